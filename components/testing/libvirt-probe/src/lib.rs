//! # libvirt-probe: a contract 0.2.0 provider that imports `egress:libvirt` (TEST ONLY)
//!
//! It binds `wit/provider/` (contract 0.2.0) and uses `egress:libvirt/libvirt`, so it imports
//! it: a host loads it only when it has the libvirt capability. `check` with
//! `{"connection": "<name>"}` opens that connection of the provider's grant and asks the
//! hypervisor for its version: `ok` with `libvirt <version>`, `forbidden` with `denied: …` when the
//! grant does not name the connection (or the provider has no grant), `unreachable` otherwise.
//! With `"hold": n` it first opens the connection `n` times and keeps every handle, to show the
//! host's handle budget bounds libvirt's resources as it bounds every other. `describe` and
//! `validate-config` answer; the other operations are `permanent`.

wit_bindgen::generate!({
    path: "../../../wit/provider",
    world: "egress:provider/provider-world@0.2.0",
    generate_all,
});

use egress::libvirt::libvirt::{Connection, Error as LibvirtError};
use egress::provider::types::{
    CheckReason, CheckResult, CreateRequest, Description, Error, Listing, Vm,
};
use exports::egress::provider::provider::Guest;

const REFUSAL: &str = "libvirt-probe only checks a connection";

struct LibvirtProbe;

impl Guest for LibvirtProbe {
    fn describe() -> Description {
        Description {
            name: "libvirt-probe".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            contract_version: "0.2.0".to_string(),
            config_schema:
                r#"{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object"}"#
                    .to_string(),
        }
    }

    fn validate_config(_config: String) -> Result<(), Error> {
        Ok(())
    }

    fn create(_request: CreateRequest) -> Result<Vm, Error> {
        Err(Error::Permanent(REFUSAL.to_string()))
    }

    fn get(_config: String, _provider_id: String) -> Result<Vm, Error> {
        Err(Error::Permanent(REFUSAL.to_string()))
    }

    fn delete(_config: String, _provider_id: String) -> Result<(), Error> {
        Err(Error::Permanent(REFUSAL.to_string()))
    }

    fn list_by_tag(_config: String, _key: String, _value: String) -> Result<Listing, Error> {
        Err(Error::Permanent(REFUSAL.to_string()))
    }

    fn check(config: String) -> CheckResult {
        let config = serde_json::from_str::<serde_json::Value>(&config).unwrap_or_default();
        let name = config
            .get("connection")
            .and_then(|name| name.as_str())
            .unwrap_or_default()
            .to_string();
        let hold = config.get("hold").and_then(|n| n.as_u64()).unwrap_or(0);
        let mut held = Vec::new();
        for _ in 0..hold {
            match Connection::open(&name) {
                Ok(connection) => held.push(connection),
                Err(error) => {
                    return CheckResult {
                        reason: CheckReason::Other,
                        message: format!("open {} failed: {error:?}", held.len()),
                    };
                }
            }
        }
        let outcome = Connection::open(&name).and_then(|connection| connection.version());
        match outcome {
            Ok(version) => CheckResult {
                reason: CheckReason::Ok,
                message: format!("libvirt {version}"),
            },
            Err(LibvirtError::Denied(message)) => CheckResult {
                reason: CheckReason::Forbidden,
                message: format!("denied: {message}"),
            },
            Err(other) => CheckResult {
                reason: CheckReason::Unreachable,
                message: format!("{other:?}"),
            },
        }
    }
}

// Only the component exports these functions; a host build (unit tests) leaves them out.
#[cfg(target_arch = "wasm32")]
export!(LibvirtProbe);
