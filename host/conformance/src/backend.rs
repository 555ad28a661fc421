//! The backend behind the grant's origins, reached through the broker under the provider's own
//! grant, so the suite never reads the credential: the broker injects it and verifies TLS. Each
//! request is a step of the run's tape, when it has one (`tape.rs`).
//!
//! - The test-backend hook `POST /_egress-test/stop` (`docs/contract.md`, "Test-backend hooks"):
//!   stops a VM by name outside the provider's API, for `create.starts-stopped`. Any backend may
//!   implement it; pvesim and the example's inventory (`testdata/inventory/inventory.py`) do.
//! - `pvesim`'s admin API (`/_sim/…`, see testdata/pvesim), when the backend is the simulator:
//!   counting the VMs of a name, which only the hypervisor can tell.

use std::sync::Arc;

use bytes::Bytes;
use egress_capability_http::Broker;
use egress_runtime::egress::{CallSite, Egress, EgressBody};
use egress_runtime::{Digest, Outgoing};
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

use super::tape::{BACKEND, Tape};

/// The label the broker logs and counts the suite's own requests under.
const OPERATION: &str = "conformance";

/// The stop hook's path, as `docs/contract.md` defines it.
pub(crate) const STOP_HOOK: &str = "/_egress-test/stop";

/// Why a rule that needs the stop hook skips, when no origin has it.
pub(crate) const NO_STOP_HOOK: &str =
    "needs the test-backend hook POST /_egress-test/stop (docs/contract.md)";

/// One of the grant's origins, through the broker.
#[derive(Clone)]
pub(crate) struct Origin {
    broker: Arc<dyn Egress>,
    site: CallSite,
    origin: String,
    tape: Option<Arc<Tape>>,
}

/// What the stop hook made of a request.
pub(crate) enum Stop {
    /// The VM is stopped.
    Stopped,
    /// The backend holds no VM of that name.
    NoSuchVm(String),
    /// The answer is not the hook's (no `"hook": "stop"` in it): the backend has no hook.
    NoHook(String),
}

impl Origin {
    /// Every origin of the grant.
    pub(crate) fn all(
        broker: &Broker,
        identity: &str,
        digest: Digest,
        origins: &[String],
        tape: Option<Arc<Tape>>,
    ) -> Vec<Origin> {
        let broker: Arc<dyn Egress> = Arc::new(broker.clone());
        origins
            .iter()
            .map(|origin| Origin {
                broker: Arc::clone(&broker),
                tape: tape.clone(),
                site: CallSite {
                    provider: identity.into(),
                    digest: digest.hex().into(),
                    operation: OPERATION,
                },
                origin: origin.trim_end_matches('/').to_owned(),
            })
            .collect()
    }

    /// Asks the stop hook to stop the VM named `name`.
    pub(crate) async fn stop(&self, name: &str) -> Result<Stop, String> {
        let body = json!({ "name": name }).to_string();
        let (status, answer) = self.send("POST", STOP_HOOK, &body).await?;
        let text = String::from_utf8_lossy(&answer);
        let answer: Value = serde_json::from_slice(&answer).unwrap_or_default();
        let said = format!("{} answered {status}: {}", self.origin, text.trim());
        if answer["hook"] != "stop" {
            return Ok(Stop::NoHook(said));
        }
        match status {
            StatusCode::OK => Ok(Stop::Stopped),
            StatusCode::NOT_FOUND => Ok(Stop::NoSuchVm(said)),
            _ => Err(format!("the stop hook of {said}")),
        }
    }

    /// One request; its status and body.
    async fn send(
        &self,
        method: &str,
        path: &str,
        body: &str,
    ) -> Result<(StatusCode, Bytes), String> {
        let uri = format!("{}{path}", self.origin);
        let authority = uri
            .parse::<http::Uri>()
            .ok()
            .and_then(|uri| uri.authority().map(|a| a.as_str().to_owned()))
            .unwrap_or_default();
        let length = body.len();
        let body: EgressBody = Full::new(Bytes::from(body.to_owned()))
            .map_err(|never| match never {})
            .boxed_unsync();
        let request = http::Request::builder()
            .method(method)
            .uri(&uri)
            .header(http::header::HOST, authority)
            .header(http::header::CONTENT_TYPE, "application/json")
            // A length, not chunks: a test double's HTTP server may not read chunked bodies.
            .header(http::header::CONTENT_LENGTH, length)
            .body(body)
            .map_err(|error| format!("{method} {uri}: {error}"))?;
        let step = match &self.tape {
            Some(tape) => tape.begin(BACKEND, Value::Null)?,
            None => None,
        };
        let outgoing = Outgoing {
            site: &self.site,
            request,
            options: None,
        };
        let answer = match &step {
            Some(step) => step.tap(None).send(outgoing, &self.broker),
            None => outgoing.send_to(&self.broker),
        };
        let answered = async {
            let response = answer.await?;
            let status = response.status();
            Ok((status, response.into_body().collect().await?.to_bytes()))
        };
        let answered: Result<_, egress_runtime::egress::EgressError> = answered.await;
        if let Some(step) = step {
            step.end(Value::Null);
        }
        answered.map_err(|error| format!("{method} {uri}: {error}"))
    }
}

/// A `pvesim` behind one of the grant's origins.
pub(crate) struct Pvesim {
    origin: Origin,
}

impl Pvesim {
    /// The first origin that answers `GET /_sim/info` as pvesim, if any.
    pub(crate) async fn detect(origins: &[Origin]) -> Option<Pvesim> {
        for origin in origins {
            let candidate = Pvesim {
                origin: origin.clone(),
            };
            if let Ok(info) = candidate.admin("GET", "info").await
                && info["simulator"] == "pvesim"
            {
                return Some(candidate);
            }
        }
        None
    }

    /// How many QEMU VMs are named `name`.
    pub(crate) async fn vms_named(&self, name: &str) -> Result<usize, String> {
        let vms = self.admin("GET", "vms").await?;
        Ok(vms
            .as_array()
            .map_or(0, |vms| vms.iter().filter(|vm| vm["name"] == name).count()))
    }

    /// One admin request; the answer's `data`.
    async fn admin(&self, method: &str, route: &str) -> Result<Value, String> {
        let path = format!("/_sim/{route}");
        let (status, body) = self.origin.send(method, &path, "").await?;
        if !status.is_success() {
            return Err(format!(
                "{method} {path} answered {status}: {}",
                String::from_utf8_lossy(&body)
            ));
        }
        let answer: Value = serde_json::from_slice(&body)
            .map_err(|error| format!("{method} {path}: not JSON: {error}"))?;
        Ok(answer["data"].clone())
    }
}
