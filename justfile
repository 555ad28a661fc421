# egress-operator tasks. `just setup` once on a fresh machine, then `just demo` / `just test`.

set shell := ["bash", "-euo", "pipefail", "-c"]

components := "reference proxmox misbehave future-contract bad-import"

# Show the recipes.
default:
    @just --list

# Install what a fresh Debian/Ubuntu machine lacks: the wasm target, cargo-component, system packages.
setup:
    # cargo-component 0.21 builds wasm32-wasip1 beside wasm32-wasip2 and wants both targets.
    rustup target add wasm32-wasip2 wasm32-wasip1
    command -v cargo-component >/dev/null || cargo install --locked cargo-component@0.21.1
    {{ if `id -u` == "0" { "" } else { "sudo " } }}bash -c 'export DEBIAN_FRONTEND=noninteractive; \
        dpkg -s pkg-config libvirt-dev xorriso genisoimage curl >/dev/null 2>&1 || \
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends pkg-config libvirt-dev xorriso genisoimage curl ca-certificates; }'

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
    cargo build --release -p egress-operator

# Run every test: host crates, guest crates' host-side unit tests, and the plain-cargo guest build.
test: build-components
    cargo test --workspace
    cargo test --manifest-path components/Cargo.toml --workspace --target-dir target/wasm-host
    just build-components-plain

# The main job: build the reference provider and drive it through the CLI.
demo: build
    #!/usr/bin/env bash
    set -euo pipefail
    bin=target/release/egress-operator
    ref=target/components/reference.wasm
    echo "== inspect"; "$bin" provider inspect "$ref"
    echo "== create";  "$bin" provider call "$ref" create --input '{"name":"proxy-demo","uid":"6c1f0a2e-demo","userData":"#cloud-config\n"}'
    echo "== get";     "$bin" provider call "$ref" get --input '{"providerId":"ref/proxy-demo"}'
    echo "== check";   "$bin" provider call "$ref" check
    echo "== delete";  "$bin" provider call "$ref" delete --input '{"providerId":"ref/proxy-demo"}'
    echo "== a classified error"; "$bin" provider call "$ref" get --input '{"providerId":"ref/missing-demo"}' || echo "(exit status $?, as expected)"

# Benchmarks of the runtime (criterion); figures land in target/criterion.
bench:
    cargo bench -p egress-runtime
