//! What domain, volume and metadata XML from the guest may say.
//!
//! A domain definition is as powerful as its hypervisor's root: `<qemu:commandline>` passes
//! arguments to qemu, a disk or a serial port can name any host file (which libvirt then relabels
//! for qemu), `<emulator>` names the binary libvirt runs. A grant of pools, networks and bridges
//! would mean nothing if the XML could reach around it, so the host checks the XML before libvirt
//! sees it, against an allow-list:
//!
//! - **Elements.** `<domain>`'s children, `<os>`'s and `<devices>`' are allow-listed; anything
//!   else is denied (`<seclabel>`, `<resource>`, `<emulator>`, `<hostdev>`, `<filesystem>`,
//!   kernel and initrd, …). Elements in any namespace are denied outside `<metadata>`.
//! - **Metadata** children must be in the provider's own namespace: a definition cannot forge
//!   another provider's ownership mark.
//! - **Disks** are `type='volume'` in a granted pool, or `type='file'` with no source (an empty
//!   CD-ROM); a backing store must be empty.
//! - **Interfaces** are `type='network'` on a granted network or `type='bridge'` on a granted
//!   bridge, without scripts, a host-side target, a backend or a ROM file.
//! - **Character devices** are `pty`, or a `unix` channel whose socket libvirt places itself;
//!   a TPM is emulated; an RNG reads `/dev/urandom`, `/dev/random` or `/dev/hwrng`.
//! - **Anywhere**, attributes that name host paths (`file`, `path`, `dir`, `socket`, `template`)
//!   are denied.
//!
//! Volume XML may give a name, a capacity, an allocation and the target's format; no path,
//! permissions or encryption. A qcow2 volume may name a backing store (copy-on-write), but only
//! as a volume of a pool by name, `<backingStore><source pool='…' volume='…'/></backingStore>`:
//! the host checks that the pool is granted on the connection, looks the volume up, and writes
//! its path and format itself. A path the guest gives is denied: it could name any host file,
//! which qemu would then read. Metadata is one well-formed element. All three are parsed without
//! DTDs (no entity expansion), within the byte bounds checked before parsing.

use std::collections::BTreeSet;

use roxmltree::{Document, Node};

use crate::bindings::egress::libvirt::libvirt::Error;

/// What a domain definition may use: the grant's connection, and the provider's namespace.
pub(crate) struct DomainScope<'a> {
    pub(crate) pools: &'a BTreeSet<String>,
    pub(crate) networks: &'a BTreeSet<String>,
    pub(crate) bridges: &'a BTreeSet<String>,
    pub(crate) namespace: &'a str,
}

const DOMAIN_CHILDREN: &[&str] = &[
    "name",
    "uuid",
    "genid",
    "title",
    "description",
    "metadata",
    "memory",
    "currentMemory",
    "maxMemory",
    "memtune",
    "memoryBacking",
    "vcpu",
    "vcpus",
    "iothreads",
    "cputune",
    "numatune",
    "cpu",
    "os",
    "features",
    "clock",
    "on_poweroff",
    "on_reboot",
    "on_crash",
    "on_lockfailure",
    "pm",
    "sysinfo",
    "devices",
];

const OS_CHILDREN: &[&str] = &[
    "type", "boot", "bootmenu", "smbios", "bios", "firmware", "loader", "nvram",
];

const DEVICES: &[&str] = &[
    "disk",
    "interface",
    "controller",
    "input",
    "graphics",
    "video",
    "audio",
    "sound",
    "console",
    "serial",
    "channel",
    "rng",
    "tpm",
    "memballoon",
    "watchdog",
    "panic",
    "vsock",
    "iommu",
];

const DISK_CHILDREN: &[&str] = &[
    "driver",
    "source",
    "target",
    "readonly",
    "shareable",
    "transient",
    "boot",
    "address",
    "serial",
    "wwn",
    "vendor",
    "product",
    "iotune",
    "alias",
    "blockio",
    "geometry",
    "backingStore",
];

const INTERFACE_CHILDREN: &[&str] = &[
    "source",
    "mac",
    "model",
    "driver",
    "address",
    "boot",
    "link",
    "mtu",
    "alias",
    "virtualport",
    "vlan",
    "filterref",
    "bandwidth",
    "coalesce",
    "tune",
    "guest",
    "rom",
    "acpi",
    "port",
];

/// Attributes that name a host path, wherever they appear.
const PATH_ATTRIBUTES: &[&str] = &["file", "path", "dir", "socket", "template"];

const RNG_SOURCES: &[&str] = &["/dev/urandom", "/dev/random", "/dev/hwrng"];

const VOLUME_CHILDREN: &[&str] = &["name", "capacity", "allocation", "target", "backingStore"];
const VOLUME_TARGET_CHILDREN: &[&str] = &["format", "compat", "features", "nocow", "clusterSize"];

fn parse<'x>(what: &str, xml: &'x str) -> Result<Document<'x>, Error> {
    // roxmltree refuses a DTD by default: no entities to expand.
    Document::parse(xml)
        .map_err(|error| Error::Invalid(format!("{what} is not well-formed XML: {error}")))
}

fn deny(reason: String) -> Error {
    crate::error::denied(reason)
}

fn elements<'a, 'input>(node: Node<'a, 'input>) -> impl Iterator<Item = Node<'a, 'input>> {
    node.children().filter(Node::is_element)
}

fn allow_children(node: Node<'_, '_>, allowed: &[&str]) -> Result<(), Error> {
    for child in elements(node) {
        let name = child.tag_name().name();
        if child.tag_name().namespace().is_some() || !allowed.contains(&name) {
            return Err(deny(format!(
                "<{}> may not contain <{name}>",
                node.tag_name().name()
            )));
        }
    }
    Ok(())
}

fn child<'a, 'input>(node: Node<'a, 'input>, name: &str) -> Option<Node<'a, 'input>> {
    elements(node).find(|child| child.has_tag_name(name))
}

/// Checks domain XML against the policy (module docs).
pub(crate) fn check_domain(xml: &str, scope: &DomainScope<'_>) -> Result<(), Error> {
    let document = parse("domain XML", xml)?;
    let domain = document.root_element();
    if !domain.has_tag_name("domain") || domain.tag_name().namespace().is_some() {
        return Err(Error::Invalid(
            "domain XML must be a <domain> element".into(),
        ));
    }
    allow_children(domain, DOMAIN_CHILDREN)?;
    let metadata = child(domain, "metadata");
    for node in domain.descendants().filter(Node::is_element) {
        if metadata
            .is_some_and(|metadata| node != metadata && node.ancestors().any(|up| up == metadata))
        {
            continue;
        }
        if let Some(namespace) = node.tag_name().namespace() {
            return Err(deny(format!(
                "<{}> in namespace {namespace} is outside the policy",
                node.tag_name().name()
            )));
        }
        if let Some(attribute) = node
            .attributes()
            .find(|attribute| PATH_ATTRIBUTES.contains(&attribute.name()))
        {
            return Err(deny(format!(
                "<{} {}=…> names a host path",
                node.tag_name().name(),
                attribute.name()
            )));
        }
    }
    if let Some(metadata) = metadata {
        for element in elements(metadata) {
            if element.tag_name().namespace() != Some(scope.namespace) {
                return Err(deny(format!(
                    "metadata <{}> is outside the provider's namespace {}",
                    element.tag_name().name(),
                    scope.namespace
                )));
            }
        }
    }
    if let Some(os) = child(domain, "os") {
        allow_children(os, OS_CHILDREN)?;
        for firmware_file in
            elements(os).filter(|node| node.has_tag_name("loader") || node.has_tag_name("nvram"))
        {
            let has_text = firmware_file
                .text()
                .is_some_and(|text| !text.trim().is_empty());
            if has_text || elements(firmware_file).next().is_some() {
                return Err(deny(format!(
                    "<{}> may not name a file; use <os firmware='efi'>",
                    firmware_file.tag_name().name()
                )));
            }
        }
    }
    if let Some(devices) = child(domain, "devices") {
        allow_children(devices, DEVICES)?;
        for device in elements(devices) {
            check_device(device, scope)?;
        }
    }
    Ok(())
}

fn check_device(device: Node<'_, '_>, scope: &DomainScope<'_>) -> Result<(), Error> {
    let kind = device.attribute("type").unwrap_or_default();
    match device.tag_name().name() {
        "disk" => {
            allow_children(device, DISK_CHILDREN)?;
            let source = child(device, "source");
            match kind {
                "volume" => {
                    let pool = source
                        .and_then(|source| source.attribute("pool"))
                        .unwrap_or_default();
                    if !scope.pools.contains(pool) {
                        return Err(deny(format!("disk in pool {pool:?}, which is not granted")));
                    }
                }
                "file" if source.is_none() => {}
                _ => {
                    return Err(deny(format!(
                        "disk of type {kind:?}: only volumes of granted pools, or an empty CD-ROM"
                    )));
                }
            }
            if source.is_some_and(|source| elements(source).next().is_some()) {
                return Err(deny("disk <source> may not have children".into()));
            }
            if let Some(backing) = child(device, "backingStore")
                && (backing.has_children() || backing.attributes().len() > 0)
            {
                return Err(deny("a disk's backingStore must be empty".into()));
            }
        }
        "interface" => {
            allow_children(device, INTERFACE_CHILDREN)?;
            let source = child(device, "source");
            let (granted, attribute) = match kind {
                "network" => (scope.networks, "network"),
                "bridge" => (scope.bridges, "bridge"),
                _ => {
                    return Err(deny(format!(
                        "interface of type {kind:?}: only granted networks and bridges"
                    )));
                }
            };
            let target = source
                .and_then(|source| source.attribute(attribute))
                .unwrap_or_default();
            if !granted.contains(target) {
                return Err(deny(format!("{attribute} {target:?} is not granted")));
            }
            if source.is_some_and(|source| elements(source).next().is_some()) {
                return Err(deny("interface <source> may not have children".into()));
            }
        }
        "console" | "serial" => {
            if kind != "pty" {
                return Err(deny(format!(
                    "{} of type {kind:?}: only pty",
                    device.tag_name().name()
                )));
            }
            no_source(device)?;
        }
        "channel" => match kind {
            "pty" | "spicevmc" => no_source(device)?,
            // libvirt places the socket itself when the source names no path.
            "unix" => {}
            _ => return Err(deny(format!("channel of type {kind:?}"))),
        },
        "tpm" => {
            let backend = child(device, "backend").and_then(|backend| backend.attribute("type"));
            if backend != Some("emulator") {
                return Err(deny("a TPM must be emulated".into()));
            }
        }
        "rng" => {
            let backend = child(device, "backend");
            let model = backend.and_then(|backend| backend.attribute("model"));
            let text = backend
                .and_then(|backend| backend.text())
                .unwrap_or_default()
                .trim();
            let allowed = match model {
                Some("builtin") => true,
                Some("random") => text.is_empty() || RNG_SOURCES.contains(&text),
                _ => false,
            };
            if !allowed {
                return Err(deny("an RNG reads the host's random devices only".into()));
            }
        }
        "input" if !matches!(kind, "mouse" | "keyboard" | "tablet") => {
            return Err(deny(format!("input of type {kind:?}")));
        }
        _ => {}
    }
    Ok(())
}

fn no_source(device: Node<'_, '_>) -> Result<(), Error> {
    if child(device, "source").is_some() {
        return Err(deny(format!(
            "<{}> may not have a source",
            device.tag_name().name()
        )));
    }
    Ok(())
}

/// Volume XML that passed the policy.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct VolumeRequest {
    /// The volume's name.
    pub(crate) name: String,
    /// The volume it is to be backed by, if any.
    pub(crate) backing: Option<Backing>,
}

/// A backing store as the guest names it: a volume of a pool, by name.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Backing {
    pub(crate) pool: String,
    pub(crate) volume: String,
    /// Where the `<backingStore>` element is in the XML, for [`with_backing_path`].
    range: std::ops::Range<usize>,
}

/// Checks volume XML against the policy (module docs).
pub(crate) fn check_volume(xml: &str) -> Result<VolumeRequest, Error> {
    let document = parse("volume XML", xml)?;
    let volume = document.root_element();
    if !volume.has_tag_name("volume") || volume.tag_name().namespace().is_some() {
        return Err(Error::Invalid(
            "volume XML must be a <volume> element".into(),
        ));
    }
    if volume.attribute("type").is_some_and(|kind| kind != "file") {
        return Err(deny("a volume is a file".into()));
    }
    allow_children(volume, VOLUME_CHILDREN)?;
    let target = child(volume, "target");
    if let Some(target) = target {
        allow_children(target, VOLUME_TARGET_CHILDREN)?;
    }
    let name = child(volume, "name")
        .and_then(|name| name.text())
        .unwrap_or_default()
        .trim();
    crate::call::name("volume name", name)?;
    let mut stores = elements(volume).filter(|node| node.has_tag_name("backingStore"));
    let backing = stores.next().map(backing).transpose()?;
    if stores.next().is_some() {
        return Err(deny("a volume has one backing store at most".into()));
    }
    if backing.is_some() {
        let format = target
            .and_then(|target| child(target, "format"))
            .and_then(|format| format.attribute("type"));
        if format != Some("qcow2") {
            return Err(deny(
                "a volume with a backing store is qcow2 (<target><format type='qcow2'/>)".into(),
            ));
        }
    }
    Ok(VolumeRequest {
        name: name.to_owned(),
        backing,
    })
}

/// A `<backingStore>` that names a volume of a pool: `<source pool='…' volume='…'/>` and nothing
/// else, so no path the guest wrote reaches libvirt.
fn backing(store: Node<'_, '_>) -> Result<Backing, Error> {
    let refused = |what: String| {
        deny(format!(
            "a backing store names a volume of a granted pool as <source pool='…' volume='…'/>, not {what}"
        ))
    };
    if let Some(attribute) = store.attributes().next() {
        return Err(refused(format!("an attribute {}", attribute.name())));
    }
    if let Some(text) = store
        .children()
        .filter_map(|node| node.is_text().then(|| node.text()).flatten())
        .find(|text| !text.trim().is_empty())
    {
        return Err(refused(format!("text {:?}", text.trim())));
    }
    let mut children = elements(store);
    let (Some(source), None) = (children.next(), children.next()) else {
        let names: Vec<_> = elements(store)
            .map(|node| format!("<{}>", node.tag_name().name()))
            .collect();
        return Err(refused(if names.is_empty() {
            "nothing".into()
        } else {
            names.join(", ")
        }));
    };
    if !source.has_tag_name("source") || source.tag_name().namespace().is_some() {
        return Err(refused(format!("<{}>", source.tag_name().name())));
    }
    if source.has_children() {
        return Err(refused("a <source> with content".into()));
    }
    if let Some(other) = source
        .attributes()
        .find(|attribute| !matches!(attribute.name(), "pool" | "volume"))
    {
        return Err(refused(format!("a source attribute {}", other.name())));
    }
    let (Some(pool), Some(volume)) = (source.attribute("pool"), source.attribute("volume")) else {
        return Err(refused("a source without both pool and volume".into()));
    };
    crate::call::name("backing pool name", pool)?;
    crate::call::name("backing volume name", volume)?;
    Ok(Backing {
        pool: pool.to_owned(),
        volume: volume.to_owned(),
        range: store.range(),
    })
}

/// `xml` with the backing store `backing` names replaced by the volume the host resolved: its
/// `path` and `format`, as libvirt reads them.
pub(crate) fn with_backing_path(xml: &str, backing: &Backing, path: &str, format: &str) -> String {
    format!(
        "{}<backingStore><path>{}</path><format type='{}'/></backingStore>{}",
        &xml[..backing.range.start],
        crate::import::escape(path),
        crate::import::escape(format),
        &xml[backing.range.end..]
    )
}

/// The capacity volume XML asks for, in bytes (libvirt's units; bytes when none is given).
pub(crate) fn capacity_bytes(xml: &str) -> Option<u64> {
    let document = roxmltree::Document::parse(xml).ok()?;
    let capacity = child(document.root_element(), "capacity")?;
    let value: u64 = capacity.text()?.trim().parse().ok()?;
    let unit = capacity.attribute("unit").unwrap_or("bytes");
    let scale: u64 = match unit {
        "b" | "bytes" => 1,
        "KB" => 1_000,
        "k" | "K" | "KiB" => 1 << 10,
        "MB" => 1_000_000,
        "m" | "M" | "MiB" => 1 << 20,
        "GB" => 1_000_000_000,
        "g" | "G" | "GiB" => 1 << 30,
        "TB" => 1_000_000_000_000,
        "t" | "T" | "TiB" => 1 << 40,
        _ => return None,
    };
    value.checked_mul(scale)
}

/// Checks a metadata element: one well-formed element.
pub(crate) fn check_metadata(xml: &str) -> Result<(), Error> {
    let document = parse("metadata", xml)?;
    if document.root_element().tag_name().name().is_empty() {
        return Err(Error::Invalid("metadata must be one XML element".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: &str = "https://egress-operator.io/owner/egress-operator";

    fn check(xml: &str) -> Result<(), Error> {
        let pools = BTreeSet::from(["images".to_owned()]);
        let networks = BTreeSet::from(["default".to_owned()]);
        let bridges = BTreeSet::from(["br0".to_owned()]);
        check_domain(
            xml,
            &DomainScope {
                pools: &pools,
                networks: &networks,
                bridges: &bridges,
                namespace: NS,
            },
        )
    }

    fn domain(devices: &str) -> String {
        format!(
            r#"<domain type='kvm'>
  <name>proxy-a</name>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <metadata><egress:proxy xmlns:egress="{NS}" uid="u1"/></metadata>
  <os firmware='efi'><type arch='x86_64' machine='q35'>hvm</type><loader secure='no'/><boot dev='hd'/></os>
  <features><acpi/><apic/></features>
  <cpu mode='host-passthrough'/>
  <devices>{devices}</devices>
</domain>"#
        )
    }

    const PRODUCTION_DEVICES: &str = r#"
    <disk type='volume' device='disk'><driver name='qemu' type='qcow2'/><source pool='images' volume='proxy-a.qcow2'/><target dev='vda' bus='virtio'/></disk>
    <disk type='volume' device='cdrom'><driver name='qemu' type='raw'/><source pool='images' volume='proxy-a-seed.iso'/><target dev='sda' bus='sata'/><readonly/></disk>
    <disk type='file' device='cdrom'><target dev='sdb' bus='sata'/><readonly/></disk>
    <interface type='network'><source network='default'/><model type='virtio'/><mac address='52:54:00:12:34:56'/></interface>
    <interface type='bridge'><source bridge='br0'/><model type='virtio'/></interface>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
    <serial type='pty'><target port='0'/></serial>
    <console type='pty'><target type='serial' port='0'/></console>
    <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>
    <tpm model='tpm-crb'><backend type='emulator' version='2.0'/></tpm>
    <controller type='usb' model='qemu-xhci'/>
    <input type='tablet' bus='usb'/>
    <graphics type='vnc' port='-1' autoport='yes' listen='127.0.0.1'/>
    <video><model type='virtio'/></video>
    <memballoon model='virtio'/>"#;

    #[test]
    fn capacities_are_read_in_libvirts_units() {
        let xml = |capacity: &str| format!("<volume><name>v</name>{capacity}</volume>");
        assert_eq!(capacity_bytes(&xml("<capacity>512</capacity>")), Some(512));
        assert_eq!(
            capacity_bytes(&xml("<capacity unit='GiB'>10</capacity>")),
            Some(10 << 30)
        );
        assert_eq!(
            capacity_bytes(&xml("<capacity unit='bytes'>7</capacity>")),
            Some(7)
        );
        assert_eq!(
            capacity_bytes(&xml("<capacity unit='MB'>2</capacity>")),
            Some(2_000_000)
        );
        assert_eq!(
            capacity_bytes(&xml("<capacity unit='parsec'>1</capacity>")),
            None
        );
        assert_eq!(capacity_bytes(&xml("")), None);
    }

    #[test]
    fn a_production_domain_passes() {
        check(&domain(PRODUCTION_DEVICES)).unwrap();
    }

    #[test]
    fn each_way_around_the_grant_is_denied() {
        let cases = [
            // qemu arguments
            domain("").replace(
                "</domain>",
                "<qemu:commandline xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'><qemu:arg value='-x'/></qemu:commandline></domain>",
            ),
            domain("<emulator>/tmp/evil</emulator>"),
            domain("<disk type='file' device='disk'><source file='/etc/shadow'/><target dev='vda'/></disk>"),
            domain("<disk type='block' device='disk'><source dev='/dev/sda'/><target dev='vda'/></disk>"),
            domain("<disk type='network' device='disk'><source protocol='http' name='x'><host name='h'/></source><target dev='vda'/></disk>"),
            domain("<disk type='volume' device='disk'><source pool='other' volume='v'/><target dev='vda'/></disk>"),
            domain("<disk type='volume' device='disk'><source pool='images' volume='v'/><backingStore type='file'><source file='/etc/shadow'/></backingStore><target dev='vda'/></disk>"),
            domain("<interface type='network'><source network='isolated'/></interface>"),
            domain("<interface type='bridge'><source bridge='br1'/></interface>"),
            domain("<interface type='direct'><source dev='eth0' mode='bridge'/></interface>"),
            domain("<interface type='ethernet'><script path='/tmp/x'/></interface>"),
            domain("<interface type='network'><source network='default'/><script path='/tmp/x'/></interface>"),
            domain("<interface type='network'><source network='default'/><rom file='/etc/shadow'/></interface>"),
            domain("<hostdev mode='subsystem' type='pci'/>"),
            domain("<filesystem type='mount'><source dir='/'/><target dir='root'/></filesystem>"),
            domain("<serial type='file'><source path='/etc/cron.d/x'/></serial>"),
            domain("<serial type='tcp'><source mode='bind' host='0.0.0.0' service='2445'/></serial>"),
            domain("<channel type='unix'><source mode='bind' path='/etc/x'/><target type='virtio' name='a'/></channel>"),
            domain("<rng model='virtio'><backend model='random'>/dev/sda</backend></rng>"),
            domain("<rng model='virtio'><backend model='egd' type='tcp'/></rng>"),
            domain("<tpm model='tpm-tis'><backend type='passthrough'/></tpm>"),
            domain("<input type='passthrough' bus='virtio'><source evdev='/dev/input/event1'/></input>"),
            domain("").replace("<vcpu>1</vcpu>", "<vcpu>1</vcpu><seclabel type='none'/>"),
            domain("").replace("<loader secure='no'/>", "<loader>/tmp/evil.fd</loader>"),
            domain("").replace("<boot dev='hd'/>", "<kernel>/boot/vmlinuz</kernel>"),
            domain("").replace("uid=\"u1\"/>", "uid=\"u1\"/><o:proxy xmlns:o='https://egress-operator.io/owner/other'/>"),
        ];
        for xml in cases {
            assert!(matches!(check(&xml), Err(Error::Denied(_))), "{xml}");
        }
    }

    /// A backing store is a granted pool's volume by name, resolved by the host: never a path,
    /// and each way of slipping one in is denied with what it named.
    #[test]
    fn a_backing_store_names_a_pools_volume_and_nothing_else() {
        let volume = |store: &str| {
            format!(
                "<volume><name>proxy-a.qcow2</name><capacity unit='bytes'>1073741824</capacity><target><format type='qcow2'/></target>{store}</volume>"
            )
        };
        let xml = volume(
            "<backingStore><source pool='images' volume='egress-base-1.qcow2'/></backingStore>",
        );
        let checked = check_volume(&xml).unwrap();
        let backing = checked.backing.expect("a backing store");
        assert_eq!(
            (backing.pool.as_str(), backing.volume.as_str()),
            ("images", "egress-base-1.qcow2")
        );
        assert_eq!(
            with_backing_path(
                &xml,
                &backing,
                "/var/lib/images/egress-base-1.qcow2",
                "qcow2"
            ),
            volume(
                "<backingStore><path>/var/lib/images/egress-base-1.qcow2</path><format type='qcow2'/></backingStore>"
            )
        );
        let denied = [
            (
                "<backingStore><path>/etc/shadow</path></backingStore>",
                "not <path>",
            ),
            (
                "<backingStore><path>/etc/shadow</path><source pool='images' volume='b'/></backingStore>",
                "<path>, <source>",
            ),
            (
                "<backingStore><source pool='images' volume='b'/><format type='raw'/></backingStore>",
                "<source>, <format>",
            ),
            (
                "<backingStore>/etc/shadow</backingStore>",
                "text \"/etc/shadow\"",
            ),
            (
                "<backingStore type='file'><source pool='images' volume='b'/></backingStore>",
                "an attribute type",
            ),
            (
                "<backingStore><source file='/etc/shadow'/></backingStore>",
                "a source attribute file",
            ),
            (
                "<backingStore><source pool='images' volume='b' file='/x'/></backingStore>",
                "a source attribute file",
            ),
            (
                "<backingStore><source pool='images'/></backingStore>",
                "without both pool and volume",
            ),
            (
                "<backingStore><source pool='images' volume='b'><path>/x</path></source></backingStore>",
                "content",
            ),
            ("<backingStore/>", "not nothing"),
            (
                "<backingStore><source pool='images' volume='b'/></backingStore><backingStore><source pool='images' volume='c'/></backingStore>",
                "one backing store at most",
            ),
        ];
        for (store, says) in denied {
            match check_volume(&volume(store)) {
                Err(Error::Denied(reason)) => assert!(reason.contains(says), "{store}: {reason}"),
                other => panic!("{store}: {other:?}"),
            }
        }
        let raw = xml.replace("type='qcow2'", "type='raw'");
        assert!(
            matches!(check_volume(&raw), Err(Error::Denied(reason)) if reason.contains("is qcow2"))
        );
        let climbing =
            volume("<backingStore><source pool='images' volume='../etc'/></backingStore>");
        assert!(matches!(check_volume(&climbing), Err(Error::Invalid(_))));
    }

    #[test]
    fn malformed_xml_and_dtds_are_invalid() {
        let billion_laughs =
            r#"<!DOCTYPE d [<!ENTITY a "aaaa">]><domain><name>&a;</name></domain>"#;
        assert!(matches!(check(billion_laughs), Err(Error::Invalid(_))));
        assert!(matches!(check("<domain>"), Err(Error::Invalid(_))));
        assert!(matches!(check("<volume/>"), Err(Error::Invalid(_))));
        assert!(matches!(check_metadata("<a/><b/>"), Err(Error::Invalid(_))));
        check_metadata("<proxy uid='x'/>").unwrap();
    }

    #[test]
    fn volumes_give_a_name_size_and_format_only() {
        let checked = check_volume(
            "<volume><name>proxy-a.qcow2</name><capacity unit='GiB'>10</capacity><target><format type='qcow2'/></target></volume>",
        )
        .unwrap();
        assert_eq!(checked.name, "proxy-a.qcow2");
        assert_eq!(checked.backing, None);
        for xml in [
            "<volume><name>v</name><capacity>1</capacity><target><path>/etc/shadow</path></target></volume>",
            "<volume><name>v</name><capacity>1</capacity><target><permissions><mode>4755</mode></permissions></target></volume>",
            "<volume type='dir'><name>v</name><capacity>1</capacity></volume>",
        ] {
            assert!(matches!(check_volume(xml), Err(Error::Denied(_))), "{xml}");
        }
        assert!(matches!(
            check_volume("<volume><name>../x</name><capacity>1</capacity></volume>"),
            Err(Error::Invalid(_))
        ));
    }
}
