//! Grant configuration: which hypervisors each provider may reach, and what it may use there.
//!
//! The format (YAML or JSON, camelCase keys, unknown keys refused):
//!
//! ```yaml
//! grants:
//!   kvm2:                                        # the provider's identity, as the host names it
//!     connections:
//!       - name: hv1                              # what the guest passes to connection.open
//!         uri: qemu+libssh2://egress@hv1.lab/system
//!         sshKeyFile: /etc/egress/hv1/id_ed25519 # read by libvirt on every dial
//!         knownHostsFile: /etc/egress/hv1/known_hosts
//!         undefineFlags: [managedSave, snapshotsMetadata, checkpointsMetadata, nvram]
//!         pools: [default, images]               # storage pools it may use
//!         networks: [default]                    # libvirt networks its domains may join
//!         bridges: [br0]                         # host bridges its domains may join
//!     images:                                    # base images the host imports for it
//!       origins: ["https://images.lab"]          # https://host[:port], no path; default deny
//!       caFile: /etc/egress/images-ca.pem        # the only roots trusted; no system roots
//!       maxBytes: 8589934592                     # largest image (8 GiB, the default)
//!     timeouts: { callMs: 30000, importMs: 1800000 }
//!     maxUploadBytes: 67108864                   # largest guest upload (64 MiB, the default)
//! ```
//!
//! [`Grants`] is only the parsed document; `LibvirtCapability::new` validates it and refuses a
//! grant that cannot be served safely, naming the provider and the field. Validation reads no
//! file: the SSH files and the CA are read when a call needs them.
//!
//! # In the host's grants file
//!
//! The host's one grants file (the CLI's `--grants`, parsed for HTTP by
//! `egress-capability-http`) carries each identity's libvirt grant under its `libvirt` key,
//! beside the HTTP grant's keys; [`Grants::from_grants_file_yaml`] reads those. The identity's
//! `digest` pins both:
//!
//! ```yaml
//! grants:
//!   proxmox:                       # HTTP only
//!     origins: ["https://192.168.2.8:8006"]
//!   kvm2:                          # libvirt only
//!     digest: "sha256:9f86d0…"     # optional: pins the HTTP and the libvirt grant
//!     libvirt:
//!       connections:
//!         - name: hv1
//!           uri: qemu+libssh2://egress@hv1.lab/system
//!           sshKeyFile: /etc/egress/hv1/id_ed25519
//!           knownHostsFile: /etc/egress/hv1/known_hosts
//!           pools: [default]
//!           networks: [default]
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// Per-call timeout when a grant sets none.
pub const DEFAULT_CALL_MS: u64 = 30_000;
/// Timeout of one image import (download and upload) when a grant sets none.
pub const DEFAULT_IMPORT_MS: u64 = 30 * 60 * 1000;
/// Largest guest upload into one volume when a grant sets none (64 MiB).
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 64 * 1024 * 1024;
/// Largest imported image when a grant sets none (8 GiB).
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 8 * 1024 * 1024 * 1024;

/// Every provider's libvirt grant, keyed by provider identity. A provider without one gets no
/// libvirt capability at all.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grants {
    /// Grants by provider identity (the name the host gives the provider).
    pub grants: BTreeMap<String, Grant>,
}

impl Grants {
    /// Parses grants from YAML.
    pub fn from_yaml(text: &str) -> Result<Self, GrantError> {
        serde_norway::from_str(text).map_err(|error| GrantError::Parse(error.to_string()))
    }

    /// Parses grants from JSON.
    pub fn from_json(text: &str) -> Result<Self, GrantError> {
        serde_json::from_str(text).map_err(|error| GrantError::Parse(error.to_string()))
    }

    /// The libvirt grants of the host's grants file, YAML (see the [module docs](self)): each
    /// identity's `libvirt` key, pinned by the identity's `digest` when it has one. Identities
    /// without a `libvirt` key get no libvirt grant; the other keys are the HTTP broker's and are
    /// not looked at here (the broker refuses unknown ones).
    pub fn from_grants_file_yaml(text: &str) -> Result<Self, GrantError> {
        let file: GrantsFile =
            serde_norway::from_str(text).map_err(|error| GrantError::Parse(error.to_string()))?;
        file.into_grants()
    }

    /// [`Grants::from_grants_file_yaml`] for a JSON grants file.
    pub fn from_grants_file_json(text: &str) -> Result<Self, GrantError> {
        let file: GrantsFile =
            serde_json::from_str(text).map_err(|error| GrantError::Parse(error.to_string()))?;
        file.into_grants()
    }
}

/// The host's grants file, as far as libvirt is concerned.
#[derive(Deserialize)]
struct GrantsFile {
    #[serde(default)]
    grants: BTreeMap<String, IdentityGrant>,
}

/// One identity's entry of the grants file: the keys libvirt reads.
#[derive(Deserialize)]
struct IdentityGrant {
    #[serde(default)]
    digest: Option<String>,
    #[serde(default)]
    libvirt: Option<Grant>,
}

impl GrantsFile {
    fn into_grants(self) -> Result<Grants, GrantError> {
        let mut grants = BTreeMap::new();
        for (identity, entry) in self.grants {
            let Some(mut grant) = entry.libvirt else {
                continue;
            };
            match (&grant.digest, entry.digest) {
                (Some(own), Some(identity_digest)) if !same_digest(own, &identity_digest) => {
                    return Err(GrantError::Invalid {
                        provider: identity,
                        field: "libvirt.digest".into(),
                        reason: "differs from the identity's digest".into(),
                    });
                }
                (None, Some(identity_digest)) => grant.digest = Some(identity_digest),
                _ => {}
            }
            grants.insert(identity, grant);
        }
        Ok(Grants { grants })
    }
}

/// Whether two digest pins (`sha256:<hex>` or bare hex) name the same bytes.
fn same_digest(a: &str, b: &str) -> bool {
    let bare = |pin: &str| {
        pin.strip_prefix("sha256:")
            .unwrap_or(pin)
            .to_ascii_lowercase()
    };
    bare(a) == bare(b)
}

/// What one provider may reach through libvirt.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Grant {
    /// Pins the grant to one component: `sha256:<hex>` of its bytes (or the bare hex). A
    /// provider with this identity but other bytes gets the ungranted state: every call denied.
    /// In the host's grants file, the identity's own `digest` pins it too.
    #[serde(default)]
    pub digest: Option<String>,
    /// The hypervisors, by the name the guest opens them with.
    pub connections: Vec<ConnectionGrant>,
    /// Where base images may be imported from; no imports when absent.
    #[serde(default)]
    pub images: Option<ImageGrant>,
    /// Per-call and import timeouts.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Largest number of bytes one `volume.upload` may write.
    #[serde(default = "default_max_upload_bytes")]
    pub max_upload_bytes: u64,
}

/// One hypervisor connection and what the provider may use on it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConnectionGrant {
    /// The name the guest passes to `connection.open`.
    pub name: String,
    /// The libvirt URI, for example `qemu+libssh2://egress@hv1/system` or `qemu:///system`. It
    /// may not carry the SSH parameters the host sets itself (`keyfile`, `known_hosts`, …).
    pub uri: String,
    /// Private key for an SSH transport, passed to libvirt as `keyfile` on every dial, so a
    /// rotated key is used from the next dial on.
    #[serde(default)]
    pub ssh_key_file: Option<PathBuf>,
    /// known_hosts for the `libssh` and `libssh2` transports, passed as `known_hosts` with strict
    /// verification. (libvirt 9's `ssh` transport, which runs the `ssh` binary, has no such
    /// parameter; use `qemu+libssh2://` to pin host keys.)
    #[serde(default)]
    pub known_hosts_file: Option<PathBuf>,
    /// Flags for `domain.undefine`. The default suits qemu (UEFI domains need `nvram`); libvirt's
    /// test driver refuses `nvram` and `checkpointsMetadata`, so grants for it list fewer.
    #[serde(default = "default_undefine_flags")]
    pub undefine_flags: Vec<UndefineFlag>,
    /// Storage pools the provider may use on this connection.
    #[serde(default)]
    pub pools: Vec<String>,
    /// libvirt networks its domains' interfaces may join.
    #[serde(default)]
    pub networks: Vec<String>,
    /// Host bridges its domains' interfaces may join.
    #[serde(default)]
    pub bridges: Vec<String>,
}

/// A `virDomainUndefineFlagsValues` flag.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum UndefineFlag {
    /// `VIR_DOMAIN_UNDEFINE_MANAGED_SAVE`: remove a managed-save image too.
    ManagedSave,
    /// `VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA`: remove snapshot metadata too.
    SnapshotsMetadata,
    /// `VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA`: remove checkpoint metadata too.
    CheckpointsMetadata,
    /// `VIR_DOMAIN_UNDEFINE_NVRAM`: remove a UEFI domain's NVRAM file too.
    Nvram,
}

impl UndefineFlag {
    /// The libvirt flag bit.
    pub fn bits(self) -> u32 {
        match self {
            UndefineFlag::ManagedSave => virt::sys::VIR_DOMAIN_UNDEFINE_MANAGED_SAVE,
            UndefineFlag::SnapshotsMetadata => virt::sys::VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA,
            UndefineFlag::CheckpointsMetadata => {
                virt::sys::VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA
            }
            UndefineFlag::Nvram => virt::sys::VIR_DOMAIN_UNDEFINE_NVRAM,
        }
    }
}

/// Where base images may come from.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ImageGrant {
    /// Allowed origins, each `https://host[:port]` with no path. Default deny.
    pub origins: Vec<String>,
    /// PEM file with the CA certificates trusted for these origins, and only them.
    pub ca_file: PathBuf,
    /// Largest image; a larger `Content-Length`, or more bytes, fails the import.
    #[serde(default = "default_max_image_bytes")]
    pub max_bytes: u64,
}

/// Timeouts in milliseconds. Each also stops at the operation's deadline, whichever comes first.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Timeouts {
    /// One libvirt call (an open, a define, a chunk of an upload).
    #[serde(default = "default_call_ms")]
    pub call_ms: u64,
    /// One whole image import.
    #[serde(default = "default_import_ms")]
    pub import_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            call_ms: DEFAULT_CALL_MS,
            import_ms: DEFAULT_IMPORT_MS,
        }
    }
}

impl Timeouts {
    /// The per-call timeout.
    pub fn call(&self) -> Duration {
        Duration::from_millis(self.call_ms)
    }

    /// The import timeout.
    pub fn import(&self) -> Duration {
        Duration::from_millis(self.import_ms)
    }
}

fn default_undefine_flags() -> Vec<UndefineFlag> {
    vec![
        UndefineFlag::ManagedSave,
        UndefineFlag::SnapshotsMetadata,
        UndefineFlag::CheckpointsMetadata,
        UndefineFlag::Nvram,
    ]
}

fn default_call_ms() -> u64 {
    DEFAULT_CALL_MS
}

fn default_import_ms() -> u64 {
    DEFAULT_IMPORT_MS
}

fn default_max_upload_bytes() -> u64 {
    DEFAULT_MAX_UPLOAD_BYTES
}

fn default_max_image_bytes() -> u64 {
    DEFAULT_MAX_IMAGE_BYTES
}

/// A grant document that cannot be used. Messages name the provider and the field.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    /// The document is not valid YAML/JSON of the grant format.
    #[error("libvirt grants: {0}")]
    Parse(String),
    /// A field that is wrong.
    #[error("libvirt grant {provider}: {field}: {reason}")]
    Invalid {
        /// The provider.
        provider: String,
        /// The field, as spelled in the document.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_with_every_field_parses() {
        let grants = Grants::from_yaml(
            r#"
grants:
  kvm2:
    connections:
      - name: hv1
        uri: qemu+libssh2://egress@hv1.lab/system
        sshKeyFile: /etc/egress/id
        knownHostsFile: /etc/egress/known_hosts
        undefineFlags: [managedSave, nvram]
        pools: [default]
        networks: [default]
        bridges: [br0]
    images:
      origins: ["https://images.lab"]
      caFile: /etc/egress/ca.pem
      maxBytes: 1024
    timeouts: { callMs: 1000, importMs: 2000 }
    maxUploadBytes: 4096
"#,
        )
        .unwrap();
        let grant = &grants.grants["kvm2"];
        let connection = &grant.connections[0];
        assert_eq!(connection.name, "hv1");
        assert_eq!(
            connection.undefine_flags,
            [UndefineFlag::ManagedSave, UndefineFlag::Nvram]
        );
        assert_eq!(connection.bridges, ["br0"]);
        assert_eq!(grant.images.as_ref().unwrap().max_bytes, 1024);
        assert_eq!(grant.timeouts.call(), Duration::from_millis(1000));
        assert_eq!(grant.max_upload_bytes, 4096);
    }

    #[test]
    fn json_uses_defaults_for_omitted_fields() {
        let grants = Grants::from_json(
            r#"{"grants":{"p":{"connections":[{"name":"c","uri":"qemu:///system"}]}}}"#,
        )
        .unwrap();
        let grant = &grants.grants["p"];
        assert!(grant.images.is_none());
        assert_eq!(grant.timeouts.call_ms, DEFAULT_CALL_MS);
        assert_eq!(grant.timeouts.import_ms, DEFAULT_IMPORT_MS);
        assert_eq!(grant.max_upload_bytes, DEFAULT_MAX_UPLOAD_BYTES);
        assert_eq!(grant.connections[0].undefine_flags.len(), 4);
        assert!(grant.connections[0].pools.is_empty());
    }

    #[test]
    fn the_grants_file_gives_libvirt_its_key_and_the_identity_digest() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let text = format!(
            r#"
grants:
  proxmox:
    origins: ["https://192.168.2.8:8006"]
    credential: {{ header: Authorization, format: "PVEAPIToken={{secret}}", secretFile: /t }}
    tls: {{ caFile: /ca.pem }}
  kvm2:
    digest: "{digest}"
    origins: ["https://images.lab"]
    tls: {{ caFile: /ca.pem }}
    libvirt:
      connections:
        - {{ name: hv1, uri: "test:///default" }}
"#
        );
        let grants = Grants::from_grants_file_yaml(&text).unwrap();
        assert_eq!(grants.grants.keys().collect::<Vec<_>>(), ["kvm2"]);
        let kvm2 = &grants.grants["kvm2"];
        assert_eq!(kvm2.digest.as_deref(), Some(digest.as_str()));
        assert_eq!(kvm2.connections[0].name, "hv1");

        let json = r#"{"grants":{"p":{"origins":["http://h"]}}}"#;
        assert!(
            Grants::from_grants_file_json(json)
                .unwrap()
                .grants
                .is_empty()
        );

        let clash = format!(
            "grants:\n  kvm2:\n    digest: \"{digest}\"\n    libvirt:\n      digest: \"sha256:{}\"\n      connections: []\n",
            "b".repeat(64)
        );
        let error = Grants::from_grants_file_yaml(&clash).unwrap_err();
        assert!(error.to_string().contains("libvirt.digest"), "{error}");
        let error =
            Grants::from_grants_file_yaml("grants:\n  kvm2:\n    libvirt:\n      insecure: true\n")
                .unwrap_err();
        assert!(error.to_string().contains("insecure"), "{error}");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let error = Grants::from_yaml("grants:\n  p:\n    connections: []\n    insecure: true\n")
            .unwrap_err();
        assert!(error.to_string().contains("insecure"), "{error}");
        let error = Grants::from_json(
            r#"{"grants":{"p":{"connections":[{"name":"c","uri":"test:///x","password":"x"}]}}}"#,
        )
        .unwrap_err();
        assert!(error.to_string().contains("password"), "{error}");
    }
}
