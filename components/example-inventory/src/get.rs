//! `get`: one VM by provider ID; a VM without our mark is `not-found` (it is not ours).

use crate::backend::{self, Vm};
use crate::egress::provider::types::{Error, Instance};

pub fn get(config: &str, provider_id: &str) -> Result<Instance, Error> {
    let id = backend::vm_id(provider_id)?;
    let vm: Vm = egress_guest::get_json(&backend::endpoint(config)?, &format!("/vms/{id}"))?;
    let not_ours = || Error::NotFound(format!("VM {id} is not one of ours"));
    vm.is_ours().then(|| vm.into_instance()).ok_or_else(not_ours)
}
