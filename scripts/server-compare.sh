#!/usr/bin/env bash
# Two meshd builds measured in one sitting under the same fleet simulator (this checkout's
# release `meshd loadgen`, which starts each build through MESHD_LOADGEN_SERVER), runs
# alternating between the builds so that a slow period of the machine falls on both:
#
#   scripts/server-compare.sh OLD_MESHD NEW_MESHD [ROUNDS]
#
# Each round runs, for each build: memory per added proxy (unscoped and Sidecar-scoped,
# plaintext and secure, 1,000 and 10,000 proxies), the connect storm on each port, a
# VirtualService change to 5,000 proxies and an endpoint change to 5,000 (with meshd's CPU
# per proxy per push), and the grpcio fleet (scripts/grpcio-fleet.py, GRPCIO_FLEETS
# proxies on the unscoped mesh, default "500 2000").
# JSON summaries go to target/compare/BUILD-SCENARIO-ROUND.json;
# scripts/server-compare.py prints the table.
set -euo pipefail
cd "$(dirname "$0")/.."
old="$1" new="$2" rounds="${3:-1}"
out=target/compare
mkdir -p "$out"
loadgen=target/release/meshd
cargo build --release --locked --features loadgen
python=${PYTHON:-python3}
"$python" -c 'import grpc' 2>/dev/null || {
    echo "scripts/server-compare.sh: the grpcio fleet needs Python's grpcio (PYTHON=path/to/venv/bin/python)" >&2
    exit 1
}

mesh=(--services 1000 --namespaces 50)
run() { # BUILD_NAME BINARY SCENARIO ROUND loadgen-args...
    local name="$1" bin="$2" scenario="$3" round="$4"
    shift 4
    echo "== $name $scenario round $round" >&2
    MESHD_LOADGEN_SERVER="$bin" "$loadgen" loadgen --spawn-meshd --config-dir "target/compare/config-$name" \
        "$@" --json "$out/$name-$scenario-$round.json" >/dev/null
}

grpcio() { # BUILD_NAME BINARY ROUND PROXIES
    local name="$1" bin="$2" round="$3" proxies="$4"
    echo "== $name grpcio-$proxies round $round" >&2
    # The unscoped mesh the memory-unscoped run just wrote.
    local dir="target/compare/config-$name"
    "$bin" serve --config-dir "$dir" --xds-address 127.0.0.1:25010 --secure-xds-address 127.0.0.1:25012 \
        --ca-dir "$out/ca-$name" --monitoring-address 127.0.0.1:25014 --webhook-address none \
        >"$out/grpcio-$name.log" 2>&1 &
    local pid=$!
    for _ in $(seq 100); do curl -sf http://127.0.0.1:25014/ready >/dev/null && break; sleep 0.2; done
    "$python" scripts/grpcio-fleet.py --xds 127.0.0.1:25010 --pid "$pid" --proxies "$proxies" \
        >"$out/$name-grpcio-$proxies-$round.json"
    kill "$pid"; wait "$pid" 2>/dev/null || true
}

for round in $(seq "$rounds"); do
    for build in old new; do
        bin="${!build}"
        run "$build" "$bin" memory-unscoped "$round" "${mesh[@]}" --proxies 1000 --warm-proxies 50 --change none
        for proxies in ${GRPCIO_FLEETS:-500 2000}; do
            grpcio "$build" "$bin" "$round" "$proxies"
        done
        run "$build" "$bin" memory-scoped "$round" "${mesh[@]}" --proxies 1000 --warm-proxies 50 --sidecar-scoped --change none
        run "$build" "$bin" memory-scoped-secure "$round" "${mesh[@]}" --proxies 1000 --warm-proxies 50 --sidecar-scoped --secure --change none
        run "$build" "$bin" memory-unscoped-secure "$round" "${mesh[@]}" --proxies 1000 --warm-proxies 50 --secure --change none
        run "$build" "$bin" memory-unscoped-10k "$round" "${mesh[@]}" --proxies 10000 --warm-proxies 50 --change none
        run "$build" "$bin" memory-scoped-10k "$round" "${mesh[@]}" --proxies 10000 --warm-proxies 50 --sidecar-scoped --change none
        run "$build" "$bin" memory-scoped-secure-10k "$round" "${mesh[@]}" --proxies 10000 --warm-proxies 50 --sidecar-scoped --secure --change none
        run "$build" "$bin" connect "$round" "${mesh[@]}" --proxies 5000 --connect-rate 2000 --change none
        run "$build" "$bin" connect-secure "$round" "${mesh[@]}" --proxies 1000 --connect-rate 2000 --secure --change none
        run "$build" "$bin" vs "$round" "${mesh[@]}" --proxies 5000 --change vs --changes 5
        run "$build" "$bin" endpoint "$round" "${mesh[@]}" --proxies 5000 --change endpoint --changes 5
    done
done
"$python" scripts/server-compare.py "$out"
