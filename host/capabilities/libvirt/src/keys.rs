//! Where SSH material from Secrets lives while libvirt needs it: libvirt's SSH transports read
//! the private key and known_hosts only from files, so the host writes them, and only there:
//!
//! - in one directory per process, `egress-operator-<pid>`, mode 0700, on a **memory-backed**
//!   filesystem (tmpfs or ramfs: `$XDG_RUNTIME_DIR`, else `/dev/shm`, or the directory the host
//!   is given), never on a disk; a base that is not memory-backed is refused;
//! - each file mode 0600, created new (never through an existing name); a grant set again with
//!   the same bytes keeps its file (and its pooled connection), a rotated key gets a new file
//!   under a fresh name, and so a new dial;
//! - removed when the grant that wrote it is gone and no call in flight still holds it, and the
//!   directory when the capability is dropped (the process ends). A process killed before that
//!   leaves its directory behind: the next one to start removes every `egress-operator-<pid>`
//!   whose process is gone.

use std::fs::{DirBuilder, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::Digest as _;

/// The prefix of a process's key directory.
const PREFIX: &str = "egress-operator-";

/// `statfs` magic numbers of the filesystems whose files live in memory only.
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// A process's private directory for key files. Removed with everything in it when dropped.
#[derive(Debug)]
pub(crate) struct KeyDir {
    path: PathBuf,
    next: AtomicU64,
}

impl KeyDir {
    /// Makes this process's directory under `base`, or under the first memory-backed one of
    /// `$XDG_RUNTIME_DIR` and `/dev/shm`; first removes what processes that are gone left.
    pub(crate) fn create(base: Option<&Path>) -> Result<KeyDir, String> {
        let base = match base {
            Some(base) => {
                check_base(base)?;
                base.to_owned()
            }
            None => std::env::var_os("XDG_RUNTIME_DIR")
                .map(PathBuf::from)
                .into_iter()
                .chain([PathBuf::from("/dev/shm")])
                .find(|candidate| memory_backed(candidate))
                .ok_or("neither $XDG_RUNTIME_DIR nor /dev/shm is a memory-backed filesystem: SSH keys from Secrets need one (give the operator a tmpfs directory)")?,
        };
        remove_stale(&base);
        let path = base.join(format!("{PREFIX}{}", std::process::id()));
        DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|error| format!("making {}: {error}", path.display()))?;
        Ok(KeyDir {
            path,
            next: AtomicU64::new(0),
        })
    }

    /// The directory.
    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `bytes` to a new 0600 file named after `what`; the file goes when the returned
    /// handle's last clone does.
    pub(crate) fn write(self: &Arc<Self>, what: &str, bytes: &[u8]) -> Result<KeyFile, String> {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let path = self.path.join(format!("{number}-{what}"));
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|error| format!("writing {}: {error}", path.display()))?;
        let written = file.write_all(bytes).and_then(|()| file.sync_all());
        let key = KeyFile {
            path,
            digest: sha2::Sha256::digest(bytes).into(),
            _dir: Arc::clone(self),
        };
        written.map_err(|error| format!("writing {}: {error}", key.path.display()))?;
        Ok(key)
    }
}

impl Drop for KeyDir {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_dir_all(&self.path)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.path.display(), %error, "removing the SSH key directory failed");
        }
    }
}

/// A file of a [`KeyDir`], removed when dropped. Holds its directory alive.
#[derive(Debug)]
pub(crate) struct KeyFile {
    path: PathBuf,
    /// The sha256 of what it holds.
    digest: [u8; 32],
    _dir: Arc<KeyDir>,
}

impl KeyFile {
    /// Where libvirt reads it.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether it holds `bytes`.
    pub(crate) fn holds(&self, bytes: &[u8]) -> bool {
        <[u8; 32]>::from(sha2::Sha256::digest(bytes)) == self.digest
    }
}

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether `base` may hold key directories: a directory on a memory-backed filesystem.
pub(crate) fn check_base(base: &Path) -> Result<(), String> {
    if memory_backed(base) {
        Ok(())
    } else {
        Err(format!(
            "{} is not a directory on a memory-backed filesystem (tmpfs or ramfs): SSH keys are never written to disk",
            base.display()
        ))
    }
}

/// Whether `path` is on tmpfs or ramfs.
fn memory_backed(path: &Path) -> bool {
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: `statfs` writes a `struct statfs` into `stat` and reads the NUL-terminated path.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c_path.as_ptr(), &mut stat) } != 0 {
        return false;
    }
    #[allow(clippy::unnecessary_cast)] // f_type is i64 or u32 depending on the target.
    let kind = stat.f_type as i64;
    kind == TMPFS_MAGIC || kind == RAMFS_MAGIC
}

/// Removes the key directories under `base` of processes that are gone, and one left by an
/// earlier process that had this process's PID (a restarted container's PID 1).
fn remove_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix(PREFIX))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = Path::new("/proc").join(pid.to_string()).exists();
        if pid == std::process::id() || !alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn keys_live_0600_in_a_private_memory_backed_directory_until_dropped() {
        let Ok(dir) = KeyDir::create(None) else {
            panic!("this host has no memory-backed /dev/shm");
        };
        let dir = Arc::new(dir);
        let base = dir.path().parent().unwrap().to_owned();
        assert!(memory_backed(&base));
        assert_eq!(mode(dir.path()), 0o700);
        let key = dir
            .write("hv1.key", b"-----BEGIN OPENSSH PRIVATE KEY-----\n")
            .unwrap();
        assert_eq!(mode(key.path()), 0o600);
        assert_eq!(
            std::fs::read(key.path()).unwrap(),
            b"-----BEGIN OPENSSH PRIVATE KEY-----\n"
        );
        let rotated = dir.write("hv1.key", b"new").unwrap();
        assert_ne!(
            rotated.path(),
            key.path(),
            "a rotated key gets a file of its own"
        );
        let (key_path, dir_path) = (key.path().to_owned(), dir.path().to_owned());
        drop(key);
        assert!(!key_path.exists());
        drop(dir);
        assert!(dir_path.exists(), "a live key file holds its directory");
        drop(rotated);
        assert!(!dir_path.exists());
    }

    #[test]
    fn a_base_on_disk_is_refused_and_stale_directories_are_removed() {
        let disk = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        if !memory_backed(disk.path()) {
            let error = KeyDir::create(Some(disk.path())).unwrap_err();
            assert!(error.contains("memory-backed"), "{error}");
        }
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        // A PID no process has (above the kernel's pid_max).
        let stale = shm.path().join(format!("{PREFIX}4294967295"));
        std::fs::create_dir(&stale).unwrap();
        let unrelated = shm.path().join("something-else");
        std::fs::create_dir(&unrelated).unwrap();
        let dir = KeyDir::create(Some(shm.path())).unwrap();
        assert!(!stale.exists());
        assert!(unrelated.exists());
        drop(dir);
    }
}
