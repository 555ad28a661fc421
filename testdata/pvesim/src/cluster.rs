//! What the cluster as a whole answers: its nodes (`GET /nodes`, the node check every
//! `/nodes/{node}/…` path makes), `/cluster/resources` and `/cluster/nextid`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::access::require;
use crate::api::{Ctx, Server};
use crate::model;
use crate::params::{Params, parse_vmid};
use crate::reply::ApiError;
use crate::state::{Guest, GuestKind, RunState};

/// Whether `node` is one of the cluster's. Not recorded: pveproxy proxies a request for another
/// node to that node's address, and for a name the cluster does not know pve-cluster's
/// `remote_node_ip` falls back to resolving it, which fails with this 500 (the closest upstream
/// text; a clone's `target` is checked otherwise, see `clone.rs`).
pub(crate) fn check_node(server: &Server, node: &str) -> Result<(), ApiError> {
    if server.state.lock().is_node(node) {
        return Ok(());
    }
    Err(ApiError::internal(format!(
        "hostname lookup '{node}' failed - failed to get address info for: {node}: Name or service not known"
    )))
}

pub(crate) fn numeric(config: &BTreeMap<String, String>, key: &str, default: u64) -> u64 {
    config
        .get(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The size of the first disk in boot order, else of scsi0, for `maxdisk`.
pub(crate) fn boot_disk_bytes(config: &BTreeMap<String, String>) -> u64 {
    let from_order = config
        .get("boot")
        .and_then(|b| b.strip_prefix("order="))
        .into_iter()
        .flat_map(|order| order.split(';'))
        .filter_map(|dev| config.get(dev))
        .find(|drive| model::drive_option(drive, "media") != Some("cdrom"));
    from_order
        .or_else(|| config.get("scsi0"))
        .and_then(|drive| model::drive_option(drive, "size"))
        .and_then(model::parse_size)
        .unwrap_or(0)
}

pub(crate) fn uptime(guest: &Guest) -> u64 {
    guest.started.map_or(0, |(at, _)| at.elapsed().as_secs())
}

/// One `/cluster/resources` VM entry (F8, F14), naming the node its config lives on.
fn resource_entry(vmid: u32, guest: &Guest) -> Value {
    let node = &guest.node;
    let kind = match guest.kind {
        GuestKind::Qemu => "qemu",
        GuestKind::Lxc => "lxc",
    };
    let id = format!("{kind}/{vmid}");
    if guest.placeholder {
        // F8: mid-clone the entry has no name and an unknown status.
        let mut entry =
            json!({"id": id, "type": kind, "vmid": vmid, "node": node, "status": "unknown"});
        if let Some(lock) = guest.lock() {
            entry["lock"] = json!(lock);
        }
        return entry;
    }
    let config = &guest.config;
    let running = guest.run != RunState::Stopped;
    let name = config
        .get("name")
        .or_else(|| config.get("hostname"))
        .cloned();
    let mut entry = json!({
        "id": id,
        "type": kind,
        "vmid": vmid,
        "node": node,
        // F14: a paused VM is plain "running" here.
        "status": if running { "running" } else { "stopped" },
        "template": numeric(config, "template", 0),
        "maxcpu": numeric(config, "cores", 1) * numeric(config, "sockets", 1),
        "maxmem": numeric(config, "memory", 512) << 20,
        "maxdisk": boot_disk_bytes(config),
        "mem": if running { (numeric(config, "memory", 512) << 20) / 4 } else { 0 },
        "cpu": if running { 0.01 } else { 0.0 },
        "disk": 0, "diskread": 0, "diskwrite": 0, "netin": 0, "netout": 0,
        "uptime": uptime(guest),
    });
    if let Some(name) = name {
        entry["name"] = json!(name);
    }
    if let Some(tags) = config.get("tags") {
        entry["tags"] = json!(tags);
    }
    // F8: lock appears only when set.
    if let Some(lock) = guest.lock() {
        entry["lock"] = json!(lock);
    }
    entry
}

/// Every node, the guests on each, and each node's storages (a shared one once per node, as
/// Proxmox lists it). Guests are listed only where the token holds `VM.Audit` on `/vms/<vmid>`,
/// as pve-manager's handler filters them.
pub(crate) fn cluster_resources(
    server: &Server,
    ctx: &Ctx,
    params: &Params,
) -> Result<Value, ApiError> {
    params.allow(&["type"])?;
    let kind = params.get("type");
    if let Some(kind) = kind.filter(|k| !["vm", "storage", "node", "sdn"].contains(k)) {
        return Err(ApiError::param(
            "type",
            format!(
                "value '{kind}' does not have a value in the enumeration 'vm, storage, node, sdn'"
            ),
        ));
    }
    let inner = server.state.lock();
    let mut entries = Vec::new();
    if kind.is_none() || kind == Some("node") {
        entries.extend(inner.nodes.iter().map(|node| {
            json!({"id": format!("node/{node}"), "type": "node", "node": node, "status": "online",
            "maxcpu": 8, "maxmem": 34_359_738_368u64, "uptime": 86_400, "level": ""})
        }));
    }
    if kind.is_none() || kind == Some("vm") {
        entries.extend(
            inner
                .guests
                .iter()
                .filter(|(vmid, _)| {
                    require(&ctx.token, &format!("/vms/{vmid}"), "VM.Audit").is_ok()
                })
                .map(|(vmid, guest)| resource_entry(*vmid, guest)),
        );
    }
    if kind.is_none() || kind == Some("storage") {
        for node in &inner.nodes {
            entries.extend(inner.storages.iter().map(|s| {
                json!({"id": format!("storage/{node}/{}", s.id), "type": "storage",
                    "storage": s.id, "node": node, "status": "available", "plugintype": s.plugin,
                    "shared": u8::from(s.shared), "content": s.content.join(","), "disk": 0,
                    "maxdisk": 107_374_182_400u64})
            }));
        }
    }
    Ok(Value::Array(entries))
}

/// `GET /nodes`: every node, online, in order (the fields of `pvesh get /nodes`).
pub(crate) fn list_nodes(server: &Server, params: &Params) -> Result<Value, ApiError> {
    params.allow(&[])?;
    let inner = server.state.lock();
    let nodes = inner.nodes.iter().map(|node| {
        json!({"node": node, "id": format!("node/{node}"), "type": "node", "status": "online",
        "level": "", "cpu": 0.01, "maxcpu": 8, "mem": 4_294_967_296u64,
        "maxmem": 34_359_738_368u64, "uptime": 86_400})
    });
    Ok(Value::Array(nodes.collect()))
}

/// `GET /cluster/nextid`: VMIDs are the cluster's, so a VMID on any node is taken.
pub(crate) fn next_id(server: &Server, params: &Params) -> Result<Value, ApiError> {
    params.allow(&["vmid"])?;
    let inner = server.state.lock();
    if let Some(text) = params.get("vmid") {
        let vmid = parse_vmid("vmid", text)?;
        if inner.guests.contains_key(&vmid) {
            return Err(ApiError::param("vmid", format!("VM {vmid} already exists")));
        }
        return Ok(json!(vmid.to_string()));
    }
    // The schema says integer, but clients see a JSON string.
    match inner.next_free_vmid() {
        Some(vmid) => Ok(json!(vmid.to_string())),
        None => Err(ApiError::internal(
            "unable to get any free VMID in range [100, 1000000]",
        )),
    }
}
