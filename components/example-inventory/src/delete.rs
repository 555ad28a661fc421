//! `delete`: idempotent (gone is success); a VM without our mark, or an ID this provider never
//! makes, is never deleted (`permanent`).

use egress_guest::{ErrorClass, Method, Request};

use crate::backend::{self, Vm};
use crate::egress::provider::types::Error;

pub fn delete(config: &str, provider_id: &str) -> Result<(), Error> {
    let endpoint = backend::endpoint(config)?;
    // An ID of another shape is none this provider made: refuse rather than guess (`permanent`).
    let id = backend::vm_id(provider_id).map_err(|problem| Error::Permanent(problem.message))?;
    let path = format!("/vms/{id}");
    let vm: Vm = match egress_guest::get_json(&endpoint, &path) {
        Err(problem) if problem.class == ErrorClass::NotFound => return Ok(()),
        answer => answer?,
    };
    if !vm.is_ours() {
        return Err(Error::Permanent(format!("VM {id} lacks our mark: not deleting it")));
    }
    match egress_guest::call(&Request::new(Method::Delete, &endpoint, &path)) {
        Err(problem) if problem.class != ErrorClass::NotFound => Err(problem.into()),
        _ => Ok(()),
    }
}
