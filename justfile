# Everyday recipes. `just --list` shows them.

# Serve the Bookinfo example on :15010 (xDS) and :15014 (metrics, debug).
run:
    cargo run --release --locked -- serve --config-dir examples/bookinfo

# Everything CI runs: formatting, lints, unit and end-to-end tests (installs Envoy itself).
test:
    .ci/run

# Regenerate the committed CRDs (crds/ and the chart's) from the Rust types.
crds:
    MESHD_UPDATE_GOLDEN=1 cargo test --locked --lib api::crd

# Formatting and clippy, as CI checks them.
lint:
    cargo fmt --check
    cargo clippy --locked --all-targets -- -D warnings

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

# Fuzz CSR parsing and verification (cargo install cargo-fuzz; needs a nightly toolchain).
fuzz-csr seconds="60":
    cd fuzz && cargo +nightly fuzz run csr -- -max_total_time={{seconds}}

# Fuzz the CA request handler (protobuf body -> verify -> sign or refuse).
fuzz-ca seconds="60":
    cd fuzz && cargo +nightly fuzz run ca_request -- -max_total_time={{seconds}}
