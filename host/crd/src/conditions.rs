//! The condition types of the resources' statuses: what each says when `True`. The reasons are
//! listed in `docs/operations.md`.

/// The Proxy's VM runs with an address; the ProviderConfig's `check` passed.
pub const READY: &str = "Ready";
/// The last reconcile reached the provider without error.
pub const SYNCED: &str = "Synced";
/// The VM exists and is running; its reason names what is waited for otherwise.
pub const PROVISIONED: &str = "Provisioned";
/// The Proxy's health check passes at its VM's address (`Passing`); `Starting` before the first
/// pass, `Failing` past `failureThreshold`. Set only on a Proxy with a health check.
pub const HEALTH_CHECK_SUCCEEDED: &str = "HealthCheckSucceeded";
/// The ProviderConfig serves an older generation than it asks for (a replacement failed).
pub const DEGRADED: &str = "Degraded";

/// The ProviderConfig's `Ready` reason for what its provider's `check` answered.
pub fn check_reason(reason: egress_runtime::types::CheckReason) -> &'static str {
    use egress_runtime::types::CheckReason;
    match reason {
        CheckReason::Ok => "CheckPassed",
        CheckReason::Unreachable => "Unreachable",
        CheckReason::Unauthorized => "Unauthorized",
        CheckReason::Forbidden => "Forbidden",
        CheckReason::CertificateInvalid => "CertificateInvalid",
        CheckReason::CredentialsUnavailable => "CredentialsUnavailable",
        CheckReason::Misconfigured => "Misconfigured",
        CheckReason::Other => "CheckFailed",
    }
}
