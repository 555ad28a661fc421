//! The egress broker: how providers reach their hypervisor without ever holding its credentials.
//!
//! A provider (a WebAssembly component) sends HTTP through `wasi:http/outgoing-handler`. The
//! runtime hands every such request to an [`Egress`]; [`Broker`] is the one that lets requests
//! out: each provider identity to the origins its [`HttpGrant`] names, with a credential the host
//! injects and the provider never sees.
//!
//! # The pipeline
//!
//! Every request goes through five steps, in the order of Spin's `RequestSender`; the first that
//! fails ends it.
//!
//! 1. **authorize**, policy only (no file, no socket): the grant of the provider's
//!    **host-assigned identity** (the file the host loaded, or the ProviderConfig naming it,
//!    never the name a component gives itself); none, or one pinned to a component digest other
//!    than this component's, denies. Then the method (`TRACE`, `TRACK` and `CONNECT` reflect or
//!    tunnel), the URL's origin (scheme, host, port, parsed once) against the grant's (default
//!    deny), and the guest's headers: a `Host` naming another authority or a credential header
//!    is denied (guests cannot even set those, [`Egress::is_forbidden_header`]; this is the
//!    second check). On a credentialed request `Range`/`If-Range` are denied and
//!    `Accept-Encoding` becomes `identity`, so a server that reflects the credential reflects it
//!    where redaction sees it;
//! 2. **inject**: the secret (a [`CredentialSource`]: held in memory from the Secret the grant
//!    names, or read again, off the executor, once its file changed, so a rotated secret is used
//!    from the next request) as the grant's header;
//! 3. **connect**: the grant's pooled client for the origin: the grant's CA only, an optional
//!    `serverName` to verify, HTTP/1.1 only if asked, built on [`locked_down_client`] (no proxy,
//!    no redirects), within the connect timeout;
//! 4. **exchange**: the request, within the first-byte timeout and the total deadline;
//! 5. **admit**: on a credentialed request, a response in a content or transfer coding the
//!    broker did not ask for, or a partial one, is refused, and every reversible form of the
//!    secret is replaced by `[redacted]`; the body is capped and bounded by the deadline. The
//!    request is counted ([`Metrics`]) and logged in one `debug!` line: method, origin, path,
//!    status, duration.
//!
//! Failures reach the guest as `wasi:http/types.error-code`s (a contract 0.2.0 guest also reads
//! a [`Refusal`]), never with host detail; the host logs the detail, without secrets. See
//! `docs/egress.md` for the table.
//!
//! # The seam
//!
//! The broker is a [`Capability`]: the runtime links `wasi:http` and `egress:http-broker` over
//! it, and the host sets each identity's [`HttpGrant`] with
//! [`set_grant`](Capability::set_grant), which validates the document and resolves what it names
//! through the [`GrantContext`] once, when it is set. A host that keeps secrets somewhere of its
//! own gives a [`CredentialSource`] instead ([`Broker::set_grant_with_credential`]).
//!
//! # Example
//!
//! The broker is the runtime's HTTP capability: give it to the runtime, keep a handle, and set
//! each identity's [`HttpGrant`] on it.
//!
//! ```no_run
//! use std::sync::Arc;
//! use egress_capability_http::{Broker, HttpGrant};
//! use egress_runtime::grant::{FilesOnly, GrantContext};
//! use egress_runtime::{Capability, Runtime, RuntimeConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let grant: HttpGrant = serde_norway::from_str(r#"
//! origins: ["https://192.168.2.8:8006"]
//! credential:
//!   header: Authorization
//!   format: "PVEAPIToken={secret}"
//!   secretFile: /etc/egress/proxmox-token
//! tls:
//!   caFile: /etc/egress/proxmox-ca.pem
//!   serverName: pv1-1.home.lab
//!   http1Only: true
//! "#)?;
//! let broker = Arc::new(Broker::new());
//! broker.set_grant("proxmox", &grant, &GrantContext { digests: &[], host: &FilesOnly })?;
//! let mut registry = prometheus_client::registry::Registry::default();
//! broker.metrics().register(&mut registry);
//! // The runtime sends every provider request through it.
//! let runtime = Runtime::new(RuntimeConfig::default().capability(broker))?;
//! # let _ = runtime;
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod body;
mod client;
mod credentials;
mod grant;
mod metrics;
mod pipeline;
mod policy;
mod redact;
mod watch;

use std::sync::Arc;

use arc_swap::ArcSwap;
use egress_runtime::egress::{
    CallSite, Egress, EgressBody, EgressFuture, RequestOptions, default_forbidden_header,
};
use egress_runtime::grant::{GrantContext, GrantError};
use egress_runtime::{Capability, HostState, PrepareContext};
use http::HeaderName;
use wasmtime::component::Linker;

pub use crate::client::locked_down_client;
pub use crate::credentials::{CredentialError, CredentialSource, Secret, SecretFuture};
pub use crate::grant::{Credential, HttpGrant, Timeouts, Tls};
pub use crate::metrics::Metrics;
pub use crate::pipeline::{CA_UNAVAILABLE, CREDENTIALS_UNAVAILABLE};
pub use crate::redact::{Redactor, StreamRedactor};
#[cfg(doc)]
use egress_runtime::Refusal;

use crate::grant::{Grants, activate};
use crate::policy::CREDENTIAL_HEADERS;
use egress_runtime::lock;

/// The egress broker: an [`Egress`] that lets each provider reach its granted origins only, with
/// credentials the host injects and the provider never sees.
#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

/// What every clone of a [`Broker`] shares.
struct Inner {
    /// By provider identity; shared by every call of every provider, replaced whole when a grant
    /// changes (a request in flight keeps the grant it started with).
    grants: ArcSwap<Grants>,
    /// Headers injected by some grant: no guest may set them.
    injected_headers: ArcSwap<Vec<HeaderName>>,
    /// Serialises grant changes (readers never wait).
    changes: std::sync::Mutex<()>,
    metrics: Metrics,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("providers", &self.identities())
            .finish_non_exhaustive()
    }
}

impl Broker {
    /// A broker with no grants: every request is denied until
    /// [`set_grant`](Capability::set_grant) grants an identity.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                grants: ArcSwap::from_pointee(Grants::new()),
                injected_headers: ArcSwap::from_pointee(Vec::new()),
                changes: std::sync::Mutex::new(()),
                metrics: Metrics::default(),
            }),
        }
    }

    /// [`set_grant`](Capability::set_grant), with the credential read from `source` instead of
    /// what the grant's `credential` names (its header and format still apply): for a host that
    /// keeps secrets somewhere of its own.
    pub fn set_grant_with_credential(
        &self,
        identity: &str,
        grant: &HttpGrant,
        context: &GrantContext<'_>,
        source: Arc<dyn CredentialSource>,
    ) -> Result<(), GrantError> {
        let active = Arc::new(activate(identity, grant, context, Some(source))?);
        self.change(|grants| {
            grants.insert(identity.to_owned(), active);
        });
        Ok(())
    }

    /// The identities that have a grant, sorted.
    pub fn identities(&self) -> Vec<String> {
        let mut identities: Vec<String> = self.inner.grants.load().keys().cloned().collect();
        identities.sort_unstable();
        identities
    }

    fn change(&self, edit: impl FnOnce(&mut Grants)) {
        let _serialised = lock(&self.inner.changes);
        let mut grants = Grants::clone(&self.inner.grants.load());
        edit(&mut grants);
        // Headers first: a guest may never set a header some grant injects.
        self.inner
            .injected_headers
            .store(Arc::new(injected_headers(&grants)));
        self.inner.grants.store(Arc::new(grants));
    }

    /// The broker's metrics, to register with the process's registry.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }
}

impl Default for Broker {
    fn default() -> Self {
        Self::new()
    }
}

/// The broker is the HTTP capability: `wasi:http` and `egress:http-broker` over its own
/// [`Egress`], granted per identity with [`HttpGrant`]s.
impl Capability for Broker {
    type Grant = HttpGrant;

    fn name(&self) -> &'static str {
        "http"
    }

    fn provides(&self, import: &str) -> bool {
        egress_runtime::http::provides(import)
    }

    fn link(&self, linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
        egress_runtime::http::link(linker)
    }

    fn set_grant(
        &self,
        identity: &str,
        grant: &HttpGrant,
        context: &GrantContext<'_>,
    ) -> Result<(), GrantError> {
        let active = Arc::new(activate(identity, grant, context, None)?);
        self.change(|grants| {
            grants.insert(identity.to_owned(), active);
        });
        Ok(())
    }

    fn remove_grant(&self, identity: &str) {
        self.change(|grants| {
            grants.remove(identity);
        });
    }

    fn granted(&self, identity: &str) -> bool {
        Egress::granted(self, identity)
    }

    fn prepare(&self, call: &PrepareContext<'_>) -> Box<dyn std::any::Any + Send> {
        egress_runtime::http::prepare(Arc::new(self.clone()), call)
    }
}

/// Every header some grant injects.
fn injected_headers(grants: &Grants) -> Vec<HeaderName> {
    let mut headers: Vec<HeaderName> = grants
        .values()
        .filter_map(|grant| {
            grant
                .injection
                .as_ref()
                .map(|injection| injection.header.clone())
        })
        .collect();
    headers.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    headers.dedup();
    headers
}

impl Egress for Broker {
    fn granted(&self, identity: &str) -> bool {
        self.inner.grants.load().contains_key(identity)
    }

    fn is_forbidden_header(&self, name: &HeaderName) -> bool {
        default_forbidden_header(name)
            || CREDENTIAL_HEADERS.contains(name)
            || self.inner.injected_headers.load().contains(name)
    }

    fn send(
        &self,
        site: &CallSite,
        request: http::Request<EgressBody>,
        options: Option<RequestOptions>,
    ) -> EgressFuture {
        let inner = self.inner.clone();
        let site = site.clone();
        Box::pin(async move {
            pipeline::send(&inner.grants, &inner.metrics, &site, request, options).await
        })
    }
}
