# The sidecar image the injector names (`--proxy-image`): meshd's agent with Envoy at
# /usr/local/bin/envoy, and iptables for the `istio-init` container (`meshd agent
# iptables`). ENVOY_IMAGE picks the Envoy build (1.40, as the test bed runs).
# Build from the repository root: docker build -f docker/proxy.Dockerfile -t meshd-proxy .
# Not built in this project's CI (its machines have no container engine).
ARG RUST_IMAGE=rust:1.95-bookworm
ARG ENVOY_IMAGE=envoyproxy/envoy:v1.40-latest

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin meshd

FROM ${ENVOY_IMAGE}
USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends iptables \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/meshd /usr/local/bin/meshd
# The injected containers set their own user: 1337 for the proxy, root for istio-init.
ENTRYPOINT ["/usr/local/bin/meshd"]
