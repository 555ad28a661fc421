#!/usr/bin/env bash
# Build the Python Proxmox provider into target/components/python-proxmox.wasm.
#
#   components/python-proxmox/build.sh            # venv (once), bindings, unit tests, component
#   components/python-proxmox/build.sh --no-test  # skip the host-side unit tests
#   components/python-proxmox/build.sh --venv-only  # only install the pinned componentize-py
#
# Needs python3 (3.11 or newer, for the generated bindings' `typing.Self`) with venv, and PyPI.
# componentize-py bundles its own CPython (3.14) and WASI libc, so nothing else is installed.
set -euo pipefail

# componentize-py 0.20.0 is the first release whose WIT parser accepts our vendored WASI 0.2.12
# (0.19.3 and older stop at `@unstable(feature = clocks-timezone) import wasi:clocks/timezone` in
# cli.wit); 0.25.1 is the newest, and its components load in wasmtime 48 under the default limits.
COMPONENTIZE_PY_VERSION=0.25.1
# The guest library (components/guest-python): bundled into the component, with the world it builds
# against (the frozen contract 0.1.0 plus the broker's exchange call; its wit/ names the contract).
GUEST=components/guest-python
WIT_DIR=$GUEST/wit
WORLD=provider

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=$root/target/py/venv
bindings=$root/target/py/bindings
out=$root/target/components/python-proxmox.wasm

if [[ "$("$venv/bin/componentize-py" --version 2>/dev/null)" != "componentize-py $COMPONENTIZE_PY_VERSION" ]]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "componentize-py==$COMPONENTIZE_PY_VERSION"
fi
if [[ "${1:-}" == "--venv-only" ]]; then
    exit 0
fi
cpy=("$venv/bin/componentize-py" -d "$root/$WIT_DIR" -w "$WORLD")

# Bindings on the host: the unit tests and editors import them; the component generates its own.
rm -rf "$bindings"
"${cpy[@]}" --quiet bindings "$bindings"

if [[ "${1:-}" != "--no-test" ]]; then
    for tests in "$root/$GUEST/tests" "$here/tests"; do
        PYTHONPATH="$here/src:$root/$GUEST:$bindings" PYTHONDONTWRITEBYTECODE=1 \
            "$venv/bin/python" -m unittest discover --start-directory "$tests" --top-level-directory "$tests"
    done
fi

mkdir -p "$(dirname "$out")"
# componentize-py's interpreter writes bytecode beside the sources it imports: give it a copy, so
# the source tree stays clean. No VIRTUAL_ENV: only src/ and the guest library (and the standard
# library) go in.
rm -rf "$root/target/py/src"
cp -r "$here/src" "$root/target/py/src"
cp -r "$root/$GUEST/egress_guest" "$root/target/py/src/"
env -u VIRTUAL_ENV "${cpy[@]}" --quiet componentize --python-path "$root/target/py/src" app --output "$out.tmp"
mv "$out.tmp" "$out"
ls -l "$out"
