//! ProviderConfigs bound to loaded components: [`ProviderSet`].
//!
//! A ProviderConfig names a component file of the components directory (served and hot-swapped
//! by the runtime's [`Registry`]). The ProviderConfig reconciler
//! ([`crate::provider_config_reconciler`]) drives the steps:
//!
//! 1. [`ProviderSet::load`] finds the file's current generation (or the digest the spec pins)
//!    and checks the provider's configuration against the JSON Schema its `describe` published;
//! 2. the reconciler asks the provider's own `validate-config`;
//! 3. [`ProviderSet::bind`] binds the component under the ProviderConfig's **name** as its
//!    identity, with the limits the spec asks for ([`Provider::bind`]): grants, permits, metrics
//!    and logs follow that name, never the name the component gives itself; then sets each
//!    capability's grant for that identity (`spec.grant`, one typed document per capability),
//!    pinned to the digest just bound (and to older generations still finishing calls), with
//!    what it references (a credential, a CA, an SSH key) resolved from the Secrets and
//!    ConfigMaps the adapter watches; a capability the component imports without a grant keeps
//!    Proxies from calling through it, naming it.
//!
//! A step that fails leaves the last good binding serving. [`ProviderSet::binding`] is what the
//! Proxy reconciler calls through.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_digest::Digest;
use egress_runtime::grant::{GrantContext, ObjectRef, digest_hex};
use egress_runtime::types::Operation;
use egress_runtime::{Limits, Provider, Registry, RegistryEvent};

use crate::conditions::NotReady;
use crate::crd::{
    EffectiveGrant, GrantSpec, HandledBy, LimitsSpec, OrphanSweep, ProviderConfigSpec,
    ProviderConfigStatus, Recovery,
};
use crate::grants::ObjectsHost;
use crate::images::{Images, Wanted};
use crate::{Objects, lock};
use egress_capability_set::Capabilities;
use egress_tap::{Bounds, RecordingDir};

/// A ProviderConfig's provider, ready to serve Proxies. `P` is what answers the calls: the
/// runtime's [`Provider`] in the operator, a fake in the Proxy reconciler's unit tests.
#[derive(Debug)]
pub struct Binding<P = Provider> {
    /// The ProviderConfig, which is the provider's identity.
    pub provider_config: String,
    /// The ProviderConfig's generation this binding was made from.
    pub generation: i64,
    /// The component bound under that identity with the spec's limits.
    pub provider: Arc<P>,
    /// Where the component came from: a file of the components directory, or an image pinned
    /// to its digest.
    pub source: Source,
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
    /// What a Proxy records of the provider that handled it.
    pub handled_by: HandledBy,
    /// Where its calls are recorded, if the spec asks for it.
    pub recordings: Option<RecordingDir>,
}

/// Where a binding's component came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A file of the components directory.
    File(String),
    /// An image, pinned to its digest (`REGISTRY/REPOSITORY[:TAG]@sha256:…`).
    Image(String),
}

/// A spec's component, found, its configuration matching the component's schema: what
/// `validate-config` is asked about before [`ProviderSet::bind`].
pub struct Candidate {
    /// The component as the registry serves it (not bound to an identity yet).
    pub component: Arc<Provider>,
    /// Where it came from.
    pub source: Source,
    /// The provider's configuration (JSON).
    pub config: String,
}

/// What [`ProviderSet::bind`] did.
#[derive(Debug)]
pub struct Bound {
    /// Why the current spec could not be bound (the last good binding, if any, serves on).
    pub spec_refused: Option<NotReady>,
    /// Whether a new binding was published (a new spec, component or referenced object).
    pub fresh: bool,
    /// Whether the binding Proxies call through changed, or a refusal that blocked them was
    /// lifted: its Proxies should reconcile.
    pub rebound: bool,
    /// The binding that serves, if any.
    pub serving: Option<Serving>,
}

/// The binding that serves a ProviderConfig, and whether Proxies may call through it.
#[derive(Debug)]
pub struct Serving {
    /// The binding.
    pub binding: Arc<Binding>,
    /// Its grant as set in the capabilities, or why they refused it.
    pub grant: Result<EffectiveGrant, NotReady>,
    /// A capability the component imports that the grant does not grant.
    pub missing_capability: Option<NotReady>,
}

/// Per ProviderConfig: the last good binding and what it holds in memory.
struct Entry {
    binding: Option<Arc<Binding>>,
    /// A digest of what the binding stands for (generation, component, referenced Secrets'
    /// content); a change bumps `revision`. Never in a status: local mode keeps it in its own
    /// state ([`ProviderSet::restore`]) beside the folder that holds those Secrets.
    fingerprint: Digest,
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
    /// Components of ProviderConfigs that name an image.
    images: Images,
    capabilities: Capabilities,
    /// The operator's namespace: where a Secret reference without one points.
    namespace: String,
    /// Limits for providers whose spec sets none.
    defaults: Limits,
    /// The folder under which each ProviderConfig that records has its own.
    recordings: PathBuf,
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
        images: Images,
        capabilities: Capabilities,
        namespace: &str,
        defaults: Limits,
        recordings: PathBuf,
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
            images,
            capabilities,
            namespace: namespace.to_owned(),
            defaults,
            recordings,
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

    /// ProviderConfig `name`'s revision and fingerprint, once bound: what local mode keeps
    /// across restarts.
    pub fn revision(&self, name: &str) -> Option<(u64, Digest)> {
        let entries = lock(&self.entries);
        let entry = entries.get(name).filter(|entry| entry.binding.is_some())?;
        Some((entry.revision, entry.fingerprint))
    }

    /// Start ProviderConfig `name` from the revision an earlier run kept: bound to the same
    /// content, it keeps that revision, so a Proxy latched on a refusal is not asked again;
    /// bound to other content (a Secret changed while no operator ran), the revision moves on
    /// and the Proxy is retried.
    pub fn restore(&self, name: &str, revision: u64, fingerprint: Digest) {
        lock(&self.entries)
            .entry(name.to_owned())
            .or_insert_with(|| Entry {
                binding: None,
                fingerprint,
                revision,
                retired: Vec::new(),
                refusal: None,
            });
    }

    /// Forget ProviderConfig `name`: its grants go, its Proxies can no longer be served.
    pub fn remove(&self, name: &str) {
        lock(&self.entries).remove(name);
        self.capabilities.remove(name);
        self.images.forget(name);
    }

    /// Find the component the spec of ProviderConfig `name` names (a file, or an image pulled or
    /// read from the cache; `previous` is its last status, which records a tag's digest) and
    /// check its configuration against the JSON Schema the component published.
    /// `validate-config` is the reconciler's to call next, then [`bind`].
    ///
    /// [`bind`]: ProviderSet::bind
    pub async fn load(
        &self,
        name: &str,
        spec: &ProviderConfigSpec,
        previous: &ProviderConfigStatus,
        objects: &dyn Objects,
    ) -> Result<Candidate, NotReady> {
        let component = &spec.component;
        match (&component.image, component.file.is_empty()) {
            (Some(_), true) => {}
            (None, false) => return self.load_file(spec),
            (Some(_), false) | (None, true) => {
                return Err(NotReady {
                    reason: "InvalidComponent",
                    message: "spec.component names exactly one of file and image".into(),
                });
            }
        }
        if component.digest.is_some() {
            return Err(NotReady {
                reason: "InvalidComponent",
                message: "spec.component.digest pins a file; an image pins its digest in the reference (IMAGE@sha256:…)".into(),
            });
        }
        let serving = lock(&self.entries)
            .get(name)
            .is_some_and(|entry| entry.binding.is_some());
        let recorded = previous
            .loaded
            .as_ref()
            .and_then(|loaded| loaded.image.as_deref());
        let fetched = self
            .images
            .fetch(
                Wanted {
                    name,
                    component,
                    recorded,
                    serving,
                },
                objects,
            )
            .await?;
        check_schema(&fetched.provider.description().config_schema, &spec.config)?;
        Ok(Candidate {
            component: fetched.provider,
            source: Source::Image(fetched.pinned),
            config: config_json(&spec.config),
        })
    }

    /// [`ProviderSet::load`] of a file of the components directory.
    fn load_file(&self, spec: &ProviderConfigSpec) -> Result<Candidate, NotReady> {
        let file = component_file(&spec.component.file)?;
        let identity = file.trim_end_matches(".wasm");
        let path = self.registry.dir().join(&file);
        let Some(component) = self.registry.get(identity) else {
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
            if pinned != component.component_digest().hex() {
                return Err(NotReady {
                    reason: "DigestMismatch",
                    message: format!(
                        "{file} is sha256:{}, the spec pins sha256:{pinned}",
                        component.component_digest().hex()
                    ),
                });
            }
        }
        check_schema(&component.description().config_schema, &spec.config)?;
        Ok(Candidate {
            component,
            source: Source::File(file),
            config: config_json(&spec.config),
        })
    }

    /// Bind ProviderConfig `name` (at `generation`) to `validated`, the candidate of its spec
    /// the provider accepted (or why there is none), and set its grants: the new binding is
    /// published only once they are set, so a Proxy never calls a binding its capabilities do
    /// not know yet. When the spec cannot be bound, the last good binding serves on, with the
    /// grant `previous` (its last status) records.
    pub fn bind(
        &self,
        name: &str,
        generation: i64,
        spec: &ProviderConfigSpec,
        previous: &ProviderConfigStatus,
        validated: Result<Candidate, NotReady>,
        objects: &dyn Objects,
    ) -> Bound {
        let attempt = validated.and_then(|candidate| self.bound_candidate(name, spec, candidate));
        let fingerprint = self.fingerprint(generation, spec, &attempt, objects);
        let next = self.next_binding(name, generation, spec, &attempt, fingerprint);
        let spec_refused = attempt.err();
        let Some(NextBinding {
            binding,
            digests,
            fresh,
        }) = next
        else {
            self.capabilities.remove(name);
            return Bound {
                spec_refused,
                fresh: false,
                rebound: false,
                serving: None,
            };
        };
        let published = fresh.then(|| Arc::clone(&binding));

        // The grant follows the binding that serves, whatever the attempt gave.
        let grant = if binding.generation == generation {
            spec.grant.clone()
        } else {
            previous
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
        let effective = match self.capabilities.set(name, &grant, &context) {
            Ok(()) => Ok(EffectiveGrant {
                identity: name.to_owned(),
                digest: binding.provider.component_digest().to_string(),
                http: grant.http.clone(),
                libvirt: grant.libvirt.clone(),
            }),
            Err(error) => {
                self.capabilities.remove(name);
                Err(NotReady {
                    reason: "InvalidGrant",
                    message: error.to_string(),
                })
            }
        };
        let missing_capability = missing_capability(&binding, &grant);
        let refusal = match &effective {
            Err(refused) => Some(refused.clone()),
            Ok(_) => missing_capability.clone(),
        };
        // Proxies waiting on a refusal that is gone should reconcile, as on a new binding.
        let lifted = self.publish(name, published, fingerprint, refusal);
        Bound {
            spec_refused,
            fresh,
            rebound: fresh || lifted,
            serving: Some(Serving {
                binding,
                grant: effective,
                missing_capability,
            }),
        }
    }

    /// Where ProviderConfig `name` records its calls, if its `spec` says to.
    fn recordings_of(&self, name: &str, spec: &ProviderConfigSpec) -> Option<RecordingDir> {
        let record = spec.record.as_ref()?;
        let bounds = Bounds::of(record.max_body_bytes, record.max_call_bytes);
        Some(RecordingDir::new(
            self.recordings.join(name),
            record.keep as usize,
            bounds,
        ))
    }

    /// The binding to serve next, if any.
    fn next_binding(
        &self,
        name: &str,
        generation: i64,
        spec: &ProviderConfigSpec,
        attempt: &Result<Fresh, NotReady>,
        fingerprint: Digest,
    ) -> Option<NextBinding> {
        let mut entries = lock(&self.entries);
        let entry = entries.entry(name.to_owned()).or_insert_with(|| Entry {
            binding: None,
            fingerprint: Digest::of(&[]),
            revision: 0,
            retired: Vec::new(),
            refusal: None,
        });
        // Older bindings stay granted while a call still holds them.
        entry.retired.retain(|old| Arc::strong_count(old) > 1);
        let candidate = match attempt {
            Ok(fresh) if entry.binding.is_none() || entry.fingerprint != fingerprint => {
                let description = fresh.provider.description();
                // Restored with the same content, the revision stays: a latch holds across restarts.
                let revision = entry.revision + u64::from(entry.fingerprint != fingerprint);
                Some(Arc::new(Binding {
                    provider_config: name.to_owned(),
                    generation,
                    provider: Arc::clone(&fresh.provider),
                    source: fresh.source.clone(),
                    config: fresh.config.clone(),
                    sweep: spec.orphan_sweep.clone(),
                    recovery: spec.recovery.clone(),
                    resync: (spec.resync_seconds).map(|s| Duration::from_secs(s.max(1))),
                    revision,
                    handled_by: HandledBy {
                        provider_config: name.to_owned(),
                        provider_config_generation: generation,
                        provider_config_revision: revision,
                        name: description.name.clone(),
                        version: description.version.clone(),
                        digest: fresh.provider.component_digest().to_string(),
                    },
                    recordings: self.recordings_of(name, spec),
                }))
            }
            _ => None,
        };
        let fresh = candidate.is_some();
        let binding = candidate.or_else(|| entry.binding.clone())?;
        let digests = std::iter::once(&binding)
            .chain(&entry.binding)
            .chain(&entry.retired)
            .map(|bound| bound.provider.component_digest().hex())
            .collect();
        Some(NextBinding {
            binding,
            digests,
            fresh,
        })
    }

    /// Makes `candidate` (if any) the binding of `name` and records why Proxies may not call
    /// through it; answers whether an earlier refusal was lifted.
    fn publish(
        &self,
        name: &str,
        candidate: Option<Arc<Binding>>,
        fingerprint: Digest,
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

    /// The spec's limits and identity on the candidate the provider accepted.
    fn bound_candidate(
        &self,
        name: &str,
        spec: &ProviderConfigSpec,
        candidate: Candidate,
    ) -> Result<Fresh, NotReady> {
        let limits = limits(&self.defaults, spec.limits.as_ref())?;
        let provider = candidate
            .component
            .bind(name, limits)
            .map_err(|error| NotReady {
                reason: "InvalidName",
                message: error.to_string(),
            })?;
        Ok(Fresh {
            provider,
            source: candidate.source,
            config: candidate.config,
        })
    }

    /// A digest of what a binding of this spec stands for: the generation, the component, and
    /// the content of the Secrets and ConfigMaps its grant references. Kept in memory only.
    fn fingerprint(
        &self,
        generation: i64,
        spec: &ProviderConfigSpec,
        attempt: &Result<Fresh, NotReady>,
        objects: &dyn Objects,
    ) -> Digest {
        let mut hashed = generation.to_le_bytes().to_vec();
        if let Ok(fresh) = attempt {
            hashed.extend(fresh.provider.load_generation().to_le_bytes());
        }
        // The signing keys and the registry's CA count too: a rotated key is a new binding.
        let host = ObjectsHost {
            objects,
            namespace: &self.namespace,
        };
        for reference in spec.references() {
            use egress_runtime::grant::GrantHost as _;
            let value = match reference {
                ObjectRef::Secret(reference) => host.secret(reference).map(|value| value.to_vec()),
                ObjectRef::ConfigMap(reference) => {
                    host.config_map(reference).map(String::into_bytes)
                }
            }
            .unwrap_or_default();
            hashed.extend((value.len() as u64).to_le_bytes());
            hashed.extend(&value);
        }
        Digest::of(&hashed)
    }
}

/// The binding that serves next.
struct NextBinding {
    binding: Arc<Binding>,
    /// The digests its grant covers: its own, the current binding's and those of older
    /// bindings still finishing calls.
    digests: Vec<String>,
    /// Whether it is new (to be published once its grant is set).
    fresh: bool,
}

/// A binding of the current spec, before it is published.
struct Fresh {
    provider: Arc<Provider>,
    source: Source,
    config: String,
}

fn config_json(config: &serde_json::Value) -> String {
    serde_json::to_string(config).unwrap_or_else(|_| "{}".into())
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
    if let Some(mib) = spec.http_sent_mib {
        limits = limits.http_bytes_sent(mib.saturating_mul(1 << 20));
    }
    if let Some(mib) = spec.http_received_mib {
        limits = limits.http_bytes_received(mib.saturating_mul(1 << 20));
    }
    Ok(limits)
}

/// A capability `binding`'s component imports that `grant` does not grant, as a refusal.
fn missing_capability(binding: &Binding, grant: &GrantSpec) -> Option<NotReady> {
    let granted = grant.granted();
    let missing = binding
        .provider
        .capabilities()
        .into_iter()
        .find(|capability| !granted.contains(capability))?;
    Some(NotReady {
        reason: "CapabilityNotGranted",
        message: format!(
            "the component imports the {missing} capability, which spec.grant does not grant: add spec.grant.{missing}"
        ),
    })
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
            http_sent_mib: Some(1024),
            http_received_mib: Some(2),
        };
        let limits = limits(&Limits::default(), Some(&spec)).unwrap();
        assert_eq!(limits.http_bytes_sent_limit(), 1 << 30);
        assert_eq!(limits.http_bytes_received_limit(), 2 << 20);
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
