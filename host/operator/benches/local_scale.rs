//! Local mode at scale: 1,000 Proxies on `pvesim` (instant tasks, no agent delay), from start to
//! all Running, against the floor: the same 1,000 creates and gets issued straight to the
//! provider in a loop with the same concurrency, no reconciler, no state, no files.
//!
//! Run: `cargo bench -p egress-operator --bench local_scale` (needs `just build-components`; a
//! release build of the operator is used). `PROXIES=200` runs a smaller fleet. Goals on a 2-core
//! machine: ≤ 15 s, ≤ 150 MiB peak RSS of the operator process, ratio to the floor ≤ 1.2.
//! Not a timed test: it prints the figures.

mod scale_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_capability_set::{Capabilities, GrantsFile};
use egress_runtime::types::{CreateRequest, Request, Response, Tag, VmState};
use egress_runtime::{CallContext, Limits, Runtime, RuntimeConfig};
use futures::StreamExt;
use pvesim::Simulator;
use scale_support::{
    CONCURRENCY, compile_cache, component, local_run, mib, provider_config, simulator_config,
};

fn main() {
    scale_support::require_component();
    let proxies = scale_support::proxies_from_env();
    let runtime = scale_support::runtime();
    scale_support::warm_compile_cache();
    let local = runtime.block_on(local_run(proxies));
    let operator = local.elapsed;
    let floor = runtime.block_on(floor_run(proxies));
    let ratio = operator.as_secs_f64() / floor.as_secs_f64();
    println!("{proxies} Proxies to Running, concurrency {CONCURRENCY}:");
    println!(
        "  local mode (the operator process): {:>8.2} s, peak RSS {:.1} MiB",
        operator.as_secs_f64(),
        mib(local.peak_rss)
    );
    println!(
        "  floor (creates and gets straight):  {:>8.2} s",
        floor.as_secs_f64()
    );
    println!("  ratio operator / floor:             {ratio:>8.2}");
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
    let runtime =
        Runtime::new(capabilities.serve(RuntimeConfig::default().cache_dir(Some(compile_cache()))))
            .unwrap();
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
                        placement: None,
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
                            if vm.state == VmState::Running && !vm.addresses.is_empty() =>
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
