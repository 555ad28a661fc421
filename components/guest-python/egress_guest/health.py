"""Health: `check` answers: the contract's `check-reason`s, and a health request answered as one."""

from dataclasses import dataclass

from .errors import Problem, TransportError, TransportKind
from .http import Request, excerpt, send

OK = "ok"
UNREACHABLE = "unreachable"
UNAUTHORIZED = "unauthorized"
FORBIDDEN = "forbidden"
CERTIFICATE_INVALID = "certificate-invalid"
CREDENTIALS_UNAVAILABLE = "credentials-unavailable"
MISCONFIGURED = "misconfigured"
OTHER = "other"

_TRANSPORT_REASONS = {
    TransportKind.UNREACHABLE: UNREACHABLE,
    TransportKind.TLS: CERTIFICATE_INVALID,
    TransportKind.CREDENTIALS_UNAVAILABLE: CREDENTIALS_UNAVAILABLE,
    # The broker refused: the grant does not cover the configured URL.
    TransportKind.DENIED: MISCONFIGURED,
}


@dataclass
class Health:
    """A `check` answer: a reason (one of the constants above), never an error."""

    reason: str
    message: str

    @staticmethod
    def of_problem(problem: Problem) -> "Health":
        """A problem found before a health request could be sent (a configuration that does not
        parse) is `misconfigured`."""
        return Health(MISCONFIGURED, problem.message)


def reason_of_transport(error: TransportError) -> str:
    """The reason for a request that got no response: unreachable, certificate-invalid,
    credentials-unavailable, misconfigured (the broker's denial) or other."""
    return _TRANSPORT_REASONS.get(error.kind, OTHER)


def reason_of_status(status: int) -> str:
    """The reason for a health request's answer: 2xx ok, 401 unauthorized, 403 forbidden, 404
    misconfigured (a wrong base path), others other."""
    if 200 <= status < 300:
        return OK
    return {401: UNAUTHORIZED, 403: FORBIDDEN, 404: MISCONFIGURED}.get(status, OTHER)


def check(request: Request) -> Health:
    """Send a health request and answer why it did or did not work (`reason_of_status`,
    `reason_of_transport`)."""
    try:
        response = send(request)
    except TransportError as error:
        return Health(reason_of_transport(error), str(error))
    return Health(reason_of_status(response.status), f"HTTP {response.status}: {excerpt(response.body)}")
