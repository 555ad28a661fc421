//! Local mode at scale: 1,000 Proxies on `pvesim` (instant tasks, no agent delay), from start to
//! all Running, against the floor: the same 1,000 creates and gets issued straight to the
//! provider in a loop with the same concurrency, no reconciler, no state, no files.
//!
//! Run: `cargo bench -p egress-operator --bench local_scale` (needs `just build-components`; a
//! release build of the operator is used). `PROXIES=200` runs a smaller fleet. Goals on a 2-core
//! machine: ≤ 15 s, ≤ 150 MiB peak RSS of the operator process, ratio to the floor ≤ 1.2.
//! Not a timed test: it prints the figures.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_capability_set::{Capabilities, GrantsFile};
use egress_runtime::types::{CreateRequest, InstanceState, Request, Response, Tag};
use egress_runtime::{CallContext, Limits, Runtime, RuntimeConfig};
use futures::StreamExt;
use pvesim::{SimConfig, Simulator};

/// The provider's concurrency in both runs (the ProviderConfig's `limits.concurrency`).
const CONCURRENCY: usize = 8;

fn component() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/components/proxmox.wasm")
}

fn main() {
    if !component().exists() {
        eprintln!("target/components/proxmox.wasm is missing: run `just build-components` first");
        std::process::exit(2);
    }
    let proxies: usize = std::env::var("PROXIES")
        .ok()
        .and_then(|count| count.parse().ok())
        .unwrap_or(1000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (operator, peak_rss) = runtime.block_on(operator_run(proxies));
    let floor = runtime.block_on(floor_run(proxies));
    let ratio = operator.as_secs_f64() / floor.as_secs_f64();
    println!("{proxies} Proxies to Running, concurrency {CONCURRENCY}:");
    println!(
        "  local mode (the operator process): {:>8.2} s, peak RSS {:.1} MiB",
        operator.as_secs_f64(),
        peak_rss as f64 / (1 << 20) as f64
    );
    println!(
        "  floor (creates and gets straight):  {:>8.2} s",
        floor.as_secs_f64()
    );
    println!("  ratio operator / floor:             {ratio:>8.2}");
}

fn simulator_config() -> SimConfig {
    SimConfig {
        task_latency: Duration::ZERO,
        agent_delay: Duration::ZERO,
        ..SimConfig::default()
    }
}

fn provider_config(sim: &Simulator) -> serde_json::Value {
    serde_json::json!({
        "apiUrl": sim.url(), "nodes": ["pv1-1"], "templateVmid": 9001,
        "targetStorage": "local-lvm", "isoStorage": "proxy-seeds",
        "budgets": {"pollMs": 10, "cloneSeconds": 60, "runningSeconds": 60},
    })
}

/// The operator binary over a folder of `count` Proxies; its wall time and peak RSS.
async fn operator_run(count: usize) -> (Duration, u64) {
    let sim = Simulator::start(simulator_config())
        .await
        .expect("simulator");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("components")).unwrap();
    std::fs::copy(component(), dir.path().join("components/proxmox.wasm")).unwrap();
    let config = serde_norway::to_string(&provider_config(&sim)).unwrap();
    let config: String = config.lines().map(|line| format!("    {line}\n")).collect();
    std::fs::write(
        dir.path().join("providerconfig.yaml"),
        format!(
            "apiVersion: egress-operator.io/v1alpha1\nkind: ProviderConfig\nmetadata: {{name: proxmox-lab}}\nspec:\n  component: {{file: proxmox.wasm}}\n  config:\n{config}  grant:\n    http:\n      origins: [\"{url}\"]\n      credential: {{header: Authorization, format: \"PVEAPIToken={{secret}}\", secretRef: {{name: token, key: token}}}}\n      tls: {{caConfigMapRef: {{name: ca, key: ca.pem}}, http1Only: true}}\n  limits: {{concurrency: {CONCURRENCY}}}\n---\napiVersion: v1\nkind: Secret\nmetadata: {{name: token}}\nstringData: {{token: \"{token}\"}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: ca}}\ndata:\n  ca.pem: |\n{ca}",
            url = sim.url(),
            token = sim.token(),
            ca = sim.ca_pem().lines().map(|line| format!("    {line}\n")).collect::<String>(),
        ),
    )
    .unwrap();
    let proxies: String = (0..count)
        .map(|index| {
            format!("---\napiVersion: egress-operator.io/v1alpha1\nkind: Proxy\nmetadata: {{name: p{index}}}\nspec: {{providerConfigRef: proxmox-lab}}\n")
        })
        .collect();
    std::fs::write(dir.path().join("proxies.yaml"), proxies).unwrap();
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("local-scale-cache");
    // Warm the compile cache first, so both runs start from a compiled component.
    let _ = Command::new(env!("CARGO_BIN_EXE_egress-operator"))
        .args(["provider", "inspect"])
        .arg(component())
        .env("XDG_CACHE_HOME", &cache)
        .output();
    let started = Instant::now();
    let status = Command::new(env!("CARGO_BIN_EXE_egress-operator"))
        .args(["run", "--no-table", "--exit-when-settled", "--local"])
        .arg(dir.path())
        .arg("--cache-dir")
        .arg(cache.join("egress-operator"))
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .status()
        .expect("the operator runs");
    let elapsed = started.elapsed();
    assert!(
        status.success(),
        "the operator did not settle with every Proxy Ready: {status}"
    );
    (elapsed, children_peak_rss())
}

/// The largest resident set of any waited-for child, in bytes.
fn children_peak_rss() -> u64 {
    // SAFETY: getrusage fills the struct it is given; RUSAGE_CHILDREN is always valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    (usage.ru_maxrss as u64) * 1024
}

/// The floor: the same component behind the same broker, `count` creates then gets until
/// running, `CONCURRENCY` at a time, nothing else.
async fn floor_run(count: usize) -> Duration {
    let sim = Simulator::start(simulator_config())
        .await
        .expect("simulator");
    let files = tempfile::tempdir().unwrap();
    let token = files.path().join("token");
    std::fs::write(&token, sim.token()).unwrap();
    let capabilities = Capabilities::new();
    GrantsFile::parse(
        &serde_json::json!({"grants": {"proxmox-lab": {"http": {
            "origins": [sim.url()],
            "credential": {"header": "Authorization", "format": "PVEAPIToken={secret}", "secretFile": token},
            "tls": {"caFile": sim.ca_file(), "http1Only": true},
        }}}})
        .to_string(),
    )
    .unwrap()
    .grant(&capabilities)
    .unwrap();
    let cache =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("local-scale-cache/egress-operator");
    let runtime =
        Runtime::new(capabilities.serve(RuntimeConfig::default().cache_dir(Some(cache)))).unwrap();
    let file = runtime.load_file(&component()).await.unwrap();
    // Measure Cranelift's code, not Winch's that serves while it compiles.
    file.optimized().await;
    let provider = file
        .bind(
            "proxmox-lab",
            Limits::default().concurrency_per_provider(CONCURRENCY),
        )
        .unwrap();
    let config = provider_config(&sim).to_string();
    let started = Instant::now();
    futures::stream::iter(0..count)
        .map(|index| {
            let (provider, config) = (Arc::clone(&provider), config.clone());
            async move {
                let uid = format!("00000000-0000-0000-0000-{index:012}");
                let request = Request::Create {
                    request: CreateRequest {
                        name: format!("floor-{index}"),
                        uid: uid.clone(),
                        tags: vec![Tag {
                            key: "egress-operator.io/proxy-uid".into(),
                            value: uid,
                        }],
                        user_data: String::new(),
                        config: config.clone(),
                    },
                };
                let Ok(Response::Create(vm)) =
                    provider.call(request, &CallContext::default()).await
                else {
                    panic!("create failed");
                };
                loop {
                    let get = Request::Get {
                        config: config.clone(),
                        provider_id: vm.provider_id.clone(),
                    };
                    match provider.call(get, &CallContext::default()).await {
                        Ok(Response::Get(vm))
                            if vm.state == InstanceState::Running && !vm.addresses.is_empty() =>
                        {
                            break;
                        }
                        Ok(_) | Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
    started.elapsed()
}
