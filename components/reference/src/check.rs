//! `check`: can the provider reach and use its endpoint with the host's grant?
//!
//! A bad configuration is `misconfigured`; no endpoint is `ok` (there is nothing to reach).
//! Otherwise `GET {endpoint}/health`, mapped by `status::check_result` (a non-2xx message quotes
//! the first 200 bytes of the body) or, when no response came, by `status::transport_check`.
//! `delayMs` applies here too; `failWith` does not, so a host can check a failing provider.

use crate::config::Config;
use crate::egress::provider::types::{CheckReason, CheckResult};
use crate::http::{self, Request};
use crate::wasi::http::types::Method;
use crate::{status, time};

/// The `check` export.
pub fn check(config: &str) -> CheckResult {
    let config = match Config::parse(config) {
        Ok(config) => config,
        Err(message) => {
            return CheckResult {
                reason: CheckReason::Misconfigured,
                message,
            };
        }
    };
    time::sleep_ms(config.delay_ms);
    let Some(endpoint) = &config.endpoint else {
        return CheckResult {
            reason: CheckReason::Ok,
            message: "no endpoint configured: nothing to reach".to_string(),
        };
    };

    let request = Request {
        method: Method::Get,
        path: "/health",
        json_body: None,
        debug_authorization: config.debug_send_authorization.as_deref(),
    };
    match http::send(endpoint, request) {
        Ok(response) => status::check_result(response.status, &response.body),
        Err(failure) => failure.into_check(),
    }
}
