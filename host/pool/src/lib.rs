//! # egress-pool: what a ProxyPool does next
//!
//! A [`ProxyPool`](egress_crd::ProxyPool) keeps `replicas` Proxies of one template. Its
//! members are Proxies it owns (labelled [`POOL_LABEL`](egress_crd::POOL_LABEL) and
//! [`TEMPLATE_HASH_LABEL`](egress_crd::TEMPLATE_HASH_LABEL)). [`plan()`] decides, from the pool
//! and what an adapter knows of each member ([`Member`]), which Proxies to make and delete and
//! the status to write ([`Plan`]). It is pure: no I/O, no clock (the caller passes `now`), the
//! same answer for the members in any order. The rules, in plain words, are in `docs/pools.md`.
//!
//! An adapter (local mode, Kubernetes mode) calls it on each pass over a pool:
//!
//! 1. lists the pool's Proxies by [`pool_selector`](egress_crd::pool_selector) and turns each
//!    into a [`Member`];
//! 2. calls `plan(&pool, &members, &now)`;
//! 3. deletes each [`Plan::delete`] (an Event with [`DeleteReason::as_str`]), makes one Proxy
//!    per [`Plan::create`] (a generated name after the pool, an owner reference to it, the
//!    labels of [`member_labels`](egress_crd::member_labels), the template's spec, and the
//!    [`PlacementRequest`] passed to the provider), asks the provider again to place each
//!    [`Plan::retry`] member, and writes [`Plan::status`] (server-side apply, as every status).
//!
//! Under `spread.policy: Required` the adapter makes a plan's creates one after another and adds
//! the host each lands on to the next ones' `avoid_hosts`: the planner cannot know where a VM
//! it has not made yet will land.

#![warn(missing_docs)]

mod adapter;
mod member;
mod plan;
pub mod publish;
#[cfg(test)]
mod tests;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

pub use adapter::creates_now;
use egress_crd::ProxyPoolStatus;
pub use member::{NO_ROOM, member};
pub use plan::plan;

/// Condition: at least `replicas - maxUnavailable` members are Ready.
pub const AVAILABLE: &str = "Available";
/// Condition: the pool's members are becoming what its spec asks (`True`), are held
/// (`Unknown`, `RolloutPaused`), or stopped making progress (`False`).
pub const PROGRESSING: &str = "Progressing";
/// Condition: more members are unhealthy than `remediation.maxUnhealthy` allows, so none is
/// replaced.
pub const REMEDIATION_HALTED: &str = "RemediationHalted";
/// Condition (only with `spread`): members the provider could not place as the spread asks.
pub const PLACEMENT_SHORTAGE: &str = "PlacementShortage";

/// The reasons the planner writes in its conditions.
pub mod reasons {
    /// `Available=True`.
    pub const MINIMUM_REPLICAS_AVAILABLE: &str = "MinimumReplicasAvailable";
    /// `Available=False`.
    pub const MINIMUM_REPLICAS_UNAVAILABLE: &str = "MinimumReplicasUnavailable";
    /// `Progressing=True`: members are being made, deleted or awaited.
    pub const REPLICAS_UPDATED: &str = "ReplicasUpdated";
    /// `Progressing=True`: every member runs the template and is Ready, `replicas` of them.
    pub const ROLLOUT_COMPLETE: &str = "RolloutComplete";
    /// `Progressing=Unknown`: `spec.paused`.
    pub const ROLLOUT_PAUSED: &str = "RolloutPaused";
    /// `Progressing=False`: no progress within `progressDeadlineSeconds`.
    pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
    /// `Progressing=False`: a value of the spec the schema would refuse (local mode reads
    /// manifests no API server checked); the pool does nothing until it is fixed.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// `RemediationHalted=True`.
    pub const TOO_MANY_UNHEALTHY: &str = "TooManyUnhealthy";
    /// `RemediationHalted=False`.
    pub const WITHIN_LIMIT: &str = "WithinLimit";
    /// `PlacementShortage=True`.
    pub const TOO_FEW_HOSTS: &str = "TooFewHosts";
    /// `PlacementShortage=False`.
    pub const ALL_PLACED: &str = "AllPlaced";
}

/// What an adapter knows of one Proxy the pool owns.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    /// The Proxy's name.
    pub name: String,
    /// Its [`TEMPLATE_HASH_LABEL`](egress_crd::TEMPLATE_HASH_LABEL).
    pub template_hash: String,
    /// Its `creationTimestamp`.
    pub created: Time,
    /// When it became Ready (its `Ready` condition's transition time), if it is: running, with
    /// an address, and passing its health check.
    pub ready_since: Option<Time>,
    /// It has a deletion timestamp: its VM is going.
    pub deleting: bool,
    /// Its health check's verdict.
    pub health: Health,
    /// The host its VM is on, if the provider reported one.
    pub host: Option<String>,
    /// Why the provider could not place it as the spread asks (no VM was made), if so.
    pub pending: Option<String>,
}

impl Member {
    /// Ready (and not being deleted).
    pub fn is_ready(&self) -> bool {
        self.ready_since.is_some() && !self.deleting
    }
}

/// A member's health check verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// Within its startup time: not judged yet.
    Starting,
    /// Passing.
    Healthy,
    /// Failing past its failure threshold since then: a candidate for remediation.
    Unhealthy {
        /// When it crossed the threshold.
        since: Time,
    },
    /// Not probed (no address yet, or no health check).
    Unknown,
}

/// What a pool does next.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Proxies to make, each of the current template.
    pub create: Vec<Create>,
    /// Proxies to delete, in the order chosen.
    pub delete: Vec<Delete>,
    /// Pending members to ask the provider again to place, with the hosts to avoid now.
    pub retry: Vec<Retry>,
    /// The status to write: the counts, the template hash, the progress clock, the conditions.
    pub status: ProxyPoolStatus,
}

/// One Proxy to make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Create {
    /// The template hash to label it with (the current template's).
    pub template_hash: String,
    /// Where to ask the provider to put it; `None` without `spread`.
    pub placement: Option<PlacementRequest>,
}

/// A request to place a VM apart from its siblings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementRequest {
    /// The hosts of every sibling that still has a VM (those being deleted too), sorted.
    pub avoid_hosts: Vec<String>,
    /// `Required`: leave the Proxy pending rather than use one of them. `Preferred`: avoid them
    /// if the provider can.
    pub required: bool,
}

/// One Proxy to delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delete {
    /// Its name.
    pub name: String,
    /// Why.
    pub reason: DeleteReason,
}

/// A pending member to place again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retry {
    /// Its name.
    pub name: String,
    /// Where to ask the provider to put it now.
    pub placement: PlacementRequest,
}

/// Why the pool deletes a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteReason {
    /// More members than `replicas`.
    ScaleIn,
    /// Of an older template, replaced by a rolling update.
    Rollout,
    /// Of an older template, under `Recreate`.
    Recreate,
    /// Unhealthy past its threshold.
    Remediation,
}

impl DeleteReason {
    /// The reason as an Event's (`ScaledIn`, `RolledOut`, `Recreated`, `Remediated`).
    pub fn as_str(self) -> &'static str {
        match self {
            DeleteReason::ScaleIn => "ScaledIn",
            DeleteReason::Rollout => "RolledOut",
            DeleteReason::Recreate => "Recreated",
            DeleteReason::Remediation => "Remediated",
        }
    }
}
