//! The origin allowlist and the header screen.
//!
//! A request's URL is parsed once into an [`Origin`] (scheme, host, port with the scheme's
//! default filled in). That one value is checked against the grant, used to connect, and used to
//! decide what to inject: there is no second parse that could disagree with the first.

use std::fmt;

use http::header::{self, HeaderMap, HeaderName};
use http::uri::{Authority, Uri};

/// The URL schemes a grant can allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Plain HTTP; a grant never injects a credential over it.
    Http,
    /// HTTP over TLS, verified against the grant's CA only.
    Https,
}

impl Scheme {
    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// Scheme, host and port: the unit the allowlist is written in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Origin {
    scheme: Scheme,
    /// Lowercased; an IPv6 literal keeps its brackets, as in a URL.
    host: String,
    port: u16,
}

/// Why a request was denied. Shown in the host's log only; the guest sees `HTTP-request-denied`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denied {
    /// No grant for this provider.
    NoGrant,
    /// The grant is pinned to a component digest and this component has another.
    DigestMismatch,
    /// A method that reflects the request back by design (`TRACE`, `TRACK`) or tunnels
    /// (`CONNECT`).
    Method(http::Method),
    /// A header that asks for part of a response (`Range`, `If-Range`) on a credentialed
    /// request: parts of a reflected secret could be reassembled past redaction.
    PartialResponse(HeaderName),
    /// The URL has no usable scheme or authority.
    MalformedUrl(&'static str),
    /// The origin is not in the provider's grant.
    OriginNotAllowed,
    /// A `Host` header that names another authority than the URL.
    HostMismatch,
    /// A header only the host may set (credentials).
    ForbiddenHeader(HeaderName),
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denied::NoGrant => f.write_str("no grant for this provider"),
            Denied::DigestMismatch => {
                f.write_str("the grant is pinned to another component digest")
            }
            Denied::Method(method) => write!(f, "method {method} reflects or tunnels the request"),
            Denied::PartialResponse(name) => {
                write!(f, "header {name} asks for part of a credentialed response")
            }
            Denied::MalformedUrl(reason) => write!(f, "malformed URL: {reason}"),
            Denied::OriginNotAllowed => f.write_str("origin not in the grant"),
            Denied::HostMismatch => f.write_str("Host header differs from the URL's authority"),
            Denied::ForbiddenHeader(name) => {
                write!(f, "guest set header {name}, which only the host sets")
            }
        }
    }
}

impl Origin {
    /// Parses an origin as written in a grant: `scheme://host[:port]`, optionally with a `/`
    /// path, nothing else.
    pub fn parse_grant(text: &str) -> Result<Self, &'static str> {
        let uri: Uri = text.parse().map_err(|_| "not a URL")?;
        if uri
            .path_and_query()
            .is_some_and(|path| path.as_str() != "/")
        {
            return Err("an origin has no path or query");
        }
        Self::of_uri(&uri)
    }

    /// The origin of a request URL. Refuses a missing or unsupported scheme, a missing host and
    /// user information (`user@host`), which a grant never lists.
    pub fn of_uri(uri: &Uri) -> Result<Self, &'static str> {
        let scheme = match uri.scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("https") => Scheme::Https,
            Some(s) if s.eq_ignore_ascii_case("http") => Scheme::Http,
            Some(_) => return Err("scheme is not http or https"),
            None => return Err("no scheme"),
        };
        let authority = uri.authority().ok_or("no authority")?;
        Self::of_authority(scheme, authority)
    }

    fn of_authority(scheme: Scheme, authority: &Authority) -> Result<Self, &'static str> {
        if authority.as_str().contains('@') {
            return Err("user information in the authority");
        }
        let host = authority.host();
        if host.is_empty() {
            return Err("empty host");
        }
        // `Authority` accepts an empty port ("host:"); it means the default.
        let port = authority.port_u16().unwrap_or(scheme.default_port());
        Ok(Self {
            scheme,
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The host, lowercased; IPv6 literals in brackets.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The host as a name or address to resolve (IPv6 without brackets).
    pub fn host_for_lookup(&self) -> &str {
        self.host.trim_start_matches('[').trim_end_matches(']')
    }

    /// The port, the scheme's default when the URL has none.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `scheme://{host}:port/...` with `host` in place of the origin's host: the URL the broker
    /// sends, so the host can be the grant's `serverName`.
    pub fn url_with_host(&self, host: &str, path_and_query: &str) -> String {
        let path = if path_and_query.is_empty() {
            "/"
        } else {
            path_and_query
        };
        format!("{}://{}:{}{}", self.scheme.as_str(), host, self.port, path)
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}:{}", self.scheme.as_str(), self.host, self.port)
    }
}

/// The origins one grant allows.
#[derive(Clone, Debug)]
pub struct Allowlist {
    origins: Vec<Origin>,
}

impl Allowlist {
    /// An allowlist of exactly these origins.
    pub fn new(origins: Vec<Origin>) -> Self {
        Self { origins }
    }

    /// Where `origin` is in [`Allowlist::origins`], if it is allowed (scheme, host and port all
    /// equal).
    pub fn position(&self, origin: &Origin) -> Option<usize> {
        self.origins.iter().position(|allowed| allowed == origin)
    }
}

/// Headers that carry credentials: a guest may never set them, whatever its grant.
pub const CREDENTIAL_HEADERS: [HeaderName; 3] = [
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::COOKIE,
];

/// Methods never sent: `TRACE` and `TRACK` echo the request (with the injected credential) by
/// design, `CONNECT` would tunnel past the broker.
pub const REFUSED_METHODS: [&str; 3] = ["TRACE", "TRACK", "CONNECT"];

/// Whether `method` is one of [`REFUSED_METHODS`] (compared without case, as servers do).
pub fn refused_method(method: &http::Method) -> bool {
    REFUSED_METHODS
        .iter()
        .any(|refused| method.as_str().eq_ignore_ascii_case(refused))
}

/// Headers a guest may not send with a credentialed request: they ask for part of a response,
/// and parts of a reflected secret, each too short to recognise, could be put back together.
pub const PARTIAL_RESPONSE_HEADERS: [HeaderName; 2] = [header::RANGE, header::IF_RANGE];

/// Hop-by-hop headers the connection manages itself; wasi:http already forbids them, and the
/// broker drops any that get through rather than forward them.
const HOP_BY_HOP_HEADERS: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
];

/// Screens the guest's headers for a request to `origin`. Refuses a `Host` that names another
/// authority and any header in [`CREDENTIAL_HEADERS`] or `host_only` (the grant's injected
/// header); on a credentialed request, also [`PARTIAL_RESPONSE_HEADERS`], and it replaces any
/// `Accept-Encoding` with `identity` (a compressed echo of the credential would pass redaction and
/// be decompressed by the guest). Removes `Host` (the client sets it from the URL it connects to)
/// and hop-by-hop headers.
pub fn screen_headers(
    headers: &mut HeaderMap,
    origin: &Origin,
    host_only: &[HeaderName],
    credentialed: bool,
) -> Result<(), Denied> {
    for value in headers.get_all(header::HOST) {
        let authority: Authority = value
            .to_str()
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or(Denied::HostMismatch)?;
        match Origin::of_authority(origin.scheme, &authority) {
            Ok(claimed) if claimed == *origin => {}
            _ => return Err(Denied::HostMismatch),
        }
    }
    if let Some(name) = CREDENTIAL_HEADERS
        .iter()
        .chain(host_only)
        .find(|name| headers.contains_key(*name))
    {
        return Err(Denied::ForbiddenHeader(name.clone()));
    }
    if credentialed {
        if let Some(name) = PARTIAL_RESPONSE_HEADERS
            .iter()
            .find(|name| headers.contains_key(*name))
        {
            return Err(Denied::PartialResponse(name.clone()));
        }
        headers.insert(
            header::ACCEPT_ENCODING,
            http::HeaderValue::from_static("identity"),
        );
    }
    headers.remove(header::HOST);
    for name in HOP_BY_HOP_HEADERS {
        headers.remove(name);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn origin(text: &str) -> Origin {
        Origin::of_uri(&text.parse().unwrap()).unwrap()
    }

    #[test]
    fn default_ports_are_filled_in_so_explicit_and_implicit_compare_equal() {
        assert_eq!(origin("https://h/x"), origin("https://H:443/y"));
        assert_eq!(origin("http://h/"), origin("http://h:80/"));
        assert_ne!(origin("https://h/"), origin("http://h:443/"));
        assert_eq!(origin("https://[::1]:8006/").host_for_lookup(), "::1");
    }

    #[test]
    fn grant_origins_refuse_paths_userinfo_and_other_schemes() {
        assert!(Origin::parse_grant("https://127.0.0.1:8006").is_ok());
        assert!(Origin::parse_grant("https://127.0.0.1:8006/").is_ok());
        assert!(Origin::parse_grant("https://127.0.0.1:8006/api2").is_err());
        assert!(Origin::parse_grant("https://u:p@127.0.0.1:8006").is_err());
        assert!(Origin::parse_grant("ftp://127.0.0.1").is_err());
        assert!(Origin::parse_grant("127.0.0.1:8006").is_err());
    }

    #[test]
    fn request_origin_refuses_userinfo() {
        let uri: Uri = "https://evil@127.0.0.1:8006/".parse().unwrap();
        assert!(Origin::of_uri(&uri).is_err());
    }

    #[test]
    fn host_header_must_name_the_url_authority() {
        let target = origin("https://127.0.0.1:8006/");
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8006"));
        assert_eq!(screen_headers(&mut headers, &target, &[], false), Ok(()));
        assert!(
            headers.get(header::HOST).is_none(),
            "Host is left to the client"
        );

        for smuggled in [
            "other.example:8006",
            "127.0.0.1",
            "127.0.0.1:9",
            "a@127.0.0.1:8006",
            "",
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, HeaderValue::from_str(smuggled).unwrap());
            assert_eq!(
                screen_headers(&mut headers, &target, &[], false),
                Err(Denied::HostMismatch),
                "{smuggled:?}"
            );
        }
    }

    #[test]
    fn credential_and_grant_headers_are_refused() {
        let target = origin("https://h/");
        for name in [
            "authorization",
            "proxy-authorization",
            "cookie",
            "x-api-key",
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(HeaderName::from_static(name), HeaderValue::from_static("v"));
            let denied = screen_headers(
                &mut headers,
                &target,
                &[HeaderName::from_static("x-api-key")],
                false,
            );
            assert_eq!(
                denied,
                Err(Denied::ForbiddenHeader(HeaderName::from_static(name)))
            );
        }
    }

    #[test]
    fn credentialed_requests_get_identity_encoding_and_no_ranges() {
        let target = origin("https://h/");
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("gzip, br"),
        );
        assert_eq!(screen_headers(&mut headers, &target, &[], true), Ok(()));
        assert_eq!(headers[header::ACCEPT_ENCODING], "identity");
        // Without a credential the guest's choice stands.
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        assert_eq!(screen_headers(&mut headers, &target, &[], false), Ok(()));
        assert_eq!(headers[header::ACCEPT_ENCODING], "gzip");

        for name in PARTIAL_RESPONSE_HEADERS {
            let mut headers = HeaderMap::new();
            headers.insert(name.clone(), HeaderValue::from_static("bytes=0-9"));
            assert_eq!(
                screen_headers(&mut headers, &target, &[], true),
                Err(Denied::PartialResponse(name.clone()))
            );
            assert_eq!(screen_headers(&mut headers, &target, &[], false), Ok(()));
        }
    }

    #[test]
    fn reflecting_and_tunnelling_methods_are_refused_in_any_case() {
        for method in ["TRACE", "trace", "TRACK", "CONNECT"] {
            let method = http::Method::from_bytes(method.as_bytes()).unwrap();
            assert!(refused_method(&method), "{method}");
        }
        for method in [http::Method::GET, http::Method::POST, http::Method::DELETE] {
            assert!(!refused_method(&method), "{method}");
        }
    }
}
