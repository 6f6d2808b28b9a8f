#!/usr/bin/env bash
# The runs behind BENCHMARKS.md's plots, each writing its JSON summary into DIR
# (default docs/plots/data): meshd's memory at 250 to 2,000 proxies, unscoped,
# Sidecar-scoped and scoped on the secure port; a connect storm of 5,000 proxies at
# 2,000/s offered; and a VirtualService change and an endpoint change to 5,000 proxies. Then `scripts/bench-plots.py DIR` draws them.
# Needs a release build (cargo build --release --locked --features loadgen).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/plots/data}
mkdir -p "$out"
meshd=target/release/meshd
run() {
    local name=$1
    shift
    echo "== $name" >&2
    "$meshd" loadgen --spawn-meshd --config-dir "target/loadgen/plot-$name" --progress-lines \
        --services 1000 --namespaces 50 --json "$out/$name.json" "$@" > /dev/null
}
for n in 250 500 1000 2000; do
    run "memory-unscoped-$n" --proxies "$n" --warm-proxies 50 --change none
    run "memory-scoped-$n" --proxies "$n" --warm-proxies 50 --sidecar-scoped --change none
    run "memory-scoped-secure-$n" --proxies "$n" --warm-proxies 50 --sidecar-scoped --secure --change none
done
run connect-5000 --proxies 5000 --connect-rate 2000 --change none
run convergence-vs-5000 --proxies 5000 --change vs --changes 5
run convergence-endpoint-5000 --proxies 5000 --change endpoint --changes 5
