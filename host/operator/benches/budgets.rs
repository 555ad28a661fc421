//! What a hostile guest can make the host hold: the host's peak RSS and open sockets while the
//! `hostile` test component attacks each per-call budget, through the real runtime and broker
//! (its HTTP to a `pvesim` simulator that answers slowly, so requests stay in flight).
//!
//! Run: `cargo bench -p egress-operator --bench budgets` (needs `just build-components`).
//! Goal: no single call raises the host's peak RSS by more than 64 MiB beyond its memory cap,
//! nor holds more sockets than its in-flight budget. Not a timed test: it prints a table.
//!
//! Peak RSS is the kernel's high-water mark (`VmHWM`), reset before each attack by writing `5`
//! to `/proc/self/clear_refs`; sockets are counted in `/proc/self/fd` by a sampling thread.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use egress_capability_set::{Capabilities, GrantsFile};
use egress_runtime::types::{CreateRequest, Request};
use egress_runtime::{CallContext, Limits, Operation, Runtime, RuntimeConfig};
use pvesim::{FaultAction, FaultRule, SimConfig, Simulator, Trigger};
use serde_json::json;

const MIB: f64 = (1 << 20) as f64;

fn component(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/components")
        .join(format!("{name}.wasm"))
}

/// A `/proc/self/status` field in bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn open_sockets() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| std::fs::read_link(entry.path()).ok())
                .filter(|target| target.to_string_lossy().starts_with("socket:"))
                .count()
        })
        .unwrap_or(0)
}

/// Samples the socket count every millisecond while an attack runs; keeps the peak.
struct SocketSampler {
    peak: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SocketSampler {
    fn start() -> Self {
        let peak = Arc::new(AtomicUsize::new(open_sockets()));
        let stop = Arc::new(AtomicBool::new(false));
        let (sampled, stopped) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                sampled.fetch_max(open_sockets(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        Self {
            peak,
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

fn main() {
    if !component("hostile").exists() || !component("misbehave").exists() {
        eprintln!("target/components/hostile.wasm is missing: run `just build-components` first");
        std::process::exit(2);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run());
}

async fn run() {
    let sim = Simulator::start(SimConfig::default())
        .await
        .expect("simulator starts");
    // Every request to the flood path waits two seconds: it stays in flight.
    sim.faults().add(FaultRule::new(
        "GET",
        "/flood/*",
        Trigger::Always,
        FaultAction::Delay(Duration::from_secs(2)),
    ));
    let files = tempfile::tempdir().unwrap();
    let secret_file = files.path().join("token");
    std::fs::write(&secret_file, sim.token()).unwrap();
    let capabilities = Capabilities::new();
    GrantsFile::parse(
        &json!({"grants": {"hostile": {"http": {
            "origins": [sim.url()],
            "credential": {"header": "Authorization", "format": "PVEAPIToken={secret}", "secretFile": secret_file},
            "tls": {"caFile": sim.ca_file(), "http1Only": true},
        }}}})
        .to_string(),
    )
    .expect("grant parses")
    .grant(&capabilities)
    .expect("grant is valid");
    let limits = Limits::default().cpu_time(Operation::Create, Duration::from_secs(2));
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("budgets-bench-cache");
    let runtime = Runtime::new(
        capabilities.serve(
            RuntimeConfig::default()
                .limits(limits.clone())
                .cache_dir(Some(cache)),
        ),
    )
    .expect("runtime");
    let hostile = runtime
        .load_file(&component("hostile"))
        .await
        .expect("hostile loads");
    let misbehave = runtime
        .load_file(&component("misbehave"))
        .await
        .expect("misbehave loads");
    // Measure on Cranelift's code, which is what serves once a load settles.
    hostile.optimized().await;
    misbehave.optimized().await;

    let endpoint = sim.url();
    let get = |attack: serde_json::Value| Request::Get {
        config: attack.to_string(),
        provider_id: "hostile/1".into(),
    };
    let attacks: Vec<(&str, Arc<egress_runtime::Provider>, Request)> = vec![
        (
            "header lists, 1 KiB each, without end",
            hostile.clone(),
            get(json!({"attack": "headers", "count": 1_000_000, "bytes": 1024})),
        ),
        (
            "one header list of 8 MiB",
            hostile.clone(),
            get(json!({"attack": "headers", "count": 1, "bytes": 8 << 20})),
        ),
        (
            "request bodies filled, never sent",
            hostile.clone(),
            get(json!({"attack": "bodies", "count": 1_000_000})),
        ),
        // Sixty: more than the in-flight budget, fewer than the handle budget allows.
        (
            "sixty requests at once to a slow server",
            hostile.clone(),
            get(json!({"attack": "requests", "endpoint": endpoint, "count": 60})),
        ),
        (
            "a 60 MiB error message",
            hostile.clone(),
            get(json!({"attack": "big-error", "mib": 60})),
        ),
        (
            "a 60 MiB VM name",
            hostile.clone(),
            get(json!({"attack": "big-name", "mib": 60})),
        ),
        (
            "120 names aliasing one 1 MiB string",
            hostile.clone(),
            Request::ListByTag {
                config: json!({"attack": "aliases", "count": 120, "mib": 1}).to_string(),
                key: "k".into(),
                value: "v".into(),
            },
        ),
        (
            "a million log lines",
            hostile.clone(),
            get(json!({"attack": "log-flood", "lines": 1_000_000})),
        ),
        (
            "one 50 MiB log message",
            hostile.clone(),
            get(json!({"attack": "log-huge", "mib": 50})),
        ),
        (
            "a create that computes forever",
            misbehave.clone(),
            Request::Create {
                request: CreateRequest {
                    name: "spin".into(),
                    uid: "u".into(),
                    tags: Vec::new(),
                    user_data: String::new(),
                    config: r#"{"mode":"spin"}"#.into(),
                    placement: None,
                },
            },
        ),
    ];

    let cap = limits.memory_bytes_limit() as f64 / MIB;
    println!(
        "memory cap per call {cap:.0} MiB; goal: peak RSS rise ≤ cap + 64 MiB = {:.0} MiB; sockets* ≤ 2 × {}",
        cap + 64.0,
        limits.requests_in_flight_limit()
    );
    println!(
        "{:<40} {:>12} {:>10} {:>9}  stopped by",
        "attack", "RSS rise MiB", "sockets*", "seconds"
    );
    let mut worst = 0.0f64;
    for (name, provider, request) in attacks {
        let baseline_sockets = open_sockets();
        let before = status_bytes("VmRSS:");
        let peak_was_reset = reset_peak();
        let sampler = SocketSampler::start();
        let started = Instant::now();
        let outcome = provider.call(request, &CallContext::default()).await;
        let elapsed = started.elapsed();
        let sockets = sampler.finish().saturating_sub(baseline_sockets);
        let rise = status_bytes("VmHWM:").saturating_sub(before) as f64 / MIB;
        worst = worst.max(rise);
        let stopped_by = match &outcome {
            Err(egress_runtime::CallError::Budget { budget, .. }) => format!("budget {budget}"),
            Err(other) => format!("{}: {}", other.class(), one_line(&other.to_string())),
            Ok(_) => "answered".to_owned(),
        };
        let rise = if peak_was_reset {
            format!("{rise:.1}")
        } else {
            "n/a".into()
        };
        println!(
            "{name:<40} {rise:>12} {sockets:>10} {:>9.2}  {stopped_by}",
            elapsed.as_secs_f64()
        );
    }
    println!("* both ends: the simulator the requests reach runs in this process");
    println!(
        "worst rise {worst:.1} MiB: {}",
        if worst <= cap + 64.0 {
            "within the goal"
        } else {
            "OVER the goal"
        }
    );
}

fn one_line(text: &str) -> String {
    let mut line: String = text.chars().take(90).collect();
    if text.chars().count() > 90 {
        line.push('…');
    }
    line
}
