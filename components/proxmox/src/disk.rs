//! The boot disk and its size: which drive `diskGiB` grows, and whether it must grow.

use crate::api::VmConfig;

const GIB: u64 = 1 << 30;

/// Whether `key` names a drive slot (`ide0`, `sata1`, `scsi0`, `virtio3`, `efidisk0`/`tpmstate0`
/// are not boot disks and do not count).
pub fn is_drive_slot(key: &str) -> bool {
    ["ide", "sata", "scsi", "virtio"].iter().any(|bus| {
        key.strip_prefix(bus)
            .is_some_and(|index| !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// The storages of a VM's disks (CD-ROMs left out), which a full clone copies: Proxmox checks
/// `Datastore.AllocateSpace` on each, or on the clone's `storage=` when given (F17).
pub fn disk_storages(config: &VmConfig) -> Vec<&str> {
    let mut storages: Vec<&str> = config
        .iter()
        .filter(|(key, value)| {
            (is_drive_slot(key) || matches!(key.as_str(), "efidisk0" | "tpmstate0"))
                && !is_cdrom(value)
        })
        .filter_map(|(_, value)| value.split(',').next()?.split_once(':'))
        .map(|(storage, _)| storage)
        .collect();
    storages.sort_unstable();
    storages.dedup();
    storages
}

/// Whether a drive value is a CD-ROM (`media=cdrom`) or the `none` placeholder.
fn is_cdrom(value: &str) -> bool {
    value.split(',').any(|option| option == "media=cdrom")
        || value.split(',').next() == Some("none")
}

/// The boot disk: the first drive in `boot: order=…` that exists and is not a CD-ROM, skipping
/// `ide2`, which Proxmox appends to the order once the seed is attached (correction 8, F19). The
/// legacy `bootdisk` key is the fallback.
pub fn boot_disk(config: &VmConfig) -> Option<String> {
    let usable = |slot: &str| {
        slot != "ide2"
            && is_drive_slot(slot)
            && config.get(slot).is_some_and(|value| !is_cdrom(value))
    };
    if let Some(order) = config
        .get("boot")
        .and_then(|boot| boot.split(',').find_map(|part| part.strip_prefix("order=")))
        && let Some(slot) = order.split(';').find(|slot| usable(slot))
    {
        return Some(slot.to_string());
    }
    config.get("bootdisk").filter(|slot| usable(slot)).cloned()
}

/// Bytes of a Proxmox size (`32G`, `3584M`, `512K`, `1T`, plain bytes, with an optional fraction).
pub fn parse_size(text: &str) -> Option<u64> {
    let (number, unit) = match text.as_bytes().last()? {
        b'K' | b'k' => (&text[..text.len() - 1], 1u64 << 10),
        b'M' | b'm' => (&text[..text.len() - 1], 1 << 20),
        b'G' | b'g' => (&text[..text.len() - 1], 1 << 30),
        b'T' | b't' => (&text[..text.len() - 1], 1 << 40),
        _ => (text, 1),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let mut bytes = whole.parse::<u64>().ok()?.checked_mul(unit)?;
    if !fraction.is_empty() {
        let digits = fraction.len().min(9) as u32;
        let numerator: u64 = fraction[..digits as usize].parse().ok()?;
        bytes = bytes.checked_add(numerator.checked_mul(unit)? / 10u64.pow(digits))?;
    }
    Some(bytes)
}

/// The `size=` of a drive value, in bytes.
pub fn drive_size(value: &str) -> Option<u64> {
    value
        .split(',')
        .find_map(|option| option.strip_prefix("size="))
        .and_then(parse_size)
}

/// Why the template cannot take `diskGiB`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiskProblem {
    NoBootDisk,
    UnknownSize(String),
}

/// The resize to make for `disk_gib`: `Some((disk, "<n>G"))` only when the boot disk is smaller
/// (F20: equal is a no-op, smaller would fail in the task; correction 4).
pub fn resize_target(
    config: &VmConfig,
    disk_gib: Option<u32>,
) -> Result<Option<(String, String)>, DiskProblem> {
    let Some(gib) = disk_gib else { return Ok(None) };
    let disk = boot_disk(config).ok_or(DiskProblem::NoBootDisk)?;
    let current = config
        .get(&disk)
        .and_then(|value| drive_size(value))
        .ok_or_else(|| DiskProblem::UnknownSize(disk.clone()))?;
    Ok((u64::from(gib) * GIB > current).then(|| (disk, format!("{gib}G"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> VmConfig {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn correction8_f19_boot_disk_table() {
        let scsi0 = ("scsi0", "local-lvm:vm-9001-disk-0,size=3G");
        let seed = ("ide2", "proxy-seeds:iso/p-seed.iso,media=cdrom");
        let rows = [
            (config(&[("boot", "order=scsi0"), scsi0]), Some("scsi0")),
            (
                config(&[("boot", "order=scsi0;ide2"), scsi0, seed]),
                Some("scsi0"),
            ),
            (
                config(&[("boot", "order=ide2;scsi0;net0"), scsi0, seed]),
                Some("scsi0"),
            ),
            // A CD-ROM first in the order is not a boot disk.
            (
                config(&[
                    ("boot", "order=ide0;virtio0"),
                    ("ide0", "local:iso/x.iso,media=cdrom"),
                    ("virtio0", "l:vm-1-disk-0,size=8G"),
                ]),
                Some("virtio0"),
            ),
            // ide2 is the seed's slot: never the boot disk, even when it holds a disk.
            (
                config(&[
                    ("boot", "order=ide2;scsi0"),
                    scsi0,
                    ("ide2", "local-lvm:vm-1-disk-1,size=4G"),
                ]),
                Some("scsi0"),
            ),
            (config(&[("boot", "order=net0")]), None),
            (config(&[("boot", "order=scsi1"), scsi0]), None),
            (
                config(&[("boot", "cdn"), ("bootdisk", "scsi0"), scsi0]),
                Some("scsi0"),
            ),
            (config(&[("bootdisk", "ide2"), seed]), None),
            (config(&[scsi0]), None),
        ];
        for (config, expected) in rows {
            assert_eq!(boot_disk(&config).as_deref(), expected, "{config:?}");
        }
    }

    #[test]
    fn f17_disk_storages_leave_out_cdroms() {
        let vm = config(&[
            ("scsi0", "local-lvm:base-9001-disk-0,size=3G"),
            ("efidisk0", "fast:base-9001-disk-1,size=4M"),
            ("scsi1", "local-lvm:base-9001-disk-2,size=1G"),
            ("ide2", "local:iso/debian.iso,media=cdrom"),
            ("ide0", "none,media=cdrom"),
            ("net0", "virtio=BC:24:11:00:00:01,bridge=vmbr0"),
        ]);
        assert_eq!(disk_storages(&vm), ["fast", "local-lvm"]);
    }

    #[test]
    fn size_parsing_table() {
        let rows = [
            ("32G", Some(32 * GIB)),
            ("3584M", Some(3584 << 20)),
            ("512K", Some(512 << 10)),
            ("1T", Some(1 << 40)),
            ("10737418240", Some(10 * GIB)),
            ("1.5G", Some(GIB + GIB / 2)),
            ("", None),
            ("G", None),
            ("12X", None),
            ("-1G", None),
            ("99999999999999999999T", None),
        ];
        for (text, expected) in rows {
            assert_eq!(parse_size(text), expected, "{text}");
        }
        assert_eq!(
            drive_size("local-lvm:vm-9001-disk-0,iothread=1,size=3G"),
            Some(3 * GIB)
        );
        assert_eq!(drive_size("local-lvm:vm-9001-disk-0"), None);
    }

    #[test]
    fn f20_correction4_resize_only_when_larger() {
        let template = config(&[
            ("boot", "order=scsi0;ide2"),
            ("scsi0", "local-lvm:vm-1-disk-0,size=3G"),
        ]);
        assert_eq!(
            resize_target(&template, Some(32)),
            Ok(Some(("scsi0".into(), "32G".into())))
        );
        assert_eq!(
            resize_target(&template, Some(3)),
            Ok(None),
            "equal size: no resize"
        );
        assert_eq!(
            resize_target(&template, Some(2)),
            Ok(None),
            "smaller: never shrink"
        );
        assert_eq!(resize_target(&template, None), Ok(None));
        assert_eq!(
            resize_target(&config(&[("boot", "order=net0")]), Some(8)),
            Err(DiskProblem::NoBootDisk)
        );
        let no_size = config(&[("boot", "order=scsi0"), ("scsi0", "local-lvm:vm-1-disk-0")]);
        assert_eq!(
            resize_target(&no_size, Some(8)),
            Err(DiskProblem::UnknownSize("scsi0".into()))
        );
    }
}
