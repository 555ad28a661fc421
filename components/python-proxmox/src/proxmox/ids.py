"""Provider IDs: `<node>/<vmid>`."""

import re
from dataclasses import dataclass

from .errors import permanent

MAX_VMID = 999_999_999
_NODE = re.compile(r"[A-Za-z0-9-]+")
_VMID = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class VmId:
    node: str
    vmid: int

    @staticmethod
    def parse(text: str) -> "VmId":
        """Parse `<node>/<vmid>`; anything else is `permanent` (an ID this provider never made)."""
        node, slash, vmid = text.partition("/")
        if not slash or not _NODE.fullmatch(node) or not _VMID.fullmatch(vmid) or len(vmid) > 9:
            raise permanent(f"provider ID {text!r} is not <node>/<vmid>")
        number = int(vmid)
        if not 100 <= number <= MAX_VMID:
            raise permanent(f"provider ID {text!r} is not <node>/<vmid>")
        return VmId(node, number)

    def __str__(self) -> str:
        return f"{self.node}/{self.vmid}"
