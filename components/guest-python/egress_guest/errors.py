"""The contract's four error classes, and what an HTTP outcome means for them (as the Rust guest
crate's `errors.rs`).

| outcome                                             | class            |
|-----------------------------------------------------|------------------|
| 2xx                                                 | (success)        |
| 404                                                 | `not-found`      |
| 408, 429, 5xx                                       | `transient`      |
| 507 (insufficient storage)                          | `quota-exceeded` |
| other statuses (400, 401, 403, 409, 3xx, ...)       | `permanent`      |
| no response: DNS, refused, reset, timeouts          | `transient`      |
| no response: the certificate did not verify         | `permanent`      |
| no response: the broker refused the request         | `permanent`      |
| no response: the host could not read the credential | `transient` (the secret may land) |

A provider that knows its backend better (a 500 that means "no such VM") classifies those answers
first and falls back to these. Nothing here imports the component's bindings.
"""

from typing import Optional

TRANSIENT = "transient"  # retry with backoff
PERMANENT = "permanent"  # retrying cannot help until someone changes something
NOT_FOUND = "not-found"  # the thing does not exist (for get and delete: it is gone)
QUOTA_EXCEEDED = "quota-exceeded"  # the backend is out of room; retry later, slowly


class Problem(Exception):
    """A failed operation: `kind` is one of the four classes above, `message` is for operators
    (never a secret). Raise it from an operation; `contract.operation` answers it as the
    contract's `error`."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message

    def __repr__(self) -> str:
        return f"Problem({self.kind!r}, {self.message!r})"


def transient(message: str) -> Problem:
    """A `transient` problem: retry with backoff."""
    return Problem(TRANSIENT, message)


def permanent(message: str) -> Problem:
    """A `permanent` problem: retrying cannot help."""
    return Problem(PERMANENT, message)


def not_found(message: str) -> Problem:
    """A `not-found` problem: the thing does not exist."""
    return Problem(NOT_FOUND, message)


def class_of_status(status: int) -> Optional[str]:
    """The error class of an HTTP status, or `None` for 2xx."""
    if 200 <= status < 300:
        return None
    if status == 404:
        return NOT_FOUND
    if status == 507:
        return QUOTA_EXCEEDED
    if status in (408, 429) or 500 <= status < 600:
        return TRANSIENT
    return PERMANENT


class TransportKind:
    """Why a request got no response at all, as the host reported it."""

    UNREACHABLE = "unreachable"  # DNS, refused, reset, timeouts
    TLS = "tls"  # the backend's certificate did not verify
    DENIED = "denied"  # the host's broker refused the request (the grant does not cover it)
    CREDENTIALS_UNAVAILABLE = "credentials-unavailable"  # the host could not read the credential
    OTHER = "other"

    @staticmethod
    def error_class(kind: str) -> str:
        """The contract error class of a request that failed this way."""
        return PERMANENT if kind in (TransportKind.TLS, TransportKind.DENIED) else TRANSIENT


class TransportError(Exception):
    """A request that got no response: its `kind` (a `TransportKind`) and a `detail` for
    messages. `http.send` raises it."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"request failed: {detail}")
        self.kind = kind
        self.detail = detail

    def __str__(self) -> str:
        return f"request failed: {self.detail}"

    def problem(self) -> Problem:
        """The contract error of this failure, of its kind's class."""
        return Problem(TransportKind.error_class(self.kind), str(self))
