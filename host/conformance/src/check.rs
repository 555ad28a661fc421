//! `check`: a reason for a good config and for a bad credential, never an error.

use egress_runtime::CallError;
use egress_runtime::types::{CheckReason, CheckResult};

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
        None => Ok(()),
        Some(bad) => expect(
            session,
            bad,
            CheckReason::Unauthorized,
            "a wrong credential",
        ),
    }
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
