//! `get`: one VM by provider ID, in entry 9's order (Phase 5):
//!
//! 1. resources entry: missing → `not-found`; locked by a task or `status: unknown` → `transient`,
//!    before the name is ever read (correction 1, F8);
//! 2. config: name and ownership mark (no mark → `not-found`: not ours); a task lock → `transient`;
//!    `lock: suspended` → `stopped` after the mark check (Phase 5 judgment);
//! 3. `status/current`: stopped, paused → `stopped`, prelaunch → `provisioning` (F14, correction 6);
//! 4. the agent: addresses → `running`, else the agent table in [`crate::state::agent_state`].
//!
//! A VM elsewhere with the same name is ignored: get addresses one VMID (Phase 5 judgment).

use crate::api::{Io, Pve, Resource, VmConfig};
use crate::egress::provider::types::{Error, Instance, InstanceState};
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

/// An instance for a VM whose config carries `mark`.
pub fn instance(
    node: &str,
    vmid: u32,
    config: &VmConfig,
    mark: &Mark,
    state: InstanceState,
    addresses: Vec<String>,
) -> Instance {
    Instance {
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
    }
}

/// `get` for `id`.
pub fn get<I: Io>(pve: &mut Pve<'_, I>, id: &VmId) -> Result<Instance, Error> {
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
    let missing =
        |what: &str| Error::NotFound(format!("VM {vmid} disappeared while reading its {what}"));

    let config = match pve.vm_config(&node, vmid) {
        Err(error) if api_missing_vm(&error) => return Err(missing("config")),
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
    if lock == LockState::Suspended || lock_state(entry.lock.as_deref()) == LockState::Suspended {
        return Ok(instance(
            &node,
            vmid,
            &config,
            &mark,
            InstanceState::Stopped,
            Vec::new(),
        ));
    }

    let status = match pve.vm_status(&node, vmid) {
        Err(error) if api_missing_vm(&error) => return Err(missing("status")),
        other => other.map_err(|error| classify(&format!("read status of VM {vmid}"), &error))?,
    };
    let (state, addresses) = match power(&status) {
        Power::Settled(state) => (state, Vec::new()),
        Power::Unsettled(why) => return Err(Error::Transient(format!("VM {vmid}: {why}"))),
        Power::AskAgent => agent_state(&pve.agent_interfaces(&node, vmid))?,
    };
    Ok(instance(&node, vmid, &config, &mark, state, addresses))
}
