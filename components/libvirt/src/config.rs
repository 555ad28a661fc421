//! The provider's configuration (`ProviderConfig.spec.config`), parsed and checked without
//! touching the hypervisor.

use serde::Deserialize;

use crate::egress::provider::types::Error;

/// JSON Schema (draft 2020-12) of [`Config`], as `describe` reports it.
pub const SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "required": ["connections", "pool", "image"],
  "properties": {
    "connections": {
      "type": "array",
      "minItems": 1,
      "maxItems": 16,
      "uniqueItems": true,
      "items": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[^/]+$"},
      "description": "Connection names of the host's libvirt grant, one per hypervisor; every one is searched before a VM is made"
    },
    "placement": {
      "enum": ["mostAvailable", "firstWithRoom"],
      "default": "mostAvailable",
      "description": "Which connection a new VM goes to: the pool with the most available bytes (ties in list order), or the first in list order with room for its disk and seed"
    },
    "pool": {"type": "string", "minLength": 1, "description": "The granted storage pool for base image, disks and seeds"},
    "network": {"type": "string", "minLength": 1, "description": "The libvirt network the NIC joins (or bridge)"},
    "bridge": {"type": "string", "minLength": 1, "description": "The host bridge the NIC joins (or network)"},
    "image": {
      "type": "object",
      "additionalProperties": false,
      "required": ["url", "sha256"],
      "properties": {
        "url": {"type": "string", "pattern": "^https://"},
        "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "format": {"enum": ["qcow2", "raw"]}
      }
    },
    "domainType": {"enum": ["kvm", "qemu", "test"]},
    "memoryMiB": {"type": "integer", "minimum": 64, "maximum": 1048576},
    "vcpus": {"type": "integer", "minimum": 1, "maximum": 256},
    "diskGiB": {"type": "integer", "minimum": 1, "maximum": 65536},
    "diskMode": {
      "enum": ["copyOnWrite", "fullCopy"],
      "default": "copyOnWrite",
      "description": "How a VM's disk is made from the base image: a qcow2 volume backed by it (made at once, near-empty until the guest writes), or a whole copy that stands on its own"
    },
    "installGuestAgent": {"type": "boolean"}
  },
  "oneOf": [{"required": ["network"]}, {"required": ["bridge"]}]
}"#;

/// Most hypervisors one ProviderConfig spans: create looks the name up on each of them.
const MAX_CONNECTIONS: usize = 16;

/// Longest name libvirt takes as one path component; the seed name adds 9 bytes to the proxy's.
const MAX_NAME_BYTES: usize = 255;

/// The base image every VM's disk is made from.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Image {
    /// An HTTPS URL on an origin of the host's grant.
    pub url: String,
    /// Lower-case hex sha256 of the image: the host checks it while importing, and it names the
    /// base volume, so each image is imported once.
    pub sha256: String,
    /// The image's format, which a whole copy keeps.
    #[serde(default)]
    pub format: VolumeFormat,
}

/// A disk format of libvirt's `dir` pools.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum VolumeFormat {
    /// QEMU copy-on-write v2 (needs `qemu-img` on the hypervisor).
    #[default]
    Qcow2,
    /// Plain bytes.
    Raw,
}

impl VolumeFormat {
    /// The name libvirt uses (`<format type='…'>`), also the volume's file extension.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeFormat::Qcow2 => "qcow2",
            VolumeFormat::Raw => "raw",
        }
    }
}

/// Which connection a new VM goes to (a retried create continues where a cut attempt left a
/// volume, whatever the rule).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Placement {
    /// The pool with the most available bytes; ties go to the first in list order.
    #[default]
    MostAvailable,
    /// The first in list order whose pool has room for the disk and the seed.
    FirstWithRoom,
}

/// How a VM's disk is made from the base image.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum DiskMode {
    /// A qcow2 volume backed by the base, which it reads until the guest writes (copy-on-write):
    /// made in one call whatever the image's size, and near-empty.
    #[default]
    CopyOnWrite,
    /// A whole copy of the base in the image's format: slower and as large as the image's data,
    /// but it stands on its own (the base can go, and no VM's reads land on it).
    FullCopy,
}

/// `<domain type='…'>`.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DomainType {
    /// Hardware virtualisation: production.
    #[default]
    Kvm,
    /// TCG emulation, for hypervisors without `/dev/kvm`.
    Qemu,
    /// libvirt's test driver.
    Test,
}

impl DomainType {
    /// The attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            DomainType::Kvm => "kvm",
            DomainType::Qemu => "qemu",
            DomainType::Test => "test",
        }
    }
}

/// Where the VM's one NIC is plugged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Nic {
    /// A libvirt network (DHCP leases are then a source of addresses).
    Network(String),
    /// A host bridge (addresses come from the guest agent only).
    Bridge(String),
}

/// The parsed configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The grant's connection names, one per hypervisor, distinct, in the configured order.
    pub connections: Vec<String>,
    /// How create chooses among them.
    pub placement: Placement,
    /// The granted pool.
    pub pool: String,
    /// The NIC's attachment.
    pub nic: Nic,
    /// The base image.
    pub image: Image,
    /// `<domain type>`.
    pub domain_type: DomainType,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// The disk's size; `None` keeps the base image's.
    pub disk_gib: Option<u64>,
    /// How the disk is made.
    pub disk_mode: DiskMode,
    /// Whether the seed's vendor-data installs the QEMU guest agent.
    pub install_guest_agent: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Raw {
    connections: Vec<String>,
    #[serde(default)]
    placement: Placement,
    pool: String,
    #[serde(default)]
    network: Option<String>,
    #[serde(default)]
    bridge: Option<String>,
    image: Image,
    #[serde(default)]
    domain_type: DomainType,
    #[serde(default = "default_memory_mib", rename = "memoryMiB")]
    memory_mib: u64,
    #[serde(default = "default_vcpus")]
    vcpus: u32,
    #[serde(default, rename = "diskGiB")]
    disk_gib: Option<u64>,
    #[serde(default)]
    disk_mode: DiskMode,
    #[serde(default = "default_true")]
    install_guest_agent: bool,
}

fn default_memory_mib() -> u64 {
    1024
}

fn default_vcpus() -> u32 {
    1
}

fn default_true() -> bool {
    true
}

/// A name libvirt takes as one path component.
fn simple_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES || name.contains(['/', '\0']) {
        return Err(format!(
            "{what} must be 1 to {MAX_NAME_BYTES} bytes without '/' or NUL"
        ));
    }
    Ok(())
}

impl Config {
    /// Parses and checks `json`; the message says which field is wrong.
    pub fn parse(json: &str) -> Result<Config, String> {
        let raw: Raw =
            serde_json::from_str(json).map_err(|error| format!("libvirt config: {error}"))?;
        if !(1..=MAX_CONNECTIONS).contains(&raw.connections.len()) {
            return Err(format!(
                "connections must list 1 to {MAX_CONNECTIONS} connection names"
            ));
        }
        for (index, connection) in raw.connections.iter().enumerate() {
            simple_name("each connection name", connection)?;
            if raw.connections[..index].contains(connection) {
                return Err(format!("connections lists {connection:?} twice"));
            }
        }
        simple_name("pool", &raw.pool)?;
        let nic = match (raw.network, raw.bridge) {
            (Some(network), None) => {
                simple_name("network", &network)?;
                Nic::Network(network)
            }
            (None, Some(bridge)) => {
                simple_name("bridge", &bridge)?;
                Nic::Bridge(bridge)
            }
            _ => return Err("libvirt config: set exactly one of network and bridge".into()),
        };
        if !raw.image.url.starts_with("https://") {
            return Err("image.url must be an https:// URL".into());
        }
        let sha = &raw.image.sha256;
        if sha.len() != 64 || !sha.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err("image.sha256 must be 64 lower-case hex digits".into());
        }
        if !(64..=1_048_576).contains(&raw.memory_mib) {
            return Err("memoryMiB must be 64 to 1048576".into());
        }
        if !(1..=256).contains(&raw.vcpus) {
            return Err("vcpus must be 1 to 256".into());
        }
        if raw.disk_gib.is_some_and(|gib| !(1..=65_536).contains(&gib)) {
            return Err("diskGiB must be 1 to 65536".into());
        }
        Ok(Config {
            connections: raw.connections,
            placement: raw.placement,
            pool: raw.pool,
            nic,
            image: raw.image,
            domain_type: raw.domain_type,
            memory_mib: raw.memory_mib,
            vcpus: raw.vcpus,
            disk_gib: raw.disk_gib,
            disk_mode: raw.disk_mode,
            install_guest_agent: raw.install_guest_agent,
        })
    }

    /// The format of a VM's disk: qcow2 when it is backed by the base, else the image's.
    pub fn disk_format(&self) -> VolumeFormat {
        match self.disk_mode {
            DiskMode::CopyOnWrite => VolumeFormat::Qcow2,
            DiskMode::FullCopy => self.image.format,
        }
    }
}

/// `validate-config`: [`Config::parse`], its message as `permanent`.
pub fn validate_config(json: &str) -> Result<(), Error> {
    Config::parse(json).map(drop).map_err(Error::Permanent)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn json(extra: &str) -> String {
        format!(
            r#"{{"connections":["hv1"],"pool":"default","image":{{"url":"https://images.lab/base.qcow2","sha256":"{SHA}"}}{extra}}}"#
        )
    }

    #[test]
    fn a_minimal_config_takes_the_defaults() {
        let config = Config::parse(&json(r#","network":"default""#)).unwrap();
        assert_eq!(config.nic, Nic::Network("default".into()));
        assert_eq!(config.domain_type, DomainType::Kvm);
        assert_eq!(config.image.format, VolumeFormat::Qcow2);
        assert_eq!((config.memory_mib, config.vcpus), (1024, 1));
        assert_eq!(config.disk_gib, None);
        assert_eq!(config.disk_mode, DiskMode::CopyOnWrite);
        assert!(config.install_guest_agent);
        let schema: serde_json::Value = serde_json::from_str(SCHEMA).unwrap();
        assert_eq!(schema["required"][0], "connections");
        assert_eq!(config.connections, ["hv1"]);
        assert_eq!(config.placement, Placement::MostAvailable);
    }

    #[test]
    fn connections_keep_their_order_and_placement_is_read() {
        let text = json(r#","bridge":"br0","placement":"firstWithRoom""#)
            .replace(r#"["hv1"]"#, r#"["hv2","hv1","hv3"]"#);
        let config = Config::parse(&text).unwrap();
        assert_eq!(config.connections, ["hv2", "hv1", "hv3"]);
        assert_eq!(config.placement, Placement::FirstWithRoom);
        let schema: serde_json::Value = serde_json::from_str(SCHEMA).unwrap();
        assert_eq!(schema["properties"]["connections"]["maxItems"], 16);
        assert_eq!(
            schema["properties"]["placement"]["enum"],
            serde_json::json!(["mostAvailable", "firstWithRoom"])
        );
    }

    #[test]
    fn a_disk_is_qcow2_when_backed_by_the_base_and_in_the_images_format_when_copied() {
        let rows = [
            (r#""qcow2""#, "", VolumeFormat::Qcow2),
            (r#""raw""#, "", VolumeFormat::Qcow2),
            (
                r#""raw""#,
                r#","diskMode":"copyOnWrite""#,
                VolumeFormat::Qcow2,
            ),
            (r#""raw""#, r#","diskMode":"fullCopy""#, VolumeFormat::Raw),
            (
                r#""qcow2""#,
                r#","diskMode":"fullCopy""#,
                VolumeFormat::Qcow2,
            ),
        ];
        for (format, mode, want) in rows {
            let text = json(&format!(r#","bridge":"br0"{mode}"#))
                .replace(r#""sha256""#, &format!(r#""format":{format},"sha256""#));
            assert_eq!(Config::parse(&text).unwrap().disk_format(), want, "{text}");
        }
        let schema: serde_json::Value = serde_json::from_str(SCHEMA).unwrap();
        assert_eq!(
            schema["properties"]["diskMode"]["enum"],
            serde_json::json!(["copyOnWrite", "fullCopy"])
        );
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases = [
            (json(""), "exactly one of network and bridge"),
            (json(r#","network":"a","bridge":"b""#), "exactly one"),
            (json(r#","bridge":"a/b""#), "bridge must be"),
            (json(r#","bridge":"br0","memoryMiB":8"#), "memoryMiB"),
            (json(r#","bridge":"br0","vcpus":0"#), "vcpus"),
            (json(r#","bridge":"br0","diskGiB":0"#), "diskGiB"),
            (
                json(r#","bridge":"br0","domainType":"xen""#),
                "unknown variant",
            ),
            (json(r#","bridge":"br0","password":"x""#), "unknown field"),
            (
                json(r#","bridge":"br0""#).replace("https://", "http://"),
                "image.url",
            ),
            (
                json(r#","bridge":"br0""#).replace(SHA, &SHA.to_uppercase()),
                "image.sha256",
            ),
            (r#"{"connections":[""]}"#.to_string(), "missing field"),
            (
                json(r#","bridge":"br0""#).replace(r#""connections":["hv1"],"#, ""),
                "missing field `connections`",
            ),
            (
                json(r#","bridge":"br0""#).replace(r#""connections""#, r#""connection""#),
                "unknown field `connection`",
            ),
            (
                json(r#","bridge":"br0""#).replace(r#"["hv1"]"#, "[]"),
                "connections must list 1 to 16",
            ),
            (
                json(r#","bridge":"br0""#).replace(
                    r#"["hv1"]"#,
                    &serde_json::to_string(&(0..17).map(|n| format!("hv{n}")).collect::<Vec<_>>())
                        .unwrap(),
                ),
                "connections must list 1 to 16",
            ),
            (
                json(r#","bridge":"br0""#).replace(r#"["hv1"]"#, r#"["hv1","hv2","hv1"]"#),
                r#"connections lists "hv1" twice"#,
            ),
            (
                json(r#","bridge":"br0""#).replace(r#"["hv1"]"#, r#"["hv1","a/b"]"#),
                "each connection name must be",
            ),
            (
                json(r#","bridge":"br0""#).replace(r#"["hv1"]"#, r#""hv1""#),
                "invalid type",
            ),
            (
                json(r#","bridge":"br0","placement":"random""#),
                "unknown variant",
            ),
            (
                json(r#","bridge":"br0","diskMode":"linked""#),
                "unknown variant `linked`",
            ),
        ];
        for (text, expected) in cases {
            let error = Config::parse(&text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
        assert!(matches!(validate_config("{}"), Err(Error::Permanent(_))));
    }
}
