"""The HTTP client: `send` makes one request through the host's egress broker and reads the whole
response, by the broker's whole-exchange call (`egress:http-broker/exchange@0.2.0`, one call into
the host) or, when the component was built without that import or the body is larger than
`STREAM_ABOVE`, by `wasi:http/outgoing-handler`. Nothing here sets `Authorization`: the broker
injects the credential and verifies TLS.
"""

import json as _json
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from componentize_py_types import Err
from wit_world.imports import outgoing_handler, streams
from wit_world.imports import wasi_http_types as wasi

from .errors import PERMANENT, TRANSIENT, Problem, TransportError, TransportKind, class_of_status

try:  # Built with `egress:http-broker/imports@0.2.0` merged into the world (the guide's build).
    from wit_world.imports import exchange
except ImportError:  # A world without it, for a host that predates the exchange call.
    exchange = None

# The default cap on a response body; an endpoint answering more is treated as broken.
DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024
# The largest request body sent whole through the exchange call; a larger one is streamed.
STREAM_ABOVE = 1 << 20
# `blocking-write-and-flush` takes at most 4096 bytes per call (more traps the instance).
_WRITE_CHUNK = 4096
_READ_CHUNK = 1024 * 1024
# How much of an error response body a message quotes: usually the server's own explanation.
_BODY_EXCERPT_BYTES = 200


@dataclass
class Endpoint:
    """Where a backend lives: `http(s)://host[:port][/base]`, split the way `wasi:http` wants it."""

    scheme: str  # "http" or "https"
    authority: str  # host or host:port
    base_path: str = ""  # empty or "/something", never ending in "/"

    @staticmethod
    def parse(url: str) -> "Endpoint":
        """Parse `http(s)://host[:port][/path]`: no user info (the host injects credentials), no
        query or fragment. A bad URL is a `permanent` problem whose message never echoes it (user
        info could hold a password)."""
        scheme, sep, rest = url.partition("://") if isinstance(url, str) else ("", "", "")
        scheme = scheme.lower()
        if not sep or scheme not in ("http", "https"):
            raise Problem(PERMANENT, "invalid configuration: the URL must start with http:// or https://")
        authority, slash, path = rest.partition("/")
        if "@" in authority:
            raise Problem(PERMANENT, "invalid configuration: the URL must not carry user info: the host injects credentials")
        if not authority or any(c.isspace() or c in "?#" or not c.isprintable() for c in rest):
            raise Problem(PERMANENT, "invalid configuration: the URL needs a host, and no spaces, query or fragment")
        return Endpoint(scheme, authority, (slash + path).rstrip("/"))

    def path(self, path: str) -> str:
        """The full path of a request, e.g. `/api/vms` for `/vms` below the base `/api`."""
        return self.base_path + path


@dataclass
class Request:
    """A request: `headers` besides `content-length`, which `send` sets itself; `body` `None`
    for none."""

    method: str  # GET, POST, PUT, DELETE, PATCH, HEAD, or any other token
    scheme: str
    authority: str
    path_with_query: str
    headers: List[Tuple[str, bytes]] = field(default_factory=list)
    body: Optional[bytes] = None
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES

    @staticmethod
    def new(method: str, endpoint: Endpoint, path: str, *, json=None, body: Optional[bytes] = None,
            content_type: Optional[str] = None) -> "Request":
        """`method` on `path` below `endpoint`'s base path, asking for JSON; `json=` sends a value
        as a JSON body, `body=` with `content_type=` sends bytes."""
        headers = [("accept", b"application/json")]
        if json is not None:
            body, content_type = _json.dumps(json).encode(), "application/json"
        if content_type is not None:
            headers.append(("content-type", content_type.encode()))
        return Request(method, endpoint.scheme, endpoint.authority, endpoint.path(path), headers, body)


@dataclass
class Response:
    """A response: its status and its whole body."""

    status: int
    body: bytes

    def is_success(self) -> bool:
        """Whether the status is 2xx."""
        return 200 <= self.status < 300

    def decode(self):
        """The body as JSON; a body that is not JSON is `transient` (a proxy's error page, a
        backend mid-upgrade), and the message does not quote it."""
        try:
            return _json.loads(self.body)
        except ValueError as error:
            raise Problem(TRANSIENT, f"the response body is not the JSON expected: {error}") from None


def send(request: Request) -> Response:
    """Send `request` and wait for the whole response; raise `TransportError` when there is none.

    `content-length` is always exact (the body's length, or 0 for a method other than GET and HEAD
    without one), so the host never sends a body chunked, which some APIs refuse."""
    body = request.body or b""
    if exchange is not None and len(body) <= STREAM_ABOVE:
        return _send_exchange(request, body)
    return _send_wasi(request, body)


def call(request: Request) -> Response:
    """`send`, with no response or a non-2xx one raised as the `Problem` of its class
    (`class_of_status`, `TransportKind.error_class`), quoting the start of the body."""
    try:
        response = send(request)
    except TransportError as failure:
        raise failure.problem() from None
    kind = class_of_status(response.status)
    if kind is not None:
        raise Problem(kind, f"HTTP {response.status}: {excerpt(response.body)}")
    return response


def get_json(endpoint: Endpoint, path: str):
    """`GET` `path` below `endpoint` and decode the JSON answer; see `call`."""
    return call(Request.new("GET", endpoint, path)).decode()


def post_json(endpoint: Endpoint, path: str, json=None):
    """`POST` `path` below `endpoint`, with `json` as its body or none (an action such as a start),
    and decode the JSON answer; see `call`."""
    return call(Request.new("POST", endpoint, path, json=json)).decode()


def excerpt(body: bytes) -> str:
    """The first bytes of a body as text (invalid UTF-8 replaced), for messages."""
    return body[:_BODY_EXCERPT_BYTES].decode("utf-8", "replace")


def percent_encode(text: str) -> str:
    """Percent-encode a path segment or query value: everything but RFC 3986 unreserved characters
    (`A-Z a-z 0-9 - . _ ~`) becomes `%XX`."""
    unreserved = "-._~"
    return "".join(chr(b) if chr(b).isascii() and (chr(b).isalnum() or chr(b) in unreserved) else f"%{b:02X}"
                   for b in text.encode("utf-8"))


_UNREACHABLE = (
    wasi.ErrorCode_DnsTimeout, wasi.ErrorCode_DnsError, wasi.ErrorCode_DestinationNotFound,
    wasi.ErrorCode_DestinationUnavailable, wasi.ErrorCode_DestinationIpUnroutable,
    wasi.ErrorCode_ConnectionRefused, wasi.ErrorCode_ConnectionTerminated,
    wasi.ErrorCode_ConnectionTimeout, wasi.ErrorCode_ConnectionReadTimeout,
    wasi.ErrorCode_ConnectionWriteTimeout, wasi.ErrorCode_ConnectionLimitReached,
    wasi.ErrorCode_HttpResponseTimeout,
)
_TLS = (wasi.ErrorCode_TlsProtocolError, wasi.ErrorCode_TlsCertificateError, wasi.ErrorCode_TlsAlertReceived)
_DENIED = (wasi.ErrorCode_HttpRequestDenied, wasi.ErrorCode_DestinationIpProhibited)


def transport_error(code, refusal=None) -> TransportError:
    """What a `wasi:http` error code (and the broker's refusal, when the exchange call gives one)
    means: the broker reports a credential it could not read as
    `internal-error("credentials-unavailable")`."""
    if isinstance(code, _UNREACHABLE):
        kind = TransportKind.UNREACHABLE
    elif isinstance(code, _TLS):
        kind = TransportKind.TLS
    elif isinstance(code, _DENIED):
        kind = TransportKind.DENIED
    elif isinstance(code, wasi.ErrorCode_InternalError) and "credential" in (code.value or "").lower():
        kind = TransportKind.CREDENTIALS_UNAVAILABLE
    else:
        kind = TransportKind.OTHER
    name = type(code).__name__.removeprefix("ErrorCode_")
    value = getattr(code, "value", None)
    detail = f"{name}({value!r})" if isinstance(value, str) else name
    if refusal is not None:
        kind = _REFUSALS.get(refusal.name, kind)
        detail += f", refused: {refusal.name.lower().replace('_', '-')}"
    return TransportError(kind, detail)


# What a broker refusal says beyond its code; the others (a CA not there yet, too many requests
# in flight) are the code's kind.
_REFUSALS = {"NOT_GRANTED": TransportKind.DENIED, "DENIED": TransportKind.DENIED,
             "RESPONSE_UNREDACTABLE": TransportKind.DENIED, "CA_INVALID": TransportKind.TLS,
             "CREDENTIALS_UNAVAILABLE": TransportKind.CREDENTIALS_UNAVAILABLE}

_METHODS = {"GET": wasi.Method_Get, "HEAD": wasi.Method_Head, "POST": wasi.Method_Post, "PUT": wasi.Method_Put,
            "DELETE": wasi.Method_Delete, "PATCH": wasi.Method_Patch, "OPTIONS": wasi.Method_Options}


def _method(name: str):
    known = _METHODS.get(name)
    return known() if known is not None else wasi.Method_Other(name)


def _scheme(name: str):
    return wasi.Scheme_Https() if name == "https" else wasi.Scheme_Http()


def _send_exchange(request: Request, body: bytes) -> Response:
    """One call into the host; it sets `content-length` from the body itself."""
    outgoing = exchange.Request(_method(request.method), _scheme(request.scheme), request.authority,
                                request.path_with_query, list(request.headers), body)
    try:
        answer = exchange.send(outgoing, request.max_response_bytes)
    except Err as error:
        why = error.value
        if isinstance(why, exchange.ExchangeError_Failed):
            raise transport_error(why.value.code, why.value.refusal) from None
        invalid = isinstance(why, exchange.ExchangeError_HeaderInvalid)
        raise _header_refused(why.value, "its name or value is not valid" if invalid else "the host forbids guests to set it")
    return Response(answer.status, answer.body)


def _header_refused(name: str, why: str) -> TransportError:
    return TransportError(TransportKind.OTHER, f"could not set header `{name}`: {why}")


def _send_wasi(request: Request, body: bytes) -> Response:
    """`wasi:http`: the body written in pieces the host accepts, every host resource dropped as
    soon as it is done with (children before parents)."""
    headers = list(request.headers)
    if request.body is not None or request.method not in ("GET", "HEAD"):
        headers.append(("content-length", str(len(body)).encode()))
    try:
        fields = wasi.Fields.from_list(headers)
    except Err as error:
        raise _header_refused(", ".join(name for name, _ in headers), type(error.value).__name__) from None
    outgoing = wasi.OutgoingRequest(fields)
    try:
        outgoing.set_method(_method(request.method))
        outgoing.set_scheme(_scheme(request.scheme))
        outgoing.set_authority(request.authority)
        outgoing.set_path_with_query(request.path_with_query)
    except Err:
        outgoing.__exit__(None, None, None)
        raise TransportError(TransportKind.OTHER, "the host refused the request line") from None
    outgoing_body = outgoing.body()
    try:
        future = outgoing_handler.handle(outgoing, None)
    except Err as error:
        outgoing_body.__exit__(None, None, None)
        raise transport_error(error.value) from None
    with future:
        written = None
        if body:
            with outgoing_body.write() as stream:
                try:
                    _write_all(stream, body)
                except TransportError as error:
                    written = error
        if written is not None:
            # The host stops taking the body when the request failed: the reason is in the
            # response future, and says more than a closed stream.
            outgoing_body.__exit__(None, None, None)
            _wait_response(future).__exit__(None, None, None)
            raise written
        try:
            wasi.OutgoingBody.finish(outgoing_body, None)
        except Err as error:
            raise transport_error(error.value) from None
        with _wait_response(future) as response:
            status = response.status()
            payload = _read_all(response, request.max_response_bytes)
    return Response(status, payload)


def _wait_response(future):
    """Block on the pollable until the response, or the reason there is none, arrives."""
    while True:
        answer = future.get()
        if answer is None:
            with future.subscribe() as ready:
                ready.block()
            continue
        if isinstance(answer, Err):
            raise TransportError(TransportKind.OTHER, "the response was already taken")
        if isinstance(answer.value, Err):
            raise transport_error(answer.value.value)
        return answer.value.value


def _stream_error(error) -> TransportError:
    if isinstance(error, streams.StreamError_Closed):
        return TransportError(TransportKind.OTHER, "the stream closed early")
    with error.value as io_error:
        code = wasi.http_error_code(io_error)
        return transport_error(code) if code is not None else TransportError(TransportKind.OTHER, io_error.to_debug_string())


def _write_all(stream, body: bytes) -> None:
    """A stream the host closed once it had the declared Content-Length is success."""
    for start in range(0, len(body), _WRITE_CHUNK):
        try:
            stream.blocking_write_and_flush(body[start:start + _WRITE_CHUNK])
        except Err as error:
            if isinstance(error.value, streams.StreamError_Closed) and start + _WRITE_CHUNK >= len(body):
                return
            raise _stream_error(error.value) from None


def _read_all(response, max_bytes: int) -> bytes:
    chunks, size = [], 0
    with response.consume() as body:
        with body.stream() as stream:
            while True:
                try:
                    chunk = stream.blocking_read(_READ_CHUNK)
                except Err as error:
                    if isinstance(error.value, streams.StreamError_Closed):
                        break
                    raise _stream_error(error.value) from None
                chunks.append(chunk)
                size += len(chunk)
                if size > max_bytes:
                    raise TransportError(TransportKind.OTHER, f"response body larger than {max_bytes} bytes")
    return b"".join(chunks)
