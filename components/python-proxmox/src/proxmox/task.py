"""Tasks and waits: UPID parsing, polling a task to its end (F16), waiting out a VM lock (F7, F15)
and waiting for a started VM to run. Every wait blocks on the monotonic clock between polls
(`wasi:clocks` through the `Io` seam, no busy loop) and gives up as `transient` when its budget is
spent.
"""

import re

from .api import ApiError
from .errors import classify, transient

# UPID:<node>:<pid>:<pstart>:<starttime>:<type>:<id>:<user>: (the node may hold `-`, pstart may have
# 9 hex digits, id may be empty for imgcopy, user may be a token `u@r!tok`).
_UPID = re.compile(
    r"UPID:(?P<node>[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?):[0-9A-Fa-f]{8}:[0-9A-Fa-f]{8,9}:"
    r"[0-9A-Fa-f]{8}:(?P<kind>[^\s:]+):(?P<id>[^\s:]*):(?P<user>[^\s:]+):"
)

RUNNING, SUCCEEDED, FAILED = "running", "succeeded", "failed"


def upid_node(upid: str) -> str:
    """The node a task runs on, from its UPID; raises ValueError for anything else."""
    match = _UPID.fullmatch(upid)
    if match is None:
        raise ValueError(f"not a task id (UPID): {upid!r}")
    return match.group("node")


def task_outcome(status: dict):
    """F16: `(RUNNING|SUCCEEDED|FAILED, exitstatus)`. `OK` and `WARNINGS: <n>` are success
    (Proxmox's own `upid_status_is_error`; the predecessor's Phase 5 judgment)."""
    if status.get("status") == "running":
        return RUNNING, None
    exitstatus = status.get("exitstatus")
    if exitstatus == "OK" or (isinstance(exitstatus, str) and re.fullmatch(r"WARNINGS: [0-9]+", exitstatus)):
        return SUCCEEDED, exitstatus
    if isinstance(exitstatus, str):
        return FAILED, exitstatus
    if status.get("status") == "stopped":
        return FAILED, "task stopped without an exit status"
    return RUNNING, None


UNLOCKED, SUSPENDED, HELD = "unlocked", "suspended", "held"


def lock_state(lock) -> str:
    """F7, correction 1: any lock but `suspended` is a task holding the VM; `suspended` is a
    hibernated VM, which is no task and is never waited on (the predecessor's Phase 6 judgment)."""
    if not lock:
        return UNLOCKED
    if lock == "suspended":
        return SUSPENDED
    return HELD


def poll_until(pve, budget_seconds: int, what: str, step):
    """Call `step(pve)` until it answers something other than `None`, sleeping `pollMs` between
    calls; `transient` once `budget_seconds` have passed."""
    poll_ms = pve.config.poll_ms
    deadline = pve.io.monotonic_ms() + budget_seconds * 1000
    while True:
        done = step(pve)
        if done is not None:
            return done
        if pve.io.monotonic_ms() + poll_ms > deadline:
            raise transient(f"{what}: still not done after {budget_seconds} s")
        pve.io.sleep_ms(poll_ms)


def wait_task(pve, what: str, upid: str) -> None:
    """F16: wait for the task `upid` to end within `budgets.cloneSeconds`. A failed task is
    `transient` with its exit status, and logged."""
    try:
        node = upid_node(upid)
    except ValueError as error:
        raise transient(f"{what}: {error}") from None

    def step(pve):
        try:
            status = pve.task_status(node, upid)
        except ApiError as error:
            raise classify(what, error) from None
        outcome, exitstatus = task_outcome(status)
        return None if outcome == RUNNING else (outcome, exitstatus)

    outcome, exitstatus = poll_until(pve, pve.config.clone_seconds, what, step)
    if outcome == FAILED:
        pve.io.log("info", "proxmox task failed", {"upid": upid, "exitstatus": exitstatus})
        raise transient(f"{what}: task failed: {exitstatus}")


def wait_optional_task(pve, what: str, upid) -> None:
    """A call that may run as a task (a UPID) or synchronously (`None`)."""
    if upid is not None:
        wait_task(pve, what, upid)


def wait_unlocked(pve, node: str, vmid: int) -> dict:
    """Read a VM's config until no task holds a lock on it, within the clone budget (F7, F15).
    Returns at once on `suspended`. A VM that vanishes while we wait answers F2's `not-found`, so
    the caller decides."""
    def step(pve):
        try:
            config = pve.vm_config(node, vmid)
        except ApiError as error:
            raise classify(f"read config of VM {vmid}", error) from None
        return None if lock_state(config.get("lock")) == HELD else config

    return poll_until(pve, pve.config.clone_seconds, f"wait for VM {vmid} to be unlocked", step)


def wait_running(pve, node: str, vmid: int) -> None:
    """After the start task: only `running`/`running` ends the wait; `stopped` is `transient` at
    once; anything else (prelaunch, ...) keeps waiting, within `budgets.runningSeconds`."""
    def step(pve):
        try:
            status = pve.vm_status(node, vmid)
        except ApiError as error:
            raise classify(f"read status of VM {vmid}", error) from None
        power, qmp = status.get("status"), status.get("qmpstatus")
        if power == "running" and qmp in (None, "running"):
            return True
        if power == "stopped":
            raise transient(f"VM {vmid} stopped right after it was started")
        return None

    poll_until(pve, pve.config.running_seconds, f"wait for VM {vmid} to run", step)

