//! Kubernetes mode at scale, beside local mode in the same run: 1,000 Proxies on `pvesim`
//! (instant tasks, no agent delay) until every one is Ready.
//!
//! Kubernetes mode: a fresh kube-apiserver and etcd (`testdata/controlplane`) set up as
//! `deploy/` sets up a cluster, the release operator binary in Kubernetes mode authenticated as
//! its ServiceAccount, the ProviderConfig with its token Secret and CA ConfigMap, then the
//! Proxies created through the API as fast as it takes them. Timed from the first create until
//! a list shows every Proxy Ready. Also: the operator's peak RSS and the API requests per Proxy
//! (the API server's `apiserver_request_total` after the run minus before the first create, the
//! bench's own creates and lists taken out).
//!
//! A takeover: that operator stops and a second replica starts over the Ready Proxies, as in a
//! rollout. Timed from its start until it has looked at every Proxy's VM; also the Proxies a
//! list saw not Ready meanwhile and its requests per Proxy (goal: none but the replica's own).
//!
//! Local mode: the same fleet as `benches/local_scale.rs` runs it (the operator over a folder,
//! from its start until it exits settled).
//!
//! Run: `cargo bench -p egress-operator --bench kube_scale` (needs `just build-components` and
//! `just setup-test`, or `EGRESS_CONTROLPLANE_DIR` naming the control plane's binaries).
//! `PROXIES=100` runs a smaller fleet. Goals on a 2-core machine: Kubernetes ÷ local ≤ 1.3,
//! ≤ 200 MiB peak RSS of the Kubernetes-mode operator, a handful of writes per Proxy.
//! Not a timed test: it prints the figures.

// The tests' cluster, of which the bench uses the admin side only.
#[path = "../tests/all/cluster_support.rs"]
#[allow(dead_code)]
mod cluster_support;
mod scale_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use cluster_support::{Cluster, OPERATOR_NAMESPACE};
use egress_operator::conditions::{self};
use egress_operator::crd::{ProviderConfig, Proxy, ProxySpec};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{ListParams, PostParams};
use pvesim::Simulator;
use scale_support::{
    CONCURRENCY, LocalRun, PROVIDER_CONFIG, component, cpu_seconds, local_run, mib, provider_config,
};
use serde_json::json;

/// The Proxies' namespace.
const NAMESPACE: &str = "default";
/// The operator replica's `--pod-name`: the Lease holder.
const IDENTITY: &str = "egress-operator-bench";
/// The replica that replaces it, as a rollout or a failover would.
const NEXT_IDENTITY: &str = "egress-operator-bench-next";
/// How many Proxies the bench creates at once.
const CREATES_AT_ONCE: usize = 16;
/// How often the bench polls a condition it waits for.
const POLL: Duration = Duration::from_millis(200);
/// The processes whose CPU time the report shows.
const OPERATOR: &str = "the operator";
const APISERVER: &str = "kube-apiserver";
const ETCD: &str = "etcd";
const BENCH: &str = "the bench and pvesim";
/// How long the operator may take to start leading with its ProviderConfig Ready.
const START_LIMIT: Duration = Duration::from_secs(120);

fn main() {
    scale_support::require_component();
    let count = scale_support::proxies_from_env();
    let runtime = scale_support::runtime();
    scale_support::warm_compile_cache();
    let kube = runtime.block_on(kube_run(count));
    let local = runtime.block_on(local_run(count));
    report(count, &kube, &local);
}

/// What the Kubernetes-mode run measured.
struct KubeRun {
    /// From the first create until every Proxy was Ready.
    elapsed: Duration,
    /// Of which creating the Proxies.
    creating: Duration,
    /// The operator's peak resident set (VmHWM) once every Proxy was Ready, in bytes.
    peak_rss: u64,
    /// The API requests made while the Proxies came up, less the bench's own.
    requests: BTreeMap<Route, Count>,
    /// Watches the API server closed meanwhile because their client fell behind, by resource.
    terminated_watches: BTreeMap<String, f64>,
    /// The bench's own requests taken out of `requests`.
    bench_requests: BTreeMap<Route, Count>,
    /// CPU seconds from the first create until every Proxy was Ready, by process.
    cpu: BTreeMap<&'static str, f64>,
    /// The operator's own metrics page at the end.
    operator_metrics: String,
    /// The operator's warnings and errors, both replicas'.
    log: String,
    /// A new replica taking over the Ready Proxies.
    restart: RestartRun,
}

/// The Kubernetes-mode run: cluster, simulator, operator, then `count` Proxies.
async fn kube_run(count: usize) -> KubeRun {
    let cluster = Cluster::start().await;
    let sim = Simulator::start(scale_support::simulator_config())
        .await
        .expect("simulator");
    let files = tempfile::tempdir().unwrap();
    create_provider_config(&cluster, &sim).await;
    let token = cluster.operator_token().await;
    let first = files.path().join("first");
    std::fs::create_dir(&first).unwrap();
    let mut operator = OperatorProcess::start(&cluster, IDENTITY, &token, &first);
    operator.until_leading_and_bound(&cluster).await;

    let before = cluster
        .plane
        .metrics()
        .await
        .expect("the API server's metrics");
    let cpu_before = cpu_by_process(operator.pid());
    let proxies: Api<Proxy> = Api::namespaced(cluster.admin.clone(), NAMESPACE);
    let started = Instant::now();
    futures::stream::iter(0..count)
        .map(|index| {
            let proxies = proxies.clone();
            async move {
                let proxy = Proxy::new(
                    &format!("p{index}"),
                    ProxySpec {
                        provider_config_ref: PROVIDER_CONFIG.into(),
                        user_data: None,
                        tags: BTreeMap::new(),
                        recovery: None,
                        health_check: None,
                    },
                );
                proxies
                    .create(&PostParams::default(), &proxy)
                    .await
                    .expect("the Proxy is created");
            }
        })
        .buffer_unordered(CREATES_AT_ONCE)
        .collect::<Vec<()>>()
        .await;
    let creating = started.elapsed();
    let lists = operator.until_all_ready(&proxies, count, started).await;
    let elapsed = started.elapsed();
    let cpu = difference_by_process(&cpu_by_process(operator.pid()), &cpu_before);
    let peak_rss = scale_support::peak_rss(operator.pid()).expect("the operator's VmHWM");
    let after = until_writes_settle(&cluster).await;
    let operator_metrics = operator.metrics().await;

    let mut bench_requests = BTreeMap::new();
    bench_requests.insert(Route::proxies("POST"), Count::ok(count as f64));
    bench_requests.insert(Route::proxies("LIST"), Count::ok(lists as f64));
    let requests = operator_requests(&before, &after, &bench_requests);
    let closed_before = terminated_watchers(&before);
    let terminated_watches = terminated_watchers(&after)
        .into_iter()
        .map(|(resource, total)| {
            let closed = total - closed_before.get(&resource).copied().unwrap_or(0.0);
            (resource, closed)
        })
        .filter(|(_, closed)| *closed > 0.0)
        .collect();
    let mut log = operator.stop();
    let next = files.path().join("next");
    std::fs::create_dir(&next).unwrap();
    let (restart, next_log) = restart_run(&cluster, &proxies, count, &token, &next).await;
    log.push_str(&next_log);
    KubeRun {
        elapsed,
        creating,
        peak_rss,
        cpu,
        requests,
        terminated_watches,
        bench_requests,
        operator_metrics,
        log,
        restart,
    }
}

/// What the restart measured: a new replica taking over `count` Ready Proxies.
struct RestartRun {
    /// From its start until it had looked at every Proxy's VM (a provider `get` each).
    elapsed: Duration,
    /// Its peak resident set once the Proxies were Ready and its writes held still, in bytes.
    peak_rss: u64,
    /// The API requests made meanwhile, less the bench's own.
    requests: BTreeMap<Route, Count>,
    /// The bench's own requests taken out of `requests`.
    bench_requests: BTreeMap<Route, Count>,
    /// How many Proxies the bench's lists saw not Ready meanwhile.
    seen_not_ready: usize,
    /// The operator's own metrics page at the end.
    operator_metrics: String,
}

/// A new replica (`NEXT_IDENTITY`, with its files under `dir`) takes over `count` Ready Proxies
/// from one that stopped, as in a rollout: what it measured, and its log.
async fn restart_run(
    cluster: &Cluster,
    proxies: &Api<Proxy>,
    count: usize,
    token: &str,
    dir: &Path,
) -> (RestartRun, String) {
    let before = cluster.plane.metrics().await.unwrap();
    let started = Instant::now();
    let mut operator = OperatorProcess::start(cluster, NEXT_IDENTITY, token, dir);
    let deadline = started + Duration::from_secs(60) + Duration::from_millis(20) * count as u32;
    let mut not_ready = std::collections::HashSet::new();
    let mut lists = 0;
    let mut elapsed = None;
    loop {
        let listed = proxies.list(&ListParams::default()).await.unwrap();
        lists += 1;
        not_ready.extend(
            listed
                .items
                .iter()
                .filter(|proxy| !is_ready(proxy))
                .filter_map(|proxy| proxy.metadata.name.clone()),
        );
        let all_ready = listed.items.len() == count && listed.items.iter().all(is_ready);
        let gets = operator_counter(
            &operator.metrics_if_up().await,
            "egress_provider_calls_total",
            &[("provider", PROVIDER_CONFIG), ("operation", "get")],
        );
        if gets >= count as f64 {
            elapsed.get_or_insert_with(|| started.elapsed());
            if all_ready {
                break;
            }
        }
        operator.assert_alive_before(deadline, "every Proxy looked at and Ready");
        tokio::time::sleep(POLL).await;
    }
    let after = until_writes_settle(cluster).await;
    let peak_rss = scale_support::peak_rss(operator.pid()).expect("the operator's VmHWM");
    let operator_metrics = operator.metrics().await;
    let mut bench_requests = BTreeMap::new();
    bench_requests.insert(Route::proxies("LIST"), Count::ok(lists as f64));
    let requests = operator_requests(&before, &after, &bench_requests);
    let log = operator.stop();
    let restart = RestartRun {
        elapsed: elapsed.expect("set before the loop ends"),
        peak_rss,
        requests,
        bench_requests,
        seen_not_ready: not_ready.len(),
        operator_metrics,
    };
    (restart, log)
}

/// The requests `after` counts more than `before`, less `bench`'s (the bench's own), on
/// resources only.
fn operator_requests(
    before: &str,
    after: &str,
    bench: &BTreeMap<Route, Count>,
) -> BTreeMap<Route, Count> {
    let mut requests = difference(&request_totals(after), &request_totals(before));
    for (route, count) in bench {
        if let Some(total) = requests.get_mut(route) {
            total.all -= count.all;
        }
    }
    // Non-resource requests are the bench's scrapes of /metrics; nothing else asks for them.
    requests.retain(|route, count| !route.resource.is_empty() && count.all > 0.0);
    requests
}

/// The token Secret and CA ConfigMap in the operator's namespace, and the ProviderConfig of
/// `sim` with them, as local mode's folder has them.
async fn create_provider_config(cluster: &Cluster, sim: &Simulator) {
    let secrets: Api<Secret> = Api::namespaced(cluster.admin.clone(), OPERATOR_NAMESPACE);
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "token"},
        "stringData": {"token": sim.token()},
    });
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(secret).unwrap(),
        )
        .await
        .unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(cluster.admin.clone(), OPERATOR_NAMESPACE);
    let ca = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "ca"},
        "data": {"ca.pem": sim.ca_pem()},
    });
    maps.create(&PostParams::default(), &serde_json::from_value(ca).unwrap())
        .await
        .unwrap();
    let pc = json!({
        "apiVersion": "egress-operator.io/v1alpha1", "kind": "ProviderConfig",
        "metadata": {"name": PROVIDER_CONFIG},
        "spec": {
            "component": {"file": "proxmox.wasm"},
            "config": provider_config(sim),
            "grant": {"http": {
                "origins": [sim.url()],
                "credential": {
                    "header": "Authorization",
                    "format": "PVEAPIToken={secret}",
                    "secretRef": {"name": "token", "key": "token"},
                },
                "tls": {"caConfigMapRef": {"name": "ca", "key": "ca.pem"}, "http1Only": true},
            }},
            "limits": {"concurrency": CONCURRENCY},
        },
    });
    let pcs: Api<ProviderConfig> = Api::all(cluster.admin.clone());
    pcs.create(&PostParams::default(), &serde_json::from_value(pc).unwrap())
        .await
        .unwrap();
}

/// The operator binary running in Kubernetes mode as its ServiceAccount; killed if the bench
/// stops before [`OperatorProcess::stop`].
struct OperatorProcess {
    child: Option<Child>,
    /// Its `--pod-name`: the Lease holder while it leads.
    identity: &'static str,
    /// Its `--listen` address (/readyz, /metrics).
    listen: String,
    /// Its stderr.
    log: PathBuf,
}

impl OperatorProcess {
    /// Start `egress-operator run` against `cluster` as `identity`, authenticated with `token`,
    /// with its files under `dir`.
    fn start(
        cluster: &Cluster,
        identity: &'static str,
        token: &str,
        dir: &Path,
    ) -> OperatorProcess {
        let kubeconfig = dir.join("kubeconfig");
        cluster.plane.write_kubeconfig(&kubeconfig, token).unwrap();
        let components = dir.join("components");
        std::fs::create_dir(&components).unwrap();
        std::fs::copy(component(), components.join("proxmox.wasm")).unwrap();
        let listen = free_loopback_address();
        let log = dir.join("operator.log");
        let child = Command::new(env!("CARGO_BIN_EXE_egress-operator"))
            .arg("run")
            .args(["--namespace", OPERATOR_NAMESPACE, "--pod-name", identity])
            .arg("--components")
            .arg(&components)
            .arg("--cache-dir")
            .arg(scale_support::compile_cache())
            .arg("--image-cache")
            .arg(dir.join("images"))
            .args(["--listen", &listen])
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("the operator starts");
        OperatorProcess {
            child: Some(child),
            identity,
            listen,
            log,
        }
    }

    /// Wait until it is ready, holds the Lease and has its ProviderConfig Ready.
    async fn until_leading_and_bound(&mut self, cluster: &Cluster) {
        let http = reqwest::Client::new();
        let leases: Api<Lease> = Api::namespaced(cluster.admin.clone(), OPERATOR_NAMESPACE);
        let pcs: Api<ProviderConfig> = Api::all(cluster.admin.clone());
        let deadline = Instant::now() + START_LIMIT;
        loop {
            let ready = http
                .get(format!("http://{}/readyz", self.listen))
                .send()
                .await
                .is_ok_and(|response| response.status().is_success());
            let leading = ready
                && leases
                    .get_opt(egress_operator::kube_mode::LEASE_NAME)
                    .await
                    .unwrap()
                    .and_then(|lease| lease.spec?.holder_identity)
                    .as_deref()
                    == Some(self.identity);
            let bound = leading
                && pcs
                    .get(PROVIDER_CONFIG)
                    .await
                    .unwrap()
                    .status
                    .is_some_and(|status| {
                        status.conditions.iter().any(|condition| {
                            condition.type_ == conditions::READY && condition.status == "True"
                        })
                    });
            if bound {
                return;
            }
            self.assert_alive_before(deadline, "leading with its ProviderConfig Ready");
            tokio::time::sleep(POLL).await;
        }
    }

    /// List the Proxies every [`POLL`] until all `count` are Ready; how many lists it took.
    async fn until_all_ready(
        &mut self,
        proxies: &Api<Proxy>,
        count: usize,
        started: Instant,
    ) -> u64 {
        // A generous bound: a tenth of a second per Proxy on top of a minute.
        let deadline =
            started + Duration::from_secs(60) + Duration::from_millis(100) * count as u32;
        let mut lists = 0;
        loop {
            let listed = proxies.list(&ListParams::default()).await.unwrap();
            lists += 1;
            let ready = listed.items.iter().filter(|proxy| is_ready(proxy)).count();
            if ready == count {
                return lists;
            }
            self.assert_alive_before(deadline, &format!("{count} Proxies Ready ({ready} are)"));
            tokio::time::sleep(POLL).await;
        }
    }

    /// Panic with the end of its log if it exited or `deadline` passed before `what`.
    fn assert_alive_before(&mut self, deadline: Instant, what: &str) {
        let child = self.child.as_mut().expect("running");
        let exited = child.try_wait().expect("looking at the operator");
        if exited.is_some() || Instant::now() > deadline {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "the operator {} before {what}; its log ends:\n{}",
                exited.map_or("took too long".to_owned(), |status| format!(
                    "exited ({status})"
                )),
                tail.join("\n")
            );
        }
    }

    /// Its process ID.
    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Its `/metrics` page.
    async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.listen))
            .await
            .and_then(reqwest::Response::error_for_status)
            .expect("the operator's metrics")
            .text()
            .await
            .unwrap()
    }

    /// Its `/metrics` page, or nothing while it does not answer yet.
    async fn metrics_if_up(&self) -> String {
        match reqwest::get(format!("http://{}/metrics", self.listen)).await {
            Ok(response) => response.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// SIGTERM, and wait for it to exit (killed after 30 s); its log of warnings and errors.
    fn stop(mut self) -> String {
        let mut child = self.child.take().expect("running");
        // SAFETY: kill sends a signal to our own child, which has not been reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        let status: Option<ExitStatus> = loop {
            match child.try_wait().expect("waiting for the operator") {
                Some(status) => break Some(status),
                None if Instant::now() > deadline => break None,
                None => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let mut log = std::fs::read_to_string(&self.log).unwrap_or_default();
        match status {
            Some(status) if status.success() => {}
            Some(status) => log.push_str(&format!("(the operator exited with {status})\n")),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                log.push_str("(the operator did not stop within 30 s of SIGTERM)\n");
            }
        }
        log
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// CPU seconds used so far by the operator (`operator` is its PID), the control plane (this
/// process's children kube-apiserver and etcd) and this process (the bench and pvesim).
fn cpu_by_process(operator: u32) -> BTreeMap<&'static str, f64> {
    let me = std::process::id();
    let mut cpu = BTreeMap::new();
    cpu.insert(OPERATOR, cpu_seconds(operator).expect("the operator runs"));
    cpu.insert(BENCH, cpu_seconds(me).unwrap());
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `PID (COMMAND) STATE PPID …`
        let Some((head, tail)) = stat.rsplit_once(')') else {
            continue;
        };
        let command = head.split_once('(').map_or("", |(_, command)| command);
        let parent: Option<u32> = tail.split_whitespace().nth(1).and_then(|p| p.parse().ok());
        if parent != Some(me) {
            continue;
        }
        let name = match command {
            "kube-apiserver" => APISERVER,
            "etcd" => ETCD,
            _ => continue,
        };
        if let Some(seconds) = cpu_seconds(pid) {
            *cpu.entry(name).or_default() += seconds;
        }
    }
    cpu
}

/// `after - before`, process by process.
fn difference_by_process(
    after: &BTreeMap<&'static str, f64>,
    before: &BTreeMap<&'static str, f64>,
) -> BTreeMap<&'static str, f64> {
    after
        .iter()
        .map(|(name, seconds)| (*name, seconds - before.get(name).copied().unwrap_or(0.0)))
        .collect()
}

/// A loopback address with a port free now.
fn free_loopback_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// Whether `proxy`'s Ready condition is True.
fn is_ready(proxy: &Proxy) -> bool {
    proxy.status.as_ref().is_some_and(|status| {
        status
            .conditions
            .iter()
            .any(|condition| condition.type_ == conditions::READY && condition.status == "True")
    })
}

/// The API server's metrics once its write counts hold still for a poll (at most 10 s): the
/// last Proxies' Events are recorded after their status says Ready.
async fn until_writes_settle(cluster: &Cluster) -> String {
    let writes = |text: &str| -> f64 {
        request_totals(text)
            .iter()
            .filter(|(route, _)| route.is_write())
            .map(|(_, count)| count.all)
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = cluster.plane.metrics().await.unwrap();
    loop {
        tokio::time::sleep(POLL * 2).await;
        let now = cluster.plane.metrics().await.unwrap();
        if writes(&now) == writes(&last) || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

/// Where a request went: `apiserver_request_total`'s labels but its code.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Route {
    verb: String,
    group: String,
    resource: String,
    subresource: String,
}

impl Route {
    /// `verb` on the Proxies.
    fn proxies(verb: &str) -> Route {
        Route {
            verb: verb.into(),
            group: "egress-operator.io".into(),
            resource: "proxies".into(),
            subresource: String::new(),
        }
    }

    /// Whether the request writes: POST, PUT, PATCH (APPLY is a server-side apply's PATCH),
    /// DELETE.
    fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE" | "DELETECOLLECTION"
        )
    }

    /// `resource/subresource`.
    fn path(&self) -> String {
        match self.subresource.as_str() {
            "" => self.resource.clone(),
            sub => format!("{}/{sub}", self.resource),
        }
    }
}

/// Requests counted on one route: all of them, and those not answered 2xx by code.
#[derive(Clone, Debug, Default)]
struct Count {
    all: f64,
    failed: BTreeMap<String, f64>,
}

impl Count {
    /// `all` requests, none failed.
    fn ok(all: f64) -> Count {
        Count {
            all,
            failed: BTreeMap::new(),
        }
    }

    /// The failures as `N×CODE`, comma-separated.
    fn failures(&self) -> String {
        let failures: Vec<String> = self
            .failed
            .iter()
            .filter(|(_, count)| **count > 0.0)
            .map(|(code, count)| format!("{count}×{code}"))
            .collect();
        failures.join(", ")
    }
}

/// `apiserver_request_total` on a metrics page, summed by route.
fn request_totals(text: &str) -> BTreeMap<Route, Count> {
    let mut totals: BTreeMap<Route, Count> = BTreeMap::new();
    for (labels, value) in samples(text, "apiserver_request_total") {
        let label = |name: &str| labels.get(name).cloned().unwrap_or_default();
        let route = Route {
            verb: label("verb"),
            group: label("group"),
            resource: label("resource"),
            subresource: label("subresource"),
        };
        let total = totals.entry(route).or_default();
        total.all += value;
        let code = label("code");
        if !code.starts_with('2') {
            *total.failed.entry(code).or_default() += value;
        }
    }
    totals
}

/// `apiserver_terminated_watchers_total` on a metrics page, by resource.
fn terminated_watchers(text: &str) -> BTreeMap<String, f64> {
    let mut totals = BTreeMap::new();
    for (labels, value) in samples(text, "apiserver_terminated_watchers_total") {
        let resource = labels.get("resource").cloned().unwrap_or_default();
        *totals.entry(resource).or_default() += value;
    }
    totals
}

/// `after - before`, route by route.
fn difference(
    after: &BTreeMap<Route, Count>,
    before: &BTreeMap<Route, Count>,
) -> BTreeMap<Route, Count> {
    after
        .iter()
        .map(|(route, count)| {
            let earlier = before.get(route).cloned().unwrap_or_default();
            let failed = count
                .failed
                .iter()
                .map(|(code, failed)| {
                    let earlier = earlier.failed.get(code).copied().unwrap_or(0.0);
                    (code.clone(), failed - earlier)
                })
                .collect();
            let change = Count {
                all: count.all - earlier.all,
                failed,
            };
            (route.clone(), change)
        })
        .collect()
}

/// The samples of metric `name` on a Prometheus text page: each one's labels and value.
fn samples(text: &str, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, rest) = match rest.strip_prefix('{') {
                Some(inner) => parse_labels(inner)?,
                None if rest.starts_with(' ') => (BTreeMap::new(), rest),
                None => return None,
            };
            let value = rest.split_whitespace().next()?.parse().ok()?;
            Some((labels, value))
        })
        .collect()
}

/// The labels of a sample, from just after its `{`; and what follows its `}`.
fn parse_labels(mut text: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        text = text.trim_start_matches(',');
        if let Some(rest) = text.strip_prefix('}') {
            return Some((labels, rest));
        }
        let (name, rest) = text.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (at, '"') => break at,
                (_, '\\') => value.push(match chars.next()?.1 {
                    'n' => '\n',
                    other => other,
                }),
                (_, other) => value.push(other),
            }
        };
        labels.insert(name.to_owned(), value);
        text = &rest[end + 1..];
    }
}

/// The sum of the operator's counter `name` over the samples whose labels include `with`.
fn operator_counter(text: &str, name: &str, with: &[(&str, &str)]) -> f64 {
    samples(text, name)
        .into_iter()
        .filter(|(labels, _)| {
            with.iter()
                .all(|(label, value)| labels.get(*label).map(String::as_str) == Some(*value))
        })
        .map(|(_, value)| value)
        .sum()
}

/// Print the figures.
fn report(count: usize, kube: &KubeRun, local: &LocalRun) {
    let per = |value: f64| value / count as f64;
    let ratio = kube.elapsed.as_secs_f64() / local.elapsed.as_secs_f64();
    println!("{count} Proxies to Ready on pvesim, provider concurrency {CONCURRENCY}:");
    println!("                                  wall time   peak RSS of the operator");
    println!(
        "  Kubernetes mode                {:>8.2} s   {:>7.1} MiB (goal ≤ 200)",
        kube.elapsed.as_secs_f64(),
        mib(kube.peak_rss)
    );
    println!(
        "    of which creating them       {:>8.2} s",
        kube.creating.as_secs_f64()
    );
    println!(
        "  local mode                     {:>8.2} s   {:>7.1} MiB",
        local.elapsed.as_secs_f64(),
        mib(local.peak_rss)
    );
    println!("  ratio Kubernetes ÷ local       {ratio:>8.2}     (goal ≤ 1.3)");
    println!();
    println!("CPU seconds while the Proxies came up:  Kubernetes    local");
    let kube_cpu = |name: &str| kube.cpu.get(name).copied().unwrap_or(0.0);
    for (name, local_cpu) in [
        (OPERATOR, Some(local.cpu)),
        (APISERVER, None),
        (ETCD, None),
        (BENCH, Some(local.bench_cpu)),
    ] {
        println!(
            "  {name:<37} {:>8.2} {:>8}",
            kube_cpu(name),
            local_cpu.map_or("–".to_owned(), |cpu| format!("{cpu:.2}"))
        );
    }
    println!(
        "  {:<37} {:>8.2} {:>8.2}   (two cores: at most {:.2} and {:.2})",
        "all",
        kube.cpu.values().sum::<f64>(),
        local.cpu + local.bench_cpu,
        2.0 * kube.elapsed.as_secs_f64(),
        2.0 * local.elapsed.as_secs_f64()
    );
    println!();
    println!(
        "Kubernetes mode, API requests per Proxy (the bench's own creates and lists left out):"
    );
    print_requests(count, &kube.requests, &kube.bench_requests);
    for (resource, closed) in &kube.terminated_watches {
        println!("  watches of {resource} the API server closed for falling behind: {closed}");
    }
    println!();
    let metrics = &kube.operator_metrics;
    println!("Kubernetes mode, the operator's own counts per Proxy:");
    println!(
        "  reconciles (the reconciler core's):  {:.2}",
        per(operator_counter(
            metrics,
            "controller_runtime_reconcile_total",
            &[("controller", "proxy")]
        ))
    );
    for operation in ["create", "get"] {
        println!(
            "  provider {operation:<6} calls:              {:.2}",
            per(operator_counter(
                metrics,
                "egress_provider_calls_total",
                &[("provider", PROVIDER_CONFIG), ("operation", operation)]
            ))
        );
    }
    for (labels, value) in samples(metrics, "egress_reconcile_errors_total") {
        println!(
            "  failed reconciles ({}, {}): {value}",
            labels.get("controller").map_or("", String::as_str),
            labels.get("error").map_or("", String::as_str),
        );
    }
    let restart = &kube.restart;
    println!();
    println!("A new replica taking over the {count} Ready Proxies (the first one stopped):");
    println!(
        "  until it had looked at every Proxy's VM: {:.2} s, peak RSS {:.1} MiB",
        restart.elapsed.as_secs_f64(),
        mib(restart.peak_rss)
    );
    println!(
        "  Proxies the bench saw not Ready meanwhile: {}",
        restart.seen_not_ready
    );
    println!(
        "  reconciles (the reconciler core's) per Proxy: {:.2}",
        per(operator_counter(
            &restart.operator_metrics,
            "controller_runtime_reconcile_total",
            &[("controller", "proxy")]
        ))
    );
    println!("  API requests per Proxy (the bench's own lists left out):");
    print_requests(count, &restart.requests, &restart.bench_requests);
    let warnings: Vec<&str> = kube.log.lines().collect();
    if !warnings.is_empty() {
        println!();
        println!(
            "The operator logged {} warnings or errors; the first:",
            warnings.len()
        );
        for line in warnings.iter().take(5) {
            println!("  {line}");
        }
    }
}

/// Print `requests` per Proxy of `count`, route by route, then writes and reads, then the
/// bench's own that were left out.
fn print_requests(
    count: usize,
    requests: &BTreeMap<Route, Count>,
    bench_requests: &BTreeMap<Route, Count>,
) {
    let per = |value: f64| value / count as f64;
    println!(
        "  {:<7} {:<28} {:<20} {:>9} {:>8}  not 2xx",
        "verb", "resource", "group", "per Proxy", "in all"
    );
    for (route, total) in requests {
        println!(
            "  {:<7} {:<28} {:<20} {:>9.2} {:>8}  {}",
            route.verb,
            route.path(),
            route.group,
            per(total.all),
            total.all,
            total.failures()
        );
    }
    let writes: f64 = requests
        .iter()
        .filter(|(route, _)| route.is_write())
        .map(|(_, total)| total.all)
        .sum();
    let reads: f64 = requests.values().map(|total| total.all).sum::<f64>() - writes;
    println!(
        "  writes (POST, PUT, PATCH and APPLY, DELETE) per Proxy: {:.2}",
        per(writes)
    );
    println!(
        "  reads per Proxy:                                        {:.2}",
        per(reads)
    );
    let bench: Vec<String> = bench_requests
        .iter()
        .map(|(route, total)| format!("{} {} {}", total.all, route.verb, route.path()))
        .collect();
    println!("  the bench's own, left out: {}", bench.join(", "));
}
