//! A request through `wasi:http`: the body streamed in pieces the host accepts, the response read
//! in large reads.

use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    Fields, FutureIncomingResponse, IncomingResponse, OutgoingBody, OutgoingRequest,
    Scheme as WasiScheme,
};
use wasip2::io::streams::{OutputStream, StreamError};

use super::{Failure, Method, Request, Response};
use crate::endpoint::Scheme;

/// How much one read of the response body asks for. The host hands over what it has, up to this:
/// large reads keep the number of calls across the sandbox boundary small.
const READ_BYTES: u64 = 1024 * 1024;

fn other(message: &str) -> Failure {
    Failure::Other(message.to_string())
}

/// Send `request` through `wasi:http` and wait for the whole response.
pub(super) fn send(request: &Request) -> Result<Response, Failure> {
    let headers = Fields::new();
    for (name, value) in &request.headers {
        set_header(&headers, name, value)?;
    }
    let length = match (&request.body, &request.method) {
        (Some(body), _) => Some(body.len()),
        (None, Method::Get | Method::Head) => None,
        (None, _) => Some(0),
    };
    if let Some(length) = length {
        set_header(&headers, "content-length", length.to_string().as_bytes())?;
    }

    let outgoing = OutgoingRequest::new(headers);
    let scheme = match request.scheme {
        Scheme::Http => WasiScheme::Http,
        Scheme::Https => WasiScheme::Https,
    };
    outgoing
        .set_method(&request.method)
        .map_err(|()| other("the host rejected the request method"))?;
    outgoing
        .set_scheme(Some(&scheme))
        .map_err(|()| other("the host rejected the URL scheme"))?;
    outgoing
        .set_authority(Some(&request.authority))
        .map_err(|()| other("the host rejected the endpoint authority"))?;
    outgoing
        .set_path_with_query(Some(&request.path_with_query))
        .map_err(|()| other("the host rejected the request path"))?;
    // A request without body bytes takes no body resource: the host sends its headers alone and
    // never waits for a body to end, and the guest saves the resource and two host calls.
    let body = match request.body.as_deref().filter(|bytes| !bytes.is_empty()) {
        Some(bytes) => Some((
            outgoing
                .body()
                .map_err(|()| other("the request body was already taken"))?,
            bytes,
        )),
        None => None,
    };

    // Hand the request to the host first, then stream the body: the host reads it as we write.
    let future = outgoing_handler::handle(outgoing, None).map_err(Failure::Transport)?;
    if let Some((body, bytes)) = body {
        let stream = body
            .write()
            .map_err(|()| other("the request body stream was already taken"))?;
        let written = write_all(&stream, bytes);
        // The stream is a child of the body: it must be gone before the body is finished.
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
        OutgoingBody::finish(body, None).map_err(Failure::Transport)?;
    }
    let response = wait_response(&future)?;
    let status = response.status();
    let body = read_body(response, request.max_response_bytes)?;
    Ok(Response { status, body })
}

fn set_header(headers: &Fields, name: &str, value: &[u8]) -> Result<(), Failure> {
    headers
        .set(name, &[value.to_vec()])
        .map_err(|error| Failure::HeaderRefused {
            name: name.to_string(),
            error,
        })
}

/// Block until the response headers (or the reason there are none) arrive.
fn wait_response(future: &FutureIncomingResponse) -> Result<IncomingResponse, Failure> {
    loop {
        match future.get() {
            Some(Ok(Ok(response))) => return Ok(response),
            Some(Ok(Err(code))) => return Err(Failure::Transport(code)),
            Some(Err(())) => return Err(other("the response was already taken")),
            // Not ready: wait on the pollable, never spin.
            None => future.subscribe().block(),
        }
    }
}

/// Write `bytes` in pieces no larger than the host's `check-write` permits, then flush.
/// (`blocking-write-and-flush` takes at most 4,096 bytes per call: a body written in one 64 KiB
/// call traps the instance, which the reference and Proxmox providers both once did.)
fn write_all(stream: &OutputStream, mut bytes: &[u8]) -> Result<(), Failure> {
    while !bytes.is_empty() {
        let permitted = stream.check_write().map_err(stream_failure)?;
        if permitted == 0 {
            stream.subscribe().block();
            continue;
        }
        let (now, rest) = bytes.split_at(bytes.len().min(permitted as usize));
        stream.write(now).map_err(stream_failure)?;
        bytes = rest;
    }
    match stream.blocking_flush() {
        // Every byte was taken, and the host stopped reading once the declared Content-Length
        // was complete: that is success, not a closed stream.
        Ok(()) | Err(StreamError::Closed) => Ok(()),
        Err(error) => Err(stream_failure(error)),
    }
}

fn read_body(response: IncomingResponse, max_bytes: usize) -> Result<Vec<u8>, Failure> {
    let body = response
        .consume()
        .map_err(|()| other("the response body was already taken"))?;
    let stream = body
        .stream()
        .map_err(|()| other("the response body stream was already taken"))?;
    let mut bytes = Vec::new();
    loop {
        match stream.blocking_read(READ_BYTES) {
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break,
            Err(error) => return Err(stream_failure(error)),
        }
        if bytes.len() > max_bytes {
            return Err(Failure::Other(format!(
                "response body larger than {max_bytes} bytes"
            )));
        }
    }
    // Children before parents: the stream, then the body, then the response.
    drop(stream);
    drop(body);
    drop(response);
    Ok(bytes)
}

/// A failed stream operation, as the `wasi:http` error code behind it when there is one.
fn stream_failure(error: StreamError) -> Failure {
    match error {
        StreamError::Closed => other("the stream closed early"),
        StreamError::LastOperationFailed(io_error) => {
            match wasip2::http::types::http_error_code(&io_error) {
                Some(code) => Failure::Transport(code),
                None => Failure::Other(io_error.to_debug_string()),
            }
        }
    }
}
