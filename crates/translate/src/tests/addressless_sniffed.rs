//! A sniffed port of a service the proxy knows by no address (a headless Service, a
//! ServiceEntry without addresses): the shared `0.0.0.0_PORT` listener takes its HTTP by
//! the route configuration `"PORT"` and its other traffic to the service's own cluster,
//! as istiod's listener for the service does, not to PassthroughCluster (BlackHoleCluster
//! under `REGISTRY_ONLY`).

use envoy_api::pb::envoy::config::listener::v3::{FilterChain, Listener, filter::ConfigType};
use envoy_api::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    TcpProxy, tcp_proxy::ClusterSpecifier,
};
use prost::Message;
use serde_json::json;

use super::{context, sidecar};
use crate::proxy_config;

/// `kafka` in shop: headless, its port named for no protocol meshd knows (sniffed).
const KAFKA: &str = "---\napiVersion: v1\nkind: Service\nmetadata: {name: kafka, namespace: shop}\nspec: {clusterIP: None, ports: [{name: broker, port: 9092}]}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: kafka-1, namespace: shop, labels: {kubernetes.io/service-name: kafka}}\naddressType: IPv4\nports: [{name: broker, port: 9092}]\nendpoints: [{addresses: [10.0.9.1], conditions: {ready: true}}]\n";

/// MeshConfig with `outboundTrafficPolicy: REGISTRY_ONLY`.
pub(super) const REGISTRY_ONLY: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |\n    outboundTrafficPolicy: {mode: REGISTRY_ONLY}\n";

/// The cluster a chain's tcp_proxy sends to.
pub(super) fn cluster_of(chain: &FilterChain) -> String {
    let filter = (chain.filters.iter()).find(|f| f.name == "envoy.filters.network.tcp_proxy");
    let Some(ConfigType::TypedConfig(any)) = &filter.unwrap().config_type else {
        panic!("{chain:?}")
    };
    match TcpProxy::decode(any.value.as_slice())
        .unwrap()
        .cluster_specifier
    {
        Some(ClusterSpecifier::Cluster(c)) => c,
        other => panic!("{other:?}"),
    }
}

fn listener(yaml: &str, name: &str) -> Listener {
    let cfg = proxy_config(&context(yaml), &sidecar("shop", json!({"app": "web"})));
    let found = cfg.listeners.into_iter().find(|l| l.name == name);
    found.unwrap_or_else(|| panic!("no listener {name}"))
}

#[test]
fn a_headless_services_sniffed_port_sends_its_tcp_to_the_service() {
    let kafka = "outbound|9092||kafka.shop.svc.cluster.local";
    for yaml in [KAFKA.to_string(), format!("{REGISTRY_ONLY}{KAFKA}")] {
        let l = listener(&yaml, "0.0.0.0_9092");
        // HTTP, told apart by the HTTP inspector, to the port's route configuration.
        assert!(
            (l.filter_chains.iter()).any(|c| c.filters[0].name.contains("http_connection_manager")),
            "{l:?}"
        );
        let default = l.default_filter_chain.as_ref().unwrap();
        assert_eq!(cluster_of(default), kafka);
    }
}

#[test]
fn a_service_entry_without_addresses_takes_its_sniffed_ports_tcp() {
    let entry = "---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: queue, namespace: shop}\nspec:\n  hosts: [queue.example]\n  resolution: DNS\n  ports: [{number: 5672, name: amqp}]\n";
    let l = listener(&format!("{REGISTRY_ONLY}{entry}"), "0.0.0.0_5672");
    let default = l.default_filter_chain.as_ref().unwrap();
    assert_eq!(cluster_of(default), "outbound|5672||queue.example");
    // A service with an address keeps its own sniffed listener, its TCP to itself.
    let own = "---\napiVersion: v1\nkind: Service\nmetadata: {name: broker, namespace: shop}\nspec: {clusterIP: 10.96.7.1, ports: [{name: broker, port: 9093}]}\n";
    let l = listener(own, "10.96.7.1_9093");
    let default = l.default_filter_chain.as_ref().unwrap();
    assert_eq!(
        cluster_of(default),
        "outbound|9093||broker.shop.svc.cluster.local"
    );
}

#[test]
fn a_sniffed_service_with_an_address_is_also_in_the_ports_shared_route_configuration() {
    // `events` sniffs 9092 on its own listener; headless `kafka` makes `0.0.0.0_9092` and
    // its route configuration "9092", in which istiod gives `events` a virtual host too
    // (reached when the name resolves to an address other than the service's).
    let events = "---\napiVersion: v1\nkind: Service\nmetadata: {name: events, namespace: shop}\nspec: {clusterIP: 10.96.3.3, ports: [{name: stream, port: 9092}]}\n";
    let cfg = proxy_config(
        &context(&format!("{KAFKA}{events}")),
        &sidecar("shop", json!({"app": "web"})),
    );
    let route = (cfg.routes.iter()).find(|r| r.name == "9092").unwrap();
    let vh = (route.virtual_hosts.iter())
        .find(|v| v.name == "events.shop.svc.cluster.local:9092")
        .unwrap_or_else(|| panic!("{route:?}"));
    assert!(vh.domains.contains(&"10.96.3.3".to_string()), "{vh:?}");
    assert!(vh.domains.contains(&"events".to_string()), "{vh:?}");
    // Its own listener keeps its own route configuration.
    assert!(
        cfg.routes
            .iter()
            .any(|r| r.name == "events.shop.svc.cluster.local:9092")
    );
    let kafka = "kafka.shop.svc.cluster.local:9092";
    assert!(route.virtual_hosts.iter().any(|v| v.name == kafka));
}
