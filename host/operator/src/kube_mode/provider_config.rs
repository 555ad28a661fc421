//! The ProviderConfig controller: the reconciler core
//! ([`ProviderConfigReconciler`](crate::provider_config_reconciler::ProviderConfigReconciler))
//! on every change of the spec, of a Secret or ConfigMap it references (credential, CA), on a
//! registry event for its component file (hot swap, or a replacement that does not load), and
//! when its last outcome asked (the resync, which runs the provider's `check`, or the next
//! orphan sweep). The sweep compares the VMs made through it with the UIDs of every Proxy in the
//! cache. Status by server-side apply, notes as Events; when the binding changed, its Proxies are
//! told (they reconcile on the new component or spec).
//!
//! A deleted ProviderConfig is forgotten ([`forget_deleted`]): its grant goes and its Proxies can
//! no longer be served.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use egress_runtime::RegistryEvent;
use egress_runtime::grant::ObjectRef as Named;
use futures::{FutureExt, StreamExt};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use tokio::sync::oneshot;

use super::caches::{Caches, StoreObjects, Touched};
use super::{Context, Error, never_ending, retry_after, write_status};
use crate::crd::{ProviderConfig, ProviderConfigSpec};
use crate::provider_config_reconciler::ProviderConfigState;
use crate::sweep::LiveProxies;

/// Run the ProviderConfig controller until `stop` fires and the reconciles in flight finish.
pub async fn controller(context: Arc<Context>, stop: oneshot::Receiver<()>) {
    let caches = context.caches.clone();
    let touches = caches.touches();
    let registry = registry_stream(context.operator.registry().subscribe());
    let initial = futures::stream::iter(caches.provider_configs.state());
    let mut generations: HashMap<String, i64> = HashMap::new();
    let own = initial
        .chain(touches.filter_map(|touched| async move {
            match touched {
                Touched::ProviderConfig(pc) => Some(pc),
                _ => None,
            }
        }))
        .filter_map(move |pc| {
            // Its own status writes are not news.
            let generation = pc.metadata.generation.unwrap_or(0);
            let new = generations.insert(pc.name_any(), generation) != Some(generation);
            std::future::ready(new.then(|| Ok((*pc).clone())))
        });
    let related = {
        let caches = caches.clone();
        let namespace = context.operator.settings.namespace.clone();
        futures::stream::select(
            caches.touches().map(Related::Touched),
            registry.map(Related::Component),
        )
        .flat_map(move |related| {
            futures::stream::iter(related_provider_configs(&caches, &namespace, related))
        })
    };
    Controller::for_stream(never_ending(own), caches.provider_configs.clone())
        .reconcile_on(never_ending(related))
        .graceful_shutdown_on(stop.map(|_| ()))
        .run(reconcile, error_policy, context)
        .for_each(|result| super::log_pass("providerconfig", result))
        .await;
}

/// Forget each ProviderConfig that is deleted (and, after a relist, each that is gone).
pub async fn forget_deleted(context: Arc<Context>) {
    let mut touches = std::pin::pin!(context.caches.touches());
    while let Some(touched) = touches.next().await {
        match touched {
            Touched::ProviderConfigGone(name) => {
                tracing::info!(provider_config = %name, "deleted: its grant and binding go");
                let operator = &context.operator;
                operator.provider_configs.forget(&operator.providers, &name);
            }
            Touched::Relisted => {
                let operator = &context.operator;
                for binding in operator.providers.bound() {
                    let name = &binding.provider_config;
                    if context.caches.provider_config(name).is_none() {
                        operator.provider_configs.forget(&operator.providers, name);
                    }
                }
            }
            _ => {}
        }
    }
}

enum Related {
    Touched(Touched),
    /// A component file the registry loaded, refused or removed.
    Component(String),
}

fn registry_stream(
    receiver: tokio::sync::broadcast::Receiver<RegistryEvent>,
) -> impl futures::Stream<Item = String> + Send + 'static {
    futures::stream::unfold(receiver, |mut receiver| async move {
        loop {
            let path = match receiver.recv().await {
                Ok(
                    RegistryEvent::Loaded { path, .. }
                    | RegistryEvent::Rejected { path, .. }
                    | RegistryEvent::Removed { path, .. },
                ) => path,
                // Missed some: every file may have changed.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    return Some((String::new(), receiver));
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            };
            if let Some(file) = Path::new(&path).file_name().and_then(|f| f.to_str()) {
                return Some((file.to_owned(), receiver));
            }
        }
    })
}

/// The ProviderConfigs a touch of another object concerns.
fn related_provider_configs(
    caches: &Caches,
    namespace: &str,
    related: Related,
) -> Vec<ObjectRef<ProviderConfig>> {
    let matching = |keep: &dyn Fn(&ProviderConfigSpec) -> bool| {
        caches
            .provider_configs
            .state()
            .iter()
            .filter(|pc| keep(&pc.spec))
            .map(|pc| ObjectRef::from_obj(pc.as_ref()))
            .collect::<Vec<_>>()
    };
    match related {
        Related::Component(file) if file.is_empty() => matching(&|_| true),
        Related::Component(file) => matching(&|spec| spec.component.file == file),
        Related::Touched(Touched::Secret {
            namespace: object_namespace,
            name,
        }) => matching(&|spec| {
            references(spec, namespace)
                .secrets
                .contains(&(object_namespace.clone(), name.clone()))
        }),
        Related::Touched(Touched::ConfigMap {
            namespace: object_namespace,
            name,
        }) => matching(&|spec| {
            references(spec, namespace)
                .config_maps
                .contains(&(object_namespace.clone(), name.clone()))
        }),
        Related::Touched(Touched::Relisted) => matching(&|_| true),
        Related::Touched(_) => Vec::new(),
    }
}

/// The objects a ProviderConfig reads, as `(namespace, name)`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct References {
    /// Secrets: the credential, a CA.
    pub secrets: HashSet<(String, String)>,
    /// ConfigMaps: a CA.
    pub config_maps: HashSet<(String, String)>,
}

/// What `spec` references; a reference without a namespace is in `namespace`.
pub fn references(spec: &ProviderConfigSpec, namespace: &str) -> References {
    let mut found = References::default();
    let key = |reference: &crate::crd::SecretKeyRef| {
        (
            reference
                .namespace
                .clone()
                .unwrap_or_else(|| namespace.to_owned()),
            reference.name.clone(),
        )
    };
    for reference in spec.references() {
        match reference {
            Named::Secret(reference) => found.secrets.insert(key(reference)),
            Named::ConfigMap(reference) => found.config_maps.insert(key(reference)),
        };
    }
    if let Some(secret) = spec
        .component
        .registry
        .as_ref()
        .and_then(|registry| registry.pull_secret.clone())
    {
        found.secrets.insert((namespace.to_owned(), secret));
    }
    found
}

/// One reconcile of one ProviderConfig: the core's, its outcome applied.
pub async fn reconcile(pc: Arc<ProviderConfig>, context: Arc<Context>) -> Result<Action, Error> {
    let name = pc.metadata.name.clone().ok_or(Error::Unnamed("name"))?;
    let state = ProviderConfigState {
        name: name.clone(),
        generation: pc.metadata.generation.unwrap_or(0),
        spec: pc.spec.clone(),
        status: pc.status.clone().unwrap_or_default(),
    };
    let operator = &context.operator;
    let caches = &context.caches;
    // Every Proxy the cache holds, those being deleted too: their VMs are not orphans.
    let live_proxy_uids = async {
        Some(
            caches
                .proxies
                .state()
                .iter()
                .filter_map(|proxy| {
                    let recorded = proxy.status.as_ref().and_then(|s| s.provider_id.clone());
                    Some((proxy.uid()?, recorded))
                })
                .collect::<LiveProxies>(),
        )
    };
    let outcome = operator
        .provider_configs
        .reconcile(
            &operator.providers,
            &state,
            &StoreObjects(caches),
            live_proxy_uids,
        )
        .await;

    let api: Api<ProviderConfig> = Api::all(context.client.clone());
    if outcome.status != state.status {
        write_status(&api, &name, &outcome.status).await?;
    }
    context.record(&outcome.notes, &pc.object_ref(&())).await;
    if outcome.rebound {
        // Nobody listening (no Proxy controller yet) is fine: it starts with every Proxy.
        let _ = context.rebound.send(name);
    }
    Ok(Action::requeue(outcome.next))
}

/// Count the failure by its label and retry shortly.
pub fn error_policy(_pc: Arc<ProviderConfig>, error: &Error, context: Arc<Context>) -> Action {
    tracing::warn!(error = %error, label = error.metric_label(), "providerconfig reconcile failed");
    retry_after("providerconfig", error, &context)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rotated SSH key or known_hosts reconciles its ProviderConfig (which sets its grant
    /// again) as a rotated token does: every Secret and ConfigMap of every capability's grant
    /// is watched, a reference without a namespace in the operator's.
    #[test]
    fn every_secret_and_config_map_a_grant_names_is_watched() {
        let spec: ProviderConfigSpec = serde_json::from_value(serde_json::json!({
            "component": {"file": "libvirt.wasm"},
            "grant": {
                "http": {
                    "origins": ["https://h"],
                    "credential": {"header": "Authorization", "format": "{secret}",
                                   "secretRef": {"name": "token", "key": "t"}},
                    "tls": {"caConfigMapRef": {"name": "ca", "key": "ca.pem", "namespace": "pki"}},
                },
                "libvirt": {
                    "connections": [{"name": "hv", "uri": "qemu+libssh2://h/system",
                                     "sshKeySecretRef": {"name": "ssh", "key": "id"},
                                     "knownHostsConfigMapRef": {"name": "hosts", "key": "k"}}],
                    "images": {"origins": ["https://i"], "caSecretRef": {"name": "images-ca", "key": "ca.pem"}},
                },
            },
        }))
        .unwrap();
        let found = references(&spec, "ops");
        let pair = |namespace: &str, name: &str| (namespace.to_owned(), name.to_owned());
        assert_eq!(
            found.secrets,
            HashSet::from([
                pair("ops", "token"),
                pair("ops", "ssh"),
                pair("ops", "images-ca")
            ])
        );
        assert_eq!(
            found.config_maps,
            HashSet::from([pair("pki", "ca"), pair("ops", "hosts")])
        );
    }

    /// A rotated pull Secret, registry CA or signing key reconciles a ProviderConfig by image.
    #[test]
    fn an_images_pull_secret_ca_and_signing_keys_are_watched() {
        let spec: ProviderConfigSpec = serde_json::from_value(serde_json::json!({
            "component": {
                "image": "r.example/p@sha256:00",
                "registry": {"pullSecret": "regcred", "caConfigMapRef": {"name": "registry-ca", "key": "ca.crt"}},
                "signedBy": [{"configMapRef": {"name": "signers", "key": "release.pub"}}],
            },
        }))
        .unwrap();
        let found = references(&spec, "ops");
        let pair = |namespace: &str, name: &str| (namespace.to_owned(), name.to_owned());
        assert_eq!(found.secrets, HashSet::from([pair("ops", "regcred")]));
        assert_eq!(
            found.config_maps,
            HashSet::from([pair("ops", "registry-ca"), pair("ops", "signers")])
        );
    }
}
