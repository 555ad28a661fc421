//! `list-by-tag`: every domain whose mark carries the tag, on every connection of the config,
//! read from the metadata the host's `list-domains` returns in one call per connection.
//! Addresses are not read here (one more call per domain); states are as `get` reports them
//! without an address.
//!
//! A connection that cannot be opened or listed is named in the answer's `unanswered`, and the
//! others' domains are listed: its domains are unknown, never gone (the operator deletes nothing
//! it did not list, and a Proxy's deletion waits for it). Only a configuration that does not parse
//! fails the call.

use crate::calls::on;
use crate::config::Config;
use crate::egress::libvirt::libvirt::Connection;
use crate::egress::provider::types::{Error, Listing, Vm};
use crate::mark::Mark;
use crate::state::vm_state;

/// The operation.
pub fn list_by_tag(config: &str, key: &str, value: &str) -> Result<Listing, Error> {
    let config = Config::parse(config).map_err(Error::Permanent)?;
    let mut listing = Listing {
        vms: Vec::new(),
        unanswered: Vec::new(),
    };
    for name in &config.connections {
        let listed = on(name, "open the connection", || Connection::open(name))
            .and_then(|connection| on(name, "list the domains", || connection.list_domains()));
        let domains = match listed {
            Ok(domains) => domains,
            Err(_) => {
                listing.unanswered.push(name.clone());
                continue;
            }
        };
        listing
            .vms
            .extend(domains.into_iter().filter_map(|summary| {
                let mark = Mark::parse(summary.metadata.as_deref())?;
                mark.has_tag(key, value).then(|| Vm {
                    provider_id: crate::id::format(name, &summary.name),
                    state: vm_state(summary.status, false),
                    name: summary.name,
                    addresses: Vec::new(),
                    created_at: mark.created_at,
                    uid: mark.uid,
                    host: Some(name.clone()),
                })
            }));
    }
    Ok(listing)
}
