//! Costs of the runtime's hot paths, with `Store::new` alone as the baseline for ratios.
//!
//! Run: `cargo bench -p egress-runtime -- --warm-up-time 1 --measurement-time 3`
//! (needs `just build-components`). Goals: a fresh instance of the reference provider ≤ 5 µs
//! median (the Proxmox provider's is reported beside it); a whole no-op call (instantiate +
//! `describe` + drop) ≤ 8 µs, reported beside a call of an operation the operator makes
//! (`validate-config`, which does no I/O in the reference provider). The compile group compares Cranelift with Winch, which tiered
//! compilation serves first.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use egress_runtime::{CallContext, Compilation, DenyAll, Request, Runtime, RuntimeConfig};
use wasmtime::Store;
use wasmtime::component::Component;

fn component_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../target/components/{name}.wasm"))
}

fn read_component(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|error| {
        panic!(
            "{} is missing ({error}): run `just build-components` first",
            path.display()
        )
    })
}

fn runtime_benchmarks(c: &mut Criterion) {
    let path = component_path("reference");
    let bytes = read_component(&path);
    let proxmox_path = component_path("proxmox");
    let proxmox_bytes = read_component(&proxmox_path);
    let executor = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let runtime = Runtime::new(RuntimeConfig::default().cache_dir(None), Arc::new(DenyAll))
        .expect("runtime builds");
    let provider = executor
        .block_on(runtime.load_bytes("reference", &bytes, &path))
        .expect("reference loads");
    let proxmox = executor
        .block_on(runtime.load_bytes("proxmox", &proxmox_bytes, &proxmox_path))
        .expect("proxmox loads");
    // Measure Cranelift's code, not Winch's that serves while it compiles.
    executor.block_on(provider.optimized());
    executor.block_on(proxmox.optimized());
    let context = CallContext::default();

    c.bench_function("baseline: Store::new", |b| {
        b.iter(|| Store::new(runtime.engine(), ()))
    });
    c.bench_function("fresh instance of reference", |b| {
        b.to_async(&executor).iter(|| async {
            provider
                .instantiate_for_benchmark()
                .await
                .expect("instantiates")
        })
    });
    c.bench_function("fresh instance of proxmox", |b| {
        b.to_async(&executor).iter(|| async {
            proxmox
                .instantiate_for_benchmark()
                .await
                .expect("instantiates")
        })
    });
    c.bench_function("no-op call: instantiate + describe + drop", |b| {
        b.to_async(&executor).iter(|| async {
            provider
                .call(Request::Describe, &context)
                .await
                .expect("describe answers")
        })
    });
    // The operations the operator calls (all but `describe`) look up and type-check only their
    // own export, where `describe` (called at load) checks all seven.
    c.bench_function(
        "operation call: instantiate + validate-config + drop",
        |b| {
            b.to_async(&executor).iter(|| async {
                let request = Request::ValidateConfig {
                    config: r#"{"delayMs": 1}"#.into(),
                };
                provider
                    .call(request, &context)
                    .await
                    .expect("validate-config answers")
            })
        },
    );

    let mut compile = c.benchmark_group("compile");
    compile.sample_size(10);
    compile.bench_function("cold: Component::new (Cranelift)", |b| {
        b.iter(|| Component::new(runtime.engine(), &bytes).expect("compiles"))
    });
    // What tiered compilation serves first: the same component through Winch.
    let winch = Runtime::new(
        RuntimeConfig::default()
            .cache_dir(None)
            .compilation(Compilation::Baseline),
        Arc::new(DenyAll),
    )
    .expect("runtime builds");
    compile.bench_function("cold: Component::new (Winch)", |b| {
        b.iter(|| Component::new(winch.engine(), &bytes).expect("compiles"))
    });
    let serialized = Component::new(runtime.engine(), &bytes)
        .unwrap()
        .serialize()
        .unwrap();
    let directory = tempfile::tempdir().unwrap();
    let cached = directory.path().join("reference.cwasm");
    std::fs::write(&cached, serialized).unwrap();
    compile.bench_function("cached: Component::deserialize_file", |b| {
        // SAFETY: the file was just written by `Component::serialize` with this same engine.
        b.iter(|| unsafe { Component::deserialize_file(runtime.engine(), &cached) }.expect("loads"))
    });
    compile.finish();
}

criterion_group!(benches, runtime_benchmarks);
criterion_main!(benches);
