# Everyday recipes. `just --list` shows them.

# Serve the Bookinfo example on :15010 (xDS) and :15014 (metrics, debug).
run:
    cargo run --release --locked -- serve --config-dir examples/bookinfo

# Everything CI runs: formatting, lints, unit and end-to-end tests (installs Envoy itself).
test:
    .ci/run

# Regenerate the committed CRDs (crds/ and the chart's) from the Rust types.
crds:
    MESHD_UPDATE_GOLDEN=1 cargo test --locked -p api crd

# Render manifests/meshd.yaml from the chart (a test fails when they differ).
manifests:
    scripts/manifests.sh

# Rewrite the golden files (tests/golden) and the flags table of docs/configuration.md
# from what the code produces now; review the diff.
golden:
    MESHD_UPDATE_GOLDEN=1 cargo test --locked -p meshd -- golden options_doc

# Formatting and clippy, as CI checks them.
lint:
    cargo fmt --all --check
    cargo clippy --locked --workspace --all-targets -- -D warnings

# Check YAML offline, like istioctl validate.
validate path="examples/bookinfo":
    cargo run --locked -- validate -f {{path}}

# Install the pinned Envoy and start it as the Bookinfo ingress gateway.
envoy:
    "$(e2e/install-envoy.sh)" -c examples/envoy/gateway.yaml --disable-hot-restart

# Micro-benchmarks (push context build, per-proxy generation); see BENCHMARKS.md.
bench:
    cargo bench --locked --bench push

# CA throughput over gRPC + mTLS next to the raw P-256 rate; see BENCHMARKS.md.
bench-ca seconds="5":
    cargo bench --locked --bench ca -- {{seconds}}

# Fuzz one target for SECONDS (cargo install cargo-fuzz; nightly, or RUSTC_BOOTSTRAP=1
# on stable): csr, ca_request, xds_stream, webhook, config_yaml, k8s_object. Runs and
# corpora in docs/fuzzing.md.
fuzz target seconds="600":
    cd fuzz && cargo +nightly fuzz run {{target}} -- -max_total_time={{seconds}} -rss_limit_mb=4096

# istiod and meshd side by side on the same API server: Bookinfo and Istio's own xDS
# benchmark configurations; shares per type in target/parity/summary.md, differences in
# each case's report.md (docs/compatibility.md).
parity:
    cargo test --locked --features loadgen --test e2e parity_corpus::the_corpus -- --ignored --nocapture

# meshd and the real istiod under the same simulated fleet on the same API server, in one
# sitting: memory per proxy, CPU per push, convergence and connect rate as ratios
# (target/loadgen/istiod-compare.json; BENCHMARKS.md).
bench-istiod proxies="1000" change="endpoint":
    cargo bench --locked --features loadgen --bench istiod -- --services 1000 --namespaces 50 --proxies {{proxies}} --warm-proxies 50 --change {{change}} --changes 5

# The change storm (as bench-storm) against meshd, then istiod, on the same API server.
bench-istiod-storm proxies="1000" rate="1000" duration="60s":
    cargo bench --locked --features loadgen --bench istiod -- --services 1000 --namespaces 50 --proxies {{proxies}} --warm-proxies 50 --change none --storm-rate {{rate}} --storm-duration {{duration}}

# Certificates per second and CPU per certificate through meshd's and istiod's CA APIs,
# one sitting, same root and client (target/ca-istiod.json).
bench-ca-istiod seconds="10":
    cargo bench --locked --bench ca_istiod -- {{seconds}}

# meshd's push-context build on Istio's own benchmark configurations next to Istio's Go
# benchmark of the same (go test -bench), one sitting (target/istio-configs.json).
bench-istio-configs:
    cargo bench --locked --features loadgen --bench istio_configs

# Fleet-simulator scenarios (issue 5); each prints a JSON summary. Figures and machine in
# BENCHMARKS.md.
# The fleet simulator against a release meshd it starts on a generated mesh.
loadgen *args:
    cargo run --release --locked --features loadgen -- loadgen --spawn-meshd --config-dir target/loadgen/config {{args}}

# One proxy per namespace connects first (--warm-proxies 50): `rss_per_added_proxy_bytes`
# is what each further proxy costs, `rss_per_proxy_bytes` the average with everything.
# Memory per connected proxy: unscoped 1,000-service mesh, then scoped to 20 services.
bench-memory proxies="1000":
    just loadgen --services 1000 --namespaces 50 --proxies {{proxies}} --warm-proxies 50 --change none --json target/loadgen/memory-unscoped.json
    just loadgen --services 1000 --namespaces 50 --proxies {{proxies}} --warm-proxies 50 --sidecar-scoped --change none --json target/loadgen/memory-scoped.json

# Mutual TLS with workload certificates, as sidecars connect in Istio.
# Memory per connected proxy of the scoped fleet, on the secure port.
bench-memory-secure proxies="1000":
    just loadgen --services 1000 --namespaces 50 --proxies {{proxies}} --warm-proxies 50 --sidecar-scoped --secure --change none --json target/loadgen/memory-scoped-secure.json

# Convergence: a VirtualService change to every delta proxy, then endpoint-only changes.
bench-convergence proxies="5000":
    just loadgen --services 1000 --namespaces 50 --proxies {{proxies}} --change vs --changes 5 --json target/loadgen/convergence-vs.json
    just loadgen --services 1000 --namespaces 50 --proxies {{proxies}} --change endpoint --changes 5 --json target/loadgen/convergence-endpoint.json

# With VHDS (MESHD_ENABLE_VHDS) the changed virtual host alone is sent, instead of the
# route configuration holding it.
# The VirtualService change to every delta proxy again, with VHDS.
bench-convergence-vhds proxies="5000":
    MESHD_ENABLE_VHDS=true just loadgen --services 1000 --namespaces 50 --proxies {{proxies}} --change vs --changes 5 --json target/loadgen/convergence-vs-vhds.json

# Endpoint-only changes are then pushed without waiting out PILOT_DEBOUNCE_AFTER, and the
# Kubernetes source has no file settle.
# The endpoint change to 10,000 proxies from the Kubernetes source, EDS debounce off.
bench-convergence-eds proxies="10000":
    PILOT_ENABLE_EDS_DEBOUNCE=false cargo bench --locked --features loadgen --bench kube_source -- --services 1000 --namespaces 50 --proxies {{proxies}} --change endpoint --changes 10 --init-timeout 600s --json target/loadgen/convergence-endpoint-eds.json

# Wire efficiency: 3 of 400 services' endpoints change, delta then state of the world.
bench-wire proxies="200":
    just loadgen --services 400 --namespaces 20 --proxies {{proxies}} --change endpoint --services-per-change 3 --changes 3 --json target/loadgen/wire-delta.json
    just loadgen --services 400 --namespaces 20 --proxies {{proxies}} --change endpoint --services-per-change 3 --changes 3 --sotw --json target/loadgen/wire-sotw.json

# Change storm: 1,000 config writes per second for 60 s against a 1,000-proxy fleet.
bench-storm proxies="1000" rate="1000" duration="60s":
    just loadgen --services 1000 --namespaces 50 --proxies {{proxies}} --change none --storm-rate {{rate}} --storm-duration {{duration}} --json target/loadgen/storm.json

# Reports the time until every proxy holds its configuration again, and the RSS peak
# over steady state.
# Restart: meshd killed and started again under a connected delta fleet.
bench-restart proxies="10000":
    just loadgen --services 1000 --namespaces 50 --proxies {{proxies}} --change none --restart --init-timeout 600s --json target/loadgen/restart.json

# Endpoint changes served from files, then from the test bed's real kube-apiserver (the
# mesh and its changes written through the API; its CPU and memory added to the summary).
bench-kubernetes proxies="2000":
    just loadgen --services 1000 --namespaces 50 --proxies {{proxies}} --change endpoint --changes 5 --json target/loadgen/source-files.json
    cargo bench --locked --features loadgen --bench kube_source -- --services 1000 --namespaces 50 --proxies {{proxies}} --change endpoint --changes 5 --json target/loadgen/source-kubernetes.json

# Needs perf and `cargo install inferno`; SVGs in target/flamegraphs/.
# Flamegraphs of the push-context build and of a cached sidecar view.
flamegraph:
    cargo bench --locked --bench push --no-run
    scripts/flamegraph.sh

# Needs perf and `cargo install inferno`. The connect storm on both ports (target 6), a
# VirtualService push to 5,000 proxies and an endpoint push to 10,000 (target 4):
# flamegraphs and hottest functions in target/flamegraphs/fleet-*; docs/profiles/ holds
# the last ones committed.
# Profiles of meshd and the simulator where the fleet targets are missed or at the edge.
flamegraph-fleet:
    cargo build --release --locked
    FREQ=499 scripts/fleet-flamegraph.sh connect connecting 6 --services 1000 --namespaces 50 --proxies 5000 --connect-rate 2000 --change none
    FREQ=499 scripts/fleet-flamegraph.sh secure-connect connecting 5 --services 1000 --namespaces 50 --proxies 2000 --secure --change none
    FREQ=499 scripts/fleet-flamegraph.sh vs "change 1/" 7 --services 1000 --namespaces 50 --proxies 5000 --change vs --changes 5
    FREQ=499 scripts/fleet-flamegraph.sh endpoint "change 1/" 9 --services 1000 --namespaces 50 --proxies 10000 --change endpoint --changes 10 --init-timeout 600s

# Needs perf.
# CPU per proxy per endpoint change to 10,000 proxies: meshd and the simulator, user and kernel.
cpu-fleet proxies="10000":
    cargo build --release --locked
    scripts/fleet-cpu.sh endpoint "change 1/" --services 1000 --namespaces 50 --proxies {{proxies}} --change endpoint --changes 10 --init-timeout 600s

# Two one-thread processes, no HTTP/2, gRPC or protobuf. The endpoint push as bare loopback writes, reads
# and ACKs to 10,000 connections; the secure storm as 1.98 MB of sealed records per new
# connection, and one mutual-TLS handshake's public-key operations.
# The floor: what the system calls and cryptography of a push cost on this machine.
bench-floor:
    cargo bench --locked --bench floor -- push 10000 10 420 90
    cargo bench --locked --bench floor -- storm 2000 1985236 sealed

# Connect storm: new proxies per second, each receiving its full initial config.
bench-connect proxies="5000" rate="2000":
    just loadgen --services 1000 --namespaces 50 --proxies {{proxies}} --connect-rate {{rate}} --change none --json target/loadgen/connect.json

# The runs behind BENCHMARKS.md's plots (JSON into docs/plots/data), then the plots
# themselves (docs/plots/*.svg; needs matplotlib).
bench-plots:
    cargo build --release --locked
    scripts/bench-plot-data.sh
    python3 scripts/bench-plots.py

# Every fuzz target for SECONDS on stable Rust, as CI runs them.
fuzz-smoke seconds="20":
    scripts/fuzz-smoke.sh {{seconds}}
