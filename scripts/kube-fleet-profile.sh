#!/usr/bin/env bash
# Profile of meshd under the fleet simulator with the mesh served from the test bed's real
# kube-apiserver (`benches/kube_source.rs`): `perf record` attached to the meshd the
# simulator spawned, from the moment its progress reaches PHASE until the run ends; then
# the share of meshd's samples by binary and its hottest functions.
# Needs perf. Builds the bench (release) through cargo.
#
# usage: scripts/kube-fleet-profile.sh NAME PHASE [loadgen args...]
#   PHASE: text of loadgen's progress line to wait for, e.g. "change 1/".
# FREQ (environment): samples per second, 999 unless set.
# Writes target/flamegraphs/kube-NAME.{perf,progress,json,txt} and prints the .txt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,10p' "$0"; exit 2; }
name=$1 phase=$2
shift 2
command -v perf >/dev/null || { echo "perf is missing" >&2; exit 1; }
out=target/flamegraphs
mkdir -p "$out"
progress=$out/kube-$name.progress
. scripts/fleet-run.sh
cargo bench --locked --features loadgen --bench kube_source --no-run 2>/dev/null
cargo bench --locked --features loadgen --bench kube_source -- "$@" --progress-lines \
    --json "$out/kube-$name.json" >/dev/null 2>"$progress" &
bench=$!
trap 'kill $bench 2>/dev/null || true' EXIT
await_phase "$progress" "$phase" $bench
meshd=$(pgrep -f "release/meshd serve" | head -n1)
[ -n "$meshd" ] || { echo "no meshd started by the simulator" >&2; exit 1; }
perf record -F "${FREQ:-999}" -p "$meshd" -o "$out/kube-$name.perf" >/dev/null 2>&1 &
perf=$!
wait $bench
trap - EXIT
kill -INT $perf 2>/dev/null || true
wait $perf 2>/dev/null || true

{
    echo "# $name: meshd from \"$phase\" to the run's end at ${FREQ:-999} Hz; kube_source $*"
    echo
    echo "## meshd's samples by binary"
    perf report -i "$out/kube-$name.perf" --no-children --sort dso -g none 2>/dev/null |
        grep -v '^#' | grep -v '^$'
    echo
    echo "## hottest functions, share of meshd's samples"
    perf report -i "$out/kube-$name.perf" --no-children --sort dso,sym -g none 2>/dev/null |
        grep -v '^#' | grep -v '^$' | head -40
} >"$out/kube-$name.txt"
cat "$out/kube-$name.txt"
