//! Hot swap as an operator sees it: the reference component served by a [`Registry`] while
//! calls run at about 200/s, its file replaced by renaming a different build over it, and the
//! time from the rename to the first call answered by the new bytes. Every call must succeed.
//!
//! Run: `cargo bench -p egress-runtime --bench hot_swap -- --warm-up-time 1 --measurement-time 3`
//! (needs `just build-components`). Goal: median ≤ 150 ms, 0 failed calls. Each swap's bytes are
//! new (a custom section with a fresh payload), so each swap misses the compile cache and pays a
//! full compile, as a real new build would.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use egress_runtime::{
    CallContext, DenyAll, Registry, RegistryEvent, Request, Runtime, RuntimeConfig,
};
use sha2::Digest;

/// Calls per second kept running during the swaps.
const CALLS_PER_SECOND: u64 = 200;
/// Longest a swap may take before the benchmark gives up.
const SWAP_BOUND: Duration = Duration::from_secs(30);

fn reference_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/components/reference.wasm")
}

/// `component` with a custom section appended: the same component, a different digest.
fn with_custom_section(component: &[u8], name: &str, payload: &[u8]) -> Vec<u8> {
    let mut bytes = component.to_vec();
    use wasm_encoder::ComponentSection;
    wasm_encoder::CustomSection {
        name: name.into(),
        data: payload.into(),
    }
    .append_to_component(&mut bytes);
    bytes
}

/// The digest being waited for and when a call was first answered by it.
#[derive(Default)]
struct Awaited {
    digest: String,
    answered_at: Option<Instant>,
}

fn hot_swap(c: &mut Criterion) {
    let path = reference_path();
    let original = std::fs::read(&path).unwrap_or_else(|error| {
        panic!(
            "{} is missing ({error}): run `just build-components` first",
            path.display()
        )
    });
    let executor = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let components = tempfile::tempdir().expect("components directory");
    let cache = tempfile::tempdir().expect("compile cache directory");
    let served = components.path().join("reference.wasm");
    std::fs::write(&served, &original).expect("reference written");
    // The registry's default setup, with its compile cache in a fresh directory.
    let config = RuntimeConfig::default().cache_dir(Some(cache.path().to_owned()));
    let runtime = Runtime::new(config, Arc::new(DenyAll)).expect("runtime builds");
    let registry = executor
        .block_on(Registry::watch(runtime, components.path()))
        .expect("registry watches");

    let awaited = Arc::new(Mutex::new(Awaited::default()));
    let failed = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let callers = {
        let (registry, awaited, failed, answered) = (
            registry.clone(),
            awaited.clone(),
            failed.clone(),
            answered.clone(),
        );
        executor.spawn(async move {
            let mut ticks =
                tokio::time::interval(Duration::from_micros(1_000_000 / CALLS_PER_SECOND));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                ticks.tick().await;
                let (registry, awaited, failed, answered) = (
                    registry.clone(),
                    awaited.clone(),
                    failed.clone(),
                    answered.clone(),
                );
                // One task per call, so a call slowed by the swap does not slow the rate.
                tokio::spawn(async move {
                    let Some(provider) = registry.get("reference") else {
                        failed.fetch_add(1, Ordering::Relaxed);
                        return;
                    };
                    match provider
                        .call(Request::Describe, &CallContext::default())
                        .await
                    {
                        Ok(_) => {
                            answered.fetch_add(1, Ordering::Relaxed);
                            let now = Instant::now();
                            let mut awaited = awaited.lock().expect("not poisoned");
                            if awaited.answered_at.is_none() && awaited.digest == provider.digest()
                            {
                                awaited.answered_at = Some(now);
                            }
                        }
                        Err(_) => _ = failed.fetch_add(1, Ordering::Relaxed),
                    }
                });
            }
        })
    };

    let mut events = registry.subscribe();
    let mut swaps = 0u64;
    let mut to_loaded_event = Vec::new();
    let mut group = c.benchmark_group("hot swap");
    group.sample_size(10).sampling_mode(SamplingMode::Flat);
    group.bench_function(
        "rename over → first call answered by the new bytes",
        |b| {
            b.iter_custom(|iterations| {
                let mut total = Duration::ZERO;
                for _ in 0..iterations {
                    swaps += 1;
                    let bytes =
                        with_custom_section(&original, "egress-bench-swap", &swaps.to_le_bytes());
                    let digest = hex::encode(sha2::Sha256::digest(&bytes));
                    let partial = served.with_extension("wasm.partial");
                    std::fs::write(&partial, &bytes).expect("new build written");
                    *awaited.lock().expect("not poisoned") = Awaited {
                        digest: digest.clone(),
                        answered_at: None,
                    };
                    let renamed_at = Instant::now();
                    std::fs::rename(&partial, &served).expect("renamed over");
                    let loaded_at = executor.block_on(async {
                        tokio::time::timeout(SWAP_BOUND, async {
                            loop {
                                match events.recv().await {
                                    Ok(RegistryEvent::Loaded { digest: loaded, .. })
                                        if loaded == digest =>
                                    {
                                        return Instant::now();
                                    }
                                    Ok(RegistryEvent::Rejected { error, .. }) => {
                                        panic!("new build rejected: {error}")
                                    }
                                    _ => continue,
                                }
                            }
                        })
                        .await
                        .expect("the new build loads")
                    });
                    to_loaded_event.push(loaded_at - renamed_at);
                    let answered_at = executor.block_on(async {
                        tokio::time::timeout(SWAP_BOUND, async {
                            loop {
                                if let Some(at) = awaited.lock().expect("not poisoned").answered_at
                                {
                                    return at;
                                }
                                tokio::time::sleep(Duration::from_millis(1)).await;
                            }
                        })
                        .await
                        .expect("a call is answered by the new build")
                    });
                    total += answered_at - renamed_at;
                }
                total
            })
        },
    );
    group.finish();
    callers.abort();

    to_loaded_event.sort();
    let failed = failed.load(Ordering::Relaxed);
    eprintln!(
        "hot swap: {swaps} swaps, rename → Loaded event median {:?}, {} calls answered, {failed} failed",
        to_loaded_event[to_loaded_event.len() / 2],
        answered.load(Ordering::Relaxed),
    );
    assert_eq!(failed, 0, "calls failed during hot swaps");
}

criterion_group!(benches, hot_swap);
criterion_main!(benches);
