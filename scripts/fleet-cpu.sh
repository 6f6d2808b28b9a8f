#!/usr/bin/env bash
# CPU per proxy per change of a fleet scenario (issue 5, target 4): `perf stat -e
# task-clock` attached to meshd and to the simulator from the moment `meshd loadgen`
# reaches PHASE until it ends, divided by the proxies each change affected. Tells how
# the push's CPU splits between meshd and the simulator sharing the machine's cores.
# Needs perf and a release build.
#
# usage: scripts/fleet-cpu.sh NAME PHASE [loadgen args...]
#   PHASE: text of loadgen's progress line to wait for, e.g. "change 1/".
# Writes target/loadgen/cpu-NAME.{json,progress,meshd.stat,simulator.stat} and prints
# the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,10p' "$0"; exit 2; }
name=$1 phase=$2
shift 2
out=target/loadgen
mkdir -p "$out"
bin=target/release/meshd
[ -x "$bin" ] || { echo "no $bin: cargo build --release --locked" >&2; exit 1; }
command -v perf >/dev/null || { echo "perf is missing" >&2; exit 1; }

. scripts/fleet-run.sh
progress=$out/cpu-$name.progress
fleet_start "$out/cpu-$name-config" "$out/cpu-$name.json" "$progress" "$phase" "$@"
perf stat -e task-clock -p "$meshd" -o "$out/cpu-$name.meshd.stat" &
meshd_stat=$!
perf stat -e task-clock -p "$loadgen" -o "$out/cpu-$name.simulator.stat" &
simulator_stat=$!
wait $loadgen || { echo "loadgen failed; see $progress" >&2; exit 1; }
trap - EXIT
kill -INT $meshd_stat $simulator_stat 2>/dev/null || true
wait $meshd_stat $simulator_stat 2>/dev/null || true

python3 - "$out/cpu-$name" <<'PY'
import json, re, sys
base = sys.argv[1]
summary = json.load(open(base + ".json"))
changes = summary["changes"]
proxy_changes = sum(c["affected"] for c in changes)
def task_clock_ms(path):
    for line in open(path):
        m = re.match(r"\s*([\d,.]+)\s+msec\s+task-clock", line)
        if m:
            return float(m.group(1).replace(",", ""))
    sys.exit(f"no task-clock in {path}")
print(f"{len(changes)} changes, {proxy_changes} affected proxies in all")
print("p99 per change (ms):", [round(c["convergence_ms"]["p99"]) for c in changes])
for who in ("meshd", "simulator"):
    ms = task_clock_ms(f"{base}.{who}.stat")
    print(f"{who}: {ms / 1000:.2f} CPU-s, {ms * 1000 / proxy_changes:.1f} us per proxy per change")
PY
