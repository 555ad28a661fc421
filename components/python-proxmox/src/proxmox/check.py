"""`check`: can the provider reach and use Proxmox with the host's grant? Always a reason, never an
error.

1. `GET /version`: no answer -> `unreachable`, `certificate-invalid` (TLS),
   `credentials-unavailable` (the broker could not read the token: `internal-error
   ("credentials-unavailable")`), `misconfigured` (the grant does not cover `apiUrl`); 401 ->
   `unauthorized` (F22); 403 -> `forbidden` (F13).
2. The configured nodes exist, and the template exists and is a template -> else `misconfigured`.
"""

from .api import ApiError, Http, Transport, TransportKind
from .errors import api_missing_vm

OK = "ok"
UNREACHABLE = "unreachable"
UNAUTHORIZED = "unauthorized"
FORBIDDEN = "forbidden"
CERTIFICATE_INVALID = "certificate-invalid"
CREDENTIALS_UNAVAILABLE = "credentials-unavailable"
MISCONFIGURED = "misconfigured"
OTHER = "other"


def reason_for(error: ApiError) -> str:
    if isinstance(error, Transport):
        return {
            TransportKind.UNREACHABLE: UNREACHABLE,
            TransportKind.TLS: CERTIFICATE_INVALID,
            TransportKind.CREDENTIALS_UNAVAILABLE: CREDENTIALS_UNAVAILABLE,
            TransportKind.DENIED: MISCONFIGURED,
        }.get(error.kind, OTHER)
    if isinstance(error, Http) and error.status == 401:
        return UNAUTHORIZED  # F22
    if isinstance(error, Http) and error.status == 403:
        return FORBIDDEN  # F13
    return OTHER


def check(pve):
    """`(reason, message)`."""
    config = pve.config
    try:
        pve.version()
        nodes = pve.nodes()
    except ApiError as error:
        return reason_for(error), f"GET /version or /nodes: {error}"
    missing = [node for node in config.nodes if node not in nodes]
    if missing:
        return MISCONFIGURED, f"node {missing[0]!r} is not in the cluster (nodes: {', '.join(nodes)})"
    vmid = config.template_vmid
    try:
        template = next((e for e in pve.resources() if e.vmid == vmid and e.is_qemu()), None)
        if template is None:
            return MISCONFIGURED, f"template {vmid} does not exist (or the token cannot see it)"
        template_config = pve.vm_config(template.node, vmid)
    except ApiError as error:
        if api_missing_vm(error):
            return MISCONFIGURED, f"template {vmid} does not exist"
        return reason_for(error), f"read template {vmid}: {error}"
    if template_config.get("template") != "1":
        return MISCONFIGURED, f"VM {vmid} is not a template"
    return OK, f"Proxmox VE reachable; nodes and template {vmid} usable"
