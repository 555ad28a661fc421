//! What a ProviderConfig's grant resolves against ([`ObjectsHost`]): the Secrets and ConfigMaps
//! the adapter watches; files of the operator are refused. The capabilities and the grant
//! documents are `egress-capability-set`'s.

use std::path::Path;

use egress_runtime::grant::{GrantHost, SecretKeyRef};

use crate::Objects;

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
            .map_err(|missing| {
                missing.describe("Secret", namespace, &reference.name, &reference.key)
            })
    }

    fn config_map(&self, reference: &SecretKeyRef) -> Result<String, String> {
        let namespace = self.namespace_of(reference);
        self.objects
            .config_map_value(namespace, &reference.name, &reference.key)
            .map_err(|missing| {
                missing.describe("ConfigMap", namespace, &reference.name, &reference.key)
            })
    }

    fn file(&self, path: &Path) -> Result<(), String> {
        Err(format!(
            "a ProviderConfig cannot name the operator's files ({}): name a Secret or ConfigMap",
            path.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Missing;

    #[test]
    fn a_provider_config_resolves_secrets_and_refuses_files() {
        struct One;
        impl Objects for One {
            fn secret_value(&self, ns: &str, name: &str, key: &str) -> Result<Vec<u8>, Missing> {
                match (ns, name, key) {
                    ("ops", "token", "t") => Ok(b"s3cret".to_vec()),
                    ("ops", "token", _) => Err(Missing::Key),
                    _ => Err(Missing::Object),
                }
            }
            fn config_map_value(&self, _: &str, _: &str, _: &str) -> Result<String, Missing> {
                Err(Missing::Object)
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
        assert_eq!(missing, "Secret ops/other does not exist");
        let no_key = SecretKeyRef {
            key: "x".into(),
            ..reference("token")
        };
        assert_eq!(
            host.secret(&no_key).unwrap_err(),
            "Secret ops/token has no key x"
        );
        assert!(host.config_map(&reference("token")).is_err());
        assert!(
            host.file(Path::new("/var/run/secrets/token"))
                .unwrap_err()
                .contains("cannot name")
        );
    }
}
