//! `POST /nodes/{node}/qemu/{vmid}/clone`: the synchronous checks, the new VM's config, and
//! where it lives. A clone onto another node (`target`) needs the source's volumes on a shared
//! storage (notes A1: `target` only with shared storage).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::access::{self, require};
use crate::api::{Ctx, Server, check_unlocked, qemu, start_task};
use crate::model;
use crate::params::{Params, is_dns_name, parse_vmid};
use crate::reply::ApiError;
use crate::state::{Guest, GuestKind, Inner, RunState};
use crate::tasks::Work;

const CLONE_PARAMS: &[&str] = &[
    "newid",
    "name",
    "description",
    "full",
    "storage",
    "target",
    "pool",
    "snapname",
    "format",
    "bwlimit",
];

/// `POST /nodes/{node}/qemu/{source}/clone`: the source must live on `node`, which runs the
/// task (its UPID names `node`). Proxmox's synchronous checks come first, in qemu-server's order
/// where it matters: `target`, then `storage`, then the source, then the new VMID.
pub(crate) fn clone_vm(
    server: &Arc<Server>,
    ctx: &Ctx,
    node: &str,
    source: u32,
    params: &Params,
) -> Result<Value, ApiError> {
    require(&ctx.token, &format!("/vms/{source}"), "VM.Clone")?;
    // `VM.Allocate` on the new VMID or on a pool (not modelled): an `or` of two checks, whose
    // refusal names neither.
    if let Some(newid) = params
        .get("newid")
        .and_then(|newid| newid.parse::<u32>().ok())
        && require(&ctx.token, &format!("/vms/{newid}"), "VM.Allocate").is_err()
    {
        return Err(ApiError::forbidden(""));
    }
    params.allow(CLONE_PARAMS)?;
    let newid = parse_vmid("newid", params.required("newid")?)?;
    if params.get("name").is_some_and(|n| !is_dns_name(n)) {
        return Err(ApiError::format(
            "name",
            "value does not look like a valid DNS name",
        ));
    }
    let full_param = params.boolean("full")?;
    let mut inner = server.state.lock();
    // qemu-server drops a `target` naming the node that runs the clone, then refuses one the
    // cluster does not have (`check_node_exists`).
    let target = params.get("target").filter(|target| *target != node);
    if let Some(target) = target
        && !inner.is_node(target)
    {
        return Err(ApiError::internal(format!(
            "no such cluster node '{target}'"
        )));
    }
    if let Some(storage) = params.get("storage") {
        let Some(scfg) = inner.storage(storage) else {
            return Err(ApiError::internal(format!(
                "storage '{storage}' does not exist"
            )));
        };
        // F15: refused up front, leaving no VM.
        if !scfg.content.contains(&"images") {
            return Err(ApiError::param(
                "storage",
                format!("storage '{storage}' does not support vm images"),
            ));
        }
        // qemu-server: the new disks must be where the target node sees them.
        if target.is_some() && !scfg.shared {
            return Err(ApiError::internal(format!(
                "can't clone to non-shared storage '{storage}'"
            )));
        }
    }
    let source_guest = qemu(&inner, node, source)?;
    access::clone_source(&ctx.token, &source_guest.config, params.get("storage"))?;
    // qemu-server's `check_storage_access_clone`: a source with any volume on a storage of its
    // node's own cannot be cloned to another node, whatever `storage` says (notes A1).
    if let Some(target) = target
        && !on_shared_storage_only(&inner, &source_guest.config)?
    {
        return Err(ApiError::internal(format!(
            "can't clone VM to node '{target}' (VM uses local storage)"
        )));
    }
    // F4: a taken VMID fails synchronously. qemu-server checks the conf on its own node and
    // pmxcfs refuses a VMID another node holds; the recorded text stands for both, as VMIDs are
    // the cluster's.
    if inner.guests.contains_key(&newid) {
        return Err(ApiError::internal(format!(
            "unable to create VM {newid}: config file already exists"
        )));
    }
    check_unlocked(source_guest)?;
    let is_template = source_guest
        .config
        .get("template")
        .is_some_and(|t| t == "1");
    let full = full_param.unwrap_or(!is_template);
    let target_config = cloned_config(&source_guest.config, source, newid, full, params);

    let work = Work::Clone {
        newid,
        config: target_config,
        node: target.unwrap_or(node).to_string(),
    };
    let upid = start_task(
        server,
        ctx,
        &mut inner,
        node,
        "qmclone",
        &source.to_string(),
        work,
    );
    // The target conf starts as qemu-server's temporary file: `lock: clone`, nothing else (F8),
    // on the node running the clone; a clone with `target` renames it into the target node's
    // directory when it ends (qemu-server's clone_vm), so until then it is listed here.
    let guest_ip = inner.address_of(newid);
    inner.guests.insert(
        newid,
        Guest {
            node: node.to_string(),
            kind: GuestKind::Qemu,
            config: BTreeMap::from([("lock".to_string(), "clone".to_string())]),
            run: RunState::Stopped,
            started: None,
            placeholder: true,
            busy: Some(upid.clone()),
            guest_ip,
        },
    );
    Ok(json!(upid))
}

/// Whether every volume of `config` (disks, and CD-ROMs holding an image) is on a shared
/// storage, as qemu-server's `check_storage_access_clone` judges it; an unknown storage dies as
/// `PVE::Storage::storage_config` does.
fn on_shared_storage_only(
    inner: &Inner,
    config: &BTreeMap<String, String>,
) -> Result<bool, ApiError> {
    let mut shared = true;
    for (_, drive) in config.iter().filter(|(key, _)| model::is_drive_key(key)) {
        let volume = drive.split(',').next().unwrap_or_default();
        let Some((storage, _)) = volume.split_once(':') else {
            continue; // `none`, `cdrom` (the host's drive): no volume
        };
        match inner.storage(storage) {
            Some(scfg) => shared &= scfg.shared,
            None => {
                return Err(ApiError::internal(format!(
                    "storage '{storage}' does not exist"
                )));
            }
        }
    }
    Ok(shared)
}

/// The clone's final config: new MACs, uuid and vmgenid, no `template`, description only when
/// given and then verbatim (F10), everything else — `meta` included (F11) — copied.
fn cloned_config(
    source: &BTreeMap<String, String>,
    source_id: u32,
    newid: u32,
    full: bool,
    params: &Params,
) -> BTreeMap<String, String> {
    let mut config = BTreeMap::new();
    let mut disk_index = 0;
    for (key, value) in source {
        let skipped = [
            "template",
            "lock",
            "description",
            "parent",
            "vmstate",
            "runningcpu",
            "digest",
        ];
        if skipped.contains(&key.as_str()) || key.starts_with("unused") {
            continue;
        }
        let new_value = if key.starts_with("net") && key[3..].parse::<u32>().is_ok() {
            match model::net_mac(value) {
                Some(mac) => value.replacen(mac, &model::random_mac(), 1),
                None => value.clone(),
            }
        } else if model::is_drive_key(key) && value.contains(":") {
            let (volume, options) = value.split_once(',').unwrap_or((value, ""));
            let (storage, volname) = volume.split_once(':').unwrap_or(("", volume));
            let new_volume = if volname.ends_with("-cloudinit") {
                format!("{storage}:vm-{newid}-cloudinit")
            } else if model::drive_option(value, "media") == Some("cdrom") {
                volume.to_string()
            } else {
                let disk = format!("vm-{newid}-disk-{disk_index}");
                disk_index += 1;
                if full {
                    format!("{}:{disk}", params.get("storage").unwrap_or(storage))
                } else {
                    format!("{storage}:{volname}/{disk}")
                }
            };
            if options.is_empty() {
                new_volume
            } else {
                format!("{new_volume},{options}")
            }
        } else if key == "smbios1" {
            model::set_drive_option(
                &format!("x,{value}"),
                "uuid",
                &uuid::Uuid::new_v4().to_string(),
            )
            .trim_start_matches("x,")
            .to_string()
        } else if key == "vmgenid" {
            uuid::Uuid::new_v4().to_string()
        } else {
            value.clone()
        };
        config.insert(key.clone(), new_value);
    }
    let default_name = format!(
        "Copy-of-VM-{}",
        source.get("name").cloned().unwrap_or(source_id.to_string())
    );
    config.insert(
        "name".into(),
        params.get("name").map_or(default_name, str::to_string),
    );
    if let Some(description) = params.get("description") {
        config.insert("description".into(), description.to_string());
    }
    config
}
