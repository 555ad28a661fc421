//! Hot swap as an operator sees it: the reference component served by a [`Registry`] while
//! calls run at about 200/s, its file replaced by renaming a different build over it, and the
//! time from the rename to the first call answered by the new bytes. Every call must succeed.
//!
//! Run: `cargo bench -p egress-runtime --bench hot_swap -- --warm-up-time 1 --measurement-time 3`
//! (needs `just build-components`). Goal: median ≤ 150 ms, 0 failed calls. Each swap's bytes are
//! new (a custom section with a fresh payload), so each swap misses the compile cache and pays a
//! full compile, as a real new build would.
//!
//! Two runtimes in one run: `optimized` compiles with Cranelift before the new file serves (the
//! baseline: how every swap worked before tiering), `tiered` (the default) serves from Winch's
//! code first. After each swap the bench waits, untimed, for the background compile to finish,
//! so that swaps are measured on a settled host, as a real swap (minutes apart) is.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use egress_runtime::{
    CallContext, Compilation, Digest, Registry, RegistryEvent, Request, Runtime, RuntimeConfig,
};

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
    digest: Option<Digest>,
    answered_at: Option<Instant>,
}

/// One registry serving the reference component while callers run, and the swaps made on it.
struct Swapper {
    executor: tokio::runtime::Runtime,
    registry: Registry,
    served: PathBuf,
    original: Vec<u8>,
    awaited: Arc<Mutex<Awaited>>,
    failed: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
    events: tokio::sync::broadcast::Receiver<RegistryEvent>,
    callers: tokio::task::JoinHandle<()>,
    swaps: u64,
    to_loaded_event: Vec<Duration>,
    // Dropped last: the files the registry serves and caches.
    _components: tempfile::TempDir,
    _cache: tempfile::TempDir,
}

impl Swapper {
    fn new(original: &[u8], compilation: Compilation) -> Swapper {
        let executor = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let components = tempfile::tempdir().expect("components directory");
        let cache = tempfile::tempdir().expect("compile cache directory");
        let served = components.path().join("reference.wasm");
        std::fs::write(&served, original).expect("reference written");
        // The registry's default setup, with its compile cache in a fresh directory.
        let config = RuntimeConfig::default()
            .cache_dir(Some(cache.path().to_owned()))
            .compilation(compilation);
        let runtime = Runtime::new(config).expect("runtime builds");
        let registry = executor
            .block_on(Registry::watch(runtime, components.path()))
            .expect("registry watches");
        let awaited = Arc::new(Mutex::new(Awaited::default()));
        let failed = Arc::new(AtomicUsize::new(0));
        let answered = Arc::new(AtomicUsize::new(0));
        let callers = executor.spawn(call_steadily(
            registry.clone(),
            awaited.clone(),
            failed.clone(),
            answered.clone(),
        ));
        let events = registry.subscribe();
        Swapper {
            executor,
            registry,
            served,
            original: original.to_vec(),
            awaited,
            failed,
            answered,
            events,
            callers,
            swaps: 0,
            to_loaded_event: Vec::new(),
            _components: components,
            _cache: cache,
        }
    }

    /// Rename a new build over the served file; the time until a call is answered by it.
    fn swap(&mut self) -> Duration {
        self.swaps += 1;
        let bytes = with_custom_section(
            &self.original,
            "egress-bench-swap",
            &self.swaps.to_le_bytes(),
        );
        let digest = Digest::of(&bytes);
        let partial = self.served.with_extension("wasm.partial");
        std::fs::write(&partial, &bytes).expect("new build written");
        *self.awaited.lock().expect("not poisoned") = Awaited {
            digest: Some(digest),
            answered_at: None,
        };
        let renamed_at = Instant::now();
        std::fs::rename(&partial, &self.served).expect("renamed over");
        let events = &mut self.events;
        let loaded_at = self.executor.block_on(async {
            tokio::time::timeout(SWAP_BOUND, async {
                loop {
                    match events.recv().await {
                        Ok(RegistryEvent::Loaded { digest: loaded, .. }) if loaded == digest => {
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
        self.to_loaded_event.push(loaded_at - renamed_at);
        let awaited = &self.awaited;
        let answered_at = self.executor.block_on(async {
            tokio::time::timeout(SWAP_BOUND, async {
                loop {
                    if let Some(at) = awaited.lock().expect("not poisoned").answered_at {
                        return at;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
            .await
            .expect("a call is answered by the new build")
        });
        // Untimed: let the background compile finish before the next swap.
        let provider = self.registry.get("reference").expect("served");
        self.executor.block_on(provider.optimized());
        answered_at - renamed_at
    }

    /// Stop the callers and report; every call must have succeeded.
    fn finish(mut self, name: &str) {
        self.callers.abort();
        self.to_loaded_event.sort();
        let failed = self.failed.load(Ordering::Relaxed);
        eprintln!(
            "hot swap, {name}: {} swaps, rename → Loaded event median {:?}, {} calls answered, {failed} failed",
            self.swaps,
            self.to_loaded_event[self.to_loaded_event.len() / 2],
            self.answered.load(Ordering::Relaxed),
        );
        assert_eq!(failed, 0, "calls failed during hot swaps");
    }
}

/// Call `describe` at [`CALLS_PER_SECOND`], each call its own task so that a call slowed by a
/// swap does not slow the rate; note the first call answered by the awaited digest.
async fn call_steadily(
    registry: Registry,
    awaited: Arc<Mutex<Awaited>>,
    failed: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
) {
    let mut ticks = tokio::time::interval(Duration::from_micros(1_000_000 / CALLS_PER_SECOND));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        ticks.tick().await;
        let (registry, awaited, failed, answered) = (
            registry.clone(),
            awaited.clone(),
            failed.clone(),
            answered.clone(),
        );
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
                    if awaited.answered_at.is_none()
                        && awaited.digest == Some(provider.component_digest())
                    {
                        awaited.answered_at = Some(now);
                    }
                }
                Err(_) => _ = failed.fetch_add(1, Ordering::Relaxed),
            }
        });
    }
}

fn hot_swap(c: &mut Criterion) {
    let path = reference_path();
    let original = std::fs::read(&path).unwrap_or_else(|error| {
        panic!(
            "{} is missing ({error}): run `just build-components` first",
            path.display()
        )
    });
    let mut group =
        c.benchmark_group("hot swap: rename over → first call answered by the new bytes");
    group.sample_size(10).sampling_mode(SamplingMode::Flat);
    for (name, compilation) in [
        ("optimized", Compilation::Optimized),
        ("tiered", Compilation::Tiered),
    ] {
        let mut swapper = Swapper::new(&original, compilation);
        group.bench_function(name, |b| {
            b.iter_custom(|iterations| (0..iterations).map(|_| swapper.swap()).sum())
        });
        swapper.finish(name);
    }
    group.finish();
}

criterion_group!(benches, hot_swap);
criterion_main!(benches);
