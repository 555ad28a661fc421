//! The provider's configuration (camelCase JSON, unknown keys rejected), its checks and the JSON
//! Schema `describe` publishes (`config.schema.json` beside this file).
//!
//! There is no token and no CA here: the host's egress broker injects `Authorization` and verifies
//! TLS for `apiUrl`.

use serde::Deserialize;

use crate::egress::provider::types::Error;

/// The JSON Schema (draft 2020-12) of the configuration.
pub const SCHEMA: &str = include_str!("config.schema.json");

/// `validate-config`: check a configuration without any I/O.
pub fn validate_config(json: &str) -> Result<(), Error> {
    Config::parse(json).map(|_| ()).map_err(Error::Permanent)
}

/// Highest VMID Proxmox accepts.
pub const MAX_VMID: u32 = 999_999_999;

/// A parsed, validated configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `host[:port]` of the API (the scheme is always https).
    pub authority: String,
    /// Where VMs are placed; the first is the default placement.
    pub nodes: Vec<String>,
    pub template_vmid: u32,
    /// Storage for the clone's disks; `None` keeps the template's.
    pub target_storage: Option<String>,
    /// Directory storage with ISO content where seeds go (the token needs Datastore.Allocate on it).
    pub iso_storage: String,
    pub bridge: Option<String>,
    pub vlan_tag: Option<u16>,
    pub disk_gib: Option<u32>,
    pub cores: Option<u32>,
    pub memory_mib: Option<u32>,
    pub vmid_min: u32,
    pub vmid_max: u32,
    pub poll_ms: u64,
    pub clone_seconds: u64,
    pub running_seconds: u64,
    /// The template already has qemu-guest-agent, so the seed carries no vendor-data
    /// (correction 10).
    pub template_has_guest_agent: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawConfig {
    api_url: String,
    nodes: Vec<String>,
    template_vmid: u32,
    target_storage: Option<String>,
    iso_storage: String,
    bridge: Option<String>,
    vlan_tag: Option<u16>,
    #[serde(rename = "diskGiB")]
    disk_gib: Option<u32>,
    cores: Option<u32>,
    #[serde(rename = "memoryMiB")]
    memory_mib: Option<u32>,
    vmid_range: Option<RawRange>,
    budgets: Option<RawBudgets>,
    template_has_guest_agent: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRange {
    min: u32,
    max: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawBudgets {
    poll_ms: Option<u64>,
    clone_seconds: Option<u64>,
    running_seconds: Option<u64>,
}

fn invalid(why: impl std::fmt::Display) -> String {
    format!("invalid configuration: {why}")
}

impl Config {
    /// Parse and check a configuration; the error is a message for a person.
    pub fn parse(json: &str) -> Result<Config, String> {
        let raw: RawConfig = serde_json::from_str(json).map_err(invalid)?;
        let authority = parse_api_url(&raw.api_url)?;
        if raw.nodes.is_empty() {
            return Err(invalid("nodes must list at least one node"));
        }
        for node in &raw.nodes {
            check_name("nodes", node, |c| c.is_ascii_alphanumeric() || c == '-')?;
        }
        if !(100..=MAX_VMID).contains(&raw.template_vmid) {
            return Err(invalid(format!("templateVmid must be 100 to {MAX_VMID}")));
        }
        let storage_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if let Some(storage) = &raw.target_storage {
            check_name("targetStorage", storage, storage_char)?;
        }
        check_name("isoStorage", &raw.iso_storage, storage_char)?;
        if let Some(bridge) = &raw.bridge {
            check_bridge(bridge)?;
        }
        if let Some(tag) = raw.vlan_tag
            && !(1..=4094).contains(&tag)
        {
            return Err(invalid("vlanTag must be 1 to 4094"));
        }
        check_range("diskGiB", raw.disk_gib, 1, 65_536)?;
        check_range("cores", raw.cores, 1, 512)?;
        check_range("memoryMiB", raw.memory_mib, 16, 4 * 1024 * 1024)?;
        let (vmid_min, vmid_max) = match raw.vmid_range {
            Some(range) => (range.min, range.max),
            None => (100_000, 199_999),
        };
        if vmid_min < 100 || vmid_max > MAX_VMID || vmid_min > vmid_max {
            return Err(invalid(format!(
                "vmidRange must satisfy 100 <= min <= max <= {MAX_VMID}"
            )));
        }
        if (vmid_min..=vmid_max).contains(&raw.template_vmid) {
            return Err(invalid("templateVmid must lie outside vmidRange"));
        }
        let budgets = raw.budgets.unwrap_or(RawBudgets {
            poll_ms: None,
            clone_seconds: None,
            running_seconds: None,
        });
        let poll_ms = budgets.poll_ms.unwrap_or(2_000);
        let clone_seconds = budgets.clone_seconds.unwrap_or(600);
        let running_seconds = budgets.running_seconds.unwrap_or(60);
        if !(10..=60_000).contains(&poll_ms) {
            return Err(invalid("budgets.pollMs must be 10 to 60000"));
        }
        if !(1..=86_400).contains(&clone_seconds) || !(1..=86_400).contains(&running_seconds) {
            return Err(invalid(
                "budgets.cloneSeconds and budgets.runningSeconds must be 1 to 86400",
            ));
        }
        Ok(Config {
            authority,
            nodes: raw.nodes,
            template_vmid: raw.template_vmid,
            target_storage: raw.target_storage,
            iso_storage: raw.iso_storage,
            bridge: raw.bridge,
            vlan_tag: raw.vlan_tag,
            disk_gib: raw.disk_gib,
            cores: raw.cores,
            memory_mib: raw.memory_mib,
            vmid_min,
            vmid_max,
            poll_ms,
            clone_seconds,
            running_seconds,
            template_has_guest_agent: raw.template_has_guest_agent.unwrap_or(false),
        })
    }

    /// The default placement node.
    pub fn placement_node(&self) -> &str {
        &self.nodes[0]
    }
}

fn check_range(key: &str, value: Option<u32>, min: u32, max: u32) -> Result<(), String> {
    match value {
        Some(value) if !(min..=max).contains(&value) => {
            Err(invalid(format!("{key} must be {min} to {max}")))
        }
        _ => Ok(()),
    }
}

fn check_name(key: &str, value: &str, allowed: impl Fn(char) -> bool) -> Result<(), String> {
    if value.is_empty() || value.len() > 128 || !value.chars().all(allowed) {
        return Err(invalid(format!(
            "{key} has an empty or invalid name {value:?}"
        )));
    }
    Ok(())
}

/// Whether `name` is spelled as Proxmox spells a bridge: its `pve-iface` format (a letter, then 1
/// to 20 letters, digits or `_`) without the `.<n>` suffix that names a VLAN interface.
fn is_bridge_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic())
        && (2..=21).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `bridge` names a bridge a VM NIC can join. `vmbr0.4` (or `vmbr0.4@vmbr0`, as `ip link` prints
/// it) is the host's own interface on VLAN 4 of vmbr0, not a bridge: the Phase 0 VLAN was given
/// that way, and the Proxmox form is `bridge=vmbr0,tag=4`.
fn check_bridge(bridge: &str) -> Result<(), String> {
    if is_bridge_name(bridge) {
        return Ok(());
    }
    let interface = bridge
        .split_once('@')
        .map_or(bridge, |(interface, _)| interface);
    if let Some((parent, tag)) = interface.rsplit_once('.')
        && is_bridge_name(parent)
        && let Ok(tag) = tag.parse::<u16>()
        && (1..=4094).contains(&tag)
    {
        return Err(invalid(format!(
            "bridge {bridge:?} is the host's interface on VLAN {tag} of {parent}, not a bridge a \
             VM can join: the Proxmox form is bridge={parent},tag={tag}, so set \
             \"bridge\": {parent:?} and \"vlanTag\": {tag} (on a VLAN-aware {parent})"
        )));
    }
    Err(invalid(format!(
        "bridge {bridge:?} is not a bridge name: a letter, then 1 to 20 letters, digits or `_` \
         (a `.` marks a VLAN interface: use the bridge with vlanTag instead)"
    )))
}

/// `https://host[:port]` with an optional trailing `/`. Plain http is refused: the broker verifies
/// TLS, and the API token must never travel in clear.
fn parse_api_url(url: &str) -> Result<String, String> {
    let rest = url
        .get(..8)
        .filter(|scheme| scheme.eq_ignore_ascii_case("https://"))
        .map(|_| &url[8..])
        .ok_or_else(|| invalid("apiUrl must start with https://"))?;
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains('@') {
        return Err(invalid(
            "apiUrl must not carry user info: the host injects credentials",
        ));
    }
    if authority.is_empty()
        || authority.contains(['/', '?', '#'])
        || authority
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(invalid(
            "apiUrl must be https://host[:port] with no path (the API lives at /api2/json)",
        ));
    }
    let port = if let Some(bracketed) = authority.strip_prefix('[') {
        let (_, after) = bracketed
            .split_once(']')
            .ok_or_else(|| invalid("apiUrl has an unclosed `[`"))?;
        after.strip_prefix(':')
    } else {
        authority.split_once(':').map(|(_, port)| port)
    };
    if let Some(port) = port
        && port.parse::<u16>().is_err()
    {
        return Err(invalid(
            "apiUrl has a port that is not a number from 0 to 65535",
        ));
    }
    Ok(authority.to_string())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The configuration the simulator tests use (template 9001 on pv1-1, seeds on proxy-seeds).
    pub const SIMULATOR: &str = r#"{"apiUrl":"https://192.168.0.8:8006","nodes":["pv1-1"],
        "templateVmid":9001,"targetStorage":"local-lvm","isoStorage":"proxy-seeds"}"#;

    pub fn simulator_config() -> Config {
        Config::parse(SIMULATOR).unwrap()
    }

    fn error_of(json: &str) -> String {
        Config::parse(json).expect_err(json)
    }

    #[test]
    fn minimal_configuration_takes_the_defaults() {
        let config = simulator_config();
        assert_eq!(config.authority, "192.168.0.8:8006");
        assert_eq!((config.vmid_min, config.vmid_max), (100_000, 199_999));
        assert_eq!(
            (config.poll_ms, config.clone_seconds, config.running_seconds),
            (2_000, 600, 60)
        );
        assert!(
            !config.template_has_guest_agent,
            "correction 10: default installs the agent"
        );
        assert_eq!(config.placement_node(), "pv1-1");
    }

    #[test]
    fn every_key_is_read() {
        let config = Config::parse(
            r#"{"apiUrl":"https://pve.example:8006/","nodes":["pv1-1","pv1-2"],"templateVmid":9001,
                "targetStorage":"local-lvm","isoStorage":"proxy-seeds","bridge":"vmbr0","vlanTag":4,
                "diskGiB":32,"cores":2,"memoryMiB":1024,"vmidRange":{"min":500,"max":600},
                "budgets":{"pollMs":50,"cloneSeconds":30,"runningSeconds":5},"templateHasGuestAgent":true}"#,
        )
        .unwrap();
        assert_eq!(config.authority, "pve.example:8006");
        assert_eq!(config.nodes, ["pv1-1", "pv1-2"]);
        assert_eq!(
            (config.bridge.as_deref(), config.vlan_tag),
            (Some("vmbr0"), Some(4))
        );
        assert_eq!(
            (config.disk_gib, config.cores, config.memory_mib),
            (Some(32), Some(2), Some(1024))
        );
        assert_eq!((config.vmid_min, config.vmid_max), (500, 600));
        assert_eq!(
            (config.poll_ms, config.clone_seconds, config.running_seconds),
            (50, 30, 5)
        );
        assert!(config.template_has_guest_agent);
    }

    #[test]
    fn bad_configurations_are_refused_with_a_reason() {
        let base = |extra: &str| {
            format!(
                r#"{{"apiUrl":"https://pve:8006","nodes":["pv1-1"],"templateVmid":9001,"isoStorage":"proxy-seeds"{extra}}}"#
            )
        };
        let cases = [
            (r#"{"apiUrl":"https://pve","nodes":["n"],"templateVmid":9001}"#.to_string(), "isoStorage"),
            (base(r#","tokenFile":"/x""#), "unknown field `tokenFile`"),
            (base(r#","vlanTag":0"#), "vlanTag"),
            (base(r#","vlanTag":4095"#), "vlanTag"),
            (base(r#","vmidRange":{"min":5,"max":10}"#), "vmidRange"),
            (base(r#","vmidRange":{"min":300,"max":200}"#), "vmidRange"),
            (base(r#","vmidRange":{"min":9000,"max":9100}"#), "outside vmidRange"),
            (base(r#","diskGiB":0"#), "diskGiB"),
            (base(r#","budgets":{"pollMs":0}"#), "pollMs"),
            (base(r#","bridge":"vmbr0 tag=4""#), "bridge"),
            (r#"{"apiUrl":"https://pve","nodes":[],"templateVmid":9001,"isoStorage":"s"}"#.into(), "at least one node"),
            (r#"{"apiUrl":"http://pve","nodes":["n"],"templateVmid":9001,"isoStorage":"s"}"#.into(), "https://"),
            (r#"{"apiUrl":"https://root:pw@pve","nodes":["n"],"templateVmid":9001,"isoStorage":"s"}"#.into(), "user info"),
            (r#"{"apiUrl":"https://pve/api2","nodes":["n"],"templateVmid":9001,"isoStorage":"s"}"#.into(), "no path"),
            (r#"{"apiUrl":"https://pve:x","nodes":["n"],"templateVmid":9001,"isoStorage":"s"}"#.into(), "port"),
            ("[]".into(), "invalid configuration"),
        ];
        for (json, why) in cases {
            let error = error_of(&json);
            assert!(error.contains(why), "{json}: {error}");
            assert!(!error.contains("pw@"), "{error}");
        }
    }

    /// Phase 0: the VLAN was given as `vmbr0.4@vmbr0`, the host's VLAN interface, which no VM NIC
    /// can join; the message names the Proxmox form.
    #[test]
    fn phase0_a_vlan_interface_is_refused_as_a_bridge_with_the_proxmox_form() {
        let with_bridge = |bridge: &str| {
            format!(
                r#"{{"apiUrl":"https://pve:8006","nodes":["pv1-1"],"templateVmid":9001,"isoStorage":"proxy-seeds","bridge":"{bridge}"}}"#
            )
        };
        for given in ["vmbr0.4", "vmbr0.4@vmbr0"] {
            let error = error_of(&with_bridge(given));
            assert!(
                error.contains("bridge=vmbr0,tag=4")
                    && error.contains(r#""bridge": "vmbr0""#)
                    && error.contains(r#""vlanTag": 4"#),
                "{given}: {error}"
            );
        }
        for bad in [
            "vmbr-0",
            "0vmbr",
            "v",
            "vmbr0.x",
            "vmbr0.4095",
            &"b".repeat(22),
        ] {
            let error = error_of(&with_bridge(bad));
            assert!(error.contains("not a bridge name"), "{bad}: {error}");
        }
        for good in ["vmbr0", "vmbr4094", "br_lan", "vnet1", &"b".repeat(21)] {
            Config::parse(&with_bridge(good)).unwrap_or_else(|error| panic!("{good}: {error}"));
        }
        // The schema says the same: no `.` (nor `-`) in a bridge name.
        let schema: serde_json::Value = serde_json::from_str(SCHEMA).unwrap();
        assert_eq!(
            schema["properties"]["bridge"]["pattern"],
            "^[A-Za-z][A-Za-z0-9_]{1,20}$"
        );
    }

    #[test]
    fn validate_config_is_permanent() {
        assert!(validate_config(SIMULATOR).is_ok());
        assert!(matches!(validate_config("{}"), Err(Error::Permanent(_))));
    }

    #[test]
    fn schema_lists_exactly_the_accepted_keys() {
        let schema: serde_json::Value = serde_json::from_str(SCHEMA).unwrap();
        assert_eq!(schema["additionalProperties"], false);
        let mut keys: Vec<&str> = schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "apiUrl",
                "bridge",
                "budgets",
                "cores",
                "diskGiB",
                "isoStorage",
                "memoryMiB",
                "nodes",
                "targetStorage",
                "templateHasGuestAgent",
                "templateVmid",
                "vlanTag",
                "vmidRange"
            ]
        );
        // Every key in the schema is one the parser accepts: a config naming them all parses.
        let required: Vec<&str> = schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert_eq!(required, ["apiUrl", "nodes", "templateVmid", "isoStorage"]);
    }
}
