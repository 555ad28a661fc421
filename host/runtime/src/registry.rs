//! [`Registry`]: the providers of one directory, hot-swapped as their files change.
//!
//! One `*.wasm` file is one provider, whose identity is the file's name (`proxmox.wasm` serves as
//! `proxmox`): the host's name for it, which grants follow. What the component calls itself in
//! `describe` is only displayed; two files whose components describe themselves under one name
//! both serve, each as its own identity, and the registry warns about it, so a component can
//! neither replace another nor borrow its grant by claiming its name.
//!
//! When a file is added, replaced or removed, the registry validates the new bytes off the call
//! path (compile, link, describe) and publishes the new set atomically. Calls already running
//! keep their `Arc<Provider>` and finish on the old generation; a file that fails to load is
//! reported (a tracing error and a [`RegistryEvent::Rejected`]) and the provider it replaced
//! keeps serving.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use egress_digest::Digest;
use notify::Watcher;
use tokio::sync::{Mutex, broadcast, mpsc};

use crate::error::{CallError, LoadError, RegistryError};
use crate::identity::identity_of;
use crate::provider::{CallContext, Provider};
use crate::runtime::Runtime;
use crate::types::{Request, Response};

/// Quiet time after the last in-place write before the directory is rescanned: editors and `cp`
/// write a file in several steps. A rename into place needs none (see [`FileChange`]).
const DEBOUNCE: Duration = Duration::from_millis(150);
/// Events kept for slow subscribers.
const EVENT_CAPACITY: usize = 256;

/// A change to the registry's providers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryEvent {
    /// A file's provider now serves (first load or a new generation).
    Loaded {
        /// The provider's identity (the file's name).
        identity: String,
        /// The name its component describes itself under.
        described_as: String,
        /// The new generation.
        generation: u64,
        /// The sha256 of the component's bytes.
        digest: Digest,
        /// The file.
        path: PathBuf,
    },
    /// A file could not serve; whatever served before keeps serving.
    Rejected {
        /// The file.
        path: PathBuf,
        /// Why, on one line.
        error: String,
    },
    /// A file was removed and its provider with it.
    Removed {
        /// The provider's identity.
        identity: String,
        /// The file.
        path: PathBuf,
    },
}

/// What a file event means for when to rescan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileChange {
    /// A `*.wasm` file was renamed into place: the rename is atomic, so the file is whole now.
    RenamedIn,
    /// Anything else (a write in place, a create, a removal): the file may be half-written.
    Written,
}

impl FileChange {
    /// `None` for events that cannot change a provider (another file's writes, reads).
    fn of(event: &notify::Event) -> Option<FileChange> {
        use notify::EventKind;
        use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
        let touches_wasm = event.paths.iter().any(|path| {
            path.extension()
                .is_some_and(|extension| extension == "wasm")
        });
        match event.kind {
            _ if !touches_wasm => None,
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => Some(FileChange::Written),
            EventKind::Access(_) => None,
            // Only the destination's name counts: a rename out of `x.wasm` removes it.
            EventKind::Modify(ModifyKind::Name(RenameMode::To | RenameMode::Both))
                if event
                    .paths
                    .last()
                    .is_some_and(|path| path.extension().is_some_and(|e| e == "wasm")) =>
            {
                Some(FileChange::RenamedIn)
            }
            _ => Some(FileChange::Written),
        }
    }
}

/// What the registry last saw of a file, so that it examines (and reports) each version of the
/// file once.
#[derive(PartialEq, Eq)]
enum FileState {
    /// The sha256 of the bytes last examined, good or bad; unchanged bytes are not reloaded.
    Read(Digest),
    /// The error reading it last failed with.
    Unread(String),
}

struct RegistryInner {
    runtime: Runtime,
    dir: PathBuf,
    /// The published providers by identity; swapped whole.
    providers: ArcSwap<HashMap<String, Arc<Provider>>>,
    /// Per-file state; the lock also serializes rescans.
    files: Mutex<HashMap<PathBuf, FileState>>,
    events: broadcast::Sender<RegistryEvent>,
}

/// The providers of one directory, kept in step with its files. Cheap to clone.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use egress_runtime::{CallContext, Registry, Request, Runtime, RuntimeConfig};
///
/// let runtime = Runtime::new(RuntimeConfig::default())?;
/// let registry = Registry::watch(runtime, "/var/lib/egress-operator/providers").await?;
/// // Serves /var/lib/egress-operator/providers/proxmox.wasm:
/// let response = registry.call("proxmox", Request::Describe, &CallContext::default()).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Registry {
    inner: Arc<RegistryInner>,
    /// Stops watching when the last clone is dropped.
    _watcher: Arc<notify::RecommendedWatcher>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("dir", &self.inner.dir)
            .field(
                "providers",
                &self.inner.providers.load().keys().collect::<BTreeSet<_>>(),
            )
            .finish()
    }
}

impl Registry {
    /// Load every `*.wasm` in `dir`, then keep watching it. Must be called within a tokio
    /// runtime. Files that fail to load are reported, not fatal; an unreadable directory or a
    /// failing watcher is.
    pub async fn watch(runtime: Runtime, dir: impl AsRef<Path>) -> Result<Registry, RegistryError> {
        let dir = dir.as_ref().to_owned();
        list_wasm_files(dir.clone()).await?;
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        let inner = Arc::new(RegistryInner {
            runtime,
            dir: dir.clone(),
            providers: ArcSwap::from_pointee(HashMap::new()),
            files: Mutex::new(HashMap::new()),
            events,
        });

        let (changed, changes) = mpsc::unbounded_channel::<FileChange>();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                match event {
                    // Which file changed does not matter: a rescan compares every file's digest.
                    Ok(event) => {
                        if let Some(change) = FileChange::of(&event) {
                            let _ = changed.send(change);
                        }
                    }
                    Err(error) => tracing::warn!(error = %error, "provider directory watch error"),
                }
            })
            .map_err(|error| RegistryError::Watch {
                path: dir.clone(),
                message: error.to_string(),
            })?;
        watcher
            .watch(&dir, notify::RecursiveMode::NonRecursive)
            .map_err(|error| RegistryError::Watch {
                path: dir.clone(),
                message: error.to_string(),
            })?;

        inner.rescan().await?;
        tokio::spawn(watch_loop(Arc::downgrade(&inner), changes));
        Ok(Registry {
            inner,
            _watcher: Arc::new(watcher),
        })
    }

    /// The provider with identity `identity` (the file `<identity>.wasm`), if one serves.
    pub fn get(&self, identity: &str) -> Option<Arc<Provider>> {
        self.inner.providers.load().get(identity).cloned()
    }

    /// Every serving provider, sorted by identity.
    pub fn providers(&self) -> Vec<Arc<Provider>> {
        let mut providers: Vec<_> = self.inner.providers.load().values().cloned().collect();
        providers.sort_by(|a, b| a.identity().cmp(b.identity()));
        providers
    }

    /// Run `request` on the provider `identity` (its current generation).
    pub async fn call(
        &self,
        identity: &str,
        request: Request,
        ctx: &CallContext,
    ) -> Result<Response, CallError> {
        let provider = self.get(identity).ok_or_else(|| CallError::NotLoaded {
            name: identity.to_owned(),
        })?;
        provider.call(request, ctx).await
    }

    /// Changes from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<RegistryEvent> {
        self.inner.events.subscribe()
    }

    /// Rescan the directory now instead of waiting for the watcher.
    pub async fn reload_now(&self) -> Result<(), RegistryError> {
        self.inner.rescan().await
    }

    /// The watched directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }
}

/// Rescan after each burst of file events, until the registry is dropped: at once after a rename
/// into place, after [`DEBOUNCE`] of quiet when any file was written in place.
async fn watch_loop(
    registry: Weak<RegistryInner>,
    mut changes: mpsc::UnboundedReceiver<FileChange>,
) {
    while let Some(first) = changes.recv().await {
        let mut written = first == FileChange::Written;
        // Events already queued belong to the same burst.
        while let Ok(change) = changes.try_recv() {
            written |= change == FileChange::Written;
        }
        // A write in place may be half done: wait for a quiet period, absorbing further events.
        while written {
            match tokio::time::timeout(DEBOUNCE, changes.recv()).await {
                Ok(Some(_)) => continue,
                Ok(None) => return,
                Err(_quiet) => written = false,
            }
        }
        let Some(registry) = registry.upgrade() else {
            return;
        };
        if let Err(error) = registry.rescan().await {
            tracing::error!(error = %error, "provider directory rescan failed");
        }
    }
}

impl RegistryInner {
    /// Bring the published providers in step with the directory's files.
    async fn rescan(&self) -> Result<(), RegistryError> {
        let mut files = self.files.lock().await;
        let listing = list_wasm_files(self.dir.clone()).await?;
        let mut providers = HashMap::clone(&self.providers.load());
        let mut events = remove_gone(&mut files, &listing, &mut providers);
        for path in &listing {
            events.extend(self.examine(path, &mut files, &mut providers).await);
        }
        self.providers.store(Arc::new(providers));
        drop(files);
        for event in events {
            // No subscribers is fine.
            let _ = self.events.send(event);
        }
        Ok(())
    }

    /// Read the file at `path` and, when its bytes are new, load them into `providers`; what
    /// changed, if anything.
    async fn examine(
        &self,
        path: &Path,
        files: &mut HashMap<PathBuf, FileState>,
        providers: &mut HashMap<String, Arc<Provider>>,
    ) -> Option<RegistryEvent> {
        let (state, bytes) = match self.runtime.read_component(path).await {
            Ok(bytes) => (FileState::Read(Digest::of(&bytes)), Ok(bytes)),
            // Gone between listing and reading: the next event's rescan removes it.
            Err(LoadError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return None;
            }
            // Reported once per error (a file too large, once per size), not on every rescan.
            Err(error) => (FileState::Unread(error.to_string()), Err(error)),
        };
        if files.get(path) == Some(&state) {
            return None;
        }
        files.insert(path.to_owned(), state);
        let loaded = match (bytes, identity_of(path)) {
            (Ok(bytes), Ok(identity)) => self.runtime.load_bytes(&identity, &bytes, path).await,
            (Err(error), _) | (_, Err(error)) => Err(error),
        };
        Some(match loaded {
            // The old generation, if any, keeps serving.
            Err(error) => self.rejected(path, error.to_string()),
            Ok(provider) => serve(provider, providers),
        })
    }

    fn rejected(&self, path: &Path, error: String) -> RegistryEvent {
        tracing::error!(path = %path.display(), error = %error, "provider file rejected; the previous generation keeps serving");
        RegistryEvent::Rejected {
            path: path.to_owned(),
            error,
        }
    }
}

/// Forget the files of `files` missing from `listing`, and take their providers out of
/// `providers`.
fn remove_gone(
    files: &mut HashMap<PathBuf, FileState>,
    listing: &BTreeSet<PathBuf>,
    providers: &mut HashMap<String, Arc<Provider>>,
) -> Vec<RegistryEvent> {
    let gone: Vec<PathBuf> = files
        .keys()
        .filter(|path| !listing.contains(*path))
        .cloned()
        .collect();
    let mut events = Vec::new();
    for path in gone {
        files.remove(&path);
        let Ok(identity) = identity_of(&path) else {
            continue;
        };
        if providers
            .get(&identity)
            .is_some_and(|provider| provider.path() == path)
        {
            providers.remove(&identity);
            tracing::info!(provider = %identity, path = %path.display(), "provider removed");
            events.push(RegistryEvent::Removed { identity, path });
        }
    }
    events
}

/// Put `provider` in `providers` under its identity, warning when another serving component
/// describes itself under the same name.
fn serve(provider: Arc<Provider>, providers: &mut HashMap<String, Arc<Provider>>) -> RegistryEvent {
    let identity = provider.identity().to_owned();
    let described_as = provider.description().name.clone();
    if let Some(other) = providers
        .values()
        .find(|other| other.identity() != identity && other.description().name == described_as)
    {
        tracing::warn!(
            provider = %identity,
            other = %other.identity(),
            described_as = %described_as,
            "two components describe themselves under one name; each serves, and is granted, only as its own identity"
        );
    }
    let event = RegistryEvent::Loaded {
        identity: identity.clone(),
        described_as,
        generation: provider.load_generation(),
        digest: provider.component_digest(),
        path: provider.path().to_owned(),
    };
    providers.insert(identity, provider);
    event
}

/// The directory's `*.wasm` regular files, sorted, listed on a blocking thread.
async fn list_wasm_files(dir: PathBuf) -> Result<BTreeSet<PathBuf>, RegistryError> {
    let listed = tokio::task::spawn_blocking(move || {
        let read_dir = |source| RegistryError::ReadDir {
            path: dir.clone(),
            source,
        };
        let mut files = BTreeSet::new();
        for entry in std::fs::read_dir(&dir).map_err(read_dir)? {
            let entry = entry.map_err(read_dir)?;
            let path = entry.path();
            let is_wasm = path
                .extension()
                .is_some_and(|extension| extension == "wasm");
            // Follows symlinks, as deployments often link files in.
            if is_wasm && path.is_file() {
                files.insert(path);
            }
        }
        Ok(files)
    })
    .await;
    listed.unwrap_or_else(|join_error| {
        Err(RegistryError::ReadDir {
            path: PathBuf::new(),
            source: std::io::Error::other(join_error.to_string()),
        })
    })
}
