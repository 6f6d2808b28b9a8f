#!/usr/bin/env bash
# Builds the test bed's real peers from Go modules pinned in this folder, into target/tools/:
#
#   tools/build.sh         kube-apiserver, etcd, kubectl and helm (tools/go.mod) into
#                          target/tools/bin/
#   tools/build.sh istio   pilot-discovery (istiod), pilot-agent and istioctl
#                          (tools/istio/go.mod) into target/tools/istio/bin/
#   tools/build.sh h2spec  h2spec, the HTTP/2 conformance suite (tools/h2spec/go.mod),
#                          into target/tools/h2spec/bin/
#   tools/build.sh kwok    kwok, which serves the kubelet's API (port-forward) for the
#                          test bed's nodes (tools/kwok/go.mod), into target/tools/kwok/bin/
#   tools/build.sh iptables  iptables-restore and iptables-save (Debian's iptables
#                          package, nftables backend, at the versions pinned below), for
#                          the traffic capture test; into target/tools/iptables/bin/
#
# Each set is keyed by the hash of its go.mod, its go.sum and this script: a second run
# with the same pins prints the folder and builds nothing. Prints the bin folder on stdout;
# progress goes to stderr. Needs Go (the version go.mod names) and the Go module proxy.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
set_name="${1:-kube}"

# Prints $bin and exits when it holds the set keyed by $key; otherwise takes the set's
# lock (one build at a time: test binaries that start in parallel wait for the first)
# and looks again.
reuse_or_lock() {
    if [ -f "$bin/.key" ] && [ "$(cat "$bin/.key")" = "$key" ]; then
        echo "$bin"
        exit 0
    fi
    mkdir -p "$out"
    exec 9>"$out/.lock"
    flock 9
    if [ -f "$bin/.key" ] && [ "$(cat "$bin/.key")" = "$key" ]; then
        echo "$bin"
        exit 0
    fi
}

# Debian bookworm's iptables and the libraries it needs beyond the base system.
iptables_debs="iptables=1.8.9-2 libxtables12=1.8.9-2 libip4tc2=1.8.9-2 libip6tc2=1.8.9-2
libnftnl11=1.2.4-2 libnetfilter-conntrack3=1.0.9-3 libnfnetlink0=1.0.2-2 libmnl0=1.0.4-3"
if [ "$set_name" = iptables ]; then
    out="${MESHD_TOOLS_DIR:-$root/target/tools}/iptables"
    bin="$out/bin"
    key="$(echo "$iptables_debs" | cat - "$here/build.sh" | sha256sum | cut -c1-16)"
    reuse_or_lock
    rm -rf "$out/debs" "$out/root" "$bin"
    mkdir -p "$out/debs" "$bin"
    echo "tools/build.sh: downloading $iptables_debs" >&2
    # shellcheck disable=SC2086
    if ! (cd "$out/debs" && apt-get download $iptables_debs >&2); then
        apt-get update >&2
        # shellcheck disable=SC2086
        (cd "$out/debs" && apt-get download $iptables_debs >&2)
    fi
    for deb in "$out"/debs/*.deb; do dpkg-deb -x "$deb" "$out/root"; done
    lib="$out/root/usr/lib/x86_64-linux-gnu"
    for name in iptables iptables-restore iptables-save; do
        printf '#!/usr/bin/env bash\nLD_LIBRARY_PATH=%s XTABLES_LIBDIR=%s exec -a %s %s "$@"\n' \
            "$lib" "$lib/xtables" "$name" "$out/root/usr/sbin/xtables-nft-multi" >"$bin/$name"
        chmod 755 "$bin/$name"
    done
    echo "$key" >"$bin/.key"
    echo "$bin"
    exit 0
fi
case "$set_name" in
kube) module="$here" out="${MESHD_TOOLS_DIR:-$root/target/tools}" ;;
istio) module="$here/istio" out="${MESHD_TOOLS_DIR:-$root/target/tools}/istio" ;;
h2spec) module="$here/h2spec" out="${MESHD_TOOLS_DIR:-$root/target/tools}/h2spec" ;;
kwok) module="$here/kwok" out="${MESHD_TOOLS_DIR:-$root/target/tools}/kwok" ;;
*)
    echo "tools/build.sh: unknown set '$set_name' (kube, istio, h2spec, kwok or iptables)" >&2
    exit 2
    ;;
esac
bin="$out/bin"

if ! command -v go >/dev/null 2>&1; then
    echo "tools/build.sh: 'go' is not on PATH; the test bed builds its $set_name binaries" \
        "from Go modules and needs Go $(sed -n 's/^go //p' "$module/go.mod")" >&2
    exit 1
fi

key="$(cat "$module/go.mod" "$module/go.sum" "$here/build.sh" | sha256sum | cut -c1-16)"
reuse_or_lock

version() { (cd "$module" && go list -m -f '{{.Version}}' "$1"); }
rm -rf "$bin.new"
mkdir -p "$bin.new"
# build NAME PACKAGE [go build flags...]
build() {
    local name="$1" pkg="$2"
    shift 2
    echo "tools/build.sh: building $name from $pkg" >&2
    (cd "$module" && CGO_ENABLED=0 go build -trimpath "$@" -o "$bin.new/$name" "$pkg") >&2
}

case "$set_name" in
kube)
    kube="$(version k8s.io/kubernetes)"
    minor="$(echo "$kube" | cut -d. -f2)"
    stamp="-s -w \
 -X k8s.io/component-base/version.gitVersion=$kube \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/client-go/pkg/version.gitVersion=$kube \
 -X helm.sh/helm/v3/internal/version.version=$(version helm.sh/helm/v3) \
 -X go.etcd.io/etcd/api/v3/version.GitSHA=$(version go.etcd.io/etcd/server/v3)"
    build etcd go.etcd.io/etcd/server/v3 -ldflags "$stamp"
    build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver -ldflags "$stamp"
    build kubectl k8s.io/kubernetes/cmd/kubectl -ldflags "$stamp"
    build helm helm.sh/helm/v3/cmd/helm -ldflags "$stamp"
    ;;
istio)
    # Istio's own build tags and version stamp (its Makefile.core.mk).
    stamp="-s -w -X istio.io/istio/pkg/version.buildVersion=$(version istio.io/istio)"
    for cmd in pilot/cmd/pilot-discovery pilot/cmd/pilot-agent istioctl/cmd/istioctl; do
        build "$(basename "$cmd")" "istio.io/istio/$cmd" -tags=vtprotobuf,disable_pgv -ldflags "$stamp"
    done
    ;;
h2spec)
    build h2spec github.com/summerwind/h2spec/cmd/h2spec -ldflags "-s -w"
    ;;
kwok)
    build kwok sigs.k8s.io/kwok/cmd/kwok -ldflags "-s -w"
    ;;
esac
echo "$key" >"$bin.new/.key"
rm -rf "$bin"
mv "$bin.new" "$bin"
echo "$bin"
