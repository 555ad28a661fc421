"""`create`: idempotent by name, adopting what it made (correction 2).

1. An empty name or UID is `permanent` (a nameless request would match a nameless mid-clone entry).
2. Look the name up in `/cluster/resources`. Our name and UID -> adopt (a running one returns at
   once). Our name without our mark, or with another UID -> `permanent`.
3. Only now read the template (a retry for an existing VM must not need it): it must be a template.
4. Allocate a VMID: start at a slot derived from the name, so a retry after a crash lands on its
   own nameless mid-clone VM (correction 2), and probe forward; every taken VMID and every F4 answer
   goes through the ownership check first.
5. Clone with name and mark (F10, F11), wait for the task (F16), read the config once unlocked (F15).
6. Write `agent=1` and our Proxmox tag (correction 7), start (F3), wait for running.

Not done here (the Rust provider does it): the NoCloud seed ISO with the request's user-data, net0
rewrites, disk resize, cores and memory. `user-data` is ignored.
"""

from dataclasses import dataclass, field
from typing import List, Tuple

from .api import ApiError
from .errors import api_missing_vm, classify, is_vmid_taken, NOT_FOUND, Problem, permanent, server_message, transient
from .get import Vm, instance, list_vms
from .mark import Mark
from .state import PROVISIONING
from .task import SUSPENDED, lock_state, wait_optional_task, wait_running, wait_task, wait_unlocked

# Correction 7: the tag every proxy VM carries (valid on every PVE version, F9).
PROXMOX_TAG = "proxy_operator"

# At most this many VMIDs are probed per create, and never more than the range holds (the
# predecessor's Phase 6 mutation: a small range must not be re-inspected in circles).
MAX_PROBES = 32


@dataclass
class CreateRequest:
    name: str
    uid: str
    tags: List[Tuple[str, str]] = field(default_factory=list)


def start_vmid(name: str, low: int, high: int) -> int:
    """Correction 2: the first VMID to try is FNV-1a of the name folded into the range, so a retry
    after a crash mid-clone comes back to the same nameless VM (the Rust provider's function)."""
    value = 0xCBF29CE484222325
    for byte in name.encode("utf-8"):
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return low + value % (high - low + 1)


def probe_sequence(name: str, low: int, high: int) -> List[int]:
    """The VMIDs to probe, in order: from the start slot, wrapping within the range, at most
    `MAX_PROBES` and at most the range's size."""
    span = high - low + 1
    start = start_vmid(name, low, high) - low
    return [low + (start + step) % span for step in range(min(span, MAX_PROBES))]


ADOPT, FOREIGN = "adopt", "foreign"


def judge(vmid: int, config: dict, name: str, uid: str) -> str:
    """Correction 2's ownership check on an unlocked (or suspended) config: another name is
    someone else's (probe past it); our name and our UID is ours (adopt it); our name with another
    UID, or with no mark, is not ours to touch (`permanent`)."""
    if config.get("name") != name:
        return FOREIGN
    mark = Mark.parse(config.get("description"))
    if mark is None:
        raise permanent(f"VM {vmid} is named {name!r} but carries no egress-operator mark: not ours to touch")
    if mark.uid != uid:
        raise permanent(f"VM {vmid} is named {name!r} but belongs to another Proxy (uid {mark.uid!r}): "
                        "not ours to touch")
    if lock_state(config.get("lock")) == SUSPENDED:
        # Ours but hibernated: not waited on and not provisioned again (Phase 6 judgment).
        raise permanent(f"VM {vmid} named {name!r} is ours but hibernated: resume or destroy it")
    return ADOPT


def clone_params(config, vmid: int, name: str, description: str, template_node: str):
    """F10, F11: a full clone named `name` carrying the mark; `storage` when set; `target` only
    when the placement node is not the template's."""
    params = [("newid", vmid), ("name", name), ("description", description), ("full", 1)]
    if config.target_storage is not None:
        params.append(("storage", config.target_storage))
    if config.placement_node != template_node:
        params.append(("target", config.placement_node))
    return params


@dataclass
class Found:
    node: str
    vmid: int
    config: dict


def _inspect(pve, node: str, vmid: int, request: CreateRequest):
    """Correction 2: wait out a task lock (a nameless mid-clone entry has one, F8) within the clone
    budget, never a `suspended` one, then judge. `None` when the VM is gone or someone else's. A VM
    whose config is not on `node` is looked up again (`_moved`) before it counts as gone."""
    try:
        config = wait_unlocked(pve, node, vmid)
    except Problem as failure:
        if failure.kind != NOT_FOUND:
            raise
        node = _moved(pve, node, vmid)
        if node is None:
            return None  # gone (a failed clone removed it)
        try:
            config = wait_unlocked(pve, node, vmid)
        except Problem as again:
            if again.kind == NOT_FOUND:
                return None
            raise
    if judge(vmid, config, request.name, request.uid) == ADOPT:
        pve.io.log("info", "adopting VM", {"vmid": str(vmid), "node": node})
        return Found(node, vmid, config)
    return None


def _moved(pve, node: str, vmid: int):
    """Where VM `vmid`, whose config `node` no longer holds, is now. A clone with `target` is listed
    on the node running it until its task ends, then moves to the target (F8, and the predecessor's
    note on cross-node clones): its new node. Not listed: `None`, it is gone. Still listed on `node`:
    `transient`, since a VM the cluster lists is never taken for gone, lest a second one be cloned
    beside it."""
    entry = next((e for e in list_vms(pve) if e.vmid == vmid and e.is_qemu()), None)
    if entry is None:
        return None
    if entry.node == node:
        raise transient(f"VM {vmid} is listed on {node}, but {node} has no config for it: retrying")
    return entry.node


def create(pve, request: CreateRequest) -> Vm:
    name = request.name
    if not name:
        raise permanent("the proxy name is empty")
    if not request.uid:
        raise permanent("the proxy UID is empty: it is the ownership mark")

    entries = list_vms(pve)
    named = [e for e in entries if e.is_qemu() and e.name == name]
    if len(named) > 1:
        ids = ", ".join(f"{e.node}/{e.vmid}" for e in named)
        raise permanent(f"several VMs are named {name!r} ({ids}): a person must remove the extra ones")
    found = _inspect(pve, named[0].node, named[0].vmid, request) if named else None

    if found is not None:
        try:
            status = pve.vm_status(found.node, found.vmid)
        except ApiError as error:
            raise classify(f"read status of VM {found.vmid}", error) from None
        if status.get("status") == "running":
            return _finish(found)  # an adopted running VM returns at once
    else:
        found = _clone(pve, entries, request)
    _provision(pve, found)
    return _finish(found)


def _finish(found: Found) -> Vm:
    mark = Mark.parse(found.config.get("description")) or Mark()
    return instance(found.node, found.vmid, found.config, mark, PROVISIONING)


def _clone(pve, entries, request: CreateRequest) -> Found:
    config = pve.config
    template = next((e for e in entries if e.vmid == config.template_vmid and e.is_qemu()), None)
    if template is None:
        raise permanent(f"template {config.template_vmid} does not exist")
    try:
        template_config = pve.vm_config(template.node, config.template_vmid)
    except ApiError as error:
        if api_missing_vm(error):
            raise permanent(f"template {config.template_vmid} does not exist") from None
        raise classify(f"read template {config.template_vmid}", error) from None
    if template_config.get("template") != "1":
        raise permanent(f"VM {config.template_vmid} is not a template")

    placement = config.placement_node
    probes = probe_sequence(request.name, config.vmid_min, config.vmid_max)
    for vmid in probes:
        taken = next((e for e in entries if e.vmid == vmid), None)
        if taken is not None:
            # Correction 2: inspect a taken VMID before probing past it (a container is not ours).
            if not taken.is_qemu():
                continue
            found = _inspect(pve, taken.node, vmid, request)
            if found is not None:
                return found
            continue
        mark = Mark(request.uid, pve.io.now_rfc3339(), list(request.tags))  # F11: our own created-at
        params = clone_params(config, vmid, request.name, mark.format(), template.node)
        what = f"clone template {config.template_vmid} to VM {vmid}"
        try:
            upid = pve.clone_vm(template.node, config.template_vmid, params)
        except ApiError as error:
            message = server_message(error)
            if message is not None and is_vmid_taken(message):
                # F4, correction 2: someone (perhaps our own crashed attempt) holds this VMID now.
                racer = next((e for e in list_vms(pve) if e.vmid == vmid and e.is_qemu()), None)
                if racer is not None:
                    found = _inspect(pve, racer.node, vmid, request)
                    if found is not None:
                        return found
                continue
            raise classify(what, error) from None
        wait_task(pve, what, upid)  # F16
        # F15: the task may end before the lock goes.
        cloned = wait_unlocked(pve, placement, vmid)
        written = Mark.parse(cloned.get("description"))
        if written is None or written.uid != request.uid:
            # F10 says the description survives the clone; a node that drops it would leave a VM
            # no later call could recognise as ours.
            raise permanent(f"VM {vmid} was cloned for {request.name!r} but the API did not keep its "
                            f"ownership mark (the description): remove VM {vmid} by hand")
        return Found(placement, vmid, cloned)
    raise transient(f"no free VMID for {request.name!r}: probed {len(probes)} VMIDs in "
                    f"{config.vmid_min}..={config.vmid_max}")


def _provision(pve, found: Found) -> None:
    """Every step is idempotent: the config write repeats, a start queues behind a lock (F3)."""
    node, vmid = found.node, found.vmid
    what = f"configure VM {vmid}"
    try:
        # Correction 7: our tag replaces the template's; agent=1 so get can read the address (F5);
        # onboot=1 so the VM starts with its host, as the Rust provider's VMs do.
        upid = pve.set_config(node, vmid, [("agent", 1), ("onboot", 1), ("tags", PROXMOX_TAG)])
    except ApiError as error:
        raise classify(what, error) from None
    wait_optional_task(pve, what, upid)

    what = f"start VM {vmid}"
    try:
        upid = pve.vm_power(node, vmid, "start")  # F3: a start queues behind a lock
    except ApiError as error:
        raise classify(what, error) from None
    try:
        wait_task(pve, what, upid)
    except Problem as failure:
        if not failure.message.endswith(f"VM {vmid} already running"):
            raise
    wait_running(pve, node, vmid)
