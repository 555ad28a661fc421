//! `check`: a reason for a good config, a bad credential and a TLS failure, never an error.

use std::time::Duration;

use egress_runtime::CallError;
use egress_runtime::types::{CheckReason, CheckResult};
use egress_tap::{Fault, Faults, Which};

use super::{Outcome, RuleResult, Session, outcome};

/// `check.reasons`
pub(crate) async fn reasons(session: &Session) -> Outcome {
    outcome(check_reasons(session).await)
}

async fn check_reasons(session: &Session) -> RuleResult {
    let good = session.check(&session.config_text()).await;
    expect(session, good, CheckReason::Ok, "the run's config")?;
    match session.check_with_wrong_credential().await {
        // Nothing to swap: the grant injects no credential.
        None => {}
        Some(bad) => expect(
            session,
            bad,
            CheckReason::Unauthorized,
            "a wrong credential",
        )?,
    }
    // Only over TLS: a handshake failure from a plain-HTTP origin is no backend's answer.
    let over_tls = session
        .http_grant()
        .is_some_and(|grant| grant.origins.iter().any(|o| o.starts_with("https://")));
    if over_tls {
        let faults = Faults::new(Fault::Tls, Which::All, Duration::ZERO);
        let _tap = session.with_tap(faults);
        let failed = session.check(&session.config_text()).await;
        expect(
            session,
            failed,
            CheckReason::CertificateInvalid,
            "a TLS handshake that fails to verify (injected at the broker)",
        )?;
    }
    Ok(())
}

fn expect(
    session: &Session,
    outcome: Result<CheckResult, CallError>,
    expected: CheckReason,
    with: &str,
) -> RuleResult {
    match outcome {
        Ok(result) if result.reason == expected => Ok(()),
        Ok(result) => Err(format!(
            "check with {with} answered {}: {}; expected {}",
            result.reason.as_str(),
            session.scrub(&result.message),
            expected.as_str()
        )),
        Err(error) => Err(format!(
            "check with {with} answered an error ({}); check answers a reason, never an error",
            session.error_text(&error)
        )),
    }
}
