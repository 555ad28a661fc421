//! `get`: one VM by provider ID, reading only the VM's own endpoints, so its cost does not grow
//! with the cluster (an operator resyncing N proxies would otherwise read N listings of N VMs):
//!
//! 1. `status/current` on the node the provider ID names: a task lock or `status: unknown` →
//!    `transient`, before the name is ever read (correction 1, F8). The node not knowing the VM
//!    (F2's missing config, a 404, the node failing) sends get to the cluster listing: missing
//!    there → `not-found`; a busy entry → `transient`; else the node the entry names (a VM that
//!    migrated since create is still found), whose `status/current` is read instead;
//! 2. config: name and ownership mark (no mark → `not-found`: not ours); a task lock → `transient`;
//!    `lock: suspended` → `stopped` after the mark check (Phase 5 judgment);
//! 3. the status read in 1: stopped, paused → `stopped`, prelaunch → `provisioning` (F14,
//!    correction 6);
//! 4. the agent: addresses → `running`, else the agent table in [`crate::state::agent_state`].
//!
//! A VM elsewhere with the same name is ignored: get addresses one VMID (Phase 5 judgment).

use crate::api::{ApiError, Io, Pve, Resource, VmConfig, VmStatus};
use crate::egress::provider::types::{Error, Vm, VmState};
use crate::errors::{api_missing_vm, classify};
use crate::id::VmId;
use crate::mark::Mark;
use crate::state::{Power, agent_state, entry_in_progress, power};
use crate::task::{LockState, lock_state};

/// The QEMU entry for `vmid` in a resources listing.
pub fn find_entry(entries: &[Resource], vmid: u32) -> Option<&Resource> {
    entries
        .iter()
        .find(|entry| entry.vmid == vmid && entry.is_qemu())
}

/// The contract's `vm` for a VM whose config carries `mark`.
pub fn contract_vm(
    node: &str,
    vmid: u32,
    config: &VmConfig,
    mark: &Mark,
    state: VmState,
    addresses: Vec<String>,
) -> Vm {
    Vm {
        provider_id: VmId {
            node: node.to_string(),
            vmid,
        }
        .to_string(),
        name: config.get("name").cloned().unwrap_or_default(),
        state,
        addresses,
        created_at: mark.created_at.clone(),
        uid: mark.uid.clone(),
        host: Some(node.to_string()),
    }
}

/// `get` for `id`: the VM's own endpoints on the node its provider ID names; the cluster
/// listing only when that node cannot answer for it (it migrated, or is gone).
pub fn get<I: Io>(pve: &mut Pve<'_, I>, id: &VmId) -> Result<Vm, Error> {
    let vmid = id.vmid;
    let status = match pve.vm_status(&id.node, vmid) {
        Ok(status) => status,
        Err(error) if not_on_node(&error) => return get_from_listing(pve, id),
        Err(error) => {
            return Err(classify(&format!("read status of VM {vmid}"), &error));
        }
    };
    match read_on_node(pve, &id.node, vmid, &status)? {
        Some(vm) => Ok(vm),
        // Gone from the node between two reads: migrated just now, or deleted.
        None => get_from_listing(pve, id),
    }
}

/// Whether the node's answer means the VM is not (or no longer) there: F2's missing config, a
/// 404, or the node itself failing (5xx, 595/596). The listing then says where it is, if anywhere.
fn not_on_node(error: &ApiError) -> bool {
    api_missing_vm(error)
        || matches!(error, ApiError::Http { status, .. } if *status == 404 || *status >= 500)
}

/// The pre-scaling path (entry 9): the cluster listing says whether the VM exists and where.
fn get_from_listing<I: Io>(pve: &mut Pve<'_, I>, id: &VmId) -> Result<Vm, Error> {
    let vmid = id.vmid;
    let entries = pve
        .resources()
        .map_err(|error| classify("list VMs", &error))?;
    let entry = find_entry(&entries, vmid)
        .ok_or_else(|| Error::NotFound(format!("VM {vmid} does not exist")))?;
    if entry_in_progress(entry) {
        return Err(Error::Transient(format!(
            "VM {vmid} is busy (lock {:?}, status {:?}): a task is running on it",
            entry.lock.as_deref().unwrap_or(""),
            entry.status.as_deref().unwrap_or("")
        )));
    }
    // The entry knows where the VM is now (it may have migrated since create).
    let node = if entry.node.is_empty() {
        id.node.clone()
    } else {
        entry.node.clone()
    };
    let status = match pve.vm_status(&node, vmid) {
        Err(error) if api_missing_vm(&error) => return Err(disappeared(vmid, "status")),
        other => other.map_err(|error| classify(&format!("read status of VM {vmid}"), &error))?,
    };
    read_on_node(pve, &node, vmid, &status)?.ok_or_else(|| disappeared(vmid, "config"))
}

fn disappeared(vmid: u32, what: &str) -> Error {
    Error::NotFound(format!("VM {vmid} disappeared while reading its {what}"))
}

/// Steps 1–4 on the node the VM is on, given its `status/current`; `None` when its config is
/// gone (F2).
fn read_on_node<I: Io>(
    pve: &mut Pve<'_, I>,
    node: &str,
    vmid: u32,
    status: &VmStatus,
) -> Result<Option<Vm>, Error> {
    // Correction 1, F8: a task lock (mid-clone, the VM has no name yet) or an unknown status is
    // transient before the name is ever read.
    let status_lock = lock_state(status.lock.as_deref());
    if let LockState::Held(lock) = &status_lock {
        return Err(Error::Transient(format!(
            "VM {vmid} is locked ({lock}): a task is running on it"
        )));
    }
    if status.status == "unknown" {
        return Err(Error::Transient(format!(
            "VM {vmid} has status \"unknown\": a task is running on it"
        )));
    }

    let config = match pve.vm_config(node, vmid) {
        Err(error) if api_missing_vm(&error) => return Ok(None),
        other => other.map_err(|error| classify(&format!("read config of VM {vmid}"), &error))?,
    };
    let lock = lock_state(config.get("lock").map(String::as_str));
    if let LockState::Held(lock) = &lock {
        return Err(Error::Transient(format!(
            "VM {vmid} is locked ({lock}): a task is running on it"
        )));
    }
    let mark = Mark::parse(config.get("description").map(String::as_str)).ok_or_else(|| {
        Error::NotFound(format!(
            "VM {vmid} carries no egress-operator mark: it is not ours"
        ))
    })?;
    if lock == LockState::Suspended || status_lock == LockState::Suspended {
        // Hibernated (`qm suspend --todisk`): it resumes from its saved state when a person
        // starts it; a person's to do, as a pause is.
        return Ok(Some(contract_vm(
            node,
            vmid,
            &config,
            &mark,
            VmState::Paused,
            Vec::new(),
        )));
    }

    let (state, addresses) = match power(status) {
        Power::Settled(state) => (state, Vec::new()),
        Power::Unsettled(why) => return Err(Error::Transient(format!("VM {vmid}: {why}"))),
        Power::AskAgent => agent_state(&pve.agent_interfaces(node, vmid))?,
    };
    Ok(Some(contract_vm(
        node, vmid, &config, &mark, state, addresses,
    )))
}
