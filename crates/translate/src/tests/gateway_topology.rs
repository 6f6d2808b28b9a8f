//! ProxyConfig `gatewayTopology` on a gateway's connection managers and listeners: from
//! the `PROXY_CONFIG` the gateway's agent sends, else from MeshConfig `defaultConfig`.

use envoy_api::pb::envoy::config::listener::v3::{Listener, filter::ConfigType};
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::ForwardClientCertDetails,
};
use model::Proxy;
use prost::Message;
use serde_json::{Value, json};

use super::context;
use crate::proxy_config;

const GATEWAY: &str = "---\napiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: istio-system}\nspec:\n  selector: {istio: ingressgateway}\n  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]\n";

/// The ingress gateway, with `PROXY_CONFIG` when given.
fn gateway(proxy_config: Option<Value>) -> Proxy {
    let mut meta = json!({"NAMESPACE": "istio-system", "LABELS": {"istio": "ingressgateway"}});
    if let Some(config) = proxy_config {
        meta["PROXY_CONFIG"] = config;
    }
    Proxy::from_node(
        "router~10.1.1.1~gw-1.istio-system~istio-system.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap()
}

/// The gateway's listener on 80 and its connection manager, MeshConfig `defaultConfig`
/// being `default_config` (YAML flow).
fn listener(default_config: &str, proxy: &Proxy) -> (Listener, HttpConnectionManager) {
    let mesh = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n    defaultConfig: {default_config}\n"
    );
    let cfg = proxy_config(&context(&format!("{mesh}{GATEWAY}")), proxy);
    let l = (cfg.listeners.into_iter()).find(|l| l.name == "0.0.0.0_80");
    let l = l.expect("the gateway's listener");
    let f = &l.filter_chains[0].filters[0];
    let Some(ConfigType::TypedConfig(any)) = &f.config_type else {
        panic!("{f:?}")
    };
    let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
    (l, hcm)
}

fn filters(l: &Listener) -> Vec<&str> {
    l.listener_filters.iter().map(|f| f.name.as_str()).collect()
}

#[test]
fn without_a_topology_a_gateway_trusts_no_hop_and_sets_the_client_certificate() {
    let (l, hcm) = listener("{}", &gateway(None));
    assert_eq!(hcm.xff_num_trusted_hops, 0);
    let forward = hcm.forward_client_cert_details;
    assert_eq!(forward, ForwardClientCertDetails::SanitizeSet as i32);
    let set = hcm.set_current_client_cert_details.unwrap();
    assert!(set.cert && set.uri && set.dns && set.subject.unwrap().value);
    assert!(filters(&l).is_empty(), "{l:?}");
}

#[test]
fn the_meshs_default_topology_applies_to_a_gateway_that_sent_no_proxy_config() {
    let mesh = "{gatewayTopology: {numTrustedProxies: 2, forwardClientCertDetails: FORWARD_ONLY, proxyProtocol: {}}}";
    let (l, hcm) = listener(mesh, &gateway(None));
    assert_eq!(hcm.xff_num_trusted_hops, 2);
    let forward = hcm.forward_client_cert_details;
    assert_eq!(forward, ForwardClientCertDetails::ForwardOnly as i32);
    // Nothing of the handshake is added to a header only forwarded.
    assert_eq!(hcm.set_current_client_cert_details, None);
    assert_eq!(filters(&l), ["envoy.filters.listener.proxy_protocol"]);
}

#[test]
fn a_gateways_own_proxy_config_replaces_the_meshs_default() {
    let mesh = "{gatewayTopology: {numTrustedProxies: 2, proxyProtocol: {}}}";
    let own = json!({"gatewayTopology": {"numTrustedProxies": 1, "forwardClientCertDetails": "APPEND_FORWARD"}});
    let (l, hcm) = listener(mesh, &gateway(Some(own)));
    assert_eq!(hcm.xff_num_trusted_hops, 1);
    let forward = hcm.forward_client_cert_details;
    assert_eq!(forward, ForwardClientCertDetails::AppendForward as i32);
    assert!(hcm.set_current_client_cert_details.is_some());
    assert!(filters(&l).is_empty(), "{l:?}");
    // A PROXY_CONFIG without a topology is the default one, not the mesh's (istiod's
    // `ProxyConfigOrDefault` takes the whole of either).
    let (_, hcm) = listener(mesh, &gateway(Some(json!({"concurrency": 2}))));
    assert_eq!(hcm.xff_num_trusted_hops, 0);
}

#[test]
fn a_gateway_whose_proxy_config_topology_is_invalid_is_refused_naming_the_field() {
    let meta = json!({"NAMESPACE": "istio-system", "PROXY_CONFIG": {"gatewayTopology": {"numTrustedProxies": "many"}}});
    let err = Proxy::from_node(
        "router~10.1.1.1~gw-1.istio-system~istio-system.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("PROXY_CONFIG: gatewayTopology.numTrustedProxies"),
        "{text}"
    );
    // A sidecar's topology is never read.
    let sidecar = Proxy::from_node(
        "sidecar~10.1.1.2~web-1.shop~shop.svc.cluster.local",
        meta.as_object().unwrap(),
    );
    assert_eq!(sidecar.unwrap().gateway_topology, None);
}
