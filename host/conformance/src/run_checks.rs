//! The rules that judge every call of the run rather than one scenario: error classes and
//! credentials, egress denials, limits. Run alone (`--only`), they first make a few calls of their
//! own.

use egress_runtime::types::{Request, Tag};

use super::session::{Ending, TAG_KEY};
use super::{Outcome, Session};

/// `errors.classified-no-secret`
pub(crate) async fn classified_no_secret(session: &Session) -> Outcome {
    exercise_if_idle(session).await;
    for call in session.calls() {
        if call.leaked {
            return Outcome::Fail(format!(
                "the answer of a {} call holds the credential the host injects",
                call.operation
            ));
        }
        let Some((class, message)) = &call.error else {
            continue;
        };
        if call.ending == Ending::Broken {
            return Outcome::Fail(format!(
                "{} did not answer a classified error of its own: {message}",
                call.operation
            ));
        }
        if call.ending == Ending::Answered && message.trim().is_empty() {
            return Outcome::Fail(format!(
                "{} answered {} with no message",
                call.operation,
                class.as_str()
            ));
        }
    }
    Outcome::Pass
}

/// `egress.no-denials`
pub(crate) async fn no_denials(session: &Session) -> Outcome {
    exercise_if_idle(session).await;
    let denied = session.denied();
    let credential_headers = session.credential_headers();
    if denied > 0 {
        return Outcome::Fail(format!(
            "the broker denied {denied} requests: the provider reached outside its grant"
        ));
    }
    if credential_headers > 0 {
        return Outcome::Fail(format!(
            "the provider tried {credential_headers} times to set a credential header; the host injects credentials"
        ));
    }
    Outcome::Pass
}

/// `limits.deadline-memory`
pub(crate) async fn deadline_memory(session: &Session) -> Outcome {
    exercise_if_idle(session).await;
    for call in session.calls() {
        let message = call.error.map(|(_, message)| message).unwrap_or_default();
        match call.ending {
            Ending::Deadline => {
                return Outcome::Fail(format!(
                    "{} hit its deadline under the default limits: {message}",
                    call.operation
                ));
            }
            Ending::Limit => {
                return Outcome::Fail(format!(
                    "{} hit a limit under the default limits: {message}",
                    call.operation
                ));
            }
            _ => {}
        }
    }
    Outcome::Pass
}

/// A few calls to judge when the rule runs alone: one of each operation that needs no VM.
async fn exercise_if_idle(session: &Session) {
    if !session.calls().is_empty() {
        return;
    }
    let config = session.config_text();
    let _ = session.call(Request::Describe).await;
    let _ = session
        .call(Request::ValidateConfig {
            config: config.clone(),
        })
        .await;
    let _ = session
        .call(Request::ValidateConfig {
            config: "not json".to_owned(),
        })
        .await;
    let _ = session.check(&config).await;
    let tag = Tag {
        key: TAG_KEY.to_owned(),
        value: session.name("idle"),
    };
    let _ = session.list(&tag).await;
}
