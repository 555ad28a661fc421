//! Errors: loading a component ([`LoadError`]), calling a provider ([`CallError`]), building the
//! runtime ([`RuntimeError`]) and watching a directory ([`RegistryError`]).

use std::path::PathBuf;
use std::time::Duration;

use crate::types::{ErrorClass, Operation, ProviderError};

/// Why a component file cannot serve. Each message names the file and the problem on one line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The file could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The component is larger than the runtime reads ([`RuntimeConfig::max_component_bytes`]);
    /// it was not read whole.
    ///
    /// [`RuntimeConfig::max_component_bytes`]: crate::RuntimeConfig#structfield.max_component_bytes
    #[error("{}: {size} bytes, over the {cap}-byte cap on a component", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size, or "more than CAP" when it grew while read.
        size: String,
        /// The cap.
        cap: u64,
    },
    /// The identity the component would serve under is not a valid provider name.
    #[error("{}: {problem}", path.display())]
    InvalidIdentity {
        /// The file.
        path: PathBuf,
        /// What is wrong with the identity.
        problem: String,
    },
    /// The file is empty.
    #[error("{}: not a wasm component: the file is empty", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The file is not WebAssembly at all.
    #[error("{}: not a wasm component: {what}", path.display())]
    NotWasm {
        /// The file.
        path: PathBuf,
        /// What it looks like instead (`a text file`, `not WebAssembly`).
        what: &'static str,
    },
    /// The file is a core wasm module, not a component.
    #[error(
        "{}: not a wasm component: it is a core wasm module (build the provider for wasm32-wasip2)",
        path.display()
    )]
    CoreModule {
        /// The file.
        path: PathBuf,
    },
    /// The component failed to parse, validate or compile (for example, it is truncated).
    #[error("{}: invalid wasm component: {message}", path.display())]
    Compile {
        /// The file.
        path: PathBuf,
        /// wasmtime's reason, on one line.
        message: String,
    },
    /// The component exports no `egress:provider/provider` interface.
    #[error(
        "{}: exports no egress:provider/provider interface (wrong world?); its exports: {exports}",
        path.display()
    )]
    MissingExport {
        /// The file.
        path: PathBuf,
        /// The component's exports, comma-separated (`none` when empty).
        exports: String,
    },
    /// The component exports a contract version this host does not serve.
    #[error("{}: exports {export}; this host serves {supported}", path.display())]
    UnsupportedContract {
        /// The file.
        path: PathBuf,
        /// The export, for example `egress:provider/provider@0.9.0`.
        export: String,
        /// The versions this host serves, comma-separated.
        supported: String,
    },
    /// The component imports an interface the host does not provide.
    #[error("{}: imports {import}, which this host does not provide", path.display())]
    UnknownImport {
        /// The file.
        path: PathBuf,
        /// The import's name, for example `acme:exfil/upload@0.1.0`.
        import: String,
    },
    /// The component's imports do not match what the host provides (for example, a function
    /// with a different signature).
    #[error("{}: cannot be linked: {message}", path.display())]
    Link {
        /// The file.
        path: PathBuf,
        /// wasmtime's reason, on one line.
        message: String,
    },
    /// Calling `describe` failed.
    #[error("{}: describe failed: {error}", path.display())]
    Describe {
        /// The file.
        path: PathBuf,
        /// The call's error.
        error: CallError,
    },
    /// `describe` answered something unusable.
    #[error("{}: describe is invalid: {problem}", path.display())]
    InvalidDescription {
        /// The file.
        path: PathBuf,
        /// What is wrong, for example a contract-version disagreeing with the export.
        problem: String,
    },
    /// The host failed while loading (a compile task panicked).
    #[error("{}: host failure while loading: {message}", path.display())]
    Host {
        /// The file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
}

impl LoadError {
    /// The file the error is about.
    pub fn path(&self) -> &std::path::Path {
        match self {
            LoadError::Read { path, .. }
            | LoadError::TooLarge { path, .. }
            | LoadError::InvalidIdentity { path, .. }
            | LoadError::Empty { path }
            | LoadError::NotWasm { path, .. }
            | LoadError::CoreModule { path }
            | LoadError::Compile { path, .. }
            | LoadError::MissingExport { path, .. }
            | LoadError::UnsupportedContract { path, .. }
            | LoadError::UnknownImport { path, .. }
            | LoadError::Link { path, .. }
            | LoadError::Describe { path, .. }
            | LoadError::InvalidDescription { path, .. }
            | LoadError::Host { path, .. } => path,
        }
    }
}

/// Why a provider call failed.
///
/// [`CallError::class`] tells the caller whether to retry: a missed deadline, a busy provider
/// or an exhausted instance pool is transient; a trap, a panic, the memory cap or any other
/// budget is permanent (the same component with the same input will do it again); a provider's
/// own error carries its own class.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The provider ran and reported a failure: its own message (its class is
    /// [`CallError::class`], said once wherever the error is shown).
    #[error("{}", .0.message())]
    Provider(#[from] ProviderError),
    /// The operation did not finish within its deadline and was stopped.
    #[error("{operation} did not finish within its deadline of {after:?} and was stopped")]
    Deadline {
        /// The operation.
        operation: Operation,
        /// The deadline.
        after: Duration,
    },
    /// The guest tried to grow its memory past the cap.
    #[error("the provider exceeded its memory cap of {limit} bytes")]
    MemoryCap {
        /// The cap in bytes.
        limit: usize,
    },
    /// The guest trapped or panicked. The message includes its captured stderr.
    #[error("the provider trapped: {message}")]
    Trap {
        /// The trap and the guest's stderr (for a panic, its message).
        message: String,
    },
    /// The provider's concurrency permits stayed taken for the whole deadline.
    #[error("{operation}: the provider stayed busy (all concurrency permits taken) for {waited:?}")]
    Busy {
        /// The operation.
        operation: Operation,
        /// How long the call waited.
        waited: Duration,
    },
    /// Every slot of the instance pool stayed taken for the whole deadline.
    #[error("{operation}: every instance slot stayed taken for {waited:?}")]
    PoolFull {
        /// The operation.
        operation: Operation,
        /// How long the call waited.
        waited: Duration,
    },
    /// No fresh instance could be made.
    #[error("cannot instantiate the provider: {message}")]
    Instantiate {
        /// wasmtime's reason, on one line.
        message: String,
    },
    /// No provider of that name is loaded.
    #[error("no provider named `{name}` is loaded")]
    NotLoaded {
        /// The requested name.
        name: String,
    },
    /// The guest exceeded one of its per-call budgets (see [`crate::Limits`]) and was stopped.
    #[error("{operation}: {}", budget.describe(*limit))]
    Budget {
        /// The operation.
        operation: Operation,
        /// Which budget.
        budget: Budget,
        /// Its limit, in the budget's unit (bytes, lines, handles, requests, milliseconds).
        limit: u64,
    },
    /// The guest answered a value the host refuses (for example an identifier longer than any
    /// hypervisor's).
    #[error("{operation}: the provider answered an invalid result: {problem}")]
    InvalidResult {
        /// The operation.
        operation: Operation,
        /// What is wrong with it.
        problem: String,
    },
}

/// A per-call budget a guest can exceed; each is a [`crate::Limits`] setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Budget {
    /// CPU time spent computing ([`crate::Limits::cpu_time`]); the limit is in milliseconds.
    CpuTime,
    /// Bytes in one transfer out of the guest: a result or a host call's arguments
    /// ([`crate::Limits::transfer_bytes`]).
    TransferBytes,
    /// Log lines per call ([`crate::Limits::log_lines`]).
    LogLines,
    /// Log bytes per call ([`crate::Limits::log_bytes`]).
    LogBytes,
    /// Host resources held at once ([`crate::Limits::resource_handles`]).
    ResourceHandles,
    /// Bytes of one header list the guest builds ([`crate::Limits::header_bytes`]).
    HeaderBytes,
    /// Outgoing HTTP requests in flight ([`crate::Limits::requests_in_flight`]).
    RequestsInFlight,
    /// Bytes of HTTP request bodies sent in one call ([`crate::Limits::http_bytes_sent`]).
    HttpBytesSent,
    /// Bytes of HTTP response bodies received in one call
    /// ([`crate::Limits::http_bytes_received`]).
    HttpBytesReceived,
}

impl Budget {
    /// A stable lowercase label (`cpu-time`, `transfer-bytes`, …) for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Budget::CpuTime => "cpu-time",
            Budget::TransferBytes => "transfer-bytes",
            Budget::LogLines => "log-lines",
            Budget::LogBytes => "log-bytes",
            Budget::ResourceHandles => "resource-handles",
            Budget::HeaderBytes => "header-bytes",
            Budget::RequestsInFlight => "requests-in-flight",
            Budget::HttpBytesSent => "http-bytes-sent",
            Budget::HttpBytesReceived => "http-bytes-received",
        }
    }

    fn describe(self, limit: u64) -> String {
        match self {
            Budget::CpuTime => format!(
                "the provider computed for more than {limit} ms of CPU time and was stopped"
            ),
            Budget::TransferBytes => format!(
                "the provider handed the host more than {limit} bytes in one transfer (a result, a log line or a header list)"
            ),
            Budget::LogLines => format!("the provider wrote more than {limit} log lines"),
            Budget::LogBytes => format!("the provider wrote more than {limit} bytes of log"),
            Budget::ResourceHandles => format!(
                "the provider held more than {limit} host resources (header lists, requests, streams) at once"
            ),
            Budget::HeaderBytes => {
                format!("the provider built a header list of more than {limit} bytes")
            }
            Budget::RequestsInFlight => format!(
                "the provider had more than {limit} outgoing HTTP requests in flight at once"
            ),
            Budget::HttpBytesSent => format!(
                "the provider sent more than {limit} bytes of HTTP request bodies in one call"
            ),
            Budget::HttpBytesReceived => format!(
                "the provider received more than {limit} bytes of HTTP response bodies in one call"
            ),
        }
    }
}

impl std::fmt::Display for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error a host function returns to stop a guest that exceeded a budget: it traps the call,
/// and the runtime turns it into [`CallError::Budget`].
#[derive(Debug, thiserror::Error)]
#[error("{budget} budget of {limit} exceeded")]
pub(crate) struct BudgetExceeded {
    pub(crate) budget: Budget,
    pub(crate) limit: u64,
}

impl CallError {
    /// The retry class: see the type's documentation.
    ///
    /// `NotLoaded` is transient: a provider file may be arriving by hot reload. A budget or an
    /// invalid result is permanent: the same component with the same input does it again.
    pub fn class(&self) -> ErrorClass {
        match self {
            CallError::Provider(error) => error.class(),
            CallError::Deadline { .. }
            | CallError::Busy { .. }
            | CallError::PoolFull { .. }
            | CallError::Instantiate { .. }
            | CallError::NotLoaded { .. } => ErrorClass::Transient,
            CallError::MemoryCap { .. }
            | CallError::Trap { .. }
            | CallError::Budget { .. }
            | CallError::InvalidResult { .. } => ErrorClass::Permanent,
        }
    }
}

/// Why the runtime could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// wasmtime refused the engine configuration.
    #[error("cannot configure the wasmtime engine: {message}")]
    Engine {
        /// wasmtime's reason.
        message: String,
    },
    /// The host interfaces could not be added to the linker.
    #[error("cannot link host interfaces: {message}")]
    Linker {
        /// wasmtime's reason.
        message: String,
    },
    /// The epoch ticker thread could not be started.
    #[error("cannot start the epoch ticker thread: {0}")]
    Ticker(#[source] std::io::Error),
    /// The background compiler's thread could not be started.
    #[error("cannot start the background compiler thread: {0}")]
    Optimizer(#[source] std::io::Error),
}

/// Why a directory cannot be watched.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The directory could not be listed.
    #[error("{}: cannot list provider directory: {source}", path.display())]
    ReadDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file watcher could not be started.
    #[error("{}: cannot watch provider directory: {message}", path.display())]
    Watch {
        /// The directory.
        path: PathBuf,
        /// The watcher's reason.
        message: String,
    },
}

/// Render a wasmtime error chain on one line.
pub(crate) fn one_line(error: &wasmtime::Error) -> String {
    let rendered = format!("{error:#}");
    rendered.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_the_documented_policy() {
        let deadline = CallError::Deadline {
            operation: Operation::Get,
            after: Duration::from_secs(1),
        };
        assert_eq!(deadline.class(), ErrorClass::Transient);
        assert_eq!(
            CallError::MemoryCap { limit: 1 }.class(),
            ErrorClass::Permanent
        );
        assert_eq!(
            CallError::Trap {
                message: "x".into()
            }
            .class(),
            ErrorClass::Permanent
        );
        assert_eq!(
            CallError::Provider(ProviderError::NotFound("gone".into())).class(),
            ErrorClass::NotFound
        );
        assert_eq!(
            CallError::Busy {
                operation: Operation::Get,
                waited: Duration::from_secs(1)
            }
            .class(),
            ErrorClass::Transient
        );
    }

    #[test]
    fn load_errors_are_one_line_and_name_the_file() {
        let error = LoadError::UnknownImport {
            path: PathBuf::from("/providers/bad.wasm"),
            import: "acme:exfil/upload@0.1.0".into(),
        };
        assert_eq!(
            error.to_string(),
            "/providers/bad.wasm: imports acme:exfil/upload@0.1.0, which this host does not provide"
        );
        assert_eq!(error.path(), std::path::Path::new("/providers/bad.wasm"));
    }

    #[test]
    fn one_line_collapses_multi_line_errors() {
        let error = wasmtime::Error::msg("first\n  second").context("outer");
        assert_eq!(one_line(&error), "outer: first second");
    }
}
