//! The libvirt capability as `egress-runtime` serves it: [`Capability`] for
//! [`LibvirtCapability`], and [`LibvirtView`] for the runtime's store data, [`HostState`].
//!
//! Give it to the runtime with `RuntimeConfig::capability`, keep a clone, and grant identities
//! with [`Capability::set_grant`] (a [`LibvirtGrant`] each). Then a component that imports
//! `egress:libvirt/libvirt` loads (and one on a runtime without it is refused, naming the
//! import); each call of such a provider gets the granted context of its identity, or, without a
//! grant (or with a grant pinned to other component bytes), [`LibvirtCallCtx::ungranted`], on
//! which every `open` is denied. Its handles live in the call's one resource table, so the
//! runtime's `resource_handles` budget and hostcall fuel bound them as they bound every other
//! resource.

use std::any::Any;

use egress_runtime::capability::import_matches;
use egress_runtime::grant::{GrantContext, GrantError};
use egress_runtime::{Capability, HostState, PrepareContext};
use wasmtime::component::Linker;

use crate::{LibvirtCallCtx, LibvirtCapability, LibvirtCtxView, LibvirtGrant, LibvirtView};

/// The interface this capability provides, and its version.
const INTERFACE: &str = "egress:libvirt/libvirt";
const VERSION: &str = "0.1.0";

impl Capability for LibvirtCapability {
    type Grant = LibvirtGrant;

    fn name(&self) -> &'static str {
        "libvirt"
    }

    fn provides(&self, import: &str) -> bool {
        import_matches(import, INTERFACE, VERSION)
    }

    fn link(&self, linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
        crate::add_to_linker(linker)
    }

    fn set_grant(
        &self,
        identity: &str,
        grant: &LibvirtGrant,
        context: &GrantContext<'_>,
    ) -> Result<(), GrantError> {
        self.set(identity, grant, context)
    }

    fn remove_grant(&self, identity: &str) {
        self.remove(identity);
    }

    fn granted(&self, identity: &str) -> bool {
        self.has_grant(identity)
    }

    fn prepare(&self, call: &PrepareContext<'_>) -> Box<dyn Any + Send> {
        let ctx = self
            .prepare_for(&call.site.provider, &call.site.digest, call.deadline)
            .unwrap_or_else(|| LibvirtCallCtx::ungranted(call.deadline));
        Box::new(ctx)
    }
}

impl LibvirtView for HostState {
    fn libvirt(&mut self) -> LibvirtCtxView<'_> {
        let (ctx, table) = self.capability_state(LibvirtCallCtx::ungranted);
        LibvirtCtxView { ctx, table }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libvirt_provides_its_interface_at_compatible_versions_only() {
        let capability = LibvirtCapability::new();
        assert_eq!(capability.name(), "libvirt");
        assert!(capability.provides("egress:libvirt/libvirt@0.1.0"));
        assert!(capability.provides("egress:libvirt/libvirt@0.1.2"));
        assert!(!capability.provides("egress:libvirt/libvirt@0.2.0"));
        assert!(!capability.provides("egress:provider/libvirt@0.1.0"));
        assert!(!capability.granted("kvm2"));
    }
}
