//! [`Operator`]: what both modes share — the runtime and its components, the broker, the
//! ProviderConfig bindings, the reconciler, the sweeper and the metrics.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use egress_capability_http::{Broker, Grants};
use egress_runtime::{Compilation, Limits, Registry, Runtime, RuntimeConfig};

use crate::metrics::Metrics;
use crate::providers::ProviderSet;
use crate::reconciler::{Reconciler, Timing};
use crate::sweep::Sweeper;

/// How the operator runs, in either mode.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The components directory, served and hot-swapped.
    pub components: PathBuf,
    /// The operator's namespace: where a Secret reference without one points.
    pub namespace: String,
    /// Where `/healthz`, `/readyz` and `/metrics` are served, if anywhere.
    pub listen: Option<SocketAddr>,
    /// The reconciler's clock.
    pub timing: Timing,
    /// Limits of a provider whose ProviderConfig sets none.
    pub limits: Limits,
    /// The most linear memory a ProviderConfig may give its provider's calls.
    pub slot_memory_bytes: usize,
    /// Where compiled components are cached, if anywhere.
    pub cache_dir: Option<PathBuf>,
    /// How a component missing from the cache is compiled.
    pub compilation: Compilation,
}

impl Settings {
    /// Defaults for `components`: the runtime's default limits, a 256 MiB pool slot, the default
    /// compile cache and tiered compilation, no HTTP port, the namespace `default`.
    pub fn new(components: PathBuf) -> Settings {
        Settings {
            components,
            namespace: "default".into(),
            listen: None,
            timing: Timing::default(),
            limits: Limits::default(),
            slot_memory_bytes: 256 << 20,
            cache_dir: egress_runtime::default_cache_dir(),
            compilation: Compilation::default(),
        }
    }
}

/// The operator's shared state. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Operator {
    /// The ProviderConfig bindings over the components directory.
    pub providers: ProviderSet,
    /// The Proxy reconciler.
    pub reconciler: Reconciler,
    /// The orphan sweep's memory.
    pub sweeper: Sweeper,
    /// Every series exported.
    pub metrics: Metrics,
    /// How it was started.
    pub settings: Settings,
}

impl Operator {
    /// Start the runtime and the registry on `settings.components` (loading every component
    /// now), with an empty broker: grants arrive with ProviderConfigs.
    pub async fn start(settings: Settings) -> anyhow::Result<Arc<Operator>> {
        let broker = Broker::new(&Grants::default()).context("starting the egress broker")?;
        let metrics = Metrics::default();
        metrics.register_with(|registry| broker.metrics().register(registry));
        let config = RuntimeConfig::default()
            .limits(settings.limits.clone())
            .cache_dir(settings.cache_dir.clone())
            .compilation(settings.compilation)
            .slot_memory_bytes(settings.slot_memory_bytes);
        let runtime =
            Runtime::new(config, Arc::new(broker.clone())).context("starting the runtime")?;
        let registry = Registry::watch(runtime, &settings.components)
            .await
            .with_context(|| {
                format!("serving components from {}", settings.components.display())
            })?;
        let providers = ProviderSet::new(
            registry,
            broker,
            &settings.namespace,
            settings.limits.clone(),
        );
        Ok(Arc::new(Operator {
            providers,
            reconciler: Reconciler::new(settings.timing.clone(), metrics.clone()),
            sweeper: Sweeper::default(),
            metrics,
            settings,
        }))
    }

    /// The components registry.
    pub fn registry(&self) -> &Registry {
        self.providers.registry()
    }
}
