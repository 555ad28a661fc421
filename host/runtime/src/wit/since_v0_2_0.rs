//! Contract `egress:provider@0.2.0`, the version in development (`wit/provider/`): bindings and
//! conversions to the host's domain types.
//!
//! What 0.2.0 changes against 0.1.0: capabilities are packages of their own
//! (`egress:log/log`, `egress:libvirt/libvirt`, `egress:http-broker/broker`) that the world may
//! import, and `describe` no longer lists capabilities (the closed `enum capability` could not
//! grow): the host reads what a provider needs from its imports. A VM can be `paused` (0.1.0 said
//! `stopped`), and `list-by-tag` answers a `listing`: the VMs of the hypervisors that answered and
//! which did not. The `instance` record is `vm` (a wasm instance is something else), `create`
//! carries a pool's placement request and a VM says which host it runs on. See `docs/contract.md`.

use semver::Version;

/// The contract version these bindings implement.
pub(crate) const VERSION: &str = "0.2.0";

/// The first version this module serves; it serves the patch releases of its minor too.
pub(crate) const MIN_VERSION: Version = Version::new(0, 2, 0);

wasmtime::component::bindgen!({
    path: "../../wit/provider",
    world: "provider-world",
    exports: { default: async },
    with: {
        // Reuse wasmtime's own WASI bindings so their host implementations serve our world.
        "wasi:http": wasmtime_wasi_http::p2::bindings::http,
        "wasi:io": wasmtime_wasi::p2::bindings::io,
        "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
        "wasi:random": wasmtime_wasi::p2::bindings::random,
    },
});

served_version!();

/// A VM as 0.2.0 names it (0.1.0 said `instance`).
type WitVm = wit::Vm;

/// What `list-by-tag` answers from 0.2.0: the VMs of the hypervisors that answered, and which
/// did not.
type Listed = wit::Listing;

fn listing(listed: Listed) -> types::Listing {
    types::Listing {
        vms: listed.vms.into_iter().map(Into::into).collect(),
        unanswered: listed.unanswered,
    }
}

impl From<types::CreateRequest> for wit::CreateRequest {
    fn from(request: types::CreateRequest) -> Self {
        wit::CreateRequest {
            name: request.name,
            uid: request.uid,
            tags: request.tags.into_iter().map(Into::into).collect(),
            user_data: request.user_data,
            config: request.config,
            placement: request.placement.map(|placement| wit::Placement {
                avoid_hosts: placement.avoid_hosts,
                required: placement.required,
            }),
        }
    }
}

impl From<wit::Vm> for types::Vm {
    fn from(vm: wit::Vm) -> Self {
        types::Vm {
            provider_id: vm.provider_id,
            name: vm.name,
            state: vm.state.into(),
            addresses: vm.addresses,
            created_at: vm.created_at,
            uid: vm.uid,
            host: vm.host,
        }
    }
}

impl From<wit::VmState> for types::VmState {
    fn from(state: wit::VmState) -> Self {
        match state {
            wit::VmState::Provisioning => types::VmState::Provisioning,
            wit::VmState::Running => types::VmState::Running,
            wit::VmState::Stopped => types::VmState::Stopped,
            wit::VmState::Failed => types::VmState::Failed,
            wit::VmState::Paused => types::VmState::Paused,
        }
    }
}

impl From<wit::Description> for types::Description {
    fn from(description: wit::Description) -> Self {
        types::Description {
            name: description.name,
            version: description.version,
            contract_version: description.contract_version,
            config_schema: description.config_schema,
            // Read from the imports instead: `Provider::capabilities`.
            capabilities: Vec::new(),
        }
    }
}
