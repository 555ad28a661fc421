"""`delete`: idempotent, and never destroys a VM that is not ours.

1. No entry, or F2 at any step -> already gone: success.
2. An entry locked by a task or mid-clone (correction 1) -> `transient`.
3. No egress-operator mark -> `permanent`: not ours, never destroyed. A hibernated VM
   (`lock: suspended`) -> `permanent` (resume or destroy it by hand).
4. Not stopped -> stop and wait for the task (F16); then destroy with
   `purge=1&destroy-unreferenced-disks=1` and wait. (No seed to delete: this provider makes none.)
"""

from .api import ApiError
from .errors import api_missing_vm, classify, permanent, transient
from .get import find_entry, list_vms
from .ids import VmId
from .mark import Mark
from .state import entry_in_progress
from .task import HELD, SUSPENDED, lock_state, wait_task


def delete(pve, vm_id: VmId) -> None:
    vmid = vm_id.vmid
    entry = find_entry(list_vms(pve), vmid)
    if entry is None:
        return  # F2: already gone
    if entry_in_progress(entry):
        raise transient(f"VM {vmid} is busy (a task holds it): delete waits for it")  # correction 1
    node = entry.node
    try:
        config = pve.vm_config(node, vmid)
    except ApiError as error:
        if api_missing_vm(error):
            return  # F2
        raise classify(f"read config of VM {vmid}", error) from None
    if Mark.parse(config.get("description")) is None:
        raise permanent(f"VM {vmid} carries no egress-operator mark: it is not ours and is never destroyed")
    lock = lock_state(config.get("lock"))
    if lock == HELD:
        raise transient(f"VM {vmid} is locked ({config.get('lock')}): delete waits for it")  # F7
    if lock == SUSPENDED:
        raise permanent(f"VM {vmid} is hibernated (lock suspended): resume or destroy it by hand")

    try:
        status = pve.vm_status(node, vmid)
    except ApiError as error:
        if api_missing_vm(error):
            return
        raise classify(f"read status of VM {vmid}", error) from None
    if status.get("status") != "stopped":
        what = f"stop VM {vmid}"
        try:
            upid = pve.vm_power(node, vmid, "stop")
        except ApiError as error:
            if api_missing_vm(error):
                return
            raise classify(what, error) from None
        wait_task(pve, what, upid)
    what = f"destroy VM {vmid}"
    try:
        upid = pve.destroy(node, vmid)
    except ApiError as error:
        if api_missing_vm(error):
            return
        raise classify(what, error) from None
    wait_task(pve, what, upid)
