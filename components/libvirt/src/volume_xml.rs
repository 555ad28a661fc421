//! Volume names and volume XML: pure, table-tested.
//!
//! Names are derived, never stored: the base image's from its checksum (so it is imported once
//! and shared by every VM), a VM's disk and seed from the VM's name (so a retried create finds
//! what a cut attempt made, and a delete finds them after the domain is gone).

use crate::config::VolumeFormat;
use crate::domain_xml::escape;

/// The shared base volume of the image with this sha256.
pub fn base_volume_name(sha256: &str, format: VolumeFormat) -> String {
    let short = sha256.get(..16).unwrap_or(sha256);
    format!("egress-base-{short}.{}", format.as_str())
}

/// The VM's own disk, cloned from the base.
pub fn disk_volume_name(vm: &str, format: VolumeFormat) -> String {
    format!("{vm}.{}", format.as_str())
}

/// The VM's NoCloud seed ISO.
pub fn seed_volume_name(vm: &str) -> String {
    format!("{vm}-seed.iso")
}

/// XML for a volume `name` of `capacity` bytes in `format`, fully allocated up front only for the
/// seed (a clone of a sparse base stays sparse).
pub fn volume_xml(name: &str, capacity: u64, format: VolumeFormat) -> String {
    format!(
        "<volume><name>{}</name><capacity unit='bytes'>{capacity}</capacity><target><format type='{}'/></target></volume>",
        escape(name),
        format.as_str()
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
        ];
        for (got, want) in table {
            assert_eq!(got, want);
        }
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
