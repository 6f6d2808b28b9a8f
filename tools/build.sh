#!/usr/bin/env bash
# Builds the test bed's real Kubernetes binaries (kube-apiserver, etcd, kubectl, helm) from
# the Go modules pinned in tools/go.mod and tools/go.sum, into target/tools/bin/.
#
# The binaries are keyed by the hash of go.mod, go.sum and this script: a second run with
# the same pins prints the folder and builds nothing. Prints the bin folder on stdout;
# progress goes to stderr. Needs Go (the version go.mod names) and the Go module proxy.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
out="${MESHD_TOOLS_DIR:-$root/target/tools}"
bin="$out/bin"

if ! command -v go >/dev/null 2>&1; then
    echo "tools/build.sh: 'go' is not on PATH; the test bed builds kube-apiserver, etcd," \
        "kubectl and helm from Go modules and needs Go $(sed -n 's/^go //p' "$here/go.mod")" >&2
    exit 1
fi

key="$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-16)"
if [ -f "$bin/.key" ] && [ "$(cat "$bin/.key")" = "$key" ]; then
    echo "$bin"
    exit 0
fi

# One build at a time: test binaries that start in parallel wait for the first.
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9
if [ -f "$bin/.key" ] && [ "$(cat "$bin/.key")" = "$key" ]; then
    echo "$bin"
    exit 0
fi

kube="$(cd "$here" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
minor="$(echo "$kube" | cut -d. -f2)"
helm="$(cd "$here" && go list -m -f '{{.Version}}' helm.sh/helm/v3)"
etcd="$(cd "$here" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
stamp="-s -w \
 -X k8s.io/component-base/version.gitVersion=$kube \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/client-go/pkg/version.gitVersion=$kube \
 -X helm.sh/helm/v3/internal/version.version=$helm \
 -X go.etcd.io/etcd/api/v3/version.GitSHA=$etcd"

rm -rf "$bin.new"
mkdir -p "$bin.new"
build() {
    local name="$1" pkg="$2"
    echo "tools/build.sh: building $name from $pkg" >&2
    (cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags "$stamp" \
        -o "$bin.new/$name" "$pkg") >&2
}
build etcd go.etcd.io/etcd/server/v3
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build kubectl k8s.io/kubernetes/cmd/kubectl
build helm helm.sh/helm/v3/cmd/helm
echo "$key" >"$bin.new/.key"
rm -rf "$bin"
mv "$bin.new" "$bin"
echo "$bin"
