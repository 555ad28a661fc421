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

served_version!("../../wit/provider-v0.1.0", vm: Instance, host: no_host, capabilities: declared, create: {});

/// What `list-by-tag` answers in 0.1.0: the VMs, all or an error.
type Listed = Vec<wit::Instance>;

fn listing(listed: Listed) -> types::Listing {
    types::Listing {
        vms: listed.into_iter().map(Into::into).collect(),
        unanswered: Vec::new(),
    }
}

/// 0.1.0 has no placement request (a pool's is dropped), and its VMs say no host.
fn no_host(_: &wit::Instance) -> Option<String> {
    None
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

/// What `describe` declares a provider needs (the host goes by the imports and warns when the
/// two differ).
fn declared(description: &wit::Description) -> Vec<types::DeclaredCapability> {
    description.capabilities.iter().map(|&c| c.into()).collect()
}
