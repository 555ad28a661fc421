//! Tiered compilation: a component missing from the compile cache serves first from Winch's
//! code, compiled in a fraction of Cranelift's time, while one background thread compiles it
//! with Cranelift and swaps the optimized code in (see [`crate::Compilation::Tiered`]).
//!
//! One thread, one job at a time: a burst of hot swaps queues its compiles instead of taking
//! every core from the calls and the next swap's Winch compile, and a job whose provider is
//! gone by its turn is skipped.

use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Weak};
use std::time::Instant;

use arc_swap::ArcSwap;
use egress_digest::Digest;
use tokio::sync::watch;
use wasmtime::Engine;
use wasmtime::component::{Component, Linker};

use crate::cache::CompileCache;
use crate::engine::Tier;
use crate::error::one_line;
use crate::provider::Code;
use crate::state::HostState;
use crate::wit::Served;

/// One component to compile with Cranelift.
pub(crate) struct Job {
    /// The provider's identity, for the log.
    pub(crate) identity: Arc<str>,
    /// The component's bytes and their sha256 (the cache key).
    pub(crate) bytes: Arc<[u8]>,
    pub(crate) digest: Digest,
    /// The contract version's bindings.
    pub(crate) served: &'static Served,
    /// Where the provider (and every binding of it) reads the code its calls run.
    pub(crate) code: Weak<ArcSwap<Code>>,
    /// Set to `true` when the job is over, whatever its outcome.
    pub(crate) settled: watch::Sender<bool>,
}

/// The background compiler. Its thread ends when the last handle is dropped.
pub(crate) struct Optimizer {
    jobs: Sender<Job>,
}

impl Optimizer {
    /// Start the thread that compiles with `engine` (Cranelift), links with `linker` and stores
    /// what it compiled in `cache`.
    pub(crate) fn start(
        engine: Engine,
        linker: Linker<HostState>,
        cache: Option<CompileCache>,
    ) -> std::io::Result<Optimizer> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("egress-optimize".into())
            .spawn(move || {
                for job in queue {
                    optimize(&engine, &linker, cache.as_ref(), &job);
                    job.settled.send_replace(true);
                }
            })?;
        Ok(Optimizer { jobs })
    }

    /// Queue `job`. If the thread is gone (it never panics, but if it did) the job is dropped,
    /// which settles it: the provider keeps its baseline code.
    pub(crate) fn submit(&self, job: Job) {
        if let Err(mpsc::SendError(job)) = self.jobs.send(job) {
            tracing::warn!(
                provider = %job.identity,
                "the background compiler is gone; the provider keeps its baseline code"
            );
        }
    }
}

/// Compile `job` with Cranelift, cache it and publish it to the provider, unless the provider
/// is gone already.
fn optimize(engine: &Engine, linker: &Linker<HostState>, cache: Option<&CompileCache>, job: &Job) {
    if job.code.strong_count() == 0 {
        return;
    }
    let started = Instant::now();
    let compiled = Component::new(engine, &job.bytes).and_then(|component| {
        let pre = (job.served.pre)(linker.instantiate_pre(&component)?)?;
        Ok((component, pre))
    });
    match compiled {
        Ok((component, pre)) => {
            if let Some(cache) = cache {
                cache.store(&component, &job.digest);
            }
            if let Some(code) = job.code.upgrade() {
                code.store(Arc::new(Code {
                    pre,
                    component,
                    tier: Tier::Optimized,
                }));
                tracing::info!(
                    provider = %job.identity,
                    digest = %job.digest.hex(),
                    elapsed = ?started.elapsed(),
                    "provider now runs its optimized code"
                );
            }
        }
        // Winch accepted what Cranelift refuses: keep serving Winch's code, and say so.
        Err(error) => tracing::warn!(
            provider = %job.identity,
            digest = %job.digest.hex(),
            error = %one_line(&error),
            "the optimizing compiler failed; the provider keeps its baseline code"
        ),
    }
}
