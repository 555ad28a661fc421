//! The Python Proxmox provider (`components/python-proxmox`, componentize-py) beside the Rust one
//! (`components/proxmox`), in the same runtime under the default limits: component size, cold
//! compile (`Component::new`), cached load (`Runtime::load_bytes` from the compile cache, its
//! `describe` included), a fresh instance, a no-op call (`describe`), and a `get` of a running VM
//! end to end (runtime + broker + `pvesim` over TLS). It also finds the least linear memory each
//! needs, to instantiate and for a whole `get`, by bisecting `Limits::memory_bytes` (1 MiB steps).
//!
//! Run: `cargo bench -p egress-operator --bench python -- --warm-up-time 1 --measurement-time 5`
//! (needs `just build-components` and `components/python-proxmox/build.sh`). Besides criterion's
//! report it prints one line per measurement, for the comparison table in
//! `components/python-proxmox/README.md`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use egress_capability_set::{Capabilities, GrantsFile};
use egress_runtime::types::{CreateRequest, Request, Response};
use egress_runtime::{CallContext, Limits, Provider, Runtime, RuntimeConfig, VmState};
use pvesim::{SimConfig, Simulator};
use serde_json::json;
use wasmtime::component::Component;

const NAME: &str = "proxy-benchaaaaaaaaaaaa";
/// Cold compiles timed per component (each is seconds for the Python one).
const COMPILES: usize = 3;

/// One provider under measurement.
struct Subject {
    /// The identity it serves as: the file's stem under `target/components/`.
    identity: &'static str,
    /// Its configuration for a simulator at `url`.
    config: fn(&str) -> String,
}

const SUBJECTS: [Subject; 2] = [
    Subject {
        identity: "proxmox",
        config: |url| {
            json!({"apiUrl": url, "nodes": ["pv1-1"], "templateVmid": 9001,
                   "targetStorage": "local-lvm", "isoStorage": "proxy-seeds",
                   "budgets": {"pollMs": 10, "cloneSeconds": 10, "runningSeconds": 10}})
            .to_string()
        },
    },
    Subject {
        identity: "python-proxmox",
        config: |url| {
            json!({"apiUrl": url, "nodes": ["pv1-1"], "templateVmid": 9001,
                   "targetStorage": "local-lvm",
                   "budgets": {"pollMs": 10, "cloneSeconds": 10, "runningSeconds": 10}})
            .to_string()
        },
    },
];

fn component_path(identity: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/components")
        .join(format!("{identity}.wasm"))
}

/// A simulator and the capabilities granting `identity` its token.
struct World {
    sim: Simulator,
    capabilities: Capabilities,
    _files: tempfile::TempDir,
}

async fn world(identity: &str) -> World {
    let sim = Simulator::start(SimConfig {
        task_latency: Duration::from_millis(5),
        agent_delay: Duration::ZERO,
        ..SimConfig::default()
    })
    .await
    .expect("simulator starts");
    let files = tempfile::tempdir().unwrap();
    let secret_file = files.path().join("token");
    std::fs::write(&secret_file, sim.token()).unwrap();
    let capabilities = Capabilities::new();
    GrantsFile::parse(
        &json!({"grants": {identity: {"http": {
            "origins": [sim.url()],
            "credential": {"header": "Authorization", "format": "PVEAPIToken={secret}", "secretFile": secret_file},
            "tls": {"caFile": sim.ca_file(), "http1Only": true},
        }}}})
        .to_string(),
    )
    .expect("grant parses")
    .grant(&capabilities)
    .expect("grant is valid");
    World {
        capabilities,
        sim,
        _files: files,
    }
}

fn new_runtime(world: &World, limits: Limits, cache: &Path) -> Runtime {
    Runtime::new(
        world.capabilities.serve(
            RuntimeConfig::default()
                .limits(limits)
                .cache_dir(Some(cache.to_path_buf())),
        ),
    )
    .expect("runtime")
}

async fn create(provider: &Provider, config: &str) -> String {
    let request = CreateRequest {
        name: NAME.into(),
        uid: "bench-uid".into(),
        tags: Vec::new(),
        user_data: "#cloud-config\n".into(),
        config: config.to_string(),
        placement: None,
    };
    match provider
        .call(Request::Create { request }, &CallContext::default())
        .await
    {
        Ok(Response::Create(instance)) => instance.provider_id,
        other => panic!("create: {other:?}"),
    }
}

/// `get` once; whether it answered running with an address.
async fn get_running(provider: &Provider, config: &str, provider_id: &str) -> bool {
    let request = Request::Get {
        config: config.to_string(),
        provider_id: provider_id.to_string(),
    };
    matches!(
        provider.call(request, &CallContext::default()).await,
        Ok(Response::Get(instance)) if instance.state == VmState::Running && !instance.addresses.is_empty()
    )
}

/// The least memory cap (MiB) under which `works` succeeds, between 1 and `high` MiB; `None` when
/// even `high` fails.
async fn least_memory_mib<F, Fut>(high: usize, works: F) -> Option<usize>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    if !works(high).await {
        return None;
    }
    let (mut failing, mut passing) = (0, high);
    while passing - failing > 1 {
        let middle = (failing + passing) / 2;
        if works(middle).await {
            passing = middle;
        } else {
            failing = middle;
        }
    }
    Some(passing)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

fn python_benchmarks(c: &mut Criterion) {
    let executor = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cache = tempfile::tempdir().unwrap();
    for subject in SUBJECTS {
        let id = subject.identity;
        let path = component_path(id);
        let bytes = std::fs::read(&path).unwrap_or_else(|error| {
            panic!(
                "{} is missing ({error}): run `just build-components` and \
                 `components/python-proxmox/build.sh` first",
                path.display()
            )
        });
        println!(
            "{id}: size {} bytes ({:.1} MiB)",
            bytes.len(),
            bytes.len() as f64 / (1 << 20) as f64
        );
        let world = executor.block_on(world(id));
        let config = (subject.config)(&world.sim.url());
        let runtime = new_runtime(&world, Limits::default(), cache.path());

        let compiles: Vec<Duration> = (0..COMPILES)
            .map(|_| {
                let start = Instant::now();
                Component::new(runtime.engine(), &bytes).expect("compiles");
                start.elapsed()
            })
            .collect();
        println!(
            "{id}: cold compile (Component::new), median of {COMPILES}: {:?}",
            median(compiles)
        );

        // The first load compiles and fills the cache; every later one reads it.
        let provider = executor
            .block_on(runtime.load_bytes(id, &bytes, &path))
            .expect("loads under the default limits");
        // The cache is written by the background compile that follows a first load.
        executor.block_on(provider.optimized());
        let start = Instant::now();
        let again = executor
            .block_on(runtime.load_bytes(id, &bytes, &path))
            .expect("loads");
        println!(
            "{id}: cached load (deserialize + checks + describe), one run: {:?} (from cache: {})",
            start.elapsed(),
            again.from_cache()
        );

        let provider_id = executor.block_on(create(&provider, &config));
        let running = executor.block_on(async {
            for _ in 0..500 {
                if get_running(&provider, &config, &provider_id).await {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            false
        });
        assert!(running, "{id}: the VM never reported running");

        let mut group = c.benchmark_group(id);
        group.sample_size(10);
        group.bench_function("cached load (load_bytes from the compile cache)", |b| {
            b.to_async(&executor).iter(|| async {
                let loaded = runtime.load_bytes(id, &bytes, &path).await.expect("loads");
                assert!(loaded.from_cache());
            })
        });
        group.finish();
        let mut group = c.benchmark_group(id);
        group.bench_function("fresh instance", |b| {
            b.to_async(&executor).iter(|| async {
                provider
                    .instantiate_for_benchmark()
                    .await
                    .expect("instantiates")
            })
        });
        group.bench_function("no-op call (describe)", |b| {
            b.to_async(&executor).iter(|| async {
                provider
                    .call(Request::Describe, &CallContext::default())
                    .await
                    .expect("describe answers")
            })
        });
        group.bench_function("get of a running VM (runtime + broker + pvesim)", |b| {
            b.to_async(&executor).iter(|| async {
                assert!(get_running(&provider, &config, &provider_id).await);
            })
        });
        group.finish();

        // The least linear memory: to load (instantiate + describe), and for a whole get.
        let limits = |mib: usize| Limits::default().memory_bytes(mib << 20);
        let load_mib = executor.block_on(least_memory_mib(64, |mib| {
            let runtime = new_runtime(&world, limits(mib), cache.path());
            let (bytes, path) = (&bytes, &path);
            async move { runtime.load_bytes(id, bytes, path).await.is_ok() }
        }));
        let get_mib = executor.block_on(least_memory_mib(64, |mib| {
            let runtime = new_runtime(&world, limits(mib), cache.path());
            let (bytes, path, config, provider_id) = (&bytes, &path, &config, &provider_id);
            async move {
                match runtime.load_bytes(id, bytes, path).await {
                    Ok(provider) => get_running(&provider, config, provider_id).await,
                    Err(_) => false,
                }
            }
        }));
        println!(
            "{id}: least memory cap to instantiate and describe: {load_mib:?} MiB; for a get of a \
             running VM: {get_mib:?} MiB (default cap 64 MiB)"
        );
    }
}

criterion_group!(benches, python_benchmarks);
criterion_main!(benches);
