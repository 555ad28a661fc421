//! Which node a new VM is cloned onto (contract 0.2.0's placement request).
//!
//! Without a request: the first of `nodes`, the default placement. With one (a pool spreading its
//! VMs across hosts): the first of `nodes`, in list order, that no sibling uses; when every node
//! is avoided, a required request makes nothing (`quota-exceeded`, naming the nodes: a person or a
//! new node must add room) and a preferred one takes the default. The request only chooses where
//! a VM is made: one found by its name is adopted where it runs.

use crate::config::Config;
use crate::egress::provider::types::{Error, Placement};

/// The node a new VM goes to under `placement`.
pub fn node<'a>(config: &'a Config, placement: Option<&Placement>) -> Result<&'a str, Error> {
    let Some(placement) = placement else {
        return Ok(config.placement_node());
    };
    let avoided = |node: &String| placement.avoid_hosts.contains(node);
    if let Some(free) = config.nodes.iter().find(|node| !avoided(node)) {
        return Ok(free);
    }
    if placement.required {
        return Err(Error::QuotaExceeded(format!(
            "placement: every node this provider may use ({}) already runs a sibling, and the \
             spread is required: another node is needed in `nodes`",
            config.nodes.join(", ")
        )));
    }
    Ok(config.placement_node())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::parse(
            r#"{"apiUrl":"https://pve.example:8006/","nodes":["pv1-1","pv1-2","pv1-3"],
                "templateVmid":9001,"isoStorage":"proxy-seeds"}"#,
        )
        .unwrap()
    }

    fn request(avoid: &[&str], required: bool) -> Placement {
        Placement {
            avoid_hosts: avoid.iter().map(|node| node.to_string()).collect(),
            required,
        }
    }

    #[test]
    fn a_request_keeps_the_vm_off_its_siblings_nodes() {
        let config = config();
        assert_eq!(node(&config, None).unwrap(), "pv1-1");
        assert_eq!(node(&config, Some(&request(&[], true))).unwrap(), "pv1-1");
        let away = request(&["pv1-1", "pv1-2"], true);
        assert_eq!(node(&config, Some(&away)).unwrap(), "pv1-3");
        // Not a node of this provider: nothing to avoid.
        assert_eq!(
            node(&config, Some(&request(&["pv9"], true))).unwrap(),
            "pv1-1"
        );
    }

    #[test]
    fn every_node_avoided_is_a_shortage_when_required_and_the_default_when_preferred() {
        let config = config();
        let all = ["pv1-1", "pv1-2", "pv1-3"];
        assert_eq!(node(&config, Some(&request(&all, false))).unwrap(), "pv1-1");
        match node(&config, Some(&request(&all, true))) {
            Err(Error::QuotaExceeded(message)) => {
                assert!(message.contains("pv1-1, pv1-2, pv1-3"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }
}
