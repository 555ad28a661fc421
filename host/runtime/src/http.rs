//! Outgoing HTTP as a capability: `wasi:http` (types and outgoing handler) and
//! `egress:http-broker/broker`, over an [`Egress`].
//!
//! The runtime owns the `wasi:http` plumbing, because its host traits are implemented on the
//! runtime's [`HostState`] (the orphan rule keeps those impls here); an [`Egress`] decides what
//! happens to each request. A capability of outgoing HTTP is [`link`] + [`provides`] +
//! [`prepare`] over its egress: [`HttpCapability`] does that for any egress without grants
//! ([`DenyAll`], or a test's), and the egress broker (`egress-capability-http`) for its own,
//! whose grants it sets and removes. This module is the one
//! place that knows the shape of wasmtime-wasi-http's hooks ([`EgressHooks`]). Per call it holds
//! the in-flight budget (each request takes a permit, which its response body keeps until the
//! guest drops it), the byte budgets of request and response bodies ([`ByteMeter`]), the header
//! list limit, the outgoing body buffer, and the record of why the
//! latest request was refused, which `egress:http-broker/broker.last-refusal` answers. Its
//! submodule `outgoing` serves `outgoing-handler.handle` so that a request without a body runs on
//! the call's own task; `exchange` serves a whole request and response in one call into the host,
//! through the same hooks.
//!
//! [`DenyAll`]: crate::egress::DenyAll

use std::any::Any;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use http::HeaderName;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime::component::{HasSelf, Linker};
use wasmtime_wasi_http::{
    ForbiddenHeaderFilter, RequestOptions, WasiBody, WasiHttp, WasiHttpCtx, WasiHttpCtxView,
    WasiHttpHooks, WasiHttpView,
};

use crate::capability::{Capability, PrepareContext, import_matches};
use crate::egress::{
    CallSite, DenyAll, Egress, EgressError, EgressFuture, Refusal, RefusalSlot, Tapped,
};
use crate::error::Budget;
use crate::grant::{GrantContext, GrantError, NoGrant};
use crate::limits::Limits;
use crate::state::{HostState, Stop};

/// The broker's refusal as `$wit`, the `refusal` enum of one `egress:http-broker` version: each
/// version has its own type, with the same cases.
macro_rules! refusal_as {
    ($refusal:expr, $wit:ident) => {
        match $refusal {
            Refusal::NotGranted => $wit::NotGranted,
            Refusal::Denied => $wit::Denied,
            Refusal::CredentialsUnavailable => $wit::CredentialsUnavailable,
            Refusal::CaUnavailable => $wit::CaUnavailable,
            Refusal::CaInvalid => $wit::CaInvalid,
            Refusal::ResponseUnredactable => $wit::ResponseUnredactable,
            Refusal::RequestsInFlight => $wit::RequestsInFlight,
        }
    };
}

mod exchange;
mod outgoing;

/// `wasi:http` interfaces this capability provides, at any 0.2 version.
const WASI_HTTP: &[&str] = &["wasi:http/types", "wasi:http/outgoing-handler"];
/// An import every component that sends HTTP has: how the runtime finds an HTTP capability.
pub(crate) const TYPES_IMPORT: &str = "wasi:http/types@0.2.0";
/// The WASI version the interfaces above are matched against.
const WASI_HTTP_VERSION: &str = "0.2.0";
/// The broker's own interface and its version.
const BROKER_INTERFACE: &str = "egress:http-broker/broker";
const BROKER_VERSION: &str = "0.1.0";

/// Bindings of `egress:http-broker`, for the `Host` trait implemented below.
mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit/http-broker-v0.1.0",
        world: "egress:http-broker/imports",
    });
}

use bindings::egress::http_broker::broker::{self as wit, Refusal as WitRefusal};

/// Whether `import` is one of the outgoing-HTTP interfaces ([`Capability::provides`] of an
/// HTTP capability).
pub fn provides(import: &str) -> bool {
    WASI_HTTP
        .iter()
        .any(|interface| import_matches(import, interface, WASI_HTTP_VERSION))
        || import_matches(import, BROKER_INTERFACE, BROKER_VERSION)
        || import_matches(import, exchange::INTERFACE, exchange::VERSION)
}

/// Adds the outgoing-HTTP interfaces to `linker` ([`Capability::link`] of an HTTP capability).
pub fn link(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    let options = wasmtime_wasi_http::p2::bindings::LinkOptions::default();
    wasmtime_wasi_http::p2::bindings::http::types::add_to_linker::<HostState, WasiHttp>(
        linker,
        &options.into(),
        HostState::http,
    )?;
    outgoing::link(linker)?;
    exchange::link(linker)?;
    wit::add_to_linker::<HostState, HasSelf<HostState>>(linker, |state| state)
}

/// The HTTP state of one call whose requests go to `egress` ([`Capability::prepare`] of an HTTP
/// capability): the call's budgets, and its record of why a request was refused.
pub fn prepare(egress: Arc<dyn Egress>, call: &PrepareContext<'_>) -> Box<dyn Any + Send> {
    let egress: Arc<dyn Egress> = match call.tap {
        Some(tap) => Arc::new(Tapped {
            tap: Arc::clone(tap),
            next: egress,
        }),
        None => egress,
    };
    Box::new(HttpCallState::new(egress, call.site.clone(), call.limits))
}

/// Outgoing HTTP over an [`Egress`] that keeps no grants: [`DenyAll`], which the runtime uses
/// when it is given no HTTP capability, or an egress of a test.
pub struct HttpCapability {
    egress: Arc<dyn Egress>,
}

impl HttpCapability {
    /// The capability sending every request to `egress`.
    pub fn new(egress: Arc<dyn Egress>) -> Self {
        HttpCapability { egress }
    }
}

impl Capability for HttpCapability {
    type Grant = NoGrant;

    fn name(&self) -> &'static str {
        "http"
    }

    fn provides(&self, import: &str) -> bool {
        provides(import)
    }

    fn link(&self, linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
        link(linker)
    }

    fn set_grant(
        &self,
        _identity: &str,
        grant: &NoGrant,
        _context: &GrantContext<'_>,
    ) -> Result<(), GrantError> {
        match *grant {}
    }

    fn remove_grant(&self, _identity: &str) {}

    fn granted(&self, identity: &str) -> bool {
        self.egress.granted(identity)
    }

    fn prepare(&self, call: &PrepareContext<'_>) -> Box<dyn Any + Send> {
        prepare(Arc::clone(&self.egress), call)
    }
}

/// The HTTP state of one call.
struct HttpCallState {
    /// wasi:http state (the header list size limit).
    http: WasiHttpCtx,
    /// The header list size limit, for a request sent whole through `exchange`.
    header_bytes: usize,
    /// The most one `exchange` holds of a response body: the call's transfer budget.
    exchange_bytes: usize,
    /// Where outgoing HTTP goes: the runtime's shared [`Egress`], tagged with this call's site.
    hooks: EgressHooks,
}

impl HttpCallState {
    fn new(egress: Arc<dyn Egress>, site: CallSite, limits: &Limits) -> Self {
        let mut http = WasiHttpCtx::new();
        http.set_field_size_limit(limits.header_bytes_limit());
        HttpCallState {
            http,
            header_bytes: limits.header_bytes_limit(),
            exchange_bytes: limits.transfer_bytes_limit(),
            hooks: EgressHooks {
                egress,
                site,
                in_flight: Arc::new(Semaphore::new(limits.requests_in_flight_limit())),
                in_flight_limit: limits.requests_in_flight_limit(),
                in_flight_exceeded: Arc::new(AtomicBool::new(false)),
                sent: Arc::new(ByteMeter::new(
                    Budget::HttpBytesSent,
                    limits.http_bytes_sent_limit(),
                )),
                received: Arc::new(ByteMeter::new(
                    Budget::HttpBytesReceived,
                    limits.http_bytes_received_limit(),
                )),
                body_buffer_bytes: limits.body_buffer_bytes_limit(),
                refusals: Arc::new(RefusalSlot::default()),
            },
        }
    }

    /// The state of a call nobody prepared HTTP for: every request is denied, under the default
    /// limits. (The runtime prepares HTTP for every component that imports it.)
    fn ungranted(_deadline: Instant) -> Self {
        let site = CallSite {
            provider: Arc::from(""),
            digest: Arc::from(""),
            operation: "-",
        };
        HttpCallState::new(Arc::new(DenyAll), site, &Limits::default())
    }
}

/// The HTTP budget the guest went past, if any: a request beyond its in-flight budget, or
/// request or response bodies beyond its byte budgets. The call fails for it, whatever the guest
/// answered, unless something else stopped it first.
pub(crate) fn budget_exceeded(state: &HostState) -> Option<Stop> {
    let hooks = &state.capability_state_ref::<HttpCallState>()?.hooks;
    if hooks.in_flight_exceeded.load(Ordering::Relaxed) {
        return Some(Stop::Budget(
            Budget::RequestsInFlight,
            hooks.in_flight_limit as u64,
        ));
    }
    [&hooks.sent, &hooks.received]
        .into_iter()
        .find(|meter| meter.exceeded.load(Ordering::Relaxed))
        .map(|meter| Stop::Budget(meter.budget, meter.limit))
}

/// Bytes of one call's HTTP bodies in one direction, against its budget.
struct ByteMeter {
    budget: Budget,
    limit: u64,
    used: AtomicU64,
    /// Set once a body went past the limit.
    exceeded: AtomicBool,
}

impl ByteMeter {
    fn new(budget: Budget, limit: u64) -> Self {
        ByteMeter {
            budget,
            limit,
            used: AtomicU64::new(0),
            exceeded: AtomicBool::new(false),
        }
    }

    /// Counts `bytes`; false (and the budget marked exceeded) when they go past the limit.
    fn take(&self, bytes: usize) -> bool {
        let used = self.used.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        if used > self.limit {
            self.exceeded.store(true, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// The error a body past this budget ends with.
    fn error(&self) -> EgressError {
        match self.budget {
            Budget::HttpBytesSent => EgressError::HttpRequestBodySize(Some(self.limit)),
            _ => EgressError::HttpResponseBodySize(Some(self.limit)),
        }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        let (state, table) = self.capability_state(HttpCallState::ungranted);
        WasiHttpCtxView {
            ctx: &mut state.http,
            table,
            hooks: &mut state.hooks,
        }
    }
}

impl wit::Host for HostState {
    fn last_refusal(&mut self) -> Option<WitRefusal> {
        let (state, _) = self.capability_state(HttpCallState::ungranted);
        state
            .hooks
            .refusals
            .last()
            .map(|refusal| refusal_as!(refusal, WitRefusal))
    }
}

/// Adapts the runtime's [`Egress`] to wasmtime-wasi-http's hooks: the one place that knows the
/// hook's shape. It also holds the call's in-flight budget: each request takes a permit, which
/// its response body keeps until the guest drops it.
struct EgressHooks {
    egress: Arc<dyn Egress>,
    site: CallSite,
    /// Requests in flight for this call.
    in_flight: Arc<Semaphore>,
    in_flight_limit: usize,
    /// Set when a request was refused for want of a permit.
    in_flight_exceeded: Arc<AtomicBool>,
    /// Request body bytes sent by this call.
    sent: Arc<ByteMeter>,
    /// Response body bytes received by this call.
    received: Arc<ByteMeter>,
    body_buffer_bytes: usize,
    /// Why the call's latest request was refused; the egress reports through the reporter each
    /// request carries in its extensions.
    refusals: Arc<RefusalSlot>,
}

type IoFuture = Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>;

impl WasiHttpHooks for EgressHooks {
    fn is_forbidden_header(&mut self, name: &HeaderName) -> bool {
        self.egress.is_forbidden_header(name)
    }

    fn forbidden_header_filter(&mut self) -> ForbiddenHeaderFilter {
        let egress = Arc::clone(&self.egress);
        Arc::new(move |name| egress.is_forbidden_header(name))
    }

    fn p2_outgoing_body_buffer_chunks(&mut self) -> usize {
        1
    }

    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        self.body_buffer_bytes
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _request_body_errors: IoFuture,
    ) -> Box<
        dyn Future<Output = wasmtime_wasi_http::Result<(http::Response<WasiBody>, IoFuture)>>
            + Send,
    > {
        let response = self.send(request, options);
        Box::new(async move {
            // The egress drives its own connection; there is no separate I/O task to report.
            let io_done: IoFuture = Box::new(async { Ok(()) });
            Ok((response.await?, io_done))
        })
    }
}

impl EgressHooks {
    /// Send `request` through the egress under the call's in-flight budget: the response body
    /// keeps the request's permit until the guest drops it.
    fn send(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
    ) -> EgressFuture {
        let reporter = self.refusals.begin();
        let Ok(permit) = Arc::clone(&self.in_flight).try_acquire_owned() else {
            self.in_flight_exceeded.store(true, Ordering::Relaxed);
            reporter.report(Refusal::RequestsInFlight);
            tracing::warn!(
                provider = %self.site.provider,
                operation = self.site.operation,
                limit = self.in_flight_limit,
                "outgoing HTTP refused: too many requests in flight"
            );
            return Box::pin(async { Err(EgressError::ConnectionLimitReached) });
        };
        request.extensions_mut().insert(reporter);
        let sent = Arc::clone(&self.sent);
        let request = request.map(|body| {
            MeteredBody {
                body,
                meter: sent,
                _permit: None,
            }
            .boxed_unsync()
        });
        let response = self.egress.send(&self.site, request, options);
        let received = Arc::clone(&self.received);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| {
                MeteredBody {
                    body,
                    meter: received,
                    _permit: Some(permit),
                }
                .boxed_unsync()
            }))
        })
    }
}

/// A request or response body counted against its call's byte budget, ending in an error once
/// past it. A response body also holds its request's in-flight permit until the guest drops it.
struct MeteredBody {
    body: WasiBody,
    meter: Arc<ByteMeter>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Body for MeteredBody {
    type Data = bytes::Bytes;
    type Error = EgressError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let frame = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &frame
            && let Some(data) = frame.data_ref()
            && !self.meter.take(data.len())
        {
            return Poll::Ready(Some(Err(self.meter.error())));
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_provides_wasi_http_0_2_and_the_broker_interface() {
        let http = HttpCapability::new(Arc::new(DenyAll));
        assert!(http.provides("wasi:http/outgoing-handler@0.2.12"));
        assert!(http.provides("wasi:http/types@0.2.6"));
        assert!(http.provides("egress:http-broker/broker@0.1.0"));
        assert!(http.provides("egress:http-broker/exchange@0.2.0"));
        assert!(!http.provides("egress:http-broker/exchange@0.1.0"));
        assert!(!http.provides("wasi:http/outgoing-handler@0.3.0"));
        assert!(!http.provides("wasi:io/streams@0.2.12"));
        assert!(!http.provides("egress:libvirt/libvirt@0.1.0"));
        assert!(!http.granted("anyone"), "DenyAll grants nobody");
    }
}
