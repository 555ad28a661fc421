//! One reflector per kind the operator reads (Proxies, ProviderConfigs, Secrets, ConfigMaps),
//! always running, leader or not (so a follower is ready to take over with warm caches), and a
//! broadcast of what each watch touched, sent **after** the store holds the change: a reconcile
//! that a touch triggers reads the new object from the store, never the old one.
//!
//! The controllers subscribe to [`Caches::touches`] when this replica starts leading. The
//! broadcast is lossy on purpose: a slow or absent subscriber never holds a watch back; a
//! subscriber that lagged is told so and reconciles everything it has.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::crd::{ProviderConfig, Proxy};
use crate::{AbortOnDrop, Missing, Objects};

/// Something a watch saw change, after its store took it in.
#[derive(Clone, Debug)]
pub enum Touched {
    /// A Proxy was added or changed.
    Proxy(Arc<Proxy>),
    /// A ProviderConfig was added or changed.
    ProviderConfig(Arc<ProviderConfig>),
    /// A ProviderConfig is gone.
    ProviderConfigGone(String),
    /// A Secret was added, changed or deleted.
    Secret { namespace: String, name: String },
    /// A ConfigMap was added, changed or deleted.
    ConfigMap { namespace: String, name: String },
    /// A watch restarted (relisted): anything may have changed.
    Relisted,
}

/// The stores, and the broadcast of touches.
#[derive(Clone)]
pub struct Caches {
    /// Every Proxy, all namespaces.
    pub proxies: Store<Proxy>,
    /// Every ProviderConfig.
    pub provider_configs: Store<ProviderConfig>,
    /// Every Secret, all namespaces (credentials, CAs and user-data).
    pub secrets: Store<Secret>,
    /// Every ConfigMap, all namespaces (CAs and user-data).
    pub config_maps: Store<ConfigMap>,
    touches: broadcast::Sender<Touched>,
}

impl std::fmt::Debug for Caches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caches")
            .field("proxies", &self.proxies.len())
            .field("provider_configs", &self.provider_configs.len())
            .finish_non_exhaustive()
    }
}

impl Caches {
    /// Start the four watches (cluster-wide) on `client`; dropping the guard stops them.
    pub(crate) fn start(client: &Client) -> (Caches, AbortOnDrop) {
        let (touches, _) = broadcast::channel(1024);
        let config = watcher::Config::default();
        let (proxies, proxy_task) = reflect(
            Api::<Proxy>::all(client.clone()),
            config.clone(),
            touches.clone(),
            |event| match event {
                Change::Applied(proxy) => Some(Touched::Proxy(proxy)),
                Change::Deleted(_) => None,
            },
        );
        let (provider_configs, pc_task) = reflect(
            Api::<ProviderConfig>::all(client.clone()),
            config.clone(),
            touches.clone(),
            |event| match event {
                Change::Applied(pc) => Some(Touched::ProviderConfig(pc)),
                Change::Deleted(pc) => Some(Touched::ProviderConfigGone(pc.name_any())),
            },
        );
        let (secrets, secret_task) = reflect(
            Api::<Secret>::all(client.clone()),
            config.clone(),
            touches.clone(),
            |event| {
                let object = event.object();
                Some(Touched::Secret {
                    namespace: object.namespace().unwrap_or_default(),
                    name: object.name_any(),
                })
            },
        );
        let (config_maps, map_task) = reflect(
            Api::<ConfigMap>::all(client.clone()),
            config,
            touches.clone(),
            |event| {
                let object = event.object();
                Some(Touched::ConfigMap {
                    namespace: object.namespace().unwrap_or_default(),
                    name: object.name_any(),
                })
            },
        );
        (
            Caches {
                proxies,
                provider_configs,
                secrets,
                config_maps,
                touches,
            },
            AbortOnDrop::new([proxy_task, pc_task, secret_task, map_task]),
        )
    }

    /// Stores seeded by hand, with no watch behind them (tests).
    pub fn detached() -> (Caches, Writers) {
        let (touches, _) = broadcast::channel(16);
        let (proxies, proxy_writer) = reflector::store();
        let (provider_configs, pc_writer) = reflector::store();
        let (secrets, secret_writer) = reflector::store();
        let (config_maps, map_writer) = reflector::store();
        (
            Caches {
                proxies,
                provider_configs,
                secrets,
                config_maps,
                touches,
            },
            Writers {
                proxies: proxy_writer,
                provider_configs: pc_writer,
                secrets: secret_writer,
                config_maps: map_writer,
            },
        )
    }

    /// Wait until every store holds its first complete list.
    pub async fn synced(&self) -> Result<(), reflector::store::WriterDropped> {
        self.proxies.wait_until_ready().await?;
        self.provider_configs.wait_until_ready().await?;
        self.secrets.wait_until_ready().await?;
        self.config_maps.wait_until_ready().await
    }

    /// Touches from now on. A subscriber that falls behind gets [`Touched::Relisted`] for what
    /// it missed.
    pub fn touches(&self) -> impl Stream<Item = Touched> + Send + 'static {
        let receiver = self.touches.subscribe();
        futures::stream::unfold(receiver, |mut receiver| async move {
            match receiver.recv().await {
                Ok(touched) => Some((touched, receiver)),
                Err(broadcast::error::RecvError::Lagged(_)) => Some((Touched::Relisted, receiver)),
                Err(broadcast::error::RecvError::Closed) => None,
            }
        })
    }

    /// The ProviderConfig `name`, if it exists.
    pub fn provider_config(&self, name: &str) -> Option<Arc<ProviderConfig>> {
        self.provider_configs.get(&ObjectRef::new(name))
    }
}

/// The write halves of [`Caches::detached`].
pub struct Writers {
    /// Proxies.
    pub proxies: reflector::store::Writer<Proxy>,
    /// ProviderConfigs.
    pub provider_configs: reflector::store::Writer<ProviderConfig>,
    /// Secrets.
    pub secrets: reflector::store::Writer<Secret>,
    /// ConfigMaps.
    pub config_maps: reflector::store::Writer<ConfigMap>,
}

/// What one watch event did to one object.
enum Change<K> {
    Applied(Arc<K>),
    Deleted(Arc<K>),
}

impl<K> Change<K> {
    fn object(&self) -> &K {
        match self {
            Change::Applied(object) | Change::Deleted(object) => object,
        }
    }
}

/// A reflector for `api` whose touches, mapped by `touch`, are broadcast after the store took
/// them in. Watch errors are retried with kube's default backoff.
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    touches: broadcast::Sender<Touched>,
    touch: impl Fn(Change<K>) -> Option<Touched> + Send + 'static,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let kind = K::kind(&());
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(reflector::reflector(
            writer,
            watcher::watcher(api, config).default_backoff()
        ));
        while let Some(event) = events.next().await {
            let touched = match event {
                Ok(Event::Apply(object)) => touch(Change::Applied(Arc::new(object))),
                Ok(Event::Delete(object)) => touch(Change::Deleted(Arc::new(object))),
                Ok(Event::InitDone) => Some(Touched::Relisted),
                Ok(Event::Init | Event::InitApply(_)) => None,
                Err(error) => {
                    tracing::warn!(%kind, %error, "watch failed; retrying");
                    None
                }
            };
            if let Some(touched) = touched {
                // No subscriber (a follower): nothing to tell.
                let _ = touches.send(touched);
            }
        }
    });
    (store, task)
}

/// The [`Objects`] the reconcilers read, over the Secret and ConfigMap stores.
pub struct StoreObjects<'a>(pub &'a Caches);

impl Objects for StoreObjects<'_> {
    fn secret_value(&self, namespace: &str, name: &str, key: &str) -> Result<Vec<u8>, Missing> {
        let secret = self
            .0
            .secrets
            .get(&ObjectRef::new(name).within(namespace))
            .ok_or(Missing::Object)?;
        if let Some(value) = secret.data.as_ref().and_then(|data| data.get(key)) {
            return Ok(value.0.clone());
        }
        // What the API server folds into `data` on write; a seeded object may still hold it.
        secret
            .string_data
            .as_ref()
            .and_then(|data| data.get(key))
            .map(|value| value.as_bytes().to_vec())
            .ok_or(Missing::Key)
    }

    fn config_map_value(&self, namespace: &str, name: &str, key: &str) -> Result<String, Missing> {
        let map = self
            .0
            .config_maps
            .get(&ObjectRef::new(name).within(namespace))
            .ok_or(Missing::Object)?;
        let value = map.data.as_ref().and_then(|data| data.get(key));
        value.cloned().ok_or(Missing::Key)
    }
}
