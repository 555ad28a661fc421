//! `storage-pool.prune-images`: base images nothing uses any more leave their pool once unused
//! for the grant's `images.unusedRetentionMs`.
//!
//! **A volume in use is never removed.** In use means, on the whole hypervisor, at the moment of
//! the prune: another volume of any active pool is backed by it (a copy-on-write disk), or a
//! domain's disk is it or reads it through its backing chain. The host scans every pool's volumes
//! and every domain's definition for that, under the hypervisor's lock ([`Retention::lock`]): a
//! copy-on-write volume is made under the same lock shared, so no disk can appear on a base
//! between the scan and the delete, whichever call of this host makes it. A prune that would wait
//! for one skips its turn instead (the next prune tries again), so it never holds up a create.
//! A volume libvirt copies from is safe without the lock: libvirt refuses to delete it.
//!
//! **Unused since when** is this host's memory ([`Retention::used`]): a base is used when it is
//! imported, backs a new volume, or is found in use by a prune; a prune that finds it unused and
//! not seen used within the retention removes it. A host that restarts forgets, and starts
//! counting again from its first prune: a base stays longer, never less. Each prune forgets the
//! volumes of its pool that are gone, so the memory holds no more than the pools do.
//!
//! Only images are candidates: volumes whose names start with the prefix the provider names its
//! bases with, never an import's temporary volume (`<name>.importing`) nor a volume an import is
//! writing, and only for a grant that may import images (the host can import a removed base
//! again; one put in place by a person stays).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock, TryLockError};
use std::time::{Duration, Instant};

use egress_runtime::lock;
use roxmltree::Document;
use virt::connect::Connect;
use virt::storage_pool::StoragePool;

use crate::bindings::egress::libvirt::libvirt::Error;

/// What the temporary volume of an import is called after the volume it becomes.
pub(crate) const IMPORTING_SUFFIX: &str = ".importing";

/// What the host remembers of image use, and the locks that order disk making against pruning;
/// shared by every call of every provider.
#[derive(Default)]
pub(crate) struct Retention {
    /// When each volume was last seen used, by (hypervisor, pool, volume).
    last_used: Mutex<HashMap<VolumeKey, Instant>>,
    /// One lock per hypervisor: making a backed volume or a clone takes it shared, a prune
    /// exclusive.
    locks: Mutex<HashMap<String, Arc<RwLock<()>>>>,
}

/// A volume of a pool of a hypervisor (its granted URI).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct VolumeKey {
    pub(crate) hypervisor: String,
    pub(crate) pool: String,
    pub(crate) volume: String,
}

impl Retention {
    /// The lock of `hypervisor`.
    pub(crate) fn lock(&self, hypervisor: &str) -> Arc<RwLock<()>> {
        let mut locks = lock(&self.locks);
        Arc::clone(locks.entry(hypervisor.to_owned()).or_default())
    }

    /// Records that `key` is used now.
    pub(crate) fn used(&self, key: VolumeKey) {
        lock(&self.last_used).insert(key, Instant::now());
    }

    /// Whether `key`, unused now, has been unused for `retention`: last seen used that long ago,
    /// or never seen before (then counted from now).
    fn expired(&self, key: &VolumeKey, now: Instant, retention: Duration) -> bool {
        let mut last_used = lock(&self.last_used);
        let since = *last_used.entry(key.clone()).or_insert(now);
        now.saturating_duration_since(since) >= retention
    }

    fn forget(&self, key: &VolumeKey) {
        lock(&self.last_used).remove(key);
    }

    /// Forgets the volumes of `pool` on `hypervisor` not among `present`.
    fn keep_only(&self, hypervisor: &str, pool: &str, present: &HashSet<String>) {
        lock(&self.last_used).retain(|key, _| {
            key.hypervisor != hypervisor || key.pool != pool || present.contains(&key.volume)
        });
    }
}

/// What the volumes and domains of a hypervisor use: paths (backing files, disk files) and
/// (pool, volume) pairs (disks given as volumes).
#[derive(Debug, Default, PartialEq, Eq)]
struct InUse {
    paths: HashSet<String>,
    volumes: HashSet<(String, String)>,
}

impl InUse {
    /// Adds what one volume's description says it is backed by.
    fn volume(&mut self, xml: &str) {
        let Ok(document) = Document::parse(xml) else {
            return;
        };
        for store in document
            .descendants()
            .filter(|node| node.has_tag_name("backingStore"))
        {
            let path = store
                .children()
                .find(|node| node.has_tag_name("path"))
                .and_then(|path| path.text());
            if let Some(path) = path {
                self.paths.insert(path.trim().to_owned());
            }
        }
    }

    /// Adds what one domain's disks use: their sources and, in a running domain's description,
    /// the backing chain libvirt found.
    fn domain(&mut self, xml: &str) {
        let Ok(document) = Document::parse(xml) else {
            return;
        };
        for disk in document
            .descendants()
            .filter(|node| node.has_tag_name("disk"))
        {
            for source in disk
                .descendants()
                .filter(|node| node.has_tag_name("source"))
            {
                if let Some(file) = source.attribute("file") {
                    self.paths.insert(file.to_owned());
                }
                if let (Some(pool), Some(volume)) =
                    (source.attribute("pool"), source.attribute("volume"))
                {
                    self.volumes.insert((pool.to_owned(), volume.to_owned()));
                }
            }
        }
    }

    fn uses(&self, pool: &str, volume: &str, path: &str) -> bool {
        self.paths.contains(path) || self.volumes.contains(&(pool.to_owned(), volume.to_owned()))
    }
}

/// What a prune needs besides the libvirt pool.
pub(crate) struct Prune<'a> {
    pub(crate) hypervisor: &'a str,
    pub(crate) pool: &'a str,
    pub(crate) prefix: &'a str,
    pub(crate) retention: Duration,
    /// Whether an import is writing the volume of this name.
    pub(crate) importing: &'a dyn Fn(&str) -> bool,
}

/// Removes the images of `pool` nothing uses that have been unused for the retention; returns
/// their names. Blocks.
pub(crate) fn prune(
    connect: &Connect,
    pool: &StoragePool,
    state: &Retention,
    asked: &Prune<'_>,
) -> Result<Vec<String>, Error> {
    let lv = |error: virt::error::Error| crate::error::libvirt(&error);
    let exclusive = state.lock(asked.hypervisor);
    let _held = match exclusive.try_write() {
        Ok(held) => held,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        // A disk is being made on a base: prune another time rather than hold it up.
        Err(TryLockError::WouldBlock) => return Ok(Vec::new()),
    };
    let mut candidates = Vec::new();
    let mut present = HashSet::new();
    for volume in pool.list_all_volumes(0).map_err(lv)? {
        let name = volume.get_name().map_err(lv)?;
        present.insert(name.clone());
        if name.starts_with(asked.prefix)
            && !name.ends_with(IMPORTING_SUFFIX)
            && !(asked.importing)(&name)
        {
            candidates.push((volume.get_path().map_err(lv)?, name, volume));
        }
    }
    state.keep_only(asked.hypervisor, asked.pool, &present);
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let in_use = scan(connect).map_err(lv)?;
    let now = Instant::now();
    let mut removed = Vec::new();
    for (path, name, volume) in candidates {
        let key = VolumeKey {
            hypervisor: asked.hypervisor.to_owned(),
            pool: asked.pool.to_owned(),
            volume: name.clone(),
        };
        if in_use.uses(asked.pool, &name, &path) {
            state.used(key);
        } else if state.expired(&key, now, asked.retention) {
            match volume.delete(0) {
                Ok(()) => {
                    tracing::info!(pool = asked.pool, volume = %name, "removed a base image nothing used");
                    removed.push(name);
                }
                // Another prune was first.
                Err(error) if crate::error::is_missing(&error) => {}
                Err(error) => return Err(lv(error)),
            }
            state.forget(&key);
        }
    }
    Ok(removed)
}

/// What every volume of every active pool, and every domain, of the hypervisor uses. Blocks.
fn scan(connect: &Connect) -> Result<InUse, virt::error::Error> {
    let mut in_use = InUse::default();
    let active = virt::sys::VIR_CONNECT_LIST_STORAGE_POOLS_ACTIVE;
    for pool in connect.list_all_storage_pools(active)? {
        for volume in pool.list_all_volumes(0)? {
            match volume.get_xml_desc(0) {
                Ok(xml) => in_use.volume(&xml),
                // Deleted while we looked.
                Err(error) if crate::error::is_missing(&error) => {}
                Err(error) => return Err(error),
            }
        }
    }
    for domain in connect.list_all_domains(0)? {
        match domain.get_xml_desc(0) {
            Ok(xml) => in_use.domain(&xml),
            Err(error) if crate::error::is_missing(&error) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(in_use)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backing_stores_and_domain_disks_are_in_use() {
        let mut in_use = InUse::default();
        in_use.volume(
            "<volume><name>a.qcow2</name><target><path>/p/a.qcow2</path></target><backingStore><path>/p/base.qcow2</path><format type='qcow2'/></backingStore></volume>",
        );
        in_use.volume(
            "<volume><name>seed.iso</name><target><path>/p/seed.iso</path></target></volume>",
        );
        in_use.domain(
            "<domain><devices>
               <disk type='volume'><source pool='images' volume='b.qcow2'/></disk>
               <disk type='file'><source file='/p/c.qcow2' index='1'/>
                 <backingStore type='file'><source file='/p/other-base.raw'/></backingStore></disk>
               <interface type='network'><source network='images'/></interface>
             </devices></domain>",
        );
        in_use.volume("not XML");
        let rows = [
            (("images", "base.qcow2", "/p/base.qcow2"), true),
            (("images", "x", "/p/other-base.raw"), true),
            (("images", "b.qcow2", "/elsewhere"), true),
            (("images", "c.qcow2", "/p/c.qcow2"), true),
            (("images", "a.qcow2", "/p/a.qcow2"), false),
            (("images", "seed.iso", "/p/seed.iso"), false),
            (("other", "b.qcow2", "/q/b.qcow2"), false),
        ];
        for ((pool, volume, path), want) in rows {
            assert_eq!(in_use.uses(pool, volume, path), want, "{pool}/{volume}");
        }
    }

    /// A prune waits for no disk being made: while the hypervisor's lock is held shared, it
    /// removes nothing; once it is free, it removes the unused image (on the test driver).
    #[test]
    fn a_prune_skips_its_turn_while_a_disk_is_being_made() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("node.xml");
        std::fs::write(
            &node,
            "<node><pool type='dir'><name>images</name><target><path>/images</path></target>\
             <volume type='file'><name>egress-base-1.raw</name><capacity unit='bytes'>1024</capacity></volume>\
             <volume type='file'><name>seed.iso</name><capacity unit='bytes'>1024</capacity></volume>\
             </pool></node>",
        )
        .unwrap();
        let connect = Connect::open(Some(&format!("test://{}", node.display()))).unwrap();
        let pool = StoragePool::lookup_by_name(&connect, "images").unwrap();
        let state = Retention::default();
        let asked = Prune {
            hypervisor: "test",
            pool: "images",
            prefix: "egress-base-",
            retention: Duration::ZERO,
            importing: &|_| false,
        };
        let making = state.lock("test");
        let held = making.read().unwrap();
        assert!(prune(&connect, &pool, &state, &asked).unwrap().is_empty());
        drop(held);
        assert_eq!(
            prune(&connect, &pool, &state, &asked).unwrap(),
            ["egress-base-1.raw"]
        );
        let left: Vec<String> = pool.list_volumes().unwrap();
        assert_eq!(left, ["seed.iso"]);
    }

    #[test]
    fn an_unused_volume_expires_after_the_retention_counted_from_its_last_use() {
        let state = Retention::default();
        let key = VolumeKey {
            hypervisor: "qemu:///system".into(),
            pool: "images".into(),
            volume: "egress-base-1.qcow2".into(),
        };
        let hour = Duration::from_secs(3600);
        let now = Instant::now();
        // Never seen: counted from now.
        assert!(!state.expired(&key, now, hour));
        assert!(state.expired(&key, now + hour, hour));
        state.used(key.clone());
        let used = Instant::now();
        assert!(!state.expired(&key, used + hour / 2, hour));
        assert!(state.expired(&key, used + hour, hour));
        assert!(state.expired(&key, now, Duration::ZERO));
        state.forget(&key);
        assert!(!state.expired(&key, now, hour));
        // Gone from its pool, a volume is forgotten; another pool's are kept.
        let other = VolumeKey {
            pool: "other".into(),
            ..key.clone()
        };
        state.used(other.clone());
        state.keep_only("qemu:///system", "images", &HashSet::new());
        let last_used = lock(&state.last_used);
        assert!(!last_used.contains_key(&key) && last_used.contains_key(&other));
    }
}
