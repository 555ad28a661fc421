//! `validate-config`: a good config passes, bad ones are `permanent`, and none touches the
//! hypervisor.

use egress_runtime::ErrorClass;
use egress_runtime::types::Request;

use super::{Outcome, RuleResult, Session, outcome};

/// Texts no provider can take as its config.
const GARBAGE: [&str; 5] = ["not json", "[]", "42", "null", "\"a string\""];

/// `validate.accepts-config`
pub(crate) async fn accepts_config(session: &Session) -> Outcome {
    let config = session.config_text();
    outcome(expect(session, &config, None).await)
}

/// `validate.refuses-garbage`
pub(crate) async fn refuses_garbage(session: &Session) -> Outcome {
    for text in GARBAGE {
        if let Err(reason) = expect(session, text, Some(ErrorClass::Permanent)).await {
            return Outcome::Fail(reason);
        }
    }
    Outcome::Pass
}

/// `validate.refuses-missing-required`
pub(crate) async fn refuses_missing_required(session: &Session) -> Outcome {
    let schema: serde_json::Value =
        serde_json::from_str(&session.provider().description().config_schema).unwrap_or_default();
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|fields| fields.iter().filter_map(|f| f.as_str()).collect())
        .unwrap_or_default();
    if required.is_empty() {
        return Outcome::Skip("the config schema requires no field".to_owned());
    }
    for field in required {
        let mut config = session.config().clone();
        if let Some(object) = config.as_object_mut() {
            object.remove(field);
        }
        if let Err(reason) = expect(session, &config.to_string(), Some(ErrorClass::Permanent)).await
        {
            return Outcome::Fail(format!("without required `{field}`: {reason}"));
        }
    }
    Outcome::Pass
}

/// Validates `config`: success when `class` is `None`, else an error of that class; either way
/// without a request.
async fn expect(session: &Session, config: &str, class: Option<ErrorClass>) -> RuleResult {
    let before = session.sent();
    let outcome = session
        .call(Request::ValidateConfig {
            config: config.to_owned(),
        })
        .await;
    let sent = session.sent() - before;
    if sent > 0 {
        return Err(format!(
            "validate-config sent {sent} requests; it checks a config without touching the hypervisor"
        ));
    }
    let shown = shorten(config);
    match (outcome, class) {
        (Ok(_), None) => Ok(()),
        (Err(error), Some(class)) if error.class() == class => Ok(()),
        (Ok(_), Some(class)) => Err(format!(
            "validate-config accepted {shown}; expected {}",
            class.as_str()
        )),
        (Err(error), _) => Err(format!(
            "validate-config of {shown} answered {}",
            session.error_text(&error)
        )),
    }
}

fn shorten(config: &str) -> String {
    if config.len() <= 60 {
        format!("{config:?}")
    } else {
        "the run's config".to_owned()
    }
}
