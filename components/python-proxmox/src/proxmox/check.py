"""`check`: can the provider reach and use Proxmox with the host's grant? Always a reason, never an
error.

1. `GET /version`: no answer -> `unreachable`, `certificate-invalid` (TLS),
   `credentials-unavailable` (the broker could not read the token: `internal-error
   ("credentials-unavailable")`), `misconfigured` (the grant does not cover `apiUrl`); 401 ->
   `unauthorized` (F22); 403 -> `forbidden` (F13).
2. The configured nodes exist, and the template exists and is a template -> else `misconfigured`.
"""

from egress_guest.health import MISCONFIGURED, OK, OTHER, reason_of_status, reason_of_transport

from .api import ApiError, Http, Transport
from .errors import api_missing_vm


def reason_for(error: ApiError) -> str:
    """The guest library's reasons; only 401 (F22) and 403 (F13) of the answers mean something."""
    if isinstance(error, Transport):
        return reason_of_transport(error)
    if isinstance(error, Http) and error.status in (401, 403):
        return reason_of_status(error.status)
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
