//! Storage pools of the real daemon on folders of the caller's.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::daemon::{SYSTEM_URI, libvirtd};

/// A transient dir pool of the real daemon on a folder, unique to its maker; destroyed when
/// dropped (the folder goes with it when it is a temporary one).
pub struct DirPool {
    /// The pool's name.
    pub name: String,
    dir: PathBuf,
    _temporary: Option<tempfile::TempDir>,
}

impl Default for DirPool {
    fn default() -> Self {
        Self::new()
    }
}

impl DirPool {
    /// A pool on a temporary folder.
    pub fn new() -> Self {
        let temporary = tempfile::tempdir().expect("a temporary folder");
        let mut pool = Self::in_dir(temporary.path());
        pool._temporary = Some(temporary);
        pool
    }

    /// A pool on `dir` (made when missing).
    pub fn in_dir(dir: &Path) -> Self {
        use std::os::unix::fs::PermissionsExt;
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        libvirtd();
        let name = format!(
            "egress-lab-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        std::fs::create_dir_all(dir).expect("making the pool's folder");
        // qemu runs as its own user: it must reach the volumes libvirt hands it.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
            .expect("opening the pool's folder to qemu");
        let mut connect = virt::connect::Connect::open(Some(SYSTEM_URI)).expect("libvirtd answers");
        let xml = format!(
            "<pool type='dir'><name>{name}</name><target><path>{}</path></target></pool>",
            dir.display()
        );
        virt::storage_pool::StoragePool::create_xml(&connect, &xml, 0).expect("the pool starts");
        let _ = connect.close();
        Self {
            name,
            dir: dir.to_owned(),
            _temporary: None,
        }
    }

    /// The pool's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A libvirt grant (JSON) of the real daemon as connection `system`, with this pool.
    pub fn grant(&self) -> serde_json::Value {
        serde_json::json!({
            "connections": [{
                "name": "system",
                "uri": SYSTEM_URI,
                "pools": [self.name],
            }],
            "timeouts": { "callMs": 30000 },
        })
    }

    /// Where `volume` is on disk.
    pub fn path(&self, volume: &str) -> PathBuf {
        self.dir.join(volume)
    }

    /// The volumes in the pool's folder, by name (what libvirt would list after a refresh).
    pub fn volumes(&self) -> std::collections::BTreeSet<String> {
        std::fs::read_dir(&self.dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|entry| entry.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for DirPool {
    fn drop(&mut self) {
        if let Ok(mut connect) = virt::connect::Connect::open(Some(SYSTEM_URI)) {
            if let Ok(pool) = virt::storage_pool::StoragePool::lookup_by_name(&connect, &self.name)
            {
                let _ = pool.destroy();
            }
            let _ = connect.close();
        }
    }
}
