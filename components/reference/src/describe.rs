//! `describe`: who this provider is and what it needs. It must not perform I/O.

use crate::egress::provider::types::{Capability, Description};

/// The contract version this provider was built against (`package egress:provider@0.1.0`).
pub const CONTRACT_VERSION: &str = "0.1.0";

/// The JSON Schema (draft 2020-12) of the configuration, kept beside the code that parses it.
pub const CONFIG_SCHEMA: &str = include_str!("config.schema.json");

/// The provider's description.
pub fn describe() -> Description {
    Description {
        name: "reference".to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        contract_version: CONTRACT_VERSION.to_string(),
        config_schema: CONFIG_SCHEMA.to_string(),
        // Only when `endpoint` is set does it use HTTP, but a provider declares what it may need.
        capabilities: vec![Capability::Http],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn schema() -> serde_json::Value {
        serde_json::from_str(CONFIG_SCHEMA).expect("the schema is JSON")
    }

    #[test]
    fn describes_itself() {
        let description = describe();
        assert_eq!(description.name, "reference");
        assert_eq!(description.version, env!("CARGO_PKG_VERSION"));
        assert_eq!(description.contract_version, "0.1.0");
        assert!(matches!(
            description.capabilities.as_slice(),
            [Capability::Http]
        ));
    }

    #[test]
    fn schema_is_a_closed_draft_2020_12_object() {
        let schema = schema();
        assert_eq!(
            schema["$schema"],
            "https://json-schema.org/draft/2020-12/schema"
        );
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["additionalProperties"], false);
    }

    #[test]
    fn schema_and_parser_agree_on_the_keys() {
        // A sample valid value per key; a key missing here or in the parser fails the test.
        let samples = [
            ("endpoint", r#""https://pve.example:8006""#),
            ("delayMs", "10"),
            ("failWith", r#""transient""#),
            ("debugSendAuthorization", r#""Bearer test""#),
        ];
        let schema = schema();
        let properties = schema["properties"].as_object().expect("properties");
        let mut schema_keys: Vec<&str> = properties.keys().map(String::as_str).collect();
        schema_keys.sort_unstable();
        let mut sample_keys: Vec<&str> = samples.iter().map(|(key, _)| *key).collect();
        sample_keys.sort_unstable();
        assert_eq!(schema_keys, sample_keys);
        for (key, value) in samples {
            Config::parse(&format!(r#"{{"{key}":{value}}}"#))
                .unwrap_or_else(|error| panic!("{key}: {error}"));
        }
    }

    #[test]
    fn schema_bounds_match_the_parser() {
        let schema = schema();
        assert_eq!(
            schema["properties"]["delayMs"]["maximum"],
            crate::config::MAX_DELAY_MS
        );
        assert_eq!(schema["properties"]["delayMs"]["minimum"], 0);
        let classes = &schema["properties"]["failWith"]["enum"];
        for class in classes.as_array().expect("enum") {
            Config::parse(&format!(r#"{{"failWith":{class}}}"#))
                .unwrap_or_else(|error| panic!("{class}: {error}"));
        }
        assert_eq!(classes.as_array().map(Vec::len), Some(4));
    }
}
