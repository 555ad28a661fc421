//! How both adapters pass a pool's placement request on to the provider ([`placement`]); what
//! they tell the planner of a member is `egress-pool`'s [`member`](crate::pool::member).

use kube::ResourceExt as _;

use crate::crd::Proxy;
use crate::pool::PlacementRequest;

/// The annotation holding a member's placement request in Kubernetes mode (JSON: `avoidHosts`,
/// `required`); local mode stores it beside the member.
pub const PLACEMENT_ANNOTATION: &str = "egress-operator.io/placement";

/// The contract's placement request for the planner's.
pub fn placement(request: &PlacementRequest) -> egress_runtime::types::Placement {
    egress_runtime::types::Placement {
        avoid_hosts: request.avoid_hosts.clone(),
        required: request.required,
    }
}

/// The placement request as [`PLACEMENT_ANNOTATION`] holds it (Kubernetes mode).
pub fn placement_json(request: &PlacementRequest) -> String {
    serde_json::to_string(&placement(request)).unwrap_or_default()
}

/// A member's placement request, from its annotation; `None` without one or if it is not
/// well-formed.
pub fn placement_of(proxy: &Proxy) -> Option<egress_runtime::types::Placement> {
    let text = proxy.annotations().get(PLACEMENT_ANNOTATION)?;
    serde_json::from_str(text).ok()
}
