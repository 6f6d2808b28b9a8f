# Sourced by the fleet scripts (fleet-flamegraph.sh, fleet-cpu.sh, kube-fleet-profile.sh):
# starts `meshd loadgen --spawn-meshd` in the background and waits until its progress
# reaches a phase.
#
# usage: fleet_start CONFIG JSON PROGRESS PHASE [loadgen args...]
#   CONFIG: the config directory loadgen writes the mesh into (emptied first);
#   JSON, PROGRESS: where its summary and its progress lines go.
# Runs "$bin", the caller's meshd binary. Sets $loadgen and $meshd (their pids) and a trap
# that kills loadgen on exit; `wait $loadgen` then waits for the run's end.
fleet_start() {
    local config=$1 json=$2 progress=$3 phase=$4
    shift 4
    rm -rf "$config" "$config.ca"
    "$bin" loadgen --spawn-meshd --config-dir "$config" --json "$json" \
        --progress-lines "$@" >/dev/null 2>"$progress" &
    loadgen=$!
    trap 'kill $loadgen 2>/dev/null || true' EXIT
    await_phase "$progress" "$phase" $loadgen
    meshd=$(pgrep -P $loadgen -f "meshd serve" | head -n1)
    [ -n "$meshd" ] || { echo "no meshd started by loadgen" >&2; exit 1; }
}

# usage: await_phase PROGRESS PHASE PID
# Returns once the progress file PROGRESS holds PHASE; exits if process PID (what writes
# it) ends first.
await_phase() {
    local progress=$1 phase=$2 pid=$3
    until grep -aqF -- "$phase" "$progress"; do
        kill -0 "$pid" 2>/dev/null || { echo "the run ended before \"$phase\"" >&2; exit 1; }
        sleep 0.05
    done
}
