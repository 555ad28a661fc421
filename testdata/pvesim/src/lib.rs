//! `pvesim`: a stateful Proxmox VE 9.2 API simulator over real HTTPS, for testing the proxmox
//! provider without a host.
//!
//! It reproduces the slice of the API a provider uses — version, cluster resources and nextid,
//! clone, config, status and power actions, resize, destroy, the guest agent's
//! `network-get-interfaces`, ISO upload and volume delete, task status, and what a provider's
//! `check` reads (`/nodes`, storage status, `/access/permissions`) — with the texts,
//! status codes and timing rules recorded from a real PVE 9.2.20 host (facts F1–F23 in the
//! Proxmox provider execution log). Every error carries its text in the reason phrase and in
//! the body's `message` (F1); 401s have an empty body.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use pvesim::{FaultAction, FaultRule, SimConfig, Simulator, Trigger};
//!
//! let sim = Simulator::start(SimConfig::default()).await?;
//! // API base: sim.url() + "/api2/json"; trust sim.ca_pem(); send sim.token_header()
//! // as the Authorization header.
//! sim.faults().add(FaultRule::new(
//!     "POST", "/nodes/*/qemu/*/clone", Trigger::Nth(1), FaultAction::LockContention,
//! ));
//! let template = sim.state().guest(9001).expect("preloaded template");
//! assert_eq!(template.config["name"], "debian-13-template");
//! # Ok(()) }
//! ```
//!
//! Preloaded: templates 9001 (`debian-13-template`, suitable) and 9000 (Ubuntu, unsuitable:
//! cloud-init drive on ide2, `tag=4` on net0) as in F19; storages `local` (iso, no images,
//! F15), `local-lvm` (images) and `proxy-seeds` (iso only). Two tokens: the main one holds
//! Datastore.Allocate on `proxy-seeds` only (the recorded setup, F13/F17); the limited one holds
//! it nowhere, so its seed deletes get 403. Every handler checks the privileges its PVE 9
//! counterpart checks and answers `403 Permission check failed (<path>, <privilege>)` when the
//! token lacks one; [`SimConfig::token_acls`] makes a main token that lacks some ([`Acl`]):
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use pvesim::{Acl, SEED_ROLE, SimConfig, Simulator, operator_role_without};
//!
//! // SDN.Use on vmbr0 itself only: untagged NICs pass, a NIC on VLAN 4 of vmbr0 gets 403.
//! let sim = Simulator::start(SimConfig {
//!     token_acls: vec![
//!         Acl::new("/", &operator_role_without(&["SDN.Use"])),
//!         Acl::new("/storage/proxy-seeds", SEED_ROLE),
//!         Acl::here_only("/sdn/zones/localnetwork/vmbr0", &["SDN.Use"]),
//!     ],
//!     ..SimConfig::default()
//! })
//! .await?;
//! # Ok(()) }
//! ```
//!
//! One node by default, `pv1-1`, the recorded host. [`SimConfig::nodes`] makes a cluster: every
//! `/nodes/{node}/…` path answers for each node, a VM is reached only through the node it lives
//! on (elsewhere F2's `does not exist`), each task is its node's, and each node has its own
//! `local`, `local-lvm` and `proxy-seeds` (a seed uploaded through one node is that node's).
//! The nodes also share [`SHARED_STORAGE`], where the templates' disks live unless
//! [`SimConfig::template_storage`] says otherwise, so a clone with `target` works; one of a
//! template on `local-lvm` is refused as Proxmox refuses it:
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use pvesim::{SimConfig, Simulator};
//!
//! let sim = Simulator::start(SimConfig {
//!     nodes: vec!["pv1-1".into(), "pv1-2".into()],
//!     ..SimConfig::default()
//! })
//! .await?;
//! // POST /nodes/pv1-1/qemu/9001/clone newid=100 target=pv1-2: VM 100 then lives on pv1-2.
//! # Ok(()) }
//! ```
//!
//! Beside the Proxmox API, an admin API under `/_sim/` (same tokens) recognises the simulator,
//! sets and clears faults, counts requests, lists VMs, and stops a VM or reboots a node as
//! happens on a real host outside the API, for tools that only hold its URL and token, such as
//! `egress-operator conformance` (see `admin.rs`). Tests in-process call the last two directly:
//! [`Simulator::stop_vm`] and [`Simulator::reboot_node`]. It also serves the conformance suite's
//! test-backend hook `POST /_egress-test/stop` (`test_hook.rs`, `docs/contract.md`), which any
//! backend may implement: the suite's only need of the admin API left is counting VMs by name.
//!
//! With [`SimConfig::service_port`], each running VM also serves a proxy endpoint of its own on
//! loopback, at the address its agent reports, for health probes; the admin API (or
//! [`Simulator::set_service`]) makes it refuse, hang or answer 503 (see `services.rs`).
//!
//! State lives in memory for the life of the [`Simulator`]; the state directory only receives
//! the CA and the tokens. Faults ([`Faults`]) and seeding ([`SimState`]) work while it runs.

#![warn(missing_docs)]

mod access;
mod admin;
mod api;
mod clone;
mod cluster;
mod faults;
mod host_events;
mod model;
mod params;
mod reply;
mod services;
mod state;
mod storage;
mod tasks;
mod test_hook;
mod tls;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

pub use access::{Acl, OPERATOR_ROLE, SEED_ROLE, operator_role_without, recorded_acls};
pub use faults::{FaultAction, FaultId, FaultRule, Faults, Trigger};
pub use host_events::NodeReboot;
pub use services::ServiceMode;
pub use state::{
    GuestKind, GuestView, LOCAL_DISK_STORAGE, RequestRecord, RunState, SHARED_STORAGE, SimState,
    TaskView, guest_ip, service_ip,
};

/// The user the simulator's tokens belong to.
pub const TOKEN_USER: &str = "egress@pve";
/// The main token's id: by default the recorded rights, Datastore.Allocate on `proxy-seeds` only.
pub const TOKEN_ID: &str = "operator";
/// The limited token's id: no Datastore.Allocate anywhere (F13, F17).
pub const LIMITED_TOKEN_ID: &str = "limited";

/// How to run a simulator.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The cluster's nodes, in order (default one, `pv1-1`, the recorded host): each answers
    /// under `/nodes/{node}/…` and names itself in the UPIDs of its tasks. The first holds the
    /// templates (and the guests added through [`SimState`]). With more than one, the cluster
    /// also has [`SHARED_STORAGE`].
    pub nodes: Vec<String>,
    /// The storage holding the templates' disks: by default [`LOCAL_DISK_STORAGE`] on one node
    /// (F19) and [`SHARED_STORAGE`] on several, so clones to another node work.
    /// `Some(LOCAL_DISK_STORAGE)` on several nodes gives a cluster whose cross-node clones are
    /// refused (`can't clone VM to node '<target>' (VM uses local storage)`).
    pub template_storage: Option<String>,
    /// How long every task runs before it ends (default 50 ms).
    pub task_latency: Duration,
    /// How long after start the agent answers `QEMU guest agent is not running` (F5).
    pub agent_delay: Duration,
    /// Where to write `ca.pem`, `token` and `limited-token`; a temporary directory if `None`.
    pub state_dir: Option<PathBuf>,
    /// Address to listen on (default `127.0.0.1:0`, a free port).
    pub listen: SocketAddr,
    /// Seed for [`Trigger::Rate`] faults, so runs repeat.
    pub fault_seed: u64,
    /// The main token's ACLs (default [`recorded_acls`]: the role on `/` and the seed role on
    /// `proxy-seeds`, F13/F17). The limited token always holds the role on `/` only.
    pub token_acls: Vec<Acl>,
    /// With a port, each VM gets a proxy service of its own: its agent reports [`service_ip`]
    /// instead of [`guest_ip`], and while it runs the simulator listens there at this port and
    /// answers an HTTP `CONNECT` with 200 ([`ServiceMode`]). Default `None`: no services, the
    /// agent reports [`guest_ip`].
    pub service_port: Option<u16>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            nodes: vec!["pv1-1".to_string()],
            template_storage: None,
            task_latency: Duration::from_millis(50),
            agent_delay: Duration::from_millis(200),
            state_dir: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            fault_seed: 0,
            token_acls: recorded_acls(),
            service_port: None,
        }
    }
}

/// A running simulator. Dropping it (or [`Simulator::shutdown`]) stops the server.
pub struct Simulator {
    url: String,
    ca_pem: String,
    ca_file: PathBuf,
    token: String,
    limited_token: String,
    server: Arc<api::Server>,
    shutdown: watch::Sender<bool>,
    _temp_dir: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for Simulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Token secrets stay out of Debug output.
        f.debug_struct("Simulator")
            .field("url", &self.url)
            .field("ca_file", &self.ca_file)
            .field("token", &format_args!("{TOKEN_USER}!{TOKEN_ID}=<redacted>"))
            .finish_non_exhaustive()
    }
}

/// At least one node, each named as `pve-node` allows (the UPID's node field), none twice.
fn check_nodes(nodes: &[String]) -> anyhow::Result<()> {
    anyhow::ensure!(!nodes.is_empty(), "a cluster needs at least one node");
    for (index, node) in nodes.iter().enumerate() {
        let bytes = node.as_bytes();
        let valid = bytes.first().is_some_and(u8::is_ascii_alphanumeric)
            && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-');
        anyhow::ensure!(
            valid,
            "node name {node:?}: letters, digits and inner hyphens only"
        );
        anyhow::ensure!(
            !nodes[..index].contains(node),
            "node {node:?} is named twice"
        );
    }
    Ok(())
}

fn new_token(tokenid: &str, acls: Vec<Acl>) -> api::Token {
    api::Token {
        user: TOKEN_USER.to_string(),
        tokenid: tokenid.to_string(),
        secret: uuid::Uuid::new_v4().to_string(),
        acls,
    }
}

fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("restricting {}", path.display()))?;
    }
    Ok(())
}

impl Simulator {
    /// Generates the CA and tokens, preloads the templates and starts serving.
    pub async fn start(config: SimConfig) -> anyhow::Result<Simulator> {
        anyhow::ensure!(
            config.service_port != Some(0),
            "the service port must be a port number, not 0: a VM's agent reports no port"
        );
        check_nodes(&config.nodes)?;
        let template_storage = config.template_storage.clone().unwrap_or_else(|| {
            match config.nodes.len() {
                1 => LOCAL_DISK_STORAGE,
                _ => SHARED_STORAGE,
            }
            .to_string()
        });
        let state = SimState::new(
            &config.nodes,
            &template_storage,
            config.service_port.map(services::Services::new),
        )
        .map_err(anyhow::Error::msg)?;
        let tls = tls::generate(&config.nodes)?;
        let (state_dir, temp_dir) = match &config.state_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                (dir.clone(), None)
            }
            None => {
                let temp = tempfile::tempdir().context("creating a temporary state directory")?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        let main_token = new_token(TOKEN_ID, config.token_acls.clone());
        let limited = new_token(LIMITED_TOKEN_ID, vec![Acl::new("/", OPERATOR_ROLE)]);
        let token = format!("{}={}", main_token.full_id(), main_token.secret);
        let limited_token = format!("{}={}", limited.full_id(), limited.secret);
        let ca_file = state_dir.join("ca.pem");
        std::fs::write(&ca_file, &tls.ca_pem)
            .with_context(|| format!("writing {}", ca_file.display()))?;
        write_private(&state_dir.join("token"), &token)?;
        write_private(&state_dir.join("limited-token"), &limited_token)?;

        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        let address = listener.local_addr()?;
        let server = Arc::new(api::Server {
            state,
            faults: Arc::new(Faults::new(config.fault_seed)),
            tokens: vec![main_token, limited],
            task_latency: config.task_latency,
            agent_delay: config.agent_delay,
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        tokio::spawn(accept_loop(
            listener,
            TlsAcceptor::from(tls.server_config),
            server.clone(),
            shutdown_rx,
        ));
        Ok(Simulator {
            url: format!("https://{address}"),
            ca_pem: tls.ca_pem,
            ca_file,
            token,
            limited_token,
            server,
            shutdown,
            _temp_dir: temp_dir,
        })
    }

    /// `https://127.0.0.1:PORT`; the API base is this plus `/api2/json`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The per-run CA in PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA written to `<state dir>/ca.pem`.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// The main token, `egress@pve!operator=<uuid secret>`.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// `PVEAPIToken=` + [`Simulator::token`], the Authorization header value.
    pub fn token_header(&self) -> String {
        format!("PVEAPIToken={}", self.token)
    }

    /// The limited token ([`OPERATOR_ROLE`] on `/`, so no Datastore.Allocate anywhere), same
    /// shape as [`Simulator::token`].
    pub fn limited_token(&self) -> &str {
        &self.limited_token
    }

    /// The Authorization header value for the limited token.
    pub fn limited_token_header(&self) -> String {
        format!("PVEAPIToken={}", self.limited_token)
    }

    /// Fault injection, live.
    pub fn faults(&self) -> &Faults {
        &self.server.faults
    }

    /// Inspect and seed the simulated host.
    pub fn state(&self) -> &SimState {
        &self.server.state
    }

    /// The cluster's nodes, in order (the first holds the templates).
    pub fn nodes(&self) -> Vec<String> {
        self.server.state.lock().nodes.clone()
    }

    /// Stops VM `vmid` at once, as `qm stop <vmid>` on the node would: `status` and `qmpstatus`
    /// become `stopped`, the guest agent answers as on a stopped VM, the config and disks stay.
    /// Fails, as `qm stop` does, for a VM that does not exist or holds a lock.
    pub fn stop_vm(&self, vmid: u32) -> anyhow::Result<()> {
        host_events::stop_vm(&self.server, vmid).map_err(|error| anyhow::anyhow!(error.message))
    }

    /// Reboots `node` (one of the simulator's): every guest on it stops at once, those on other
    /// nodes run on. With `start_onboot`, the node's `startall` task then starts its guests with
    /// `onboot=1` after the task latency, and their agents answer after the agent delay, as after
    /// any start. Without it they stay stopped (a host whose boot did not start them). Fails for
    /// a node the simulator does not have.
    pub fn reboot_node(&self, node: &str, start_onboot: bool) -> anyhow::Result<NodeReboot> {
        host_events::reboot_node(&self.server, node, start_onboot)
            .map_err(|error| anyhow::anyhow!(error.message))
    }

    /// Sets how VM `vmid`'s proxy service behaves (the simulator must run with a service port).
    /// Fails for a VM that does not exist. The listener follows before this returns.
    pub fn set_service(&self, vmid: u32, mode: ServiceMode) -> anyhow::Result<()> {
        services::set_mode(&self.server, vmid, mode).map_err(|error| anyhow::anyhow!(error.message))
    }

    /// Stops accepting and closes open connections.
    pub fn shutdown(self) {
        drop(self);
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    server: Arc<api::Server>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((tcp, _peer)) = accepted else { continue };
        let acceptor = acceptor.clone();
        let server = server.clone();
        let mut shutdown = shutdown.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = service_fn(move |request| api::handle(server.clone(), request));
            let connection = http1::Builder::new().serve_connection(TokioIo::new(tls), service);
            tokio::select! {
                _ = connection => {}
                _ = shutdown.changed() => {}
            }
        });
    }
}
