//! The store data of one provider call: [`HostState`].
//!
//! # What a provider is given
//!
//! Rust standard-library components import `wasi:cli`, `wasi:filesystem` and `wasi:sockets` even
//! when they never use them, so the linker provides all of WASI 0.2 — but the [`WasiCtx`] built
//! here grants nothing: no preopened directories, no environment, no arguments, an empty stdin, a
//! discarded stdout, no TCP, UDP or name lookup, and every socket address refused. Stderr is
//! captured into a small bounded buffer so a panic message can be reported with the trap.
//!
//! Everything else comes from a [`Capability`](crate::Capability) (outgoing HTTP through the
//! host's `Egress`, libvirt, …), whose per-call state is kept here by its type, beside the call's
//! one [`ResourceTable`]. Clocks, randomness and the log are the host's.
//!
//! # What a provider can make the host hold
//!
//! Every host resource a call can grow is bounded, from its [`Limits`]: the resource table every
//! capability's resources share and the store's handle count (`resource_handles`), each header
//! list the guest builds (`header_bytes`), each outgoing body's buffer (`body_buffer_bytes`), the
//! requests in flight (`requests_in_flight`), the log (`log_lines`, `log_bytes`) and the stderr
//! capture (8 KiB).

use std::any::{Any, TypeId};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{HostWallClock, WasiCtx, WasiCtxView, WasiView};

use crate::cpu::CpuMeter;
use crate::egress::CallSite;
use crate::error::Budget;
use crate::limits::Limits;
use crate::log::{LogBudget, LogView};

/// How much of a guest's stderr is kept for error messages.
pub(crate) const STDERR_CAPACITY: usize = 8 * 1024;

/// Why the host stopped a call before it returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The wall-clock deadline passed.
    Deadline,
    /// A budget was exceeded; the limit in the budget's unit.
    Budget(Budget, u64),
}

/// The store data of one provider call: owned by that call's `Store`, shared with nothing else.
///
/// Capability crates reach it through a small surface: the call's [`ResourceTable`]
/// ([`table`](HostState::table)), their own per-call state by its type
/// ([`capability_state`](HostState::capability_state)), the call's [`CallSite`] and its
/// [`deadline`](HostState::deadline). The rest (WASI, the log, the limiter, the CPU meter) is the
/// runtime's.
pub struct HostState {
    /// Resources the guest holds handles to, of every capability (streams, HTTP requests, libvirt
    /// connections, …); capped at the call's `resource_handles`.
    table: ResourceTable,
    /// WASI context granting nothing (see the module docs).
    wasi: WasiCtx,
    /// The per-call state of each capability the component imports, by type.
    capabilities: CapabilityStates,
    /// Who calls: identity, digest, operation.
    site: CallSite,
    /// Lines and bytes this call has logged, against its budget.
    log: LogBudget,
    /// Memory, table and instance caps for this store.
    pub(crate) limiter: CallLimiter,
    /// When the operation's wall-clock deadline passes.
    pub(crate) deadline: Instant,
    /// CPU time the call has spent computing; shared with the future that polls the call.
    pub(crate) cpu: Arc<CpuMeter>,
    /// The CPU time the call may spend.
    pub(crate) cpu_budget: Duration,
    /// Set when the host stopped the guest (deadline or budget).
    pub(crate) stop: Option<Stop>,
    /// The guest's captured stderr (bounded).
    stderr: MemoryOutputPipe,
}

impl std::fmt::Debug for HostState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostState")
            .field("site", &self.site)
            .field("deadline", &self.deadline)
            .field("capability_states", &self.capabilities.states.len())
            .finish_non_exhaustive()
    }
}

impl HostState {
    /// State for one call of `site` with `limits`, stopping at `deadline` or after `cpu_budget`
    /// of CPU time. No capability state yet: see [`HostState::insert_capability_state`].
    pub(crate) fn new(
        site: CallSite,
        limits: &Limits,
        deadline: Instant,
        cpu_budget: Duration,
        wall_clock: Option<Box<dyn HostWallClock>>,
    ) -> HostState {
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        let mut wasi = WasiCtx::builder();
        if let Some(clock) = wall_clock {
            wasi.wall_clock(TapClock(clock));
        }
        let wasi = wasi
            .stdin(std::io::empty())
            .stdout(std::io::empty())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .socket_addr_check(|_, _| Box::pin(async { false }))
            .build();
        let mut table = ResourceTable::new();
        table.set_max_capacity(limits.resource_handles_limit());
        HostState {
            table,
            wasi,
            capabilities: CapabilityStates::default(),
            log: LogBudget::new(site.clone(), limits),
            site,
            limiter: CallLimiter::new(limits),
            deadline,
            cpu: Arc::new(CpuMeter::default()),
            cpu_budget,
            stop: None,
            stderr,
        }
    }

    /// The call's resource table, shared by every capability: its capacity is the call's
    /// `resource_handles` budget.
    pub fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }

    /// Who calls: the provider's host-assigned identity, its digest and the operation.
    pub fn site(&self) -> &CallSite {
        &self.site
    }

    /// When the operation's wall-clock deadline passes.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The call's state of the capability whose state type is `T` (what its
    /// [`Capability::prepare`](crate::Capability::prepare) returned), with the call's resource
    /// table. When the call has no such state, `ungranted(deadline)` makes one and it is kept:
    /// give it the state of a provider without a grant, on which every use is denied. (The
    /// runtime prepares every capability a component imports, so that happens only when a host
    /// function is reached some other way.)
    pub fn capability_state<T: Any + Send>(
        &mut self,
        ungranted: impl FnOnce(Instant) -> T,
    ) -> (&mut T, &mut ResourceTable) {
        let deadline = self.deadline;
        (
            self.capabilities.get_or_insert_with(|| ungranted(deadline)),
            &mut self.table,
        )
    }

    /// Keep `state`, a capability's per-call state, replacing one of the same type.
    pub(crate) fn insert_capability_state(&mut self, state: Box<dyn Any + Send>) {
        self.capabilities.insert(state);
    }

    /// The call's state of type `T`, if it has one.
    pub(crate) fn capability_state_ref<T: Any + Send>(&self) -> Option<&T> {
        self.capabilities.get::<T>()
    }

    /// What the guest wrote to stderr so far, lossily decoded and trimmed.
    pub(crate) fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.contents())
            .trim()
            .to_owned()
    }
}

/// The per-call states of a call's capabilities, by type. A call has a few at most, so a list
/// beats a map.
#[derive(Default)]
struct CapabilityStates {
    states: Vec<Box<dyn Any + Send>>,
}

impl CapabilityStates {
    fn insert(&mut self, state: Box<dyn Any + Send>) {
        // `(*state).type_id()` is the boxed value's type, not the box's.
        let id = (*state).type_id();
        self.states.retain(|kept| (**kept).type_id() != id);
        self.states.push(state);
    }

    fn get<T: Any>(&self) -> Option<&T> {
        self.states
            .iter()
            .find_map(|state| state.downcast_ref::<T>())
    }

    fn get_or_insert_with<T: Any + Send>(&mut self, make: impl FnOnce() -> T) -> &mut T {
        let index = match self
            .states
            .iter()
            .position(|state| (**state).type_id() == TypeId::of::<T>())
        {
            Some(index) => index,
            None => {
                self.states.push(Box::new(make()));
                self.states.len() - 1
            }
        };
        match self.states[index].downcast_mut::<T>() {
            Some(state) => state,
            // The position was found by this very type id.
            None => unreachable!("a state of the type just checked"),
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl LogView for HostState {
    fn log_budget(&mut self) -> &mut LogBudget {
        &mut self.log
    }

    fn exceeded(&mut self, budget: Budget, limit: u64) {
        self.stop.get_or_insert(Stop::Budget(budget, limit));
    }
}

/// Caps one store's resources and remembers whether the memory cap stopped a growth, so the
/// call fails with `CallError::MemoryCap` rather than a generic trap.
pub(crate) struct CallLimiter {
    memory_bytes: usize,
    table_elements: usize,
    instances: usize,
    /// Set when a memory growth was refused for exceeding `memory_bytes`.
    pub(crate) memory_cap_hit: bool,
}

impl CallLimiter {
    fn new(limits: &Limits) -> CallLimiter {
        CallLimiter {
            memory_bytes: limits.memory_bytes_limit(),
            table_elements: limits.table_elements_limit(),
            instances: limits.instances_per_store_limit(),
            memory_cap_hit: false,
        }
    }

    /// The memory cap in bytes.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.memory_bytes
    }
}

impl wasmtime::ResourceLimiter for CallLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            self.memory_cap_hit = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= self.table_elements)
    }

    fn instances(&self) -> usize {
        self.instances
    }

    fn tables(&self) -> usize {
        self.instances
    }

    fn memories(&self) -> usize {
        self.instances
    }
}

/// A tap's wall clock, as the WASI context takes one.
struct TapClock(Box<dyn HostWallClock>);

impl HostWallClock for TapClock {
    fn resolution(&self) -> Duration {
        self.0.resolution()
    }

    fn now(&self) -> Duration {
        self.0.now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_refuses_growth_past_the_cap_and_remembers_it() {
        use wasmtime::ResourceLimiter;
        let mut limiter = CallLimiter::new(&Limits::default().memory_bytes(2 << 20));
        assert!(limiter.memory_growing(0, 2 << 20, None).unwrap());
        assert!(!limiter.memory_cap_hit);
        assert!(
            !limiter
                .memory_growing(2 << 20, (2 << 20) + 65536, None)
                .unwrap()
        );
        assert!(limiter.memory_cap_hit);
    }
}
