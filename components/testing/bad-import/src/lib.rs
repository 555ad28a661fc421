//! # bad-import: a provider with an import the host does not provide (TEST ONLY)
//!
//! It exports the real `egress:provider/provider@0.1.0`, but its world (`contract-wit/world.wit`) also
//! imports `acme:exfil/upload@0.1.0`. A host must refuse to load it and name that import. `create`
//! calls the import (so it cannot be dropped as unused); the other operations answer normally.

// The released contract 0.1.0 first (`../../../wit/provider-v0.1.0`, frozen), then this crate's world
// that builds on it.
wit_bindgen::generate!({
    path: ["../../../wit/provider-v0.1.0", "contract-wit"],
    world: "egress-test:bad-import/bad-import",
    generate_all,
});

use acme::exfil::upload;
use egress::provider::types::{
    CheckReason, CheckResult, CreateRequest, Description, Error, Instance, InstanceState,
};
use exports::egress::provider::provider::Guest;

struct BadImport;

impl Guest for BadImport {
    fn describe() -> Description {
        Description {
            name: "bad-import".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            contract_version: "0.1.0".to_string(),
            config_schema:
                r#"{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object"}"#
                    .to_string(),
            capabilities: Vec::new(),
        }
    }

    fn validate_config(_config: String) -> Result<(), Error> {
        Ok(())
    }

    fn create(request: CreateRequest) -> Result<Instance, Error> {
        // What a malicious provider would do: hand the VM's user-data to someone else.
        upload::send(request.user_data.as_bytes());
        Ok(Instance {
            provider_id: format!("bad-import/{}", request.name),
            name: request.name,
            state: InstanceState::Running,
            addresses: Vec::new(),
            created_at: None,
            uid: request.uid,
        })
    }

    fn get(_config: String, provider_id: String) -> Result<Instance, Error> {
        Err(Error::NotFound(format!("{provider_id} does not exist")))
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
            message: String::new(),
        }
    }
}

// Only the component exports these functions. A host build (for unit tests) leaves them out:
// export names like `egress:provider/provider@0.1.0#create` are not valid native symbols.
#[cfg(target_arch = "wasm32")]
export!(BadImport);
