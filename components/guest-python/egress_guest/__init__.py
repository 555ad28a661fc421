"""egress_guest: what every Python egress provider shares, the Python twin of the Rust guest crate
`components/guest` (`egress-guest`).

A provider talks to its backend over HTTP through the host's egress broker, stamps `created-at`
from the wall clock, waits on the monotonic clock, logs, and answers errors in the contract's four
classes and `check` in its reasons. This package is that plumbing, once:

* `Endpoint.parse` the backend URL (`http(s)://host[:port][/base]`, no user info: the host injects
  credentials); `contract.config` parses a configuration, unknown keys refused.
* `Request.new(method, endpoint, path, json=...)`, then `send` it (a `Response`, or
  `TransportError` when there is none) or `call` it (a non-2xx answer or no response raised as the
  `Problem` of its class); `get_json` and `post_json` call and decode the JSON answer. The body
  goes whole through the broker's exchange call (`egress:http-broker/exchange@0.2.0`) when the
  component was built with that import, else through `wasi:http`, with an exact `content-length`
  either way.
* `Problem` and `transient` / `permanent` / `not_found`: raise them; `@operation` answers them as
  the contract's `error`. `check(request)` answers a health request as a `Health` reason;
  `@check_operation` turns it into the contract's `check-result`.
* `log.info(...)`, `time.now_rfc3339()`, `time.sleep_ms(...)`.

It imports the bindings componentize-py generates (`wit_world`), and runs on a stock CPython with
those bindings on `sys.path` (`componentize-py ... bindings <dir>`), for host-side unit tests.
It never sets `Authorization`.
"""

from . import log, time
from .health import Health, check
from .contract import check_operation, check_result, config, error, instance_state, operation
from .errors import (NOT_FOUND, PERMANENT, QUOTA_EXCEEDED, TRANSIENT, Problem, TransportError, TransportKind,
                     class_of_status, not_found, permanent, transient)
from .http import Endpoint, Request, Response, call, get_json, percent_encode, post_json, send
