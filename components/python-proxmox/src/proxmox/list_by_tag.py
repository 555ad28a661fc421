"""`list-by-tag`: every VM of ours carrying the tag `key=value`, in any state, so the operator can
find orphans.

Candidates are the QEMU entries with our Proxmox tag (correction 7); each one's config is read and
it is listed when its mark carries `key=value` (Proxmox tags cannot hold `=`, F9, so the pair lives
in the mark). Entries without a mark are left out. The state is the cheap one from the entry;
addresses are not read (`get` reads them).
"""

from .api import ApiError
from .create import PROXMOX_TAG
from .errors import api_missing_vm, classify
from .get import instance, list_vms
from .mark import Mark
from .state import entry_state


def is_candidate(entry) -> bool:
    """A QEMU VM, not a template, carrying our Proxmox tag."""
    return entry.is_qemu() and not entry.template and entry.has_tag(PROXMOX_TAG)


def list_by_tag(pve, key: str, value: str) -> list:
    found = []
    for entry in list_vms(pve):
        if not is_candidate(entry):
            continue
        try:
            config = pve.vm_config(entry.node, entry.vmid)
        except ApiError as error:
            if api_missing_vm(error):
                continue  # destroyed between the listing and this read (F2)
            raise classify(f"read config of VM {entry.vmid}", error) from None
        mark = Mark.parse(config.get("description"))
        if mark is not None and mark.has_tag(key, value):
            found.append(instance(entry.node, entry.vmid, config, mark, entry_state(entry)))
    return found
