//! What the scale benchmarks share: the fleet's size, the simulator with instant tasks, the
//! Proxmox provider's configuration for it, the warm compile cache, and local mode's run (the
//! operator binary over a folder of Proxies until every one is Ready).

// Each bench that includes this module uses a part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use pvesim::{SimConfig, Simulator};

/// The provider's concurrency in every run (the ProviderConfig's `limits.concurrency`).
pub const CONCURRENCY: usize = 8;

/// The ProviderConfig every Proxy names.
pub const PROVIDER_CONFIG: &str = "proxmox-lab";

/// The built Proxmox component.
pub fn component() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/components/proxmox.wasm")
}

/// Exit with a hint when the component is not built.
pub fn require_component() {
    if !component().exists() {
        eprintln!("target/components/proxmox.wasm is missing: run `just build-components` first");
        std::process::exit(2);
    }
}

/// The fleet's size: `PROXIES` from the environment, else 1,000.
pub fn proxies_from_env() -> usize {
    std::env::var("PROXIES")
        .ok()
        .and_then(|count| count.parse().ok())
        .unwrap_or(1000)
}

/// The benches' async runtime: two workers, as many as the machine's cores.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A simulator whose tasks finish at once and whose guests report an address at once.
pub fn simulator_config() -> SimConfig {
    SimConfig {
        task_latency: Duration::ZERO,
        agent_delay: Duration::ZERO,
        ..SimConfig::default()
    }
}

/// The Proxmox provider's `config` for `sim`.
pub fn provider_config(sim: &Simulator) -> serde_json::Value {
    serde_json::json!({
        "apiUrl": sim.url(), "nodes": ["pv1-1"], "templateVmid": 9001,
        "targetStorage": "local-lvm", "isoStorage": "proxy-seeds",
        "budgets": {"pollMs": 10, "cloneSeconds": 60, "runningSeconds": 60},
    })
}

/// The compile cache every run shares (the operator's `--cache-dir`).
pub fn compile_cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("scale-cache/egress-operator")
}

/// Compile the component into [`compile_cache`] once, so every run starts from compiled code.
pub fn warm_compile_cache() {
    let status = Command::new(env!("CARGO_BIN_EXE_egress-operator"))
        .args(["provider", "inspect"])
        .arg(component())
        .env("XDG_CACHE_HOME", compile_cache().parent().unwrap())
        .stdout(Stdio::null())
        .status()
        .expect("the operator runs");
    assert!(status.success(), "provider inspect failed: {status}");
}

/// A process's peak resident set so far (`VmHWM`), in bytes; `None` once it has exited.
pub fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The CPU time a running process has used (user and system), in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks as f64 / per_second as f64)
}

/// How a child process ended and what it used.
pub struct Waited {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its peak resident set, in bytes: `VmHWM` as last read before it exited.
    pub peak_rss: u64,
    /// Its CPU time, user and system, in seconds.
    pub cpu: f64,
}

/// Wait for `child` to exit, reading its peak resident set every 20 ms meanwhile. Not
/// `ru_maxrss`: Linux counts in it the parent's resident set at the time of the child's exec,
/// which after a Kubernetes-mode run in the same process is the larger. Its CPU time is what
/// this process's reaped children used more after than before (no other child ends meanwhile).
pub fn wait_measuring(mut child: Child) -> Waited {
    let pid = child.id();
    let cpu_before = children_cpu_seconds();
    let mut peak = 0;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the child") {
            break status;
        }
        peak = peak_rss(pid).unwrap_or(peak).max(peak);
        std::thread::sleep(Duration::from_millis(20));
    };
    Waited {
        status,
        peak_rss: peak,
        cpu: children_cpu_seconds() - cpu_before,
    }
}

/// The CPU time, user and system, of this process's reaped children, in seconds.
fn children_cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given; RUSAGE_CHILDREN is always valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Bytes as MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// What a local-mode run measured.
pub struct LocalRun {
    /// From the operator's start until it exited settled.
    pub elapsed: Duration,
    /// The operator's peak resident set, in bytes.
    pub peak_rss: u64,
    /// The operator's CPU time, in seconds.
    pub cpu: f64,
    /// This process's CPU time meanwhile (pvesim's, mostly), in seconds.
    pub bench_cpu: f64,
}

/// Local mode: the operator binary over a folder of `count` Proxies on a fresh simulator, from
/// its start until it exits settled with every Proxy Ready.
pub async fn local_run(count: usize) -> LocalRun {
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
            "apiVersion: egress-operator.io/v1alpha1\nkind: ProviderConfig\nmetadata: {{name: {PROVIDER_CONFIG}}}\nspec:\n  component: {{file: proxmox.wasm}}\n  config:\n{config}  grant:\n    http:\n      origins: [\"{url}\"]\n      credential: {{header: Authorization, format: \"PVEAPIToken={{secret}}\", secretRef: {{name: token, key: token}}}}\n      tls: {{caConfigMapRef: {{name: ca, key: ca.pem}}, http1Only: true}}\n  limits: {{concurrency: {CONCURRENCY}}}\n---\napiVersion: v1\nkind: Secret\nmetadata: {{name: token}}\nstringData: {{token: \"{token}\"}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: ca}}\ndata:\n  ca.pem: |\n{ca}",
            url = sim.url(),
            token = sim.token(),
            ca = sim.ca_pem().lines().map(|line| format!("    {line}\n")).collect::<String>(),
        ),
    )
    .unwrap();
    let proxies: String = (0..count)
        .map(|index| {
            format!("---\napiVersion: egress-operator.io/v1alpha1\nkind: Proxy\nmetadata: {{name: p{index}}}\nspec: {{providerConfigRef: {PROVIDER_CONFIG}}}\n")
        })
        .collect();
    std::fs::write(dir.path().join("proxies.yaml"), proxies).unwrap();
    let bench_cpu = cpu_seconds(std::process::id()).unwrap();
    let started = Instant::now();
    let child = Command::new(env!("CARGO_BIN_EXE_egress-operator"))
        .args(["run", "--no-table", "--exit-when-settled", "--local"])
        .arg(dir.path())
        .arg("--cache-dir")
        .arg(compile_cache())
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .expect("the operator runs");
    // The process's exit is the end of the run; waiting for it blocks, so off the workers.
    let waited = tokio::task::spawn_blocking(move || wait_measuring(child))
        .await
        .expect("the waiting thread");
    let elapsed = started.elapsed();
    let bench_cpu = cpu_seconds(std::process::id()).unwrap() - bench_cpu;
    assert!(
        waited.status.success(),
        "the operator did not settle with every Proxy Ready: {}",
        waited.status
    );
    LocalRun {
        elapsed,
        peak_rss: waited.peak_rss,
        cpu: waited.cpu,
        bench_cpu,
    }
}
