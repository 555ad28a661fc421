"""What Proxmox's answers mean: whole-message matchers for the texts the provider branches on, and
the classification of every other failure into one of the contract's four error classes (the
guest library's `Problem`; Proxmox answers a missing VM with a 500, so its generic
`class_of_status` is not used).

| failure                                                    | class            |
|------------------------------------------------------------|------------------|
| 500 `Configuration file '.../<id>.conf' does not exist` (F2) | `not-found`    |
| 500 `VM is locked (...)` (F7), `can't lock file ... got timeout`, other 5xx, 408, 429 | `transient` |
| 5xx `No space left on device` / `not enough free space` (F6, not captured) | `quota-exceeded` |
| 400 (F9, F15), 401 (F22), 403 (F13), 501, other 4xx        | `permanent`      |
| no response: unreachable, timeouts, credentials unreadable | `transient`      |
| no response: TLS verification failed, the broker refused   | `permanent`      |
| a 2xx body that does not decode                            | `transient`      |
"""

import re

from egress_guest import NOT_FOUND, PERMANENT, QUOTA_EXCEEDED, TRANSIENT, Problem, not_found, permanent, transient

from .api import ApiError, Http, Transport, TransportKind

# F5: `VM <vmid> is not running`, matched as a whole message, because `is not running` alone also
# ends `QEMU guest agent is not running` (the predecessor's Phase 1 note and Phase 2 mutation).
_VM_NOT_RUNNING = re.compile(r"VM [0-9]+ is not running")
# F2: identical for GET config, GET status/current and DELETE.
_MISSING_VM = re.compile(r"Configuration file 'nodes/[^/]+/qemu-server/[0-9]+\.conf' does not exist")
# F4: a clone onto a VMID that is already taken, answered synchronously.
_VMID_TAKEN = re.compile(r"unable to create VM [0-9]+: config file already exists")


def is_vm_not_running(message: str) -> bool:
    """F5: the VM stopped between the status read and the agent call."""
    return _VM_NOT_RUNNING.fullmatch(message) is not None


def is_agent_not_running(message: str) -> bool:
    """F5: the agent is enabled but not (yet) answering (booting, or its install failed)."""
    return message == "QEMU guest agent is not running"


def is_agent_not_configured(message: str) -> bool:
    """F5: `agent` is not enabled in the VM's config (someone removed our `agent=1`)."""
    return message == "No QEMU guest agent configured"


def is_missing_vm(message: str) -> bool:
    """F2: the VM's config file does not exist."""
    return _MISSING_VM.fullmatch(message) is not None


def is_vmid_taken(message: str) -> bool:
    """F4: `unable to create VM <id>: config file already exists`."""
    return _VMID_TAKEN.fullmatch(message) is not None


def api_missing_vm(error: ApiError) -> bool:
    """Whether `error` is F2's missing VM."""
    return isinstance(error, Http) and error.status == 500 and is_missing_vm(error.message)


def server_message(error: ApiError):
    """The message of a 5xx answer, for the matchers above; `None` otherwise."""
    if isinstance(error, Http) and error.status >= 500:
        return error.message
    return None


def _out_of_space(message: str) -> bool:
    lower = message.lower()
    return "no space left on device" in lower or "not enough free space" in lower


def classify(what: str, error: ApiError) -> Problem:
    """The contract error for a failed call; `what` says what was being done ("clone VM 100123")."""
    message = f"{what}: {error}"
    if isinstance(error, Http):
        status = error.status
        if status == 500 and is_missing_vm(error.message):
            return not_found(message)  # F2
        if status >= 500 and _out_of_space(error.message):
            return Problem(QUOTA_EXCEEDED, message)  # F6: not captured on a real host
        if status == 501:
            return permanent(message)  # the API has no such method: retrying cannot help
        if status >= 500 or status in (408, 429):
            return transient(message)  # F7 locks, 5xx, 595/596
        if status == 401:
            # F22: the token was refused (the reason phrase is not exposed by wasi:http).
            return permanent(f"{message} (the API token was refused: fix the host's credentials)")
        if status == 403:
            # F13: a privilege is missing.
            return permanent(f"{message} (the API token lacks a privilege)")
        return permanent(message)  # F9, F15: parameter errors
    if isinstance(error, Transport):
        if error.kind == TransportKind.TLS:
            return permanent(f"{message} (the node's certificate did not verify)")
        if error.kind == TransportKind.DENIED:
            return permanent(f"{message} (the host's egress grant does not allow it)")
        # Unreachable, the host unable to read the token (it may land), anything else.
        return transient(message)
    return transient(message)  # Decode: a 2xx answer we could not read
