# meshd's control-plane image: `meshd serve` (the chart runs one Deployment per revision).
# Build from the repository root: docker build -f docker/meshd.Dockerfile -t meshd .
# Not built in this project's CI (its machines have no container engine).
ARG RUST_IMAGE=rust:1.95-bookworm
ARG BASE_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin meshd

FROM ${BASE_IMAGE}
COPY --from=build /src/target/release/meshd /usr/local/bin/meshd
# Istio's ports: plaintext xDS, xDS and the CA over TLS, monitoring, webhooks.
EXPOSE 15010 15012 15014 15017
USER 1337:1337
ENTRYPOINT ["/usr/local/bin/meshd"]
CMD ["serve"]
