//! Costs of the runtime's hot paths, with `Store::new` alone as the baseline for ratios.
//!
//! Run: `cargo bench -p egress-runtime -- --warm-up-time 1 --measurement-time 3`
//! (needs `just build-components`). Goals: a fresh instance of the reference provider ≤ 5 µs
//! median (the Proxmox provider's is reported beside it); a whole no-op call (instantiate +
//! `describe` + drop) ≤ 8 µs, reported beside a call of an operation the operator makes
//! (`validate-config`, which does no I/O in the reference provider). Beside them, wasmtime's own
//! floor on the same engine: a fresh instance of a component of one core instance with a memory
//! the size of a Rust guest's and nothing imported, in a `Store<()>`; a provider's instance costs
//! more for its imports (each a host function to link), its three core instances and the call's
//! host state. The compile group compares Cranelift with Winch, which tiered compilation serves
//! first.

use std::path::{Path, PathBuf};

use criterion::{Criterion, criterion_group, criterion_main};
use egress_runtime::{CallContext, Compilation, Request, Runtime, RuntimeConfig};
use wasmtime::Store;
use wasmtime::component::{Component, Linker};

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

/// The smallest component shaped like a guest's main module: one core instance with a memory of
/// 17 pages (a Rust guest's 1 MiB stack and its data), a table, and one exported function
/// lifted as `f: func() -> u32`; nothing imported.
fn empty_component() -> Vec<u8> {
    use wasm_encoder::{
        CodeSection, ComponentBuilder, ComponentExportKind, ComponentValType, ExportKind,
        ExportSection, Function, FunctionSection, MemorySection, MemoryType, Module,
        PrimitiveValType, RefType, TableSection, TableType, TypeSection, ValType,
    };
    let mut types = TypeSection::new();
    types.ty().function([], [ValType::I32]);
    let mut functions = FunctionSection::new();
    functions.function(0);
    let mut tables = TableSection::new();
    tables.table(TableType {
        element_type: RefType::FUNCREF,
        table64: false,
        minimum: 102,
        maximum: Some(102),
        shared: false,
    });
    let mut memories = MemorySection::new();
    memories.memory(MemoryType {
        minimum: 17,
        maximum: None,
        memory64: false,
        shared: false,
        page_size_log2: None,
    });
    let mut exports = ExportSection::new();
    exports.export("memory", ExportKind::Memory, 0);
    exports.export("f", ExportKind::Func, 0);
    let mut code = CodeSection::new();
    let mut body = Function::new([]);
    body.instructions().i32_const(0).end();
    code.function(&body);
    let mut module = Module::new();
    module
        .section(&types)
        .section(&functions)
        .section(&tables)
        .section(&memories)
        .section(&exports)
        .section(&code);

    let mut component = ComponentBuilder::default();
    let module = component.core_module(None, &module);
    let instance = component.core_instantiate(None, module, []);
    let core_func = component.core_alias_export(None, instance, "f", ExportKind::Func);
    let (func_type, mut encoder) = component.type_function(None);
    encoder
        .params::<_, ComponentValType>([])
        .result(Some(ComponentValType::Primitive(PrimitiveValType::U32)));
    let func = component.lift_func(None, core_func, func_type, []);
    component.export("f", ComponentExportKind::Func, func, None);
    component.finish()
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
    let runtime = Runtime::new(RuntimeConfig::default().cache_dir(None)).expect("runtime builds");
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
    let floor = Component::new(runtime.engine(), empty_component()).expect("the floor compiles");
    let floor = Linker::<()>::new(runtime.engine())
        .instantiate_pre(&floor)
        .expect("the floor imports nothing");
    c.bench_function("floor: fresh instance of an empty component", |b| {
        b.to_async(&executor).iter(|| async {
            let mut store = Store::new(runtime.engine(), ());
            floor
                .instantiate_async(&mut store)
                .await
                .expect("instantiates")
        })
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
