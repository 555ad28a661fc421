//! `list-by-tag`: our VMs whose mark carries `tag.<key>=<value>`.

use egress_guest::percent_encode;

use crate::backend::{self, Vm};
use crate::egress::provider::types::{Error, Instance};

pub fn list_by_tag(config: &str, key: &str, value: &str) -> Result<Vec<Instance>, Error> {
    let path = format!("/vms?label={}", percent_encode(&format!("tag.{key}={value}")));
    let vms: Vec<Vm> = egress_guest::get_json(&backend::endpoint(config)?, &path)?;
    Ok(vms.into_iter().filter(Vm::is_ours).map(Vm::into_instance).collect())
}
