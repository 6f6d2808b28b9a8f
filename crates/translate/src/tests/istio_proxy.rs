//! What a proxy with Istio's extensions gets on top of stock Envoy's configuration
//! (`istio_proxy`): metadata exchange, `istio.alpn` and `istio.stats`, placed as istiod
//! places them.

use envoy_api::pb::envoy::config::listener::v3::{Filter, Listener, filter::ConfigType};
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_filter,
};
use prost::Message;
use serde_json::json;

use super::{context, ingress_gateway, sidecar};
use crate::istio_proxy::TypedStruct;
use crate::{ProxyConfig, proxy_config};
use model::Proxy;

/// A workload `web` (HTTP 80 and TCP 5432) in shop, and an ingress gateway's server.
const OBJECTS: &str = "---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {clusterIP: 10.96.5.1, selector: {app: web}, ports: [{name: http, port: 80}, {name: tcp-db, port: 5432}]}\n---\napiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: istio-system}\nspec:\n  selector: {istio: ingressgateway}\n  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]\n";

fn mesh(metrics: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n    defaultProviders: {{metrics: [{metrics}]}}\n{OBJECTS}"
    )
}

fn istio_proxy(mut p: Proxy) -> Proxy {
    p.istio_extensions = true;
    p
}

fn web() -> Proxy {
    sidecar("shop", json!({"app": "web"}))
}

fn hcm(filter: &Filter) -> Option<HttpConnectionManager> {
    match (filter.name.as_str(), &filter.config_type) {
        ("envoy.filters.network.http_connection_manager", Some(ConfigType::TypedConfig(a))) => {
            Some(HttpConnectionManager::decode(a.value.as_slice()).unwrap())
        }
        _ => None,
    }
}

fn listener<'a>(cfg: &'a ProxyConfig, name: &str) -> &'a Listener {
    let found = cfg.listeners.iter().find(|l| l.name == name);
    found.unwrap_or_else(|| panic!("no listener {name}"))
}

/// The HTTP filter names of the first connection manager of listener `name`.
fn http_filters(cfg: &ProxyConfig, name: &str) -> Vec<String> {
    let chains = listener(cfg, name).filter_chains.iter();
    let hcm = chains.flat_map(|c| c.filters.iter()).find_map(hcm).unwrap();
    hcm.http_filters.iter().map(|f| f.name.clone()).collect()
}

/// Every filter name anywhere in `cfg` (network, HTTP and cluster filters).
fn all_filter_names(cfg: &ProxyConfig) -> Vec<String> {
    let mut names = Vec::new();
    for l in &cfg.listeners {
        for f in l.filter_chains.iter().flat_map(|c| c.filters.iter()) {
            names.push(f.name.clone());
            if let Some(h) = hcm(f) {
                names.extend(h.http_filters.iter().map(|f| f.name.clone()));
            }
        }
    }
    names.extend(
        cfg.clusters
            .iter()
            .flat_map(|c| c.filters.iter().map(|f| f.name.clone())),
    );
    names
}

#[test]
fn stock_envoy_gets_none_of_istios_filters() {
    let ctx = context(&mesh("prometheus"));
    for proxy in [web(), ingress_gateway()] {
        let names = all_filter_names(&proxy_config(&ctx, &proxy));
        assert!(names.iter().all(|n| !n.starts_with("istio.")), "{names:?}");
    }
}

#[test]
fn an_istio_proxy_sidecar_gets_istiods_filters_in_istiods_order() {
    let cfg = proxy_config(&context(&mesh("prometheus")), &istio_proxy(web()));
    // Outbound HTTP (80): exchange first, ALPN after gRPC statistics, stats before the
    // router.
    assert_eq!(
        http_filters(&cfg, "0.0.0.0_80"),
        [
            "istio.metadata_exchange",
            "envoy.filters.http.grpc_stats",
            "istio.alpn",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "istio.stats",
            "envoy.filters.http.router"
        ]
    );
    // Inbound: the network exchange filter opens every chain; the HTTP chains' managers
    // have no ALPN filter; tcp_proxy has stats in front.
    let inbound = listener(&cfg, "virtualInbound");
    for chain in &inbound.filter_chains {
        assert_eq!(
            chain.filters[0].name, "istio.metadata_exchange",
            "{}",
            chain.name
        );
        let names: Vec<&str> = chain.filters.iter().map(|f| f.name.as_str()).collect();
        if let Some(i) = names
            .iter()
            .position(|n| *n == "envoy.filters.network.tcp_proxy")
        {
            assert_eq!(names[i - 1], "istio.stats", "{}: {names:?}", chain.name);
        }
        for h in chain.filters.iter().filter_map(hcm) {
            let http: Vec<&str> = h.http_filters.iter().map(|f| f.name.as_str()).collect();
            assert_eq!(http.first(), Some(&"istio.metadata_exchange"));
            assert_eq!(
                &http[http.len() - 2..],
                ["istio.stats", "envoy.filters.http.router"]
            );
            assert!(!http.contains(&"istio.alpn"), "{http:?}");
        }
    }
    // Outbound clusters and PassthroughCluster exchange metadata; inbound ones and the
    // black hole do not.
    for c in &cfg.clusters {
        let names: Vec<&str> = c.filters.iter().map(|f| f.name.as_str()).collect();
        let expected: &[&str] = if c.name.starts_with("outbound|") || c.name == "PassthroughCluster"
        {
            &["istio.metadata_exchange"]
        } else {
            &[]
        };
        assert_eq!(names, expected, "{}", c.name);
    }
}

#[test]
fn the_exchange_filters_carry_istiods_configurations() {
    let cfg = proxy_config(&context(&mesh("prometheus")), &istio_proxy(web()));
    let typed = |any: &envoy_api::pb::google::protobuf::Any| {
        assert_eq!(any.type_url, "type.googleapis.com/udpa.type.v1.TypedStruct");
        let t = TypedStruct::decode(any.value.as_slice()).unwrap();
        (t.type_url, t.value.unwrap())
    };
    let fields = |json: serde_json::Value| crate::json_struct(json.as_object().unwrap());
    let cluster = cfg
        .clusters
        .iter()
        .find(|c| c.name == "PassthroughCluster")
        .unwrap();
    assert_eq!(
        typed(cluster.filters[0].typed_config.as_ref().unwrap()),
        (
            "type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange".into(),
            fields(json!({"protocol": "istio-peer-exchange", "enable_discovery": true}))
        )
    );
    let outbound = listener(&cfg, "0.0.0.0_80").filter_chains.iter();
    let h = outbound
        .flat_map(|c| c.filters.iter())
        .find_map(hcm)
        .unwrap();
    let Some(http_filter::ConfigType::TypedConfig(any)) = &h.http_filters[0].config_type else {
        panic!()
    };
    assert_eq!(
        typed(any),
        (
            "type.googleapis.com/io.istio.http.peer_metadata.Config".into(),
            fields(json!({
                "upstream_discovery": [{"istio_headers": {}}, {"workload_discovery": {}}],
                "upstream_propagation": [{"istio_headers": {}}]
            }))
        )
    );
}

/// `disable_host_header_fallback` (field 6) of each stats filter of `filters`.
fn host_fallback_disabled<'a>(
    filters: impl Iterator<Item = &'a http_filter::ConfigType>,
) -> Vec<bool> {
    filters
        .map(|c| {
            let http_filter::ConfigType::TypedConfig(any) = c else {
                panic!()
            };
            assert_eq!(any.type_url, "type.googleapis.com/stats.PluginConfig");
            any.value == [0x30, 1]
        })
        .collect()
}

#[test]
fn stats_take_the_destination_from_the_host_header_only_on_a_sidecars_outbound_side() {
    let ctx = context(&mesh("prometheus"));
    let sidecar = proxy_config(&ctx, &istio_proxy(web()));
    let gateway = proxy_config(&ctx, &istio_proxy(ingress_gateway()));
    let stats = |cfg: &ProxyConfig, name: &str| {
        let chains = listener(cfg, name).filter_chains.iter();
        let managers: Vec<_> = chains
            .flat_map(|c| c.filters.iter())
            .filter_map(hcm)
            .collect();
        let configs: Vec<_> = (managers.iter())
            .flat_map(|h| h.http_filters.iter())
            .filter(|f| f.name == "istio.stats")
            .filter_map(|f| f.config_type.clone())
            .collect();
        host_fallback_disabled(configs.iter())
    };
    assert_eq!(stats(&sidecar, "0.0.0.0_80"), [false]);
    assert!(stats(&sidecar, "virtualInbound").iter().all(|d| *d));
    assert_eq!(stats(&gateway, "0.0.0.0_80"), [true]);
    assert_eq!(
        http_filters(&gateway, "0.0.0.0_80")
            .first()
            .map(String::as_str),
        Some("istio.metadata_exchange")
    );
}

#[test]
fn without_a_prometheus_provider_there_are_no_stats_filters() {
    // No metrics provider, and a name no provider has.
    for metrics in ["", "nosuch"] {
        let cfg = proxy_config(&context(&mesh(metrics)), &istio_proxy(web()));
        let names = all_filter_names(&cfg);
        assert!(
            !names.iter().any(|n| n == "istio.stats"),
            "{metrics}: {names:?}"
        );
        assert!(names.iter().any(|n| n == "istio.metadata_exchange"));
    }
}

#[test]
fn a_gateways_istio_mutual_tcp_chain_opens_with_the_metadata_exchange_before_its_policies() {
    let server = "---\napiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: mesh-tcp, namespace: istio-system}\nspec:\n  selector: {istio: ingressgateway}\n  servers: [{port: {number: 9443, name: tls-mesh, protocol: TLS}, hosts: ['*'], tls: {mode: ISTIO_MUTUAL}}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: mesh-tcp, namespace: istio-system}\nspec:\n  hosts: ['*']\n  gateways: [mesh-tcp]\n  tcp: [{route: [{destination: {host: web.shop.svc.cluster.local, port: {number: 5432}}}]}]\n---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: deny, namespace: istio-system}\nspec:\n  selector: {matchLabels: {istio: ingressgateway}}\n  action: DENY\n  rules: [{from: [{source: {ipBlocks: [192.0.2.0/24]}}]}]\n";
    let ctx = context(&format!("{}{server}", mesh("prometheus")));
    let mut gateway = istio_proxy(ingress_gateway());
    gateway.identity = Some("spiffe://cluster.local/ns/istio-system/sa/gw".into());
    let names = |cfg: &ProxyConfig| -> Vec<String> {
        let l = listener(cfg, "0.0.0.0_9443");
        (l.filter_chains[0].filters.iter())
            .map(|f| f.name.clone())
            .collect()
    };
    let cfg = proxy_config(&ctx, &gateway);
    assert_eq!(
        names(&cfg),
        [
            "istio.metadata_exchange",
            "envoy.filters.network.rbac",
            "istio.stats",
            "envoy.filters.network.tcp_proxy"
        ]
    );
    // Stock Envoy: the policies first.
    gateway.istio_extensions = false;
    let cfg = proxy_config(&ctx, &gateway);
    let stock = names(&cfg);
    assert_eq!(
        stock,
        [
            "envoy.filters.network.rbac",
            "envoy.filters.network.tcp_proxy"
        ]
    );
}
