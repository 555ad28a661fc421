//! # egress-crd: the operator's resources
//!
//! `Proxy` (namespaced: an egress proxy a user wants), `ProxyPool` (namespaced: N Proxies of
//! one template, rolled, spread and remediated as one object: [`ProxyPool`]) and `ProviderConfig`
//! (cluster-scoped: which provider component serves Proxies, its configuration, what it may
//! reach, and its limits). `egress-operator crdgen` prints their CRDs; the committed copies are in
//! `deploy/crds/`. A crate of its own, re-exported as `egress_operator::crd`, so that the
//! resources can be read without the operator: the types and their schemas, no client.
//!
//! The same YAML is read from a Kubernetes API server and, in local mode, from a folder.

#![warn(missing_docs)]

pub mod conditions;
mod health;
mod manifests;
mod pool;

use std::collections::BTreeMap;

pub use egress_capability_http::HttpGrant;
pub use egress_capability_libvirt::LibvirtGrant;
use egress_runtime::grant::ObjectRef;
pub use egress_runtime::grant::SecretKeyRef;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use health::*;
pub use manifests::manifests;
pub use pool::*;

/// The API group of both resources.
pub const GROUP: &str = "egress-operator.io";
/// Their API version.
pub const VERSION: &str = "v1alpha1";
/// The finalizer the operator puts on every Proxy it manages.
pub const FINALIZER: &str = "egress-operator.io/vm";
/// The field manager of every status the operator writes (server-side apply).
pub const FIELD_MANAGER: &str = "egress-operator";

/// An egress proxy: a VM that a provider makes and keeps running, reachable at its addresses.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "egress-operator.io",
    version = "v1alpha1",
    kind = "Proxy",
    plural = "proxies",
    namespaced,
    status = "ProxyStatus",
    shortname = "px",
    category = "egress",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.providerConfigRef"}"#,
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".status.addresses[0]"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase","priority":1}"#,
    printcolumn = r#"{"name":"VM","type":"string","jsonPath":".status.providerId","priority":1}"#,
    printcolumn = r#"{"name":"Host","type":"string","jsonPath":".status.host","priority":1}"#,
    printcolumn = r#"{"name":"Restarts","type":"integer","jsonPath":".status.restarts","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "size(self.providerConfigRef) > 0",
        "message": "providerConfigRef must name the ProviderConfig whose provider makes this Proxy's VM",
    },
]))]
pub struct ProxySpec {
    /// The ProviderConfig (cluster-scoped) whose provider makes this Proxy's VM.
    pub provider_config_ref: String,
    /// Cloud-init user-data for the VM's first boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<UserData>,
    /// Labels stored on the VM (beside the operator's own), for finding it again.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// What the operator does when the VM stops or fails; each field left out comes from the
    /// ProviderConfig's `recovery`, then from the defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<Recovery>,
    /// How the operator probes the proxy service at the VM's address. When set, the Proxy is
    /// `Ready` only while the probe passes, not merely while its VM runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
}

/// What the operator does with a Proxy's VM found stopped (a hypervisor rebooted, a person ran
/// `qm stop`) or failed. Every field is optional so a Proxy can override one of its
/// ProviderConfig's defaults and keep the others.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.windowSeconds) || self.windowSeconds >= 1",
        "message": "recovery.windowSeconds is at least 1",
    },
]))]
pub struct Recovery {
    /// `Restart` (the default) starts a stopped VM again, `Replace` deletes it and makes a new
    /// one, `None` only reports it. A `failed` VM is replaced under `Restart` and `Replace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<RecoveryPolicy>,
    /// How many recoveries within `windowSeconds` before the Proxy is `Degraded` and its VM
    /// is left alone (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<u32>,
    /// The window `maxRestarts` counts in, in seconds (default 900).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_seconds: Option<u64>,
    /// The least wait between two recoveries, in seconds, doubled for each recovery already in
    /// the window (default 10: 10, 20, 40, 80 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_seconds: Option<u64>,
}

/// What to do with a stopped VM.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum RecoveryPolicy {
    /// Start the same VM again (the provider's `create` adopts and starts it).
    Restart,
    /// Delete it and make a new one.
    Replace,
    /// Report it; a person acts.
    None,
}

/// A Proxy's recovery settings with every default filled in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EffectiveRecovery {
    /// What to do.
    pub policy: RecoveryPolicy,
    /// Recoveries allowed within `window`.
    pub max_restarts: u32,
    /// The window they are counted in.
    pub window: std::time::Duration,
    /// The least wait between two recoveries.
    pub backoff: std::time::Duration,
}

impl Recovery {
    /// The Proxy's settings (`self`), then the ProviderConfig's, then the defaults.
    pub fn effective(proxy: Option<&Recovery>, provider: Option<&Recovery>) -> EffectiveRecovery {
        let pick = |field: fn(&Recovery) -> Option<u64>| {
            proxy.and_then(field).or_else(|| provider.and_then(field))
        };
        EffectiveRecovery {
            policy: proxy
                .and_then(|recovery| recovery.policy)
                .or_else(|| provider.and_then(|recovery| recovery.policy))
                .unwrap_or(RecoveryPolicy::Restart),
            max_restarts: pick(|recovery| recovery.max_restarts.map(u64::from))
                .map_or(5, |max| u32::try_from(max).unwrap_or(u32::MAX)),
            window: std::time::Duration::from_secs(
                pick(|recovery| recovery.window_seconds).unwrap_or(900),
            ),
            backoff: std::time::Duration::from_secs(
                pick(|recovery| recovery.backoff_seconds).unwrap_or(10),
            ),
        }
    }
}

/// Where a Proxy's user-data comes from: exactly one of the three.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "[has(self.inline), has(self.secretKeyRef), has(self.configMapKeyRef)].filter(x, x).size() == 1",
        "message": "userData takes exactly one of inline, secretKeyRef and configMapKeyRef",
    },
]))]
pub struct UserData {
    /// The user-data itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline: Option<String>,
    /// A key of a Secret in the Proxy's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeyRef>,
    /// A key of a ConfigMap in the Proxy's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeyRef>,
}

/// A key of an object in the referring object's namespace.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct KeyRef {
    /// The object's name.
    pub name: String,
    /// The key in its data.
    pub key: String,
}

/// Where a Proxy is in its life.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum Phase {
    /// Accepted; no VM asked for yet (waiting for its ProviderConfig or user-data).
    Pending,
    /// The VM is being made or has no address yet.
    Provisioning,
    /// The VM runs and answers at its addresses.
    Running,
    /// The VM exists but is stopped.
    Stopped,
    /// A person paused or hibernated the VM: it runs again when resumed; the operator looks
    /// again at a slow interval and does not fight the person.
    Paused,
    /// The VM kept stopping: `recovery.maxRestarts` recoveries within the window, so the operator
    /// leaves it until a person starts it or changes the Proxy.
    Degraded,
    /// A person must act: the provider refused for a reason retrying cannot fix.
    Failed,
    /// The Proxy is being deleted; its VM is being removed.
    Deleting,
}

/// What the operator last observed of a Proxy.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProxyStatus {
    /// Where the Proxy is in its life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// `Ready`, `Synced` and `Provisioned`, in Kubernetes form.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The VM's ID at its provider (for example `pv1-1/123`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// The VM's name at its provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_name: Option<String>,
    /// The hypervisor host the VM runs on (a Proxmox node, a libvirt connection), when its
    /// provider says (contract 0.2.0): what a pool spreads its Proxies across.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Where the proxy answers, most preferred first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// When the provider made the VM (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// The provider that last handled this Proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<HandledBy>,
    /// The installation named in the VM's mark: the one that made it, or that adopted a VM made
    /// before marks named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installation: Option<String>,
    /// The Proxy generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// How many times the operator brought the VM back (restarted or replaced it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u32,
    /// The last time it did, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_recovery: Option<RecoveryRecord>,
    /// When it did so within the recovery window, oldest first (at most `maxRestarts`): what the
    /// rate limit counts, kept in the status so a restarted operator counts the same.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_recoveries: Vec<Time>,
}

fn is_zero(count: &u32) -> bool {
    *count == 0
}

/// One recovery of a Proxy's VM.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryRecord {
    /// When.
    pub at: Time,
    /// `Restart` or `Replace`.
    pub action: RecoveryPolicy,
    /// Why: what the VM was found in.
    pub reason: String,
}

/// The provider that last handled a Proxy.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HandledBy {
    /// The ProviderConfig.
    pub provider_config: String,
    /// Its generation at the time.
    pub provider_config_generation: i64,
    /// The revision of its binding: moves with its spec, its component, and the content of the
    /// Secrets its grant references.
    #[serde(default)]
    pub provider_config_revision: u64,
    /// The name the component describes itself under.
    pub name: String,
    /// The component's own version.
    pub version: String,
    /// The sha256 of the component's bytes.
    pub digest: String,
}

/// How an operator reaches one kind of hypervisor: a provider component, its configuration, what
/// it may reach (its grant) and its limits.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "egress-operator.io",
    version = "v1alpha1",
    kind = "ProviderConfig",
    status = "ProviderConfigStatus",
    shortname = "pc",
    category = "egress",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Component","type":"string","jsonPath":".spec.component.file"}"#,
    printcolumn = r#"{"name":"Image","type":"string","jsonPath":".status.loaded.image","priority":1}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.loaded.version"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.resyncSeconds) || self.resyncSeconds >= 1",
        "message": "resyncSeconds is at least 1",
    },
]))]
pub struct ProviderConfigSpec {
    /// Which component serves this ProviderConfig.
    pub component: ComponentRef,
    /// The provider's own configuration (JSON), checked against the JSON Schema the component
    /// describes and with its `validate-config` before any call. Never holds credentials.
    #[serde(default = "empty_object")]
    #[schemars(schema_with = "free_form_object")]
    pub config: serde_json::Value,
    /// What the provider may reach. Without it, every request it makes is denied.
    #[serde(default)]
    pub grant: GrantSpec,
    /// Limits on each call, in place of the operator's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsSpec>,
    /// How VMs marked as this ProviderConfig's, whose Proxy is gone, are found and removed.
    #[serde(default)]
    pub orphan_sweep: OrphanSweep,
    /// What its Proxies do when their VM stops or fails, unless a Proxy says otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<Recovery>,
    /// Seconds between looks at each of its Proxies' VMs (one `get` each), in place of the
    /// operator's `--resync-seconds`: the bound on noticing a VM that stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync_seconds: Option<u64>,
    /// How much of its provider's calls the operator logs, beyond what it shows of every
    /// provider: `Debug` adds one line per hypervisor call (the provider's and the broker's),
    /// `Trace` everything. It only adds: the operator's own filter (`RUST_LOG`) still applies to
    /// the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_level: Option<LogLevel>,
    /// Record its provider's calls: each call's input and output and every exchange as the
    /// broker answered it, redacted, one file per call in the operator's recordings folder
    /// (`--recordings-dir`), the oldest removed first (docs/recordings.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<RecordSpec>,
}

/// How many of a ProviderConfig's calls are kept recorded, and how much of each.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RecordSpec {
    /// The most recordings kept (default 50).
    #[serde(default = "RecordSpec::default_keep")]
    #[schemars(range(min = 1, max = 10000))]
    pub keep: u32,
    /// The most bytes kept of one body; the rest is cut off and marked (default 1 MiB).
    #[serde(default = "RecordSpec::default_body_bytes")]
    #[schemars(range(min = 0))]
    pub max_body_bytes: u64,
    /// The most body bytes kept of one call (default 8 MiB).
    #[serde(default = "RecordSpec::default_call_bytes")]
    #[schemars(range(min = 0))]
    pub max_call_bytes: u64,
}

impl RecordSpec {
    fn default_keep() -> u32 {
        50
    }

    fn default_body_bytes() -> u64 {
        1 << 20
    }

    fn default_call_bytes() -> u64 {
        8 << 20
    }
}

/// How much of one provider's calls is logged.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum LogLevel {
    /// As every provider: each operation's outcome, warnings and errors.
    Info,
    /// And each call to the hypervisor.
    Debug,
    /// Everything the provider and the host log for its calls.
    Trace,
}

impl LogLevel {
    /// The level as a log filter names it (`debug`).
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// A provider component: a file of the operator's components directory, or an OCI artifact in a
/// registry (`image`). Exactly one of the two.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "(has(self.file) && size(self.file) > 0) != has(self.image)",
        "message": "component takes exactly one of file (a file of the operator's components directory) and image (an OCI artifact)",
    },
    {
        "rule": "!has(self.image) || self.image.contains('@sha256:')",
        "message": "component.image must be pinned by digest in a cluster (REGISTRY/REPOSITORY[:TAG]@sha256:DIGEST); only local mode resolves a tag alone",
    },
    {
        "rule": "!has(self.digest) || self.digest.matches('^sha256:[0-9a-f]{64}$')",
        "message": "component.digest is sha256: and 64 lower-case hex digits",
    },
    {
        "rule": "!has(self.image) || !has(self.digest)",
        "message": "component.digest pins a file; an image is pinned by the digest in component.image",
    },
]))]
pub struct ComponentRef {
    /// A file of the operator's components directory, such as `proxmox.wasm`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub file: String,
    /// Serve only the component file with this digest (`sha256:<hex>`): a replaced file with
    /// other bytes is refused and the pinned one keeps serving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// An OCI artifact in the wasm layout: `REGISTRY/REPOSITORY[:TAG]@sha256:DIGEST`. Kubernetes
    /// mode requires the digest; local mode resolves a tag alone once and records the digest in
    /// `status.loaded.image`, then serves that digest (a tag that moves is reported, not
    /// followed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// How to reach the image's registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<RegistryAccess>,
    /// The keys allowed to sign the image (cosign-compatible keyed signatures stored beside it
    /// in the registry). An image is refused unless one of them signed its digest, or the
    /// operator runs with `--allow-unsigned-images`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signed_by: Vec<SigningKeyRef>,
}

/// How the operator reaches an image's registry.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistryAccess {
    /// A Secret of type `kubernetes.io/dockerconfigjson` (key `.dockerconfigjson`) holding the
    /// registry's credentials; anonymous without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret: Option<String>,
    /// PEM CA certificates the registry's TLS certificate is checked against, beside the public
    /// web PKI roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_config_map_ref: Option<SecretKeyRef>,
    /// Speak plain HTTP to this image's registry. Only for a registry on a trusted network: the
    /// digest and the signature still hold, the credentials do not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plain_http: bool,
}

/// A public key allowed to sign provider images: a PEM `PUBLIC KEY` (ECDSA P-256, cosign's
/// default, as `cosign generate-key-pair` writes to `cosign.pub`) in a ConfigMap.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SigningKeyRef {
    /// The ConfigMap key holding the PEM public key. Its namespace is always the operator's:
    /// whoever may write there is trusted to name signers.
    pub config_map_ref: SecretKeyRef,
}

impl ProviderConfigSpec {
    /// Every Secret and ConfigMap key the spec names: its grants', the registry's CA, the
    /// signing keys.
    pub fn references(&self) -> Vec<ObjectRef<'_>> {
        let mut references = self.grant.references();
        references.extend(self.component.references());
        references
    }
}

impl ComponentRef {
    /// The ConfigMap keys its image needs: the registry's CA and the signing keys. (The pull
    /// Secret is named by [`RegistryAccess::pull_secret`] alone.)
    pub fn references(&self) -> Vec<ObjectRef<'_>> {
        let mut references = Vec::new();
        if let Some(ca) = self
            .registry
            .as_ref()
            .and_then(|registry| registry.ca_config_map_ref.as_ref())
        {
            references.push(ObjectRef::ConfigMap(ca));
        }
        references.extend(
            self.signed_by
                .iter()
                .map(|key| ObjectRef::ConfigMap(&key.config_map_ref)),
        );
        references
    }
}

/// What a provider may reach: one grant per capability (`spec.grant`).
pub use egress_capability_set::Grants as GrantSpec;

/// Per-call limits for one ProviderConfig's provider.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.deadlineSeconds) || self.deadlineSeconds.all(op, op in ['describe', 'validate-config', 'create', 'get', 'delete', 'list-by-tag', 'check'] && self.deadlineSeconds[op] >= 1)",
        "message": "limits.deadlineSeconds: keys are operations (describe, validate-config, create, get, delete, list-by-tag, check), values at least 1 second",
    },
    {
        "rule": "!has(self.cpuMillis) || self.cpuMillis.all(op, op in ['describe', 'validate-config', 'create', 'get', 'delete', 'list-by-tag', 'check'] && self.cpuMillis[op] >= 1)",
        "message": "limits.cpuMillis: keys are operations (describe, validate-config, create, get, delete, list-by-tag, check), values at least 1 millisecond",
    },
    {
        "rule": "(!has(self.memoryMib) || self.memoryMib >= 1) && (!has(self.concurrency) || self.concurrency >= 1) && (!has(self.httpSentMib) || self.httpSentMib >= 1) && (!has(self.httpReceivedMib) || self.httpReceivedMib >= 1)",
        "message": "limits.memoryMib, concurrency, httpSentMib and httpReceivedMib are at least 1",
    },
]))]
pub struct LimitsSpec {
    /// Wall-clock deadline per operation, in seconds.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 7))]
    pub deadline_seconds: BTreeMap<String, u64>,
    /// CPU time per operation, in milliseconds.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 7))]
    pub cpu_millis: BTreeMap<String, u64>,
    /// Linear memory per call, in MiB (at most the operator's pool slot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// Calls running at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// MiB of HTTP request bodies one call may send (default 256): raise it for a provider that
    /// uploads large files such as seed images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_sent_mib: Option<u64>,
    /// MiB of HTTP response bodies one call may receive (default 256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_received_mib: Option<u64>,
}

/// How VMs marked as this ProviderConfig's whose Proxy is gone are handled.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.intervalSeconds >= 1",
        "message": "orphanSweep.intervalSeconds is at least 1",
    },
]))]
pub struct OrphanSweep {
    /// `Delete` them, only `Report` them (status and events), or `Off`.
    #[serde(default = "OrphanSweep::default_mode")]
    pub mode: SweepMode,
    /// Seconds between sweeps.
    #[serde(default = "OrphanSweep::default_interval")]
    pub interval_seconds: u64,
}

impl OrphanSweep {
    fn default_mode() -> SweepMode {
        SweepMode::Delete
    }

    fn default_interval() -> u64 {
        300
    }
}

impl Default for OrphanSweep {
    fn default() -> Self {
        OrphanSweep {
            mode: Self::default_mode(),
            interval_seconds: Self::default_interval(),
        }
    }
}

/// What the orphan sweep does with an orphan.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum SweepMode {
    /// Delete it.
    Delete,
    /// Report it in the ProviderConfig's status and an event; leave it.
    Report,
    /// Do not sweep.
    Off,
}

/// What the operator last observed of a ProviderConfig.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProviderConfigStatus {
    /// The component serving it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loaded: Option<LoadedComponent>,
    /// What the provider may reach, as enforced, without secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_grant: Option<EffectiveGrant>,
    /// `Ready` (from the provider's `check`) and `Degraded` (a replacement that failed to load,
    /// or a configuration refused, while the last good one keeps serving).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The last orphan sweep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orphans: Option<OrphanReport>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The component that serves a ProviderConfig.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LoadedComponent {
    /// The file (empty for an image).
    #[serde(default)]
    pub file: String,
    /// The image, pinned to the digest that serves (`REGISTRY/REPOSITORY@sha256:…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The name it describes itself under.
    pub name: String,
    /// Its own version.
    pub version: String,
    /// The contract version it implements.
    pub contract_version: String,
    /// The sha256 of its bytes (`sha256:<hex>`).
    pub digest: String,
    /// The operator's load generation (increases with every hot swap).
    pub generation: u64,
}

/// What a provider may reach, as the broker enforces it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveGrant {
    /// The identity the grant belongs to (the ProviderConfig's name).
    pub identity: String,
    /// The component digest it is pinned to.
    pub digest: String,
    /// HTTP, if granted: origins, TLS, and the credential's header, format and Secret (never its
    /// value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpGrant>,
    /// libvirt, if granted: the owner, connections, pools, networks, image origins, and the SSH
    /// key's Secret (never its value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libvirt: Option<LibvirtGrant>,
}

/// The last orphan sweep's findings.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OrphanReport {
    /// When it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sweep: Option<Time>,
    /// Provider IDs of VMs marked as ours whose Proxy no longer exists.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub found: Vec<String>,
    /// How many of them were deleted.
    #[serde(default)]
    pub deleted: u32,
    /// How many VMs made through a ProviderConfig of this name carry no mark of this
    /// installation: another installation's, or made before marks named one. Never deleted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub foreign: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_key_that_names_no_capability_is_refused_naming_it() {
        let spec = |grant: &str| {
            serde_json::from_str::<ProviderConfigSpec>(&format!(
                r#"{{"component":{{"file":"libvirt.wasm"}},"grant":{grant}}}"#
            ))
        };
        let error = spec(r#"{"libvrt":{"connections":[]}}"#).unwrap_err();
        assert!(error.to_string().contains("libvrt"), "{error}");
        let granted = spec(
            r#"{"http":{"origins":["https://h"]},"libvirt":{"connections":[{"name":"c","uri":"qemu:///system"}]}}"#,
        )
        .unwrap();
        assert_eq!(granted.grant.granted(), ["http", "libvirt"]);
        // A field renamed inside a capability's grant is refused by that capability's own type.
        let error = spec(
            r#"{"libvirt":{"connections":[{"name":"c","uri":"qemu:///system","sshKey":"x"}]}}"#,
        )
        .unwrap_err();
        assert!(error.to_string().contains("sshKey"), "{error}");
    }
}
