//! Pure Proxmox rules with no I/O: tags, sizes, UPIDs, drive strings, config digests.

use sha1::{Digest, Sha1};
use std::collections::BTreeMap;

/// Normalises a tag list the way PVE 9.2.20 stores it (F9): split on `;` or `,`, lowercase,
/// deduplicate, sort, join with `;`. Hyphens are accepted; a space or `!` is refused.
pub(crate) fn normalize_tags(input: &str) -> Result<String, String> {
    let mut tags: Vec<String> = Vec::new();
    for tag in input.split([';', ',']).filter(|t| !t.is_empty()) {
        let mut chars = tag.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || "_-+.".contains(c));
        if !first_ok || !rest_ok {
            return Err("invalid characters in tag".to_string());
        }
        tags.push(tag.to_ascii_lowercase());
    }
    tags.sort();
    tags.dedup();
    Ok(tags.join(";"))
}

/// Bytes per unit suffix in Proxmox size strings.
fn unit_bytes(unit: char) -> Option<u64> {
    match unit {
        'K' => Some(1 << 10),
        'M' => Some(1 << 20),
        'G' => Some(1 << 30),
        'T' => Some(1 << 40),
        _ => None,
    }
}

/// Parses `\d+(\.\d+)?[KMGT]?` into bytes (a bare number is bytes).
pub(crate) fn parse_size(text: &str) -> Option<u64> {
    let (number, multiplier) = match text.chars().last()? {
        c if c.is_ascii_digit() => (text, 1),
        c => (&text[..text.len() - 1], unit_bytes(c)?),
    };
    let valid = !number.is_empty()
        && number
            .split_once('.')
            .map_or(number.chars().all(|c| c.is_ascii_digit()), |(i, f)| {
                !i.is_empty()
                    && !f.is_empty()
                    && i.chars().all(|c| c.is_ascii_digit())
                    && f.chars().all(|c| c.is_ascii_digit())
            });
    if !valid {
        return None;
    }
    let value: f64 = number.parse().ok()?;
    let bytes = value * multiplier as f64;
    (bytes.is_finite() && bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// Renders bytes with the largest unit that divides them evenly, as qemu-server writes `size=`.
pub(crate) fn format_size(bytes: u64) -> String {
    for unit in ['T', 'G', 'M', 'K'] {
        let per = unit_bytes(unit).unwrap_or(1);
        if bytes >= per && bytes.is_multiple_of(per) {
            return format!("{}{unit}", bytes / per);
        }
    }
    bytes.to_string()
}

/// A drive or net string's `key=value` options after the first (volume or model) part.
pub(crate) fn drive_option<'a>(drive: &'a str, key: &str) -> Option<&'a str> {
    drive
        .split(',')
        .skip(1)
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// Replaces or appends `key=value` in a drive string, keeping the other options in order.
pub(crate) fn set_drive_option(drive: &str, key: &str, value: &str) -> String {
    let mut parts: Vec<String> = drive.split(',').map(str::to_string).collect();
    let prefix = format!("{key}=");
    match parts.iter_mut().skip(1).find(|p| p.starts_with(&prefix)) {
        Some(part) => *part = format!("{key}={value}"),
        None => parts.push(format!("{key}={value}")),
    }
    parts.join(",")
}

/// Whether a config key names a disk drive slot.
pub(crate) fn is_drive_key(key: &str) -> bool {
    let indexed = |prefix: &str, max: u32| {
        key.strip_prefix(prefix)
            .and_then(|n| n.parse::<u32>().ok().filter(|n| *n <= max).map(|_| n.len()))
            .is_some_and(|len| len > 0 && !key.ends_with('+'))
    };
    indexed("ide", 3)
        || indexed("sata", 5)
        || indexed("scsi", 30)
        || indexed("virtio", 15)
        || key == "efidisk0"
        || key == "tpmstate0"
}

/// The MAC of a `netN` string (`virtio=BC:24:11:…,bridge=…`).
pub(crate) fn net_mac(net: &str) -> Option<&str> {
    let first = net.split(',').next()?;
    let (_, mac) = first.split_once('=')?;
    Some(mac)
}

/// SHA1 over the config as qemu-server would write it; changes with every change of content.
pub(crate) fn digest(config: &BTreeMap<String, String>) -> String {
    let mut hasher = Sha1::new();
    for (key, value) in config {
        hasher.update(format!("{key}: {value}\n").as_bytes());
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The UPID layout: `UPID:<node>:%08X:%08X:%08X:<type>:<id>:<user>:` with the trailing colon.
pub(crate) fn format_upid(
    node: &str,
    pid: u32,
    pstart: u32,
    starttime: u64,
    task_type: &str,
    id: &str,
    user: &str,
) -> String {
    format!("UPID:{node}:{pid:08X}:{pstart:08X}:{starttime:08X}:{task_type}:{id}:{user}:")
}

/// Whether a string has the UPID layout (the decode regex from pve-common).
pub(crate) fn is_upid(upid: &str) -> bool {
    let Some(body) = upid.strip_prefix("UPID:").and_then(|b| b.strip_suffix(':')) else {
        return false;
    };
    let fields: Vec<&str> = body.split(':').collect();
    let hex = |s: &str, lens: &[usize]| {
        lens.contains(&s.len()) && s.chars().all(|c| c.is_ascii_hexdigit())
    };
    fields.len() == 7
        && !fields[0].is_empty()
        && hex(fields[1], &[8])
        && hex(fields[2], &[8, 9])
        && hex(fields[3], &[8])
        && !fields[4].is_empty()
        && !fields[6].is_empty()
}

/// A fresh MAC under the Proxmox OUI BC:24:11, as clone gives every netN.
pub(crate) fn random_mac() -> String {
    let bytes = uuid::Uuid::new_v4();
    let b = bytes.as_bytes();
    format!("BC:24:11:{:02X}:{:02X}:{:02X}", b[0], b[1], b[2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_fold_case_sort_and_keep_hyphens() {
        assert_eq!(normalize_tags("Proxy_Operator").unwrap(), "proxy_operator");
        assert_eq!(normalize_tags("b-2,a;B-2").unwrap(), "a;b-2");
        assert_eq!(normalize_tags("").unwrap(), "");
        for bad in ["proxy operator", "bang!", "-lead"] {
            assert_eq!(
                normalize_tags(bad).unwrap_err(),
                "invalid characters in tag",
                "{bad}"
            );
        }
    }

    #[test]
    fn sizes_parse_and_render() {
        assert_eq!(parse_size("3G"), Some(3 << 30));
        assert_eq!(parse_size("1.5G"), Some(3 << 29));
        assert_eq!(parse_size("512"), Some(512));
        for bad in ["", "G", "1.G", "3X", "-1G", "1..2G"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
        assert_eq!(format_size(32 << 30), "32G");
        assert_eq!(format_size(3584 << 20), "3584M");
        assert_eq!(format_size(1000), "1000");
    }

    #[test]
    fn drive_options_are_read_and_replaced_in_place() {
        let drive = "local-lvm:vm-100-disk-0,iothread=1,size=3G";
        assert_eq!(drive_option(drive, "size"), Some("3G"));
        assert_eq!(
            set_drive_option(drive, "size", "8G"),
            "local-lvm:vm-100-disk-0,iothread=1,size=8G"
        );
        assert_eq!(set_drive_option("x:y", "size", "1G"), "x:y,size=1G");
    }

    #[test]
    fn drive_keys() {
        for key in ["scsi0", "ide2", "sata5", "virtio15", "efidisk0"] {
            assert!(is_drive_key(key), "{key}");
        }
        for key in ["ide4", "scsi", "net0", "scsi31", "boot"] {
            assert!(!is_drive_key(key), "{key}");
        }
    }

    #[test]
    fn upid_has_the_exact_layout() {
        let upid = format_upid(
            "pv1-1",
            0x17C594,
            0xADB2769,
            0x63EC5455,
            "imgcopy",
            "",
            "root@pam!tok",
        );
        assert_eq!(
            upid,
            "UPID:pv1-1:0017C594:0ADB2769:63EC5455:imgcopy::root@pam!tok:"
        );
        assert!(is_upid(&upid));
        assert!(!is_upid(
            "UPID:pv1-1:0017C594:0ADB2769:63EC5455:imgcopy::root@pam"
        ));
        assert!(!is_upid("nonsense"));
    }

    #[test]
    fn digest_changes_with_content() {
        let mut config = BTreeMap::from([("name".to_string(), "a".to_string())]);
        let before = digest(&config);
        config.insert("cores".into(), "2".into());
        assert_ne!(before, digest(&config));
        assert_eq!(before.len(), 40);
    }
}
