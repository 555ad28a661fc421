"""The library's outcomes as the contract's bindings (`wit_world.imports.egress_provider_types`):
a `Problem` raised from an operation answers as the contract's `error`, a `Health` as its
`check-result`, and a configuration is parsed the way the contract wants (unknown keys refused)."""

import functools
import json

from componentize_py_types import Err
from wit_world.imports import egress_provider_types as wit

from .health import OTHER, Health
from .errors import NOT_FOUND, PERMANENT, QUOTA_EXCEEDED, TRANSIENT, Problem

_ERRORS = {TRANSIENT: wit.Error_Transient, PERMANENT: wit.Error_Permanent, NOT_FOUND: wit.Error_NotFound,
           QUOTA_EXCEEDED: wit.Error_QuotaExceeded}


def error(problem: Problem):
    """The contract's `error` for `problem`."""
    return _ERRORS[problem.kind](problem.message)


def check_result(health: Health):
    """The contract's `check-result` for `health`."""
    return wit.CheckResult(wit.CheckReason[health.reason.upper().replace("-", "_")], health.message)


def instance_state(name: str):
    """The contract's `instance-state` named `name` (provisioning, running, stopped, failed)."""
    return wit.InstanceState[name.upper()]


def operation(method):
    """Decorate a provider method: a `Problem` it raises answers as the contract's error
    (`Err(...)`); any other exception is a defect of the provider, answered `permanent`
    (retrying the same input hits it again) with its type and text, without a traceback."""
    @functools.wraps(method)
    def run(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except Problem as problem:
            raise Err(error(problem)) from None
        except Err:
            raise
        except Exception as bug:
            raise Err(wit.Error_Permanent(f"{method.__name__} failed: {type(bug).__name__}: {bug}")) from None
    return run


def check_operation(method):
    """Decorate a provider's `check`, which returns a `Health`: a `Problem` raised before the
    health request (a configuration that does not parse) answers `misconfigured`, a defect
    `other`; never an error, as the contract wants."""
    @functools.wraps(method)
    def run(*args, **kwargs):
        try:
            health = method(*args, **kwargs)
        except Problem as problem:
            health = Health.of_problem(problem)
        except Exception as bug:
            health = Health(OTHER, f"check failed: {type(bug).__name__}: {bug}")
        return check_result(health)
    return run


def config(text: str, required=(), optional=()) -> dict:
    """Parse a provider configuration: a JSON object with every `required` key and no key outside
    `required` and `optional`. Anything else is `permanent`; the message names keys, never
    values (a value could be a secret pasted in the wrong place)."""
    try:
        value = json.loads(text)
    except ValueError as why:
        raise Problem(PERMANENT, f"invalid configuration: not JSON: {why}") from None
    if not isinstance(value, dict):
        raise Problem(PERMANENT, "invalid configuration: expected a JSON object")
    missing = [key for key in required if key not in value]
    unknown = sorted(set(value) - set(required) - set(optional))
    if missing or unknown:
        raise Problem(PERMANENT, f"invalid configuration: missing {missing}, unknown {unknown}")
    return value
