//! An example provider for a toy inventory service (`testdata/inventory/inventory.py`): the
//! smallest complete provider, to copy. The `wasi:http` client, RFC 3339 time and error classes
//! come from `egress-guest`; this crate is only the backend's rules. Guide:
//! `docs/providers/authoring.md`.
//!
//! One file per operation (`describe`, `validate-config` and `check` are one expression each, here);
//! [`backend`] is the inventory's configuration, its VMs and the ownership mark.

mod backend;
mod create;
mod delete;
mod get;
mod list;

// The contract's bindings, from the frozen 0.1.0 WIT (`contract-wit` links to `wit/provider-v0.1.0`
// in this repository; copy that folder when you copy this crate).
wit_bindgen::generate!({ path: "contract-wit", world: "provider-world", generate_all });
// `?` turns the guest crate's `Problem` into the contract's `error`, `Health` into `check-result`.
egress_guest::contract_types!(egress::provider::types);

use egress::provider::types::{Capability, CheckResult, CreateRequest};
use egress::provider::types::{Description, Error, Instance};
use egress_guest::{Health, Method, Request};
use exports::egress::provider::provider::Guest;

/// The configuration's JSON Schema, published by `describe`.
const SCHEMA: &str = r#"{"type":"object","required":["url"],"additionalProperties":false,
"properties":{"url":{"type":"string","description":"http(s)://host[:port] of the inventory"}}}"#;

struct InventoryProvider;

impl Guest for InventoryProvider {
    fn describe() -> Description {
        Description {
            name: "example-inventory".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            contract_version: "0.1.0".into(),
            config_schema: SCHEMA.into(),
            capabilities: vec![Capability::Http],
        }
    }

    fn validate_config(config: String) -> Result<(), Error> {
        backend::endpoint(&config).map(drop).map_err(Error::from)
    }

    fn create(request: CreateRequest) -> Result<Instance, Error> {
        create::create(&request)
    }

    fn get(config: String, provider_id: String) -> Result<Instance, Error> {
        get::get(&config, &provider_id)
    }

    fn delete(config: String, provider_id: String) -> Result<(), Error> {
        delete::delete(&config, &provider_id)
    }

    fn list_by_tag(config: String, key: String, value: String) -> Result<Vec<Instance>, Error> {
        list::list_by_tag(&config, &key, &value)
    }

    /// `GET /health` with the host's grant, answered as a reason, never an error.
    fn check(config: String) -> CheckResult {
        let health = |url| egress_guest::check(&Request::new(Method::Get, &url, "/health"));
        backend::endpoint(&config).map_or_else(Health::from, health).into()
    }
}

#[cfg(target_arch = "wasm32")]
export!(InventoryProvider);
