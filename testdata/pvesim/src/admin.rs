//! The simulator's own admin API under `/_sim/`, beside the Proxmox API, so a tool that only holds
//! the simulator's URL and token (the conformance suite, a shell script) can recognise it, set
//! faults and count what it served without linking this crate.
//!
//! Every request needs the main or the limited token, as the Proxmox API does. Admin requests are
//! never subject to faults (a fault on `/**` must not lock out the call that clears it) and are
//! not logged in the request log (they are not what a provider sent).
//!
//! | request | answer (`{"data": …}`) |
//! |---|---|
//! | `GET /_sim/info` | `{"simulator": "pvesim", "version", "node", "nodes"}` (`node` the first of `nodes`, where the templates live), and `"servicePort"` when VMs have services |
//! | `POST /_sim/faults`, body: rules, one per line, in the `--fault` syntax | `{"added": n}`; 400 and nothing added if one line does not parse |
//! | `DELETE /_sim/faults` | every rule and the abort budget removed |
//! | `GET /_sim/requests` | `{"total", "unanswered"}`: requests logged, and those reset without an answer |
//! | `GET /_sim/vms` | `[{"vmid", "node", "name", "template", "lock"}]`, every QEMU guest on every node |
//! | `POST /_sim/vms/{vmid}/stop` | `null`: the VM stopped, as by `qm stop <vmid>` on the node (see below) |
//! | `POST /_sim/vms/{vmid}/qmpstatus`, body `{"qmpstatus": "…"}` | `null`: a running VM put in a QMP state only its guest or QEMU reaches: `suspended` (the guest slept, ACPI S3), `io-error`, `guest-panicked`, `internal-error`, `watchdog`, or back to `running`; 400 for another word, 500 for a stopped VM |
//! | `POST /_sim/nodes/{node}/reboot`, body: empty or `{"startOnboot": false}` | `{"stopped": [vmid…], "startall": UPID or null}`: that node's guests only (see below) |
//! | `POST /_sim/vms/{vmid}/service`, body `{"service": "ok" \| "refuse" \| "hang" \| "error"}` | `null`: the VM's proxy service, with `--service-port`, from now on answers `CONNECT` with 200 (`ok`, the default), refuses connections (`refuse`), accepts and never answers (`hang`) or answers 503 (`error`); it serves only while the VM runs. 400 without `--service-port` or for another word, F2's 500 for an unknown VM |
//!
//! **Stop** (`qm stop`): when the answer comes the VM is stopped (`status` and `qmpstatus`
//! `stopped`, F14), its agent answers `VM <vmid> is not running` (F5), and its config and disks
//! are untouched. A locked VM is refused with `VM is locked (<lock>)` and an unknown one with
//! F2's text, both 500 as `qm` would fail; a stopped VM stays stopped.
//!
//! The VM routes take a VMID alone: VMIDs are the cluster's, so they reach a VM on any node.
//!
//! **Node reboot**: every guest on the node stops at once, the other nodes' run on (`stopped` lists those that ran). Then,
//! as Proxmox VE does at boot, a `startall` task owned by `root@pam` starts every guest with
//! `onboot=1` (not templates, not locked ones, not those someone started meanwhile) once the task
//! latency has passed; each then starts as after any start, its agent answering after the agent
//! delay. `{"startOnboot": false}` leaves every guest stopped and starts no task: a host whose
//! boot did not start them, for tests of the operator's own healing. An unknown node is a 400.
//!
//! A VM started again through the API (`POST …/status/start`) behaves as after any start.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::Server;
use crate::faults::FaultRule;
use crate::host_events;
use crate::params::parse_vmid;
use crate::reply::ApiError;
use crate::services::{self, ServiceMode};
use crate::state::GuestKind;

/// Where the admin API lives.
pub(crate) const PREFIX: &str = "/_sim/";

/// Answers one authenticated admin request.
pub(crate) fn dispatch(
    server: &Arc<Server>,
    method: &http::Method,
    path: &str,
    body: &[u8],
) -> Result<Value, ApiError> {
    let route = path.strip_prefix(PREFIX).unwrap_or(path);
    let segments: Vec<&str> = route.split('/').collect();
    match (method.as_str(), segments.as_slice()) {
        ("POST", ["vms", vmid, "stop"]) => {
            host_events::stop_vm(server, parse_vmid("vmid", vmid)?)?;
            Ok(Value::Null)
        }
        ("POST", ["vms", vmid, "qmpstatus"]) => {
            host_events::set_qmpstatus(server, parse_vmid("vmid", vmid)?, &qmpstatus(body)?)?;
            Ok(Value::Null)
        }
        ("POST", ["vms", vmid, "service"]) => {
            services::set_mode(server, parse_vmid("vmid", vmid)?, service_mode(body)?)?;
            Ok(Value::Null)
        }
        ("POST", ["nodes", node, "reboot"]) => {
            let reboot =
                host_events::reboot_node(server, node, reboot_options(body)?.start_onboot)?;
            Ok(json!({"stopped": reboot.stopped, "startall": reboot.startall}))
        }
        _ => dispatch_route(server, method, path, route, body),
    }
}

/// The body of a QMP state change: `{"qmpstatus": "guest-panicked"}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QmpStatus {
    qmpstatus: String,
}

fn qmpstatus(body: &[u8]) -> Result<String, ApiError> {
    serde_json::from_slice::<QmpStatus>(body)
        .map(|body| body.qmpstatus)
        .map_err(|error| {
            ApiError::new(
                400,
                format!("the body is not {{\"qmpstatus\": …}}: {error}"),
            )
        })
}

/// The body of a service change: `{"service": "hang"}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceChange {
    service: String,
}

fn service_mode(body: &[u8]) -> Result<ServiceMode, ApiError> {
    let change = serde_json::from_slice::<ServiceChange>(body).map_err(|error| {
        ApiError::new(400, format!("the body is not {{\"service\": …}}: {error}"))
    })?;
    ServiceMode::from_word(&change.service).ok_or_else(|| {
        ApiError::new(
            400,
            format!(
                "no service mode {:?}: ok, refuse, hang or error",
                change.service
            ),
        )
    })
}

/// The body of a node reboot; empty means the defaults.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RebootOptions {
    /// Whether the boot starts the guests with `onboot=1` (default true).
    #[serde(default = "starts_onboot_by_default")]
    start_onboot: bool,
}

fn starts_onboot_by_default() -> bool {
    true
}

fn reboot_options(body: &[u8]) -> Result<RebootOptions, ApiError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        body
    };
    serde_json::from_slice(body)
        .map_err(|error| ApiError::new(400, format!("reboot options: {error}")))
}

/// The routes without path parameters.
fn dispatch_route(
    server: &Server,
    method: &http::Method,
    path: &str,
    route: &str,
    body: &[u8],
) -> Result<Value, ApiError> {
    match (method.as_str(), route) {
        ("GET", "info") => {
            let inner = server.state.lock();
            let mut info = json!({
                "simulator": "pvesim",
                "version": env!("CARGO_PKG_VERSION"),
                "node": inner.first_node(),
                "nodes": inner.nodes,
            });
            if let Some(services) = &inner.services {
                info["servicePort"] = json!(services.port());
            }
            Ok(info)
        }
        ("POST", "faults") => add_faults(server, body),
        ("DELETE", "faults") => {
            server.faults.clear();
            Ok(Value::Null)
        }
        ("GET", "requests") => {
            let log = server.state.request_log();
            let unanswered = log.iter().filter(|record| record.status.is_none()).count();
            Ok(json!({"total": log.len(), "unanswered": unanswered}))
        }
        ("GET", "vms") => Ok(vms(server)),
        _ => Err(ApiError::new(
            501,
            format!("Method '{method} {path}' not implemented"),
        )),
    }
}

/// Parses every line first, so a bad line adds nothing.
fn add_faults(server: &Server, body: &[u8]) -> Result<Value, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::new(400, "fault rules must be UTF-8 text"))?;
    let rules = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(str::parse::<FaultRule>)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| ApiError::new(400, error))?;
    let added = rules.len();
    for rule in rules {
        server.faults.add(rule);
    }
    Ok(json!({ "added": added }))
}

fn vms(server: &Server) -> Value {
    let state = &server.state;
    let vms: Vec<Value> = state
        .vmids()
        .into_iter()
        .filter_map(|vmid| state.guest(vmid))
        .filter(|guest| guest.kind == GuestKind::Qemu)
        .map(|guest| {
            json!({
                "vmid": guest.vmid,
                "node": guest.node,
                "name": guest.config.get("name"),
                "template": guest.config.get("template").is_some_and(|t| t == "1"),
                "lock": guest.lock,
            })
        })
        .collect();
    Value::Array(vms)
}
