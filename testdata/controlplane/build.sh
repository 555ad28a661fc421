#!/usr/bin/env bash
# Builds the tests' control plane from Go modules: kube-apiserver and kubectl from k8s.io/kubernetes
# (the version go/go.mod pins), etcd from go.etcd.io/etcd/server/v3 (go/etcd/go.mod), into DIR
# (default target/controlplane). Skipped when DIR already holds binaries built from these exact
# sources with this Go: a second `just test` does not rebuild them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(mkdir -p "${1:-target/controlplane}" && cd "${1:-target/controlplane}" && pwd)
binaries="kube-apiserver kubectl etcd"

stamp=$( (go version; cd "$here" && cat build.sh go/go.mod go/go.sum go/*/main.go go/etcd/go.mod go/etcd/go.sum) | sha256sum | cut -d' ' -f1)
if [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ] && (cd "$out" && ls $binaries >/dev/null 2>&1); then
    echo "control plane up to date in $out"
    exit 0
fi

start=$(date +%s)
cd "$here/go"
version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(echo "$version" | cut -d. -f2)
# Without these /version reports v0.0.0-master, and kubectl warns of a skew.
ldflags="-s -w
  -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1
  -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/client-go/pkg/version.gitVersion=$version
  -X k8s.io/component-base/version.gitTreeState=clean"
export CGO_ENABLED=0
go build -trimpath -ldflags "$ldflags" -o "$out/" ./kube-apiserver ./kubectl
(cd etcd && go build -trimpath -ldflags "-s -w" -o "$out/etcd" .)
echo "$stamp" > "$out/stamp"
echo "built kube-apiserver and kubectl $version, $("$out/etcd" --version | head -n 1) in $(( $(date +%s) - start ))s:"
ls -l "$out"
