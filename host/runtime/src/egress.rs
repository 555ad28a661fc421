//! The egress seam: how a provider's `wasi:http/outgoing-handler` calls leave the sandbox.
//!
//! The runtime owns the `wasi:http` plumbing; an [`Egress`] decides what happens to each request.
//! The default, [`DenyAll`], refuses everything. The broker crate (`egress-capability-http`)
//! implements [`Egress`] with per-provider grants, credential injection and redaction.
//!
//! This trait wraps `wasmtime_wasi_http::WasiHttpHooks` so that the hook's shape, which has
//! changed across wasmtime releases, is adapted in one place (`state.rs`) and nowhere else.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::HeaderName;
pub use wasmtime_wasi_http::{Error as EgressError, RequestOptions, WasiBody as EgressBody};

/// A boxed future returned by [`Egress::send`].
pub type EgressFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<EgressBody>, EgressError>> + Send>>;

/// Who is sending: the provider, as the host identifies it, and the call it is making.
///
/// Both fields come from the host, never from the component: a component can describe itself
/// under any name, so grants must not follow that name.
#[derive(Clone, Debug)]
pub struct CallSite {
    /// The provider's host-assigned identity: the file it was loaded from (its stem) or the
    /// ProviderConfig that names it. Grants are keyed by it.
    pub provider: Arc<str>,
    /// The sha256 of the component's bytes, lowercase hex; a grant may be pinned to it. Empty
    /// for calls made before a component is accepted (the load-time `describe`).
    pub digest: Arc<str>,
    /// The operation being run (`create`, `get`, …).
    pub operation: &'static str,
}

/// The host side of outgoing HTTP for providers. Shared by every call of every provider.
pub trait Egress: Send + Sync + 'static {
    /// Whether a guest may not set header `name` itself. Checked when the guest builds its
    /// request, before [`Egress::send`]. The default adds credential-bearing headers to
    /// wasi:http's own forbidden list.
    fn is_forbidden_header(&self, name: &HeaderName) -> bool {
        default_forbidden_header(name)
    }

    /// Send one request for `site.provider`, or refuse it. Errors reach the guest as the
    /// matching `wasi:http/types.error-code`; their detail must not carry secrets. Called on the
    /// async executor: an implementation must not block it (no blocking file I/O).
    fn send(
        &self,
        site: &CallSite,
        request: http::Request<EgressBody>,
        options: Option<RequestOptions>,
    ) -> EgressFuture;
}

/// wasi:http's default forbidden headers plus `Authorization` and `Cookie`, which only the host
/// may set (it injects credentials itself).
pub fn default_forbidden_header(name: &HeaderName) -> bool {
    name == http::header::AUTHORIZATION
        || name == http::header::COOKIE
        || wasmtime_wasi_http::DEFAULT_FORBIDDEN_HEADERS.contains(name)
}

/// Refuses every request with `HTTP-request-denied`: the egress of a host with no broker.
#[derive(Clone, Copy, Debug, Default)]
pub struct DenyAll;

impl Egress for DenyAll {
    fn send(
        &self,
        site: &CallSite,
        request: http::Request<EgressBody>,
        _options: Option<RequestOptions>,
    ) -> EgressFuture {
        tracing::warn!(provider = %site.provider, uri = %request.uri(), "outgoing HTTP denied: no egress grant");
        Box::pin(async { Err(EgressError::HttpRequestDenied) })
    }
}
