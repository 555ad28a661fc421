//! What every hypervisor-facing operation (create, get, delete, list-by-tag) does first, and the
//! one helper they share to call the endpoint.

use crate::config::{Config, Endpoint, FailWith};
use crate::egress::provider::types::Error;
use crate::http::{self, Request};
use crate::wasi::http::types::Method;
use crate::{logging, status, time};

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
    let method_name = http::method_name(&method).to_string();
    let request = Request {
        method,
        path,
        json_body,
        debug_authorization: config.debug_send_authorization.as_deref(),
    };
    let response = http::send(endpoint, request).map_err(http::Failure::into_error)?;
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
