"""Export wiring of the Python Proxmox provider (`egress:provider/provider@0.1.0`): each method
parses the config, hands over to its operation's module and converts the answer into the
contract's types. The rules live in the `proxmox` package; see its docstring."""

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import egress_provider_types as wit

from proxmox import check as check_op
from proxmox.api import Pve
from proxmox.config import Config, schema_text
from proxmox.create import CreateRequest, create
from proxmox.delete import delete
from proxmox.errors import NOT_FOUND, PERMANENT, QUOTA_EXCEEDED, TRANSIENT, Failure
from proxmox.get import get
from proxmox.ids import VmId
from proxmox.list_by_tag import list_by_tag
from proxmox.wasi_io import WasiIo

NAME = "python-proxmox"
VERSION = "0.1.0"
# The contract version this provider implements (the WIT package version).
CONTRACT_VERSION = "0.1.0"

_ERRORS = {
    TRANSIENT: wit.Error_Transient,
    PERMANENT: wit.Error_Permanent,
    NOT_FOUND: wit.Error_NotFound,
    QUOTA_EXCEEDED: wit.Error_QuotaExceeded,
}
_STATES = {
    "provisioning": wit.InstanceState.PROVISIONING,
    "running": wit.InstanceState.RUNNING,
    "stopped": wit.InstanceState.STOPPED,
    "failed": wit.InstanceState.FAILED,
}
_REASONS = {
    check_op.OK: wit.CheckReason.OK,
    check_op.UNREACHABLE: wit.CheckReason.UNREACHABLE,
    check_op.UNAUTHORIZED: wit.CheckReason.UNAUTHORIZED,
    check_op.FORBIDDEN: wit.CheckReason.FORBIDDEN,
    check_op.CERTIFICATE_INVALID: wit.CheckReason.CERTIFICATE_INVALID,
    check_op.CREDENTIALS_UNAVAILABLE: wit.CheckReason.CREDENTIALS_UNAVAILABLE,
    check_op.MISCONFIGURED: wit.CheckReason.MISCONFIGURED,
    check_op.OTHER: wit.CheckReason.OTHER,
}


def _instance(vm) -> wit.Instance:
    return wit.Instance(vm.provider_id, vm.name, _STATES[vm.state], vm.addresses, vm.created_at, vm.uid)


def _run(config_text: str, operation: str, body):
    """Parse the config, run `body(pve)`, log the outcome with the number of API requests, and
    turn a `Failure` into the contract's error. Any other exception is a bug: it is reported as
    `permanent` (retrying the same input hits it again), without its traceback."""
    try:
        config = Config.parse(config_text)
    except Failure as failure:
        raise Err(_ERRORS[failure.kind](failure.message)) from None
    io = WasiIo(config.authority)
    pve = Pve(io, config)
    try:
        result = body(pve)
        outcome = "ok"
    except Failure as failure:
        outcome = f"{failure.kind}: {failure.message}"
        error = _ERRORS[failure.kind](failure.message)
    except Exception as bug:  # a defect in this provider, not in the hypervisor
        outcome = f"bug: {type(bug).__name__}"
        error = wit.Error_Permanent(f"python-proxmox {operation} failed: {type(bug).__name__}: {bug}")
    io.log("info", "proxmox operation finished",
           {"operation": operation, "requests": str(pve.requests), "result": outcome})
    if outcome != "ok":
        raise Err(error)
    return result


class Provider(exports.Provider):
    def describe(self) -> wit.Description:
        return wit.Description(NAME, VERSION, CONTRACT_VERSION, schema_text(), [wit.Capability.HTTP])

    def validate_config(self, config: str) -> None:
        try:
            Config.parse(config)  # no I/O
        except Failure as failure:
            raise Err(wit.Error_Permanent(failure.message)) from None

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
        except Failure as failure:
            return wit.CheckResult(wit.CheckReason.MISCONFIGURED, failure.message)
        try:
            reason, message = check_op.check(Pve(WasiIo(parsed.authority), parsed))
        except Exception as bug:  # check never fails: a defect is reported as `other`
            reason, message = check_op.OTHER, f"python-proxmox check failed: {type(bug).__name__}: {bug}"
        return wit.CheckResult(_REASONS[reason], message)


def _parse_id(provider_id: str, malformed: str = PERMANENT) -> VmId:
    try:
        return VmId.parse(provider_id)
    except Failure as failure:
        raise Failure(malformed, str(failure)) from None
