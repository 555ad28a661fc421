//! The [`wasmtime::Engine`]s providers run on, and the thread that advances their epochs.

use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, MemoryCreator, PoolingAllocationConfig,
    Strategy,
};

use crate::limits::Limits;

/// Memories one component may define: a Rust wasip2 component has one.
const MEMORIES_PER_COMPONENT: u32 = 2;
/// Tables one component may define: the main module's plus the shims wit-component adds.
const TABLES_PER_COMPONENT: u32 = 8;

/// Low bytes of each pooled linear memory reset in place rather than decommitted.
const KEEP_RESIDENT_MEMORY_BYTES: usize = 2 << 20;
/// Low bytes of each pooled table reset in place rather than decommitted.
const KEEP_RESIDENT_TABLE_BYTES: usize = 64 << 10;

/// Which compiler made the code a provider's calls run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Winch, wasmtime's single-pass baseline compiler: several times faster to compile than
    /// Cranelift, slower code.
    Baseline,
    /// Cranelift, wasmtime's optimizing compiler.
    Optimized,
}

/// How the runtime compiles a component that is not in its compile cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compilation {
    /// Compile with Winch, serve at once, and compile with Cranelift on a background thread;
    /// calls move to Cranelift's code when it is ready, and only Cranelift's goes to the cache.
    /// A new file serves in the time of a Winch compile; the cache makes later loads faster.
    #[default]
    Tiered,
    /// Cranelift only: a load returns once Cranelift is done.
    Optimized,
    /// Winch only, for everything, cache included: the fastest loads and the slowest calls.
    Baseline,
}

/// How an engine gets its instances' memories, tables and stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Allocation {
    /// The pooling allocator sized from the limits: the engine calls normally run on.
    Pooled,
    /// Allocated per instance: for the baseline engine that serves only until Cranelift is
    /// done, so its slots do not double the pool's reservation.
    OnDemand,
}

/// Build an engine: component model, async, epoch interruption, the compiler of `tier`, and either the
/// pooling allocator sized from `limits` with slots of `slot_memory_bytes` of linear memory,
/// on-demand allocation, or (tests and diagnostics only) `memory_creator`.
pub(crate) fn build_engine(
    limits: &Limits,
    slot_memory_bytes: usize,
    memory_creator: Option<Arc<dyn MemoryCreator>>,
    tier: Tier,
    allocation: Allocation,
) -> wasmtime::Result<Engine> {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    config.strategy(match tier {
        Tier::Optimized => Strategy::Cranelift,
        Tier::Baseline => Strategy::Winch,
    });
    match (memory_creator, allocation) {
        (Some(creator), _) => {
            // A custom creator owns every linear memory, which the pooling allocator cannot
            // share: fall back to on-demand allocation.
            config.with_host_memory(creator);
            config.allocation_strategy(InstanceAllocationStrategy::OnDemand);
            // Copy-on-write images need mmap-backed memories; wasmtime 48 reaches `unreachable!`
            // when a host-provided memory meets a memory image.
            config.memory_init_cow(false);
        }
        (None, Allocation::OnDemand) => {
            config.allocation_strategy(InstanceAllocationStrategy::OnDemand);
        }
        (None, Allocation::Pooled) => {
            let pooling = pooling_config(limits, slot_memory_bytes);
            config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
            // Fresh instances map the component's data segments copy-on-write instead of
            // copying them: the main reason instantiation takes microseconds.
            config.memory_init_cow(true);
        }
    }
    Engine::new(&config)
}

/// The pooling allocator sized from `limits`, with slots of `slot_memory_bytes` of linear memory.
fn pooling_config(limits: &Limits, slot_memory_bytes: usize) -> PoolingAllocationConfig {
    let instances = limits.max_concurrent_instances_limit();
    let core_instances_per_store =
        u32::try_from(limits.instances_per_store_limit()).unwrap_or(u32::MAX);
    let mut pooling = PoolingAllocationConfig::default();
    pooling
        .total_component_instances(instances)
        .total_core_instances(instances.saturating_mul(core_instances_per_store))
        .total_memories(instances.saturating_mul(MEMORIES_PER_COMPONENT))
        .max_memories_per_component(MEMORIES_PER_COMPONENT)
        .total_tables(instances.saturating_mul(TABLES_PER_COMPONENT))
        .max_tables_per_component(TABLES_PER_COMPONENT)
        .total_stacks(instances)
        .max_memory_size(slot_memory_bytes)
        .table_elements(limits.table_elements_limit())
        // Reset a freed slot's touched pages in place instead of `madvise`-ing them away, so the
        // next instance takes no page faults on them: `PAGEMAP_SCAN` (Linux ≥ 6.7) finds exactly
        // the touched pages. A Rust guest's 1 MiB stack sits below its data, so the window must
        // reach past it to cover what a call touches. Without the ioctl the whole window would be
        // `memset` on every reuse, costing more than the faults it saves: older kernels keep
        // wasmtime's default (decommit everything).
        .pagemap_scan(Enabled::Auto);
    if kernel_has_pagemap_scan() {
        pooling
            .linear_memory_keep_resident(KEEP_RESIDENT_MEMORY_BYTES)
            .table_keep_resident(KEEP_RESIDENT_TABLE_BYTES);
    }
    pooling
}

/// Whether the running kernel has the `PAGEMAP_SCAN` ioctl (Linux 6.7 and later).
fn kernel_has_pagemap_scan() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .and_then(|release| release_at_least(&release, (6, 7)))
        .unwrap_or(false)
}

/// Whether a kernel release such as `6.18.44-fc` is at least `(major, minor)`; `None` when the
/// release does not start with `major.minor`.
fn release_at_least(release: &str, wanted: (u32, u32)) -> Option<bool> {
    let mut numbers = release.trim().split(['.', '-']);
    let major = numbers.next()?.parse::<u32>().ok()?;
    let minor = numbers.next()?.parse::<u32>().ok()?;
    Some((major, minor) >= wanted)
}

/// Advances the engines' epochs every tick on its own thread; stops when dropped.
///
/// Epoch interruption is how a guest that never returns is made to yield its executor thread
/// (every tick) and, once its deadline passes, stopped.
pub(crate) struct EpochTicker {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    /// Start ticking `engines` every `tick`.
    pub(crate) fn start(engines: Vec<Engine>, tick: Duration) -> std::io::Result<EpochTicker> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("egress-epoch-ticker".into())
            .spawn(move || {
                // The sender is never used to send: its drop disconnects the channel.
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(tick) {
                    for engine in &engines {
                        engine.increment_epoch();
                    }
                }
            })?;
        Ok(EpochTicker {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // The thread only sleeps and increments a counter: it cannot panic.
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::release_at_least;

    #[test]
    fn kernel_releases_compare_by_major_then_minor() {
        assert_eq!(release_at_least("6.18.44-fc-v669\n", (6, 7)), Some(true));
        assert_eq!(release_at_least("6.7.0", (6, 7)), Some(true));
        assert_eq!(release_at_least("6.6.30-generic", (6, 7)), Some(false));
        assert_eq!(release_at_least("5.15.0-105-generic", (6, 7)), Some(false));
        assert_eq!(release_at_least("7.0", (6, 7)), Some(true));
        assert_eq!(release_at_least("garbage", (6, 7)), None);
    }
}
