//! Request handling: faults, auth, routing and the VM endpoints, each answering with the texts
//! recorded from PVE 9.2.20 (F1–F23). The cluster-wide endpoints live in `cluster.rs`, clone in
//! `clone.rs`, the storage endpoints in `storage.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, header};
use http_body_util::{BodyExt, Full, Limited};
use serde_json::{Value, json};

use crate::access::{self, Acl, require, require_any};
use crate::admin;
use crate::clone::clone_vm;
use crate::cluster::{self, boot_disk_bytes, check_node, numeric, uptime};
use crate::faults::{Decision, FaultAction, Faults};
use crate::model;
use crate::params::{Params, is_dns_name, parse_vmid};
use crate::reply::{self, ApiError};
use crate::state::{Guest, GuestKind, Inner, RequestRecord, RunState, SimState, Task, unix_now};
use crate::storage;
use crate::tasks::{self, Work};
use crate::test_hook;

/// Largest request body accepted (uploads are seed ISOs of a few KiB to MiB).
const MAX_BODY: usize = 256 << 20;
/// How long a task waits for another task's config flock, as `lock_config` does.
const FLOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// An API token and its ACLs (privilege separation off: its user's).
#[derive(Clone)]
pub(crate) struct Token {
    pub user: String,
    pub tokenid: String,
    pub secret: String,
    pub acls: Vec<Acl>,
}

impl Token {
    pub fn full_id(&self) -> String {
        format!("{}!{}", self.user, self.tokenid)
    }
}

/// Everything a request handler needs.
pub(crate) struct Server {
    pub state: SimState,
    pub faults: Arc<Faults>,
    pub tokens: Vec<Token>,
    pub task_latency: Duration,
    pub agent_delay: Duration,
}

/// Returned to hyper to drop the connection without an answer.
#[derive(Debug)]
pub(crate) struct ConnectionReset;

impl std::fmt::Display for ConnectionReset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection reset by fault injection")
    }
}

impl std::error::Error for ConnectionReset {}

/// How a fault changes the task a request starts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TaskOverride {
    Fail(String),
    Warnings(u32),
}

/// Who asks, and how a fault changes the task the request starts.
pub(crate) struct Ctx {
    pub token: Token,
    pub task_override: Option<TaskOverride>,
}

type HttpResponse = Response<Full<Bytes>>;

/// Serves one request: fault decision, auth, dispatch, request log.
pub(crate) async fn handle<B>(
    server: Arc<Server>,
    request: Request<B>,
) -> Result<HttpResponse, ConnectionReset>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let method = request.method().as_str().to_string();
    let path = request.uri().path().to_string();
    let api_path = path.strip_prefix("/api2/json").unwrap_or(&path).to_string();
    let chunked = request
        .headers()
        .contains_key(hyper::header::TRANSFER_ENCODING);
    let log = |status: Option<u16>| {
        let record = RequestRecord {
            method: method.clone(),
            path: path.clone(),
            status,
            chunked,
        };
        server.state.lock().requests.push(record);
    };

    if path.starts_with(admin::PREFIX) {
        return Ok(admin_request(&server, request).await);
    }
    if path.starts_with(test_hook::PREFIX) {
        return Ok(test_hook_request(&server, request).await);
    }

    let mut task_override = None;
    match server.faults.decide(&method, &api_path) {
        Decision::Proceed => {}
        Decision::Act(FaultAction::Reset) => {
            log(None);
            return Err(ConnectionReset);
        }
        Decision::Act(FaultAction::Delay(delay)) => tokio::time::sleep(delay).await,
        Decision::Act(FaultAction::Status { status, message }) => {
            log(Some(status));
            return Ok(reply::error(&ApiError::new(status, message)));
        }
        Decision::Act(FaultAction::LockContention) => {
            let segments: Vec<&str> = api_path.split('/').collect();
            let vmid = segments
                .iter()
                .position(|s| *s == "qemu")
                .and_then(|i| segments.get(i + 1))
                .unwrap_or(&"0");
            log(Some(500));
            return Ok(reply::error(&ApiError::internal(lock_timeout(vmid))));
        }
        Decision::Act(FaultAction::TaskFails(text)) => {
            task_override = Some(TaskOverride::Fail(text))
        }
        Decision::Act(FaultAction::TaskWarnings(n)) => {
            task_override = Some(TaskOverride::Warnings(n))
        }
    }

    let response = match authenticate(&server, &request) {
        Err(err) => reply::error(&err),
        Ok(token) => {
            let ctx = Ctx {
                token,
                task_override,
            };
            let (parts, body) = request.into_parts();
            match Limited::new(body, MAX_BODY).collect().await {
                Err(_) => reply::error(&ApiError::new(413, "request entity too large")),
                Ok(body) => {
                    let body = body.to_bytes();
                    let content_type = parts
                        .headers
                        .get(header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    let request = ApiRequest {
                        method: parts.method,
                        api_path: api_path.clone(),
                        query: parts.uri.query().map(str::to_string),
                        content_type,
                        body,
                    };
                    match dispatch(&server, &ctx, &request).await {
                        Ok(value) => reply::data(value),
                        Err(err) => reply::error(&err),
                    }
                }
            }
        }
    };
    log(Some(response.status().as_u16()));
    Ok(response)
}

/// An admin request (see [`admin`]): authenticated like the API, never faulted nor logged.
async fn admin_request<B>(server: &Arc<Server>, request: Request<B>) -> HttpResponse
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    match authenticated(server, request).await {
        Ok((parts, body)) => {
            match admin::dispatch(server, &parts.method, parts.uri.path(), &body) {
                Ok(value) => reply::data(value),
                Err(err) => reply::error(&err),
            }
        }
        Err(refused) => refused,
    }
}

/// A test-backend hook request (see [`test_hook`]): authenticated like the API, never faulted nor
/// logged.
async fn test_hook_request<B>(server: &Arc<Server>, request: Request<B>) -> HttpResponse
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    match authenticated(server, request).await {
        Ok((parts, body)) => test_hook::answer(server, &parts.method, parts.uri.path(), &body),
        Err(refused) => refused,
    }
}

/// The head and whole body of a request outside the Proxmox API, once its token is accepted;
/// else the answer refusing it.
async fn authenticated<B>(
    server: &Arc<Server>,
    request: Request<B>,
) -> Result<(http::request::Parts, Bytes), HttpResponse>
where
    B: hyper::body::Body<Data = Bytes> + Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    authenticate(server, &request).map_err(|err| reply::error(&err))?;
    let (parts, body) = request.into_parts();
    let Ok(body) = Limited::new(body, MAX_BODY).collect().await else {
        return Err(reply::error(&ApiError::new(
            413,
            "request entity too large",
        )));
    };
    Ok((parts, body.to_bytes()))
}

/// F22: wrong secret or unknown token → `Authentication failed!`; no credentials → `No ticket`.
fn authenticate<B>(server: &Server, request: &Request<B>) -> Result<Token, ApiError> {
    let Some(value) = request.headers().get(header::AUTHORIZATION) else {
        return Err(ApiError::new(401, "No ticket"));
    };
    let Some(credential) = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("PVEAPIToken="))
    else {
        return Err(ApiError::new(401, "No ticket"));
    };
    let failed = || ApiError::new(401, "Authentication failed!");
    let (token_id, secret) = credential.trim().split_once('=').ok_or_else(failed)?;
    server
        .tokens
        .iter()
        .find(|t| t.full_id() == token_id && t.secret == secret)
        .cloned()
        .ok_or_else(failed)
}

/// One authenticated API request, its body read.
pub(crate) struct ApiRequest {
    pub method: Method,
    pub api_path: String,
    pub query: Option<String>,
    pub content_type: String,
    pub body: Bytes,
}

impl ApiRequest {
    /// The form (or query) parameters; none from a multipart body.
    pub fn params(&self) -> Params {
        let form = if self.content_type.starts_with("multipart/") {
            &[][..]
        } else {
            &self.body[..]
        };
        Params::parse(self.query.as_deref(), form)
    }
}

fn not_implemented(request: &ApiRequest) -> ApiError {
    ApiError::new(
        501,
        format!(
            "Method '{} /api2/json{}' not implemented",
            request.method, request.api_path
        ),
    )
}

async fn dispatch(
    server: &Arc<Server>,
    ctx: &Ctx,
    request: &ApiRequest,
) -> Result<Value, ApiError> {
    let segments: Vec<String> = request
        .api_path
        .trim_matches('/')
        .split('/')
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
    let params = request.params();
    let m = &request.method;
    match segs.as_slice() {
        ["version"] if m == Method::GET => {
            params.allow(&[])?;
            Ok(json!({"release": "9.2", "version": "9.2.20", "repoid": "49318c671b82f31e"}))
        }
        ["cluster", "resources"] if m == Method::GET => {
            cluster::cluster_resources(server, ctx, &params)
        }
        ["cluster", "nextid"] if m == Method::GET => cluster::next_id(server, &params),
        ["nodes"] if m == Method::GET => cluster::list_nodes(server, &params),
        ["access", "permissions"] if m == Method::GET => {
            params.allow(&["path"])?;
            Ok(access::permissions(&ctx.token, params.get("path")))
        }
        ["nodes", node, rest @ ..] => {
            let route_known = node_route_known(m, rest);
            if !route_known {
                return Err(not_implemented(request));
            }
            check_node(server, node)?;
            node_dispatch(server, ctx, request, &params, node, rest).await
        }
        _ => Err(not_implemented(request)),
    }
}

fn node_route_known(m: &Method, rest: &[&str]) -> bool {
    matches!(
        (m.as_str(), rest),
        ("POST", ["qemu", _, "clone"])
            | ("GET" | "PUT" | "POST", ["qemu", _, "config"])
            | ("GET", ["qemu", _, "status", "current"])
            | (
                "POST",
                ["qemu", _, "status", "start" | "stop" | "suspend" | "resume"]
            )
            | ("PUT", ["qemu", _, "resize"])
            | ("DELETE", ["qemu", _])
            | ("GET", ["qemu", _, "agent", "network-get-interfaces"])
            | ("POST", ["storage", _, "upload"])
            | ("GET", ["storage", _, "content"])
            | ("GET", ["storage", _, "status"])
            | ("DELETE", ["storage", _, "content", _])
            | ("GET", ["tasks", _, "status"])
    )
}

/// A `/nodes/{node}/…` request, `node` one of the cluster's: it runs there, so a VM it names must
/// live there and a task it starts is that node's.
async fn node_dispatch(
    server: &Arc<Server>,
    ctx: &Ctx,
    request: &ApiRequest,
    params: &Params,
    node: &str,
    rest: &[&str],
) -> Result<Value, ApiError> {
    let vm_here = |vmid: &str| parse_vmid("vmid", vmid).map(|vmid| (node, vmid));
    match (request.method.as_str(), rest) {
        ("POST", ["qemu", vmid, "clone"]) => {
            clone_vm(server, ctx, node, parse_vmid("vmid", vmid)?, params)
        }
        ("GET", ["qemu", vmid, "config"]) => get_config(server, ctx, vm_here(vmid)?, params),
        (method @ ("PUT" | "POST"), ["qemu", vmid, "config"]) => {
            set_config(server, ctx, vm_here(vmid)?, params, method == "POST")
        }
        ("GET", ["qemu", vmid, "status", "current"]) => {
            status_current(server, ctx, vm_here(vmid)?, params)
        }
        ("POST", ["qemu", vmid, "status", action]) => {
            status_action(server, ctx, vm_here(vmid)?, action, params)
        }
        ("PUT", ["qemu", vmid, "resize"]) => resize(server, ctx, vm_here(vmid)?, params),
        ("DELETE", ["qemu", vmid]) => destroy(server, ctx, vm_here(vmid)?, params),
        ("GET", ["qemu", vmid, "agent", "network-get-interfaces"]) => {
            agent_interfaces(server, ctx, vm_here(vmid)?, params)
        }
        ("POST", ["storage", id, "upload"]) => {
            storage::upload(server, ctx, node, id, request).await
        }
        ("GET", ["storage", id, "content"]) => storage::list_content(server, ctx, node, id, params),
        ("GET", ["storage", id, "status"]) => {
            storage::storage_status(server, ctx, node, id, params)
        }
        ("DELETE", ["storage", id, "content", volid]) => {
            storage::delete_volume(server, ctx, node, id, volid, params)
        }
        ("GET", ["tasks", upid, "status"]) => task_status(server, node, upid, params),
        _ => Err(not_implemented(request)),
    }
}

/// A VM as a `/nodes/{node}/qemu/{vmid}/…` path names it.
type VmAt<'a> = (&'a str, u32);

/// F2: the same text for config, status and destroy of a missing VM; a VM on another node is
/// missing here too (its conf is not in this node's directory).
fn missing_vm(node: &str, vmid: u32) -> ApiError {
    ApiError::internal(format!(
        "Configuration file 'nodes/{node}/qemu-server/{vmid}.conf' does not exist"
    ))
}

pub(crate) fn lock_timeout(vmid: impl std::fmt::Display) -> String {
    format!("can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout")
}

/// QEMU VM `vmid` on `node`, else F2's error naming `node`.
pub(crate) fn qemu<'a>(inner: &'a Inner, node: &str, vmid: u32) -> Result<&'a Guest, ApiError> {
    inner
        .guests
        .get(&vmid)
        .filter(|g| g.kind == GuestKind::Qemu && g.node == node)
        .ok_or_else(|| missing_vm(node, vmid))
}

/// [`qemu`], to change it.
fn qemu_mut<'a>(inner: &'a mut Inner, node: &str, vmid: u32) -> Result<&'a mut Guest, ApiError> {
    inner
        .guests
        .get_mut(&vmid)
        .filter(|g| g.kind == GuestKind::Qemu && g.node == node)
        .ok_or_else(|| missing_vm(node, vmid))
}

/// QEMU VM `vmid` on whichever node holds it, for what happens outside the API (`qm` on its
/// node, the admin API); else F2's error naming the first node.
pub(crate) fn qemu_on_any_node_mut(inner: &mut Inner, vmid: u32) -> Result<&mut Guest, ApiError> {
    let first = inner.first_node().to_string();
    inner
        .guests
        .get_mut(&vmid)
        .filter(|g| g.kind == GuestKind::Qemu)
        .ok_or_else(|| missing_vm(&first, vmid))
}

pub(crate) fn check_unlocked(guest: &Guest) -> Result<(), ApiError> {
    match guest.lock() {
        Some(lock) => Err(ApiError::internal(format!("VM is locked ({lock})"))),
        None => Ok(()),
    }
}

/// Who a task runs as, for its UPID and its status.
pub(crate) struct TaskOwner {
    user: String,
    tokenid: Option<String>,
}

impl TaskOwner {
    fn of_token(token: &Token) -> Self {
        TaskOwner {
            user: token.user.clone(),
            tokenid: Some(token.tokenid.clone()),
        }
    }

    /// The node itself, for work it does on its own, such as `startall` at boot.
    pub(crate) fn node() -> Self {
        TaskOwner {
            user: "root@pam".to_string(),
            tokenid: None,
        }
    }

    /// The user field of the UPID: `user!tokenid` for a token.
    fn upid_user(&self) -> String {
        match &self.tokenid {
            Some(tokenid) => format!("{}!{tokenid}", self.user),
            None => self.user.clone(),
        }
    }
}

/// Registers a task running on `node` for the request's token and starts its worker; returns
/// the UPID.
pub(crate) fn start_task(
    server: &Arc<Server>,
    ctx: &Ctx,
    inner: &mut Inner,
    node: &str,
    task_type: &str,
    id: &str,
    work: Work,
) -> String {
    let owner = TaskOwner::of_token(&ctx.token);
    let task = NewTask {
        node,
        task_type,
        id,
        task_override: ctx.task_override.clone(),
        work,
    };
    spawn_task(server, inner, &owner, task)
}

/// A task about to be registered.
pub(crate) struct NewTask<'a> {
    /// The node that runs it: its UPID names it, and only it serves its status.
    pub node: &'a str,
    /// Task type, e.g. `qmstart`.
    pub task_type: &'a str,
    /// Task id (a VMID, a storage, or empty).
    pub id: &'a str,
    /// How a fault changes it, if one fired.
    pub task_override: Option<TaskOverride>,
    /// What it does when its latency has passed.
    pub work: Work,
}

/// Registers a running task owned by `owner` and starts its worker; returns the UPID.
pub(crate) fn spawn_task(
    server: &Arc<Server>,
    inner: &mut Inner,
    owner: &TaskOwner,
    task: NewTask<'_>,
) -> String {
    inner.next_pid += 1;
    let pid = inner.next_pid;
    let starttime = unix_now();
    let upid = model::format_upid(
        task.node,
        pid,
        inner.pstart,
        starttime,
        task.task_type,
        task.id,
        &owner.upid_user(),
    );
    inner.tasks.insert(
        upid.clone(),
        Task {
            node: task.node.to_string(),
            upid: upid.clone(),
            task_type: task.task_type.to_string(),
            id: task.id.to_string(),
            user: owner.user.clone(),
            tokenid: owner.tokenid.clone(),
            pid,
            pstart: inner.pstart,
            starttime,
            exitstatus: None,
            log: Vec::new(),
        },
    );
    tokio::spawn(tasks::run(
        server.clone(),
        upid.clone(),
        task.task_override,
        task.work,
    ));
    upid
}

// ---------------------------------------------------------------- config

/// JSON rendering of config values: integer-typed properties as numbers, the rest as strings.
fn render_config(config: &BTreeMap<String, String>) -> serde_json::Map<String, Value> {
    const INTEGER_KEYS: &[&str] = &[
        "cores",
        "sockets",
        "template",
        "protection",
        "onboot",
        "numa",
        "acpi",
        "kvm",
        "tablet",
        "vcpus",
        "balloon",
    ];
    config
        .iter()
        .map(|(k, v)| {
            let value = match v.parse::<i64>() {
                Ok(n) if INTEGER_KEYS.contains(&k.as_str()) => json!(n),
                _ => json!(v),
            };
            (k.clone(), value)
        })
        .collect()
}

fn get_config(
    server: &Server,
    ctx: &Ctx,
    (node, vmid): VmAt<'_>,
    params: &Params,
) -> Result<Value, ApiError> {
    require(&ctx.token, &format!("/vms/{vmid}"), "VM.Audit")?;
    params.allow(&["current", "snapshot"])?;
    let inner = server.state.lock();
    let guest = qemu(&inner, node, vmid)?;
    let mut object = render_config(&guest.config);
    object.insert("digest".into(), json!(model::digest(&guest.config)));
    Ok(Value::Object(object))
}

fn is_config_key(key: &str) -> bool {
    const PLAIN: &[&str] = &[
        "acpi",
        "affinity",
        "agent",
        "arch",
        "args",
        "audio0",
        "autostart",
        "balloon",
        "bios",
        "boot",
        "bootdisk",
        "cicustom",
        "cipassword",
        "citype",
        "ciupgrade",
        "ciuser",
        "cores",
        "cpu",
        "cpulimit",
        "cpuunits",
        "description",
        "hookscript",
        "hotplug",
        "hugepages",
        "keyboard",
        "kvm",
        "localtime",
        "machine",
        "memory",
        "meta",
        "migrate_downtime",
        "migrate_speed",
        "name",
        "nameserver",
        "numa",
        "onboot",
        "ostype",
        "protection",
        "reboot",
        "rng0",
        "scsihw",
        "searchdomain",
        "shares",
        "smbios1",
        "sockets",
        "sshkeys",
        "startup",
        "tablet",
        "tags",
        "template",
        "tdf",
        "vcpus",
        "vga",
        "vmgenid",
        "vmstatestorage",
        "watchdog",
        "efidisk0",
        "tpmstate0",
    ];
    let indexed = |prefix: &str| {
        key.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.parse::<u32>().is_ok())
    };
    PLAIN.contains(&key)
        || model::is_drive_key(key)
        || [
            "net", "ipconfig", "serial", "unused", "hostpci", "usb", "parallel", "numa", "virtiofs",
        ]
        .iter()
        .any(|p| indexed(p))
}

/// A validated change set: keys to set and keys to delete.
struct ConfigChange {
    set: BTreeMap<String, String>,
    delete: Vec<String>,
}

fn parse_config_change(params: &Params, is_post: bool) -> Result<ConfigChange, ApiError> {
    const CONTROL: &[&str] = &["delete", "digest", "revert", "force", "skiplock"];
    params.allow_if(|k| {
        is_config_key(k) || CONTROL.contains(&k) || (is_post && k == "background_delay")
    })?;
    let mut set = BTreeMap::new();
    for (key, value) in &params.0 {
        if CONTROL.contains(&key.as_str()) || key == "background_delay" {
            continue;
        }
        let value = match key.as_str() {
            // F9: hyphens pass, case folds, `;` joins, space or `!` is refused.
            "tags" => model::normalize_tags(value).map_err(|e| ApiError::format("tags", &e))?,
            "name" if !is_dns_name(value) => {
                return Err(ApiError::format(
                    "name",
                    "value does not look like a valid DNS name",
                ));
            }
            _ => value.clone(),
        };
        set.insert(key.clone(), value);
    }
    let delete: Vec<String> = params
        .get("delete")
        .unwrap_or_default()
        .split([',', ';', ' '])
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .collect();
    if let Some(bad) = delete.iter().find(|k| !is_config_key(k)) {
        return Err(ApiError::param(
            "delete",
            format!("invalid format - invalid configuration ID '{bad}'\n"),
        ));
    }
    if let Some(both) = delete.iter().find(|k| set.contains_key(*k)) {
        return Err(ApiError::internal(format!(
            "unable to delete '{both}' - option is also set"
        )));
    }
    Ok(ConfigChange { set, delete })
}

/// Applies a change set; a newly attached drive joins the boot order (F19: `order=scsi0;ide2`).
fn apply_config_change(
    config: &mut BTreeMap<String, String>,
    set: &BTreeMap<String, String>,
    delete: &[String],
) {
    for key in delete {
        config.remove(key);
    }
    for (key, value) in set {
        let newly_attached = model::is_drive_key(key) && !config.contains_key(key);
        config.insert(key.clone(), value.clone());
        if !newly_attached || key == "efidisk0" || key == "tpmstate0" {
            continue;
        }
        if let Some(order) = config.get("boot").and_then(|b| b.strip_prefix("order="))
            && !order.split(';').any(|d| d == key)
        {
            let order = if order.is_empty() {
                key.clone()
            } else {
                format!("{order};{key}")
            };
            config.insert("boot".into(), format!("order={order}"));
        }
    }
}

fn is_nic_key(key: &str) -> bool {
    key.strip_prefix("net")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// What qemu-server checks per key as it writes the pending change: each drive set or deleted
/// ([`access::drive`]), `tags` (`VM.Config.Options`), and the bridge of a NIC being replaced or
/// deleted (its old value).
fn written_access(
    token: &Token,
    vmid: u32,
    current: &BTreeMap<String, String>,
    change: &ConfigChange,
) -> Result<(), ApiError> {
    let deleted = change
        .delete
        .iter()
        .filter_map(|key| Some((key, current.get(key)?)));
    for (key, value) in deleted.chain(&change.set) {
        if model::is_drive_key(key) {
            access::drive(token, vmid, value)?;
        } else if key == "tags" {
            require(token, &format!("/vms/{vmid}"), "VM.Config.Options")?;
        } else if is_nic_key(key)
            && let Some(old) = current.get(key)
        {
            access::bridge(token, old)?;
        }
    }
    Ok(())
}

fn set_config(
    server: &Arc<Server>,
    ctx: &Ctx,
    (node, vmid): VmAt<'_>,
    params: &Params,
    is_post: bool,
) -> Result<Value, ApiError> {
    require_any(
        &ctx.token,
        &format!("/vms/{vmid}"),
        access::VM_CONFIG_PRIVILEGES,
    )?;
    let change = parse_config_change(params, is_post)?;
    // The checks qemu-server makes before the write: each key's privilege, the volumes drives
    // name, the bridge (and VLAN) of each new NIC.
    for key in change.delete.iter().chain(change.set.keys()) {
        access::config_key(&ctx.token, vmid, key)?;
    }
    for (key, value) in &change.set {
        if model::is_drive_key(key) {
            access::volume(&ctx.token, value)?;
        } else if is_nic_key(key) {
            access::bridge(&ctx.token, value)?;
        }
    }
    let mut inner = server.state.lock();
    let guest = qemu_mut(&mut inner, node, vmid)?;
    // F7: a config write while clone-locked fails synchronously.
    check_unlocked(guest)?;
    if params
        .get("digest")
        .is_some_and(|expected| expected != model::digest(&guest.config))
    {
        return Err(ApiError::internal(
            "detected modified configuration - file changed by other user? Try again.",
        ));
    }
    let previous = guest.config.clone();
    // The checks qemu-server makes while it writes: a refusal fails the POST's task (nothing
    // changes) and answers the PUT with the 403.
    if let Err(refused) = written_access(&ctx.token, vmid, &previous, &change) {
        if !is_post {
            return Err(refused);
        }
        let task = NewTask {
            node,
            task_type: "qmconfig",
            id: &vmid.to_string(),
            task_override: Some(TaskOverride::Fail(refused.message)),
            work: Work::Config { vmid, previous },
        };
        let owner = TaskOwner::of_token(&ctx.token);
        return Ok(json!(spawn_task(server, &mut inner, &owner, task)));
    }
    apply_config_change(&mut guest.config, &change.set, &change.delete);
    if !is_post {
        return Ok(Value::Null);
    }
    let work = Work::Config { vmid, previous };
    Ok(json!(start_task(
        server,
        ctx,
        &mut inner,
        node,
        "qmconfig",
        &vmid.to_string(),
        work
    )))
}

// ---------------------------------------------------------------- status

fn agent_enabled(config: &BTreeMap<String, String>) -> bool {
    config.get("agent").is_some_and(|agent| {
        let enabled = agent
            .split(',')
            .find(|p| !p.contains('=') || p.starts_with("enabled="));
        matches!(
            enabled.map(|p| p.trim_start_matches("enabled=")),
            Some("1" | "yes" | "on" | "true")
        )
    })
}

fn status_current(
    server: &Server,
    ctx: &Ctx,
    (node, vmid): VmAt<'_>,
    params: &Params,
) -> Result<Value, ApiError> {
    require(&ctx.token, &format!("/vms/{vmid}"), "VM.Audit")?;
    params.allow(&[])?;
    let inner = server.state.lock();
    let guest = qemu(&inner, node, vmid)?;
    let config = &guest.config;
    // F14: paused (and the other QMP states but stopped) is status running.
    let (status, qmpstatus) = guest.run.words();
    let mut object = json!({
        "vmid": vmid, "status": status, "qmpstatus": qmpstatus,
        "cpus": numeric(config, "cores", 1) * numeric(config, "sockets", 1),
        "maxmem": numeric(config, "memory", 512) << 20, "maxdisk": boot_disk_bytes(config),
        "mem": 0, "cpu": 0, "disk": 0, "diskread": 0, "diskwrite": 0, "netin": 0, "netout": 0,
        "uptime": uptime(guest), "ha": {"managed": 0},
    });
    if let Some(name) = config.get("name") {
        object["name"] = json!(name);
    }
    if let Some(lock) = guest.lock() {
        object["lock"] = json!(lock);
    }
    if let Some(tags) = config.get("tags") {
        object["tags"] = json!(tags);
    }
    if agent_enabled(config) {
        object["agent"] = json!(1);
    }
    if config.get("template").is_some_and(|t| t == "1") {
        object["template"] = json!(1);
    }
    if guest.run != RunState::Stopped {
        object["pid"] = json!(100_000 + vmid % 100_000);
        object["running-machine"] = json!("pc-q35-11.0+pve0");
        object["running-qemu"] = json!("11.0.3");
    }
    Ok(object)
}

fn status_action(
    server: &Arc<Server>,
    ctx: &Ctx,
    (node, vmid): VmAt<'_>,
    action: &str,
    params: &Params,
) -> Result<Value, ApiError> {
    require(&ctx.token, &format!("/vms/{vmid}"), "VM.PowerMgmt")?;
    let mut inner = server.state.lock();
    let guest = qemu(&inner, node, vmid)?;
    let run = guest.run;
    let (task_type, work) = match action {
        "start" => {
            params.allow(&[
                "skiplock",
                "timeout",
                "machine",
                "forceCPU",
                "migratedfrom",
                "migration_type",
                "migration_network",
                "stateuri",
                "targetstorage",
            ])?;
            // F3: accepted even while clone-locked; the worker waits for the lock.
            ("qmstart", Work::Start { vmid })
        }
        "stop" => {
            params.allow(&[
                "skiplock",
                "timeout",
                "keepActive",
                "overrule-shutdown",
                "migratedfrom",
            ])?;
            ("qmstop", Work::Stop { vmid })
        }
        "suspend" => {
            params.allow(&["skiplock", "todisk", "statestorage"])?;
            if run == RunState::Stopped {
                return Err(ApiError::internal(format!("VM {vmid} not running")));
            }
            if params.get("todisk").is_some_and(|todisk| todisk == "1") {
                // Hibernation: the state saved to disk, the VM stopped with `lock: suspended`.
                ("qmsuspend", Work::Hibernate { vmid })
            } else {
                ("qmpause", Work::Pause { vmid })
            }
        }
        "resume" => {
            params.allow(&["skiplock", "nocheck"])?;
            if run == RunState::Stopped && guest.lock() != Some("suspended") {
                return Err(ApiError::internal(format!("VM {vmid} not running")));
            }
            ("qmresume", Work::Resume { vmid })
        }
        _ => {
            return Err(ApiError::new(
                501,
                format!("Method 'POST status/{action}' not implemented"),
            ));
        }
    };
    Ok(json!(start_task(
        server,
        ctx,
        &mut inner,
        node,
        task_type,
        &vmid.to_string(),
        work
    )))
}

// ---------------------------------------------------------------- resize, destroy

fn resize(
    server: &Arc<Server>,
    ctx: &Ctx,
    (node, vmid): VmAt<'_>,
    params: &Params,
) -> Result<Value, ApiError> {
    require(&ctx.token, &format!("/vms/{vmid}"), "VM.Config.Disk")?;
    params.allow(&["disk", "size", "digest", "skiplock"])?;
    let disk = params.required("disk")?.to_string();
    let size = params.required("size")?.to_string();
    if !model::is_drive_key(&disk) {
        return Err(ApiError::param(
            "disk",
            format!(
                "value '{disk}' does not have a value in the enumeration 'ide0, …, virtio15, efidisk0, tpmstate0'"
            ),
        ));
    }
    if model::parse_size(size.trim_start_matches('+')).is_none() {
        return Err(ApiError::param(
            "size",
            "value does not match the regex pattern",
        ));
    }
    let mut inner = server.state.lock();
    let guest = qemu(&inner, node, vmid)?;
    check_unlocked(guest)?;
    // The task checks Datastore.AllocateSpace on the disk's storage before it grows the disk.
    let refused = guest
        .config
        .get(&disk)
        .and_then(|drive| drive.split(',').next()?.split_once(':'))
        .and_then(|(storage, _)| {
            require(
                &ctx.token,
                &format!("/storage/{storage}"),
                "Datastore.AllocateSpace",
            )
            .err()
        });
    // F20: resize is a task; its errors show in the exitstatus.
    let task = NewTask {
        node,
        task_type: "resize",
        id: &vmid.to_string(),
        task_override: refused
            .map(|refused| TaskOverride::Fail(refused.message))
            .or_else(|| ctx.task_override.clone()),
        work: Work::Resize { vmid, disk, size },
    };
    let owner = TaskOwner::of_token(&ctx.token);
    Ok(json!(spawn_task(server, &mut inner, &owner, task)))
}

fn destroy(
    server: &Arc<Server>,
    ctx: &Ctx,
    (node, vmid): VmAt<'_>,
    params: &Params,
) -> Result<Value, ApiError> {
    require(&ctx.token, &format!("/vms/{vmid}"), "VM.Allocate")?;
    params.allow(&["purge", "destroy-unreferenced-disks", "skiplock"])?;
    params.boolean("purge")?;
    params.boolean("destroy-unreferenced-disks")?;
    let mut inner = server.state.lock();
    let guest = qemu(&inner, node, vmid)?;
    if guest.run != RunState::Stopped {
        return Err(ApiError::internal(format!(
            "VM {vmid} is running - destroy failed"
        )));
    }
    check_unlocked(guest)?;
    if guest.config.get("protection").is_some_and(|p| p == "1") {
        return Err(ApiError::internal(format!(
            "can't remove VM {vmid} - protection mode enabled"
        )));
    }
    let upid = start_task(
        server,
        ctx,
        &mut inner,
        node,
        "qmdestroy",
        &vmid.to_string(),
        Work::Destroy { vmid },
    );
    let guest = qemu_mut(&mut inner, node, vmid)?;
    guest.config.insert("lock".into(), "destroyed".into());
    guest.busy = Some(upid.clone());
    Ok(json!(upid))
}

// ---------------------------------------------------------------- agent

/// F5 and F21: three distinct 500s, then the interface list with net0's MAC on ens18.
fn agent_interfaces(
    server: &Server,
    ctx: &Ctx,
    (node, vmid): VmAt<'_>,
    params: &Params,
) -> Result<Value, ApiError> {
    // PVE 9's agent read privilege (VM.Monitor before).
    require(&ctx.token, &format!("/vms/{vmid}"), "VM.GuestAgent.Audit")?;
    params.allow(&[])?;
    let inner = server.state.lock();
    let guest = qemu(&inner, node, vmid)?;
    if !agent_enabled(&guest.config) {
        return Err(ApiError::internal("No QEMU guest agent configured"));
    }
    let started = match (guest.run, guest.started) {
        (RunState::Stopped, _) | (_, None) => {
            return Err(ApiError::internal(format!("VM {vmid} is not running")));
        }
        (RunState::Running, Some((at, _))) => at,
        // Paused, suspended or stuck: the agent cannot answer.
        (_, _) => return Err(ApiError::internal("QEMU guest agent is not running")),
    };
    if Instant::now().duration_since(started) < server.agent_delay {
        return Err(ApiError::internal("QEMU guest agent is not running"));
    }
    let mac = guest
        .config
        .get("net0")
        .and_then(|n| model::net_mac(n))
        .unwrap_or("00:00:00:00:00:00")
        .to_ascii_lowercase();
    Ok(json!({"result": [
        {"name": "lo", "hardware-address": "00:00:00:00:00:00", "ip-addresses": [
            {"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8},
            {"ip-address": "::1", "ip-address-type": "ipv6", "prefix": 128}]},
        {"name": "ens18", "hardware-address": mac, "ip-addresses": [
            {"ip-address": guest.guest_ip, "ip-address-type": "ipv4", "prefix": 24}]},
    ]}))
}

// ---------------------------------------------------------------- tasks

/// F16: the task status fields, `exitstatus` only once stopped. A task's log is kept by the node
/// that ran it (`/var/log/pve/tasks` is not in the cluster filesystem), so another node answers
/// as for a task it never had (pve-manager's `read_task_status`).
fn task_status(
    server: &Server,
    node: &str,
    upid: &str,
    params: &Params,
) -> Result<Value, ApiError> {
    params.allow(&[])?;
    if !model::is_upid(upid) {
        return Err(ApiError::param("upid", "unable to parse worker upid"));
    }
    let inner = server.state.lock();
    let Some(task) = inner.tasks.get(upid).filter(|task| task.node == node) else {
        return Err(ApiError::param("upid", "no such task"));
    };
    let mut object = json!({
        "upid": task.upid, "node": task.node, "pid": task.pid, "pstart": task.pstart,
        "starttime": task.starttime, "type": task.task_type, "id": task.id, "user": task.user,
        "status": if task.exitstatus.is_some() { "stopped" } else { "running" },
    });
    if let Some(tokenid) = &task.tokenid {
        object["tokenid"] = json!(tokenid);
    }
    if let Some(exit) = &task.exitstatus {
        object["exitstatus"] = json!(exit);
    }
    Ok(object)
}

/// Waits until no task holds the guest's config flock; `Err` after the lock_config timeout.
pub(crate) async fn wait_for_flock(server: &Server, vmid: u32) -> Result<bool, String> {
    let deadline = Instant::now() + FLOCK_TIMEOUT;
    let mut waited = false;
    loop {
        let busy = server
            .state
            .lock()
            .guests
            .get(&vmid)
            .is_some_and(|g| g.busy.is_some());
        if !busy {
            return Ok(waited);
        }
        if Instant::now() >= deadline {
            return Err(lock_timeout(vmid));
        }
        waited = true;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attaching_ide2_appends_it_to_the_boot_order() {
        let mut config = BTreeMap::from([("boot".to_string(), "order=scsi0".to_string())]);
        let set = BTreeMap::from([(
            "ide2".to_string(),
            "proxy-seeds:iso/a.iso,media=cdrom".to_string(),
        )]);
        apply_config_change(&mut config, &set, &[]);
        assert_eq!(config["boot"], "order=scsi0;ide2");
        apply_config_change(&mut config, &set, &[]);
        assert_eq!(
            config["boot"], "order=scsi0;ide2",
            "re-setting ide2 must not append twice"
        );
    }

    #[test]
    fn agent_property_forms() {
        let with = |v: &str| BTreeMap::from([("agent".to_string(), v.to_string())]);
        assert!(agent_enabled(&with("1")));
        assert!(agent_enabled(&with("enabled=1,fstrim_cloned_disks=1")));
        assert!(!agent_enabled(&with("0")));
        assert!(!agent_enabled(&BTreeMap::new()));
    }
}
