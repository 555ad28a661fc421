//! The provider's configuration and the `validate-config` export.
//!
//! The host passes the configuration as a JSON string to every operation (the provider keeps no
//! state, so it parses it each time). Unknown keys are rejected so a typo is an error, not a
//! silently ignored setting. `config.schema.json` beside this file describes the same rules for
//! humans and tools; `describe` publishes it.

use std::fmt;

use serde_json::{Map, Value};

use crate::egress::provider::types::Error;
use egress_guest::Endpoint;

/// The longest `delayMs` accepted: ten minutes is beyond any sensible host timeout.
pub const MAX_DELAY_MS: u64 = 600_000;

/// `validate-config`: check a configuration without any I/O.
pub fn validate_config(config: &str) -> Result<(), Error> {
    Config::parse(config).map(|_| ()).map_err(Error::Permanent)
}

/// A parsed, validated configuration.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// Where to send real HTTP requests; `None` means answer without any I/O.
    pub endpoint: Option<Endpoint>,
    /// How long to wait at the start of each operation, in milliseconds.
    pub delay_ms: u64,
    /// The error class every operation (except describe, validate-config and check) answers.
    pub fail_with: Option<FailWith>,
    /// TEST ONLY: a value the provider tries to send as `Authorization`, so a host can test that
    /// its broker refuses guest-set credentials. A real provider never sets this header: the host
    /// injects credentials.
    pub debug_send_authorization: Option<String>,
}

/// An error class `failWith` can ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailWith {
    Transient,
    Permanent,
    NotFound,
    QuotaExceeded,
}

impl FailWith {
    /// Each class with the name the configuration spells it with.
    const NAMES: [(&'static str, FailWith); 4] = [
        ("transient", FailWith::Transient),
        ("permanent", FailWith::Permanent),
        ("not-found", FailWith::NotFound),
        ("quota-exceeded", FailWith::QuotaExceeded),
    ];
}

/// Every key the configuration may have.
const KEYS: [&str; 4] = ["endpoint", "delayMs", "failWith", "debugSendAuthorization"];

impl Config {
    /// Parse and check a configuration; the error is a message for a person.
    ///
    /// Parsed key by key (not with a serde derive) so each message names the key at fault.
    pub fn parse(json: &str) -> Result<Config, String> {
        let invalid = |why: String| format!("invalid configuration: {why}");
        let value: Value =
            serde_json::from_str(json).map_err(|error| invalid(format!("not JSON ({error})")))?;
        let Value::Object(object) = value else {
            return Err(invalid("must be a JSON object".to_string()));
        };
        if let Some(unknown) = object.keys().find(|key| !KEYS.contains(&key.as_str())) {
            return Err(invalid(format!(
                "unknown key `{unknown}` (known keys: {})",
                KEYS.join(", ")
            )));
        }

        let endpoint = optional_string(&object, "endpoint")
            .map_err(invalid)?
            .map(|url| Endpoint::parse(url).map_err(|why| invalid(format!("endpoint {why}"))))
            .transpose()?;
        let delay_ms = match object.get("delayMs") {
            None | Some(Value::Null) => 0,
            Some(value) => value
                .as_u64()
                .filter(|delay| *delay <= MAX_DELAY_MS)
                .ok_or_else(|| {
                    invalid(format!(
                        "delayMs must be an integer from 0 to {MAX_DELAY_MS}, got {value}"
                    ))
                })?,
        };
        let fail_with = optional_string(&object, "failWith")
            .map_err(invalid)?
            .map(|name| {
                FailWith::NAMES
                    .iter()
                    .find(|(known, _)| *known == name)
                    .map(|(_, class)| *class)
                    .ok_or_else(|| {
                        let known: Vec<&str> = FailWith::NAMES.iter().map(|(n, _)| *n).collect();
                        invalid(format!(
                            "failWith must be one of {}, got `{name}`",
                            known.join(", ")
                        ))
                    })
            })
            .transpose()?;
        let debug_send_authorization = optional_string(&object, "debugSendAuthorization")
            .map_err(invalid)?
            .map(str::to_string);

        Ok(Config {
            endpoint,
            delay_ms,
            fail_with,
            debug_send_authorization,
        })
    }
}

/// The string at `key`, `None` when absent or null, an error message when not a string.
fn optional_string<'a>(
    object: &'a Map<String, Value>,
    key: &str,
) -> Result<Option<&'a str>, String> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        // The value is not echoed: under debugSendAuthorization it would be a credential.
        Some(_) => Err(format!("{key} must be a string")),
    }
}

// Written by hand so the test-only Authorization value never reaches a log or an error message.
impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("endpoint", &self.endpoint)
            .field("delay_ms", &self.delay_ms)
            .field("fail_with", &self.fail_with)
            .field(
                "debug_send_authorization",
                &self.debug_send_authorization.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(json: &str) -> String {
        Config::parse(json).expect_err(json)
    }

    #[test]
    fn empty_object_is_the_default_configuration() {
        let config = Config::parse("{}").unwrap();
        assert_eq!(config.endpoint, None);
        assert_eq!(config.delay_ms, 0);
        assert_eq!(config.fail_with, None);
        assert_eq!(config.debug_send_authorization, None);
    }

    #[test]
    fn every_key_is_read() {
        let config = Config::parse(
            r#"{"endpoint":"https://pve.example:8006/api/","delayMs":250,
                "failWith":"quota-exceeded","debugSendAuthorization":"Bearer x"}"#,
        )
        .unwrap();
        assert_eq!(
            config.endpoint,
            Some(Endpoint {
                scheme: egress_guest::Scheme::Https,
                authority: "pve.example:8006".into(),
                base_path: "/api".into(),
            })
        );
        assert_eq!(config.delay_ms, 250);
        assert_eq!(config.fail_with, Some(FailWith::QuotaExceeded));
        assert_eq!(config.debug_send_authorization.as_deref(), Some("Bearer x"));
    }

    #[test]
    fn each_fail_with_class_is_accepted() {
        for (name, class) in [
            ("transient", FailWith::Transient),
            ("permanent", FailWith::Permanent),
            ("not-found", FailWith::NotFound),
            ("quota-exceeded", FailWith::QuotaExceeded),
        ] {
            let config = Config::parse(&format!(r#"{{"failWith":"{name}"}}"#)).unwrap();
            assert_eq!(config.fail_with, Some(class), "{name}");
        }
    }

    #[test]
    fn unknown_keys_are_rejected_by_name() {
        assert!(error_of(r#"{"endpoit":"http://x"}"#).contains("unknown key `endpoit`"));
    }

    #[test]
    fn unknown_fail_with_class_is_rejected() {
        let error = error_of(r#"{"failWith":"sometimes"}"#);
        assert!(error.contains("failWith must be one of"), "{error}");
        assert!(error.contains("`sometimes`"), "{error}");
    }

    #[test]
    fn delay_is_bounded_to_ten_minutes() {
        assert_eq!(
            Config::parse(r#"{"delayMs":600000}"#).unwrap().delay_ms,
            600_000
        );
        for bad in ["600001", "-1", "1.5", "\"soon\"", "true"] {
            let error = error_of(&format!(r#"{{"delayMs":{bad}}}"#));
            assert!(
                error.contains("delayMs must be an integer from 0 to 600000"),
                "{error}"
            );
        }
    }

    #[test]
    fn null_means_unset() {
        let config = Config::parse(r#"{"endpoint":null,"delayMs":null,"failWith":null}"#).unwrap();
        assert_eq!(
            (config.endpoint, config.delay_ms, config.fail_with),
            (None, 0, None)
        );
    }

    #[test]
    fn string_keys_reject_other_types_without_echoing_the_value() {
        for key in ["endpoint", "failWith", "debugSendAuthorization"] {
            let error = error_of(&format!(r#"{{"{key}":["hunter2"]}}"#));
            assert!(
                error.contains(&format!("{key} must be a string")),
                "{error}"
            );
            assert!(!error.contains("hunter2"), "{error}");
        }
    }

    #[test]
    fn non_object_configurations_are_rejected() {
        for json in ["", "null", "[]", "\"endpoint\"", "{"] {
            assert!(
                error_of(json).starts_with("invalid configuration"),
                "{json:?}"
            );
        }
    }

    #[test]
    fn validate_config_answers_permanent_with_the_message() {
        assert!(validate_config("{}").is_ok());
        match validate_config(r#"{"delayMs":"soon"}"#) {
            Err(Error::Permanent(message)) => assert!(message.contains("delayMs"), "{message}"),
            other => panic!("expected permanent, got {other:?}"),
        }
    }

    #[test]
    fn endpoint_error_does_not_echo_a_password_in_user_info() {
        let error = error_of(r#"{"endpoint":"https://root:hunter2@pve"}"#);
        assert!(error.contains("user info"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
    }

    #[test]
    fn debug_output_redacts_the_authorization_value() {
        let config = Config::parse(r#"{"debugSendAuthorization":"Bearer hunter2"}"#).unwrap();
        let debug = format!("{config:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains("<redacted>"), "{debug}");
    }
}
