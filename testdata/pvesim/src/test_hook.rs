//! The test-backend hook every backend of the conformance suite may implement
//! (`docs/contract.md`, "Test-backend hooks"): `POST /_egress-test/stop`, body
//! `{"name": "<vm name>"}`, stops every QEMU VM of that name as `qm stop` on its node would
//! (`host_events::stop_vm`), outside the Proxmox API, so the suite can see what a provider makes
//! of a VM of its own that stopped (`create.starts-stopped`).
//!
//! Authenticated like the API, never faulted nor logged (like the admin API). Its answers are
//! plain JSON, not Proxmox's `{"data": …}` envelope, the same from any backend, and each carries
//! `"hook": "stop"` so the suite tells them from a backend's own 404:
//!
//! | answer | when |
//! |---|---|
//! | 200 `{"hook": "stop", "stopped": [vmid…]}` | every VM of that name is stopped (one already stopped stays so) |
//! | 404 `{"hook": "stop", "error": …}` | no QEMU VM (templates aside) has that name |
//! | 400 `{"hook": "stop", "error": …}` | the body is not `{"name": "…"}` |
//! | 409 `{"hook": "stop", "error": …}` | a VM of that name is locked (mid-clone, …), as `qm stop` refuses it |

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::Full;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::Server;
use crate::host_events;
use crate::state::GuestKind;

/// Where the test-backend hooks live.
pub(crate) const PREFIX: &str = "/_egress-test/";

/// The body of a stop: `{"name": "conformance-1a2b3c4d-restart"}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Stop {
    name: String,
}

/// Answers one authenticated hook request.
pub(crate) fn answer(
    server: &Server,
    method: &http::Method,
    path: &str,
    body: &[u8],
) -> Response<Full<Bytes>> {
    if (method.as_str(), path) != ("POST", "/_egress-test/stop") {
        return reply(
            StatusCode::NOT_FOUND,
            json!({"error": format!("no test-backend hook {method} {path}")}),
        );
    }
    let Ok(Stop { name }) = serde_json::from_slice::<Stop>(body) else {
        return hook_error(
            StatusCode::BAD_REQUEST,
            "the body is not {\"name\": …}".into(),
        );
    };
    let named: Vec<u32> = {
        let inner = server.state.lock();
        inner
            .guests
            .iter()
            .filter(|(_, guest)| {
                guest.kind == GuestKind::Qemu
                    && guest.config.get("template").is_none_or(|t| t != "1")
                    && guest.config.get("name").is_some_and(|n| *n == name)
            })
            .map(|(vmid, _)| *vmid)
            .collect()
    };
    if named.is_empty() {
        return hook_error(StatusCode::NOT_FOUND, format!("no VM named {name}"));
    }
    for vmid in &named {
        if let Err(refused) = host_events::stop_vm(server, *vmid) {
            return hook_error(StatusCode::CONFLICT, refused.message);
        }
    }
    reply(StatusCode::OK, json!({"hook": "stop", "stopped": named}))
}

fn hook_error(status: StatusCode, error: String) -> Response<Full<Bytes>> {
    reply(status, json!({"hook": "stop", "error": error}))
}

fn reply(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}
