//! `get`: read one VM by its provider ID.
//!
//! IDs that do not start with `ref/` are not-found: no VM of ours can have them. Without an
//! endpoint, names starting `missing-` are not-found (so hosts can test that path) and every
//! other name is a running instance. With an endpoint: `GET {endpoint}/instances/<name>`.

use crate::egress::provider::types::{Error, Instance};
use crate::{instance, operation};
use egress_guest::{Method, percent_encode};

/// The `get` export.
pub fn get(config: &str, provider_id: &str) -> Result<Instance, Error> {
    let config = operation::begin(config)?;
    let Some(name) = instance::name_from_provider_id(provider_id) else {
        return Err(Error::NotFound(format!(
            "`{provider_id}` is not a reference provider ID (they look like `ref/<name>`)"
        )));
    };

    match &config.endpoint {
        None if name.starts_with("missing-") => {
            Err(Error::NotFound(format!("no instance named `{name}`")))
        }
        // Unknown after the fact: the mark with the creation time and UID lives on the endpoint.
        None => Ok(instance::invented(name, None, "")),
        Some(endpoint) => {
            let path = format!("/instances/{}", percent_encode(name));
            let answer = operation::call(&config, endpoint, Method::Get, &path, None)?;
            instance::parse_instance(&answer)
        }
    }
}
