#!/usr/bin/env bash
# Profiles of a fleet scenario (issue 5, targets 3-7): meshd and the simulator, recorded
# with perf (DWARF call graphs) for SECONDS once `meshd loadgen` reaches PHASE, then
# written as one flamegraph per process and a summary of their hottest functions.
# Needs perf and inferno (`cargo install inferno`), and a release build.
#
# usage: scripts/fleet-flamegraph.sh NAME PHASE SECONDS [loadgen args...]
#   PHASE: text of loadgen's progress line to wait for, e.g. "connecting" (the connect
#   storm) or "change 1/" (the first change's push).
# FREQ (environment): samples per second, 199 unless set.
# Writes target/flamegraphs/fleet-NAME-{meshd,simulator}.svg and fleet-NAME.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { sed -n '2,10p' "$0"; exit 2; }
name=$1 phase=$2 seconds=$3
shift 3
out=target/flamegraphs
mkdir -p "$out" target/loadgen
bin=target/release/meshd
[ -x "$bin" ] || { echo "no $bin: cargo build --release --locked --features loadgen" >&2; exit 1; }
for tool in perf inferno-collapse-perf inferno-flamegraph; do
    command -v "$tool" >/dev/null || { echo "$tool is missing" >&2; exit 1; }
done

. scripts/fleet-run.sh
progress=$out/fleet-$name.progress
fleet_start target/loadgen/profile-$name "$out/fleet-$name.json" "$progress" "$phase" "$@"
perf record -F "${FREQ:-199}" --call-graph dwarf,16384 -p "$loadgen,$meshd" -o "$out/fleet-$name.perf" \
    -- sleep "$seconds" >/dev/null 2>&1
wait $loadgen || true
trap - EXIT

{
    echo "# $name: $seconds s from \"$phase\" at ${FREQ:-199} Hz; loadgen $*"
    for who in "meshd:$meshd" "simulator:$loadgen"; do
        label=${who%%:*} pid=${who#*:}
        perf script -i "$out/fleet-$name.perf" --pid "$pid" 2>/dev/null | inferno-collapse-perf \
            >"$out/fleet-$name-$label.folded"
        inferno-flamegraph --minwidth 0.5 --title "$label: $name" <"$out/fleet-$name-$label.folded" \
            >"$out/fleet-$name-$label.svg"
        echo
        echo "## $label (pid $pid): hottest functions, share of its own samples"
        perf report -i "$out/fleet-$name.perf" --pid "$pid" --percentage relative \
            --no-children --sort sym --stdio -g none 2>/dev/null | grep '%' | awk 'NR <= 25'
    done
} >"$out/fleet-$name.txt"
echo "$out/fleet-$name-meshd.svg $out/fleet-$name-simulator.svg $out/fleet-$name.txt"
