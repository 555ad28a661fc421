# egress-operator tasks. `just setup` once on a fresh machine, then `just demo` / `just test`.

set shell := ["bash", "-euo", "pipefail", "-c"]

components := "reference proxmox libvirt conformance-broken misbehave hostile future-contract bad-import contract-v2 libvirt-probe"

# Show the recipes.
default:
    @just --list

# Install what a fresh Debian/Ubuntu machine lacks: the wasm target, cargo-component, system packages.
setup:
    #!/usr/bin/env bash
    set -euo pipefail
    # cargo-component 0.21 builds wasm32-wasip1 beside wasm32-wasip2 and wants both targets.
    rustup target add wasm32-wasip2 wasm32-wasip1
    command -v cargo-component >/dev/null || cargo install --locked cargo-component@0.21.1
    sudo=$([ "$(id -u)" = 0 ] || echo sudo)
    export DEBIAN_FRONTEND=noninteractive
    packages="pkg-config libvirt-dev libvirt-daemon libvirt-daemon-driver-qemu qemu-system-x86 qemu-utils iproute2 dnsmasq-base openssh-server openssh-client xorriso genisoimage curl jq libsqlite3-dev python3-venv"
    install() { $sudo apt-get install -y -qq --no-install-recommends "$@" ca-certificates; }
    if ! dpkg -s $packages >/dev/null 2>&1; then
        $sudo apt-get update -qq
        # A newer qemu-utils from backports breaks the release's qemu-system: take the release's own.
        release=$(. /etc/os-release && echo "$VERSION_CODENAME")
        install $packages || install --allow-downgrades ${packages/qemu-utils/qemu-utils\/$release}
    fi
    command -v kubectl >/dev/null || { $sudo apt-get update -qq && install kubernetes-client; }

# Build every provider component with cargo-component into target/components/<name>.wasm.
build-components:
    cargo component build --manifest-path components/Cargo.toml --workspace --release --target wasm32-wasip2 --target-dir target/wasm
    mkdir -p target/components
    for c in {{ components }}; do cp "target/wasm/wasm32-wasip2/release/${c//-/_}.wasm" "target/components/$c.wasm"; done
    # The example provider is a workspace of its own, as it is when copied out of this repository.
    cargo component build --manifest-path components/example-inventory/Cargo.toml --release --target wasm32-wasip2 --target-dir target/wasm
    cp target/wasm/wasm32-wasip2/release/example_inventory.wasm target/components/example-inventory.wasm
    components/python-proxmox/build.sh
    ls -l target/components

# The same components with plain cargo (no cargo-component): proves both toolchains build them.
build-components-plain:
    cargo build --manifest-path components/Cargo.toml --workspace --release --target wasm32-wasip2 --target-dir target/wasm-plain
    cargo build --manifest-path components/example-inventory/Cargo.toml --release --target wasm32-wasip2 --target-dir target/wasm-plain

# Build the operator binary in release mode.
build: build-components
    cargo build --release -p egress-operator -p pvesim

# Run every test: host crates, guest crates' host-side unit tests, and the plain-cargo guest build.
test: build-components build-components-plain
    cargo test --manifest-path components/Cargo.toml --workspace --target-dir target/wasm-host
    cargo test --workspace

# The main job: the operator in local mode over deploy/examples/local/ (a ProviderConfig for the
# sandboxed Proxmox provider, its Secret, three Proxies) against the Proxmox VE simulator, until all
# three run with addresses; then one manifest is deleted and its VM and seed go.
demo: build
    #!/usr/bin/env bash
    set -euo pipefail
    bin=target/release/egress-operator
    state=target/demo && rm -rf "$state" && mkdir -p "$state/sim" "$state/local/components"
    target/release/pvesim --listen 127.0.0.1:0 --state-dir "$state/sim" --agent-delay-ms 3000 > "$state/pvesim.out" &
    sim=$!; trap 'kill $sim 2>/dev/null' EXIT
    for _ in $(seq 50); do grep -q '^url:' "$state/pvesim.out" 2>/dev/null && break; sleep 0.1; done
    url=$(sed -n 's/^url: //p' "$state/pvesim.out")
    echo "== the Proxmox VE simulator runs at $url"
    # The example folder, pointed at this simulator, with its token and CA.
    for file in deploy/examples/local/*.yaml; do sed "s|https://127.0.0.1:8006|$url|g" "$file" > "$state/local/$(basename "$file")"; done
    python3 - "$state" <<'PY'
    import sys
    state = sys.argv[1]
    path = f"{state}/local/secret.yaml"
    text = open(path).read()
    text = text.replace("egress@pve!operator=00000000-0000-0000-0000-000000000000", open(f"{state}/sim/token").read().strip())
    ca = "".join("    " + line + "\n" for line in open(f"{state}/sim/ca.pem").read().strip().splitlines())
    text = text[: text.index("  ca.pem: |")] + "  ca.pem: |\n" + ca
    open(path, "w").write(text)
    PY
    cp target/components/proxmox.wasm "$state/local/components/"
    echo "== egress-operator run --local $state/local (the Proxmox provider sandboxed; the broker holds the token)"
    "$bin" run --local "$state/local" --exit-when-settled --cache-dir "$state/cache"
    echo "== egress-operator get proxies --local $state/local"
    "$bin" get proxies --local "$state/local"
    vms() { curl -s --cacert "$state/sim/ca.pem" -H "Authorization: PVEAPIToken=$(cat "$state/sim/token")" "$url/api2/json/cluster/resources?type=vm" | jq -c '[.data[] | select(.template != 1) | {vmid, name, status}]'; }
    seeds() { curl -s --cacert "$state/sim/ca.pem" -H "Authorization: PVEAPIToken=$(cat "$state/sim/token")" "$url/api2/json/nodes/pv1-1/storage/proxy-seeds/content" | jq -c '[.data[].volid]'; }
    echo "== the simulator's VMs and seeds"; vms; seeds
    echo "== rm proxy-ci.yaml: the operator deletes its VM and seed"
    rm "$state/local/proxy-ci.yaml"
    "$bin" run --local "$state/local" --exit-when-settled --cache-dir "$state/cache"
    echo "== the simulator's VMs and seeds now"; vms; seeds
    [ "$(vms | jq length)" = 2 ] || { echo "expected two VMs left" >&2; exit 1; }

# Benchmarks (criterion, and the budgets table); figures land in target/criterion.
bench: build-components
    cargo bench -p egress-runtime
    cargo bench -p egress-operator --bench budgets
    cargo bench -p egress-operator --bench proxmox -- --warm-up-time 1 --measurement-time 3
    cargo bench -p egress-capability-http --bench redact -- --warm-up-time 1 --measurement-time 3
    # The Python provider beside the Rust one: size, cold compile, cached load, fresh instance, a get.
    cargo bench -p egress-operator --bench python -- --warm-up-time 1 --measurement-time 3
