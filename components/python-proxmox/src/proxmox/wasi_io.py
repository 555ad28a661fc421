"""The component's `Io`: `wasi:http/outgoing-handler` through the host's egress broker,
`wasi:clocks` for waits and timestamps, and the contract's `log` import.

Nothing here sets `Authorization`: the broker injects the API token and verifies TLS. Every host
resource is dropped as soon as it is done with (children before parents), so a call holds a
handful of handles, well inside the host's budget.
"""

from componentize_py_types import Err, Ok
from wit_world.imports import log as wit_log
from wit_world.imports import monotonic_clock, outgoing_handler, streams, wall_clock
from wit_world.imports import wasi_http_types as http

from .api import Response, Transport, TransportKind
from .mark import rfc3339

# `blocking-write-and-flush` takes at most 4096 bytes per call (more traps).
WRITE_CHUNK = 4096
# Bytes per stream read.
READ_CHUNK = 64 * 1024
# The largest response body read (the biggest answer is a resources listing).
MAX_BODY_BYTES = 16 * 1024 * 1024

_METHODS = {"GET": http.Method_Get, "POST": http.Method_Post, "PUT": http.Method_Put, "DELETE": http.Method_Delete}

_UNREACHABLE = (
    http.ErrorCode_DnsTimeout, http.ErrorCode_DnsError, http.ErrorCode_DestinationNotFound,
    http.ErrorCode_DestinationUnavailable, http.ErrorCode_DestinationIpUnroutable,
    http.ErrorCode_ConnectionRefused, http.ErrorCode_ConnectionTerminated,
    http.ErrorCode_ConnectionTimeout, http.ErrorCode_ConnectionReadTimeout,
    http.ErrorCode_ConnectionWriteTimeout, http.ErrorCode_ConnectionLimitReached,
    http.ErrorCode_HttpResponseTimeout,
)
_TLS = (http.ErrorCode_TlsProtocolError, http.ErrorCode_TlsCertificateError, http.ErrorCode_TlsAlertReceived)
_DENIED = (http.ErrorCode_HttpRequestDenied, http.ErrorCode_DestinationIpProhibited)

_LEVELS = {"debug": wit_log.Level.DEBUG, "info": wit_log.Level.INFO, "warn": wit_log.Level.WARN}


def transport_error(code) -> Transport:
    """What a `wasi:http` error code means for the provider. The broker reports a secret file it
    could not read as `internal-error("credentials-unavailable")`."""
    if isinstance(code, _UNREACHABLE):
        kind = TransportKind.UNREACHABLE
    elif isinstance(code, _TLS):
        kind = TransportKind.TLS
    elif isinstance(code, _DENIED):
        kind = TransportKind.DENIED
    elif isinstance(code, http.ErrorCode_InternalError) and "credential" in (code.value or "").lower():
        kind = TransportKind.CREDENTIALS_UNAVAILABLE
    else:
        kind = TransportKind.OTHER
    return Transport(kind, _code_name(code))


def _code_name(code) -> str:
    name = type(code).__name__.removeprefix("ErrorCode_")
    value = getattr(code, "value", None)
    return f"{name}({value!r})" if isinstance(value, str) else name


def _stream_error(error) -> Transport:
    if isinstance(error, streams.StreamError_Closed):
        return Transport(TransportKind.OTHER, "the stream closed early")
    with error.value as io_error:
        code = http.http_error_code(io_error)
        return transport_error(code) if code is not None else Transport(TransportKind.OTHER, io_error.to_debug_string())


def _wait_response(future):
    """Block until the response, or the reason there is none, arrives."""
    while True:
        answer = future.get()
        if answer is None:
            with future.subscribe() as ready:
                ready.block()
            continue
        if isinstance(answer, Err):
            raise Transport(TransportKind.OTHER, "the response was already taken")
        inner = answer.value
        if isinstance(inner, Err):
            raise transport_error(inner.value)
        return inner.value


def _write_all(stream, body: bytes) -> None:
    """Write in chunks of at most 4 KiB; a stream the host closed once it had the declared
    Content-Length is success."""
    for start in range(0, len(body), WRITE_CHUNK):
        try:
            stream.blocking_write_and_flush(body[start:start + WRITE_CHUNK])
        except Err as error:
            if isinstance(error.value, streams.StreamError_Closed) and start + WRITE_CHUNK >= len(body):
                return
            raise _stream_error(error.value) from None


def _read_all(response) -> bytes:
    with response.consume() as body:
        with body.stream() as stream:
            chunks, size = [], 0
            while True:
                try:
                    chunk = stream.blocking_read(READ_CHUNK)
                except Err as error:
                    if isinstance(error.value, streams.StreamError_Closed):
                        break
                    raise _stream_error(error.value) from None
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise Transport(TransportKind.OTHER, f"response body larger than {MAX_BODY_BYTES} bytes")
    return b"".join(chunks)


class WasiIo:
    """`Io` over the component's imports, sending to `https://<authority>`."""

    def __init__(self, authority: str):
        self.authority = authority

    def send(self, request):
        has_body = request.method in ("POST", "PUT")
        entries = [("accept", b"application/json")]
        if request.content_type is not None:
            entries.append(("content-type", request.content_type.encode()))
        if has_body:
            # An exact length, as the recorded curl calls sent; pveproxy never saw chunked.
            entries.append(("content-length", str(len(request.body)).encode()))
        try:
            headers = http.Fields.from_list(entries)
        except Err as error:
            raise Transport(TransportKind.OTHER, f"header refused: {type(error.value).__name__}") from None
        outgoing = http.OutgoingRequest(headers)
        try:
            outgoing.set_method(_METHODS[request.method]())
            outgoing.set_scheme(http.Scheme_Https())
            outgoing.set_authority(self.authority)
            outgoing.set_path_with_query(request.path)
        except Err:
            outgoing.__exit__(None, None, None)
            raise Transport(TransportKind.OTHER, "the host refused the request line") from None
        body = outgoing.body()
        try:
            future = outgoing_handler.handle(outgoing, None)
        except Err as error:
            body.__exit__(None, None, None)
            raise transport_error(error.value) from None
        with future:
            written = None
            if has_body:
                with body.write() as stream:
                    try:
                        _write_all(stream, request.body)
                    except Transport as error:
                        written = error
            if written is not None:
                # The host stops taking the body when the request failed: the reason is in the
                # response future, and says more than a closed stream.
                body.__exit__(None, None, None)
                try:
                    _wait_response(future).__exit__(None, None, None)
                except Transport as reason:
                    raise reason from None
                raise written
            try:
                http.OutgoingBody.finish(body, None)
            except Err as error:
                raise transport_error(error.value) from None
            with _wait_response(future) as response:
                status = response.status()
                payload = _read_all(response)
        return Response(status, payload)

    def sleep_ms(self, milliseconds: int) -> None:
        if milliseconds > 0:
            with monotonic_clock.subscribe_duration(milliseconds * 1_000_000) as ready:
                ready.block()

    def monotonic_ms(self) -> int:
        return monotonic_clock.now() // 1_000_000

    def now_rfc3339(self) -> str:
        return rfc3339(wall_clock.now().seconds)

    def log(self, level: str, message: str, fields: dict) -> None:
        wit_log.emit(_LEVELS.get(level, wit_log.Level.INFO), message,
                     [wit_log.Field(str(k), str(v)) for k, v in fields.items()])
