//! # egress-capability-set
//!
//! Every capability of this host, the grants a provider identity holds on them, and the runtime
//! served with them: what Spin's runtime factors are to its factors, in one small crate.
//!
//! - [`Capabilities`]: a handle onto each capability (the egress broker, libvirt) and
//!   [`Capabilities::serve`], the one way the operator, the CLI and the conformance suite build a
//!   runtime with them.
//! - [`Grants`]: one grant per capability, each that capability's own typed document. It is a
//!   ProviderConfig's `spec.grant` and an identity's entry in the CLI's [`GrantsFile`];
//!   [`Capabilities::set`] hands each document to its capability, the one loop over
//!   capabilities.
//!
//! Adding a capability is one field in [`Capabilities`] and one in [`Grants`], here.

#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use egress_capability_http::{Broker, HttpGrant};
use egress_capability_libvirt::{LibvirtCapability, LibvirtGrant};
use egress_runtime::Egress;
use egress_runtime::grant::{FilesOnly, GrantContext, GrantDocument as _, GrantError, ObjectRef};
use egress_runtime::http::HttpCapability;
use egress_runtime::{Capability, RuntimeConfig};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a provider may reach: one grant per capability, each the capability's own typed
/// document (the same type its crate validates). A key that names no capability is refused,
/// naming it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Grants {
    /// Outgoing HTTP through the egress broker: origins, the credential the host injects, TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpGrant>,
    /// libvirt hypervisors: connections and what may be used on each, image origins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libvirt: Option<LibvirtGrant>,
}

impl Grants {
    /// The names of the capabilities it grants (`http`, `libvirt`).
    pub fn granted(&self) -> Vec<&'static str> {
        let mut names = Vec::new();
        if self.http.is_some() {
            names.push("http");
        }
        if self.libvirt.is_some() {
            names.push("libvirt");
        }
        names
    }

    /// Every Secret and ConfigMap key its grants name.
    pub fn references(&self) -> Vec<ObjectRef<'_>> {
        let mut references = Vec::new();
        if let Some(http) = &self.http {
            references.extend(http.references());
        }
        if let Some(libvirt) = &self.libvirt {
            references.extend(libvirt.references());
        }
        references
    }
}

/// Every capability of the host, each a handle onto what the runtime serves.
#[derive(Clone, Debug, Default)]
pub struct Capabilities {
    /// Outgoing HTTP: the egress broker.
    pub http: Arc<Broker>,
    /// libvirt hypervisors.
    pub libvirt: Arc<LibvirtCapability>,
}

impl Capabilities {
    /// Both capabilities with no grants; SSH keys from Secrets go under `$XDG_RUNTIME_DIR` or
    /// `/dev/shm`.
    pub fn new() -> Self {
        Capabilities {
            http: Arc::new(Broker::new()),
            libvirt: Arc::new(LibvirtCapability::new()),
        }
    }

    /// [`Capabilities::new`] with SSH keys from Secrets under `key_base`, which must be a
    /// directory on a memory-backed filesystem.
    pub fn with_key_base(key_base: PathBuf) -> anyhow::Result<Self> {
        let libvirt = LibvirtCapability::with_key_base(key_base.clone())
            .map_err(|reason| anyhow::anyhow!("--key-dir {}: {reason}", key_base.display()))?;
        Ok(Capabilities {
            http: Arc::new(Broker::new()),
            libvirt: Arc::new(libvirt),
        })
    }

    /// `config` serving both: the one way the operator and the CLI build their runtime.
    pub fn serve(&self, config: RuntimeConfig) -> RuntimeConfig {
        config
            .capability(Arc::clone(&self.http))
            .capability(Arc::clone(&self.libvirt))
    }

    /// [`Capabilities::serve`], with providers' HTTP going through `egress` before the broker
    /// (the conformance suite watches what a provider sends); the grants stay the broker's.
    pub fn serve_through(&self, config: RuntimeConfig, egress: Arc<dyn Egress>) -> RuntimeConfig {
        config
            .capability(Arc::new(HttpCapability::new(egress)))
            .capability(Arc::clone(&self.libvirt))
    }

    /// Give `identity` the grants of `grants`, and take back those it does not name. On an
    /// error the caller removes them all ([`Capabilities::remove`]): no capability keeps a grant
    /// of a document that was refused.
    pub fn set(
        &self,
        identity: &str,
        grants: &Grants,
        context: &GrantContext<'_>,
    ) -> Result<(), GrantError> {
        grant(&*self.http, identity, grants.http.as_ref(), context)?;
        grant(&*self.libvirt, identity, grants.libvirt.as_ref(), context)
    }

    /// Take every grant of `identity` back.
    pub fn remove(&self, identity: &str) {
        self.http.remove_grant(identity);
        self.libvirt.remove_grant(identity);
    }
}

/// Sets `identity`'s grant of `capability` to `document`, or removes it.
fn grant<C: Capability>(
    capability: &C,
    identity: &str,
    document: Option<&C::Grant>,
    context: &GrantContext<'_>,
) -> Result<(), GrantError> {
    match document {
        Some(document) => capability.set_grant(identity, document, context),
        None => {
            capability.remove_grant(identity);
            Ok(())
        }
    }
}

/// The CLI's grants file: each identity's grants, the same documents as a ProviderConfig's
/// `spec.grant`, optionally pinned to one component.
///
/// ```yaml
/// grants:
///   proxmox:                         # the identity: the component's file name without .wasm
///     digest: "sha256:9f86d0…"       # optional: only this component gets the grants
///     http:
///       origins: ["https://127.0.0.1:8006"]
///       credential: {header: Authorization, format: "PVEAPIToken={secret}", secretFile: /tmp/pve/token}
///       tls: {caFile: /tmp/pve/ca.pem, http1Only: true}
///   libvirt:
///     libvirt:
///       connections: [{name: hv1, uri: "qemu:///system", pools: [default], networks: [default]}]
/// ```
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantsFile {
    /// By identity.
    pub grants: BTreeMap<String, IdentityGrants>,
}

/// One identity's entry of a [`GrantsFile`]: its [`Grants`], and the component they are pinned
/// to. (Written out rather than flattened: serde refuses unknown keys only without `flatten`,
/// and a key that names no capability must be refused.)
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", from = "IdentityEntry")]
pub struct IdentityGrants {
    /// Pins every grant of the identity to the component with this sha256.
    pub digest: Option<String>,
    /// Its grants.
    pub grants: Grants,
}

/// An identity's entry as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct IdentityEntry {
    #[serde(default)]
    digest: Option<String>,
    #[serde(default)]
    http: Option<HttpGrant>,
    #[serde(default)]
    libvirt: Option<LibvirtGrant>,
}

impl From<IdentityEntry> for IdentityGrants {
    fn from(entry: IdentityEntry) -> Self {
        IdentityGrants {
            digest: entry.digest,
            grants: Grants {
                http: entry.http,
                libvirt: entry.libvirt,
            },
        }
    }
}

impl GrantsFile {
    /// Reads and parses `path` (YAML, of which JSON is a part).
    pub fn read(path: &Path) -> anyhow::Result<GrantsFile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading grants {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("grants {}", path.display()))
    }

    /// Parses a grants document.
    pub fn parse(text: &str) -> anyhow::Result<GrantsFile> {
        Ok(serde_norway::from_str(text)?)
    }

    /// Sets every identity's grants on `capabilities`, files allowed.
    pub fn grant(&self, capabilities: &Capabilities) -> Result<(), GrantError> {
        for (identity, entry) in &self.grants {
            let digests: Vec<String> = entry.digest.iter().cloned().collect();
            let context = GrantContext {
                digests: &digests,
                host: &FilesOnly,
            };
            capabilities.set(identity, &entry.grants, &context)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_file_holds_every_capabilitys_grant_and_refuses_unknown_keys() {
        let file = GrantsFile::parse(&format!(
            r#"
grants:
  proxmox:
    digest: "sha256:{}"
    http:
      origins: ["https://192.168.2.8:8006"]
      credential: {{ header: Authorization, format: "PVEAPIToken={{secret}}", secretFile: /t }}
      tls: {{ caFile: /ca.pem }}
  kvm:
    libvirt:
      connections:
        - {{ name: hv1, uri: "test:///default" }}
"#,
            "a".repeat(64)
        ))
        .unwrap();
        let capabilities = Capabilities::new();
        file.grant(&capabilities).unwrap();
        assert_eq!(capabilities.http.identities(), ["proxmox"]);
        assert_eq!(capabilities.libvirt.identities(), ["kvm"]);

        // The shape of the file before one grant model: HTTP keys beside the identity.
        let old = GrantsFile::parse("grants:\n  p:\n    origins: [\"https://h\"]\n").unwrap_err();
        assert!(format!("{old:#}").contains("origins"), "{old:#}");
        let typo = GrantsFile::parse("grants:\n  p:\n    libvrt: {connections: []}\n").unwrap_err();
        assert!(format!("{typo:#}").contains("libvrt"), "{typo:#}");
    }
}
