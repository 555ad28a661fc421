//! The libvirt capability: how a sandboxed provider drives KVM hypervisors without ever holding
//! a URI, an SSH key or an image's bytes.
//!
//! A provider imports `egress:libvirt/libvirt@0.1.0` (`wit/libvirt/libvirt.wit`). Everything in
//! it is a **resource the host owns**: the guest holds handles into its call's
//! [`ResourceTable`], and each handle carries what the host needs (the libvirt object, the
//! connection, the grant) without the guest seeing any of it.
//!
//! # What a provider may do
//!
//! Its grant ([`Grants`], YAML or JSON, see [`grant`]) names, per provider identity:
//!
//! - **connections** by name, each a libvirt URI the guest never sees, with the SSH key and
//!   known_hosts files the host hands libvirt on every dial (so rotating them needs no restart);
//! - on each connection, the **pools** it may use, and the **networks** and **bridges** its
//!   domains may join;
//! - the **HTTPS origins** base images may be imported from, with the CA trusted for them;
//! - the per-call and import **timeouts**, and the largest guest upload.
//!
//! `connection.open(name)` opens a granted connection from the host's pool (one connection per
//! URI, shared by every call of every provider; reopened when it dies or a call on it times
//! out); `connection.open-unpooled(name)` dials a fresh one for health checks. On a connection:
//! define, look up (by name or UUID) and list domains; start, destroy, undefine (with the
//! grant's flags: qemu's UEFI domains need `nvram`, which the test driver refuses, so a grant for
//! the test driver lists fewer flags; the host never retries without them), state and reason,
//! interface addresses (guest agent first, DHCP leases when the agent has none); storage pool
//! info, volume create, clone, look-up, delete and chunked upload; and image import.
//!
//! # What the host enforces
//!
//! - **The grant.** A connection, pool, network, bridge or image origin the grant does not name
//!   is `denied`.
//! - **The XML.** Domain XML is checked against an allow-list before libvirt sees it: disks are
//!   volumes of granted pools, interfaces join granted networks or bridges, metadata is in the
//!   provider's namespace, and nothing names a host path, device, emulator or qemu argument
//!   (which would hand the provider the hypervisor host). Volume XML gives a name, sizes and a
//!   format only. See the `policy` module for the rules.
//! - **Metadata namespaces.** Each provider reads and writes one metadata element, in the
//!   namespace `https://egress-operator.io/provider/<identity>` ([`METADATA_NAMESPACE_PREFIX`]),
//!   which the host derives from the provider's identity: a provider cannot see or forge
//!   another's ownership mark.
//! - **Images.** `import-image` downloads from a granted origin, trusting the grant's CA only
//!   (no system roots, proxy or redirects), streams the bytes into a new volume without holding
//!   them, and deletes the volume when the sha256 differs or anything fails.
//! - **Bounds.** Names are at most [`MAX_NAME_BYTES`], domain XML [`MAX_DOMAIN_XML_BYTES`],
//!   volume XML [`MAX_VOLUME_XML_BYTES`], metadata [`MAX_METADATA_BYTES`], an upload chunk
//!   [`MAX_CHUNK_BYTES`], an image URL [`MAX_URL_BYTES`]; no guest string may hold a NUL. The
//!   component model copies an argument into the host before these checks run, so that copy is
//!   bounded by the guest's own memory cap; the checks keep the host from holding or passing on
//!   more. Upload totals are capped by the grant's `maxUploadBytes`, imports by `maxBytes`; an
//!   import holds at most a few chunks in memory. The handles a guest holds are bounded by its
//!   `ResourceTable`'s capacity; the host keeps no cache keyed by guest input.
//! - **Time.** Every libvirt call runs on a blocking thread (`spawn_blocking`), never on the
//!   executor, and the guest gets `timeout` at the earlier of the grant's per-call timeout and
//!   the operation's deadline. libvirt calls cannot be cancelled: a timed-out call finishes in
//!   the background, and its pooled connection is evicted so the next call dials afresh.
//! - **Quiet.** [`LibvirtCapability::new`] clears libvirt's error callback, so libvirt prints
//!   nothing to stderr; failures go to `tracing` (never with key contents, which the host never
//!   reads: libvirt reads the key file itself).
//!
//! Errors reach the guest as the WIT `error` variant: `denied`, `invalid`, `timeout`,
//! `credentials-unavailable` (an SSH file the host cannot read: transient), `ssh-auth` and
//! `host-key` (permanent), `checksum-mismatch`, `download` (with the HTTP status and whether a
//! retry may help), and `libvirt { code, domain, message }`. The host never panics on guest
//! input.
//!
//! # Wiring it into a host
//!
//! As `wasmtime-wasi-http` does it:
//!
//! 1. Build one [`LibvirtCapability`] from the grants at start-up; it is cheap to clone and
//!    shared by every call.
//! 2. For each call, [`LibvirtCapability::prepare`] a [`LibvirtCallCtx`] from the provider's
//!    identity and the call's deadline, and keep it in the store's data beside the
//!    [`ResourceTable`] (a provider without a grant gets [`LibvirtCallCtx::ungranted`], on which
//!    every `open` is denied).
//! 3. Implement [`LibvirtView`] for the store's data, and add the interface to the linker with
//!    [`add_to_linker`]. The engine must have async support.
//!
//! ```no_run
//! use std::time::{Duration, Instant};
//! use egress_capability_libvirt::{
//!     LibvirtCallCtx, LibvirtCapability, LibvirtCtxView, LibvirtView, Grants,
//! };
//! use wasmtime::component::{Linker, ResourceTable};
//! use wasmtime::{Config, Engine};
//!
//! struct CallState {
//!     table: ResourceTable,
//!     libvirt: LibvirtCallCtx,
//! }
//!
//! impl LibvirtView for CallState {
//!     fn libvirt(&mut self) -> LibvirtCtxView<'_> {
//!         LibvirtCtxView { ctx: &mut self.libvirt, table: &mut self.table }
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let grants = Grants::from_yaml(r#"
//! grants:
//!   kvm2:
//!     connections:
//!       - name: hv1
//!         uri: qemu+libssh2://egress@hv1.lab/system
//!         sshKeyFile: /etc/egress/hv1/id_ed25519
//!         knownHostsFile: /etc/egress/hv1/known_hosts
//!         pools: [default]
//!         networks: [default]
//!     images:
//!       origins: ["https://images.lab"]
//!       caFile: /etc/egress/images-ca.pem
//! "#)?;
//! let capability = LibvirtCapability::new(&grants)?;
//!
//! let mut config = Config::new();
//! config.async_support(true);
//! let engine = Engine::new(&config)?;
//! let mut linker = Linker::<CallState>::new(&engine);
//! egress_capability_libvirt::add_to_linker(&mut linker)?;
//!
//! // For each call of the provider `kvm2`:
//! let deadline = Instant::now() + Duration::from_secs(600);
//! let state = CallState {
//!     table: ResourceTable::new(),
//!     libvirt: capability
//!         .prepare("kvm2", deadline)
//!         .unwrap_or_else(|| LibvirtCallCtx::ungranted(deadline)),
//! };
//! let store = wasmtime::Store::new(&engine, state);
//! // … instantiate the provider with `linker` and call it in `store`.
//! # let _ = store;
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod addresses;
pub mod bindings;
mod call;
mod capability;
mod conn;
mod error;
pub mod grant;
mod host_impl;
mod import;
mod policy;
mod resources;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Once};
use std::time::Instant;

use wasmtime::component::{HasData, Linker, ResourceTable};

pub use crate::call::{
    LibvirtCallCtx, MAX_CHUNK_BYTES, MAX_DOMAIN_XML_BYTES, MAX_METADATA_BYTES, MAX_NAME_BYTES,
    MAX_URL_BYTES, MAX_VOLUME_XML_BYTES,
};
use crate::conn::{ActiveConnection, ConnectionPool};
use crate::grant::Timeouts;
pub use crate::grant::{Grant, GrantError, Grants};
use crate::import::ImageAccess;
pub use crate::resources::{Connection, Domain, StoragePool, Volume, VolumeUpload};

/// The metadata namespace of a provider is this prefix followed by its identity.
pub const METADATA_NAMESPACE_PREFIX: &str = "https://egress-operator.io/provider/";

/// The XML prefix libvirt gives the provider's metadata element.
pub(crate) const METADATA_PREFIX: &str = "egress";

/// The libvirt capability: every provider's validated grant and the shared connection pool.
/// Cheap to clone; built once at start-up.
#[derive(Clone)]
pub struct LibvirtCapability {
    /// By provider identity; shared by every call of every provider.
    grants: Arc<HashMap<String, Arc<ActiveGrant>>>,
    shared: Arc<Shared>,
}

impl fmt::Debug for LibvirtCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut providers: Vec<&str> = self.grants.keys().map(String::as_str).collect();
        providers.sort_unstable();
        f.debug_struct("LibvirtCapability")
            .field("providers", &providers)
            .finish_non_exhaustive()
    }
}

/// What every call of every provider shares.
#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) pool: ConnectionPool,
    /// TEST ONLY: capability calls left before each later one traps ([`LibvirtCapability::cut_after`]).
    #[cfg(feature = "fault-injection")]
    pub(crate) cut: std::sync::Mutex<Option<usize>>,
}

impl Shared {
    /// Counts one capability call about to reach libvirt; a trap when a test cut falls here.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn count_call(&self) -> wasmtime::Result<()> {
        let mut cut = self
            .cut
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match cut.as_mut() {
            Some(0) => Err(wasmtime::format_err!(
                "fault injection: the host stopped here"
            )),
            Some(left) => {
                *left -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Counts one capability call about to reach libvirt (nothing to count outside tests).
    #[cfg(not(feature = "fault-injection"))]
    pub(crate) fn count_call(&self) -> wasmtime::Result<()> {
        Ok(())
    }
}

/// One provider's grant, validated: shared by every call of that provider.
#[derive(Debug)]
pub(crate) struct ActiveGrant {
    pub(crate) identity: String,
    /// `METADATA_NAMESPACE_PREFIX` + identity.
    pub(crate) namespace: String,
    /// By the name the guest opens them with.
    pub(crate) connections: HashMap<String, Arc<ActiveConnection>>,
    pub(crate) images: Option<ImageAccess>,
    pub(crate) timeouts: Timeouts,
    pub(crate) max_upload_bytes: u64,
    /// The component digest (lowercase hex) the grant is pinned to; `None`: any component.
    pub(crate) digest: Option<String>,
}

static QUIET: Once = Once::new();

impl LibvirtCapability {
    /// The capability serving `grants`. Validates every grant (names, URIs, SSH files against
    /// transports, image origins, timeouts); reads no file. Clears libvirt's error callback so
    /// libvirt prints nothing to stderr.
    pub fn new(grants: &Grants) -> Result<Self, GrantError> {
        QUIET.call_once(virt::error::clear_error_callback);
        let mut active = HashMap::new();
        for (identity, grant) in &grants.grants {
            active.insert(identity.clone(), Arc::new(activate(identity, grant)?));
        }
        Ok(Self {
            grants: Arc::new(active),
            shared: Arc::new(Shared::default()),
        })
    }

    /// The libvirt state of one call of the provider `identity`, stopping at `deadline`; `None`
    /// when that provider has no libvirt grant, or a grant pinned to a component digest (the
    /// bytes are not known here: see [`LibvirtCapability::prepare_for`]).
    pub fn prepare(&self, identity: &str, deadline: Instant) -> Option<LibvirtCallCtx> {
        self.prepare_for(identity, "", deadline)
    }

    /// The libvirt state of one call of the provider `identity`, whose component's sha256 is
    /// `digest` (lowercase hex), stopping at `deadline`; `None` when that provider has no libvirt
    /// grant, or its grant is pinned to other bytes.
    pub fn prepare_for(
        &self,
        identity: &str,
        digest: &str,
        deadline: Instant,
    ) -> Option<LibvirtCallCtx> {
        let grant = self.grants.get(identity)?;
        if grant.digest.as_ref().is_some_and(|pinned| pinned != digest) {
            return None;
        }
        Some(LibvirtCallCtx {
            grant: Some(grant.clone()),
            shared: self.shared.clone(),
            deadline,
        })
    }

    /// TEST ONLY (feature `fault-injection`): let `calls` more capability calls reach libvirt,
    /// then make every later one trap before it does, as if the host had died there; `None`
    /// lets every call through again. Calls that reach libvirt are those that open a connection,
    /// run a libvirt function or import an image; handle accessors and drops are not counted.
    #[cfg(feature = "fault-injection")]
    pub fn cut_after(&self, calls: Option<usize>) {
        *self
            .shared
            .cut
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = calls;
    }

    /// Whether the provider `identity` has a libvirt grant (pinned or not).
    pub fn has_grant(&self, identity: &str) -> bool {
        self.grants.contains_key(identity)
    }
}

impl LibvirtCallCtx {
    /// The state of a call of a provider without a libvirt grant (when
    /// [`LibvirtCapability::prepare`] answers `None`, or the host has no capability at all):
    /// every `open` is denied.
    pub fn ungranted(deadline: Instant) -> LibvirtCallCtx {
        LibvirtCallCtx {
            grant: None,
            shared: Arc::new(Shared::default()),
            deadline,
        }
    }
}

/// A provider identity is one URI path segment: lowercase letters, digits, `.`, `_`, `-`.
fn is_identity(identity: &str) -> bool {
    (1..=63).contains(&identity.len())
        && identity
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

fn activate(identity: &str, grant: &Grant) -> Result<ActiveGrant, GrantError> {
    let invalid = |field: &str, reason: &str| GrantError::Invalid {
        provider: identity.to_owned(),
        field: field.to_owned(),
        reason: reason.to_owned(),
    };
    if !is_identity(identity) {
        return Err(invalid(
            "identity",
            "must be 1 to 63 of a-z, 0-9, '.', '_', '-' (it names the metadata namespace)",
        ));
    }
    if grant.connections.is_empty() {
        return Err(invalid("connections", "is empty"));
    }
    let mut connections = HashMap::new();
    for connection in &grant.connections {
        let active = ActiveConnection::new(identity, connection)?;
        if connections
            .insert(active.name.clone(), Arc::new(active))
            .is_some()
        {
            return Err(invalid("connections", "two connections share a name"));
        }
    }
    if grant.timeouts.call_ms == 0 || grant.timeouts.import_ms == 0 {
        return Err(invalid("timeouts", "every timeout must be above zero"));
    }
    if grant.max_upload_bytes == 0 {
        return Err(invalid("maxUploadBytes", "must be above zero"));
    }
    let images = grant
        .images
        .as_ref()
        .map(|images| ImageAccess::new(identity, images))
        .transpose()?;
    let digest = grant
        .digest
        .as_ref()
        .map(|pin| {
            let hex = pin
                .strip_prefix("sha256:")
                .unwrap_or(pin)
                .to_ascii_lowercase();
            if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                Ok(hex)
            } else {
                Err(invalid("digest", "is not sha256:<64 hex digits>"))
            }
        })
        .transpose()?;
    Ok(ActiveGrant {
        identity: identity.to_owned(),
        namespace: format!("{METADATA_NAMESPACE_PREFIX}{identity}"),
        connections,
        images,
        timeouts: grant.timeouts,
        max_upload_bytes: grant.max_upload_bytes,
        digest,
    })
}

/// What the `Host*` traits are implemented on: the call's libvirt state and its resource table.
pub struct LibvirtCtxView<'a> {
    /// The call's libvirt state.
    pub ctx: &'a mut LibvirtCallCtx,
    /// The call's resource table, where the guest's handles live.
    pub table: &'a mut ResourceTable,
}

/// Gets the libvirt view out of a store's data.
pub trait LibvirtView: Send {
    /// The call's libvirt state and resource table.
    fn libvirt(&mut self) -> LibvirtCtxView<'_>;
}

/// The [`HasData`] marker [`add_to_linker`] uses.
struct Libvirt;

impl HasData for Libvirt {
    type Data<'a> = LibvirtCtxView<'a>;
}

/// Adds `egress:libvirt/libvirt@0.1.0` to `linker`. The engine must have async support.
pub fn add_to_linker<T: LibvirtView + Send + 'static>(
    linker: &mut Linker<T>,
) -> wasmtime::Result<()> {
    bindings::egress::libvirt::libvirt::add_to_linker::<T, Libvirt>(linker, T::libvirt)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(json: &str) -> Result<LibvirtCapability, GrantError> {
        LibvirtCapability::new(&Grants::from_json(json).unwrap())
    }

    #[test]
    fn grants_that_cannot_be_served_are_refused_naming_the_field() {
        for (json, field) in [
            (
                r#"{"grants":{"Bad Name":{"connections":[{"name":"c","uri":"test:///x"}]}}}"#,
                "identity",
            ),
            (r#"{"grants":{"p":{"connections":[]}}}"#, "connections"),
            (
                r#"{"grants":{"p":{"connections":[{"name":"c","uri":"test:///x"},{"name":"c","uri":"test:///y"}]}}}"#,
                "connections",
            ),
            (
                r#"{"grants":{"p":{"connections":[{"name":"c","uri":"test:///x"}],"timeouts":{"callMs":0}}}}"#,
                "timeouts",
            ),
            (
                r#"{"grants":{"p":{"connections":[{"name":"c","uri":"test:///x"}],"maxUploadBytes":0}}}"#,
                "maxUploadBytes",
            ),
            (
                r#"{"grants":{"p":{"connections":[{"name":"c","uri":"test:///x"}],"images":{"origins":["http://i"],"caFile":"/c"}}}}"#,
                "images.origins",
            ),
        ] {
            let error = grant(json).unwrap_err();
            assert!(error.to_string().contains(field), "{json}: {error}");
        }
    }

    #[test]
    fn a_grant_pinned_to_a_digest_is_prepared_for_those_bytes_only() {
        let pinned = "ab".repeat(32);
        let capability = grant(&format!(
            r#"{{"grants":{{"kvm2":{{"digest":"sha256:{}","connections":[{{"name":"c","uri":"test:///x"}}]}}}}}}"#,
            pinned.to_uppercase()
        ))
        .unwrap();
        let deadline = Instant::now();
        assert!(capability.prepare_for("kvm2", &pinned, deadline).is_some());
        assert!(
            capability
                .prepare_for("kvm2", &"cd".repeat(32), deadline)
                .is_none()
        );
        assert!(
            capability.prepare("kvm2", deadline).is_none(),
            "bytes unknown"
        );
        assert!(capability.has_grant("kvm2"));
        let error = grant(r#"{"grants":{"p":{"digest":"sha256:12","connections":[{"name":"c","uri":"test:///x"}]}}}"#)
            .unwrap_err();
        assert!(error.to_string().contains("digest"), "{error}");
    }

    #[test]
    fn prepare_answers_none_without_a_grant_and_names_the_namespace() {
        let capability =
            grant(r#"{"grants":{"kvm2":{"connections":[{"name":"c","uri":"test:///x"}]}}}"#)
                .unwrap();
        let deadline = Instant::now();
        assert!(capability.prepare("other", deadline).is_none());
        let ctx = capability.prepare("kvm2", deadline).unwrap();
        assert_eq!(
            ctx.grant.unwrap().namespace,
            "https://egress-operator.io/provider/kvm2"
        );
    }
}
