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
//! Its grant ([`LibvirtGrant`], YAML or JSON, see [`grant`]), set per provider identity at run
//! time, names:
//!
//! - the **owner** of its ownership marks (the metadata namespace; not the identity, so a renamed
//!   ProviderConfig keeps its VMs);
//! - **connections** by name, each a libvirt URI the guest never sees, with the SSH key and
//!   known_hosts the host hands libvirt on every dial: files the grant names (the CLI), or files
//!   the host writes from Secrets in a private, memory-backed directory, removed with the grant
//!   (a rotated Secret is a new file and a new dial);
//! - on each connection, the **pools** it may use, and the **networks** and **bridges** its
//!   domains may join;
//! - the **HTTPS origins** base images may be imported from, with the CA trusted for them;
//! - the per-call and import **timeouts**, and the largest guest upload.
//!
//! `connection.open(name)` opens a granted connection from the host's pool (one connection per
//! URI, shared by every call of every provider; reopened when it dies or a call on it times
//! out); `connection.open-unpooled(name)` dials a fresh one for health checks, and
//! `connection.probe` checks several at once, each dialed afresh within its own timeout. On a
//! connection:
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
//!   format, and for copy-on-write a backing store named as a granted pool's volume, whose path
//!   the host looks up itself. See the `policy` module for the rules.
//! - **Metadata namespaces.** Each provider reads and writes one metadata element, in the
//!   namespace `https://egress-operator.io/owner/<owner>` ([`METADATA_NAMESPACE_PREFIX`]), which
//!   the host derives from its grant's `owner`: a provider cannot see or forge the marks of
//!   another owner.
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
//! 1. Build one [`LibvirtCapability`] at start-up; it is cheap to clone and shared by every call.
//!    Grant identities with [`Capability::set_grant`](egress_runtime::Capability::set_grant)
//!    whenever their grants change.
//! 2. For each call, [`LibvirtCapability::prepare_for`] a [`LibvirtCallCtx`] from the provider's
//!    identity, its component's digest and the call's deadline, and keep it in the store's data
//!    beside the [`ResourceTable`] (a provider without a grant gets
//!    [`LibvirtCallCtx::ungranted`], on which every `open` is denied).
//! 3. Implement [`LibvirtView`] for the store's data, and add the interface to the linker with
//!    [`add_to_linker`]. The engine must have async support.
//!
//! `egress-runtime` does steps 2 and 3 itself: give it the capability with
//! `RuntimeConfig::capability`.
//!
//! ```no_run
//! use std::time::{Duration, Instant};
//! use egress_capability_libvirt::{
//!     LibvirtCallCtx, LibvirtCapability, LibvirtCtxView, LibvirtGrant, LibvirtView,
//! };
//! use egress_runtime::Capability;
//! use egress_runtime::grant::{FilesOnly, GrantContext};
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
//! let grant: LibvirtGrant = serde_json::from_str(r#"{
//!   "connections": [{
//!     "name": "hv1",
//!     "uri": "qemu+libssh2://egress@hv1.lab/system",
//!     "sshKeyFile": "/etc/egress/hv1/id_ed25519",
//!     "knownHostsFile": "/etc/egress/hv1/known_hosts",
//!     "pools": ["default"],
//!     "networks": ["default"]
//!   }],
//!   "images": {"origins": ["https://images.lab"], "caFile": "/etc/egress/images-ca.pem"}
//! }"#)?;
//! let capability = LibvirtCapability::new();
//! capability.set_grant("kvm2", &grant, &GrantContext { digests: &[], host: &FilesOnly })?;
//!
//! let mut config = Config::new();
//! config.async_support(true);
//! let engine = Engine::new(&config)?;
//! let mut linker = Linker::<CallState>::new(&engine);
//! egress_capability_libvirt::add_to_linker(&mut linker)?;
//!
//! // For each call of the provider `kvm2` whose component's sha256 is `digest`:
//! let (deadline, digest) = (Instant::now() + Duration::from_secs(600), "");
//! let state = CallState {
//!     table: ResourceTable::new(),
//!     libvirt: capability
//!         .prepare_for("kvm2", digest, deadline)
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
mod keys;
mod leaves;
mod policy;
mod resources;
mod retention;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::Instant;

use arc_swap::ArcSwap;
use egress_runtime::grant::{GrantContext, GrantError};
use wasmtime::component::{HasData, Linker, ResourceTable};

pub use crate::call::{
    LibvirtCallCtx, MAX_CHUNK_BYTES, MAX_DOMAIN_XML_BYTES, MAX_METADATA_BYTES, MAX_NAME_BYTES,
    MAX_URL_BYTES, MAX_VOLUME_XML_BYTES,
};
use crate::conn::{ActiveConnection, ConnectionPool};
pub use crate::grant::LibvirtGrant;
use crate::grant::Timeouts;
use crate::import::{ImageAccess, Imports};
use crate::keys::KeyDir;
pub use crate::resources::{Connection, Domain, StoragePool, Volume, VolumeUpload};

/// The metadata namespace of a grant's marks is this prefix followed by its `owner`.
pub const METADATA_NAMESPACE_PREFIX: &str = "https://egress-operator.io/owner/";

/// The XML prefix libvirt gives the provider's metadata element.
pub(crate) const METADATA_PREFIX: &str = "egress";

/// The libvirt capability: every provider identity's grant, set and removed at run time, and the
/// connection pool they share. Cheap to clone; built once at start-up.
#[derive(Clone)]
pub struct LibvirtCapability {
    /// By provider identity; replaced whole when a grant changes (a call in flight keeps the
    /// grant it was prepared with).
    grants: Arc<ArcSwap<HashMap<String, Arc<ActiveGrant>>>>,
    /// Serialises grant changes (readers never wait).
    changes: Arc<Mutex<()>>,
    shared: Arc<Shared>,
}

impl fmt::Debug for LibvirtCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LibvirtCapability")
            .field("providers", &self.identities())
            .finish_non_exhaustive()
    }
}

impl Default for LibvirtCapability {
    fn default() -> Self {
        Self::new()
    }
}

/// What every call of every provider shares.
#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) pool: ConnectionPool,
    /// Image imports running, which outlive the calls that start them.
    pub(crate) imports: Arc<Imports>,
    /// When images were last used, and the locks that keep a prune from removing a base a disk
    /// is being made on.
    pub(crate) retention: Arc<retention::Retention>,
    /// Where SSH material from Secrets is written, once a grant needs it (see `keys`).
    key_dir: OnceLock<Result<Arc<KeyDir>, String>>,
    /// The base directory for it, if the host chose one.
    key_base: Option<PathBuf>,
    /// TEST ONLY: capability calls left before each later one traps ([`LibvirtCapability::cut_after`]).
    #[cfg(feature = "fault-injection")]
    pub(crate) cut: std::sync::Mutex<Option<usize>>,
    /// TEST ONLY: whether a call trapped at the cut ([`LibvirtCapability::cut_fired`]).
    #[cfg(feature = "fault-injection")]
    pub(crate) fired: std::sync::atomic::AtomicBool,
    /// TEST ONLY: calls left before a hook runs, and the hook ([`LibvirtCapability::before_call`]).
    #[cfg(feature = "fault-injection")]
    pub(crate) hook: std::sync::Mutex<Option<(usize, TestHook)>>,
    /// TEST ONLY: capability calls that reached libvirt ([`LibvirtCapability::calls`]).
    #[cfg(feature = "fault-injection")]
    pub(crate) counted: std::sync::atomic::AtomicUsize,
}

/// TEST ONLY: what [`LibvirtCapability::before_call`] runs.
#[cfg(feature = "fault-injection")]
pub type TestHook = Box<dyn FnOnce() + Send>;

impl Shared {
    /// The key directory, made on first use.
    pub(crate) fn key_dir(&self) -> Result<&Arc<KeyDir>, String> {
        self.key_dir
            .get_or_init(|| KeyDir::create(self.key_base.as_deref()).map(Arc::new))
            .as_ref()
            .map_err(String::clone)
    }

    /// Counts one capability call about to reach libvirt; a trap when a test cut falls here.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn count_call(&self) -> wasmtime::Result<()> {
        self.counted
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let due = {
            let mut hook = self
                .hook
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match hook.as_mut() {
                Some((0, _)) => hook.take().map(|(_, run)| run),
                Some((left, _)) => {
                    *left -= 1;
                    None
                }
                None => None,
            }
        };
        if let Some(run) = due {
            run();
        }
        let mut cut = self
            .cut
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match cut.as_mut() {
            Some(0) => {
                // A host that dies takes its import jobs with it.
                self.imports.abort_all();
                self.fired.store(true, std::sync::atomic::Ordering::SeqCst);
                Err(wasmtime::format_err!(
                    "fault injection: the host stopped here"
                ))
            }
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
    /// `METADATA_NAMESPACE_PREFIX` + owner.
    pub(crate) namespace: String,
    /// By the name the guest opens them with.
    pub(crate) connections: HashMap<String, Arc<ActiveConnection>>,
    pub(crate) images: Option<ImageAccess>,
    pub(crate) timeouts: Timeouts,
    pub(crate) max_upload_bytes: u64,
    /// The component digests (lowercase hex) the grant is pinned to; empty: any component.
    pub(crate) digests: Vec<String>,
}

static QUIET: Once = Once::new();

impl LibvirtCapability {
    /// A capability with no grants yet. SSH keys from Secrets go to a directory under
    /// `$XDG_RUNTIME_DIR` or `/dev/shm` (see [`LibvirtCapability::with_key_base`]). Clears
    /// libvirt's error callback so libvirt prints nothing to stderr.
    pub fn new() -> Self {
        Self::build(None)
    }

    /// A capability with no grants yet whose SSH keys from Secrets go under `base`; `Err` when
    /// `base` is not a directory on a memory-backed filesystem (tmpfs or ramfs).
    pub fn with_key_base(base: PathBuf) -> Result<Self, String> {
        keys::check_base(&base)?;
        Ok(Self::build(Some(base)))
    }

    fn build(key_base: Option<PathBuf>) -> Self {
        QUIET.call_once(virt::error::clear_error_callback);
        Self {
            grants: Arc::new(ArcSwap::from_pointee(HashMap::new())),
            changes: Arc::new(Mutex::new(())),
            shared: Arc::new(Shared {
                key_base,
                ..Shared::default()
            }),
        }
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
        let grant = self.grants.load().get(identity)?.clone();
        if !grant.digests.is_empty() && !grant.digests.iter().any(|pinned| pinned == digest) {
            return None;
        }
        Some(LibvirtCallCtx {
            grant: Some(grant),
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
        self.shared
            .fired
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// TEST ONLY (feature `fault-injection`): whether a call trapped at the cut since
    /// [`LibvirtCapability::cut_after`] armed it.
    #[cfg(feature = "fault-injection")]
    pub fn cut_fired(&self) -> bool {
        self.shared.fired.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// TEST ONLY (feature `fault-injection`): with `Some((calls, hook))`, run `hook` once, just
    /// before the call after the next `calls` ones reaches libvirt (the calls
    /// [`LibvirtCapability::cut_after`] counts), as if someone acted on the hypervisor right
    /// then; it runs on the calling thread. `None` disarms a hook that has not run.
    #[cfg(feature = "fault-injection")]
    pub fn before_call(&self, hook: Option<(usize, TestHook)>) {
        *self
            .shared
            .hook
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = hook;
    }

    /// TEST ONLY (feature `fault-injection`): how many capability calls have reached libvirt
    /// since this capability was made (the calls [`LibvirtCapability::cut_after`] counts).
    #[cfg(feature = "fault-injection")]
    pub fn calls(&self) -> usize {
        self.shared
            .counted
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The identities that have a libvirt grant, sorted.
    pub fn identities(&self) -> Vec<String> {
        let mut identities: Vec<String> = self.grants.load().keys().cloned().collect();
        identities.sort_unstable();
        identities
    }

    /// Whether the provider `identity` has a libvirt grant (pinned or not).
    pub fn has_grant(&self, identity: &str) -> bool {
        self.grants.load().contains_key(identity)
    }

    /// Validates and resolves `identity`'s grant, then swaps it in.
    pub(crate) fn set(
        &self,
        identity: &str,
        grant: &LibvirtGrant,
        context: &GrantContext<'_>,
    ) -> Result<(), GrantError> {
        let previous = self.grants.load().get(identity).cloned();
        let active = Arc::new(activate(
            identity,
            grant,
            context,
            &self.shared,
            previous.as_deref(),
        )?);
        self.change(|grants| {
            grants.insert(identity.to_owned(), active);
        });
        Ok(())
    }

    /// Removes `identity`'s grant, and stops the imports it started.
    pub(crate) fn remove(&self, identity: &str) {
        self.change(|grants| {
            grants.remove(identity);
        });
        self.shared.imports.abort_of(identity);
    }

    fn change(&self, edit: impl FnOnce(&mut HashMap<String, Arc<ActiveGrant>>)) {
        let _serialised = self
            .changes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut grants = HashMap::clone(&self.grants.load());
        edit(&mut grants);
        // Pooled connections dialed for a grant that is gone (or a key that rotated) leave the
        // pool; calls in flight keep theirs.
        let dialed: HashSet<String> = grants
            .values()
            .flat_map(|grant| grant.connections.values())
            .map(|connection| connection.dial_uri())
            .collect();
        self.grants.store(Arc::new(grants));
        self.shared.pool.retain(&dialed);
    }
}

impl LibvirtCallCtx {
    /// The state of a call of a provider without a libvirt grant (when
    /// [`LibvirtCapability::prepare_for`] answers `None`, or the host has no capability at all):
    /// every `open` is denied.
    pub fn ungranted(deadline: Instant) -> LibvirtCallCtx {
        LibvirtCallCtx {
            grant: None,
            shared: Arc::new(Shared::default()),
            deadline,
        }
    }
}

/// An owner is one URI path segment: lowercase letters, digits, `.`, `_`, `-`.
fn is_owner(owner: &str) -> bool {
    (1..=63).contains(&owner.len())
        && owner
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// Validates `identity`'s grant and resolves what it names; `previous` is the grant it replaces.
fn activate(
    identity: &str,
    grant: &LibvirtGrant,
    context: &GrantContext<'_>,
    shared: &Shared,
    previous: Option<&ActiveGrant>,
) -> Result<ActiveGrant, GrantError> {
    let invalid = GrantError::about("libvirt", identity);
    if !is_owner(&grant.owner) {
        return Err(invalid(
            "owner",
            "must be 1 to 63 of a-z, 0-9, '.', '_', '-' (it names the metadata namespace)".into(),
        ));
    }
    if grant.connections.is_empty() {
        return Err(invalid("connections", "is empty".into()));
    }
    let mut connections = HashMap::new();
    for connection in &grant.connections {
        let kept = previous.and_then(|previous| previous.connections.get(&connection.name));
        let active =
            ActiveConnection::new(identity, connection, context, shared, kept.map(|c| &**c))?;
        if connections
            .insert(active.name.clone(), Arc::new(active))
            .is_some()
        {
            return Err(invalid(
                "connections",
                "two connections share a name".into(),
            ));
        }
    }
    if grant.timeouts.call_ms == 0 || grant.timeouts.import_ms == 0 {
        return Err(invalid(
            "timeouts",
            "every timeout must be above zero".into(),
        ));
    }
    if grant.max_upload_bytes == 0 {
        return Err(invalid("maxUploadBytes", "must be above zero".into()));
    }
    let images = grant
        .images
        .as_ref()
        .map(|images| ImageAccess::new(identity, images, context))
        .transpose()?;
    let digests = context.pinned_digests(&invalid)?;
    Ok(ActiveGrant {
        identity: identity.to_owned(),
        namespace: format!("{METADATA_NAMESPACE_PREFIX}{}", grant.owner),
        connections,
        images,
        timeouts: grant.timeouts,
        max_upload_bytes: grant.max_upload_bytes,
        digests,
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
    use egress_runtime::grant::FilesOnly;

    fn grant(
        identity: &str,
        json: &str,
        digests: &[String],
    ) -> Result<LibvirtCapability, GrantError> {
        let capability = LibvirtCapability::new();
        let grant: LibvirtGrant = serde_json::from_str(json).unwrap();
        capability.set(
            identity,
            &grant,
            &GrantContext {
                digests,
                host: &FilesOnly,
            },
        )?;
        Ok(capability)
    }

    #[test]
    fn grants_that_cannot_be_served_are_refused_naming_the_field() {
        for (json, field) in [
            (
                r#"{"owner":"Bad Name","connections":[{"name":"c","uri":"test:///x"}]}"#,
                "owner",
            ),
            (r#"{"connections":[]}"#, "connections"),
            (
                r#"{"connections":[{"name":"c","uri":"test:///x"},{"name":"c","uri":"test:///y"}]}"#,
                "connections",
            ),
            (
                r#"{"connections":[{"name":"c","uri":"test:///x"}],"timeouts":{"callMs":0}}"#,
                "timeouts",
            ),
            (
                r#"{"connections":[{"name":"c","uri":"test:///x"}],"maxUploadBytes":0}"#,
                "maxUploadBytes",
            ),
            (
                r#"{"connections":[{"name":"c","uri":"test:///x"}],"images":{"origins":["http://i"],"caFile":"/c"}}"#,
                "images.origins",
            ),
        ] {
            let error = grant("p", json, &[]).unwrap_err();
            assert!(error.to_string().contains(field), "{json}: {error}");
        }
    }

    #[test]
    fn a_grant_pinned_to_a_digest_is_prepared_for_those_bytes_only() {
        let pinned = "ab".repeat(32);
        let capability = grant(
            "kvm2",
            r#"{"connections":[{"name":"c","uri":"test:///x"}]}"#,
            &[format!("sha256:{}", pinned.to_uppercase())],
        )
        .unwrap();
        let deadline = Instant::now();
        assert!(capability.prepare_for("kvm2", &pinned, deadline).is_some());
        assert!(
            capability
                .prepare_for("kvm2", &"cd".repeat(32), deadline)
                .is_none()
        );
        assert!(capability.has_grant("kvm2"));
        let error = grant(
            "p",
            r#"{"connections":[{"name":"c","uri":"test:///x"}]}"#,
            &["sha256:12".into()],
        )
        .unwrap_err();
        assert!(error.to_string().contains("digest"), "{error}");
    }

    /// The namespace follows the grant's owner, never the identity: a ProviderConfig renamed or
    /// recreated under another name keeps reading its marks.
    #[test]
    fn the_namespace_is_the_owners_whatever_the_identity() {
        let capability = grant(
            "kvm-lab",
            r#"{"connections":[{"name":"c","uri":"test:///x"}]}"#,
            &[],
        )
        .unwrap();
        let deadline = Instant::now();
        assert!(capability.prepare_for("other", "", deadline).is_none());
        let ctx = capability.prepare_for("kvm-lab", "", deadline).unwrap();
        assert_eq!(
            ctx.grant.unwrap().namespace,
            "https://egress-operator.io/owner/egress-operator"
        );
        let owned = grant(
            "renamed",
            r#"{"owner":"lab","connections":[{"name":"c","uri":"test:///x"}]}"#,
            &[],
        )
        .unwrap();
        let ctx = owned.prepare_for("renamed", "", deadline).unwrap();
        assert_eq!(
            ctx.grant.unwrap().namespace,
            "https://egress-operator.io/owner/lab"
        );
    }

    #[test]
    fn a_grant_set_again_or_removed_leaves_calls_in_flight_theirs() {
        let capability = grant(
            "p",
            r#"{"connections":[{"name":"c","uri":"test:///x"}]}"#,
            &[],
        )
        .unwrap();
        let deadline = Instant::now();
        let in_flight = capability.prepare_for("p", "", deadline).unwrap();
        let other: LibvirtGrant = serde_json::from_str(
            r#"{"owner":"lab","connections":[{"name":"d","uri":"test:///y"}]}"#,
        )
        .unwrap();
        capability
            .set(
                "p",
                &other,
                &GrantContext {
                    digests: &[],
                    host: &FilesOnly,
                },
            )
            .unwrap();
        let next = capability.prepare_for("p", "", deadline).unwrap();
        assert!(
            in_flight
                .grant
                .as_ref()
                .unwrap()
                .connections
                .contains_key("c")
        );
        assert!(next.grant.as_ref().unwrap().connections.contains_key("d"));
        capability.remove("p");
        assert!(capability.prepare_for("p", "", deadline).is_none());
        assert!(
            in_flight.grant.is_some(),
            "a call in flight keeps its grant"
        );
    }
}
