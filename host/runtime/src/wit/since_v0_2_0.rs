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

served_version!("../../wit/provider", vm: Vm, host: vm_host, capabilities: none_declared, create: { placement: placement });

/// What `list-by-tag` answers from 0.2.0: the VMs of the hypervisors that answered, and which
/// did not.
type Listed = wit::Listing;

fn listing(listed: Listed) -> types::Listing {
    types::Listing {
        vms: listed.vms.into_iter().map(Into::into).collect(),
        unanswered: listed.unanswered,
    }
}

fn vm_host(vm: &wit::Vm) -> Option<String> {
    vm.host.clone()
}

fn placement(request: &types::CreateRequest) -> Option<wit::Placement> {
    let placement = request.placement.as_ref()?;
    Some(wit::Placement {
        avoid_hosts: placement.avoid_hosts.clone(),
        required: placement.required,
    })
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

/// None: from 0.2.0 the host reads what a provider needs from its imports
/// (`Provider::capabilities`).
fn none_declared(_: &wit::Description) -> Vec<types::DeclaredCapability> {
    Vec::new()
}
