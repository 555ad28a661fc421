//! [`Runtime`]: the engine, linker and limits shared by every provider, and the loader that turns a
//! component file into a validated [`Provider`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use arc_swap::ArcSwap;
use egress_digest::Digest;
use semver::Version;
use tokio::sync::watch;
use tracing::Instrument;
use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, MemoryCreator};

use crate::cache::{CompileCache, default_cache_dir};
use crate::call::{CallEnv, CallPlan, run_call};
use crate::capability::{Capability, CapabilitySet, Linked};
use crate::egress::CallSite;
use crate::engine::{Allocation, Compilation, EpochTicker, Tier, build_engine};
use crate::error::{LoadError, RuntimeError, one_line};
use crate::http::HttpCapability;
use crate::identity::{identity_of, name_problem};
use crate::limits::Limits;
use crate::provider::{Code, LoadedParts, Provider, note_ungranted};
use crate::state::HostState;
use crate::tiering::{Job, Optimizer};
use crate::types::{Description, Request, Response};
use crate::wit::{self, ContractPre, Served};

/// How the runtime is built.
#[derive(Clone)]
pub struct RuntimeConfig {
    /// Limits applied to every call.
    pub limits: Limits,
    /// Where compiled components are cached; `None` disables the cache. Defaults to
    /// `$XDG_CACHE_HOME/egress-operator` or `~/.cache/egress-operator`. The directory must belong
    /// to the user running the host and be writable by nobody else (whoever can write it can run
    /// native code in the process holding every secret); otherwise the cache is not used.
    pub cache_dir: Option<PathBuf>,
    /// Replaces the pooling allocator with this creator of linear memories. **Tests and
    /// diagnostics only**: it lets a test read a guest's whole memory after a call; it gives up
    /// the pooling allocator's fast, copy-on-write instantiation.
    pub memory_creator: Option<Arc<dyn MemoryCreator>>,
    /// The linear memory of each slot of the instance pool: the most any one provider's calls
    /// may be given ([`Provider::bind`]). Defaults to the limits' memory cap; reserved address
    /// space, not memory, until a call touches it.
    pub slot_memory_bytes: Option<usize>,
    /// Host capabilities, in the order given ([`RuntimeConfig::capability`]): for example
    /// `egress-capability-http`'s `Broker` and `egress-capability-libvirt`'s
    /// `LibvirtCapability`. A component importing an interface none of them provides is refused
    /// at load. Defaults to none, and then outgoing HTTP is [`HttpCapability`] over
    /// [`DenyAll`](crate::DenyAll).
    capabilities: Vec<Arc<dyn Linked>>,
    /// How a component missing from the compile cache is compiled. Defaults to
    /// [`Compilation::Tiered`]: Winch first, Cranelift in the background.
    pub compilation: Compilation,
    /// The largest component loaded, in bytes: a larger file is refused from its size, before it
    /// is read. Defaults to [`DEFAULT_MAX_COMPONENT_BYTES`].
    pub max_component_bytes: u64,
    /// Count every call a guest makes into the host ([`Runtime::host_calls`]). **Benchmarks and
    /// diagnostics only**: it runs a hook on every such call. Defaults to off.
    pub count_host_calls: bool,
}

/// The largest component a runtime loads unless told otherwise: 64 MiB, several times the
/// largest provider built here (the Python one).
pub const DEFAULT_MAX_COMPONENT_BYTES: u64 = 64 * 1024 * 1024;

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            limits: Limits::default(),
            cache_dir: default_cache_dir(),
            memory_creator: None,
            slot_memory_bytes: None,
            capabilities: Vec::new(),
            compilation: Compilation::default(),
            max_component_bytes: DEFAULT_MAX_COMPONENT_BYTES,
            count_host_calls: false,
        }
    }
}

impl std::fmt::Debug for RuntimeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let capabilities: Vec<&str> = self.capabilities.iter().map(|c| c.name()).collect();
        f.debug_struct("RuntimeConfig")
            .field("limits", &self.limits)
            .field("cache_dir", &self.cache_dir)
            .field(
                "memory_creator",
                &self.memory_creator.as_ref().map(|_| "custom"),
            )
            .field("slot_memory_bytes", &self.slot_memory_bytes)
            .field("capabilities", &capabilities)
            .field("compilation", &self.compilation)
            .field("max_component_bytes", &self.max_component_bytes)
            .field("count_host_calls", &self.count_host_calls)
            .finish()
    }
}

impl RuntimeConfig {
    /// Use `limits`.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Cache compiled components in `dir`, or not at all with `None`.
    pub fn cache_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.cache_dir = dir;
        self
    }

    /// Let a provider's calls be given up to `bytes` of linear memory (see
    /// [`RuntimeConfig::slot_memory_bytes`](Self#structfield.slot_memory_bytes)).
    pub fn slot_memory_bytes(mut self, bytes: usize) -> Self {
        self.slot_memory_bytes = Some(bytes);
        self
    }

    /// Tests and diagnostics only: see [`RuntimeConfig::memory_creator`](Self#structfield.memory_creator).
    pub fn memory_creator(mut self, creator: Arc<dyn MemoryCreator>) -> Self {
        self.memory_creator = Some(creator);
        self
    }

    /// Benchmarks and diagnostics only: see
    /// [`RuntimeConfig::count_host_calls`](Self#structfield.count_host_calls).
    pub fn count_host_calls(mut self) -> Self {
        self.count_host_calls = true;
        self
    }

    /// Compile components missing from the cache as `compilation` says.
    pub fn compilation(mut self, compilation: Compilation) -> Self {
        self.compilation = compilation;
        self
    }

    /// Load no component larger than `bytes`.
    pub fn max_component_bytes(mut self, bytes: u64) -> Self {
        self.max_component_bytes = bytes;
        self
    }

    /// Add a host capability (see [`Capability`]): its interfaces are linked once, and each call
    /// of a provider that imports them gets the capability's per-call state. Names must be
    /// unique. The host keeps its own handle to set grants through.
    pub fn capability<C: Capability>(mut self, capability: Arc<C>) -> Self {
        self.capabilities.push(capability);
        self
    }
}

/// State shared by the runtime handle and its loader.
struct RuntimeInner {
    /// The engine calls settle on: Cranelift, or Winch under [`Compilation::Baseline`].
    engine: Engine,
    /// What every call shares: the instance pool's slots, the permits, the epoch ticker.
    env: Arc<CallEnv>,
    /// WASI p2 (granting nothing, see `state.rs`), the log under each of its names, and every
    /// capability's interfaces, for the engine calls settle on. One linker serves every contract
    /// version.
    linker: Linker<HostState>,
    /// The compiler of `engine`.
    tier: Tier,
    /// Under [`Compilation::Tiered`], the Winch engine and its linker that serve a component
    /// missing from the cache until Cranelift's code is ready, and the thread that compiles it.
    baseline: Option<(Engine, Linker<HostState>, Optimizer)>,
    /// HTTP first, then the configuration's, in order.
    capabilities: CapabilitySet,
    /// Limits for every call.
    limits: Limits,
    cache: Option<CompileCache>,
    /// The largest component loaded.
    max_component_bytes: u64,
}

/// The provider host: one wasmtime engine, its linker, limits, compile cache and egress.
/// Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("limits", &self.inner.limits)
            .field("capabilities", &self.inner.capabilities)
            .finish_non_exhaustive()
    }
}

/// Every generation ever loaded in this process gets the next number.
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

impl Runtime {
    /// Build the engine and linker and start the epoch ticker.
    ///
    /// The capabilities are [`RuntimeConfig::capability`]'s. Outgoing HTTP (`wasi:http`, and
    /// `egress:http-broker` to tell a guest why a request was refused) is one of them, such as
    /// the egress broker; without one, [`HttpCapability`] over [`DenyAll`](crate::DenyAll) comes
    /// first, so a component that imports `wasi:http` loads and every request it makes is
    /// denied. Fails when the engine cannot be configured, a capability's interfaces cannot be
    /// linked, or two capabilities share a name.
    pub fn new(config: RuntimeConfig) -> Result<Runtime, RuntimeError> {
        let capabilities = with_http(&config.capabilities)?;
        let limits = &config.limits;
        let slot_memory_bytes = config
            .slot_memory_bytes
            .unwrap_or(0)
            .max(limits.memory_bytes_limit());
        let tier = match config.compilation {
            Compilation::Baseline => Tier::Baseline,
            Compilation::Tiered | Compilation::Optimized => Tier::Optimized,
        };
        let engine = build_engine(
            limits,
            slot_memory_bytes,
            config.memory_creator.clone(),
            tier,
            Allocation::Pooled,
        )
        .map_err(|error| RuntimeError::Engine {
            message: one_line(&error),
        })?;
        let linker = new_linker(&engine, &capabilities)?;
        let cache = config
            .cache_dir
            .clone()
            .map(|dir| CompileCache::new(dir, &engine));
        let baseline = match config.compilation {
            Compilation::Tiered => start_tiering(
                &config,
                slot_memory_bytes,
                &capabilities,
                &engine,
                &linker,
                cache.clone(),
            )?,
            Compilation::Optimized | Compilation::Baseline => None,
        };
        let ticked = std::iter::once(engine.clone())
            .chain(baseline.as_ref().map(|(engine, ..)| engine.clone()))
            .collect();
        let ticker = EpochTicker::start(ticked, limits.epoch_tick_interval())
            .map_err(RuntimeError::Ticker)?;
        let env = CallEnv::new(limits, slot_memory_bytes, config.count_host_calls, ticker);
        Ok(Runtime {
            inner: Arc::new(RuntimeInner {
                engine,
                env: Arc::new(env),
                linker,
                tier,
                baseline,
                capabilities,
                limits: config.limits,
                max_component_bytes: config.max_component_bytes,
                cache,
            }),
        })
    }

    /// The names of the runtime's capabilities, HTTP first.
    pub fn capabilities(&self) -> Vec<&'static str> {
        self.inner.capabilities.names()
    }

    /// The calls guests have made into the host so far (host functions and wasmtime's libcalls,
    /// as wasmtime's call hook sees them), when the runtime counts them
    /// ([`RuntimeConfig::count_host_calls`]).
    pub fn host_calls(&self) -> Option<u64> {
        self.inner
            .env
            .host_calls
            .as_ref()
            .map(|calls| calls.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The engine every provider runs on.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The limits applied to every call.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// The bytes of the component file at `path`, refused from its size when over
    /// [`RuntimeConfig::max_component_bytes`](RuntimeConfig#structfield.max_component_bytes),
    /// and never read past the cap (a file that grows while read is refused too).
    pub async fn read_component(&self, path: &Path) -> Result<Vec<u8>, LoadError> {
        use tokio::io::AsyncReadExt as _;
        let cap = self.inner.max_component_bytes;
        let read_error = |source| LoadError::Read {
            path: path.to_owned(),
            source,
        };
        let file = tokio::fs::File::open(path).await.map_err(read_error)?;
        let size = file.metadata().await.map_err(read_error)?.len();
        if size > cap {
            return Err(LoadError::TooLarge {
                path: path.to_owned(),
                size: size.to_string(),
                cap,
            });
        }
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        file.take(cap + 1)
            .read_to_end(&mut bytes)
            .await
            .map_err(read_error)?;
        if bytes.len() as u64 > cap {
            return Err(LoadError::TooLarge {
                path: path.to_owned(),
                size: format!("more than {cap}"),
                cap,
            });
        }
        Ok(bytes)
    }

    /// The most linear memory one call can be given (the instance pool's slot size).
    pub fn slot_memory_bytes(&self) -> usize {
        self.inner.env.slot_memory_bytes
    }

    /// Read, validate, compile and describe the component at `path`, under the identity its file
    /// name gives (`providers/proxmox.wasm` serves as `proxmox`).
    pub async fn load_file(&self, path: &Path) -> Result<Arc<Provider>, LoadError> {
        let bytes = self.read_component(path).await?;
        // What the file is matters more than what it is called: say "a text file" first.
        check_header(&bytes, path)?;
        let identity = identity_of(path)?;
        self.load_bytes(&identity, &bytes, path).await
    }

    /// Validate, compile and describe a component that will serve as `identity`; `origin` names
    /// it in errors and on the provider.
    ///
    /// The identity is the host's name for the provider: grants, concurrency permits, metrics
    /// and logs follow it. It must be 1–63 characters of lowercase letters, digits and `-`.
    /// Before a component serves, the loader checks, in order: it is a wasm component (not
    /// empty, not text, not a core module); it compiles; it exports
    /// `egress:provider/provider@X` with `X` a contract version the host serves (semver,
    /// [`wit::MIN_VERSION`] ≤ `X` < [`wit::MAX_VERSION`]); every import is one the host provides
    /// (WASI, the log, or an interface of one of its capabilities); `describe` succeeds in a fresh
    /// instance and its `contract-version` is `X`. Each failure is its own [`LoadError`] variant.
    /// What the provider needs is read from its imports ([`Provider::capabilities`]); a 0.1.0
    /// component that declares something else in `describe` is loaded with a warning.
    /// Compilation runs on a blocking thread, off the async executor.
    pub async fn load_bytes(
        &self,
        identity: &str,
        bytes: &[u8],
        origin: &Path,
    ) -> Result<Arc<Provider>, LoadError> {
        let path = origin.to_owned();
        self.validate(identity, bytes, &path)?;
        let digest = Digest::of(bytes);
        let bytes: Arc<[u8]> = Arc::from(bytes);
        let compiled = self.compile(Arc::clone(&bytes), digest, &path).await?;
        let linked = self.link(compiled, &path)?;
        let description = self.describe_linked(identity, &linked, &path).await?;
        let source = Source {
            bytes,
            digest,
            path,
        };
        Ok(self.publish(identity, linked, description, source))
    }

    /// The checks before compiling: the size, the identity, and that the bytes are a component.
    fn validate(&self, identity: &str, bytes: &[u8], path: &Path) -> Result<(), LoadError> {
        if bytes.len() as u64 > self.inner.max_component_bytes {
            return Err(LoadError::TooLarge {
                path: path.to_owned(),
                size: bytes.len().to_string(),
                cap: self.inner.max_component_bytes,
            });
        }
        if let Some(problem) = name_problem(identity) {
            return Err(LoadError::InvalidIdentity {
                path: path.to_owned(),
                problem,
            });
        }
        check_header(bytes, path)
    }

    /// Find the served contract export of `compiled` and link it: every import must be one the
    /// host provides.
    fn link(&self, compiled: Compiled, path: &Path) -> Result<LinkedComponent, LoadError> {
        let component = &compiled.component;
        let engine = component.engine();
        let (export, version, served) = check_exports(component, engine, path)?;
        let imports: Vec<String> = component
            .component_type()
            .imports(engine)
            .map(|(name, _)| name.to_owned())
            .collect();
        let link_error = |error: wasmtime::Error| LoadError::Link {
            path: path.to_owned(),
            message: one_line(&error),
        };
        let instance_pre = self
            .linker_for(compiled.tier)
            .instantiate_pre(component)
            .map_err(|error| {
                match imports.iter().find(|import| !self.provided_by_host(import)) {
                    Some(import) => LoadError::UnknownImport {
                        path: path.to_owned(),
                        import: import.clone(),
                    },
                    None => link_error(error),
                }
            })?;
        let pre = (served.pre)(instance_pre).map_err(link_error)?;
        let capabilities = self
            .inner
            .capabilities
            .imported_by(imports.iter().map(String::as_str));
        Ok(LinkedComponent {
            compiled,
            export,
            version,
            served,
            pre,
            capabilities,
        })
    }

    /// Call `describe` on `linked` and check its answer: the contract version it exports, a
    /// valid name. A name other than `identity`, or capabilities other than its imports, are
    /// only logged.
    async fn describe_linked(
        &self,
        identity: &str,
        linked: &LinkedComponent,
        path: &Path,
    ) -> Result<Description, LoadError> {
        let description = self
            .describe(&*linked.pre, &linked.capabilities, path)
            .await?;
        let invalid = |problem| LoadError::InvalidDescription {
            path: path.to_owned(),
            problem,
        };
        let described = Version::parse(&description.contract_version).ok();
        if described.as_ref() != Some(&linked.version) {
            return Err(invalid(format!(
                "contract-version is `{}` but the component exports {}",
                crate::log::escape(&description.contract_version),
                linked.export
            )));
        }
        if let Some(problem) = name_problem(&description.name) {
            return Err(invalid(problem));
        }
        if description.name != identity {
            // Only a consistency note: the identity is the host's, the name the component's.
            tracing::info!(
                provider = identity,
                described_as = %description.name,
                path = %path.display(),
                "provider describes itself under another name; it serves, and is granted, as its identity"
            );
        }
        if linked.served.declares_capabilities {
            warn_on_declared_mismatch(identity, path, &description, &linked.capabilities);
        }
        Ok(description)
    }

    /// A new generation of `identity` from what was validated: its permits, its number, its
    /// code.
    fn publish(
        &self,
        identity: &str,
        linked: LinkedComponent,
        description: Description,
        source: Source,
    ) -> Arc<Provider> {
        let LinkedComponent {
            compiled,
            version,
            served,
            pre,
            capabilities,
            ..
        } = linked;
        note_ungranted(&capabilities, identity);
        let concurrency = self
            .inner
            .env
            .semaphore_for(identity, self.inner.limits.concurrency_per_provider_limit());
        let generation = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
        let capability_names: Vec<&str> = capabilities.iter().map(|c| c.name()).collect();
        tracing::info!(
            provider = identity,
            described_as = %description.name,
            version = %crate::log::escape(&description.version),
            contract_version = %version,
            capabilities = ?capability_names,
            path = %source.path.display(),
            digest = %source.digest.hex(),
            generation,
            from_cache = compiled.from_cache,
            tier = ?compiled.tier,
            "provider loaded"
        );
        let code = Code {
            pre,
            component: compiled.component,
            tier: compiled.tier,
        };
        let (code, settled) = self.share_code(identity, code, served, &source);
        Arc::new(Provider::new(LoadedParts {
            env: Arc::clone(&self.inner.env),
            code,
            settled,
            loaded_tier: compiled.tier,
            contract_version: version,
            capabilities,
            description,
            identity: Arc::from(identity),
            digest: source.digest,
            path: source.path,
            generation,
            from_cache: compiled.from_cache,
            limits: self.inner.limits.clone(),
            concurrency,
        }))
    }

    /// `code`, shared by every binding of `identity`'s new generation, and whether it is settled:
    /// when it is Winch's under [`Compilation::Tiered`], Cranelift's compile of `source` is
    /// queued to replace it.
    fn share_code(
        &self,
        identity: &str,
        code: Code,
        served: &'static Served,
        source: &Source,
    ) -> (Arc<ArcSwap<Code>>, watch::Receiver<bool>) {
        // Settled unless better code is on its way.
        let optimizing = code.tier != self.inner.tier;
        let (settled, settled_watch) = watch::channel(!optimizing);
        let code = Arc::new(ArcSwap::from_pointee(code));
        if optimizing && let Some((.., optimizer)) = &self.inner.baseline {
            optimizer.submit(Job {
                identity: Arc::from(identity),
                bytes: Arc::clone(&source.bytes),
                digest: source.digest,
                served,
                code: Arc::downgrade(&code),
                settled,
            });
        }
        (code, settled_watch)
    }

    /// Load `bytes`' code from the cache, or compile them on a blocking thread: with Winch first
    /// under [`Compilation::Tiered`] (Cranelift's code is then the background compiler's job
    /// and the cache's), otherwise with the serving engine, caching the result.
    async fn compile(
        &self,
        bytes: Arc<[u8]>,
        digest: Digest,
        path: &Path,
    ) -> Result<Compiled, LoadError> {
        let engine = self.engine().clone();
        let serving_tier = self.inner.tier;
        let baseline = self
            .inner
            .baseline
            .as_ref()
            .map(|(engine, ..)| engine.clone());
        let cache = self.inner.cache.clone();
        let task = tokio::task::spawn_blocking(move || {
            if let Some(component) = cache
                .as_ref()
                .and_then(|cache| cache.load(&engine, &digest))
            {
                return Ok(Compiled {
                    component,
                    tier: serving_tier,
                    from_cache: true,
                });
            }
            if let Some(baseline) = baseline {
                return Ok(Compiled {
                    component: Component::new(&baseline, &bytes)?,
                    tier: Tier::Baseline,
                    from_cache: false,
                });
            }
            let component = Component::new(&engine, &bytes)?;
            if let Some(cache) = &cache {
                cache.store(&component, &digest);
            }
            Ok(Compiled {
                component,
                tier: serving_tier,
                from_cache: false,
            })
        });
        match task.await {
            Ok(Ok(compiled)) => Ok(compiled),
            Ok(Err(error)) => Err(LoadError::Compile {
                path: path.to_owned(),
                message: one_line(&error),
            }),
            Err(join_error) => Err(LoadError::Host {
                path: path.to_owned(),
                message: join_error.to_string(),
            }),
        }
    }

    /// The linker of the engine that compiled code of `tier`.
    fn linker_for(&self, tier: Tier) -> &Linker<HostState> {
        match &self.inner.baseline {
            Some((_, linker, _)) if tier != self.inner.tier => linker,
            _ => &self.inner.linker,
        }
    }

    /// Call `describe` once in a fresh instance.
    async fn describe(
        &self,
        pre: &dyn ContractPre,
        capabilities: &[Arc<dyn Linked>],
        path: &Path,
    ) -> Result<Description, LoadError> {
        // Not yet accepted: an empty identity, which no grant names, so every capability grants
        // this call nothing (describe does no I/O).
        let site = CallSite {
            provider: Arc::from(""),
            digest: Arc::from(""),
            operation: "describe",
        };
        let span = tracing::info_span!("provider_describe", path = %path.display());
        let plan = CallPlan {
            pre,
            capabilities,
            site,
            limits: &self.inner.limits,
            tap: None,
        };
        let call = run_call(&self.inner.env, plan, Request::Describe, Instant::now());
        match call.instrument(span).await {
            Ok(Response::Describe(description)) => Ok(description),
            Ok(other) => Err(LoadError::InvalidDescription {
                path: path.to_owned(),
                problem: format!("describe answered a {} response", other.operation()),
            }),
            Err(error) => Err(LoadError::Describe {
                path: path.to_owned(),
                error,
            }),
        }
    }

    /// Whether `import` is an interface the linker provides. Used only to name the culprit when
    /// linking fails; the linker itself is the authority.
    fn provided_by_host(&self, import: &str) -> bool {
        provided_by_wasi(import)
            || wit::provides(import)
            || self.inner.capabilities.provider_of(import).is_some()
    }
}

/// `configured`, after [`HttpCapability`] over [`DenyAll`](crate::DenyAll) when none of them
/// provides `wasi:http`; refused when two share a name.
fn with_http(configured: &[Arc<dyn Linked>]) -> Result<CapabilitySet, RuntimeError> {
    let mut capabilities: Vec<Arc<dyn Linked>> = Vec::new();
    if !configured
        .iter()
        .any(|capability| capability.provides(crate::http::TYPES_IMPORT))
    {
        capabilities.push(Arc::new(HttpCapability::new(Arc::new(crate::DenyAll))));
    }
    capabilities.extend(configured.iter().cloned());
    CapabilitySet::new(capabilities).map_err(|name| RuntimeError::Linker {
        message: format!("the capability `{name}` is given twice"),
    })
}

/// A linker for `engine`: WASI p2, the log under each of its names, and every capability's
/// interfaces.
fn new_linker(
    engine: &Engine,
    capabilities: &CapabilitySet,
) -> Result<Linker<HostState>, RuntimeError> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)
        .and_then(|_| wit::add_to_linker(&mut linker))
        .and_then(|_| {
            capabilities.iter().try_for_each(|capability| {
                capability.link(&mut linker).map_err(|error| {
                    error.context(format!("linking the `{}` capability", capability.name()))
                })
            })
        })
        .map_err(|error| RuntimeError::Linker {
            message: one_line(&error),
        })?;
    Ok(linker)
}

/// Under [`Compilation::Tiered`]: the Winch engine and its linker, and the thread that compiles
/// with the serving `engine` and `linker` (Cranelift's) into `cache`. `None` where Winch is not
/// available.
fn start_tiering(
    config: &RuntimeConfig,
    slot_memory_bytes: usize,
    capabilities: &CapabilitySet,
    engine: &Engine,
    linker: &Linker<HostState>,
    cache: Option<CompileCache>,
) -> Result<Option<(Engine, Linker<HostState>, Optimizer)>, RuntimeError> {
    let baseline = match build_engine(
        &config.limits,
        slot_memory_bytes,
        config.memory_creator.clone(),
        Tier::Baseline,
        Allocation::OnDemand,
    ) {
        Ok(baseline) => baseline,
        // Winch serves x86-64 only: elsewhere, tiering is only slower loads.
        Err(error) => {
            tracing::warn!(
                error = %one_line(&error),
                "the baseline compiler is not available here; components compile with Cranelift before they serve"
            );
            return Ok(None);
        }
    };
    let baseline_linker = new_linker(&baseline, capabilities)?;
    let optimizer =
        Optimizer::start(engine.clone(), linker.clone(), cache).map_err(RuntimeError::Optimizer)?;
    Ok(Some((baseline, baseline_linker, optimizer)))
}

/// Warn when what a 0.1.0 component declares in `describe` differs from what it imports: the
/// host goes by the imports.
fn warn_on_declared_mismatch(
    identity: &str,
    path: &Path,
    description: &Description,
    imported: &[Arc<dyn Linked>],
) {
    let mut declared: Vec<&str> = description
        .capabilities
        .iter()
        .map(|capability| capability.name())
        .collect();
    declared.sort_unstable();
    declared.dedup();
    let mut imports: Vec<&str> = imported.iter().map(|c| c.name()).collect();
    imports.sort_unstable();
    if declared != imports {
        tracing::warn!(
            provider = identity,
            path = %path.display(),
            ?declared,
            imported = ?imports,
            "the capabilities the component declares in describe differ from those it imports; the host goes by its imports"
        );
    }
}

/// Reject what is not a wasm component, saying what it is instead.
fn check_header(bytes: &[u8], path: &Path) -> Result<(), LoadError> {
    const MAGIC: &[u8] = b"\0asm";
    const CORE_VERSION: [u8; 4] = [0x01, 0x00, 0x00, 0x00];
    let path = path.to_owned();
    if bytes.is_empty() {
        return Err(LoadError::Empty { path });
    }
    if !bytes.starts_with(MAGIC) {
        let what = if std::str::from_utf8(bytes).is_ok() {
            "it is a text file"
        } else {
            "it is not WebAssembly"
        };
        return Err(LoadError::NotWasm { path, what });
    }
    if bytes.get(4..8) == Some(&CORE_VERSION[..]) {
        return Err(LoadError::CoreModule { path });
    }
    Ok(())
}

/// A component's code and where it came from.
struct Compiled {
    component: Component,
    /// The compiler that made it.
    tier: Tier,
    from_cache: bool,
}

/// A compiled component linked against the host, in the bindings of the contract version it
/// exports.
struct LinkedComponent {
    compiled: Compiled,
    /// The name of its contract export (`egress:provider/provider@0.2.0`).
    export: String,
    /// The contract version of that export.
    version: Version,
    served: &'static Served,
    pre: Arc<dyn ContractPre>,
    /// The runtime's capabilities it imports.
    capabilities: Vec<Arc<dyn Linked>>,
}

/// The bytes a provider was loaded from, their digest and the file they are named by.
struct Source {
    bytes: Arc<[u8]>,
    digest: Digest,
    path: PathBuf,
}

/// Find the `egress:provider/provider@X` export and check `X` is served; returns the export
/// name, its version and the module that serves it.
fn check_exports(
    component: &Component,
    engine: &Engine,
    path: &Path,
) -> Result<(String, Version, &'static Served), LoadError> {
    let component_type = component.component_type();
    let exports: Vec<&str> = component_type
        .exports(engine)
        .map(|(name, _)| name)
        .collect();
    let interface = format!("{}/provider", wit::CONTRACT_PACKAGE);
    let Some(export) = exports.iter().find(|name| {
        name.strip_prefix(interface.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('@'))
    }) else {
        let exports = if exports.is_empty() {
            "none".to_owned()
        } else {
            exports.join(", ")
        };
        return Err(LoadError::MissingExport {
            path: path.to_owned(),
            exports,
        });
    };
    let unsupported = || LoadError::UnsupportedContract {
        path: path.to_owned(),
        export: (*export).to_owned(),
        supported: format!("contract versions {}", wit::served_range()),
    };
    let version = export
        .rsplit_once('@')
        .and_then(|(_, version)| Version::parse(version).ok())
        .ok_or_else(unsupported)?;
    let served = wit::serving(&version).ok_or_else(unsupported)?;
    Ok(((*export).to_owned(), version, served))
}

/// WASI 0.2 interfaces the linker provides (all of them but `wasi:http`, the HTTP capability's:
/// see `state.rs` for why).
const WASI_INTERFACES: &[&str] = &[
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:clocks/monotonic-clock",
    "wasi:clocks/wall-clock",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:sockets/network",
    "wasi:sockets/instance-network",
    "wasi:sockets/udp",
    "wasi:sockets/udp-create-socket",
    "wasi:sockets/tcp",
    "wasi:sockets/tcp-create-socket",
    "wasi:sockets/ip-name-lookup",
];

/// Whether `import` is a WASI 0.2 interface the linker provides.
fn provided_by_wasi(import: &str) -> bool {
    let (interface, version) = import.split_once('@').unwrap_or((import, ""));
    WASI_INTERFACES.contains(&interface) && version.starts_with("0.2.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_check_names_what_the_file_is() {
        let path = Path::new("p.wasm");
        assert!(matches!(
            check_header(b"", path),
            Err(LoadError::Empty { .. })
        ));
        let text = check_header(b"# README\nhello", path).unwrap_err();
        assert_eq!(
            text.to_string(),
            "p.wasm: not a wasm component: it is a text file"
        );
        let binary = check_header(&[0xff, 0xfe, 0x00, 0x80], path).unwrap_err();
        assert!(
            binary.to_string().ends_with("it is not WebAssembly"),
            "{binary}"
        );
        let core = check_header(b"\0asm\x01\0\0\0", path).unwrap_err();
        assert!(matches!(core, LoadError::CoreModule { .. }), "{core}");
        assert!(check_header(b"\0asm\x0d\0\x01\0", path).is_ok());
    }

    #[test]
    fn host_provides_wasi_0_2_the_log_and_its_capabilities_only() {
        let runtime =
            Runtime::new(RuntimeConfig::default().cache_dir(None)).expect("runtime builds");
        let provided = |import: &str| runtime.provided_by_host(import);
        assert!(provided("wasi:http/outgoing-handler@0.2.12"));
        assert!(provided("egress:http-broker/broker@0.1.0"));
        assert!(provided("wasi:cli/environment@0.2.0"));
        assert!(provided("egress:provider/log@0.1.0"));
        assert!(provided("egress:log/log@0.1.0"));
        assert!(!provided("acme:exfil/upload@0.1.0"));
        assert!(!provided("wasi:http/outgoing-handler@0.3.0"));
        assert!(!provided("egress:provider/log@0.9.0"));
        assert!(
            !provided("egress:libvirt/libvirt@0.1.0"),
            "libvirt only with the capability"
        );
        assert_eq!(runtime.capabilities(), ["http"]);
    }
}
