//! The whole `wasi:http` client: one function, [`send`], that makes a request and reads the
//! entire response body.
//!
//! Every request goes through the host's egress broker, which decides whether it may leave and
//! adds the credentials. So this code never sets `Authorization` itself; the only exception is
//! the test-only `debugSendAuthorization` setting, which exists to prove the host refuses it.

use crate::config::{Endpoint, UrlScheme};
use crate::egress::provider::types::{CheckReason, CheckResult, Error};
use crate::status;
use crate::wasi::http::outgoing_handler;
use crate::wasi::http::types::{
    ErrorCode, Fields, HeaderError, IncomingResponse, Method, OutgoingBody, OutgoingRequest, Scheme,
};
use crate::wasi::io::streams::StreamError;

/// The largest response body read; an endpoint answering more is treated as broken.
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// How much to write or read per stream call.
const CHUNK_BYTES: u64 = 64 * 1024;

/// A response: its status and its whole body.
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Why a request got no usable response.
#[derive(Debug)]
pub enum Failure {
    /// The host or the network refused or broke the request (see `status::transport_error`).
    Transport(ErrorCode),
    /// The host refused a header the guest tried to set. This is what a guest sees when it tries
    /// to set `Authorization` and the host forbids it.
    HeaderRefused {
        name: &'static str,
        error: HeaderError,
    },
    /// Anything else that went wrong on our side of the request.
    Other(String),
}

impl Failure {
    /// The contract error an operation answers for this failure.
    pub fn into_error(self) -> Error {
        match self {
            Failure::Transport(code) => status::transport_error(&code),
            Failure::HeaderRefused { name, error } => Error::Permanent(header_refused(name, error)),
            Failure::Other(message) => Error::Transient(message),
        }
    }

    /// The result `check` answers for this failure.
    pub fn into_check(self) -> CheckResult {
        match self {
            Failure::Transport(code) => status::transport_check(&code),
            Failure::HeaderRefused { name, error } => CheckResult {
                reason: CheckReason::Other,
                message: header_refused(name, error),
            },
            Failure::Other(message) => CheckResult {
                reason: CheckReason::Other,
                message,
            },
        }
    }
}

fn header_refused(name: &str, error: HeaderError) -> String {
    let why = match error {
        HeaderError::Forbidden => "the host forbids guests to set it",
        HeaderError::InvalidSyntax => "its name or value is not valid",
        HeaderError::Immutable => "the headers were already sent",
    };
    format!("could not set header `{name}`: {why}")
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

/// A request to make: method, path below the endpoint, optional JSON body.
pub struct Request<'a> {
    pub method: Method,
    /// Path and query below the endpoint's base path, e.g. `/instances?tag=a%3Db`.
    pub path: &'a str,
    pub json_body: Option<Vec<u8>>,
    /// TEST ONLY: an `Authorization` value to try to send (see `Config::debug_send_authorization`).
    pub debug_authorization: Option<&'a str>,
}

/// Send `request` to `endpoint` and wait for the whole response.
pub fn send(endpoint: &Endpoint, request: Request<'_>) -> Result<Response, Failure> {
    let headers = Fields::new();
    set_header(&headers, "accept", b"application/json")?;
    if request.json_body.is_some() {
        set_header(&headers, "content-type", b"application/json")?;
    }
    // Say how long the body is (0 when there is none) for every method that may carry one:
    // otherwise the host streams it chunked, which some APIs refuse.
    if !matches!(request.method, Method::Get | Method::Head) {
        let length = request.json_body.as_ref().map_or(0, Vec::len);
        set_header(&headers, "content-length", length.to_string().as_bytes())?;
    }
    if let Some(value) = request.debug_authorization {
        set_header(&headers, "authorization", value.as_bytes())?;
    }

    let outgoing = OutgoingRequest::new(headers);
    let scheme = match endpoint.scheme {
        UrlScheme::Http => Scheme::Http,
        UrlScheme::Https => Scheme::Https,
    };
    let path = endpoint.path(request.path);
    outgoing
        .set_method(&request.method)
        .map_err(|()| Failure::Other("the host rejected the request method".into()))?;
    outgoing
        .set_scheme(Some(&scheme))
        .map_err(|()| Failure::Other("the host rejected the URL scheme".into()))?;
    outgoing
        .set_authority(Some(&endpoint.authority))
        .map_err(|()| Failure::Other("the host rejected the endpoint authority".into()))?;
    outgoing
        .set_path_with_query(Some(&path))
        .map_err(|()| Failure::Other("the host rejected the request path".into()))?;
    let body = outgoing
        .body()
        .map_err(|()| Failure::Other("the request body was already taken".into()))?;

    // Hand the request to the host first, then stream the body: the host reads it as we write.
    let future_response = outgoing_handler::handle(outgoing, None).map_err(Failure::Transport)?;
    if let Some(bytes) = request.json_body {
        write_body(&body, &bytes)?;
    }
    OutgoingBody::finish(body, None).map_err(Failure::Transport)?;

    let response = loop {
        match future_response.get() {
            Some(Ok(Ok(response))) => break response,
            Some(Ok(Err(code))) => return Err(Failure::Transport(code)),
            Some(Err(())) => return Err(Failure::Other("the response was already taken".into())),
            // Not ready: wait without spinning until the host has the response headers.
            None => future_response.subscribe().block(),
        }
    };
    let status = response.status();
    let body = read_body(response)?;
    Ok(Response { status, body })
}

fn set_header(headers: &Fields, name: &'static str, value: &[u8]) -> Result<(), Failure> {
    headers
        .set(name, &[value.to_vec()])
        .map_err(|error| Failure::HeaderRefused { name, error })
}

fn write_body(body: &OutgoingBody, bytes: &[u8]) -> Result<(), Failure> {
    let stream = body
        .write()
        .map_err(|()| Failure::Other("the request body stream was already taken".into()))?;
    for chunk in bytes.chunks(CHUNK_BYTES as usize) {
        stream
            .blocking_write_and_flush(chunk)
            .map_err(stream_failure)?;
    }
    // The stream is a child of the body: it must be gone before the body is finished.
    drop(stream);
    Ok(())
}

fn read_body(response: IncomingResponse) -> Result<Vec<u8>, Failure> {
    let body = response
        .consume()
        .map_err(|()| Failure::Other("the response body was already taken".into()))?;
    let stream = body
        .stream()
        .map_err(|()| Failure::Other("the response body stream was already taken".into()))?;
    let mut bytes = Vec::new();
    loop {
        match stream.blocking_read(CHUNK_BYTES) {
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break,
            Err(error) => return Err(stream_failure(error)),
        }
        if bytes.len() > MAX_BODY_BYTES {
            return Err(Failure::Other(format!(
                "response body larger than {MAX_BODY_BYTES} bytes"
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
        StreamError::Closed => Failure::Other("the stream closed early".into()),
        StreamError::LastOperationFailed(io_error) => {
            match crate::wasi::http::types::http_error_code(&io_error) {
                Some(code) => Failure::Transport(code),
                None => Failure::Other(io_error.to_debug_string()),
            }
        }
    }
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
    fn a_forbidden_header_is_a_permanent_error_naming_the_header() {
        let failure = Failure::HeaderRefused {
            name: "authorization",
            error: HeaderError::Forbidden,
        };
        match failure.into_error() {
            Error::Permanent(message) => {
                assert!(message.contains("`authorization`"), "{message}");
                assert!(message.contains("forbids"), "{message}");
            }
            other => panic!("expected permanent, got {other:?}"),
        }
    }

    #[test]
    fn failures_map_to_check_reasons() {
        let refused = Failure::Transport(ErrorCode::ConnectionRefused).into_check();
        assert_eq!(refused.reason, CheckReason::Unreachable);
        let header = Failure::HeaderRefused {
            name: "authorization",
            error: HeaderError::Forbidden,
        };
        assert_eq!(header.into_check().reason, CheckReason::Other);
        let other = Failure::Other("the stream closed early".into()).into_check();
        assert_eq!(
            (other.reason, other.message.as_str()),
            (CheckReason::Other, "the stream closed early")
        );
    }

    #[test]
    fn other_failures_are_transient() {
        assert!(matches!(Failure::Other("x".into()).into_error(), Error::Transient(m) if m == "x"));
    }
}
