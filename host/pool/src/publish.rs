//! A pool's Service and EndpointSlice, as an adapter applies them (server-side apply): a
//! selectorless Service named after the pool, on the port of the template's health check
//! ([`service_port`]), and one EndpointSlice of the same name listing the address of each Ready
//! member ([`endpoint_address`]). A template without a health check has no port to publish.

use std::net::Ipv4Addr;

use egress_crd::{POOL_LABEL, Proxy, ProxyPool};
use serde_json::{Value, json};

/// The pool condition saying whether its Service publishes its Ready members.
pub const SERVING: &str = "Serving";
/// The EndpointSlice's `endpointslice.kubernetes.io/managed-by` (a label value: no slash), as
/// `endpointslice-controller.k8s.io` names the EndpointSlice controller.
pub const MANAGED_BY: &str = "pool-controller.egress-operator.io";
/// The name of the Service's one port.
pub const PORT_NAME: &str = "proxy";

/// The port a pool's Service publishes: its template's health check port, if it has one.
pub fn service_port(pool: &ProxyPool) -> Option<u16> {
    let check = pool.spec.template.spec.health_check.as_ref()?;
    u16::try_from(check.port()).ok().filter(|port| *port > 0)
}

/// A pool's Service and EndpointSlice, and what the slice lists.
#[derive(Clone, Debug, PartialEq)]
pub struct Published {
    /// The Service (`v1`), to apply.
    pub service: Value,
    /// The EndpointSlice (`discovery.k8s.io/v1`), to apply.
    pub slice: Value,
    /// How many members are Ready.
    pub ready: usize,
    /// How many of them the slice lists (the others have no publishable address).
    pub listed: usize,
}

/// Pool `name`'s Service and EndpointSlice on `port`, both owned by `owner` (the pool's
/// controller owner reference), the slice listing the Ready ones of `members`.
pub fn published(name: &str, owner: &Value, port: u16, members: &[Proxy]) -> Published {
    let ready: Vec<&Proxy> = members.iter().filter(|proxy| is_ready(proxy)).collect();
    let mut endpoints: Vec<Value> = ready.iter().filter_map(|proxy| endpoint(proxy)).collect();
    endpoints.sort_by_key(|endpoint| endpoint["addresses"][0].to_string());
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": {POOL_LABEL: name}, "ownerReferences": [owner]},
        "spec": {"ports": [{"name": PORT_NAME, "protocol": "TCP", "port": port, "targetPort": port}]},
    });
    let labels = json!({
        "kubernetes.io/service-name": name,
        "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
        POOL_LABEL: name,
    });
    let listed = endpoints.len();
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": labels, "ownerReferences": [owner]},
        "addressType": "IPv4",
        "ports": [{"name": PORT_NAME, "protocol": "TCP", "port": port}],
        "endpoints": endpoints,
    });
    Published {
        service,
        slice,
        ready: ready.len(),
        listed,
    }
}

/// A member not being deleted whose `Ready` condition is True (its health check passes).
fn is_ready(proxy: &Proxy) -> bool {
    let conditions = proxy.status.as_ref().map(|status| &status.conditions[..]);
    proxy.metadata.deletion_timestamp.is_none()
        && conditions
            .unwrap_or_default()
            .iter()
            .any(|condition| condition.type_ == "Ready" && condition.status == "True")
}

/// A Ready member's endpoint: its publishable address and a reference to it.
fn endpoint(proxy: &Proxy) -> Option<Value> {
    let address = endpoint_address(&proxy.status.as_ref()?.addresses)?;
    let metadata = &proxy.metadata;
    Some(json!({
        "addresses": [address.to_string()],
        "conditions": {"ready": true},
        "targetRef": {
            "apiVersion": "egress-operator.io/v1alpha1", "kind": "Proxy",
            "namespace": metadata.namespace, "name": metadata.name, "uid": metadata.uid,
        },
    }))
}

/// The address a Service publishes for a member: the first of its `addresses` (most preferred
/// first) written as a plain IPv4 address that an EndpointSlice may hold. The provider is not
/// trusted, so anything else is left out: text that is not exactly an IPv4 address, and the
/// addresses the API server refuses in an EndpointSlice (unspecified, loopback, link-local,
/// multicast, broadcast).
pub fn endpoint_address(addresses: &[String]) -> Option<Ipv4Addr> {
    addresses.iter().find_map(|text| {
        let address: Ipv4Addr = text.parse().ok()?;
        let publishable = address.to_string() == *text
            && !address.is_unspecified()
            && !address.is_loopback()
            && !address.is_link_local()
            && !address.is_multicast()
            && !address.is_broadcast();
        publishable.then_some(address)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_crd::{ProxySpec, ProxyStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn proxy(name: &str, ready: bool, deleting: bool, addresses: &[&str]) -> Proxy {
        let mut proxy = Proxy::new(name, ProxySpec::default());
        proxy.metadata.namespace = Some("team-a".into());
        proxy.metadata.uid = Some(format!("uid-{name}"));
        let epoch = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        proxy.metadata.deletion_timestamp = deleting.then(|| epoch.clone());
        proxy.status = Some(ProxyStatus {
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                reason: "Test".into(),
                message: String::new(),
                observed_generation: None,
                last_transition_time: epoch,
            }],
            ..ProxyStatus::default()
        });
        proxy
    }

    #[test]
    fn the_slice_lists_only_ready_members_kept_with_a_publishable_address() {
        let owner = json!({"kind": "ProxyPool", "name": "edge", "uid": "u"});
        let members = [
            proxy("b", true, false, &["10.0.0.9"]),
            proxy("a", true, false, &["10.0.0.2", "10.0.0.3"]),
            proxy("unready", false, false, &["10.0.0.4"]),
            proxy("going", true, true, &["10.0.0.5"]),
            proxy("loopback", true, false, &["127.77.0.1"]),
        ];
        let published = published("edge", &owner, 3128, &members);
        assert_eq!((published.ready, published.listed), (3, 2));
        let endpoints = published.slice["endpoints"].as_array().unwrap();
        let addresses: Vec<&str> = endpoints
            .iter()
            .map(|endpoint| endpoint["addresses"][0].as_str().unwrap())
            .collect();
        assert_eq!(addresses, ["10.0.0.2", "10.0.0.9"]);
        assert_eq!(endpoints[0]["targetRef"]["name"], "a");
        let slice = &published.slice;
        assert_eq!(
            slice["metadata"]["labels"]["kubernetes.io/service-name"],
            "edge"
        );
        assert_eq!(slice["ports"][0]["port"], 3128);
        assert_eq!(published.service["spec"]["ports"][0]["targetPort"], 3128);
        assert!(published.service["spec"].get("selector").is_none());
        assert_eq!(published.service["metadata"]["ownerReferences"][0], owner);
    }

    #[test]
    fn only_a_plain_routable_ipv4_address_is_published() {
        let published = |addresses: &[&str]| {
            endpoint_address(&addresses.iter().map(|a| a.to_string()).collect::<Vec<_>>())
        };
        assert_eq!(
            published(&["10.0.0.7", "10.0.0.8"]),
            Some(Ipv4Addr::new(10, 0, 0, 7))
        );
        // What the API server refuses, or a provider should never say, is skipped.
        for refused in [
            "127.77.0.5",
            "0.0.0.0",
            "169.254.1.1",
            "224.0.0.1",
            "255.255.255.255",
            "010.0.0.1",
            " 10.0.0.1",
            "10.0.0.1:3128",
            "fd00::1",
            "proxy.example",
            "",
        ] {
            assert_eq!(published(&[refused]), None, "{refused:?}");
        }
        assert_eq!(
            published(&["127.0.0.1", "fd00::1", "192.0.2.4"]),
            Some(Ipv4Addr::new(192, 0, 2, 4))
        );
    }
}
