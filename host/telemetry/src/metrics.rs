//! The operator's metrics (prometheus-client), served on `/metrics`.
//!
//! Reconciles use controller-runtime's names, so dashboards written for Go operators work:
//! `controller_runtime_reconcile_total{controller,result}`,
//! `controller_runtime_reconcile_errors_total{controller}` and
//! `controller_runtime_reconcile_time_seconds{controller}`. A reconcile that fails (Kubernetes
//! mode's `error_policy`) is counted by controller and the error's label in
//! `egress_reconcile_errors_total{controller,error}` (`kube`, `finalizer`, `cleanuppending`, …),
//! a family of its own: controller-runtime's errors counter has no error label, and ours also
//! counts reconciles that end not Ready. Provider calls are counted by
//! provider (the ProviderConfig), operation and outcome (`ok` or an error class) in
//! `egress_provider_calls_total`, and timed in `egress_provider_call_duration_seconds`. VMs
//! brought back are counted in `egress_proxy_recoveries_total{provider,action,reason}`, image
//! fetches in `egress_provider_image_loads_total{provider,source,outcome}`. Each ProxyPool's members
//! are gauged in `egress_pool_replicas{namespace,pool,state}` (`desired`: its spec; `current`:
//! members not being deleted; `ready`; `updated`: of its current template). The egress
//! broker's own series (`egress_http_requests_total`, …) are registered beside them.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    controller: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    controller: String,
    error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    provider: String,
    operation: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RecoveryLabels {
    provider: String,
    action: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ImageLabels {
    provider: String,
    source: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    namespace: String,
    pool: String,
    state: String,
}

/// One ProxyPool's member counts, as [`Metrics::pool_counts`] gauges them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolCounts {
    /// `spec.replicas`.
    pub desired: i64,
    /// Members not being deleted.
    pub current: i64,
    /// Of them, Ready.
    pub ready: i64,
    /// Of them, of the current template.
    pub updated: i64,
}

impl PoolCounts {
    fn by_state(self) -> [(&'static str, i64); 4] {
        [
            ("desired", self.desired),
            ("current", self.current),
            ("ready", self.ready),
            ("updated", self.updated),
        ]
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    provider: String,
    operation: String,
}

/// Every series the operator exports. Cloning shares them.
#[derive(Clone, Debug)]
pub struct Metrics {
    reconciles: Family<ReconcileLabels, Counter>,
    reconcile_errors: Family<ControllerLabels, Counter>,
    reconcile_time: Family<ControllerLabels, Histogram>,
    reconcile_failures: Family<FailureLabels, Counter>,
    calls: Family<CallLabels, Counter>,
    call_time: Family<LatencyLabels, Histogram>,
    recoveries: Family<RecoveryLabels, Counter>,
    image_loads: Family<ImageLabels, Counter>,
    pools: Family<PoolLabels, Gauge>,
    registry: Arc<std::sync::Mutex<Registry>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let metrics = Metrics {
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_time: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.005, 2.0, 14))
            }),
            reconcile_failures: Family::default(),
            calls: Family::default(),
            call_time: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 18))
            }),
            recoveries: Family::default(),
            image_loads: Family::default(),
            pools: Family::default(),
            registry: Arc::new(std::sync::Mutex::new(Registry::default())),
        };
        metrics.register();
        metrics
    }
}

impl Metrics {
    /// Registers every family with the registry `/metrics` encodes.
    fn register(&self) {
        let mut registry = self.lock();
        registry.register(
            "controller_runtime_reconcile",
            "Reconciliations per controller and result",
            self.reconciles.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Reconciliations that ended in an error, per controller",
            self.reconcile_errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Time per reconciliation",
            self.reconcile_time.clone(),
        );
        registry.register(
            "egress_reconcile_errors",
            "Reconciles that failed, per controller and error label",
            self.reconcile_failures.clone(),
        );
        registry.register(
            "egress_provider_calls",
            "Provider calls by provider, operation and outcome (ok or the error class)",
            self.calls.clone(),
        );
        registry.register(
            "egress_provider_call_duration_seconds",
            "Provider call latency by provider and operation",
            self.call_time.clone(),
        );
        registry.register(
            "egress_proxy_recoveries",
            "Stopped or failed VMs brought back, by provider, action (restart, replace, or \
             degraded when the limit stopped them) and reason (stopped, failed)",
            self.recoveries.clone(),
        );
        registry.register(
            "egress_provider_image_loads",
            "ProviderConfig images fetched, by provider, source (loaded, cache, registry, or \
             none when refused before) and outcome (ok or the refusal's reason)",
            self.image_loads.clone(),
        );
        registry.register(
            "egress_pool_replicas",
            "ProxyPool members by namespace, pool and state (desired, current, ready, updated)",
            self.pools.clone(),
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Register more series (the broker's) in the same registry.
    pub fn register_with(&self, register: impl FnOnce(&mut Registry)) {
        register(&mut self.lock());
    }

    /// Count one fetch of ProviderConfig `provider`'s image from `source` ending in `outcome`.
    pub fn image_loaded(&self, provider: &str, source: &str, outcome: &str) {
        self.image_loads
            .get_or_create(&ImageLabels {
                provider: provider.into(),
                source: source.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// The number of image fetches counted with these labels (tests).
    pub fn image_loads(&self, provider: &str, source: &str, outcome: &str) -> u64 {
        self.image_loads
            .get_or_create(&ImageLabels {
                provider: provider.into(),
                source: source.into(),
                outcome: outcome.into(),
            })
            .get()
    }

    /// Count one reconcile of `controller` (`proxy`, `providerconfig`) ending in `result`.
    pub fn reconciled(&self, controller: &str, result: &str, elapsed: Duration) {
        self.reconciles
            .get_or_create(&ReconcileLabels {
                controller: controller.into(),
                result: result.into(),
            })
            .inc();
        let labels = ControllerLabels {
            controller: controller.into(),
        };
        if result == "error" {
            self.reconcile_errors.get_or_create(&labels).inc();
        }
        self.reconcile_time
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// Count one reconcile of `controller` that failed with an error labelled `error`
    /// (`Error::metric_label`).
    pub fn reconcile_failed(&self, controller: &str, error: &str) {
        self.reconcile_failures
            .get_or_create(&FailureLabels {
                controller: controller.into(),
                error: error.into(),
            })
            .inc();
    }

    /// The number of failed reconciles counted with these labels (tests).
    pub fn reconcile_failures(&self, controller: &str, error: &str) -> u64 {
        self.reconcile_failures
            .get_or_create(&FailureLabels {
                controller: controller.into(),
                error: error.into(),
            })
            .get()
    }

    /// Count and time one provider call.
    pub fn provider_call(&self, provider: &str, operation: &str, outcome: &str, elapsed: Duration) {
        self.calls
            .get_or_create(&CallLabels {
                provider: provider.into(),
                operation: operation.into(),
                outcome: outcome.into(),
            })
            .inc();
        self.call_time
            .get_or_create(&LatencyLabels {
                provider: provider.into(),
                operation: operation.into(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Count one recovery of a Proxy's VM: `action` is `restart`, `replace` or `degraded` (the
    /// limit was reached), `reason` what the VM was found in.
    pub fn recovery(&self, provider: &str, action: &str, reason: &str) {
        self.recoveries
            .get_or_create(&RecoveryLabels {
                provider: provider.into(),
                action: action.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// The number of recoveries counted with these labels (tests).
    pub fn recoveries(&self, provider: &str, action: &str, reason: &str) -> u64 {
        self.recoveries
            .get_or_create(&RecoveryLabels {
                provider: provider.into(),
                action: action.into(),
                reason: reason.into(),
            })
            .get()
    }

    /// Gauge ProxyPool `namespace/pool`'s member counts.
    pub fn pool_counts(&self, namespace: &str, pool: &str, counts: PoolCounts) {
        for (state, value) in counts.by_state() {
            self.pools
                .get_or_create(&pool_labels(namespace, pool, state))
                .set(value);
        }
    }

    /// Drop the gauges of ProxyPool `namespace/pool`, which is gone.
    pub fn pool_gone(&self, namespace: &str, pool: &str) {
        for (state, _) in PoolCounts::default().by_state() {
            self.pools.remove(&pool_labels(namespace, pool, state));
        }
    }

    /// The text exposition of every series.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.lock());
        text
    }

    /// The number of calls counted with these labels (tests).
    pub fn calls(&self, provider: &str, operation: &str, outcome: &str) -> u64 {
        self.calls
            .get_or_create(&CallLabels {
                provider: provider.into(),
                operation: operation.into(),
                outcome: outcome.into(),
            })
            .get()
    }
}

fn pool_labels(namespace: &str, pool: &str, state: &str) -> PoolLabels {
    PoolLabels {
        namespace: namespace.into(),
        pool: pool.into(),
        state: state.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_use_controller_runtime_names() {
        let metrics = Metrics::default();
        metrics.reconciled("proxy", "success", Duration::from_millis(3));
        metrics.reconciled("proxy", "error", Duration::from_millis(3));
        metrics.provider_call("proxmox-lab", "get", "ok", Duration::from_millis(2));
        metrics.reconcile_failed("proxy", "kube");
        let text = metrics.encode();
        for expected in [
            r#"controller_runtime_reconcile_total{controller="proxy",result="success"} 1"#,
            r#"controller_runtime_reconcile_errors_total{controller="proxy"} 1"#,
            "controller_runtime_reconcile_time_seconds_count{controller=\"proxy\"} 2",
            r#"egress_provider_calls_total{provider="proxmox-lab",operation="get",outcome="ok"} 1"#,
            "egress_provider_call_duration_seconds_bucket",
            r#"egress_reconcile_errors_total{controller="proxy",error="kube"} 1"#,
        ] {
            assert!(text.contains(expected), "missing {expected} in\n{text}");
        }
        assert_eq!(metrics.calls("proxmox-lab", "get", "ok"), 1);
    }

    #[test]
    fn a_pools_gauges_follow_its_counts_and_go_with_it() {
        let metrics = Metrics::default();
        let counts = PoolCounts {
            desired: 3,
            current: 4,
            ready: 3,
            updated: 1,
        };
        metrics.pool_counts("team-a", "edge", counts);
        let text = metrics.encode();
        for expected in [
            r#"egress_pool_replicas{namespace="team-a",pool="edge",state="desired"} 3"#,
            r#"egress_pool_replicas{namespace="team-a",pool="edge",state="current"} 4"#,
            r#"egress_pool_replicas{namespace="team-a",pool="edge",state="ready"} 3"#,
            r#"egress_pool_replicas{namespace="team-a",pool="edge",state="updated"} 1"#,
        ] {
            assert!(text.contains(expected), "missing {expected} in\n{text}");
        }
        metrics.pool_gone("team-a", "edge");
        assert!(!metrics.encode().contains("pool=\"edge\""));
    }
}
