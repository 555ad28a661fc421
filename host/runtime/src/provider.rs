//! [`Provider`]: one loaded generation of a provider component, and how a call runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use egress_digest::Digest;
use semver::Version;
use tokio::sync::{Semaphore, watch};
use tracing::Instrument;
use wasmtime::component::Component;
use wasmtime::component::types::ComponentItem;

use crate::call::{BENCHMARK_DEADLINE, CallEnv, CallPlan, new_store, run_call};
use crate::capability::Linked;
use crate::egress::{CallSite, Tap};
use crate::engine::Tier;
use crate::error::{CallError, LoadError, one_line};
use crate::identity::name_problem;
use crate::limits::Limits;
use crate::types::{Description, Operation, Request, Response};
use crate::wit::ContractPre;

/// Who a call is for, recorded on the call's tracing span (as `proxy`, the key logs have always
/// carried), and what stands between its requests and the egress.
#[derive(Clone, Debug, Default)]
pub struct CallContext {
    /// What the call is made for, if anything: a Proxy (`namespace/name`), or a ProviderConfig's
    /// own work (`providerconfig/<name>`, `providerconfig/<name>/sweep`).
    pub subject: Option<String>,
    /// Sees (or answers) every request of this call before the egress does: a flight recorder,
    /// a replay, injected faults.
    pub tap: Option<Arc<dyn Tap>>,
}

/// One loaded generation of a provider component: compiled, linked, validated and described.
///
/// Every [`call`](Provider::call) runs in a fresh instance, so a provider keeps no state between
/// calls and a misbehaving call cannot affect the next. A `Provider` is immutable; hot swap
/// (see [`crate::Registry`]) publishes a new one, and calls holding the old `Arc<Provider>`
/// finish on the old generation.
///
/// A provider is known by its **identity**, which the host assigns (the file it was loaded from,
/// or the ProviderConfig that names it) and which grants, concurrency, metrics and logs follow.
/// What the component says about itself ([`Provider::description`]) is for display and a
/// consistency check only: a component cannot borrow another's grant by describing itself under
/// its name.
///
/// The component may be of any contract version the runtime serves
/// ([`Provider::contract_version`]); calls look the same whatever the version. What it needs of
/// the host is read from its imports ([`Provider::capabilities`]).
///
/// The one thing that changes under a loaded provider is its machine code: under
/// [`crate::Compilation::Tiered`] a component missing from the compile cache serves from Winch's
/// code until Cranelift's replaces it ([`Provider::tier`], [`Provider::optimized`]); each call
/// runs on the code it started with.
pub struct Provider {
    env: Arc<CallEnv>,
    /// The code calls run, shared by every binding of this load.
    code: Arc<ArcSwap<Code>>,
    /// `true` once no better code is coming.
    settled: watch::Receiver<bool>,
    /// The compiler whose code validated and described the component at load.
    loaded_tier: Tier,
    /// The contract version it exports.
    contract_version: Version,
    /// The runtime's capabilities this component imports, prepared for each of its calls.
    capabilities: Arc<[Arc<dyn Linked>]>,
    description: Description,
    identity: Arc<str>,
    digest: Digest,
    path: PathBuf,
    generation: u64,
    from_cache: bool,
    limits: Limits,
    /// Shared by every generation of the provider with this identity (kept by the runtime).
    concurrency: Arc<Semaphore>,
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("identity", &self.identity)
            .field("described_as", &self.description.name)
            .field("version", &self.description.version)
            .field("contract_version", &self.contract_version.to_string())
            .field("capabilities", &self.capabilities())
            .field("digest", &self.digest.hex())
            .field("path", &self.path)
            .field("generation", &self.generation)
            .field("tier", &self.tier())
            .finish_non_exhaustive()
    }
}

/// A provider's machine code: the component compiled by one compiler, linked, and wrapped in
/// its contract version's bindings.
pub(crate) struct Code {
    /// The bindings of the component's contract version.
    pub(crate) pre: Arc<dyn ContractPre>,
    pub(crate) component: Component,
    /// The compiler that made it.
    pub(crate) tier: Tier,
}

/// Everything [`Provider::new`] needs, produced by the runtime's loader.
pub(crate) struct LoadedParts {
    pub(crate) env: Arc<CallEnv>,
    pub(crate) code: Arc<ArcSwap<Code>>,
    pub(crate) settled: watch::Receiver<bool>,
    pub(crate) loaded_tier: Tier,
    pub(crate) contract_version: Version,
    pub(crate) capabilities: Vec<Arc<dyn Linked>>,
    pub(crate) description: Description,
    pub(crate) identity: Arc<str>,
    pub(crate) digest: Digest,
    pub(crate) path: PathBuf,
    pub(crate) generation: u64,
    pub(crate) from_cache: bool,
    pub(crate) limits: Limits,
    pub(crate) concurrency: Arc<Semaphore>,
}

impl Provider {
    pub(crate) fn new(parts: LoadedParts) -> Provider {
        Provider {
            env: parts.env,
            code: parts.code,
            settled: parts.settled,
            loaded_tier: parts.loaded_tier,
            contract_version: parts.contract_version,
            capabilities: parts.capabilities.into(),
            description: parts.description,
            identity: parts.identity,
            digest: parts.digest,
            path: parts.path,
            generation: parts.generation,
            from_cache: parts.from_cache,
            limits: parts.limits,
            concurrency: parts.concurrency,
        }
    }

    /// What the provider said about itself when it was loaded. Its `name` is the component's
    /// claim, not its identity.
    pub fn description(&self) -> &Description {
        &self.description
    }

    /// The contract version the component exports (`egress:provider/provider@0.2.0` → `0.2.0`),
    /// which the runtime serves.
    pub fn contract_version(&self) -> &Version {
        &self.contract_version
    }

    /// The host capabilities the component imports (`http`, `libvirt`, …), by
    /// [name](crate::Capability::name), in the runtime's order: what it needs granted. Read from
    /// the component's imports, whatever its contract version; a 0.1.0 component's own list in
    /// `describe` ([`Description::capabilities`]) is only compared with it.
    pub fn capabilities(&self) -> Vec<&'static str> {
        self.capabilities.iter().map(|c| c.name()).collect()
    }

    /// The host-assigned identity: grants, concurrency permits, metrics and logs follow it.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The sha256 of the component's bytes, which a grant or a ProviderConfig may pin. It displays
    /// as `sha256:<hex>`; [`Digest::hex`] gives the bare hex.
    pub fn component_digest(&self) -> Digest {
        self.digest
    }

    /// The file the component was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This load's generation: unique and increasing across the whole process.
    pub fn load_generation(&self) -> u64 {
        self.generation
    }

    /// Whether the compiled code came from the on-disk compile cache.
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    /// The limits this provider's calls run under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The compiler whose code the next call runs.
    pub fn tier(&self) -> Tier {
        self.code.load().tier
    }

    /// The compiler whose code validated and described the component when it was loaded:
    /// [`Tier::Baseline`] when it served before Cranelift was done.
    pub fn loaded_tier(&self) -> Tier {
        self.loaded_tier
    }

    /// Wait until no better code is coming (at once unless a background compile is pending),
    /// and return the compiler whose code calls now run. A failed optimizing compile settles
    /// too, on [`Tier::Baseline`] (it is logged).
    pub async fn optimized(&self) -> Tier {
        let mut settled = self.settled.clone();
        // An error means the job was dropped unfinished: settled too.
        let _ = settled.wait_for(|settled| *settled).await;
        self.tier()
    }

    /// This component serving as `identity` under `limits`: how the operator gives each
    /// ProviderConfig its own grant, permits, metrics, logs and limits over one loaded file. The
    /// compiled code is shared; the memory cap is clamped to the instance pool's slot (see
    /// [`crate::RuntimeConfig::slot_memory_bytes`]), and the pool-wide settings of `limits` (the
    /// pool size, the epoch tick) are the runtime's, whatever `limits` says.
    pub fn bind(&self, identity: &str, limits: Limits) -> Result<Arc<Provider>, LoadError> {
        if let Some(problem) = name_problem(identity) {
            return Err(LoadError::InvalidIdentity {
                path: self.path.clone(),
                problem,
            });
        }
        let memory = limits.memory_bytes_limit().min(self.env.slot_memory_bytes);
        let limits = limits.memory_bytes(memory);
        let concurrency = self
            .env
            .semaphore_for(identity, limits.concurrency_per_provider_limit());
        note_ungranted(&self.capabilities, identity);
        Ok(Arc::new(Provider {
            env: Arc::clone(&self.env),
            code: Arc::clone(&self.code),
            settled: self.settled.clone(),
            loaded_tier: self.loaded_tier,
            contract_version: self.contract_version.clone(),
            capabilities: Arc::clone(&self.capabilities),
            description: self.description.clone(),
            identity: Arc::from(identity),
            digest: self.digest,
            path: self.path.clone(),
            generation: self.generation,
            from_cache: self.from_cache,
            limits,
            concurrency,
        }))
    }

    /// The component's import names (for example `wasi:http/outgoing-handler@0.2.12`).
    pub fn imports(&self) -> Vec<String> {
        let code = self.code.load();
        let engine = code.component.engine();
        code.component
            .component_type()
            .imports(engine)
            .map(|(name, _)| name.to_owned())
            .collect()
    }

    /// The component's exports: each exported interface (for example
    /// `egress:provider/provider@0.1.0`) followed by its functions as `interface#function`.
    pub fn exports(&self) -> Vec<String> {
        let code = self.code.load();
        let engine = code.component.engine();
        let mut names = Vec::new();
        for (name, item) in code.component.component_type().exports(engine) {
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
    /// Waits for one of the provider's concurrency permits, then for a slot of the shared
    /// instance pool (back-pressure, first come first served), then instantiates and calls, all
    /// within the operation's deadline (see [`crate::Limits::deadline`]). A guest that computes
    /// without returning yields its thread every epoch tick and is stopped at its CPU budget or
    /// its deadline, whichever comes first; host-side waits (HTTP, sleeps) are bounded by the
    /// deadline. Every other per-call budget of [`crate::Limits`] applies. The host never panics
    /// on guest behaviour: every failure is a [`CallError`].
    pub async fn call(&self, request: Request, ctx: &CallContext) -> Result<Response, CallError> {
        let operation = request.operation();
        let span = tracing::info_span!(
            "provider_call",
            provider = %self.identity,
            version = %crate::log::escape(&self.description.version),
            operation = operation.as_str(),
            proxy = ctx.subject.as_deref().unwrap_or("-"),
            generation = self.generation,
        );
        async move {
            let started = Instant::now();
            let tap = ctx.tap.clone();
            let result = self
                .call_with_permit(request, operation, started, tap)
                .await;
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
        tap: Option<Arc<dyn Tap>>,
    ) -> Result<Response, CallError> {
        let deadline = started + self.limits.deadline_for(operation);
        let _permit =
            match tokio::time::timeout_at(deadline.into(), self.concurrency.acquire()).await {
                Ok(Ok(permit)) => permit,
                // The semaphore is never closed; a closed one would mean no permits ever again.
                Ok(Err(_)) | Err(_) => {
                    return Err(CallError::Busy {
                        operation,
                        waited: started.elapsed(),
                    });
                }
            };
        let code = self.code.load_full();
        let site = self.site(operation.as_str());
        run_call(&self.env, self.plan(&code, site, tap), request, started).await
    }

    /// Who calls: this provider, running `operation`.
    fn site(&self, operation: &'static str) -> CallSite {
        CallSite {
            provider: Arc::clone(&self.identity),
            digest: Arc::from(self.digest.hex()),
            operation,
        }
    }

    /// What a call of this provider as `site` running `code` needs.
    fn plan<'a>(
        &'a self,
        code: &'a Code,
        site: CallSite,
        tap: Option<Arc<dyn Tap>>,
    ) -> CallPlan<'a> {
        CallPlan {
            tap,
            pre: &*code.pre,
            capabilities: &self.capabilities,
            site,
            limits: &self.limits,
        }
    }

    /// Instantiate once in a fresh store and drop it: the fixed cost of every call.
    #[doc(hidden)]
    pub async fn instantiate_for_benchmark(&self) -> Result<(), CallError> {
        let site = self.site("benchmark");
        let deadline = Instant::now() + BENCHMARK_DEADLINE;
        let code = self.code.load_full();
        let mut store = new_store(&self.plan(&code, site, None), Operation::Describe, deadline);
        code.pre
            .instantiate(&mut store)
            .await
            .map_err(|error| CallError::Instantiate {
                message: one_line(&error),
            })
    }
}

/// Note each capability of `capabilities` the provider `identity` has no grant of: its calls get
/// the ungranted state, on which every use is denied. (Grants may still arrive.)
pub(crate) fn note_ungranted(capabilities: &[Arc<dyn Linked>], identity: &str) {
    for capability in capabilities {
        if !capability.granted(identity) {
            tracing::debug!(
                provider = identity,
                capability = capability.name(),
                "the provider imports a capability its identity has no grant of: every use is denied"
            );
        }
    }
}
