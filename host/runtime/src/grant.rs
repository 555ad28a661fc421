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
//! A document spells each place one value may come from as a field of its own (`caSecretRef`,
//! `caConfigMapRef`, `caFile`), so its YAML and schema stay flat; [`ValueFrom::one_of`] reads
//! those fields into one model and [`GrantContext::resolve`] is the one place it is resolved.
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

/// Where one value a grant document names comes from, and the field that names it.
///
/// The fields stay the document's own (`#[serde(flatten)]` cannot be combined with the
/// documents' `deny_unknown_fields`, and would change their schema), so this model is read from
/// them, not serialized: [`ValueFrom::one_of`] picks the one field set, and
/// [`GrantContext::resolve`] resolves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueFrom<'a> {
    /// The field, as the document spells it (`tls.caSecretRef`): what an error names.
    pub field: &'static str,
    /// What the field names.
    pub source: ValueSource<'a>,
}

/// What a grant document's field names as the place a value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueSource<'a> {
    /// A key of a Secret the host holds.
    Secret(&'a SecretKeyRef),
    /// A key of a ConfigMap the host holds (public material: a CA, a known_hosts list).
    ConfigMap(&'a SecretKeyRef),
    /// A file of the host, which the capability reads itself when it needs it.
    File(&'a Path),
}

/// Names the object, never its content: `Secret proxmox-token key token`, for errors and logs.
impl std::fmt::Display for ValueSource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Secret(reference) => write!(f, "Secret {} key {}", reference.name, reference.key),
            Self::ConfigMap(reference) => {
                write!(f, "ConfigMap {} key {}", reference.name, reference.key)
            }
            Self::File(path) => write!(f, "file {}", path.display()),
        }
    }
}

/// A document named more than one place for one value; which is meant cannot be guessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoreThanOneSource;

impl<'a> ValueFrom<'a> {
    /// The one of `fields` (each the field's name and what it names, when set) the document
    /// sets: `Ok(None)` when none is set. Whether none is allowed is the caller's to say.
    pub fn one_of(
        fields: impl IntoIterator<Item = (&'static str, Option<ValueSource<'a>>)>,
    ) -> Result<Option<Self>, MoreThanOneSource> {
        let mut set = fields.into_iter().filter_map(|(field, source)| {
            Some(Self {
                field,
                source: source?,
            })
        });
        let first = set.next();
        match set.next() {
            Some(_) => Err(MoreThanOneSource),
            None => Ok(first),
        }
    }
}

/// A value [`GrantContext::resolve`] resolved.
pub enum Resolved<'a> {
    /// The value of a Secret's or ConfigMap's key, which the host holds; zeroed on drop.
    Value(zeroize::Zeroizing<Vec<u8>>),
    /// A file the document may name. The capability reads it when it needs it, so a file that
    /// changes is read again without setting the grant again.
    File(&'a Path),
}

impl std::fmt::Debug for Resolved<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Value(_) => f.write_str("Value([redacted])"),
            Self::File(path) => f.debug_tuple("File").field(path).finish(),
        }
    }
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

    /// Resolves `from` through the host: a Secret's or ConfigMap's value now, or for a file
    /// whether the document may name it. `Err` (built by `invalid`, for `from`'s field) names
    /// the object, never its content.
    pub fn resolve<'a>(
        &self,
        from: ValueFrom<'a>,
        invalid: impl Fn(&str, String) -> GrantError,
    ) -> Result<Resolved<'a>, GrantError> {
        let resolved = match from.source {
            ValueSource::Secret(reference) => self.host.secret(reference).map(Resolved::Value),
            ValueSource::ConfigMap(reference) => self
                .host
                .config_map(reference)
                .map(|text| Resolved::Value(zeroize::Zeroizing::new(text.into_bytes()))),
            ValueSource::File(path) => self.host.file(path).map(|()| Resolved::File(path)),
        };
        resolved.map_err(|reason| invalid(from.field, reason))
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

    #[test]
    fn a_value_comes_from_at_most_one_field() {
        let reference = SecretKeyRef::default();
        let file = Path::new("/etc/ca.pem");
        let none = ValueFrom::one_of([("caSecretRef", None), ("caFile", None)]);
        assert_eq!(none, Ok(None));
        let one = ValueFrom::one_of([
            ("caSecretRef", None),
            ("caFile", Some(ValueSource::File(file))),
        ]);
        assert_eq!(
            one,
            Ok(Some(ValueFrom {
                field: "caFile",
                source: ValueSource::File(file)
            }))
        );
        let two = ValueFrom::one_of([
            ("caSecretRef", Some(ValueSource::Secret(&reference))),
            ("caFile", Some(ValueSource::File(file))),
        ]);
        assert_eq!(two, Err(MoreThanOneSource));
    }

    #[test]
    fn resolving_names_the_field_the_host_refused() {
        let context = GrantContext {
            digests: &[],
            host: &FilesOnly,
        };
        let invalid = GrantError::about("http", "proxmox");
        let reference = SecretKeyRef {
            name: "token".into(),
            ..SecretKeyRef::default()
        };
        let secret = ValueFrom {
            field: "credential.secretRef",
            source: ValueSource::Secret(&reference),
        };
        let error = context.resolve(secret, &invalid).unwrap_err();
        assert_eq!(error.field, "credential.secretRef");
        assert!(error.reason.contains("token"), "{error}");
        let file = ValueFrom {
            field: "credential.secretFile",
            source: ValueSource::File(Path::new("/etc/token")),
        };
        assert!(matches!(
            context.resolve(file, &invalid),
            Ok(Resolved::File(path)) if path == Path::new("/etc/token")
        ));
    }
}
