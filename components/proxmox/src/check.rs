//! `check`: can the provider reach and use Proxmox with the host's grant? Always a reason, never
//! an error.
//!
//! 1. `GET /version`: no answer → `unreachable`, `certificate-invalid` (TLS), `credentials-unavailable`
//!    (the broker could not read the token), `misconfigured` (the grant does not cover `apiUrl`);
//!    401 → `unauthorized` (F22); 403 → `forbidden`.
//! 2. The configured nodes, the template (and its shape) and `isoStorage` exist → else
//!    `misconfigured`.
//! 3. Every privilege the provider's calls need ([`needed_privileges`], F13, F17), read with one
//!    `GET /access/permissions?path=…` per path → `forbidden`, naming each missing privilege and
//!    its path in one message. A path the endpoint does not answer for (an HTTP error) leaves the
//!    answer `ok`, with a note that those privileges were not verified: the rest of the check
//!    passed, and a create that lacks one fails with a permanent 403 naming it, so `other` would
//!    only mark a working installation not ready. No answer at all is the node gone, as for any
//!    other call.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::api::{ApiError, Io, Pve, TransportKind, VmConfig};
use crate::config::Config;
use crate::create::check_template;
use crate::disk::disk_storages;
use crate::egress::provider::types::{CheckReason, CheckResult};
use crate::errors::api_missing_vm;
use crate::net::bridge_and_tag;

/// One privilege a call needs: the ACL path Proxmox checks it on, and what it is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Need {
    pub path: String,
    pub privilege: &'static str,
    pub why: String,
}

/// The ACL path of a bridge (and VLAN) for `SDN.Use`: Proxmox checks a NIC on a plain bridge in
/// its built-in zone `localnetwork`, on `<bridge>/<tag>` when the NIC is tagged and on `<bridge>`
/// otherwise (pve-guest-common `check_vnet_access`). A bridge that is an SDN VNet is checked in
/// its own zone instead, which the provider cannot see without `SDN.Audit`: not modelled.
pub fn sdn_path(bridge: &str, tag: Option<u16>) -> String {
    match tag {
        Some(tag) => format!("/sdn/zones/localnetwork/{bridge}/{tag}"),
        None => format!("/sdn/zones/localnetwork/{bridge}"),
    }
}

/// Every privilege the provider's calls need under `config`, given the template's config (its
/// disks' storages and bridges), in the order they are reported. New VMIDs are not known in
/// advance, so their privileges are read on `/vms`, which `/vms/<vmid>` inherits. The names and
/// paths are those the qemu-server and pve-storage API handlers check (PVE 9); F17 recorded that a
/// role on `/` with them covered every call but the seed delete (F13).
pub fn needed_privileges(config: &Config, template: &VmConfig) -> Vec<Need> {
    let mut needs: Vec<Need> = Vec::new();
    let mut need = |path: String, privilege: &'static str, why: String| {
        if !needs
            .iter()
            .any(|held| held.path == path && held.privilege == privilege)
        {
            needs.push(Need {
                path,
                privilege,
                why,
            });
        }
    };
    let vms = || "/vms".to_string();
    need(
        format!("/vms/{}", config.template_vmid),
        "VM.Clone",
        "clone the template".into(),
    );
    need(
        vms(),
        "VM.Allocate",
        "clone onto a new VMID, destroy the VM".into(),
    );
    need(
        vms(),
        "VM.Audit",
        "list VMs, read their config and status".into(),
    );
    need(vms(), "VM.Config.CDROM", "attach the seed on ide2".into());
    need(
        vms(),
        "VM.Config.Options",
        "set agent, onboot, tags and the ownership mark".into(),
    );
    need(vms(), "VM.PowerMgmt", "start, stop and wake the VM".into());
    need(
        vms(),
        "VM.GuestAgent.Audit",
        "read the address from the guest agent (VM.Monitor before PVE 9)".into(),
    );
    let rewrites_net0 = config.bridge.is_some() || config.vlan_tag.is_some();
    if rewrites_net0 {
        need(
            vms(),
            "VM.Config.Network",
            "rewrite net0 (bridge, vlanTag)".into(),
        );
    }
    if config.cores.is_some() {
        need(vms(), "VM.Config.CPU", "set cores".into());
    }
    if config.memory_mib.is_some() {
        need(vms(), "VM.Config.Memory", "set memoryMiB".into());
    }
    if config.disk_gib.is_some() {
        need(
            vms(),
            "VM.Config.Disk",
            "grow the boot disk (diskGiB)".into(),
        );
    }
    let disk_storages = match &config.target_storage {
        Some(storage) => vec![storage.as_str()],
        None => disk_storages(template),
    };
    for storage in disk_storages {
        need(
            format!("/storage/{storage}"),
            "Datastore.AllocateSpace",
            "full-clone the disks onto it (and grow the boot disk)".into(),
        );
    }
    let seeds = format!("/storage/{}", config.iso_storage);
    need(
        seeds.clone(),
        "Datastore.Allocate",
        "delete seeds (F13)".into(),
    );
    need(
        seeds,
        "Datastore.AllocateTemplate",
        "upload seeds (F12)".into(),
    );
    // The clone checks every NIC the template carries, whether or not net0 is rewritten.
    for (key, value) in template.iter().filter(|(key, _)| {
        key.strip_prefix("net")
            .is_some_and(|index| !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()))
    }) {
        if let Some((bridge, tag)) = bridge_and_tag(value) {
            need(
                sdn_path(bridge, tag),
                "SDN.Use",
                format!("clone the template, whose {key} is on it"),
            );
        }
    }
    if rewrites_net0
        && let Some((bridge, tag)) = template
            .get("net0")
            .and_then(|net0| bridge_and_tag(net0))
            .map(|(bridge, tag)| {
                (
                    config.bridge.as_deref().unwrap_or(bridge),
                    config.vlan_tag.or(tag),
                )
            })
    {
        need(
            sdn_path(bridge, tag),
            "SDN.Use",
            "put net0 on it (bridge, vlanTag)".into(),
        );
    }
    needs
}

/// Whether a permissions answer holds `privilege` at `path`. The value is the ACL's propagate
/// flag (pve-access-control: "privilege => propagate boolean"), so a privilege from an ACL that
/// does not propagate reads `0` and is still held at its own path.
pub fn holds(
    answer: &BTreeMap<String, BTreeMap<String, Value>>,
    path: &str,
    privilege: &str,
) -> bool {
    answer
        .get(path)
        .is_some_and(|privileges| privileges.contains_key(privilege))
}

/// The check reason for a failed call.
pub fn reason_for(error: &ApiError) -> CheckReason {
    match error {
        ApiError::Transport(transport) => match transport.kind {
            TransportKind::Unreachable => CheckReason::Unreachable,
            TransportKind::Tls => CheckReason::CertificateInvalid,
            TransportKind::CredentialsUnavailable => CheckReason::CredentialsUnavailable,
            TransportKind::Denied => CheckReason::Misconfigured,
            TransportKind::Other => CheckReason::Other,
        },
        ApiError::Http { status: 401, .. } => CheckReason::Unauthorized,
        ApiError::Http { status: 403, .. } => CheckReason::Forbidden,
        ApiError::Http { .. } | ApiError::Decode(_) => CheckReason::Other,
    }
}

fn result(reason: CheckReason, message: impl Into<String>) -> CheckResult {
    CheckResult {
        reason,
        message: message.into(),
    }
}

fn failed(what: &str, error: &ApiError) -> CheckResult {
    result(reason_for(error), format!("{what}: {error}"))
}

/// `check` under the client's configuration.
pub fn check<I: Io>(pve: &mut Pve<'_, I>) -> CheckResult {
    let config = pve.config;
    if let Err(error) = pve.version() {
        return failed("GET /version", &error);
    }
    let nodes = match pve.nodes() {
        Ok(nodes) => nodes,
        Err(error) => return failed("list nodes", &error),
    };
    if let Some(missing) = config.nodes.iter().find(|node| !nodes.contains(node)) {
        return result(
            CheckReason::Misconfigured,
            format!(
                "node {missing:?} is not in the cluster (nodes: {})",
                nodes.join(", ")
            ),
        );
    }

    let entries = match pve.resources() {
        Ok(entries) => entries,
        Err(error) => return failed("list VMs", &error),
    };
    let template_vmid = config.template_vmid;
    let Some(template) = entries
        .iter()
        .find(|e| e.vmid == template_vmid && e.is_qemu())
    else {
        return result(
            CheckReason::Misconfigured,
            format!("template {template_vmid} does not exist (or the token cannot see it)"),
        );
    };
    let template_node = template.node.clone();
    let template = match pve.vm_config(&template_node, template_vmid) {
        Err(error) if api_missing_vm(&error) => {
            return result(
                CheckReason::Misconfigured,
                format!("template {template_vmid} does not exist"),
            );
        }
        Err(error) => return failed(&format!("read template {template_vmid}"), &error),
        Ok(template) => template,
    };
    if let Err(why) = check_template(&template, config) {
        return result(CheckReason::Misconfigured, why);
    }

    let storage = &config.iso_storage;
    match pve.storage_status(config.placement_node(), storage) {
        Err(
            error @ ApiError::Http {
                status: 401 | 403, ..
            },
        ) => return failed(&format!("read storage {storage}"), &error),
        Err(ApiError::Http { message, .. }) => {
            return result(
                CheckReason::Misconfigured,
                format!(
                    "isoStorage {storage:?} is not usable on {}: {message}",
                    config.placement_node()
                ),
            );
        }
        Err(error) => return failed(&format!("read storage {storage}"), &error),
        Ok(status) => {
            let content = status.get("content").and_then(Value::as_str);
            if content.is_some_and(|content| !content.split(',').any(|kind| kind == "iso")) {
                return result(
                    CheckReason::Misconfigured,
                    format!(
                        "isoStorage {storage:?} does not hold ISO images (content {content:?})"
                    ),
                );
            }
        }
    }

    let needs = needed_privileges(config, &template);
    let mut paths: Vec<&str> = Vec::new();
    for need in &needs {
        if !paths.contains(&need.path.as_str()) {
            paths.push(&need.path);
        }
    }
    let mut missing = Vec::new();
    let mut unverified = Vec::new();
    let mut verified = 0;
    for path in paths {
        match pve.permissions(path) {
            Ok(answer) => {
                verified += needs.iter().filter(|need| need.path == path).count();
                missing.extend(
                    needs
                        .iter()
                        .filter(|need| need.path == path && !holds(&answer, path, need.privilege))
                        .map(|need| format!("{} on {} ({})", need.privilege, need.path, need.why)),
                );
            }
            Err(error @ ApiError::Transport(_)) => {
                return failed(&format!("GET /access/permissions?path={path}"), &error);
            }
            Err(error) => unverified.push(format!("{path} ({error})")),
        }
    }
    let unverified = if unverified.is_empty() {
        String::new()
    } else {
        format!(
            "; the privileges on {} were NOT verified: GET /access/permissions did not answer, and \
             a create that lacks one fails with 403 Permission check failed",
            unverified.join(", ")
        )
    };
    if !missing.is_empty() {
        return result(
            CheckReason::Forbidden,
            format!(
                "the token lacks {} (F17: each call that needs one fails with 403 Permission \
                 check failed){unverified}",
                missing.join("; ")
            ),
        );
    }
    result(
        CheckReason::Ok,
        format!(
            "Proxmox VE reachable; nodes, template {template_vmid} and storage {storage} usable; \
             the token holds {verified} of the {} privileges the provider needs{unverified}",
            needs.len()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::TransportError;

    #[test]
    fn f22_check_reason_table() {
        let transport = |kind| {
            ApiError::Transport(TransportError {
                kind,
                detail: "x".into(),
            })
        };
        let rows = [
            (
                transport(TransportKind::Unreachable),
                CheckReason::Unreachable,
            ),
            (
                transport(TransportKind::Tls),
                CheckReason::CertificateInvalid,
            ),
            (
                transport(TransportKind::CredentialsUnavailable),
                CheckReason::CredentialsUnavailable,
            ),
            (transport(TransportKind::Denied), CheckReason::Misconfigured),
            (transport(TransportKind::Other), CheckReason::Other),
            (
                ApiError::Http {
                    status: 401,
                    message: "HTTP status 401".into(),
                },
                CheckReason::Unauthorized,
            ),
            (
                ApiError::Http {
                    status: 403,
                    message: "Permission check failed".into(),
                },
                CheckReason::Forbidden,
            ),
            (
                ApiError::Http {
                    status: 500,
                    message: "boom".into(),
                },
                CheckReason::Other,
            ),
        ];
        for (error, expected) in rows {
            assert_eq!(reason_for(&error), expected, "{error:?}");
        }
    }

    fn answer(json: &str) -> BTreeMap<String, BTreeMap<String, Value>> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn f13_f17_a_privilege_is_held_whether_or_not_its_acl_propagates() {
        let phase0 = answer(
            r#"{"/storage/proxy-seeds":{"Datastore.AllocateTemplate":1,"Datastore.AllocateSpace":1}}"#,
        );
        assert!(holds(
            &phase0,
            "/storage/proxy-seeds",
            "Datastore.AllocateTemplate"
        ));
        assert!(
            !holds(&phase0, "/storage/proxy-seeds", "Datastore.Allocate"),
            "F13"
        );
        // An ACL with propagate 0 (`pveum acl modify … --propagate 0`) holds at its own path.
        let own = answer(r#"{"/sdn/zones/localnetwork/vmbr0":{"SDN.Use":0}}"#);
        assert!(holds(&own, "/sdn/zones/localnetwork/vmbr0", "SDN.Use"));
        assert!(!holds(&own, "/sdn/zones/localnetwork/vmbr0/4", "SDN.Use"));
        assert!(!holds(&answer("{}"), "/vms", "VM.Audit"));
    }

    fn template() -> VmConfig {
        [
            ("template", "1"),
            ("boot", "order=scsi0"),
            ("scsi0", "local-lvm:base-9001-disk-0,size=3G"),
            ("net0", "virtio=BC:24:11:EE:48:83,bridge=vmbr0"),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
    }

    fn listed(needs: &[Need]) -> Vec<String> {
        needs
            .iter()
            .map(|need| format!("{} {}", need.path, need.privilege))
            .collect()
    }

    #[test]
    fn f17_the_privileges_follow_the_configuration() {
        let minimal = Config::parse(
            r#"{"apiUrl":"https://pve","nodes":["pv1-1"],"templateVmid":9001,"isoStorage":"proxy-seeds"}"#,
        )
        .unwrap();
        assert_eq!(
            listed(&needed_privileges(&minimal, &template())),
            [
                "/vms/9001 VM.Clone",
                "/vms VM.Allocate",
                "/vms VM.Audit",
                "/vms VM.Config.CDROM",
                "/vms VM.Config.Options",
                "/vms VM.PowerMgmt",
                "/vms VM.GuestAgent.Audit",
                // No targetStorage: the template's disks are copied where they are.
                "/storage/local-lvm Datastore.AllocateSpace",
                "/storage/proxy-seeds Datastore.Allocate",
                "/storage/proxy-seeds Datastore.AllocateTemplate",
                // The clone checks the template's NIC even when net0 is not rewritten.
                "/sdn/zones/localnetwork/vmbr0 SDN.Use",
            ]
        );
        let full = Config::parse(
            r#"{"apiUrl":"https://pve","nodes":["pv1-1"],"templateVmid":9001,"isoStorage":"proxy-seeds",
                "targetStorage":"fast","vlanTag":4,"cores":2,"memoryMiB":1024,"diskGiB":8}"#,
        )
        .unwrap();
        let needs = listed(&needed_privileges(&full, &template()));
        for expected in [
            "/vms VM.Config.Network",
            "/vms VM.Config.CPU",
            "/vms VM.Config.Memory",
            "/vms VM.Config.Disk",
            "/storage/fast Datastore.AllocateSpace",
            "/sdn/zones/localnetwork/vmbr0 SDN.Use",
            // Phase 0: bridge=vmbr0,tag=4 is checked on the VLAN's own path.
            "/sdn/zones/localnetwork/vmbr0/4 SDN.Use",
        ] {
            assert!(
                needs.contains(&expected.to_string()),
                "{expected}: {needs:#?}"
            );
        }
        assert!(!needs.contains(&"/storage/local-lvm Datastore.AllocateSpace".to_string()));
        // Another bridge, keeping the template's tag.
        let mut tagged = template();
        tagged.insert(
            "net0".into(),
            "virtio=BC:24:11:00:00:01,bridge=vmbr0,tag=4".into(),
        );
        let other = Config::parse(
            r#"{"apiUrl":"https://pve","nodes":["pv1-1"],"templateVmid":9001,"isoStorage":"proxy-seeds","bridge":"vmbr1"}"#,
        )
        .unwrap();
        let needs = listed(&needed_privileges(&other, &tagged));
        assert!(needs.contains(&"/sdn/zones/localnetwork/vmbr0/4 SDN.Use".to_string()));
        assert!(needs.contains(&"/sdn/zones/localnetwork/vmbr1/4 SDN.Use".to_string()));
    }
}
