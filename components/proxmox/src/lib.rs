//! # The Proxmox VE provider
//!
//! An egress provider component (`egress:provider@0.2.0`, world `provider-world`) that makes
//! egress-proxy VMs on Proxmox VE by full-cloning a template, attaching a NoCloud seed on ide2 and
//! reading addresses from the QEMU guest agent. It behaves as the Go predecessor's execution log
//! recorded against a real PVE 9.2.20 host; the facts (F1–F23), corrections (1–10) and judgment
//! calls are cited where each rule lives. The operator's guide is `docs/providers/proxmox.md`.
//!
//! ## Layout
//!
//! * `lib.rs` (this file): export wiring only.
//! * Operations, one file each: [`create`], [`get`], [`delete`], [`list`] (`list-by-tag`),
//!   [`check`]; `describe` and `validate-config` are in this file and [`config`].
//! * Rules as pure functions over parsed API data, table-tested on the host: [`state`] (Get's
//!   order, the agent table), [`mark`] (ownership mark), [`task`] (UPIDs, task outcomes, locks),
//!   [`net`] (net0 rewrite), [`placement`] (the node a new VM goes to), [`disk`] (boot disk, sizes, resize-when-larger), [`errors`]
//!   (message matchers and classification), [`seed`], [`id`] (provider IDs `<node>/<vmid>`).
//! * [`api`]: the thin PVE client over the [`api::Io`] seam; [`wasi_io`] implements the seam over
//!   `wasi:http`, `wasi:clocks` and the `log` import.
//!
//! The provider never sets `Authorization` and has no token or CA: the host's egress broker
//! injects the token and verifies TLS. Every call runs in a fresh instance and keeps no state.

pub mod api;
pub mod check;
pub mod config;
pub mod create;
pub mod delete;
pub mod disk;
pub mod errors;
pub mod get;
pub mod id;
pub mod list;
pub mod mark;
pub mod net;
pub mod placement;
pub mod seed;
pub mod state;
pub mod task;
pub mod wasi_io;

#[cfg(test)]
mod flow_tests;

wit_bindgen::generate!({
    path: "../../wit/provider",
    world: "provider-world",
    generate_all,
});
egress_guest::contract_types!(crate::egress::provider::types, vm - state);

use api::{Io, LogLevel, Pve};
use config::Config;
use egress::provider::types::{
    CheckReason, CheckResult, CreateRequest, Description, Error, Listing, Vm,
};
use exports::egress::provider::provider::Guest;
use id::VmId;
use wasi_io::WasiIo;

/// The contract version this provider implements (the WIT package version).
pub const CONTRACT_VERSION: &str = "0.2.0";

/// The exported provider; each method hands over to its operation's module.
struct ProxmoxProvider;

/// Parse the config and run `operation` over the component's [`Io`] ([`operate`]).
fn run<T: Answer>(
    json: &str,
    name: &str,
    operation: impl FnOnce(&mut Pve<'_, WasiIo>) -> Result<T, Error>,
) -> Result<T, Error> {
    let config = Config::parse(json).map_err(Error::Permanent)?;
    let mut io = WasiIo {
        authority: config.authority.clone(),
    };
    operate(&mut io, &config, name, operation)
}

/// What an operation's outcome line says about its answer.
trait Answer {
    fn summary(&self) -> String;
}

impl Answer for Vm {
    /// `pv1-1/142857 proxy-… provisioning` and the addresses, if any.
    fn summary(&self) -> String {
        let state = self.state.as_str();
        let mut summary = format!("{} {} {state}", self.provider_id, self.name);
        for address in &self.addresses {
            summary.push(' ');
            summary.push_str(address);
        }
        summary
    }
}

impl Answer for Listing {
    fn summary(&self) -> String {
        let mut summary = format!("{} VMs", self.vms.len());
        if !self.unanswered.is_empty() {
            summary.push_str(&format!("; unanswered: {}", self.unanswered.join(", ")));
        }
        summary
    }
}

impl Answer for () {
    fn summary(&self) -> String {
        "ok".into()
    }
}

/// Run `operation` over `io` and log its outcome at info, one line: the operation, how many API
/// requests it made (each has its own debug line), how long it took, and its answer or error.
fn operate<I: Io, T: Answer>(
    io: &mut I,
    config: &Config,
    name: &str,
    operation: impl FnOnce(&mut Pve<'_, I>) -> Result<T, Error>,
) -> Result<T, Error> {
    let started = io.monotonic_ms();
    let mut pve = Pve::new(io, config);
    let outcome = operation(&mut pve);
    let requests = pve.requests.to_string();
    let ms = io.monotonic_ms().saturating_sub(started).to_string();
    let result = match &outcome {
        Ok(answer) => answer.summary(),
        Err(error) => format!("{error:?}"),
    };
    io.log(
        LogLevel::Info,
        "proxmox operation finished",
        &[
            ("operation", name),
            ("requests", &requests),
            ("ms", &ms),
            ("result", &result),
        ],
    );
    outcome
}

impl Guest for ProxmoxProvider {
    fn describe() -> Description {
        Description {
            name: "proxmox".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            contract_version: CONTRACT_VERSION.into(),
            config_schema: config::SCHEMA.into(),
        }
    }

    fn validate_config(config: String) -> Result<(), Error> {
        config::validate_config(&config)
    }

    fn create(request: CreateRequest) -> Result<Vm, Error> {
        run(&request.config, "create", |pve| {
            create::create(pve, &request)
        })
    }

    fn get(config: String, provider_id: String) -> Result<Vm, Error> {
        // An ID of another shape names no VM this provider made: `not-found` (create then finds
        // its VM again by name and UID), never `permanent`. `delete` keeps refusing it.
        let id = VmId::parse(&provider_id).map_err(|error| match error {
            Error::Permanent(message) => Error::NotFound(message),
            other => other,
        })?;
        run(&config, "get", |pve| get::get(pve, &id))
    }

    fn delete(config: String, provider_id: String) -> Result<(), Error> {
        let id = VmId::parse(&provider_id)?;
        run(&config, "delete", |pve| delete::delete(pve, &id))
    }

    fn list_by_tag(config: String, key: String, value: String) -> Result<Listing, Error> {
        run(&config, "list-by-tag", |pve| {
            list::list_by_tag(pve, &key, &value)
        })
    }

    fn check(config: String) -> CheckResult {
        let config = match Config::parse(&config) {
            Ok(config) => config,
            Err(message) => {
                return CheckResult {
                    reason: CheckReason::Misconfigured,
                    message,
                };
            }
        };
        let mut io = WasiIo {
            authority: config.authority.clone(),
        };
        let mut pve = Pve::new(&mut io, &config);
        check::check(&mut pve)
    }
}

// Only the component exports these functions. A host build (for unit tests) leaves them out:
// export names like `egress:provider/provider@0.2.0#create` are not valid native symbols.
#[cfg(target_arch = "wasm32")]
export!(ProxmoxProvider);
