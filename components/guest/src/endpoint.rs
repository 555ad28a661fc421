//! A backend URL split the way `wasi:http` wants it: scheme, authority, base path.

/// `http` or `https`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// Where a provider's backend lives: `http(s)://host[:port][/base]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub scheme: Scheme,
    /// `host` or `host:port`.
    pub authority: String,
    /// The path every request path is appended to: empty or `/something`, never ending in `/`.
    pub base_path: String,
}

impl Endpoint {
    /// Parse `http(s)://host[:port][/path]`. No user info (credentials come from the host), no
    /// query, no fragment. The error says what is wrong without echoing the URL, which could carry
    /// a password in its user info.
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        let (scheme, rest) = if let Some(rest) = strip_prefix_ignore_case(url, "https://") {
            (Scheme::Https, rest)
        } else if let Some(rest) = strip_prefix_ignore_case(url, "http://") {
            (Scheme::Http, rest)
        } else {
            return Err("must start with http:// or https://".into());
        };
        if rest.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("must not contain spaces or control characters".into());
        }
        if rest.contains(['?', '#']) {
            return Err("must not have a query or fragment".into());
        }
        let (authority, path) = match rest.find('/') {
            Some(slash) => rest.split_at(slash),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err("must not carry user info: the host injects credentials".into());
        }
        check_authority(authority)?;
        Ok(Endpoint {
            scheme,
            authority: authority.to_string(),
            base_path: path.trim_end_matches('/').to_string(),
        })
    }

    /// The full path for a request, e.g. `/api/instances` for `path` `/instances`.
    pub fn path(&self, path: &str) -> String {
        format!("{}{path}", self.base_path)
    }
}

/// An endpoint reads from a configuration as its URL string, checked by [`Endpoint::parse`].
impl<'de> serde::Deserialize<'de> for Endpoint {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Endpoint, D::Error> {
        let url = String::deserialize(deserializer)?;
        Endpoint::parse(&url).map_err(|why| serde::de::Error::custom(format!("URL {why}")))
    }
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

/// A host (name, IPv4 or `[IPv6]`) with an optional numeric port.
fn check_authority(authority: &str) -> Result<(), String> {
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let close = bracketed.find(']').ok_or("has an unclosed `[`")?;
        let after = &bracketed[close + 1..];
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or("has text after `]`")?),
        };
        (&bracketed[..close], port)
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("has no host".into());
    }
    if let Some(port) = port
        && port.parse::<u16>().is_err()
    {
        return Err("has a port that is not a number from 0 to 65535".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_accepts_hosts_ports_and_ipv6() {
        let cases = [
            ("http://127.0.0.1:8080", Scheme::Http, "127.0.0.1:8080", ""),
            ("HTTPS://pve.example", Scheme::Https, "pve.example", ""),
            (
                "https://[::1]:8443/base//",
                Scheme::Https,
                "[::1]:8443",
                "/base",
            ),
            ("http://[fe80::1]", Scheme::Http, "[fe80::1]", ""),
        ];
        for (url, scheme, authority, base_path) in cases {
            let endpoint = Endpoint::parse(url).unwrap();
            assert_eq!(endpoint.scheme, scheme, "{url}");
            assert_eq!(endpoint.authority, authority, "{url}");
            assert_eq!(endpoint.base_path, base_path, "{url}");
        }
    }

    #[test]
    fn endpoint_rejects_what_wasi_http_cannot_take_or_should_not_see() {
        let cases = [
            ("ftp://host", "must start with http:// or https://"),
            ("host:8080", "must start with http:// or https://"),
            ("http://", "has no host"),
            ("http://:8080", "has no host"),
            ("http://host:99999", "port"),
            ("http://host:port", "port"),
            ("http://[::1", "unclosed"),
            ("http://[::1]x", "after `]`"),
            ("http://user:secret@host", "user info"),
            ("http://host/path?q=1", "query or fragment"),
            ("http://host/#top", "query or fragment"),
            ("http://ho st", "spaces"),
        ];
        for (url, why) in cases {
            let error = Endpoint::parse(url).expect_err(url);
            assert!(error.contains(why), "{url}: {error}");
            assert!(!error.contains("secret"), "{url}: {error}");
        }
    }

    #[test]
    fn request_paths_hang_off_the_base_path() {
        let endpoint = Endpoint::parse("https://pve/api/").unwrap();
        assert_eq!(endpoint.path("/instances"), "/api/instances");
        let bare = Endpoint::parse("https://pve").unwrap();
        assert_eq!(bare.path("/health"), "/health");
    }
}
