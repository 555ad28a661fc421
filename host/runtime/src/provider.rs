//! [`Provider`]: one loaded generation of a provider component, and how a call runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tracing::Instrument;
use wasmtime::component::Component;
use wasmtime::component::types::ComponentItem;
use wasmtime::{Store, UpdateDeadline};

use crate::egress::CallSite;
use crate::error::{CallError, one_line};
use crate::runtime::RuntimeInner;
use crate::state::HostState;
use crate::types::{Description, Operation, Request, Response};
use crate::wit::latest;

/// Who a call is for; recorded on the call's tracing span.
#[derive(Clone, Debug, Default)]
pub struct CallContext {
    /// The Proxy resource the call is made for, if any.
    pub proxy: Option<String>,
}

/// One loaded generation of a provider component: compiled, linked, validated and described.
///
/// Every [`call`](Provider::call) runs in a fresh instance, so a provider keeps no state between
/// calls and a misbehaving call cannot affect the next. A `Provider` is immutable; hot swap
/// (see [`crate::Registry`]) publishes a new one, and calls holding the old `Arc<Provider>`
/// finish on the old generation.
pub struct Provider {
    runtime: Arc<RuntimeInner>,
    pre: latest::ProviderWorldPre<HostState>,
    component: Component,
    description: Description,
    name: Arc<str>,
    digest: String,
    path: PathBuf,
    generation: u64,
    from_cache: bool,
    /// Shared by every generation of the provider with this name (kept by the runtime).
    concurrency: Arc<Semaphore>,
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("name", &self.name)
            .field("version", &self.description.version)
            .field("digest", &self.digest)
            .field("path", &self.path)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

/// Everything [`Provider::new`] needs, produced by the runtime's loader.
pub(crate) struct LoadedParts {
    pub(crate) runtime: Arc<RuntimeInner>,
    pub(crate) pre: latest::ProviderWorldPre<HostState>,
    pub(crate) component: Component,
    pub(crate) description: Description,
    pub(crate) digest: String,
    pub(crate) path: PathBuf,
    pub(crate) generation: u64,
    pub(crate) from_cache: bool,
    pub(crate) concurrency: Arc<Semaphore>,
}

impl Provider {
    pub(crate) fn new(parts: LoadedParts) -> Provider {
        Provider {
            name: Arc::from(parts.description.name.as_str()),
            runtime: parts.runtime,
            pre: parts.pre,
            component: parts.component,
            description: parts.description,
            digest: parts.digest,
            path: parts.path,
            generation: parts.generation,
            from_cache: parts.from_cache,
            concurrency: parts.concurrency,
        }
    }

    /// What the provider said about itself when it was loaded.
    pub fn description(&self) -> &Description {
        &self.description
    }

    /// The provider's name (from its description).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The sha256 of the component's bytes, lowercase hex.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The file the component was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This load's generation: unique and increasing across the whole process.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether the compiled code came from the on-disk compile cache.
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    /// The component's import names (for example `wasi:http/outgoing-handler@0.2.12`).
    pub fn imports(&self) -> Vec<String> {
        let engine = self.component.engine();
        self.component
            .component_type()
            .imports(engine)
            .map(|(name, _)| name.to_owned())
            .collect()
    }

    /// The component's exports: each exported interface (for example
    /// `egress:provider/provider@0.1.0`) followed by its functions as `interface#function`.
    pub fn exports(&self) -> Vec<String> {
        let engine = self.component.engine();
        let mut names = Vec::new();
        for (name, item) in self.component.component_type().exports(engine) {
            names.push(name.to_owned());
            if let ComponentItem::ComponentInstance(instance) = item.ty {
                // Only functions: the interface also re-exports the types it uses.
                let functions = instance
                    .exports(engine)
                    .filter(|(_, item)| matches!(item.ty, ComponentItem::ComponentFunc(_)));
                names.extend(functions.map(|(function, _)| format!("{name}#{function}")));
            }
        }
        names
    }

    /// Run one operation in a fresh instance.
    ///
    /// Waits for one of the provider's concurrency permits (back-pressure), then instantiates and
    /// calls, all within the operation's deadline (see [`crate::Limits::deadline`]). A guest that
    /// computes without returning yields its thread every epoch tick and is stopped at the
    /// deadline; host-side waits (HTTP, sleeps) are bounded by the same deadline. The host never
    /// panics on guest behaviour: every failure is a [`CallError`].
    pub async fn call(&self, request: Request, ctx: &CallContext) -> Result<Response, CallError> {
        let operation = request.operation();
        let span = tracing::info_span!(
            "provider_call",
            provider = %self.name,
            version = %self.description.version,
            operation = operation.as_str(),
            proxy = ctx.proxy.as_deref().unwrap_or("-"),
            generation = self.generation,
        );
        async move {
            let started = Instant::now();
            let result = self.call_with_permit(request, operation, started).await;
            match &result {
                Ok(_) => tracing::debug!(elapsed = ?started.elapsed(), "provider call succeeded"),
                Err(error) => tracing::debug!(
                    elapsed = ?started.elapsed(),
                    class = error.class().as_str(),
                    error = %error,
                    "provider call failed"
                ),
            }
            result
        }
        .instrument(span)
        .await
    }

    async fn call_with_permit(
        &self,
        request: Request,
        operation: Operation,
        started: Instant,
    ) -> Result<Response, CallError> {
        let after = self.runtime.limits.deadline_for(operation);
        let deadline = started + after;
        let _permit =
            match tokio::time::timeout_at(deadline.into(), self.concurrency.acquire()).await {
                Ok(Ok(permit)) => permit,
                // The semaphore is never closed; a closed one would mean no permits ever again.
                Ok(Err(_)) | Err(_) => {
                    return Err(CallError::Busy {
                        operation,
                        waited: after,
                    });
                }
            };
        let site = CallSite {
            provider: Arc::clone(&self.name),
            operation: operation.as_str(),
        };
        run_call(&self.runtime, &self.pre, site, request, deadline, after).await
    }

    /// Instantiate once in a fresh store and drop it: the fixed cost of every call.
    #[doc(hidden)]
    pub async fn instantiate_for_benchmark(&self) -> Result<(), CallError> {
        let site = CallSite {
            provider: Arc::clone(&self.name),
            operation: "benchmark",
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut store = new_store(&self.runtime, site, deadline);
        self.pre
            .instantiate_async(&mut store)
            .await
            .map(drop)
            .map_err(|error| CallError::Instantiate {
                message: one_line(&error),
            })
    }
}

/// A fresh store for one call, with its limiter and epoch deadline behaviour set.
fn new_store(runtime: &RuntimeInner, site: CallSite, deadline: Instant) -> Store<HostState> {
    let state = HostState::new(site, Arc::clone(&runtime.egress), &runtime.limits, deadline);
    let mut store = Store::new(&runtime.engine, state);
    store.limiter(|state| &mut state.limiter);
    // Check in at every epoch tick: yield the thread so a spinning guest never blocks an
    // executor, and stop the guest once its wall-clock deadline has passed.
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|mut context| {
        let state = context.data_mut();
        if Instant::now() >= state.deadline {
            state.deadline_passed = true;
            Ok(UpdateDeadline::Interrupt)
        } else {
            Ok(UpdateDeadline::Yield(1))
        }
    });
    store
}

/// Where a wasmtime error came from.
enum Failure {
    Instantiate(wasmtime::Error),
    Call(wasmtime::Error),
}

/// Instantiate `pre` in a fresh store and run `request`, stopping at `deadline`.
pub(crate) async fn run_call(
    runtime: &RuntimeInner,
    pre: &latest::ProviderWorldPre<HostState>,
    site: CallSite,
    request: Request,
    deadline: Instant,
    after: Duration,
) -> Result<Response, CallError> {
    let operation = request.operation();
    let mut store = new_store(runtime, site, deadline);
    let work = async {
        let bindings = pre
            .instantiate_async(&mut store)
            .await
            .map_err(Failure::Instantiate)?;
        latest::call(&bindings, &mut store, request)
            .await
            .map_err(Failure::Call)
    };
    let outcome = tokio::time::timeout_at(deadline.into(), work).await;
    let state = store.data();
    let failure = match outcome {
        Err(_elapsed) => return Err(CallError::Deadline { operation, after }),
        Ok(Ok(Ok(response))) => return Ok(response),
        Ok(Ok(Err(provider_error))) => return Err(CallError::Provider(provider_error)),
        Ok(Err(failure)) => failure,
    };
    let stderr = state.stderr();
    if !stderr.is_empty() {
        tracing::debug!(stderr = %stderr, "provider stderr");
    }
    if state.limiter.memory_cap_hit {
        return Err(CallError::MemoryCap {
            limit: state.limiter.memory_bytes(),
        });
    }
    if state.deadline_passed {
        return Err(CallError::Deadline { operation, after });
    }
    match failure {
        Failure::Instantiate(error) => Err(CallError::Instantiate {
            message: one_line(&error),
        }),
        Failure::Call(error) => {
            let trap = match error.downcast_ref::<wasmtime::Trap>() {
                Some(trap) => trap.to_string(),
                None => one_line(&error),
            };
            let message = if stderr.is_empty() {
                trap
            } else {
                let stderr = stderr
                    .lines()
                    .map(str::trim)
                    .filter(|line| !line.is_empty());
                format!("{trap}; stderr: {}", stderr.collect::<Vec<_>>().join(" | "))
            };
            Err(CallError::Trap { message })
        }
    }
}
