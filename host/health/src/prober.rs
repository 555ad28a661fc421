//! [`Prober`]: the VMs whose service is checked, each under its Proxy's key, probed when due.
//!
//! The reconciler says what to probe ([`Prober::watch`], each time it finds the VM running at an
//! address) and reads the verdict back; a loop of the adapter calls [`Prober::probe_due`] every
//! second and reconciles the Proxies whose verdict changed. A reconcile so never waits on a
//! probe, and a probe never calls the provider.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

use futures::StreamExt as _;
use k8s_openapi::jiff::Timestamp;

use egress_crd::HealthCheck;

use crate::{ProbeOutcome, Verdict, VmHealth, probe};

/// The most probes in flight at once: each holds a socket for up to its timeout.
pub const MAX_PROBES_IN_FLIGHT: usize = 32;

/// What is probed for one Proxy.
#[derive(Clone, Debug)]
struct Target {
    /// The VM (its provider ID): a new VM starts a new record.
    vm: String,
    address: IpAddr,
    check: HealthCheck,
    health: VmHealth,
}

/// The probed VMs by Proxy key, and what their probes say.
#[derive(Debug, Default)]
pub struct Prober {
    /// Never held across an await.
    targets: Mutex<HashMap<String, Target>>,
}

impl Prober {
    /// Probe VM `vm` of Proxy `key` at `address` as `check` says, from `now` on, and return its
    /// verdict so far. Another VM, address or check than the one watched starts afresh (not
    /// probed yet, its startup grace from `now`). `passed` says the Proxy's status records this
    /// VM passing: one not watched yet (the operator restarted) is then healthy until its first
    /// probe, so a restart does not take every proxy out of service.
    pub fn watch(
        &self,
        key: &str,
        vm: &str,
        address: IpAddr,
        check: &HealthCheck,
        now: Timestamp,
        passed: bool,
    ) -> Verdict {
        let mut targets = self.lock();
        let target = targets
            .entry(key.to_owned())
            .and_modify(|target| {
                if target.vm != vm || target.address != address || target.check != *check {
                    *target = Target::new(vm, address, check, VmHealth::new(now));
                }
            })
            .or_insert_with(|| {
                let health = match passed {
                    true => VmHealth::resumed(now),
                    false => VmHealth::new(now),
                };
                Target::new(vm, address, check, health)
            });
        target.health.verdict().clone()
    }

    /// Stop probing for Proxy `key` (its VM is gone, or it has no check any more).
    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    /// How many VMs are probed.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no VM is probed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Probe every VM due at `now` ([`MAX_PROBES_IN_FLIGHT`] at a time) and record the outcomes;
    /// the keys whose verdict changed kind (starting, healthy, unhealthy). An outcome for a
    /// target watched anew meanwhile is dropped.
    pub async fn probe_due(&self, now: Timestamp) -> Vec<String> {
        let due: Vec<(String, Target)> = self
            .lock()
            .iter()
            .filter(|(_, target)| target.health.is_due(&target.check, now))
            .map(|(key, target)| (key.clone(), target.clone()))
            .collect();
        let outcomes: Vec<(String, Target, ProbeOutcome)> = futures::stream::iter(due)
            .map(|(key, target)| async move {
                let outcome = probe(&target.check, target.address).await;
                (key, target, outcome)
            })
            .buffer_unordered(MAX_PROBES_IN_FLIGHT)
            .collect()
            .await;
        let mut targets = self.lock();
        let mut changed = Vec::new();
        for (key, probed, outcome) in outcomes {
            let Some(target) = targets.get_mut(&key) else {
                continue;
            };
            if target.vm != probed.vm || target.address != probed.address {
                continue;
            }
            let before = std::mem::discriminant(target.health.verdict());
            let after = std::mem::discriminant(target.health.record(&target.check, now, &outcome));
            if before != after {
                changed.push(key);
            }
        }
        changed.sort();
        changed
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Target>> {
        // A panic elsewhere leaves the map whole: every update is one assignment.
        self.targets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Target {
    fn new(vm: &str, address: IpAddr, check: &HealthCheck, health: VmHealth) -> Target {
        Target {
            vm: vm.to_owned(),
            address,
            check: check.clone(),
            health,
        }
    }
}
