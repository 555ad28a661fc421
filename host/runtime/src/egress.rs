//! The egress seam: how a provider's `wasi:http/outgoing-handler` calls leave the sandbox.
//!
//! The runtime owns the `wasi:http` plumbing; an [`Egress`] decides what happens to each request.
//! The default, [`DenyAll`], refuses everything. The broker crate (`egress-capability-http`)
//! implements [`Egress`] with per-provider grants, credential injection and redaction.
//!
//! This trait wraps `wasmtime_wasi_http::WasiHttpHooks` so that the hook's shape, which has
//! changed across wasmtime releases, is adapted in one place (`http.rs`) and nowhere else.
//!
//! # Telling the guest why
//!
//! A refused request reaches the guest as a `wasi:http` `error-code`, which cannot say *why*
//! (`internal-error` carries only a free-form string). An egress that wants the guest to know
//! takes the [`RefusalReporter`] the runtime puts in every request's extensions and reports a
//! [`Refusal`]; a 0.2.0 guest reads it from `egress:http-broker/broker.last-refusal`:
//!
//! ```
//! # use egress_runtime::egress::{CallSite, Egress, EgressBody, EgressError, EgressFuture, Refusal, RefusalReporter, RequestOptions};
//! struct NoCredentials;
//!
//! impl Egress for NoCredentials {
//!     fn send(&self, _site: &CallSite, mut request: http::Request<EgressBody>, _options: Option<RequestOptions>) -> EgressFuture {
//!         if let Some(reporter) = RefusalReporter::take(request.extensions_mut()) {
//!             reporter.report(Refusal::CredentialsUnavailable);
//!         }
//!         Box::pin(async { Err(EgressError::InternalError(Some("credentials-unavailable".into()))) })
//!     }
//! }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use http::HeaderName;

use crate::sync::lock;
pub use wasmtime_wasi::HostWallClock;
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
///
/// The runtime's HTTP capability (`wasi:http` and `egress:http-broker`) is built over one
/// `Egress`: see [`Runtime::new`](crate::Runtime::new).
pub trait Egress: Send + Sync + 'static {
    /// Whether the provider `identity` has a grant here. Informational (load-time notes,
    /// [`Capability::granted`](crate::Capability::granted)): every request is decided by
    /// [`Egress::send`]. The default, for an egress that keeps no grants, is `true`.
    fn granted(&self, identity: &str) -> bool {
        let _ = identity;
        true
    }

    /// Whether a guest may not set header `name` itself. Checked when the guest builds its
    /// request, before [`Egress::send`]. The default adds credential-bearing headers to
    /// wasi:http's own forbidden list.
    fn is_forbidden_header(&self, name: &HeaderName) -> bool {
        default_forbidden_header(name)
    }

    /// Send one request for `site.provider`, or refuse it. Errors reach the guest as the
    /// matching `wasi:http/types.error-code`; their detail must not carry secrets. Called on the
    /// async executor: an implementation must not block it (no blocking file I/O). The request's
    /// extensions hold a [`RefusalReporter`] (when the runtime sent it) to tell the guest why a
    /// request was refused; nothing else of the extensions is meant to leave the host.
    ///
    /// The returned future is polled only while the guest asks about its response: a guest that
    /// waits on another of its requests leaves it unpolled (not dropped) meanwhile. It must not
    /// hold, while pending, anything another request waits for (a lock shared by the grant's
    /// requests, say): shared work goes on a task of its own, as the HTTP broker's CA load does.
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

/// Stands between one call's requests and the [`Egress`]: records them, answers them from a
/// recording, or injects a fault, for that call only (set in its
/// [`CallContext`](crate::CallContext)). Requests reach a tap after the runtime's budgets and
/// before the egress's policy; what it returns reaches the guest as the egress's answer would.
pub trait Tap: Send + Sync + std::fmt::Debug + 'static {
    /// Answer `outgoing`, or hand it on to `next` ([`Outgoing::send_to`]).
    fn send(&self, outgoing: Outgoing<'_>, next: &Arc<dyn Egress>) -> EgressFuture;

    /// The wall clock the call's guest reads (`wasi:clocks/wall-clock`) when the tap keeps or
    /// replays it (a provider writes the time into what it sends); `None`: the host's.
    fn wall_clock(&self) -> Option<Box<dyn HostWallClock>> {
        None
    }
}

/// One request of a call on its way to the [`Egress`], as a [`Tap`] sees it.
pub struct Outgoing<'a> {
    /// The call that sends it.
    pub site: &'a CallSite,
    /// The request as the guest wrote it (no credential yet).
    pub request: http::Request<EgressBody>,
    /// The guest's timeouts, if it set any.
    pub options: Option<RequestOptions>,
}

impl Outgoing<'_> {
    /// Hand the request on to `egress` unchanged.
    pub fn send_to(self, egress: &Arc<dyn Egress>) -> EgressFuture {
        egress.send(self.site, self.request, self.options)
    }
}

/// Two taps on one call, `front` before `behind`: what `front` hands on reaches `behind`, and
/// the guest reads `front`'s wall clock if it keeps one, else `behind`'s.
#[derive(Debug)]
pub struct Chain {
    /// The tap the call's requests reach first.
    pub front: Arc<dyn Tap>,
    /// The tap between `front` and the egress.
    pub behind: Arc<dyn Tap>,
}

impl Tap for Chain {
    fn send(&self, outgoing: Outgoing<'_>, next: &Arc<dyn Egress>) -> EgressFuture {
        let behind: Arc<dyn Egress> = Arc::new(Tapped {
            tap: Arc::clone(&self.behind),
            next: Arc::clone(next),
        });
        self.front.send(outgoing, &behind)
    }

    fn wall_clock(&self) -> Option<Box<dyn HostWallClock>> {
        self.front.wall_clock().or_else(|| self.behind.wall_clock())
    }
}

/// An [`Egress`] with a call's [`Tap`] in front.
pub(crate) struct Tapped {
    pub(crate) tap: Arc<dyn Tap>,
    pub(crate) next: Arc<dyn Egress>,
}

impl Egress for Tapped {
    fn granted(&self, identity: &str) -> bool {
        self.next.granted(identity)
    }

    fn is_forbidden_header(&self, name: &HeaderName) -> bool {
        self.next.is_forbidden_header(name)
    }

    fn send(
        &self,
        site: &CallSite,
        request: http::Request<EgressBody>,
        options: Option<RequestOptions>,
    ) -> EgressFuture {
        let outgoing = Outgoing {
            site,
            request,
            options,
        };
        self.tap.send(outgoing, &self.next)
    }
}

/// Refuses every request with `HTTP-request-denied`: the egress of a host with no broker.
#[derive(Clone, Copy, Debug, Default)]
pub struct DenyAll;

impl Egress for DenyAll {
    fn granted(&self, _identity: &str) -> bool {
        false
    }

    fn send(
        &self,
        site: &CallSite,
        mut request: http::Request<EgressBody>,
        _options: Option<RequestOptions>,
    ) -> EgressFuture {
        tracing::warn!(provider = %site.provider, uri = %request.uri(), "outgoing HTTP denied: no egress grant");
        if let Some(reporter) = RefusalReporter::take(request.extensions_mut()) {
            reporter.report(Refusal::NotGranted);
        }
        Box::pin(async { Err(EgressError::HttpRequestDenied) })
    }
}

/// Why the host refused a provider's request, as the guest learns it from
/// `egress:http-broker/broker.last-refusal` (beside the `wasi:http` error code, which stays).
/// Each value says whether retrying can help; see `wit/http-broker/http-broker.wit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// The provider's identity has no grant, or its grant is pinned to other component bytes.
    NotGranted,
    /// The request is outside the grant: origin, method, headers.
    Denied,
    /// The host could not read the credential it injects. Transient.
    CredentialsUnavailable,
    /// The CA the grant trusts is not there yet. Transient.
    CaUnavailable,
    /// The CA the grant trusts holds no usable certificate.
    CaInvalid,
    /// A credentialed response that redaction could not see whole was refused.
    ResponseUnredactable,
    /// The call already had as many requests in flight as its budget allows.
    RequestsInFlight,
}

impl Refusal {
    /// The WIT name (`credentials-unavailable`, …): a stable label for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NotGranted => "not-granted",
            Refusal::Denied => "denied",
            Refusal::CredentialsUnavailable => "credentials-unavailable",
            Refusal::CaUnavailable => "ca-unavailable",
            Refusal::CaInvalid => "ca-invalid",
            Refusal::ResponseUnredactable => "response-unredactable",
            Refusal::RequestsInFlight => "requests-in-flight",
        }
    }

    /// The refusal whose WIT name is `name`, if there is one (a recording names refusals so).
    pub fn named(name: &str) -> Option<Refusal> {
        [
            Refusal::NotGranted,
            Refusal::Denied,
            Refusal::CredentialsUnavailable,
            Refusal::CaUnavailable,
            Refusal::CaInvalid,
            Refusal::ResponseUnredactable,
            Refusal::RequestsInFlight,
        ]
        .into_iter()
        .find(|refusal| refusal.as_str() == name)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Reports why one request was refused to the call that made it. The runtime puts one in the
/// extensions of every request it hands to [`Egress::send`]; the egress takes it out
/// ([`RefusalReporter::take`]) and calls [`report`](RefusalReporter::report) when it refuses.
///
/// A report about a request older than the call's latest is dropped: `last-refusal` is about
/// the most recent request only.
#[derive(Clone, Debug)]
pub struct RefusalReporter {
    slot: Arc<RefusalSlot>,
    /// The request's number within its call.
    request: u64,
}

impl RefusalReporter {
    /// Take the reporter out of a request's extensions, if the runtime put one there.
    pub fn take(extensions: &mut http::Extensions) -> Option<RefusalReporter> {
        extensions.remove::<RefusalReporter>()
    }

    /// The request was refused for `refusal`.
    pub fn report(&self, refusal: Refusal) {
        let mut state = lock(&self.slot.state);
        if state.latest == self.request {
            state.refusal = Some(refusal);
        }
    }

    /// Why this request was refused, as reported so far (`None` once a later one was sent).
    pub fn reported(&self) -> Option<Refusal> {
        let state = lock(&self.slot.state);
        (state.latest == self.request)
            .then_some(state.refusal)
            .flatten()
    }
}

/// One call's record of why its latest request was refused. Shared by the call's HTTP state and
/// the reporters of its requests.
#[derive(Debug, Default)]
pub(crate) struct RefusalSlot {
    state: Mutex<SlotState>,
}

#[derive(Debug, Default)]
struct SlotState {
    /// The number of the latest request handed over.
    latest: u64,
    refusal: Option<Refusal>,
}

impl RefusalSlot {
    /// A new request is handed over: forget the last refusal and return the request's reporter.
    pub(crate) fn begin(self: &Arc<Self>) -> RefusalReporter {
        let mut state = lock(&self.state);
        state.latest += 1;
        state.refusal = None;
        RefusalReporter {
            slot: Arc::clone(self),
            request: state.latest,
        }
    }

    /// Why the latest request was refused, if it was.
    pub(crate) fn last(&self) -> Option<Refusal> {
        lock(&self.state).refusal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_is_found_by_its_name_and_nothing_else_is() {
        for refusal in [
            Refusal::NotGranted,
            Refusal::CaInvalid,
            Refusal::RequestsInFlight,
        ] {
            assert_eq!(Refusal::named(refusal.as_str()), Some(refusal));
        }
        assert_eq!(Refusal::named("CaInvalid"), None);
    }

    #[test]
    fn only_the_latest_request_sets_the_last_refusal() {
        let slot = Arc::new(RefusalSlot::default());
        let first = slot.begin();
        first.report(Refusal::Denied);
        assert_eq!(slot.last(), Some(Refusal::Denied));
        let second = slot.begin();
        assert_eq!(slot.last(), None, "a new request clears it");
        first.report(Refusal::CredentialsUnavailable);
        assert_eq!(slot.last(), None, "an older request's refusal is dropped");
        second.report(Refusal::CaUnavailable);
        assert_eq!(slot.last(), Some(Refusal::CaUnavailable));
    }

    #[test]
    fn the_reporter_travels_in_the_request_extensions() {
        let slot = Arc::new(RefusalSlot::default());
        let mut request = http::Request::new(());
        request.extensions_mut().insert(slot.begin());
        let reporter = RefusalReporter::take(request.extensions_mut()).expect("inserted");
        assert!(RefusalReporter::take(request.extensions_mut()).is_none());
        reporter.report(Refusal::NotGranted);
        assert_eq!(slot.last(), Some(Refusal::NotGranted));
    }
}
