//! `list-by-tag`: every VM carrying the tag `key=value`.
//!
//! Without an endpoint there is nothing to list (the provider keeps no state), so the answer is
//! empty. With one: `GET {endpoint}/instances?tag=<key>=<value>`, key and value percent-encoded.

use crate::egress::provider::types::{Error, Instance};
use crate::{instance, operation};
use egress_guest::{Method, percent_encode};

/// The `list-by-tag` export.
pub fn list_by_tag(config: &str, key: &str, value: &str) -> Result<Vec<Instance>, Error> {
    let config = operation::begin(config)?;
    let Some(endpoint) = &config.endpoint else {
        return Ok(Vec::new());
    };
    let path = format!(
        "/instances?tag={}={}",
        percent_encode(key),
        percent_encode(value)
    );
    let answer = operation::call(&config, endpoint, Method::Get, &path, None)?;
    instance::parse_instances(&answer)
}
