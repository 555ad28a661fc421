"""A thin Proxmox VE API client over the `Io` seam.

Every success body is the envelope `{"data": ...}`; an error is the HTTP status plus a message
(F1). The client never sets `Authorization`: the host's egress broker injects the API token and
verifies TLS. Request bodies are form-encoded. The response, the transport failure's kinds and
percent-encoding are the guest library's (`egress_guest`).
"""

import json
from dataclasses import dataclass, field
from typing import Optional, Protocol

from egress_guest import Response, TransportError, TransportKind, percent_encode

API_PREFIX = "/api2/json"

# Most of a body that is not PVE-shaped kept in an error message.
_MAX_FOREIGN_BODY = 300


@dataclass
class Request:
    method: str  # GET, POST, PUT, DELETE
    path: str  # path and query, starting with API_PREFIX
    content_type: Optional[str] = None
    body: bytes = b""


class ApiError(Exception):
    """A failed API call."""


class Http(ApiError):
    """A non-2xx answer: the status and the body's trimmed `message`, or the status (F1, F22)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message

    def __str__(self) -> str:
        return f"HTTP {self.status}: {self.message}"


class Transport(ApiError, TransportError):
    """No response at all: the guest library's `TransportError` (a `TransportKind` and a detail)."""


class Decode(ApiError):
    """A 2xx answer whose body is not what the endpoint documents."""

    def __str__(self) -> str:
        return f"unexpected answer: {self.args[0] if self.args else ''}"


class Io(Protocol):
    """Everything the provider needs from outside; `app.GuestIo` (the guest library) in the component, a script in
    the host-side tests."""

    def send(self, request: Request) -> Response: ...  # raises Transport
    def sleep_ms(self, milliseconds: int) -> None: ...  # waits without spinning
    def monotonic_ms(self) -> int: ...
    def now_rfc3339(self) -> str: ...
    def log(self, level: str, message: str, fields: dict) -> None: ...


def http_error(response: Response) -> Http:
    """F1: the trimmed body `message`, else the status. A body that is not a PVE JSON envelope (a
    proxy's HTML page) is kept, cut and on one line, after the status."""
    try:
        parsed = json.loads(response.body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        message = parsed.get("message")
        if isinstance(message, str) and message.strip():
            return Http(response.status, message.strip())
    status = f"HTTP status {response.status}"
    text = " ".join(response.body.decode("utf-8", "replace").split())
    if parsed is not None or not text:
        return Http(response.status, status)  # F22: a 401 has an empty body
    cut = text[:_MAX_FOREIGN_BODY]
    return Http(response.status, f"{status}: {cut}{'…' if len(cut) < len(text) else ''}")


def data(response: Response):
    """Unwrap the `{"data": ...}` envelope of a 2xx response, or raise the error it carries."""
    if not 200 <= response.status < 300:
        raise http_error(response)
    try:
        envelope = json.loads(response.body)
    except ValueError as error:
        raise Decode(f"not JSON: {error}") from None
    if not isinstance(envelope, dict) or "data" not in envelope:
        raise Decode("no `data` in the answer")
    return envelope["data"]


def form(pairs) -> bytes:
    """`application/x-www-form-urlencoded` body of `(key, value)` pairs, in order."""
    return "&".join(f"{percent_encode(k)}={percent_encode(str(v))}" for k, v in pairs).encode("ascii")


@dataclass
class Resource:
    """One entry of `GET /cluster/resources?type=vm` (F8). Mid-clone the entry has no name,
    `status: unknown` and `lock: clone`."""

    vmid: int
    kind: str = ""
    node: str = ""
    name: Optional[str] = None
    status: Optional[str] = None
    lock: Optional[str] = None
    tags: Optional[str] = None
    template: bool = False

    @staticmethod
    def from_json(entry: dict) -> "Resource":
        if not isinstance(entry, dict) or not isinstance(entry.get("vmid"), int):
            raise Decode("a resources entry without a numeric vmid")
        return Resource(
            vmid=entry["vmid"],
            kind=_text(entry.get("type")) or "",
            node=_text(entry.get("node")) or "",
            name=_text(entry.get("name")),
            status=_text(entry.get("status")),
            lock=_text(entry.get("lock")),
            tags=_text(entry.get("tags")),
            template=_flag(entry.get("template")),
        )

    def is_qemu(self) -> bool:
        """The `type=vm` listing also returns containers."""
        return self.kind == "qemu"

    def has_tag(self, tag: str) -> bool:
        """F9: tags are `;`-separated and folded to lowercase."""
        if not self.tags:
            return False
        return any(t.lower() == tag.lower() for t in self.tags.replace(",", ";").replace(" ", ";").split(";"))


def _text(value):
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float, str)):
        return str(value)
    return None


def _flag(value) -> bool:
    """`0`/`1` or `false`/`true`, absent as false."""
    return value is True or value == 1 or value == "1"


def config_from_json(value) -> dict:
    """A VM config: every scalar as text (numbers come back as JSON numbers)."""
    if not isinstance(value, dict):
        raise Decode("VM config is not an object")
    return {key: text for key, item in value.items() if (text := _text(item)) is not None}


@dataclass
class Pve:
    """The client: the configuration plus the `Io` it sends through; it counts requests."""

    io: Io
    config: object
    requests: int = field(default=0)

    def call(self, method: str, path: str, pairs=None) -> Response:
        body = b""
        content_type = None
        if pairs is not None:
            body = form(pairs)
            content_type = "application/x-www-form-urlencoded"
        request = Request(method, API_PREFIX + path, content_type, body)
        self.requests += 1
        response = self.io.send(request)  # raises Transport
        if not 200 <= response.status < 300:
            error = http_error(response)
            self.io.log("debug", "proxmox api call failed",
                        {"method": method, "path": request.path, "error": str(error)})
            raise error
        return response

    def get(self, path: str):
        return data(self.call("GET", path))

    @staticmethod
    def vm_path(node: str, vmid: int) -> str:
        return f"/nodes/{percent_encode(node)}/qemu/{vmid}"

    def version(self):
        return self.get("/version")

    def nodes(self) -> list:
        answer = self.get("/nodes")
        if not isinstance(answer, list):
            raise Decode("nodes is not a list")
        return [n.get("node") for n in answer if isinstance(n, dict) and isinstance(n.get("node"), str)]

    def resources(self) -> list:
        """F8: `GET /cluster/resources?type=vm`."""
        answer = self.get("/cluster/resources?type=vm")
        if not isinstance(answer, list):
            raise Decode("resources is not a list")
        return [Resource.from_json(entry) for entry in answer]

    def vm_config(self, node: str, vmid: int) -> dict:
        return config_from_json(self.get(f"{self.vm_path(node, vmid)}/config"))

    def vm_status(self, node: str, vmid: int) -> dict:
        """F14: `status/current` (status, qmpstatus, lock)."""
        answer = self.get(f"{self.vm_path(node, vmid)}/status/current")
        if not isinstance(answer, dict):
            raise Decode("status is not an object")
        return answer

    def agent_interfaces(self, node: str, vmid: int) -> list:
        """F5, F21: `{"result": [{"name", "ip-addresses": [{"ip-address", "ip-address-type"}]}]}`."""
        answer = self.get(f"{self.vm_path(node, vmid)}/agent/network-get-interfaces")
        result = answer.get("result", []) if isinstance(answer, dict) else None
        if not isinstance(result, list):
            raise Decode("agent answer has no result list")
        return result

    def clone_vm(self, node: str, template: int, pairs) -> str:
        """F10, F11: a full clone with name and description (the ownership mark); a UPID."""
        return _upid(data(self.call("POST", f"{self.vm_path(node, template)}/clone", pairs)))

    def set_config(self, node: str, vmid: int, pairs):
        """`POST .../config`: a UPID when the write runs as a task, else `None`."""
        answer = data(self.call("POST", f"{self.vm_path(node, vmid)}/config", pairs))
        return None if answer is None else _upid(answer)

    def vm_power(self, node: str, vmid: int, action: str) -> str:
        """`POST .../status/start` or `.../status/stop`: a UPID."""
        return _upid(data(self.call("POST", f"{self.vm_path(node, vmid)}/status/{action}", [])))

    def destroy(self, node: str, vmid: int) -> str:
        """`DELETE .../qemu/<vmid>?purge=1&destroy-unreferenced-disks=1`: a UPID."""
        path = f"{self.vm_path(node, vmid)}?purge=1&destroy-unreferenced-disks=1"
        return _upid(data(self.call("DELETE", path)))

    def task_status(self, node: str, upid: str) -> dict:
        """F16: `GET /nodes/<node>/tasks/<upid>/status`."""
        answer = self.get(f"/nodes/{percent_encode(node)}/tasks/{percent_encode(upid)}/status")
        if not isinstance(answer, dict):
            raise Decode("task status is not an object")
        return answer


def _upid(answer) -> str:
    if not isinstance(answer, str):
        raise Decode("expected a task id (UPID)")
    return answer
