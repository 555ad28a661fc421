//! A request through the broker's whole-exchange call: one call into the host, where `wasi:http`
//! takes 18 or more (fields, setters, futures, pollables, streams).

use super::{Failure, HeaderError, Request, Response};
use crate::endpoint::Scheme;

mod bindings {
    wit_bindgen::generate!({
        // A link to `wit/http-broker` in this repository: `cp -rL` copies the crate whole.
        path: "http-broker-wit",
        world: "egress:http-broker/imports",
        // The `wasi:http` types are wasip2's, so a failure's code is the one `wasi:http` gives.
        with: {
            "wasi:http/types@0.2.12": wasip2::http::types,
            "wasi:io/error@0.2.12": wasip2::io::error,
            "wasi:io/poll@0.2.12": wasip2::io::poll,
            "wasi:io/streams@0.2.12": wasip2::io::streams,
            "wasi:clocks/monotonic-clock@0.2.12": wasip2::clocks::monotonic_clock,
        },
    });
}

use bindings::egress::http_broker::exchange::{self, ExchangeError};

/// Send `request` whole and read the whole response.
pub(super) fn send(request: &Request) -> Result<Response, Failure> {
    let outgoing = exchange::Request {
        method: request.method.clone(),
        scheme: match request.scheme {
            Scheme::Http => wasip2::http::types::Scheme::Http,
            Scheme::Https => wasip2::http::types::Scheme::Https,
        },
        authority: request.authority.clone(),
        path_with_query: request.path_with_query.clone(),
        headers: request.headers.clone(),
        body: request.body.clone().unwrap_or_default(),
    };
    match exchange::send(&outgoing, request.max_response_bytes as u64) {
        Ok(response) => Ok(Response {
            status: response.status,
            body: response.body,
        }),
        Err(ExchangeError::HeaderForbidden(name)) => Err(Failure::HeaderRefused {
            name,
            error: HeaderError::Forbidden,
        }),
        Err(ExchangeError::HeaderInvalid(name)) => Err(Failure::HeaderRefused {
            name,
            error: HeaderError::InvalidSyntax,
        }),
        Err(ExchangeError::Failed(failure)) => Err(Failure::Transport(failure.code)),
    }
}
