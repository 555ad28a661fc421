//! `ProxyPool`: N Proxies of one template kept up as one object, rolled when the template
//! changes, spread across hypervisor hosts, their unhealthy members replaced (issue 34). The
//! resource and its template hash; what a pool does next is the operator's `pool` planner.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
pub use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ProxySpec;

/// The label on every Proxy of a pool: the owning pool's name.
pub const POOL_LABEL: &str = "egress-operator.io/pool";
/// The label on every Proxy of a pool: the hash of the template it was made from
/// ([`template_hash`]), as a ReplicaSet's `pod-template-hash`.
pub const TEMPLATE_HASH_LABEL: &str = "egress-operator.io/template-hash";
/// How many hex digits of the template's sha256 the hash keeps (40 bits: a label value, and
/// enough that two templates of one pool do not collide).
const TEMPLATE_HASH_DIGITS: usize = 10;

/// N egress proxies of one template, kept up as one object: the pool makes and deletes its
/// Proxies (each named after the pool, labelled `egress-operator.io/pool` and
/// `egress-operator.io/template-hash`) to keep `replicas` of them, replaces them when the template changes as `strategy` says, keeps
/// them apart across hosts as `spread` asks, and replaces unhealthy ones within `remediation`.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "egress-operator.io",
    version = "v1alpha1",
    kind = "ProxyPool",
    plural = "proxypools",
    namespaced,
    status = "ProxyPoolStatus",
    shortname = "pxp",
    category = "egress",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Up-to-date","type":"integer","jsonPath":".status.updatedReplicas"}"#,
    printcolumn = r#"{"name":"Available","type":"integer","jsonPath":".status.availableReplicas"}"#,
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.template.spec.providerConfigRef","priority":1}"#,
    printcolumn = r#"{"name":"Progressing","type":"string","jsonPath":".status.conditions[?(@.type==\"Progressing\")].reason","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ProxyPoolSpec {
    /// How many Proxies the pool keeps (default 1). `kubectl scale` and an autoscaler set it
    /// through the scale subresource.
    #[serde(default = "ProxyPoolSpec::default_replicas")]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// What each Proxy of the pool is made from.
    pub template: PoolTemplate,
    /// How Proxies of an older template are replaced (default: rolling, surge 1, unavailable 0).
    #[serde(default)]
    pub strategy: PoolStrategy,
    /// Hold a rollout: no Proxy is made or deleted for a template change while set. Scaling
    /// and remediation go on, as a paused Deployment still scales.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// Seconds a change may go without progress (a Proxy of the template becoming Ready) before
    /// `Progressing` turns `False` with `ProgressDeadlineExceeded` and the rollout stops making
    /// surge Proxies and deleting old ones (default 600).
    #[serde(default = "ProxyPoolSpec::default_progress_deadline")]
    #[schemars(range(min = 1))]
    pub progress_deadline_seconds: i32,
    /// Keep the Proxies on different hypervisor hosts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<Spread>,
    /// How many unhealthy Proxies the pool replaces at once.
    #[serde(default)]
    pub remediation: Remediation,
}

impl ProxyPoolSpec {
    fn default_replicas() -> i32 {
        1
    }

    fn default_progress_deadline() -> i32 {
        600
    }

    /// A spec of `replicas` Proxies of `template`, every other field its default.
    pub fn new(replicas: i32, template: ProxySpec) -> ProxyPoolSpec {
        ProxyPoolSpec {
            replicas,
            template: PoolTemplate {
                metadata: None,
                spec: template,
            },
            strategy: PoolStrategy::default(),
            paused: false,
            progress_deadline_seconds: Self::default_progress_deadline(),
            spread: None,
            remediation: Remediation::default(),
        }
    }
}

/// What each Proxy of a pool is made from: its labels and annotations (beside the pool's own)
/// and its spec.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolTemplate {
    /// Labels and annotations put on each Proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    /// Each Proxy's spec, as a Proxy of its own takes it.
    pub spec: ProxySpec,
}

/// Labels and annotations of a pool's Proxies.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    /// Labels, beside the pool's own two (`egress-operator.io/pool` and
    /// `egress-operator.io/template-hash`), which they cannot override.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// How a pool replaces Proxies of an older template.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.type == 'RollingUpdate' || !has(self.rollingUpdate)",
        "message": "strategy.rollingUpdate applies only to type RollingUpdate; leave it out with Recreate",
    },
]))]
pub struct PoolStrategy {
    /// `RollingUpdate` (the default) or `Recreate`.
    #[serde(default, rename = "type")]
    pub type_: StrategyType,
    /// The bounds of a rolling update (default surge 1, unavailable 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdate>,
}

/// The two strategies, as a Deployment's.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum StrategyType {
    /// Make Proxies of the new template and delete old ones a few at a time, within
    /// `maxSurge` and `maxUnavailable`.
    #[default]
    RollingUpdate,
    /// Delete every old Proxy first; make new ones when none of the old remain.
    Recreate,
}

/// The bounds of a rolling update: a count or a percent of `replicas`, as a Deployment's.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "type(self.maxSurge) == int ? self.maxSurge >= 0 : self.maxSurge.matches('^[0-9]+%$')",
        "message": "rollingUpdate.maxSurge is a count (0 or more) or a percent of replicas such as 25%",
    },
    {
        "rule": "type(self.maxUnavailable) == int ? self.maxUnavailable >= 0 : self.maxUnavailable.matches('^0*([0-9]{1,2}|100)%$')",
        "message": "rollingUpdate.maxUnavailable is a count (0 or more) or a percent of replicas from 0% to 100%",
    },
    {
        "rule": "!((type(self.maxSurge) == int ? self.maxSurge == 0 : self.maxSurge.matches('^0+%$')) && (type(self.maxUnavailable) == int ? self.maxUnavailable == 0 : self.maxUnavailable.matches('^0+%$')))",
        "message": "rollingUpdate.maxSurge and maxUnavailable may not both be 0: a rolling update could neither add a Proxy nor remove one",
    },
]))]
// `nullable: false` on each field: kube marks every int-or-string field with a default nullable,
// and a stored null would be kept (not defaulted) and could not be read back.
pub struct RollingUpdate {
    /// How many Proxies beyond `replicas` may hold a VM during a rollout (default 1); a
    /// percent rounds up.
    #[serde(default = "RollingUpdate::default_max_surge")]
    #[schemars(extend("nullable" = false))]
    pub max_surge: IntOrString,
    /// How many fewer than `replicas` may be Ready because the rollout deleted Proxies
    /// (default 0); a percent rounds down.
    #[serde(default = "RollingUpdate::default_max_unavailable")]
    #[schemars(extend("nullable" = false))]
    pub max_unavailable: IntOrString,
}

impl RollingUpdate {
    fn default_max_surge() -> IntOrString {
        IntOrString::Int(1)
    }

    fn default_max_unavailable() -> IntOrString {
        IntOrString::Int(0)
    }
}

impl Default for RollingUpdate {
    fn default() -> Self {
        RollingUpdate {
            max_surge: Self::default_max_surge(),
            max_unavailable: Self::default_max_unavailable(),
        }
    }
}

/// Keep a pool's Proxies on different hypervisor hosts.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Spread {
    /// What to spread across: `Host` (a Proxmox node, a libvirt connection).
    #[serde(default)]
    pub across: SpreadAcross,
    /// `Required`: a Proxy no host can take stays pending, no VM is made on a host a sibling
    /// uses. `Preferred`: the provider is asked to avoid those hosts and may use them anyway.
    pub policy: SpreadPolicy,
}

/// The domain a pool spreads across.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum SpreadAcross {
    /// A hypervisor host, as the provider reports where a VM landed.
    #[default]
    Host,
}

/// How hard a spread holds.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum SpreadPolicy {
    /// Never two Proxies of the pool on one host; the extra ones stay pending.
    Required,
    /// Apart where the provider can; together rather than not at all.
    Preferred,
}

/// How many unhealthy Proxies a pool replaces at once.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "type(self.maxUnhealthy) == int ? self.maxUnhealthy >= 0 : self.maxUnhealthy.matches('^0*([0-9]{1,2}|100)%$')",
        "message": "remediation.maxUnhealthy is a count (0 or more) or a percent of replicas from 0% to 100%",
    },
]))]
pub struct Remediation {
    /// The most Proxies that may be unhealthy for the pool still to replace them (default
    /// 40%, rounded up, so a pool of one or two replaces one); when more are, something beyond
    /// the Proxies is wrong and the pool replaces none (`RemediationHalted`), as Cluster API's
    /// MachineHealthCheck. 0 turns remediation off.
    #[serde(default = "Remediation::default_max_unhealthy")]
    #[schemars(extend("nullable" = false))]
    pub max_unhealthy: IntOrString,
}

impl Remediation {
    fn default_max_unhealthy() -> IntOrString {
        IntOrString::String("40%".into())
    }
}

impl Default for Remediation {
    fn default() -> Self {
        Remediation {
            max_unhealthy: Self::default_max_unhealthy(),
        }
    }
}

/// What the operator last observed of a pool. The counts are of its Proxies not being deleted.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProxyPoolStatus {
    /// Proxies of the pool (any template), not being deleted.
    #[serde(default)]
    pub replicas: i32,
    /// Of them, those Ready (their health check included).
    #[serde(default)]
    pub ready_replicas: i32,
    /// Of them, those of the current template.
    #[serde(default)]
    pub updated_replicas: i32,
    /// Of them, those counted available: Ready (a pool has no `minReadySeconds`, so the same
    /// as `readyReplicas`; kept for tools that read a Deployment's).
    #[serde(default)]
    pub available_replicas: i32,
    /// `replicas` of the spec less `availableReplicas`, at least 0.
    #[serde(default)]
    pub unavailable_replicas: i32,
    /// The pool generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The label selector of the pool's Proxies (`egress-operator.io/pool=NAME`), for the
    /// scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The hash of the current template, as its Proxies' `egress-operator.io/template-hash`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,
    /// While a change is under way: when it began or last progressed (a Proxy of the template
    /// became Ready). What `progressDeadlineSeconds` counts from; cleared when complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_progress_time: Option<Time>,
    /// `Available`, `Progressing`, `RemediationHalted` and, with `spread`,
    /// `PlacementShortage`, in Kubernetes form.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The hash of a pool's template: the template as canonical JSON (object keys sorted, fields
/// left out absent), its sha256, the first 10 lowercase hex digits. The same template gives the
/// same hash in every process and version whose serialisation of it is the same; a new
/// optional field left out does not change it.
pub fn template_hash(template: &PoolTemplate) -> String {
    let value = serde_json::to_value(template).expect("a template serialises to JSON");
    let mut canonical = String::new();
    write_canonical(&value, &mut canonical);
    let mut hex = egress_digest::Digest::of(canonical.as_bytes()).hex();
    hex.truncate(TEMPLATE_HASH_DIGITS);
    hex
}

/// `value` as JSON with every object's keys in byte order, whatever order the map kept: serde_json
/// sorts them only while no crate in the build turns on its `preserve_order` feature.
fn write_canonical(value: &serde_json::Value, out: &mut String) {
    match value {
        serde_json::Value::Object(fields) => {
            let mut keys: Vec<&String> = fields.keys().collect();
            keys.sort();
            out.push('{');
            for (index, key) in keys.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&fields[key], out);
            }
            out.push('}');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// The label selector of pool `pool`'s Proxies, as `status.selector` writes it.
pub fn pool_selector(pool: &str) -> String {
    format!("{POOL_LABEL}={pool}")
}

/// The labels a pool puts on a Proxy it makes: the template's, then [`POOL_LABEL`] and
/// [`TEMPLATE_HASH_LABEL`] (which the template cannot override).
pub fn member_labels(pool: &str, template: &PoolTemplate) -> BTreeMap<String, String> {
    let mut labels = template
        .metadata
        .as_ref()
        .map(|metadata| metadata.labels.clone())
        .unwrap_or_default();
    labels.insert(POOL_LABEL.to_owned(), pool.to_owned());
    labels.insert(TEMPLATE_HASH_LABEL.to_owned(), template_hash(template));
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(provider: &str) -> PoolTemplate {
        PoolTemplate {
            metadata: None,
            spec: ProxySpec {
                provider_config_ref: provider.into(),
                ..ProxySpec::default()
            },
        }
    }

    #[test]
    fn a_pool_left_mostly_out_takes_every_default() {
        let spec: ProxyPoolSpec =
            serde_json::from_str(r#"{"template":{"spec":{"providerConfigRef":"pve"}}}"#).unwrap();
        assert_eq!(spec, ProxyPoolSpec::new(1, template("pve").spec));
        assert_eq!(spec.strategy.type_, StrategyType::RollingUpdate);
        assert_eq!(
            spec.remediation.max_unhealthy,
            IntOrString::String("40%".into())
        );
        let rolling: RollingUpdate = serde_json::from_str("{}").unwrap();
        assert_eq!(rolling, RollingUpdate::default());
        assert_eq!(rolling.max_surge, IntOrString::Int(1));
        assert_eq!(rolling.max_unavailable, IntOrString::Int(0));
    }

    #[test]
    fn the_template_hash_is_short_lowercase_hex_and_moves_only_with_the_template() {
        let hash = template_hash(&template("pve"));
        assert_eq!(hash.len(), 10);
        assert!(
            hash.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')),
            "{hash}"
        );
        assert_eq!(hash, template_hash(&template("pve")));
        assert_ne!(hash, template_hash(&template("kvm")));
        let mut labelled = template("pve");
        labelled.metadata = Some(TemplateMetadata {
            labels: BTreeMap::from([("team".into(), "a".into())]),
            annotations: BTreeMap::new(),
        });
        assert_ne!(hash, template_hash(&labelled));
    }

    #[test]
    fn the_canonical_form_sorts_keys_whatever_order_they_came_in() {
        let mut out = String::new();
        let value: serde_json::Value =
            serde_json::from_str(r#"{"b":[{"z":1,"a":"x\"y"}],"a":null}"#).unwrap();
        write_canonical(&value, &mut out);
        assert_eq!(out, r#"{"a":null,"b":[{"a":"x\"y","z":1}]}"#);
    }

    #[test]
    fn members_carry_the_pool_and_the_template_hash_over_the_template_labels() {
        let mut labelled = template("pve");
        labelled.metadata = Some(TemplateMetadata {
            labels: BTreeMap::from([
                ("team".into(), "a".into()),
                (POOL_LABEL.into(), "not-mine".into()),
            ]),
            annotations: BTreeMap::new(),
        });
        let labels = member_labels("edge", &labelled);
        assert_eq!(labels[POOL_LABEL], "edge");
        assert_eq!(labels[TEMPLATE_HASH_LABEL], template_hash(&labelled));
        assert_eq!(labels["team"], "a");
        assert_eq!(pool_selector("edge"), "egress-operator.io/pool=edge");
    }

    #[test]
    fn the_crd_has_the_scale_subresource_and_the_readable_rules() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(ProxyPool::crd()).unwrap();
        let version = &crd["spec"]["versions"][0];
        assert_eq!(
            version["subresources"]["scale"],
            serde_json::json!({
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector",
            })
        );
        let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(
            spec["properties"]["replicas"]["minimum"].as_f64(),
            Some(0.0)
        );
        let rules = spec["properties"]["strategy"]["properties"]["rollingUpdate"]
            ["x-kubernetes-validations"]
            .to_string();
        assert!(rules.contains("may not both be 0"), "{rules}");
        let surge = &spec["properties"]["strategy"]["properties"]["rollingUpdate"]["properties"]["maxSurge"];
        assert_eq!(
            surge["nullable"], false,
            "a stored null could not be read back"
        );
        assert_eq!(surge["x-kubernetes-int-or-string"], true);
        assert_eq!(
            crd["spec"]["names"]["shortNames"],
            serde_json::json!(["pxp"])
        );
    }
}
