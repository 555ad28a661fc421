//! Volume names and volume XML: pure, table-tested.
//!
//! Names are derived, never stored: the base image's from its checksum (so it is imported once
//! and shared by every VM), a VM's disk and seed from the VM's name (so a retried create finds
//! what a cut attempt made, and a delete finds them after the domain is gone). A disk that is not
//! whole yet has a temporary name of its own ([`creating_volume_name`]), as an import has
//! `<name>.importing`: the disk's own name stands only for a finished disk.

use crate::config::VolumeFormat;
use crate::domain_xml::escape;

/// How every base volume's name begins: the host prunes the volumes so named that no VM uses.
pub const BASE_PREFIX: &str = "egress-base-";

/// The shared base volume of the image with this sha256.
pub fn base_volume_name(sha256: &str, format: VolumeFormat) -> String {
    let short = sha256.get(..16).unwrap_or(sha256);
    format!("{BASE_PREFIX}{short}.{}", format.as_str())
}

/// The VM's own disk, made from the base (backed by it, or a whole copy).
pub fn disk_volume_name(vm: &str, format: VolumeFormat) -> String {
    format!("{vm}.{}", format.as_str())
}

/// The VM's NoCloud seed ISO.
pub fn seed_volume_name(vm: &str) -> String {
    format!("{vm}-seed.iso")
}

/// What a disk is called until it is whole.
pub fn creating_volume_name(disk: &str) -> String {
    format!("{disk}.creating")
}

/// Every volume a VM of this name may have, in the order delete removes them: its disk in
/// either format (the config may have changed since create), either disk's temporary name, and
/// its seed.
pub fn vm_volume_names(vm: &str) -> [String; 5] {
    let [qcow2, raw] = [VolumeFormat::Qcow2, VolumeFormat::Raw].map(|f| disk_volume_name(vm, f));
    [
        creating_volume_name(&qcow2),
        creating_volume_name(&raw),
        qcow2,
        raw,
        seed_volume_name(vm),
    ]
}

/// XML for a volume `name` of `capacity` bytes in `format`: the seed, and a whole copy's disk
/// (a copy of a sparse base stays sparse).
pub fn volume_xml(name: &str, capacity: u64, format: VolumeFormat) -> String {
    format!(
        "<volume><name>{}</name><capacity unit='bytes'>{capacity}</capacity><target><format type='{}'/></target></volume>",
        escape(name),
        format.as_str()
    )
}

/// XML for a qcow2 volume `name` of `capacity` bytes backed by volume `base` of pool `pool`
/// (copy-on-write): the host resolves the base by name and writes its path and format. It
/// allocates nothing up front (libvirt would otherwise count the whole capacity against the
/// pool).
pub fn overlay_xml(name: &str, capacity: u64, pool: &str, base: &str) -> String {
    format!(
        "<volume><name>{}</name><capacity unit='bytes'>{capacity}</capacity><allocation unit='bytes'>0</allocation><target><format type='qcow2'/></target><backingStore><source pool='{}' volume='{}'/></backingStore></volume>",
        escape(name),
        escape(pool),
        escape(base)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_derived_from_the_checksum_and_the_vm() {
        let sha = "0123456789abcdef".repeat(4);
        let table = [
            (
                base_volume_name(&sha, VolumeFormat::Qcow2),
                "egress-base-0123456789abcdef.qcow2",
            ),
            (
                base_volume_name(&sha, VolumeFormat::Raw),
                "egress-base-0123456789abcdef.raw",
            ),
            (
                disk_volume_name("proxy-a", VolumeFormat::Qcow2),
                "proxy-a.qcow2",
            ),
            (
                disk_volume_name("proxy-a", VolumeFormat::Raw),
                "proxy-a.raw",
            ),
            (seed_volume_name("proxy-a"), "proxy-a-seed.iso"),
            (
                creating_volume_name("proxy-a.qcow2"),
                "proxy-a.qcow2.creating",
            ),
        ];
        for (got, want) in table {
            assert_eq!(got, want);
        }
        assert_eq!(
            vm_volume_names("proxy-a"),
            [
                "proxy-a.qcow2.creating",
                "proxy-a.raw.creating",
                "proxy-a.qcow2",
                "proxy-a.raw",
                "proxy-a-seed.iso"
            ]
        );
    }

    #[test]
    fn an_overlay_names_its_base_by_pool_and_volume() {
        let xml = overlay_xml(
            "proxy-a.qcow2",
            1 << 30,
            "images&co",
            "egress-base-0123.raw",
        );
        assert_eq!(
            xml,
            "<volume><name>proxy-a.qcow2</name><capacity unit='bytes'>1073741824</capacity><allocation unit='bytes'>0</allocation><target><format type='qcow2'/></target><backingStore><source pool='images&amp;co' volume='egress-base-0123.raw'/></backingStore></volume>"
        );
        roxmltree::Document::parse(&xml).expect("well-formed");
    }

    #[test]
    fn volume_xml_carries_name_capacity_and_format_escaped() {
        let table = [
            (
                volume_xml("proxy-a.qcow2", 10 << 30, VolumeFormat::Qcow2),
                "<volume><name>proxy-a.qcow2</name><capacity unit='bytes'>10737418240</capacity><target><format type='qcow2'/></target></volume>",
            ),
            (
                volume_xml("a<b>&'\".raw", 1, VolumeFormat::Raw),
                "<volume><name>a&lt;b&gt;&amp;&apos;&quot;.raw</name><capacity unit='bytes'>1</capacity><target><format type='raw'/></target></volume>",
            ),
        ];
        for (got, want) in table {
            assert_eq!(got, want);
            roxmltree::Document::parse(&got).expect("well-formed");
        }
    }
}
