//! The one reconciler core, whatever holds the resources (a Kubernetes API server or a local
//! folder): given a Proxy as last written and what its references resolve to, make its VM exist
//! and run, and say what to write back and when to come again.
//!
//! It is level-triggered and idempotent: it reads the Proxy's status (the VM's provider ID, if
//! any) and the VM's state from the provider, never a history of events, so running it twice, or
//! after a restart, changes nothing that is already right. The adapters (`kube_mode`, `local`)
//! serialise calls for one Proxy, apply the [`Outcome`], and requeue it.
//!
//! Provider errors drive it as `docs/contract.md` says:
//!
//! | answer | what the reconciler does |
//! |---|---|
//! | `transient` | `Synced=False`, retry with exponential backoff and jitter |
//! | `permanent` | `Ready=False` with the message; no retry until the Proxy, its ProviderConfig or the component changes |
//! | `not-found` from `get` | the VM is gone: create again |
//! | `quota-exceeded` | condition, retry slowly |
//! | state `stopped` | per the Proxy's `recovery`: start it again (`create` adopts and starts a stopped VM of its own), or replace it, or only report it; rate-limited, and `Degraded` after `maxRestarts` within the window |
//! | state `failed` | delete, then create (unless `recovery.policy` is `None`), counted as above |
//! | deleting | delete the VM (by provider ID, or every VM tagged with the Proxy's UID), then let the finalizer go |

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egress_runtime::types::{
    CreateRequest, ErrorClass, Instance, InstanceState, Request, Response, Tag,
};
use egress_runtime::{CallContext, CallError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sha2::{Digest, Sha256};

use crate::conditions::{self, NotReady, condition, set_condition};
use crate::crd::{
    EffectiveRecovery, HandledBy, Phase, ProxySpec, ProxyStatus, Recovery, RecoveryPolicy,
    RecoveryRecord,
};
use crate::installation::{INSTALLATION_TAG, Installation};
use crate::metrics::Metrics;
use crate::providers::Binding;
use crate::{Note, lock, now};

/// The tag every VM carries with the UID of the Proxy it was made for (the ownership mark is the
/// UID itself; this tag finds the VM again without knowing its provider ID).
pub const PROXY_UID_TAG: &str = "egress-operator.io/proxy-uid";
/// The tag naming the ProviderConfig a VM was made through (the orphan sweep lists by it).
pub const PROVIDER_CONFIG_TAG: &str = "egress-operator.io/provider-config";
/// The tag naming the Proxy (`namespace/name`), for people.
pub const PROXY_TAG: &str = "egress-operator.io/proxy";

/// A Proxy as the reconciler sees it.
#[derive(Clone, Debug)]
pub struct ProxyState {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID: the ownership mark written on its VM.
    pub uid: String,
    /// Its spec generation.
    pub generation: i64,
    /// What it asks for.
    pub spec: ProxySpec,
    /// What was last written of it.
    pub status: ProxyStatus,
    /// Whether it is being deleted (its finalizer holds it).
    pub deleting: bool,
}

impl ProxyState {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What a Proxy's references resolve to, looked up by the adapter.
pub struct Resolved {
    /// Its ProviderConfig's binding.
    pub binding: Result<Arc<Binding>, NotReady>,
    /// Its user-data.
    pub user_data: Result<String, NotReady>,
}

/// When to reconcile a Proxy again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// After this long.
    After(Duration),
    /// Only when the Proxy, its ProviderConfig, a referenced object or the component changes.
    AwaitChange,
    /// Its deletion is complete: remove the finalizer.
    Finalized,
}

/// What one reconcile decided.
#[derive(Debug)]
pub struct Outcome {
    /// The status to write.
    pub status: ProxyStatus,
    /// When to come again.
    pub next: Next,
    /// Events to record on the Proxy.
    pub notes: Vec<Note>,
}

/// The reconciler's clock settings.
#[derive(Clone, Debug)]
pub struct Timing {
    /// How often a Proxy that is fine is looked at again (drift).
    pub resync: Duration,
    /// The first poll of a VM still provisioning; polls then slow down to `poll_max`.
    pub poll_min: Duration,
    /// The slowest poll of a VM still provisioning.
    pub poll_max: Duration,
    /// The first retry after a transient error; doubled each time, up to `backoff_max`.
    pub backoff_base: Duration,
    /// The longest retry wait.
    pub backoff_max: Duration,
    /// The retry after `quota-exceeded`.
    pub quota_retry: Duration,
    /// The retry while the ProviderConfig or user-data is missing (changes also trigger one).
    pub not_ready_retry: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            resync: Duration::from_secs(60),
            poll_min: Duration::from_secs(2),
            poll_max: Duration::from_secs(30),
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            quota_retry: Duration::from_secs(600),
            not_ready_retry: Duration::from_secs(60),
        }
    }
}

/// The reconciler: timing, per-Proxy retry counts, metrics. Shared by every reconcile.
#[derive(Debug)]
pub struct Reconciler {
    /// Named in every VM's mark.
    installation: Installation,
    timing: Timing,
    metrics: Metrics,
    /// Consecutive transient failures (or provisioning polls) per Proxy UID; reset on progress.
    attempts: Mutex<HashMap<String, u32>>,
    /// The status of each Proxy UID whose last reconcile failed permanently. A watch cache can
    /// hand the next reconcile a status older than the one just written; this one still says
    /// "do not ask again" then.
    permanent: Mutex<HashMap<String, ProxyStatus>>,
    /// The recovery record last written per Proxy UID, for the same reason: a stale status must
    /// not forget a restart and so restart once more than the limit allows.
    recoveries: Mutex<HashMap<String, Recoveries>>,
}

/// What a Proxy's status says of its recoveries.
#[derive(Clone, Debug, Default, PartialEq)]
struct Recoveries {
    restarts: u32,
    last: Option<RecoveryRecord>,
    recent: Vec<Time>,
}

impl Recoveries {
    fn of(status: &ProxyStatus) -> Recoveries {
        Recoveries {
            restarts: status.restarts,
            last: status.last_recovery.clone(),
            recent: status.recent_recoveries.clone(),
        }
    }

    fn write(self, status: &mut ProxyStatus) {
        status.restarts = self.restarts;
        status.last_recovery = self.last;
        status.recent_recoveries = self.recent;
    }
}

/// What a VM was found in that calls for a recovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trouble {
    Stopped,
    Failed,
}

impl Trouble {
    fn word(self) -> &'static str {
        match self {
            Trouble::Stopped => "stopped",
            Trouble::Failed => "failed",
        }
    }
}

impl Reconciler {
    /// A reconciler of `installation` with `timing`, recording into `metrics`.
    pub fn new(installation: Installation, timing: Timing, metrics: Metrics) -> Self {
        Reconciler {
            installation,
            timing,
            metrics,
            attempts: Mutex::new(HashMap::new()),
            permanent: Mutex::new(HashMap::new()),
            recoveries: Mutex::new(HashMap::new()),
        }
    }

    /// Its timing.
    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// Its metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Bring `proxy`'s VM in step with it.
    pub async fn reconcile(&self, proxy: &ProxyState, resolved: Resolved) -> Outcome {
        let started = Instant::now();
        let outcome = if proxy.deleting {
            lock(&self.recoveries).remove(&proxy.uid);
            self.cleanup(proxy, resolved.binding).await
        } else {
            let mut proxy = std::borrow::Cow::Borrowed(proxy);
            if let Some(written) = lock(&self.recoveries).get(&proxy.uid)
                && written.restarts > proxy.status.restarts
            {
                written.clone().write(&mut proxy.to_mut().status);
            }
            let outcome = self.apply(&proxy, resolved).await;
            let recoveries = Recoveries::of(&outcome.status);
            if recoveries.restarts > 0 {
                lock(&self.recoveries).insert(proxy.uid.clone(), recoveries);
            }
            outcome
        };
        self.metrics
            .reconciled("proxy", outcome_label(&outcome), started.elapsed());
        outcome
    }

    async fn apply(&self, proxy: &ProxyState, resolved: Resolved) -> Outcome {
        let mut step = Step::new(proxy);
        let binding = match resolved.binding {
            Ok(binding) => binding,
            Err(why) => return step.not_ready(why, self.timing.not_ready_retry),
        };
        let user_data = match resolved.user_data {
            Ok(user_data) => user_data,
            Err(why) => return step.not_ready(why, self.timing.not_ready_retry),
        };
        let handled = binding.handled_by();
        let latched = if blocked(&proxy.status, proxy.generation, Some(&handled)) {
            Some(proxy.status.clone())
        } else {
            // The same, though the status given has not caught up with the one written.
            self.failed_permanently(proxy, &handled)
        };
        if let Some(status) = latched {
            // Permanent, and nothing it depends on changed since: do not ask again. A VM the
            // answer was about is re-read at the resync, so a person who fixed it (resumed a
            // paused VM, say) is seen without changing any object.
            step.status = status;
            return match step.status.provider_id.clone() {
                Some(provider_id) => {
                    self.recheck(proxy, step, &binding, provider_id, &user_data)
                        .await
                }
                None => step.finish(Next::AwaitChange),
            };
        }
        step.status.provider = Some(handled);
        match proxy.status.provider_id.clone() {
            None => self.create(proxy, step, &binding, &user_data).await,
            Some(provider_id) => {
                self.observe(proxy, step, &binding, provider_id, &user_data)
                    .await
            }
        }
    }

    fn create_request(&self, proxy: &ProxyState, binding: &Binding, user_data: &str) -> Request {
        Request::Create {
            request: CreateRequest {
                name: vm_name(&proxy.uid),
                uid: proxy.uid.clone(),
                tags: tags(proxy, &binding.provider_config, &self.installation),
                user_data: user_data.to_owned(),
                config: binding.config.clone(),
            },
        }
    }

    async fn create(
        &self,
        proxy: &ProxyState,
        mut step: Step,
        binding: &Binding,
        user_data: &str,
    ) -> Outcome {
        step.status.vm_name = Some(vm_name(&proxy.uid));
        let request = self.create_request(proxy, binding, user_data);
        match self.call(binding, proxy, request).await {
            Ok(Response::Create(vm)) => {
                step.status.provider_id = Some(vm.provider_id.clone());
                step.status.installation = Some(self.installation.to_string());
                step.note(Note::normal(
                    "VMCreated",
                    format!("{} is {} at {}", vm.name, vm.state.as_str(), vm.provider_id),
                ));
                self.vm_observed(proxy, step, binding, vm, user_data, true)
                    .await
            }
            Ok(other) => self.unexpected(proxy, step, &other),
            Err(error) => self.failed(proxy, step, &error),
        }
    }

    async fn observe(
        &self,
        proxy: &ProxyState,
        mut step: Step,
        binding: &Binding,
        provider_id: String,
        user_data: &str,
    ) -> Outcome {
        let request = Request::Get {
            config: binding.config.clone(),
            provider_id: provider_id.clone(),
        };
        match self.call(binding, proxy, request).await {
            Ok(Response::Get(vm)) if vm.uid == proxy.uid => {
                if vm.state == InstanceState::Running
                    && proxy.status.installation.as_deref() != Some(self.installation.as_str())
                {
                    self.adopt(proxy, &mut step, binding, &vm, user_data).await;
                }
                self.vm_observed(proxy, step, binding, vm, user_data, false)
                    .await
            }
            Ok(Response::Get(vm)) => {
                // The ID now names a VM that is not this Proxy's (the hypervisor reused it).
                self.gone(
                    proxy,
                    step,
                    format!(
                        "{provider_id} now carries another mark ({:?}); making a new VM",
                        vm.uid
                    ),
                )
            }
            Ok(other) => self.unexpected(proxy, step, &other),
            Err(error) if error.class() == ErrorClass::NotFound => {
                step.note(Note::warning(
                    "VMGone",
                    format!("{provider_id} no longer exists; making a new VM"),
                ));
                self.gone(proxy, step, format!("{provider_id} is gone"))
            }
            Err(error) => self.failed(proxy, step, &error),
        }
    }

    /// Mark a running VM of this Proxy whose mark names no installation (made before marks
    /// did), or another (the installation was renamed), as this installation's: `create` with
    /// the same name and UID adopts it and writes the request's tags into its mark. Only a VM
    /// under the name create looks for, so the call can only find this one, never make a second.
    /// Best effort: a failure leaves the VM as it is (the sweep never deletes a VM without this
    /// installation's mark) and is tried again at the next look.
    async fn adopt(
        &self,
        proxy: &ProxyState,
        step: &mut Step,
        binding: &Binding,
        vm: &Instance,
        user_data: &str,
    ) {
        if vm.name != vm_name(&proxy.uid) {
            return;
        }
        let request = self.create_request(proxy, binding, user_data);
        match self.call(binding, proxy, request).await {
            Ok(Response::Create(adopted)) if adopted.uid == proxy.uid => {
                let before = match &proxy.status.installation {
                    Some(other) => format!("installation {other}"),
                    None => "no installation".into(),
                };
                step.status.provider_id = Some(adopted.provider_id.clone());
                step.status.installation = Some(self.installation.to_string());
                step.note(Note::normal(
                    "VMAdopted",
                    format!(
                        "{}'s mark named {before}; it now names this one ({})",
                        adopted.provider_id, self.installation
                    ),
                ));
            }
            Ok(other) => tracing::warn!(
                proxy = %proxy.key(),
                "marking {} as this installation's: create answered {:?}",
                vm.provider_id,
                other.operation()
            ),
            Err(error) => tracing::warn!(
                proxy = %proxy.key(),
                %error,
                "marking {} as this installation's failed; trying again at the next look",
                vm.provider_id
            ),
        }
    }

    /// A Proxy latched on a permanent answer about its VM: read the VM again; running at an
    /// address it is this Proxy's again (the latch is lifted), else the latch stays and the VM is
    /// read again at the next resync.
    async fn recheck(
        &self,
        proxy: &ProxyState,
        step: Step,
        binding: &Binding,
        provider_id: String,
        user_data: &str,
    ) -> Outcome {
        let request = Request::Get {
            config: binding.config.clone(),
            provider_id,
        };
        match self.call(binding, proxy, request).await {
            Ok(Response::Get(vm))
                if vm.uid == proxy.uid
                    && vm.state == InstanceState::Running
                    && !vm.addresses.is_empty() =>
            {
                lock(&self.permanent).remove(&proxy.uid);
                self.vm_observed(proxy, step, binding, vm, user_data, false)
                    .await
            }
            _ => step.finish(Next::After(self.resync(binding))),
        }
    }

    /// Forget the VM: the next reconcile (now) creates one.
    fn gone(&self, proxy: &ProxyState, mut step: Step, why: String) -> Outcome {
        step.status.provider_id = None;
        step.status.installation = None;
        step.status.addresses.clear();
        step.status.created_at = None;
        step.provisioned(false, "Recreating", &why);
        step.ready(false, "Recreating", &why);
        step.status.phase = Some(Phase::Provisioning);
        self.reset(proxy);
        step.finish(Next::After(Duration::ZERO))
    }

    /// Act on what the provider answered of the VM. `just_made` says the answer came from a
    /// `create` of this same reconcile, which is not repeated at once.
    async fn vm_observed(
        &self,
        proxy: &ProxyState,
        mut step: Step,
        binding: &Binding,
        vm: Instance,
        user_data: &str,
        just_made: bool,
    ) -> Outcome {
        step.status.vm_name = Some(vm.name.clone());
        if vm.created_at.is_some() {
            step.status.created_at = vm.created_at.clone();
        }
        step.synced(true, "Synced", "the provider answered");
        match vm.state {
            InstanceState::Running if !vm.addresses.is_empty() => {
                let became_ready =
                    !conditions::is_true(&proxy.status.conditions, conditions::READY);
                step.status.addresses = vm.addresses.clone();
                step.status.phase = Some(Phase::Running);
                let at = vm.addresses.join(", ");
                step.provisioned(true, "Running", &format!("{} runs", vm.provider_id));
                step.ready(true, "Running", &format!("answers at {at}"));
                if became_ready {
                    step.note(Note::normal(
                        "Ready",
                        format!("{} answers at {at}", vm.provider_id),
                    ));
                }
                self.reset(proxy);
                step.finish(Next::After(self.resync(binding)))
            }
            InstanceState::Running | InstanceState::Provisioning => {
                let waiting = if vm.state == InstanceState::Running {
                    (
                        "WaitingForAddress",
                        "the VM runs; its address is not known yet",
                    )
                } else {
                    ("WaitingForVM", "the VM is being made or booted")
                };
                step.status.addresses = vm.addresses.clone();
                step.status.phase = Some(Phase::Provisioning);
                step.provisioned(false, waiting.0, waiting.1);
                step.ready(false, waiting.0, waiting.1);
                let poll = self.poll_delay(proxy);
                step.finish(Next::After(poll))
            }
            InstanceState::Paused => {
                // A person paused or hibernated it: not the operator's to undo. It is read
                // again at the resync and is Running again once resumed; no recovery counts.
                let why = format!(
                    "{} is paused or hibernated: it runs again when resumed; looked at again every {}s",
                    vm.provider_id,
                    self.resync(binding).as_secs()
                );
                let was_ready = conditions::is_true(&proxy.status.conditions, conditions::READY);
                step.status.addresses.clear();
                step.status.phase = Some(Phase::Paused);
                step.provisioned(false, "VMPaused", &why);
                step.ready(false, "VMPaused", &why);
                if was_ready {
                    step.note(Note::warning("VMPaused", why));
                }
                self.reset(proxy);
                step.finish(Next::After(self.resync(binding)))
            }
            InstanceState::Stopped => {
                let recovery = self.recovery(proxy, binding, just_made);
                self.recover(
                    proxy,
                    step,
                    binding,
                    vm,
                    user_data,
                    Trouble::Stopped,
                    recovery,
                )
                .await
            }
            InstanceState::Failed => {
                let recovery = self.recovery(proxy, binding, just_made);
                self.recover(
                    proxy,
                    step,
                    binding,
                    vm,
                    user_data,
                    Trouble::Failed,
                    recovery,
                )
                .await
            }
        }
    }

    /// The Proxy's recovery settings; `None` for a VM that a `create` of this reconcile just
    /// answered stopped, which waits for the next pass rather than being recovered in a loop.
    fn recovery(
        &self,
        proxy: &ProxyState,
        binding: &Binding,
        just_made: bool,
    ) -> Option<EffectiveRecovery> {
        (!just_made)
            .then(|| Recovery::effective(proxy.spec.recovery.as_ref(), binding.recovery.as_ref()))
    }

    /// A VM found stopped or failed: restart it, replace it, or report it, as its recovery
    /// policy says, at most `max_restarts` times within the window, each after a growing wait.
    #[allow(clippy::too_many_arguments)]
    async fn recover(
        &self,
        proxy: &ProxyState,
        mut step: Step,
        binding: &Binding,
        vm: Instance,
        user_data: &str,
        trouble: Trouble,
        recovery: Option<EffectiveRecovery>,
    ) -> Outcome {
        let id = vm.provider_id.clone();
        step.status.addresses.clear();
        let was_ready = conditions::is_true(&proxy.status.conditions, conditions::READY);
        let reason = match trouble {
            Trouble::Stopped => "VMStopped",
            Trouble::Failed => "VMFailed",
        };
        let Some(recovery) = recovery else {
            // A create of this pass answered it stopped: the provider could not start it.
            let why = format!("{id} is still {} after a start", trouble.word());
            step.status.phase = Some(Phase::Stopped);
            step.provisioned(false, reason, &why);
            step.ready(false, reason, &why);
            let backoff =
                Recovery::effective(proxy.spec.recovery.as_ref(), binding.recovery.as_ref())
                    .backoff;
            let wait = self.recovery_wait(&step.status.recent_recoveries, backoff, now());
            return step.finish(Next::After(wait.max(backoff)));
        };
        let mut record = Recoveries::of(&step.status);
        if degraded_since_change(&proxy.status, proxy.generation) {
            // Latched until a person starts the VM (it is then found running) or edits the Proxy.
            step.status.phase = Some(Phase::Degraded);
            return step.finish(Next::After(self.resync(binding)));
        }
        if is_reason(&proxy.status, conditions::READY, "Degraded") {
            // Degraded, then the Proxy changed: the person asks for a fresh start.
            record.recent.clear();
        }
        let now_time = step.now.clone();
        record
            .recent
            .retain(|at| age(&now_time, at) < recovery.window);
        if recovery.policy == RecoveryPolicy::None {
            let why = format!(
                "{id} is {}; recovery.policy is None, so it is left to a person",
                trouble.word()
            );
            step.status.phase = Some(match trouble {
                Trouble::Stopped => Phase::Stopped,
                Trouble::Failed => Phase::Failed,
            });
            step.provisioned(false, reason, &why);
            step.ready(false, reason, &why);
            if was_ready {
                step.note(Note::warning(reason, why));
            }
            record.write(&mut step.status);
            self.reset(proxy);
            return step.finish(Next::After(self.resync(binding)));
        }
        let tries = record.recent.len() as u32;
        if tries >= recovery.max_restarts {
            let why = format!(
                "{id} is {} again after {tries} recoveries within {}s; left alone \
                 (recovery.maxRestarts is {}): start it by hand or change the Proxy",
                trouble.word(),
                recovery.window.as_secs(),
                recovery.max_restarts,
            );
            step.status.phase = Some(Phase::Degraded);
            step.provisioned(false, "Degraded", &why);
            step.ready(false, "Degraded", &why);
            step.note(Note::warning("Degraded", why));
            record.write(&mut step.status);
            self.metrics
                .recovery(&binding.provider_config, "degraded", trouble.word());
            self.reset(proxy);
            return step.finish(Next::After(self.resync(binding)));
        }
        let action = match (recovery.policy, trouble) {
            (RecoveryPolicy::Restart, Trouble::Stopped) => RecoveryPolicy::Restart,
            _ => RecoveryPolicy::Replace,
        };
        let verb = match action {
            RecoveryPolicy::Restart => "restarting",
            _ => "replacing",
        };
        let wait = self.recovery_wait(&record.recent, recovery.backoff, now());
        if !wait.is_zero() {
            let why = format!(
                "{id} is {}; {verb} it in {}s (recovery {} of {})",
                trouble.word(),
                wait.as_secs_f64().ceil(),
                tries + 1,
                recovery.max_restarts
            );
            step.status.phase = Some(Phase::Stopped);
            step.provisioned(false, reason, &why);
            step.ready(false, reason, &why);
            record.write(&mut step.status);
            return step.finish(Next::After(wait));
        }
        let why = format!(
            "{id} was {}; {verb} it (recovery {} of {} within {}s)",
            trouble.word(),
            tries + 1,
            recovery.max_restarts,
            recovery.window.as_secs()
        );
        record.restarts = record.restarts.saturating_add(1);
        record.recent.push(now_time.clone());
        record.last = Some(RecoveryRecord {
            at: now_time,
            action,
            reason: trouble.word().into(),
        });
        record.write(&mut step.status);
        let action_word = match action {
            RecoveryPolicy::Restart => "restart",
            _ => "replace",
        };
        self.metrics
            .recovery(&binding.provider_config, action_word, trouble.word());
        step.status.phase = Some(Phase::Provisioning);
        step.provisioned(false, reason, &why);
        step.ready(false, reason, &why);
        if action == RecoveryPolicy::Restart {
            step.note(Note::warning("VMRestarted", why));
            let request = self.create_request(proxy, binding, user_data);
            return match self.call(binding, proxy, request).await {
                Ok(Response::Create(started)) => {
                    step.status.provider_id = Some(started.provider_id.clone());
                    step.status.installation = Some(self.installation.to_string());
                    // Boxed: observing the VM is what led here.
                    Box::pin(self.vm_observed(proxy, step, binding, started, user_data, true)).await
                }
                Ok(other) => self.unexpected(proxy, step, &other),
                Err(error) => self.failed(proxy, step, &error),
            };
        }
        step.note(Note::warning("VMReplaced", why));
        let request = Request::Delete {
            config: binding.config.clone(),
            provider_id: id.clone(),
        };
        match self.call(binding, proxy, request).await {
            Ok(_) => self.gone(
                proxy,
                step,
                format!("{id} was {} and was deleted", trouble.word()),
            ),
            Err(error) if error.class() == ErrorClass::NotFound => self.gone(
                proxy,
                step,
                format!("{id} was {} and is gone", trouble.word()),
            ),
            Err(error) => self.failed(proxy, step, &error),
        }
    }

    /// How long until the next recovery may run: `base × 2^(n-1)` after the last of
    /// the `n` recoveries in `recent`, capped at `backoff_max`; zero when there are none.
    fn recovery_wait(&self, recent: &[Time], base: Duration, now: Time) -> Duration {
        let Some(last) = recent.last() else {
            return Duration::ZERO;
        };
        let count = recent.len() as u32;
        let spacing = base
            .saturating_mul(1u32 << (count - 1).min(16))
            .min(self.timing.backoff_max);
        spacing.saturating_sub(age(&now, last))
    }

    /// How often a Proxy of `binding` that is fine is looked at again.
    fn resync(&self, binding: &Binding) -> Duration {
        binding.resync.unwrap_or(self.timing.resync)
    }

    /// A classified failure: what the class says to do.
    fn failed(&self, proxy: &ProxyState, mut step: Step, error: &CallError) -> Outcome {
        let message = error.to_string();
        match error.class() {
            ErrorClass::Permanent => {
                step.status.phase = Some(Phase::Failed);
                step.synced(false, "PermanentError", &message);
                step.ready(false, "PermanentError", &message);
                if !blocked(
                    &proxy.status,
                    proxy.generation,
                    step.status.provider.as_ref(),
                ) {
                    step.note(Note::warning("PermanentError", message));
                }
                self.reset(proxy);
                lock(&self.permanent).insert(proxy.uid.clone(), step.status.clone());
                // Nothing retries the refused call until an object changes; a VM it was about
                // is read again at the resync (see `recheck`), so a person who fixed the VM
                // itself is seen too.
                match step.status.provider_id {
                    Some(_) => step.finish(Next::After(self.timing.resync)),
                    None => step.finish(Next::AwaitChange),
                }
            }
            ErrorClass::QuotaExceeded => {
                step.synced(false, "QuotaExceeded", &message);
                step.ready(false, "QuotaExceeded", &message);
                step.provisioned(false, "QuotaExceeded", &message);
                step.note(Note::warning("QuotaExceeded", message));
                step.finish(Next::After(self.timing.quota_retry))
            }
            ErrorClass::Transient | ErrorClass::NotFound => {
                step.synced(false, "TransientError", &message);
                if step.status.provider_id.is_none() {
                    step.provisioned(false, "Creating", &message);
                    step.status.phase.get_or_insert(Phase::Pending);
                }
                let wait = self.backoff(proxy);
                step.finish(Next::After(wait))
            }
        }
    }

    fn unexpected(&self, proxy: &ProxyState, step: Step, response: &Response) -> Outcome {
        let error = CallError::InvalidResult {
            operation: response.operation(),
            problem: "answered another operation".into(),
        };
        self.failed(proxy, step, &error)
    }

    /// Deletion: remove the VM (by provider ID, else every VM tagged with this Proxy's UID),
    /// then the finalizer may go. Idempotent: a VM already gone is done.
    async fn cleanup(
        &self,
        proxy: &ProxyState,
        binding: Result<Arc<Binding>, NotReady>,
    ) -> Outcome {
        let mut step = Step::new(proxy);
        step.status.phase = Some(Phase::Deleting);
        let binding = match binding {
            Ok(binding) => binding,
            Err(why) => {
                // Nothing can delete the VM without its provider: keep the finalizer and wait.
                let message = format!("cannot delete the VM yet: {}", why.message);
                step.synced(false, why.reason, &message);
                step.ready(false, "Deleting", &message);
                return step.finish(Next::After(self.timing.not_ready_retry));
            }
        };
        step.ready(false, "Deleting", "the Proxy is being deleted");
        let mut unanswered = Vec::new();
        let targets = match &proxy.status.provider_id {
            Some(provider_id) => vec![provider_id.clone()],
            None => {
                // A create may have made a VM whose ID was never written: find it by its tag.
                let request = Request::ListByTag {
                    config: binding.config.clone(),
                    key: PROXY_UID_TAG.into(),
                    value: proxy.uid.clone(),
                };
                match self.call(&binding, proxy, request).await {
                    Ok(Response::ListByTag(listing)) => {
                        unanswered = listing.unanswered;
                        listing
                            .instances
                            .into_iter()
                            .filter(|vm| vm.uid == proxy.uid)
                            .map(|vm| vm.provider_id)
                            .collect()
                    }
                    Ok(other) => return self.unexpected(proxy, step, &other),
                    Err(error) => return self.failed(proxy, step, &error),
                }
            }
        };
        for provider_id in targets {
            let request = Request::Delete {
                config: binding.config.clone(),
                provider_id: provider_id.clone(),
            };
            match self.call(&binding, proxy, request).await {
                Ok(_) => step.note(Note::normal("VMDeleted", format!("{provider_id} deleted"))),
                Err(error) if error.class() == ErrorClass::NotFound => {}
                Err(error) => return self.failed(proxy, step, &error),
            }
        }
        if !unanswered.is_empty() {
            // The VM may be on a hypervisor that did not answer: an unreachable one is never
            // read as "gone", so the finalizer stays until every one has answered.
            let why = format!(
                "{} did not answer; the VM may be there, so the Proxy waits for it",
                unanswered.join(", ")
            );
            step.synced(false, "HypervisorUnreachable", &why);
            let wait = self.backoff(proxy);
            return step.finish(Next::After(wait));
        }
        self.reset(proxy);
        step.status.provider_id = None;
        step.status.addresses.clear();
        step.finish(Next::Finalized)
    }

    /// One provider call, counted and timed.
    async fn call(
        &self,
        binding: &Binding,
        proxy: &ProxyState,
        request: Request,
    ) -> Result<Response, CallError> {
        let operation = request.operation();
        let started = Instant::now();
        let result = binding
            .provider
            .call(
                request,
                &CallContext {
                    proxy: Some(proxy.key()),
                },
            )
            .await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(error) => error.class().as_str(),
        };
        self.metrics.provider_call(
            &binding.provider_config,
            operation.as_str(),
            outcome,
            started.elapsed(),
        );
        result
    }

    /// The wait before the next attempt after a transient failure: `base × 2^n`, capped, with
    /// full jitter in its upper half (so a burst of failures does not retry in step).
    fn backoff(&self, proxy: &ProxyState) -> Duration {
        let attempt = self.bump(proxy);
        let ceiling = self
            .timing
            .backoff_base
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.timing.backoff_max);
        jitter(ceiling)
    }

    /// The wait before polling a VM that is still provisioning: quick at first, then slower.
    fn poll_delay(&self, proxy: &ProxyState) -> Duration {
        let attempt = self.bump(proxy);
        let delay = self
            .timing
            .poll_min
            .saturating_mul(1 + attempt / 4)
            .min(self.timing.poll_max);
        jitter(delay)
    }

    fn bump(&self, proxy: &ProxyState) -> u32 {
        let mut attempts = lock(&self.attempts);
        let count = attempts.entry(proxy.uid.clone()).or_insert(0);
        let current = *count;
        *count = count.saturating_add(1);
        current
    }

    /// Forget `proxy`'s retry count and permanent failure: it made progress, failed anew, or is
    /// gone.
    fn reset(&self, proxy: &ProxyState) {
        lock(&self.attempts).remove(&proxy.uid);
        lock(&self.permanent).remove(&proxy.uid);
    }

    /// The status this reconciler wrote when `proxy` last failed permanently, if nothing it
    /// depends on changed since (its generation, its provider); forgotten once something did.
    fn failed_permanently(&self, proxy: &ProxyState, handled: &HandledBy) -> Option<ProxyStatus> {
        let mut permanent = lock(&self.permanent);
        match permanent.get(&proxy.uid) {
            Some(status) if blocked(status, proxy.generation, Some(handled)) => {
                Some(status.clone())
            }
            Some(_) => {
                permanent.remove(&proxy.uid);
                None
            }
            None => None,
        }
    }
}

/// A status being built for one reconcile.
struct Step {
    status: ProxyStatus,
    generation: i64,
    now: Time,
    notes: Vec<Note>,
}

impl Step {
    fn new(proxy: &ProxyState) -> Step {
        let mut status = proxy.status.clone();
        status.observed_generation = Some(proxy.generation);
        Step {
            status,
            generation: proxy.generation,
            now: now(),
            notes: Vec::new(),
        }
    }

    fn set(&mut self, kind: &str, ok: bool, reason: &str, message: &str) {
        set_condition(
            &mut self.status.conditions,
            kind,
            ok,
            reason,
            message,
            Some(self.generation),
            &self.now,
        );
    }

    fn ready(&mut self, ok: bool, reason: &str, message: &str) {
        self.set(conditions::READY, ok, reason, message);
    }

    fn synced(&mut self, ok: bool, reason: &str, message: &str) {
        self.set(conditions::SYNCED, ok, reason, message);
    }

    fn provisioned(&mut self, ok: bool, reason: &str, message: &str) {
        self.set(conditions::PROVISIONED, ok, reason, message);
    }

    fn note(&mut self, note: Note) {
        self.notes.push(note);
    }

    fn not_ready(mut self, why: NotReady, retry: Duration) -> Outcome {
        self.synced(false, why.reason, &why.message);
        self.ready(false, why.reason, &why.message);
        if self.status.provider_id.is_none() {
            self.status.phase = Some(Phase::Pending);
            self.provisioned(false, why.reason, &why.message);
        }
        self.finish(Next::After(retry))
    }

    fn finish(self, next: Next) -> Outcome {
        Outcome {
            status: self.status,
            next,
            notes: self.notes,
        }
    }
}

/// Whether the Proxy failed permanently and nothing it depends on has changed since: the same
/// Proxy generation, and the same ProviderConfig generation and component digest (`handled`).
fn blocked(status: &ProxyStatus, generation: i64, handled: Option<&HandledBy>) -> bool {
    let Some(ready) = condition(&status.conditions, conditions::READY) else {
        return false;
    };
    ready.reason == "PermanentError"
        && ready.observed_generation == Some(generation)
        && status.provider.is_some()
        && status.provider.as_ref() == handled
}

fn is_reason(status: &ProxyStatus, kind: &str, reason: &str) -> bool {
    condition(&status.conditions, kind).is_some_and(|condition| condition.reason == reason)
}

/// Whether the Proxy went `Degraded` at this generation: it stays so until a person starts the
/// VM or changes the Proxy.
fn degraded_since_change(status: &ProxyStatus, generation: i64) -> bool {
    condition(&status.conditions, conditions::READY).is_some_and(|ready| {
        ready.reason == "Degraded" && ready.observed_generation == Some(generation)
    })
}

/// How long ago `then` was at `now` (zero if in the future).
fn age(now: &Time, then: &Time) -> Duration {
    Duration::try_from(now.0.duration_since(then.0)).unwrap_or(Duration::ZERO)
}

/// The VM's name for a Proxy: `proxy-` and 16 base32 characters of the UID's sha256, 22 in all
/// (a name Proxmox accepts, F10). Deterministic, so a retried create finds the VM it made, and
/// different for a Proxy deleted and made again (a new UID), whose old VM the sweep removes.
pub fn vm_name(uid: &str) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let digest = Sha256::digest(uid.as_bytes());
    let mut bits = 0u32;
    let mut bit_count = 0;
    let mut name = String::from("proxy-");
    for byte in digest {
        bits = (bits << 8) | u32::from(byte);
        bit_count += 8;
        while bit_count >= 5 && name.len() < 22 {
            bit_count -= 5;
            name.push(char::from(ALPHABET[((bits >> bit_count) & 31) as usize]));
        }
    }
    name
}

/// The tags a Proxy's VM carries: the spec's, then the operator's (which win).
fn tags(proxy: &ProxyState, provider_config: &str, installation: &Installation) -> Vec<Tag> {
    let mut tags: BTreeMap<String, String> = proxy.spec.tags.clone();
    tags.insert(PROXY_UID_TAG.into(), proxy.uid.clone());
    tags.insert(PROVIDER_CONFIG_TAG.into(), provider_config.into());
    tags.insert(INSTALLATION_TAG.into(), installation.to_string());
    tags.insert(PROXY_TAG.into(), proxy.key());
    tags.into_iter()
        .map(|(key, value)| Tag { key, value })
        .collect()
}

fn outcome_label(outcome: &Outcome) -> &'static str {
    match condition(&outcome.status.conditions, conditions::SYNCED) {
        Some(synced) if synced.status == "False" => "error",
        _ => match outcome.next {
            Next::After(_) | Next::Finalized => "success",
            Next::AwaitChange => "error",
        },
    }
}

/// A wait in `[ceiling / 2, ceiling]`.
fn jitter(ceiling: Duration) -> Duration {
    if ceiling.is_zero() {
        return ceiling;
    }
    let half = ceiling / 2;
    half + half.mul_f64(rand::random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_names_are_22_characters_deterministic_and_per_uid_f10() {
        let name = vm_name("6c1f0a2e-5d7b-4b8e-9a51-0d3c2f1e7a90");
        assert_eq!(name.len(), 22);
        assert!(name.starts_with("proxy-"));
        assert!(
            name[6..]
                .bytes()
                .all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b))
        );
        assert_eq!(name, vm_name("6c1f0a2e-5d7b-4b8e-9a51-0d3c2f1e7a90"));
        assert_ne!(name, vm_name("6c1f0a2e-5d7b-4b8e-9a51-0d3c2f1e7a91"));
    }

    fn at(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + seconds).unwrap())
    }

    #[test]
    fn recovery_settings_come_from_the_proxy_then_the_provider_config_then_the_defaults() {
        let defaults = Recovery::effective(None, None);
        assert_eq!(
            defaults,
            EffectiveRecovery {
                policy: RecoveryPolicy::Restart,
                max_restarts: 5,
                window: Duration::from_secs(900),
                backoff: Duration::from_secs(10),
            }
        );
        let provider = Recovery {
            policy: Some(RecoveryPolicy::Replace),
            max_restarts: Some(3),
            ..Recovery::default()
        };
        let proxy = Recovery {
            max_restarts: Some(1),
            backoff_seconds: Some(2),
            ..Recovery::default()
        };
        let effective = Recovery::effective(Some(&proxy), Some(&provider));
        assert_eq!(
            effective.policy,
            RecoveryPolicy::Replace,
            "from the ProviderConfig"
        );
        assert_eq!(effective.max_restarts, 1, "the Proxy's own");
        assert_eq!(effective.backoff, Duration::from_secs(2));
        assert_eq!(effective.window, Duration::from_secs(900), "the default");
    }

    #[test]
    fn each_recovery_waits_twice_as_long_as_the_last_capped() {
        let reconciler = Reconciler::new(
            Installation::new("test").unwrap(),
            Timing::default(),
            Metrics::default(),
        );
        let base = Duration::from_secs(10);
        assert_eq!(reconciler.recovery_wait(&[], base, at(0)), Duration::ZERO);
        assert_eq!(
            reconciler.recovery_wait(&[at(0)], base, at(4)),
            Duration::from_secs(6)
        );
        let three = [at(0), at(10), at(30)];
        assert_eq!(
            reconciler.recovery_wait(&three, base, at(40)),
            Duration::from_secs(30),
            "40 s after the third"
        );
        assert_eq!(
            reconciler.recovery_wait(&three, base, at(99)),
            Duration::ZERO
        );
        let twelve: Vec<Time> = (0..12).map(at).collect();
        assert_eq!(
            reconciler.recovery_wait(&twelve, base, at(11)),
            Timing::default().backoff_max,
            "capped"
        );
    }

    #[test]
    fn degraded_holds_until_the_proxy_changes() {
        let mut status = ProxyStatus::default();
        set_condition(
            &mut status.conditions,
            conditions::READY,
            false,
            "Degraded",
            "stopped again",
            Some(4),
            &at(0),
        );
        assert!(degraded_since_change(&status, 4));
        assert!(
            !degraded_since_change(&status, 5),
            "a new spec starts afresh"
        );
        set_condition(
            &mut status.conditions,
            conditions::READY,
            true,
            "Running",
            "answers",
            Some(4),
            &at(1),
        );
        assert!(!degraded_since_change(&status, 4), "running again");
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        for _ in 0..100 {
            let wait = jitter(Duration::from_secs(8));
            assert!(
                (Duration::from_secs(4)..=Duration::from_secs(8)).contains(&wait),
                "{wait:?}"
            );
        }
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
    }
}
