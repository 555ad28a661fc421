//! `wasi:http/outgoing-handler.handle`, served so that a request without a body runs on the task
//! that runs the call.
//!
//! wasmtime-wasi-http's own `handle` spawns a task for each request and, once the response has
//! arrived, another for its I/O; the call then waits on the first task's join handle. On a
//! multi-threaded executor every such hand-over can wake another worker, and the call's requests
//! hop between threads: called from a worker task, a Proxmox `get` took twice as long as its
//! requests alone (docs/performance.md). Here a request without a body is a future kept in the
//! call's resource table and polled by the call itself: once when the guest hands it over (so it
//! is on its way before the guest waits), on each `get`, and while the guest waits on it.
//!
//! A request with a body, or a `content-length` other than `0`, still goes through
//! wasmtime-wasi-http's `handle`: its task takes the body while the guest writes it, and it
//! checks the length.
//!
//! The response future's resource keeps wasmtime-wasi-http's type, so the guest's other calls
//! type-check as before; its `get`, `subscribe` and destructor are defined again here, for both
//! kinds of entry in the table.

use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HOST};
use http_body_util::{BodyExt, Empty};
use wasmtime::component::{Linker, Resource, ResourceTable, ResourceTableError, ResourceType};
use wasmtime_wasi::p2::Pollable;
use wasmtime_wasi_http::p2::bindings::http::outgoing_handler;
use wasmtime_wasi_http::p2::bindings::http::types::{
    ErrorCode, HostFutureIncomingResponse as FutureResponseHost, Method, Scheme,
};
use wasmtime_wasi_http::p2::body::HostIncomingBody;
use wasmtime_wasi_http::p2::types::{
    HostFutureIncomingResponse, HostIncomingResponse, HostOutgoingRequest,
};
use wasmtime_wasi_http::p2::{HttpResult, http_request_error};
use wasmtime_wasi_http::{FieldMap, RequestOptions, WasiBody, WasiHttpHooks, WasiHttpView};

use super::{EgressHooks, HttpCallState};
use crate::egress::{EgressError, EgressFuture};
use crate::state::HostState;

/// The instances as wasmtime-wasi-http names them (the version of its WIT): `handle` is defined
/// in the first, the response future's functions again in the second. Should a new
/// wasmtime-wasi-http name another version, these would define instances of their own, and every
/// guest `get` of a bodiless request's response would trap: every HTTP test would fail.
const HANDLER_INSTANCE: &str = "wasi:http/outgoing-handler@0.2.12";
const TYPES_INSTANCE: &str = "wasi:http/types@0.2.12";
/// The resource and the functions of it defined again.
const FUTURE_RESPONSE: &str = "future-incoming-response";
const FUTURE_RESPONSE_GET: &str = "[method]future-incoming-response.get";
const FUTURE_RESPONSE_SUBSCRIBE: &str = "[method]future-incoming-response.subscribe";

/// Link `handle`, and the response future's `get`, `subscribe` and destructor, over what
/// wasmtime-wasi-http's `wasi:http/types` defined (which must already be in `linker`).
pub(super) fn link(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.instance(HANDLER_INSTANCE)?.func_wrap(
        "handle",
        |mut store,
         (request, options): (
            Resource<HostOutgoingRequest>,
            Option<Resource<RequestOptions>>,
        )| {
            match handle(store.data_mut(), request, options) {
                Ok(future) => Ok((Ok(future),)),
                // An error code is the guest's to handle; anything else traps, as in
                // wasmtime-wasi-http.
                Err(error) => Ok((Err::<Resource<HostFutureIncomingResponse>, ErrorCode>(
                    error.downcast()?,
                ),)),
            }
        },
    )?;
    linker.allow_shadowing(true);
    let defined = define_future_response(linker);
    linker.allow_shadowing(false);
    defined
}

fn define_future_response(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    let mut types = linker.instance(TYPES_INSTANCE)?;
    types.resource(
        FUTURE_RESPONSE,
        ResourceType::host::<HostFutureIncomingResponse>(),
        |mut store, rep| {
            let table = store.data_mut().table();
            // (A delete of the wrong type would free the entry anyway: ask first.)
            if sent_here(table, rep)? {
                table.delete(Resource::<SentHere>::new_own(rep))?;
            } else {
                table.delete(Resource::<HostFutureIncomingResponse>::new_own(rep))?;
            }
            Ok(())
        },
    )?;
    types.func_wrap(
        FUTURE_RESPONSE_GET,
        |mut store, (future,): (Resource<HostFutureIncomingResponse>,)| {
            Ok((response(store.data_mut(), future)?,))
        },
    )?;
    types.func_wrap(
        FUTURE_RESPONSE_SUBSCRIBE,
        |mut store, (future,): (Resource<HostFutureIncomingResponse>,)| {
            let state: &mut HostState = store.data_mut();
            if sent_here(state.table(), future.rep())? {
                let here = Resource::<SentHere>::new_borrow(future.rep());
                Ok((wasmtime_wasi::p2::subscribe(state.table(), here)?,))
            } else {
                Ok((FutureResponseHost::subscribe(&mut state.http(), future)?,))
            }
        },
    )?;
    Ok(())
}

/// Whether the response future at `rep` is one of ours, not wasmtime-wasi-http's.
fn sent_here(table: &ResourceTable, rep: u32) -> Result<bool, ResourceTableError> {
    match table.get(&Resource::<SentHere>::new_borrow(rep)) {
        Ok(_) => Ok(true),
        Err(ResourceTableError::WrongType) => Ok(false),
        Err(error) => Err(error),
    }
}

/// What a response future's `get` answers: nothing yet, taken already, or the response or why
/// there is none.
type Answer = Option<Result<Result<Resource<HostIncomingResponse>, ErrorCode>, ()>>;

/// `get` of a response future: ours polled once more, wasmtime-wasi-http's as it answers it.
fn response(
    state: &mut HostState,
    future: Resource<HostFutureIncomingResponse>,
) -> wasmtime::Result<Answer> {
    if !sent_here(state.table(), future.rep())? {
        return FutureResponseHost::get(&mut state.http(), future);
    }
    let sent = state
        .table()
        .get_mut(&Resource::<SentHere>::new_borrow(future.rep()))?;
    sent.poll_now();
    let outcome = match std::mem::replace(sent, SentHere::Taken) {
        SentHere::Taken => return Ok(Some(Err(()))),
        SentHere::Sending(sending) => {
            *sent = SentHere::Sending(sending);
            return Ok(None);
        }
        SentHere::Answered(outcome) => outcome,
    };
    match outcome {
        Ok(answer) => {
            let (parts, body) = answer.into_parts();
            let (call, table) = state.capability_state(HttpCallState::ungranted);
            let headers = FieldMap::new_immutable(&mut call.hooks, parts.headers);
            let answer = table.push(HostIncomingResponse {
                status: parts.status.as_u16(),
                headers,
                body: Some(HostIncomingBody::new(body)),
            })?;
            Ok(Some(Ok(Ok(answer))))
        }
        Err(error) => Ok(Some(Ok(Err(error_code(state, error)?)))),
    }
}

/// What `error` means to the guest, as wasmtime-wasi-http says it of its own requests' errors.
pub(super) fn error_code(state: &mut HostState, error: EgressError) -> wasmtime::Result<ErrorCode> {
    let theirs = state
        .table()
        .push(HostFutureIncomingResponse::Ready(Err(error)))?;
    let borrowed = Resource::new_borrow(theirs.rep());
    let answer = FutureResponseHost::get(&mut state.http(), borrowed);
    state.table().delete(theirs)?;
    match answer? {
        Some(Ok(Err(code))) => Ok(code),
        _ => Err(wasmtime::format_err!(
            "a failed exchange read as a response"
        )),
    }
}

/// A response future for a request sent from the call's own task.
enum SentHere {
    /// The exchange, polled by the call.
    Sending(EgressFuture),
    /// The response, or why there is none, not yet taken.
    Answered(Result<http::Response<WasiBody>, EgressError>),
    /// The guest has taken the answer.
    Taken,
}

impl SentHere {
    /// Move the exchange on as far as it goes without waiting. (Whoever waits on it polls it
    /// again with their own waker.)
    fn poll_now(&mut self) {
        if let SentHere::Sending(sending) = self
            && let Poll::Ready(outcome) = sending
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
        {
            *self = SentHere::Answered(outcome);
        }
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for SentHere {
    async fn ready(&mut self) {
        if let SentHere::Sending(sending) = self {
            let outcome = sending.as_mut().await;
            *self = SentHere::Answered(outcome);
        }
    }
}

/// `handle`: a request without a body is sent from here; one with a body, or a
/// `content-length` other than `0`, by wasmtime-wasi-http.
fn handle(
    state: &mut HostState,
    request: Resource<HostOutgoingRequest>,
    options: Option<Resource<RequestOptions>>,
) -> HttpResult<Resource<HostFutureIncomingResponse>> {
    let outgoing = state.table().get(&request)?;
    if outgoing.body.is_some() || !no_length_or_zero(&outgoing.headers) {
        return outgoing_handler::Host::handle(&mut state.http(), request, options);
    }
    let options = options.and_then(|options| state.table().get(&options).ok().cloned());
    let outgoing = state.table().delete(request)?;
    let (call, table) = state.capability_state(HttpCallState::ungranted);
    let target = Target {
        method: outgoing.method,
        scheme: outgoing.scheme,
        authority: outgoing.authority,
        path_with_query: outgoing.path_with_query,
    };
    let body = Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed_unsync();
    let request = request_to(target, &outgoing.headers, body, &mut call.hooks)?;
    let mut sent = SentHere::Sending(call.hooks.send(request, options));
    sent.poll_now();
    let sent = table.push(sent)?;
    Ok(Resource::new_own(sent.rep()))
}

/// Whether `headers` declare no body: no `content-length`, or one of `0` (a `DELETE` or a bodiless
/// `POST`). Any other length, or a malformed one, is wasmtime-wasi-http's to refuse.
fn no_length_or_zero(headers: &http::HeaderMap) -> bool {
    let mut lengths = headers.get_all(CONTENT_LENGTH).iter();
    match (lengths.next(), lengths.next()) {
        (None, _) => true,
        (Some(length), None) => length.as_bytes() == b"0",
        (Some(_), Some(_)) => false,
    }
}

/// Where a request goes, as the guest set it.
pub(super) struct Target {
    pub method: Method,
    pub scheme: Option<Scheme>,
    pub authority: Option<String>,
    pub path_with_query: Option<String>,
}

/// The request the guest built, as wasmtime-wasi-http's `handle` builds it: the scheme the guest
/// set or the hooks' default, the `host` header from the authority.
pub(super) fn request_to(
    target: Target,
    headers: &http::HeaderMap,
    body: WasiBody,
    hooks: &mut EgressHooks,
) -> HttpResult<http::Request<WasiBody>> {
    let method = match target.method {
        Method::Get => http::Method::GET,
        Method::Head => http::Method::HEAD,
        Method::Post => http::Method::POST,
        Method::Put => http::Method::PUT,
        Method::Delete => http::Method::DELETE,
        Method::Connect => http::Method::CONNECT,
        Method::Options => http::Method::OPTIONS,
        Method::Trace => http::Method::TRACE,
        Method::Patch => http::Method::PATCH,
        Method::Other(name) => http::Method::from_bytes(name.as_bytes())
            .map_err(|_| ErrorCode::HttpRequestMethodInvalid)?,
    };
    let scheme = match target.scheme {
        Some(Scheme::Http) => http::uri::Scheme::HTTP,
        Some(Scheme::Https) => http::uri::Scheme::HTTPS,
        Some(Scheme::Other(scheme)) => http::uri::Scheme::try_from(scheme.as_str())
            .map_err(|_| ErrorCode::HttpProtocolError)?,
        None => hooks.default_scheme().ok_or(ErrorCode::HttpProtocolError)?,
    };
    if !hooks.is_supported_scheme(&scheme) {
        return Err(ErrorCode::HttpProtocolError.into());
    }
    let authority = target.authority.unwrap_or_default();
    let mut uri = http::Uri::builder()
        .scheme(scheme)
        .authority(authority.as_str());
    if let Some(path) = target.path_with_query {
        uri = uri.path_and_query(path);
    }
    let mut request = http::Request::builder()
        .method(method)
        .uri(uri.build().map_err(http_request_error)?);
    if hooks.set_host_header() {
        request = request.header(HOST, authority.as_str());
    }
    for (name, value) in headers {
        request = request.header(name, value);
    }
    Ok(request.body(body).map_err(http_request_error)?)
}
