//! `create`: idempotent by name. A VM with our name and this UID is adopted; our name with
//! another UID, or without our mark, is `permanent`; otherwise POST a new one with the mark.

use egress_guest::{Method, Request, percent_encode, time};
use serde_json::json;

use crate::backend::{self, Vm};
use crate::egress::provider::types::{CreateRequest, Error, Instance};

pub fn create(request: &CreateRequest) -> Result<Instance, Error> {
    let endpoint = backend::endpoint(&request.config)?;
    let path = format!("/vms?name={}", percent_encode(&request.name));
    if let Some(vm) = egress_guest::get_json::<Vec<Vm>>(&endpoint, &path)?.into_iter().next() {
        let not_ours = || Error::Permanent(format!("VM `{}` exists, not ours", request.name));
        let adopt = vm.is_ours() && vm.labels.get("egress-uid") == Some(&request.uid);
        return adopt.then(|| vm.into_instance()).ok_or_else(not_ours);
    }
    // The mark. The provider writes `created-at`; the operator only reads it back.
    let mut labels = json!({"managed-by": "egress-operator", "egress-uid": request.uid,
                            "created-at": time::now_rfc3339()});
    for tag in &request.tags {
        labels[format!("tag.{}", tag.key)] = json!(tag.value);
    }
    let body = json!({"name": request.name, "labels": labels, "userData": request.user_data});
    let post = Request::new(Method::Post, &endpoint, "/vms").json(&body);
    Ok(egress_guest::call(&post)?.decode::<Vm>()?.into_instance())
}
