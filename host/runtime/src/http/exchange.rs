//! `egress:http-broker/exchange.send`: a whole request in, a whole response out, in one call into
//! the host.
//!
//! Through `wasi:http` a bodiless `GET` costs a guest 18–22 calls into the host (fields, setters,
//! futures, pollables, streams); here it costs one. The request goes to the same
//! [`EgressHooks::send`] as a `wasi:http` request, so the broker's promises hold on both paths
//! alike: the grant, the injected credential, redaction, refused encodings, the in-flight budget
//! and the byte budgets (both bodies are [`MeteredBody`](super::MeteredBody)s). What only this
//! path does is checked here: the header list against the call's header budget and the host's
//! own headers, and the response body against the guest's cap and the call's transfer budget, the
//! most the host holds for one exchange.

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HeaderValue};
use http_body_util::{BodyExt, Full};
use wasmtime::component::{HasSelf, Linker};
use wasmtime_wasi_http::p2::bindings::http::types::{ErrorCode, Method};
use wasmtime_wasi_http::{FieldMap, FieldMapError};

use super::outgoing::{Target, error_code, request_to};
use super::{EgressHooks, HttpCallState};
use crate::egress::{EgressBody, EgressError, Refusal};
use crate::state::HostState;

/// The interface and its version, for [`super::provides`].
pub(super) const INTERFACE: &str = "egress:http-broker/exchange";
pub(super) const VERSION: &str = "0.2.0";

/// Bindings of `egress:http-broker@0.2.0`, its `wasi:http` types those of wasmtime-wasi-http.
mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit/http-broker",
        world: "egress:http-broker/imports",
        imports: { default: async | trappable },
        require_store_data_send: true,
        with: {
            "wasi:http/types": wasmtime_wasi_http::p2::bindings::http::types,
        },
    });
}

use bindings::egress::http_broker::exchange::{
    self as wit, ExchangeError, Failure, Refusal as WitRefusal, Request, Response,
};

/// Adds `exchange` to `linker`.
pub(super) fn link(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    wit::add_to_linker::<HostState, HasSelf<HostState>>(linker, |state| state)
}

impl wit::Host for HostState {
    async fn send(
        &mut self,
        request: Request,
        max_response_bytes: u64,
    ) -> wasmtime::Result<Result<Response, ExchangeError>> {
        let (call, _) = self.capability_state(HttpCallState::ungranted);
        let cap = max_response_bytes.min(call.exchange_bytes as u64);
        let sending = match outgoing(request, call.header_bytes, &mut call.hooks)? {
            Ok(request) => call.hooks.send(request, None),
            Err(refused) => return Ok(Err(refused)),
        };
        let outcome = match sending.await {
            Ok(response) => read_whole(response, cap).await,
            Err(error) => Err(error),
        };
        let (parts, body) = match outcome {
            Ok(read) => read,
            Err(error) => return Ok(Err(self.failed(error))),
        };
        // The headers a guest may not see are dropped, as for a `wasi:http` response.
        let (call, _) = self.capability_state(HttpCallState::ungranted);
        let headers = FieldMap::new_immutable(&mut call.hooks, parts.headers);
        Ok(Ok(Response {
            status: parts.status.as_u16(),
            headers: headers
                .iter()
                .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
                .collect(),
            body,
        }))
    }
}

impl HostState {
    /// The guest's view of an exchange that failed: the `wasi:http` code, and the broker's
    /// refusal when it refused.
    fn failed(&mut self, error: EgressError) -> ExchangeError {
        let (call, _) = self.capability_state(HttpCallState::ungranted);
        let refusal = call
            .hooks
            .refusals
            .last()
            .map(|refusal| refusal_as!(refusal, WitRefusal));
        let code = error_code(self, error)
            .unwrap_or_else(|_| ErrorCode::InternalError(Some("unknown error".into())));
        ExchangeError::Failed(Failure { code, refusal })
    }
}

/// The request the guest described, its headers checked as `wasi:http` checks those of a
/// request the guest builds (the same header list type, limit and forbidden names), and
/// `content-length` the body's, set by the host. A header list past the call's budget stops the
/// call, as it does on `wasi:http` (`Budget{header-bytes}`).
fn outgoing(
    request: Request,
    header_bytes: usize,
    hooks: &mut EgressHooks,
) -> wasmtime::Result<Result<http::Request<EgressBody>, ExchangeError>> {
    let mut headers = FieldMap::new_mutable(header_bytes);
    for (name, value) in request.headers {
        if name.eq_ignore_ascii_case(CONTENT_LENGTH.as_str()) {
            return Ok(Err(ExchangeError::HeaderForbidden(name)));
        }
        match headers.append(hooks, name.clone(), value) {
            Ok(_) => {}
            Err(FieldMapError::Forbidden) => return Ok(Err(ExchangeError::HeaderForbidden(name))),
            Err(FieldMapError::InvalidHeaderName | FieldMapError::InvalidHeaderValue) => {
                return Ok(Err(ExchangeError::HeaderInvalid(name)));
            }
            Err(other) => return Err(other.into()),
        }
    }
    let bodiless = request.body.is_empty() && matches!(request.method, Method::Get | Method::Head);
    let length = (!bodiless).then(|| HeaderValue::from(request.body.len()));
    let body = Full::new(Bytes::from(request.body))
        .map_err(|never| match never {})
        .boxed_unsync();
    let target = Target {
        method: request.method,
        scheme: Some(request.scheme),
        authority: Some(request.authority),
        path_with_query: Some(request.path_with_query),
    };
    let mut request = match request_to(target, &headers, body, hooks) {
        Ok(request) => request,
        // An error code is the guest's; anything else traps, as on `wasi:http`.
        Err(error) => return Ok(Err(code_only(error.downcast()?))),
    };
    if let Some(length) = length {
        request.headers_mut().insert(CONTENT_LENGTH, length);
    }
    Ok(Ok(request))
}

fn code_only(code: ErrorCode) -> ExchangeError {
    ExchangeError::Failed(Failure {
        code,
        refusal: None,
    })
}

/// The response with its body read whole, at most `cap` bytes of it.
async fn read_whole(
    response: http::Response<EgressBody>,
    cap: u64,
) -> Result<(http::response::Parts, Vec<u8>), EgressError> {
    let (parts, mut body) = response.into_parts();
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame?.data_ref() {
            if (bytes.len() + data.len()) as u64 > cap {
                return Err(EgressError::HttpResponseBodySize(Some(cap)));
            }
            bytes.extend_from_slice(data);
        }
    }
    Ok((parts, bytes))
}
