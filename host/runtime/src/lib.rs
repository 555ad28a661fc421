//! # egress-runtime: the wasmtime host for provider components
//!
//! Providers are WebAssembly components exporting `egress:provider/provider` (see `wit/`). This
//! crate loads them, sandboxes them, bounds them and swaps them while they serve.
//!
//! - [`Runtime`] owns one wasmtime [`Engine`](wasmtime::Engine) (pooling allocator,
//!   copy-on-write memory images, epoch interruption), the linker, the [`Limits`], an on-disk
//!   compile cache and the [`Egress`] every provider's outgoing HTTP goes through.
//! - [`Runtime::load_file`] validates a component before it serves — a wasm component, a
//!   supported contract version, no import the host does not provide, a working `describe` — and
//!   returns a [`Provider`]. Each problem is its own [`LoadError`] with a one-line message naming
//!   the file.
//! - [`Provider::call`] runs one [`Request`] in a **fresh instance** with a memory cap, a
//!   wall-clock deadline per [`Operation`] and a per-provider concurrency bound. A guest that
//!   spins yields its thread every epoch tick and is stopped at its deadline; a memory bomb is
//!   stopped at its cap; a panic becomes [`CallError::Trap`] carrying the panic message. The
//!   host never panics on guest behaviour. [`CallError::class`] says whether to retry.
//! - [`Registry::watch`] serves every `*.wasm` of a directory and hot-swaps them on change:
//!   new generations are validated off the call path and published atomically, calls in flight
//!   finish on the generation they started on, and a broken file leaves the old one serving.
//!
//! ## The sandbox
//!
//! A provider gets outgoing HTTP through the host's [`Egress`] (default [`DenyAll`]; the broker
//! crate `egress-capability-http` implements grants and credential injection), clocks,
//! randomness and the contract's `log` interface, whose lines become `tracing` events inside the
//! call's `provider_call` span (fields `provider`, `version`, `operation`, `proxy`). Rust
//! components import all of WASI 0.2 even when unused, so the linker provides it, but the WASI
//! context grants nothing: no files, environment, arguments, sockets or stdio (stderr is
//! captured, bounded, for error messages).
//!
//! ## Example
//!
//! ```no_run
//! use std::path::Path;
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use egress_runtime::{CallContext, DenyAll, Limits, Operation, Request, Runtime, RuntimeConfig};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = Limits::default().deadline(Operation::Get, Duration::from_secs(10));
//! let runtime = Runtime::new(RuntimeConfig::default().limits(limits), Arc::new(DenyAll))?;
//!
//! let provider = runtime.load_file(Path::new("providers/proxmox.wasm")).await?;
//! println!("{} {}", provider.description().name, provider.description().version);
//!
//! let request = Request::Get { config: "{}".into(), provider_id: "pve1/100".into() };
//! let context = CallContext { proxy: Some("default/egress".into()) };
//! match provider.call(request, &context).await {
//!     Ok(response) => println!("{}", serde_json::to_string(&response)?),
//!     Err(error) => eprintln!("{error} (retry class: {})", error.class()),
//! }
//! # Ok(()) }
//! ```

mod cache;
mod call;
mod cpu;
pub mod egress;
mod engine;
mod error;
mod limits;
mod log;
mod provider;
mod registry;
mod runtime;
mod state;
pub mod types;
pub mod wit;

pub use cache::default_cache_dir;
pub use egress::{CallSite, DenyAll, Egress, default_forbidden_header};
pub use error::{Budget, CallError, LoadError, RegistryError, RuntimeError};
pub use limits::Limits;
pub use provider::{CallContext, Provider};
pub use registry::{Registry, RegistryEvent};
pub use runtime::{Runtime, RuntimeConfig};
pub use types::{
    Capability, CheckReason, CheckResult, CreateRequest, Description, ErrorClass, Instance,
    InstanceState, Operation, ProviderError, Request, Response, Tag, UnknownOperation,
};
