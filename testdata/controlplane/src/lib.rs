//! A real Kubernetes control plane for the tests: etcd and kube-apiserver, built from their Go
//! modules by `testdata/controlplane/build.sh` (`just setup-test` runs it) into
//! `target/controlplane/`, and started here on free loopback ports in a temporary folder, as
//! controller-runtime's envtest starts them. No kubelet and no controller-manager: Pods never run
//! and nothing garbage-collects owned objects, but storage, watches, server-side apply, the
//! status subresource, CRD validation (schemas and CEL), admission, RBAC, Leases, Events and
//! TokenRequests are the real server's.
//!
//! # Using it in a test
//!
//! 1. [`ControlPlane::start`] starts etcd, then kube-apiserver with certificates from `rcgen`
//!    and a token for an admin (`system:masters`), and returns once `/readyz` answers.
//! 2. [`ControlPlane::client`] is a `kube::Client` as that admin; [`ControlPlane::kubeconfig`]
//!    the same for a process under test. [`ControlPlane::service_account_token`] asks the server
//!    for a ServiceAccount's token (a TokenRequest), for a client that RBAC limits.
//! 3. Break it on purpose: [`ControlPlane::kill_apiserver`] and [`ControlPlane::start_apiserver`],
//!    the same for etcd, and [`ControlPlane::compact`], which compacts etcd's history so that a
//!    watch resumed from an older `resourceVersion` gets 410 Gone.
//!
//! Dropping it kills both processes, also when the test panics; a test process killed outright
//! takes them along (they get SIGKILL when the thread that started them exits, a thread that
//! lives as long as the control plane).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, PostParams};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};

/// How long a process may take to answer after it is started.
const START_LIMIT: Duration = Duration::from_secs(90);

/// Where `build.sh` puts the binaries: `target/controlplane/NAME` of this workspace, or the
/// folder `$EGRESS_CONTROLPLANE_DIR` names.
pub fn binary(name: &str) -> PathBuf {
    let dir = std::env::var_os("EGRESS_CONTROLPLANE_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/controlplane"),
        PathBuf::from,
    );
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run `just setup-test` (testdata/controlplane/build.sh) first",
        path.display()
    );
    path
}

/// A running etcd and kube-apiserver.
pub struct ControlPlane {
    dir: tempfile::TempDir,
    spawner: Spawner,
    etcd: Option<Child>,
    apiserver: Option<Child>,
    etcd_port: u16,
    peer_port: u16,
    api_port: u16,
    ca_pem: String,
    admin_token: String,
    client: kube::Client,
}

impl ControlPlane {
    /// Start etcd and kube-apiserver; ready when this returns.
    pub async fn start() -> anyhow::Result<ControlPlane> {
        let dir = tempfile::tempdir().context("a folder for the control plane")?;
        let path = |name: &str| dir.path().join(name);

        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key)?;
        let server_key = KeyPair::generate()?;
        let mut server_params =
            CertificateParams::new(vec!["localhost".to_owned(), "kubernetes".to_owned()])?;
        server_params
            .subject_alt_names
            .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
        let server = server_params.signed_by(&server_key, &ca, &ca_key)?;
        std::fs::write(path("ca.pem"), ca.pem())?;
        std::fs::write(path("server.pem"), server.pem())?;
        std::fs::write(path("server-key.pem"), server_key.serialize_pem())?;
        // The key ServiceAccount tokens are signed with (ES256).
        let signing = KeyPair::generate()?;
        std::fs::write(path("sa-key.pem"), signing.serialize_pem())?;
        std::fs::write(path("sa.pem"), signing.public_key_pem())?;
        let admin_token = random_token();
        std::fs::write(
            path("tokens.csv"),
            format!("{admin_token},admin,admin,\"system:masters\"\n"),
        )?;

        let [etcd_port, peer_port, api_port] = free_ports::<3>()?;
        let ca_pem = ca.pem();
        let kubeconfig = kubeconfig_text(api_port, &ca_pem, &admin_token);
        std::fs::write(path("kubeconfig"), &kubeconfig)?;
        let client = client_from(&kubeconfig).await?;
        let mut plane = ControlPlane {
            dir,
            spawner: Spawner::new(),
            etcd: None,
            apiserver: None,
            etcd_port,
            peer_port,
            api_port,
            ca_pem,
            admin_token,
            client,
        };
        plane.start_etcd().await?;
        plane.start_apiserver().await?;
        Ok(plane)
    }

    /// The API server's URL (`https://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port)
    }

    /// The CA that signed the API server's certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A client as the admin (`system:masters`).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// A kubeconfig file for the admin.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// Write a kubeconfig authenticating with `token` to `path`.
    pub fn write_kubeconfig(&self, path: &Path, token: &str) -> anyhow::Result<()> {
        std::fs::write(path, kubeconfig_text(self.api_port, &self.ca_pem, token))
            .with_context(|| format!("writing {}", path.display()))
    }

    /// A client authenticating with `token`.
    pub async fn client_with_token(&self, token: &str) -> anyhow::Result<kube::Client> {
        client_from(&kubeconfig_text(self.api_port, &self.ca_pem, token)).await
    }

    /// A token for ServiceAccount `namespace/name` (made, with its namespace, if missing), valid
    /// for an hour: what a Pod running as it would present.
    pub async fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<String> {
        let namespaces: Api<Namespace> = Api::all(self.client());
        let object = serde_json::json!({"metadata": {"name": namespace}});
        create_if_missing(&namespaces, serde_json::from_value(object)?).await?;
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client(), namespace);
        let object = serde_json::json!({"metadata": {"name": name}});
        create_if_missing(&accounts, serde_json::from_value(object)?).await?;
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let issued: TokenRequest = accounts
            .create_subresource("token", name, &PostParams::default(), &request)
            .await
            .with_context(|| format!("a token for ServiceAccount {namespace}/{name}"))?;
        issued
            .status
            .and_then(|status| status.token)
            .context("the TokenRequest has no token")
    }

    /// Run the `kubectl` built beside the server (the same version) as the admin, off the async
    /// threads: whether it succeeded, its stdout and its stderr.
    pub async fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        let mut command = Command::new(binary("kubectl"));
        command
            .args(args)
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .arg("--cache-dir")
            .arg(self.dir.path().join("kubectl-cache"))
            .stdin(Stdio::null());
        let output = tokio::task::spawn_blocking(move || command.output())
            .await
            .expect("kubectl's thread")
            .expect("kubectl starts");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// [`ControlPlane::kubectl`], panicking with what it said when it fails; its stdout.
    pub async fn kubectl_ok(&self, args: &[&str]) -> String {
        let (success, stdout, stderr) = self.kubectl(args).await;
        assert!(
            success,
            "kubectl {} failed:\n{stderr}{stdout}",
            args.join(" ")
        );
        stdout
    }

    /// The API server's `/metrics` (Prometheus text).
    pub async fn metrics(&self) -> anyhow::Result<String> {
        let response = self
            .https()?
            .get(format!("{}/metrics", self.url()))
            .bearer_auth(&self.admin_token)
            .send()
            .await?
            .error_for_status()?;
        Ok(response.text().await?)
    }

    /// Start etcd (again) on its ports and data folder; returns once it is healthy.
    pub async fn start_etcd(&mut self) -> anyhow::Result<()> {
        let client = format!("http://127.0.0.1:{}", self.etcd_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut command = Command::new(binary("etcd"));
        command
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("etcd").display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=default={peer}"))
            .args(["--unsafe-no-fsync", "--log-level=warn"]);
        self.etcd = Some(self.spawn(command, "etcd.log")?);
        let http = reqwest::Client::new();
        self.wait("etcd", "etcd.log", || {
            let http = http.clone();
            let url = format!("{client}/health");
            async move {
                let response = http.get(url).send().await.ok()?;
                let body: serde_json::Value = response.json().await.ok()?;
                (body["health"] == "true").then_some(())
            }
        })
        .await
    }

    /// Start kube-apiserver (again) on its port; returns once `/readyz` answers and the
    /// namespace `default` exists.
    pub async fn start_apiserver(&mut self) -> anyhow::Result<()> {
        let path = |name: &str| self.dir.path().join(name).display().to_string();
        let url = self.url();
        let mut command = Command::new(binary("kube-apiserver"));
        command
            .arg(format!(
                "--etcd-servers=http://127.0.0.1:{}",
                self.etcd_port
            ))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={}", self.api_port))
            .arg(format!("--cert-dir={}", path("certs")))
            .arg(format!("--tls-cert-file={}", path("server.pem")))
            .arg(format!("--tls-private-key-file={}", path("server-key.pem")))
            .arg(format!("--client-ca-file={}", path("ca.pem")))
            .arg(format!("--token-auth-file={}", path("tokens.csv")))
            .args([
                "--authorization-mode=RBAC",
                "--service-cluster-ip-range=10.0.0.0/24",
            ])
            .arg(format!("--service-account-issuer={url}/"))
            .arg(format!("--service-account-key-file={}", path("sa.pem")))
            .arg(format!(
                "--service-account-signing-key-file={}",
                path("sa-key.pem")
            ))
            // No Pods run: the ServiceAccount admission plugin would only wait for tokens.
            // OwnerReferencesPermissionEnforcement, off by default, is on in some clusters: an
            // owner reference that blocks its owner's deletion needs `update` on the owner's
            // finalizers, which the tests then prove the operator's role grants.
            .args([
                "--disable-admission-plugins=ServiceAccount",
                "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
                "--profiling=false",
            ]);
        self.apiserver = Some(self.spawn(command, "apiserver.log")?);
        let https = self.https()?;
        let token = self.admin_token.clone();
        self.wait("kube-apiserver", "apiserver.log", || {
            let request = https
                .get(format!("{url}/api/v1/namespaces/default"))
                .bearer_auth(&token);
            let ready = https.get(format!("{url}/readyz")).bearer_auth(&token);
            async move {
                ready.send().await.ok()?.error_for_status().ok()?;
                request
                    .send()
                    .await
                    .ok()?
                    .error_for_status()
                    .ok()
                    .map(|_| ())
            }
        })
        .await
    }

    /// Kill kube-apiserver (SIGKILL); etcd keeps the state.
    pub fn kill_apiserver(&mut self) {
        kill(self.apiserver.take());
    }

    /// Kill etcd (SIGKILL); its data folder stays for [`ControlPlane::start_etcd`].
    pub fn kill_etcd(&mut self) {
        kill(self.etcd.take());
    }

    /// Compact etcd's history up to its current revision: a watch resumed from a
    /// `resourceVersion` before it is answered 410 Gone (once the API server's watch cache no
    /// longer holds it). Returns the revision.
    pub async fn compact(&self) -> anyhow::Result<i64> {
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{}/v3/kv", self.etcd_port);
        // A range over one key only to read the store's current revision.
        let range: serde_json::Value = http
            .post(format!("{base}/range"))
            .json(&serde_json::json!({"key": "Lw==", "limit": 1}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let revision: i64 = range["header"]["revision"]
            .as_str()
            .context("etcd's answer has no revision")?
            .parse()?;
        http.post(format!("{base}/compaction"))
            .json(&serde_json::json!({"revision": revision, "physical": true}))
            .send()
            .await?
            .error_for_status()?;
        Ok(revision)
    }

    fn https(&self) -> anyhow::Result<reqwest::Client> {
        let ca = reqwest::Certificate::from_pem(self.ca_pem.as_bytes())?;
        Ok(reqwest::Client::builder()
            .add_root_certificate(ca)
            .timeout(Duration::from_secs(10))
            .build()?)
    }

    fn spawn(&self, mut command: Command, log: &str) -> anyhow::Result<Child> {
        let log = std::fs::File::create(self.dir.path().join(log))?;
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.spawner.spawn(command)
    }

    /// Poll `ready` until it answers, at most [`START_LIMIT`]; the error holds the end of the
    /// process's log.
    async fn wait<F, Fut>(&mut self, what: &str, log: &str, mut ready: F) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<()>>,
    {
        let started = Instant::now();
        loop {
            if ready().await.is_some() {
                return Ok(());
            }
            let exited = match what {
                "etcd" => self.etcd.as_mut(),
                _ => self.apiserver.as_mut(),
            }
            .and_then(|child| child.try_wait().ok().flatten());
            if exited.is_some() || started.elapsed() > START_LIMIT {
                let text = std::fs::read_to_string(self.dir.path().join(log)).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                bail!(
                    "{what} did not become ready ({}):\n{}",
                    exited.map_or("timed out".to_owned(), |status| status.to_string()),
                    tail.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        kill(self.apiserver.take());
        kill(self.etcd.take());
    }
}

async fn create_if_missing<K>(api: &Api<K>, object: K) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(error.into()),
    }
}

fn kill(child: Option<Child>) {
    if let Some(mut child) = child {
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn kubeconfig_text(port: u16, ca_pem: &str, token: &str) -> String {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\n\
         clusters: [{{name: test, cluster: {{server: \"https://127.0.0.1:{port}\", certificate-authority-data: {ca}}}}}]\n\
         users: [{{name: test, user: {{token: \"{token}\"}}}}]\n\
         contexts: [{{name: test, context: {{cluster: test, user: test, namespace: default}}}}]\n\
         current-context: test\n"
    )
}

async fn client_from(kubeconfig: &str) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

fn random_token() -> String {
    use rand::Rng as _;
    let bytes: [u8; 24] = rand::rng().random();
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// `N` distinct ports free on loopback now.
fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

/// Starts processes from a thread that lives as long as the control plane, each with SIGKILL as
/// its parent-death signal: if the test process dies without unwinding, they die with it.
struct Spawner {
    requests: mpsc::Sender<(Command, mpsc::Sender<std::io::Result<Child>>)>,
}

impl Spawner {
    fn new() -> Spawner {
        let (requests, incoming) = mpsc::channel::<(Command, mpsc::Sender<_>)>();
        std::thread::spawn(move || {
            for (mut command, reply) in incoming {
                use std::os::unix::process::CommandExt as _;
                // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
                unsafe {
                    command.pre_exec(|| {
                        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                let _ = reply.send(command.spawn());
            }
        });
        Spawner { requests }
    }

    fn spawn(&self, command: Command) -> anyhow::Result<Child> {
        let program = command.get_program().to_owned();
        let (reply, answer) = mpsc::channel();
        self.requests
            .send((command, reply))
            .ok()
            .context("the spawning thread is gone")?;
        answer
            .recv()
            .context("the spawning thread is gone")?
            .with_context(|| format!("starting {}", program.display()))
    }
}
