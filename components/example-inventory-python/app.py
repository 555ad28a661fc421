"""An example provider for the toy inventory service (`testdata/inventory/inventory.py`), in
Python: the smallest complete provider, to copy. The HTTP client, error classes, check reasons
and time come from `egress_guest`; this file is only the backend's rules. Its ownership mark is
the labels `managed-by=egress-operator`, `egress-uid`, `created-at` and `tag.<key>`."""
import json
import re

from egress_guest import (Endpoint, Request, Problem, call, check_operation, config, get_json, instance_state,
                          not_found, operation, percent_encode, permanent, post_json, time, NOT_FOUND, PERMANENT)
from egress_guest import check as check_health
from wit_world import exports
from wit_world.imports import egress_provider_types as wit

SCHEMA = json.dumps({"type": "object", "required": ["url"], "additionalProperties": False,
                     "properties": {"url": {"type": "string", "description": "http(s)://host[:port] of the inventory"}}})


def endpoint(text: str) -> Endpoint:
    """The inventory's endpoint from a configuration; a bad one is `permanent`."""
    return Endpoint.parse(config(text, required=["url"])["url"])


def vm_id(provider_id: str, malformed: str = NOT_FOUND) -> str:
    """The VM ID in `inv/<digits>`; any other shape names no VM of ours (`malformed`)."""
    if not re.fullmatch(r"inv/[0-9]+", provider_id):
        raise Problem(malformed, f"`{provider_id}` is no inventory ID")
    return provider_id[len("inv/"):]


def is_ours(vm: dict) -> bool:
    """Whether the ownership mark says an operator made it."""
    return vm["labels"].get("managed-by") == "egress-operator"


def instance(vm: dict) -> wit.Instance:
    state = vm["state"] if vm["state"] in ("running", "stopped", "failed") else "provisioning"
    labels = vm["labels"]
    return wit.Instance(f"inv/{vm['id']}", vm["name"], instance_state(state), [a for a in [vm["address"]] if a],
                        labels.get("created-at"), labels.get("egress-uid", ""))


class Provider(exports.Provider):
    def describe(self) -> wit.Description:
        return wit.Description("example-inventory-python", "0.1.0", "0.1.0", SCHEMA, [wit.Capability.HTTP])

    @operation
    def validate_config(self, config: str) -> None:
        endpoint(config)

    @operation
    def create(self, request: wit.CreateRequest) -> wit.Instance:
        """Idempotent by name: adopt our VM with this UID, refuse any other, else create one. The
        operator restarts a stopped VM by creating it again: start it."""
        url = endpoint(request.config)
        for vm in get_json(url, f"/vms?name={percent_encode(request.name)}"):
            if is_ours(vm) and vm["labels"].get("egress-uid") == request.uid:
                if vm["state"] == "stopped":
                    return instance(post_json(url, f"/vms/{vm['id']}/start"))
                return instance(vm)
            raise permanent(f"VM `{request.name}` exists, not ours")
        labels = {"managed-by": "egress-operator", "egress-uid": request.uid, "created-at": time.now_rfc3339()}
        labels.update({f"tag.{tag.key}": tag.value for tag in request.tags})
        body = {"name": request.name, "labels": labels, "userData": request.user_data}
        return instance(post_json(url, "/vms", body))

    @operation
    def get(self, config: str, provider_id: str) -> wit.Instance:
        """One VM; not ours, or gone, is `not-found`."""
        vm = get_json(endpoint(config), f"/vms/{vm_id(provider_id)}")
        if not is_ours(vm):
            raise not_found(f"VM {vm['id']} is not one of ours")
        return instance(vm)

    @operation
    def delete(self, config: str, provider_id: str) -> None:
        """Gone is success; a VM without our mark, or an ID we never make, is `permanent`."""
        url, path = endpoint(config), f"/vms/{vm_id(provider_id, PERMANENT)}"
        try:
            if not is_ours(get_json(url, path)):
                raise permanent(f"{provider_id} lacks our mark: not deleting it")
            call(Request.new("DELETE", url, path))
        except Problem as problem:
            if problem.kind != NOT_FOUND:
                raise

    @operation
    def list_by_tag(self, config: str, key: str, value: str) -> list:
        """Our VMs whose mark carries `tag.<key>=<value>`."""
        vms = get_json(endpoint(config), f"/vms?label={percent_encode(f'tag.{key}={value}')}")
        return [instance(vm) for vm in vms if is_ours(vm)]

    @check_operation
    def check(self, config: str) -> wit.CheckResult:
        """`GET /health` with the host's grant, answered as a reason, never an error."""
        return check_health(Request.new("GET", endpoint(config), "/health"))
