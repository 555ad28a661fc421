//! How one call runs: a fresh store and instance, the deadline, the CPU budget and every other
//! per-call bound, and the classification of whatever stopped it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use wasmtime::{CallHook, Store, UpdateDeadline};

use crate::capability::{Linked, PrepareContext};
use crate::cpu::Metered;
use crate::egress::{CallSite, Tap};
use crate::engine::EpochTicker;
use crate::error::{Budget, CallError, one_line};
use crate::limits::Limits;
use crate::state::{HostState, Stop};
use crate::types::{Operation, ProviderError, Request, Response};
use crate::wit::{CallOutcome, ContractPre, Failure};

/// What every call of every provider shares: the instance pool's slots, the per-provider
/// permits, and the ticker that drives every engine's epoch.
pub(crate) struct CallEnv {
    /// One permit per slot of the pooling allocator: a call takes one before it instantiates, so
    /// a burst across many providers waits its turn (first come, first served) instead of
    /// failing to instantiate.
    pub(crate) instance_slots: Arc<Semaphore>,
    /// The most linear memory any one call may be given: the pool's slot size.
    pub(crate) slot_memory_bytes: usize,
    /// Concurrency permits per provider identity and permit count; they outlive any one
    /// generation or binding, so a hot swap does not reset them.
    pub(crate) semaphores:
        std::sync::Mutex<std::collections::HashMap<(String, usize), Arc<Semaphore>>>,
    /// Calls into the host so far, when counted (`RuntimeConfig::count_host_calls`).
    pub(crate) host_calls: Option<Arc<AtomicU64>>,
    /// Advances the engines' epochs for as long as anything holds this state.
    pub(crate) _ticker: EpochTicker,
}

impl CallEnv {
    /// What the calls of a runtime with `limits` share: a pool of instance slots of
    /// `slot_memory_bytes` each, the `ticker` of its engines, and a count of host calls when
    /// `count_host_calls`.
    pub(crate) fn new(
        limits: &Limits,
        slot_memory_bytes: usize,
        count_host_calls: bool,
        ticker: EpochTicker,
    ) -> CallEnv {
        let slots = limits.max_concurrent_instances_limit() as usize;
        CallEnv {
            instance_slots: Arc::new(Semaphore::new(slots)),
            slot_memory_bytes,
            semaphores: std::sync::Mutex::new(std::collections::HashMap::new()),
            host_calls: count_host_calls.then(Default::default),
            _ticker: ticker,
        }
    }

    /// The concurrency permits of the provider `identity` allowed `permits` calls at once,
    /// created on first use.
    pub(crate) fn semaphore_for(&self, identity: &str, permits: usize) -> Arc<Semaphore> {
        let mut semaphores = self
            .semaphores
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        Arc::clone(
            semaphores
                .entry((identity.to_owned(), permits))
                .or_insert_with(|| Arc::new(Semaphore::new(permits))),
        )
    }
}

/// What a call needs of its provider: its capabilities, the contract version's bindings, and the
/// call's site and limits.
pub(crate) struct CallPlan<'a> {
    /// The bindings of the component's contract version.
    pub(crate) pre: &'a dyn ContractPre,
    /// The capabilities the component imports: each is prepared for the call.
    pub(crate) capabilities: &'a [Arc<dyn Linked>],
    /// Who calls.
    pub(crate) site: CallSite,
    /// The limits the call runs under.
    pub(crate) limits: &'a Limits,
    /// What stands between the call's requests and the egress, if anything.
    pub(crate) tap: Option<Arc<dyn Tap>>,
}

/// A fresh store for one call, with its limiter, budgets and epoch behaviour set, and the state
/// of every capability in `plan` prepared.
pub(crate) fn new_store(
    plan: &CallPlan<'_>,
    operation: Operation,
    deadline: Instant,
) -> Store<HostState> {
    let limits = plan.limits;
    let mut state = HostState::new(
        plan.site.clone(),
        limits,
        deadline,
        limits.cpu_time_for(operation),
        plan.tap.as_ref().and_then(|tap| tap.wall_clock()),
    );
    let prepare = PrepareContext::new(&plan.site, deadline, limits).with_tap(plan.tap.as_ref());
    for capability in plan.capabilities {
        state.insert_capability_state(capability.prepare(&prepare));
    }
    // The engine that compiled the code: Cranelift's, or Winch's while Cranelift compiles.
    let mut store = Store::new(plan.pre.engine(), state);
    store.limiter(|state| &mut state.limiter);
    // wasmtime's own bounds on what a guest can make it allocate: bytes lifted out of the guest
    // in one transfer (a result, a host call's arguments) and handles alive at once.
    store.set_hostcall_fuel(limits.transfer_bytes_limit());
    store.set_max_component_handles(limits.resource_handles_limit());
    // Check in at every epoch tick: yield the thread so a spinning guest never blocks an
    // executor, and stop the guest once its wall-clock deadline or its CPU budget has passed.
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|mut context| {
        let state = context.data_mut();
        if Instant::now() >= state.deadline {
            state.stop = Some(Stop::Deadline);
            return Ok(UpdateDeadline::Interrupt);
        }
        if state.cpu.used() > state.cpu_budget {
            let limit = u64::try_from(state.cpu_budget.as_millis()).unwrap_or(u64::MAX);
            state.stop = Some(Stop::Budget(Budget::CpuTime, limit));
            return Ok(UpdateDeadline::Interrupt);
        }
        Ok(UpdateDeadline::Yield(1))
    });
    store
}

/// Take an instance slot, instantiate the plan's component in a fresh store and run `request`,
/// all before `started + deadline`.
pub(crate) async fn run_call(
    env: &CallEnv,
    plan: CallPlan<'_>,
    request: Request,
    started: Instant,
) -> Result<Response, CallError> {
    let operation = request.operation();
    let after = plan.limits.deadline_for(operation);
    let deadline = started + after;
    let _slot = match tokio::time::timeout_at(deadline.into(), env.instance_slots.acquire()).await {
        Ok(Ok(slot)) => slot,
        // The semaphore is never closed.
        Ok(Err(_)) | Err(_) => {
            return Err(CallError::PoolFull {
                operation,
                waited: started.elapsed(),
            });
        }
    };
    let mut store = new_store(&plan, operation, deadline);
    if let Some(calls) = &env.host_calls {
        count_host_calls(&mut store, Arc::clone(calls));
    }
    let meter = Arc::clone(&store.data().cpu);
    let work = Metered::new(plan.pre.call(&mut store, request), meter);
    let Ok(outcome) = tokio::time::timeout_at(deadline.into(), work).await else {
        return Err(CallError::Deadline { operation, after });
    };
    let classifier = Classifier {
        operation,
        after,
        limits: plan.limits,
    };
    classifier.classify(outcome, store.data())
}

/// Count in `calls` every call the guest makes into the host.
fn count_host_calls(store: &mut Store<HostState>, calls: Arc<AtomicU64>) {
    store.call_hook(move |_, hook| {
        if let CallHook::CallingHost = hook {
            calls.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    });
}

/// Says how a call that ended before its deadline went, by its operation, deadline and limits.
struct Classifier<'a> {
    operation: Operation,
    /// The call's deadline, counted from when it started.
    after: Duration,
    limits: &'a Limits,
}

impl Classifier<'_> {
    /// The call's result from its `outcome` and what its `state` recorded.
    fn classify(&self, outcome: CallOutcome, state: &HostState) -> Result<Response, CallError> {
        // A budget the guest could observe (a refused request) fails the call even if the guest
        // went on to answer; when it failed, more specific causes come first.
        let http_budget = match crate::http::budget_exceeded(state) {
            Some(Stop::Budget(budget, limit)) => Some(self.budget_error(budget, limit)),
            Some(Stop::Deadline) | None => None,
        };
        match outcome {
            Ok(answer) => match http_budget {
                Some(error) => Err(error),
                None => bound(self.operation, answer),
            },
            Err(failure) => Err(self.failure_error(failure, state, http_budget)),
        }
    }

    /// What stopped a guest that failed, most specific first: the memory cap, the host's own
    /// stop (deadline, CPU, log), then a bound wasmtime enforced, then `http_budget` (a refused
    /// request the guest carried on after), and only then the trap itself.
    fn failure_error(
        &self,
        failure: Failure,
        state: &HostState,
        http_budget: Option<CallError>,
    ) -> CallError {
        let stderr = state.stderr();
        if !stderr.is_empty() {
            tracing::debug!(stderr = %crate::log::escape(&stderr), "provider stderr");
        }
        if state.limiter.memory_cap_hit {
            return CallError::MemoryCap {
                limit: state.limiter.memory_bytes(),
            };
        }
        match state.stop {
            Some(Stop::Deadline) => {
                return CallError::Deadline {
                    operation: self.operation,
                    after: self.after,
                };
            }
            Some(Stop::Budget(budget, limit)) => return self.budget_error(budget, limit),
            None => {}
        }
        let (Failure::Instantiate(error) | Failure::Call(error)) = &failure;
        if let Some(budget) = wasmtime_budget(error) {
            let limit = match budget {
                Budget::TransferBytes => self.limits.transfer_bytes_limit(),
                Budget::HeaderBytes => self.limits.header_bytes_limit(),
                _ => self.limits.resource_handles_limit(),
            };
            return self.budget_error(budget, limit as u64);
        }
        http_budget.unwrap_or_else(|| trap_error(failure, &stderr))
    }

    fn budget_error(&self, budget: Budget, limit: u64) -> CallError {
        CallError::Budget {
            operation: self.operation,
            budget,
            limit,
        }
    }
}

/// A failed instantiation, or a trap with the guest's stderr, which often says why.
fn trap_error(failure: Failure, stderr: &str) -> CallError {
    let error = match failure {
        Failure::Instantiate(error) => {
            return CallError::Instantiate {
                message: one_line(&error),
            };
        }
        Failure::Call(error) => error,
    };
    let trap = match error.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => trap.to_string(),
        None => one_line(&error),
    };
    let message = if stderr.is_empty() {
        trap
    } else {
        let stderr = stderr
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty());
        format!("{trap}; stderr: {}", stderr.collect::<Vec<_>>().join(" | "))
    };
    CallError::Trap {
        message: crate::log::escape(&message).into_owned(),
    }
}

/// The budget a wasmtime-enforced bound reports, recognised by its error: the hostcall fuel, the
/// resource table's capacity, the store's handle limit and wasi-http's header list limit.
fn wasmtime_budget(error: &wasmtime::Error) -> Option<Budget> {
    for cause in error.chain() {
        if matches!(
            cause.downcast_ref(),
            Some(wasmtime::component::ResourceTableError::Full)
        ) {
            return Some(Budget::ResourceHandles);
        }
        if matches!(
            cause.downcast_ref(),
            Some(wasmtime_wasi_http::FieldMapError::TotalSizeTooBig)
        ) {
            return Some(Budget::HeaderBytes);
        }
    }
    let text = format!("{error:#}");
    if text.contains("fuel allocated for hostcalls has been exhausted") {
        return Some(Budget::TransferBytes);
    }
    if text.contains("store handle limit exceeded") {
        return Some(Budget::ResourceHandles);
    }
    None
}

/// Longest message kept from a provider's error or check result; the rest is cut and counted.
const MAX_MESSAGE: usize = 4 * 1024;
/// Longest identifier (provider ID, name, UID, version) accepted from a provider.
const MAX_IDENTIFIER: usize = 256;
/// Most addresses accepted for one VM.
const MAX_ADDRESSES: usize = 64;
/// The most hypervisors a listing may name as unanswered.
const MAX_UNANSWERED: usize = 64;
/// Longest JSON Schema accepted from `describe`.
const MAX_SCHEMA: usize = 256 * 1024;

/// Check and bound what a provider answered: messages are cut to [`MAX_MESSAGE`] and escaped
/// (they reach logs, terminals and status fields); an identifier past its bound is refused, as
/// cutting it would make it name something else.
fn bound(
    operation: Operation,
    answer: Result<Response, ProviderError>,
) -> Result<Response, CallError> {
    let invalid = |problem: String| CallError::InvalidResult { operation, problem };
    let mut response = match answer {
        Ok(response) => response,
        Err(error) => {
            let message = bounded_message(error.message());
            return Err(CallError::Provider(match error {
                ProviderError::Transient(_) => ProviderError::Transient(message),
                ProviderError::Permanent(_) => ProviderError::Permanent(message),
                ProviderError::NotFound(_) => ProviderError::NotFound(message),
                ProviderError::QuotaExceeded(_) => ProviderError::QuotaExceeded(message),
            }));
        }
    };
    match &mut response {
        Response::Describe(description) => {
            for (field, value) in [
                ("version", &description.version),
                ("contract-version", &description.contract_version),
            ] {
                check_identifier(field, value).map_err(invalid)?;
            }
            if description.config_schema.len() > MAX_SCHEMA {
                return Err(invalid(format!(
                    "config-schema is {} bytes; at most {MAX_SCHEMA}",
                    description.config_schema.len()
                )));
            }
        }
        Response::Create(vm) | Response::Get(vm) => check_vm(vm).map_err(invalid)?,
        Response::ListByTag(listing) => {
            for vm in &listing.vms {
                check_vm(vm).map_err(invalid)?;
            }
            if listing.unanswered.len() > MAX_UNANSWERED {
                return Err(invalid(format!(
                    "{} hypervisors named as unanswered; at most {MAX_UNANSWERED}",
                    listing.unanswered.len()
                )));
            }
            for name in &listing.unanswered {
                check_identifier("unanswered", name).map_err(invalid)?;
            }
        }
        Response::Check(result) => result.message = bounded_message(&result.message),
        Response::ValidateConfig | Response::Delete => {}
    }
    Ok(response)
}

fn check_vm(vm: &crate::types::Vm) -> Result<(), String> {
    for (field, value) in [
        ("provider-id", &vm.provider_id),
        ("name", &vm.name),
        ("uid", &vm.uid),
    ] {
        check_identifier(field, value)?;
    }
    if let Some(created_at) = &vm.created_at {
        check_identifier("created-at", created_at)?;
    }
    if vm.addresses.len() > MAX_ADDRESSES {
        return Err(format!(
            "{} addresses for {:?}; at most {MAX_ADDRESSES}",
            vm.addresses.len(),
            vm.provider_id
        ));
    }
    for address in &vm.addresses {
        check_identifier("addresses", address)?;
    }
    Ok(())
}

fn check_identifier(field: &str, value: &str) -> Result<(), String> {
    if value.len() > MAX_IDENTIFIER {
        return Err(format!(
            "{field} is {} bytes; at most {MAX_IDENTIFIER}",
            value.len()
        ));
    }
    if value.contains(|c: char| c.is_control()) {
        return Err(format!(
            "{field} {:?} holds control characters",
            crate::log::escape(crate::log::prefix(value, 64))
        ));
    }
    Ok(())
}

fn bounded_message(message: &str) -> String {
    let kept = crate::log::prefix(message, MAX_MESSAGE);
    let mut bounded = crate::log::escape(kept).into_owned();
    if kept.len() < message.len() {
        bounded.push_str(&format!(
            " … ({} more bytes cut)",
            message.len() - kept.len()
        ));
    }
    bounded
}

/// A deadline for a call that waits for nothing: long enough for any instantiation.
pub(crate) const BENCHMARK_DEADLINE: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{CheckReason, CheckResult, Vm, VmState};

    fn vm(provider_id: &str, name: &str) -> Vm {
        Vm {
            provider_id: provider_id.into(),
            name: name.into(),
            state: VmState::Running,
            addresses: vec!["192.0.2.1".into()],
            created_at: None,
            uid: "uid-1".into(),
            host: None,
        }
    }

    #[test]
    fn long_messages_are_cut_escaped_and_counted() {
        let long = format!("line one\nline two {}", "x".repeat(10_000));
        let Err(CallError::Provider(error)) =
            bound(Operation::Get, Err(ProviderError::Transient(long.clone())))
        else {
            panic!("a provider error stays a provider error")
        };
        assert!(
            error.message().starts_with("line one\\nline two x"),
            "{error}"
        );
        assert!(
            error.message().len() < MAX_MESSAGE + 64,
            "{}",
            error.message().len()
        );
        assert!(
            error
                .message()
                .ends_with(&format!("({} more bytes cut)", long.len() - MAX_MESSAGE)),
            "{error}"
        );
        let Ok(Response::Check(check)) = bound(
            Operation::Check,
            Ok(Response::Check(CheckResult {
                reason: CheckReason::Other,
                message: "é".repeat(5_000),
            })),
        ) else {
            panic!("a check answer passes")
        };
        assert!(check.message.len() < MAX_MESSAGE + 64);
    }

    #[test]
    fn oversized_or_control_identifiers_are_refused_not_cut() {
        let ok = bound(Operation::Get, Ok(Response::Get(vm("pve/100", "proxy-a"))));
        assert!(ok.is_ok(), "{ok:?}");
        for bad in [vm(&"p".repeat(300), "a"), vm("pve/100", "a\nb")] {
            let error = bound(Operation::Get, Ok(Response::Get(bad))).unwrap_err();
            assert!(matches!(error, CallError::InvalidResult { .. }), "{error}");
            assert_eq!(error.class(), crate::types::ErrorClass::Permanent);
        }
        let mut many = vm("pve/100", "a");
        many.addresses = vec!["192.0.2.1".into(); MAX_ADDRESSES + 1];
        let listed = bound(
            Operation::ListByTag,
            Ok(Response::ListByTag(crate::types::Listing {
                vms: vec![vm("pve/1", "a"), many],
                unanswered: Vec::new(),
            })),
        );
        assert!(
            matches!(listed, Err(CallError::InvalidResult { .. })),
            "{listed:?}"
        );
        for unanswered in [
            vec!["a\nforged log line".to_owned()],
            vec!["node".to_owned(); MAX_UNANSWERED + 1],
        ] {
            let listed = bound(
                Operation::ListByTag,
                Ok(Response::ListByTag(crate::types::Listing {
                    vms: Vec::new(),
                    unanswered,
                })),
            );
            assert!(
                matches!(listed, Err(CallError::InvalidResult { .. })),
                "{listed:?}"
            );
        }
    }
}
