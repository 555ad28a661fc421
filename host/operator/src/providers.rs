//! ProviderConfigs bound to loaded components: [`ProviderSet`].
//!
//! A ProviderConfig names a component file of the components directory (served and hot-swapped
//! by the runtime's [`Registry`]). Applying it:
//!
//! 1. finds the file's current generation (or the digest the spec pins);
//! 2. checks the provider's configuration against the JSON Schema its `describe` published, then
//!    with its own `validate-config`;
//! 3. binds the component under the ProviderConfig's **name** as its identity, with the limits the
//!    spec asks for ([`Provider::bind`]): grants, permits, metrics and logs follow that name,
//!    never the name the component gives itself;
//! 4. sets each capability's grant for that identity (`spec.grant`, one typed document per
//!    capability), pinned to the digest just bound (and to older generations still finishing
//!    calls), with what it references (a credential, a CA, an SSH key) resolved from the
//!    Secrets and ConfigMaps the adapter watches; a capability the component imports without a
//!    grant leaves the ProviderConfig not Ready, naming it;
//! 5. runs the provider's `check`.
//!
//! A step that fails leaves the last good binding serving, with a `Degraded` condition naming the
//! problem. [`ProviderSet::binding`] is what the Proxy reconciler calls through.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_runtime::grant::{GrantContext, ObjectRef, digest_hex};
use egress_runtime::types::{CheckReason, Operation, Request, Response};
use egress_runtime::{CallContext, Limits, Provider, Registry, RegistryEvent};

use crate::crd::{
    EffectiveGrant, GrantSpec, LimitsSpec, LoadedComponent, OrphanSweep, ProviderConfigSpec, Recovery,
    ProviderConfigStatus, conditions, set_condition,
};
use crate::grants::{Capabilities, ObjectsHost};
use crate::{Note, Objects, lock, now};

/// A ProviderConfig's provider, ready to serve Proxies.
#[derive(Debug)]
pub struct Binding {
    /// The ProviderConfig, which is the provider's identity.
    pub provider_config: String,
    /// The ProviderConfig's generation this binding was made from.
    pub generation: i64,
    /// The component bound under that identity with the spec's limits.
    pub provider: Arc<Provider>,
    /// The provider's configuration (JSON), passed to every call.
    pub config: String,
    /// The orphan sweep settings.
    pub sweep: OrphanSweep,
    /// Its Proxies' recovery defaults.
    pub recovery: Option<Recovery>,
    /// How often its Proxies' VMs are looked at, in place of the operator's resync.
    pub resync: Option<Duration>,
    /// Counts every change of what this binding stands for: the spec, the component, and the
    /// content of the Secrets and ConfigMaps its grant references (a rotated credential can fix
    /// what failed permanently, so Proxies blocked on the old one try again).
    pub revision: u64,
}

impl Binding {
    /// What a Proxy records of the provider that handled it.
    pub fn handled_by(&self) -> crate::crd::HandledBy {
        let description = self.provider.description();
        crate::crd::HandledBy {
            provider_config: self.provider_config.clone(),
            provider_config_generation: self.generation,
            provider_config_revision: self.revision,
            name: description.name.clone(),
            version: description.version.clone(),
            digest: format!("sha256:{}", self.provider.digest()),
        }
    }
}

/// Why a ProviderConfig cannot serve a Proxy now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotReady {
    /// A condition reason (`ProviderConfigNotFound`, `ComponentNotLoaded`, …).
    pub reason: &'static str,
    /// For people.
    pub message: String,
}

/// What applying a ProviderConfig produced.
#[derive(Debug)]
pub struct Applied {
    /// Its new status.
    pub status: ProviderConfigStatus,
    /// Events to record on it.
    pub notes: Vec<Note>,
    /// Whether the binding Proxies call through changed (Proxies should reconcile).
    pub rebound: bool,
}

/// Per ProviderConfig: the last good binding and what it holds in memory.
struct Entry {
    binding: Option<Arc<Binding>>,
    /// A digest of what the binding stands for (generation, component, referenced Secrets'
    /// content), held in memory only; a change bumps `revision`.
    fingerprint: [u8; 32],
    revision: u64,
    /// Earlier bindings, kept until their calls finish so their digest stays granted.
    retired: Vec<Arc<Binding>>,
    /// Why Proxies may not call through `binding` (its grant was refused or lacks a capability
    /// the component imports): a call would be denied by the capability, which a provider
    /// reports as permanent.
    refusal: Option<NotReady>,
}

/// Every ProviderConfig's binding, over one registry and the host's capabilities.
pub struct ProviderSet {
    registry: Registry,
    capabilities: Capabilities,
    /// The operator's namespace: where a Secret reference without one points.
    namespace: String,
    /// Limits for providers whose spec sets none.
    defaults: Limits,
    entries: Mutex<HashMap<String, Entry>>,
    /// The last load error of each component file, from the registry's events.
    load_errors: Arc<Mutex<BTreeMap<PathBuf, String>>>,
}

impl std::fmt::Debug for ProviderSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderSet")
            .field("components", &self.registry.dir())
            .field("capabilities", &self.capabilities)
            .finish_non_exhaustive()
    }
}

impl ProviderSet {
    /// Bindings over the components `registry` serves, with grants set on `capabilities` (those
    /// the registry's runtime serves). `namespace` is where a Secret reference without a
    /// namespace points; `defaults` the limits of a spec that sets none.
    pub fn new(
        registry: Registry,
        capabilities: Capabilities,
        namespace: &str,
        defaults: Limits,
    ) -> Self {
        let load_errors = Arc::new(Mutex::new(BTreeMap::new()));
        let mut events = registry.subscribe();
        let errors = Arc::clone(&load_errors);
        tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(RegistryEvent::Rejected { path, error }) => {
                        lock(&errors).insert(path, error);
                    }
                    Ok(
                        RegistryEvent::Loaded { path, .. } | RegistryEvent::Removed { path, .. },
                    ) => {
                        lock(&errors).remove(&path);
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        ProviderSet {
            registry,
            capabilities,
            namespace: namespace.to_owned(),
            defaults,
            entries: Mutex::new(HashMap::new()),
            load_errors,
        }
    }

    /// The registry serving the components directory.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The binding Proxies of ProviderConfig `name` call through.
    pub fn binding(&self, name: &str) -> Result<Arc<Binding>, NotReady> {
        let entries = lock(&self.entries);
        let entry = entries.get(name);
        if let Some(refusal) = entry.and_then(|entry| entry.refusal.clone()) {
            return Err(refusal);
        }
        entry
            .and_then(|entry| entry.binding.clone())
            .ok_or_else(|| NotReady {
                reason: "ProviderNotReady",
                message: format!("ProviderConfig {name} has no loaded provider yet"),
            })
    }

    /// Every ProviderConfig whose binding Proxies may call through.
    pub fn bound(&self) -> Vec<Arc<Binding>> {
        lock(&self.entries)
            .values()
            .filter(|entry| entry.refusal.is_none())
            .filter_map(|entry| entry.binding.clone())
            .collect()
    }

    /// Forget ProviderConfig `name`: its grants go, its Proxies can no longer be served.
    pub fn remove(&self, name: &str) {
        lock(&self.entries).remove(name);
        self.capabilities.remove(name);
    }

    /// Bring ProviderConfig `name` (at `generation`) in step with `spec`; `previous` is its
    /// last status, whose condition times are kept.
    pub async fn apply(
        &self,
        name: &str,
        generation: i64,
        spec: &ProviderConfigSpec,
        previous: &ProviderConfigStatus,
        objects: &dyn Objects,
    ) -> Applied {
        let now = now();
        let mut status = previous.clone();
        status.observed_generation = Some(generation);
        let mut notes = Vec::new();
        let attempt = self.attempt(name, spec).await;
        let fingerprint = self.fingerprint(generation, spec, &attempt, objects);
        // A new binding is published only once its grants are set: a Proxy never calls a
        // binding its capabilities do not know yet.
        let (candidate, current) = {
            let mut entries = lock(&self.entries);
            let entry = entries.entry(name.to_owned()).or_insert_with(|| Entry {
                binding: None,
                fingerprint: [0; 32],
                revision: 0,
                retired: Vec::new(),
                refusal: None,
            });
            // Older bindings stay granted while a call still holds them.
            entry.retired.retain(|old| Arc::strong_count(old) > 1);
            let candidate = match &attempt {
                Ok(fresh) if entry.binding.is_none() || entry.fingerprint != fingerprint => {
                    Some(Arc::new(Binding {
                        provider_config: name.to_owned(),
                        generation,
                        provider: Arc::clone(&fresh.provider),
                        config: fresh.config.clone(),
                        sweep: spec.orphan_sweep.clone(),
                        recovery: spec.recovery.clone(),
                        resync: spec
                            .resync_seconds
                            .map(|seconds| Duration::from_secs(seconds.max(1))),
                        revision: entry.revision + 1,
                    }))
                }
                _ => None,
            };
            let current = candidate
                .clone()
                .or_else(|| entry.binding.clone())
                .map(|binding| {
                    let digests: Vec<String> = std::iter::once(&binding)
                        .chain(&entry.binding)
                        .chain(&entry.retired)
                        .map(|bound| bound.provider.digest().to_owned())
                        .collect();
                    (binding, digests)
                });
            (candidate, current)
        };
        let rebound = candidate.is_some();

        match &attempt {
            Ok(fresh) => {
                set_condition(
                    &mut status.conditions,
                    conditions::DEGRADED,
                    false,
                    "AsSpecified",
                    "the provider serves the current spec",
                    Some(generation),
                    &now,
                );
                if rebound {
                    let description = fresh.provider.description();
                    notes.push(Note::normal(
                        "ProviderLoaded",
                        format!(
                            "{} {} (sha256:{}, generation {}) serves",
                            description.name,
                            description.version,
                            fresh.provider.digest(),
                            fresh.provider.generation()
                        ),
                    ));
                }
            }
            Err(failure) => {
                set_condition(
                    &mut status.conditions,
                    conditions::DEGRADED,
                    true,
                    failure.reason,
                    &failure.message,
                    Some(generation),
                    &now,
                );
                notes.push(Note::warning(failure.reason, failure.message.clone()));
            }
        }

        let Some((binding, digests)) = current else {
            let failure = attempt.err().unwrap_or(NotReady {
                reason: "ProviderNotReady",
                message: "no provider loaded".into(),
            });
            set_condition(
                &mut status.conditions,
                conditions::READY,
                false,
                failure.reason,
                &failure.message,
                Some(generation),
                &now,
            );
            status.loaded = None;
            status.effective_grant = None;
            self.capabilities.remove(name);
            return Applied {
                status,
                notes,
                rebound,
            };
        };

        // The grant follows the binding that serves, whatever the attempt gave.
        let grant = if binding.generation == generation {
            spec.grant.clone()
        } else {
            status
                .effective_grant
                .as_ref()
                .map(|grant| GrantSpec {
                    http: grant.http.clone(),
                    libvirt: grant.libvirt.clone(),
                })
                .unwrap_or_default()
        };
        let context = GrantContext {
            digests: &digests,
            host: &ObjectsHost {
                objects,
                namespace: &self.namespace,
            },
        };
        if let Err(error) = self.capabilities.set(name, &grant, &context) {
            self.capabilities.remove(name);
            status.effective_grant = None;
            let message = error.to_string();
            set_condition(
                &mut status.conditions,
                conditions::READY,
                false,
                "InvalidGrant",
                &message,
                Some(generation),
                &now,
            );
            notes.push(Note::warning("InvalidGrant", message.clone()));
            self.publish(
                name,
                candidate,
                fingerprint,
                Some(NotReady {
                    reason: "InvalidGrant",
                    message,
                }),
            );
            return Applied {
                status,
                notes,
                rebound,
            };
        }
        status.effective_grant = Some(EffectiveGrant {
            identity: name.to_owned(),
            digest: format!("sha256:{}", binding.provider.digest()),
            http: grant.http.clone(),
            libvirt: grant.libvirt.clone(),
        });
        let description = binding.provider.description();
        status.loaded = Some(LoadedComponent {
            file: spec.component.file.clone(),
            name: description.name.clone(),
            version: description.version.clone(),
            contract_version: description.contract_version.clone(),
            digest: format!("sha256:{}", binding.provider.digest()),
            generation: binding.provider.generation(),
        });

        let granted = grant.granted();
        if let Some(missing) = binding
            .provider
            .capabilities()
            .into_iter()
            .find(|capability| !granted.contains(capability))
        {
            let message = format!(
                "the component imports the {missing} capability, which spec.grant does not grant: add spec.grant.{missing}"
            );
            let was_ready = crate::crd::condition(&status.conditions, conditions::READY)
                .is_some_and(|condition| condition.status == "True");
            set_condition(
                &mut status.conditions,
                conditions::READY,
                false,
                "CapabilityNotGranted",
                &message,
                Some(generation),
                &now,
            );
            if was_ready || rebound {
                notes.push(Note::warning("CapabilityNotGranted", message.clone()));
            }
            self.publish(
                name,
                candidate,
                fingerprint,
                Some(NotReady {
                    reason: "CapabilityNotGranted",
                    message,
                }),
            );
            return Applied {
                status,
                notes,
                rebound,
            };
        }
        // Proxies waiting on a refusal that is gone should reconcile, as on a new binding.
        let cleared = self.publish(name, candidate, fingerprint, None);
        let rebound = rebound || cleared;

        let check = binding
            .provider
            .call(
                Request::Check {
                    config: binding.config.clone(),
                },
                &CallContext {
                    proxy: Some(format!("providerconfig/{name}")),
                },
            )
            .await;
        let (ready, reason, message) = match check {
            Ok(Response::Check(result)) => (
                result.reason == CheckReason::Ok,
                check_reason(result.reason),
                result.message,
            ),
            Ok(other) => (
                false,
                "CheckFailed",
                format!("check answered {}", other.operation()),
            ),
            Err(error) => (false, "CheckFailed", error.to_string()),
        };
        let was_ready = crate::crd::condition(&status.conditions, conditions::READY)
            .is_some_and(|condition| condition.status == "True");
        set_condition(
            &mut status.conditions,
            conditions::READY,
            ready,
            reason,
            &message,
            Some(generation),
            &now,
        );
        if !ready && was_ready {
            notes.push(Note::warning(reason, message));
        }
        Applied {
            status,
            notes,
            rebound,
        }
    }

    /// Makes `candidate` (if any) the binding of `name` and records why Proxies may not call
    /// through it; answers whether an earlier refusal was lifted.
    fn publish(
        &self,
        name: &str,
        candidate: Option<Arc<Binding>>,
        fingerprint: [u8; 32],
        refusal: Option<NotReady>,
    ) -> bool {
        let mut entries = lock(&self.entries);
        let Some(entry) = entries.get_mut(name) else {
            return false;
        };
        if let Some(binding) = candidate {
            entry.fingerprint = fingerprint;
            entry.revision = binding.revision;
            if let Some(old) = entry.binding.replace(binding) {
                entry.retired.push(old);
            }
        }
        let lifted = entry.refusal.is_some() && refusal.is_none();
        entry.refusal = refusal;
        lifted
    }

    /// Steps 1–3: a binding of the current spec, or why not.
    async fn attempt(&self, name: &str, spec: &ProviderConfigSpec) -> Result<Fresh, NotReady> {
        let file = component_file(&spec.component.file)?;
        let identity = file.trim_end_matches(".wasm");
        let path = self.registry.dir().join(&file);
        let Some(loaded) = self.registry.get(identity) else {
            let message = match lock(&self.load_errors).get(&path) {
                Some(error) => format!("component {file} does not load: {error}"),
                None => format!("component {file} is not in the components directory"),
            };
            return Err(NotReady {
                reason: "ComponentNotLoaded",
                message,
            });
        };
        if let Some(error) = lock(&self.load_errors).get(&path) {
            // A replacement was refused: the old generation serves, and the spec is not met.
            return Err(NotReady {
                reason: "ComponentRejected",
                message: format!("the new {file} does not load, the previous one serves: {error}"),
            });
        }
        if let Some(pin) = &spec.component.digest {
            let Some(pinned) = digest_hex(pin) else {
                return Err(NotReady {
                    reason: "DigestMismatch",
                    message: format!("the spec pins {pin:?}, which is not sha256:<64 hex digits>"),
                });
            };
            if pinned != loaded.digest() {
                return Err(NotReady {
                    reason: "DigestMismatch",
                    message: format!(
                        "{file} is sha256:{}, the spec pins sha256:{pinned}",
                        loaded.digest()
                    ),
                });
            }
        }
        let config = serde_json::to_string(&spec.config).unwrap_or_else(|_| "{}".into());
        check_schema(&loaded.description().config_schema, &spec.config)?;
        match loaded
            .call(
                Request::ValidateConfig {
                    config: config.clone(),
                },
                &CallContext {
                    proxy: Some(format!("providerconfig/{name}")),
                },
            )
            .await
        {
            Ok(_) => {}
            Err(error) => {
                return Err(NotReady {
                    reason: "InvalidConfig",
                    message: format!("the provider refused its configuration: {error}"),
                });
            }
        }
        let limits = limits(&self.defaults, spec.limits.as_ref())?;
        let provider = loaded.bind(name, limits).map_err(|error| NotReady {
            reason: "InvalidName",
            message: error.to_string(),
        })?;
        Ok(Fresh { provider, config })
    }

    /// A digest of what a binding of this spec stands for: the generation, the component, and
    /// the content of the Secrets and ConfigMaps its grant references. Kept in memory only.
    fn fingerprint(
        &self,
        generation: i64,
        spec: &ProviderConfigSpec,
        attempt: &Result<Fresh, NotReady>,
        objects: &dyn Objects,
    ) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        hasher.update(generation.to_le_bytes());
        if let Ok(fresh) = attempt {
            hasher.update(fresh.provider.generation().to_le_bytes());
        }
        let host = ObjectsHost {
            objects,
            namespace: &self.namespace,
        };
        for reference in spec.grant.references() {
            use egress_runtime::grant::GrantHost as _;
            let value = match reference {
                ObjectRef::Secret(reference) => host.secret(reference).map(|value| value.to_vec()),
                ObjectRef::ConfigMap(reference) => {
                    host.config_map(reference).map(String::into_bytes)
                }
            }
            .unwrap_or_default();
            hasher.update((value.len() as u64).to_le_bytes());
            hasher.update(&value);
        }
        hasher.finalize().into()
    }
}

/// A binding of the current spec, before it is published.
struct Fresh {
    provider: Arc<Provider>,
    config: String,
}

/// A component file name: `<identity>.wasm`, no directory.
fn component_file(file: &str) -> Result<String, NotReady> {
    let bad = || NotReady {
        reason: "InvalidComponent",
        message: format!("component file {file:?} must be a file name such as proxmox.wasm"),
    };
    let path = Path::new(file);
    if path.components().count() != 1
        || path.extension().is_none_or(|extension| extension != "wasm")
    {
        return Err(bad());
    }
    Ok(file.to_owned())
}

/// The configuration against the JSON Schema the component published. The schema is compiled
/// without remote references: a provider cannot make the host fetch anything.
fn check_schema(schema: &str, config: &serde_json::Value) -> Result<(), NotReady> {
    let schema: serde_json::Value = serde_json::from_str(schema).map_err(|error| NotReady {
        reason: "InvalidSchema",
        message: format!("the provider's config schema is not JSON: {error}"),
    })?;
    let validator = jsonschema::validator_for(&schema).map_err(|error| NotReady {
        reason: "InvalidSchema",
        message: format!("the provider's config schema does not compile: {error}"),
    })?;
    let problems: Vec<String> = validator
        .iter_errors(config)
        .take(5)
        .map(|error| {
            let at = error.instance_path.to_string();
            if at.is_empty() {
                error.to_string()
            } else {
                format!("{at}: {error}")
            }
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(NotReady {
            reason: "InvalidConfig",
            message: format!(
                "the configuration does not match the provider's schema: {}",
                problems.join("; ")
            ),
        })
    }
}

/// The limits of a spec, over the operator's defaults.
fn limits(defaults: &Limits, spec: Option<&LimitsSpec>) -> Result<Limits, NotReady> {
    let mut limits = defaults.clone();
    let Some(spec) = spec else {
        return Ok(limits);
    };
    let operation = |name: &str| {
        name.parse::<Operation>().map_err(|error| NotReady {
            reason: "InvalidLimits",
            message: error.to_string(),
        })
    };
    for (name, seconds) in &spec.deadline_seconds {
        limits = limits.deadline(operation(name)?, std::time::Duration::from_secs(*seconds));
    }
    for (name, millis) in &spec.cpu_millis {
        limits = limits.cpu_time(operation(name)?, std::time::Duration::from_millis(*millis));
    }
    if let Some(mib) = spec.memory_mib {
        limits = limits.memory_bytes(usize::try_from(mib << 20).unwrap_or(usize::MAX));
    }
    if let Some(calls) = spec.concurrency {
        limits = limits.concurrency_per_provider(calls as usize);
    }
    Ok(limits)
}

/// A check reason as a condition reason (`CertificateInvalid`, …).
fn check_reason(reason: CheckReason) -> &'static str {
    match reason {
        CheckReason::Ok => "CheckPassed",
        CheckReason::Unreachable => "Unreachable",
        CheckReason::Unauthorized => "Unauthorized",
        CheckReason::Forbidden => "Forbidden",
        CheckReason::CertificateInvalid => "CertificateInvalid",
        CheckReason::CredentialsUnavailable => "CredentialsUnavailable",
        CheckReason::Misconfigured => "Misconfigured",
        CheckReason::Other => "CheckFailed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_component_is_a_wasm_file_name_only() {
        assert_eq!(component_file("proxmox.wasm").unwrap(), "proxmox.wasm");
        for bad in [
            "../proxmox.wasm",
            "/abs/proxmox.wasm",
            "proxmox",
            "a/b.wasm",
            "",
        ] {
            assert_eq!(
                component_file(bad).unwrap_err().reason,
                "InvalidComponent",
                "{bad}"
            );
        }
    }

    #[test]
    fn the_configuration_is_checked_against_the_published_schema() {
        let schema = r#"{"type":"object","required":["apiUrl"],"properties":{"apiUrl":{"type":"string"}},"additionalProperties":false}"#;
        assert!(check_schema(schema, &serde_json::json!({"apiUrl": "https://h"})).is_ok());
        let missing = check_schema(schema, &serde_json::json!({})).unwrap_err();
        assert_eq!(missing.reason, "InvalidConfig");
        assert!(missing.message.contains("apiUrl"), "{}", missing.message);
        let typo =
            check_schema(schema, &serde_json::json!({"apiUrl": "x", "apiUrk": 1})).unwrap_err();
        assert!(typo.message.contains("apiUrk"), "{}", typo.message);
        assert_eq!(
            check_schema("{", &serde_json::json!({}))
                .unwrap_err()
                .reason,
            "InvalidSchema"
        );
        // A remote reference is never fetched: it fails to compile here.
        let remote = r#"{"$ref":"https://example.invalid/schema.json"}"#;
        assert_eq!(
            check_schema(remote, &serde_json::json!({}))
                .unwrap_err()
                .reason,
            "InvalidSchema"
        );
    }

    #[test]
    fn limits_of_a_spec_override_the_defaults() {
        let spec = LimitsSpec {
            deadline_seconds: [("get".to_owned(), 7)].into(),
            cpu_millis: [("create".to_owned(), 1500)].into(),
            memory_mib: Some(128),
            concurrency: Some(3),
        };
        let limits = limits(&Limits::default(), Some(&spec)).unwrap();
        assert_eq!(limits.deadline_for(Operation::Get).as_secs(), 7);
        assert_eq!(limits.cpu_time_for(Operation::Create).as_millis(), 1500);
        assert_eq!(limits.memory_bytes_limit(), 128 << 20);
        assert_eq!(limits.concurrency_per_provider_limit(), 3);
        let bad = LimitsSpec {
            deadline_seconds: [("reboot".to_owned(), 7)].into(),
            ..LimitsSpec::default()
        };
        assert_eq!(limits_err(&bad), "InvalidLimits");
    }

    fn limits_err(spec: &LimitsSpec) -> &'static str {
        limits(&Limits::default(), Some(spec)).unwrap_err().reason
    }
}
