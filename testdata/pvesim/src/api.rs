//! Request handling: faults, auth, routing and the endpoint handlers, each answering with the
//! texts recorded from PVE 9.2.20 (F1–F23).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, header};
use http_body_util::{BodyExt, Full, Limited};
use serde_json::{Value, json};

use crate::access::{self, Acl, require, require_any};
use crate::admin;
use crate::faults::{Decision, FaultAction, Faults};
use crate::model;
use crate::params::{Params, is_dns_name, parse_vmid};
use crate::reply::{self, ApiError, MISSING};
use crate::state::{Guest, GuestKind, Inner, RequestRecord, RunState, SimState, Task, unix_now};
use crate::tasks::{self, Work};

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
    pub node: String,
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

struct Ctx {
    token: Token,
    task_override: Option<TaskOverride>,
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
    if let Err(err) = authenticate(server, &request) {
        return reply::error(&err);
    }
    let (parts, body) = request.into_parts();
    let Ok(body) = Limited::new(body, MAX_BODY).collect().await else {
        return reply::error(&ApiError::new(413, "request entity too large"));
    };
    match admin::dispatch(server, &parts.method, parts.uri.path(), &body.to_bytes()) {
        Ok(value) => reply::data(value),
        Err(err) => reply::error(&err),
    }
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

struct ApiRequest {
    method: Method,
    api_path: String,
    query: Option<String>,
    content_type: String,
    body: Bytes,
}

impl ApiRequest {
    fn params(&self) -> Params {
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
        ["cluster", "resources"] if m == Method::GET => cluster_resources(server, ctx, &params),
        ["cluster", "nextid"] if m == Method::GET => next_id(server, &params),
        ["nodes"] if m == Method::GET => list_nodes(server, &params),
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
            node_dispatch(server, ctx, request, &params, rest).await
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

async fn node_dispatch(
    server: &Arc<Server>,
    ctx: &Ctx,
    request: &ApiRequest,
    params: &Params,
    rest: &[&str],
) -> Result<Value, ApiError> {
    match (request.method.as_str(), rest) {
        ("POST", ["qemu", vmid, "clone"]) => {
            clone_vm(server, ctx, parse_vmid("vmid", vmid)?, params)
        }
        ("GET", ["qemu", vmid, "config"]) => {
            get_config(server, ctx, parse_vmid("vmid", vmid)?, params)
        }
        (method @ ("PUT" | "POST"), ["qemu", vmid, "config"]) => set_config(
            server,
            ctx,
            parse_vmid("vmid", vmid)?,
            params,
            method == "POST",
        ),
        ("GET", ["qemu", vmid, "status", "current"]) => {
            status_current(server, ctx, parse_vmid("vmid", vmid)?, params)
        }
        ("POST", ["qemu", vmid, "status", action]) => {
            status_action(server, ctx, parse_vmid("vmid", vmid)?, action, params)
        }
        ("PUT", ["qemu", vmid, "resize"]) => resize(server, ctx, parse_vmid("vmid", vmid)?, params),
        ("DELETE", ["qemu", vmid]) => destroy(server, ctx, parse_vmid("vmid", vmid)?, params),
        ("GET", ["qemu", vmid, "agent", "network-get-interfaces"]) => {
            agent_interfaces(server, ctx, parse_vmid("vmid", vmid)?, params)
        }
        ("POST", ["storage", storage, "upload"]) => upload(server, ctx, storage, request).await,
        ("GET", ["storage", storage, "content"]) => list_content(server, ctx, storage, params),
        ("GET", ["storage", storage, "status"]) => storage_status(server, ctx, storage, params),
        ("DELETE", ["storage", storage, "content", volid]) => {
            delete_volume(server, ctx, storage, volid, params)
        }
        ("GET", ["tasks", upid, "status"]) => task_status(server, upid, params),
        _ => Err(not_implemented(request)),
    }
}

fn check_node(server: &Server, node: &str) -> Result<(), ApiError> {
    if node == server.node {
        return Ok(());
    }
    Err(ApiError::internal(format!(
        "hostname lookup '{node}' failed - failed to get address info for: {node}: Name or service not known"
    )))
}

/// F2: the same text for config, status and destroy of a missing VM.
fn missing_vm(node: &str, vmid: u32) -> ApiError {
    ApiError::internal(format!(
        "Configuration file 'nodes/{node}/qemu-server/{vmid}.conf' does not exist"
    ))
}

pub(crate) fn lock_timeout(vmid: impl std::fmt::Display) -> String {
    format!("can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout")
}

fn qemu(inner: &Inner, vmid: u32) -> Result<&Guest, ApiError> {
    inner
        .guests
        .get(&vmid)
        .filter(|g| g.kind == GuestKind::Qemu)
        .ok_or_else(|| missing_vm(&inner.node, vmid))
}

pub(crate) fn qemu_mut(inner: &mut Inner, vmid: u32) -> Result<&mut Guest, ApiError> {
    let node = inner.node.clone();
    inner
        .guests
        .get_mut(&vmid)
        .filter(|g| g.kind == GuestKind::Qemu)
        .ok_or_else(|| missing_vm(&node, vmid))
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

/// Registers a running task for the request's token and starts its worker; returns the UPID.
fn start_task(
    server: &Arc<Server>,
    ctx: &Ctx,
    inner: &mut Inner,
    task_type: &str,
    id: &str,
    work: Work,
) -> String {
    let owner = TaskOwner::of_token(&ctx.token);
    let task = NewTask {
        task_type,
        id,
        task_override: ctx.task_override.clone(),
        work,
    };
    spawn_task(server, inner, &owner, task)
}

/// A task about to be registered.
pub(crate) struct NewTask<'a> {
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
        &inner.node,
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

// ---------------------------------------------------------------- cluster

fn numeric(config: &BTreeMap<String, String>, key: &str, default: u64) -> u64 {
    config
        .get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The size of the first disk in boot order, else of scsi0, for `maxdisk`.
fn boot_disk_bytes(config: &BTreeMap<String, String>) -> u64 {
    let from_order = config
        .get("boot")
        .and_then(|b| b.strip_prefix("order="))
        .into_iter()
        .flat_map(|order| order.split(';'))
        .filter_map(|dev| config.get(dev))
        .find(|drive| model::drive_option(drive, "media") != Some("cdrom"));
    from_order
        .or_else(|| config.get("scsi0"))
        .and_then(|drive| model::drive_option(drive, "size"))
        .and_then(model::parse_size)
        .unwrap_or(0)
}

fn uptime(guest: &Guest) -> u64 {
    guest.started.map_or(0, |(at, _)| at.elapsed().as_secs())
}

/// One `/cluster/resources` VM entry (F8, F14).
fn resource_entry(node: &str, vmid: u32, guest: &Guest) -> Value {
    let kind = match guest.kind {
        GuestKind::Qemu => "qemu",
        GuestKind::Lxc => "lxc",
    };
    let id = format!("{kind}/{vmid}");
    if guest.placeholder {
        // F8: mid-clone the entry has no name and an unknown status.
        let mut entry =
            json!({"id": id, "type": kind, "vmid": vmid, "node": node, "status": "unknown"});
        if let Some(lock) = guest.lock() {
            entry["lock"] = json!(lock);
        }
        return entry;
    }
    let config = &guest.config;
    let running = guest.run != RunState::Stopped;
    let name = config
        .get("name")
        .or_else(|| config.get("hostname"))
        .cloned();
    let mut entry = json!({
        "id": id,
        "type": kind,
        "vmid": vmid,
        "node": node,
        // F14: a paused VM is plain "running" here.
        "status": if running { "running" } else { "stopped" },
        "template": numeric(config, "template", 0),
        "maxcpu": numeric(config, "cores", 1) * numeric(config, "sockets", 1),
        "maxmem": numeric(config, "memory", 512) << 20,
        "maxdisk": boot_disk_bytes(config),
        "mem": if running { (numeric(config, "memory", 512) << 20) / 4 } else { 0 },
        "cpu": if running { 0.01 } else { 0.0 },
        "disk": 0, "diskread": 0, "diskwrite": 0, "netin": 0, "netout": 0,
        "uptime": uptime(guest),
    });
    if let Some(name) = name {
        entry["name"] = json!(name);
    }
    if let Some(tags) = config.get("tags") {
        entry["tags"] = json!(tags);
    }
    // F8: lock appears only when set.
    if let Some(lock) = guest.lock() {
        entry["lock"] = json!(lock);
    }
    entry
}

/// Guests are listed only where the token holds `VM.Audit` on `/vms/<vmid>`, as pve-manager's
/// handler filters them.
fn cluster_resources(server: &Server, ctx: &Ctx, params: &Params) -> Result<Value, ApiError> {
    params.allow(&["type"])?;
    let kind = params.get("type");
    if let Some(kind) = kind.filter(|k| !["vm", "storage", "node", "sdn"].contains(k)) {
        return Err(ApiError::param(
            "type",
            format!(
                "value '{kind}' does not have a value in the enumeration 'vm, storage, node, sdn'"
            ),
        ));
    }
    let inner = server.state.lock();
    let node = &inner.node;
    let mut entries = Vec::new();
    if kind.is_none() || kind == Some("node") {
        entries.push(
            json!({"id": format!("node/{node}"), "type": "node", "node": node, "status": "online",
            "maxcpu": 8, "maxmem": 34_359_738_368u64, "uptime": 86_400, "level": ""}),
        );
    }
    if kind.is_none() || kind == Some("vm") {
        entries.extend(
            inner
                .guests
                .iter()
                .filter(|(vmid, _)| {
                    require(&ctx.token, &format!("/vms/{vmid}"), "VM.Audit").is_ok()
                })
                .map(|(vmid, guest)| resource_entry(node, *vmid, guest)),
        );
    }
    if kind.is_none() || kind == Some("storage") {
        entries.extend(inner.storages.iter().map(|s| {
            json!({"id": format!("storage/{node}/{}", s.id), "type": "storage", "storage": s.id,
                "node": node, "status": "available", "plugintype": s.plugin, "shared": 0,
                "content": s.content.join(","), "disk": 0, "maxdisk": 107_374_182_400u64})
        }));
    }
    Ok(Value::Array(entries))
}

/// `GET /nodes`: the one node, online (the fields of `pvesh get /nodes` on a single node).
fn list_nodes(server: &Server, params: &Params) -> Result<Value, ApiError> {
    params.allow(&[])?;
    let node = &server.node;
    Ok(
        json!([{"node": node, "id": format!("node/{node}"), "type": "node", "status": "online",
        "level": "", "cpu": 0.01, "maxcpu": 8, "mem": 4_294_967_296u64,
        "maxmem": 34_359_738_368u64, "uptime": 86_400}]),
    )
}

fn next_id(server: &Server, params: &Params) -> Result<Value, ApiError> {
    params.allow(&["vmid"])?;
    let inner = server.state.lock();
    if let Some(text) = params.get("vmid") {
        let vmid = parse_vmid("vmid", text)?;
        if inner.guests.contains_key(&vmid) {
            return Err(ApiError::param("vmid", format!("VM {vmid} already exists")));
        }
        return Ok(json!(vmid.to_string()));
    }
    // The schema says integer, but clients see a JSON string.
    match inner.next_free_vmid() {
        Some(vmid) => Ok(json!(vmid.to_string())),
        None => Err(ApiError::internal(
            "unable to get any free VMID in range [100, 1000000]",
        )),
    }
}

// ---------------------------------------------------------------- clone

const CLONE_PARAMS: &[&str] = &[
    "newid",
    "name",
    "description",
    "full",
    "storage",
    "target",
    "pool",
    "snapname",
    "format",
    "bwlimit",
];

fn clone_vm(
    server: &Arc<Server>,
    ctx: &Ctx,
    source: u32,
    params: &Params,
) -> Result<Value, ApiError> {
    require(&ctx.token, &format!("/vms/{source}"), "VM.Clone")?;
    // `VM.Allocate` on the new VMID or on a pool (not modelled): an `or` of two checks, whose
    // refusal names neither.
    if let Some(newid) = params
        .get("newid")
        .and_then(|newid| newid.parse::<u32>().ok())
        && require(&ctx.token, &format!("/vms/{newid}"), "VM.Allocate").is_err()
    {
        return Err(ApiError::forbidden(""));
    }
    params.allow(CLONE_PARAMS)?;
    let newid = parse_vmid("newid", params.required("newid")?)?;
    if params.get("name").is_some_and(|n| !is_dns_name(n)) {
        return Err(ApiError::format(
            "name",
            "value does not look like a valid DNS name",
        ));
    }
    let full_param = params.boolean("full")?;
    let mut inner = server.state.lock();
    if let Some(storage) = params.get("storage") {
        let Some(scfg) = inner.storage(storage) else {
            return Err(ApiError::internal(format!(
                "storage '{storage}' does not exist"
            )));
        };
        // F15: refused up front, leaving no VM.
        if !scfg.content.contains(&"images") {
            return Err(ApiError::param(
                "storage",
                format!("storage '{storage}' does not support vm images"),
            ));
        }
    }
    if let Some(target) = params.get("target").filter(|t| *t != inner.node) {
        return Err(ApiError::internal(format!(
            "no such cluster node '{target}'"
        )));
    }
    let source_guest = qemu(&inner, source)?;
    access::clone_source(&ctx.token, &source_guest.config, params.get("storage"))?;
    // F4: a taken VMID fails synchronously.
    if inner.guests.contains_key(&newid) {
        return Err(ApiError::internal(format!(
            "unable to create VM {newid}: config file already exists"
        )));
    }
    check_unlocked(source_guest)?;
    let is_template = source_guest
        .config
        .get("template")
        .is_some_and(|t| t == "1");
    let full = full_param.unwrap_or(!is_template);
    let target_config = cloned_config(&source_guest.config, source, newid, full, params);

    let work = Work::Clone {
        newid,
        config: target_config,
    };
    let upid = start_task(
        server,
        ctx,
        &mut inner,
        "qmclone",
        &source.to_string(),
        work,
    );
    // The target conf starts as qemu-server's temporary file: `lock: clone`, nothing else (F8).
    let guest_ip = inner.address_of(newid);
    inner.guests.insert(
        newid,
        Guest {
            kind: GuestKind::Qemu,
            config: BTreeMap::from([("lock".to_string(), "clone".to_string())]),
            run: RunState::Stopped,
            started: None,
            placeholder: true,
            busy: Some(upid.clone()),
            guest_ip,
        },
    );
    Ok(json!(upid))
}

/// The clone's final config: new MACs, uuid and vmgenid, no `template`, description only when
/// given and then verbatim (F10), everything else — `meta` included (F11) — copied.
fn cloned_config(
    source: &BTreeMap<String, String>,
    source_id: u32,
    newid: u32,
    full: bool,
    params: &Params,
) -> BTreeMap<String, String> {
    let mut config = BTreeMap::new();
    let mut disk_index = 0;
    for (key, value) in source {
        let skipped = [
            "template",
            "lock",
            "description",
            "parent",
            "vmstate",
            "runningcpu",
            "digest",
        ];
        if skipped.contains(&key.as_str()) || key.starts_with("unused") {
            continue;
        }
        let new_value = if key.starts_with("net") && key[3..].parse::<u32>().is_ok() {
            match model::net_mac(value) {
                Some(mac) => value.replacen(mac, &model::random_mac(), 1),
                None => value.clone(),
            }
        } else if model::is_drive_key(key) && value.contains(":") {
            let (volume, options) = value.split_once(',').unwrap_or((value, ""));
            let (storage, volname) = volume.split_once(':').unwrap_or(("", volume));
            let new_volume = if volname.ends_with("-cloudinit") {
                format!("{storage}:vm-{newid}-cloudinit")
            } else if model::drive_option(value, "media") == Some("cdrom") {
                volume.to_string()
            } else {
                let disk = format!("vm-{newid}-disk-{disk_index}");
                disk_index += 1;
                if full {
                    format!("{}:{disk}", params.get("storage").unwrap_or(storage))
                } else {
                    format!("{storage}:{volname}/{disk}")
                }
            };
            if options.is_empty() {
                new_volume
            } else {
                format!("{new_volume},{options}")
            }
        } else if key == "smbios1" {
            model::set_drive_option(
                &format!("x,{value}"),
                "uuid",
                &uuid::Uuid::new_v4().to_string(),
            )
            .trim_start_matches("x,")
            .to_string()
        } else if key == "vmgenid" {
            uuid::Uuid::new_v4().to_string()
        } else {
            value.clone()
        };
        config.insert(key.clone(), new_value);
    }
    let default_name = format!(
        "Copy-of-VM-{}",
        source.get("name").cloned().unwrap_or(source_id.to_string())
    );
    config.insert(
        "name".into(),
        params.get("name").map_or(default_name, str::to_string),
    );
    if let Some(description) = params.get("description") {
        config.insert("description".into(), description.to_string());
    }
    config
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

fn get_config(server: &Server, ctx: &Ctx, vmid: u32, params: &Params) -> Result<Value, ApiError> {
    require(&ctx.token, &format!("/vms/{vmid}"), "VM.Audit")?;
    params.allow(&["current", "snapshot"])?;
    let inner = server.state.lock();
    let guest = qemu(&inner, vmid)?;
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
    vmid: u32,
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
    let guest = qemu_mut(&mut inner, vmid)?;
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
    vmid: u32,
    params: &Params,
) -> Result<Value, ApiError> {
    require(&ctx.token, &format!("/vms/{vmid}"), "VM.Audit")?;
    params.allow(&[])?;
    let inner = server.state.lock();
    let guest = qemu(&inner, vmid)?;
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
    vmid: u32,
    action: &str,
    params: &Params,
) -> Result<Value, ApiError> {
    require(&ctx.token, &format!("/vms/{vmid}"), "VM.PowerMgmt")?;
    let mut inner = server.state.lock();
    let guest = qemu(&inner, vmid)?;
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
        task_type,
        &vmid.to_string(),
        work
    )))
}

// ---------------------------------------------------------------- resize, destroy

fn resize(server: &Arc<Server>, ctx: &Ctx, vmid: u32, params: &Params) -> Result<Value, ApiError> {
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
    let guest = qemu(&inner, vmid)?;
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

fn destroy(server: &Arc<Server>, ctx: &Ctx, vmid: u32, params: &Params) -> Result<Value, ApiError> {
    require(&ctx.token, &format!("/vms/{vmid}"), "VM.Allocate")?;
    params.allow(&["purge", "destroy-unreferenced-disks", "skiplock"])?;
    params.boolean("purge")?;
    params.boolean("destroy-unreferenced-disks")?;
    let mut inner = server.state.lock();
    let guest = qemu(&inner, vmid)?;
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
        "qmdestroy",
        &vmid.to_string(),
        Work::Destroy { vmid },
    );
    let guest = qemu_mut(&mut inner, vmid)?;
    guest.config.insert("lock".into(), "destroyed".into());
    guest.busy = Some(upid.clone());
    Ok(json!(upid))
}

// ---------------------------------------------------------------- agent

/// F5 and F21: three distinct 500s, then the interface list with net0's MAC on ens18.
fn agent_interfaces(
    server: &Server,
    ctx: &Ctx,
    vmid: u32,
    params: &Params,
) -> Result<Value, ApiError> {
    // PVE 9's agent read privilege (VM.Monitor before).
    require(&ctx.token, &format!("/vms/{vmid}"), "VM.GuestAgent.Audit")?;
    params.allow(&[])?;
    let inner = server.state.lock();
    let guest = qemu(&inner, vmid)?;
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

// ---------------------------------------------------------------- storage

fn content_dir(content: &str) -> &'static str {
    match content {
        "vztmpl" => "vztmpl",
        "import" => "import",
        _ => "iso",
    }
}

fn extension_ok(content: &str, filename: &str) -> bool {
    let lower = filename.to_ascii_lowercase();
    let endings: &[&str] = match content {
        "iso" => &[".iso", ".img"],
        "vztmpl" => &[".tar.gz", ".tar.xz", ".tar.zst"],
        _ => &[".raw", ".qcow2", ".vmdk", ".ova"],
    };
    endings
        .iter()
        .any(|e| lower.len() > e.len() && lower.ends_with(e))
}

/// F12, F23: multipart with `content` and a `filename` file part; overwrite is silent.
async fn upload(
    server: &Arc<Server>,
    ctx: &Ctx,
    storage: &str,
    request: &ApiRequest,
) -> Result<Value, ApiError> {
    require(
        &ctx.token,
        &format!("/storage/{storage}"),
        "Datastore.AllocateTemplate",
    )?;
    let mut fields: BTreeMap<String, String> = BTreeMap::new();
    let mut file: Option<(String, Bytes)> = None;
    if let Ok(boundary) = multer::parse_boundary(&request.content_type) {
        let body = request.body.clone();
        let stream = futures_util::stream::once(async move { Ok::<Bytes, std::io::Error>(body) });
        let mut multipart = multer::Multipart::new(stream, boundary);
        loop {
            let field = match multipart.next_field().await {
                Ok(Some(field)) => field,
                Ok(None) => break,
                Err(err) => {
                    return Err(ApiError::new(
                        400,
                        format!("malformed multipart body: {err}"),
                    ));
                }
            };
            let name = field.name().unwrap_or_default().to_string();
            let file_name = field.file_name().map(str::to_string);
            let bytes = field
                .bytes()
                .await
                .map_err(|err| ApiError::new(400, format!("malformed multipart body: {err}")))?;
            match file_name {
                Some(file_name) if name == "filename" => file = Some((file_name, bytes)),
                _ => {
                    fields.insert(name, String::from_utf8_lossy(&bytes).into_owned());
                }
            }
        }
    } else {
        fields.extend(request.params().0);
    }
    let params = Params(fields);
    params.allow(&[
        "content",
        "filename",
        "checksum",
        "checksum-algorithm",
        "tmpfilename",
    ])?;
    let content = params.required("content")?.to_string();
    if !["iso", "vztmpl", "import"].contains(&content.as_str()) {
        return Err(ApiError::param(
            "content",
            format!(
                "value '{content}' does not have a value in the enumeration 'iso, vztmpl, import'"
            ),
        ));
    }
    let Some((raw_name, bytes)) = file else {
        return Err(ApiError::param("filename", MISSING));
    };
    let filename: String = raw_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut inner = server.state.lock();
    let Some(scfg) = inner.storage(storage) else {
        return Err(ApiError::internal(format!(
            "storage '{storage}' does not exist"
        )));
    };
    if !scfg.content.contains(&content.as_str()) {
        return Err(ApiError::internal(format!(
            "storage '{storage}' does not support '{content}' content"
        )));
    }
    if !extension_ok(&content, &filename) {
        return Err(ApiError::param("filename", "wrong file extension"));
    }
    let volid = format!("{storage}:{}/{filename}", content_dir(&content));
    let work = Work::Upload {
        volid,
        filename,
        bytes,
    };
    // The imgcopy task has an empty id.
    Ok(json!(start_task(
        server, ctx, &mut inner, "imgcopy", "", work
    )))
}

fn list_content(
    server: &Server,
    ctx: &Ctx,
    storage: &str,
    params: &Params,
) -> Result<Value, ApiError> {
    require_any(&ctx.token, &format!("/storage/{storage}"), STORAGE_READ)?;
    params.allow(&["content", "vmid"])?;
    let inner = server.state.lock();
    let Some(scfg) = inner.storage(storage) else {
        return Err(ApiError::internal(format!(
            "storage '{storage}' does not exist"
        )));
    };
    let wanted = params.get("content");
    let prefix = format!("{storage}:");
    let mut entries: Vec<Value> = inner
        .volumes
        .iter()
        .filter(|(volid, _)| volid.starts_with(&prefix))
        .map(|(volid, volume)| {
            let content = volid[prefix.len()..].split('/').next().unwrap_or("iso");
            json!({"volid": volid, "content": content, "format": content, "size": volume.bytes.len(), "ctime": volume.ctime})
        })
        .collect();
    if scfg.content.contains(&"images") {
        for (vmid, guest) in inner.guests.iter().filter(|(_, g)| !g.placeholder) {
            for drive in guest
                .config
                .iter()
                .filter(|(k, _)| model::is_drive_key(k))
                .map(|(_, d)| d)
            {
                let volume = drive.split(',').next().unwrap_or_default();
                if volume.starts_with(&prefix)
                    && model::drive_option(drive, "media") != Some("cdrom")
                {
                    let size = model::drive_option(drive, "size")
                        .and_then(model::parse_size)
                        .unwrap_or(0);
                    entries.push(json!({"volid": volume, "content": "images", "format": "raw", "size": size, "vmid": vmid}));
                }
            }
        }
    }
    if let Some(wanted) = wanted {
        entries.retain(|e| e["content"] == wanted);
    }
    Ok(Value::Array(entries))
}

/// Either lets a token read a storage's status and content (pve-storage).
const STORAGE_READ: &[&str] = &["Datastore.Audit", "Datastore.AllocateSpace"];

/// Capacity the simulated storages report, in bytes (made up: no capture has them).
fn storage_total(storage: &str) -> u64 {
    match storage {
        "local-lvm" => 375_809_638_400,
        "proxy-seeds" => 21_474_836_480,
        _ => 107_374_182_400,
    }
}

/// `GET /nodes/{node}/storage/{storage}/status`: type, content, active, enabled, shared and
/// total/used/avail, where used counts the stored volumes and the disks of guests on it. The
/// unknown-storage text is the one `PVE::Storage::storage_config` dies with (from the upstream
/// source, not a capture), which the other storage endpoints here already give.
fn storage_status(
    server: &Server,
    ctx: &Ctx,
    storage: &str,
    params: &Params,
) -> Result<Value, ApiError> {
    require_any(&ctx.token, &format!("/storage/{storage}"), STORAGE_READ)?;
    params.allow(&[])?;
    let inner = server.state.lock();
    let Some(scfg) = inner.storage(storage) else {
        return Err(ApiError::internal(format!(
            "storage '{storage}' does not exist"
        )));
    };
    let prefix = format!("{storage}:");
    let volumes: u64 = inner
        .volumes
        .iter()
        .filter(|(volid, _)| volid.starts_with(&prefix))
        .map(|(_, volume)| volume.bytes.len() as u64)
        .sum();
    let disks: u64 = inner
        .guests
        .values()
        .flat_map(|guest| guest.config.iter())
        .filter(|(key, drive)| {
            model::is_drive_key(key)
                && drive.starts_with(&prefix)
                && model::drive_option(drive, "media") != Some("cdrom")
        })
        .filter_map(|(_, drive)| model::drive_option(drive, "size").and_then(model::parse_size))
        .sum();
    let total = storage_total(storage);
    let used = (volumes + disks).min(total);
    Ok(json!({
        "type": scfg.plugin, "content": scfg.content.join(","), "active": 1, "enabled": 1,
        "shared": 0, "total": total, "used": used, "avail": total - used,
    }))
}

/// F13: needs Datastore.Allocate on the volume's storage; a missing volume still ends OK.
fn delete_volume(
    server: &Arc<Server>,
    ctx: &Ctx,
    storage: &str,
    volume: &str,
    params: &Params,
) -> Result<Value, ApiError> {
    params.allow(&["delay"])?;
    let volid = if volume.contains(':') {
        volume.to_string()
    } else {
        format!("{storage}:{volume}")
    };
    let storeid = volid.split(':').next().unwrap_or(storage).to_string();
    let mut inner = server.state.lock();
    if inner.storage(&storeid).is_none() {
        return Err(ApiError::internal(format!(
            "storage '{storeid}' does not exist"
        )));
    }
    require(
        &ctx.token,
        &format!("/storage/{storeid}"),
        "Datastore.Allocate",
    )?;
    let work = Work::DeleteVolume { volid };
    Ok(json!(start_task(
        server, ctx, &mut inner, "imgdel", &storeid, work
    )))
}

// ---------------------------------------------------------------- tasks

/// F16: the task status fields, `exitstatus` only once stopped.
fn task_status(server: &Server, upid: &str, params: &Params) -> Result<Value, ApiError> {
    params.allow(&[])?;
    if !model::is_upid(upid) {
        return Err(ApiError::param("upid", "unable to parse worker upid"));
    }
    let inner = server.state.lock();
    let Some(task) = inner.tasks.get(upid) else {
        return Err(ApiError::param("upid", "no such task"));
    };
    let mut object = json!({
        "upid": task.upid, "node": inner.node, "pid": task.pid, "pstart": task.pstart,
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

    #[test]
    fn extensions_per_content() {
        assert!(extension_ok("iso", "seed.ISO"));
        assert!(!extension_ok("iso", "seed.txt"));
        assert!(!extension_ok("iso", ".iso"));
        assert!(extension_ok("vztmpl", "debian.tar.zst"));
    }
}
