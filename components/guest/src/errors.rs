//! The contract's four error classes, and what an HTTP outcome means for them.
//!
//! | outcome                                             | class           |
//! |-----------------------------------------------------|-----------------|
//! | 2xx                                                 | (success)       |
//! | 404                                                 | `not-found`     |
//! | 408, 429, 5xx                                       | `transient`     |
//! | 507 (insufficient storage)                          | `quota-exceeded`|
//! | other statuses (400, 401, 403, 409, 3xx, …)         | `permanent`     |
//! | no response: DNS, refused, reset, timeouts          | `transient`     |
//! | no response: the certificate did not verify         | `permanent`     |
//! | no response: the broker refused the request         | `permanent`     |
//! | no response: the host could not read the credential | `transient` (the secret may land) |
//!
//! A provider that knows its backend better (a 500 that means "no such VM") classifies those
//! answers first and falls back to these.

use crate::http::{ErrorCode, Failure};

/// The contract's error classes: what the operator does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// Retry with backoff.
    Transient,
    /// Retrying cannot help until someone changes something.
    Permanent,
    /// The thing does not exist (for `get` and `delete`: it is gone).
    NotFound,
    /// The backend is out of room; retry later, slowly.
    QuotaExceeded,
}

impl ErrorClass {
    /// The class of an HTTP status, or `None` for 2xx.
    pub fn of_status(status: u16) -> Option<ErrorClass> {
        match status {
            200..=299 => None,
            404 => Some(ErrorClass::NotFound),
            507 => Some(ErrorClass::QuotaExceeded),
            408 | 429 | 500..=599 => Some(ErrorClass::Transient),
            _ => Some(ErrorClass::Permanent),
        }
    }
}

/// Why a request got no response at all, as the host reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportKind {
    /// DNS, refused, reset, timeouts: the backend could not be reached.
    Unreachable,
    /// The backend's certificate did not verify (or the TLS handshake failed).
    Tls,
    /// The host's broker refused the request (the grant does not cover it).
    Denied,
    /// The host could not read the credentials it injects.
    CredentialsUnavailable,
    /// Anything else.
    Other,
}

impl TransportKind {
    /// The kind of a `wasi:http` error code.
    pub fn of(code: &ErrorCode) -> TransportKind {
        match code {
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
            ErrorCode::HttpRequestDenied | ErrorCode::DestinationIpProhibited => {
                TransportKind::Denied
            }
            // The broker's word for "I could not read the secret I inject" (docs/egress.md).
            ErrorCode::InternalError(Some(message))
                if message.to_ascii_lowercase().contains("credential") =>
            {
                TransportKind::CredentialsUnavailable
            }
            _ => TransportKind::Other,
        }
    }

    /// The contract error class of a request that failed this way.
    pub fn class(self) -> ErrorClass {
        match self {
            TransportKind::Tls | TransportKind::Denied => ErrorClass::Permanent,
            TransportKind::Unreachable
            | TransportKind::CredentialsUnavailable
            | TransportKind::Other => ErrorClass::Transient,
        }
    }
}

/// A request that got no response: its kind and a detail for the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportError {
    pub kind: TransportKind,
    pub detail: String,
}

impl From<Failure> for TransportError {
    fn from(failure: Failure) -> TransportError {
        match failure {
            Failure::Transport(code) => TransportError {
                kind: TransportKind::of(&code),
                detail: format!("{code:?}"),
            },
            other => TransportError {
                kind: TransportKind::Other,
                detail: other.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::HeaderError;

    #[test]
    fn statuses_map_to_the_four_classes() {
        let cases = [
            (200, None),
            (204, None),
            (299, None),
            (404, Some(ErrorClass::NotFound)),
            (408, Some(ErrorClass::Transient)),
            (429, Some(ErrorClass::Transient)),
            (500, Some(ErrorClass::Transient)),
            (503, Some(ErrorClass::Transient)),
            (507, Some(ErrorClass::QuotaExceeded)),
            (400, Some(ErrorClass::Permanent)),
            (401, Some(ErrorClass::Permanent)),
            (403, Some(ErrorClass::Permanent)),
            (409, Some(ErrorClass::Permanent)),
            (302, Some(ErrorClass::Permanent)),
            (600, Some(ErrorClass::Permanent)),
        ];
        for (status, class) in cases {
            assert_eq!(ErrorClass::of_status(status), class, "HTTP {status}");
        }
    }

    #[test]
    fn transport_failures_map_to_kinds_and_classes() {
        let cases = [
            (
                ErrorCode::ConnectionRefused,
                TransportKind::Unreachable,
                ErrorClass::Transient,
            ),
            (
                ErrorCode::HttpResponseTimeout,
                TransportKind::Unreachable,
                ErrorClass::Transient,
            ),
            (
                ErrorCode::TlsCertificateError,
                TransportKind::Tls,
                ErrorClass::Permanent,
            ),
            (
                ErrorCode::HttpRequestDenied,
                TransportKind::Denied,
                ErrorClass::Permanent,
            ),
            (
                ErrorCode::InternalError(Some("credentials-unavailable".into())),
                TransportKind::CredentialsUnavailable,
                ErrorClass::Transient,
            ),
            (
                ErrorCode::InternalError(Some("boom".into())),
                TransportKind::Other,
                ErrorClass::Transient,
            ),
        ];
        for (code, kind, class) in cases {
            let error = TransportError::from(Failure::Transport(code));
            assert_eq!(
                (error.kind, error.kind.class()),
                (kind, class),
                "{}",
                error.detail
            );
        }
        let header = TransportError::from(Failure::HeaderRefused {
            name: "authorization".into(),
            error: HeaderError::Forbidden,
        });
        assert_eq!(header.kind, TransportKind::Other);
        assert!(header.detail.contains("authorization"), "{}", header.detail);
    }
}
