//! What every hypervisor-facing operation (create, get, delete, list-by-tag) does first, and the
//! one helper they share to call the endpoint.

use egress_guest::{Endpoint, Method, Request, time};

use crate::config::{Config, FailWith};
use crate::egress::provider::types::Error;
use crate::{logging, status};

/// Parse the configuration, wait `delayMs`, then answer `failWith` if it is set.
///
/// The wait comes first so a host can test a slow call that then fails.
pub fn begin(config_json: &str) -> Result<Config, Error> {
    let config = Config::parse(config_json).map_err(Error::Permanent)?;
    time::sleep_ms(config.delay_ms);
    match config.fail_with {
        Some(class) => Err(forced_error(class)),
        None => Ok(config),
    }
}

/// The error `failWith` asks for.
pub fn forced_error(class: FailWith) -> Error {
    let message = "failWith is set in the reference provider's configuration".to_string();
    match class {
        FailWith::Transient => Error::Transient(message),
        FailWith::Permanent => Error::Permanent(message),
        FailWith::NotFound => Error::NotFound(message),
        FailWith::QuotaExceeded => Error::QuotaExceeded(message),
    }
}

/// Make one request to the endpoint; a 2xx answers its body, anything else the contract error
/// `status::operation_error` picks.
pub fn call(
    config: &Config,
    endpoint: &Endpoint,
    method: Method,
    path: &str,
    json_body: Option<Vec<u8>>,
) -> Result<Vec<u8>, Error> {
    let method_name = egress_guest::method_name(&method).to_string();
    let request = request(config, Request::new(method, endpoint, path), json_body);
    let response = egress_guest::send(&request).map_err(status::failure_error)?;
    // Status only: bodies may hold anything, and the host adds provider and operation context.
    logging::debug(
        "endpoint answered",
        &[
            ("method", &method_name),
            ("path", path),
            ("status", &response.status.to_string()),
        ],
    );
    match status::operation_error(response.status, &response.body) {
        Some(error) => Err(error),
        None => Ok(response.body),
    }
}

/// `request` with the JSON body and the test-only `debugSendAuthorization` header, if any.
///
/// The endpoint speaks JSON; bodies over 4 MiB are refused as a broken endpoint.
pub fn request(config: &Config, request: Request, json_body: Option<Vec<u8>>) -> Request {
    let mut request = request.max_response_bytes(MAX_RESPONSE_BYTES);
    if let Some(body) = json_body {
        request = request.body("application/json", body);
    }
    match config.debug_send_authorization.as_deref() {
        // TEST ONLY: the broker must refuse it (see `Config::debug_send_authorization`).
        Some(value) => request.header("authorization", value),
        None => request,
    }
}

/// The largest response body read; an endpoint answering more is treated as broken.
const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forced_errors_have_the_requested_class() {
        assert!(matches!(
            forced_error(FailWith::Transient),
            Error::Transient(_)
        ));
        assert!(matches!(
            forced_error(FailWith::Permanent),
            Error::Permanent(_)
        ));
        assert!(matches!(
            forced_error(FailWith::NotFound),
            Error::NotFound(_)
        ));
        assert!(matches!(
            forced_error(FailWith::QuotaExceeded),
            Error::QuotaExceeded(_)
        ));
    }

    #[test]
    fn a_bad_configuration_fails_before_any_wait() {
        // `begin` reaches no import when the configuration does not parse, so this runs natively.
        assert!(
            matches!(begin(r#"{"delayMs":1,"nope":1}"#), Err(Error::Permanent(m)) if m.contains("nope"))
        );
    }
}
