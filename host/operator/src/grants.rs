//! The host's capabilities and the grants it sets on them, from either source:
//!
//! - a ProviderConfig's `spec.grant` ([`GrantSpec`]): its references resolve against the
//!   Secrets and ConfigMaps the adapter watches ([`ObjectsHost`]); files of the operator are
//!   refused;
//! - the CLI's `--grants` file ([`GrantsFile`]): the same documents per identity, with files and
//!   no Secrets ([`FilesOnly`]).
//!
//! Each capability owns its grant type; [`Capabilities::set`] hands each document to its
//! capability through [`Capability::set_grant`], so nothing is re-encoded on the way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use egress_capability_http::{Broker, HttpGrant};
use egress_capability_libvirt::{LibvirtCapability, LibvirtGrant};
use egress_runtime::grant::{FilesOnly, GrantContext, GrantError, GrantHost, SecretKeyRef};
use egress_runtime::{Capability, RuntimeConfig};
use serde::Deserialize;

use crate::Objects;
use crate::crd::GrantSpec;

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

    /// `config` serving both.
    pub fn serve(&self, config: RuntimeConfig) -> RuntimeConfig {
        config
            .capability(Arc::clone(&self.http))
            .capability(Arc::clone(&self.libvirt))
    }

    /// Give `identity` the grants of `spec`, and take back those it does not name. On an error
    /// the caller removes them all ([`Capabilities::remove`]): no capability keeps a grant of a
    /// spec that was refused.
    pub fn set(
        &self,
        identity: &str,
        spec: &GrantSpec,
        context: &GrantContext<'_>,
    ) -> Result<(), GrantError> {
        grant(&*self.http, identity, spec.http.as_ref(), context)?;
        grant(&*self.libvirt, identity, spec.libvirt.as_ref(), context)
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

/// What a ProviderConfig's grant resolves against: the adapter's Secrets and ConfigMaps, a
/// reference without a namespace pointing into the operator's.
pub struct ObjectsHost<'a> {
    /// The Secrets and ConfigMaps.
    pub objects: &'a dyn Objects,
    /// The operator's namespace.
    pub namespace: &'a str,
}

impl ObjectsHost<'_> {
    fn namespace_of<'r>(&'r self, reference: &'r SecretKeyRef) -> &'r str {
        reference.namespace.as_deref().unwrap_or(self.namespace)
    }
}

impl GrantHost for ObjectsHost<'_> {
    fn secret(&self, reference: &SecretKeyRef) -> Result<zeroize::Zeroizing<Vec<u8>>, String> {
        let namespace = self.namespace_of(reference);
        self.objects
            .secret_value(namespace, &reference.name, &reference.key)
            .map(zeroize::Zeroizing::new)
            .ok_or_else(|| {
                format!(
                    "Secret {namespace}/{} has no key {}",
                    reference.name, reference.key
                )
            })
    }

    fn config_map(&self, reference: &SecretKeyRef) -> Result<String, String> {
        let namespace = self.namespace_of(reference);
        self.objects
            .config_map_value(namespace, &reference.name, &reference.key)
            .ok_or_else(|| {
                format!(
                    "ConfigMap {namespace}/{} has no key {}",
                    reference.name, reference.key
                )
            })
    }

    fn file(&self, path: &Path) -> Result<(), String> {
        Err(format!(
            "a ProviderConfig cannot name the operator's files ({}): name a Secret or ConfigMap",
            path.display()
        ))
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

/// One identity's entry of a [`GrantsFile`].
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IdentityGrants {
    /// Pins every grant of the identity to the component with this sha256.
    #[serde(default)]
    pub digest: Option<String>,
    /// Outgoing HTTP.
    #[serde(default)]
    pub http: Option<HttpGrant>,
    /// libvirt.
    #[serde(default)]
    pub libvirt: Option<LibvirtGrant>,
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
            grant(&*capabilities.http, identity, entry.http.as_ref(), &context)?;
            grant(
                &*capabilities.libvirt,
                identity,
                entry.libvirt.as_ref(),
                &context,
            )?;
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

    #[test]
    fn a_provider_config_resolves_secrets_and_refuses_files() {
        struct One;
        impl Objects for One {
            fn secret_value(&self, namespace: &str, name: &str, key: &str) -> Option<Vec<u8>> {
                (namespace == "ops" && name == "token" && key == "t").then(|| b"s3cret".to_vec())
            }
            fn config_map_value(&self, _: &str, _: &str, _: &str) -> Option<String> {
                None
            }
        }
        let host = ObjectsHost {
            objects: &One,
            namespace: "ops",
        };
        let reference = |name: &str| SecretKeyRef {
            name: name.into(),
            key: "t".into(),
            namespace: None,
        };
        assert_eq!(
            host.secret(&reference("token")).unwrap().as_slice(),
            b"s3cret"
        );
        let missing = host.secret(&reference("other")).unwrap_err();
        assert_eq!(missing, "Secret ops/other has no key t");
        assert!(host.config_map(&reference("token")).is_err());
        assert!(
            host.file(Path::new("/var/run/secrets/token"))
                .unwrap_err()
                .contains("cannot name")
        );
    }
}
