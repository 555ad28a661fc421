//! What an adapter decides beside the plan: how many of a plan's creates to make now
//! ([`creates_now`]) and which address of a member a Service may publish ([`endpoint_address`]).

use std::net::Ipv4Addr;

use crate::Member;

/// How many of a plan's `planned` creates to make in this pass. Without `spread`, all of them.
/// With it, one, and none while a sibling holding a VM has not reported its host yet: a
/// placement request's avoid-list is only as complete as what has landed.
pub fn creates_now(spread: bool, members: &[Member], planned: usize) -> usize {
    if !spread {
        return planned;
    }
    let unplaced = members
        .iter()
        .any(|member| !member.deleting && member.host.is_none() && member.pending.is_none());
    if unplaced { 0 } else { planned.min(1) }
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
    use crate::Health;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn member(host: Option<&str>, pending: Option<&str>, deleting: bool) -> Member {
        Member {
            name: "m".into(),
            template_hash: "h".into(),
            created: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            ready_since: None,
            deleting,
            health: Health::Unknown,
            host: host.map(Into::into),
            pending: pending.map(Into::into),
        }
    }

    #[test]
    fn without_spread_every_create_is_made_at_once() {
        assert_eq!(creates_now(false, &[member(None, None, false)], 3), 3);
    }

    #[test]
    fn with_spread_one_create_a_pass_once_every_sibling_has_landed() {
        let landed = member(Some("pv1"), None, false);
        let pending = member(None, Some("no host"), false);
        let going = member(None, None, true);
        assert_eq!(creates_now(true, &[landed.clone(), pending, going], 3), 1);
        assert_eq!(creates_now(true, &[], 0), 0);
        let unplaced = member(None, None, false);
        assert_eq!(creates_now(true, &[landed, unplaced], 2), 0);
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
