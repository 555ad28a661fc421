//! `delete`: remove a VM. Idempotent: a VM that is already gone is success.
//!
//! An ID that is not `ref/<name>` is a permanent error rather than not-found: it cannot be ours,
//! so "already deleted" would hide an operator bug that handed us another provider's ID. With an
//! endpoint: `DELETE {endpoint}/instances/<name>`, where a 404 also counts as success.

use crate::egress::provider::types::Error;
use crate::{instance, operation};
use egress_guest::{Method, percent_encode};

/// The `delete` export.
pub fn delete(config: &str, provider_id: &str) -> Result<(), Error> {
    let config = operation::begin(config)?;
    let Some(name) = instance::name_from_provider_id(provider_id) else {
        return Err(Error::Permanent(format!(
            "`{provider_id}` is not a reference provider ID (they look like `ref/<name>`)"
        )));
    };

    let Some(endpoint) = &config.endpoint else {
        return Ok(());
    };
    let path = format!("/instances/{}", percent_encode(name));
    match operation::call(&config, endpoint, Method::Delete, &path, None) {
        Ok(_) | Err(Error::NotFound(_)) => Ok(()),
        Err(error) => Err(error),
    }
}
