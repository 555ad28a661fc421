//! Grants: what a capability lets one provider identity do, and what the host resolves for it.
//!
//! Each capability owns **one typed grant document** ([`Capability::Grant`]): the same Rust type
//! is the ProviderConfig's `spec.grant.<capability>`, an entry of the CLI's grants file, and what
//! [`Capability::set_grant`] takes, so a renamed field fails to compile rather than at run time.
//! A document never holds a secret: it names where the host finds one ([`SecretKeyRef`], or a
//! file for the CLI), and the host resolves those names when the grant is set, through the
//! [`GrantHost`] of the [`GrantContext`]:
//!
//! | host | Secret and ConfigMap references | host files |
//! |---|---|---|
//! | the operator (ProviderConfigs) | the Secrets and ConfigMaps it watches | refused: a ProviderConfig cannot make the operator read its own files |
//! | the CLI (`--grants`) | refused: there are no Secrets | allowed |
//!
//! A grant is set and removed at run time; calls in flight keep the grant they started with.
//!
//! [`Capability::Grant`]: crate::Capability::Grant
//! [`Capability::set_grant`]: crate::Capability::set_grant

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A key of a Secret (or, where a field says so, a ConfigMap) the host holds, in a namespace.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeyRef {
    /// The object's name.
    pub name: String,
    /// The key in its data.
    pub key: String,
    /// Its namespace; defaults to the operator's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// An object a grant document names, so the host can watch it and re-set the grant when it
/// changes (a rotated credential is used from the next request or dial on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectRef<'a> {
    /// A key of a Secret.
    Secret(&'a SecretKeyRef),
    /// A key of a ConfigMap.
    ConfigMap(&'a SecretKeyRef),
}

/// A capability's grant document: what it names of the host's objects.
pub trait GrantDocument: Send + Sync + 'static {
    /// Every Secret and ConfigMap key the document names.
    fn references(&self) -> Vec<ObjectRef<'_>>;
}

/// The grant of a capability no host grants anything of: it has no value, so
/// [`Capability::set_grant`](crate::Capability::set_grant) can never be called on one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoGrant {}

impl GrantDocument for NoGrant {
    fn references(&self) -> Vec<ObjectRef<'_>> {
        match *self {}
    }
}

/// What the host resolves for a grant document. Errors are for people and name the object,
/// never its content.
pub trait GrantHost: Sync {
    /// The value of a Secret's key.
    fn secret(&self, reference: &SecretKeyRef) -> Result<zeroize::Zeroizing<Vec<u8>>, String>;
    /// The value of a ConfigMap's key (public material: a CA, a known_hosts list).
    fn config_map(&self, reference: &SecretKeyRef) -> Result<String, String>;
    /// Whether the document may name `path`, a file of the host, for the capability to read.
    fn file(&self, path: &Path) -> Result<(), String>;
}

/// What [`Capability::set_grant`](crate::Capability::set_grant) is told beside the document.
#[derive(Clone, Copy)]
pub struct GrantContext<'a> {
    /// The component digests (lowercase hex sha256) the grant is pinned to: a component of the
    /// identity with other bytes gets the ungranted state. Empty: any component of the identity.
    pub digests: &'a [String],
    /// Resolves what the document names.
    pub host: &'a dyn GrantHost,
}

impl GrantContext<'_> {
    /// The digests the grant is pinned to, as lowercase hex; `Err` (built by `invalid`, for the
    /// field `digest`) names one that is not a sha256.
    pub fn pinned_digests(
        &self,
        invalid: impl Fn(&str, String) -> GrantError,
    ) -> Result<Vec<String>, GrantError> {
        self.digests
            .iter()
            .map(|pin| {
                digest_hex(pin).ok_or_else(|| {
                    invalid("digest", format!("{pin:?} is not sha256:<64 hex digits>"))
                })
            })
            .collect()
    }
}

impl std::fmt::Debug for GrantContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrantContext")
            .field("digests", &self.digests)
            .finish_non_exhaustive()
    }
}

/// The [`GrantHost`] of a host that reads files and holds no Secrets (the CLI's grants file).
#[derive(Clone, Copy, Debug, Default)]
pub struct FilesOnly;

impl GrantHost for FilesOnly {
    fn secret(&self, reference: &SecretKeyRef) -> Result<zeroize::Zeroizing<Vec<u8>>, String> {
        Err(format!(
            "Secret {} is a reference only the operator resolves; name a file here",
            reference.name
        ))
    }

    fn config_map(&self, reference: &SecretKeyRef) -> Result<String, String> {
        Err(format!(
            "ConfigMap {} is a reference only the operator resolves; name a file here",
            reference.name
        ))
    }

    fn file(&self, _path: &Path) -> Result<(), String> {
        Ok(())
    }
}

/// A grant that cannot be served. The message names the capability, the identity and the field
/// as the document spells it, never a secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{capability} grant of {identity}: {field}: {reason}")]
pub struct GrantError {
    /// The capability (`http`, `libvirt`).
    pub capability: &'static str,
    /// The provider identity.
    pub identity: String,
    /// The field, as spelled in the document (`connections[hv1].uri`).
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl GrantError {
    /// A builder of errors about `identity`'s grant of `capability`.
    pub fn about(capability: &'static str, identity: &str) -> impl Fn(&str, String) -> GrantError {
        let identity = identity.to_owned();
        move |field, reason| GrantError {
            capability,
            identity: identity.clone(),
            field: field.to_owned(),
            reason,
        }
    }
}

/// A component digest pin as lowercase hex: `sha256:<64 hex>` or the bare hex. `None` when it is
/// not one.
pub fn digest_hex(pin: &str) -> Option<String> {
    let hex = pin
        .strip_prefix("sha256:")
        .unwrap_or(pin)
        .to_ascii_lowercase();
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_pins_are_normalised_or_refused() {
        let hex = "ab".repeat(32);
        assert_eq!(
            digest_hex(&format!("sha256:{}", hex.to_uppercase())),
            Some(hex.clone())
        );
        assert_eq!(digest_hex(&hex), Some(hex));
        assert_eq!(digest_hex("sha256:12"), None);
        assert_eq!(digest_hex(&"zz".repeat(32)), None);
    }

    #[test]
    fn the_cli_host_reads_files_and_refuses_references() {
        let reference = SecretKeyRef {
            name: "token".into(),
            key: "value".into(),
            namespace: None,
        };
        assert!(FilesOnly.secret(&reference).unwrap_err().contains("token"));
        assert!(FilesOnly.config_map(&reference).is_err());
        assert!(FilesOnly.file(Path::new("/etc/ca.pem")).is_ok());
    }
}
