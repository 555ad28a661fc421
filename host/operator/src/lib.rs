//! # egress-operator
//!
//! The operator that provisions egress-proxy VMs through sandboxed provider components.
//!
//! Users declare [`crd::Proxy`] resources; each names a [`crd::ProviderConfig`], which names a
//! provider component (a WebAssembly file of the components directory), its configuration, what
//! it may reach (its grant) and its limits. The operator:
//!
//! 1. loads and hot-swaps the components ([`egress_runtime::Registry`]) and binds each
//!    ProviderConfig to its component under the ProviderConfig's name ([`bindings`]), with its
//!    grant served by the host's capabilities ([`egress_capability_set`]);
//! 2. reconciles each Proxy with one reconciler core ([`proxy_reconciler`]) and each
//!    ProviderConfig with another ([`provider_config_reconciler`]), both calling their provider
//!    through one counted seam ([`provider_calls`]), whatever holds the resources: a Kubernetes
//!    API server ([`kube_mode`]) or a folder of manifests on a laptop ([`local`], the default for
//!    a newcomer); their waits come from [`timing`], their conditions from [`conditions`];
//! 3. sweeps VMs marked as its own ([`marks`]) whose Proxy is gone ([`sweep`]), never those of
//!    another installation ([`installation`]);
//! 4. exports metrics ([`metrics`]) and health on one port ([`server`]), and its log lines
//!    ([`logging`]): the `egress-telemetry` crate, which knows nothing of the reconcilers.
//!
//! A [`crd::ProxyPool`] keeps N Proxies of one template; [`pool::plan()`] (the `egress-pool`
//! crate) decides, purely, what a pool does next, and local mode carries it out
//! ([`local`]). [`health`] (the `egress-health` crate) is the probe of a proxy VM's own
//! service and its tracker; the reconcilers do not call it yet.
//!
//! The command line is in [`cli`], the options of `run` in [`run_args`]; `egress-operator crdgen`
//! prints the CRDs of [`crd`] (the `egress-crd` crate's `manifests`); the provider author's
//! commands (`provider …`, `conformance`) are [`egress_provider_cli`]. [`images`] loads a
//! ProviderConfig's image: pinned, kept in [`egress_distribution`]'s store and verified.

pub mod bindings;
pub mod cli;
pub mod conditions;
pub use egress_crd as crd;
pub mod grants;
pub use egress_health as health;
pub mod images;
pub use egress_ownership::installation;
pub mod kube_mode;
pub mod local;
pub use egress_ownership::marks;
pub use egress_telemetry::logging;
pub use egress_telemetry::metrics;
pub mod operator;
pub use egress_pool as pool;
pub mod pool_members;
pub mod provider_calls;
pub mod provider_config_reconciler;
pub mod proxy_reconciler;
pub mod run_args;
pub use egress_telemetry::server;
pub mod sweep;
pub mod timing;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// An event to record on a resource: Kubernetes Events in Kubernetes mode, log lines and the
/// live table in local mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// `Warning` rather than `Normal`.
    pub warning: bool,
    /// A CamelCase reason (`VMCreated`, `PermanentError`, …).
    pub reason: String,
    /// For people; never a secret.
    pub message: String,
}

impl Note {
    /// A `Normal` event.
    pub fn normal(reason: &str, message: impl Into<String>) -> Note {
        Note {
            warning: false,
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// A `Warning` event.
    pub fn warning(reason: &str, message: impl Into<String>) -> Note {
        Note {
            warning: true,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// The objects the reconcilers read by reference: Secrets and ConfigMaps. Implemented by each
/// adapter over what it watches.
pub trait Objects: Send + Sync {
    /// The value of `key` of Secret `namespace/name`.
    fn secret_value(&self, namespace: &str, name: &str, key: &str) -> Result<Vec<u8>, Missing>;
    /// The value of `key` of ConfigMap `namespace/name`.
    fn config_map_value(&self, namespace: &str, name: &str, key: &str) -> Result<String, Missing>;
}

/// Why a referenced value is not there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Missing {
    /// The object does not exist.
    Object,
    /// The object exists without the key.
    Key,
}

impl Missing {
    /// In words: `{kind} {namespace}/{name} does not exist` or `… has no key {key}`.
    pub fn describe(self, kind: &str, namespace: &str, name: &str, key: &str) -> String {
        match self {
            Missing::Object => format!("{kind} {namespace}/{name} does not exist"),
            Missing::Key => format!("{kind} {namespace}/{name} has no key {key}"),
        }
    }
}

pub(crate) use egress_runtime::lock;

/// Tasks that run beside a loop and stop with it: aborted when this is dropped.
pub(crate) struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl AbortOnDrop {
    /// A guard over `tasks`.
    pub(crate) fn new(tasks: impl IntoIterator<Item = tokio::task::JoinHandle<()>>) -> Self {
        AbortOnDrop(tasks.into_iter().collect())
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Now, as a Kubernetes timestamp (whole seconds, as the API server writes them).
pub fn now() -> Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// SIGTERM or SIGINT, in either mode. Listening starts at the first poll: keep one future
/// for the life of the process (a signal arriving while no listener exists is lost).
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => {
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
    tracing::info!("shutdown requested");
}
