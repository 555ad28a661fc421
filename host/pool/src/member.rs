//! A pool's member as the planner sees it, read from its Proxy's status: both adapters build
//! their [`Member`]s here.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use egress_crd::ProxyStatus;
use egress_crd::conditions::{HEALTH_CHECK_SUCCEEDED, READY};

use crate::{Health, Member};

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
    let ready = condition(status, READY);
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
    match condition(status, HEALTH_CHECK_SUCCEEDED) {
        None => Health::Unknown,
        Some(check) if check.status == "True" => Health::Healthy,
        Some(check) if check.reason == "Failing" => Health::Unhealthy {
            since: check.last_transition_time.clone(),
        },
        Some(_) => Health::Starting,
    }
}

fn condition<'a>(status: &'a ProxyStatus, kind: &str) -> Option<&'a Condition> {
    status
        .conditions
        .iter()
        .find(|condition| condition.type_ == kind)
}
