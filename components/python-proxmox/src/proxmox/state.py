"""State rules: what a resources entry, a status read and an agent answer mean for the contract's
instance state. `get` applies them in the predecessor's entry-9 order."""

import ipaddress

from .errors import (classify, is_agent_not_configured, is_agent_not_running, is_vm_not_running,
                     transient)
from .api import ApiError, Http
from .task import HELD, SUSPENDED, lock_state

PROVISIONING, RUNNING, STOPPED, FAILED = "provisioning", "running", "stopped", "failed"


def entry_in_progress(entry) -> bool:
    """Correction 1, F8: an entry locked by a task (not `suspended`) or with `status: unknown` is
    a VM in the middle of something (mid-clone it has no name yet). Never absent."""
    return lock_state(entry.lock) == HELD or entry.status == "unknown"


# F14, correction 6: QMP states that will not run by themselves are stopped; these are on their way.
_QMP_STOPPED = {"paused", "suspended", "shutdown", "guest-panicked", "io-error", "internal-error", "watchdog"}
_QMP_PROVISIONING = {"prelaunch", "inmigrate", "postmigrate", "finish-migrate", "restore-vm", "save-vm",
                     "colo", "debug"}

ASK_AGENT = "ask-agent"


def power(status: dict):
    """F14, correction 6: `status/current` tells paused from running (`/cluster/resources` shows a
    paused VM as plain running). Returns a settled state, `ASK_AGENT`, or raises `transient`."""
    state = status.get("status")
    qmp = status.get("qmpstatus")
    if state == "stopped":
        return STOPPED
    if state == "running":
        if qmp in (None, "running"):
            return ASK_AGENT
        if qmp in _QMP_STOPPED:
            return STOPPED
        if qmp in _QMP_PROVISIONING:
            return PROVISIONING
        raise transient(f"VM has QMP status {qmp!r}")
    raise transient(f"VM has status {state!r}")


def usable_ipv4(interfaces: list) -> list:
    """F21: IPv4 addresses the agent reports, in its order: not loopback, link-local,
    unspecified, broadcast or multicast, no duplicates (early in boot only `lo` may be there)."""
    addresses = []
    for interface in interfaces:
        if not isinstance(interface, dict):
            continue
        for address in interface.get("ip-addresses") or []:
            if not isinstance(address, dict) or address.get("ip-address-type") != "ipv4":
                continue
            try:
                ip = ipaddress.IPv4Address(address.get("ip-address"))
            except (ipaddress.AddressValueError, ValueError, TypeError):
                continue
            if ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast \
                    or ip == ipaddress.IPv4Address("255.255.255.255"):
                continue
            if str(ip) not in addresses:
                addresses.append(str(ip))
    return addresses


def agent_state(read_agent):
    """F5 and correction 9: the state of a running VM from its agent. `read_agent()` returns the
    interfaces or raises the API error.

    * addresses: `running` with them; none usable yet: `provisioning`;
    * `QEMU guest agent is not running`: `provisioning` (booting, or the agent install runs);
    * `No QEMU guest agent configured`: `failed` (our `agent=1` was removed: replace the VM);
    * `VM <vmid> is not running`: `transient` (it stopped between two reads);
    * anything else: `transient` (the next get re-reads the VM from the top).
    """
    try:
        interfaces = read_agent()
    except Http as error:
        if is_agent_not_running(error.message):
            return PROVISIONING, []
        if is_agent_not_configured(error.message):
            return FAILED, []
        if is_vm_not_running(error.message):
            raise transient(f"read guest agent: {error.message} (it stopped while being read)") from None
        raise transient(f"read guest agent: {error.message}") from None
    except ApiError as error:  # Transport, Decode
        failure = classify("read guest agent", error)
        raise transient(failure.message) from None
    addresses = usable_ipv4(interfaces)
    return (RUNNING if addresses else PROVISIONING), addresses


def entry_state(entry) -> str:
    """The cheap state `list-by-tag` reports from a resources entry alone (no addresses)."""
    if lock_state(entry.lock) == SUSPENDED:
        return STOPPED
    if entry_in_progress(entry):
        return PROVISIONING
    if entry.status == "running":
        return RUNNING
    if entry.status == "stopped":
        return STOPPED
    return PROVISIONING
