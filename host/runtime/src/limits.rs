//! Resource limits for provider calls.
//!
//! Every builder method states its default and clamps its input to a sane minimum (a wasmCloud
//! habit): a zero deadline or a 1-byte memory cap would only produce confusing failures.

use std::time::Duration;

use crate::types::Operation;

/// The smallest memory cap accepted: one wasm page (64 KiB) is too little for any real
/// component, 1 MiB is the least a Rust component needs to start.
const MIN_MEMORY_BYTES: usize = 1 << 20;
/// The smallest table size accepted.
const MIN_TABLE_ELEMENTS: usize = 1_000;
/// The smallest per-store instance count accepted: a Rust wasip2 component instantiates several
/// core instances (the main module plus adapter shims).
const MIN_INSTANCES: usize = 8;
/// The shortest operation deadline accepted: two epoch ticks must fit in it with room to spare.
const MIN_DEADLINE: Duration = Duration::from_millis(100);
/// The shortest epoch tick accepted.
const MIN_EPOCH_TICK: Duration = Duration::from_millis(1);

/// Limits applied to every provider call. Cheap to clone.
///
/// ```
/// use std::time::Duration;
/// use egress_runtime::{Limits, Operation};
///
/// let limits = Limits::default()
///     .memory_bytes(32 << 20)
///     .deadline(Operation::Get, Duration::from_secs(5))
///     .concurrency_per_provider(4);
/// assert_eq!(limits.deadline_for(Operation::Get), Duration::from_secs(5));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    memory_bytes: usize,
    table_elements: usize,
    instances_per_store: usize,
    deadlines: [Duration; Operation::ALL.len()],
    concurrency_per_provider: usize,
    max_concurrent_instances: u32,
    epoch_tick: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        let mut deadlines = [Duration::ZERO; Operation::ALL.len()];
        for operation in Operation::ALL {
            deadlines[operation as usize] = match operation {
                Operation::Create => Duration::from_secs(15 * 60),
                Operation::Delete => Duration::from_secs(10 * 60),
                Operation::Get | Operation::Check => Duration::from_secs(30),
                Operation::ListByTag => Duration::from_secs(60),
                Operation::Describe | Operation::ValidateConfig => Duration::from_secs(5),
            };
        }
        Limits {
            memory_bytes: 64 << 20,
            table_elements: 20_000,
            instances_per_store: 32,
            deadlines,
            concurrency_per_provider: 8,
            max_concurrent_instances: 64,
            epoch_tick: Duration::from_millis(10),
        }
    }
}

impl Limits {
    /// Linear memory cap per instance, in bytes. Defaults to 64 MiB; at least 1 MiB.
    ///
    /// A call whose guest tries to grow past it fails with `CallError::MemoryCap`.
    pub fn memory_bytes(mut self, bytes: usize) -> Self {
        self.memory_bytes = bytes.max(MIN_MEMORY_BYTES);
        self
    }

    /// Elements per table. Defaults to 20 000; at least 1 000.
    pub fn table_elements(mut self, elements: usize) -> Self {
        self.table_elements = elements.max(MIN_TABLE_ELEMENTS);
        self
    }

    /// Core instances (and as many tables and memories) per call's store. Defaults to 32; at
    /// least 8.
    pub fn instances_per_store(mut self, instances: usize) -> Self {
        self.instances_per_store = instances.max(MIN_INSTANCES);
        self
    }

    /// Wall-clock deadline of one operation, covering the wait for a concurrency permit and
    /// the call itself. Defaults: create 15 min, delete 10 min, get 30 s, list-by-tag 60 s,
    /// check 30 s, describe and validate-config 5 s. At least 100 ms.
    pub fn deadline(mut self, operation: Operation, deadline: Duration) -> Self {
        self.deadlines[operation as usize] = deadline.max(MIN_DEADLINE);
        self
    }

    /// Calls of one provider (by name, across hot swaps) running at once; further calls wait.
    /// Defaults to 8; at least 1.
    pub fn concurrency_per_provider(mut self, calls: usize) -> Self {
        self.concurrency_per_provider = calls.max(1);
        self
    }

    /// Instances alive at once across all providers: the size of the pooling allocator.
    /// Defaults to 64; at least 1.
    pub fn max_concurrent_instances(mut self, instances: u32) -> Self {
        self.max_concurrent_instances = instances.max(1);
        self
    }

    /// How often the engine's epoch advances: the granularity of deadlines and how long a
    /// spinning guest runs before yielding its thread. Defaults to 10 ms; at least 1 ms.
    pub fn epoch_tick(mut self, tick: Duration) -> Self {
        self.epoch_tick = tick.max(MIN_EPOCH_TICK);
        self
    }

    /// The linear memory cap per instance, in bytes.
    pub fn memory_bytes_limit(&self) -> usize {
        self.memory_bytes
    }

    /// The table element cap.
    pub fn table_elements_limit(&self) -> usize {
        self.table_elements
    }

    /// The per-store instance cap.
    pub fn instances_per_store_limit(&self) -> usize {
        self.instances_per_store
    }

    /// The deadline of `operation`.
    pub fn deadline_for(&self, operation: Operation) -> Duration {
        self.deadlines[operation as usize]
    }

    /// The per-provider concurrency.
    pub fn concurrency_per_provider_limit(&self) -> usize {
        self.concurrency_per_provider
    }

    /// The pooling allocator's instance count.
    pub fn max_concurrent_instances_limit(&self) -> u32 {
        self.max_concurrent_instances
    }

    /// The epoch tick.
    pub fn epoch_tick_interval(&self) -> Duration {
        self.epoch_tick
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_documented_values() {
        let limits = Limits::default();
        assert_eq!(limits.memory_bytes_limit(), 64 << 20);
        assert_eq!(
            limits.deadline_for(Operation::Create),
            Duration::from_secs(900)
        );
        assert_eq!(
            limits.deadline_for(Operation::Delete),
            Duration::from_secs(600)
        );
        assert_eq!(limits.deadline_for(Operation::Get), Duration::from_secs(30));
        assert_eq!(
            limits.deadline_for(Operation::ListByTag),
            Duration::from_secs(60)
        );
        assert_eq!(
            limits.deadline_for(Operation::Check),
            Duration::from_secs(30)
        );
        assert_eq!(
            limits.deadline_for(Operation::Describe),
            Duration::from_secs(5)
        );
        assert_eq!(
            limits.deadline_for(Operation::ValidateConfig),
            Duration::from_secs(5)
        );
        assert_eq!(limits.concurrency_per_provider_limit(), 8);
        assert_eq!(limits.max_concurrent_instances_limit(), 64);
        assert_eq!(limits.epoch_tick_interval(), Duration::from_millis(10));
    }

    #[test]
    fn values_are_clamped_to_minimums() {
        let limits = Limits::default()
            .memory_bytes(1)
            .table_elements(0)
            .instances_per_store(0)
            .deadline(Operation::Get, Duration::ZERO)
            .concurrency_per_provider(0)
            .max_concurrent_instances(0)
            .epoch_tick(Duration::ZERO);
        assert_eq!(limits.memory_bytes_limit(), MIN_MEMORY_BYTES);
        assert_eq!(limits.table_elements_limit(), MIN_TABLE_ELEMENTS);
        assert_eq!(limits.instances_per_store_limit(), MIN_INSTANCES);
        assert_eq!(limits.deadline_for(Operation::Get), MIN_DEADLINE);
        assert_eq!(limits.concurrency_per_provider_limit(), 1);
        assert_eq!(limits.max_concurrent_instances_limit(), 1);
        assert_eq!(limits.epoch_tick_interval(), MIN_EPOCH_TICK);
        // Setting one operation's deadline leaves the others alone.
        assert_eq!(
            limits.deadline_for(Operation::Create),
            Duration::from_secs(900)
        );
    }
}
