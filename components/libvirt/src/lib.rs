//! # The libvirt/KVM provider
//!
//! An egress provider component (contract `egress:provider@0.2.0`) that makes egress-proxy VMs on
//! KVM hypervisors through the host's libvirt capability (`egress:libvirt/libvirt@0.1.0`): each
//! VM's disk is made from a base image the host imports once per checksum (backed by it,
//! copy-on-write, or a whole copy), its NoCloud seed (built by `nocloud`) is uploaded as a
//! CD-ROM volume, and the domain carries an ownership mark in the metadata namespace of its
//! grant's owner. It ports the behaviour of the Go predecessor's kvm2 provider; the operator's
//! guide is `docs/providers/libvirt.md`.
//!
//! ## Layout
//!
//! * `lib.rs` (this file): export wiring; every capability call and operation outcome is logged
//!   through [`calls`].
//! * Operations, one file each: [`create`], [`get`], [`delete`], [`list_by_tag`], [`check`];
//!   `describe` is here and `validate-config` in [`config`]. Base images, imported and pruned
//!   by the host, in [`bases`].
//! * Pure rules, table-tested on the host: [`domain_xml`], [`volume_xml`] (names and XML),
//!   [`mark`] (the metadata element), [`state`] (state from state and reason, address choice),
//!   [`placement`] (which connection a new VM goes to), [`errors`] (classification), [`id`]
//!   (provider IDs).
//!
//! The provider never sees a URI, key or image byte: it names granted connections (one per
//! hypervisor) and a pool, and the host does the rest. Every call runs in a fresh instance and
//! keeps no state.

pub mod bases;
pub mod calls;
pub mod check;
pub mod config;
pub mod create;
pub mod delete;
pub mod domain_xml;
pub mod errors;
pub mod get;
pub mod id;
pub mod list_by_tag;
pub mod mark;
pub mod placement;
pub mod state;
pub mod volume_xml;

wit_bindgen::generate!({
    path: "../../wit/provider",
    world: "egress:provider/provider-world@0.2.0",
    generate_all,
});
egress_guest::contract_types!(crate::egress::provider::types, vm - state);

use egress::provider::types::{CheckResult, CreateRequest, Description, Error, Listing, Vm};
use exports::egress::provider::provider::Guest;

/// The contract version this provider implements (the WIT package version).
pub const CONTRACT_VERSION: &str = "0.2.0";

/// The VM a provider ID names, for the log (the ID itself when it is not one of ours).
fn vm_of(provider_id: &str) -> &str {
    id::parse(provider_id).map_or(provider_id, |(_, name)| name)
}

/// The exported provider; each method hands over to its operation's module.
struct LibvirtProvider;

impl Guest for LibvirtProvider {
    fn describe() -> Description {
        Description {
            name: "libvirt".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            contract_version: CONTRACT_VERSION.into(),
            config_schema: config::SCHEMA.into(),
        }
    }

    fn validate_config(config: String) -> Result<(), Error> {
        config::validate_config(&config)
    }

    fn create(request: CreateRequest) -> Result<Vm, Error> {
        calls::begin(&request.name);
        calls::finished(create::create(&request), |vm| {
            format!("ok: {} {}", vm.provider_id, vm.state.as_str())
        })
    }

    fn get(config: String, provider_id: String) -> Result<Vm, Error> {
        calls::begin(vm_of(&provider_id));
        calls::finished(get::get(&config, &provider_id), |vm| {
            format!("ok: {}", vm.state.as_str())
        })
    }

    fn delete(config: String, provider_id: String) -> Result<(), Error> {
        calls::begin(vm_of(&provider_id));
        calls::finished(delete::delete(&config, &provider_id), |()| "ok".into())
    }

    fn list_by_tag(config: String, key: String, value: String) -> Result<Listing, Error> {
        calls::begin("");
        calls::finished(list_by_tag::list_by_tag(&config, &key, &value), |listing| {
            format!(
                "ok: {} VMs, {} connections unanswered",
                listing.vms.len(),
                listing.unanswered.len()
            )
        })
    }

    fn check(config: String) -> CheckResult {
        calls::begin("");
        calls::checked(check::check(&config))
    }
}

// Only the component exports these functions; a host build (unit tests) leaves them out.
#[cfg(target_arch = "wasm32")]
export!(LibvirtProvider);
