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

use std::sync::Arc;
use std::time::Instant;

use http::HeaderName;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{
    ForbiddenHeaderFilter, RequestOptions, WasiBody, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks,
    WasiHttpView,
};

use crate::egress::{CallSite, Egress};
use crate::limits::Limits;
use crate::wit::latest::log;

/// How much of a guest's stderr is kept for error messages.
pub(crate) const STDERR_CAPACITY: usize = 8 * 1024;
/// Longest guest log message forwarded to tracing; longer ones are cut.
const MAX_LOG_MESSAGE: usize = 4 * 1024;

/// Store data for one call: owned by that call's `Store`, shared with nothing else.
pub(crate) struct HostState {
    /// Resources (streams, HTTP requests) the guest holds handles to.
    table: ResourceTable,
    /// WASI context granting nothing (see the module docs).
    wasi: WasiCtx,
    /// wasi:http state (field size limits).
    http: WasiHttpCtx,
    /// Where outgoing HTTP goes: the runtime's shared [`Egress`], tagged with this call's site.
    hooks: EgressHooks,
    /// Memory, table and instance caps for this store.
    pub(crate) limiter: CallLimiter,
    /// When the operation's wall-clock deadline passes.
    pub(crate) deadline: Instant,
    /// Set by the epoch callback when it stopped the guest at `deadline`.
    pub(crate) deadline_passed: bool,
    /// The guest's captured stderr (bounded).
    stderr: MemoryOutputPipe,
}

impl HostState {
    /// State for one call of `site` with `limits`, stopping at `deadline`.
    pub(crate) fn new(
        site: CallSite,
        egress: Arc<dyn Egress>,
        limits: &Limits,
        deadline: Instant,
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
        HostState {
            table: ResourceTable::new(),
            wasi,
            http: WasiHttpCtx::new(),
            hooks: EgressHooks { egress, site },
            limiter: CallLimiter::new(limits),
            deadline,
            deadline_passed: false,
            stderr,
        }
    }

    /// What the guest wrote to stderr so far, lossily decoded and trimmed.
    pub(crate) fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.contents())
            .trim()
            .to_owned()
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

/// Adapts the runtime's [`Egress`] to wasmtime-wasi-http's hooks: the one place that knows the
/// hook's shape.
struct EgressHooks {
    egress: Arc<dyn Egress>,
    site: CallSite,
}

impl WasiHttpHooks for EgressHooks {
    fn is_forbidden_header(&mut self, name: &HeaderName) -> bool {
        self.egress.is_forbidden_header(name)
    }

    fn forbidden_header_filter(&mut self) -> ForbiddenHeaderFilter {
        let egress = Arc::clone(&self.egress);
        Arc::new(move |name| egress.is_forbidden_header(name))
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _request_body_errors: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> Box<
        dyn Future<
                Output = wasmtime_wasi_http::Result<(
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
                )>,
            > + Send,
    > {
        let response = self.egress.send(&self.site, request, options);
        Box::new(async move {
            let response = response.await?;
            // The egress drives its own connection; there is no separate I/O task to report.
            let io_done: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send> =
                Box::new(async { Ok(()) });
            Ok((response, io_done))
        })
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

impl log::Host for HostState {
    fn emit(&mut self, level: log::Level, message: String, fields: Vec<log::Field>) {
        let message = truncate(&message, MAX_LOG_MESSAGE);
        let fields = render_fields(&fields);
        // Emitted inside the call's `provider_call` span, which carries provider, version,
        // operation and proxy.
        match level {
            log::Level::Trace => {
                tracing::trace!(target: "egress_runtime::guest", fields = %fields, "{message}")
            }
            log::Level::Debug => {
                tracing::debug!(target: "egress_runtime::guest", fields = %fields, "{message}")
            }
            log::Level::Info => {
                tracing::info!(target: "egress_runtime::guest", fields = %fields, "{message}")
            }
            log::Level::Warn => {
                tracing::warn!(target: "egress_runtime::guest", fields = %fields, "{message}")
            }
            log::Level::Error => {
                tracing::error!(target: "egress_runtime::guest", fields = %fields, "{message}")
            }
        }
    }
}

/// `k=v` pairs separated by spaces; values with spaces or quotes are quoted (Debug form).
fn render_fields(fields: &[log::Field]) -> String {
    let mut rendered = String::new();
    for field in fields {
        if !rendered.is_empty() {
            rendered.push(' ');
        }
        rendered.push_str(truncate(&field.key, 128));
        rendered.push('=');
        let value = truncate(&field.value, 1024);
        if value.is_empty() || value.contains(|c: char| c.is_whitespace() || c == '"' || c == '=') {
            rendered.push_str(&format!("{value:?}"));
        } else {
            rendered.push_str(value);
        }
    }
    rendered
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(key: &str, value: &str) -> log::Field {
        log::Field {
            key: key.into(),
            value: value.into(),
        }
    }

    #[test]
    fn fields_render_as_key_value_pairs_quoting_when_needed() {
        let rendered = render_fields(&[
            field("node", "pve1"),
            field("vmid", "123"),
            field("reason", "lock held"),
            field("empty", ""),
        ]);
        assert_eq!(
            rendered,
            r#"node=pve1 vmid=123 reason="lock held" empty="""#
        );
    }

    #[test]
    fn truncate_respects_character_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("abc", 10), "abc");
    }

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
