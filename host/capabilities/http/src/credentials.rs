//! Where injected secrets come from. A source is asked on every request, so a rotated secret is
//! used from the next request on, with no restart (Proxmox entry 14: the token is read per
//! request). Asking never blocks the async executor: a file source keeps the secret in memory
//! and reads the file again, on a blocking thread, only when its [`FileWatch`] saw it change.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use zeroize::Zeroizing;

use crate::watch::{FileWatch, Freshness};
use egress_runtime::lock;

/// A secret value. Its `Debug` and `Display` print `[redacted]`; its memory is zeroed on drop.
pub struct Secret(Zeroizing<String>);

impl Secret {
    /// Wraps a value. Surrounding whitespace is the caller's to trim.
    pub fn new(value: String) -> Self {
        Self(Zeroizing::new(value))
    }

    /// The value, for building the injected header. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Why a secret could not be read. Never carries the secret or any part of it.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The file could not be read (missing, permissions).
    #[error("secret file {path}: {source}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is empty or only whitespace.
    #[error("secret file {path} is empty")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The secret holds bytes a header value cannot carry (control characters, non-UTF-8).
    #[error("secret file {path} holds characters a header cannot carry")]
    Unusable {
        /// The file.
        path: PathBuf,
    },
}

/// What [`CredentialSource::read`] returns.
pub type SecretFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Secret, CredentialError>> + Send + 'a>>;

/// A place the broker reads a secret from, once per request.
pub trait CredentialSource: Send + Sync {
    /// Reads the current secret, without blocking the async executor.
    fn read(&self) -> SecretFuture<'_>;
}

/// A secret in a file (for example a mounted Kubernetes Secret), trimmed, kept in memory (zeroed
/// on drop) and read again once the file changed: an edit, a file renamed over it, a Secret's
/// `..data` swap. Clones share the cache.
#[derive(Clone, Debug)]
pub struct FileSource {
    shared: Arc<FileShared>,
}

#[derive(Debug)]
struct FileShared {
    path: PathBuf,
    watch: FileWatch,
    cache: Mutex<Cached>,
}

/// The last secret read, and how many changes were seen: a read that started before a change
/// must not store what it read after that change was seen.
#[derive(Default)]
struct Cached {
    secret: Option<Zeroizing<String>>,
    changes: u64,
}

impl fmt::Debug for Cached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cached")
            .field("secret", &self.secret.as_ref().map(|_| "[redacted]"))
            .field("changes", &self.changes)
            .finish()
    }
}

impl FileSource {
    /// A source reading `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        Self {
            shared: Arc::new(FileShared {
                watch: FileWatch::new(&path),
                path,
                cache: Mutex::new(Cached::default()),
            }),
        }
    }

    /// Read and check the file now, blocking the calling thread. Bypasses the cache.
    #[cfg(test)]
    fn read_blocking(&self) -> Result<Secret, CredentialError> {
        read_file(&self.shared.path).map(|secret| Secret::new(secret.to_string()))
    }

    /// The cached secret if the file has not changed since it was read; else the count of
    /// changes seen, for [`FileSource::store`].
    fn cached(&self) -> Result<Secret, u64> {
        let mut cache = lock(&self.shared.cache);
        match self.shared.watch.check() {
            Freshness::Unchanged => {}
            // Unwatched: a read is under way, or no watch could be had; read it every time.
            Freshness::Changed | Freshness::Unwatched => {
                cache.secret = None;
                cache.changes += 1;
            }
        }
        match &cache.secret {
            Some(secret) => Ok(Secret::new(secret.to_string())),
            None => Err(cache.changes),
        }
    }

    /// Arm the watch, then read the file (blocking): the watch must see a change made while
    /// the file is read.
    fn reload_blocking(&self, changes: u64) -> Result<Secret, CredentialError> {
        self.shared.watch.arm_blocking();
        let secret = read_file(&self.shared.path)?;
        let mut cache = lock(&self.shared.cache);
        if cache.changes == changes {
            cache.secret = Some(secret.clone());
        }
        Ok(Secret::new(secret.to_string()))
    }
}

/// Read, trim and check a secret file.
fn read_file(path: &Path) -> Result<Zeroizing<String>, CredentialError> {
    let bytes =
        Zeroizing::new(
            std::fs::read(path).map_err(|source| CredentialError::Unreadable {
                path: path.to_owned(),
                source,
            })?,
        );
    let text = std::str::from_utf8(&bytes).map_err(|_| CredentialError::Unusable {
        path: path.to_owned(),
    })?;
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(CredentialError::Empty {
            path: path.to_owned(),
        });
    }
    if trimmed.chars().any(|c| c.is_control()) {
        return Err(CredentialError::Unusable {
            path: path.to_owned(),
        });
    }
    Ok(Zeroizing::new(trimmed.to_owned()))
}

impl CredentialSource for FileSource {
    fn read(&self) -> SecretFuture<'_> {
        let changes = match self.cached() {
            Ok(secret) => return Box::pin(std::future::ready(Ok(secret))),
            Err(changes) => changes,
        };
        let source = self.clone();
        Box::pin(async move {
            let path = source.shared.path.clone();
            tokio::task::spawn_blocking(move || source.reload_blocking(changes))
                .await
                .unwrap_or_else(|join_error| {
                    Err(CredentialError::Unreadable {
                        path,
                        source: std::io::Error::other(join_error.to_string()),
                    })
                })
        })
    }
}

/// A secret the host holds in memory (for example from a Kubernetes Secret it watches), replaced
/// when it rotates: the next request reads the new one. Never written to disk.
#[derive(Default)]
pub struct MemorySource {
    value: std::sync::RwLock<Option<Zeroizing<String>>>,
    /// Names where the secret comes from, for error messages (never the value).
    origin: String,
}

impl fmt::Debug for MemorySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySource")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl MemorySource {
    /// An empty source; `origin` (for example `Secret ops/proxmox-token key token`) names it in
    /// errors.
    pub fn new(origin: impl Into<String>) -> Self {
        Self {
            value: std::sync::RwLock::new(None),
            origin: origin.into(),
        }
    }

    /// Hold `value` (trimmed) from now on; `None` when it is gone.
    pub fn set(&self, value: Option<&str>) {
        let value = value.map(|value| Zeroizing::new(value.trim().to_owned()));
        *self
            .value
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = value;
    }

    fn current(&self) -> Result<Secret, CredentialError> {
        let path = PathBuf::from(&self.origin);
        let guard = self
            .value
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match guard.as_ref().map(|value| value.as_str()) {
            None => Err(CredentialError::Unreadable {
                path,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "not present"),
            }),
            Some("") => Err(CredentialError::Empty { path }),
            Some(value) if value.chars().any(|c| c.is_control()) => {
                Err(CredentialError::Unusable { path })
            }
            Some(value) => Ok(Secret::new(value.to_owned())),
        }
    }
}

impl CredentialSource for MemorySource {
    fn read(&self) -> SecretFuture<'_> {
        // In memory: nothing to wait for.
        Box::pin(std::future::ready(self.current()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn file_source_trims_and_rereads_once_the_file_changed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "  first-secret\n").unwrap();
        let source = FileSource::new(&path);
        assert_eq!(source.read().await.unwrap().expose(), "first-secret");
        std::fs::write(&path, "second-secret\r\n").unwrap();
        assert_eq!(source.read().await.unwrap().expose(), "second-secret");
        // A Kubernetes Secret rotates by renaming a new file over the old one.
        let next = dir.path().join("token.next");
        std::fs::write(&next, "third-secret").unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(source.read().await.unwrap().expose(), "third-secret");
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            source.read().await,
            Err(CredentialError::Unreadable { .. })
        ));
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn an_unchanged_file_is_served_from_memory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first-secret").unwrap();
        let source = FileSource::new(&path);
        assert_eq!(source.read().await.unwrap().expose(), "first-secret");
        let before = lock(&source.shared.cache).changes;
        assert!(source.read().await.is_ok());
        assert_eq!(lock(&source.shared.cache).changes, before, "no change seen");
        assert!(
            lock(&source.shared.cache).secret.is_some(),
            "served from memory"
        );
    }

    #[test]
    fn errors_and_debug_never_show_the_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "abc\u{7}def").unwrap();
        let error = FileSource::new(&path).read_blocking().unwrap_err();
        assert!(matches!(error, CredentialError::Unusable { .. }));
        assert!(!error.to_string().contains("abc"), "{error}");

        std::fs::write(&path, " \n").unwrap();
        assert!(matches!(
            FileSource::new(&path).read_blocking(),
            Err(CredentialError::Empty { .. })
        ));

        let missing = FileSource::new(dir.path().join("missing"))
            .read_blocking()
            .unwrap_err();
        assert!(matches!(missing, CredentialError::Unreadable { .. }));

        let memory = MemorySource::new("Secret ops/token key token");
        assert!(matches!(
            memory.current(),
            Err(CredentialError::Unreadable { .. })
        ));
        memory.set(Some(" rotated\n"));
        assert_eq!(memory.current().unwrap().expose(), "rotated");
        memory.set(Some("bad\u{1b}"));
        let error = memory.current().unwrap_err();
        assert!(!error.to_string().contains("bad"), "{error}");
        assert!(format!("{memory:?}").contains("Secret ops/token"));

        let secret = Secret::new("hunter2".into());
        assert_eq!(
            format!("{secret:?} {secret}"),
            "Secret([redacted]) [redacted]"
        );
    }
}
