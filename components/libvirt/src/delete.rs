//! `delete`: power off, undefine, and remove the disk and seed. Idempotent.
//!
//! A domain with the name that does not carry this provider's mark is never touched (nor its
//! volumes): `permanent`. The volumes are found by name, not through the domain, so a delete cut
//! after the undefine still removes them on retry, and one cut anywhere leaves nothing orphaned.

use crate::Step;
use crate::config::Config;
use crate::create::delete_volume;
use crate::egress::libvirt::libvirt::{Connection, DomainState};
use crate::egress::provider::types::Error;
use crate::errors::{code, is_code, not_running};
use crate::mark::Mark;
use crate::volume_xml::{disk_volume_name, seed_volume_name};

/// The operation.
pub fn delete(config: &str, provider_id: &str) -> Result<(), Error> {
    let config = Config::parse(config).map_err(Error::Permanent)?;
    let (connection_name, name) = crate::id::parse(provider_id).map_err(Error::Permanent)?;
    let connection = Connection::open(connection_name).at("open the connection")?;
    if let Some(domain) = connection.lookup_domain(name).at("look up the domain")? {
        if Mark::parse(domain.metadata().at("read the mark")?.as_deref()).is_none() {
            return Err(Error::Permanent(format!(
                "domain {name} does not carry this provider's mark: not deleted"
            )));
        }
        let status = domain.status().at("read the domain state")?;
        if status.state != DomainState::Shutoff {
            match domain.destroy() {
                Err(error) if !not_running(&error) && !is_code(&error, code::NO_DOMAIN) => {
                    return Err(crate::errors::classify("power off the domain", error));
                }
                _ => {}
            }
        }
        match domain.undefine() {
            Err(error) if !is_code(&error, code::NO_DOMAIN) => {
                return Err(crate::errors::classify("undefine the domain", error));
            }
            _ => {}
        }
    }
    let pool = connection.storage_pool(&config.pool).at("open the pool")?;
    for volume_name in [
        disk_volume_name(name, config.image.format),
        seed_volume_name(name),
    ] {
        if let Some(volume) = pool.lookup_volume(&volume_name).at("look up a volume")? {
            delete_volume(&volume, "delete a volume")?;
        }
    }
    Ok(())
}
