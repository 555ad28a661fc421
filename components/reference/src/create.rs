//! `create`: make sure a VM named `request.name` exists and is starting.
//!
//! Without an endpoint the answer is invented (a running `ref/<name>`). With one, the provider
//! POSTs `{"name", "uid", "tags", "userData"}` to `{endpoint}/instances` and answers the instance
//! the endpoint returns. The tags go along so that list-by-tag finds what create made.
//! Either way it logs an info line `created` with the name, the UID and a random request ID.

use serde::Serialize;

use crate::egress::provider::types::{CreateRequest, Error, Instance, Tag};
use crate::wasi::random::random;
use crate::{instance, logging, operation};
use egress_guest::{Method, time};

/// The JSON body POSTed to `{endpoint}/instances`.
#[derive(Serialize)]
struct CreateBody<'a> {
    name: &'a str,
    uid: &'a str,
    tags: Vec<TagBody<'a>>,
    #[serde(rename = "userData")]
    user_data: &'a str,
}

/// A tag as the endpoint stores it, `{"key", "value"}`, as list-by-tag's `?tag=key=value` asks.
#[derive(Serialize)]
struct TagBody<'a> {
    key: &'a str,
    value: &'a str,
}

impl<'a> From<&'a Tag> for TagBody<'a> {
    fn from(tag: &'a Tag) -> Self {
        TagBody {
            key: &tag.key,
            value: &tag.value,
        }
    }
}

/// The `create` export.
pub fn create(request: &CreateRequest) -> Result<Instance, Error> {
    let config = operation::begin(&request.config)?;
    if request.name.is_empty() {
        return Err(Error::Permanent(
            "create needs a non-empty name".to_string(),
        ));
    }

    let created = match &config.endpoint {
        None => instance::invented(&request.name, Some(time::now_rfc3339()), &request.uid),
        Some(endpoint) => {
            let body = CreateBody {
                name: &request.name,
                uid: &request.uid,
                tags: request.tags.iter().map(TagBody::from).collect(),
                user_data: &request.user_data,
            };
            let body = serde_json::to_vec(&body).map_err(|error| {
                Error::Permanent(format!("could not encode the create request: {error}"))
            })?;
            let answer =
                operation::call(&config, endpoint, Method::Post, "/instances", Some(body))?;
            let mut created = instance::parse_instance(&answer)?;
            // The endpoint may leave these out; then they are what this call wrote.
            created.created_at.get_or_insert_with(time::now_rfc3339);
            if created.uid.is_empty() {
                created.uid.clone_from(&request.uid);
            }
            created
        }
    };

    // A random ID ties this log line to any endpoint-side logs of the same call.
    let request_id = format!("{:016x}", random::get_random_u64());
    logging::info(
        "created",
        &[
            ("name", &request.name),
            ("uid", &request.uid),
            ("request_id", &request_id),
        ],
    );
    Ok(created)
}
