//! net0 rewrite for the configured bridge and VLAN (Phase 0 decision, Phase 6): `bridge=` is
//! replaced, `tag=` is replaced in place or appended, everything else, the MAC included, is kept.

/// The rewritten net0, or `None` when neither `bridge` nor `vlan_tag` is set or nothing changes
/// (net0 is written only when it changes, Phase 6).
pub fn rewrite_net0(net0: &str, bridge: Option<&str>, vlan_tag: Option<u16>) -> Option<String> {
    if bridge.is_none() && vlan_tag.is_none() {
        return None;
    }
    let mut parts: Vec<String> = net0.split(',').map(String::from).collect();
    let mut set = |key: &str, value: String| {
        let prefix = format!("{key}=");
        match parts.iter_mut().find(|part| part.starts_with(&prefix)) {
            Some(part) => *part = format!("{prefix}{value}"),
            None => parts.push(format!("{prefix}{value}")),
        }
    };
    if let Some(bridge) = bridge {
        set("bridge", bridge.to_string());
    }
    if let Some(tag) = vlan_tag {
        set("tag", tag.to_string());
    }
    let rewritten = parts.join(",");
    (rewritten != net0).then_some(rewritten)
}

/// The `bridge=` and `tag=` of a NIC value (`virtio=…,bridge=vmbr0,tag=4`); no bridge, no answer.
pub fn bridge_and_tag(net: &str) -> Option<(&str, Option<u16>)> {
    let option = |key: &str| {
        net.split(',')
            .find_map(|part| part.strip_prefix(key)?.strip_prefix('='))
    };
    let bridge = option("bridge").filter(|bridge| !bridge.is_empty())?;
    Some((bridge, option("tag").and_then(|tag| tag.parse().ok())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridge_and_tag_of_a_nic() {
        assert_eq!(bridge_and_tag(CLONED), Some(("vmbr0", None)));
        assert_eq!(
            bridge_and_tag("virtio=BC:24:11:00:00:01,bridge=vmbr0,tag=4,firewall=1"),
            Some(("vmbr0", Some(4)))
        );
        assert_eq!(bridge_and_tag("virtio=BC:24:11:00:00:01"), None);
    }

    const CLONED: &str = "virtio=BC:24:11:EE:48:83,bridge=vmbr0";

    /// net0 as cloned, bridge, vlanTag, expected rewrite.
    type Row = (
        &'static str,
        Option<&'static str>,
        Option<u16>,
        Option<&'static str>,
    );

    #[test]
    fn phase0_phase6_rewrite_net0_table() {
        let rows: [Row; 7] = [
            // The Phase 0 capture: tag=4 appended, MAC kept.
            (
                CLONED,
                None,
                Some(4),
                Some("virtio=BC:24:11:EE:48:83,bridge=vmbr0,tag=4"),
            ),
            (
                CLONED,
                Some("vmbr1"),
                None,
                Some("virtio=BC:24:11:EE:48:83,bridge=vmbr1"),
            ),
            (
                CLONED,
                Some("vmbr1"),
                Some(4),
                Some("virtio=BC:24:11:EE:48:83,bridge=vmbr1,tag=4"),
            ),
            // F19's template 9000 carries tag=4: replaced in place, not appended twice.
            (
                "virtio=BC:24:11:00:00:01,bridge=vmbr0,tag=4,firewall=1",
                None,
                Some(7),
                Some("virtio=BC:24:11:00:00:01,bridge=vmbr0,tag=7,firewall=1"),
            ),
            // Unset: leave net0 as cloned.
            (CLONED, None, None, None),
            // Already as wanted: no write.
            (
                "virtio=BC:24:11:EE:48:83,bridge=vmbr0,tag=4",
                Some("vmbr0"),
                Some(4),
                None,
            ),
            // A bridge-less net0 gets one.
            (
                "virtio=BC:24:11:EE:48:83",
                Some("vmbr0"),
                None,
                Some("virtio=BC:24:11:EE:48:83,bridge=vmbr0"),
            ),
        ];
        for (net0, bridge, tag, expected) in rows {
            assert_eq!(
                rewrite_net0(net0, bridge, tag).as_deref(),
                expected,
                "{net0} {bridge:?} {tag:?}"
            );
        }
    }
}
