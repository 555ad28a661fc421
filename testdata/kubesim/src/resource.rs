//! The resource types the server serves: built-in ones, and custom ones registered by creating a
//! `CustomResourceDefinition` (or through [`KubeSim::register`](crate::KubeSim::register)).

use std::collections::BTreeMap;

use serde_json::Value;

/// A kind of object the server stores, named the way its URLs name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceType {
    /// API group, empty for the core group (`/api/v1`).
    pub group: String,
    /// Versions served, the preferred one first. Objects are stored once and shown in any of
    /// them (no conversion).
    pub versions: Vec<String>,
    /// Kind, e.g. `ConfigMap`.
    pub kind: String,
    /// Plural resource name used in paths, e.g. `configmaps`.
    pub plural: String,
    /// Singular name, the lower-case kind unless a CRD says otherwise.
    pub singular: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Whether the kind has the `status` subresource: then `.status` changes only through it.
    pub status_subresource: bool,
}

impl ResourceType {
    /// A namespaced kind without the status subresource; see [`ResourceType::with_status`].
    pub fn namespaced(group: &str, version: &str, kind: &str, plural: &str) -> Self {
        ResourceType {
            group: group.to_string(),
            versions: vec![version.to_string()],
            kind: kind.to_string(),
            plural: plural.to_string(),
            singular: kind.to_ascii_lowercase(),
            namespaced: true,
            status_subresource: false,
        }
    }

    /// A cluster-scoped kind without the status subresource.
    pub fn cluster(group: &str, version: &str, kind: &str, plural: &str) -> Self {
        ResourceType {
            namespaced: false,
            ..Self::namespaced(group, version, kind, plural)
        }
    }

    /// The same kind, with the `status` subresource.
    #[must_use]
    pub fn with_status(mut self) -> Self {
        self.status_subresource = true;
        self
    }

    /// `v1` or `group/version`.
    pub(crate) fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    /// The type a `CustomResourceDefinition` object declares, if it is well formed enough.
    pub(crate) fn from_crd(crd: &Value) -> Option<Self> {
        let spec = crd.get("spec")?;
        let names = spec.get("names")?;
        let kind = names.get("kind")?.as_str()?;
        let served: Vec<&Value> = spec
            .get("versions")?
            .as_array()?
            .iter()
            .filter(|v| v.get("served").and_then(Value::as_bool).unwrap_or(true))
            .collect();
        let versions: Vec<String> = served
            .iter()
            .filter_map(|v| v.get("name").and_then(Value::as_str).map(str::to_string))
            .collect();
        if versions.is_empty() {
            return None;
        }
        let status_subresource = served
            .iter()
            .any(|v| v.pointer("/subresources/status").is_some());
        Some(ResourceType {
            group: spec.get("group")?.as_str()?.to_string(),
            versions,
            kind: kind.to_string(),
            plural: names.get("plural")?.as_str()?.to_string(),
            singular: names
                .get("singular")
                .and_then(Value::as_str)
                .map_or_else(|| kind.to_ascii_lowercase(), str::to_string),
            namespaced: spec.get("scope").and_then(Value::as_str) != Some("Cluster"),
            status_subresource,
        })
    }
}

/// The types being served, keyed by (group, plural).
#[derive(Debug, Clone)]
pub(crate) struct Registry {
    types: BTreeMap<(String, String), ResourceType>,
}

impl Registry {
    /// The built-in kinds: enough of core v1, apps/v1, batch/v1, coordination, events and
    /// apiextensions for an operator.
    pub(crate) fn builtin() -> Self {
        let n = ResourceType::namespaced;
        let c = ResourceType::cluster;
        let types = [
            c("", "v1", "Namespace", "namespaces").with_status(),
            c("", "v1", "Node", "nodes").with_status(),
            n("", "v1", "ConfigMap", "configmaps"),
            n("", "v1", "Secret", "secrets"),
            n("", "v1", "Event", "events"),
            n("", "v1", "ServiceAccount", "serviceaccounts"),
            n("", "v1", "Service", "services").with_status(),
            n("", "v1", "Pod", "pods").with_status(),
            n("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims").with_status(),
            n("apps", "v1", "Deployment", "deployments").with_status(),
            n("apps", "v1", "StatefulSet", "statefulsets").with_status(),
            n("apps", "v1", "DaemonSet", "daemonsets").with_status(),
            n("batch", "v1", "Job", "jobs").with_status(),
            n("coordination.k8s.io", "v1", "Lease", "leases"),
            n("events.k8s.io", "v1", "Event", "events"),
            c(
                "apiextensions.k8s.io",
                "v1",
                "CustomResourceDefinition",
                "customresourcedefinitions",
            )
            .with_status(),
        ];
        let mut registry = Registry {
            types: BTreeMap::new(),
        };
        for t in types {
            registry.register(t);
        }
        registry
    }

    pub(crate) fn register(&mut self, t: ResourceType) {
        self.types.insert((t.group.clone(), t.plural.clone()), t);
    }

    pub(crate) fn unregister(&mut self, group: &str, plural: &str) {
        self.types.remove(&(group.to_string(), plural.to_string()));
    }

    pub(crate) fn get(&self, group: &str, plural: &str) -> Option<&ResourceType> {
        self.types.get(&(group.to_string(), plural.to_string()))
    }

    /// The type of a `kind` in `group`, for objects handed in by `apiVersion` and `kind`.
    pub(crate) fn by_kind(&self, group: &str, kind: &str) -> Option<&ResourceType> {
        self.types
            .values()
            .find(|t| t.group == group && t.kind == kind)
    }

    /// Every served type, by group then plural.
    pub(crate) fn all(&self) -> impl Iterator<Item = &ResourceType> {
        self.types.values()
    }

    /// Every served type of one group and version.
    pub(crate) fn in_group_version<'a>(
        &'a self,
        group: &'a str,
        version: &'a str,
    ) -> impl Iterator<Item = &'a ResourceType> + 'a {
        self.types
            .values()
            .filter(move |t| t.group == group && t.versions.iter().any(|v| v == version))
    }

    /// Every non-core group with its versions, preferred first.
    pub(crate) fn groups(&self) -> BTreeMap<&str, Vec<&str>> {
        let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for t in self.types.values().filter(|t| !t.group.is_empty()) {
            let versions = groups.entry(&t.group).or_default();
            for v in &t.versions {
                if !versions.contains(&v.as_str()) {
                    versions.push(v);
                }
            }
        }
        groups
    }
}
