//! An example provider for a toy inventory service (`testdata/inventory/inventory.py`), to copy:
//! `egress-guest` is the plumbing and the contract's ownership rules, this file the inventory's
//! VMs (`/vms`) and provider IDs (`inv/<digits>`). Guide: `docs/providers/authoring.md`.

// The frozen contract 0.1.0: `contract-wit` links to `wit/provider-v0.1.0`; copy it with the crate.
wit_bindgen::generate!({ path: "contract-wit", world: "provider-world", generate_all });
// `?` turns the guest crate's `Problem` into the contract's `error`, `Health` into `check-result`.
egress_guest::contract_types!(egress::provider::types, instance);

use egress::provider::types::{
    CheckResult, CreateRequest, Description, Error, Instance, InstanceState,
};
use egress_guest::{Health, Mark, Method, Problem, Request, call, get_json, percent_encode};
use egress_guest::{UrlConfig, numeric_id, post_json, unless_gone};
use exports::egress::provider::provider::Guest;
use serde::Deserialize;
use serde_json::json;

/// A VM as the inventory answers it, its labels read as our ownership mark (`None`: not ours).
#[derive(Deserialize)]
struct Vm {
    id: String,
    name: String,
    state: String,
    address: Option<String>,
    #[serde(rename = "labels", deserialize_with = "Mark::from_labels_field")]
    mark: Option<Mark>,
}

impl Vm {
    fn ours(self) -> Result<Instance, Problem> {
        let state = InstanceState::from_name(&self.state).unwrap_or(InstanceState::Provisioning);
        let addresses = self.address.into_iter().collect();
        Instance::marked(format!("inv/{}", self.id), self.name, state, addresses, self.mark)
    }
}

/// The configuration is the inventory's URL: `{"url": "http(s)://host[:port]"}` ([`UrlConfig`]).
struct InventoryProvider;

impl Guest for InventoryProvider {
    fn describe() -> Description {
        Description::http("example-inventory", env!("CARGO_PKG_VERSION"), UrlConfig::SCHEMA)
    }

    fn validate_config(config: String) -> Result<(), Error> {
        Ok(UrlConfig::endpoint(&config).map(drop)?)
    }

    /// Idempotent by name: adopt and start our VM with this UID, refuse others, else create it.
    fn create(request: CreateRequest) -> Result<Instance, Error> {
        let url = UrlConfig::endpoint(&request.config)?;
        let path = format!("/vms?name={}", percent_encode(&request.name));
        if let Some(vm) = get_json::<Vec<Vm>>(&url, &path)?.into_iter().next() {
            egress_guest::adopt(&request.name, &request.uid, vm.mark.as_ref())?;
            if vm.state == "stopped" {
                return Ok(post_json::<Vm>(&url, &format!("/vms/{}/start", vm.id), None)?.ours()?);
            }
            return Ok(vm.ours()?);
        }
        let mark = Mark::new(&request.uid, request.tags.iter().map(|t| (&*t.key, &*t.value)));
        let body =
            json!({"name": request.name, "labels": mark.labels(), "userData": request.user_data});
        Ok(post_json::<Vm>(&url, "/vms", Some(&body))?.ours()?)
    }

    /// One VM; not ours, gone, or a malformed ID is `not-found`.
    fn get(config: String, provider_id: String) -> Result<Instance, Error> {
        let path = format!("/vms/{}", numeric_id(&provider_id, "inv/")?);
        Ok(get_json::<Vm>(&UrlConfig::endpoint(&config)?, &path)?.ours()?)
    }

    /// Gone is success; a VM without our mark, or an ID this provider never makes, is `permanent`.
    fn delete(config: String, provider_id: String) -> Result<(), Error> {
        let id = numeric_id(&provider_id, "inv/")
            .map_err(|problem| Problem::permanent(problem.message))?;
        let (url, path) = (UrlConfig::endpoint(&config)?, format!("/vms/{id}"));
        if let Some(vm) = unless_gone(get_json::<Vm>(&url, &path))? {
            egress_guest::deletable(vm.mark.as_ref(), &provider_id)?;
            unless_gone(call(&Request::new(Method::Delete, &url, &path)))?;
        }
        Ok(())
    }

    /// Our VMs whose mark carries `tag.<key>=<value>`.
    fn list_by_tag(config: String, key: String, value: String) -> Result<Vec<Instance>, Error> {
        let path = format!("/vms?label={}", percent_encode(&Mark::tag_label(&key, &value)));
        let vms: Vec<Vm> = get_json(&UrlConfig::endpoint(&config)?, &path)?;
        Ok(vms.into_iter().filter_map(|vm| vm.ours().ok()).collect())
    }

    /// `GET /health` with the host's grant, answered as a reason, never an error.
    fn check(config: String) -> CheckResult {
        let health = |url| egress_guest::check(&Request::new(Method::Get, &url, "/health"));
        UrlConfig::endpoint(&config).map_or_else(Health::from, health).into()
    }
}

#[cfg(target_arch = "wasm32")]
export!(InventoryProvider);
