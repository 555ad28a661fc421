//! The orphan sweep: VMs this installation made through a ProviderConfig whose Proxy no longer
//! exists.
//!
//! Per ProviderConfig, `list-by-tag` on [`PROVIDER_CONFIG_TAG`] returns every VM made through a
//! ProviderConfig of that name, by any installation sharing the hypervisor. A VM whose ownership
//! mark (the Proxy's UID) matches no existing Proxy is a suspect. Only a suspect that also
//! carries this installation's tag ([`INSTALLATION_TAG`], a second `list-by-tag`, asked only when
//! there are suspects) can be an orphan: its Proxy was deleted while the operator could not clean
//! up, or a create's VM was never recorded. The others are another installation's, or were made
//! before marks named an installation: they are never deleted, and reported once each.
//! A VM counts as an orphan only when two consecutive sweeps find it so: a Proxy created a moment
//! ago may not be in the adapter's view yet. Orphans are then deleted, or only reported.
//!
//! When a sweep is due is one rule for both modes ([`SweepSchedule`]): the first at the
//! ProviderConfig's first reconcile after start, then each `orphanSweep.intervalSeconds` after
//! the last one, measured with the interval the spec gives now.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use egress_runtime::types::{ErrorClass, Listing, Request, Response};
use egress_runtime::{CallContext, CallError};
use tokio::time::Instant;

use crate::crd::{OrphanSweep, SweepMode};
use crate::installation::Installation;
use crate::marks::{INSTALLATION_TAG, PROVIDER_CONFIG_TAG};
use crate::provider_calls::ProviderCalls;
use crate::{Note, lock};

/// At most this many provider IDs are named in one report of foreign VMs.
const NAMED: usize = 10;

/// Every existing Proxy, by UID, with the provider ID its status records (none yet while its
/// first create runs).
pub type LiveProxies = HashMap<String, Option<String>>;

/// What one sweep of one ProviderConfig found and did.
#[derive(Debug, Default)]
pub struct SweepReport {
    /// Provider IDs of the orphans (seen in two sweeps running).
    pub found: Vec<String>,
    /// How many were deleted.
    pub deleted: u32,
    /// How many VMs of the ProviderConfig's name carry no mark of this installation.
    pub foreign: u32,
    /// Events for the ProviderConfig.
    pub notes: Vec<Note>,
}

/// The VMs one sweep looks at: those made through ProviderConfig `provider_config` by
/// `installation`.
#[derive(Clone, Copy, Debug)]
pub struct SweepTarget<'a> {
    /// The ProviderConfig (the tag's value).
    pub provider_config: &'a str,
    /// This installation: only VMs carrying its tag are ever deleted.
    pub installation: &'a Installation,
    /// The provider's configuration (JSON), passed to each call.
    pub config: &'a str,
    /// What is done with an orphan.
    pub mode: SweepMode,
}

/// Remembers suspects between sweeps, and the foreign VMs already reported.
#[derive(Debug, Default)]
pub struct Sweeper {
    /// Per ProviderConfig, the provider IDs that looked orphaned last time.
    suspects: Mutex<HashMap<String, HashSet<String>>>,
    /// Per ProviderConfig, the foreign VMs reported since start.
    reported: Mutex<HashMap<String, HashSet<String>>>,
}

impl Sweeper {
    /// Sweep `target`'s VMs, listed and deleted through `calls`, against `live`, every existing
    /// Proxy.
    pub async fn sweep(
        &self,
        calls: &impl ProviderCalls,
        target: SweepTarget<'_>,
        live: &LiveProxies,
    ) -> SweepReport {
        let mut report = SweepReport::default();
        if target.mode == SweepMode::Off {
            return report;
        }
        let name = target.provider_config;
        let context = CallContext {
            subject: Some(format!("providerconfig/{name}/sweep")),
            ..CallContext::default()
        };
        let list = |key: &str, value: &str| Request::ListByTag {
            config: target.config.to_owned(),
            key: key.to_owned(),
            value: value.to_owned(),
        };
        let listing = match listed(calls.call(list(PROVIDER_CONFIG_TAG, name), &context).await) {
            Ok(listing) => listing,
            Err(note) => {
                report.notes.push(note);
                return report;
            }
        };
        // Their VMs are unknown, never gone: none of them is a suspect this time, and a VM is
        // deleted only once two sweeps in a row listed it.
        report.notes.extend(partial(&listing.unanswered));
        let vms = listing.vms;
        self.report_second_vms(name, &vms, live, &mut report);
        let mut suspects: HashSet<String> = vms
            .iter()
            .filter(|vm| !live.contains_key(&vm.uid))
            .map(|vm| vm.provider_id.clone())
            .collect();
        if !suspects.is_empty() {
            let request = list(INSTALLATION_TAG, target.installation.as_str());
            match listed(calls.call(request, &context).await) {
                Ok(ours) => self.keep_ours(&target, ours, &mut suspects, &mut report),
                Err(note) => {
                    // Without it no suspect can be proven ours: nothing is deleted.
                    report.notes.push(note);
                    return report;
                }
            }
        }
        for provider_id in self.confirmed(name, suspects) {
            report.found.push(provider_id.clone());
            self.dispose(calls, &target, &context, provider_id, &mut report)
                .await;
        }
        report
    }

    /// Keeps the suspects `ours`, this installation's listing, holds; the others are foreign,
    /// reported and never touched.
    fn keep_ours(
        &self,
        target: &SweepTarget<'_>,
        ours: Listing,
        suspects: &mut HashSet<String>,
        report: &mut SweepReport,
    ) {
        let ours: HashSet<String> = ours.vms.into_iter().map(|vm| vm.provider_id).collect();
        let mut foreign: Vec<String> = suspects.difference(&ours).cloned().collect();
        foreign.sort();
        report.foreign = foreign.len() as u32;
        suspects.retain(|provider_id| ours.contains(provider_id));
        self.report_foreign(target.provider_config, target.installation, foreign, report);
    }

    /// This sweep's suspects that the last sweep suspected too, sorted; this sweep's become the
    /// next one's.
    fn confirmed(&self, name: &str, suspects: HashSet<String>) -> Vec<String> {
        let mut all = lock(&self.suspects);
        let before = all
            .insert(name.to_owned(), suspects.clone())
            .unwrap_or_default();
        let mut confirmed: Vec<String> = suspects.intersection(&before).cloned().collect();
        confirmed.sort();
        confirmed
    }

    /// Reports a confirmed orphan, or deletes it in `Delete` mode.
    async fn dispose(
        &self,
        calls: &impl ProviderCalls,
        target: &SweepTarget<'_>,
        context: &CallContext,
        provider_id: String,
        report: &mut SweepReport,
    ) {
        if target.mode == SweepMode::Report {
            report.notes.push(Note::warning(
                "OrphanFound",
                format!("{provider_id} is marked as ours but no Proxy owns it (report only)"),
            ));
            return;
        }
        let request = Request::Delete {
            config: target.config.to_owned(),
            provider_id: provider_id.clone(),
        };
        match calls.call(request, context).await {
            Ok(_) => {
                report.deleted += 1;
                report.notes.push(Note::warning(
                    "OrphanDeleted",
                    format!(
                        "{provider_id} was made by this installation ({}) and no Proxy owns it; \
                         deleted",
                        target.installation
                    ),
                ));
            }
            Err(error) if error.class() == ErrorClass::NotFound => report.deleted += 1,
            Err(error) => report.notes.push(Note::warning(
                "OrphanNotDeleted",
                format!("{provider_id} could not be deleted: {error}"),
            )),
        }
    }

    /// One Event for each VM, not reported before, that carries a live Proxy's UID but is not the
    /// VM the Proxy records: a create placed elsewhere while the hypervisor holding the first one
    /// did not answer, or a VM copied by hand. It is the Proxy's, but which of the two to keep is
    /// a person's call (a VM that moved to another node changes its ID too): never deleted.
    fn report_second_vms(
        &self,
        name: &str,
        vms: &[egress_runtime::types::Vm],
        live: &LiveProxies,
        report: &mut SweepReport,
    ) {
        let mut reported = lock(&self.reported);
        let seen = reported.entry(name.to_owned()).or_default();
        for vm in vms {
            let Some(Some(recorded)) = live.get(&vm.uid) else {
                continue;
            };
            if *recorded != vm.provider_id && seen.insert(vm.provider_id.clone()) {
                report.notes.push(Note::warning(
                    "SecondVM",
                    format!(
                        "{} carries the UID of the Proxy whose VM is {recorded}: a second VM of \
                         that Proxy (made while the first did not answer?); left for a person to \
                         delete the one not wanted",
                        vm.provider_id
                    ),
                ));
            }
        }
    }

    /// One Event for the foreign VMs not reported before.
    fn report_foreign(
        &self,
        name: &str,
        installation: &Installation,
        foreign: Vec<String>,
        report: &mut SweepReport,
    ) {
        let new: Vec<String> = {
            let mut reported = lock(&self.reported);
            let seen = reported.entry(name.to_owned()).or_default();
            foreign
                .into_iter()
                .filter(|provider_id| seen.insert(provider_id.clone()))
                .collect()
        };
        if new.is_empty() {
            return;
        }
        let mut named = new[..new.len().min(NAMED)].join(", ");
        if new.len() > NAMED {
            named.push_str(&format!(" and {} more", new.len() - NAMED));
        }
        report.notes.push(Note::warning(
            "ForeignVMs",
            format!(
                "{} VM(s) made through a ProviderConfig named {name} carry no mark of this \
                 installation ({installation}): another installation's, or made before marks \
                 named one; never deleted here: {named}",
                new.len()
            ),
        ));
    }

    /// Forget ProviderConfig `name`'s suspects (it is gone).
    pub fn forget(&self, name: &str) {
        lock(&self.suspects).remove(name);
        lock(&self.reported).remove(name);
    }
}

/// The note of a sweep some hypervisors did not answer: their VMs are not swept this time.
fn partial(unanswered: &[String]) -> Option<Note> {
    (!unanswered.is_empty()).then(|| {
        Note::warning(
            "SweepPartial",
            format!(
                "{} did not answer; its VMs are not swept this time",
                unanswered.join(", ")
            ),
        )
    })
}

/// What a `list-by-tag` answered, or the Event saying why there is nothing.
fn listed(answer: Result<Response, CallError>) -> Result<Listing, Note> {
    match answer {
        Ok(Response::ListByTag(listing)) => Ok(listing),
        Ok(other) => Err(Note::warning(
            "SweepFailed",
            format!("list-by-tag answered {}", other.operation().as_str()),
        )),
        Err(error) => Err(Note::warning(
            "SweepFailed",
            format!("listing VMs failed: {error}"),
        )),
    }
}

/// Whether a ProviderConfig's sweep is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SweepPlan {
    /// Its sweep is `Off`.
    Off,
    /// Sweep now; the next one is due this long after.
    Due(Duration),
    /// The next sweep is due in this long.
    Wait(Duration),
}

/// The sweep rule, from the settings, the last sweep (none yet since start) and now.
pub fn plan(settings: &OrphanSweep, last: Option<Instant>, now: Instant) -> SweepPlan {
    if settings.mode == SweepMode::Off {
        return SweepPlan::Off;
    }
    let interval = Duration::from_secs(settings.interval_seconds.max(1));
    match last.map(|last| now.saturating_duration_since(last)) {
        Some(since) if since < interval => SweepPlan::Wait(interval - since),
        _ => SweepPlan::Due(interval),
    }
}

/// When each ProviderConfig was last swept, in memory: a restart sweeps at the first reconcile
/// (nothing is deleted before a second sweep confirms it, one interval later).
#[derive(Debug, Default)]
pub struct SweepSchedule {
    last: Mutex<HashMap<String, Instant>>,
}

impl SweepSchedule {
    /// [`plan`] for ProviderConfig `name`; a due sweep is recorded as run at `now` (the caller
    /// runs it), so two reconciles at once never both sweep.
    pub fn plan(&self, name: &str, settings: &OrphanSweep, now: Instant) -> SweepPlan {
        let mut last = lock(&self.last);
        let plan = plan(settings, last.get(name).copied(), now);
        if matches!(plan, SweepPlan::Due(_)) {
            last.insert(name.to_owned(), now);
        }
        plan
    }

    /// Forget ProviderConfig `name` (it is gone).
    pub fn forget(&self, name: &str) {
        lock(&self.last).remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every(mode: SweepMode, seconds: u64) -> OrphanSweep {
        OrphanSweep {
            mode,
            interval_seconds: seconds,
        }
    }

    #[test]
    fn the_first_sweep_is_due_at_once_then_one_interval_after_the_last() {
        let now = Instant::now();
        let settings = every(SweepMode::Delete, 30);
        let secs = Duration::from_secs;
        assert_eq!(plan(&settings, None, now), SweepPlan::Due(secs(30)));
        assert_eq!(
            plan(&settings, Some(now), now + secs(10)),
            SweepPlan::Wait(secs(20))
        );
        assert_eq!(
            plan(&settings, Some(now), now + secs(30)),
            SweepPlan::Due(secs(30))
        );
        // A shorter interval in the spec applies from the last sweep on, not after the old one.
        assert_eq!(
            plan(&every(SweepMode::Report, 5), Some(now), now + secs(10)),
            SweepPlan::Due(secs(5))
        );
        assert_eq!(plan(&every(SweepMode::Off, 30), None, now), SweepPlan::Off);
        // Zero seconds is one: never a hot loop.
        assert_eq!(
            plan(&every(SweepMode::Delete, 0), Some(now), now),
            SweepPlan::Wait(secs(1))
        );
    }

    #[test]
    fn a_due_sweep_is_recorded_so_the_next_look_waits() {
        let schedule = SweepSchedule::default();
        let now = Instant::now();
        let settings = every(SweepMode::Delete, 60);
        assert_eq!(
            schedule.plan("lab", &settings, now),
            SweepPlan::Due(Duration::from_secs(60))
        );
        assert_eq!(
            schedule.plan("lab", &settings, now + Duration::from_secs(1)),
            SweepPlan::Wait(Duration::from_secs(59))
        );
        schedule.forget("lab");
        assert!(matches!(
            schedule.plan("lab", &settings, now + Duration::from_secs(2)),
            SweepPlan::Due(_)
        ));
    }
}
