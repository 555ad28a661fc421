"""A Proxmox VE egress provider in Python, for `egress:provider@0.1.0` (world `provider-world`).

It clones a proxy VM from a template, starts it and reads its address from the QEMU guest agent,
following the same recorded facts (F1-F23) and corrections (1-10) as the Rust provider in
`components/proxmox`; each rule cites its fact beside it. The operator's guide is
`components/python-proxmox/README.md`.

Layout (the Rust provider's, one module per operation):

* `app.py` (beside this package): export wiring, and the `Io` seam over the guest library
  `egress_guest` (`components/guest-python`: the broker's exchange call, the clocks, the log).
* Operations: `create`, `get`, `delete`, `list_by_tag`, `check`; `describe` and
  `validate-config` live in `app.py` and `config`.
* Rules over parsed API data, tested on the host with plain `python3 -m unittest`: `state`,
  `mark`, `task`, `errors`, `ids`, `config`.
* `api`: a thin PVE client over the `Io` seam. Only `app.py` calls into the host, so every
  other module runs on a stock CPython (with the generated bindings on the path, which the guest
  library imports).

The provider never sets `Authorization` and holds no token or CA: the host's egress broker injects
the token and verifies TLS. Every call runs in a fresh instance and keeps no state.
"""
