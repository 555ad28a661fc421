//! The tokens' privileges: what `GET /access/permissions` reports (F13, F17) and what every
//! handler checks before it acts, answering `403 Permission check failed (<path>, <privilege>)`
//! as PVE's `raise_perm_exc` does.
//!
//! A token holds ACLs ([`Acl`]): a role's privileges on a path, propagated to the paths below it or
//! not (`pveum acl modify <path> --propagate 0`). The privileges at a path are those of the most
//! specific ACL on it or above it that applies there: an ACL on a more specific path replaces the
//! inherited one (the Phase 0 ACL caveat), and one that does not propagate applies at its own path
//! only. That is pve-access-control's `roles()` for a user; the tokens here are privilege
//! separation off (the Phase 0 token), so a token holds its user's ACLs. Groups, pools and the
//! `NoAccess` role are not modelled.
//!
//! The main token holds, by default, what was recorded ([`recorded_acls`]): the role the
//! predecessor planned on `/` (F17: it covered clone, config, resize, power, agent read, upload and
//! destroy, but not `Datastore.Allocate`) and the seed role (`ProxyOperatorSeeds` in the Phase 0
//! setup) on `/storage/proxy-seeds`. [`crate::SimConfig::token_acls`] gives it others, for a token
//! that lacks a privilege. The limited token holds the role on `/` only.
//!
//! Which call needs which privilege on which path follows the PVE 9 API handlers (qemu-server,
//! pve-storage, pve-guest-common), not a capture: F17 only records that the role on `/` sufficed.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::api::Token;
use crate::reply::ApiError;

/// The role the predecessor planned, granted on `/` (F17): no `Datastore.Allocate`, so seed
/// deletes outside the seed storage get 403 (F13). Its exact list was not recorded; this one holds
/// every privilege a config key needs (`VM.Config.HWType` and `VM.Config.Cloudinit` included,
/// which the provider does not use), so a write of any key but the root-only ones passes, as it
/// did before the simulator checked privileges.
pub const OPERATOR_ROLE: &[&str] = &[
    "Datastore.AllocateSpace",
    "Datastore.AllocateTemplate",
    "Datastore.Audit",
    "SDN.Use",
    "VM.Allocate",
    "VM.Audit",
    "VM.Clone",
    "VM.Config.CDROM",
    "VM.Config.CPU",
    "VM.Config.Cloudinit",
    "VM.Config.Disk",
    "VM.Config.HWType",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.Options",
    "VM.GuestAgent.Audit",
    "VM.PowerMgmt",
];

/// The seed role on `/storage/<id>` (Phase 0: `ProxyOperatorSeeds`). It repeats what uploads need
/// beside `Datastore.Allocate`, because it replaces the role inherited from `/` there.
pub const SEED_ROLE: &[&str] = &[
    "Datastore.Allocate",
    "Datastore.AllocateSpace",
    "Datastore.AllocateTemplate",
    "Datastore.Audit",
];

/// One ACL entry of a token: privileges on a path, and whether they propagate below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    /// The ACL path, e.g. `/`, `/vms`, `/storage/proxy-seeds`, `/sdn/zones/localnetwork/vmbr0`.
    pub path: String,
    /// The privileges of the role granted there.
    pub privileges: Vec<String>,
    /// Whether the paths below inherit them (`--propagate`, PVE's default 1).
    pub propagate: bool,
}

impl Acl {
    /// `privileges` on `path`, propagated below it.
    pub fn new(path: &str, privileges: &[&str]) -> Acl {
        Acl {
            path: path.to_string(),
            privileges: privileges.iter().map(|p| p.to_string()).collect(),
            propagate: true,
        }
    }

    /// `privileges` on `path` only (`--propagate 0`).
    pub fn here_only(path: &str, privileges: &[&str]) -> Acl {
        Acl {
            propagate: false,
            ..Acl::new(path, privileges)
        }
    }
}

/// The main token's ACLs as recorded: [`OPERATOR_ROLE`] on `/`, [`SEED_ROLE`] on
/// `/storage/proxy-seeds`.
pub fn recorded_acls() -> Vec<Acl> {
    vec![
        Acl::new("/", OPERATOR_ROLE),
        Acl::new("/storage/proxy-seeds", SEED_ROLE),
    ]
}

/// [`OPERATOR_ROLE`] without `missing`: the role of a token that lacks those privileges.
pub fn operator_role_without(missing: &[&str]) -> Vec<&'static str> {
    OPERATOR_ROLE
        .iter()
        .copied()
        .filter(|privilege| !missing.contains(privilege))
        .collect()
}

/// `path` and every path above it, from `/` down.
fn path_and_ancestors(path: &str) -> Vec<String> {
    let mut paths = vec!["/".to_string()];
    let mut current = String::new();
    for segment in path.split('/').filter(|segment| !segment.is_empty()) {
        current.push('/');
        current.push_str(segment);
        paths.push(current.clone());
    }
    paths
}

/// The privileges `token` holds at `path`, each with its ACL's propagate flag: walking from `/`
/// down, every level where an ACL applies (at `path` itself, or propagating) replaces what was
/// inherited.
pub(crate) fn privileges_at(token: &Token, path: &str) -> BTreeMap<String, bool> {
    let mut held = BTreeMap::new();
    for level in path_and_ancestors(path) {
        let applies: Vec<&Acl> = token
            .acls
            .iter()
            .filter(|acl| acl.path == level && (acl.propagate || level == path))
            .collect();
        if applies.is_empty() {
            continue;
        }
        held = BTreeMap::new();
        for acl in applies {
            for privilege in &acl.privileges {
                let propagate = held.entry(privilege.clone()).or_insert(false);
                *propagate |= acl.propagate;
            }
        }
    }
    held
}

/// `Ok` when `token` holds `privilege` at `path`, else PVE's 403.
pub(crate) fn require(token: &Token, path: &str, privilege: &str) -> Result<(), ApiError> {
    if privileges_at(token, path).contains_key(privilege) {
        return Ok(());
    }
    Err(ApiError::forbidden(&format!("{path}, {privilege}")))
}

/// `Ok` when `token` holds any of `privileges` at `path` (`check_any`), else the 403 that lists
/// them joined with `|`.
pub(crate) fn require_any(token: &Token, path: &str, privileges: &[&str]) -> Result<(), ApiError> {
    let held = privileges_at(token, path);
    if privileges
        .iter()
        .any(|privilege| held.contains_key(*privilege))
    {
        return Ok(());
    }
    Err(ApiError::forbidden(&format!(
        "{path}, {}",
        privileges.join("|")
    )))
}

/// The privileges a config write needs any one of on `/vms/<vmid>` before anything else
/// (qemu-server's `update_vm` permission check).
pub(crate) const VM_CONFIG_PRIVILEGES: &[&str] = &[
    "VM.Config.Disk",
    "VM.Config.CDROM",
    "VM.Config.CPU",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.HWType",
    "VM.Config.Options",
    "VM.Config.Cloudinit",
];

/// The privilege setting (or deleting) config `key` needs on `/vms/<vmid>`, checked before the
/// write starts (qemu-server's `$check_vm_modify_config_perm`, PVE 9). Drives, `tags` and the
/// NIC's bridge are checked elsewhere, as there.
pub(crate) fn config_key(token: &Token, vmid: u32, key: &str) -> Result<(), ApiError> {
    const CPU: &[&str] = &[
        "cores",
        "cpu",
        "runningcpu",
        "cpulimit",
        "cpuunits",
        "numa",
        "smp",
        "sockets",
        "vcpus",
    ];
    const MEMORY: &[&str] = &["memory", "balloon", "shares", "allow-ksm"];
    const HWTYPE: &[&str] = &[
        "acpi",
        "hotplug",
        "kvm",
        "machine",
        "runningmachine",
        "scsihw",
        "smbios1",
        "tablet",
        "vga",
        "watchdog",
        "audio0",
        "rng0",
    ];
    const OPTIONS: &[&str] = &[
        "agent",
        "autostart",
        "bios",
        "description",
        "keyboard",
        "localtime",
        "migrate_downtime",
        "migrate_speed",
        "name",
        "onboot",
        "ostype",
        "protection",
        "reboot",
        "startdate",
        "startup",
        "tdf",
        "template",
    ];
    const DISK: &[&str] = &["boot", "bootdisk", "vmstatestorage"];
    const CLOUDINIT: &[&str] = &[
        "cicustom",
        "cipassword",
        "citype",
        "ciuser",
        "ciupgrade",
        "nameserver",
        "searchdomain",
        "sshkeys",
    ];
    let indexed = |prefix: &str| {
        key.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let path = format!("/vms/{vmid}");
    if crate::model::is_drive_key(key)
        || key == "cdrom"
        || key == "tags"
        || ["unused", "serial", "usb", "hostpci", "virtiofs"]
            .iter()
            .any(|prefix| indexed(prefix))
    {
        Ok(())
    } else if CPU.contains(&key) || indexed("numa") {
        require(token, &path, "VM.Config.CPU")
    } else if MEMORY.contains(&key) {
        require(token, &path, "VM.Config.Memory")
    } else if HWTYPE.contains(&key) {
        require(token, &path, "VM.Config.HWType")
    } else if OPTIONS.contains(&key) {
        require(token, &path, "VM.Config.Options")?;
        if key == "startup" {
            // It changes how the host boots.
            require(token, "/", "Sys.Modify")?;
        }
        Ok(())
    } else if key == "freeze" {
        require(token, &path, "VM.PowerMgmt")
    } else if DISK.contains(&key) {
        require(token, &path, "VM.Config.Disk")
    } else if indexed("net") {
        require(token, &path, "VM.Config.Network")
    } else if CLOUDINIT.contains(&key) || indexed("ipconfig") {
        require_any(token, &path, &["VM.Config.Cloudinit", "VM.Config.Network"])
    } else if key == "vmstate" {
        require(token, &path, "VM.Config.Disk")?;
        require(token, &path, "VM.PowerMgmt")
    } else {
        Err(ApiError::internal(format!(
            "only root can set '{key}' config"
        )))
    }
}

/// The privilege a drive value needs on `/vms/<vmid>`, checked while the config task writes it: a
/// cloud-init drive both `VM.Config.Cloudinit` and `VM.Config.CDROM`, a CD-ROM (the seed on ide2)
/// `VM.Config.CDROM`, a disk `VM.Config.Disk`.
pub(crate) fn drive(token: &Token, vmid: u32, value: &str) -> Result<(), ApiError> {
    let path = format!("/vms/{vmid}");
    let volume = value.split(',').next().unwrap_or_default();
    if volume.ends_with("cloudinit") {
        require(token, &path, "VM.Config.Cloudinit")?;
        require(token, &path, "VM.Config.CDROM")
    } else if crate::model::drive_option(value, "media") == Some("cdrom") {
        require(token, &path, "VM.Config.CDROM")
    } else {
        require(token, &path, "VM.Config.Disk")
    }
}

/// The access a drive's volume needs on its storage, checked before the write (pve-storage's
/// `check_volume_access`): `Datastore.Allocate` there covers any volume; an ISO (the seed) needs
/// `Datastore.AllocateSpace` or `Datastore.Audit`. Other volumes are not modelled.
pub(crate) fn volume(token: &Token, value: &str) -> Result<(), ApiError> {
    let volume = value.split(',').next().unwrap_or_default();
    let Some((storage, name)) = volume.split_once(':') else {
        return Ok(());
    };
    let path = format!("/storage/{storage}");
    if !name.starts_with("iso/") || require(token, &path, "Datastore.Allocate").is_ok() {
        return Ok(());
    }
    require_any(
        token,
        &path,
        &["Datastore.AllocateSpace", "Datastore.Audit"],
    )
}

/// `SDN.Use` for a NIC value (pve-guest-common's `check_vnet_access`): on
/// `/sdn/zones/localnetwork/<bridge>/<tag>` when tagged, else on `/sdn/zones/localnetwork/<bridge>`.
/// Every bridge is a plain one in the built-in zone `localnetwork`: the simulator has no SDN VNets.
/// Trunks are not modelled.
pub(crate) fn bridge(token: &Token, net: &str) -> Result<(), ApiError> {
    let Some(bridge) = crate::model::drive_option(net, "bridge") else {
        return Ok(());
    };
    match crate::model::drive_option(net, "tag") {
        Some(tag) => require(
            token,
            &format!("/sdn/zones/localnetwork/{bridge}/{tag}"),
            "SDN.Use",
        ),
        None => require(
            token,
            &format!("/sdn/zones/localnetwork/{bridge}"),
            "SDN.Use",
        ),
    }
}

/// What a clone checks before it starts, once its API-level checks passed: for each disk,
/// `Datastore.AllocateSpace` on its storage (on `storage=` when given), then `SDN.Use` for every
/// NIC the source carries (qemu-server's clone).
pub(crate) fn clone_source(
    token: &Token,
    source: &BTreeMap<String, String>,
    storage: Option<&str>,
) -> Result<(), ApiError> {
    for (_, value) in source.iter().filter(|(key, value)| {
        crate::model::is_drive_key(key)
            && crate::model::drive_option(value, "media") != Some("cdrom")
    }) {
        let volume = value.split(',').next().unwrap_or_default();
        if let Some((own, _)) = volume.split_once(':') {
            let target = storage.unwrap_or(own);
            require(
                token,
                &format!("/storage/{target}"),
                "Datastore.AllocateSpace",
            )?;
        }
    }
    for (_, net) in source.iter().filter(|(key, _)| {
        key.strip_prefix("net")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    }) {
        bridge(token, net)?;
    }
    Ok(())
}

/// `{privilege: propagate}`, the flag as 1 or 0 (pve-access-control's "privilege => propagate
/// boolean").
fn privilege_map(held: BTreeMap<String, bool>) -> Value {
    Value::Object(
        held.into_iter()
            .map(|(privilege, propagate)| (privilege, json!(u8::from(propagate))))
            .collect(),
    )
}

/// The answer of `GET /access/permissions`: for one `path`, `{path: {privilege: 0|1}}`; without
/// one, every path the token has an ACL on.
pub(crate) fn permissions(token: &Token, path: Option<&str>) -> Value {
    let entries: BTreeMap<String, Value> = match path {
        Some(path) => {
            BTreeMap::from([(path.to_string(), privilege_map(privileges_at(token, path)))])
        }
        None => token
            .acls
            .iter()
            .map(|acl| {
                (
                    acl.path.clone(),
                    privilege_map(privileges_at(token, &acl.path)),
                )
            })
            .collect(),
    };
    json!(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(acls: Vec<Acl>) -> Token {
        Token {
            user: "egress@pve".into(),
            tokenid: "t".into(),
            secret: "s".into(),
            acls,
        }
    }

    fn held(token: &Token, path: &str) -> Vec<String> {
        privileges_at(token, path).into_keys().collect()
    }

    #[test]
    fn the_most_specific_acl_replaces_the_inherited_one() {
        let main = token(recorded_acls());
        assert_eq!(held(&main, "/storage/proxy-seeds"), SEED_ROLE);
        assert_eq!(held(&main, "/storage/local"), OPERATOR_ROLE);
        assert_eq!(held(&main, "/storage/proxy-seeds-2"), OPERATOR_ROLE);
        assert_eq!(held(&main, "/vms/100"), OPERATOR_ROLE);
        let limited = token(vec![Acl::new("/", OPERATOR_ROLE)]);
        assert!(require(&limited, "/storage/proxy-seeds", "Datastore.Allocate").is_err());
    }

    #[test]
    fn an_acl_that_does_not_propagate_holds_at_its_own_path_only() {
        let vlan_less = token(vec![
            Acl::new("/", &operator_role_without(&["SDN.Use"])),
            Acl::here_only("/sdn/zones/localnetwork/vmbr0", &["SDN.Use"]),
        ]);
        assert!(require(&vlan_less, "/sdn/zones/localnetwork/vmbr0", "SDN.Use").is_ok());
        assert_eq!(
            require(&vlan_less, "/sdn/zones/localnetwork/vmbr0/4", "SDN.Use")
                .unwrap_err()
                .message,
            "Permission check failed (/sdn/zones/localnetwork/vmbr0/4, SDN.Use)"
        );
        // Below the bridge the role on `/` still applies: it was not replaced there.
        assert!(require(&vlan_less, "/sdn/zones/localnetwork/vmbr0/4", "VM.Audit").is_ok());
        let answer = permissions(&vlan_less, Some("/sdn/zones/localnetwork/vmbr0"));
        assert_eq!(
            answer["/sdn/zones/localnetwork/vmbr0"],
            json!({"SDN.Use": 0})
        );
    }

    #[test]
    fn require_any_lists_the_alternatives() {
        let none = token(vec![Acl::new("/", &[])]);
        assert_eq!(
            require_any(
                &none,
                "/storage/local",
                &["Datastore.Audit", "Datastore.AllocateSpace"]
            )
            .unwrap_err()
            .message,
            "Permission check failed (/storage/local, Datastore.Audit|Datastore.AllocateSpace)"
        );
    }

    #[test]
    fn without_a_path_every_acl_is_listed() {
        let answer = permissions(&token(recorded_acls()), None);
        let paths: Vec<&String> = answer.as_object().unwrap().keys().collect();
        assert_eq!(paths, ["/", "/storage/proxy-seeds"]);
        assert_eq!(answer["/storage/proxy-seeds"]["Datastore.Allocate"], 1);
        assert!(answer["/"].get("Datastore.Allocate").is_none());
    }
}
