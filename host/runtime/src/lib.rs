//! # egress-runtime: the wasmtime host for provider components
//!
//! Providers are WebAssembly components exporting `egress:provider/provider` (the contract, in
//! `wit/`). This crate loads them, sandboxes them, bounds them and swaps them while they serve.
//!
//! - [`Runtime`] owns the wasmtime [`Engine`](wasmtime::Engine) calls settle on (Cranelift,
//!   pooling allocator, copy-on-write memory images, epoch interruption), the linker, the
//!   [`Limits`], an on-disk compile cache and the host's [`Capability`]s, which
//!   [`RuntimeConfig::capability`] adds (the egress broker for outgoing HTTP, libvirt), each with
//!   its own typed [`grant`] per provider identity, set and removed at run time. Under
//!   [`Compilation::Tiered`] (the default) a second engine runs Winch's code for a component
//!   missing from the cache while Cranelift compiles it in the background ([`Tier`]).
//! - [`Runtime::load_file`] validates a component before it serves — a wasm component, a
//!   served contract version, no import the host does not provide, a working `describe` — and
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
//! ## Contract versions
//!
//! Contract versions are served side by side, each from its own frozen WIT folder and module
//! ([`wit`]): every `v` with [`wit::MIN_VERSION`] ≤ `v` < [`wit::MAX_VERSION`] (today 0.1.x and
//! 0.2.x), matched by semver. Whatever the version, a provider is called with the same domain
//! types ([`types`]); [`Provider::contract_version`] says which it exports.
//!
//! ## The sandbox
//!
//! A provider gets clocks, randomness, the log (`egress:provider/log` in 0.1.0, `egress:log/log`
//! from 0.2.0: one host implementation, whose lines become `tracing` events inside the call's
//! `provider_call` span with fields `provider`, `version`, `operation`, `proxy`) and the
//! interfaces of the capabilities it imports ([`capability`]): outgoing HTTP through an
//! [`Egress`] (the broker crate `egress-capability-http` implements grants and credential
//! injection; without it, [`http::HttpCapability`] over [`DenyAll`]), and libvirt when the
//! runtime has it. What a provider needs is read
//! from its imports ([`Provider::capabilities`]). Rust components import all of WASI 0.2 even
//! when unused, so the linker provides it, but the WASI context grants nothing: no files,
//! environment, arguments, sockets or stdio (stderr is captured, bounded, for error messages).
//!
//! ## Example
//!
//! ```no_run
//! use std::path::Path;
//! use std::time::Duration;
//!
//! use egress_runtime::{CallContext, Limits, Operation, Request, Runtime, RuntimeConfig};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = Limits::default().deadline(Operation::Get, Duration::from_secs(10));
//! let runtime = Runtime::new(RuntimeConfig::default().limits(limits))?;
//!
//! let provider = runtime.load_file(Path::new("providers/proxmox.wasm")).await?;
//! println!("{} {}", provider.description().name, provider.description().version);
//!
//! let request = Request::Get { config: "{}".into(), provider_id: "pve1/100".into() };
//! let context = CallContext { subject: Some("default/egress".into()), ..CallContext::default() };
//! match provider.call(request, &context).await {
//!     Ok(response) => println!("{}", serde_json::to_string(&response)?),
//!     Err(error) => eprintln!("{error} (retry class: {})", error.class()),
//! }
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod cache;
mod call;
pub mod capability;
mod cpu;
pub mod egress;
mod engine;
mod error;
pub mod grant;
pub mod http;
mod identity;
mod limits;
mod log;
mod provider;
mod registry;
mod runtime;
mod state;
mod sync;
mod tiering;
pub mod types;
pub mod wit;

pub use cache::default_cache_dir;
pub use capability::{Capability, PrepareContext};
// The digest of a component's bytes (`Provider::component_digest`), in a leaf crate of its own so
// that crates without wasmtime share it.
pub use egress::{
    CallSite, Chain, DenyAll, Egress, Outgoing, Refusal, RefusalReporter, Tap,
    default_forbidden_header,
};
pub use egress_digest::{Digest, ParseDigestError};
pub use engine::{Compilation, Tier};
pub use error::{Budget, CallError, LoadError, RegistryError, RuntimeError};
pub use limits::Limits;
pub use provider::{CallContext, Provider};
pub use registry::{Registry, RegistryEvent};
pub use runtime::{DEFAULT_MAX_COMPONENT_BYTES, Runtime, RuntimeConfig};
pub use state::HostState;
pub use sync::lock;
pub use types::{
    CheckReason, CheckResult, CreateRequest, Description, ErrorClass, Operation, ProviderError,
    Request, Response, Tag, UnknownOperation, Vm, VmState,
};
// `semver`, in which contract versions are given (`Provider::contract_version`).
pub use semver;
