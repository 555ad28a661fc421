//! ProxyPools in the store, and the Proxies they make.

use egress_runtime::types::Placement;
use rusqlite::{Connection, OptionalExtension, params};

use super::{Membership, Store, StoreError};
use crate::crd::{ProxyPoolSpec, ProxyPoolStatus, ProxySpec};

/// A ProxyPool as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolRecord {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID, made once.
    pub uid: String,
    /// Its spec generation.
    pub generation: i64,
    /// Its spec, as last read.
    pub spec: ProxyPoolSpec,
    /// Its status, as last written.
    pub status: ProxyPoolStatus,
    /// When it was first seen (RFC 3339).
    pub created: String,
}

impl PoolRecord {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The pools table, and the column that ties a Proxy to its pool (added to a database made
/// before pools existed).
pub(super) fn create_tables(connection: &Connection) -> Result<(), StoreError> {
    connection.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS pools ({})",
        super::OBJECT_COLUMNS
    ))?;
    let has_membership = connection
        .prepare("SELECT 1 FROM pragma_table_info('proxies') WHERE name = 'membership'")?
        .exists([])?;
    if !has_membership {
        connection.execute_batch("ALTER TABLE proxies ADD COLUMN membership TEXT;")?;
    }
    Ok(())
}

type PoolRow = (String, String, String, i64, String, String, String);

fn read_pool_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<PoolRow> {
    let text = |index| row.get::<_, String>(index);
    Ok((
        text(0)?,
        text(1)?,
        text(2)?,
        row.get(3)?,
        text(4)?,
        text(5)?,
        text(6)?,
    ))
}

fn decode_pool(row: PoolRow) -> Result<PoolRecord, StoreError> {
    let (namespace, name, uid, generation, spec, status, created) = row;
    let (spec, status) = (serde_json::from_str(&spec)?, serde_json::from_str(&status)?);
    let record = PoolRecord {
        namespace,
        name,
        uid,
        generation,
        spec,
        status,
        created,
    };
    Ok(record)
}

impl Store {
    /// Record that a manifest declares ProxyPool `namespace/name` with `spec`: a new pool gets a
    /// UID and generation 1, a changed spec bumps the generation.
    pub fn declare_pool(
        &self,
        namespace: &str,
        name: &str,
        spec: &ProxyPoolSpec,
        created: &str,
    ) -> Result<(), StoreError> {
        let spec_json = serde_json::to_string(spec)?;
        let connection = self.lock();
        let stored: Option<String> = connection
            .query_row(
                "SELECT spec FROM pools WHERE namespace = ?1 AND name = ?2",
                params![namespace, name],
                |row| row.get(0),
            )
            .optional()?;
        match stored {
            None => {
                connection.execute(
                    "INSERT INTO pools (namespace, name, uid, generation, spec, status, created)
                     VALUES (?1, ?2, ?3, 1, ?4, '{}', ?5)",
                    params![
                        namespace,
                        name,
                        uuid::Uuid::new_v4().to_string(),
                        spec_json,
                        created
                    ],
                )?;
            }
            Some(stored) if stored != spec_json => {
                connection.execute(
                    "UPDATE pools SET spec = ?3, generation = generation + 1
                     WHERE namespace = ?1 AND name = ?2",
                    params![namespace, name, spec_json],
                )?;
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// Every stored pool, by namespace and name.
    pub fn pools(&self) -> Result<Vec<PoolRecord>, StoreError> {
        let sql = "SELECT namespace, name, uid, generation, spec, status, created
                   FROM pools ORDER BY namespace, name";
        self.all(sql, read_pool_row, decode_pool)
    }

    /// Write pool `namespace/name`'s status.
    pub fn write_pool_status(
        &self,
        namespace: &str,
        name: &str,
        status: &ProxyPoolStatus,
    ) -> Result<(), StoreError> {
        self.lock().execute(
            "UPDATE pools SET status = ?3 WHERE namespace = ?1 AND name = ?2",
            params![namespace, name, serde_json::to_string(status)?],
        )?;
        Ok(())
    }

    /// Remove pool `namespace/name` (its manifest is gone and so are its Proxies).
    pub fn remove_pool(&self, namespace: &str, name: &str) -> Result<(), StoreError> {
        self.lock().execute(
            "DELETE FROM pools WHERE namespace = ?1 AND name = ?2",
            params![namespace, name],
        )?;
        Ok(())
    }

    /// Add Proxy `namespace/name`, made by a pool with `spec`: a UID and generation 1, as a
    /// manifest's would get.
    pub fn add_member(
        &self,
        namespace: &str,
        name: &str,
        spec: &ProxySpec,
        membership: &Membership,
        created: &str,
    ) -> Result<(), StoreError> {
        self.lock().execute(
            "INSERT INTO proxies (namespace, name, uid, generation, spec, status, created, membership)
             VALUES (?1, ?2, ?3, 1, ?4, '{}', ?5, ?6)",
            params![
                namespace,
                name,
                uuid::Uuid::new_v4().to_string(),
                serde_json::to_string(spec)?,
                created,
                serde_json::to_string(membership)?
            ],
        )?;
        Ok(())
    }

    /// Ask again where a pool's Proxy `namespace/name` goes.
    pub fn set_placement(
        &self,
        namespace: &str,
        name: &str,
        placement: &Placement,
    ) -> Result<(), StoreError> {
        let Some(record) = self.proxy(namespace, name)? else {
            return Ok(());
        };
        let Some(mut membership) = record.membership else {
            return Ok(());
        };
        membership.placement = Some(placement.clone());
        self.lock().execute(
            "UPDATE proxies SET membership = ?3 WHERE namespace = ?1 AND name = ?2",
            params![namespace, name, serde_json::to_string(&membership)?],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder's database from before pools: opening it adds the membership column and keeps
    /// every Proxy (and so every VM's UID) as it was.
    #[test]
    fn a_database_from_before_pools_keeps_its_proxies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch(
                "CREATE TABLE proxies (namespace TEXT NOT NULL, name TEXT NOT NULL,
                     uid TEXT NOT NULL UNIQUE, generation INTEGER NOT NULL, spec TEXT NOT NULL,
                     status TEXT NOT NULL, deleting INTEGER NOT NULL DEFAULT 0,
                     created TEXT NOT NULL, PRIMARY KEY (namespace, name));
                 INSERT INTO proxies VALUES ('default', 'web', 'uid-1', 2,
                     '{\"providerConfigRef\":\"lab\"}', '{}', 0, '2026-12-01T00:00:00Z');",
            )
            .unwrap();
        let store = Store::open(&path).unwrap();
        let proxies = store.proxies().unwrap();
        assert_eq!(proxies.len(), 1);
        assert_eq!(
            (proxies[0].uid.as_str(), proxies[0].generation),
            ("uid-1", 2)
        );
        assert_eq!(proxies[0].membership, None);
        assert!(store.pools().unwrap().is_empty());
        // Opening it again finds the column there.
        assert_eq!(Store::open(&path).unwrap().proxies().unwrap(), proxies);
    }
}
