//! The libvirt grant: which hypervisors a provider identity may reach, and what it may use there.
//! One typed document ([`LibvirtGrant`]): a ProviderConfig's `spec.grant.libvirt`, an identity's
//! `libvirt` in the CLI's grants file, and what `LibvirtCapability`'s `set_grant` takes (YAML or
//! JSON, camelCase keys, unknown keys refused):
//!
//! ```yaml
//! owner: lab                                   # the marks' namespace; default egress-operator
//! connections:
//!   - name: hv1                                # what the guest passes to connection.open
//!     uri: qemu+libssh2://egress@hv1.lab/system
//!     sshKeySecretRef: {name: hv1-ssh, key: id_ed25519}       # or sshKeyFile (the CLI)
//!     knownHostsSecretRef: {name: hv1-ssh, key: known_hosts}  # or knownHostsConfigMapRef, knownHostsFile
//!     undefineFlags: [managedSave, snapshotsMetadata, checkpointsMetadata, nvram]
//!     pools: [default, images]                 # storage pools it may use
//!     networks: [default]                      # libvirt networks its domains may join
//!     bridges: [br0]                           # host bridges its domains may join
//! images:                                      # base images the host imports for it
//!   origins: ["https://images.lab"]            # https://host[:port], no path; default deny
//!   caConfigMapRef: {name: images-ca, key: ca.pem}   # or caSecretRef, caFile; no system roots
//!   maxBytes: 8589934592                       # largest image (8 GiB, the default)
//!   unusedRetentionMs: 86400000                # an image nothing uses is removed after (24 h)
//! timeouts: { callMs: 30000, importMs: 1800000 }
//! maxUploadBytes: 67108864                     # largest guest upload (64 MiB, the default)
//! ```
//!
//! The document holds no key: the host resolves the Secret references when the grant is set and
//! hands libvirt, which reads SSH material only from files, a file it writes in a private,
//! memory-backed directory (see `keys`). Validation reads no file the document names: the host
//! reads them when a call needs them.

use std::path::PathBuf;
use std::time::Duration;

use egress_runtime::grant::{GrantDocument, ObjectRef, SecretKeyRef};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Per-call timeout when a grant sets none.
pub const DEFAULT_CALL_MS: u64 = 30_000;
/// Timeout of one image import (download and upload) when a grant sets none.
pub const DEFAULT_IMPORT_MS: u64 = 30 * 60 * 1000;
/// Largest guest upload into one volume when a grant sets none (64 MiB).
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 64 * 1024 * 1024;
/// Largest imported image when a grant sets none (8 GiB).
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 8 * 1024 * 1024 * 1024;
/// How long an imported image nothing uses stays in its pool when a grant sets nothing (24 h).
pub const DEFAULT_UNUSED_RETENTION_MS: u64 = 24 * 60 * 60 * 1000;
/// The owner of marks when a grant names none.
pub const DEFAULT_OWNER: &str = "egress-operator";

/// What one provider identity may reach through libvirt.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LibvirtGrant {
    /// Whose ownership marks the provider reads and writes: its metadata namespace is
    /// `https://egress-operator.io/owner/<owner>`. Chosen by the host, never by the component,
    /// and not the identity, so renaming or recreating a ProviderConfig keeps its VMs its own.
    /// ProviderConfigs with the same owner on one hypervisor read each other's marks; give
    /// installations that must not, such as two clusters, owners of their own.
    #[serde(default = "default_owner")]
    pub owner: String,
    /// The hypervisors, by the name the guest opens them with.
    pub connections: Vec<ConnectionGrant>,
    /// Where base images may be imported from; no imports when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<ImageGrant>,
    /// Per-call and import timeouts.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Largest number of bytes one `volume.upload` may write.
    #[serde(default = "default_max_upload_bytes")]
    pub max_upload_bytes: u64,
}

impl GrantDocument for LibvirtGrant {
    fn references(&self) -> Vec<ObjectRef<'_>> {
        let mut references = Vec::new();
        for connection in &self.connections {
            references.extend(connection.ssh_key_secret_ref.iter().map(ObjectRef::Secret));
            references.extend(
                connection
                    .known_hosts_secret_ref
                    .iter()
                    .map(ObjectRef::Secret),
            );
            references.extend(
                connection
                    .known_hosts_config_map_ref
                    .iter()
                    .map(ObjectRef::ConfigMap),
            );
        }
        if let Some(images) = &self.images {
            references.extend(images.ca_secret_ref.iter().map(ObjectRef::Secret));
            references.extend(images.ca_config_map_ref.iter().map(ObjectRef::ConfigMap));
        }
        references
    }
}

/// One hypervisor connection and what the provider may use on it.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConnectionGrant {
    /// The name the guest passes to `connection.open`.
    pub name: String,
    /// The libvirt URI, for example `qemu+libssh2://egress@hv1/system` or `qemu:///system`. It
    /// may not carry the SSH parameters the host sets itself (`keyfile`, `known_hosts`, …).
    pub uri: String,
    /// The SSH private key, from a Secret's key: written 0600 to the host's private key
    /// directory and passed to libvirt as `keyfile`; a rotated Secret is used from the next dial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_key_secret_ref: Option<SecretKeyRef>,
    /// The SSH private key as a file (the CLI only), passed to libvirt as `keyfile` on every
    /// dial, so a rotated key is used from the next dial on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_key_file: Option<PathBuf>,
    /// known_hosts for the `libssh` and `libssh2` transports, from a Secret's key, checked
    /// strictly. (libvirt 9's `ssh` transport, which runs the `ssh` binary, takes no known_hosts;
    /// use `qemu+libssh2://` to pin host keys.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_hosts_secret_ref: Option<SecretKeyRef>,
    /// The same from a ConfigMap's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_hosts_config_map_ref: Option<SecretKeyRef>,
    /// The same as a file (the CLI only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
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

/// Where base images may come from, and the CA trusted for them (and only it), from exactly one
/// of the three sources.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ImageGrant {
    /// Allowed origins, each `https://host[:port]` with no path. Default deny.
    pub origins: Vec<String>,
    /// A PEM bundle in a Secret's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_ref: Option<SecretKeyRef>,
    /// A PEM bundle in a ConfigMap's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_config_map_ref: Option<SecretKeyRef>,
    /// A PEM file (the CLI only), read at each import.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Largest image; a larger `Content-Length`, or more bytes, fails the import.
    #[serde(default = "default_max_image_bytes")]
    pub max_bytes: u64,
    /// How long an image stays in its pool once nothing uses it (no volume is backed by it, no
    /// domain's disk reads it, nothing imported it or was made from it) before the host removes
    /// it, when the provider asks it to prune (`storage-pool.prune-images`). 0 removes it at the
    /// first prune that finds it unused.
    #[serde(default = "default_unused_retention_ms")]
    pub unused_retention_ms: u64,
}

/// Timeouts in milliseconds. A call's timeout also stops at the operation's deadline, whichever
/// comes first; an import goes on past the call that started it, up to its own timeout.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
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

fn default_owner() -> String {
    DEFAULT_OWNER.to_owned()
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

fn default_unused_retention_ms() -> u64 {
    DEFAULT_UNUSED_RETENTION_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_with_every_field_parses() {
        let grant: LibvirtGrant = serde_norway::from_str(
            r#"
owner: lab
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
  unusedRetentionMs: 60000
timeouts: { callMs: 1000, importMs: 2000 }
maxUploadBytes: 4096
"#,
        )
        .unwrap();
        assert_eq!(grant.owner, "lab");
        let connection = &grant.connections[0];
        assert_eq!(connection.name, "hv1");
        assert_eq!(
            connection.undefine_flags,
            [UndefineFlag::ManagedSave, UndefineFlag::Nvram]
        );
        assert_eq!(connection.bridges, ["br0"]);
        assert_eq!(grant.images.as_ref().unwrap().max_bytes, 1024);
        assert_eq!(grant.images.as_ref().unwrap().unused_retention_ms, 60000);
        assert_eq!(grant.timeouts.call(), Duration::from_millis(1000));
        assert_eq!(grant.max_upload_bytes, 4096);
    }

    #[test]
    fn omitted_fields_take_the_defaults() {
        let grant: LibvirtGrant =
            serde_json::from_str(r#"{"connections":[{"name":"c","uri":"qemu:///system"}]}"#)
                .unwrap();
        assert_eq!(grant.owner, DEFAULT_OWNER);
        assert!(grant.images.is_none());
        assert_eq!(grant.timeouts.call_ms, DEFAULT_CALL_MS);
        assert_eq!(grant.timeouts.import_ms, DEFAULT_IMPORT_MS);
        assert_eq!(grant.max_upload_bytes, DEFAULT_MAX_UPLOAD_BYTES);
        assert_eq!(grant.connections[0].undefine_flags.len(), 4);
        assert!(grant.connections[0].pools.is_empty());
    }

    #[test]
    fn unknown_fields_are_refused() {
        let error = serde_json::from_str::<LibvirtGrant>(r#"{"connections":[],"insecure":true}"#)
            .unwrap_err();
        assert!(error.to_string().contains("insecure"), "{error}");
        let error = serde_json::from_str::<LibvirtGrant>(
            r#"{"connections":[{"name":"c","uri":"test:///x","password":"x"}]}"#,
        )
        .unwrap_err();
        assert!(error.to_string().contains("password"), "{error}");
    }

    #[test]
    fn the_keys_known_hosts_and_ca_it_names_are_its_references() {
        let grant: LibvirtGrant = serde_json::from_str(
            r#"{"connections":[{"name":"c","uri":"qemu+libssh2://h/system",
                "sshKeySecretRef":{"name":"ssh","key":"id"},
                "knownHostsConfigMapRef":{"name":"hosts","key":"known_hosts"}}],
                "images":{"origins":["https://i"],"caSecretRef":{"name":"ca","key":"ca.pem"}}}"#,
        )
        .unwrap();
        let names: Vec<String> = grant
            .references()
            .iter()
            .map(|reference| match reference {
                ObjectRef::Secret(r) => format!("secret/{}", r.name),
                ObjectRef::ConfigMap(r) => format!("configmap/{}", r.name),
            })
            .collect();
        assert_eq!(names, ["secret/ssh", "configmap/hosts", "secret/ca"]);
    }
}
