//! Base images: imported once per pool, and pruned once no VM uses them.
//!
//! The host does both: it downloads and verifies an image (`import-image`), and removes the
//! images of a pool that nothing has used for the grant's retention (`prune-images`). It never
//! removes one a disk is backed by or a domain reads, and it alone sees every pool and domain of
//! the hypervisor to tell; the provider only names which volumes are its images, by the prefix
//! of their names ([`BASE_PREFIX`]).

use crate::calls::{at, call};
use crate::config::Config;
use crate::egress::libvirt::libvirt::{StoragePool, Volume};
use crate::egress::provider::types::Error;
use crate::errors::is_code;
use crate::volume_xml::{BASE_PREFIX, base_volume_name};

/// `VIR_ERR_STORAGE_VOL_EXIST`: another create imported the base at the same time.
const STORAGE_VOL_EXIST: i32 = 90;

/// The base volume, imported by the host into `pool` on `connection` (the pool did not have it
/// when surveyed).
pub fn import(config: &Config, connection: &str, pool: &StoragePool) -> Result<Volume, Error> {
    let name = base_volume_name(&config.image.sha256, config.image.format);
    let imported = call(connection, "import the base image", || {
        pool.import_image(&name, &config.image.url, &config.image.sha256)
    });
    match imported {
        Ok(base) => Ok(base),
        // Another create imported it meanwhile.
        Err(error) if is_code(&error, STORAGE_VOL_EXIST) => {
            at(connection, "look up the base image", || {
                pool.lookup_volume(&name)
            })?
            .ok_or_else(|| Error::Transient(format!("base image {name} vanished")))
        }
        Err(error) => Err(crate::errors::classify("import the base image", error)),
    }
}

/// Has the host remove the base images of `pool` on `connection` that no VM uses any more
/// (after the grant's retention). A failure fails nothing, the next prune tries again: it is
/// logged.
pub fn prune(connection: &str, pool: &StoragePool) {
    let pruned = at(connection, "prune unused base images", || {
        pool.prune_images(BASE_PREFIX)
    });
    if let Err(error) = pruned {
        crate::calls::warn("pruning unused base images failed", &error);
    }
}
