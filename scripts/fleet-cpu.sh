#!/usr/bin/env bash
# CPU per proxy per change of a fleet scenario (issue 5, target 4): `perf stat -e
# task-clock` attached to meshd and to the simulator from the moment `meshd loadgen`
# reaches PHASE until it ends, divided by the proxies each change affected. Tells how
# the push's CPU splits between meshd and the simulator sharing the machine's cores.
# Needs perf and a release build.
#
# usage: scripts/fleet-cpu.sh NAME PHASE [loadgen args...]
#   PHASE: text of loadgen's progress line to wait for, e.g. "change 1/".
# Also splits each process's CPU into user and kernel time (utime and stime of
# /proc/PID/stat, read every 100 ms; the kernel's share includes the loopback delivery
# that a sender's write runs into its peer's socket).
# Writes target/loadgen/cpu-NAME.{json,progress,meshd.stat,simulator.stat,meshd.ticks,
# simulator.ticks} and prints the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,10p' "$0"; exit 2; }
name=$1 phase=$2
shift 2
out=target/loadgen
mkdir -p "$out"
bin=target/release/meshd
[ -x "$bin" ] || { echo "no $bin: cargo build --release --locked --features loadgen" >&2; exit 1; }
command -v perf >/dev/null || { echo "perf is missing" >&2; exit 1; }

. scripts/fleet-run.sh
progress=$out/cpu-$name.progress
fleet_start "$out/cpu-$name-config" "$out/cpu-$name.json" "$progress" "$phase" "$@"
perf stat -e task-clock -p "$meshd" -o "$out/cpu-$name.meshd.stat" &
meshd_stat=$!
perf stat -e task-clock -p "$loadgen" -o "$out/cpu-$name.simulator.stat" &
simulator_stat=$!
# utime and stime (fields 14 and 15, in clock ticks) of PID into FILE, a line per read,
# until the process ends: the first and last lines bound the measured span.
# Shell built-ins only, but for sleep, so that reading costs the measured cores little.
ticks() {
    local stat fields
    while read -r stat 2>/dev/null <"/proc/$1/stat"; do
        read -ra fields <<<"${stat##*) }"
        echo "${fields[11]} ${fields[12]}" >>"$2"
        sleep 0.1
    done
}
rm -f "$out/cpu-$name".{meshd,simulator}.ticks
ticks "$meshd" "$out/cpu-$name.meshd.ticks" &
ticks "$loadgen" "$out/cpu-$name.simulator.ticks" &
wait $loadgen || { echo "loadgen failed; see $progress" >&2; exit 1; }
trap - EXIT
kill -INT $meshd_stat $simulator_stat 2>/dev/null || true
wait 2>/dev/null || true

python3 - "$out/cpu-$name" "$(getconf CLK_TCK)" <<'PY'
import json, re, sys
base, hz = sys.argv[1], int(sys.argv[2])
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
    rows = [tuple(map(int, l.split())) for l in open(f"{base}.{who}.ticks") if l.strip()]
    user, kernel = ((rows[-1][i] - rows[0][i]) / hz for i in (0, 1))
    if user + kernel > 0:
        print(f"  user {user * 1e6 / proxy_changes:.1f} us, kernel {kernel * 1e6 / proxy_changes:.1f} us"
              f" per proxy per change ({100 * kernel / (user + kernel):.0f}% kernel)")
PY
