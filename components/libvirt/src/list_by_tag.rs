//! `list-by-tag`: every domain whose mark carries the tag, on every connection of the config,
//! read from the metadata the host's `list-domains` returns in one call per connection.
//! Addresses are not read here (one more call per domain); states are as `get` reports them
//! without an address.
//!
//! A connection that cannot be opened or listed fails the whole call (`transient` unless
//! retrying cannot help): a partial list would read as VMs gone.

use crate::calls::on;
use crate::config::Config;
use crate::egress::libvirt::libvirt::Connection;
use crate::egress::provider::types::{Error, Instance};
use crate::mark::Mark;
use crate::state::instance_state;

/// The operation.
pub fn list_by_tag(config: &str, key: &str, value: &str) -> Result<Vec<Instance>, Error> {
    let config = Config::parse(config).map_err(Error::Permanent)?;
    let mut instances = Vec::new();
    for name in &config.connections {
        let connection = on(name, "open the connection", || Connection::open(name))?;
        let domains = on(name, "list the domains", || connection.list_domains())?;
        instances.extend(domains.into_iter().filter_map(|summary| {
            let mark = Mark::parse(summary.metadata.as_deref())?;
            mark.has_tag(key, value).then(|| Instance {
                provider_id: crate::id::format(name, &summary.name),
                state: instance_state(summary.status, false),
                name: summary.name,
                addresses: Vec::new(),
                created_at: mark.created_at,
                uid: mark.uid,
            })
        }));
    }
    Ok(instances)
}
