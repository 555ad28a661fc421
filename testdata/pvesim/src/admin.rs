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
//! | `GET /_sim/info` | `{"simulator": "pvesim", "version", "node"}` |
//! | `POST /_sim/faults`, body: rules, one per line, in the `--fault` syntax | `{"added": n}`; 400 and nothing added if one line does not parse |
//! | `DELETE /_sim/faults` | every rule and the abort budget removed |
//! | `GET /_sim/requests` | `{"total", "unanswered"}`: requests logged, and those reset without an answer |
//! | `GET /_sim/vms` | `[{"vmid", "name", "template", "lock"}]`, every QEMU guest |

use serde_json::{Value, json};

use crate::api::Server;
use crate::faults::FaultRule;
use crate::reply::ApiError;
use crate::state::GuestKind;

/// Where the admin API lives.
pub(crate) const PREFIX: &str = "/_sim/";

/// Answers one authenticated admin request.
pub(crate) fn dispatch(
    server: &Server,
    method: &http::Method,
    path: &str,
    body: &[u8],
) -> Result<Value, ApiError> {
    let route = path.strip_prefix(PREFIX).unwrap_or(path);
    match (method.as_str(), route) {
        ("GET", "info") => Ok(json!({
            "simulator": "pvesim",
            "version": env!("CARGO_PKG_VERSION"),
            "node": server.node,
        })),
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
                "name": guest.config.get("name"),
                "template": guest.config.get("template").is_some_and(|t| t == "1"),
                "lock": guest.lock,
            })
        })
        .collect();
    Value::Array(vms)
}
