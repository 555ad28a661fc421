//! Contract `egress:provider@0.1.0`, frozen in `wit/provider-v0.1.0/`: bindings and conversions to
//! the host's domain types.
//!
//! Its `describe` declares the capabilities a provider needs in a closed `enum capability`; the
//! host reads them from the imports instead and only warns when the two disagree. Its log
//! interface is the contract's own `egress:provider/log`, served by the same `log.rs` as the
//! `egress:log` package of later versions.

use semver::Version;

/// The contract version these bindings implement.
pub(crate) const VERSION: &str = "0.1.0";

/// The first version this module serves; it serves the patch releases of its minor too.
pub(crate) const MIN_VERSION: Version = Version::new(0, 1, 0);

/// The name this version gives the log interface (at [`VERSION`]).
pub(crate) const LOG_INTERFACE: &str = "egress:provider/log";

wasmtime::component::bindgen!({
    path: "../../wit/provider-v0.1.0",
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

/// A VM as 0.1.0 names it.
type WitVm = wit::Instance;

/// What `list-by-tag` answers in 0.1.0: the VMs, all or an error.
type Listed = Vec<wit::Instance>;

fn listing(listed: Listed) -> types::Listing {
    types::Listing {
        vms: listed.into_iter().map(Into::into).collect(),
        unanswered: Vec::new(),
    }
}

/// 0.1.0 has no placement request: a pool's request is dropped (the pool sees no `host` back).
impl From<types::CreateRequest> for wit::CreateRequest {
    fn from(request: types::CreateRequest) -> Self {
        wit::CreateRequest {
            name: request.name,
            uid: request.uid,
            tags: request.tags.into_iter().map(Into::into).collect(),
            user_data: request.user_data,
            config: request.config,
        }
    }
}

impl From<wit::Instance> for types::Vm {
    fn from(vm: wit::Instance) -> Self {
        types::Vm {
            provider_id: vm.provider_id,
            name: vm.name,
            state: vm.state.into(),
            addresses: vm.addresses,
            created_at: vm.created_at,
            uid: vm.uid,
            host: None,
        }
    }
}

impl From<wit::InstanceState> for types::VmState {
    fn from(state: wit::InstanceState) -> Self {
        match state {
            wit::InstanceState::Provisioning => types::VmState::Provisioning,
            wit::InstanceState::Running => types::VmState::Running,
            wit::InstanceState::Stopped => types::VmState::Stopped,
            wit::InstanceState::Failed => types::VmState::Failed,
        }
    }
}

impl From<wit::Capability> for types::DeclaredCapability {
    fn from(capability: wit::Capability) -> Self {
        match capability {
            wit::Capability::Http => types::DeclaredCapability::Http,
            wit::Capability::Libvirt => types::DeclaredCapability::Libvirt,
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
            capabilities: description
                .capabilities
                .into_iter()
                .map(Into::into)
                .collect(),
        }
    }
}
