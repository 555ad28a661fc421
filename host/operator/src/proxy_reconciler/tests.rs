//! The Proxy reconciler's decisions over a fake provider: every row of the table in the module
//! docs, the recovery decision on its own, and the rules that keep a VM from being lost or stolen.

use std::collections::BTreeMap;
use std::sync::Mutex;

use egress_runtime::types::{Listing, Operation, ProviderError};

use super::*;
use crate::bindings::Source;
use crate::conditions::set_condition;
use crate::crd::OrphanSweep;

const INSTALLED: &str = "cluster-a";
const UID: &str = "uid-1";

/// A hypervisor in memory behind the contract: `create` makes a VM (or adopts and starts this
/// Proxy's VM of the same name), `get`, `delete` and `list-by-tag` read and change them. Errors
/// queued per operation are answered first, once each.
struct FakeProvider {
    vms: Mutex<BTreeMap<String, Vm>>,
    /// The state `create` leaves a VM in (with an address when running).
    created: VmState,
    /// Answered instead, in order, by operation.
    errors: Mutex<Vec<(Operation, ProviderError)>>,
    /// The hypervisors every listing says did not answer.
    unanswered: Vec<String>,
    asked: Mutex<Vec<Operation>>,
    /// The placement each `create` asked for.
    placements: Mutex<Vec<Option<Placement>>>,
}

impl Default for FakeProvider {
    fn default() -> Self {
        FakeProvider {
            vms: Mutex::default(),
            created: VmState::Running,
            errors: Mutex::default(),
            unanswered: Vec::new(),
            asked: Mutex::default(),
            placements: Mutex::default(),
        }
    }
}

impl FakeProvider {
    fn with_vm(self, provider_id: &str, uid: &str, state: VmState) -> Self {
        let vm = Vm {
            provider_id: provider_id.into(),
            name: vm_name(uid),
            state,
            addresses: match state {
                VmState::Running => vec!["192.0.2.7".into()],
                _ => Vec::new(),
            },
            created_at: None,
            uid: uid.into(),
            host: None,
        };
        lock(&self.vms).insert(provider_id.into(), vm);
        self
    }

    fn failing(self, operation: Operation, error: ProviderError) -> Self {
        lock(&self.errors).push((operation, error));
        self
    }

    /// A person (or the hypervisor) changed the VM.
    fn set_state(&self, provider_id: &str, state: VmState) {
        let mut vms = lock(&self.vms);
        let vm = vms.get_mut(provider_id).expect("the VM is there");
        vm.state = state;
        vm.addresses.clear();
    }

    fn asked(&self) -> Vec<Operation> {
        lock(&self.asked).clone()
    }

    fn vm(&self, provider_id: &str) -> Option<Vm> {
        lock(&self.vms).get(provider_id).cloned()
    }

    fn answer(&self, request: Request) -> Result<Response, ProviderError> {
        let mut vms = lock(&self.vms);
        match request {
            Request::Create { request } => {
                lock(&self.placements).push(request.placement.clone());
                let found = vms.values_mut().find(|vm| vm.name == request.name);
                let vm = match found {
                    Some(vm) => vm,
                    None => {
                        let provider_id = format!("vm-{}", vms.len() + 100);
                        let vm = Vm {
                            provider_id: provider_id.clone(),
                            name: request.name.clone(),
                            state: VmState::Provisioning,
                            addresses: Vec::new(),
                            created_at: None,
                            uid: request.uid.clone(),
                            host: Some("hv-1".into()),
                        };
                        vms.entry(provider_id).or_insert(vm)
                    }
                };
                vm.state = self.created;
                if self.created == VmState::Running {
                    vm.addresses = vec!["192.0.2.7".into()];
                }
                Ok(Response::Create(vm.clone()))
            }
            Request::Get { provider_id, .. } => match vms.get(&provider_id) {
                Some(vm) => Ok(Response::Get(vm.clone())),
                None => Err(ProviderError::NotFound(provider_id)),
            },
            Request::Delete { provider_id, .. } => match vms.remove(&provider_id) {
                Some(_) => Ok(Response::Delete),
                None => Err(ProviderError::NotFound(provider_id)),
            },
            Request::ListByTag { key, value, .. } => {
                assert_eq!(key, PROXY_UID_TAG, "a Proxy lists its VMs by its UID");
                let instances = vms.values().filter(|vm| vm.uid == value).cloned();
                Ok(Response::ListByTag(Listing {
                    // A provider lists by tag; one with the tag forged is still filtered by mark.
                    vms: instances.chain(vms.get("forged").cloned()).collect(),
                    unanswered: self.unanswered.clone(),
                }))
            }
            other => panic!("not a Proxy call: {:?}", other.operation()),
        }
    }
}

impl ProviderCalls for FakeProvider {
    async fn call(&self, request: Request, _: &CallContext) -> Result<Response, CallError> {
        let operation = request.operation();
        lock(&self.asked).push(operation);
        let queued = {
            let mut errors = lock(&self.errors);
            let at = errors.iter().position(|(op, _)| *op == operation);
            at.map(|at| errors.remove(at).1)
        };
        match queued {
            Some(error) => Err(CallError::Provider(error)),
            None => self.answer(request).map_err(CallError::Provider),
        }
    }
}

fn reconciler() -> ProxyReconciler {
    ProxyReconciler::new(
        Installation::new(INSTALLED).unwrap(),
        Timing::default(),
        Metrics::default(),
    )
}

fn binding(fake: FakeProvider, recovery: Option<Recovery>) -> Arc<Binding<FakeProvider>> {
    Arc::new(Binding {
        provider_config: "lab".into(),
        generation: 1,
        provider: Arc::new(fake),
        source: Source::File("fake.wasm".into()),
        config: "{}".into(),
        sweep: OrphanSweep::default(),
        recovery,
        resync: None,
        revision: 1,
        handled_by: HandledBy {
            provider_config: "lab".into(),
            provider_config_generation: 1,
            provider_config_revision: 1,
            name: "fake".into(),
            version: "0.1.0".into(),
            digest: format!("sha256:{}", "0".repeat(64)),
        },
        recordings: None,
    })
}

fn proxy(status: ProxyStatus) -> ProxyState {
    ProxyState {
        namespace: "default".into(),
        name: "p".into(),
        uid: UID.into(),
        generation: 1,
        spec: ProxySpec {
            provider_config_ref: "lab".into(),
            user_data: None,
            tags: BTreeMap::new(),
            recovery: None,
            health_check: None,
        },
        status,
        deleting: false,
        placement: None,
        pooled: false,
    }
}

/// A status that records VM `provider_id` as this installation's.
fn with_vm(provider_id: &str) -> ProxyStatus {
    ProxyStatus {
        provider_id: Some(provider_id.into()),
        installation: Some(INSTALLED.into()),
        ..ProxyStatus::default()
    }
}

fn resolved(binding: &Arc<Binding<FakeProvider>>) -> Resolved<FakeProvider> {
    Resolved {
        binding: Ok(Arc::clone(binding)),
        user_data: Ok(String::new()),
    }
}

fn reason(outcome: &ProxyOutcome, kind: &str) -> String {
    condition(&outcome.status.conditions, kind)
        .map(|condition| condition.reason.clone())
        .unwrap_or_default()
}

fn noted(outcome: &ProxyOutcome) -> Vec<&str> {
    outcome
        .notes
        .iter()
        .map(|note| note.reason.as_str())
        .collect()
}

fn at(seconds: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + seconds).unwrap())
}

// The recovery decision, on its own.

fn restart_policy(policy: RecoveryPolicy) -> EffectiveRecovery {
    EffectiveRecovery {
        policy,
        max_restarts: 3,
        window: Duration::from_secs(900),
        backoff: Duration::from_secs(10),
    }
}

fn decide(
    trouble: Trouble,
    recovery: &EffectiveRecovery,
    written: &ProxyStatus,
    record: &mut Recoveries,
) -> RecoveryDecision {
    let now = at(1000);
    let case = RecoveryCase {
        trouble,
        recovery,
        just_made: false,
        written,
        generation: 2,
        now: &now,
    };
    recovery_decision(&case, record, &Timing::default())
}

fn ready_reason(reason: &str, generation: i64) -> ProxyStatus {
    let mut status = ProxyStatus::default();
    set_condition(
        &mut status.conditions,
        conditions::READY,
        false,
        reason,
        "…",
        Some(generation),
        &at(0),
    );
    status
}

#[test]
fn a_stopped_vm_under_restart_is_restarted_and_the_recovery_counted() {
    let mut record = Recoveries::default();
    let recovery = restart_policy(RecoveryPolicy::Restart);
    let decision = decide(
        Trouble::Stopped,
        &recovery,
        &ProxyStatus::default(),
        &mut record,
    );
    assert_eq!(
        decision,
        RecoveryDecision::Recover {
            act: Act::Restart,
            attempt: 1
        }
    );
    assert_eq!(record.restarts, 1);
    assert_eq!(record.recent, vec![at(1000)]);
    let last = record.last.expect("the recovery is recorded");
    assert_eq!(
        (last.action, last.reason.as_str()),
        (RecoveryPolicy::Restart, "stopped")
    );
}

#[test]
fn a_failed_vm_is_replaced_even_where_the_policy_is_restart() {
    let mut record = Recoveries::default();
    let recovery = restart_policy(RecoveryPolicy::Restart);
    let decision = decide(
        Trouble::Failed,
        &recovery,
        &ProxyStatus::default(),
        &mut record,
    );
    assert_eq!(
        decision,
        RecoveryDecision::Recover {
            act: Act::Replace,
            attempt: 1
        }
    );
    assert_eq!(record.last.unwrap().action, RecoveryPolicy::Replace);
}

#[test]
fn a_stopped_vm_under_replace_is_replaced() {
    let mut record = Recoveries::default();
    let recovery = restart_policy(RecoveryPolicy::Replace);
    let decision = decide(
        Trouble::Stopped,
        &recovery,
        &ProxyStatus::default(),
        &mut record,
    );
    assert_eq!(
        decision,
        RecoveryDecision::Recover {
            act: Act::Replace,
            attempt: 1
        }
    );
}

#[test]
fn under_policy_none_a_stopped_or_failed_vm_is_left_to_a_person_and_nothing_counts() {
    let recovery = restart_policy(RecoveryPolicy::None);
    for trouble in [Trouble::Stopped, Trouble::Failed] {
        let mut record = Recoveries::default();
        let decision = decide(trouble, &recovery, &ProxyStatus::default(), &mut record);
        assert_eq!(decision, RecoveryDecision::LeaveAlone, "{trouble:?}");
        assert_eq!(record, Recoveries::default(), "nothing counted");
    }
}

#[test]
fn the_next_recovery_waits_out_the_backoff_doubled_per_recovery_in_the_window() {
    let recovery = restart_policy(RecoveryPolicy::Restart);
    let mut record = Recoveries {
        restarts: 1,
        recent: vec![at(996)],
        ..Recoveries::default()
    };
    let decision = decide(
        Trouble::Stopped,
        &recovery,
        &ProxyStatus::default(),
        &mut record,
    );
    assert_eq!(
        decision,
        RecoveryDecision::Wait {
            wait: Duration::from_secs(6),
            then: Some((Act::Restart, 2))
        },
        "10 s after the first, 4 s gone"
    );
    assert_eq!(record.restarts, 1, "a wait counts nothing");
    let mut two = Recoveries {
        restarts: 2,
        recent: vec![at(970), at(990)],
        ..Recoveries::default()
    };
    let decision = decide(
        Trouble::Stopped,
        &recovery,
        &ProxyStatus::default(),
        &mut two,
    );
    assert_eq!(
        decision,
        RecoveryDecision::Wait {
            wait: Duration::from_secs(10),
            then: Some((Act::Restart, 3))
        },
        "20 s after the second"
    );
}

#[test]
fn max_restarts_within_the_window_degrades() {
    let recovery = restart_policy(RecoveryPolicy::Restart);
    let mut record = Recoveries {
        restarts: 3,
        recent: vec![at(200), at(400), at(800)],
        ..Recoveries::default()
    };
    let decision = decide(
        Trouble::Stopped,
        &recovery,
        &ProxyStatus::default(),
        &mut record,
    );
    assert_eq!(
        decision,
        RecoveryDecision::Degrade {
            newly: true,
            tries: 3
        }
    );
    assert_eq!(record.restarts, 3, "giving up is not a recovery");
}

#[test]
fn recoveries_older_than_the_window_no_longer_count() {
    let recovery = restart_policy(RecoveryPolicy::Restart);
    let mut record = Recoveries {
        restarts: 3,
        recent: vec![at(0), at(50), at(99)],
        ..Recoveries::default()
    };
    let decision = decide(
        Trouble::Stopped,
        &recovery,
        &ProxyStatus::default(),
        &mut record,
    );
    assert_eq!(
        decision,
        RecoveryDecision::Recover {
            act: Act::Restart,
            attempt: 1
        },
        "all three are more than 900 s old at 1000"
    );
    assert_eq!(record.recent, vec![at(1000)]);
    assert_eq!(record.restarts, 4, "the total keeps counting");
}

#[test]
fn a_degraded_proxy_stays_degraded_until_it_changes() {
    let recovery = restart_policy(RecoveryPolicy::Restart);
    let mut record = Recoveries {
        restarts: 3,
        recent: vec![at(100), at(400), at(800)],
        ..Recoveries::default()
    };
    let written = ready_reason("Degraded", 2);
    let decision = decide(Trouble::Stopped, &recovery, &written, &mut record);
    assert_eq!(
        decision,
        RecoveryDecision::Degrade {
            newly: false,
            tries: 3
        }
    );
}

#[test]
fn a_degraded_proxy_a_person_changed_starts_afresh() {
    let recovery = restart_policy(RecoveryPolicy::Restart);
    let mut record = Recoveries {
        restarts: 3,
        recent: vec![at(700), at(800), at(900)],
        ..Recoveries::default()
    };
    let written = ready_reason("Degraded", 1);
    let decision = decide(Trouble::Stopped, &recovery, &written, &mut record);
    assert_eq!(
        decision,
        RecoveryDecision::Recover {
            act: Act::Restart,
            attempt: 1
        },
        "generation 2 is a change made after it went Degraded at 1"
    );
}

#[test]
fn a_vm_a_create_of_this_pass_left_stopped_waits_at_least_the_backoff_uncounted() {
    let recovery = restart_policy(RecoveryPolicy::Restart);
    let mut record = Recoveries::default();
    let now = at(1000);
    let case = RecoveryCase {
        trouble: Trouble::Stopped,
        recovery: &recovery,
        just_made: true,
        written: &ProxyStatus::default(),
        generation: 2,
        now: &now,
    };
    let decision = recovery_decision(&case, &mut record, &Timing::default());
    assert_eq!(
        decision,
        RecoveryDecision::Wait {
            wait: Duration::from_secs(10),
            then: None
        }
    );
    assert_eq!(record, Recoveries::default());
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
fn degraded_holds_until_the_proxy_changes() {
    let mut status = ready_reason("Degraded", 4);
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

// Whole reconciles over the fake provider.

#[tokio::test]
async fn a_proxy_without_a_vm_gets_one_made_and_is_ready_at_its_address_with_the_call_counted() {
    let core = reconciler();
    let bound = binding(FakeProvider::default(), None);
    let outcome = core
        .reconcile(&proxy(ProxyStatus::default()), resolved(&bound))
        .await;
    assert_eq!(bound.provider.asked(), vec![Operation::Create]);
    assert_eq!(outcome.status.provider_id.as_deref(), Some("vm-100"));
    assert_eq!(outcome.status.installation.as_deref(), Some(INSTALLED));
    assert_eq!(outcome.status.addresses, vec!["192.0.2.7".to_owned()]);
    assert_eq!(outcome.status.phase, Some(Phase::Running));
    assert!(conditions::is_true(
        &outcome.status.conditions,
        conditions::READY
    ));
    assert_eq!(outcome.next, Next::After(Timing::default().resync));
    assert_eq!(noted(&outcome), ["VMCreated", "Ready"]);
    assert_eq!(core.metrics.calls("lab", "create", "ok"), 1);
    let made = bound.provider.vm("vm-100").unwrap();
    assert_eq!(made.uid, UID, "the VM carries the Proxy's UID");
    assert_eq!(
        outcome.status.host.as_deref(),
        Some("hv-1"),
        "where it runs"
    );
    assert_eq!(
        *lock(&bound.provider.placements),
        [None],
        "a Proxy of its own"
    );
}

#[tokio::test]
async fn a_pool_members_placement_request_reaches_the_provider() {
    let core = reconciler();
    let bound = binding(FakeProvider::default(), None);
    let asked = Placement {
        avoid_hosts: vec!["hv-2".into()],
        required: true,
    };
    let member = ProxyState {
        placement: Some(asked.clone()),
        ..proxy(ProxyStatus::default())
    };
    core.reconcile(&member, resolved(&bound)).await;
    assert_eq!(*lock(&bound.provider.placements), [Some(asked)]);
}

#[tokio::test]
async fn a_transient_error_is_synced_false_and_retried_after_a_growing_jittered_wait() {
    let core = reconciler();
    let fake = FakeProvider::default()
        .failing(Operation::Create, ProviderError::Transient("busy".into()))
        .failing(Operation::Create, ProviderError::Transient("busy".into()));
    let bound = binding(fake, None);
    let first = core
        .reconcile(&proxy(ProxyStatus::default()), resolved(&bound))
        .await;
    assert_eq!(reason(&first, conditions::SYNCED), "TransientError");
    assert_eq!(first.status.phase, Some(Phase::Pending));
    let Next::After(wait) = first.next else {
        panic!("{:?}", first.next)
    };
    assert!((Duration::from_millis(500)..=Duration::from_secs(1)).contains(&wait));
    let second = core.reconcile(&proxy(first.status), resolved(&bound)).await;
    let Next::After(wait) = second.next else {
        panic!("{:?}", second.next)
    };
    assert!(
        (Duration::from_secs(1)..=Duration::from_secs(2)).contains(&wait),
        "doubled"
    );
    assert_eq!(core.metrics.calls("lab", "create", "transient"), 2);
}

#[tokio::test]
async fn progress_forgets_the_failures_so_the_next_transient_wait_starts_from_the_base() {
    let core = reconciler();
    let busy = || ProviderError::Transient("busy".into());
    let fake = FakeProvider::default()
        .failing(Operation::Create, busy())
        .failing(Operation::Create, busy())
        .failing(Operation::Create, busy());
    let bound = binding(fake, None);
    let mut status = ProxyStatus::default();
    for _ in 0..3 {
        status = core
            .reconcile(&proxy(status), resolved(&bound))
            .await
            .status;
    }
    let made = core.reconcile(&proxy(status), resolved(&bound)).await;
    assert_eq!(made.status.phase, Some(Phase::Running));
    lock(&bound.provider.errors).push((Operation::Get, busy()));
    let after = core.reconcile(&proxy(made.status), resolved(&bound)).await;
    assert_eq!(reason(&after, conditions::SYNCED), "TransientError");
    let Next::After(wait) = after.next else {
        panic!("{:?}", after.next)
    };
    assert!(
        (Duration::from_millis(500)..=Duration::from_secs(1)).contains(&wait),
        "the count started again after the VM ran: {wait:?}"
    );
}

#[tokio::test]
async fn a_running_vm_without_an_address_is_provisioning_not_ready() {
    let core = reconciler();
    let fake = FakeProvider::default().with_vm("vm-7", UID, VmState::Running);
    lock(&fake.vms).get_mut("vm-7").unwrap().addresses.clear();
    let bound = binding(fake, None);
    let outcome = core
        .reconcile(&proxy(with_vm("vm-7")), resolved(&bound))
        .await;
    assert_eq!(outcome.status.phase, Some(Phase::Provisioning));
    assert_eq!(reason(&outcome, conditions::READY), "WaitingForAddress");
    assert!(!conditions::is_true(
        &outcome.status.conditions,
        conditions::READY
    ));
    assert!(matches!(outcome.next, Next::After(wait) if wait <= Timing::default().poll_max));
}

#[tokio::test]
async fn a_permanent_error_is_not_asked_again_until_the_proxy_changes() {
    let core = reconciler();
    let fake = FakeProvider::default().failing(
        Operation::Create,
        ProviderError::Permanent("no such template".into()),
    );
    let bound = binding(fake, None);
    let first = core
        .reconcile(&proxy(ProxyStatus::default()), resolved(&bound))
        .await;
    assert_eq!(reason(&first, conditions::READY), "PermanentError");
    assert_eq!(first.status.phase, Some(Phase::Failed));
    assert_eq!(first.next, Next::AwaitChange);
    assert_eq!(noted(&first), ["PermanentError"]);

    // Even from a stale status (the watch has not caught up), nothing is asked.
    let again = core
        .reconcile(&proxy(ProxyStatus::default()), resolved(&bound))
        .await;
    assert_eq!(again.next, Next::AwaitChange);
    assert_eq!(
        bound.provider.asked(),
        vec![Operation::Create],
        "asked once"
    );

    let mut changed = proxy(first.status);
    changed.generation = 2;
    let after = core.reconcile(&changed, resolved(&bound)).await;
    assert_eq!(bound.provider.asked(), vec![Operation::Create; 2]);
    assert_eq!(after.status.phase, Some(Phase::Running));
}

#[tokio::test]
async fn a_permanent_answer_about_a_vm_is_read_again_at_the_resync_and_lifted_once_it_runs() {
    let core = reconciler();
    let fake = FakeProvider::default()
        .with_vm("vm-7", UID, VmState::Stopped)
        .failing(
            Operation::Get,
            ProviderError::Permanent("locked by a backup".into()),
        );
    let bound = binding(fake, None);
    let refused = core
        .reconcile(&proxy(with_vm("vm-7")), resolved(&bound))
        .await;
    assert_eq!(reason(&refused, conditions::READY), "PermanentError");
    assert_eq!(
        refused.next,
        Next::After(Timing::default().resync),
        "not AwaitChange"
    );

    // Still stopped at the resync: the latch stays, nothing else is asked.
    let latched = core
        .reconcile(&proxy(refused.status), resolved(&bound))
        .await;
    assert_eq!(reason(&latched, conditions::READY), "PermanentError");
    assert_eq!(bound.provider.asked(), vec![Operation::Get; 2]);

    // A person started it: running at an address, the latch is lifted.
    bound.provider.set_state("vm-7", VmState::Running);
    lock(&bound.provider.vms).get_mut("vm-7").unwrap().addresses = vec!["192.0.2.7".into()];
    let lifted = core
        .reconcile(&proxy(latched.status), resolved(&bound))
        .await;
    assert_eq!(lifted.status.phase, Some(Phase::Running));
    assert!(conditions::is_true(
        &lifted.status.conditions,
        conditions::READY
    ));
}

#[tokio::test]
async fn quota_exceeded_is_reported_and_retried_after_the_quota_wait() {
    let core = reconciler();
    let fake = FakeProvider::default().failing(
        Operation::Create,
        ProviderError::QuotaExceeded("8 of 8 VMs".into()),
    );
    let bound = binding(fake, None);
    let outcome = core
        .reconcile(&proxy(ProxyStatus::default()), resolved(&bound))
        .await;
    assert_eq!(reason(&outcome, conditions::READY), "QuotaExceeded");
    assert_eq!(outcome.next, Next::After(Timing::default().quota_retry));
    assert_eq!(noted(&outcome), ["QuotaExceeded"]);
}

#[tokio::test]
async fn a_vm_not_found_by_get_is_forgotten_and_made_again_at_once() {
    let core = reconciler();
    let bound = binding(FakeProvider::default(), None);
    let status = ProxyStatus {
        host: Some("hv-1".into()),
        ..with_vm("vm-7")
    };
    let outcome = core.reconcile(&proxy(status), resolved(&bound)).await;
    assert_eq!(bound.provider.asked(), vec![Operation::Get]);
    assert_eq!(outcome.status.provider_id, None);
    assert_eq!(outcome.status.host, None, "a VM that is gone runs nowhere");
    assert_eq!(reason(&outcome, conditions::READY), "Recreating");
    assert_eq!(outcome.next, Next::After(Duration::ZERO));
    assert_eq!(noted(&outcome), ["VMGone"]);
}

#[tokio::test]
async fn an_id_that_now_names_another_proxys_vm_is_left_alone_and_a_new_vm_made() {
    let core = reconciler();
    let fake = FakeProvider::default().with_vm("vm-7", "someone-else", VmState::Stopped);
    let bound = binding(fake, None);
    let outcome = core
        .reconcile(&proxy(with_vm("vm-7")), resolved(&bound))
        .await;
    assert_eq!(
        bound.provider.asked(),
        vec![Operation::Get],
        "neither started nor deleted"
    );
    assert!(bound.provider.vm("vm-7").is_some());
    assert_eq!(outcome.status.provider_id, None);
    assert_eq!(outcome.next, Next::After(Duration::ZERO));
}

#[tokio::test]
async fn a_paused_vm_is_reported_and_read_again_at_the_resync_with_no_recovery() {
    let core = reconciler();
    let fake = FakeProvider::default().with_vm("vm-7", UID, VmState::Paused);
    let bound = binding(fake, None);
    let mut status = with_vm("vm-7");
    set_condition(
        &mut status.conditions,
        conditions::READY,
        true,
        "Running",
        "answers",
        Some(1),
        &at(0),
    );
    let outcome = core.reconcile(&proxy(status), resolved(&bound)).await;
    assert_eq!(bound.provider.asked(), vec![Operation::Get]);
    assert_eq!(outcome.status.phase, Some(Phase::Paused));
    assert_eq!(reason(&outcome, conditions::READY), "VMPaused");
    assert_eq!(outcome.status.restarts, 0);
    assert_eq!(outcome.next, Next::After(Timing::default().resync));
    assert_eq!(
        noted(&outcome),
        ["VMPaused"],
        "once, as it stops being Ready"
    );
}

#[tokio::test]
async fn a_stopped_vm_is_started_again_through_create_and_the_restart_counted() {
    let core = reconciler();
    let fake = FakeProvider::default().with_vm("vm-7", UID, VmState::Stopped);
    let bound = binding(fake, None);
    let outcome = core
        .reconcile(&proxy(with_vm("vm-7")), resolved(&bound))
        .await;
    assert_eq!(
        bound.provider.asked(),
        vec![Operation::Get, Operation::Create]
    );
    assert_eq!(bound.provider.vm("vm-7").unwrap().state, VmState::Running);
    assert_eq!(outcome.status.phase, Some(Phase::Running));
    assert_eq!(outcome.status.restarts, 1);
    assert_eq!(noted(&outcome), ["VMRestarted", "Ready"]);
    assert_eq!(core.metrics.recoveries("lab", "restart", "stopped"), 1);

    // A status read before that write came back: the restart is not forgotten.
    bound.provider.set_state("vm-7", VmState::Stopped);
    let stale = core
        .reconcile(&proxy(with_vm("vm-7")), resolved(&bound))
        .await;
    assert_eq!(
        stale.status.restarts, 1,
        "waits out the backoff after the first"
    );
    assert_eq!(stale.status.phase, Some(Phase::Stopped));
}

#[tokio::test]
async fn a_failed_vm_is_deleted_then_made_again() {
    let core = reconciler();
    let fake = FakeProvider::default().with_vm("vm-7", UID, VmState::Failed);
    let bound = binding(fake, None);
    let outcome = core
        .reconcile(&proxy(with_vm("vm-7")), resolved(&bound))
        .await;
    assert_eq!(
        bound.provider.asked(),
        vec![Operation::Get, Operation::Delete]
    );
    assert!(bound.provider.vm("vm-7").is_none());
    assert_eq!(outcome.status.provider_id, None);
    assert_eq!(outcome.next, Next::After(Duration::ZERO));
    assert_eq!(noted(&outcome), ["VMReplaced"]);
    assert_eq!(core.metrics.recoveries("lab", "replace", "failed"), 1);

    let remade = core
        .reconcile(&proxy(outcome.status), resolved(&bound))
        .await;
    assert_eq!(remade.status.phase, Some(Phase::Running));
    assert_ne!(remade.status.provider_id.as_deref(), Some("vm-7"));
}

#[tokio::test]
async fn a_stopped_vm_under_policy_none_is_only_reported() {
    let core = reconciler();
    let fake = FakeProvider::default().with_vm("vm-7", UID, VmState::Stopped);
    let none = Recovery {
        policy: Some(RecoveryPolicy::None),
        ..Recovery::default()
    };
    let bound = binding(fake, Some(none));
    let outcome = core
        .reconcile(&proxy(with_vm("vm-7")), resolved(&bound))
        .await;
    assert_eq!(bound.provider.asked(), vec![Operation::Get]);
    assert_eq!(outcome.status.phase, Some(Phase::Stopped));
    assert_eq!(reason(&outcome, conditions::READY), "VMStopped");
}

#[tokio::test]
async fn a_running_vm_marked_by_no_installation_is_adopted_through_create() {
    let core = reconciler();
    let fake = FakeProvider::default().with_vm("vm-7", UID, VmState::Running);
    let bound = binding(fake, None);
    let legacy = ProxyStatus {
        provider_id: Some("vm-7".into()),
        ..ProxyStatus::default()
    };
    let outcome = core.reconcile(&proxy(legacy), resolved(&bound)).await;
    assert_eq!(
        bound.provider.asked(),
        vec![Operation::Get, Operation::Create]
    );
    assert_eq!(outcome.status.installation.as_deref(), Some(INSTALLED));
    assert_eq!(
        outcome.status.provider_id.as_deref(),
        Some("vm-7"),
        "the same VM"
    );
    assert!(noted(&outcome).contains(&"VMAdopted"));
}

#[tokio::test]
async fn a_missing_provider_config_leaves_the_proxy_pending_and_asks_nothing() {
    let core = reconciler();
    let unresolved = Resolved::<FakeProvider> {
        binding: Err(NotReady {
            reason: "ProviderConfigNotFound",
            message: "ProviderConfig lab does not exist".into(),
        }),
        user_data: Ok(String::new()),
    };
    let outcome = core
        .reconcile(&proxy(ProxyStatus::default()), unresolved)
        .await;
    assert_eq!(outcome.status.phase, Some(Phase::Pending));
    assert_eq!(
        reason(&outcome, conditions::READY),
        "ProviderConfigNotFound"
    );
    assert_eq!(outcome.next, Next::After(Timing::default().not_ready_retry));
}

// Deletion.

fn deleting(status: ProxyStatus) -> ProxyState {
    ProxyState {
        deleting: true,
        ..proxy(status)
    }
}

#[tokio::test]
async fn deleting_removes_the_vm_by_its_id_then_lets_the_finalizer_go() {
    let core = reconciler();
    let fake = FakeProvider::default().with_vm("vm-7", UID, VmState::Running);
    let bound = binding(fake, None);
    let outcome = core
        .reconcile(&deleting(with_vm("vm-7")), resolved(&bound))
        .await;
    assert_eq!(bound.provider.asked(), vec![Operation::Delete]);
    assert!(bound.provider.vm("vm-7").is_none());
    assert_eq!(outcome.next, Next::Finalized);
    assert_eq!(noted(&outcome), ["VMDeleted"]);
}

#[tokio::test]
async fn deleting_without_an_id_finds_the_proxys_vms_by_uid_and_deletes_only_those() {
    let core = reconciler();
    let fake = FakeProvider::default()
        .with_vm("vm-7", UID, VmState::Running)
        .with_vm("forged", "someone-else", VmState::Running);
    let bound = binding(fake, None);
    let outcome = core
        .reconcile(&deleting(ProxyStatus::default()), resolved(&bound))
        .await;
    assert_eq!(
        bound.provider.asked(),
        vec![Operation::ListByTag, Operation::Delete]
    );
    assert!(bound.provider.vm("vm-7").is_none());
    assert!(
        bound.provider.vm("forged").is_some(),
        "another Proxy's VM is kept"
    );
    assert_eq!(outcome.next, Next::Finalized);
}

#[tokio::test]
async fn deleting_keeps_the_finalizer_while_a_hypervisor_has_not_answered() {
    let core = reconciler();
    let fake = FakeProvider {
        unanswered: vec!["pve2".into()],
        ..FakeProvider::default()
    };
    let bound = binding(fake, None);
    let outcome = core
        .reconcile(&deleting(ProxyStatus::default()), resolved(&bound))
        .await;
    assert_eq!(
        reason(&outcome, conditions::SYNCED),
        "HypervisorUnreachable"
    );
    assert!(matches!(outcome.next, Next::After(_)), "{:?}", outcome.next);
}

#[tokio::test]
async fn deleting_without_a_provider_keeps_the_finalizer_and_waits() {
    let core = reconciler();
    let unresolved = Resolved::<FakeProvider> {
        binding: Err(NotReady {
            reason: "ProviderNotReady",
            message: "ProviderConfig lab has no loaded provider yet".into(),
        }),
        user_data: Ok(String::new()),
    };
    let outcome = core.reconcile(&deleting(with_vm("vm-7")), unresolved).await;
    assert_eq!(outcome.status.phase, Some(Phase::Deleting));
    assert_eq!(reason(&outcome, conditions::SYNCED), "ProviderNotReady");
    assert_eq!(outcome.next, Next::After(Timing::default().not_ready_retry));
}

#[tokio::test]
async fn deleting_a_vm_that_is_already_gone_is_done() {
    let core = reconciler();
    let bound = binding(FakeProvider::default(), None);
    let outcome = core
        .reconcile(&deleting(with_vm("vm-7")), resolved(&bound))
        .await;
    assert_eq!(outcome.next, Next::Finalized);
    assert!(outcome.notes.is_empty());
}

#[tokio::test]
async fn deleting_when_delete_fails_transiently_keeps_the_finalizer() {
    let core = reconciler();
    let fake = FakeProvider::default()
        .with_vm("vm-7", UID, VmState::Running)
        .failing(Operation::Delete, ProviderError::Transient("locked".into()));
    let bound = binding(fake, None);
    let outcome = core
        .reconcile(&deleting(with_vm("vm-7")), resolved(&bound))
        .await;
    assert!(bound.provider.vm("vm-7").is_some());
    assert!(matches!(outcome.next, Next::After(_)), "{:?}", outcome.next);
    assert_eq!(reason(&outcome, conditions::SYNCED), "TransientError");
}

// The health check: Ready requires it; failing past its threshold, the Proxy's recovery (or its
// pool's remediation) acts.

/// A fake whose VM `vm-7` runs at the loopback address, where the tests listen (or not).
fn running_on_loopback() -> FakeProvider {
    let fake = FakeProvider::default().with_vm("vm-7", UID, VmState::Running);
    lock(&fake.vms).get_mut("vm-7").unwrap().addresses = vec!["127.0.0.1".into()];
    fake
}

/// A Proxy of VM `vm-7` checked at `port` by TCP: one failure is the threshold, no grace.
fn checked(port: u16) -> ProxyState {
    let mut proxy = proxy(with_vm("vm-7"));
    proxy.spec.health_check = Some(crate::crd::HealthCheck {
        tcp: Some(crate::crd::TcpProbe { port: port.into() }),
        http_connect: None,
        period_seconds: 10,
        failure_threshold: 1,
        startup_seconds: 0,
        timeout_seconds: 1,
    });
    proxy
}

/// A loopback port nothing listens on.
async fn closed_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

/// Probes what is due; the keys whose verdict changed.
async fn probe(core: &ProxyReconciler) -> Vec<String> {
    core.prober().probe_due(crate::now().0).await
}

#[tokio::test]
async fn a_running_vm_is_ready_only_once_its_service_passes_the_health_check() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let core = reconciler();
    let bound = binding(running_on_loopback(), None);
    let proxy = checked(listener.local_addr().unwrap().port());

    let first = core.reconcile(&proxy, resolved(&bound)).await;
    assert_eq!(first.status.phase, Some(Phase::Running));
    assert_eq!(reason(&first, conditions::READY), "HealthCheckPending");
    assert_eq!(reason(&first, conditions::PROVISIONED), "Running");
    assert_eq!(
        reason(&first, conditions::HEALTH_CHECK_SUCCEEDED),
        "Starting"
    );
    assert_eq!(probe(&core).await, ["default/p"]);

    let mut proxy = proxy;
    proxy.status = first.status;
    let second = core.reconcile(&proxy, resolved(&bound)).await;
    assert!(conditions::is_true(
        &second.status.conditions,
        conditions::READY
    ));
    assert_eq!(
        reason(&second, conditions::HEALTH_CHECK_SUCCEEDED),
        "Passing"
    );
    let passing = conditions::HEALTH_CHECK_SUCCEEDED;
    assert!(conditions::is_true(&second.status.conditions, passing));
    assert_eq!(noted(&second), ["Ready"]);
}

#[tokio::test]
async fn a_proxy_without_a_health_check_is_ready_at_its_address_and_nothing_is_probed() {
    let core = reconciler();
    let bound = binding(running_on_loopback(), None);
    // Its check was just removed: the condition it left goes with it.
    let mut status = with_vm("vm-7");
    set_condition(
        &mut status.conditions,
        conditions::HEALTH_CHECK_SUCCEEDED,
        false,
        "Failing",
        "…",
        Some(1),
        &at(0),
    );
    let outcome = core.reconcile(&proxy(status), resolved(&bound)).await;
    assert!(conditions::is_true(
        &outcome.status.conditions,
        conditions::READY
    ));
    assert!(
        condition(
            &outcome.status.conditions,
            conditions::HEALTH_CHECK_SUCCEEDED
        )
        .is_none()
    );
    assert!(core.prober().is_empty());
}

#[tokio::test]
async fn a_vm_whose_service_fails_past_its_threshold_is_replaced_by_the_proxys_recovery() {
    let core = reconciler();
    let bound = binding(running_on_loopback(), None);
    let mut proxy = checked(closed_port().await);
    proxy.status = core.reconcile(&proxy, resolved(&bound)).await.status;
    assert_eq!(probe(&core).await, ["default/p"]);

    let outcome = core.reconcile(&proxy, resolved(&bound)).await;
    assert_eq!(
        bound.provider.asked(),
        vec![Operation::Get, Operation::Get, Operation::Delete]
    );
    assert!(bound.provider.vm("vm-7").is_none());
    assert_eq!(noted(&outcome), ["VMReplaced"]);
    let last = outcome.status.last_recovery.clone().unwrap();
    assert_eq!(
        (last.action, last.reason.as_str()),
        (RecoveryPolicy::Replace, "unhealthy")
    );
    assert_eq!(core.metrics.recoveries("lab", "replace", "unhealthy"), 1);
    // The replaced VM is no longer probed.
    assert!(core.prober().is_empty());
}

#[tokio::test]
async fn a_pooled_proxys_unhealthy_vm_is_left_to_the_pools_remediation() {
    let core = reconciler();
    let bound = binding(running_on_loopback(), None);
    let mut proxy = checked(closed_port().await);
    proxy.pooled = true;
    proxy.status = core.reconcile(&proxy, resolved(&bound)).await.status;
    assert_eq!(probe(&core).await, ["default/p"]);

    let outcome = core.reconcile(&proxy, resolved(&bound)).await;
    assert_eq!(bound.provider.asked(), vec![Operation::Get, Operation::Get]);
    assert!(bound.provider.vm("vm-7").is_some());
    assert_eq!(reason(&outcome, conditions::READY), "ServiceUnhealthy");
    assert_eq!(
        reason(&outcome, conditions::HEALTH_CHECK_SUCCEEDED),
        "Failing"
    );
    assert_eq!(outcome.status.phase, Some(Phase::Running));
    assert_eq!(outcome.status.restarts, 0);
}

#[tokio::test]
async fn under_policy_none_an_unhealthy_vm_is_only_reported() {
    let core = reconciler();
    let none = Recovery {
        policy: Some(RecoveryPolicy::None),
        ..Recovery::default()
    };
    let bound = binding(running_on_loopback(), Some(none));
    let mut proxy = checked(closed_port().await);
    proxy.status = core.reconcile(&proxy, resolved(&bound)).await.status;
    assert_eq!(probe(&core).await, ["default/p"]);

    let outcome = core.reconcile(&proxy, resolved(&bound)).await;
    assert_eq!(bound.provider.asked(), vec![Operation::Get, Operation::Get]);
    assert_eq!(reason(&outcome, conditions::READY), "ServiceUnhealthy");
    assert_eq!(outcome.status.phase, Some(Phase::Running));
}

#[test]
fn an_unhealthy_vm_is_replaced_even_where_the_policy_is_restart() {
    let mut record = Recoveries::default();
    let recovery = restart_policy(RecoveryPolicy::Restart);
    let decision = decide(
        Trouble::Unhealthy,
        &recovery,
        &ProxyStatus::default(),
        &mut record,
    );
    assert_eq!(
        decision,
        RecoveryDecision::Recover {
            act: Act::Replace,
            attempt: 1
        }
    );
}

#[tokio::test]
async fn after_a_restart_a_vm_whose_status_says_passing_stays_ready_until_a_probe_fails() {
    let core = reconciler();
    let bound = binding(running_on_loopback(), None);
    let mut proxy = checked(closed_port().await);
    let mut passing = with_vm("vm-7");
    for kind in [conditions::READY, conditions::HEALTH_CHECK_SUCCEEDED] {
        set_condition(
            &mut passing.conditions,
            kind,
            true,
            "…",
            "…",
            Some(1),
            &at(0),
        );
    }
    proxy.status = passing;
    let first = core.reconcile(&proxy, resolved(&bound)).await;
    assert!(conditions::is_true(
        &first.status.conditions,
        conditions::READY
    ));
    // Its first probe, at once, is refused: out of service.
    assert_eq!(probe(&core).await, ["default/p"]);
    proxy.pooled = true;
    proxy.status = first.status;
    let second = core.reconcile(&proxy, resolved(&bound)).await;
    assert_eq!(reason(&second, conditions::READY), "ServiceUnhealthy");
}
