//! The component's [`Io`]: `wasi:http/outgoing-handler` through the host's egress broker,
//! `wasi:clocks` for waits and timestamps, and the `log` import.
//!
//! Nothing here sets `Authorization`: the broker injects the API token and verifies TLS.

use crate::api::{Io, LogLevel, Method, Request, Response, TransportError, TransportKind};
use crate::egress::provider::log::{self, Field, Level};
use crate::wasi::clocks::{monotonic_clock, wall_clock};
use crate::wasi::http::outgoing_handler;
use crate::wasi::http::types::{
    ErrorCode, Fields, FutureIncomingResponse, IncomingResponse, Method as WasiMethod,
    OutgoingBody, OutgoingRequest, Scheme,
};
use crate::wasi::io::streams::{OutputStream, StreamError};

/// The largest response body read (the biggest answer is a resources listing).
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// Bytes per stream read.
const CHUNK_BYTES: u64 = 64 * 1024;

/// [`Io`] over the component's imports, sending to `https://<authority>`.
pub struct WasiIo {
    pub authority: String,
}

fn other(detail: impl Into<String>) -> TransportError {
    TransportError {
        kind: TransportKind::Other,
        detail: detail.into(),
    }
}

/// What a `wasi:http` error code means for the provider.
pub fn transport_error(code: &ErrorCode) -> TransportError {
    let kind = match code {
        ErrorCode::DnsTimeout
        | ErrorCode::DnsError(_)
        | ErrorCode::DestinationNotFound
        | ErrorCode::DestinationUnavailable
        | ErrorCode::DestinationIpUnroutable
        | ErrorCode::ConnectionRefused
        | ErrorCode::ConnectionTerminated
        | ErrorCode::ConnectionTimeout
        | ErrorCode::ConnectionReadTimeout
        | ErrorCode::ConnectionWriteTimeout
        | ErrorCode::ConnectionLimitReached
        | ErrorCode::HttpResponseTimeout => TransportKind::Unreachable,
        ErrorCode::TlsProtocolError
        | ErrorCode::TlsCertificateError
        | ErrorCode::TlsAlertReceived(_) => TransportKind::Tls,
        ErrorCode::HttpRequestDenied | ErrorCode::DestinationIpProhibited => TransportKind::Denied,
        ErrorCode::InternalError(Some(message))
            if message.to_ascii_lowercase().contains("credential") =>
        {
            TransportKind::CredentialsUnavailable
        }
        _ => TransportKind::Other,
    };
    TransportError {
        kind,
        detail: format!("{code:?}"),
    }
}

fn stream_error(error: StreamError) -> TransportError {
    match error {
        StreamError::Closed => other("the stream closed early"),
        StreamError::LastOperationFailed(io_error) => {
            match crate::wasi::http::types::http_error_code(&io_error) {
                Some(code) => transport_error(&code),
                None => other(io_error.to_debug_string()),
            }
        }
    }
}

impl WasiIo {
    fn request(&self, request: &Request) -> Result<Response, TransportError> {
        let headers = Fields::new();
        let set = |name: &str, value: &str| {
            headers
                .set(name, &[value.as_bytes().to_vec()])
                .map_err(|error| other(format!("header {name}: {error:?}")))
        };
        set("accept", "application/json")?;
        let has_body = matches!(request.method, Method::Post | Method::Put);
        if let Some(content_type) = &request.content_type {
            set("content-type", content_type)?;
        }
        if has_body {
            // An exact length, as the Phase 0 curl upload sent (F12); pveproxy never saw chunked.
            set("content-length", &request.body.len().to_string())?;
        }
        let outgoing = OutgoingRequest::new(headers);
        let method = match request.method {
            Method::Get => WasiMethod::Get,
            Method::Post => WasiMethod::Post,
            Method::Put => WasiMethod::Put,
            Method::Delete => WasiMethod::Delete,
        };
        outgoing
            .set_method(&method)
            .map_err(|()| other("the host refused the method"))?;
        outgoing
            .set_scheme(Some(&Scheme::Https))
            .map_err(|()| other("the host refused https"))?;
        outgoing
            .set_authority(Some(&self.authority))
            .map_err(|()| other("the host refused the authority"))?;
        outgoing
            .set_path_with_query(Some(&request.path))
            .map_err(|()| other("the host refused the path"))?;
        let body = outgoing
            .body()
            .map_err(|()| other("the request body was already taken"))?;
        let future =
            outgoing_handler::handle(outgoing, None).map_err(|code| transport_error(&code))?;
        if has_body {
            let stream = body
                .write()
                .map_err(|()| other("the body stream was already taken"))?;
            let written = write_all(&stream, &request.body);
            drop(stream);
            if let Err(error) = written {
                // The host stops taking the body when the request failed: its reason is in the
                // response future, and says more than a closed stream.
                drop(body);
                return Err(match wait_response(&future) {
                    Err(reason) => reason,
                    Ok(_) => error,
                });
            }
        }
        OutgoingBody::finish(body, None).map_err(|code| transport_error(&code))?;
        let response = wait_response(&future)?;
        let status = response.status();
        let body = read_body(response)?;
        Ok(Response { status, body })
    }
}

/// Block until the response (or the reason there is none) arrives.
fn wait_response(future: &FutureIncomingResponse) -> Result<IncomingResponse, TransportError> {
    loop {
        match future.get() {
            Some(Ok(Ok(response))) => return Ok(response),
            Some(Ok(Err(code))) => return Err(transport_error(&code)),
            Some(Err(())) => return Err(other("the response was already taken")),
            None => future.subscribe().block(),
        }
    }
}

/// Write `bytes` as fast as the host's `check-write` permits, then flush. (`blocking-write-and-
/// flush` takes at most 4096 bytes per call: a seed ISO in one 64 KiB call trapped, found by the
/// end-to-end tests.)
fn write_all(stream: &OutputStream, mut bytes: &[u8]) -> Result<(), TransportError> {
    while !bytes.is_empty() {
        let permitted = stream.check_write().map_err(stream_error)?;
        if permitted == 0 {
            stream.subscribe().block();
            continue;
        }
        let (now, rest) = bytes.split_at(bytes.len().min(permitted as usize));
        stream.write(now).map_err(stream_error)?;
        bytes = rest;
    }
    match stream.blocking_flush() {
        // Every byte was taken, and the host stopped reading once the declared Content-Length
        // was complete: that is success, not a closed stream.
        Ok(()) | Err(StreamError::Closed) => Ok(()),
        Err(error) => Err(stream_error(error)),
    }
}

fn read_body(response: IncomingResponse) -> Result<Vec<u8>, TransportError> {
    let body = response
        .consume()
        .map_err(|()| other("the response body was already taken"))?;
    let stream = body
        .stream()
        .map_err(|()| other("the response stream was already taken"))?;
    let mut bytes = Vec::new();
    loop {
        match stream.blocking_read(CHUNK_BYTES) {
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break,
            Err(error) => return Err(stream_error(error)),
        }
        if bytes.len() > MAX_BODY_BYTES {
            return Err(other(format!(
                "response body larger than {MAX_BODY_BYTES} bytes"
            )));
        }
    }
    // Children before parents.
    drop(stream);
    drop(body);
    drop(response);
    Ok(bytes)
}

impl Io for WasiIo {
    fn send(&mut self, request: &Request) -> Result<Response, TransportError> {
        self.request(request)
    }

    fn sleep_ms(&mut self, milliseconds: u64) {
        if milliseconds > 0 {
            monotonic_clock::subscribe_duration(milliseconds.saturating_mul(1_000_000)).block();
        }
    }

    fn monotonic_ms(&mut self) -> u64 {
        monotonic_clock::now() / 1_000_000
    }

    fn now_rfc3339(&mut self) -> String {
        crate::mark::rfc3339(wall_clock::now().seconds)
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
