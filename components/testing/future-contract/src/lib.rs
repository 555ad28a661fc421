//! # future-contract: a provider from a contract version the host does not know (TEST ONLY)
//!
//! It exports `egress:provider/provider@0.9.0` (WIT in this crate's `contract-wit/`, a copy of the real
//! contract with the version changed) instead of `@0.1.0`. A host that supports only 0.1.0 must
//! refuse to load it with an "unsupported contract version" error, not fail later on a call.
//! If a host does call it, `describe` says contract-version `0.9.0` and every other operation
//! answers `permanent`.

wit_bindgen::generate!({
    path: "contract-wit",
    world: "provider-world",
});

use egress::provider::types::{
    CheckReason, CheckResult, CreateRequest, Description, Error, Instance,
};
use exports::egress::provider::provider::Guest;

const REFUSAL: &str = "future-contract is a test component: it only describes itself";

struct FutureContract;

impl Guest for FutureContract {
    fn describe() -> Description {
        Description {
            name: "future-contract".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            contract_version: "0.9.0".to_string(),
            config_schema:
                r#"{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object"}"#
                    .to_string(),
            capabilities: Vec::new(),
        }
    }

    fn validate_config(_config: String) -> Result<(), Error> {
        Err(Error::Permanent(REFUSAL.to_string()))
    }

    fn create(_request: CreateRequest) -> Result<Instance, Error> {
        Err(Error::Permanent(REFUSAL.to_string()))
    }

    fn get(_config: String, _provider_id: String) -> Result<Instance, Error> {
        Err(Error::Permanent(REFUSAL.to_string()))
    }

    fn delete(_config: String, _provider_id: String) -> Result<(), Error> {
        Err(Error::Permanent(REFUSAL.to_string()))
    }

    fn list_by_tag(_config: String, _key: String, _value: String) -> Result<Vec<Instance>, Error> {
        Err(Error::Permanent(REFUSAL.to_string()))
    }

    fn check(_config: String) -> CheckResult {
        CheckResult {
            reason: CheckReason::Other,
            message: REFUSAL.to_string(),
        }
    }
}

// Only the component exports these functions. A host build (for unit tests) leaves them out:
// export names like `egress:provider/provider@0.1.0#create` are not valid native symbols.
#[cfg(target_arch = "wasm32")]
export!(FutureContract);
