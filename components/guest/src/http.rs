//! The whole HTTP client: [`send`] makes one request through the host's egress broker and reads
//! the entire response, by the broker's whole-exchange call (`exchange`) or by `wasi:http`
//! (`wasi`).

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::endpoint::{Endpoint, Scheme};

pub use wasip2::http::types::{ErrorCode, HeaderError, Method};

#[cfg(not(feature = "wasi-http-only"))]
mod exchange;
mod wasi;

/// The default cap on a response body; an endpoint answering more is treated as broken. (The host
/// holds an exchange's response whole, within the call's transfer budget of 8 MiB by default.)
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;

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

/// Send `request` and wait for the whole response.
///
/// `content-length` is always exact: the body's length, or 0 for a method that may carry a body
/// but has none, so the host never streams a body chunked (some APIs refuse that). A request
/// whose body is at most [`STREAM_ABOVE`] goes through the host's whole-exchange call
/// (`egress:http-broker/exchange`), one call into the host; a larger body is streamed through
/// `wasi:http`, as is every request when the crate is built with its `wasi-http-only` feature (for
/// a host that predates `egress:http-broker@0.2.0`).
pub fn send(request: &Request) -> Result<Response, Failure> {
    #[cfg(not(feature = "wasi-http-only"))]
    if request.body.as_ref().map_or(0, Vec::len) <= STREAM_ABOVE {
        return exchange::send(request);
    }
    wasi::send(request)
}

/// The largest request body sent whole through the exchange call; a larger one is streamed
/// through `wasi:http`. (The host lifts an exchange's arguments whole, within the call's transfer
/// budget of 8 MiB by default.)
pub const STREAM_ABOVE: usize = 1 << 20;

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
