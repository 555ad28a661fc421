//! Local mode's state: an embedded, transactional SQLite database under the folder
//! (`DIR/.egress-operator/state.db`).
//!
//! It keeps what a Kubernetes API server keeps for a cluster: each object's UID (made once and
//! kept, so a restart adopts the VMs it made and never fails a Proxy as "another UID"), its
//! generation (bumped when its spec changes), its status, and whether it is being deleted (the
//! finalizer's hold). Every change is one transaction. The database is in WAL mode, so
//! `egress-operator get proxies` can read it while `run --local` writes. A ProxyPool's Proxies
//! are stored as Proxies with a [`Membership`] (they have no manifest of their own); the pools
//! themselves are in [`pools`].

mod pools;

use std::path::Path;
use std::sync::{Arc, Mutex};

use egress_digest::Digest;
use egress_runtime::types::Placement;
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::crd::{ProviderConfigSpec, ProviderConfigStatus, ProxySpec, ProxyStatus};
use crate::installation::Installation;
use crate::proxy_reconciler::ProxyState;

pub use pools::PoolRecord;

/// What makes a stored Proxy a pool's: the pool made it, and it goes when the pool says.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Membership {
    /// The pool's name (in the Proxy's namespace).
    pub pool: String,
    /// The template hash the Proxy was made from.
    pub template_hash: String,
    /// Where the pool asks the provider to put its VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

/// A Proxy as stored: what the reconciler sees of it ([`ProxyState`], which it derefs to), and
/// what only the store keeps.
#[derive(Clone, Debug, PartialEq)]
pub struct ProxyRecord {
    /// The Proxy as the reconciler sees it; its placement is its membership's.
    pub proxy: ProxyState,
    /// When it was first seen (RFC 3339).
    pub created: String,
    /// The pool it belongs to, if a pool made it rather than a manifest.
    pub membership: Option<Membership>,
}

impl std::ops::Deref for ProxyRecord {
    type Target = ProxyState;

    fn deref(&self) -> &ProxyState {
        &self.proxy
    }
}

/// A ProviderConfig as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigRecord {
    /// Its name.
    pub name: String,
    /// Its spec generation.
    pub generation: i64,
    /// Its spec, as the folder declares it.
    pub spec: ProviderConfigSpec,
    /// Its status.
    pub status: ProviderConfigStatus,
}

/// The database; cheap to clone. Every method is blocking: call it off the async executor
/// ([`Store::run`]).
#[derive(Clone, Debug)]
pub struct Store {
    connection: Arc<Mutex<Connection>>,
}

/// A store failure, on one line.
#[derive(Debug, thiserror::Error)]
#[error("local state database: {0}")]
pub struct StoreError(String);

impl From<rusqlite::Error> for StoreError {
    fn from(error: rusqlite::Error) -> Self {
        StoreError(error.to_string())
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(error: serde_json::Error) -> Self {
        StoreError(format!("a stored object does not parse: {error}"))
    }
}

impl Store {
    /// Open (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|error| StoreError(format!("{}: {error}", parent.display())))?;
        }
        let connection = Connection::open(path)?;
        connection.execute_batch(&format!(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = NORMAL;
             PRAGMA busy_timeout = 5000;
             CREATE TABLE IF NOT EXISTS proxies (
                 deleting INTEGER NOT NULL DEFAULT 0,
                 {OBJECT_COLUMNS}
             );
             CREATE TABLE IF NOT EXISTS provider_configs (
                 name TEXT PRIMARY KEY,
                 generation INTEGER NOT NULL,
                 spec TEXT NOT NULL,
                 status TEXT NOT NULL
             );
             CREATE TABLE IF NOT EXISTS settings (
                 key TEXT PRIMARY KEY,
                 value TEXT NOT NULL
             );"
        ))?;
        pools::create_tables(&connection)?;
        Ok(Store {
            connection: Arc::new(Mutex::new(connection)),
        })
    }

    /// Open an existing database for reading only (`get proxies`).
    pub fn open_read_only(path: &Path) -> Result<Store, StoreError> {
        let connection =
            Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .map_err(|error| StoreError(format!("{}: {error}", path.display())))?;
        connection.busy_timeout(std::time::Duration::from_secs(5))?;
        Ok(Store {
            connection: Arc::new(Mutex::new(connection)),
        })
    }

    /// Run `work` on a blocking thread.
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || work(&store))
            .await
            .map_err(|error| StoreError(format!("the database task failed: {error}")))?
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.connection
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// This folder's installation: made at the first call and kept, so every VM the folder's
    /// operator makes carries the same one across restarts.
    pub fn installation(&self) -> Result<Installation, StoreError> {
        let connection = self.lock();
        connection.execute(
            "INSERT OR IGNORE INTO settings (key, value) VALUES ('installation', ?1)",
            params![Installation::new_local().as_str()],
        )?;
        let id: String = connection.query_row(
            "SELECT value FROM settings WHERE key = 'installation'",
            [],
            |row| row.get(0),
        )?;
        Installation::new(&id).map_err(|why| StoreError(format!("the stored {why}")))
    }

    /// The binding revision and fingerprint ProviderConfig `name` had when last bound, if kept.
    pub fn binding_revision(&self, name: &str) -> Result<Option<(u64, Digest)>, StoreError> {
        let value: Option<String> = self
            .lock()
            .query_row(
                "SELECT value FROM settings WHERE key = ?1",
                params![format!("binding/{name}")],
                |row| row.get(0),
            )
            .optional()?;
        let parsed = value.and_then(|value| {
            let (revision, fingerprint) = value.split_once(' ')?;
            Some((revision.parse().ok()?, Digest::parse(fingerprint).ok()?))
        });
        Ok(parsed)
    }

    /// Keep ProviderConfig `name`'s binding revision and fingerprint for the next run.
    pub fn set_binding_revision(
        &self,
        name: &str,
        revision: u64,
        fingerprint: Digest,
    ) -> Result<(), StoreError> {
        self.lock().execute(
            "INSERT INTO settings (key, value) VALUES (?1, ?2)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![
                format!("binding/{name}"),
                format!("{revision} {fingerprint}")
            ],
        )?;
        Ok(())
    }

    /// Record that a manifest declares Proxy `namespace/name` with `spec`: a new Proxy gets a
    /// UID and generation 1; a changed spec bumps the generation. A Proxy being deleted is left
    /// alone until its deletion completes. Returns the record and whether it changed.
    pub fn declare_proxy(
        &self,
        namespace: &str,
        name: &str,
        spec: &ProxySpec,
        created: &str,
    ) -> Result<(ProxyRecord, bool), StoreError> {
        let mut connection = self.lock();
        let transaction = connection.transaction()?;
        let spec_json = serde_json::to_string(spec)?;
        let existing: Option<(String, i64, String, bool)> = transaction
            .query_row(
                "SELECT uid, generation, spec, deleting FROM proxies WHERE namespace = ?1 AND name = ?2",
                params![namespace, name],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
            )
            .optional()?;
        let changed =
            match existing {
                None => {
                    transaction.execute(
                    "INSERT INTO proxies (namespace, name, uid, generation, spec, status, created)
                     VALUES (?1, ?2, ?3, 1, ?4, '{}', ?5)",
                    params![namespace, name, uuid::Uuid::new_v4().to_string(), spec_json, created],
                )?;
                    true
                }
                Some((_, _, stored, deleting)) if stored != spec_json && !deleting => {
                    transaction.execute(
                        "UPDATE proxies SET spec = ?3, generation = generation + 1
                     WHERE namespace = ?1 AND name = ?2",
                        params![namespace, name, spec_json],
                    )?;
                    true
                }
                Some(_) => false,
            };
        transaction.commit()?;
        drop(connection);
        let record = self
            .proxy(namespace, name)?
            .ok_or_else(|| StoreError("a Proxy just written is gone".into()))?;
        Ok((record, changed))
    }

    /// Mark Proxy `namespace/name` as being deleted; returns whether it was not already.
    pub fn mark_deleting(&self, namespace: &str, name: &str) -> Result<bool, StoreError> {
        let changed = self.lock().execute(
            "UPDATE proxies SET deleting = 1 WHERE namespace = ?1 AND name = ?2 AND deleting = 0",
            params![namespace, name],
        )?;
        Ok(changed > 0)
    }

    /// Proxy `namespace/name`, if stored.
    pub fn proxy(&self, namespace: &str, name: &str) -> Result<Option<ProxyRecord>, StoreError> {
        let connection = self.lock();
        let mut statement = connection.prepare_cached(&format!(
            "SELECT {PROXY_COLUMNS} FROM proxies WHERE namespace = ?1 AND name = ?2"
        ))?;
        let row = statement
            .query_row(params![namespace, name], read_proxy_row)
            .optional()?;
        row.map(decode_proxy).transpose()
    }

    /// Every stored Proxy, by namespace and name.
    pub fn proxies(&self) -> Result<Vec<ProxyRecord>, StoreError> {
        let sql = format!("SELECT {PROXY_COLUMNS} FROM proxies ORDER BY namespace, name");
        self.all(&sql, read_proxy_row, decode_proxy)
    }

    /// Every row `sql` selects, read by `read`, decoded by `decode`.
    fn all<Row, Record>(
        &self,
        sql: &str,
        read: fn(&rusqlite::Row<'_>) -> rusqlite::Result<Row>,
        decode: fn(Row) -> Result<Record, StoreError>,
    ) -> Result<Vec<Record>, StoreError> {
        let connection = self.lock();
        let mut statement = connection.prepare_cached(sql)?;
        let rows = statement.query_map([], read)?;
        rows.map(|row| decode(row?)).collect()
    }

    /// Write Proxy `namespace/name`'s status, if it is still the one with `uid`.
    pub fn write_status(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        status: &ProxyStatus,
    ) -> Result<(), StoreError> {
        self.lock().execute(
            "UPDATE proxies SET status = ?4 WHERE namespace = ?1 AND name = ?2 AND uid = ?3",
            params![namespace, name, uid, serde_json::to_string(status)?],
        )?;
        Ok(())
    }

    /// Remove Proxy `namespace/name` (its deletion completed: the finalizer lets go).
    pub fn remove_proxy(&self, namespace: &str, name: &str, uid: &str) -> Result<(), StoreError> {
        self.lock().execute(
            "DELETE FROM proxies WHERE namespace = ?1 AND name = ?2 AND uid = ?3",
            params![namespace, name, uid],
        )?;
        Ok(())
    }

    /// Record that a manifest declares ProviderConfig `name` with `spec` (as JSON); returns its
    /// record and whether its generation moved.
    pub fn declare_config(
        &self,
        name: &str,
        spec: &crate::crd::ProviderConfigSpec,
    ) -> Result<(ConfigRecord, bool), StoreError> {
        let spec_json = serde_json::to_string(spec)?;
        let mut connection = self.lock();
        let transaction = connection.transaction()?;
        let stored: Option<String> = transaction
            .query_row(
                "SELECT spec FROM provider_configs WHERE name = ?1",
                params![name],
                |row| row.get(0),
            )
            .optional()?;
        let changed = match stored {
            None => {
                transaction.execute(
                    "INSERT INTO provider_configs (name, generation, spec, status) VALUES (?1, 1, ?2, '{}')",
                    params![name, spec_json],
                )?;
                true
            }
            Some(stored) if stored != spec_json => {
                transaction.execute(
                    "UPDATE provider_configs SET spec = ?2, generation = generation + 1 WHERE name = ?1",
                    params![name, spec_json],
                )?;
                true
            }
            Some(_) => false,
        };
        transaction.commit()?;
        let record = transaction_free_config(&connection, name)?
            .ok_or_else(|| StoreError("a ProviderConfig just written is gone".into()))?;
        Ok((record, changed))
    }

    /// Every stored ProviderConfig.
    pub fn configs(&self) -> Result<Vec<ConfigRecord>, StoreError> {
        let connection = self.lock();
        let mut statement =
            connection.prepare_cached("SELECT name FROM provider_configs ORDER BY name")?;
        let names: Vec<String> = statement
            .query_map([], |row| row.get(0))?
            .collect::<Result<_, _>>()?;
        let mut records = Vec::new();
        for name in names {
            if let Some(record) = transaction_free_config(&connection, &name)? {
                records.push(record);
            }
        }
        Ok(records)
    }

    /// ProviderConfig `name`, if stored.
    pub fn config(&self, name: &str) -> Result<Option<ConfigRecord>, StoreError> {
        transaction_free_config(&self.lock(), name)
    }

    /// Write ProviderConfig `name`'s status.
    pub fn write_config_status(
        &self,
        name: &str,
        status: &ProviderConfigStatus,
    ) -> Result<(), StoreError> {
        self.lock().execute(
            "UPDATE provider_configs SET status = ?2 WHERE name = ?1",
            params![name, serde_json::to_string(status)?],
        )?;
        Ok(())
    }

    /// Remove ProviderConfig `name`.
    pub fn remove_config(&self, name: &str) -> Result<(), StoreError> {
        self.lock().execute(
            "DELETE FROM provider_configs WHERE name = ?1",
            params![name],
        )?;
        Ok(())
    }
}

/// The columns of a namespaced object (a Proxy, a ProxyPool): its identity, spec and status.
const OBJECT_COLUMNS: &str =
    "namespace TEXT NOT NULL, name TEXT NOT NULL, uid TEXT NOT NULL UNIQUE,
    generation INTEGER NOT NULL, spec TEXT NOT NULL, status TEXT NOT NULL, created TEXT NOT NULL,
    PRIMARY KEY (namespace, name)";

/// The columns a Proxy is read from, in [`read_proxy_row`]'s order.
const PROXY_COLUMNS: &str =
    "namespace, name, uid, generation, spec, status, deleting, created, membership";

type ProxyRow = (
    String,
    String,
    String,
    i64,
    String,
    String,
    bool,
    String,
    Option<String>,
);

fn read_proxy_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ProxyRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
        row.get(7)?,
        row.get(8)?,
    ))
}

fn decode_proxy(row: ProxyRow) -> Result<ProxyRecord, StoreError> {
    let (namespace, name, uid, generation, spec, status, deleting, created, membership) = row;
    let membership: Option<Membership> = membership
        .map(|membership| serde_json::from_str(&membership))
        .transpose()?;
    Ok(ProxyRecord {
        proxy: ProxyState {
            namespace,
            name,
            uid,
            generation,
            spec: serde_json::from_str(&spec)?,
            status: serde_json::from_str(&status)?,
            deleting,
            placement: membership.as_ref().and_then(|m| m.placement.clone()),
            pooled: membership.is_some(),
        },
        created,
        membership,
    })
}

fn transaction_free_config(
    connection: &Connection,
    name: &str,
) -> Result<Option<ConfigRecord>, StoreError> {
    let row: Option<(i64, String, String)> = connection
        .query_row(
            "SELECT generation, spec, status FROM provider_configs WHERE name = ?1",
            params![name],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .optional()?;
    row.map(|(generation, spec, status)| {
        Ok(ConfigRecord {
            name: name.to_owned(),
            generation,
            spec: serde_json::from_str(&spec)?,
            status: serde_json::from_str(&status)?,
        })
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(config: &str) -> ProxySpec {
        ProxySpec {
            provider_config_ref: config.into(),
            ..ProxySpec::default()
        }
    }

    #[test]
    fn the_installation_is_made_once_and_kept_across_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let first = Store::open(&path).unwrap().installation().unwrap();
        assert!(first.as_str().starts_with("local-"));
        assert_eq!(Store::open(&path).unwrap().installation().unwrap(), first);
        let other = tempfile::tempdir().unwrap();
        let elsewhere = Store::open(&other.path().join("state.db")).unwrap();
        assert_ne!(elsewhere.installation().unwrap(), first);
    }

    #[test]
    fn a_proxy_keeps_its_uid_across_reopens_and_its_generation_moves_with_its_spec() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".egress-operator/state.db");
        let store = Store::open(&path).unwrap();
        let (first, changed) = store
            .declare_proxy("default", "web", &spec("a"), "t")
            .unwrap();
        assert!(changed);
        assert_eq!(first.generation, 1);
        let (same, changed) = store
            .declare_proxy("default", "web", &spec("a"), "t")
            .unwrap();
        assert!(!changed);
        assert_eq!(same.uid, first.uid);
        drop(store);

        let store = Store::open(&path).unwrap();
        let (moved, changed) = store
            .declare_proxy("default", "web", &spec("b"), "t")
            .unwrap();
        assert!(changed);
        assert_eq!(
            (moved.uid.as_str(), moved.generation),
            (first.uid.as_str(), 2)
        );

        let status = ProxyStatus {
            provider_id: Some("pv1-1/100".into()),
            ..ProxyStatus::default()
        };
        store
            .write_status("default", "web", &first.uid, &status)
            .unwrap();
        // A status for another UID (an older object of the same name) is not written.
        store
            .write_status("default", "web", "another", &ProxyStatus::default())
            .unwrap();
        let read = store.proxy("default", "web").unwrap().unwrap();
        assert_eq!(read.status.provider_id.as_deref(), Some("pv1-1/100"));

        // Deleting holds the record, ignores spec changes, then it goes.
        assert!(store.mark_deleting("default", "web").unwrap());
        assert!(!store.mark_deleting("default", "web").unwrap());
        let (held, changed) = store
            .declare_proxy("default", "web", &spec("c"), "t")
            .unwrap();
        assert!(!changed && held.deleting);
        let reader = Store::open_read_only(&path).unwrap();
        assert_eq!(reader.proxies().unwrap().len(), 1);
        store.remove_proxy("default", "web", &first.uid).unwrap();
        assert!(store.proxies().unwrap().is_empty());
        // Declared again after its deletion: a new object, a new UID.
        let (fresh, _) = store
            .declare_proxy("default", "web", &spec("c"), "t")
            .unwrap();
        assert_ne!(fresh.uid, first.uid);
    }

    #[test]
    fn provider_configs_keep_status_and_move_generation_with_their_spec() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.db")).unwrap();
        let mut spec = crate::crd::ProviderConfigSpec::default();
        spec.component.file = "proxmox.wasm".into();
        let (record, changed) = store.declare_config("lab", &spec).unwrap();
        assert!(changed && record.generation == 1);
        let status = ProviderConfigStatus {
            observed_generation: Some(1),
            ..ProviderConfigStatus::default()
        };
        store.write_config_status("lab", &status).unwrap();
        spec.component.file = "other.wasm".into();
        let (record, changed) = store.declare_config("lab", &spec).unwrap();
        assert!(changed && record.generation == 2);
        assert_eq!(record.status.observed_generation, Some(1));
        assert_eq!(store.config("lab").unwrap(), Some(record));
        store.remove_config("lab").unwrap();
        assert!(store.configs().unwrap().is_empty());
    }
}
