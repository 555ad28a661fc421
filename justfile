# egress-operator tasks. `just setup` once on a fresh machine, then `just demo` / `just test`.

set shell := ["bash", "-euo", "pipefail", "-c"]

components := "reference proxmox misbehave hostile future-contract bad-import"

# Show the recipes.
default:
    @just --list

# Install what a fresh Debian/Ubuntu machine lacks: the wasm target, cargo-component, system packages.
setup:
    # cargo-component 0.21 builds wasm32-wasip1 beside wasm32-wasip2 and wants both targets.
    rustup target add wasm32-wasip2 wasm32-wasip1
    command -v cargo-component >/dev/null || cargo install --locked cargo-component@0.21.1
    {{ if `id -u` == "0" { "" } else { "sudo " } }}bash -c 'export DEBIAN_FRONTEND=noninteractive; \
        dpkg -s pkg-config libvirt-dev libvirt-daemon libvirt-daemon-driver-qemu openssh-server openssh-client xorriso genisoimage curl jq >/dev/null 2>&1 || \
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends pkg-config libvirt-dev libvirt-daemon libvirt-daemon-driver-qemu openssh-server openssh-client xorriso genisoimage curl jq ca-certificates; }'

# Build every provider component with cargo-component into target/components/<name>.wasm.
build-components:
    cargo component build --manifest-path components/Cargo.toml --workspace --release --target wasm32-wasip2 --target-dir target/wasm
    mkdir -p target/components
    for c in {{ components }}; do cp "target/wasm/wasm32-wasip2/release/${c//-/_}.wasm" "target/components/$c.wasm"; done
    ls -l target/components

# The same components with plain cargo (no cargo-component): proves both toolchains build them.
build-components-plain:
    cargo build --manifest-path components/Cargo.toml --workspace --release --target wasm32-wasip2 --target-dir target/wasm-plain

# Build the operator binary in release mode.
build: build-components
    cargo build --release -p egress-operator -p pvesim

# Run every test: host crates, guest crates' host-side unit tests, and the plain-cargo guest build.
test: build-components build-components-plain
    cargo test --manifest-path components/Cargo.toml --workspace --target-dir target/wasm-host
    cargo test --workspace

# The main job: a Proxmox VE simulator, the Proxmox provider sandboxed, the broker holding the token.
demo: build
    #!/usr/bin/env bash
    set -euo pipefail
    bin=target/release/egress-operator
    pmx=target/components/proxmox.wasm
    state=target/demo && rm -rf "$state" && mkdir -p "$state"
    target/release/pvesim --listen 127.0.0.1:0 --state-dir "$state" --agent-delay-ms 3000 > "$state/pvesim.out" &
    sim=$!; trap 'kill $sim 2>/dev/null' EXIT
    for _ in $(seq 50); do grep -q '^url:' "$state/pvesim.out" 2>/dev/null && break; sleep 0.1; done
    url=$(sed -n 's/^url: //p' "$state/pvesim.out")
    echo "== simulator at $url (token in $state/token, CA in $state/ca.pem)"
    printf 'grants:\n  proxmox:\n    origins: ["%s"]\n    credential:\n      header: Authorization\n      format: "PVEAPIToken={secret}"\n      secretFile: %s/token\n    tls:\n      caFile: %s/ca.pem\n      http1Only: true\n' "$url" "$PWD/$state" "$PWD/$state" > "$state/grants.yaml"
    printf '{"apiUrl":"%s","nodes":["pv1-1"],"templateVmid":9001,"targetStorage":"local-lvm","isoStorage":"proxy-seeds","budgets":{"pollMs":200,"cloneSeconds":60,"runningSeconds":30}}\n' "$url" > "$state/config.json"
    call() { "$bin" provider call "$pmx" "$1" --config "$state/config.json" --grants "$state/grants.yaml" ${2:+--input "$2"}; }
    echo "== inspect"; "$bin" provider inspect "$pmx"
    echo "== check"; call check
    echo "== create"; created=$(call create '{"name":"proxy-demo","uid":"6c1f0a2e-5d7b-4b8e-9a51-0d3c2f1e7a90","tags":[{"key":"egress.io/proxy","value":"demo"}],"userData":"#cloud-config\n"}')
    echo "$created"
    id=$(jq -r .result.providerId <<<"$created")
    running() { jq -e '.result.state == "running" and (.result.addresses | length > 0)' <<<"$got" >/dev/null; }
    echo "== get until running (the guest agent answers a few seconds after start)"
    for _ in $(seq 30); do
        got=$(call get "{\"providerId\":\"$id\"}" || true)
        running && break
        sleep 1
    done
    echo "$got"
    running || { echo "the VM never reported running with an address" >&2; exit 1; }
    echo "== list-by-tag"; call list-by-tag '{"key":"egress.io/proxy","value":"demo"}'
    echo "== delete"; call delete "{\"providerId\":\"$id\"}"
    echo "== get after delete (a classified error, exit status 1)"; call get "{\"providerId\":\"$id\"}" || true
    echo "== the simulator's state: no VM but the templates, no seed left"
    curl -s --cacert "$state/ca.pem" -H "Authorization: PVEAPIToken=$(cat "$state/token")" "$url/api2/json/cluster/resources?type=vm" | head -c 600; echo
    curl -s --cacert "$state/ca.pem" -H "Authorization: PVEAPIToken=$(cat "$state/token")" "$url/api2/json/nodes/pv1-1/storage/proxy-seeds/content"; echo

# Benchmarks of the runtime (criterion); figures land in target/criterion.
bench:
    cargo bench -p egress-runtime
