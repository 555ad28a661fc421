//! Local mode, the embedded default: `egress-operator run --local DIR`.
//!
//! The same reconciler as in a cluster, over the `Proxy`, `ProviderConfig`, `Secret` and
//! `ConfigMap` manifests of a folder (the same YAML), watched for changes. State lives in an
//! embedded SQLite database under the folder ([`store`]): each Proxy's UID is made once and kept,
//! so a restart adopts the VMs it made. Deleting a Proxy's manifest runs the finalizer path: its
//! VM is deleted, then its record. A malformed manifest gets one error naming the file and the
//! field, and its objects keep their last good version ([`manifests`]).
//!
//! ProviderConfigs go through the same ProviderConfig reconciler core as in a cluster
//! ([`crate::provider_config_reconciler`]): on start, when their manifest or a Secret or
//! ConfigMap of the folder changes, on a registry event, and when their last outcome asked (the
//! resync, or the next orphan sweep); their status, `status.orphans` included, is stored.
//!
//! While it runs, a table on stdout gets a line each time a Proxy changes (like
//! `kubectl get -w`); log lines go to stderr. `egress-operator get proxies --local DIR` prints the
//! stored state (table, YAML or JSON).

pub mod manifests;
mod pools;

pub use pools::get_pools;
pub mod queue;
pub mod store;

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use arc_swap::ArcSwap;
use notify::Watcher as _;
use tokio::time::Instant;

use crate::conditions::{self, condition};
use crate::crd::{Phase, ProxyStatus};
use crate::operator::Operator;
use crate::provider_config_reconciler::ProviderConfigState;
use crate::proxy_reconciler::{Next, Resolved};
use crate::run_args::RunArgs;
use crate::server::{self, Health};
use crate::sweep::LiveProxies;
use crate::{AbortOnDrop, Missing, Note, Objects, lock};

use self::manifests::Folder;
use self::queue::Queue;
use self::store::{ProxyRecord, Store};

/// Where local mode keeps its state, under the folder.
pub const STATE_DIR: &str = ".egress-operator";
/// Workers reconciling Proxies at once (each provider's own concurrency bounds its calls).
const WORKERS: usize = 32;
/// Quiet time after a file event before the folder is read again.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// How often every pool is planned again (its Proxies' changes move its rollout on).
const POOL_PASS: Duration = Duration::from_secs(1);
/// How often the health checks due are probed (each at its own `periodSeconds`).
const PROBE_PASS: Duration = Duration::from_secs(1);
/// How long a shutdown waits for calls in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// The folder's Secrets and ConfigMaps, for the reconcilers.
struct FolderObjects(Arc<ArcSwap<Folder>>);

impl Objects for FolderObjects {
    fn secret_value(&self, namespace: &str, name: &str, key: &str) -> Result<Vec<u8>, Missing> {
        self.0.load().secret_value(namespace, name, key)
    }

    fn config_map_value(&self, namespace: &str, name: &str, key: &str) -> Result<String, Missing> {
        self.0.load().config_map_value(namespace, name, key)
    }
}

/// Local mode's shared state.
struct Local {
    operator: Arc<Operator>,
    store: Store,
    dir: PathBuf,
    /// The folder's objects, last good version of each file (the rescan's own copy).
    folder: Mutex<Folder>,
    /// A snapshot of it for readers.
    snapshot: Arc<ArcSwap<Folder>>,
    /// Proxies due for a reconcile.
    queue: Queue,
    /// ProviderConfigs due for a reconcile (their last outcome's `next`).
    config_queue: Queue,
    table: Option<Table>,
    /// ProviderConfigs reconciled at least once since start.
    applied: Mutex<HashSet<String>>,
}

/// Run local mode over `dir` until interrupted (or, with `--exit-when-settled`, until every
/// Proxy is Ready or failed).
pub async fn run(dir: &Path, args: &RunArgs) -> anyhow::Result<ExitCode> {
    let dir = dir
        .canonicalize()
        .with_context(|| format!("local folder {}", dir.display()))?;
    let store = Store::open(&dir.join(STATE_DIR).join("state.db"))?;
    let mut settings = args.settings(
        store.installation()?,
        &dir.join("components"),
        &dir.join(STATE_DIR).join("images"),
    );
    tracing::info!(installation = %settings.installation, "local mode over {}", dir.display());
    // Local mode resolves a tag once and records its digest in the status.
    settings.images.allow_tags = true;
    let listener = server::bind(args.listen).await?;
    let operator = Operator::start(settings).await?;
    let health = Arc::new(Health::new(operator.metrics.clone()));
    let _serving =
        listener.map(|listener| AbortOnDrop::new([server::spawn(listener, Arc::clone(&health))]));
    let local = Arc::new(Local {
        operator,
        store,
        dir: dir.clone(),
        folder: Mutex::new(Folder::default()),
        snapshot: Arc::new(ArcSwap::from_pointee(Folder::default())),
        queue: Queue::default(),
        config_queue: Queue::default(),
        table: (!args.no_table).then(Table::default),
        applied: Mutex::new(HashSet::new()),
    });
    if let Some(table) = &local.table {
        table.header();
    }

    local.restore_revisions().await?;
    let (watcher, mut changes) = watch_folder(&dir)?;
    local.rescan().await?;
    // Ready once the folder has been read: from here on every Proxy in it is being worked on.
    health.set_ready(Ok(()));
    // Every stored Proxy is looked at once at start: a restart adopts what exists.
    for record in local.store.run(|store| store.proxies()).await? {
        local.queue.schedule(&record.key(), Instant::now());
    }

    let workers: Vec<_> = (0..WORKERS)
        .map(|_| tokio::spawn(Arc::clone(&local).work()))
        .collect();
    let _probing = AbortOnDrop::new([tokio::spawn(Arc::clone(&local).probe())]);

    let exit = local.serve(&mut changes, args.exit_when_settled).await;
    local.queue.close();
    let drained = futures::future::join_all(workers);
    if tokio::time::timeout(SHUTDOWN_GRACE, drained).await.is_err() {
        tracing::warn!(grace = ?SHUTDOWN_GRACE, "calls still in flight at shutdown were abandoned");
    }
    drop(watcher);
    Ok(exit)
}

/// Every stored Proxy, those being deleted too (their VMs are not orphans), for the sweep; `None`
/// when the store cannot be read, which sweeps nothing.
async fn live_proxies(store: Store) -> Option<LiveProxies> {
    match store.run(|store| store.proxies()).await {
        Ok(records) => Some(
            records
                .into_iter()
                .map(|record| (record.proxy.uid, record.proxy.status.provider_id))
                .collect(),
        ),
        Err(error) => {
            tracing::error!(%error, "reading the Proxies for the orphan sweep failed");
            None
        }
    }
}

/// A watch of `dir` and the channel of its changes: one message per change of a manifest.
fn watch_folder(
    dir: &Path,
) -> anyhow::Result<(
    notify::RecommendedWatcher,
    tokio::sync::mpsc::UnboundedReceiver<()>,
)> {
    let (changed, changes) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Only manifests count: a log or an editor's swap file written beside them is no change.
        let relevant = event.is_ok_and(|event| {
            event.paths.iter().any(|path| {
                !path.components().any(|part| part.as_os_str() == STATE_DIR)
                    && path.extension().is_some_and(|extension| {
                        matches!(extension.to_str(), Some("yaml" | "yml" | "json"))
                    })
            })
        });
        if relevant {
            let _ = changed.send(());
        }
    })
    .context("watching the local folder")?;
    watcher
        .watch(dir, notify::RecursiveMode::NonRecursive)
        .with_context(|| format!("watching {}", dir.display()))?;
    Ok((watcher, changes))
}

impl Local {
    fn objects(&self) -> FolderObjects {
        FolderObjects(Arc::clone(&self.snapshot))
    }

    /// Serves until interrupted or, with `exit_when_settled`, settled: folder `changes` become
    /// rescans, a component event reconciles every ProviderConfig, due ProviderConfigs are
    /// reconciled. The exit code.
    async fn serve(
        &self,
        changes: &mut tokio::sync::mpsc::UnboundedReceiver<()>,
        exit_when_settled: bool,
    ) -> ExitCode {
        let mut registry_events = self.operator.registry().subscribe();
        let mut settle_tick = tokio::time::interval(Duration::from_millis(100));
        let mut pool_tick = tokio::time::interval(POOL_PASS);
        // One listener for the whole run: one made anew in each turn of the loop would miss a
        // signal that arrives while a turn's work runs.
        let shutdown = crate::shutdown_signal();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                Some(()) = changes.recv() => {
                    // Debounce: wait for a quiet moment, absorbing further events.
                    while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, changes.recv()).await {}
                    if let Err(error) = self.rescan().await {
                        tracing::error!(%error, "reading the local folder failed");
                    }
                }
                event = registry_events.recv() => {
                    // A component changed, or failed to: reconcile every ProviderConfig; those
                    // whose binding moved bring their Proxies along, and a refused one shows
                    // `Degraded`.
                    if !matches!(event, Err(tokio::sync::broadcast::error::RecvError::Closed)) {
                        self.reconcile_configs(|_| true).await;
                    }
                }
                Some(name) = self.config_queue.next() => {
                    self.config_queue.done(&name);
                    self.reconcile_config(&name).await;
                }
                _ = pool_tick.tick() => {
                    if let Err(error) = self.reconcile_pools().await {
                        tracing::error!(%error, "planning the ProxyPools failed");
                    }
                }
                _ = settle_tick.tick(), if exit_when_settled => {
                    if let Some(code) = self.settled().await {
                        break code;
                    }
                }
                () = &mut shutdown => {
                    tracing::info!("interrupted; letting calls in flight finish");
                    break ExitCode::SUCCESS;
                }
            }
        }
    }

    /// One worker: reconciles the Proxies the queue hands out until it is closed. A reconcile
    /// that failed in the store is counted and retried after the adapter-failure wait, as in
    /// Kubernetes mode.
    async fn work(self: Arc<Self>) {
        while let Some(key) = self.queue.next().await {
            if let Err(error) = self.process(&key).await {
                tracing::error!(proxy = %key, %error, "reconcile failed");
                self.operator.metrics.reconcile_failed("proxy", "store");
                let retry = self.operator.reconciler.timing().after_adapter_failure();
                self.queue.schedule(&key, Instant::now() + retry);
            }
            self.queue.done(&key);
        }
    }

    /// Probes the services due, every second; a Proxy whose verdict changed is reconciled now.
    async fn probe(self: Arc<Self>) {
        let mut tick = tokio::time::interval(PROBE_PASS);
        loop {
            tick.tick().await;
            let prober = self.operator.reconciler.prober();
            for key in prober.probe_due(crate::now().0).await {
                self.queue.schedule(&key, Instant::now());
            }
        }
    }

    /// Read the folder again and bring the store in step with it.
    async fn rescan(&self) -> anyhow::Result<()> {
        let (folder, errors) = {
            let mut folder = self
                .folder
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let errors = folder
                .rescan(&self.dir)
                .with_context(|| format!("reading {}", self.dir.display()))?;
            (folder.clone(), errors)
        };
        for error in errors {
            tracing::error!("{}", error.message);
        }
        let previous = self.snapshot.swap(Arc::new(folder.clone()));

        // ProviderConfigs first, so Proxies find them.
        let changed_configs = self.store_configs(&folder).await?;
        let references_changed = !same_references(&previous, &folder);
        self.reconcile_configs(|name| {
            references_changed
                || changed_configs.contains(name)
                || !lock(&self.applied).contains(name)
        })
        .await;

        self.reconcile_pools().await?;
        self.store_proxies(&folder, references_changed).await?;
        Ok(())
    }

    /// Brings the store's ProviderConfigs in step with `folder`'s; the names of those whose spec
    /// changed.
    async fn store_configs(&self, folder: &Folder) -> anyhow::Result<HashSet<String>> {
        let declared = folder.provider_configs();
        let mut changed_configs = HashSet::new();
        for (name, manifest) in &declared {
            let (key, spec) = (name.clone(), manifest.spec.clone());
            let (_, changed) = self
                .store
                .run(move |store| store.declare_config(&key, &spec))
                .await?;
            if changed {
                changed_configs.insert(name.clone());
            }
        }
        for record in self.store.run(|store| store.configs()).await? {
            if !declared.contains_key(&record.name) {
                let operator = &self.operator;
                operator
                    .provider_configs
                    .forget(&operator.providers, &record.name);
                let name = record.name.clone();
                self.store
                    .run(move |store| store.remove_config(&name))
                    .await?;
                lock(&self.applied).remove(&record.name);
                self.config_queue.forget(&record.name);
                tracing::info!(provider_config = %record.name, "ProviderConfig removed");
            }
        }
        Ok(changed_configs)
    }

    /// Brings the store's Proxies in step with `folder`'s, scheduling each that changed, whose
    /// referenced objects changed, or whose manifest is gone (to delete its VM).
    async fn store_proxies(&self, folder: &Folder, references_changed: bool) -> anyhow::Result<()> {
        let proxies = folder.proxies();
        let now = Instant::now();
        let created = crate::now().0.to_string();
        for (key, manifest) in &proxies {
            let refers = manifest.spec.user_data.as_ref().is_some_and(|data| {
                data.secret_key_ref.is_some() || data.config_map_key_ref.is_some()
            });
            let (manifest, created) = (manifest.clone(), created.clone());
            let (_, changed) = self
                .store
                .run(move |store| {
                    store.declare_proxy(
                        &manifest.namespace,
                        &manifest.name,
                        &manifest.spec,
                        &created,
                    )
                })
                .await?;
            if changed || (refers && references_changed) {
                self.queue.schedule(key, now);
            }
        }
        for record in self.store.run(|store| store.proxies()).await? {
            // A pool's Proxy has no manifest: its pool says when it goes.
            let declared = record.membership.is_some() || proxies.contains_key(&record.key());
            if !record.deleting && !declared {
                let (namespace, name) = (record.namespace.clone(), record.name.clone());
                if self
                    .store
                    .run(move |store| store.mark_deleting(&namespace, &name))
                    .await?
                {
                    tracing::info!(proxy = %record.key(), "manifest removed: deleting its VM");
                    self.queue.schedule(&record.key(), now);
                }
            }
        }
        Ok(())
    }

    /// Reconcile each declared ProviderConfig `which` keeps.
    async fn reconcile_configs(&self, which: impl Fn(&str) -> bool) {
        let names: Vec<String> = self
            .snapshot
            .load()
            .provider_configs()
            .keys()
            .filter(|name| which(name))
            .cloned()
            .collect();
        for name in names {
            self.reconcile_config(&name).await;
        }
    }

    /// Reconcile ProviderConfig `name` with the core, store what it decided, and schedule the
    /// next reconcile when the outcome asks; Proxies of one whose binding moved (or that is
    /// reconciled for the first time since start) are scheduled now.
    async fn reconcile_config(&self, name: &str) {
        let declared = self.snapshot.load().provider_configs();
        let Some(manifest) = declared.get(name) else {
            return;
        };
        let key = name.to_owned();
        let record = match self.store.run(move |store| store.config(&key)).await {
            Ok(Some(record)) => record,
            Ok(None) => return,
            Err(error) => {
                tracing::error!(provider_config = %name, %error, "reading a ProviderConfig failed");
                self.operator
                    .metrics
                    .reconcile_failed("providerconfig", "store");
                let retry = self.operator.reconciler.timing().after_adapter_failure();
                self.config_queue.schedule(name, Instant::now() + retry);
                return;
            }
        };
        let state = ProviderConfigState {
            name: name.to_owned(),
            generation: record.generation,
            spec: manifest.spec.clone(),
            status: record.status,
        };
        let live_proxy_uids = live_proxies(self.store.clone());
        let operator = &self.operator;
        let outcome = operator
            .provider_configs
            .reconcile(
                &operator.providers,
                &state,
                &self.objects(),
                live_proxy_uids,
            )
            .await;
        for note in &outcome.notes {
            log_note(&format!("ProviderConfig {name}"), note);
        }
        if outcome.status != state.status {
            let (key, status) = (name.to_owned(), outcome.status.clone());
            if let Err(error) = self
                .store
                .run(move |store| store.write_config_status(&key, &status))
                .await
            {
                tracing::error!(%error, "writing a ProviderConfig status failed");
            }
        }
        // The outcome's time replaces any earlier one.
        self.config_queue.forget(name);
        self.config_queue
            .schedule(name, Instant::now() + outcome.next);
        self.keep_revision(name).await;
        let first = lock(&self.applied).insert(name.to_owned());
        if outcome.rebound || first {
            self.schedule_proxies_of(name).await;
        }
    }

    /// Each ProviderConfig starts from the binding revision it had: a Proxy latched on a refusal
    /// stays so unless what the ProviderConfig references changed while no operator ran.
    async fn restore_revisions(&self) -> anyhow::Result<()> {
        for config in self.store.run(|store| store.configs()).await? {
            let name = config.name.clone();
            let kept = self.store.run(move |store| store.binding_revision(&name));
            if let Some((revision, fingerprint)) = kept.await? {
                let providers = &self.operator.providers;
                providers.restore(&config.name, revision, fingerprint);
            }
        }
        Ok(())
    }

    /// Keep ProviderConfig `name`'s binding revision for the next run.
    async fn keep_revision(&self, name: &str) {
        let Some((revision, fingerprint)) = self.operator.providers.revision(name) else {
            return;
        };
        let key = name.to_owned();
        let kept =
            (self.store).run(move |store| store.set_binding_revision(&key, revision, fingerprint));
        if let Err(error) = kept.await {
            tracing::warn!(provider_config = %name, %error, "keeping the binding's revision failed");
        }
    }

    async fn schedule_proxies_of(&self, provider_config: &str) {
        let Ok(records) = self.store.run(|store| store.proxies()).await else {
            return;
        };
        let now = Instant::now();
        for record in records {
            if record.spec.provider_config_ref == provider_config {
                self.queue.schedule(&record.key(), now);
            }
        }
    }

    /// Reconcile Proxy `key` once and write what it decided.
    async fn process(&self, key: &str) -> anyhow::Result<()> {
        let Some((namespace, name)) = key.split_once('/') else {
            return Ok(());
        };
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        let Some(record) = self
            .store
            .run(move |store| store.proxy(&namespace, &name))
            .await?
        else {
            self.queue.forget(key);
            return Ok(());
        };
        let declared = (self.snapshot.load().provider_configs())
            .contains_key(&record.spec.provider_config_ref);
        let resolved = Resolved::lookup(
            &record.spec,
            &record.namespace,
            declared,
            &self.operator.providers,
            &self.objects(),
        );
        let outcome = self.operator.reconciler.reconcile(&record, resolved).await;
        for note in &outcome.notes {
            log_note(&format!("Proxy {key}"), note);
        }
        let (namespace, name, uid) = (
            record.namespace.clone(),
            record.name.clone(),
            record.uid.clone(),
        );
        match outcome.next {
            Next::Finalized => {
                self.store
                    .run(move |store| store.remove_proxy(&namespace, &name, &uid))
                    .await?;
                if let Some(table) = &self.table {
                    table.gone(&record);
                }
                return Ok(());
            }
            Next::After(wait) => self.queue.schedule(key, Instant::now() + wait),
            Next::AwaitChange => {}
        }
        if outcome.status != record.status {
            let status = outcome.status.clone();
            self.store
                .run(move |store| store.write_status(&namespace, &name, &uid, &status))
                .await?;
            if let Some(table) = &self.table {
                table.changed(&record, &outcome.status);
            }
        }
        Ok(())
    }

    /// With `--exit-when-settled`: the exit status once every Proxy is Ready or waits on a
    /// person (each printed on stderr, with its reason) and no deletion is pending; `None` while
    /// any is still on its way.
    async fn settled(&self) -> Option<ExitCode> {
        let records = self.store.run(|store| store.proxies()).await.ok()?;
        let pools = self.store.run(|store| store.pools()).await.ok()?;
        let configs = self.store.run(|store| store.configs()).await.ok()?;
        let mut waiting = Vec::new();
        let mut failed = false;
        for pool in &pools {
            let status = &pool.status;
            let progressing = condition(&status.conditions, crate::pool::PROGRESSING);
            if progressing.is_some_and(|progressing| progressing.status == "False") {
                failed = true;
            } else if status.observed_generation != Some(pool.generation)
                || status.replicas != pool.spec.replicas
                || status.updated_replicas != pool.spec.replicas
            {
                return None;
            }
        }
        for record in &records {
            if record.deleting {
                return None;
            }
            if conditions::is_true(&record.status.conditions, conditions::READY) {
                continue;
            }
            match waits_on_a_person(record, &configs) {
                Some(why) => waiting.push(format!("Proxy {}: {why}", record.key())),
                None => return None,
            }
        }
        for why in &waiting {
            eprintln!("{why}");
        }
        Some(if failed || !waiting.is_empty() {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        })
    }
}

/// The Proxy's own reasons not to be Ready that no retry ends: a person must change an object.
const REFUSED: &[&str] = &[
    "InvalidGrant",
    "CapabilityNotGranted",
    "ProviderConfigNotFound",
    "UserDataNotFound",
    "InvalidUserData",
    "QuotaExceeded",
];

/// A ProviderConfig's reasons not to be Ready that end by themselves (retried, or loading).
const PASSING: &[&str] = &["ProviderNotReady", "Unreachable", "RegistryUnavailable"];

/// Why a Proxy that is not Ready waits on a person, if it does: a refusal, a pause or a failure
/// of its own, or its ProviderConfig refused (`reason: message`).
fn waits_on_a_person(record: &ProxyRecord, configs: &[store::ConfigRecord]) -> Option<String> {
    let ready = condition(&record.status.conditions, conditions::READY)?;
    let own = matches!(
        record.status.phase,
        Some(Phase::Failed | Phase::Paused | Phase::Degraded)
    ) || REFUSED.contains(&ready.reason.as_str());
    if own {
        return Some(format!("{}: {}", ready.reason, ready.message));
    }
    if ready.reason != "ProviderNotReady" {
        return None;
    }
    let name = &record.spec.provider_config_ref;
    let config = configs.iter().find(|config| &config.name == name)?;
    let refused = condition(&config.status.conditions, conditions::READY)
        .filter(|ready| ready.status == "False" && !PASSING.contains(&ready.reason.as_str()))?;
    Some(format!(
        "ProviderConfig {name} is not Ready: {}: {}",
        refused.reason, refused.message
    ))
}

/// Whether two folder views hold the same Secrets and ConfigMaps (the objects references
/// resolve to).
fn same_references(a: &Folder, b: &Folder) -> bool {
    a.object_data() == b.object_data()
}

fn log_note(object: &str, note: &Note) {
    if note.warning {
        tracing::warn!(object, reason = %note.reason, "{}", note.message);
    } else {
        tracing::info!(object, reason = %note.reason, "{}", note.message);
    }
}

/// The live table on stdout: a header, then a line each time a Proxy changes.
#[derive(Default)]
struct Table {
    /// The last line printed per Proxy, to print only changes.
    last: Mutex<HashMap<String, String>>,
}

impl Table {
    fn header(&self) {
        print_line(&row(
            "NAMESPACE",
            "NAME",
            "READY",
            "PHASE",
            "PROVIDER",
            "ADDRESS",
            "VM",
        ));
    }

    fn changed(&self, record: &ProxyRecord, status: &ProxyStatus) {
        let ready = condition(&status.conditions, conditions::READY)
            .map_or("Unknown", |ready| ready.status.as_str());
        let phase = status
            .phase
            .map_or_else(|| "-".to_owned(), |phase| format!("{phase:?}"));
        let line = row(
            &record.namespace,
            &record.name,
            ready,
            &phase,
            &record.spec.provider_config_ref,
            status.addresses.first().map_or("-", String::as_str),
            status.provider_id.as_deref().unwrap_or("-"),
        );
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if last.get(&record.key()) != Some(&line) {
            last.insert(record.key(), line.clone());
            print_line(&line);
        }
    }

    fn gone(&self, record: &ProxyRecord) {
        self.last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&record.key());
        print_line(&row(
            &record.namespace,
            &record.name,
            "-",
            "Deleted",
            &record.spec.provider_config_ref,
            "-",
            record.status.provider_id.as_deref().unwrap_or("-"),
        ));
    }
}

fn row(
    namespace: &str,
    name: &str,
    ready: &str,
    phase: &str,
    provider: &str,
    address: &str,
    vm: &str,
) -> String {
    format!("{namespace:<12} {name:<20} {ready:<7} {phase:<13} {provider:<16} {address:<16} {vm}")
}

fn print_line(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}

/// `egress-operator get proxies --local DIR -o table|yaml|json`.
pub fn get_proxies(dir: &Path, output: &str) -> anyhow::Result<ExitCode> {
    let records = open_state(dir)?.proxies()?;
    let objects: Vec<serde_json::Value> = records
        .iter()
        .map(|record| {
            let mut object = listed(
                "Proxy",
                [
                    &record.namespace,
                    &record.name,
                    &record.uid,
                    &record.created,
                ],
                record.generation,
                (&record.spec, &record.status),
            );
            let metadata = &mut object["metadata"];
            metadata["deletionTimestamp"] = serde_json::json!(record.deleting.then_some(true));
            if let Some(membership) = &record.membership {
                metadata["labels"] = serde_json::json!({
                    crate::crd::POOL_LABEL: membership.pool,
                    crate::crd::TEMPLATE_HASH_LABEL: membership.template_hash,
                });
            }
            object
        })
        .collect();
    print_objects(output, objects, || {
        let table = Table::default();
        table.header();
        for record in &records {
            table.changed(record, &record.status);
        }
    })
}

/// `egress-operator get providerconfigs --local DIR`: each ProviderConfig's state as local mode
/// last wrote it: what serves, its conditions (why it is not Ready), its orphans.
pub fn get_provider_configs(dir: &Path, output: &str) -> anyhow::Result<ExitCode> {
    let records = open_state(dir)?.configs()?;
    let objects: Vec<serde_json::Value> = records
        .iter()
        .map(|record| {
            serde_json::json!({
                "apiVersion": "egress-operator.io/v1alpha1",
                "kind": "ProviderConfig",
                "metadata": {"name": record.name, "generation": record.generation},
                "spec": record.spec,
                "status": record.status,
            })
        })
        .collect();
    print_objects(output, objects, || {
        let line = |[name, ready, reason, version, orphans]: [&str; 5]| {
            println!("{name:<20} {ready:<6} {reason:<24} {version:<10} {orphans}");
        };
        line(["NAME", "READY", "REASON", "VERSION", "ORPHANS"]);
        for record in &records {
            let status = &record.status;
            let ready = condition(&status.conditions, conditions::READY);
            let loaded = status.loaded.as_ref();
            let orphans = status
                .orphans
                .as_ref()
                .map(|found| found.found.len().to_string());
            line([
                &record.name,
                ready.map_or("-", |ready| ready.status.as_str()),
                ready.map_or("-", |ready| ready.reason.as_str()),
                loaded.map_or("-", |loaded| loaded.version.as_str()),
                orphans.as_deref().unwrap_or("-"),
            ]);
        }
    })
}

/// A stored object as `get -o yaml|json` prints it: `[namespace, name, uid, created]`,
/// its generation, and `(spec, status)`.
fn listed(
    kind: &str,
    [namespace, name, uid, created]: [&String; 4],
    generation: i64,
    (spec, status): (impl serde::Serialize, impl serde::Serialize),
) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "egress-operator.io/v1alpha1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "generation": generation,
            "creationTimestamp": created,
        },
        "spec": spec,
        "status": status,
    })
}

/// The state database of local-mode folder `dir`, for reading.
fn open_state(dir: &Path) -> anyhow::Result<Store> {
    let path = dir.join(STATE_DIR).join("state.db");
    if !path.exists() {
        anyhow::bail!(
            "{} has no local-mode state yet (run `egress-operator run --local {}` first)",
            dir.display(),
            dir.display()
        );
    }
    Ok(Store::open_read_only(&path)?)
}

/// Print `objects` as `output` says: a List in YAML or JSON, or the `table`.
fn print_objects(
    output: &str,
    objects: Vec<serde_json::Value>,
    table: impl FnOnce(),
) -> anyhow::Result<ExitCode> {
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
    match output {
        "json" => println!("{}", serde_json::to_string_pretty(&list)?),
        "yaml" => print!("{}", serde_norway::to_string(&list)?),
        "table" => table(),
        other => anyhow::bail!("-o {other}: expected table, yaml or json"),
    }
    Ok(ExitCode::SUCCESS)
}
