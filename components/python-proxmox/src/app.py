"""Export wiring of the Python Proxmox provider (`egress:provider/provider@0.1.0`): each method
parses the config, hands over to its operation's module and converts the answer into the
contract's types. The rules live in the `proxmox` package; see its docstring."""

import egress_guest
from componentize_py_types import Err
from egress_guest import Health, Problem, TransportError, check_result, error, instance_state, log, time
from wit_world import exports
from wit_world.imports import egress_provider_types as wit

from proxmox import check as check_op
from proxmox.api import Pve, Response, Transport
from proxmox.config import Config, schema_text
from proxmox.create import CreateRequest, create
from proxmox.delete import delete
from proxmox.errors import NOT_FOUND, PERMANENT
from proxmox.get import get
from proxmox.ids import VmId
from proxmox.list_by_tag import list_by_tag

NAME = "python-proxmox"
VERSION = "0.1.0"
# The contract version this provider implements (the WIT package version).
CONTRACT_VERSION = "0.1.0"
# The largest response body read (the biggest answer is a resources listing).
MAX_RESPONSE_BYTES = 16 * 1024 * 1024


class GuestIo:
    """The `Io` seam over the guest library: HTTPS to `authority` through the host's egress broker
    (the exchange call), the clocks and the contract's log."""

    def __init__(self, authority: str):
        self.authority = authority

    def send(self, request) -> Response:
        headers = [("accept", b"application/json")]
        if request.content_type is not None:
            headers.append(("content-type", request.content_type.encode()))
        # A body only where PVE takes one: the library sends its exact length (pveproxy never saw chunked).
        body = request.body if request.method in ("POST", "PUT") else None
        try:
            return egress_guest.send(egress_guest.Request(request.method, "https", self.authority, request.path,
                                                          headers, body, MAX_RESPONSE_BYTES))
        except TransportError as failure:
            raise Transport(failure.kind, failure.detail) from None

    sleep_ms = staticmethod(time.sleep_ms)
    monotonic_ms = staticmethod(time.monotonic_ms)
    now_rfc3339 = staticmethod(time.now_rfc3339)

    @staticmethod
    def log(level: str, message: str, fields: dict) -> None:
        log.log(level, message, **fields)


def _instance(vm) -> wit.Instance:
    return wit.Instance(vm.provider_id, vm.name, instance_state(vm.state), vm.addresses, vm.created_at, vm.uid)


def _run(config_text: str, operation: str, body):
    """Parse the config, run `body(pve)`, log the outcome with the number of API requests, and
    turn a `Problem` into the contract's error. Any other exception is a bug: it is reported as
    `permanent` (retrying the same input hits it again), without its traceback."""
    try:
        config = Config.parse(config_text)
    except Problem as problem:
        raise Err(error(problem)) from None
    io = GuestIo(config.authority)
    pve = Pve(io, config)
    try:
        result = body(pve)
        outcome = "ok"
    except Problem as problem:
        outcome = f"{problem.kind}: {problem.message}"
        failed = error(problem)
    except Exception as bug:  # a defect in this provider, not in the hypervisor
        outcome = f"bug: {type(bug).__name__}"
        failed = wit.Error_Permanent(f"python-proxmox {operation} failed: {type(bug).__name__}: {bug}")
    log.info("proxmox operation finished", operation=operation, requests=pve.requests, result=outcome)
    if outcome != "ok":
        raise Err(failed)
    return result


class Provider(exports.Provider):
    def describe(self) -> wit.Description:
        return wit.Description(NAME, VERSION, CONTRACT_VERSION, schema_text(), [wit.Capability.HTTP])

    def validate_config(self, config: str) -> None:
        try:
            Config.parse(config)  # no I/O
        except Problem as problem:
            raise Err(wit.Error_Permanent(problem.message)) from None

    def create(self, request: wit.CreateRequest) -> wit.Instance:
        wanted = CreateRequest(request.name, request.uid, [(t.key, t.value) for t in request.tags])
        # request.user_data is not used: this provider builds no NoCloud seed (see README).
        return _instance(_run(request.config, "create", lambda pve: create(pve, wanted)))

    def get(self, config: str, provider_id: str) -> wit.Instance:
        # A malformed ID names no VM of ours: `not-found` (docs/contract.md); delete keeps it permanent.
        return _instance(_run(config, "get", lambda pve: get(pve, _parse_id(provider_id, NOT_FOUND))))

    def delete(self, config: str, provider_id: str) -> None:
        _run(config, "delete", lambda pve: delete(pve, _parse_id(provider_id)))

    def list_by_tag(self, config: str, key: str, value: str) -> list:
        return [_instance(vm) for vm in _run(config, "list-by-tag", lambda pve: list_by_tag(pve, key, value))]

    def check(self, config: str) -> wit.CheckResult:
        try:
            parsed = Config.parse(config)
        except Problem as problem:
            return check_result(Health.of_problem(problem))
        try:
            reason, message = check_op.check(Pve(GuestIo(parsed.authority), parsed))
        except Exception as bug:  # check never fails: a defect is reported as `other`
            reason, message = check_op.OTHER, f"python-proxmox check failed: {type(bug).__name__}: {bug}"
        return check_result(Health(reason, message))


def _parse_id(provider_id: str, malformed: str = PERMANENT) -> VmId:
    try:
        return VmId.parse(provider_id)
    except Problem as problem:
        raise Problem(malformed, str(problem)) from None
