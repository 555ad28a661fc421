//! Host capabilities: what a provider can be granted beyond the bare sandbox (a trimmed Spin
//! `Factor`).
//!
//! A capability is a family of host interfaces a provider imports (`wasi:http/*` and
//! `egress:http-broker/*` for HTTP, `egress:libvirt/libvirt` for libvirt), with a grant per
//! provider identity. Each one is its own crate (the HTTP broker, the libvirt capability); the
//! runtime knows them only through [`Capability`]:
//!
//! | when | method | what it does |
//! |---|---|---|
//! | the runtime is built | [`link`](Capability::link) | adds the capability's interfaces to the one linker, once |
//! | a component is loaded | [`provides`](Capability::provides) | claims its imports: what a provider needs is read from its imports, never from what it declares |
//! | the host grants an identity, or takes the grant back | [`set_grant`](Capability::set_grant), [`remove_grant`](Capability::remove_grant) | validates the typed [`Grant`](Capability::Grant), resolves what it names through the host ([`GrantContext`]) and swaps it in: calls in flight keep the grant they started with |
//! | a provider is loaded or bound | [`granted`](Capability::granted) | says whether its identity has a grant (a note when it does not) |
//! | every call | [`prepare`](Capability::prepare) | builds the call's state: the granted context, or an ungranted one on which everything is denied |
//!
//! A capability's per-call state lives in the call's [`HostState`], found by its type
//! ([`HostState::capability_state`]), beside the call's one [`ResourceTable`] that every
//! capability's resources share. So every budget of [`Limits`] applies to them: the table's
//! capacity and the store's handle limit (`resource_handles`), and wasmtime's hostcall fuel on
//! every argument a guest hands a host function (`transfer_bytes`).
//!
//! A component that imports an interface no capability of the runtime provides is refused at load
//! ([`LoadError::UnknownImport`](crate::LoadError::UnknownImport)); capabilities are added with
//! [`RuntimeConfig::capability`](crate::RuntimeConfig::capability). Only the capabilities a
//! component imports are prepared for its calls.
//!
//! # Implementing one
//!
//! ```no_run
//! use std::any::Any;
//! use std::sync::Mutex;
//! use egress_runtime::grant::{GrantContext, GrantError, NoGrant};
//! use egress_runtime::{Capability, HostState, PrepareContext};
//! use wasmtime::component::Linker;
//!
//! /// The per-call state: here, only whether the provider is granted.
//! struct EchoCall { granted: bool }
//!
//! struct Echo { granted: Vec<String> }
//!
//! impl Capability for Echo {
//!     // Echo's grants are fixed when it is built: there is nothing to set.
//!     type Grant = NoGrant;
//!     fn name(&self) -> &'static str { "echo" }
//!     fn provides(&self, import: &str) -> bool {
//!         egress_runtime::capability::import_matches(import, "acme:echo/echo", "0.1.0")
//!     }
//!     fn link(&self, linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
//!         linker.instance("acme:echo/echo@0.1.0")?.func_wrap(
//!             "granted",
//!             |mut store: wasmtime::StoreContextMut<'_, HostState>, (): ()| {
//!                 // The fallback builds an ungranted state should none have been prepared.
//!                 let (call, _table) = store
//!                     .data_mut()
//!                     .capability_state(|_deadline| EchoCall { granted: false });
//!                 Ok((call.granted,))
//!             },
//!         )
//!     }
//!     fn set_grant(&self, _: &str, grant: &NoGrant, _: &GrantContext<'_>) -> Result<(), GrantError> {
//!         match *grant {}
//!     }
//!     fn remove_grant(&self, _identity: &str) {}
//!     fn granted(&self, identity: &str) -> bool {
//!         self.granted.iter().any(|granted| granted == identity)
//!     }
//!     fn prepare(&self, call: &PrepareContext<'_>) -> Box<dyn Any + Send> {
//!         Box::new(EchoCall { granted: self.granted(&call.site.provider) })
//!     }
//! }
//! ```

use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::Linker;

#[cfg(doc)]
use wasmtime::component::ResourceTable;

use crate::egress::{CallSite, Tap};
use crate::grant::{GrantContext, GrantDocument, GrantError};
use crate::limits::Limits;
use crate::state::HostState;

/// A host capability: interfaces a provider imports, granted per provider identity. See the
/// [module documentation](self).
///
/// Implementations are shared by every call of every provider (`Send + Sync`); whatever one call
/// needs goes in the state [`prepare`](Capability::prepare) returns.
pub trait Capability: Send + Sync + 'static {
    /// What the host grants one provider identity: the capability's one typed grant document,
    /// which the ProviderConfig's `spec.grant.<name>` and the CLI's grants file hold as they are
    /// ([`NoGrant`](crate::grant::NoGrant) for a capability whose grants are fixed).
    type Grant: GrantDocument;

    /// A short, stable name (`http`, `libvirt`): what [`Provider::capabilities`] lists and logs
    /// say. Unique within a runtime.
    ///
    /// [`Provider::capabilities`]: crate::Provider::capabilities
    fn name(&self) -> &'static str;

    /// Whether `import`, a component's import name such as `egress:libvirt/libvirt@0.1.0`, is
    /// one of this capability's interfaces. Versions should be matched as the linker matches them,
    /// by semver compatibility ([`import_matches`]). Only used to read what a provider needs and
    /// to name what is missing: the linker decides what links.
    fn provides(&self, import: &str) -> bool;

    /// Add this capability's interfaces to `linker`. Called once, when the runtime is built; the
    /// engine has async support, so host functions may be async.
    fn link(&self, linker: &mut Linker<HostState>) -> wasmtime::Result<()>;

    /// Grant `identity` what `grant` says, replacing its grant: the document is validated, what
    /// it names is resolved through `context.host` now, and the grant is pinned to
    /// `context.digests`. Calls in flight keep the grant they started with; the next call gets
    /// this one. An invalid grant is refused and the previous one, if any, stays.
    fn set_grant(
        &self,
        identity: &str,
        grant: &Self::Grant,
        context: &GrantContext<'_>,
    ) -> Result<(), GrantError>;

    /// Take `identity`'s grant back: its next call gets the ungranted state. Whatever the grant
    /// held (secrets in memory, key files) goes once the calls in flight that use it end.
    fn remove_grant(&self, identity: &str);

    /// Whether the provider `identity` has a grant of this capability now. Informational: a call
    /// of a provider without one still runs, with the ungranted state
    /// [`prepare`](Capability::prepare) gives it.
    fn granted(&self, identity: &str) -> bool;

    /// The state of one call: the provider's granted context, or (without a grant) one on which
    /// every use is denied. It is stored in the call's [`HostState`] and found again by its type
    /// with [`HostState::capability_state`]; its resources go in the call's shared
    /// [`ResourceTable`]. Called before the call's instance is made, on the async executor: it
    /// must not block.
    fn prepare(&self, call: &PrepareContext<'_>) -> Box<dyn Any + Send>;
}

/// The part of a [`Capability`] the runtime uses, without its grant type, so capabilities with
/// different grants sit in one list.
pub(crate) trait Linked: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn provides(&self, import: &str) -> bool;
    fn link(&self, linker: &mut Linker<HostState>) -> wasmtime::Result<()>;
    fn granted(&self, identity: &str) -> bool;
    fn prepare(&self, call: &PrepareContext<'_>) -> Box<dyn Any + Send>;
}

impl<C: Capability> Linked for C {
    fn name(&self) -> &'static str {
        Capability::name(self)
    }

    fn provides(&self, import: &str) -> bool {
        Capability::provides(self, import)
    }

    fn link(&self, linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
        Capability::link(self, linker)
    }

    fn granted(&self, identity: &str) -> bool {
        Capability::granted(self, identity)
    }

    fn prepare(&self, call: &PrepareContext<'_>) -> Box<dyn Any + Send> {
        Capability::prepare(self, call)
    }
}

/// What [`Capability::prepare`] knows about the call it prepares.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct PrepareContext<'a> {
    /// Who calls: the provider's host-assigned identity and digest, and the operation. The
    /// identity is the host's, never the component's claim; grants follow it.
    pub site: &'a CallSite,
    /// When the operation's wall-clock deadline passes: no host work for the call should run
    /// past it.
    pub deadline: Instant,
    /// The limits the call runs under.
    pub limits: &'a Limits,
    /// What stands between the call's requests and the egress, if anything.
    pub tap: Option<&'a Arc<dyn Tap>>,
}

impl<'a> PrepareContext<'a> {
    /// The context of a call of `site` until `deadline` under `limits`, with no tap.
    pub fn new(site: &'a CallSite, deadline: Instant, limits: &'a Limits) -> Self {
        PrepareContext {
            site,
            deadline,
            limits,
            tap: None,
        }
    }

    /// With `tap` in front of the call's egress.
    pub fn with_tap(self, tap: Option<&'a Arc<dyn Tap>>) -> Self {
        PrepareContext { tap, ..self }
    }
}

/// Whether the import name `import` (`package/interface@version`) names `interface` at a version
/// semver-compatible with `version`, as wasmtime's linker matches them: the same major version,
/// and for `0.x` the same minor (for `0.0.x` the same patch). `import_matches(
/// "egress:libvirt/libvirt@0.1.3", "egress:libvirt/libvirt", "0.1.0")` is true; `@0.2.0` is not.
pub fn import_matches(import: &str, interface: &str, version: &str) -> bool {
    let Some((name, imported)) = import.split_once('@') else {
        return false;
    };
    if name != interface {
        return false;
    }
    match (
        semver::Version::parse(imported),
        semver::Version::parse(version),
    ) {
        (Ok(imported), Ok(provided)) => compatible(&imported, &provided),
        _ => false,
    }
}

/// Whether two versions are semver-compatible: the same major, and for `0.x` the same minor
/// (for `0.0.x` the same patch). Pre-releases are compatible only with themselves.
pub(crate) fn compatible(a: &semver::Version, b: &semver::Version) -> bool {
    if !a.pre.is_empty() || !b.pre.is_empty() {
        return a == b;
    }
    match (a.major, b.major) {
        (0, 0) => a.minor == b.minor && (a.minor != 0 || a.patch == b.patch),
        (x, y) => x == y,
    }
}

/// The capabilities of a runtime, in the order they were given (HTTP first).
#[derive(Clone, Default)]
pub(crate) struct CapabilitySet {
    capabilities: Vec<Arc<dyn Linked>>,
}

impl std::fmt::Debug for CapabilitySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl CapabilitySet {
    /// A set of `capabilities`; `Err` names a capability given twice.
    pub(crate) fn new(capabilities: Vec<Arc<dyn Linked>>) -> Result<Self, &'static str> {
        for (index, capability) in capabilities.iter().enumerate() {
            let name = capability.name();
            if capabilities[..index].iter().any(|c| c.name() == name) {
                return Err(name);
            }
        }
        Ok(CapabilitySet { capabilities })
    }

    /// The names, in order.
    pub(crate) fn names(&self) -> Vec<&'static str> {
        self.capabilities.iter().map(|c| c.name()).collect()
    }

    /// Every capability.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<dyn Linked>> {
        self.capabilities.iter()
    }

    /// The capability that provides `import`, if any.
    pub(crate) fn provider_of(&self, import: &str) -> Option<&Arc<dyn Linked>> {
        self.capabilities.iter().find(|c| c.provides(import))
    }

    /// The capabilities that provide at least one of `imports`, in the set's order.
    pub(crate) fn imported_by<'a>(
        &self,
        imports: impl IntoIterator<Item = &'a str>,
    ) -> Vec<Arc<dyn Linked>> {
        let imports: Vec<&str> = imports.into_iter().collect();
        self.capabilities
            .iter()
            .filter(|c| imports.iter().any(|import| c.provides(import)))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imports_match_by_semver_compatibility() {
        let libvirt = "egress:libvirt/libvirt";
        assert!(import_matches(
            "egress:libvirt/libvirt@0.1.0",
            libvirt,
            "0.1.0"
        ));
        assert!(import_matches(
            "egress:libvirt/libvirt@0.1.7",
            libvirt,
            "0.1.0"
        ));
        assert!(!import_matches(
            "egress:libvirt/libvirt@0.2.0",
            libvirt,
            "0.1.0"
        ));
        assert!(!import_matches(
            "egress:libvirt/libvirt@1.1.0",
            libvirt,
            "0.1.0"
        ));
        assert!(!import_matches("egress:libvirt/libvirt", libvirt, "0.1.0"));
        assert!(!import_matches(
            "egress:libvirt/other@0.1.0",
            libvirt,
            "0.1.0"
        ));
        assert!(!import_matches(
            "egress:libvirt/libvirt@0.1.0-rc1",
            libvirt,
            "0.1.0"
        ));
        assert!(import_matches(
            "wasi:http/types@0.2.6",
            "wasi:http/types",
            "0.2.12"
        ));
        assert!(import_matches("acme:x/y@1.9.0", "acme:x/y", "1.0.0"));
        assert!(!import_matches("acme:x/y@0.0.2", "acme:x/y", "0.0.1"));
    }
}
