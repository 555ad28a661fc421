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
//! Outgoing HTTP (`wasi:http/outgoing-handler`) goes through [`EgressHooks`] to the host's
//! [`Egress`]; the guest never opens a connection itself. Clocks and randomness are the host's.
//!
//! # What a provider can make the host hold
//!
//! Every host resource a call can grow is bounded here, from its [`Limits`]: the resource table
//! and the store's handle count (`resource_handles`), each header list the guest builds
//! (`header_bytes`), each outgoing body's buffer (`body_buffer_bytes`), the requests in flight
//! (`requests_in_flight`), the log (`log_lines`, `log_bytes`) and the stderr capture (8 KiB).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::HeaderName;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{
    ForbiddenHeaderFilter, RequestOptions, WasiBody, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks,
    WasiHttpView,
};

use crate::cpu::CpuMeter;
use crate::egress::{CallSite, Egress, EgressError};
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

/// Store data for one call: owned by that call's `Store`, shared with nothing else.
pub(crate) struct HostState {
    /// Resources (streams, HTTP requests) the guest holds handles to; capped at the call's
    /// `resource_handles`.
    table: ResourceTable,
    /// WASI context granting nothing (see the module docs).
    wasi: WasiCtx,
    /// wasi:http state (the header list size limit).
    http: WasiHttpCtx,
    /// Where outgoing HTTP goes: the runtime's shared [`Egress`], tagged with this call's site.
    hooks: EgressHooks,
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

impl HostState {
    /// State for one call of `site` with `limits`, stopping at `deadline` or after `cpu_budget`
    /// of CPU time.
    pub(crate) fn new(
        site: CallSite,
        egress: Arc<dyn Egress>,
        limits: &Limits,
        deadline: Instant,
        cpu_budget: Duration,
    ) -> HostState {
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        let wasi = WasiCtx::builder()
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
        let mut http = WasiHttpCtx::new();
        http.set_field_size_limit(limits.header_bytes_limit());
        HostState {
            table,
            wasi,
            http,
            log: LogBudget::new(site.clone(), limits),
            hooks: EgressHooks {
                egress,
                site,
                in_flight: Arc::new(Semaphore::new(limits.requests_in_flight_limit())),
                in_flight_limit: limits.requests_in_flight_limit(),
                in_flight_exceeded: Arc::new(AtomicBool::new(false)),
                body_buffer_bytes: limits.body_buffer_bytes_limit(),
            },
            limiter: CallLimiter::new(limits),
            deadline,
            cpu: Arc::new(CpuMeter::default()),
            cpu_budget,
            stop: None,
            stderr,
        }
    }

    /// What the guest wrote to stderr so far, lossily decoded and trimmed.
    pub(crate) fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.contents())
            .trim()
            .to_owned()
    }

    /// Whether the guest was refused a request beyond its in-flight budget: the call fails for
    /// it, whatever the guest answered, unless something else stopped it first.
    pub(crate) fn in_flight_exceeded(&self) -> Option<Stop> {
        self.hooks
            .in_flight_exceeded
            .load(Ordering::Relaxed)
            .then_some(Stop::Budget(
                Budget::RequestsInFlight,
                self.hooks.in_flight_limit as u64,
            ))
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

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
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

/// Adapts the runtime's [`Egress`] to wasmtime-wasi-http's hooks: the one place that knows the
/// hook's shape. It also holds the call's in-flight budget: each request takes a permit, which
/// its response body keeps until the guest drops it.
struct EgressHooks {
    egress: Arc<dyn Egress>,
    site: CallSite,
    /// Requests in flight for this call.
    in_flight: Arc<Semaphore>,
    in_flight_limit: usize,
    /// Set when a request was refused for want of a permit.
    in_flight_exceeded: Arc<AtomicBool>,
    body_buffer_bytes: usize,
}

type IoFuture = Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>;

impl WasiHttpHooks for EgressHooks {
    fn is_forbidden_header(&mut self, name: &HeaderName) -> bool {
        self.egress.is_forbidden_header(name)
    }

    fn forbidden_header_filter(&mut self) -> ForbiddenHeaderFilter {
        let egress = Arc::clone(&self.egress);
        Arc::new(move |name| egress.is_forbidden_header(name))
    }

    fn p2_outgoing_body_buffer_chunks(&mut self) -> usize {
        1
    }

    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        self.body_buffer_bytes
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _request_body_errors: IoFuture,
    ) -> Box<
        dyn Future<Output = wasmtime_wasi_http::Result<(http::Response<WasiBody>, IoFuture)>>
            + Send,
    > {
        let Ok(permit) = Arc::clone(&self.in_flight).try_acquire_owned() else {
            self.in_flight_exceeded.store(true, Ordering::Relaxed);
            tracing::warn!(
                provider = %self.site.provider,
                operation = self.site.operation,
                limit = self.in_flight_limit,
                "outgoing HTTP refused: too many requests in flight"
            );
            return Box::new(async { Err(EgressError::ConnectionLimitReached) });
        };
        let response = self.egress.send(&self.site, request, options);
        Box::new(async move {
            let response = response.await?;
            // The egress drives its own connection; there is no separate I/O task to report.
            let io_done: IoFuture = Box::new(async { Ok(()) });
            let response = response.map(|body| {
                PermitBody {
                    body,
                    _permit: permit,
                }
                .boxed_unsync()
            });
            Ok((response, io_done))
        })
    }
}

/// A response body that holds its request's in-flight permit until the guest drops it.
struct PermitBody {
    body: WasiBody,
    _permit: OwnedSemaphorePermit,
}

impl Body for PermitBody {
    type Data = bytes::Bytes;
    type Error = EgressError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
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
