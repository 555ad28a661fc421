//! What an HTTP outcome means for the contract: statuses and `wasi:http` error codes become
//! contract errors (for operations, statuses by `egress_guest::ErrorClass::of_status`) or check
//! results (for `check`).
//!
//! The error class is what the operator acts on, so the rules are deliberate:
//!
//! | outcome                                   | operation error   | check reason          |
//! |-------------------------------------------|-------------------|-----------------------|
//! | 2xx                                       | (success)         | `ok`                  |
//! | 404                                       | `not-found`       | `misconfigured`       |
//! | 401                                       | `permanent`       | `unauthorized`        |
//! | 403                                       | `permanent`       | `forbidden`           |
//! | 408, 429, 5xx but 507                     | `transient`       | `other`               |
//! | 507                                       | `quota-exceeded`  | `other`               |
//! | other statuses                            | `permanent`       | `misconfigured`       |
//! | `HTTP-request-denied` (broker said no)    | `permanent`       | `other`               |
//! | DNS, connection refused, timeouts         | `transient`       | `unreachable`         |
//! | `TLS-certificate-error`                   | `permanent`       | `certificate-invalid` |
//! | any other error code                      | `transient`       | `other`               |
//!
//! Messages carry the first [`BODY_EXCERPT_BYTES`] bytes of an error response body, which is
//! usually the server's own explanation.

use crate::egress::provider::types::{CheckReason, CheckResult, Error};
use egress_guest::{ErrorClass, ErrorCode, Failure};

/// How much of an error response body a message quotes.
pub const BODY_EXCERPT_BYTES: usize = 200;

/// The error for a non-2xx response to an operation, or `None` for 2xx.
pub fn operation_error(status: u16, body: &[u8]) -> Option<Error> {
    let message = format!("endpoint answered HTTP {status}: {}", body_excerpt(body));
    ErrorClass::of_status(status).map(|class| contract_error(class, message))
}

/// The contract error of `class` with `message`.
pub fn contract_error(class: ErrorClass, message: String) -> Error {
    match class {
        ErrorClass::Transient => Error::Transient(message),
        ErrorClass::Permanent => Error::Permanent(message),
        ErrorClass::NotFound => Error::NotFound(message),
        ErrorClass::QuotaExceeded => Error::QuotaExceeded(message),
    }
}

/// The contract error an operation answers for a request that got no response. A header the
/// host refused (`Authorization`, which is the broker's) is `permanent`.
pub fn failure_error(failure: Failure) -> Error {
    match failure {
        Failure::Transport(code) => transport_error(&code),
        refused @ Failure::HeaderRefused { .. } => Error::Permanent(refused.to_string()),
        Failure::Other(message) => Error::Transient(message),
    }
}

/// The result `check` answers for a request that got no response.
pub fn failure_check(failure: Failure) -> CheckResult {
    match failure {
        Failure::Transport(code) => transport_check(&code),
        other => CheckResult {
            reason: CheckReason::Other,
            message: other.to_string(),
        },
    }
}

/// The check result for the response to the health request.
pub fn check_result(status: u16, body: &[u8]) -> CheckResult {
    let reason = match status {
        200..=299 => {
            return CheckResult {
                reason: CheckReason::Ok,
                message: format!("endpoint healthy (HTTP {status})"),
            };
        }
        401 => CheckReason::Unauthorized,
        403 => CheckReason::Forbidden,
        429 | 500..=599 => CheckReason::Other,
        _ => CheckReason::Misconfigured,
    };
    CheckResult {
        reason,
        message: format!("endpoint answered HTTP {status}: {}", body_excerpt(body)),
    }
}

/// The `internal-error` detail the host's broker sends when it cannot read the credentials it
/// injects: the provider can do nothing about it but report it.
pub const CREDENTIALS_UNAVAILABLE: &str = "credentials-unavailable";

/// The error for a request that got no response.
pub fn transport_error(code: &ErrorCode) -> Error {
    match code {
        ErrorCode::HttpRequestDenied => {
            Error::Permanent("egress denied: the host does not allow this request".to_string())
        }
        ErrorCode::TlsCertificateError => Error::Permanent(format!(
            "the endpoint's TLS certificate did not verify ({code:?})"
        )),
        _ => Error::Transient(format!("request failed: {code:?}")),
    }
}

/// The check result for a health request that got no response.
pub fn transport_check(code: &ErrorCode) -> CheckResult {
    let reason = match code {
        ErrorCode::DnsTimeout
        | ErrorCode::DnsError(_)
        | ErrorCode::DestinationNotFound
        | ErrorCode::DestinationUnavailable
        | ErrorCode::DestinationIpUnroutable
        | ErrorCode::ConnectionRefused
        | ErrorCode::ConnectionTimeout
        | ErrorCode::ConnectionReadTimeout
        | ErrorCode::ConnectionWriteTimeout
        | ErrorCode::HttpResponseTimeout => CheckReason::Unreachable,
        ErrorCode::TlsCertificateError => CheckReason::CertificateInvalid,
        // The broker's word for "I could not read the secret I inject" (docs/egress.md).
        ErrorCode::InternalError(Some(detail)) if detail == CREDENTIALS_UNAVAILABLE => {
            CheckReason::CredentialsUnavailable
        }
        _ => CheckReason::Other,
    };
    let message = match transport_error(code) {
        Error::Permanent(message) | Error::Transient(message) => message,
        Error::NotFound(message) | Error::QuotaExceeded(message) => message,
    };
    CheckResult { reason, message }
}

/// The first [`BODY_EXCERPT_BYTES`] bytes of a body as text (invalid UTF-8 replaced).
pub fn body_excerpt(body: &[u8]) -> String {
    String::from_utf8_lossy(&body[..body.len().min(BODY_EXCERPT_BYTES)]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_guest::HeaderError;
    use egress_guest::wasip2::http::types::DnsErrorPayload;

    fn class(error: &Option<Error>) -> &'static str {
        match error {
            None => "success",
            Some(Error::Transient(_)) => "transient",
            Some(Error::Permanent(_)) => "permanent",
            Some(Error::NotFound(_)) => "not-found",
            Some(Error::QuotaExceeded(_)) => "quota-exceeded",
        }
    }

    #[test]
    fn operation_statuses_map_to_error_classes() {
        let cases = [
            (200, "success"),
            (201, "success"),
            (204, "success"),
            (299, "success"),
            (404, "not-found"),
            (408, "transient"),
            (429, "transient"),
            (500, "transient"),
            (503, "transient"),
            (599, "transient"),
            (507, "quota-exceeded"),
            (400, "permanent"),
            (401, "permanent"),
            (403, "permanent"),
            (409, "permanent"),
            (302, "permanent"),
            (600, "permanent"),
        ];
        for (status, expected) in cases {
            assert_eq!(
                class(&operation_error(status, b"")),
                expected,
                "HTTP {status}"
            );
        }
    }

    #[test]
    fn check_statuses_map_to_reasons() {
        let cases = [
            (200, CheckReason::Ok),
            (204, CheckReason::Ok),
            (401, CheckReason::Unauthorized),
            (403, CheckReason::Forbidden),
            (404, CheckReason::Misconfigured),
            (400, CheckReason::Misconfigured),
            (429, CheckReason::Other),
            (502, CheckReason::Other),
        ];
        for (status, expected) in cases {
            let result = check_result(status, b"");
            assert_eq!(result.reason, expected, "HTTP {status}");
        }
    }

    #[test]
    fn error_messages_quote_the_first_200_bytes_of_the_body() {
        let body = format!("{}{}", "a".repeat(BODY_EXCERPT_BYTES), "TAIL");
        let check = check_result(401, body.as_bytes());
        assert!(
            check.message.contains(&"a".repeat(BODY_EXCERPT_BYTES)),
            "{}",
            check.message
        );
        assert!(!check.message.contains("TAIL"), "{}", check.message);
        assert!(check.message.contains("401"), "{}", check.message);

        match operation_error(500, b"node pve1 is locked") {
            Some(Error::Transient(message)) => assert!(message.contains("node pve1 is locked")),
            other => panic!("expected transient, got {other:?}"),
        }
    }

    #[test]
    fn excerpt_survives_a_cut_through_a_multibyte_character() {
        let body = format!("{}é", "a".repeat(BODY_EXCERPT_BYTES - 1));
        let excerpt = body_excerpt(body.as_bytes());
        assert!(excerpt.starts_with(&"a".repeat(BODY_EXCERPT_BYTES - 1)));
        assert!(excerpt.ends_with('\u{FFFD}'), "{excerpt}");
    }

    #[test]
    fn transport_errors_map_to_error_classes() {
        assert!(matches!(
            transport_error(&ErrorCode::HttpRequestDenied),
            Error::Permanent(m) if m.contains("egress denied")
        ));
        assert!(matches!(
            transport_error(&ErrorCode::TlsCertificateError),
            Error::Permanent(_)
        ));
        for code in [
            ErrorCode::DnsTimeout,
            ErrorCode::ConnectionRefused,
            ErrorCode::ConnectionTimeout,
            ErrorCode::HttpProtocolError,
            ErrorCode::InternalError(Some("boom".into())),
        ] {
            assert!(
                matches!(transport_error(&code), Error::Transient(_)),
                "{code:?}"
            );
        }
    }

    #[test]
    fn transport_errors_map_to_check_reasons() {
        let dns = ErrorCode::DnsError(DnsErrorPayload {
            rcode: Some("NXDOMAIN".into()),
            info_code: None,
        });
        let cases = [
            (dns, CheckReason::Unreachable),
            (ErrorCode::DnsTimeout, CheckReason::Unreachable),
            (ErrorCode::ConnectionRefused, CheckReason::Unreachable),
            (ErrorCode::ConnectionTimeout, CheckReason::Unreachable),
            (
                ErrorCode::TlsCertificateError,
                CheckReason::CertificateInvalid,
            ),
            (ErrorCode::HttpRequestDenied, CheckReason::Other),
            (ErrorCode::TlsProtocolError, CheckReason::Other),
            (
                ErrorCode::InternalError(Some("credentials-unavailable".into())),
                CheckReason::CredentialsUnavailable,
            ),
            (
                ErrorCode::InternalError(Some("something else".into())),
                CheckReason::Other,
            ),
        ];
        for (code, expected) in cases {
            let result = transport_check(&code);
            assert_eq!(result.reason, expected, "{code:?}");
            assert!(!result.message.is_empty());
        }
        assert!(
            transport_check(&ErrorCode::HttpRequestDenied)
                .message
                .contains("egress denied")
        );
    }

    #[test]
    fn a_forbidden_header_is_a_permanent_error_naming_the_header() {
        let failure = Failure::HeaderRefused {
            name: "authorization".into(),
            error: HeaderError::Forbidden,
        };
        match failure_error(failure) {
            Error::Permanent(message) => {
                assert!(message.contains("`authorization`"), "{message}");
                assert!(message.contains("forbids"), "{message}");
            }
            other => panic!("expected permanent, got {other:?}"),
        }
    }

    #[test]
    fn failures_map_to_check_reasons() {
        let refused = failure_check(Failure::Transport(ErrorCode::ConnectionRefused));
        assert_eq!(refused.reason, CheckReason::Unreachable);
        let header = Failure::HeaderRefused {
            name: "authorization".into(),
            error: HeaderError::Forbidden,
        };
        assert_eq!(failure_check(header).reason, CheckReason::Other);
        let other = failure_check(Failure::Other("the stream closed early".into()));
        assert_eq!(
            (other.reason, other.message.as_str()),
            (CheckReason::Other, "the stream closed early")
        );
    }

    #[test]
    fn other_failures_are_transient() {
        assert!(
            matches!(failure_error(Failure::Other("x".into())), Error::Transient(m) if m == "x")
        );
    }
}
