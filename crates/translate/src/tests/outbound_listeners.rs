//! The shape istiod gives a sidecar's outbound listeners and a gateway's: an HTTP port on
//! 0.0.0.0 takes HTTP by the HTTP inspector and passes everything else through (or
//! refuses it under `REGISTRY_ONLY`); `virtualOutbound` refuses connections to its own
//! port; bound listeners accept one connection per socket event; chains time out slow TLS
//! handshakes.

use envoy_api::pb::envoy::config::listener::v3::Listener;
use serde_json::json;

use super::addressless_sniffed::{REGISTRY_ONLY, cluster_of};
use super::{context, ingress_gateway, sidecar};
use crate::{ProxyConfig, proxy_config};
use model::Proxy;

fn listener<'a>(cfg: &'a ProxyConfig, name: &str) -> &'a Listener {
    let found = cfg.listeners.iter().find(|l| l.name == name);
    found.unwrap_or_else(|| panic!("no listener {name}"))
}

fn listener_filters(l: &Listener) -> Vec<&str> {
    l.listener_filters.iter().map(|f| f.name.as_str()).collect()
}

fn seconds(d: Option<envoy_api::pb::google::protobuf::Duration>) -> Option<i64> {
    d.map(|d| d.seconds)
}

#[test]
fn an_http_port_on_0_0_0_0_takes_http_by_inspection_and_passes_the_rest_through() {
    let cfg = proxy_config(&context(""), &sidecar("shop", json!({})));
    let l = listener(&cfg, "0.0.0.0_9080");
    assert_eq!(
        listener_filters(l),
        ["envoy.filters.listener.http_inspector"]
    );
    assert_eq!(seconds(l.listener_filters_timeout), Some(0), "no limit");
    assert!(l.continue_on_listener_filters_timeout);
    assert_eq!(l.filter_chains.len(), 1);
    let http = &l.filter_chains[0];
    let m = http.filter_chain_match.as_ref().unwrap();
    assert_eq!(
        (m.transport_protocol.as_str(), &m.application_protocols[..]),
        (
            "raw_buffer",
            &["http/1.1".to_string(), "h2c".to_string()][..]
        )
    );
    assert_eq!(
        http.filters[0].name,
        "envoy.filters.network.http_connection_manager"
    );
    assert_eq!(seconds(http.transport_socket_connect_timeout), Some(15));
    let other = l.default_filter_chain.as_ref().unwrap();
    assert_eq!(other.name, "PassthroughFilterChain");
    assert_eq!(cluster_of(other), "PassthroughCluster");
    assert_eq!(other.transport_socket_connect_timeout, None);
    // Not bound: the socket is virtualOutbound's.
    assert_eq!(l.max_connections_to_accept_per_socket_event, None);
}

#[test]
fn under_registry_only_what_is_not_http_is_refused() {
    let cfg = proxy_config(&context(REGISTRY_ONLY), &sidecar("shop", json!({})));
    let l = listener(&cfg, "0.0.0.0_9080");
    assert_eq!(
        cluster_of(l.default_filter_chain.as_ref().unwrap()),
        "BlackHoleCluster"
    );
}

#[test]
fn without_capture_an_http_port_binds_for_real_and_takes_only_http() {
    let meta = json!({"NAMESPACE": "shop", "INTERCEPTION_MODE": "NONE"});
    let proxy = Proxy::from_node(
        "sidecar~10.9.9.9~p.shop~shop.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap();
    let cfg = proxy_config(&context(""), &proxy);
    let l = listener(&cfg, "127.0.0.1_9080");
    assert!(l.listener_filters.is_empty());
    assert_eq!(l.filter_chains.len(), 1);
    assert_eq!(l.filter_chains[0].filter_chain_match, None);
    assert!(l.default_filter_chain.is_none());
    assert_eq!(
        seconds(l.filter_chains[0].transport_socket_connect_timeout),
        Some(15)
    );
    assert_eq!(
        l.max_connections_to_accept_per_socket_event
            .map(|v| v.value),
        Some(1)
    );
}

#[test]
fn virtual_outbound_refuses_connections_to_its_own_port() {
    let cfg = proxy_config(&context(""), &sidecar("shop", json!({})));
    let l = listener(&cfg, "virtualOutbound");
    let names: Vec<&str> = l.filter_chains.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        ["virtualOutbound-blackhole", "virtualOutbound-catchall-tcp"]
    );
    let own = l.filter_chains[0].filter_chain_match.as_ref().unwrap();
    assert_eq!(own.destination_port.map(|p| p.value), Some(15001));
    assert_eq!(cluster_of(&l.filter_chains[0]), "BlackHoleCluster");
    assert_eq!(cluster_of(&l.filter_chains[1]), "PassthroughCluster");
    assert_eq!(
        l.max_connections_to_accept_per_socket_event
            .map(|v| v.value),
        Some(1)
    );
    let inbound = listener(&cfg, "virtualInbound");
    assert_eq!(
        inbound
            .max_connections_to_accept_per_socket_event
            .map(|v| v.value),
        Some(1)
    );
}

#[test]
fn a_gateways_listeners_accept_one_connection_per_event_and_time_out_handshakes() {
    let gateway = "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: istio-system}\nspec:\n  selector: {istio: ingressgateway}\n  servers: [{port: {number: 8080, name: http, protocol: HTTP}, hosts: ['*']}]\n";
    let cfg = proxy_config(&context(gateway), &ingress_gateway());
    let l = listener(&cfg, "0.0.0.0_8080");
    assert_eq!(
        l.max_connections_to_accept_per_socket_event
            .map(|v| v.value),
        Some(1)
    );
    assert!(!l.filter_chains.is_empty());
    for c in &l.filter_chains {
        assert_eq!(seconds(c.transport_socket_connect_timeout), Some(15));
    }
}
