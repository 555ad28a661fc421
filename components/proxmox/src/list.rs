//! `list-by-tag`: every VM of ours carrying the tag `key=value`, in any state, so the operator can
//! find orphans.
//!
//! Candidates are the QEMU entries with our Proxmox tag (correction 7); each one's config is read,
//! and it is listed when its mark carries `key=value` (Proxmox tags cannot hold `=`, F9, so the
//! exact pair lives in the mark). Entries without a mark are left out. The state is the cheap one
//! from the entry; addresses are not read (`get` reads them).

use crate::api::{Io, Pve, Resource};
use crate::create::PROXMOX_TAG;
use crate::egress::provider::types::{Error, Listing};
use crate::errors::{api_missing_vm, classify};
use crate::get::contract_vm;
use crate::mark::Mark;
use crate::state::entry_state;

/// Whether a resources entry is worth reading: a QEMU VM, not a template, with our tag.
pub fn is_candidate(entry: &Resource) -> bool {
    entry.is_qemu() && !entry.template && entry.has_tag(PROXMOX_TAG)
}

/// `list-by-tag` for `key=value`. A node whose VM configs cannot be read (it is down, or does
/// not answer the cluster) is named in `unanswered` and its VMs left out: unknown, never gone.
pub fn list_by_tag<I: Io>(pve: &mut Pve<'_, I>, key: &str, value: &str) -> Result<Listing, Error> {
    let entries = pve
        .resources()
        .map_err(|error| classify("list VMs", &error))?;
    let mut vms = Vec::new();
    let mut unanswered: Vec<String> = Vec::new();
    for entry in entries.iter().filter(|entry| is_candidate(entry)) {
        if unanswered.contains(&entry.node) {
            continue;
        }
        let config = match pve.vm_config(&entry.node, entry.vmid) {
            // Destroyed between the listing and this read.
            Err(error) if api_missing_vm(&error) => continue,
            Err(error) => match classify(&format!("read config of VM {}", entry.vmid), &error) {
                Error::Transient(_) => {
                    unanswered.push(entry.node.clone());
                    continue;
                }
                refused => return Err(refused),
            },
            Ok(config) => config,
        };
        let Some(mark) = Mark::parse(config.get("description").map(String::as_str)) else {
            continue;
        };
        if mark.has_tag(key, value) {
            vms.push(contract_vm(
                &entry.node,
                entry.vmid,
                &config,
                &mark,
                entry_state(entry),
                Vec::new(),
            ));
        }
    }
    Ok(Listing { vms, unanswered })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn correction7_candidates_are_tagged_qemu_vms_not_templates() {
        let entry = |kind: &str, template: bool, tags: Option<&str>| Resource {
            vmid: 100_001,
            kind: kind.into(),
            node: "pv1-1".into(),
            template,
            tags: tags.map(String::from),
            ..Resource::default()
        };
        assert!(is_candidate(&entry("qemu", false, Some("proxy_operator"))));
        assert!(is_candidate(&entry(
            "qemu",
            false,
            Some("prod;proxy_operator")
        )));
        assert!(!is_candidate(&entry("qemu", true, Some("proxy_operator"))));
        assert!(!is_candidate(&entry("lxc", false, Some("proxy_operator"))));
        assert!(!is_candidate(&entry("qemu", false, Some("proxy-operator"))));
        assert!(!is_candidate(&entry("qemu", false, None)));
    }
}
