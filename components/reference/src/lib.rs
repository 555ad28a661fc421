//! # The reference provider
//!
//! A complete egress provider that needs no hypervisor. It is the example to copy when writing a
//! provider of your own, and the component the host's tests drive through every import and
//! export of the contract (`egress:provider@0.1.0`, world `provider-world` in
//! `wit/provider-v0.1.0/`, the released version, frozen).
//!
//! ## How the code is laid out
//!
//! * `lib.rs` (this file) only wires the exported functions to one module per operation:
//!   `describe`, `config` (`validate-config`), `create`, `get`, `delete`,
//!   `list_by_tag` and `check`.
//! * `operation` is what every hypervisor-facing operation does first: parse the config, wait
//!   `delayMs`, answer `failWith`.
//! * The `wasi:http` client, RFC 3339 time and the error classes of HTTP statuses come from the
//!   shared guest crate `egress-guest` (`components/guest`).
//! * `status` turns HTTP statuses and `wasi:http` error codes into contract errors and check
//!   results.
//! * `instance` and `logging` are small helpers (provider IDs, the JSON the endpoint speaks, the
//!   `log` import).
//!
//! ## What it does
//!
//! Without `endpoint` in its configuration it invents its answers: `create` of `web` answers a
//! running instance `ref/web` at a `198.51.100.x` address derived from the name. With `endpoint`
//! it makes one real HTTP request per operation (see `http`), so a host can test its egress
//! broker. `delayMs` and `failWith` let a host test timeouts and each error class.
//!
//! Each call runs in a fresh instance, so nothing here keeps state between calls.

mod check;
mod config;
mod create;
mod delete;
mod describe;
mod get;
mod instance;
mod list_by_tag;
mod logging;
mod operation;
mod status;

// Rust bindings for the contract, generated at compile time from the released contract 0.1.0 in
// the repository's `wit/provider-v0.1.0/` folder (frozen: a new contract version is a new folder).
// Imports become plain functions (`wasi::clocks::wall_clock::now()`), exports become the `Guest`
// trait implemented below. `generate_all` also generates the WASI interfaces the world only uses
// indirectly (`wasi:io/poll`, `wasi:io/streams`, ...), rather than expecting them from another
// crate.
wit_bindgen::generate!({
    path: "../../wit/provider-v0.1.0",
    world: "provider-world",
    generate_all,
});

use egress::provider::types::{CheckResult, CreateRequest, Description, Error, Instance};
use exports::egress::provider::provider::Guest;

/// The type the component exports; each method hands over to the operation's module.
struct ReferenceProvider;

impl Guest for ReferenceProvider {
    fn describe() -> Description {
        describe::describe()
    }

    fn validate_config(config: String) -> Result<(), Error> {
        config::validate_config(&config)
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
        list_by_tag::list_by_tag(&config, &key, &value)
    }

    fn check(config: String) -> CheckResult {
        check::check(&config)
    }
}

// Only the component exports these functions. A host build (for unit tests) leaves them out:
// export names like `egress:provider/provider@0.1.0#create` are not valid native symbols.
#[cfg(target_arch = "wasm32")]
export!(ReferenceProvider);
