"""The ownership mark, written as the VM's description in the clone call (F10: it survives the
clone verbatim, newlines included) and read back from its config. A clone copies the template's
`meta`, so the mark carries its own creation time (F11). It also carries the request's tags, which
Proxmox's tag syntax cannot hold (F9: no `=`). The format is the Rust provider's, so either
provider recognises the other's VMs:

    egress-operator: managed
    uid: 6c1f0a2e-...
    created-at: 2026-09-18T15:02:00Z
    tag: egress.io/pool=blue

A description whose first line is not the header is not ours. A mark without a `uid:` line reads
as an empty UID, not as "unmanaged" (the predecessor's Phase 5 judgment).
"""

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

HEADER = "egress-operator: managed"


def _one_line(text: str) -> str:
    """Replace line breaks so a value cannot forge another line of the mark."""
    return text.replace("\r", " ").replace("\n", " ")


@dataclass
class Mark:
    uid: str = ""
    created_at: Optional[str] = None
    tags: List[Tuple[str, str]] = field(default_factory=list)

    def format(self) -> str:
        text = f"{HEADER}\nuid: {_one_line(self.uid)}\n"
        if self.created_at is not None:
            text += f"created-at: {_one_line(self.created_at)}\n"
        for key, value in self.tags:
            text += f"tag: {_one_line(key)}={_one_line(value)}\n"
        return text

    @staticmethod
    def parse(description: Optional[str]) -> Optional["Mark"]:
        """The mark in a VM description; `None` when the description is not a mark."""
        if description is None:
            return None
        lines = [line.rstrip("\r") for line in description.split("\n")]
        if not lines or lines[0].strip() != HEADER:
            return None
        mark = Mark()
        for line in lines[1:]:
            key, colon, value = line.partition(":")
            if not colon:
                continue
            key, value = key.strip(), value.strip()
            if key == "uid":
                mark.uid = value
            elif key == "created-at" and value:
                mark.created_at = value
            elif key == "tag":
                tag_key, equals, tag_value = value.partition("=")
                if equals:
                    mark.tags.append((tag_key, tag_value))
        return mark

    def has_tag(self, key: str, value: str) -> bool:
        return (key, value) in self.tags
