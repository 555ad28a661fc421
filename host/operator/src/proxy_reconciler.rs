//! The Proxy reconciler core, whatever holds the resources (a Kubernetes API server or a local
//! folder): given a Proxy as last written and what its references resolve to, make its VM exist
//! and run, and say what to write back and when to come again.
//!
//! It is level-triggered and idempotent: it reads the Proxy's status (the VM's provider ID, if
//! any) and the VM's state from the provider, never a history of events, so running it twice, or
//! after a restart, changes nothing that is already right. The adapters (`kube_mode`, `local`)
//! look up its references ([`Resolved::lookup`]), serialise calls for one Proxy, apply the
//! [`ProxyOutcome`], and requeue it. Every provider call goes through the [`ProviderCalls`] seam,
//! counted as the ProviderConfig reconciler's are, so its decisions are unit-tested over a fake
//! provider.
//!
//! Provider answers drive it as `docs/contract.md` says:
//!
//! | answer | what the reconciler does |
//! |---|---|
//! | `transient` | `Synced=False`, retry with exponential backoff and jitter |
//! | `permanent` | `Ready=False` with the message; the refused call is not repeated until the Proxy, its ProviderConfig (what it references included: its binding's revision) or the component changes; a VM it was about is read again at the resync |
//! | `not-found` from `get` | the VM is gone: create again |
//! | `quota-exceeded` | condition, retry slowly |
//! | state `paused` | reported and read again at the resync: a person paused it, the operator does not undo it |
//! | state `stopped` | per the Proxy's `recovery`: start it again (`create` adopts and starts a stopped VM of its own), or replace it, or only report it; rate-limited, and `Degraded` after `maxRestarts` within the window |
//! | state `failed` | delete, then create (unless `recovery.policy` is `None`), counted as above |
//! | deleting | delete the VM (by provider ID, or every VM tagged with the Proxy's UID); the finalizer stays while a hypervisor did not answer |
//!
//! The recovery rows are one pure decision, `recovery_decision`, and its actions.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use egress_runtime::types::{CreateRequest, ErrorClass, Placement, Request, Response, Vm, VmState};
use egress_runtime::{CallContext, CallError, Provider};
use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::bindings::{Binding, ProviderSet};
use crate::conditions::{self, NotReady, Stamp, condition};
use crate::crd::{
    EffectiveRecovery, HandledBy, Phase, ProxySpec, ProxyStatus, Recovery, RecoveryPolicy,
    RecoveryRecord,
};
use crate::health::{Prober, Verdict};
use crate::installation::Installation;
use crate::marks::{self, Owner, PROXY_UID_TAG, vm_name};
use crate::metrics::Metrics;
use crate::provider_calls::{Counted, ProviderCalls};
use crate::timing::{Timing, age, jitter};
use crate::{Note, Objects, lock};

/// A Proxy as the reconciler sees it.
#[derive(Clone, Debug, PartialEq)]
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
    /// Where its pool asks the provider to put a VM it makes; `None` for a Proxy of its own.
    pub placement: Option<Placement>,
    /// A ProxyPool owns it: a VM whose service fails its health check is reported, and the
    /// pool's remediation (at most `maxUnhealthy` at once) replaces it, not the Proxy's recovery.
    pub pooled: bool,
}

impl ProxyState {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What a Proxy's references resolve to. `P` answers the provider calls: the runtime's
/// [`Provider`] in the operator, a fake in unit tests.
pub struct Resolved<P = Provider> {
    /// Its ProviderConfig's binding.
    pub binding: Result<Arc<Binding<P>>, NotReady>,
    /// Its user-data.
    pub user_data: Result<String, NotReady>,
}

impl Resolved {
    /// The binding of `spec`'s ProviderConfig (when the adapter holds one of that name:
    /// `declared`) and its user-data from `objects` of `namespace`: the one lookup of both modes.
    pub fn lookup(
        spec: &ProxySpec,
        namespace: &str,
        declared: bool,
        providers: &ProviderSet,
        objects: &dyn Objects,
    ) -> Resolved {
        let name = &spec.provider_config_ref;
        let binding = match declared {
            true => providers.binding(name),
            false => Err(NotReady {
                reason: "ProviderConfigNotFound",
                message: format!("ProviderConfig {name} does not exist"),
            }),
        };
        Resolved {
            binding,
            user_data: user_data(spec, namespace, objects),
        }
    }
}

/// A Proxy's user-data, resolved from its spec in `namespace`.
fn user_data(spec: &ProxySpec, namespace: &str, objects: &dyn Objects) -> Result<String, NotReady> {
    let Some(source) = &spec.user_data else {
        return Ok(String::new());
    };
    let missing = |missing: crate::Missing, kind: &str, name: &str, key: &str| NotReady {
        reason: "UserDataNotFound",
        message: format!(
            "{} (the Proxy's user-data)",
            missing.describe(kind, namespace, name, key)
        ),
    };
    match (
        &source.inline,
        &source.secret_key_ref,
        &source.config_map_key_ref,
    ) {
        (Some(inline), None, None) => Ok(inline.clone()),
        (None, Some(secret), None) => {
            let bytes = objects
                .secret_value(namespace, &secret.name, &secret.key)
                .map_err(|m| missing(m, "Secret", &secret.name, &secret.key))?;
            String::from_utf8(bytes).map_err(|_| NotReady {
                reason: "InvalidUserData",
                message: format!(
                    "Secret {namespace}/{} key {} is not UTF-8",
                    secret.name, secret.key
                ),
            })
        }
        (None, None, Some(map)) => objects
            .config_map_value(namespace, &map.name, &map.key)
            .map_err(|m| missing(m, "ConfigMap", &map.name, &map.key)),
        _ => Err(NotReady {
            reason: "InvalidUserData",
            message: "userData must set exactly one of inline, secretKeyRef, configMapKeyRef"
                .into(),
        }),
    }
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

/// What one reconcile of a Proxy decided.
#[derive(Debug)]
pub struct ProxyOutcome {
    /// The status to write.
    pub status: ProxyStatus,
    /// When to come again.
    pub next: Next,
    /// Events to record on the Proxy.
    pub notes: Vec<Note>,
}

/// The Proxy reconciler: timing, per-Proxy retry counts, metrics. Shared by every reconcile.
#[derive(Debug)]
pub struct ProxyReconciler {
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
    /// The health checks of the VMs that run, by Proxy key.
    prober: Arc<Prober>,
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
    /// It is stopped.
    Stopped,
    /// It failed (crashed, panicked, or the hypervisor says so).
    Failed,
    /// It runs, but its service failed the health check past `failureThreshold`.
    Unhealthy,
}

impl Trouble {
    /// `stopped`, `failed` or `unhealthy`: the metric label and the word in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Trouble::Stopped => "stopped",
            Trouble::Failed => "failed",
            Trouble::Unhealthy => "unhealthy",
        }
    }

    /// The condition reason: `VMStopped`, `VMFailed` or `ServiceUnhealthy`.
    fn reason(self) -> &'static str {
        match self {
            Trouble::Stopped => "VMStopped",
            Trouble::Failed => "VMFailed",
            Trouble::Unhealthy => "ServiceUnhealthy",
        }
    }

    /// The phase while the VM is held in this trouble: an unhealthy VM still runs.
    fn phase(self) -> Phase {
        match self {
            Trouble::Stopped => Phase::Stopped,
            Trouble::Failed => Phase::Failed,
            Trouble::Unhealthy => Phase::Running,
        }
    }
}

/// A recovery that acts on the VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    /// Start the stopped VM again (`create` adopts and starts it).
    Restart,
    /// Delete the VM; the next pass makes a new one.
    Replace,
}

impl Act {
    /// `restart` or `replace`: the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Act::Restart => "restart",
            Act::Replace => "replace",
        }
    }

    fn verb(self) -> &'static str {
        match self {
            Act::Restart => "restarting",
            Act::Replace => "replacing",
        }
    }

    fn policy(self) -> RecoveryPolicy {
        match self {
            Act::Restart => RecoveryPolicy::Restart,
            Act::Replace => RecoveryPolicy::Replace,
        }
    }
}

/// What a VM found stopped or failed calls for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RecoveryDecision {
    /// Look again after `wait`. `then` is the recovery (and its number) the backoff since the
    /// last one holds back; `None` when a `create` of this pass answered the VM stopped (the
    /// provider could not start it).
    Wait {
        /// How long.
        wait: Duration,
        /// What comes after it, with its number within the window.
        then: Option<(Act, u32)>,
    },
    /// Left alone until a person starts the VM or changes the Proxy: `newly` after
    /// `maxRestarts` recoveries within the window, else Degraded at this generation already.
    Degrade {
        /// Whether this pass is the one that gives up.
        newly: bool,
        /// The recoveries within the window.
        tries: u32,
    },
    /// `recovery.policy: None`: reported, left to a person.
    LeaveAlone,
    /// Act now: recovery number `attempt` within the window.
    Recover {
        /// Restart or replace.
        act: Act,
        /// Its number within the window, from 1.
        attempt: u32,
    },
}

/// What [`recovery_decision`] decides from.
struct RecoveryCase<'a> {
    /// What the VM is in.
    trouble: Trouble,
    /// The Proxy's recovery settings over its ProviderConfig's and the defaults.
    recovery: &'a EffectiveRecovery,
    /// A `create` of this same pass answered the VM stopped: not recovered in a loop.
    just_made: bool,
    /// The Proxy's status as last written: its Ready condition says whether it went Degraded.
    written: &'a ProxyStatus,
    /// The Proxy's generation now.
    generation: i64,
    /// The time of this pass.
    now: &'a Time,
}

/// Decide what `case` calls for, calling nothing: the recovery table of the module docs. The
/// record is pruned to the window (cleared when a person changed a Degraded Proxy) and, for a
/// recovery that acts, counted.
fn recovery_decision(
    case: &RecoveryCase<'_>,
    record: &mut Recoveries,
    timing: &Timing,
) -> RecoveryDecision {
    let recovery = case.recovery;
    if case.just_made {
        let wait = timing.recovery_wait(&record.recent, recovery.backoff, case.now);
        let wait = wait.max(recovery.backoff);
        return RecoveryDecision::Wait { wait, then: None };
    }
    if degraded_since_change(case.written, case.generation) {
        let tries = record.recent.len() as u32;
        return RecoveryDecision::Degrade {
            newly: false,
            tries,
        };
    }
    if is_reason(case.written, conditions::READY, "Degraded") {
        // Degraded, then the Proxy changed: the person asks for a fresh start.
        record.recent.clear();
    }
    record
        .recent
        .retain(|at| age(case.now, at) < recovery.window);
    if recovery.policy == RecoveryPolicy::None {
        return RecoveryDecision::LeaveAlone;
    }
    let tries = record.recent.len() as u32;
    if tries >= recovery.max_restarts {
        return RecoveryDecision::Degrade { newly: true, tries };
    }
    // Only a stopped VM can be started again: a failed one, or one whose service fails while
    // it runs (the contract has no reboot), is replaced.
    let act = match (recovery.policy, case.trouble) {
        (RecoveryPolicy::Restart, Trouble::Stopped) => Act::Restart,
        _ => Act::Replace,
    };
    let wait = timing.recovery_wait(&record.recent, recovery.backoff, case.now);
    if !wait.is_zero() {
        return RecoveryDecision::Wait {
            wait,
            then: Some((act, tries + 1)),
        };
    }
    record.restarts = record.restarts.saturating_add(1);
    record.recent.push(case.now.clone());
    record.last = Some(RecoveryRecord {
        at: case.now.clone(),
        action: act.policy(),
        reason: case.trouble.as_str().into(),
    });
    RecoveryDecision::Recover {
        act,
        attempt: tries + 1,
    }
}

/// What the health check says of a running VM's service.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Service {
    /// The Proxy has no health check: running at an address is Ready.
    Unchecked,
    /// Passing.
    Healthy,
    /// Not passed yet, or nothing to probe: why.
    Pending(String),
    /// Failing past its threshold: why.
    Unhealthy(String),
}

impl ProxyReconciler {
    /// A reconciler of `installation` with `timing`, recording into `metrics`.
    pub fn new(installation: Installation, timing: Timing, metrics: Metrics) -> Self {
        ProxyReconciler {
            installation,
            timing,
            metrics,
            attempts: Mutex::new(HashMap::new()),
            permanent: Mutex::new(HashMap::new()),
            recoveries: Mutex::new(HashMap::new()),
            prober: Arc::new(Prober::default()),
        }
    }

    /// The VMs whose service it has the adapters probe (`Prober::probe_due`, every second).
    pub fn prober(&self) -> &Arc<Prober> {
        &self.prober
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
    pub async fn reconcile<P: ProviderCalls>(
        &self,
        proxy: &ProxyState,
        resolved: Resolved<P>,
    ) -> ProxyOutcome {
        let started = Instant::now();
        let outcome = if proxy.deleting {
            lock(&self.recoveries).remove(&proxy.uid);
            self.prober.forget(&proxy.key());
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

    async fn apply<P: ProviderCalls>(
        &self,
        proxy: &ProxyState,
        resolved: Resolved<P>,
    ) -> ProxyOutcome {
        let mut step = Step::new(proxy);
        let (binding, user_data) = match (resolved.binding, resolved.user_data) {
            (Ok(binding), Ok(user_data)) => (binding, user_data),
            (Err(why), _) | (_, Err(why)) => {
                return step.not_ready(why, self.timing.not_ready_retry);
            }
        };
        let pass = Pass {
            proxy,
            binding: &binding,
            user_data: &user_data,
        };
        let handled = &binding.handled_by;
        let latched = if blocked(&proxy.status, proxy.generation, Some(handled)) {
            Some(proxy.status.clone())
        } else {
            // The same, though the status given has not caught up with the one written.
            self.failed_permanently(proxy, handled)
        };
        if let Some(status) = latched {
            // Permanent, and nothing it depends on changed since: do not ask again. A VM the
            // answer was about is re-read at the resync, so a person who fixed it (resumed a
            // paused VM, say) is seen without changing any object.
            step.status = status;
            return match step.status.provider_id.clone() {
                Some(provider_id) => self.recheck(&pass, step, provider_id).await,
                None => step.finish(Next::AwaitChange),
            };
        }
        step.status.provider = Some(handled.clone());
        match proxy.status.provider_id.clone() {
            None => self.create(&pass, step).await,
            Some(provider_id) => self.observe(&pass, step, provider_id).await,
        }
    }

    async fn create<P: ProviderCalls>(&self, pass: &Pass<'_, P>, mut step: Step) -> ProxyOutcome {
        step.status.vm_name = Some(vm_name(&pass.proxy.uid));
        match self.call(pass, self.create_request(pass)).await {
            Ok(Response::Create(vm)) => {
                step.status.provider_id = Some(vm.provider_id.clone());
                step.status.installation = Some(self.installation.to_string());
                step.note(Note::normal(
                    "VMCreated",
                    format!("{} is {} at {}", vm.name, vm.state.as_str(), vm.provider_id),
                ));
                self.vm_observed(pass, step, vm, true).await
            }
            Ok(other) => self.unexpected(pass.proxy, step, &other),
            Err(error) => self.failed(pass.proxy, step, &error),
        }
    }

    async fn observe<P: ProviderCalls>(
        &self,
        pass: &Pass<'_, P>,
        mut step: Step,
        provider_id: String,
    ) -> ProxyOutcome {
        let proxy = pass.proxy;
        let request = Request::Get {
            config: pass.binding.config.clone(),
            provider_id: provider_id.clone(),
        };
        match self.call(pass, request).await {
            Ok(Response::Get(vm)) if vm.uid == proxy.uid => {
                if vm.state == VmState::Running
                    && proxy.status.installation.as_deref() != Some(self.installation.as_str())
                {
                    self.adopt(pass, &mut step, &vm).await;
                }
                self.vm_observed(pass, step, vm, false).await
            }
            Ok(Response::Get(vm)) => {
                // The ID now names a VM that is not this Proxy's (the hypervisor reused it).
                let why = format!(
                    "{provider_id} now carries another mark ({:?}); making a new VM",
                    vm.uid
                );
                self.gone(proxy, step, why)
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
    async fn adopt<P: ProviderCalls>(&self, pass: &Pass<'_, P>, step: &mut Step, vm: &Vm) {
        let proxy = pass.proxy;
        if vm.name != vm_name(&proxy.uid) {
            return;
        }
        match self.call(pass, self.create_request(pass)).await {
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
    async fn recheck<P: ProviderCalls>(
        &self,
        pass: &Pass<'_, P>,
        step: Step,
        provider_id: String,
    ) -> ProxyOutcome {
        let request = Request::Get {
            config: pass.binding.config.clone(),
            provider_id,
        };
        match self.call(pass, request).await {
            Ok(Response::Get(vm))
                if vm.uid == pass.proxy.uid
                    && vm.state == VmState::Running
                    && !vm.addresses.is_empty() =>
            {
                // Found running: `running` forgets the permanent failure.
                self.vm_observed(pass, step, vm, false).await
            }
            _ => step.finish(Next::After(self.resync(pass.binding))),
        }
    }

    /// Forget the VM: the next reconcile (now) creates one.
    fn gone(&self, proxy: &ProxyState, mut step: Step, why: String) -> ProxyOutcome {
        self.prober.forget(&proxy.key());
        step.status.provider_id = None;
        step.status.host = None;
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
    /// `create` of this same reconcile, which is not repeated at once. Boxed: a restart observes
    /// the VM it started, so this future holds itself.
    fn vm_observed<'s, P: ProviderCalls>(
        &'s self,
        pass: &'s Pass<'_, P>,
        mut step: Step,
        vm: Vm,
        just_made: bool,
    ) -> BoxFuture<'s, ProxyOutcome> {
        Box::pin(async move {
            step.status.vm_name = Some(vm.name.clone());
            if vm.host.is_some() {
                step.status.host = vm.host.clone();
            }
            if vm.created_at.is_some() {
                step.status.created_at = vm.created_at.clone();
            }
            step.synced(true, "Synced", "the provider answered");
            let answers = vm.state == VmState::Running && !vm.addresses.is_empty();
            if !answers {
                // Probed again from scratch once it runs at an address.
                self.prober.forget(&pass.proxy.key());
            }
            match vm.state {
                VmState::Running if answers => match self.service(pass, &mut step, &vm) {
                    Service::Unhealthy(_) if !pass.proxy.pooled => {
                        self.recover(pass, step, vm, Trouble::Unhealthy, false)
                            .await
                    }
                    service => self.running(pass, step, &vm, service),
                },
                VmState::Running | VmState::Provisioning => {
                    self.provisioning(pass.proxy, step, &vm)
                }
                VmState::Paused => self.paused(pass, step, &vm),
                VmState::Stopped => {
                    self.recover(pass, step, vm, Trouble::Stopped, just_made)
                        .await
                }
                VmState::Failed => {
                    self.recover(pass, step, vm, Trouble::Failed, just_made)
                        .await
                }
            }
        })
    }

    /// What the Proxy's health check says of the service of its VM, running at an address,
    /// written as `HealthCheckSucceeded`: the [`Prober`]'s verdict so far.
    fn service<P>(&self, pass: &Pass<'_, P>, step: &mut Step, vm: &Vm) -> Service {
        let key = pass.proxy.key();
        let Some(check) = &pass.proxy.spec.health_check else {
            self.prober.forget(&key);
            let conditions = &mut step.status.conditions;
            conditions.retain(|condition| condition.type_ != conditions::HEALTH_CHECK_SUCCEEDED);
            return Service::Unchecked;
        };
        // An address may come as `ip/prefix`; the first that is an IP address is probed.
        let address = vm.addresses.iter().find_map(|address| {
            let ip = address.split('/').next().unwrap_or_default();
            ip.parse::<IpAddr>().ok()
        });
        let Some(address) = address else {
            self.prober.forget(&key);
            let why = format!(
                "none of {}'s addresses ({}) is an IP address to probe",
                vm.provider_id,
                vm.addresses.join(", ")
            );
            step.set(conditions::HEALTH_CHECK_SUCCEEDED, false, "NoAddress", &why);
            return Service::Pending(why);
        };
        let now = step.stamp.now.0;
        let port = check.port();
        let written = &pass.proxy.status;
        let passed = written.provider_id.as_deref() == Some(vm.provider_id.as_str())
            && conditions::is_true(&written.conditions, conditions::HEALTH_CHECK_SUCCEEDED);
        let verdict = (self.prober).watch(&key, &vm.provider_id, address, check, now, passed);
        match verdict {
            Verdict::Starting => {
                let why = format!(
                    "waiting for the service at {address} port {port} to pass its health check"
                );
                step.set(conditions::HEALTH_CHECK_SUCCEEDED, false, "Starting", &why);
                Service::Pending(why)
            }
            Verdict::Healthy => {
                let why = format!("the service at {address} port {port} passes its health check");
                step.set(conditions::HEALTH_CHECK_SUCCEEDED, true, "Passing", &why);
                Service::Healthy
            }
            Verdict::Unhealthy { reason, .. } => {
                let why = format!("the service at {address} port {port}: {reason}");
                step.set(conditions::HEALTH_CHECK_SUCCEEDED, false, "Failing", &why);
                Service::Unhealthy(why)
            }
        }
    }

    fn running<P>(
        &self,
        pass: &Pass<'_, P>,
        mut step: Step,
        vm: &Vm,
        service: Service,
    ) -> ProxyOutcome {
        let became_ready = !conditions::is_true(&pass.proxy.status.conditions, conditions::READY);
        step.status.addresses = vm.addresses.clone();
        step.status.phase = Some(Phase::Running);
        let at = vm.addresses.join(", ");
        step.provisioned(true, "Running", &format!("{} runs", vm.provider_id));
        // Not Ready: why, and whether it is news worth a warning (a Ready proxy failing).
        let unready = match service {
            Service::Unchecked | Service::Healthy => None,
            Service::Pending(why) => Some(("HealthCheckPending", why, false)),
            Service::Unhealthy(why) => Some((
                "ServiceUnhealthy",
                format!("{why}; its ProxyPool's remediation replaces it"),
                !became_ready,
            )),
        };
        if let Some((reason, why, warn)) = unready {
            if warn {
                step.note(Note::warning(reason, why.clone()));
            }
            step.ready(false, reason, &why);
            return step.finish(Next::After(self.resync(pass.binding)));
        }
        step.ready(true, "Running", &format!("answers at {at}"));
        if became_ready {
            step.note(Note::normal(
                "Ready",
                format!("{} answers at {at}", vm.provider_id),
            ));
        }
        self.reset(pass.proxy);
        step.finish(Next::After(self.resync(pass.binding)))
    }

    fn provisioning(&self, proxy: &ProxyState, mut step: Step, vm: &Vm) -> ProxyOutcome {
        let (reason, why) = match vm.state {
            VmState::Running => (
                "WaitingForAddress",
                "the VM runs; its address is not known yet",
            ),
            _ => ("WaitingForVM", "the VM is being made or booted"),
        };
        step.status.addresses = vm.addresses.clone();
        step.status.phase = Some(Phase::Provisioning);
        step.provisioned(false, reason, why);
        step.ready(false, reason, why);
        let poll = self.poll_delay(proxy);
        step.finish(Next::After(poll))
    }

    /// A person paused or hibernated the VM: not the operator's to undo. It is read again at the
    /// resync and is Running again once resumed; no recovery counts.
    fn paused<P>(&self, pass: &Pass<'_, P>, mut step: Step, vm: &Vm) -> ProxyOutcome {
        let resync = self.resync(pass.binding);
        let why = format!(
            "{} is paused or hibernated: it runs again when resumed; looked at again every {}s",
            vm.provider_id,
            resync.as_secs()
        );
        let was_ready = conditions::is_true(&pass.proxy.status.conditions, conditions::READY);
        step.status.addresses.clear();
        step.status.phase = Some(Phase::Paused);
        step.provisioned(false, "VMPaused", &why);
        step.ready(false, "VMPaused", &why);
        if was_ready {
            step.note(Note::warning("VMPaused", why));
        }
        self.reset(pass.proxy);
        step.finish(Next::After(resync))
    }

    /// A VM found stopped or failed: restart it, replace it, or report it, as
    /// [`recovery_decision`] decides.
    async fn recover<P: ProviderCalls>(
        &self,
        pass: &Pass<'_, P>,
        mut step: Step,
        vm: Vm,
        trouble: Trouble,
        just_made: bool,
    ) -> ProxyOutcome {
        let proxy = pass.proxy;
        step.status.addresses.clear();
        let recovery =
            Recovery::effective(proxy.spec.recovery.as_ref(), pass.binding.recovery.as_ref());
        let now = step.stamp.now.clone();
        let case = RecoveryCase {
            trouble,
            recovery: &recovery,
            just_made,
            written: &proxy.status,
            generation: proxy.generation,
            now: &now,
        };
        let mut record = Recoveries::of(&step.status);
        let decision = recovery_decision(&case, &mut record, &self.timing);
        record.write(&mut step.status);
        let held = Held {
            id: &vm.provider_id,
            trouble,
            recovery: &recovery,
        };
        match decision {
            RecoveryDecision::Recover { act, attempt } => {
                self.act(pass, step, &held, act, attempt).await
            }
            RecoveryDecision::Wait { wait, then } => held.wait(step, wait, then),
            RecoveryDecision::LeaveAlone => self.leave_alone(pass, step, &held),
            RecoveryDecision::Degrade { newly: true, tries } => {
                self.degrade(pass, step, &held, tries)
            }
            RecoveryDecision::Degrade { newly: false, .. } => {
                // Latched until a person starts the VM (it is then found running) or edits the
                // Proxy: the status stays as written.
                step.status.phase = Some(Phase::Degraded);
                step.finish(Next::After(self.resync(pass.binding)))
            }
        }
    }

    /// `recovery.policy: None`: the VM is reported and left to a person.
    fn leave_alone<P>(&self, pass: &Pass<'_, P>, mut step: Step, held: &Held<'_>) -> ProxyOutcome {
        let why = format!(
            "{} is {}; recovery.policy is None, so it is left to a person",
            held.id,
            held.trouble.as_str()
        );
        held.report(&mut step, held.trouble.phase(), &why);
        if conditions::is_true(&pass.proxy.status.conditions, conditions::READY) {
            step.note(Note::warning(held.trouble.reason(), why));
        }
        self.reset(pass.proxy);
        step.finish(Next::After(self.resync(pass.binding)))
    }

    /// `maxRestarts` recoveries within the window: Degraded until a person acts.
    fn degrade<P>(
        &self,
        pass: &Pass<'_, P>,
        mut step: Step,
        held: &Held<'_>,
        tries: u32,
    ) -> ProxyOutcome {
        let word = held.trouble.as_str();
        let why = format!(
            "{} is {word} again after {tries} recoveries within {}s; left alone \
             (recovery.maxRestarts is {}): start it by hand or change the Proxy",
            held.id,
            held.recovery.window.as_secs(),
            held.recovery.max_restarts,
        );
        step.status.phase = Some(Phase::Degraded);
        step.provisioned(false, "Degraded", &why);
        step.ready(false, "Degraded", &why);
        step.note(Note::warning("Degraded", why));
        self.metrics
            .recovery(&pass.binding.provider_config, "degraded", word);
        self.reset(pass.proxy);
        step.finish(Next::After(self.resync(pass.binding)))
    }

    /// Restart or replace the VM now, counted.
    async fn act<P: ProviderCalls>(
        &self,
        pass: &Pass<'_, P>,
        mut step: Step,
        held: &Held<'_>,
        act: Act,
        attempt: u32,
    ) -> ProxyOutcome {
        let (id, word) = (held.id, held.trouble.as_str());
        let why = format!(
            "{id} was {word}; {} it (recovery {attempt} of {} within {}s)",
            act.verb(),
            held.recovery.max_restarts,
            held.recovery.window.as_secs()
        );
        self.metrics
            .recovery(&pass.binding.provider_config, act.as_str(), word);
        held.report(&mut step, Phase::Provisioning, &why);
        match act {
            Act::Restart => {
                step.note(Note::warning("VMRestarted", why));
                self.restart(pass, step).await
            }
            Act::Replace => {
                step.note(Note::warning("VMReplaced", why));
                self.replace(pass, step, held).await
            }
        }
    }

    /// Start the stopped VM: `create` adopts and starts a VM of this Proxy's.
    async fn restart<P: ProviderCalls>(&self, pass: &Pass<'_, P>, mut step: Step) -> ProxyOutcome {
        match self.call(pass, self.create_request(pass)).await {
            Ok(Response::Create(started)) => {
                step.status.provider_id = Some(started.provider_id.clone());
                step.status.installation = Some(self.installation.to_string());
                self.vm_observed(pass, step, started, true).await
            }
            Ok(other) => self.unexpected(pass.proxy, step, &other),
            Err(error) => self.failed(pass.proxy, step, &error),
        }
    }

    /// Delete the VM; the next pass makes a new one.
    async fn replace<P: ProviderCalls>(
        &self,
        pass: &Pass<'_, P>,
        step: Step,
        held: &Held<'_>,
    ) -> ProxyOutcome {
        let (id, word) = (held.id, held.trouble.as_str());
        let request = Request::Delete {
            config: pass.binding.config.clone(),
            provider_id: id.to_owned(),
        };
        match self.call(pass, request).await {
            Ok(_) => self.gone(pass.proxy, step, format!("{id} was {word} and was deleted")),
            Err(error) if error.class() == ErrorClass::NotFound => {
                self.gone(pass.proxy, step, format!("{id} was {word} and is gone"))
            }
            Err(error) => self.failed(pass.proxy, step, &error),
        }
    }

    /// How often a Proxy of `binding` that is fine is looked at again.
    fn resync<P>(&self, binding: &Binding<P>) -> Duration {
        binding.resync.unwrap_or(self.timing.resync)
    }

    /// A classified failure: what the class says to do.
    fn failed(&self, proxy: &ProxyState, mut step: Step, error: &CallError) -> ProxyOutcome {
        let message = error.to_string();
        match error.class() {
            ErrorClass::Permanent => {
                step.status.phase = Some(Phase::Failed);
                step.synced(false, "PermanentError", &message);
                step.ready(false, "PermanentError", &message);
                let handled = step.status.provider.as_ref();
                if !blocked(&proxy.status, proxy.generation, handled) {
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

    fn unexpected(&self, proxy: &ProxyState, step: Step, response: &Response) -> ProxyOutcome {
        let error = CallError::InvalidResult {
            operation: response.operation(),
            problem: "answered another operation".into(),
        };
        self.failed(proxy, step, &error)
    }

    /// Deletion: remove the VM (by provider ID, else every VM tagged with this Proxy's UID),
    /// then the finalizer may go. Idempotent: a VM already gone is done.
    async fn cleanup<P: ProviderCalls>(
        &self,
        proxy: &ProxyState,
        binding: Result<Arc<Binding<P>>, NotReady>,
    ) -> ProxyOutcome {
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
        let pass = Pass {
            proxy,
            binding: &binding,
            user_data: "",
        };
        let (targets, unanswered) = match self.cleanup_targets(&pass).await {
            Ok(found) => found,
            Err(error) => return self.failed(proxy, step, &error),
        };
        for provider_id in targets {
            let request = Request::Delete {
                config: binding.config.clone(),
                provider_id: provider_id.clone(),
            };
            match self.call(&pass, request).await {
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

    /// The VMs a cleanup deletes, and the hypervisors that did not answer while they were looked
    /// for: the recorded provider ID, else every VM tagged with the Proxy's UID (a create may
    /// have made a VM whose ID was never written).
    async fn cleanup_targets<P: ProviderCalls>(
        &self,
        pass: &Pass<'_, P>,
    ) -> Result<(Vec<String>, Vec<String>), CallError> {
        if let Some(provider_id) = &pass.proxy.status.provider_id {
            return Ok((vec![provider_id.clone()], Vec::new()));
        }
        let request = Request::ListByTag {
            config: pass.binding.config.clone(),
            key: PROXY_UID_TAG.into(),
            value: pass.proxy.uid.clone(),
        };
        match self.call(pass, request).await? {
            Response::ListByTag(listing) => {
                let targets = listing
                    .vms
                    .into_iter()
                    .filter(|vm| vm.uid == pass.proxy.uid)
                    .map(|vm| vm.provider_id)
                    .collect();
                Ok((targets, listing.unanswered))
            }
            other => Err(CallError::InvalidResult {
                operation: other.operation(),
                problem: "answered another operation".into(),
            }),
        }
    }

    /// One provider call for the Proxy of `pass`, counted and timed as every provider call is.
    async fn call<P: ProviderCalls>(
        &self,
        pass: &Pass<'_, P>,
        request: Request,
    ) -> Result<Response, CallError> {
        let counted = Counted {
            calls: pass.binding.provider.as_ref(),
            provider_config: &pass.binding.provider_config,
            metrics: &self.metrics,
            recordings: pass.binding.recordings.as_ref(),
        };
        let context = CallContext {
            subject: Some(pass.proxy.key()),
            ..CallContext::default()
        };
        counted.call(request, &context).await
    }

    fn create_request<P>(&self, pass: &Pass<'_, P>) -> Request {
        let proxy = pass.proxy;
        let owner = Owner {
            uid: &proxy.uid,
            proxy: &proxy.key(),
            provider_config: &pass.binding.provider_config,
            installation: &self.installation,
        };
        Request::Create {
            request: CreateRequest {
                name: vm_name(&proxy.uid),
                uid: proxy.uid.clone(),
                tags: marks::tags(&proxy.spec.tags, &owner),
                user_data: pass.user_data.to_owned(),
                config: pass.binding.config.clone(),
                placement: proxy.placement.clone(),
            },
        }
    }

    /// The wait before the next attempt after a transient failure: exponential, jittered.
    fn backoff(&self, proxy: &ProxyState) -> Duration {
        let attempt = self.bump(proxy);
        jitter(self.timing.exponential(self.timing.backoff_base, attempt))
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

/// One reconcile's Proxy and what its references resolved to.
struct Pass<'a, P> {
    proxy: &'a ProxyState,
    binding: &'a Binding<P>,
    user_data: &'a str,
}

/// A VM a recovery is about.
struct Held<'a> {
    id: &'a str,
    trouble: Trouble,
    recovery: &'a EffectiveRecovery,
}

impl Held<'_> {
    /// `phase`, and Provisioned and Ready false for the trouble's reason with `why`.
    fn report(&self, step: &mut Step, phase: Phase, why: &str) {
        step.status.phase = Some(phase);
        step.provisioned(false, self.trouble.reason(), why);
        step.ready(false, self.trouble.reason(), why);
    }

    /// Look again after `wait`: the provider could not start the VM (`then` is `None`), or the
    /// backoff holds the next recovery back.
    fn wait(&self, mut step: Step, wait: Duration, then: Option<(Act, u32)>) -> ProxyOutcome {
        let (id, word) = (self.id, self.trouble.as_str());
        let why = match then {
            None => format!("{id} is still {word} after a start"),
            Some((act, attempt)) => format!(
                "{id} is {word}; {} it in {}s (recovery {attempt} of {})",
                act.verb(),
                wait.as_secs_f64().ceil(),
                self.recovery.max_restarts
            ),
        };
        let phase = match self.trouble {
            Trouble::Unhealthy => Phase::Running,
            Trouble::Stopped | Trouble::Failed => Phase::Stopped,
        };
        self.report(&mut step, phase, &why);
        step.finish(Next::After(wait))
    }
}

/// A status being built for one reconcile.
struct Step {
    status: ProxyStatus,
    stamp: Stamp,
    notes: Vec<Note>,
}

impl Step {
    fn new(proxy: &ProxyState) -> Step {
        let mut status = proxy.status.clone();
        status.observed_generation = Some(proxy.generation);
        Step {
            status,
            stamp: Stamp::new(proxy.generation),
            notes: Vec::new(),
        }
    }

    fn set(&mut self, kind: &str, ok: bool, reason: &str, message: &str) {
        self.stamp
            .set(&mut self.status.conditions, kind, ok, reason, message);
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

    fn not_ready(mut self, why: NotReady, retry: Duration) -> ProxyOutcome {
        self.synced(false, why.reason, &why.message);
        self.ready(false, why.reason, &why.message);
        if self.status.provider_id.is_none() {
            self.status.phase = Some(Phase::Pending);
            self.provisioned(false, why.reason, &why.message);
        }
        self.finish(Next::After(retry))
    }

    fn finish(self, next: Next) -> ProxyOutcome {
        ProxyOutcome {
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

fn outcome_label(outcome: &ProxyOutcome) -> &'static str {
    match condition(&outcome.status.conditions, conditions::SYNCED) {
        Some(synced) if synced.status == "False" => "error",
        _ => match outcome.next {
            Next::After(_) | Next::Finalized => "success",
            Next::AwaitChange => "error",
        },
    }
}

#[cfg(test)]
mod tests;
