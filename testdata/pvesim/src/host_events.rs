//! What happens to guests outside the Proxmox API, injected through the admin API or
//! [`Simulator`](crate::Simulator): a person running `qm stop` on the node, and a node reboot.
//! Tests of self-healing use them to take proxies down the way a real host does.
//!
//! Simplified: a reboot does not interrupt tasks in flight, nor make the API unreachable; it
//! honours no `startup` order or delay.

use std::sync::Arc;

use crate::api::{NewTask, Server, TaskOwner, check_unlocked, qemu_on_any_node_mut, spawn_task};
use crate::reply::ApiError;
use crate::state::RunState;
use crate::tasks::Work;

/// What a node reboot did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReboot {
    /// The guests that were running or paused, all stopped now.
    pub stopped: Vec<u32>,
    /// The UPID of the `startall` task (run as `root@pam`) that starts the guests with
    /// `onboot=1` once the task latency has passed, as the node's boot does; `None` when the
    /// reboot was asked to leave them stopped.
    pub startall: Option<String>,
}

/// `qm stop <vmid>` on the VM's node: the VM is stopped when this returns, its config and disks stay,
/// and its guest agent answers as a stopped VM's does. Like `qm stop` without `--skiplock`, a
/// locked VM (mid-clone, backup, hibernated) is refused; a stopped VM stays stopped.
pub(crate) fn stop_vm(server: &Server, vmid: u32) -> Result<(), ApiError> {
    let mut inner = server.state.lock();
    let guest = qemu_on_any_node_mut(&mut inner, vmid)?;
    check_unlocked(guest)?;
    guest.power_off();
    Ok(())
}

/// Puts running VM `vmid` in the QMP state `qmpstatus` (what its guest or QEMU does: a kernel
/// panic, an I/O error, a suspend to RAM). `paused` and `stopped` come through the API instead
/// (`status/suspend`, `status/stop`).
pub(crate) fn set_qmpstatus(server: &Server, vmid: u32, qmpstatus: &str) -> Result<(), ApiError> {
    let run = RunState::from_qmp(qmpstatus)
        .filter(|run| !matches!(run, RunState::Stopped | RunState::Paused))
        .ok_or_else(|| ApiError::new(400, format!("no QMP state {qmpstatus:?} to put a VM in")))?;
    let mut inner = server.state.lock();
    let guest = qemu_on_any_node_mut(&mut inner, vmid)?;
    if guest.run == RunState::Stopped {
        return Err(ApiError::internal(format!("VM {vmid} not running")));
    }
    guest.run = run;
    Ok(())
}

/// Reboots `node`: every guest on it stops at once, those of the other nodes run on. With
/// `start_onboot`, a `startall` task of `node` then starts its guests with `onboot=1`, as
/// `pve-guests.service` does at boot; each starts as after any start, so its agent answers after
/// the agent delay. Without it the guests stay stopped, as on a host whose boot did not start
/// them.
pub(crate) fn reboot_node(
    server: &Arc<Server>,
    node: &str,
    start_onboot: bool,
) -> Result<NodeReboot, ApiError> {
    let mut inner = server.state.lock();
    if !inner.is_node(node) {
        return Err(ApiError::new(
            400,
            format!(
                "no node {node:?}: the simulator's nodes are {}",
                inner.nodes.join(", ")
            ),
        ));
    }
    let mut stopped = Vec::new();
    for (vmid, guest) in inner.guests.iter_mut().filter(|(_, g)| g.node == node) {
        if guest.run != RunState::Stopped {
            stopped.push(*vmid);
        }
        guest.power_off();
    }
    let startall = start_onboot.then(|| {
        let task = NewTask {
            node,
            task_type: "startall",
            id: "",
            task_override: None,
            work: Work::StartAll,
        };
        spawn_task(server, &mut inner, &TaskOwner::node(), task)
    });
    Ok(NodeReboot { stopped, startall })
}
