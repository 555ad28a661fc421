"""The provider's configuration (camelCase JSON, unknown keys refused), its checks and the JSON
Schema `describe` publishes.

There is no token and no CA here: the host's egress broker injects `Authorization` and verifies
TLS for `apiUrl`. `validate-config` calls `Config.parse` and performs no I/O.
"""

import json
import re
from dataclasses import dataclass
from typing import List, Optional

from .errors import permanent
from .ids import MAX_VMID

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Proxmox VE provider (Python) configuration",
    "description": "Where and how proxy VMs are cloned. No token or CA: the host's egress broker "
                   "injects Authorization and verifies TLS for apiUrl.",
    "type": "object",
    "additionalProperties": False,
    "required": ["apiUrl", "nodes", "templateVmid"],
    "properties": {
        "apiUrl": {
            "description": "https://host[:port] of the Proxmox VE API (an address in the node certificate).",
            "type": "string",
            "pattern": "^[Hh][Tt][Tt][Pp][Ss]://[^/?#@\\s]+/?$",
        },
        "nodes": {
            "description": "Nodes VMs may be placed on; the first is where clones go.",
            "type": "array", "minItems": 1,
            "items": {"type": "string", "pattern": "^[A-Za-z0-9-]{1,128}$"},
        },
        "templateVmid": {
            "description": "VMID of the template to clone.",
            "type": "integer", "minimum": 100, "maximum": MAX_VMID,
        },
        "targetStorage": {
            "description": "Storage for the clone's disks; unset keeps the template's.",
            "type": "string", "pattern": "^[A-Za-z0-9_.-]{1,128}$",
        },
        "vmidRange": {
            "description": "VMIDs the provider may allocate (inclusive); must not contain templateVmid. "
                           "Default 100000..199999.",
            "type": "object", "additionalProperties": False, "required": ["min", "max"],
            "properties": {
                "min": {"type": "integer", "minimum": 100, "maximum": MAX_VMID},
                "max": {"type": "integer", "minimum": 100, "maximum": MAX_VMID},
            },
        },
        "budgets": {
            "description": "Waiting: poll interval, the budget of each task wait and lock wait, and of "
                           "the wait for running after start.",
            "type": "object", "additionalProperties": False,
            "properties": {
                "pollMs": {"type": "integer", "minimum": 10, "maximum": 60000, "default": 2000},
                "cloneSeconds": {"type": "integer", "minimum": 1, "maximum": 86400, "default": 600},
                "runningSeconds": {"type": "integer", "minimum": 1, "maximum": 86400, "default": 60},
            },
        },
    },
}

_NODE = re.compile(r"[A-Za-z0-9-]{1,128}")
_STORAGE = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def _invalid(why: str):
    return permanent(f"invalid configuration: {why}")


def _integer(value, key: str, low: int, high: int) -> int:
    # bool is an int in Python; JSON `true` is not a number here.
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _invalid(f"{key} must be an integer from {low} to {high}")
    return value


def _object(value, key: str, allowed: set) -> dict:
    if not isinstance(value, dict):
        raise _invalid(f"{key} must be an object")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise _invalid(f"unknown field `{unknown[0]}` in {key}")
    return value


def _api_authority(url) -> str:
    """`https://host[:port]`, optional trailing `/`. Plain http is refused: the broker verifies
    TLS, and the API token must never travel in clear."""
    if not isinstance(url, str) or url[:8].lower() != "https://":
        raise _invalid("apiUrl must start with https://")
    authority = url[8:]
    if authority.endswith("/"):
        authority = authority[:-1]
    if "@" in authority:
        raise _invalid("apiUrl must not carry user info: the host injects credentials")
    if not authority or any(c in authority for c in "/?#") or any(c.isspace() or not c.isprintable() for c in authority):
        raise _invalid("apiUrl must be https://host[:port] with no path (the API lives at /api2/json)")
    if authority.startswith("["):
        _, closed, after = authority[1:].partition("]")
        if not closed:
            raise _invalid("apiUrl has an unclosed `[`")
        port = after[1:] if after.startswith(":") else None
    else:
        _, colon, port = authority.partition(":")
        port = port if colon else None
    if port is not None and (not port.isdigit() or not port.isascii() or int(port) > 65535):
        raise _invalid("apiUrl has a port that is not a number from 0 to 65535")
    return authority


@dataclass
class Config:
    authority: str  # host[:port] of the API; the scheme is always https
    nodes: List[str]
    template_vmid: int
    target_storage: Optional[str]
    vmid_min: int
    vmid_max: int
    poll_ms: int
    clone_seconds: int
    running_seconds: int

    @property
    def placement_node(self) -> str:
        return self.nodes[0]

    @staticmethod
    def parse(text: str) -> "Config":
        """Parse and check a configuration; raises a `permanent` Problem saying why not."""
        try:
            raw = json.loads(text)
        except (ValueError, TypeError) as error:
            raise _invalid(f"not JSON ({error.__class__.__name__})") from None
        raw = _object(raw, "the configuration", set(SCHEMA["properties"]))
        for key in SCHEMA["required"]:
            if key not in raw:
                raise _invalid(f"missing field `{key}`")
        authority = _api_authority(raw["apiUrl"])
        nodes = raw["nodes"]
        if not isinstance(nodes, list) or not nodes:
            raise _invalid("nodes must list at least one node")
        for node in nodes:
            if not isinstance(node, str) or not _NODE.fullmatch(node):
                raise _invalid(f"nodes has an empty or invalid name {node!r}")
        template_vmid = _integer(raw["templateVmid"], "templateVmid", 100, MAX_VMID)
        target_storage = raw.get("targetStorage")
        if target_storage is not None and (not isinstance(target_storage, str) or not _STORAGE.fullmatch(target_storage)):
            raise _invalid(f"targetStorage has an empty or invalid name {target_storage!r}")
        vmid_min, vmid_max = 100_000, 199_999
        if "vmidRange" in raw:
            bounds = _object(raw["vmidRange"], "vmidRange", {"min", "max"})
            if "min" not in bounds or "max" not in bounds:
                raise _invalid("vmidRange needs min and max")
            vmid_min = _integer(bounds["min"], "vmidRange.min", 100, MAX_VMID)
            vmid_max = _integer(bounds["max"], "vmidRange.max", 100, MAX_VMID)
            if vmid_min > vmid_max:
                raise _invalid(f"vmidRange must satisfy 100 <= min <= max <= {MAX_VMID}")
        if vmid_min <= template_vmid <= vmid_max:
            raise _invalid("templateVmid must lie outside vmidRange")
        budgets = _object(raw.get("budgets", {}), "budgets", {"pollMs", "cloneSeconds", "runningSeconds"})
        return Config(
            authority=authority,
            nodes=list(nodes),
            template_vmid=template_vmid,
            target_storage=target_storage,
            vmid_min=vmid_min,
            vmid_max=vmid_max,
            poll_ms=_integer(budgets.get("pollMs", 2000), "budgets.pollMs", 10, 60_000),
            clone_seconds=_integer(budgets.get("cloneSeconds", 600), "budgets.cloneSeconds", 1, 86_400),
            running_seconds=_integer(budgets.get("runningSeconds", 60), "budgets.runningSeconds", 1, 86_400),
        )


def schema_text() -> str:
    return json.dumps(SCHEMA, indent=2)
