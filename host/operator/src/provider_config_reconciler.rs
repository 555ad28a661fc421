//! The ProviderConfig reconciler core, whatever holds the resources (a Kubernetes API server or a
//! local folder), in the Proxy reconciler's shape: given a ProviderConfig as last written, bind
//! its spec, ask the provider about it, sweep its orphans when due, and say what to write back,
//! what to record and when to come again ([`ProviderConfigOutcome`]). The adapters
//! (`kube_mode::provider_config`, `local`) apply the outcome and requeue it.
//!
//! One reconcile:
//!
//! 1. [`ProviderSet::load`] finds the component and checks the configuration against its schema;
//!    `validate-config` asks the provider;
//! 2. [`ProviderSet::bind`] binds and grants (the last good binding serves on when the spec
//!    cannot): `Degraded` says whether the current spec serves;
//! 3. `check` runs through the binding that serves, unless its grant was refused or lacks a
//!    capability the component imports: `Ready` is its answer;
//! 4. the orphan sweep runs when [`SweepSchedule`] says it is due, and its findings go to
//!    `status.orphans`; the reconcile comes again at the resync or the next sweep, whichever is
//!    first.
//!
//! Every provider call goes through [`ProviderCalls`], counted in the call metrics under the
//! ProviderConfig's name ([`Counted`]); the steps after binding are tested with a fake provider.

use std::future::Future;
use std::time::Duration;

use egress_runtime::types::{CheckReason, Request, Response};
use egress_runtime::{CallContext, CallError};
use tokio::time::Instant;

use crate::bindings::{Bound, ProviderSet, Source};
use crate::conditions::{self, NotReady, Stamp};
use crate::crd::{
    EffectiveGrant, LoadedComponent, OrphanReport, OrphanSweep, ProviderConfigSpec,
    ProviderConfigStatus,
};
use crate::installation::Installation;
use crate::metrics::Metrics;
use crate::provider_calls::{Counted, ProviderCalls};
use crate::sweep::{LiveProxies, SweepPlan, SweepReport, SweepSchedule, SweepTarget, Sweeper};
use crate::{Note, Objects};

/// A ProviderConfig as the reconciler sees it.
#[derive(Clone, Debug)]
pub struct ProviderConfigState {
    /// Its name: the provider's identity.
    pub name: String,
    /// Its spec generation.
    pub generation: i64,
    /// What it asks for.
    pub spec: ProviderConfigSpec,
    /// What was last written of it.
    pub status: ProviderConfigStatus,
}

/// What one reconcile of a ProviderConfig decided.
#[derive(Debug)]
pub struct ProviderConfigOutcome {
    /// The status to write.
    pub status: ProviderConfigStatus,
    /// Events to record on the ProviderConfig.
    pub notes: Vec<Note>,
    /// When to come again: the resync, or the next sweep if that is sooner.
    pub next: Duration,
    /// Whether its Proxies should reconcile (a new binding, or a refusal lifted).
    pub rebound: bool,
}

/// The ProviderConfig reconciler: the resync, the sweep's memory, metrics. Shared by every
/// reconcile of every ProviderConfig.
#[derive(Debug)]
pub struct ProviderConfigReconciler {
    /// Whose VMs the sweep may delete.
    installation: Installation,
    /// How often a ProviderConfig is checked again.
    resync: Duration,
    metrics: Metrics,
    /// Orphan suspects between sweeps.
    sweeper: Sweeper,
    /// When each ProviderConfig was last swept.
    sweeps: SweepSchedule,
}

/// What binding answered, as the steps after it see it: plain data, and the provider to call
/// through (the runtime's in the operator, a fake in tests).
struct Observed<'a, P> {
    spec_refused: Option<NotReady>,
    fresh: bool,
    rebound: bool,
    serving: Option<ServingView<'a, P>>,
}

/// The binding that serves, as the steps see it.
struct ServingView<'a, P> {
    component: LoadedComponent,
    grant: Result<EffectiveGrant, NotReady>,
    missing_capability: Option<NotReady>,
    /// The provider's configuration (JSON).
    config: &'a str,
    sweep: &'a OrphanSweep,
    provider: &'a P,
}

impl ProviderConfigReconciler {
    /// A reconciler of `installation` checking each ProviderConfig every `resync`, recording
    /// into `metrics`.
    pub fn new(installation: Installation, resync: Duration, metrics: Metrics) -> Self {
        ProviderConfigReconciler {
            installation,
            resync,
            metrics,
            sweeper: Sweeper::default(),
            sweeps: SweepSchedule::default(),
        }
    }

    /// Bring ProviderConfig `state` in step with its spec over `providers`, with the Secrets and
    /// ConfigMaps of `objects`. `live_proxy_uids` (awaited only when a sweep is due) answers the
    /// UIDs of every existing Proxy, or `None` when the adapter cannot tell (no sweep then).
    pub async fn reconcile(
        &self,
        providers: &ProviderSet,
        state: &ProviderConfigState,
        objects: &dyn Objects,
        live_proxy_uids: impl Future<Output = Option<LiveProxies>> + Send,
    ) -> ProviderConfigOutcome {
        let started = std::time::Instant::now();
        // `info`, `debug`, `trace`: each a tracing level's name.
        let level = state
            .spec
            .log_level
            .and_then(|level| level.as_str().parse().ok());
        crate::logging::set_provider_level(&state.name, level);
        let loaded = providers
            .load(&state.name, &state.spec, &state.status, objects)
            .await;
        let validated = match loaded {
            Ok(candidate) => self
                .validate(&state.name, candidate.component.as_ref(), &candidate.config)
                .await
                .map(|()| candidate),
            Err(why) => Err(why),
        };
        let bound = providers.bind(
            &state.name,
            state.generation,
            &state.spec,
            &state.status,
            validated,
            objects,
        );
        let outcome = self.follow(state, observe(&bound), live_proxy_uids).await;
        let result = if is_ready(&outcome.status) {
            "success"
        } else {
            "error"
        };
        self.metrics
            .reconciled("providerconfig", result, started.elapsed());
        outcome
    }

    /// Forget ProviderConfig `name` (it is deleted): its binding and grants go, and its sweep
    /// memory.
    pub fn forget(&self, providers: &ProviderSet, name: &str) {
        providers.remove(name);
        crate::logging::set_provider_level(name, None);
        self.sweeper.forget(name);
        self.sweeps.forget(name);
    }

    /// The provider's own `validate-config` on `config`.
    async fn validate(
        &self,
        name: &str,
        component: &impl ProviderCalls,
        config: &str,
    ) -> Result<(), NotReady> {
        let request = Request::ValidateConfig {
            config: config.to_owned(),
        };
        match self
            .counted(name, component)
            .call(request, &subject(name))
            .await
        {
            Ok(_) => Ok(()),
            Err(error) => Err(NotReady {
                reason: "InvalidConfig",
                message: format!("the provider refused its configuration: {error}"),
            }),
        }
    }

    /// The steps after binding: conditions, `check`, the sweep, when to come again.
    async fn follow<P: ProviderCalls>(
        &self,
        state: &ProviderConfigState,
        observed: Observed<'_, P>,
        live_proxy_uids: impl Future<Output = Option<LiveProxies>> + Send,
    ) -> ProviderConfigOutcome {
        let Observed {
            spec_refused,
            fresh,
            rebound,
            serving,
        } = observed;
        let mut step = Step::new(state);
        step.spec(
            spec_refused.as_ref(),
            fresh.then_some(serving.as_ref()).flatten(),
        );
        let Some(serving) = serving else {
            step.nothing_serves(spec_refused);
            return step.finish(self.resync, rebound);
        };
        if !step.serves(&serving, fresh) {
            return step.finish(self.resync, rebound);
        }
        let provider = self.counted(&state.name, serving.provider);
        let request = Request::Check {
            config: serving.config.to_owned(),
        };
        step.checked(provider.call(request, &subject(&state.name)).await);

        let mut next = self.resync;
        match self.sweeps.plan(&state.name, serving.sweep, Instant::now()) {
            SweepPlan::Off => {}
            SweepPlan::Wait(wait) => next = next.min(wait),
            SweepPlan::Due(interval) => {
                next = next.min(interval);
                let target = SweepTarget {
                    provider_config: &state.name,
                    installation: &self.installation,
                    config: serving.config,
                    mode: serving.sweep.mode,
                };
                match live_proxy_uids.await {
                    Some(live) => step.swept(self.sweeper.sweep(&provider, target, &live).await),
                    // Without the Proxies every VM would look orphaned: no sweep this time.
                    None => step.notes.push(Note::warning(
                        "SweepSkipped",
                        "the Proxies could not be read; the next sweep is in one interval",
                    )),
                }
            }
        }
        step.finish(next, rebound)
    }

    fn counted<'a, P>(&'a self, name: &'a str, calls: &'a P) -> Counted<'a, P> {
        Counted {
            calls,
            provider_config: name,
            metrics: &self.metrics,
            recordings: None,
        }
    }
}

/// What `bound` says, as the steps see it.
fn observe<'a>(bound: &'a Bound) -> Observed<'a, egress_runtime::Provider> {
    Observed {
        spec_refused: bound.spec_refused.clone(),
        fresh: bound.fresh,
        rebound: bound.rebound,
        serving: bound.serving.as_ref().map(|serving| {
            let binding = &serving.binding;
            let description = binding.provider.description();
            ServingView {
                component: LoadedComponent {
                    file: match &binding.source {
                        Source::File(file) => file.clone(),
                        Source::Image(_) => String::new(),
                    },
                    image: match &binding.source {
                        Source::File(_) => None,
                        Source::Image(pinned) => Some(pinned.clone()),
                    },
                    name: description.name.clone(),
                    version: description.version.clone(),
                    contract_version: description.contract_version.clone(),
                    digest: binding.provider.component_digest().to_string(),
                    generation: binding.provider.load_generation(),
                },
                grant: serving.grant.clone(),
                missing_capability: serving.missing_capability.clone(),
                config: &binding.config,
                sweep: &binding.sweep,
                provider: binding.provider.as_ref(),
            }
        }),
    }
}

/// Who the ProviderConfig's own calls are for, on the call's span.
fn subject(name: &str) -> CallContext {
    CallContext {
        subject: Some(format!("providerconfig/{name}")),
        ..CallContext::default()
    }
}

fn is_ready(status: &ProviderConfigStatus) -> bool {
    conditions::is_true(&status.conditions, conditions::READY)
}

/// The status and notes one reconcile builds, step by step; pure.
struct Step {
    status: ProviderConfigStatus,
    notes: Vec<Note>,
    stamp: Stamp,
    /// Whether the status given said Ready.
    was_ready: bool,
}

impl Step {
    fn new(state: &ProviderConfigState) -> Step {
        let mut status = state.status.clone();
        status.observed_generation = Some(state.generation);
        Step {
            was_ready: is_ready(&status),
            status,
            notes: Vec::new(),
            stamp: Stamp::new(state.generation),
        }
    }

    fn set(&mut self, kind: &str, ok: bool, reason: &str, message: &str) {
        self.stamp
            .set(&mut self.status.conditions, kind, ok, reason, message);
    }

    /// `Degraded`: whether the current spec serves; a new binding (`fresh`) is announced.
    fn spec<P>(&mut self, refused: Option<&NotReady>, fresh: Option<&ServingView<'_, P>>) {
        match refused {
            None => {
                self.set(
                    conditions::DEGRADED,
                    false,
                    "AsSpecified",
                    "the provider serves the current spec",
                );
                if let Some(fresh) = fresh {
                    let component = &fresh.component;
                    self.notes.push(Note::normal(
                        "ProviderLoaded",
                        format!(
                            "{} {} ({}, generation {}) serves",
                            component.name,
                            component.version,
                            component.digest,
                            component.generation
                        ),
                    ));
                }
            }
            Some(failure) => {
                self.set(conditions::DEGRADED, true, failure.reason, &failure.message);
                self.notes
                    .push(Note::warning(failure.reason, failure.message.clone()));
            }
        }
    }

    /// No binding serves: not Ready, for the reason the spec could not be bound.
    fn nothing_serves(&mut self, why: Option<NotReady>) {
        let why = why.unwrap_or(NotReady {
            reason: "ProviderNotReady",
            message: "no provider loaded".into(),
        });
        self.set(conditions::READY, false, why.reason, &why.message);
        self.status.loaded = None;
        self.status.effective_grant = None;
    }

    /// The binding that serves, its grant and whether Proxies may call through it (then the
    /// provider is checked next). `fresh`: the binding is new, so a refusal is news.
    fn serves<P>(&mut self, serving: &ServingView<'_, P>, fresh: bool) -> bool {
        self.status.loaded = Some(serving.component.clone());
        match &serving.grant {
            Ok(grant) => self.status.effective_grant = Some(grant.clone()),
            Err(refused) => {
                self.status.effective_grant = None;
                self.set(conditions::READY, false, refused.reason, &refused.message);
                self.notes
                    .push(Note::warning(refused.reason, refused.message.clone()));
                return false;
            }
        }
        if let Some(missing) = &serving.missing_capability {
            self.set(conditions::READY, false, missing.reason, &missing.message);
            if self.was_ready || fresh {
                self.notes
                    .push(Note::warning(missing.reason, missing.message.clone()));
            }
            return false;
        }
        true
    }

    /// `Ready`: what `check` answered. Losing it is news; failing again is not.
    fn checked(&mut self, answer: Result<Response, CallError>) {
        let (ready, reason, message) = match answer {
            Ok(Response::Check(result)) => (
                result.reason == CheckReason::Ok,
                conditions::check_reason(result.reason),
                result.message,
            ),
            Ok(other) => (
                false,
                "CheckFailed",
                format!("check answered {}", other.operation().as_str()),
            ),
            Err(error) => (false, "CheckFailed", error.to_string()),
        };
        self.set(conditions::READY, ready, reason, &message);
        if !ready && self.was_ready {
            self.notes.push(Note::warning(reason, message));
        }
    }

    /// `status.orphans`: what the sweep that just ran found.
    fn swept(&mut self, report: SweepReport) {
        self.status.orphans = Some(OrphanReport {
            last_sweep: Some(self.stamp.now.clone()),
            found: report.found,
            deleted: report.deleted,
            foreign: report.foreign,
        });
        self.notes.extend(report.notes);
    }

    fn finish(self, next: Duration, rebound: bool) -> ProviderConfigOutcome {
        ProviderConfigOutcome {
            status: self.status,
            notes: self.notes,
            next,
            rebound,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use egress_runtime::types::{CheckResult, Listing, Operation, ProviderError, Vm, VmState};

    use super::*;
    use crate::conditions::set_condition;
    use crate::crd::SweepMode;
    use crate::marks::{INSTALLATION_TAG, PROVIDER_CONFIG_TAG};
    use crate::{lock, now};

    /// A provider answering from a script, recording what it was asked.
    #[derive(Default)]
    struct FakeProvider {
        /// `validate-config` refuses with this.
        refuse_config: Option<ProviderError>,
        /// What `check` answers; passing when unset.
        check: Option<Result<CheckResult, ProviderError>>,
        /// This installation's VMs: what `list-by-tag` answers by ProviderConfig or by
        /// installation.
        vms: Vec<Vm>,
        /// Another installation's VMs of the same ProviderConfig name: listed by ProviderConfig
        /// only.
        foreign: Vec<Vm>,
        /// The hypervisors every listing says did not answer.
        unanswered: Vec<String>,
        asked: Mutex<Vec<Operation>>,
        /// The provider IDs `delete` was called with.
        deleted: Mutex<Vec<String>>,
    }

    impl FakeProvider {
        fn asked(&self) -> Vec<Operation> {
            lock(&self.asked).clone()
        }
    }

    impl ProviderCalls for FakeProvider {
        async fn call(&self, request: Request, _: &CallContext) -> Result<Response, CallError> {
            lock(&self.asked).push(request.operation());
            let answer = match request {
                Request::ValidateConfig { .. } => match &self.refuse_config {
                    Some(refusal) => Err(refusal.clone()),
                    None => Ok(Response::ValidateConfig),
                },
                Request::Check { .. } => self
                    .check
                    .clone()
                    .unwrap_or(Ok(CheckResult {
                        reason: CheckReason::Ok,
                        message: "the hypervisor answers".into(),
                    }))
                    .map(Response::Check),
                Request::ListByTag { key, value, .. } => {
                    let mut vms = self.vms.clone();
                    match key.as_str() {
                        PROVIDER_CONFIG_TAG => vms.extend(self.foreign.iter().cloned()),
                        INSTALLATION_TAG => assert_eq!(value, INSTALLED),
                        other => panic!("listed by {other}"),
                    }
                    Ok(Response::ListByTag(Listing {
                        vms,
                        unanswered: self.unanswered.clone(),
                    }))
                }
                Request::Delete { provider_id, .. } => {
                    lock(&self.deleted).push(provider_id);
                    Ok(Response::Delete)
                }
                other => panic!("not a ProviderConfig call: {:?}", other.operation()),
            };
            answer.map_err(CallError::Provider)
        }
    }

    const NAME: &str = "lab";
    const INSTALLED: &str = "cluster-a";

    fn state(status: ProviderConfigStatus) -> ProviderConfigState {
        let mut spec = ProviderConfigSpec::default();
        spec.component.file = "fake.wasm".into();
        ProviderConfigState {
            name: NAME.into(),
            generation: 2,
            spec,
            status,
        }
    }

    fn ready_status() -> ProviderConfigStatus {
        let mut status = ProviderConfigStatus::default();
        set_condition(
            &mut status.conditions,
            conditions::READY,
            true,
            "CheckPassed",
            "ok",
            Some(1),
            &now(),
        );
        status
    }

    fn sweep(mode: SweepMode, seconds: u64) -> OrphanSweep {
        OrphanSweep {
            mode,
            interval_seconds: seconds,
        }
    }

    /// A binding of `provider` that serves, its grant set.
    fn serving<'a>(
        provider: &'a FakeProvider,
        sweep: &'a OrphanSweep,
    ) -> ServingView<'a, FakeProvider> {
        ServingView {
            component: LoadedComponent {
                file: "fake.wasm".into(),
                image: None,
                name: "fake".into(),
                version: "1.0.0".into(),
                contract_version: "0.1.0".into(),
                digest: format!("sha256:{}", "ab".repeat(32)),
                generation: 3,
            },
            grant: Ok(EffectiveGrant {
                identity: NAME.into(),
                digest: format!("sha256:{}", "ab".repeat(32)),
                http: None,
                libvirt: None,
            }),
            missing_capability: None,
            config: "{}",
            sweep,
            provider,
        }
    }

    fn observed(serving: ServingView<'_, FakeProvider>) -> Observed<'_, FakeProvider> {
        Observed {
            spec_refused: None,
            fresh: false,
            rebound: false,
            serving: Some(serving),
        }
    }

    fn reconciler() -> ProviderConfigReconciler {
        ProviderConfigReconciler::new(
            Installation::new(INSTALLED).unwrap(),
            Duration::from_secs(60),
            Metrics::default(),
        )
    }

    async fn no_proxies() -> Option<LiveProxies> {
        Some(LiveProxies::new())
    }

    /// The live Proxies `uids`, each recording no VM.
    fn live(uids: &[&str]) -> Option<LiveProxies> {
        Some(uids.iter().map(|uid| (uid.to_string(), None)).collect())
    }

    /// The status and reason of condition `kind`.
    fn said(outcome: &ProviderConfigOutcome, kind: &str) -> (String, String) {
        let found =
            conditions::condition(&outcome.status.conditions, kind).expect("the condition is set");
        (found.status.clone(), found.reason.clone())
    }

    fn reasons(outcome: &ProviderConfigOutcome) -> Vec<&str> {
        outcome
            .notes
            .iter()
            .map(|note| note.reason.as_str())
            .collect()
    }

    fn vm(provider_id: &str, uid: &str) -> Vm {
        Vm {
            provider_id: provider_id.into(),
            name: format!("vm-{uid}"),
            state: VmState::Running,
            addresses: Vec::new(),
            created_at: None,
            uid: uid.into(),
            host: None,
        }
    }

    fn pair(status: &str, reason: &str) -> (String, String) {
        (status.into(), reason.into())
    }

    #[tokio::test]
    async fn a_new_binding_that_checks_out_is_ready_and_announced_with_its_calls_counted() {
        let core = reconciler();
        let provider = FakeProvider::default();
        let settings = sweep(SweepMode::Off, 300);
        let mut fresh = observed(serving(&provider, &settings));
        fresh.fresh = true;
        fresh.rebound = true;
        let outcome = core
            .follow(&state(Default::default()), fresh, no_proxies())
            .await;
        assert_eq!(
            said(&outcome, conditions::READY),
            pair("True", "CheckPassed")
        );
        assert_eq!(
            said(&outcome, conditions::DEGRADED),
            pair("False", "AsSpecified")
        );
        assert_eq!(outcome.status.observed_generation, Some(2));
        assert_eq!(outcome.status.loaded.as_ref().unwrap().generation, 3);
        assert_eq!(
            outcome.status.effective_grant.as_ref().unwrap().identity,
            NAME
        );
        assert_eq!(reasons(&outcome), ["ProviderLoaded"]);
        assert!(outcome.rebound);
        assert_eq!(outcome.next, Duration::from_secs(60));
        assert_eq!(provider.asked(), [Operation::Check]);
        assert_eq!(core.metrics.calls(NAME, "check", "ok"), 1);
    }

    #[tokio::test]
    async fn a_configuration_the_provider_refuses_is_invalid_and_the_call_is_counted() {
        let core = reconciler();
        let provider = FakeProvider {
            refuse_config: Some(ProviderError::Permanent("apiUrl is not a URL".into())),
            ..FakeProvider::default()
        };
        let refused = core.validate(NAME, &provider, "{}").await.unwrap_err();
        assert_eq!(refused.reason, "InvalidConfig");
        assert!(refused.message.contains("apiUrl"), "{}", refused.message);
        assert_eq!(core.metrics.calls(NAME, "validate-config", "permanent"), 1);
        let accepted = FakeProvider::default();
        assert_eq!(core.validate(NAME, &accepted, "{}").await, Ok(()));
        assert_eq!(core.metrics.calls(NAME, "validate-config", "ok"), 1);
    }

    #[tokio::test]
    async fn a_spec_that_cannot_be_bound_degrades_while_the_last_good_binding_serves() {
        let core = reconciler();
        let provider = FakeProvider::default();
        let settings = sweep(SweepMode::Off, 300);
        let mut degraded = observed(serving(&provider, &settings));
        degraded.spec_refused = Some(NotReady {
            reason: "ComponentRejected",
            message: "the new fake.wasm does not load, the previous one serves".into(),
        });
        let outcome = core
            .follow(&state(ready_status()), degraded, no_proxies())
            .await;
        assert_eq!(
            said(&outcome, conditions::DEGRADED),
            pair("True", "ComponentRejected")
        );
        assert_eq!(
            said(&outcome, conditions::READY),
            pair("True", "CheckPassed")
        );
        assert_eq!(reasons(&outcome), ["ComponentRejected"]);
        assert!(outcome.notes[0].warning);
    }

    #[tokio::test]
    async fn with_nothing_serving_it_is_not_ready_for_the_reason_the_spec_gave() {
        let core = reconciler();
        let mut previous = ready_status();
        previous.loaded = Some(LoadedComponent::default());
        let outcome = core
            .follow::<FakeProvider>(
                &state(previous),
                Observed {
                    spec_refused: Some(NotReady {
                        reason: "ComponentNotLoaded",
                        message: "component fake.wasm is not in the components directory".into(),
                    }),
                    fresh: false,
                    rebound: false,
                    serving: None,
                },
                no_proxies(),
            )
            .await;
        assert_eq!(
            said(&outcome, conditions::READY),
            pair("False", "ComponentNotLoaded")
        );
        assert_eq!(outcome.status.loaded, None);
        assert_eq!(outcome.status.effective_grant, None);
        assert_eq!(outcome.next, Duration::from_secs(60));
    }

    #[tokio::test]
    async fn a_refused_grant_or_a_missing_capability_is_not_ready_and_calls_nothing() {
        let core = reconciler();
        let provider = FakeProvider::default();
        let settings = sweep(SweepMode::Delete, 1);
        let mut refused = serving(&provider, &settings);
        refused.grant = Err(NotReady {
            reason: "InvalidGrant",
            message: "origin ftp://h is not http(s)".into(),
        });
        let outcome = core
            .follow(&state(ready_status()), observed(refused), no_proxies())
            .await;
        assert_eq!(
            said(&outcome, conditions::READY),
            pair("False", "InvalidGrant")
        );
        assert_eq!(outcome.status.effective_grant, None);
        assert_eq!(reasons(&outcome), ["InvalidGrant"]);

        let mut lacking = serving(&provider, &settings);
        lacking.missing_capability = Some(NotReady {
            reason: "CapabilityNotGranted",
            message: "add spec.grant.http".into(),
        });
        let outcome = core
            .follow(&state(ready_status()), observed(lacking), no_proxies())
            .await;
        assert_eq!(
            said(&outcome, conditions::READY),
            pair("False", "CapabilityNotGranted")
        );
        assert_eq!(reasons(&outcome), ["CapabilityNotGranted"]);
        // Neither checked nor swept: the capability would deny every call.
        assert!(provider.asked().is_empty(), "{:?}", provider.asked());
        assert!(outcome.status.orphans.is_none());
    }

    #[tokio::test]
    async fn a_failing_check_is_not_ready_with_its_reason_and_only_losing_ready_is_an_event() {
        let core = reconciler();
        let settings = sweep(SweepMode::Off, 300);
        let unreachable = FakeProvider {
            check: Some(Err(ProviderError::Transient("connection refused".into()))),
            ..FakeProvider::default()
        };
        let outcome = core
            .follow(
                &state(ready_status()),
                observed(serving(&unreachable, &settings)),
                no_proxies(),
            )
            .await;
        assert_eq!(
            said(&outcome, conditions::READY),
            pair("False", "CheckFailed")
        );
        assert_eq!(reasons(&outcome), ["CheckFailed"]);
        assert_eq!(core.metrics.calls(NAME, "check", "transient"), 1);

        let unauthorized = FakeProvider {
            check: Some(Ok(CheckResult {
                reason: CheckReason::Unauthorized,
                message: "the token was refused".into(),
            })),
            ..FakeProvider::default()
        };
        let again = core
            .follow(
                &state(outcome.status),
                observed(serving(&unauthorized, &settings)),
                no_proxies(),
            )
            .await;
        assert_eq!(
            said(&again, conditions::READY),
            pair("False", "Unauthorized")
        );
        assert!(
            again.notes.is_empty(),
            "not Ready before either: {:?}",
            again.notes
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_sweep_is_due_at_the_first_reconcile_then_each_interval_which_sets_the_next_one() {
        let core = reconciler();
        let provider = FakeProvider::default();
        let settings = sweep(SweepMode::Delete, 10);
        let pc = state(Default::default());
        let first = core
            .follow(&pc, observed(serving(&provider, &settings)), no_proxies())
            .await;
        assert_eq!(provider.asked(), [Operation::Check, Operation::ListByTag]);
        assert!(first.status.orphans.as_ref().unwrap().last_sweep.is_some());
        assert_eq!(first.next, Duration::from_secs(10));
        assert_eq!(core.metrics.calls(NAME, "list-by-tag", "ok"), 1);

        tokio::time::advance(Duration::from_secs(4)).await;
        let early = core
            .follow(&pc, observed(serving(&provider, &settings)), no_proxies())
            .await;
        assert_eq!(
            early.next,
            Duration::from_secs(6),
            "comes again when the sweep is due"
        );
        assert_eq!(
            core.metrics.calls(NAME, "list-by-tag", "ok"),
            1,
            "not due yet"
        );

        tokio::time::advance(Duration::from_secs(6)).await;
        core.follow(&pc, observed(serving(&provider, &settings)), no_proxies())
            .await;
        assert_eq!(core.metrics.calls(NAME, "list-by-tag", "ok"), 2);
    }

    /// Two sweeps, one interval apart, over an orphan and a live Proxy's VM.
    async fn two_sweeps(
        mode: SweepMode,
    ) -> (
        FakeProvider,
        ProviderConfigReconciler,
        ProviderConfigOutcome,
    ) {
        let core = reconciler();
        let provider = FakeProvider {
            vms: vec![vm("pv1/101", "gone"), vm("pv1/102", "here")],
            ..FakeProvider::default()
        };
        let settings = sweep(mode, 1);
        let live = || async { live(&["here"]) };
        let pc = state(Default::default());
        let first = core
            .follow(&pc, observed(serving(&provider, &settings)), live())
            .await;
        let report = first.status.orphans.clone().expect("the sweep is reported");
        assert!(
            report.found.is_empty(),
            "one sighting is only a suspect: {report:?}"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        let second = core
            .follow(
                &state(first.status),
                observed(serving(&provider, &settings)),
                live(),
            )
            .await;
        (provider, core, second)
    }

    #[tokio::test(start_paused = true)]
    async fn in_delete_mode_an_orphan_seen_twice_is_deleted_and_written_into_the_status() {
        let (provider, core, outcome) = two_sweeps(SweepMode::Delete).await;
        let report = outcome.status.orphans.as_ref().unwrap();
        assert_eq!(report.found, ["pv1/101"]);
        assert_eq!(report.deleted, 1);
        assert_eq!(reasons(&outcome), ["OrphanDeleted"]);
        assert_eq!(
            provider
                .asked()
                .iter()
                .filter(|asked| **asked == Operation::Delete)
                .count(),
            1
        );
        assert_eq!(core.metrics.calls(NAME, "delete", "ok"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn in_report_mode_an_orphan_is_written_into_the_status_and_left_alone() {
        let (provider, core, outcome) = two_sweeps(SweepMode::Report).await;
        let report = outcome.status.orphans.as_ref().unwrap();
        assert_eq!(report.found, ["pv1/101"]);
        assert_eq!(report.deleted, 0);
        assert_eq!(reasons(&outcome), ["OrphanFound"]);
        assert!(!provider.asked().contains(&Operation::Delete));
        // Each sweep lists by ProviderConfig, then by installation for its suspect.
        assert_eq!(core.metrics.calls(NAME, "list-by-tag", "ok"), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn another_installations_vms_are_never_deleted_and_reported_once() {
        let core = reconciler();
        let provider = FakeProvider {
            vms: vec![vm("pv1/101", "gone"), vm("pv1/102", "here")],
            foreign: vec![vm("pv1/201", "theirs-1"), vm("pv1/202", "theirs-2")],
            ..FakeProvider::default()
        };
        let settings = sweep(SweepMode::Delete, 1);
        let live = || async { live(&["here"]) };
        let mut status = ProviderConfigStatus::default();
        let mut foreign_reports = 0;
        for _ in 0..5 {
            let outcome = core
                .follow(
                    &state(status),
                    observed(serving(&provider, &settings)),
                    live(),
                )
                .await;
            foreign_reports += reasons(&outcome)
                .iter()
                .filter(|reason| **reason == "ForeignVMs")
                .count();
            assert_eq!(outcome.status.orphans.as_ref().unwrap().foreign, 2);
            status = outcome.status;
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        let report = status.orphans.unwrap();
        assert_eq!(report.found, ["pv1/101"], "only our own orphan");
        assert_eq!(foreign_reports, 1, "reported once");
        let deleted = lock(&provider.deleted).clone();
        assert!(
            !deleted.is_empty() && deleted.iter().all(|id| id == "pv1/101"),
            "{deleted:?}"
        );
    }

    /// Issue 32: a second VM carrying a live Proxy's UID (a create placed elsewhere while the
    /// first VM's hypervisor did not answer) is reported once and never deleted.
    #[tokio::test(start_paused = true)]
    async fn a_second_vm_of_a_live_proxy_is_reported_once_and_left_alone() {
        let core = reconciler();
        let provider = FakeProvider {
            vms: vec![vm("pv1/101", "here"), vm("pv2/101", "here")],
            ..FakeProvider::default()
        };
        let settings = sweep(SweepMode::Delete, 1);
        let live = || async {
            Some(LiveProxies::from([(
                "here".to_owned(),
                Some("pv1/101".to_owned()),
            )]))
        };
        let mut status = ProviderConfigStatus::default();
        let mut reported = Vec::new();
        for _ in 0..3 {
            let outcome = core
                .follow(
                    &state(status),
                    observed(serving(&provider, &settings)),
                    live(),
                )
                .await;
            reported.extend(
                outcome
                    .notes
                    .iter()
                    .filter(|note| note.reason == "SecondVM")
                    .map(|note| note.message.clone()),
            );
            status = outcome.status;
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert_eq!(reported.len(), 1, "{reported:?}");
        assert!(reported[0].starts_with("pv2/101"), "{reported:?}");
        assert!(lock(&provider.deleted).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn without_suspects_the_installation_is_not_listed() {
        let core = reconciler();
        let provider = FakeProvider {
            vms: vec![vm("pv1/102", "here")],
            ..FakeProvider::default()
        };
        let settings = sweep(SweepMode::Delete, 1);
        let live = || async { live(&["here"]) };
        core.follow(
            &state(Default::default()),
            observed(serving(&provider, &settings)),
            live(),
        )
        .await;
        assert_eq!(core.metrics.calls(NAME, "list-by-tag", "ok"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn with_the_sweep_off_nothing_is_listed_and_the_last_report_stays() {
        let core = reconciler();
        let provider = FakeProvider {
            vms: vec![vm("pv1/101", "gone")],
            ..FakeProvider::default()
        };
        let settings = sweep(SweepMode::Off, 1);
        let previous = ProviderConfigStatus {
            orphans: Some(OrphanReport {
                last_sweep: Some(now()),
                found: vec!["pv1/7".into()],
                deleted: 0,
                foreign: 0,
            }),
            ..ProviderConfigStatus::default()
        };
        let outcome = core
            .follow(
                &state(previous.clone()),
                observed(serving(&provider, &settings)),
                no_proxies(),
            )
            .await;
        assert_eq!(provider.asked(), [Operation::Check]);
        assert_eq!(outcome.status.orphans, previous.orphans);
        assert_eq!(outcome.next, Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn without_the_proxies_to_compare_with_nothing_is_swept() {
        let core = reconciler();
        let provider = FakeProvider {
            vms: vec![vm("pv1/101", "gone")],
            ..FakeProvider::default()
        };
        let settings = sweep(SweepMode::Delete, 5);
        let outcome = core
            .follow(
                &state(Default::default()),
                observed(serving(&provider, &settings)),
                async { None },
            )
            .await;
        assert_eq!(provider.asked(), [Operation::Check]);
        assert_eq!(reasons(&outcome), ["SweepSkipped"]);
        assert!(outcome.status.orphans.is_none());
        assert_eq!(outcome.next, Duration::from_secs(5));
    }
}
