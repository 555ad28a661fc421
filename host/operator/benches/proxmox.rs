//! The Proxmox provider's `get` of a running VM by four paths, on the same simulator in the same
//! run:
//!
//! - **component**: the real path (component → runtime → broker → simulator over TLS), each
//!   request one call into the host (`egress:http-broker/exchange`);
//! - **component over wasi:http**: the same provider built with `egress-guest`'s
//!   `wasi-http-only` feature (`proxmox-wasi-http.wasm`, `just bench` builds it), each request
//!   through `wasi:http` as every provider sent it before the exchange: the before/after of that
//!   change in the same run;
//! - **broker**: the same requests sent through the broker from host code (no wasm), so
//!   component ÷ broker is the sandbox's share;
//! - **direct**: the same requests sent by a pooled host client (same CA, HTTP/1.1 only, same
//!   token header), so broker ÷ direct is the broker's share.
//!
//! Also: the component's size and its cold compile time (`Component::new`), and `get` through
//! the component on clusters of 10, 1,000 and 10,000 VMs (goal: get at 10,000 ≤ 1.2 × get at 10;
//! an operator resyncing N proxies calls get N times, so a get reading every VM costs O(N²)).
//!
//! Run: `cargo bench -p egress-operator --bench proxmox -- --warm-up-time 1 --measurement-time 5`
//! (needs `just build-components` and the wasi:http build above). Goals: component ÷ direct ≤ 1.15
//! with at most 8 calls into the host per `get` (printed for both builds), broker ÷ direct ≤ 1.05;
//! component ≤ 1 MiB; cold compile ≤ 1 s. Besides criterion's report, the bench prints the ratios
//! of medians from an interleaved run, so every path sees the same machine load, twice: called
//! from the thread that drives the executor, and from a task on its worker threads, where the
//! operator's reconcilers call providers (there a host path's requests and their connection
//! tasks can stay on one thread).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use egress_capability_http::{Broker, HttpGrant};
use egress_runtime::Capability as _;
use egress_runtime::egress::{CallSite, Egress, EgressBody};
use egress_runtime::grant::{FilesOnly, GrantContext};
use egress_runtime::types::{CreateRequest, Request, Response};
use egress_runtime::{CallContext, Provider, Runtime, RuntimeConfig, VmState};
use http_body_util::{BodyExt, Empty};
use pvesim::{SimConfig, Simulator};
use serde_json::{Value, json};
use wasmtime::component::Component;

const NAME: &str = "proxy-benchaaaaaaaaaaaa";
/// Interleaved samples per path for the printed ratio.
const RATIO_SAMPLES: usize = 400;
/// The order the four paths take turns in (0 component, 1 broker, 2 component over wasi:http,
/// 3 direct): a de Bruijn sequence, in which each path runs right after each path,
/// itself included, exactly once per cycle. A call right after a component call is slower (work
/// the component's call left behind is still running, the caches hold its code), so a path that
/// followed the component more often than another would look dearer: a plain rotation (0123,
/// 1230, …) puts the broker after it in 3 turns of 4 and the direct client never, which reads
/// broker ÷ direct about 0.1 too high.
const TURNS: [usize; 16] = [0, 0, 1, 0, 2, 0, 3, 1, 1, 2, 1, 3, 2, 2, 3, 3];
/// VMs on the simulated cluster, ours and the two templates included, for the scaling bench.
const CLUSTER_SIZES: [usize; 3] = [10, 1_000, 10_000];
/// Interleaved samples per cluster size for the printed scaling ratio.
const SCALING_SAMPLES: usize = 200;

fn component_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/components/proxmox.wasm")
}

/// The same provider, every request through `wasi:http`.
fn wasi_http_component_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/components/proxmox-wasi-http.wasm")
}

struct Setup {
    sim: Simulator,
    runtime: Runtime,
    broker: Broker,
    provider: Arc<Provider>,
    /// The same provider over `wasi:http`, in a runtime of its own, when it is loaded.
    wasi_http: Option<(Runtime, Arc<Provider>)>,
    config: String,
    direct: reqwest::Client,
    provider_id: String,
    _files: tempfile::TempDir,
}

/// A simulator holding `other_vms` VMs that are not ours beside the templates, and one running VM
/// of ours created through the component; `wasi_http`, the bytes of the wasi:http build to load
/// beside it.
async fn setup(bytes: &[u8], other_vms: usize, wasi_http: Option<&[u8]>) -> Setup {
    let sim = Simulator::start(SimConfig {
        task_latency: Duration::from_millis(5),
        agent_delay: Duration::ZERO,
        ..SimConfig::default()
    })
    .await
    .expect("simulator starts");
    sim.state().add_other_vms(other_vms);
    let files = tempfile::tempdir().unwrap();
    let secret_file = files.path().join("token");
    std::fs::write(&secret_file, sim.token()).unwrap();
    let grant: HttpGrant = serde_json::from_value(json!({
        "origins": [sim.url()],
        "credential": {"header": "Authorization", "format": "PVEAPIToken={secret}", "secretFile": secret_file},
        "tls": {"caFile": sim.ca_file(), "http1Only": true},
    }))
    .expect("grant parses");
    let context = GrantContext {
        digests: &[],
        host: &FilesOnly,
    };
    let granted = || {
        let broker = Broker::new();
        broker
            .set_grant("proxmox", &grant, &context)
            .expect("grant is valid");
        broker
    };
    let broker = granted();
    // Each runtime gets a broker of its own, so each of the four paths has its own pooled
    // connection: switching connections costs the next request (most of all from a worker task),
    // and a path sharing the previous path's connection would be spared that cost. They count
    // the calls their guests make into the host.
    let runtime = || {
        Runtime::new(
            RuntimeConfig::default()
                .cache_dir(None)
                .count_host_calls()
                .capability(Arc::new(granted())),
        )
        .expect("runtime")
    };
    let load = |runtime: &Runtime, bytes: &[u8], path: PathBuf| {
        let runtime = runtime.clone();
        let bytes = bytes.to_vec();
        async move {
            let provider = runtime
                .load_bytes("proxmox", &bytes, &path)
                .await
                .expect("the proxmox component loads");
            // Measure Cranelift's code, not Winch's that serves while it compiles.
            provider.optimized().await;
            provider
        }
    };
    let (runtime, wasi_runtime) = (runtime(), runtime());
    let provider = load(&runtime, bytes, component_path()).await;
    let wasi_http = match wasi_http {
        Some(bytes) => Some((
            wasi_runtime.clone(),
            load(&wasi_runtime, bytes, wasi_http_component_path()).await,
        )),
        None => None,
    };
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
        placement: None,
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
        broker,
        provider,
        wasi_http,
        config,
        direct,
        provider_id,
        _files: files,
    }
}

impl Setup {
    async fn component_get(&self) {
        self.get_through(&self.provider).await
    }

    async fn wasi_http_get(&self) {
        let (_, provider) = self
            .wasi_http
            .as_ref()
            .expect("the wasi:http build is loaded");
        self.get_through(provider).await
    }

    /// The calls into the host of one `get` through `provider` of `runtime`.
    async fn host_calls_per_get(&self, runtime: &Runtime, provider: &Provider) -> u64 {
        let before = runtime.host_calls().expect("the runtime counts");
        self.get_through(provider).await;
        runtime.host_calls().expect("the runtime counts") - before
    }

    async fn get_through(&self, provider: &Provider) {
        let request = Request::Get {
            config: self.config.clone(),
            provider_id: self.provider_id.clone(),
        };
        match provider.call(request, &CallContext::default()).await {
            Ok(Response::Get(instance)) if instance.state == VmState::Running => {}
            other => panic!("get: {other:?}"),
        }
    }

    /// Waits (bounded) until get reports the VM running; returns the paths that get requested.
    async fn wait_running(&self) -> Vec<String> {
        for _ in 0..500 {
            let before = self.sim.state().request_log().len();
            let request = Request::Get {
                config: self.config.clone(),
                provider_id: self.provider_id.clone(),
            };
            if let Ok(Response::Get(instance)) =
                self.provider.call(request, &CallContext::default()).await
                && instance.state == VmState::Running
            {
                return self.sim.state().request_log()[before..]
                    .iter()
                    .map(|r| r.path.clone())
                    .collect();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the VM never reported running");
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

    /// The same requests through the broker from host code, as the runtime hands them over for
    /// the component (identity `proxmox`, a `Host` header, an empty body, no credential: the
    /// broker injects it), each body read whole and parsed as the component parses it.
    async fn broker_get(&self, broker: &Broker, paths: &[String], site: &CallSite) {
        for path in paths {
            let request = http::Request::get(format!("{}{path}", self.sim.url()))
                .header(
                    http::header::HOST,
                    self.sim.url().trim_start_matches("https://"),
                )
                .body(EgressBody::new(
                    Empty::<Bytes>::new().map_err(|never| match never {}),
                ))
                .unwrap();
            let response = broker
                .send(site, request, None)
                .await
                .expect("brokered request");
            assert!(
                response.status().is_success(),
                "{path}: {}",
                response.status()
            );
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let body: Value = serde_json::from_slice(&body).unwrap();
            assert!(!body["data"].is_null(), "{path}");
        }
    }
}

/// Whether each ordered pair of paths, a path with itself included, follows in [`TURNS`] (read
/// as a cycle) exactly once.
fn turns_are_balanced() -> bool {
    let mut follows = [[0; 4]; 4];
    for (turn, &path) in TURNS.iter().enumerate() {
        follows[TURNS[(turn + TURNS.len() - 1) % TURNS.len()]][path] += 1;
    }
    follows.iter().flatten().all(|&count| count == 1)
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

/// The four paths taking turns in the order of [`TURNS`], [`RATIO_SAMPLES`] gets each; each
/// sample is kept with the path that ran before it (`[path][before]`), to show what a component
/// call leaves for the call after it.
async fn take_turns(
    setup: &Setup,
    paths: &[String],
    site: &CallSite,
    auth: &str,
) -> [[Vec<Duration>; 4]; 4] {
    let mut samples: [[Vec<Duration>; 4]; 4] = Default::default();
    let mut before = TURNS[TURNS.len() - 1];
    for path in TURNS.into_iter().cycle().take(4 * RATIO_SAMPLES) {
        let start = Instant::now();
        match path {
            0 => setup.component_get().await,
            1 => setup.broker_get(&setup.broker, paths, site).await,
            2 => setup.wasi_http_get().await,
            _ => setup.direct_get(paths, auth).await,
        }
        samples[path][before].push(start.elapsed());
        before = path;
    }
    samples
}

/// Prints the ratios of the medians of one [`take_turns`], called from `caller`.
fn report_turns(caller: &str, samples: [[Vec<Duration>; 4]; 4]) {
    let after_the_component = |path: usize| median(&mut samples[path][0].clone());
    let after_itself = |path: usize| median(&mut samples[path][path].clone());
    let (broker_after, direct_after) = (after_the_component(1), after_the_component(3));
    println!(
        "get {caller}, after a component get ÷ after one by the same path: broker {:.3}, \
         direct {:.3} (what a component call leaves to the next call: work after it returned, \
         colder caches)",
        broker_after.as_secs_f64() / after_itself(1).as_secs_f64(),
        direct_after.as_secs_f64() / after_itself(3).as_secs_f64(),
    );
    let [through, brokered, wasi_http, direct] = samples.map(|after| median(&mut after.concat()));
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "get {caller}, interleaved medians: component {through:?}, broker {brokered:?}, \
         direct {direct:?}; component/broker {:.3}, broker/direct {:.3} (goal <= 1.05), \
         component/direct {:.3} (goal <= 1.15); the component over wasi:http (before the \
         exchange) {wasi_http:?}, {:.3} × direct, {:.3} × the component",
        ratio(through, brokered),
        ratio(brokered, direct),
        ratio(through, direct),
        ratio(wasi_http, direct),
        ratio(wasi_http, through)
    );
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
    let wasi_http = std::fs::read(wasi_http_component_path()).unwrap_or_else(|error| {
        panic!(
            "{} is missing ({error}): run `just bench`, which builds it",
            wasi_http_component_path().display()
        )
    });
    let setup = executor.block_on(setup(&bytes, 0, Some(&wasi_http)));
    let auth = setup.sim.token_header();

    // Every path sends the same requests: those the simulator logged for one get of the component
    // (the log leaves out the query; the listing's is `type=vm`).
    let paths: Vec<String> = executor
        .block_on(setup.wait_running())
        .into_iter()
        .map(|path| {
            if path.ends_with("/cluster/resources") {
                format!("{path}?type=vm")
            } else {
                path
            }
        })
        .collect();
    println!("get requests: {paths:?}");
    let (wasi_runtime, wasi_provider) = setup.wasi_http.as_ref().expect("loaded");
    let (exchange_calls, wasi_calls) = executor.block_on(async {
        (
            setup
                .host_calls_per_get(&setup.runtime, &setup.provider)
                .await,
            setup.host_calls_per_get(wasi_runtime, wasi_provider).await,
        )
    });
    println!(
        "calls into the host per get: {exchange_calls} through the exchange (goal <= 8), \
         {wasi_calls} over wasi:http"
    );

    let site = CallSite {
        provider: Arc::from("proxmox"),
        digest: Arc::from(""),
        operation: "get",
    };

    assert!(
        turns_are_balanced(),
        "TURNS must put each path after each path once"
    );
    // Interleaved, once from the thread that drives the executor (as a CLI call would) and once
    // from a task on its workers (as the operator calls providers: its reconcilers are tasks).
    let setup = Arc::new(setup);
    let paths = Arc::new(paths);
    let samples = executor.block_on(take_turns(&setup, &paths, &site, &auth));
    report_turns("from the executor's own thread", samples);
    let on_worker = {
        let (setup, paths, site, auth) = (setup.clone(), paths.clone(), site.clone(), auth.clone());
        executor.spawn(async move { take_turns(&setup, &paths, &site, &auth).await })
    };
    let samples = executor
        .block_on(on_worker)
        .expect("the turns run to the end");
    report_turns("from a task on the executor's workers", samples);

    let mut group = c.benchmark_group("proxmox get of a running VM");
    group.bench_function("component (runtime + broker)", |b| {
        b.to_async(&executor).iter(|| setup.component_get())
    });
    group.bench_function("broker from host code (no wasm)", |b| {
        b.to_async(&executor)
            .iter(|| setup.broker_get(&setup.broker, &paths, &site))
    });
    group.bench_function("component over wasi:http (before the exchange)", |b| {
        b.to_async(&executor).iter(|| setup.wasi_http_get())
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

/// `get` of our running VM through the component on clusters of each of [`CLUSTER_SIZES`].
fn get_scaling(c: &mut Criterion) {
    let bytes = std::fs::read(component_path()).expect("run `just build-components` first");
    let executor = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let setups: Vec<(usize, Setup)> = CLUSTER_SIZES
        .iter()
        .map(|&size| {
            // The templates and our VM count towards the cluster's size.
            let setup = executor.block_on(setup(&bytes, size - 3, None));
            executor.block_on(setup.wait_running());
            (size, setup)
        })
        .collect();

    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); setups.len()];
    executor.block_on(async {
        for _ in 0..SCALING_SAMPLES {
            for ((_, setup), samples) in setups.iter().zip(&mut samples) {
                let start = Instant::now();
                setup.component_get().await;
                samples.push(start.elapsed());
            }
        }
    });
    let medians: Vec<Duration> = samples.iter_mut().map(|s| median(s)).collect();
    let report: Vec<String> = setups
        .iter()
        .zip(&medians)
        .map(|((size, _), median)| format!("{size} VMs {median:?}"))
        .collect();
    println!(
        "get by cluster size, interleaved medians: {}; {} ÷ {} VMs {:.3} (goal <= 1.2)",
        report.join(", "),
        CLUSTER_SIZES[2],
        CLUSTER_SIZES[0],
        medians[2].as_secs_f64() / medians[0].as_secs_f64()
    );

    let mut group = c.benchmark_group("proxmox get by cluster size");
    for (size, setup) in &setups {
        group.bench_function(format!("{size} VMs"), |b| {
            b.to_async(&executor).iter(|| setup.component_get())
        });
    }
    group.finish();
}

criterion_group!(benches, proxmox_benchmarks, get_scaling);
criterion_main!(benches);
