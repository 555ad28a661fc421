//! The whole `wasi:http` client: [`send`] makes one request through the host's egress broker and
//! reads the entire response.

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;
use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    Fields, FutureIncomingResponse, IncomingResponse, OutgoingBody, OutgoingRequest,
    Scheme as WasiScheme,
};
use wasip2::io::streams::{OutputStream, StreamError};

use crate::endpoint::{Endpoint, Scheme};

pub use wasip2::http::types::{ErrorCode, HeaderError, Method};

/// The default cap on a response body; an endpoint answering more is treated as broken.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// How much one read of the response body asks for. The host hands over what it has, up to this:
/// large reads keep the number of calls across the sandbox boundary small.
const READ_BYTES: u64 = 1024 * 1024;

/// A request to send.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: Method,
    pub scheme: Scheme,
    /// `host` or `host:port`.
    pub authority: String,
    /// The path and query, starting with `/`.
    pub path_with_query: String,
    /// Headers besides `content-length`, which [`send`] sets itself.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body, or `None` for none.
    pub body: Option<Vec<u8>>,
    /// The largest response body read before the request fails.
    pub max_response_bytes: usize,
}

impl Request {
    /// `method` on `path` below `endpoint`'s base path, asking for JSON (`accept:
    /// application/json`), with no body.
    pub fn new(method: Method, endpoint: &Endpoint, path: &str) -> Request {
        Request {
            method,
            scheme: endpoint.scheme,
            authority: endpoint.authority.clone(),
            path_with_query: endpoint.path(path),
            headers: vec![("accept".into(), b"application/json".to_vec())],
            body: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }

    /// Add a header. (`authorization` is the host's: its broker refuses it, see [`Failure`].)
    pub fn header(mut self, name: &str, value: impl Into<Vec<u8>>) -> Request {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    /// Send `bytes` as the body, of type `content_type`.
    pub fn body(mut self, content_type: &str, bytes: Vec<u8>) -> Request {
        self.body = Some(bytes);
        self.header("content-type", content_type)
    }

    /// Send `value` as a JSON body.
    pub fn json(self, value: &impl Serialize) -> Request {
        // Serializing plain data to a Vec cannot fail; a map with non-string keys would, and
        // then the body is `null` rather than a panic.
        let bytes = serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec());
        self.body("application/json", bytes)
    }

    /// Cap the response body at `bytes`.
    pub fn max_response_bytes(mut self, bytes: usize) -> Request {
        self.max_response_bytes = bytes;
        self
    }
}

/// A response: its status and its whole body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Response {
    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body decoded as JSON into `T`; the error says why, without quoting the body.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, String> {
        serde_json::from_slice(&self.body)
            .map_err(|error| format!("the response body is not the JSON expected: {error}"))
    }
}

/// Why a request got no response.
#[derive(Debug)]
pub enum Failure {
    /// The host or the network refused or broke the request: the broker's denial
    /// (`HTTP-request-denied`), DNS, refused connections, timeouts, TLS.
    Transport(ErrorCode),
    /// The host refused a header: what a guest sees when it sets `Authorization`.
    HeaderRefused { name: String, error: HeaderError },
    /// Anything else that went wrong on the guest's side of the request.
    Other(String),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Transport(code) => write!(f, "request failed: {code:?}"),
            Failure::HeaderRefused { name, error } => {
                let why = match error {
                    HeaderError::Forbidden => "the host forbids guests to set it",
                    HeaderError::InvalidSyntax => "its name or value is not valid",
                    HeaderError::Immutable => "the headers were already sent",
                };
                write!(f, "could not set header `{name}`: {why}")
            }
            Failure::Other(message) => f.write_str(message),
        }
    }
}

fn other(message: &str) -> Failure {
    Failure::Other(message.to_string())
}

/// Send `request` and wait for the whole response.
///
/// `content-length` is always exact: the body's length, or 0 for a method that may carry a body
/// but has none, so the host never streams a body chunked (some APIs refuse that).
pub fn send(request: &Request) -> Result<Response, Failure> {
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

/// The method's name on the wire, for log lines.
pub fn method_name(method: &Method) -> &str {
    match method {
        Method::Get => "GET",
        Method::Head => "HEAD",
        Method::Post => "POST",
        Method::Put => "PUT",
        Method::Delete => "DELETE",
        Method::Connect => "CONNECT",
        Method::Options => "OPTIONS",
        Method::Trace => "TRACE",
        Method::Patch => "PATCH",
        Method::Other(name) => name,
    }
}

/// Percent-encode `text` for use in a URL path segment or query value: everything except RFC 3986
/// unreserved characters (`A-Z a-z 0-9 - . _ ~`) becomes `%XX`.
pub fn percent_encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_names_are_the_wire_names() {
        assert_eq!(method_name(&Method::Post), "POST");
        assert_eq!(method_name(&Method::Delete), "DELETE");
        assert_eq!(method_name(&Method::Other("PROPFIND".into())), "PROPFIND");
    }

    #[test]
    fn percent_encoding_keeps_unreserved_characters() {
        assert_eq!(percent_encode("Proxy-1.a_b~"), "Proxy-1.a_b~");
    }

    #[test]
    fn percent_encoding_escapes_separators_and_non_ascii() {
        assert_eq!(percent_encode("a=b&c/d?e f"), "a%3Db%26c%2Fd%3Fe%20f");
        assert_eq!(percent_encode("é"), "%C3%A9");
        assert_eq!(percent_encode("%"), "%25");
    }

    #[test]
    fn a_request_asks_for_json_below_the_base_path() {
        let endpoint = Endpoint::parse("https://inventory.example:8443/v1").unwrap();
        let request = Request::new(Method::Post, &endpoint, "/items").json(&["a"]);
        assert_eq!(request.path_with_query, "/v1/items");
        assert_eq!(request.authority, "inventory.example:8443");
        assert_eq!(request.body.as_deref(), Some(&b"[\"a\"]"[..]));
        assert!(
            request
                .headers
                .contains(&("content-type".into(), b"application/json".to_vec()))
        );
        assert!(
            request
                .headers
                .contains(&("accept".into(), b"application/json".to_vec()))
        );
    }

    #[test]
    fn a_refused_header_names_the_header_and_why() {
        let failure = Failure::HeaderRefused {
            name: "authorization".into(),
            error: HeaderError::Forbidden,
        };
        let message = failure.to_string();
        assert!(message.contains("`authorization`"), "{message}");
        assert!(message.contains("forbids"), "{message}");
    }

    #[test]
    fn a_response_body_decodes_as_json() {
        let response = Response {
            status: 200,
            body: br#"{"id":"a"}"#.to_vec(),
        };
        assert!(response.is_success());
        let value: serde_json::Value = response.json().unwrap();
        assert_eq!(value["id"], "a");
        let broken = Response {
            status: 404,
            body: b"<html>".to_vec(),
        };
        assert!(!broken.is_success());
        assert!(broken.json::<serde_json::Value>().is_err());
    }
}
