//! # TEST ONLY: a provider that breaks the contract on purpose
//!
//! `egress-operator conformance` must fail it on exactly these rules, and pass it on the rest
//! (`host/operator/tests/all/conformance.rs`):
//!
//! - `create` makes a new VM on every call: each answer has a fresh provider ID, whatever the
//!   name and UID (breaks `create.idempotent`, `create.foreign-uid-permanent`);
//! - it keeps nothing, so `get` finds every ID it ever handed out, deleted or not, and answers
//!   `permanent` for any other ID (breaks `get.unknown-not-found`), and `list-by-tag` finds nothing
//!   (breaks `lifecycle.create-get-list-delete`).
//!
//! It needs no backend and imports no HTTP; describe, validate-config and check keep the
//! contract. Never load it anywhere but a test.

wit_bindgen::generate!({
    path: "../../../wit/provider-v0.1.0",
    world: "provider-world",
    generate_all,
});

use egress::provider::types::{
    CheckReason, CheckResult, CreateRequest, Description, Error, Instance, InstanceState,
};
use exports::egress::provider::provider::Guest;

/// Provider IDs are `broken/<name>/<uid>/<random>`.
const PREFIX: &str = "broken/";

struct Broken;

impl Guest for Broken {
    fn describe() -> Description {
        Description {
            name: "conformance-broken".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            contract_version: "0.1.0".to_string(),
            config_schema: r#"{"type":"object","properties":{"label":{"type":"string"}},"additionalProperties":false}"#.to_string(),
            capabilities: Vec::new(),
        }
    }

    fn validate_config(config: String) -> Result<(), Error> {
        match serde_json::from_str::<serde_json::Value>(&config) {
            Ok(value) if value.is_object() => Ok(()),
            _ => Err(Error::Permanent(
                "the config must be a JSON object".to_string(),
            )),
        }
    }

    fn create(request: CreateRequest) -> Result<Instance, Error> {
        if request.name.is_empty() {
            return Err(Error::Permanent("create needs a name".to_string()));
        }
        // The bug: no lookup by name, a new VM every time.
        let serial = wasi::random::random::get_random_u64();
        let id = format!("{PREFIX}{}/{}/{serial:016x}", request.name, request.uid);
        Ok(instance(&id, &request.name, &request.uid))
    }

    fn get(_config: String, provider_id: String) -> Result<Instance, Error> {
        // The bug: an ID that is not ours is `permanent`, not `not-found`.
        let mut parts = provider_id
            .strip_prefix(PREFIX)
            .ok_or_else(|| Error::Permanent(format!("unknown provider ID {provider_id}")))?
            .split('/');
        match (parts.next(), parts.next()) {
            (Some(name), Some(uid)) => Ok(instance(&provider_id, name, uid)),
            _ => Err(Error::Permanent(format!(
                "unknown provider ID {provider_id}"
            ))),
        }
    }

    fn delete(_config: String, _provider_id: String) -> Result<(), Error> {
        Ok(())
    }

    fn list_by_tag(_config: String, _key: String, _value: String) -> Result<Vec<Instance>, Error> {
        Ok(Vec::new())
    }

    fn check(_config: String) -> CheckResult {
        CheckResult {
            reason: CheckReason::Ok,
            message: "nothing to reach".to_string(),
        }
    }
}

fn instance(id: &str, name: &str, uid: &str) -> Instance {
    Instance {
        provider_id: id.to_string(),
        name: name.to_string(),
        state: InstanceState::Running,
        addresses: vec!["198.51.100.7".to_string()],
        created_at: None,
        uid: uid.to_string(),
    }
}

#[cfg(target_arch = "wasm32")]
export!(Broken);
