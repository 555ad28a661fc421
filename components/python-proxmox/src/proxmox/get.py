"""`get`: one VM by provider ID, in the predecessor's entry-9 order:

1. resources entry: missing -> `not-found` (F2); locked by a task or `status: unknown` ->
   `transient`, before the name is ever read (correction 1, F8);
2. config: no mark -> `not-found` (not ours); a task lock -> `transient`; `lock: suspended` ->
   `stopped`, after the mark check;
3. `status/current`: stopped, paused -> `stopped`, prelaunch -> `provisioning` (F14, correction 6);
4. the guest agent: addresses -> `running`, else `state.agent_state` (F5, F21).

A VM elsewhere with the same name is ignored: get addresses one VMID.
"""

from dataclasses import dataclass, field
from typing import List, Optional

from .api import ApiError
from .errors import api_missing_vm, classify, not_found, transient
from .ids import VmId
from .mark import Mark
from .state import ASK_AGENT, STOPPED, agent_state, entry_in_progress, power
from .task import HELD, SUSPENDED, lock_state


@dataclass
class Vm:
    """One VM as the contract's `instance` describes it (app.py converts it)."""

    provider_id: str
    name: str
    state: str
    addresses: List[str] = field(default_factory=list)
    created_at: Optional[str] = None
    uid: str = ""


def instance(node: str, vmid: int, config: dict, mark: Mark, state: str, addresses=()) -> Vm:
    return Vm(str(VmId(node, vmid)), config.get("name", ""), state, list(addresses), mark.created_at, mark.uid)


def find_entry(entries, vmid: int):
    """The QEMU entry for `vmid` in a resources listing, or `None`."""
    return next((e for e in entries if e.vmid == vmid and e.is_qemu()), None)


def list_vms(pve):
    try:
        return pve.resources()
    except ApiError as error:
        raise classify("list VMs", error) from None


def get(pve, vm_id: VmId) -> Vm:
    vmid = vm_id.vmid
    entry = find_entry(list_vms(pve), vmid)
    if entry is None:
        raise not_found(f"VM {vmid} does not exist")
    if entry_in_progress(entry):
        # Correction 1: a locked or nameless mid-clone entry is in progress, never absent.
        raise transient(f"VM {vmid} is busy (lock {entry.lock or ''!r}, status {entry.status or ''!r}): "
                        "a task is running on it")
    node = entry.node or vm_id.node  # the entry knows where the VM is now (it may have migrated)

    try:
        config = pve.vm_config(node, vmid)
    except ApiError as error:
        if api_missing_vm(error):
            raise not_found(f"VM {vmid} disappeared while reading its config") from None  # F2
        raise classify(f"read config of VM {vmid}", error) from None
    lock = lock_state(config.get("lock"))
    if lock == HELD:
        raise transient(f"VM {vmid} is locked ({config.get('lock')}): a task is running on it")  # F7
    mark = Mark.parse(config.get("description"))
    if mark is None:
        raise not_found(f"VM {vmid} carries no egress-operator mark: it is not ours")
    if lock == SUSPENDED or lock_state(entry.lock) == SUSPENDED:
        return instance(node, vmid, config, mark, STOPPED)  # hibernated: will not run by itself

    try:
        status = pve.vm_status(node, vmid)
    except ApiError as error:
        if api_missing_vm(error):
            raise not_found(f"VM {vmid} disappeared while reading its status") from None  # F2
        raise classify(f"read status of VM {vmid}", error) from None
    state = power(status)  # F14: paused is stopped
    addresses = []
    if state == ASK_AGENT:
        state, addresses = agent_state(lambda: pve.agent_interfaces(node, vmid))  # F5, F21
    return instance(node, vmid, config, mark, state, addresses)
