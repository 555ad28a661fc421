//! `describe`: what the provider says about itself, and that saying it costs no I/O.

use egress_runtime::types::{Request, Response};

use super::{Outcome, RuleResult, Session, outcome};

/// `describe.valid`
pub(crate) async fn valid(session: &Session) -> Outcome {
    outcome(check_description(session))
}

fn check_description(session: &Session) -> RuleResult {
    let provider = session.provider();
    let description = provider.description();
    let name = &description.name;
    let label = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !label {
        return Err(format!(
            "name {name:?} is not a DNS label (a-z, 0-9, `-`, at most 63), as Proxy resources name providers"
        ));
    }
    semver::Version::parse(&description.version)
        .map_err(|error| format!("version {:?} is not semver: {error}", description.version))?;
    let exported = provider.contract_version().to_string();
    if description.contract_version != exported {
        return Err(format!(
            "describe says contract version {:?}, the component exports {exported}",
            description.contract_version
        ));
    }
    let schema: serde_json::Value = serde_json::from_str(&description.config_schema)
        .map_err(|error| format!("the config schema is not JSON: {error}"))?;
    let validator = jsonschema::validator_for(&schema)
        .map_err(|error| format!("the config schema does not compile: {error}"))?;
    if let Some(error) = validator.iter_errors(session.config()).next() {
        return Err(format!(
            "the run's config does not fit the provider's schema: {} at {}",
            error, error.instance_path
        ));
    }
    Ok(())
}

/// `describe.no-io`
pub(crate) async fn no_io(session: &Session) -> Outcome {
    let before = session.sent();
    let outcome = session.call(Request::Describe).await;
    let sent = session.sent() - before;
    match outcome {
        Ok(Response::Describe(description)) if sent == 0 => {
            if &description == session.provider().description() {
                Outcome::Pass
            } else {
                Outcome::Fail(
                    "a second describe answered differently from the one at load".to_owned(),
                )
            }
        }
        Ok(_) => Outcome::Fail(format!("describe sent {sent} requests; it does no I/O")),
        Err(error) => Outcome::Fail(format!("describe: {}", session.error_text(&error))),
    }
}
