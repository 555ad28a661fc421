//! The inventory's API (`/vms`), the configuration and the ownership mark: labels
//! `managed-by=egress-operator`, `egress-uid`, `created-at` and `tag.<key>` on every VM this
//! provider creates.

use std::collections::BTreeMap;

use egress_guest::{Endpoint, Problem};
use serde::Deserialize;

use crate::egress::provider::types::{Instance, InstanceState};

/// The configuration: `{"url": "http(s)://host[:port]"}`, nothing else.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    url: Endpoint,
}

/// The inventory's endpoint from a configuration; one that does not parse is `permanent`.
pub fn endpoint(config: &str) -> Result<Endpoint, Problem> {
    Ok(egress_guest::config::<Config>(config)?.url)
}

/// A VM as the inventory answers it.
#[derive(Deserialize)]
pub struct Vm {
    pub id: String,
    pub name: String,
    pub state: String,
    pub address: Option<String>,
    pub labels: BTreeMap<String, String>,
}

impl Vm {
    /// Whether the ownership mark says an operator made it.
    pub fn is_ours(&self) -> bool {
        self.labels.get("managed-by").is_some_and(|v| v == "egress-operator")
    }

    pub fn into_instance(self) -> Instance {
        let state = match self.state.as_str() {
            "running" => InstanceState::Running,
            "stopped" => InstanceState::Stopped,
            "failed" => InstanceState::Failed,
            _ => InstanceState::Provisioning,
        };
        Instance {
            provider_id: format!("inv/{}", self.id),
            uid: self.labels.get("egress-uid").cloned().unwrap_or_default(),
            created_at: self.labels.get("created-at").cloned(),
            addresses: self.address.into_iter().collect(),
            name: self.name,
            state,
        }
    }
}

/// The VM ID in a provider ID `inv/<digits>`; any other shape names no VM of ours: `not-found`.
pub fn vm_id(provider_id: &str) -> Result<&str, Problem> {
    let digits = |id: &&str| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit());
    let id = provider_id.strip_prefix("inv/").filter(digits);
    id.ok_or_else(|| Problem::not_found(format!("`{provider_id}` is no inventory ID")))
}
