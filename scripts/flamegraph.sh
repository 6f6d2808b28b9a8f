#!/usr/bin/env bash
# Flamegraphs of the two hot paths issue 5 times: the full push-context build (10,000
# services) and one cached sidecar view (1,000 services). Needs `perf` and inferno
# (`cargo install inferno`), and the bench binary (`cargo bench --bench push --no-run`;
# the bench profile keeps line tables, so `--call-graph dwarf` can name every frame).
# Writes target/flamegraphs/{push_context_build,cached_view}.svg.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=$(ls -t target/release/deps/push-* | grep -v '\.d$' | head -n1)
out=target/flamegraphs
mkdir -p "$out"

# profile NAME BENCH-FILTER FRAME: record the benchmark, keep the stacks under FRAME.
profile() {
    local name=$1 filter=$2 frame=$3
    perf record -F 499 --call-graph dwarf,16384 -o "$out/$name.perf" \
        "$bench" --bench --profile-time 6 "$filter" >/dev/null 2>&1
    perf script -i "$out/$name.perf" 2>/dev/null | inferno-collapse-perf \
        | grep -F "$frame" | sed "s/^.*;\($frame\)/\1/" >"$out/$name.folded"
    inferno-flamegraph --title "$name ($filter)" <"$out/$name.folded" >"$out/$name.svg"
    echo "$out/$name.svg"
}

profile push_context_build 'push_context_build/10000' 'meshd::model::push_context::PushContext::build'
profile cached_view 'sidecar_generation/1000_services_cached' 'meshd::xds::cache::view'
