//! `list-by-tag`: every domain whose mark carries the tag, read from the metadata the host's
//! `list-domains` returns in one call. Addresses are not read here (one more call per domain);
//! states are as `get` reports them without an address.

use crate::Step;
use crate::config::Config;
use crate::egress::libvirt::libvirt::Connection;
use crate::egress::provider::types::{Error, Instance};
use crate::mark::Mark;
use crate::state::instance_state;

/// The operation.
pub fn list_by_tag(config: &str, key: &str, value: &str) -> Result<Vec<Instance>, Error> {
    let config = Config::parse(config).map_err(Error::Permanent)?;
    let connection = Connection::open(&config.connection).at("open the connection")?;
    let domains = connection.list_domains().at("list the domains")?;
    Ok(domains
        .into_iter()
        .filter_map(|summary| {
            let mark = Mark::parse(summary.metadata.as_deref())?;
            mark.has_tag(key, value).then(|| Instance {
                provider_id: crate::id::format(&config.connection, &summary.name),
                state: instance_state(summary.status, false),
                name: summary.name,
                addresses: Vec::new(),
                created_at: mark.created_at,
                uid: mark.uid,
            })
        })
        .collect())
}
