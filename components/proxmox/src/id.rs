//! Provider IDs: `<node>/<vmid>`.

use crate::egress::provider::types::Error;

/// A parsed provider ID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmId {
    pub node: String,
    pub vmid: u32,
}

impl VmId {
    /// Parse `<node>/<vmid>`; anything else is `permanent` (an ID this provider never made).
    pub fn parse(text: &str) -> Result<VmId, Error> {
        let bad = || Error::Permanent(format!("provider ID {text:?} is not <node>/<vmid>"));
        let (node, vmid) = text.split_once('/').ok_or_else(bad)?;
        if node.is_empty() || !node.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(bad());
        }
        if vmid.is_empty() || !vmid.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let vmid: u32 = vmid.parse().map_err(|_| bad())?;
        if !(100..=crate::config::MAX_VMID).contains(&vmid) {
            return Err(bad());
        }
        Ok(VmId {
            node: node.to_string(),
            vmid,
        })
    }
}

impl std::fmt::Display for VmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.node, self.vmid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_round_trip_and_bad_ones_are_permanent() {
        let id = VmId::parse("pv1-1/100123").unwrap();
        assert_eq!(
            id,
            VmId {
                node: "pv1-1".into(),
                vmid: 100_123
            }
        );
        assert_eq!(id.to_string(), "pv1-1/100123");
        for bad in [
            "",
            "pv1-1",
            "/100",
            "pv1-1/",
            "pv1-1/99",
            "pv1-1/1x",
            "a/b/1",
            "pv 1/100",
            "n/+100",
            "n/9999999999",
        ] {
            assert!(
                matches!(VmId::parse(bad), Err(Error::Permanent(_))),
                "{bad:?}"
            );
        }
    }
}
