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
    use EgressError as E;
    Some(match name {
        "DNS-timeout" => E::DnsTimeout,
        "DNS-error" => E::DnsError {
            rcode: None,
            info_code: None,
        },
        "destination-not-found" => E::DestinationNotFound,
        "destination-unavailable" => E::DestinationUnavailable,
        "destination-IP-prohibited" => E::DestinationIpProhibited,
        "destination-IP-unroutable" => E::DestinationIpUnroutable,
        "connection-refused" => E::ConnectionRefused,
        "connection-terminated" => E::ConnectionTerminated,
        "connection-timeout" => E::ConnectionTimeout,
        "connection-read-timeout" => E::ConnectionReadTimeout,
        "connection-write-timeout" => E::ConnectionWriteTimeout,
        "connection-limit-reached" => E::ConnectionLimitReached,
        "TLS-protocol-error" => E::TlsProtocolError,
        "TLS-certificate-error" => E::TlsCertificateError,
        "TLS-alert-received" => E::TlsAlertReceived {
            alert_id: None,
            alert_message: None,
        },
        "HTTP-request-denied" => E::HttpRequestDenied,
        "HTTP-request-length-required" => E::HttpRequestLengthRequired,
        "HTTP-request-body-size" => E::HttpRequestBodySize(None),
        "HTTP-request-method-invalid" => E::HttpRequestMethodInvalid,
        "HTTP-request-URI-invalid" => E::HttpRequestUriInvalid,
        "HTTP-request-URI-too-long" => E::HttpRequestUriTooLong,
        "HTTP-request-header-section-size" => E::HttpRequestHeaderSectionSize(None),
        "HTTP-request-header-size" => E::HttpRequestHeaderSize {
            field_name: None,
            field_size: None,
        },
        "HTTP-request-trailer-section-size" => E::HttpRequestTrailerSectionSize(None),
        "HTTP-request-trailer-size" => E::HttpRequestTrailerSize {
            field_name: None,
            field_size: None,
        },
        "HTTP-response-incomplete" => E::HttpResponseIncomplete,
        "HTTP-response-header-section-size" => E::HttpResponseHeaderSectionSize(None),
        "HTTP-response-header-size" => E::HttpResponseHeaderSize {
            field_name: None,
            field_size: None,
        },
        "HTTP-response-body-size" => E::HttpResponseBodySize(None),
        "HTTP-response-trailer-section-size" => E::HttpResponseTrailerSectionSize(None),
        "HTTP-response-trailer-size" => E::HttpResponseTrailerSize {
            field_name: None,
            field_size: None,
        },
        "HTTP-response-transfer-coding" => E::HttpResponseTransferCoding(None),
        "HTTP-response-content-coding" => E::HttpResponseContentCoding(None),
        "HTTP-response-timeout" => E::HttpResponseTimeout,
        "HTTP-upgrade-failed" => E::HttpUpgradeFailed,
        "HTTP-protocol-error" => E::HttpProtocolError,
        "loop-detected" => E::LoopDetected,
        "configuration-error" => E::ConfigurationError,
        "internal-error" => E::InternalError(detail),
        _ => return None,
    })
}

/// The refusal named `name` (`Refusal::as_str`), if this version knows it.
pub(crate) fn refusal(name: &str) -> Option<egress_runtime::Refusal> {
    use egress_runtime::Refusal as R;
    [
        R::NotGranted,
        R::Denied,
        R::CredentialsUnavailable,
        R::CaUnavailable,
        R::CaInvalid,
        R::ResponseUnredactable,
        R::RequestsInFlight,
    ]
    .into_iter()
    .find(|refusal| refusal.as_str() == name)
}

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
        assert_eq!(
            refusal("ca-invalid"),
            Some(egress_runtime::Refusal::CaInvalid)
        );
    }
}
