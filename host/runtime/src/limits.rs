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
/// The least CPU time a call may be given: a Rust component's instantiation and a small call
/// fit in a few milliseconds, a Python one needs more.
const MIN_CPU_TIME: Duration = Duration::from_millis(50);
/// The least a transfer from the guest may carry: a description with its JSON Schema.
const MIN_TRANSFER_BYTES: usize = 64 << 10;
/// The fewest host resources a call may hold at once: one HTTP exchange needs about ten.
const MIN_RESOURCE_HANDLES: usize = 32;
/// The smallest header list a guest may build: room for a few ordinary headers.
const MIN_HEADER_BYTES: usize = 1 << 10;
/// The smallest buffer for an outgoing body: one `blocking-write-and-flush` (4 KiB).
const MIN_BODY_BUFFER_BYTES: usize = 4 << 10;

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
///
/// # What a guest can make the host hold
///
/// Besides its own linear memory (`memory_bytes`), a call can make the host allocate only through
/// what it imports. Each of those is bounded per call, and exceeding a bound stops the call with
/// its own [`CallError::Budget`](crate::CallError::Budget):
///
/// | budget | default | what it bounds |
/// |---|---|---|
/// | [`cpu_time`](Limits::cpu_time) | 10 s create/delete, 5 s others | time spent computing, apart from the wall deadline spent waiting |
/// | [`transfer_bytes`](Limits::transfer_bytes) | 8 MiB | bytes lifted out of the guest in one transfer: the call's result, or the arguments of one host call (wasmtime's hostcall fuel) |
/// | [`log_lines`](Limits::log_lines) | 1 000 | lines a call may log |
/// | [`log_bytes`](Limits::log_bytes) | 256 KiB | bytes of log a call may keep (each message is read up to 4 KiB, never lifted whole) |
/// | [`resource_handles`](Limits::resource_handles) | 256 | host resources (fields, requests, bodies, streams, pollables) alive at once |
/// | [`header_bytes`](Limits::header_bytes) | 32 KiB | bytes of one header list the guest builds |
/// | [`body_buffer_bytes`](Limits::body_buffer_bytes) | 64 KiB | bytes of one outgoing body buffered in the host |
/// | [`requests_in_flight`](Limits::requests_in_flight) | 16 | outgoing HTTP requests whose response is not yet dropped: sockets |
/// | [`http_bytes_sent`](Limits::http_bytes_sent) | 256 MiB | bytes of outgoing HTTP request bodies in one call: what a provider can make an origin absorb |
/// | [`http_bytes_received`](Limits::http_bytes_received) | 256 MiB | bytes of HTTP response bodies in one call |
///
/// So the host memory one call can hold beyond its linear memory is at most
/// [`host_bytes_bound`](Limits::host_bytes_bound) (about 32 MiB with the defaults), plus one
/// result of `transfer_bytes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    memory_bytes: usize,
    table_elements: usize,
    instances_per_store: usize,
    deadlines: [Duration; Operation::ALL.len()],
    cpu_times: [Duration; Operation::ALL.len()],
    concurrency_per_provider: usize,
    max_concurrent_instances: u32,
    epoch_tick: Duration,
    transfer_bytes: usize,
    log_lines: usize,
    log_bytes: usize,
    resource_handles: usize,
    header_bytes: usize,
    body_buffer_bytes: usize,
    requests_in_flight: usize,
    http_bytes_sent: u64,
    http_bytes_received: u64,
}

impl Default for Limits {
    fn default() -> Self {
        let mut deadlines = [Duration::ZERO; Operation::ALL.len()];
        let mut cpu_times = [Duration::ZERO; Operation::ALL.len()];
        for operation in Operation::ALL {
            deadlines[operation as usize] = match operation {
                Operation::Create => Duration::from_secs(15 * 60),
                Operation::Delete => Duration::from_secs(10 * 60),
                Operation::Get | Operation::Check => Duration::from_secs(30),
                Operation::ListByTag => Duration::from_secs(60),
                Operation::Describe | Operation::ValidateConfig => Duration::from_secs(5),
            };
            cpu_times[operation as usize] = match operation {
                Operation::Create | Operation::Delete => Duration::from_secs(10),
                _ => Duration::from_secs(5),
            };
        }
        Limits {
            memory_bytes: 64 << 20,
            table_elements: 20_000,
            instances_per_store: 32,
            deadlines,
            cpu_times,
            concurrency_per_provider: 8,
            max_concurrent_instances: 64,
            epoch_tick: Duration::from_millis(10),
            transfer_bytes: 8 << 20,
            log_lines: 1_000,
            log_bytes: 256 << 10,
            resource_handles: 256,
            header_bytes: 32 << 10,
            body_buffer_bytes: 64 << 10,
            requests_in_flight: 16,
            http_bytes_sent: 256 << 20,
            http_bytes_received: 256 << 20,
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

    /// CPU time one operation may spend computing (instantiation included), counted only while
    /// the guest runs, not while it waits for I/O or a timer. A call that computes past it is
    /// stopped in seconds even when its wall-clock deadline is many minutes away. Defaults: create
    /// and delete 10 s, every other operation 5 s. At least 50 ms.
    pub fn cpu_time(mut self, operation: Operation, cpu: Duration) -> Self {
        self.cpu_times[operation as usize] = cpu.max(MIN_CPU_TIME);
        self
    }

    /// Bytes the guest may hand the host in one transfer: the call's result, or the arguments of
    /// one host call (a log line, a header list). It is wasmtime's hostcall fuel, counted before
    /// anything is copied. Defaults to 8 MiB; at least 64 KiB.
    pub fn transfer_bytes(mut self, bytes: usize) -> Self {
        self.transfer_bytes = bytes.max(MIN_TRANSFER_BYTES);
        self
    }

    /// Log lines one call may write. Defaults to 1 000; at least 1.
    pub fn log_lines(mut self, lines: usize) -> Self {
        self.log_lines = lines.max(1);
        self
    }

    /// Bytes of log one call may keep (messages cut to 4 KiB, fields to 32 of 128-byte keys and
    /// 1 KiB values count as kept). Defaults to 256 KiB; at least 4 KiB.
    pub fn log_bytes(mut self, bytes: usize) -> Self {
        self.log_bytes = bytes.max(4 << 10);
        self
    }

    /// Host resources (header lists, requests, bodies, streams, pollables) one call may hold at
    /// once. Defaults to 256; at least 32.
    pub fn resource_handles(mut self, handles: usize) -> Self {
        self.resource_handles = handles.max(MIN_RESOURCE_HANDLES);
        self
    }

    /// Bytes of names and values in one header list a guest builds. Defaults to 32 KiB; at least
    /// 1 KiB.
    pub fn header_bytes(mut self, bytes: usize) -> Self {
        self.header_bytes = bytes.max(MIN_HEADER_BYTES);
        self
    }

    /// Bytes of one outgoing request body the host buffers before the guest must wait for them to
    /// be sent. Defaults to 64 KiB; at least 4 KiB.
    pub fn body_buffer_bytes(mut self, bytes: usize) -> Self {
        self.body_buffer_bytes = bytes.max(MIN_BODY_BUFFER_BYTES);
        self
    }

    /// Outgoing HTTP requests one call may have in flight (sent, response not yet dropped): each
    /// holds a connection. Defaults to 16; at least 1.
    pub fn requests_in_flight(mut self, requests: usize) -> Self {
        self.requests_in_flight = requests.max(1);
        self
    }

    /// Bytes of outgoing HTTP request bodies one call may send, across all its requests: past
    /// them the request being sent fails and so does the call, with
    /// [`Budget::HttpBytesSent`](crate::Budget::HttpBytesSent). Defaults to 256 MiB; raise it for
    /// a provider that uploads large files (seed images).
    pub fn http_bytes_sent(mut self, bytes: u64) -> Self {
        self.http_bytes_sent = bytes;
        self
    }

    /// Bytes of HTTP response bodies one call may receive, across all its requests, with
    /// [`Budget::HttpBytesReceived`](crate::Budget::HttpBytesReceived) past them. Defaults to
    /// 256 MiB.
    pub fn http_bytes_received(mut self, bytes: u64) -> Self {
        self.http_bytes_received = bytes;
        self
    }

    /// Calls of one provider (by identity, across hot swaps) running at once; further calls wait.
    /// Defaults to 8; at least 1.
    pub fn concurrency_per_provider(mut self, calls: usize) -> Self {
        self.concurrency_per_provider = calls.max(1);
        self
    }

    /// Instances alive at once across all providers: the size of the pooling allocator. Calls
    /// beyond it wait their turn, first come first served, within their deadline. Defaults to 64;
    /// at least 1.
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

    /// The CPU time `operation` may spend.
    pub fn cpu_time_for(&self, operation: Operation) -> Duration {
        self.cpu_times[operation as usize]
    }

    /// The bytes one transfer from the guest may carry (hostcall fuel).
    pub fn transfer_bytes_limit(&self) -> usize {
        self.transfer_bytes
    }

    /// The log lines per call.
    pub fn log_lines_limit(&self) -> usize {
        self.log_lines
    }

    /// The log bytes per call.
    pub fn log_bytes_limit(&self) -> usize {
        self.log_bytes
    }

    /// The host resources a call may hold at once.
    pub fn resource_handles_limit(&self) -> usize {
        self.resource_handles
    }

    /// The bytes of one guest-built header list.
    pub fn header_bytes_limit(&self) -> usize {
        self.header_bytes
    }

    /// The bytes of one outgoing body buffered in the host.
    pub fn body_buffer_bytes_limit(&self) -> usize {
        self.body_buffer_bytes
    }

    /// The outgoing requests a call may have in flight.
    pub fn requests_in_flight_limit(&self) -> usize {
        self.requests_in_flight
    }

    /// The bytes of request bodies a call may send over HTTP.
    pub fn http_bytes_sent_limit(&self) -> u64 {
        self.http_bytes_sent
    }

    /// The bytes of response bodies a call may receive over HTTP.
    pub fn http_bytes_received_limit(&self) -> u64 {
        self.http_bytes_received
    }

    /// The most host memory one call can hold through its resources: every handle a header list
    /// or an outgoing body at its cap (a body buffers at most two chunks). Results and host-call
    /// arguments add at most one [`transfer_bytes`](Limits::transfer_bytes) at a time.
    pub fn host_bytes_bound(&self) -> usize {
        self.resource_handles
            .saturating_mul(self.header_bytes.max(2 * self.body_buffer_bytes))
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
        assert_eq!(
            limits.cpu_time_for(Operation::Create),
            Duration::from_secs(10)
        );
        assert_eq!(
            limits.cpu_time_for(Operation::Delete),
            Duration::from_secs(10)
        );
        assert_eq!(limits.cpu_time_for(Operation::Get), Duration::from_secs(5));
        assert_eq!(limits.transfer_bytes_limit(), 8 << 20);
        assert_eq!(limits.log_lines_limit(), 1_000);
        assert_eq!(limits.log_bytes_limit(), 256 << 10);
        assert_eq!(limits.resource_handles_limit(), 256);
        assert_eq!(limits.header_bytes_limit(), 32 << 10);
        assert_eq!(limits.body_buffer_bytes_limit(), 64 << 10);
        assert_eq!(limits.requests_in_flight_limit(), 16);
        // The documented bound: 256 handles of 128 KiB (a body's two 64 KiB chunks).
        assert_eq!(limits.host_bytes_bound(), 32 << 20);
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
            .epoch_tick(Duration::ZERO)
            .cpu_time(Operation::Get, Duration::ZERO)
            .transfer_bytes(0)
            .log_lines(0)
            .log_bytes(0)
            .resource_handles(0)
            .header_bytes(0)
            .body_buffer_bytes(0)
            .requests_in_flight(0);
        assert_eq!(limits.memory_bytes_limit(), MIN_MEMORY_BYTES);
        assert_eq!(limits.table_elements_limit(), MIN_TABLE_ELEMENTS);
        assert_eq!(limits.instances_per_store_limit(), MIN_INSTANCES);
        assert_eq!(limits.deadline_for(Operation::Get), MIN_DEADLINE);
        assert_eq!(limits.concurrency_per_provider_limit(), 1);
        assert_eq!(limits.max_concurrent_instances_limit(), 1);
        assert_eq!(limits.epoch_tick_interval(), MIN_EPOCH_TICK);
        assert_eq!(limits.cpu_time_for(Operation::Get), MIN_CPU_TIME);
        assert_eq!(limits.transfer_bytes_limit(), MIN_TRANSFER_BYTES);
        assert_eq!(limits.log_lines_limit(), 1);
        assert_eq!(limits.log_bytes_limit(), 4 << 10);
        assert_eq!(limits.resource_handles_limit(), MIN_RESOURCE_HANDLES);
        assert_eq!(limits.header_bytes_limit(), MIN_HEADER_BYTES);
        assert_eq!(limits.body_buffer_bytes_limit(), MIN_BODY_BUFFER_BYTES);
        assert_eq!(limits.requests_in_flight_limit(), 1);
        // Setting one operation's deadline leaves the others alone.
        assert_eq!(
            limits.deadline_for(Operation::Create),
            Duration::from_secs(900)
        );
    }
}
