//! Provider components from OCI registries: [`Images`], what a ProviderConfig's
//! `spec.component.image` loads through.
//!
//! One fetch of an image, for one ProviderConfig:
//!
//! 1. The digest: the one the reference pins. Where a tag alone is allowed (local mode), the
//!    digest recorded in the status when the tag was first resolved; a tag seen for the first
//!    time is resolved once. Once recorded, a tag that points elsewhere is reported
//!    (`TagMoved`), never followed.
//! 2. The bytes: the component already loaded for that digest, else
//!    [`egress_distribution::store`]'s entry for it, else the registry (digest-verified, within
//!    the size cap), then stored. A restart, or a registry that is down, serves from the store.
//! 3. The signatures: one by a key `spec.component.signedBy` names, over this digest, before the
//!    component is compiled; cached signatures that no longer verify (a rotated key) are fetched
//!    again.
//! 4. The component is compiled and described by the runtime, under the ProviderConfig's name.
//!
//! Each refusal is a [`NotReady`] with its own reason; the ProviderConfig reconciler keeps the
//! last good binding serving.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use egress_distribution::Reference;
use egress_runtime::{Provider, Runtime};

use crate::conditions::NotReady;
use crate::crd::ComponentRef;
use crate::metrics::Metrics;
use crate::{Objects, lock};
use egress_distribution::oci::{OciError, RegistryClient, RegistryOptions};
use egress_distribution::signing::{self, Signature, TrustedKey};
use egress_distribution::store::{ComponentStore, StoreError};

/// The key of a `kubernetes.io/dockerconfigjson` Secret holding the credentials.
pub const DOCKER_CONFIG_KEY: &str = ".dockerconfigjson";

/// How images are fetched.
#[derive(Clone, Debug)]
pub struct ImageSettings {
    /// The content-addressed cache of pulled artifacts.
    pub cache_dir: PathBuf,
    /// The largest component pulled (and cached).
    pub max_component_bytes: u64,
    /// Whether an image may name a tag without a digest (resolved once, recorded in status).
    pub allow_tags: bool,
    /// Whether an image without `signedBy` may serve.
    pub allow_unsigned: bool,
}

/// What a ProviderConfig asks [`Images::fetch`] for.
#[derive(Clone, Copy, Debug)]
pub struct Wanted<'a> {
    /// The ProviderConfig's name.
    pub name: &'a str,
    /// Its `spec.component`, which names the image.
    pub component: &'a ComponentRef,
    /// The pinned image its status records.
    pub recorded: Option<&'a str>,
    /// Whether a binding of it serves now: a moved tag is then reported; before anything
    /// serves, the recorded digest serves first.
    pub serving: bool,
}

/// An image's component, ready to be validated and bound.
#[derive(Debug)]
pub struct Fetched {
    /// The component, loaded under the ProviderConfig's name.
    pub provider: Arc<Provider>,
    /// The image pinned to the digest that serves (`REGISTRY/REPOSITORY[:TAG]@sha256:…`).
    pub pinned: String,
}

/// Provider components from registries, cached by digest.
pub struct Images {
    runtime: Runtime,
    metrics: Metrics,
    settings: ImageSettings,
    store: ComponentStore,
    /// The operator's namespace: where the pull Secret and the keys' ConfigMaps are.
    namespace: String,
    /// Per ProviderConfig: the image last loaded, so a reconcile of an unchanged spec neither
    /// reads the cache nor compiles again.
    /// Never held across an await: a ProviderConfig is reconciled by one task at a time.
    loaded: std::sync::Mutex<HashMap<String, Loaded>>,
}

impl std::fmt::Debug for Images {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Images")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The image a ProviderConfig loaded last.
struct Loaded {
    digest: String,
    provider: Arc<Provider>,
    /// Its signatures, checked again on every fetch.
    signatures: Vec<Signature>,
}

/// An image's component before its signatures are checked.
enum Component {
    /// Loaded by an earlier fetch.
    Loaded(Arc<Provider>),
    /// Read from the cache or the registry, not compiled yet.
    Bytes(Vec<u8>),
}

impl Images {
    /// Images loaded into `runtime`, with the pull Secret and keys read in `namespace`, each
    /// fetch counted in `metrics`.
    pub fn new(
        runtime: Runtime,
        settings: ImageSettings,
        namespace: &str,
        metrics: Metrics,
    ) -> Images {
        Images {
            runtime,
            metrics,
            store: ComponentStore::new(&settings.cache_dir),
            settings,
            namespace: namespace.to_owned(),
            loaded: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The component of the image `wanted` names, its pull Secret and keys read in `objects`.
    pub async fn fetch(
        &self,
        wanted: Wanted<'_>,
        objects: &dyn Objects,
    ) -> Result<Fetched, NotReady> {
        let mut source = "none";
        let fetched = self.fetch_from(wanted, objects, &mut source).await;
        let outcome = match &fetched {
            Ok(_) => "ok",
            Err(refused) => refused.reason,
        };
        self.metrics.image_loaded(wanted.name, source, outcome);
        fetched
    }

    /// [`Images::fetch`], saying in `source` where the component came from.
    async fn fetch_from(
        &self,
        wanted: Wanted<'_>,
        objects: &dyn Objects,
        source: &mut &'static str,
    ) -> Result<Fetched, NotReady> {
        let Wanted {
            name,
            component,
            recorded,
            serving,
        } = wanted;
        let image = component.image.as_deref().unwrap_or_default();
        let reference = parse(image)?;
        let client = || self.client(component, objects);
        let digest = match reference.digest() {
            Some(digest) => digest.to_owned(),
            None if !self.settings.allow_tags => {
                return Err(NotReady {
                    reason: "InvalidImage",
                    message: format!(
                        "image {image} names no digest; in a cluster pin one: {image}@sha256:<digest> (provider push prints it)"
                    ),
                });
            }
            None => self.tag_digest(image, recorded, serving, client).await?,
        };
        let pinned = egress_distribution::oci::pinned(image, &digest).map_err(NotReady::from)?;
        let keys = self.trusted_keys(component, objects)?;

        let entry = self.store.entry(&digest)?;
        // What is loaded already is not read again, but its signatures are checked again: the
        // trust policy may have changed since.
        let known = lock(&self.loaded)
            .get(name)
            .filter(|loaded| loaded.digest == digest)
            .map(|loaded| (Arc::clone(&loaded.provider), loaded.signatures.clone()));
        let (component, mut signatures) = match known {
            Some((provider, signatures)) => {
                *source = "loaded";
                (Component::Loaded(provider), signatures)
            }
            None => {
                // Until the store says it served: a refusal on the way is the registry's.
                *source = "registry";
                let stored = self
                    .store
                    .component(&pinned, &digest, !keys.is_empty(), client)
                    .await?;
                *source = stored.source.as_str();
                (Component::Bytes(stored.bytes), stored.signatures)
            }
        };
        if !keys.is_empty() && signing::verify(&digest, &signatures, &keys).is_err() {
            // Stored signatures may predate a rotated key: ask the registry once more.
            if let Ok(client) = client()
                && let Ok(fresh) = self
                    .store
                    .refresh_signatures(&client, &pinned, &digest)
                    .await
            {
                signatures = fresh;
            }
        }
        // Before anything is compiled.
        self.check_signed(&digest, &signatures, &keys, image)?;
        let provider = match component {
            Component::Loaded(provider) => provider,
            Component::Bytes(bytes) => self
                .runtime
                .load_bytes(name, &bytes, &entry.join("component.wasm"))
                .await
                .map_err(|error| NotReady {
                    reason: "ComponentNotLoaded",
                    message: format!("image {pinned} does not load: {error}"),
                })?,
        };
        lock(&self.loaded).insert(
            name.to_owned(),
            Loaded {
                digest,
                provider: Arc::clone(&provider),
                signatures,
            },
        );
        Ok(Fetched { provider, pinned })
    }

    /// Forget what ProviderConfig `name` loaded (it is deleted). The cache keeps the bytes.
    pub fn forget(&self, name: &str) {
        lock(&self.loaded).remove(name);
    }

    /// The digest a tag-only `image` serves: the one recorded for it, else resolved now. A
    /// recorded tag is looked up again once something serves, to report a move.
    async fn tag_digest(
        &self,
        image: &str,
        recorded: Option<&str>,
        serving: bool,
        client: impl Fn() -> Result<RegistryClient, NotReady>,
    ) -> Result<String, NotReady> {
        let recorded = recorded
            .and_then(|pinned| pinned.strip_prefix(image))
            .and_then(|rest| rest.strip_prefix('@'));
        match recorded {
            Some(digest) if !serving => Ok(digest.to_owned()),
            Some(digest) => {
                let now = client()?.resolve(image).await.map_err(NotReady::from)?;
                if now == digest {
                    Ok(now)
                } else {
                    Err(NotReady {
                        reason: "TagMoved",
                        message: format!(
                            "the tag of {image} moved from {digest} to {now}; {digest} keeps serving: to move, pin image {image}@{now}"
                        ),
                    })
                }
            }
            None => client()?.resolve(image).await.map_err(NotReady::from),
        }
    }

    /// A registry client as `component.registry` asks: its pull Secret, its CA, plain HTTP.
    fn client(
        &self,
        component: &ComponentRef,
        objects: &dyn Objects,
    ) -> Result<RegistryClient, NotReady> {
        let image = component.image.as_deref().unwrap_or_default();
        let invalid = |message: String| NotReady {
            reason: "InvalidImage",
            message,
        };
        let mut options = RegistryOptions {
            max_layer_bytes: self.settings.max_component_bytes,
            ..RegistryOptions::default()
        };
        let Some(access) = &component.registry else {
            return RegistryClient::new(options).map_err(NotReady::from);
        };
        if let Some(secret) = &access.pull_secret {
            let json = objects
                .secret_value(&self.namespace, secret, DOCKER_CONFIG_KEY)
                .map_err(|missing| {
                    let what =
                        missing.describe("Secret", &self.namespace, secret, DOCKER_CONFIG_KEY);
                    invalid(format!(
                        "the pull {what} (a Secret of type kubernetes.io/dockerconfigjson)"
                    ))
                })?;
            options.credentials =
                egress_distribution::oci::DockerConfig::parse(&json).map_err(|problem| {
                    invalid(format!(
                        "the pull Secret {}/{secret}: {problem}",
                        self.namespace
                    ))
                })?;
        }
        if let Some(ca) = &access.ca_config_map_ref {
            let namespace = ca.namespace.as_deref().unwrap_or(&self.namespace);
            let pem = objects
                .config_map_value(namespace, &ca.name, &ca.key)
                .map_err(|missing| {
                    let what = missing.describe("ConfigMap", namespace, &ca.name, &ca.key);
                    invalid(format!("{what} (the registry's CA)"))
                })?;
            if !pem.contains("-----BEGIN CERTIFICATE-----") {
                return Err(invalid(format!(
                    "ConfigMap {namespace}/{} key {} holds no PEM certificate",
                    ca.name, ca.key
                )));
            }
            options.ca_pem = Some(pem.into_bytes());
        }
        if access.plain_http {
            options.plain_http =
                vec![egress_distribution::oci::registry_of(image).map_err(NotReady::from)?];
        }
        RegistryClient::new(options).map_err(NotReady::from)
    }

    /// The keys `signedBy` names, read from ConfigMaps of the operator's namespace.
    fn trusted_keys(
        &self,
        component: &ComponentRef,
        objects: &dyn Objects,
    ) -> Result<Vec<TrustedKey>, NotReady> {
        let invalid = |message: String| NotReady {
            reason: "InvalidTrustPolicy",
            message,
        };
        component
            .signed_by
            .iter()
            .map(|key| {
                let reference = &key.config_map_ref;
                if reference
                    .namespace
                    .as_deref()
                    .is_some_and(|namespace| namespace != self.namespace)
                {
                    return Err(invalid(format!(
                        "signedBy ConfigMap {}/{}: signing keys are read only from the operator's namespace {}",
                        reference.namespace.as_deref().unwrap_or_default(),
                        reference.name,
                        self.namespace
                    )));
                }
                let name = format!("{}/{}", reference.name, reference.key);
                let pem = objects
                    .config_map_value(&self.namespace, &reference.name, &reference.key)
                    .map_err(|missing| {
                        let (name, key) = (&reference.name, &reference.key);
                        let what = missing.describe("ConfigMap", &self.namespace, name, key);
                        invalid(format!("{what} (a signing key)"))
                    })?;
                TrustedKey::from_pem(&name, pem.as_bytes())
                    .map_err(|error| invalid(format!("ConfigMap {}/{error}", self.namespace)))
            })
            .collect()
    }

    /// Refuses an image no trusted key signed (or any image without keys, unless allowed).
    fn check_signed(
        &self,
        digest: &str,
        signatures: &[Signature],
        keys: &[TrustedKey],
        image: &str,
    ) -> Result<(), NotReady> {
        if keys.is_empty() {
            if self.settings.allow_unsigned {
                return Ok(());
            }
            return Err(NotReady {
                reason: "Unsigned",
                message: format!(
                    "image {image}: spec.component.signedBy names no key, and this operator serves only images signed by a trusted key (--allow-unsigned-images lifts this)"
                ),
            });
        }
        match signing::verify(digest, signatures, keys) {
            Ok(_) => Ok(()),
            Err(refusal @ signing::SignatureRefusal::Unsigned { .. }) => Err(NotReady {
                reason: "Unsigned",
                message: format!("image {image}: {refusal}"),
            }),
            Err(refusal) => Err(NotReady {
                reason: "UntrustedSignature",
                message: format!("image {image}: {refusal}"),
            }),
        }
    }
}

fn parse(image: &str) -> Result<Reference, NotReady> {
    image.parse::<Reference>().map_err(|error| NotReady {
        reason: "InvalidImage",
        message: format!(
            "{image:?} is not an image reference (REGISTRY/REPOSITORY[:TAG]@sha256:DIGEST): {error}"
        ),
    })
}

/// A refusal for a registry error, with its own reason.
impl From<OciError> for NotReady {
    fn from(error: OciError) -> NotReady {
        let reason = error.reason();
        let message = error.to_string();
        NotReady { reason, message }
    }
}

/// A refusal for a store that cannot serve: its registry's reason, else its own.
impl From<StoreError> for NotReady {
    fn from(error: StoreError) -> NotReady {
        let reason = error.reason();
        let message = error.to_string();
        NotReady { reason, message }
    }
}
