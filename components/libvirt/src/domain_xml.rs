//! The domain definition: pure, table-tested.
//!
//! q35, a virtio disk (the VM's, made from the base), the NoCloud seed as a read-only SATA CD-ROM (q35 has no
//! IDE), one virtio NIC on the configured network or bridge, a serial console on a pty, and the
//! guest agent's virtio channel (a unix socket libvirt places itself). Everything is inside what
//! the host's policy allows: volumes of the granted pool, no host path, no emulator, and no
//! metadata (the host writes the provider's mark in its namespace through `set-metadata`).

use crate::config::{Config, Nic};

/// XML-escapes text and attribute values.
pub fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '\'' => escaped.push_str("&apos;"),
            '"' => escaped.push_str("&quot;"),
            c => escaped.push(c),
        }
    }
    escaped
}

/// What one VM's definition names.
#[derive(Clone, Debug)]
pub struct DomainSpec<'a> {
    /// The domain name (the proxy's).
    pub name: &'a str,
    /// The domain UUID to ask for: the Proxy UID when it is a UUID, so the domain carries it
    /// from the moment it is defined (see `create`).
    pub uuid: Option<&'a str>,
    /// The VM's disk volume.
    pub disk: &'a str,
    /// The VM's seed volume.
    pub seed: &'a str,
}

/// The domain XML for `spec` under `config`.
pub fn domain_xml(config: &Config, spec: &DomainSpec<'_>) -> String {
    let uuid = spec
        .uuid
        .map(|uuid| format!("\n  <uuid>{}</uuid>", escape(uuid)))
        .unwrap_or_default();
    let nic = match &config.nic {
        Nic::Network(network) => format!(
            "<interface type='network'><source network='{}'/><model type='virtio'/></interface>",
            escape(network)
        ),
        Nic::Bridge(bridge) => format!(
            "<interface type='bridge'><source bridge='{}'/><model type='virtio'/></interface>",
            escape(bridge)
        ),
    };
    let pool = escape(&config.pool);
    format!(
        "<domain type='{domain_type}'>
  <name>{name}</name>{uuid}
  <memory unit='MiB'>{memory}</memory>
  <vcpu>{vcpus}</vcpu>
  <os><type arch='x86_64' machine='q35'>hvm</type><boot dev='hd'/></os>
  <features><acpi/><apic/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <disk type='volume' device='disk'><driver name='qemu' type='{format}'/><source pool='{pool}' volume='{disk}'/><target dev='vda' bus='virtio'/></disk>
    <disk type='volume' device='cdrom'><driver name='qemu' type='raw'/><source pool='{pool}' volume='{seed}'/><target dev='sda' bus='sata'/><readonly/></disk>
    {nic}
    <serial type='pty'><target port='0'/></serial>
    <console type='pty'><target type='serial' port='0'/></console>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
  </devices>
</domain>",
        domain_type = config.domain_type.as_str(),
        name = escape(spec.name),
        memory = config.memory_mib,
        vcpus = config.vcpus,
        format = config.disk_format().as_str(),
        disk = escape(spec.disk),
        seed = escape(spec.seed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn config(extra: &str) -> Config {
        Config::parse(&format!(
            r#"{{"connections":["hv1"],"pool":"images","image":{{"url":"https://i/b","sha256":"{}"}}{extra}}}"#,
            "a".repeat(64)
        ))
        .unwrap()
    }

    fn spec() -> DomainSpec<'static> {
        DomainSpec {
            name: "proxy-a",
            uuid: Some("6c1f0a2e-0000-4000-8000-000000000001"),
            disk: "proxy-a.qcow2",
            seed: "proxy-a-seed.iso",
        }
    }

    /// `(tag@parent, attribute, value)` a document must carry.
    type Attribute<'a> = (&'a str, &'a str, &'a str);

    /// Each row: a config, and attributes the document must carry (`tag@parent`).
    #[test]
    fn the_definition_says_what_the_config_asks() {
        let mut raw_qemu_bridge =
            config(r#","bridge":"br0","domainType":"qemu","diskMode":"fullCopy""#);
        raw_qemu_bridge.image.format = crate::config::VolumeFormat::Raw;
        // A copy-on-write disk is qcow2 whatever the base's format.
        let mut raw_backed = config(r#","network":"default""#);
        raw_backed.image.format = crate::config::VolumeFormat::Raw;
        let rows: [(Config, &[Attribute]); 4] = [
            (
                config(r#","network":"default""#),
                &[
                    ("domain", "type", "kvm"),
                    ("type", "machine", "q35"),
                    ("interface", "type", "network"),
                    ("source@interface", "network", "default"),
                    ("driver@disk", "type", "qcow2"),
                ],
            ),
            (
                raw_qemu_bridge,
                &[
                    ("domain", "type", "qemu"),
                    ("interface", "type", "bridge"),
                    ("source@interface", "bridge", "br0"),
                    ("driver@disk", "type", "raw"),
                ],
            ),
            (
                config(r#","network":"n","domainType":"test""#),
                &[("domain", "type", "test"), ("channel", "type", "unix")],
            ),
            (raw_backed, &[("driver@disk", "type", "qcow2")]),
        ];
        for (config, checks) in rows {
            let xml = domain_xml(&config, &spec());
            let document = roxmltree::Document::parse(&xml).expect("well-formed");
            for (element, attribute, want) in checks.iter() {
                let (tag, parent) = element.split_once('@').unwrap_or((element, ""));
                let found = document.descendants().any(|node| {
                    node.has_tag_name(tag)
                        && (parent.is_empty()
                            || node.parent().is_some_and(|up| up.has_tag_name(parent)))
                        && node.attribute(*attribute) == Some(*want)
                });
                assert!(found, "<{element} {attribute}='{want}'> in\n{xml}");
            }
        }
    }

    #[test]
    fn disk_seed_console_and_agent_channel_are_there() {
        let xml = domain_xml(&config(r#","network":"default""#), &spec());
        let document = roxmltree::Document::parse(&xml).unwrap();
        let text = |tag: &str| {
            document
                .descendants()
                .find(|node| node.has_tag_name(tag))
                .and_then(|node| node.text())
                .map(str::to_owned)
        };
        assert_eq!(text("name").as_deref(), Some("proxy-a"));
        assert_eq!(
            text("uuid").as_deref(),
            Some("6c1f0a2e-0000-4000-8000-000000000001")
        );
        assert_eq!(text("memory").as_deref(), Some("1024"));
        let disks: Vec<_> = document
            .descendants()
            .filter(|node| node.has_tag_name("source") && node.attribute("pool").is_some())
            .map(|node| {
                (
                    node.attribute("pool").unwrap(),
                    node.attribute("volume").unwrap(),
                )
            })
            .collect();
        assert_eq!(
            disks,
            [("images", "proxy-a.qcow2"), ("images", "proxy-a-seed.iso")]
        );
        let cdrom = document
            .descendants()
            .find(|node| node.attribute("device") == Some("cdrom"))
            .unwrap();
        assert!(cdrom.children().any(|child| child.has_tag_name("readonly")));
        assert!(
            document
                .descendants()
                .any(|node| node.has_tag_name("serial") && node.attribute("type") == Some("pty"))
        );
        assert!(
            document
                .descendants()
                .any(|node| node.has_tag_name("target")
                    && node.attribute("name") == Some("org.qemu.guest_agent.0"))
        );
        // Nothing the host's policy refuses: no metadata, emulator or host path.
        for refused in ["metadata", "emulator"] {
            assert!(
                !document
                    .descendants()
                    .any(|node| node.has_tag_name(refused))
            );
        }
        assert!(
            !document
                .descendants()
                .any(|node| node.attribute("file").is_some() || node.attribute("path").is_some())
        );
    }

    #[test]
    fn names_are_escaped_and_a_missing_uuid_is_left_to_libvirt() {
        let spec = DomainSpec {
            name: "a'<b>",
            uuid: None,
            disk: "d&.qcow2",
            seed: "s\".iso",
        };
        let xml = domain_xml(&config(r#","bridge":"br'0""#), &spec);
        let document = roxmltree::Document::parse(&xml).expect("escaped");
        assert!(!document.descendants().any(|node| node.has_tag_name("uuid")));
        let name = document
            .descendants()
            .find(|node| node.has_tag_name("name"));
        assert_eq!(name.and_then(|node| node.text()), Some("a'<b>"));
        assert!(
            document
                .descendants()
                .any(|node| node.attribute("bridge") == Some("br'0"))
        );
        assert!(
            document
                .descendants()
                .any(|node| node.attribute("volume") == Some("d&.qcow2"))
        );
    }
}
