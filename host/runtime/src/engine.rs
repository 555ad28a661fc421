//! The one [`wasmtime::Engine`] every provider runs on, and the thread that advances its epoch.

use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, MemoryCreator, PoolingAllocationConfig,
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

/// Build the engine: component model, async, epoch interruption, and either the pooling
/// allocator sized from `limits` with slots of `slot_memory_bytes` of linear memory, or (tests
/// and diagnostics only) `memory_creator`.
pub(crate) fn build_engine(
    limits: &Limits,
    slot_memory_bytes: usize,
    memory_creator: Option<Arc<dyn MemoryCreator>>,
) -> wasmtime::Result<Engine> {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    match memory_creator {
        Some(creator) => {
            // A custom creator owns every linear memory, which the pooling allocator cannot
            // share: fall back to on-demand allocation.
            config.with_host_memory(creator);
            config.allocation_strategy(InstanceAllocationStrategy::OnDemand);
            // Copy-on-write images need mmap-backed memories; wasmtime 48 reaches `unreachable!`
            // when a host-provided memory meets a memory image.
            config.memory_init_cow(false);
        }
        None => {
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
                // Reset a freed slot's touched pages in place instead of `madvise`-ing them away,
                // so the next instance takes no page faults on them: `PAGEMAP_SCAN` (Linux ≥ 6.7)
                // finds exactly the touched pages. A Rust guest's 1 MiB stack sits below its data,
                // so the window must reach past it to cover what a call touches. Without the
                // ioctl the whole window would be `memset` on every reuse, costing more than the
                // faults it saves: older kernels keep wasmtime's default (decommit everything).
                .pagemap_scan(Enabled::Auto);
            if kernel_has_pagemap_scan() {
                pooling
                    .linear_memory_keep_resident(KEEP_RESIDENT_MEMORY_BYTES)
                    .table_keep_resident(KEEP_RESIDENT_TABLE_BYTES);
            }
            config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
            // Fresh instances map the component's data segments copy-on-write instead of
            // copying them: the main reason instantiation takes microseconds.
            config.memory_init_cow(true);
        }
    }
    Engine::new(&config)
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

/// Advances the engine's epoch every tick on its own thread; stops when dropped.
///
/// Epoch interruption is how a guest that never returns is made to yield its executor thread
/// (every tick) and, once its deadline passes, stopped.
pub(crate) struct EpochTicker {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    /// Start ticking `engine` every `tick`.
    pub(crate) fn start(engine: Engine, tick: Duration) -> std::io::Result<EpochTicker> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("egress-epoch-ticker".into())
            .spawn(move || {
                // The sender is never used to send: its drop disconnects the channel.
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(tick) {
                    engine.increment_epoch();
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
