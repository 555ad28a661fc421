//! Instances: provider IDs, invented addresses, and the JSON an endpoint answers with.

use serde::Deserialize;

use crate::egress::provider::types::{Error, Instance, InstanceState};

/// Every provider ID this provider hands out starts with this.
pub const PROVIDER_ID_PREFIX: &str = "ref/";

/// The provider ID for a VM name: `ref/<name>`.
pub fn provider_id(name: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}{name}")
}

/// The VM name inside a provider ID, or `None` when the ID is not one of ours.
pub fn name_from_provider_id(provider_id: &str) -> Option<&str> {
    provider_id
        .strip_prefix(PROVIDER_ID_PREFIX)
        .filter(|name| !name.is_empty())
}

/// A documentation-range address (RFC 5737 TEST-NET-2) that is the same for the same name on
/// every call, so a stateless provider can answer `get` consistently with `create`.
pub fn address_for(name: &str) -> String {
    format!("198.51.100.{}", fnv1a_32(name.as_bytes()) % 254 + 1)
}

/// 32-bit FNV-1a: tiny, stable across platforms and Rust versions (unlike `std`'s hasher).
fn fnv1a_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash, &byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// The running instance this provider invents for `name` when it has no endpoint.
pub fn invented(name: &str, created_at: Option<String>, uid: &str) -> Instance {
    Instance {
        provider_id: provider_id(name),
        name: name.to_string(),
        state: InstanceState::Running,
        addresses: vec![address_for(name)],
        created_at,
        uid: uid.to_string(),
    }
}

/// One instance as the endpoint's JSON spells it. Extra fields are ignored so the endpoint can
/// grow without breaking this provider.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RemoteInstance {
    name: String,
    state: String,
    #[serde(default)]
    addresses: Vec<String>,
    created_at: Option<String>,
    uid: Option<String>,
}

impl RemoteInstance {
    fn into_instance(self) -> Result<Instance, Error> {
        Ok(Instance {
            provider_id: provider_id(&self.name),
            state: parse_state(&self.state)?,
            name: self.name,
            addresses: self.addresses,
            created_at: self.created_at,
            uid: self.uid.unwrap_or_default(),
        })
    }
}

/// Parse one instance from a 2xx response body.
pub fn parse_instance(body: &[u8]) -> Result<Instance, Error> {
    serde_json::from_slice::<RemoteInstance>(body)
        .map_err(unreadable_response)?
        .into_instance()
}

/// Parse a JSON array of instances from a 2xx response body.
pub fn parse_instances(body: &[u8]) -> Result<Vec<Instance>, Error> {
    serde_json::from_slice::<Vec<RemoteInstance>>(body)
        .map_err(unreadable_response)?
        .into_iter()
        .map(RemoteInstance::into_instance)
        .collect()
}

// Permanent: an endpoint that answers 2xx with something else (an HTML login page, another API)
// is misconfigured, and retrying will not change its answer.
fn unreadable_response(error: serde_json::Error) -> Error {
    Error::Permanent(format!(
        "endpoint answered with unreadable instance JSON: {error}"
    ))
}

/// The contract's state for the endpoint's state string.
pub fn parse_state(state: &str) -> Result<InstanceState, Error> {
    match state {
        "provisioning" => Ok(InstanceState::Provisioning),
        "running" => Ok(InstanceState::Running),
        "stopped" => Ok(InstanceState::Stopped),
        "failed" => Ok(InstanceState::Failed),
        other => Err(Error::Permanent(format!(
            "endpoint answered unknown instance state `{other}`"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_round_trip() {
        assert_eq!(provider_id("web-1"), "ref/web-1");
        assert_eq!(name_from_provider_id("ref/web-1"), Some("web-1"));
    }

    #[test]
    fn foreign_and_empty_provider_ids_are_not_ours() {
        for id in ["", "ref/", "pve1/123", "REF/web", "web", "/ref/web"] {
            assert_eq!(name_from_provider_id(id), None, "{id:?}");
        }
    }

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        // From the FNV reference test suite (draft-eastlake-fnv).
        assert_eq!(fnv1a_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a_32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a_32(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn address_is_derived_from_the_name() {
        // 0xe40c292c % 254 + 1 = 221.
        assert_eq!(address_for("a"), "198.51.100.221");
        assert_eq!(address_for("foobar"), "198.51.100.215");
        assert_eq!(address_for("proxy-1"), address_for("proxy-1"));
    }

    #[test]
    fn address_host_part_stays_in_1_to_254() {
        for index in 0..5_000 {
            let address = address_for(&format!("proxy-{index}"));
            let host: u32 = address.rsplit('.').next().unwrap().parse().unwrap();
            assert!((1..=254).contains(&host), "{address}");
        }
    }

    #[test]
    fn invented_instance_is_running_at_its_address() {
        let instance = invented("web", Some("2024-01-01T00:00:00Z".into()), "uid-1");
        assert_eq!(instance.provider_id, "ref/web");
        assert_eq!(instance.name, "web");
        assert!(matches!(instance.state, InstanceState::Running));
        assert_eq!(instance.addresses, vec![address_for("web")]);
        assert_eq!(instance.created_at.as_deref(), Some("2024-01-01T00:00:00Z"));
        assert_eq!(instance.uid, "uid-1");
    }

    #[test]
    fn each_state_string_maps_to_its_state() {
        assert!(matches!(
            parse_state("provisioning"),
            Ok(InstanceState::Provisioning)
        ));
        assert!(matches!(parse_state("running"), Ok(InstanceState::Running)));
        assert!(matches!(parse_state("stopped"), Ok(InstanceState::Stopped)));
        assert!(matches!(parse_state("failed"), Ok(InstanceState::Failed)));
        assert!(
            matches!(parse_state("Running"), Err(Error::Permanent(m)) if m.contains("`Running`"))
        );
    }

    #[test]
    fn parses_an_instance_with_optional_fields() {
        let instance = parse_instance(
            br#"{"name":"web","state":"stopped","addresses":["10.0.0.5"],"extra":1,
                 "createdAt":"2024-01-01T00:00:00Z","uid":"u-1"}"#,
        )
        .unwrap();
        assert_eq!(instance.provider_id, "ref/web");
        assert!(matches!(instance.state, InstanceState::Stopped));
        assert_eq!(instance.addresses, vec!["10.0.0.5".to_string()]);
        assert_eq!(instance.created_at.as_deref(), Some("2024-01-01T00:00:00Z"));
        assert_eq!(instance.uid, "u-1");

        let minimal = parse_instance(br#"{"name":"db","state":"provisioning"}"#).unwrap();
        assert!(minimal.addresses.is_empty());
        assert_eq!(minimal.created_at, None);
        assert_eq!(minimal.uid, "");
    }

    #[test]
    fn parses_a_list_of_instances() {
        let instances = parse_instances(
            br#"[{"name":"a","state":"running","addresses":[]},
                 {"name":"b","state":"failed","addresses":["10.0.0.9"]}]"#,
        )
        .unwrap();
        let names: Vec<_> = instances.iter().map(|i| i.provider_id.as_str()).collect();
        assert_eq!(names, ["ref/a", "ref/b"]);
        assert!(matches!(instances[1].state, InstanceState::Failed));
    }

    #[test]
    fn unreadable_bodies_are_permanent_errors() {
        for body in [
            &b"<html>login</html>"[..],
            b"{}",
            br#"{"name":"a"}"#,
            b"[1]",
            b"",
        ] {
            let shown = String::from_utf8_lossy(body);
            assert!(
                matches!(parse_instance(body), Err(Error::Permanent(_))),
                "{shown}"
            );
            assert!(
                matches!(parse_instances(body), Err(Error::Permanent(_))),
                "{shown}"
            );
        }
        assert!(matches!(
            parse_instances(br#"[{"name":"a","state":"melting"}]"#),
            Err(Error::Permanent(_))
        ));
    }
}
