//! Kubernetes mode as a cluster user sees it, through `kubectl`: against a real kube-apiserver
//! (`cluster_support`) and `pvesim` (Proxmox VE), the installation `kubectl apply --server-side -k
//! deploy/` makes and the cluster example of `deploy/examples/proxmox/` (pointed at the
//! simulator) are applied and validated by the server, the operator runs in Kubernetes mode
//! (`kube_mode::run_with`, as `egress-operator run` runs it) as its ServiceAccount, `kubectl get
//! proxies` shows Ready, Provider and Address, `kubectl describe proxy` shows the Events the
//! operator recorded, and `kubectl delete proxy` goes through the finalizer and the VM goes from
//! the simulator.
//!
//! `kubectl` is the one built beside the server, of the same version (`just setup-test`). Every
//! wait polls with a deadline; nothing sleeps to synchronise.

use crate::cluster_support;
use crate::proxmox_support;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cluster_support::OPERATOR_NAMESPACE;
use controlplane::ControlPlane;
use egress_operator::crd::FINALIZER;
use egress_operator::installation::Installation;
use egress_operator::kube_mode::{self, Options, REPORTER};
use egress_operator::marks::vm_name;
use egress_operator::operator::{Operator, Settings};
use egress_operator::timing::Timing;
use kube::Client;
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

/// The control plane's own `kubectl`, as its admin.
struct Kubectl<'a>(&'a ControlPlane);

impl Kubectl<'_> {
    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        self.0.kubectl(args).await
    }

    async fn ok(&self, args: &[&str]) -> String {
        self.0.kubectl_ok(args).await
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
        let mut settings = Settings::new(
            Installation::new("test-cluster").unwrap(),
            components.path().to_path_buf(),
        );
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
    let plane = ControlPlane::start()
        .await
        .expect("the control plane starts");
    let pve = Simulator::start(proxmox_support::quick_sim_config())
        .await
        .expect("pvesim starts");
    let files = tempfile::tempdir().unwrap();
    let kubectl = Kubectl(&plane);

    // Installed as a user installs it, every object validated by the server: the CRDs, the
    // namespace, the RBAC, the Deployment (no Pod runs here: the operator runs in this test).
    let deploy = repo().join("deploy");
    let (ok, installed, warnings) = kubectl
        .run(&["apply", "--server-side", "-k", deploy.to_str().unwrap()])
        .await;
    assert!(
        ok && installed.contains(
            "customresourcedefinition.apiextensions.k8s.io/proxies.egress-operator.io serverside-applied"
        ),
        "{installed}{warnings}"
    );
    // Not even a warning (the server warned of every Rust integer format the CRDs carried).
    assert!(warnings.is_empty(), "{warnings}");
    kubectl
        .ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/proxies.egress-operator.io",
            "crd/providerconfigs.egress-operator.io",
        ])
        .await;
    // The ServiceMonitor, where the Prometheus operator's CRD is installed (a stand-in here).
    let stand_in = repo().join("testdata/controlplane/servicemonitor-crd.yaml");
    kubectl
        .ok(&["apply", "--server-side", "-f", stand_in.to_str().unwrap()])
        .await;
    kubectl
        .ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com",
        ])
        .await;
    let monitoring = kubectl
        .ok(&[
            "apply",
            "--server-side",
            "-k",
            deploy.join("monitoring").to_str().unwrap(),
        ])
        .await;
    assert!(
        monitoring.contains("servicemonitor.monitoring.coreos.com/egress-operator"),
        "{monitoring}"
    );

    let mut apply = vec!["apply".to_string(), "--server-side".to_string()];
    for file in render_example(&pve, files.path()) {
        apply.extend(["-f".to_string(), file.display().to_string()]);
    }
    let apply: Vec<&str> = apply.iter().map(String::as_str).collect();
    let applied = kubectl.ok(&apply).await;
    assert!(
        applied.contains("proxy.egress-operator.io/egress-a serverside-applied"),
        "{applied}"
    );

    let token = plane
        .service_account_token(OPERATOR_NAMESPACE, cluster_support::SERVICE_ACCOUNT)
        .await
        .unwrap();
    let client = plane.client_with_token(&token).await.unwrap();
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
    let stored: serde_json::Value = serde_json::to_value(
        kube::Api::<egress_operator::crd::Proxy>::namespaced(plane.client(), PROXY_NAMESPACE)
            .get(PROXY)
            .await
            .unwrap(),
    )
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

/// Issue 31: every cluster example is accepted by the real server as it stands, and each rule of
/// the CRDs the server can check refuses a bad manifest with the rule's own message, creating
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_examples_are_accepted_and_bad_manifests_refused_with_the_rules_message() {
    let cluster = cluster_support::Cluster::start().await;
    let kubectl = Kubectl(&cluster.plane);
    for example in ["proxmox", "proxmox-image", "libvirt", "cluster"] {
        let dir = repo().join("deploy/examples").join(example);
        let (ok, stdout, stderr) = kubectl
            .run(&[
                "apply",
                "--server-side",
                "--dry-run=server",
                "-k",
                dir.to_str().unwrap(),
            ])
            .await;
        assert!(ok && stderr.is_empty(), "{example}: {stdout}{stderr}");
    }

    let component = "component: {file: proxmox.wasm}";
    let pc = |name: &str, spec: &str| {
        format!(
            "apiVersion: egress-operator.io/v1alpha1\nkind: ProviderConfig\nmetadata: {{name: {name}}}\nspec:\n{spec}"
        )
    };
    let proxy = |name: &str, spec: &str| {
        format!(
            "apiVersion: egress-operator.io/v1alpha1\nkind: Proxy\nmetadata: {{name: {name}, namespace: default}}\nspec:\n{spec}"
        )
    };
    let digest = "sha256:".to_owned() + &"ab".repeat(32);
    let refused = [
        (
            pc(
                "both",
                "  component: {file: p.wasm, image: \"r.example/p@sha256:ab\"}\n",
            ),
            "component takes exactly one of file",
        ),
        (
            pc("neither", "  component: {}\n"),
            "component takes exactly one of file",
        ),
        (
            pc("tag-only", "  component: {image: \"r.example/p:1.0\"}\n"),
            "must be pinned by digest in a cluster",
        ),
        (
            pc(
                "bad-digest",
                "  component: {file: p.wasm, digest: \"sha256:xyz\"}\n",
            ),
            "component.digest is sha256: and 64 lower-case hex digits",
        ),
        (
            pc(
                "image-and-digest",
                &format!(
                    "  component: {{image: \"r.example/p@{digest}\", digest: \"{digest}\"}}\n"
                ),
            ),
            "an image is pinned by the digest in component.image",
        ),
        (
            pc(
                "sweep",
                &format!("  {component}\n  orphanSweep: {{mode: Delete, intervalSeconds: 0}}\n"),
            ),
            "orphanSweep.intervalSeconds is at least 1",
        ),
        (
            // YAML 1.1 reads a plain Off as the boolean false.
            pc(
                "plain-off",
                &format!("  {component}\n  orphanSweep: {{mode: Off}}\n"),
            ),
            ".spec.orphanSweep.mode: expected string",
        ),
        (
            pc(
                "deadline",
                &format!("  {component}\n  limits: {{deadlineSeconds: {{crate: 5}}}}\n"),
            ),
            "keys are operations",
        ),
        (
            pc(
                "memory",
                &format!("  {component}\n  limits: {{memoryMib: 0}}\n"),
            ),
            "limits.memoryMib, concurrency, httpSentMib and httpReceivedMib are at least 1",
        ),
        (
            pc("resync", &format!("  {component}\n  resyncSeconds: 0\n")),
            "resyncSeconds is at least 1",
        ),
        (
            pc(
                "window",
                &format!("  {component}\n  recovery: {{windowSeconds: 0}}\n"),
            ),
            "recovery.windowSeconds is at least 1",
        ),
        (
            proxy("nameless", "  providerConfigRef: \"\"\n"),
            "providerConfigRef must name the ProviderConfig",
        ),
        (
            proxy(
                "two-sources",
                "  providerConfigRef: lab\n  userData: {inline: \"#cloud-config\", configMapKeyRef: {name: u, key: k}}\n",
            ),
            "userData takes exactly one of inline, secretKeyRef and configMapKeyRef",
        ),
    ];
    let files = tempfile::tempdir().unwrap();
    for (index, (manifest, message)) in refused.iter().enumerate() {
        let file = files.path().join(format!("bad-{index}.yaml"));
        std::fs::write(&file, manifest).unwrap();
        let (ok, stdout, stderr) = kubectl
            .run(&["apply", "--server-side", "-f", file.to_str().unwrap()])
            .await;
        assert!(!ok, "accepted:\n{manifest}\n{stdout}");
        assert!(
            stderr.contains(message),
            "{message:?} not in:\n{stderr}\nfor:\n{manifest}"
        );
    }
    let listed = kubectl
        .ok(&["get", "providerconfigs,proxies", "-A", "-o", "name"])
        .await;
    assert!(listed.trim().is_empty(), "nothing is created: {listed}");

    // The quoted value, and a good manifest of each kind, are accepted.
    let good = [
        pc(
            "quoted-off",
            &format!("  {component}\n  orphanSweep: {{mode: \"Off\"}}\n"),
        ),
        proxy(
            "web",
            "  providerConfigRef: quoted-off\n  userData: {inline: \"#cloud-config\"}\n",
        ),
    ];
    for (index, manifest) in good.iter().enumerate() {
        let file = files.path().join(format!("good-{index}.yaml"));
        std::fs::write(&file, manifest).unwrap();
        kubectl
            .ok(&["apply", "--server-side", "-f", file.to_str().unwrap()])
            .await;
    }
}
