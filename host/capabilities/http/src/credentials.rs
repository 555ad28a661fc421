//! Where injected secrets come from. A source is read on every request, so a rotated secret is
//! used from the next request on, with no restart (Proxmox entry 14: the token is read per
//! request). Reading never blocks the async executor: a file is read on a blocking thread.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use zeroize::Zeroizing;

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

/// A secret in a file (for example a mounted Kubernetes Secret), read and trimmed on every call.
#[derive(Clone, Debug)]
pub struct FileSource {
    path: PathBuf,
}

impl FileSource {
    /// A source reading `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The file read.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl FileSource {
    /// Read and check the file now, blocking the calling thread.
    pub fn read_blocking(&self) -> Result<Secret, CredentialError> {
        let bytes = Zeroizing::new(std::fs::read(&self.path).map_err(|source| {
            CredentialError::Unreadable {
                path: self.path.clone(),
                source,
            }
        })?);
        let text = std::str::from_utf8(&bytes).map_err(|_| CredentialError::Unusable {
            path: self.path.clone(),
        })?;
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(CredentialError::Empty {
                path: self.path.clone(),
            });
        }
        if trimmed.chars().any(|c| c.is_control()) {
            return Err(CredentialError::Unusable {
                path: self.path.clone(),
            });
        }
        Ok(Secret::new(trimmed.to_owned()))
    }
}

impl CredentialSource for FileSource {
    fn read(&self) -> SecretFuture<'_> {
        let source = self.clone();
        Box::pin(async move {
            let path = source.path.clone();
            tokio::task::spawn_blocking(move || source.read_blocking())
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
    async fn file_source_trims_and_rereads_every_call() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "  first-secret\n").unwrap();
        let source = FileSource::new(&path);
        assert_eq!(source.read().await.unwrap().expose(), "first-secret");
        std::fs::write(&path, "second-secret\r\n").unwrap();
        assert_eq!(source.read().await.unwrap().expose(), "second-secret");
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
