//! The contract's outcomes without the contract's bindings: a failed operation as a [`Problem`]
//! (class and message), a `check` answer as a [`Health`] (reason and message), and
//! [`contract_types!`](crate::contract_types) to turn both into the `error` and `check-result`
//! types a provider's `wit_bindgen::generate!` made, whatever contract version it binds.

use crate::endpoint::Endpoint;
use crate::errors::{ErrorClass, TransportError, TransportKind};
use crate::http::{Failure, Method, Request, Response, send};

/// How much of an error response body a message quotes: usually the server's own explanation.
const BODY_EXCERPT_BYTES: usize = 200;

/// A failed operation: the contract error class and a message for operators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub class: ErrorClass,
    pub message: String,
}

impl Problem {
    /// A problem of `class`.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Problem {
        Problem {
            class,
            message: message.into(),
        }
    }
}

impl Problem {
    /// A `permanent` problem: retrying cannot help.
    pub fn permanent(message: impl Into<String>) -> Problem {
        Problem::new(ErrorClass::Permanent, message)
    }

    /// A `not-found` problem: the thing does not exist.
    pub fn not_found(message: impl Into<String>) -> Problem {
        Problem::new(ErrorClass::NotFound, message)
    }
}

/// Parse a provider configuration (JSON) into `T`; a configuration that does not parse is
/// `permanent`, with serde's reason (which names the key, never echoes a value it refused).
pub fn config<T: serde::de::DeserializeOwned>(json: &str) -> Result<T, Problem> {
    serde_json::from_str(json)
        .map_err(|error| Problem::permanent(format!("invalid configuration: {error}")))
}

/// `GET` `path` below `endpoint` and decode the JSON answer; see [`call`].
pub fn get_json<T: serde::de::DeserializeOwned>(
    endpoint: &Endpoint,
    path: &str,
) -> Result<T, Problem> {
    call(&Request::new(Method::Get, endpoint, path))?.decode()
}

/// `POST` `path` below `endpoint`, with `body` as JSON or none (an action such as a start), and
/// decode the JSON answer; see [`call`].
pub fn post_json<T: serde::de::DeserializeOwned>(
    endpoint: &Endpoint,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<T, Problem> {
    let request = Request::new(Method::Post, endpoint, path);
    call(&match body {
        Some(body) => request.json(body),
        None => request,
    })?
    .decode()
}

/// The configuration of a provider whose backend is one URL and nothing else:
/// `{"url": "http(s)://host[:port][/base]"}`, unknown keys refused.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UrlConfig {
    pub url: Endpoint,
}

impl UrlConfig {
    /// Its JSON Schema, for `describe`.
    pub const SCHEMA: &str = r#"{"type":"object","required":["url"],"additionalProperties":false,"properties":{"url":{"type":"string","description":"http(s)://host[:port][/base] of the backend"}}}"#;

    /// The backend's endpoint in a configuration; one that does not parse is `permanent`.
    pub fn endpoint(json: &str) -> Result<Endpoint, Problem> {
        Ok(config::<UrlConfig>(json)?.url)
    }
}

impl From<Failure> for Problem {
    fn from(failure: Failure) -> Problem {
        let error = TransportError::from(failure);
        Problem::new(
            error.kind.class(),
            format!("request failed: {}", error.detail),
        )
    }
}

/// Send `request`; no response, or a non-2xx one, is the [`Problem`] of its class
/// ([`ErrorClass::of_status`]), quoting the start of the body.
pub fn call(request: &Request) -> Result<Response, Problem> {
    let response = send(request)?;
    match ErrorClass::of_status(response.status) {
        None => Ok(response),
        Some(class) => Err(Problem::new(
            class,
            format!("HTTP {}: {}", response.status, excerpt(&response.body)),
        )),
    }
}

impl Response {
    /// The body decoded as JSON; a body that is not the JSON expected is `transient` (a proxy's
    /// error page, a backend mid-upgrade).
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, Problem> {
        self.json()
            .map_err(|why| Problem::new(ErrorClass::Transient, why))
    }
}

/// The first bytes of a body as text (invalid UTF-8 replaced).
fn excerpt(body: &[u8]) -> String {
    String::from_utf8_lossy(&body[..body.len().min(BODY_EXCERPT_BYTES)]).into_owned()
}

/// The contract's `check-reason`s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Ok,
    Unreachable,
    Unauthorized,
    Forbidden,
    CertificateInvalid,
    CredentialsUnavailable,
    Misconfigured,
    Other,
}

impl Reason {
    /// The reason as the contract spells it (`certificate-invalid`), for log lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Ok => "ok",
            Reason::Unreachable => "unreachable",
            Reason::Unauthorized => "unauthorized",
            Reason::Forbidden => "forbidden",
            Reason::CertificateInvalid => "certificate-invalid",
            Reason::CredentialsUnavailable => "credentials-unavailable",
            Reason::Misconfigured => "misconfigured",
            Reason::Other => "other",
        }
    }
}

/// A `check` answer: a reason, never an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    pub reason: Reason,
    pub message: String,
}

/// A problem found before a health request could be sent (a configuration that does not parse)
/// is `misconfigured`.
impl From<Problem> for Health {
    fn from(problem: Problem) -> Health {
        Health {
            reason: Reason::Misconfigured,
            message: problem.message,
        }
    }
}

/// Send a health request and answer why it did or did not work: 2xx `ok`, 401 `unauthorized`,
/// 403 `forbidden`, 404 `misconfigured` (wrong base path), others `other`; no response by its
/// kind (unreachable, certificate, credentials unavailable, the broker's denial as
/// `misconfigured`: the grant does not cover the configured URL).
pub fn check(request: &Request) -> Health {
    let (reason, message) = match send(request) {
        Ok(response) => {
            let reason = match response.status {
                200..=299 => Reason::Ok,
                401 => Reason::Unauthorized,
                403 => Reason::Forbidden,
                404 => Reason::Misconfigured,
                _ => Reason::Other,
            };
            (
                reason,
                format!("HTTP {}: {}", response.status, excerpt(&response.body)),
            )
        }
        Err(failure) => {
            let error = TransportError::from(failure);
            let reason = match error.kind {
                TransportKind::Unreachable => Reason::Unreachable,
                TransportKind::Tls => Reason::CertificateInvalid,
                TransportKind::CredentialsUnavailable => Reason::CredentialsUnavailable,
                TransportKind::Denied => Reason::Misconfigured,
                TransportKind::Other => Reason::Other,
            };
            (reason, format!("request failed: {}", error.detail))
        }
    };
    Health { reason, message }
}

/// Implement `From<Problem>` for the contract's `error` and `From<Health>` for its `check-result`,
/// given the path of the `types` module your `wit_bindgen::generate!` made, so `?` turns a
/// [`Problem`] into your operation's error, and `as_str` on its `check-reason` (and, with
/// `vm-state` from contract 0.2.0, on its `vm-state`) for log lines:
///
/// ```text
/// wit_bindgen::generate!({ path: "contract-wit", world: "provider-world", generate_all });
/// egress_guest::contract_types!(crate::egress::provider::types);
/// // A 0.2.0 provider:
/// egress_guest::contract_types!(crate::egress::provider::types, vm-state);
/// // A 0.1.0 provider, with `InstanceState::from_name`, `Instance::marked` and `Description::http`:
/// egress_guest::contract_types!(crate::egress::provider::types, instance);
/// ```
#[macro_export]
macro_rules! contract_types {
    ($($types:ident)::+, vm-state) => {
        $crate::contract_types!($($types)::+);

        impl $($types)::+::VmState {
            /// The state as the contract spells it (`provisioning`), for log lines.
            pub fn as_str(self) -> &'static str {
                use $($types)::+::VmState;
                match self {
                    VmState::Provisioning => "provisioning",
                    VmState::Running => "running",
                    VmState::Stopped => "stopped",
                    VmState::Failed => "failed",
                    VmState::Paused => "paused",
                }
            }
        }
    };
    ($($types:ident)::+, instance) => {
        $crate::contract_types!($($types)::+);

        impl $($types)::+::InstanceState {
            /// The state the contract names `name` (`running`), if it names one.
            pub fn from_name(name: &str) -> Option<Self> {
                use $($types)::+::InstanceState;
                match name {
                    "provisioning" => Some(InstanceState::Provisioning),
                    "running" => Some(InstanceState::Running),
                    "stopped" => Some(InstanceState::Stopped),
                    "failed" => Some(InstanceState::Failed),
                    _ => None,
                }
            }
        }

        impl $($types)::+::Instance {
            /// A VM as an instance: its `uid` and `created-at` read back from its ownership
            /// `mark`; a VM without one is not ours, `not-found`.
            pub fn marked(
                provider_id: String,
                name: String,
                state: $($types)::+::InstanceState,
                addresses: Vec<String>,
                mark: Option<$crate::Mark>,
            ) -> Result<Self, $crate::Problem> {
                let Some($crate::Mark { uid, created_at, .. }) = mark else {
                    return Err($crate::Problem::not_found(format!("VM `{name}` is not ours")));
                };
                Ok(Self { provider_id, name, state, addresses, created_at, uid })
            }
        }

        impl $($types)::+::Description {
            /// What a provider of contract 0.1.0 over HTTP says about itself.
            pub fn http(name: &str, version: &str, config_schema: &str) -> Self {
                Self {
                    name: name.into(),
                    version: version.into(),
                    contract_version: "0.1.0".into(),
                    config_schema: config_schema.into(),
                    capabilities: vec![$($types)::+::Capability::Http],
                }
            }
        }
    };
    ($($types:ident)::+) => {
        impl $($types)::+::CheckReason {
            /// The reason as the contract spells it (`certificate-invalid`), for log lines.
            pub fn as_str(self) -> &'static str {
                $crate::Reason::from(self).as_str()
            }
        }

        impl ::core::convert::From<$($types)::+::CheckReason> for $crate::Reason {
            fn from(reason: $($types)::+::CheckReason) -> Self {
                use $($types)::+::CheckReason;
                match reason {
                    CheckReason::Ok => $crate::Reason::Ok,
                    CheckReason::Unreachable => $crate::Reason::Unreachable,
                    CheckReason::Unauthorized => $crate::Reason::Unauthorized,
                    CheckReason::Forbidden => $crate::Reason::Forbidden,
                    CheckReason::CertificateInvalid => $crate::Reason::CertificateInvalid,
                    CheckReason::CredentialsUnavailable => $crate::Reason::CredentialsUnavailable,
                    CheckReason::Misconfigured => $crate::Reason::Misconfigured,
                    CheckReason::Other => $crate::Reason::Other,
                }
            }
        }

        impl ::core::convert::From<$crate::Problem> for $($types)::+::Error {
            fn from(problem: $crate::Problem) -> Self {
                match problem.class {
                    $crate::ErrorClass::Transient => Self::Transient(problem.message),
                    $crate::ErrorClass::Permanent => Self::Permanent(problem.message),
                    $crate::ErrorClass::NotFound => Self::NotFound(problem.message),
                    $crate::ErrorClass::QuotaExceeded => Self::QuotaExceeded(problem.message),
                }
            }
        }

        impl ::core::convert::From<$crate::Health> for $($types)::+::CheckResult {
            fn from(health: $crate::Health) -> Self {
                use $($types)::+::CheckReason;
                let reason = match health.reason {
                    $crate::Reason::Ok => CheckReason::Ok,
                    $crate::Reason::Unreachable => CheckReason::Unreachable,
                    $crate::Reason::Unauthorized => CheckReason::Unauthorized,
                    $crate::Reason::Forbidden => CheckReason::Forbidden,
                    $crate::Reason::CertificateInvalid => CheckReason::CertificateInvalid,
                    $crate::Reason::CredentialsUnavailable => CheckReason::CredentialsUnavailable,
                    $crate::Reason::Misconfigured => CheckReason::Misconfigured,
                    $crate::Reason::Other => CheckReason::Other,
                };
                Self { reason, message: health.message }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{ErrorCode, HeaderError};

    #[test]
    fn failures_become_problems_of_their_class() {
        let refused = Problem::from(Failure::Transport(ErrorCode::ConnectionRefused));
        assert_eq!(refused.class, ErrorClass::Transient);
        assert!(
            refused.message.contains("ConnectionRefused"),
            "{}",
            refused.message
        );
        let denied = Problem::from(Failure::Transport(ErrorCode::HttpRequestDenied));
        assert_eq!(denied.class, ErrorClass::Permanent);
        let header = Problem::from(Failure::HeaderRefused {
            name: "authorization".into(),
            error: HeaderError::Forbidden,
        });
        assert!(
            header.message.contains("authorization"),
            "{}",
            header.message
        );
    }

    #[test]
    fn a_configuration_that_does_not_parse_is_permanent_and_names_the_key() {
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)] // Only parsed.
        struct Config {
            url: Endpoint,
        }
        let problem = config::<Config>(r#"{"url":"http://a","nope":1}"#).unwrap_err();
        assert_eq!(problem.class, ErrorClass::Permanent);
        assert!(problem.message.contains("nope"), "{}", problem.message);
        let secret = config::<Config>(r#"{"url":"http://root:hunter2@a"}"#).unwrap_err();
        assert!(secret.message.contains("user info"), "{}", secret.message);
        assert!(!secret.message.contains("hunter2"), "{}", secret.message);
        assert!(config::<Config>(r#"{"url":"http://a:8080/base"}"#).is_ok());
    }

    #[test]
    fn a_url_configuration_is_the_url_and_its_schema_says_so() {
        let endpoint = UrlConfig::endpoint(r#"{"url":"https://a:8443/v1"}"#).unwrap();
        assert_eq!(
            (endpoint.authority.as_str(), endpoint.path("/vms")),
            ("a:8443", "/v1/vms".into())
        );
        for refused in [
            "{}",
            r#"{"url":"ftp://a"}"#,
            r#"{"url":"http://a","extra":1}"#,
        ] {
            assert_eq!(
                UrlConfig::endpoint(refused).unwrap_err().class,
                ErrorClass::Permanent
            );
        }
        let schema: serde_json::Value = serde_json::from_str(UrlConfig::SCHEMA).unwrap();
        assert_eq!(schema["required"], serde_json::json!(["url"]));
        assert_eq!(schema["additionalProperties"], false);
    }

    #[test]
    fn a_body_that_is_not_the_json_expected_is_transient() {
        let page = Response {
            status: 200,
            body: b"<html>maintenance</html>".to_vec(),
        };
        let problem = page.decode::<Vec<String>>().unwrap_err();
        assert_eq!(problem.class, ErrorClass::Transient);
    }

    #[test]
    fn excerpts_stop_at_200_bytes_and_survive_a_cut_character() {
        let body = format!("{}é{}", "a".repeat(BODY_EXCERPT_BYTES - 1), "TAIL");
        let text = excerpt(body.as_bytes());
        assert!(text.starts_with(&"a".repeat(BODY_EXCERPT_BYTES - 1)));
        assert!(
            text.ends_with('\u{FFFD}') && !text.contains("TAIL"),
            "{text}"
        );
    }
}
