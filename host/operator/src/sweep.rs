//! The orphan sweep: VMs marked as made through a ProviderConfig whose Proxy no longer exists.
//!
//! Per ProviderConfig, `list-by-tag` on [`PROVIDER_CONFIG_TAG`] returns every VM made through
//! it. A VM whose ownership mark (the Proxy's UID) matches no existing Proxy is an orphan: its
//! Proxy was deleted while the operator could not clean up, or a create's VM was never recorded.
//! A VM counts as an orphan only when two consecutive sweeps find it so: a Proxy created a moment
//! ago may not be in the adapter's view yet. Orphans are then deleted, or only reported.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use egress_runtime::CallContext;
use egress_runtime::types::{ErrorClass, Request, Response};

use crate::Note;
use crate::crd::SweepMode;
use crate::providers::Binding;
use crate::reconciler::PROVIDER_CONFIG_TAG;

/// What one sweep of one ProviderConfig found and did.
#[derive(Debug, Default)]
pub struct SweepReport {
    /// Provider IDs of the orphans (seen in two sweeps running).
    pub found: Vec<String>,
    /// How many were deleted.
    pub deleted: u32,
    /// Events for the ProviderConfig.
    pub notes: Vec<Note>,
}

/// Remembers suspects between sweeps.
#[derive(Debug, Default)]
pub struct Sweeper {
    /// Per ProviderConfig, the provider IDs that looked orphaned last time.
    suspects: Mutex<HashMap<String, HashSet<String>>>,
}

impl Sweeper {
    /// Sweep `binding`'s VMs against `live_uids`, the UIDs of every existing Proxy.
    pub async fn sweep(&self, binding: &Binding, live_uids: &HashSet<String>) -> SweepReport {
        let mut report = SweepReport::default();
        if binding.sweep.mode == SweepMode::Off {
            return report;
        }
        let name = &binding.provider_config;
        let context = CallContext {
            proxy: Some(format!("providerconfig/{name}/sweep")),
        };
        let request = Request::ListByTag {
            config: binding.config.clone(),
            key: PROVIDER_CONFIG_TAG.into(),
            value: name.clone(),
        };
        let vms = match binding.provider.call(request, &context).await {
            Ok(Response::ListByTag(vms)) => vms,
            Ok(_) => return report,
            Err(error) => {
                report.notes.push(Note::warning(
                    "SweepFailed",
                    format!("listing VMs failed: {error}"),
                ));
                return report;
            }
        };
        let suspects: HashSet<String> = vms
            .iter()
            .filter(|vm| !live_uids.contains(&vm.uid))
            .map(|vm| vm.provider_id.clone())
            .collect();
        let confirmed: Vec<String> = {
            let mut all = self
                .suspects
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let before = all
                .insert(name.clone(), suspects.clone())
                .unwrap_or_default();
            let mut confirmed: Vec<String> = suspects.intersection(&before).cloned().collect();
            confirmed.sort();
            confirmed
        };
        for provider_id in confirmed {
            report.found.push(provider_id.clone());
            if binding.sweep.mode == SweepMode::Report {
                report.notes.push(Note::warning(
                    "OrphanFound",
                    format!("{provider_id} is marked as ours but no Proxy owns it (report only)"),
                ));
                continue;
            }
            let request = Request::Delete {
                config: binding.config.clone(),
                provider_id: provider_id.clone(),
            };
            match binding.provider.call(request, &context).await {
                Ok(_) => {
                    report.deleted += 1;
                    report.notes.push(Note::normal(
                        "OrphanDeleted",
                        format!("{provider_id} had no Proxy; deleted"),
                    ));
                }
                Err(error) if error.class() == ErrorClass::NotFound => report.deleted += 1,
                Err(error) => report.notes.push(Note::warning(
                    "OrphanNotDeleted",
                    format!("{provider_id} could not be deleted: {error}"),
                )),
            }
        }
        report
    }
}
