//! End-to-end tests: meshd as a process, the real Envoy binary (installed by the harness),
//! real upstream HTTP servers and real requests. One test binary, modules per area.

mod cluster;
mod harness;
mod test_host;
mod tls_client;

mod bad_config;
mod ca;
mod capture;
mod chart;
mod cli;
mod dns;
mod gateway;
mod gateway_tls;
mod h2spec;
mod hostile;
mod inbound_http;
mod inject;
mod istio;
mod istio_configs;
mod istioctl;
mod istiod;
mod jwt;
mod kubelet;
mod kubernetes;
mod kubernetes_crds;
mod kubernetes_inject;
mod kubernetes_root_cert;
mod kubernetes_scope;
mod kubernetes_tls;
mod kubernetes_webhook;
mod loadgen;
mod mesh_tls;
mod mtls;
mod observability;
mod operator;
mod parity;
mod parity_corpus;
mod parity_diff;
mod protocol;
mod scoping;
mod service_entry_addresses;
mod sidecar;
mod stat_tags;
mod traffic_policy;
