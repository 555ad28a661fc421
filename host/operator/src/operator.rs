//! [`Operator`]: what both modes share — the runtime and its components, the capabilities (the
//! egress broker, libvirt), the ProviderConfig bindings, the two reconcilers and the metrics.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use egress_runtime::{Compilation, Limits, Registry, Runtime, RuntimeConfig};

use crate::bindings::ProviderSet;
use crate::images::{ImageSettings, Images};
use crate::installation::Installation;
use crate::metrics::Metrics;
use crate::provider_config_reconciler::ProviderConfigReconciler;
use crate::proxy_reconciler::ProxyReconciler;
use crate::timing::Timing;
use egress_capability_set::Capabilities;

/// How the operator runs, in either mode.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Which installation this is: written on every VM it makes, and the sweep's bound.
    pub installation: Installation,
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
    /// How images (`spec.component.image`) are pulled, cached and verified.
    pub images: ImageSettings,
    /// Where the calls of ProviderConfigs that set `record` are recorded, a folder each.
    pub recordings_dir: PathBuf,
    /// A memory-backed directory under which SSH keys from Secrets are written for libvirt;
    /// `None`: `$XDG_RUNTIME_DIR` or `/dev/shm`.
    pub key_dir: Option<PathBuf>,
}

impl Settings {
    /// Defaults for installation `installation` over `components`: the runtime's default limits, a 256 MiB pool slot, the default
    /// compile cache and tiered compilation, no HTTP port, the namespace `default`; images
    /// pinned by digest and signed, cached in the system's temporary directory.
    pub fn new(installation: Installation, components: PathBuf) -> Settings {
        Settings {
            installation,
            components,
            namespace: "default".into(),
            listen: None,
            timing: Timing::default(),
            limits: Limits::default(),
            slot_memory_bytes: 256 << 20,
            cache_dir: egress_runtime::default_cache_dir(),
            compilation: Compilation::default(),
            images: ImageSettings {
                cache_dir: std::env::temp_dir().join("egress-operator-images"),
                max_component_bytes: egress_runtime::DEFAULT_MAX_COMPONENT_BYTES,
                allow_tags: false,
                allow_unsigned: false,
            },
            key_dir: None,
            recordings_dir: std::env::temp_dir().join("egress-operator-recordings"),
        }
    }
}

/// The operator's shared state. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Operator {
    /// The ProviderConfig bindings over the components directory.
    pub providers: ProviderSet,
    /// The capabilities the runtime serves, whose grants the bindings set.
    pub capabilities: Capabilities,
    /// The Proxy reconciler.
    pub reconciler: ProxyReconciler,
    /// The ProviderConfig reconciler (binding, `check`, the orphan sweep).
    pub provider_configs: ProviderConfigReconciler,
    /// Every series exported.
    pub metrics: Metrics,
    /// How it was started.
    pub settings: Settings,
}

impl Operator {
    /// Start the runtime and the registry on `settings.components` (loading every component
    /// now), with the capabilities granting nothing yet: grants arrive with ProviderConfigs.
    pub async fn start(settings: Settings) -> anyhow::Result<Arc<Operator>> {
        let capabilities = match &settings.key_dir {
            Some(dir) => Capabilities::with_key_base(dir.clone())?,
            None => Capabilities::new(),
        };
        let metrics = Metrics::default();
        metrics.register_with(|registry| capabilities.http.metrics().register(registry));
        let config = capabilities.serve(
            RuntimeConfig::default()
                .limits(settings.limits.clone())
                .cache_dir(settings.cache_dir.clone())
                .compilation(settings.compilation)
                .max_component_bytes(settings.images.max_component_bytes)
                .slot_memory_bytes(settings.slot_memory_bytes),
        );
        let runtime = Runtime::new(config).context("starting the runtime")?;
        let images = Images::new(
            runtime.clone(),
            settings.images.clone(),
            &settings.namespace,
            metrics.clone(),
        );
        let registry = Registry::watch(runtime, &settings.components)
            .await
            .with_context(|| {
                format!("serving components from {}", settings.components.display())
            })?;
        let providers = ProviderSet::new(
            registry,
            images,
            capabilities.clone(),
            &settings.namespace,
            settings.limits.clone(),
            settings.recordings_dir.clone(),
        );
        Ok(Arc::new(Operator {
            providers,
            capabilities,
            reconciler: ProxyReconciler::new(
                settings.installation.clone(),
                settings.timing.clone(),
                metrics.clone(),
            ),
            provider_configs: ProviderConfigReconciler::new(
                settings.installation.clone(),
                settings.timing.resync,
                metrics.clone(),
            ),
            metrics,
            settings,
        }))
    }

    /// The components registry.
    pub fn registry(&self) -> &Registry {
        self.providers.registry()
    }
}
