//! `wasi:http` error codes by their WIT names, both ways: a recording stores the name, a replay
//! gives the guest the code back. Payloads other than `internal-error`'s detail are not kept (the
//! broker sets none that a provider reads).

use egress_runtime::egress::EgressError;

/// The WIT name of `error`, and the detail of an `internal-error`.
pub(crate) fn name(error: &EgressError) -> (&'static str, Option<String>) {
    use EgressError as E;
    let name = match error {
        E::DnsTimeout => "DNS-timeout",
        E::DnsError { .. } => "DNS-error",
        E::DestinationNotFound => "destination-not-found",
        E::DestinationUnavailable => "destination-unavailable",
        E::DestinationIpProhibited => "destination-IP-prohibited",
        E::DestinationIpUnroutable => "destination-IP-unroutable",
        E::ConnectionRefused => "connection-refused",
        E::ConnectionTerminated => "connection-terminated",
        E::ConnectionTimeout => "connection-timeout",
        E::ConnectionReadTimeout => "connection-read-timeout",
        E::ConnectionWriteTimeout => "connection-write-timeout",
        E::ConnectionLimitReached => "connection-limit-reached",
        E::TlsProtocolError => "TLS-protocol-error",
        E::TlsCertificateError => "TLS-certificate-error",
        E::TlsAlertReceived { .. } => "TLS-alert-received",
        E::HttpRequestDenied => "HTTP-request-denied",
        E::HttpRequestLengthRequired => "HTTP-request-length-required",
        E::HttpRequestBodySize(_) => "HTTP-request-body-size",
        E::HttpRequestMethodInvalid => "HTTP-request-method-invalid",
        E::HttpRequestUriInvalid => "HTTP-request-URI-invalid",
        E::HttpRequestUriTooLong => "HTTP-request-URI-too-long",
        E::HttpRequestHeaderSectionSize(_) => "HTTP-request-header-section-size",
        E::HttpRequestHeaderSize { .. } => "HTTP-request-header-size",
        E::HttpRequestTrailerSectionSize(_) => "HTTP-request-trailer-section-size",
        E::HttpRequestTrailerSize { .. } => "HTTP-request-trailer-size",
        E::HttpResponseIncomplete => "HTTP-response-incomplete",
        E::HttpResponseHeaderSectionSize(_) => "HTTP-response-header-section-size",
        E::HttpResponseHeaderSize { .. } => "HTTP-response-header-size",
        E::HttpResponseBodySize(_) => "HTTP-response-body-size",
        E::HttpResponseTrailerSectionSize(_) => "HTTP-response-trailer-section-size",
        E::HttpResponseTrailerSize { .. } => "HTTP-response-trailer-size",
        E::HttpResponseTransferCoding(_) => "HTTP-response-transfer-coding",
        E::HttpResponseContentCoding(_) => "HTTP-response-content-coding",
        E::HttpResponseTimeout => "HTTP-response-timeout",
        E::HttpUpgradeFailed => "HTTP-upgrade-failed",
        E::HttpProtocolError => "HTTP-protocol-error",
        E::LoopDetected => "loop-detected",
        E::ConfigurationError => "configuration-error",
        E::InternalError(detail) => return ("internal-error", detail.clone()),
        // The embedder-side variants (a hyper or socket error) reach a guest as internal errors.
        _ => "internal-error",
    };
    (name, None)
}

/// The error code named `name` (with `detail` for `internal-error`); `None` for a name this
/// version does not know.
pub(crate) fn parse(name: &str, detail: Option<String>) -> Option<EgressError> {
    if name == "internal-error" {
        return Some(EgressError::InternalError(detail));
    }
    CODES
        .iter()
        .map(|code| code())
        .find(|code| self::name(code).0 == name)
}

/// Every code but `internal-error`, without payload (the type is not `Clone`: a maker each).
const CODES: &[fn() -> EgressError] = {
    use EgressError as E;
    &[
        || E::DnsTimeout,
        || E::DnsError {
            rcode: None,
            info_code: None,
        },
        || E::DestinationNotFound,
        || E::DestinationUnavailable,
        || E::DestinationIpProhibited,
        || E::DestinationIpUnroutable,
        || E::ConnectionRefused,
        || E::ConnectionTerminated,
        || E::ConnectionTimeout,
        || E::ConnectionReadTimeout,
        || E::ConnectionWriteTimeout,
        || E::ConnectionLimitReached,
        || E::TlsProtocolError,
        || E::TlsCertificateError,
        || E::TlsAlertReceived {
            alert_id: None,
            alert_message: None,
        },
        || E::HttpRequestDenied,
        || E::HttpRequestLengthRequired,
        || E::HttpRequestBodySize(None),
        || E::HttpRequestMethodInvalid,
        || E::HttpRequestUriInvalid,
        || E::HttpRequestUriTooLong,
        || E::HttpRequestHeaderSectionSize(None),
        || E::HttpRequestHeaderSize {
            field_name: None,
            field_size: None,
        },
        || E::HttpRequestTrailerSectionSize(None),
        || E::HttpRequestTrailerSize {
            field_name: None,
            field_size: None,
        },
        || E::HttpResponseIncomplete,
        || E::HttpResponseHeaderSectionSize(None),
        || E::HttpResponseHeaderSize {
            field_name: None,
            field_size: None,
        },
        || E::HttpResponseBodySize(None),
        || E::HttpResponseTrailerSectionSize(None),
        || E::HttpResponseTrailerSize {
            field_name: None,
            field_size: None,
        },
        || E::HttpResponseTransferCoding(None),
        || E::HttpResponseContentCoding(None),
        || E::HttpResponseTimeout,
        || E::HttpUpgradeFailed,
        || E::HttpProtocolError,
        || E::LoopDetected,
        || E::ConfigurationError,
    ]
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_code_parses_back_to_the_same_name() {
        for code in [
            EgressError::ConnectionTerminated,
            EgressError::HttpResponseTimeout,
            EgressError::TlsCertificateError,
            EgressError::HttpRequestDenied,
            EgressError::HttpResponseBodySize(Some(3)),
            EgressError::InternalError(Some("credentials-unavailable".into())),
        ] {
            let (name, detail) = name(&code);
            let back = parse(name, detail.clone()).expect(name);
            assert_eq!(super::name(&back), (name, detail));
        }
        assert!(parse("no-such-code", None).is_none());
    }
}
