//! `check`: can the provider reach and use its endpoint with the host's grant?
//!
//! A bad configuration is `misconfigured`; no endpoint is `ok` (there is nothing to reach).
//! Otherwise `GET {endpoint}/health`, mapped by `status::check_result` (a non-2xx message quotes
//! the first 200 bytes of the body) or, when no response came, by `status::transport_check`.
//! `delayMs` applies here too; `failWith` does not, so a host can check a failing provider.

use crate::config::Config;
use crate::egress::provider::types::{CheckReason, CheckResult};
use crate::{operation, status};
use egress_guest::{Method, Request, time};

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

    let request = Request::new(Method::Get, endpoint, "/health");
    match egress_guest::send(&operation::request(&config, request, None)) {
        Ok(response) => status::check_result(response.status, &response.body),
        Err(failure) => status::failure_check(failure),
    }
}
