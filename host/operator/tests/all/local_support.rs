//! Local mode as a user runs it: the real `egress-operator` binary in `run --local DIR` over a
//! folder of manifests ([`Folder`]); for the Proxmox tests with the Proxmox component against an
//! in-process `pvesim` over TLS ([`Local`]). The test reads the operator's state database
//! (read-only, as `get proxies` does) and the backend's state; it never sleeps to synchronise, it
//! polls with a bound.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use egress_operator::conditions::{self, condition};
use egress_operator::crd::Phase;
use egress_operator::local::store::{PoolRecord, ProxyRecord, Store};
use pvesim::{SimConfig, Simulator};

/// The ProviderConfig of the tests, pointed at a simulator: small budgets, a one-second sweep.
pub fn provider_config(sim: &Simulator, sweep: &str) -> String {
    provider_config_named(sim, "proxmox-lab", sweep)
}

/// [`provider_config`] named `name`.
pub fn provider_config_named(sim: &Simulator, name: &str, sweep: &str) -> String {
    format!(
        r#"apiVersion: egress-operator.io/v1alpha1
kind: ProviderConfig
metadata:
  name: {name}
spec:
  component: {{file: proxmox.wasm}}
  config:
    apiUrl: {url}
    nodes: [pv1-1]
    templateVmid: 9001
    targetStorage: local-lvm
    isoStorage: proxy-seeds
    budgets: {{pollMs: 20, cloneSeconds: 10, runningSeconds: 10}}
  grant:
    http:
      origins: ["{url}"]
      credential:
        header: Authorization
        format: "PVEAPIToken={{secret}}"
        secretRef: {{name: proxmox-token, key: token}}
      tls:
        caConfigMapRef: {{name: proxmox-ca, key: ca.pem}}
        http1Only: true
  orphanSweep: {{mode: {sweep}, intervalSeconds: 1}}
"#,
        url = sim.url()
    )
}

/// The Secret with `token` and the ConfigMap with the simulator's CA.
pub fn credentials(sim: &Simulator, token: &str) -> String {
    let ca: String = sim
        .ca_pem()
        .lines()
        .map(|line| format!("    {line}\n"))
        .collect();
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: proxmox-token}}\nstringData: {{token: \"{token}\"}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: proxmox-ca}}\ndata:\n  ca.pem: |\n{ca}"
    )
}

/// A Proxy manifest.
pub fn proxy(namespace: &str, name: &str) -> String {
    format!(
        "apiVersion: egress-operator.io/v1alpha1\nkind: Proxy\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  providerConfigRef: proxmox-lab\n  tags: {{test: local}}\n  userData: {{inline: \"#cloud-config\\n\"}}\n"
    )
}

/// A simulator, a folder of manifests with the component, and the operator running over it.
pub struct Local {
    pub sim: Simulator,
    folder: Folder,
}

impl std::ops::Deref for Local {
    type Target = Folder;

    fn deref(&self) -> &Folder {
        &self.folder
    }
}

impl std::ops::DerefMut for Local {
    fn deref_mut(&mut self) -> &mut Folder {
        &mut self.folder
    }
}

/// A folder of manifests with a components folder, and the operator running over it.
pub struct Folder {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
    cache: PathBuf,
    /// The health and metrics address of the running operator, if it listens.
    listen: Option<String>,
}

impl Folder {
    /// An empty folder with `components` (files) copied into its components folder; the
    /// operator is not started yet.
    pub fn new(components: &[PathBuf]) -> Folder {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("components")).unwrap();
        for component in components {
            std::fs::copy(
                component,
                dir.path()
                    .join("components")
                    .join(component.file_name().unwrap()),
            )
            .unwrap();
        }
        Folder {
            dir,
            child: None,
            listen: None,
            cache: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("local-mode-cache"),
        }
    }
}

impl Local {
    /// A simulator whose tasks and agent answer quickly, and a folder with the ProviderConfig,
    /// its credentials and the component; the operator is not started yet.
    pub async fn new() -> Local {
        Self::with_sim(SimConfig {
            task_latency: Duration::from_millis(5),
            agent_delay: Duration::from_millis(50),
            ..SimConfig::default()
        })
        .await
    }

    pub async fn with_sim(config: SimConfig) -> Local {
        let sim = Simulator::start(config).await.expect("simulator starts");
        let local = Local {
            sim,
            folder: Folder::new(&[component()]),
        };
        local.write(
            "providerconfig.yaml",
            &provider_config(&local.sim, "Delete"),
        );
        local.write(
            "credentials.yaml",
            &credentials(&local.sim, local.sim.token()),
        );
        local
    }

    /// The simulator's VMs that are not templates: (vmid, name).
    pub fn vms(&self) -> Vec<(u32, String)> {
        let state = self.sim.state();
        state
            .vmids()
            .into_iter()
            .filter(|vmid| *vmid != 9000 && *vmid != 9001)
            .filter_map(|vmid| {
                state.guest(vmid).map(|guest| {
                    let name = guest.config.get("name").cloned().unwrap_or_default();
                    (vmid, name)
                })
            })
            .collect()
    }

    /// The seed ISOs on the simulator's seed storage.
    pub fn seeds(&self) -> Vec<String> {
        self.sim.state().volumes("proxy-seeds")
    }
}

impl Folder {
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// Write a manifest (atomically, as an editor's save would land).
    pub fn write(&self, file: &str, text: &str) {
        let partial = self.path(&format!(".{file}.partial"));
        std::fs::write(&partial, text).unwrap();
        std::fs::rename(&partial, self.path(file)).unwrap();
    }

    pub fn remove(&self, file: &str) {
        std::fs::remove_file(self.path(file)).unwrap();
    }

    /// The operator's command over this folder with `extra` arguments.
    pub fn command(&self, extra: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_egress-operator"));
        command
            .args(["run", "--local"])
            .arg(self.dir.path())
            .args(["--no-table", "--resync-seconds", "1", "--cache-dir"])
            .arg(&self.cache)
            .args(extra)
            .env("RUST_LOG", "warn,egress_operator=info")
            .stdin(Stdio::null());
        command
    }

    /// Start the operator in the background, its stderr to `operator.log` in the folder's state.
    pub fn start(&mut self) {
        self.start_with(&[]);
    }

    /// [`Local::start`] with `extra` arguments.
    pub fn start_with(&mut self, extra: &[&str]) {
        let log = std::fs::File::create(self.dir.path().join("operator.log")).unwrap();
        let child = self
            .command(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the operator starts");
        self.child = Some(child);
    }

    /// [`Local::start`] with the health and metrics port on a free loopback address, returned.
    pub fn start_listening(&mut self) -> String {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        self.start_with(&["--listen", &addr]);
        self.listen = Some(addr.clone());
        addr
    }

    /// The operator's `/metrics` page; `None` until it answers (or if it does not listen).
    pub async fn metrics(&self) -> Option<String> {
        let addr = self.listen.as_ref()?;
        let response = reqwest::get(format!("http://{addr}/metrics")).await.ok()?;
        response.text().await.ok()
    }

    /// Stop the operator as Ctrl-C (`libc::SIGINT`) or a supervisor (`libc::SIGTERM`) does:
    /// calls in flight finish, then it exits. Its exit status, waited for at most a minute.
    pub fn stop_with(&mut self, signal: i32) -> Option<std::process::ExitStatus> {
        self.listen = None;
        let mut child = self.child.take()?;
        // SAFETY: kill(2) on a child we started and have not reaped.
        unsafe {
            libc::kill(child.id() as i32, signal);
        }
        let end = Instant::now() + Duration::from_secs(60);
        while Instant::now() < end {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// Kill the operator at once (SIGKILL: a crash, no graceful anything).
    pub fn kill(&mut self) {
        self.listen = None;
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// What the operator logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("operator.log")).unwrap_or_default()
    }

    /// The stored Proxies (empty until the operator made its database).
    pub fn proxies(&self) -> Vec<ProxyRecord> {
        let path = self.dir.path().join(".egress-operator/state.db");
        if !path.exists() {
            return Vec::new();
        }
        Store::open_read_only(&path)
            .and_then(|store| store.proxies())
            .unwrap_or_default()
    }

    /// The stored ProxyPools (empty until the operator made its database).
    pub fn pools(&self) -> Vec<PoolRecord> {
        let path = self.dir.path().join(".egress-operator/state.db");
        Store::open_read_only(&path)
            .and_then(|store| store.pools())
            .unwrap_or_default()
    }

    pub fn proxy(&self, key: &str) -> Option<ProxyRecord> {
        self.proxies()
            .into_iter()
            .find(|record| record.key() == key)
    }

    /// Poll until `check` holds of the stored Proxies, at most `limit`; panics with `what`, the
    /// last state and the operator's log.
    pub fn wait_until(&self, what: &str, limit: Duration, check: impl Fn(&[ProxyRecord]) -> bool) {
        let started = Instant::now();
        loop {
            let proxies = self.proxies();
            if check(&proxies) {
                return;
            }
            if started.elapsed() > limit {
                panic!(
                    "timed out waiting for {what}; proxies: {proxies:#?}\noperator log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether `record` is Ready and Running with an address.
pub fn running(record: &ProxyRecord) -> bool {
    record.status.phase == Some(Phase::Running)
        && !record.status.addresses.is_empty()
        && condition(&record.status.conditions, conditions::READY)
            .is_some_and(|c| c.status == "True")
}

/// The reason of `record`'s condition `kind`.
pub fn reason(record: &ProxyRecord, kind: &str) -> String {
    condition(&record.status.conditions, kind).map_or_else(String::new, |c| c.reason.clone())
}

pub fn component() -> PathBuf {
    testkit::component("proxmox")
}
