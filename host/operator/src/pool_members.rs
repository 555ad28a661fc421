//! What both adapters tell the pool planner of a pool's Proxy ([`member`]), and how they pass its
//! placement request on to the provider ([`placement`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::conditions;
use crate::crd::ProxyStatus;
use crate::pool::{Health, Member, PlacementRequest};

/// The Ready reason of a Proxy whose provider found no room where it was asked to put its VM.
pub const NO_ROOM: &str = "QuotaExceeded";

/// The planner's view of Proxy `name` of template `template_hash`, made at `created`, from its
/// status; `required` says its placement request is `Required` (then a `QuotaExceeded` leaves it
/// pending, not failed).
pub fn member(
    name: &str,
    template_hash: String,
    created: Time,
    deleting: bool,
    status: &ProxyStatus,
    required: bool,
) -> Member {
    let ready = conditions::condition(&status.conditions, conditions::READY);
    let ready_since = ready
        .filter(|ready| ready.status == "True")
        .map(|ready| ready.last_transition_time.clone());
    let pending = ready
        .filter(|ready| required && ready.status == "False" && ready.reason == NO_ROOM)
        .map(|ready| ready.message.clone());
    Member {
        name: name.to_owned(),
        template_hash,
        created,
        ready_since,
        deleting,
        health: health(status),
        host: status.host.clone(),
        pending,
    }
}

/// A member's health, from the `HealthCheckSucceeded` condition its reconcile writes: failing
/// since that condition last turned false.
fn health(status: &ProxyStatus) -> Health {
    match conditions::condition(&status.conditions, conditions::HEALTH_CHECK_SUCCEEDED) {
        None => Health::Unknown,
        Some(check) if check.status == "True" => Health::Healthy,
        Some(check) if check.reason == "Failing" => Health::Unhealthy {
            since: check.last_transition_time.clone(),
        },
        Some(_) => Health::Starting,
    }
}

/// The contract's placement request for the planner's.
pub fn placement(request: &PlacementRequest) -> egress_runtime::types::Placement {
    egress_runtime::types::Placement {
        avoid_hosts: request.avoid_hosts.clone(),
        required: request.required,
    }
}
