//! The Proxmox provider's `get` of a running VM through the real path (component → runtime →
//! broker → simulator over TLS) against the same HTTP requests sent directly by a pooled host
//! client (same CA, HTTP/1.1 only, same token header), on the same simulator in the same run.
//! Also: the component's size and its cold compile time (`Component::new`).
//!
//! Run: `cargo bench -p egress-operator --bench proxmox -- --warm-up-time 1 --measurement-time 5`
//! (needs `just build-components`). Goals: median ratio component/direct ≤ 1.05; component
//! ≤ 1 MiB; cold compile ≤ 1 s. Besides criterion's report, the bench prints the ratio of
//! medians from an interleaved run, so both paths see the same machine load.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use egress_capability_http::{Broker, Grants};
use egress_runtime::types::{CreateRequest, Request, Response};
use egress_runtime::{CallContext, InstanceState, Provider, Runtime, RuntimeConfig};
use pvesim::{SimConfig, Simulator};
use serde_json::{Value, json};
use wasmtime::component::Component;

const NAME: &str = "proxy-benchaaaaaaaaaaaa";
/// Interleaved samples per path for the printed ratio.
const RATIO_SAMPLES: usize = 400;

fn component_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/components/proxmox.wasm")
}

struct Setup {
    sim: Simulator,
    runtime: Runtime,
    provider: Arc<Provider>,
    config: String,
    direct: reqwest::Client,
    provider_id: String,
    _files: tempfile::TempDir,
}

async fn setup(bytes: &[u8]) -> Setup {
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
    let grants = Grants::from_json(
        &json!({"grants": {"proxmox": {
            "origins": [sim.url()],
            "credential": {"header": "Authorization", "format": "PVEAPIToken={secret}", "secretFile": secret_file},
            "tls": {"caFile": sim.ca_file(), "http1Only": true},
        }}})
        .to_string(),
    )
    .expect("grant parses");
    let broker = Broker::new(&grants).expect("grant is valid");
    let runtime =
        Runtime::new(RuntimeConfig::default().cache_dir(None), Arc::new(broker)).expect("runtime");
    let provider = runtime
        .load_bytes("proxmox", bytes, &component_path())
        .await
        .expect("the proxmox component loads");
    let config = json!({
        "apiUrl": sim.url(), "nodes": ["pv1-1"], "templateVmid": 9001,
        "targetStorage": "local-lvm", "isoStorage": "proxy-seeds",
        "budgets": {"pollMs": 10, "cloneSeconds": 10, "runningSeconds": 10},
    })
    .to_string();
    let request = CreateRequest {
        name: NAME.into(),
        uid: "bench-uid".into(),
        tags: Vec::new(),
        user_data: "#cloud-config\n".into(),
        config: config.clone(),
    };
    let provider_id = match provider
        .call(Request::Create { request }, &CallContext::default())
        .await
    {
        Ok(Response::Create(instance)) => instance.provider_id,
        other => panic!("create: {other:?}"),
    };
    let ca = reqwest::Certificate::from_pem(sim.ca_pem().as_bytes()).unwrap();
    let direct = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .http1_only()
        .no_proxy()
        .build()
        .unwrap();
    Setup {
        sim,
        runtime,
        provider,
        config,
        direct,
        provider_id,
        _files: files,
    }
}

impl Setup {
    async fn component_get(&self) {
        let request = Request::Get {
            config: self.config.clone(),
            provider_id: self.provider_id.clone(),
        };
        match self.provider.call(request, &CallContext::default()).await {
            Ok(Response::Get(instance)) if instance.state == InstanceState::Running => {}
            other => panic!("get: {other:?}"),
        }
    }

    /// The paths a running get reads (entry 9): resources, config, status, agent.
    fn get_paths(&self) -> Vec<String> {
        let vm = format!(
            "/api2/json/nodes/pv1-1/qemu/{}",
            self.provider_id.rsplit('/').next().unwrap()
        );
        vec![
            "/api2/json/cluster/resources?type=vm".into(),
            format!("{vm}/config"),
            format!("{vm}/status/current"),
            format!("{vm}/agent/network-get-interfaces"),
        ]
    }

    /// The same requests from the host, each body parsed as the component parses it.
    async fn direct_get(&self, paths: &[String], auth: &str) {
        for path in paths {
            let response = self
                .direct
                .get(format!("{}{path}", self.sim.url()))
                .header("Authorization", auth)
                .send()
                .await
                .expect("direct request");
            assert!(
                response.status().is_success(),
                "{path}: {}",
                response.status()
            );
            let body: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
            assert!(!body["data"].is_null(), "{path}");
        }
    }
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

fn proxmox_benchmarks(c: &mut Criterion) {
    let path = component_path();
    let bytes = std::fs::read(&path).unwrap_or_else(|error| {
        panic!(
            "{} is missing ({error}): run `just build-components` first",
            path.display()
        )
    });
    let size = bytes.len();
    println!(
        "proxmox.wasm size: {size} bytes ({:.1} KiB; goal <= 1 MiB: {})",
        size as f64 / 1024.0,
        size <= 1 << 20
    );

    let executor = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let setup = executor.block_on(setup(&bytes));
    let auth = setup.sim.token_header();
    let paths = setup.get_paths();

    // Both paths must send the same requests: compare with what the simulator logged for one get.
    executor.block_on(async {
        for _ in 0..500 {
            let before = setup.sim.state().request_log().len();
            let request = Request::Get {
                config: setup.config.clone(),
                provider_id: setup.provider_id.clone(),
            };
            if let Ok(Response::Get(instance)) =
                setup.provider.call(request, &CallContext::default()).await
                && instance.state == InstanceState::Running
            {
                let logged: Vec<String> = setup.sim.state().request_log()[before..]
                    .iter()
                    .map(|r| r.path.clone())
                    .collect();
                let expected: Vec<String> = paths
                    .iter()
                    .map(|p| p.split('?').next().unwrap().to_string())
                    .collect();
                assert_eq!(
                    logged, expected,
                    "the direct client must replay the component's requests"
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the VM never reported running");
    });

    // Interleaved, so both paths share the machine's state; the ratio of medians is printed.
    let (mut through, mut direct) = (Vec::new(), Vec::new());
    executor.block_on(async {
        for _ in 0..RATIO_SAMPLES {
            let start = Instant::now();
            setup.component_get().await;
            through.push(start.elapsed());
            let start = Instant::now();
            setup.direct_get(&paths, &auth).await;
            direct.push(start.elapsed());
        }
    });
    let (through, direct) = (median(&mut through), median(&mut direct));
    println!(
        "get, interleaved medians: component {through:?}, direct {direct:?}, ratio {:.3} (goal <= 1.05)",
        through.as_secs_f64() / direct.as_secs_f64()
    );

    let mut group = c.benchmark_group("proxmox get of a running VM");
    group.bench_function("component (runtime + broker)", |b| {
        b.to_async(&executor).iter(|| setup.component_get())
    });
    group.bench_function("direct (pooled reqwest)", |b| {
        b.to_async(&executor)
            .iter(|| setup.direct_get(&paths, &auth))
    });
    group.finish();

    let start = Instant::now();
    Component::new(setup.runtime.engine(), &bytes).expect("compiles");
    println!(
        "proxmox.wasm cold compile (one run): {:?} (goal <= 1 s)",
        start.elapsed()
    );
    let mut compile = c.benchmark_group("proxmox compile");
    compile.sample_size(10);
    compile.bench_function("cold: Component::new", |b| {
        b.iter(|| Component::new(setup.runtime.engine(), &bytes).expect("compiles"))
    });
    compile.finish();
}

criterion_group!(benches, proxmox_benchmarks);
criterion_main!(benches);
