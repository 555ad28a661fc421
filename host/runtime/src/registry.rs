//! [`Registry`]: the providers of one directory, hot-swapped as their files change.
//!
//! One `*.wasm` file is one provider, named by its `describe`. When a file is added, replaced or
//! removed, the registry validates the new bytes off the call path (compile, link, describe) and
//! publishes the new set atomically. Calls already running keep their `Arc<Provider>` and finish
//! on the old generation; a file that fails to load is reported (a tracing error and a
//! [`RegistryEvent::Rejected`]) and the provider it replaced keeps serving.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use notify::Watcher;
use tokio::sync::{Mutex, broadcast, mpsc};

use crate::cache::sha256_hex;
use crate::error::{CallError, RegistryError};
use crate::provider::{CallContext, Provider};
use crate::runtime::Runtime;
use crate::types::{Request, Response};

/// Quiet time after the last file event before the directory is rescanned: editors and `cp`
/// write a file in several steps.
const DEBOUNCE: Duration = Duration::from_millis(150);
/// Events kept for slow subscribers.
const EVENT_CAPACITY: usize = 256;

/// A change to the registry's providers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryEvent {
    /// A file's provider now serves (first load or a new generation).
    Loaded {
        /// The provider's name.
        name: String,
        /// The new generation.
        generation: u64,
        /// The sha256 of the component's bytes.
        digest: String,
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
        /// The provider's name.
        name: String,
        /// The file.
        path: PathBuf,
    },
}

/// What the registry last concluded about a file.
struct FileState {
    /// The sha256 of the bytes last examined; unchanged bytes are not reloaded.
    digest: String,
    /// The provider name the file serves, or `None` if its bytes were rejected.
    serves: Option<String>,
}

struct RegistryInner {
    runtime: Runtime,
    dir: PathBuf,
    /// The published providers by name; swapped whole.
    providers: ArcSwap<HashMap<String, Arc<Provider>>>,
    /// Per-file state; the lock also serializes rescans.
    files: Mutex<HashMap<PathBuf, FileState>>,
    events: broadcast::Sender<RegistryEvent>,
}

/// The providers of one directory, kept in step with its files. Cheap to clone.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use egress_runtime::{CallContext, DenyAll, Registry, Request, Runtime, RuntimeConfig};
///
/// let runtime = Runtime::new(RuntimeConfig::default(), Arc::new(DenyAll))?;
/// let registry = Registry::watch(runtime, "/var/lib/egress-operator/providers").await?;
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
        std::fs::read_dir(&dir).map_err(|source| RegistryError::ReadDir {
            path: dir.clone(),
            source,
        })?;
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        let inner = Arc::new(RegistryInner {
            runtime,
            dir: dir.clone(),
            providers: ArcSwap::from_pointee(HashMap::new()),
            files: Mutex::new(HashMap::new()),
            events,
        });

        let (changed, changes) = mpsc::unbounded_channel::<()>();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                match event {
                    // Which file changed does not matter: a rescan compares every file's digest.
                    Ok(_) => {
                        let _ = changed.send(());
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

    /// The provider named `name`, if one serves.
    pub fn get(&self, name: &str) -> Option<Arc<Provider>> {
        self.inner.providers.load().get(name).cloned()
    }

    /// Every serving provider, sorted by name.
    pub fn providers(&self) -> Vec<Arc<Provider>> {
        let mut providers: Vec<_> = self.inner.providers.load().values().cloned().collect();
        providers.sort_by(|a, b| a.name().cmp(b.name()));
        providers
    }

    /// Run `request` on the provider named `name` (its current generation).
    pub async fn call(
        &self,
        name: &str,
        request: Request,
        ctx: &CallContext,
    ) -> Result<Response, CallError> {
        let provider = self.get(name).ok_or_else(|| CallError::NotLoaded {
            name: name.to_owned(),
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

/// Rescan after each burst of file events, until the registry is dropped.
async fn watch_loop(registry: Weak<RegistryInner>, mut changes: mpsc::UnboundedReceiver<()>) {
    while changes.recv().await.is_some() {
        // Debounce: wait for a quiet period, absorbing further events.
        loop {
            match tokio::time::timeout(DEBOUNCE, changes.recv()).await {
                Ok(Some(())) => continue,
                Ok(None) => return,
                Err(_quiet) => break,
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
        let listing = self.list_wasm_files()?;
        let mut providers = HashMap::clone(&self.providers.load());
        let mut events = Vec::new();

        // Files that disappeared take their provider with them.
        let gone: Vec<PathBuf> = files
            .keys()
            .filter(|path| !listing.contains(*path))
            .cloned()
            .collect();
        for path in gone {
            let Some(state) = files.remove(&path) else {
                continue;
            };
            if let Some(name) = state.serves
                && providers
                    .get(&name)
                    .is_some_and(|provider| provider.path() == path)
            {
                providers.remove(&name);
                tracing::info!(provider = %name, path = %path.display(), "provider removed");
                events.push(RegistryEvent::Removed { name, path });
            }
        }

        for path in &listing {
            let bytes = match tokio::fs::read(path).await {
                Ok(bytes) => bytes,
                // Gone between listing and reading: the next event's rescan removes it.
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => {
                    let error = format!("{}: cannot read: {error}", path.display());
                    events.push(self.rejected(path, error));
                    continue;
                }
            };
            let digest = sha256_hex(&bytes);
            let previous = files.get(path);
            if previous.is_some_and(|state| state.digest == digest) {
                continue;
            }
            let previously_served = previous.and_then(|state| state.serves.clone());
            match self.runtime.load_bytes(&bytes, path).await {
                Err(error) => {
                    // Keep the old generation serving; remember the bad bytes so they are
                    // reported once, not on every rescan.
                    files.insert(
                        path.clone(),
                        FileState {
                            digest,
                            serves: previously_served,
                        },
                    );
                    events.push(self.rejected(path, error.to_string()));
                }
                Ok(provider) => {
                    let name = provider.name().to_owned();
                    let claimed_by_other = providers
                        .get(&name)
                        .filter(|existing| existing.path() != path)
                        .map(|existing| existing.path().to_owned());
                    if let Some(other) = claimed_by_other {
                        files.insert(
                            path.clone(),
                            FileState {
                                digest,
                                serves: previously_served,
                            },
                        );
                        let error = format!(
                            "{}: provider name `{name}` is already served by {}",
                            path.display(),
                            other.display()
                        );
                        events.push(self.rejected(path, error));
                        continue;
                    }
                    if let Some(old_name) = previously_served.filter(|old| *old != name) {
                        providers.remove(&old_name);
                        events.push(RegistryEvent::Removed {
                            name: old_name,
                            path: path.clone(),
                        });
                    }
                    events.push(RegistryEvent::Loaded {
                        name: name.clone(),
                        generation: provider.generation(),
                        digest: provider.digest().to_owned(),
                        path: path.clone(),
                    });
                    providers.insert(name.clone(), provider);
                    files.insert(
                        path.clone(),
                        FileState {
                            digest,
                            serves: Some(name),
                        },
                    );
                }
            }
        }

        self.providers.store(Arc::new(providers));
        drop(files);
        for event in events {
            // No subscribers is fine.
            let _ = self.events.send(event);
        }
        Ok(())
    }

    fn rejected(&self, path: &Path, error: String) -> RegistryEvent {
        tracing::error!(path = %path.display(), error = %error, "provider file rejected; the previous generation keeps serving");
        RegistryEvent::Rejected {
            path: path.to_owned(),
            error,
        }
    }

    /// The directory's `*.wasm` regular files, sorted (so the first of two files claiming one
    /// name wins deterministically).
    fn list_wasm_files(&self) -> Result<BTreeSet<PathBuf>, RegistryError> {
        let read_dir = |source| RegistryError::ReadDir {
            path: self.dir.clone(),
            source,
        };
        let mut files = BTreeSet::new();
        for entry in std::fs::read_dir(&self.dir).map_err(read_dir)? {
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
    }
}
