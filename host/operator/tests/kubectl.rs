//! Kubernetes mode as a cluster user sees it, through `kubectl`: against `kubesim` (the API
//! server stand-in) and `pvesim` (Proxmox VE), the CRDs of `deploy/crds/` and the cluster
//! example of `deploy/examples/proxmox/` (pointed at the simulator) are applied with kubectl's
//! validation on, the operator runs in Kubernetes mode (`kube_mode::run_with`, as
//! `egress-operator run` runs it), `kubectl get proxies` shows Ready, Provider and Address,
//! `kubectl describe proxy` shows the Events the operator recorded, and `kubectl delete proxy`
//! goes through the finalizer and the VM goes from the simulator.
//!
//! Needs `kubectl` on PATH (CI's image ships 1.32; `just setup` installs Debian's
//! `kubernetes-client`, 1.20, where there is none; both pass): without it the test fails and
//! says so. Every wait
//! polls with a deadline; nothing sleeps to synchronise.

mod proxmox_support;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_operator::crd::FINALIZER;
use egress_operator::kube_mode::{self, Options, REPORTER};
use egress_operator::operator::{Operator, Settings};
use egress_operator::reconciler::{Timing, vm_name};
use kube::Client;
use kubesim::KubeSim;
use pvesim::Simulator;
use tokio::sync::oneshot;

/// The operator's namespace: where the example puts the token Secret and the CA ConfigMap.
const NAMESPACE: &str = "egress-operator";
/// The example Proxy and its namespace.
const PROXY: &str = "egress-a";
const PROXY_NAMESPACE: &str = "default";
/// Every wait is bounded by this.
const LIMIT: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `kubectl` with a kubeconfig for kubesim and a cache of its own.
struct Kubectl {
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    /// Runs kubectl off the async threads: its exit status, stdout and stderr.
    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let mut command = Command::new("kubectl");
        command
            .args(args)
            .arg("--cache-dir")
            .arg(&self.cache)
            .env("KUBECONFIG", &self.kubeconfig);
        let output = tokio::task::spawn_blocking(move || command.output())
            .await
            .expect("kubectl's thread")
            .unwrap_or_else(|error| {
                panic!(
                    "this test drives the operator with kubectl, which is not on PATH ({error}): \
                     CI's image ships it; elsewhere `just setup` installs Debian's kubernetes-client"
                )
            });
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Runs kubectl; its stdout, or a panic with what it said when it fails.
    async fn ok(&self, args: &[&str]) -> String {
        let (success, stdout, stderr) = self.run(args).await;
        assert!(
            success,
            "kubectl {} failed:\n{stderr}{stdout}",
            args.join(" ")
        );
        stdout
    }
}

/// The cells of kubectl's table output by column name (cut at the header's column starts, so
/// an empty cell reads as `""`), for the row whose first cell is `name`.
fn table_row(output: &str, name: &str) -> Option<Vec<(String, String)>> {
    let mut lines = output.lines();
    let header = lines.next()?;
    let starts: Vec<usize> = header
        .char_indices()
        .filter(|&(i, c)| c != ' ' && (i == 0 || header.as_bytes()[i - 1] == b' '))
        .map(|(i, _)| i)
        .collect();
    let row = lines.find(|line| line.split_whitespace().next() == Some(name))?;
    let cell = |text: &str, k: usize| -> String {
        let end = starts
            .get(k + 1)
            .copied()
            .unwrap_or(text.len())
            .min(text.len());
        text.get(starts[k].min(end)..end)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    Some(
        (0..starts.len())
            .map(|k| (cell(header, k), cell(row, k)))
            .collect(),
    )
}

fn column<'a>(row: &'a [(String, String)], name: &str) -> Option<&'a str> {
    row.iter()
        .find(|(header, _)| header == name)
        .map(|(_, value)| value.as_str())
}

/// Replaces `from` by `to` in `text`, failing when the example no longer has `from`.
fn replace(text: &str, from: &str, to: &str, file: &str) -> String {
    assert!(
        text.contains(from),
        "{file} no longer has {from:?}: update this test"
    );
    text.replace(from, to)
}

/// The cluster example (`deploy/examples/proxmox/`) pointed at `pve`: its URL and node, its
/// token and CA, and a short poll budget so the test takes seconds. Returns the files in the
/// order to apply.
fn render_example(pve: &Simulator, out: &Path) -> Vec<PathBuf> {
    let example = repo().join("deploy/examples/proxmox");
    let read = |name: &str| std::fs::read_to_string(example.join(name)).unwrap();
    let secret = replace(
        &read("secret.yaml"),
        "egress@pve!operator=00000000-0000-0000-0000-000000000000",
        pve.token(),
        "secret.yaml",
    );
    let at = secret
        .find("  ca.pem: |")
        .expect("secret.yaml has the CA ConfigMap");
    let ca: String = pve
        .ca_pem()
        .trim()
        .lines()
        .map(|line| format!("    {line}\n"))
        .collect();
    let secret = format!("{}  ca.pem: |\n{ca}", &secret[..at]);
    let mut config = read("providerconfig.yaml");
    for (from, to) in [
        ("https://pve.example.internal:8006", pve.url()),
        ("nodes: [pve1]", "nodes: [pv1-1]".to_string()),
        (
            "    isoStorage: proxy-seeds\n",
            "    isoStorage: proxy-seeds\n    budgets: {pollMs: 50}\n".to_string(),
        ),
    ] {
        config = replace(&config, from, &to, "providerconfig.yaml");
    }
    let mut files = vec![repo().join("deploy/namespace.yaml")];
    for (name, text) in [
        ("secret.yaml", secret),
        ("providerconfig.yaml", config),
        ("proxy.yaml", read("proxy.yaml")),
    ] {
        let path = out.join(name);
        std::fs::write(&path, text).unwrap();
        files.push(path);
    }
    files
}

/// Polls `condition` every 100 ms until it gives a value; panics naming `what` (and the last
/// thing seen) after [`LIMIT`].
async fn until<T, F, Fut>(what: &str, mut condition: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + LIMIT;
    loop {
        match condition().await {
            Ok(value) => return value,
            Err(last) if Instant::now() > deadline => {
                panic!("timed out waiting for {what}; last seen:\n{last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The operator in Kubernetes mode, in this process, with the Proxmox component.
struct RunningOperator {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<ExitCode>>,
    _components: tempfile::TempDir,
}

impl RunningOperator {
    async fn start(client: Client) -> RunningOperator {
        let components = tempfile::tempdir().unwrap();
        std::fs::copy(
            proxmox_support::component(),
            components.path().join("proxmox.wasm"),
        )
        .unwrap();
        let mut settings = Settings::new(components.path().to_path_buf());
        settings.namespace = NAMESPACE.into();
        settings.timing = Timing {
            resync: Duration::from_secs(5),
            poll_min: Duration::from_millis(100),
            poll_max: Duration::from_millis(400),
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
            not_ready_retry: Duration::from_millis(500),
            ..Timing::default()
        };
        settings.cache_dir =
            Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kube-mode-cache"));
        let operator = Operator::start(settings)
            .await
            .expect("the operator starts");
        let mut options = Options::new(NAMESPACE, "kubectl-test");
        options.lease_seconds = 2;
        options.lease_grace_seconds = 1;
        options.shutdown_grace = Duration::from_secs(10);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(kube_mode::run_with(
            client,
            Arc::clone(&operator),
            options,
            async move {
                let _ = stopped.await;
            },
        ));
        RunningOperator {
            stop,
            task,
            _components: components,
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(LIMIT, self.task)
            .await
            .expect("the operator stops in time")
            .expect("the operator task did not panic")
            .expect("the operator ran");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_applies_the_example_sees_the_proxy_ready_with_its_events_and_deletes_it() {
    let kube = KubeSim::start().await.expect("kubesim starts");
    let pve = Simulator::start(proxmox_support::quick_sim_config())
        .await
        .expect("pvesim starts");
    let files = tempfile::tempdir().unwrap();
    let kubectl = Kubectl {
        kubeconfig: files.path().join("kubeconfig"),
        cache: files.path().join("kubectl-cache"),
    };
    kube.write_kubeconfig(&kubectl.kubeconfig).unwrap();

    // Applied as a user would: validation on (kubesim serves the OpenAPI documents).
    let crds = repo().join("deploy/crds");
    kubectl.ok(&["apply", "-f", crds.to_str().unwrap()]).await;
    let mut apply = vec!["apply".to_string()];
    for file in render_example(&pve, files.path()) {
        apply.extend(["-f".to_string(), file.display().to_string()]);
    }
    let apply: Vec<&str> = apply.iter().map(String::as_str).collect();
    let applied = kubectl.ok(&apply).await;
    assert!(
        applied.contains("proxy.egress-operator.io/egress-a created"),
        "{applied}"
    );

    let client = Client::try_from(kube::Config::new(kube.url().parse().unwrap()))
        .expect("a client for kubesim");
    let operator = RunningOperator::start(client).await;

    // `kubectl get proxies`: the CRD's printer columns, filled in once the VM runs.
    let get = ["get", "proxies", "-n", PROXY_NAMESPACE];
    let row = until("kubectl get proxies to show egress-a Ready", || async {
        let output = kubectl.ok(&get).await;
        match table_row(&output, PROXY) {
            Some(row)
                if column(&row, "READY") == Some("True")
                    && column(&row, "ADDRESS").is_some_and(|a| !a.is_empty()) =>
            {
                Ok(row)
            }
            _ => Err(output),
        }
    })
    .await;
    assert_eq!(column(&row, "PROVIDER"), Some("proxmox"), "{row:?}");
    let stored = kube
        .get("/apis/egress-operator.io/v1alpha1/namespaces/default/proxies/egress-a")
        .unwrap();
    assert_eq!(
        column(&row, "ADDRESS"),
        stored["status"]["addresses"][0].as_str(),
        "the address the status holds"
    );
    assert!(
        column(&row, "AGE").is_some_and(|age| !age.is_empty()),
        "{row:?}"
    );
    let pcs = kubectl.ok(&["get", "providerconfigs"]).await;
    let pc = table_row(&pcs, "proxmox").unwrap_or_else(|| panic!("{pcs}"));
    assert_eq!(column(&pc, "READY"), Some("True"), "{pcs}");
    assert_eq!(column(&pc, "COMPONENT"), Some("proxmox.wasm"), "{pcs}");

    // `kubectl describe proxy`: the Events the operator recorded through events.k8s.io/v1.
    let describe = ["describe", "proxy", PROXY, "-n", PROXY_NAMESPACE];
    until("kubectl describe to show VMCreated and Ready", || async {
        let output = kubectl.ok(&describe).await;
        let events = output.split_once("\nEvents:").map_or("", |(_, e)| e);
        let shown = |reason: &str| {
            events.lines().any(|line| {
                let words: Vec<&str> = line.split_whitespace().collect();
                words.first() == Some(&"Normal")
                    && words.get(1) == Some(&reason)
                    && words.contains(&REPORTER)
            })
        };
        if shown("VMCreated") && shown("Ready") {
            Ok(())
        } else {
            Err(output)
        }
    })
    .await;

    // `kubectl delete proxy`: kubectl waits while the finalizer holds it; the VM goes first.
    let uid = stored["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(stored["metadata"]["finalizers"][0], FINALIZER);
    let vms = || {
        let state = pve.state();
        state
            .vmids()
            .into_iter()
            .filter_map(|vmid| state.guest(vmid))
            .filter(|guest| {
                guest.config.get("name").map(String::as_str) == Some(vm_name(&uid).as_str())
            })
            .count()
    };
    assert_eq!(vms(), 1, "the Proxy's VM runs before the delete");
    let deleted = kubectl
        .ok(&[
            "delete",
            "proxy",
            PROXY,
            "-n",
            PROXY_NAMESPACE,
            "--timeout=60s",
        ])
        .await;
    assert!(deleted.contains("deleted"), "{deleted}");
    let (found, _, stderr) = kubectl
        .run(&["get", "proxy", PROXY, "-n", PROXY_NAMESPACE])
        .await;
    assert!(!found && stderr.contains("NotFound"), "{stderr}");
    assert_eq!(
        vms(),
        0,
        "the VM went before the finalizer let the Proxy go"
    );
    operator.stop().await;
}
