//! # contract-v2: a minimal provider on contract `egress:provider@0.2.0` (TEST ONLY)
//!
//! It binds the version in development, `wit/provider/`, and uses what 0.2.0 adds:
//!
//! - the log is its own package, `egress:log/log` (`create` logs a line);
//! - `describe` lists no capabilities: the host reads them from the imports. This component uses
//!   HTTP only, so it imports `wasi:http` and `egress:http-broker` but not `egress:libvirt`
//!   (wit-component drops what a guest does not use), and loads on a host without libvirt;
//! - `check` with `{"endpoint": "https://host:port"}` sends one `GET /` and, when it fails, asks
//!   the broker why (`egress:http-broker/broker.last-refusal`), answering a typed reason instead
//!   of parsing `internal-error("credentials-unavailable")`. Its message is
//!   `refusal: <name>` (or `refusal: none`) followed by the `wasi:http` error code.
//!
//! Every other operation answers without I/O: `create` of `web` answers a running VM `v2/web`, on
//! the first of the hosts `host-a`, `host-b`, `host-c` its placement request does not avoid
//! (`quota-exceeded` when a required request avoids them all).

wit_bindgen::generate!({
    path: "../../../wit/provider",
    world: "egress:provider/provider-world@0.2.0",
    generate_all,
});

use egress::http_broker::broker::{self, Refusal};
use egress::log::log::{self as host_log, Field, Level};
use egress::provider::types::{
    CheckReason, CheckResult, CreateRequest, Description, Error, Listing, Vm, VmState,
};
use exports::egress::provider::provider::Guest;
use wasi::http::outgoing_handler;
use wasi::http::types::{ErrorCode, Fields, Method, OutgoingBody, OutgoingRequest, Scheme};

/// The contract version this component is built against.
pub const CONTRACT_VERSION: &str = "0.2.0";

const SCHEMA: &str = r#"{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"endpoint":{"type":"string"}},"additionalProperties":false}"#;

struct ContractV2;

impl Guest for ContractV2 {
    fn describe() -> Description {
        Description {
            name: "contract-v2".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            contract_version: CONTRACT_VERSION.to_string(),
            config_schema: SCHEMA.to_string(),
        }
    }

    fn validate_config(config: String) -> Result<(), Error> {
        endpoint(&config).map(drop)
    }

    fn create(request: CreateRequest) -> Result<Vm, Error> {
        host_log::emit(
            Level::Info,
            "creating",
            &[Field {
                key: "name".to_string(),
                value: request.name.clone(),
            }],
        );
        const HOSTS: [&str; 3] = ["host-a", "host-b", "host-c"];
        let avoided = |host: &&str| {
            let placement = request.placement.as_ref();
            placement.is_some_and(|p| p.avoid_hosts.iter().any(|avoid| avoid == host))
        };
        let host = match HOSTS.iter().find(|host| !avoided(host)) {
            Some(host) => host,
            None if request.placement.as_ref().is_some_and(|p| p.required) => {
                return Err(Error::QuotaExceeded("every host is avoided".into()));
            }
            None => &HOSTS[0],
        };
        Ok(Vm {
            host: Some(host.to_string()),
            ..vm(&format!("v2/{}", request.name), &request.name, &request.uid)
        })
    }

    fn get(_config: String, provider_id: String) -> Result<Vm, Error> {
        match provider_id.strip_prefix("v2/") {
            Some(name) => Ok(vm(&provider_id, name, "")),
            None => Err(Error::NotFound(format!("{provider_id} is not ours"))),
        }
    }

    fn delete(_config: String, _provider_id: String) -> Result<(), Error> {
        Ok(())
    }

    fn list_by_tag(_config: String, _key: String, _value: String) -> Result<Listing, Error> {
        Ok(Listing {
            vms: Vec::new(),
            unanswered: Vec::new(),
        })
    }

    fn check(config: String) -> CheckResult {
        let endpoint = match endpoint(&config) {
            Ok(Some(endpoint)) => endpoint,
            Ok(None) => return result(CheckReason::Ok, "no endpoint to check".to_string()),
            Err(error) => return result(CheckReason::Misconfigured, format!("{error:?}")),
        };
        match get_root(&endpoint) {
            Ok(status) => result(CheckReason::Ok, format!("status {status}")),
            Err(code) => {
                let refusal = broker::last_refusal();
                let reason = match refusal {
                    Some(Refusal::CredentialsUnavailable) => CheckReason::CredentialsUnavailable,
                    Some(Refusal::CaInvalid) => CheckReason::CertificateInvalid,
                    Some(Refusal::NotGranted | Refusal::Denied) => CheckReason::Forbidden,
                    Some(_) => CheckReason::Other,
                    None => CheckReason::Unreachable,
                };
                let name = refusal.map_or("none", refusal_name);
                result(reason, format!("refusal: {name}; error code: {code:?}"))
            }
        }
    }
}

fn refusal_name(refusal: Refusal) -> &'static str {
    match refusal {
        Refusal::NotGranted => "not-granted",
        Refusal::Denied => "denied",
        Refusal::CredentialsUnavailable => "credentials-unavailable",
        Refusal::CaUnavailable => "ca-unavailable",
        Refusal::CaInvalid => "ca-invalid",
        Refusal::ResponseUnredactable => "response-unredactable",
        Refusal::RequestsInFlight => "requests-in-flight",
    }
}

fn result(reason: CheckReason, message: String) -> CheckResult {
    CheckResult { reason, message }
}

fn vm(provider_id: &str, name: &str, uid: &str) -> Vm {
    Vm {
        provider_id: provider_id.to_string(),
        name: name.to_string(),
        state: VmState::Running,
        addresses: vec!["198.51.100.2".to_string()],
        created_at: None,
        uid: uid.to_string(),
        host: None,
    }
}

/// A parsed `endpoint`: scheme and authority.
struct Endpoint {
    https: bool,
    authority: String,
}

fn endpoint(config: &str) -> Result<Option<Endpoint>, Error> {
    let value: serde_json::Value = serde_json::from_str(config)
        .map_err(|error| Error::Permanent(format!("config is not JSON: {error}")))?;
    let Some(endpoint) = value.get("endpoint") else {
        return Ok(None);
    };
    let endpoint = endpoint
        .as_str()
        .ok_or_else(|| Error::Permanent("endpoint must be a string".to_string()))?;
    let (https, rest) = if let Some(rest) = endpoint.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = endpoint.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err(Error::Permanent(format!(
            "{endpoint} is not an http(s) URL"
        )));
    };
    Ok(Some(Endpoint {
        https,
        authority: rest.trim_end_matches('/').to_string(),
    }))
}

/// `GET /` on `endpoint`: the status, or the `wasi:http` error code.
fn get_root(endpoint: &Endpoint) -> Result<u16, ErrorCode> {
    let internal = |what: &str| ErrorCode::InternalError(Some(what.to_string()));
    let request = OutgoingRequest::new(Fields::new());
    let scheme = if endpoint.https {
        Scheme::Https
    } else {
        Scheme::Http
    };
    request
        .set_method(&Method::Get)
        .map_err(|()| internal("method"))?;
    request
        .set_scheme(Some(&scheme))
        .map_err(|()| internal("scheme"))?;
    request
        .set_authority(Some(&endpoint.authority))
        .map_err(|()| internal("authority"))?;
    request
        .set_path_with_query(Some("/"))
        .map_err(|()| internal("path"))?;
    let body = request.body().map_err(|()| internal("body"))?;
    let response = outgoing_handler::handle(request, None)?;
    OutgoingBody::finish(body, None)?;
    let response = loop {
        match response.get() {
            Some(Ok(Ok(response))) => break response,
            Some(Ok(Err(code))) => return Err(code),
            Some(Err(())) => return Err(internal("response taken")),
            None => response.subscribe().block(),
        }
    };
    Ok(response.status())
}

// Only the component exports these functions; a host build (unit tests) leaves them out.
#[cfg(target_arch = "wasm32")]
export!(ContractV2);
