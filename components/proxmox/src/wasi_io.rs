//! The component's [`Io`]: `wasi:http/outgoing-handler` through the host's egress broker (the
//! shared guest crate's client), `wasi:clocks` for waits and timestamps, and the `log` import.
//!
//! Nothing here sets `Authorization`: the broker injects the API token and verifies TLS.

use egress_guest::{Endpoint, Scheme, time};

use crate::api::{Io, LogLevel, Method, Request, Response, TransportError};
use crate::egress::log::log::{self, Field, Level};

/// The largest response body read (the biggest answer is a resources listing).
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// [`Io`] over the component's imports, sending to `https://<authority>`.
pub struct WasiIo {
    pub authority: String,
}

impl Io for WasiIo {
    fn send(&mut self, request: &Request) -> Result<Response, TransportError> {
        let endpoint = Endpoint {
            scheme: Scheme::Https,
            authority: self.authority.clone(),
            base_path: String::new(),
        };
        let method = match request.method {
            Method::Get => egress_guest::Method::Get,
            Method::Post => egress_guest::Method::Post,
            Method::Put => egress_guest::Method::Put,
            Method::Delete => egress_guest::Method::Delete,
        };
        let mut outgoing = egress_guest::Request::new(method, &endpoint, &request.path)
            .max_response_bytes(MAX_BODY_BYTES);
        if matches!(request.method, Method::Post | Method::Put) {
            // An exact length, as the Phase 0 curl upload sent (F12); pveproxy never saw chunked.
            outgoing.body = Some(request.body.clone());
        }
        if let Some(content_type) = &request.content_type {
            outgoing = outgoing.header("content-type", content_type.as_str());
        }
        let response = egress_guest::send(&outgoing)?;
        Ok(Response {
            status: response.status,
            body: response.body,
        })
    }

    fn sleep_ms(&mut self, milliseconds: u64) {
        time::sleep_ms(milliseconds);
    }

    fn monotonic_ms(&mut self) -> u64 {
        time::monotonic_ms()
    }

    fn now_rfc3339(&mut self) -> String {
        time::now_rfc3339()
    }

    fn log(&mut self, level: LogLevel, message: &str, fields: &[(&str, &str)]) {
        let level = match level {
            LogLevel::Debug => Level::Debug,
            LogLevel::Info => Level::Info,
            LogLevel::Warn => Level::Warn,
        };
        let fields: Vec<Field> = fields
            .iter()
            .map(|(key, value)| Field {
                key: key.to_string(),
                value: value.to_string(),
            })
            .collect();
        log::emit(level, message, &fields);
    }
}
