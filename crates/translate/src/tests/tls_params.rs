//! MeshConfig `tlsDefaults` on TLS a DestinationRule originates: its cipher suites and
//! ECDH curves, over TLS 1.2 to 1.3 whatever minimum it names (istiod's
//! `applyTLSDefaults`).

use envoy_api::pb::envoy::config::core::v3::transport_socket::ConfigType;
use envoy_api::pb::envoy::extensions::transport_sockets::tls::v3::{
    TlsParameters, UpstreamTlsContext, tls_parameters::TlsProtocol,
};
use prost::Message;
use serde_json::json;

use super::{context, sidecar};
use crate::proxy_config;

const MESH: &str = "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |\n    tlsDefaults: {minProtocolVersion: TLSV1_3, cipherSuites: [ECDHE-RSA-AES128-GCM-SHA256, RC4-MD5], ecdhCurves: [X25519, P-256]}\n";

const ORIGINATED: &str = "---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: api, namespace: shop}\nspec:\n  hosts: [api.example.com]\n  resolution: DNS\n  ports: [{number: 443, name: https, protocol: HTTPS}]\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: api, namespace: shop}\nspec:\n  host: api.example.com\n  trafficPolicy: {tls: {mode: SIMPLE}}\n";

fn params(yaml: &str, cluster: &str) -> TlsParameters {
    let cfg = proxy_config(&context(yaml), &sidecar("shop", json!({})));
    let c = cfg.clusters.iter().find(|c| c.name == cluster).unwrap();
    let socket = c.transport_socket.as_ref().expect("TLS");
    let Some(ConfigType::TypedConfig(any)) = &socket.config_type else {
        panic!("{socket:?}")
    };
    let tls = UpstreamTlsContext::decode(any.value.as_slice()).unwrap();
    tls.common_tls_context.unwrap().tls_params.unwrap()
}

#[test]
fn originated_tls_takes_the_meshs_tls_defaults_suites_and_curves() {
    let cluster = "outbound|443||api.example.com";
    let with_defaults = params(&format!("{ORIGINATED}{MESH}"), cluster);
    assert_eq!(
        with_defaults.tls_minimum_protocol_version,
        TlsProtocol::TlSv12 as i32
    );
    assert_eq!(
        with_defaults.tls_maximum_protocol_version,
        TlsProtocol::TlSv13 as i32
    );
    // A name Envoy would refuse the cluster for is left out.
    assert_eq!(with_defaults.cipher_suites, ["ECDHE-RSA-AES128-GCM-SHA256"]);
    assert_eq!(with_defaults.ecdh_curves, ["X25519", "P-256"]);

    let without = params(ORIGINATED, cluster);
    assert!(without.cipher_suites.is_empty() && without.ecdh_curves.is_empty());
}
