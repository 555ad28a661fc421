//! `get`: one domain's state and address.

use crate::calls::{at, call};
use crate::egress::libvirt::libvirt::{Connection, DomainState};
use crate::egress::provider::types::{Error, Vm};
use crate::errors::{code, is_code};
use crate::mark::Mark;
use crate::state::{first_ipv4, vm_state};

/// The operation. `not-found` when the domain is gone, and when a domain with the name carries no
/// mark of this provider (the contract's rule, as the Proxmox provider has it: not ours; create
/// then refuses to adopt it, and delete never touches it). Answering `permanent` here would latch
/// a Proxy whose VM was replaced behind its back into Failed.
///
/// A provider ID this provider never makes is `not-found` too (docs/contract.md): no VM of ours
/// can have it, and the operator's next create finds the VM by name if there is one.
pub fn get(_config: &str, provider_id: &str) -> Result<Vm, Error> {
    let (connection_name, name) = crate::id::parse(provider_id).map_err(Error::NotFound)?;
    let on = connection_name;
    let connection = at(on, "open the connection", || Connection::open(on))?;
    let Some(domain) = at(on, "look up the domain", || connection.lookup_domain(name))? else {
        return Err(Error::NotFound(format!("domain {name} is gone")));
    };
    let Some(mark) = Mark::parse(at(on, "read the mark", || domain.metadata())?.as_deref()) else {
        return Err(Error::NotFound(format!(
            "domain {name} does not carry this provider's mark: not ours"
        )));
    };
    let status = at(on, "read the domain state", || domain.status())?;
    let address = match status.state {
        DomainState::Running | DomainState::Blocked => {
            match call(on, "read the addresses", || domain.interface_addresses()) {
                Ok(reported) => first_ipv4(&reported),
                Err(error) if is_code(&error, code::NO_DOMAIN) => {
                    return Err(Error::NotFound(format!("domain {name} is gone")));
                }
                // No agent yet and no lease: still provisioning.
                Err(_) => None,
            }
        }
        _ => None,
    };
    Ok(Vm {
        provider_id: provider_id.to_owned(),
        name: name.to_owned(),
        state: vm_state(status, address.is_some()),
        addresses: address.into_iter().collect(),
        created_at: mark.created_at,
        uid: mark.uid,
        host: Some(on.to_owned()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// K15: a malformed ID is `not-found` here, before any capability call (delete keeps
    /// `permanent`: an ID it never made could be an older version's, and success would leak it).
    #[test]
    fn a_malformed_provider_id_is_not_found() {
        for bad in ["", "hv1", "/proxy-a", "hv1/", "hv1/a/b"] {
            assert!(
                matches!(get("{}", bad), Err(Error::NotFound(message)) if message.contains("not <connection>/<domain>")),
                "{bad:?}"
            );
        }
    }
}
