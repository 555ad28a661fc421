//! `delete`: power off, undefine, and remove the disk (under its own or its temporary name, in
//! either format) and the seed. Idempotent.
//!
//! A domain with the name that does not carry this provider's mark is never touched (nor its
//! volumes): `permanent`. The volumes are found by name, not through the domain, so a delete cut
//! after the undefine still removes them on retry, and one cut anywhere leaves nothing orphaned.
//! A domain that vanishes while delete works on it (someone undefined it meanwhile) is gone, as
//! one that was never found is: its volumes are removed all the same, rather than answering
//! `not-found`, which the operator counts as done.

use crate::calls::{at, call};
use crate::config::Config;
use crate::create::delete_volume;
use crate::egress::libvirt::libvirt::{Connection, Domain, DomainState, Error as LibvirtError};
use crate::egress::provider::types::Error;
use crate::errors::{classify, code, is_code, not_running};
use crate::mark::Mark;
use crate::volume_xml::vm_volume_names;

/// The operation.
pub fn delete(config: &str, provider_id: &str) -> Result<(), Error> {
    let config = Config::parse(config).map_err(Error::Permanent)?;
    let (on, name) = crate::id::parse(provider_id).map_err(Error::Permanent)?;
    let connection = at(on, "open the connection", || Connection::open(on))?;
    if let Some(domain) = at(on, "look up the domain", || connection.lookup_domain(name))? {
        remove_domain(on, name, &domain)?;
    }
    let pool = at(on, "open the pool", || {
        connection.storage_pool(&config.pool)
    })?;
    for volume_name in vm_volume_names(name) {
        if let Some(volume) = at(on, "look up a volume", || pool.lookup_volume(&volume_name))? {
            delete_volume(on, &volume, "delete a volume")?;
        }
    }
    // The last VM of a base gone, the base goes after the grant's retention.
    crate::bases::prune(on, &pool);
    Ok(())
}

/// Whether `error` says the domain is no longer there.
fn vanished(error: &LibvirtError) -> bool {
    is_code(error, code::NO_DOMAIN)
}

/// Powers off and undefines our domain `name` on connection `on`; also `Ok` when it vanishes
/// meanwhile.
fn remove_domain(on: &str, name: &str, domain: &Domain) -> Result<(), Error> {
    let mark = match call(on, "read the mark", || domain.metadata()) {
        Err(error) if vanished(&error) => return Ok(()),
        read => read.map_err(|error| classify("read the mark", error))?,
    };
    if Mark::parse(mark.as_deref()).is_none() {
        return Err(Error::Permanent(format!(
            "domain {name} does not carry this provider's mark: not deleted"
        )));
    }
    let status = match call(on, "read the domain state", || domain.status()) {
        Err(error) if vanished(&error) => return Ok(()),
        read => read.map_err(|error| classify("read the domain state", error))?,
    };
    if status.state != DomainState::Shutoff {
        match call(on, "power off the domain", || domain.destroy()) {
            Err(error) if !not_running(&error) && !vanished(&error) => {
                return Err(classify("power off the domain", error));
            }
            _ => {}
        }
    }
    match call(on, "undefine the domain", || domain.undefine()) {
        Err(error) if !vanished(&error) => Err(classify("undefine the domain", error)),
        _ => Ok(()),
    }
}
