//! Kubernetes mode: the operator against an API server.
//!
//! `egress-operator run` (without `--local`) connects with the in-cluster config or the
//! kubeconfig ([`kube::Client::try_default`]), starts the shared [`Operator`] and then:
//!
//! 1. **Caches** ([`caches`]): one watch each of Proxies, ProviderConfigs, Secrets and
//!    ConfigMaps, always running, so a replica standing by is ready to take over.
//! 2. **Leader election** with `kube-lease-manager` (a Lease named `egress-operator` in
//!    `--namespace`, held by `--pod-name`): only the leader runs the controllers. A lease lost
//!    while leading stops them and the process exits with status 1 (the Deployment restarts it
//!    as a follower).
//! 3. **Three controllers** while leading: Proxies ([`proxy`]: the finalizer, the reconciler
//!    core, status by server-side apply, Events, and the health checks probed every second),
//!    ProviderConfigs ([`provider_config`]: the ProviderConfig reconciler core: bind and grant,
//!    `check` every resync, hot swap, orphan sweep) and ProxyPools ([`pool`]: the planner's
//!    plan carried out, the pool's Service and EndpointSlice). Reconciles of one object never run at once (kube's controller serialises them);
//!    a failed one is counted by its [`Error::metric_label`].
//! 4. **Health** on `--listen` ([`crate::server`]): `/healthz`, `/readyz` (caches synced and the
//!    election running, leading or standing by) and `/metrics`.
//! 5. **Graceful shutdown** on SIGTERM or SIGINT: no new reconciles, the ones running finish
//!    within [`Options::shutdown_grace`], the lease is released, exit 0.
//!
//! What triggers a reconcile of a Proxy: a change of its spec, finalizers, deletion or pool
//! placement request (not of its own status), a changed verdict of its health check, a change of its ProviderConfig's spec, a rebinding of its ProviderConfig (a hot
//! swap or a new spec bound), a change of a Secret or ConfigMap its user-data names, and the
//! time its last [`Outcome`](crate::proxy_reconciler::Outcome) asked for. Of a ProviderConfig: its
//! spec, a Secret or ConfigMap it references (a rotated credential is in the broker from the
//! next request on), a registry event for its component file, and every resync. Of a ProxyPool:
//! its own changes, any change of a Proxy it controls (its status included), and every resync
//! (30 s at most: the progress deadline and remediation are clocks).

pub mod caches;
pub mod pool;
pub mod provider_config;
pub mod proxy;

#[cfg(test)]
mod fixtures;

use std::future::Future;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::{broadcast, oneshot};
use tokio::task::JoinHandle;

use crate::installation::Installation;
use crate::operator::Operator;
use crate::run_args::RunArgs;
use crate::server::{self, Health};
use crate::{AbortOnDrop, Note};

pub use caches::Caches;

/// The components directory in a cluster (a volume of the Deployment).
pub const DEFAULT_COMPONENTS: &str = "/var/lib/egress-operator/components";
/// Where pulled provider images are cached unless `--image-cache` says otherwise (the
/// Deployment's emptyDir).
pub const DEFAULT_IMAGE_CACHE: &str = "/var/cache/egress-operator/images";
/// The Lease the replicas elect a leader with.
pub const LEASE_NAME: &str = "egress-operator";
/// The controller name on Events.
pub const REPORTER: &str = "egress-operator";

/// Why a reconcile did not finish. Each variant wraps a source or names a domain condition.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or could not be reached.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The finalizer helper failed. Boxed: its error type contains this one.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// Deleting: the VM is not removed yet; the finalizer stays and the Proxy comes back then.
    #[error("the VM is not removed yet; again in {0:?}")]
    CleanupPending(Duration),
    /// An object without a namespace or name.
    #[error("the object has no {0}")]
    Unnamed(&'static str),
}

/// After a failed reconcile: count it under `controller` and its label, then come back after the
/// cleanup's own wait, the shortest retry after a stale finalizer patch, else [`api_retry`].
pub(crate) fn retry_after(controller: &str, error: &Error, context: &Context) -> Action {
    let metrics = &context.operator.metrics;
    metrics.reconcile_failed(controller, error.metric_label());
    if let Error::Finalizer(inner) = error
        && let kube::runtime::finalizer::Error::CleanupFailed(Error::CleanupPending(wait)) =
            inner.as_ref()
    {
        return Action::requeue(*wait);
    }
    if error.is_stale_finalizer_patch() {
        return Action::requeue(context.operator.reconciler.timing().backoff_base);
    }
    Action::requeue(api_retry(context))
}

/// Log what one of `controller`'s passes ended with: a pass waiting on its cleanup or on a stale
/// finalizer patch comes back by itself (debug); anything else is a warning.
pub(crate) fn log_pass<T, Q: std::error::Error + 'static>(
    controller: &str,
    result: Result<T, kube::runtime::controller::Error<Error, Q>>,
) -> std::future::Ready<()> {
    match result {
        Ok(_) => {}
        Err(kube::runtime::controller::Error::ReconcilerFailed(error, object))
            if error.metric_label() == "cleanuppending" || error.is_stale_finalizer_patch() =>
        {
            tracing::debug!(%object, "{error}");
        }
        Err(error) => tracing::warn!("{controller} controller: {error}"),
    }
    std::future::ready(())
}

/// The wait after an API error: the adapter-failure rule both modes share.
pub(crate) fn api_retry(context: &Context) -> Duration {
    context.operator.reconciler.timing().after_adapter_failure()
}

impl Error {
    /// The finalizer's patch was refused because its JSON-patch `test` saw other finalizers than
    /// the cache did: the cache had not yet seen a write (such as the finalizer just added). The
    /// watch brings the object as it is and the next reconcile goes on: nothing to warn of.
    pub fn is_stale_finalizer_patch(&self) -> bool {
        use kube::runtime::finalizer::Error as Finalizer;
        let Error::Finalizer(inner) = self else {
            return false;
        };
        matches!(
            inner.as_ref(),
            Finalizer::AddFinalizer(kube::Error::Api(status))
                | Finalizer::RemoveFinalizer(kube::Error::Api(status))
                if status.code == 422
        )
    }

    /// A label for metrics and logs: the variant, lower case.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::CleanupFailed(Error::CleanupPending(_)) => {
                    "cleanuppending"
                }
                kube::runtime::finalizer::Error::ApplyFailed(_)
                | kube::runtime::finalizer::Error::CleanupFailed(_) => "reconcile",
                _ => "finalizer",
            },
            Error::CleanupPending(_) => "cleanuppending",
            Error::Unnamed(_) => "unnamed",
        }
    }
}

/// How Kubernetes mode runs beside the [`Settings`](crate::operator::Settings) both modes share.
#[derive(Clone, Debug)]
pub struct Options {
    /// The Lease's namespace (the operator's own).
    pub lease_namespace: String,
    /// The Lease's name.
    pub lease_name: String,
    /// This replica's name as the Lease holder, and the Events' reporting instance.
    pub lease_holder: String,
    /// Seconds a lease is valid after its last renewal.
    pub lease_seconds: u64,
    /// Seconds before expiry the holder renews.
    pub lease_grace_seconds: u64,
    /// How long reconciles in flight may take to finish on shutdown.
    pub shutdown_grace: Duration,
}

impl Options {
    /// A 15 s lease renewed 5 s before it expires, 30 s to finish on shutdown.
    pub fn new(namespace: &str, lease_holder: &str) -> Options {
        Options {
            lease_namespace: namespace.to_owned(),
            lease_name: LEASE_NAME.to_owned(),
            lease_holder: lease_holder.to_owned(),
            lease_seconds: 15,
            lease_grace_seconds: 5,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// Run the operator against a cluster until SIGTERM or SIGINT (exit 0) or a lost lease (1).
pub async fn run(args: &RunArgs) -> anyhow::Result<ExitCode> {
    let client = Client::try_default()
        .await
        .context("connecting to the cluster (in-cluster config or kubeconfig)")?;
    let mut shutdown = std::pin::pin!(crate::shutdown_signal());
    let installation = match &args.installation {
        Some(installation) => installation.clone(),
        None => tokio::select! {
            () = &mut shutdown => return Ok(ExitCode::SUCCESS),
            installation = cluster_installation(&client) => installation,
        },
    };
    tracing::info!(%installation, "this installation");
    let operator = Operator::start(args.settings(
        installation,
        Path::new(DEFAULT_COMPONENTS),
        Path::new(DEFAULT_IMAGE_CACHE),
    ))
    .await?;
    let identity = match &args.pod_name {
        Some(name) => name.clone(),
        None => host_name(),
    };
    let mut options = Options::new(&args.namespace, &identity);
    options.lease_seconds = args.lease_seconds;
    options.lease_grace_seconds = (args.lease_seconds / 3).max(1);
    run_with(client, operator, options, shutdown).await
}

/// This cluster's installation: `cluster-` and the UID of its `kube-system` namespace, which
/// lives as long as the cluster. Asked until the API server answers: without it no VM may be made
/// or swept, and a crash loop would only hide why (a 403 says which rule is missing).
pub async fn cluster_installation(client: &Client) -> Installation {
    let namespaces: kube::Api<Namespace> = kube::Api::all(client.clone());
    let mut wait = Duration::from_secs(1);
    loop {
        let why = match namespaces.get("kube-system").await {
            Ok(namespace) => match namespace
                .metadata
                .uid
                .as_deref()
                .map(Installation::of_cluster)
            {
                Some(Ok(installation)) => return installation,
                Some(Err(why)) => why,
                None => "namespace kube-system has no UID".into(),
            },
            Err(error) => format!("reading namespace kube-system: {error}"),
        };
        tracing::error!(
            retry_in = ?wait,
            "cannot name this installation ({why}); the operator needs `get` on namespace \
             kube-system, or pass --installation"
        );
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(30));
    }
}

/// Run with `client` and a started `operator` until `shutdown` resolves (exit 0) or the lease
/// is lost (exit 1). Errors are what kept it from starting (an API server that never lists).
pub async fn run_with(
    client: Client,
    operator: Arc<Operator>,
    options: Options,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<ExitCode> {
    let health = Arc::new(Health::new(operator.metrics.clone()));
    let _server = operator.settings.listen.map(|addr| {
        let health = Arc::clone(&health);
        AbortOnDrop::new([tokio::spawn(async move {
            if let Err(error) = server::serve(addr, health).await {
                tracing::error!("{error:#}");
            }
        })])
    });
    let mut shutdown = std::pin::pin!(shutdown);

    let (caches, _reflectors) = Caches::start(&client);
    health.set_ready(Err("the caches are not synced yet".into()));
    tokio::select! {
        () = &mut shutdown => return Ok(ExitCode::SUCCESS),
        synced = caches.synced() => synced.context("the caches stopped before they synced")?,
    }

    // A Lease that cannot be read or made (a missing RBAC rule, an API server down) is retried,
    // logged with why: exiting would only turn it into a crash loop that hides the reason.
    let mut wait = Duration::from_secs(1);
    let manager = loop {
        let built = LeaseManagerBuilder::new(client.clone(), &options.lease_name)
            .with_namespace(&options.lease_namespace)
            .with_identity(&options.lease_holder)
            .with_duration(options.lease_seconds)
            .with_grace(options.lease_grace_seconds)
            .build()
            .await;
        match built {
            Ok(manager) => break manager,
            Err(error) => {
                let why = format!(
                    "the leader election cannot start (Lease {}/{}: the operator needs get, \
                     create and patch on Leases there): {error}",
                    options.lease_namespace, options.lease_name
                );
                tracing::error!(retry_in = ?wait, "{why}");
                health.set_ready(Err(why));
                tokio::select! {
                    () = &mut shutdown => return Ok(ExitCode::SUCCESS),
                    () = tokio::time::sleep(wait) => {}
                }
                wait = (wait * 2).min(Duration::from_secs(30));
            }
        }
    };
    let (mut leading, lease) = manager.watch().await;
    health.set_ready(Ok(()));
    tracing::info!(identity = %options.lease_holder, "standing by for the lease");

    while !*leading.borrow_and_update() {
        tokio::select! {
            () = &mut shutdown => {
                release(leading, lease).await;
                return Ok(ExitCode::SUCCESS);
            }
            changed = leading.changed() => {
                if changed.is_err() {
                    anyhow::bail!("the leader election stopped: {}", lease_outcome(lease).await);
                }
            }
        }
    }

    tracing::info!(identity = %options.lease_holder, "leading: reconciling");
    let controllers = Controllers::start(client, operator, caches, &options.lease_holder);
    let code = tokio::select! {
        () = &mut shutdown => {
            tracing::info!("shutting down: finishing the reconciles in flight");
            controllers.stop(options.shutdown_grace).await;
            ExitCode::SUCCESS
        }
        () = lost(&mut leading) => {
            controllers.abort();
            tracing::error!("lost the lease: stopped reconciling; exiting to restart as a follower");
            ExitCode::from(1)
        }
    };
    release(leading, lease).await;
    Ok(code)
}

/// Resolves when `leading` turns false or the election ends.
async fn lost(leading: &mut tokio::sync::watch::Receiver<bool>) {
    loop {
        if leading.changed().await.is_err() || !*leading.borrow_and_update() {
            return;
        }
    }
}

type LeaseTask = JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>;

/// Let go of the lease: closing the channel makes the manager release it and stop.
async fn release(leading: tokio::sync::watch::Receiver<bool>, lease: LeaseTask) {
    drop(leading);
    match tokio::time::timeout(Duration::from_secs(5), lease).await {
        Ok(Ok(Ok(_))) => {}
        Ok(Ok(Err(error))) => tracing::warn!(%error, "releasing the lease failed"),
        Ok(Err(error)) => tracing::warn!(%error, "the lease task failed"),
        Err(_) => tracing::warn!("releasing the lease took too long"),
    }
}

async fn lease_outcome(lease: LeaseTask) -> String {
    match lease.await {
        Ok(Ok(_)) => "released".into(),
        Ok(Err(error)) => error.to_string(),
        Err(error) => error.to_string(),
    }
}

/// The running controllers of a leader.
struct Controllers {
    tasks: Vec<JoinHandle<()>>,
    stops: Vec<oneshot::Sender<()>>,
}

impl Controllers {
    fn start(client: Client, operator: Arc<Operator>, caches: Caches, identity: &str) -> Self {
        let (rebound, _) = broadcast::channel(256);
        let context = Arc::new(Context {
            recorder: Recorder::new(
                client.clone(),
                Reporter {
                    controller: REPORTER.into(),
                    instance: Some(identity.to_owned()),
                },
            ),
            client,
            operator,
            caches,
            rebound,
        });
        let (proxy_stop, proxy_stopped) = oneshot::channel();
        let (pc_stop, pc_stopped) = oneshot::channel();
        let (pool_stop, pool_stopped) = oneshot::channel();
        let mut tasks = vec![
            tokio::spawn(proxy::controller(Arc::clone(&context), proxy_stopped)),
            tokio::spawn(provider_config::controller(
                Arc::clone(&context),
                pc_stopped,
            )),
            tokio::spawn(pool::controller(Arc::clone(&context), pool_stopped)),
        ];
        tasks.push(tokio::spawn(provider_config::forget_deleted(context)));
        Controllers {
            tasks,
            stops: vec![proxy_stop, pc_stop, pool_stop],
        }
    }

    /// Stop starting reconciles; wait up to `grace` for the running ones.
    async fn stop(self, grace: Duration) {
        // The first tasks are the controllers, one per stop; the rest are helpers.
        let mut tasks = self.tasks;
        let helpers = tasks.split_off(self.stops.len());
        for stop in self.stops {
            let _ = stop.send(());
        }
        for helper in &helpers {
            helper.abort();
        }
        let aborts: Vec<_> = tasks.iter().map(JoinHandle::abort_handle).collect();
        let finished = futures::future::join_all(tasks);
        if tokio::time::timeout(grace, finished).await.is_err() {
            tracing::warn!(
                ?grace,
                "reconciles still running after the grace period; abandoning them"
            );
            for task in aborts {
                task.abort();
            }
        }
    }

    fn abort(self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// What both controllers' reconciles share.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Providers, reconcilers, metrics.
    pub operator: Arc<Operator>,
    /// The watched objects.
    pub caches: Caches,
    /// Events.
    pub recorder: Recorder,
    /// Names of ProviderConfigs whose binding changed; their Proxies reconcile.
    pub rebound: broadcast::Sender<String>,
}

impl Context {
    /// Record `notes` as Events on the object `reference` names. A failure is logged: an Event
    /// lost never fails a reconcile.
    pub async fn record(
        &self,
        notes: &[Note],
        reference: &k8s_openapi::api::core::v1::ObjectReference,
    ) {
        use kube::runtime::events::{Event, EventType};
        for note in notes {
            let event = Event {
                type_: if note.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: truncate(&note.reason, 128),
                note: Some(truncate(&note.message, 1024)),
                action: "Reconcile".into(),
                secondary: None,
            };
            if let Err(error) = self.recorder.publish(&event, reference).await {
                tracing::warn!(%error, reason = %note.reason, "recording an event failed");
            }
        }
    }
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "egress-operator".into())
}

/// Server-side apply of a resource's whole status, as the operator's one field manager.
pub async fn write_status<K>(
    api: &kube::Api<K>,
    name: &str,
    status: &impl serde::Serialize,
) -> Result<(), Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        name,
        &kube::api::PatchParams::apply(crate::crd::FIELD_MANAGER).force(),
        &kube::api::Patch::Apply(patch),
    )
    .await?;
    Ok(())
}

/// Stream helper: the controllers' trigger streams never end while the caches live.
pub(crate) fn never_ending<S>(stream: S) -> futures::stream::BoxStream<'static, S::Item>
where
    S: futures::Stream + Send + 'static,
    S::Item: Send,
{
    stream.chain(futures::stream::pending()).boxed()
}
