# egress-operator tasks. `just setup` once on a fresh machine, then `just demo` / `just test`.

set shell := ["bash", "-euo", "pipefail", "-c"]

components := "reference proxmox libvirt conformance-broken misbehave hostile future-contract bad-import contract-v2 libvirt-probe"

# Show the recipes.
default:
    @just --list

# Install what a fresh Debian/Ubuntu machine lacks for the demo: the wasm targets, system packages.
setup:
    #!/usr/bin/env bash
    set -euo pipefail
    # cargo-component 0.21 builds wasm32-wasip1 beside wasm32-wasip2 and wants both targets.
    rustup target add wasm32-wasip2 wasm32-wasip1
    sudo=$([ "$(id -u)" = 0 ] || echo sudo)
    export DEBIAN_FRONTEND=noninteractive
    # libvirt and qemu: the KVM lab of the demo and the tests; mtools, syslinux, cpio: its guest
    # image (testdata/guest-image/build.sh). docker-registry: the CNCF distribution registry the
    # OCI tests push providers to and pull them from.
    packages="pkg-config libvirt-dev libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86 qemu-utils iproute2 dnsmasq-base openssh-server openssh-client xorriso genisoimage curl jq libsqlite3-dev python3-venv mtools syslinux cpio docker-registry openssl"
    install() { $sudo apt-get install -y -qq --no-install-recommends "$@" ca-certificates; }
    if ! dpkg -s $packages >/dev/null 2>&1; then
        $sudo apt-get update -qq
        # A newer qemu-utils from backports breaks the release's qemu-system: take the release's own.
        release=$(. /etc/os-release && echo "$VERSION_CODENAME")
        install $packages || install --allow-downgrades ${packages/qemu-utils/qemu-utils\/$release}
    fi

# What `just test` needs beyond `just setup`: cargo-component, and a real Kubernetes control plane
# (kube-apiserver, etcd and kubectl built from their Go modules into target/controlplane; kept
# when its sources are unchanged).
setup-test: setup
    command -v cargo-component >/dev/null || cargo install --locked cargo-component@0.21.1
    testdata/controlplane/build.sh target/controlplane

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
    cargo build --release -p egress-operator -p pvesim -p kvmlab

# What the demo runs, and nothing else: the Proxmox and libvirt providers (plain cargo, no
# cargo-component needed), the operator, the simulator, the KVM lab and its guest image.
build-demo:
    cargo build --manifest-path components/Cargo.toml -p proxmox -p libvirt --release --target wasm32-wasip2 --target-dir target/wasm-plain
    mkdir -p target/components
    for c in proxmox libvirt; do cp "target/wasm-plain/wasm32-wasip2/release/$c.wasm" "target/components/$c.wasm"; done
    cargo build --profile quick-release -p egress-operator -p pvesim -p kvmlab
    bash testdata/guest-image/build.sh target/guest-image

# Run every test: host crates, guest crates' host-side unit tests, and the plain-cargo guest build.
test: setup-test build-components build-components-plain
    cargo test --manifest-path components/Cargo.toml --workspace --target-dir target/wasm-host
    cargo test --workspace

# The main job: the operator in local mode over deploy/examples/local/ (a ProviderConfig for the
# sandboxed Proxmox provider, its Secret, three Proxies, a ProxyPool of three spread across the
# simulator's two nodes) against the Proxmox VE simulator, and,
# where this machine can run libvirtd, deploy/examples/local-kvm/ (the libvirt provider, one Proxy)
# on a KVM lab of the machine's own; until every Proxy runs with an address. Then the pool's
# user-data changes and is rolled through one VM at a time, and one manifest is deleted and its VM
# and seed go.
demo: build-demo
    #!/usr/bin/env bash
    set -euo pipefail
    bin=target/quick-release/egress-operator
    state=target/demo && rm -rf "$state" && mkdir -p "$state/sim" "$state/local/components"
    # Two nodes, and a proxy service of its own on port 3128 at each VM's address (on the loopback).
    target/quick-release/pvesim --listen 127.0.0.1:0 --state-dir "$state/sim" --agent-delay-ms 3000 --nodes pv1-1,pv1-2 --service-port 3128 > "$state/pvesim.out" &
    sim=$!; lab=
    trap 'kill $sim $lab 2>/dev/null; [ -z "$lab" ] || wait $lab 2>/dev/null' EXIT
    for _ in $(seq 50); do grep -q '^url:' "$state/pvesim.out" 2>/dev/null && break; sleep 0.1; done
    url=$(sed -n 's/^url: //p' "$state/pvesim.out")
    echo "== the Proxmox VE simulator runs at $url, nodes $(sed -n 's/^nodes: //p' "$state/pvesim.out")"
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
    # The KVM part: a lab on this machine's libvirtd (a pool, a DHCP network, a guest image on an
    # HTTPS origin), when libvirtd runs or can be started here.
    target/quick-release/kvmlab --state-dir "$PWD/$state/kvm" > "$state/kvmlab.out" 2> "$state/kvmlab.err" &
    lab=$!; kvm=
    for _ in $(seq 600); do
        grep -q '^ca:' "$state/kvmlab.out" 2>/dev/null && { kvm=yes; break; }
        kill -0 $lab 2>/dev/null || break
        sleep 0.1
    done
    if [ -n "$kvm" ]; then
        python3 - "$state" <<'PY'
    import sys
    state = sys.argv[1]
    lab = dict(line.split(": ", 1) for line in open(f"{state}/kvmlab.out").read().splitlines())
    origin = lab["image-url"].rsplit("/", 1)[0]
    ca = "".join("    " + line + "\n" for line in open(lab["ca"]).read().strip().splitlines())
    for name in ["providerconfig.yaml", "proxy-edge.yaml"]:
        text = open(f"deploy/examples/local-kvm/{name}").read()
        for key, plural in [("pool", "pools"), ("network", "networks")]:
            text = text.replace(f"{key}: default", f"{key}: {lab[key]}").replace(f"{plural}: [default]", f"{plural}: [{lab[key]}]")
        text = text.replace("https://images.lab.example/egress-test-guest.qcow2", lab["image-url"])
        text = text.replace("https://images.lab.example", origin).replace("0" * 64, lab["image-sha256"])
        if "  ca.pem: |" in text:
            text = text[: text.index("  ca.pem: |")] + "  ca.pem: |\n" + ca
        open(f"{state}/local/kvm-{name}", "w").write(text)
    PY
        cp target/components/libvirt.wasm "$state/local/components/"
        echo "== the KVM lab runs on this machine's libvirtd: pool $(sed -n 's/^pool: //p' "$state/kvmlab.out"), network $(sed -n 's/^network: //p' "$state/kvmlab.out"), its guest image on $(sed -n 's/^image-url: //p' "$state/kvmlab.out")"
    else
        echo "== no KVM part here: libvirtd does not run and cannot be started on this machine (it needs root): $(tail -n 1 "$state/kvmlab.err")"
        echo "   the Proxmox part goes on alone"
    fi
    echo "== egress-operator run --local $state/local (providers sandboxed; the broker holds the token, the host the libvirt connection)"
    # Bounded: a proxy that cannot come up leaves its reason in its status, not a demo that waits
    # forever.
    timeout -s INT 600 "$bin" run --local "$state/local" --exit-when-settled --cache-dir "$state/cache" \
        || echo "== not every proxy is Ready: \`$bin get proxies --local $state/local -o yaml\` says why"
    echo "== egress-operator get proxies --local $state/local"
    "$bin" get proxies --local "$state/local"
    vms() { curl -s --cacert "$state/sim/ca.pem" -H "Authorization: PVEAPIToken=$(cat "$state/sim/token")" "$url/api2/json/cluster/resources?type=vm" | jq -c '[.data[] | select(.template != 1) | {vmid, name, node, status}]'; }
    seeds() { for node in pv1-1 pv1-2; do curl -s --cacert "$state/sim/ca.pem" -H "Authorization: PVEAPIToken=$(cat "$state/sim/token")" "$url/api2/json/nodes/$node/storage/proxy-seeds/content" | jq -c --arg node "$node" '{($node): [.data[].volid]}'; done; }
    echo "== the simulator's VMs and seeds"; vms; seeds
    if [ -n "$kvm" ]; then
        echo "== the KVM lab's guests (dnsmasq's leases: the hostname is the VM's, from its seed) and volumes"
        virsh -q -c qemu:///system net-dhcp-leases "$(sed -n 's/^network: //p' "$state/kvmlab.out")" || true
        ls "$(sed -n 's/^pool-dir: //p' "$state/kvmlab.out")"
    fi
    echo "== egress-operator get pools --local $state/local: the pool's members run on both nodes"
    "$bin" get pools --local "$state/local"
    [ "$(vms | jq '[.[].node] | unique | length')" = 2 ] || { echo "expected VMs on both nodes" >&2; exit 1; }
    echo "== the pool's user-data changes (v1 -> v2): rolled through one VM at a time, never fewer than three Ready (the table shows each step)"
    sed -i 's/# proxy image v1/# proxy image v2/' "$state/local/pool-edge.yaml"
    "$bin" run --local "$state/local" --exit-when-settled --cache-dir "$state/cache"
    "$bin" get pools --local "$state/local"
    echo "== rm proxy-ci.yaml: the operator deletes its VM and seed"
    rm "$state/local/proxy-ci.yaml"
    "$bin" run --local "$state/local" --exit-when-settled --cache-dir "$state/cache"
    echo "== the simulator's VMs and seeds now"; vms; seeds
    [ "$(vms | jq length)" = 5 ] || { echo "expected five VMs left: two Proxies and the pool's three" >&2; exit 1; }

# Benchmarks (criterion, and the budgets table); figures land in target/criterion.
bench: build-components
    # The Proxmox provider with every request over wasi:http, as before the exchange call: the
    # before side of benches/proxmox.rs.
    cargo build --manifest-path components/Cargo.toml -p proxmox --features egress-guest/wasi-http-only --release --target wasm32-wasip2 --target-dir target/wasm-wasi-http
    cp target/wasm-wasi-http/wasm32-wasip2/release/proxmox.wasm target/components/proxmox-wasi-http.wasm
    cargo bench -p egress-runtime
    cargo bench -p egress-operator --bench budgets
    cargo bench -p egress-operator --bench proxmox -- --warm-up-time 1 --measurement-time 3
    cargo bench -p egress-capability-http --bench redact -- --warm-up-time 1 --measurement-time 3
    # The Python provider beside the Rust one: size, cold compile, cached load, fresh instance, a get.
    cargo bench -p egress-operator --bench python -- --warm-up-time 1 --measurement-time 3
