//! Reading a local-mode folder: the same YAML (or JSON) manifests as in a cluster.
//!
//! Every `*.yaml`, `*.yml` and `*.json` file of the folder (not below it) is read; a YAML file may
//! hold several documents. Kinds: `Proxy`, `ProxyPool` and `ProviderConfig`
//! (`egress-operator.io/v1alpha1`),
//! `Secret` and `ConfigMap` (`v1`). Anything else is reported and skipped. A file that does not
//! parse gets one error naming the file, the document and the field, and **its objects keep their
//! last good version**: a typo must not read as "delete this Proxy" (which would destroy its VM).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine;
use serde::Deserialize;

use crate::Missing;
use crate::crd::{ProviderConfigSpec, ProxyPoolSpec, ProxySpec};

/// A Proxy read from a manifest.
#[derive(Clone, Debug, PartialEq)]
pub struct ProxyManifest {
    /// Its namespace (`default` when unset).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its spec.
    pub spec: ProxySpec,
}

/// A ProxyPool read from a manifest.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolManifest {
    /// Its namespace (`default` when unset).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its spec.
    pub spec: ProxyPoolSpec,
}

/// A ProviderConfig read from a manifest.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderConfigManifest {
    /// Its name.
    pub name: String,
    /// Its spec.
    pub spec: ProviderConfigSpec,
}

/// What one file holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FileObjects {
    /// Its Proxies.
    pub proxies: Vec<ProxyManifest>,
    /// Its ProxyPools.
    pub pools: Vec<PoolManifest>,
    /// Its ProviderConfigs.
    pub provider_configs: Vec<ProviderConfigManifest>,
    /// Its Secrets' data, by (namespace, name).
    pub secrets: BTreeMap<(String, String), BTreeMap<String, Vec<u8>>>,
    /// Its ConfigMaps' data, by (namespace, name).
    pub config_maps: BTreeMap<(String, String), BTreeMap<String, String>>,
}

/// Secret or ConfigMap data by (namespace, name), then key.
pub type Keyed<V> = BTreeMap<(String, String), BTreeMap<String, V>>;

/// The folder's objects: the last good version of each file.
#[derive(Clone, Debug, Default)]
pub struct Folder {
    files: BTreeMap<PathBuf, FileObjects>,
    /// The problems the last rescan found, so each one is reported once, not on every rescan.
    reported: std::collections::BTreeSet<String>,
}

/// A manifest problem: one line naming the file, the document and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestError {
    /// The file.
    pub path: PathBuf,
    /// The message, starting with the file name.
    pub message: String,
}

impl Folder {
    /// Re-read `dir`: files that parse replace their last version; files that do not keep it and
    /// are reported; files that are gone take their objects with them. A problem is returned by
    /// the rescan that first finds it, not again while it stays.
    pub fn rescan(&mut self, dir: &Path) -> std::io::Result<Vec<ManifestError>> {
        let mut seen = Vec::new();
        let mut errors = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            let manifest = path
                .extension()
                .and_then(|extension| extension.to_str())
                .is_some_and(|extension| matches!(extension, "yaml" | "yml" | "json"));
            if !manifest || !path.is_file() {
                continue;
            }
            seen.push(path.clone());
            let parsed = std::fs::read_to_string(&path)
                .map_err(|error| ManifestError {
                    path: path.clone(),
                    message: format!("{}: cannot read: {error}", path.display()),
                })
                .and_then(|text| parse_file(&path, &text));
            match parsed {
                Ok(objects) => {
                    self.files.insert(path, objects);
                }
                Err(error) => errors.push(error),
            }
        }
        self.files.retain(|path, _| seen.contains(path));
        errors.extend(self.duplicates());
        let current = errors.iter().map(|error| error.message.clone()).collect();
        let previous = std::mem::replace(&mut self.reported, current);
        errors.retain(|error| !previous.contains(&error.message));
        Ok(errors)
    }

    /// Every Proxy, by `namespace/name` (the first file in name order wins a duplicate).
    pub fn proxies(&self) -> BTreeMap<String, ProxyManifest> {
        let mut proxies = BTreeMap::new();
        for objects in self.files.values() {
            for proxy in &objects.proxies {
                proxies
                    .entry(format!("{}/{}", proxy.namespace, proxy.name))
                    .or_insert_with(|| proxy.clone());
            }
        }
        proxies
    }

    /// Every ProxyPool, by `namespace/name` (the first file in name order wins a duplicate).
    pub fn pools(&self) -> BTreeMap<String, PoolManifest> {
        let mut pools = BTreeMap::new();
        for objects in self.files.values() {
            for pool in &objects.pools {
                pools
                    .entry(format!("{}/{}", pool.namespace, pool.name))
                    .or_insert_with(|| pool.clone());
            }
        }
        pools
    }

    /// Every ProviderConfig, by name.
    pub fn provider_configs(&self) -> BTreeMap<String, ProviderConfigManifest> {
        let mut configs = BTreeMap::new();
        for objects in self.files.values() {
            for config in &objects.provider_configs {
                configs
                    .entry(config.name.clone())
                    .or_insert_with(|| config.clone());
            }
        }
        configs
    }

    /// The value of `key` of Secret `namespace/name`.
    pub fn secret_value(&self, namespace: &str, name: &str, key: &str) -> Result<Vec<u8>, Missing> {
        let id = (namespace.to_owned(), name.to_owned());
        let data = self
            .files
            .values()
            .find_map(|objects| objects.secrets.get(&id));
        data.ok_or(Missing::Object)?
            .get(key)
            .cloned()
            .ok_or(Missing::Key)
    }

    /// The value of `key` of ConfigMap `namespace/name`.
    pub fn config_map_value(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
    ) -> Result<String, Missing> {
        let id = (namespace.to_owned(), name.to_owned());
        let data = self
            .files
            .values()
            .find_map(|objects| objects.config_maps.get(&id));
        data.ok_or(Missing::Object)?
            .get(key)
            .cloned()
            .ok_or(Missing::Key)
    }

    /// Every Secret's and ConfigMap's data (what references resolve to), to tell whether any
    /// changed.
    pub fn object_data(&self) -> Vec<(&Keyed<Vec<u8>>, &Keyed<String>)> {
        self.files
            .values()
            .map(|objects| (&objects.secrets, &objects.config_maps))
            .collect()
    }

    /// Objects declared in two files: reported; the first file (in name order) wins.
    fn duplicates(&self) -> Vec<ManifestError> {
        let mut owners: BTreeMap<String, &Path> = BTreeMap::new();
        let mut errors = Vec::new();
        for (path, objects) in &self.files {
            let names = objects
                .proxies
                .iter()
                .map(|p| format!("Proxy {}/{}", p.namespace, p.name))
                .chain(
                    objects
                        .pools
                        .iter()
                        .map(|p| format!("ProxyPool {}/{}", p.namespace, p.name)),
                )
                .chain(
                    objects
                        .provider_configs
                        .iter()
                        .map(|c| format!("ProviderConfig {}", c.name)),
                );
            for name in names {
                match owners.get(&name) {
                    Some(first) => errors.push(ManifestError {
                        path: path.clone(),
                        message: format!(
                            "{}: {name} is already declared in {}; this one is ignored",
                            path.display(),
                            first.display()
                        ),
                    }),
                    None => {
                        owners.insert(name, path);
                    }
                }
            }
        }
        errors
    }
}

/// The header every manifest has.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Head {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    metadata: Metadata,
}

#[derive(Default, Deserialize)]
struct Metadata {
    name: Option<String>,
    namespace: Option<String>,
}

/// A Secret's or ConfigMap's data.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data<T> {
    #[serde(default)]
    data: BTreeMap<String, T>,
    #[serde(default)]
    string_data: BTreeMap<String, String>,
    #[serde(default)]
    binary_data: BTreeMap<String, String>,
}

/// Parse one file's documents; the first bad document fails the file.
pub fn parse_file(path: &Path, text: &str) -> Result<FileObjects, ManifestError> {
    let fail = |document: usize, what: String| ManifestError {
        path: path.to_owned(),
        message: format!("{}: document {document}: {what}", path.display()),
    };
    let mut objects = FileObjects::default();
    for (index, document) in documents(path, text, &fail)?.into_iter().enumerate() {
        let number = index + 1;
        let head: Head = serde_json::from_value(document.clone())
            .map_err(|error| fail(number, format!("not a Kubernetes object: {error}")))?;
        let kind = head
            .kind
            .ok_or_else(|| fail(number, "kind: missing".into()))?;
        let api_version = head.api_version.unwrap_or_default();
        let name = head
            .metadata
            .name
            .filter(|name| !name.is_empty())
            .ok_or_else(|| fail(number, format!("{kind}: metadata.name: missing")))?;
        let namespace = head
            .metadata
            .namespace
            .unwrap_or_else(|| "default".to_owned());
        let what = format!("{kind} {name}");
        let spec = || {
            document
                .get("spec")
                .cloned()
                .ok_or_else(|| fail(number, format!("{what}: spec: missing")))
        };
        match (api_version.as_str(), kind.as_str()) {
            ("egress-operator.io/v1alpha1", "Proxy") => objects.proxies.push(ProxyManifest {
                namespace,
                name,
                spec: typed(spec()?)
                    .map_err(|error| fail(number, format!("{what}: spec.{error}")))?,
            }),
            ("egress-operator.io/v1alpha1", "ProxyPool") => objects.pools.push(PoolManifest {
                namespace,
                name,
                spec: typed(spec()?)
                    .map_err(|error| fail(number, format!("{what}: spec.{error}")))?,
            }),
            ("egress-operator.io/v1alpha1", "ProviderConfig") => {
                objects.provider_configs.push(ProviderConfigManifest {
                    name,
                    spec: typed(spec()?)
                        .map_err(|error| fail(number, format!("{what}: spec.{error}")))?,
                });
            }
            ("v1", "Secret") => {
                let data: Data<String> = typed(document.clone())
                    .map_err(|error| fail(number, format!("{what}: {error}")))?;
                let mut values = BTreeMap::new();
                for (key, encoded) in data.data {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(encoded.trim())
                        .map_err(|_| fail(number, format!("{what}: data.{key}: not base64")))?;
                    values.insert(key, bytes);
                }
                for (key, value) in data.string_data {
                    values.insert(key, value.into_bytes());
                }
                objects.secrets.insert((namespace, name), values);
            }
            ("v1", "ConfigMap") => {
                let data: Data<String> = typed(document.clone())
                    .map_err(|error| fail(number, format!("{what}: {error}")))?;
                if let Some(key) = data.binary_data.keys().next() {
                    return Err(fail(
                        number,
                        format!("{what}: binaryData.{key}: not supported for user-data or CAs"),
                    ));
                }
                objects.config_maps.insert((namespace, name), data.data);
            }
            _ => {
                return Err(fail(
                    number,
                    format!(
                        "{api_version} {kind} is not a kind local mode reads (Proxy, ProxyPool, ProviderConfig, Secret, ConfigMap)"
                    ),
                ));
            }
        }
    }
    Ok(objects)
}

/// The documents of a file: one of a `.json` file, every non-empty one of a YAML file.
fn documents(
    path: &Path,
    text: &str,
    fail: &dyn Fn(usize, String) -> ManifestError,
) -> Result<Vec<serde_json::Value>, ManifestError> {
    if path
        .extension()
        .is_some_and(|extension| extension == "json")
    {
        let value =
            serde_json::from_str(text).map_err(|error| fail(1, format!("not JSON: {error}")))?;
        return Ok(vec![value]);
    }
    let mut documents = Vec::new();
    for (index, document) in serde_norway::Deserializer::from_str(text).enumerate() {
        let value = serde_json::Value::deserialize(document)
            .map_err(|error| fail(index + 1, format!("not YAML: {error}")))?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    Ok(documents)
}

/// Deserialize with the path of the field at fault in the error (`providerConfigRef: missing
/// field`, `grant.http.origins[0]: invalid type`).
fn typed<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let mut path = error.path().to_string();
        let inner = error.into_inner().to_string();
        // serde reports a missing field at its parent: name the field itself.
        if let Some(field) = inner
            .strip_prefix("missing field `")
            .and_then(|rest| rest.strip_suffix('`'))
        {
            path = if path == "." {
                field.to_owned()
            } else {
                format!("{path}.{field}")
            };
        }
        if path == "." {
            inner
        } else {
            format!("{path}: {inner}")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
apiVersion: egress-operator.io/v1alpha1
kind: ProviderConfig
metadata: {name: proxmox-lab}
spec:
  component: {file: proxmox.wasm}
  config: {apiUrl: "https://127.0.0.1:8006"}
  grant:
    http:
      origins: ["https://127.0.0.1:8006"]
      credential:
        header: Authorization
        format: "PVEAPIToken={secret}"
        secretRef: {name: proxmox-token, key: token}
---
apiVersion: v1
kind: Secret
metadata: {name: proxmox-token}
stringData: {token: "root@pam!op=abc"}
data: {other: aGVsbG8=}
---
apiVersion: egress-operator.io/v1alpha1
kind: Proxy
metadata: {name: web, namespace: team-a}
spec:
  providerConfigRef: proxmox-lab
  tags: {team: a}
"#;

    #[test]
    fn a_file_of_several_documents_gives_each_object() {
        let objects = parse_file(Path::new("lab.yaml"), GOOD).unwrap();
        assert_eq!(objects.provider_configs[0].name, "proxmox-lab");
        assert_eq!(
            objects.provider_configs[0].spec.component.file,
            "proxmox.wasm"
        );
        let proxy = &objects.proxies[0];
        assert_eq!(
            (proxy.namespace.as_str(), proxy.name.as_str()),
            ("team-a", "web")
        );
        assert_eq!(proxy.spec.provider_config_ref, "proxmox-lab");
        let secret = &objects.secrets[&("default".to_owned(), "proxmox-token".to_owned())];
        assert_eq!(secret["token"], b"root@pam!op=abc");
        assert_eq!(secret["other"], b"hello");
    }

    #[test]
    fn a_bad_document_is_one_error_naming_the_file_the_document_and_the_field() {
        let bad = GOOD.replace(
            "providerConfigRef: proxmox-lab",
            "providerConfig: proxmox-lab",
        );
        let error = parse_file(Path::new("/m/lab.yaml"), &bad).unwrap_err();
        assert_eq!(
            error.message,
            "/m/lab.yaml: document 3: Proxy web: spec.providerConfigRef: missing field `providerConfigRef`"
        );
        let typo = GOOD.replace(r#"origins: ["https://127.0.0.1:8006"]"#, "origins: 8006");
        let error = parse_file(Path::new("lab.yaml"), &typo).unwrap_err();
        assert!(
            error.message.starts_with("lab.yaml: document 1: ProviderConfig proxmox-lab: spec.grant.http.origins: invalid type"),
            "{}",
            error.message
        );
        for (text, expected) in [
            (
                "kind: Proxy\nmetadata: {name: x}\n",
                "is not a kind local mode reads",
            ),
            ("apiVersion: v1\nmetadata: {name: x}\n", "kind: missing"),
            (
                "apiVersion: v1\nkind: Secret\ndata: {k: '!!'}\nmetadata: {name: s}\n",
                "data.k: not base64",
            ),
            ("a: [\n", "not YAML"),
        ] {
            let error = parse_file(Path::new("x.yaml"), text).unwrap_err();
            assert!(error.message.contains(expected), "{}", error.message);
        }
    }

    #[test]
    fn a_broken_file_keeps_its_last_good_objects_and_a_removed_one_loses_them() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("lab.yaml"), GOOD).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not a manifest").unwrap();
        let mut folder = Folder::default();
        assert!(folder.rescan(dir.path()).unwrap().is_empty());
        assert!(folder.proxies().contains_key("team-a/web"));

        std::fs::write(dir.path().join("lab.yaml"), "kind: [").unwrap();
        let errors = folder.rescan(dir.path()).unwrap();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            folder.rescan(dir.path()).unwrap().is_empty(),
            "reported once while it stays"
        );
        assert!(
            folder.proxies().contains_key("team-a/web"),
            "a typo does not delete"
        );
        assert_eq!(
            folder
                .secret_value("default", "proxmox-token", "token")
                .unwrap(),
            b"root@pam!op=abc"
        );

        std::fs::remove_file(dir.path().join("lab.yaml")).unwrap();
        assert!(folder.rescan(dir.path()).unwrap().is_empty());
        assert!(folder.proxies().is_empty());
    }

    #[test]
    fn an_object_declared_twice_is_reported_and_the_first_file_wins() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), GOOD).unwrap();
        std::fs::write(
            dir.path().join("b.yaml"),
            GOOD.replace("tags: {team: a}", "tags: {team: b}"),
        )
        .unwrap();
        let mut folder = Folder::default();
        let errors = folder.rescan(dir.path()).unwrap();
        assert!(
            errors
                .iter()
                .any(|e| e.message.contains("Proxy team-a/web is already declared")),
            "{errors:?}"
        );
        assert_eq!(folder.proxies()["team-a/web"].spec.tags["team"], "a");
    }
}
