//! MeshConfig's `connectTimeout` and `tcpKeepalive` on every cluster, under what a
//! DestinationRule sets (istiod's `applyConnectionPool` and `applyTCPKeepalive`).

use envoy_api::pb::envoy::config::cluster::v3::Cluster;
use serde_json::json;

use super::{context, sidecar};
use crate::proxy_config;

/// (connect timeout in seconds, keepalive probes, time, interval) of a cluster.
fn pool(c: &Cluster) -> (i64, Option<u32>, Option<u32>, Option<u32>) {
    let k = (c.upstream_connection_options.as_ref()).and_then(|o| o.tcp_keepalive);
    let k = k.unwrap_or_default();
    (
        c.connect_timeout.unwrap().seconds,
        k.keepalive_probes.map(|v| v.value),
        k.keepalive_time.map(|v| v.value),
        k.keepalive_interval.map(|v| v.value),
    )
}

#[test]
fn clusters_take_the_meshs_connect_timeout_and_keepalive_under_their_rules() {
    let services = "---\napiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: shop}\nspec: {clusterIP: 10.96.0.50, selector: {app: web}, ports: [{name: tcp, port: 5432}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: shop}\nspec: {clusterIP: 10.96.0.51, ports: [{name: http, port: 80}]}\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: api, namespace: shop}\nspec:\n  host: api\n  trafficPolicy: {connectionPool: {tcp: {connectTimeout: 1s, tcpKeepalive: {probes: 2, interval: 30s}}}}\n";
    let mesh = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |\n    connectTimeout: 3s\n    tcpKeepalive: {probes: 5, time: 600s}\n";
    let proxy = sidecar("shop", json!({"app": "web"}));
    let cluster = |yaml: &str, name: &str| {
        let cfg = proxy_config(&context(yaml), &proxy);
        let c = cfg.clusters.iter().find(|c| c.name == name);
        pool(c.unwrap_or_else(|| panic!("{name}")))
    };
    let with_mesh = format!("{mesh}{services}");
    let db = "outbound|5432||db.shop.svc.cluster.local";
    let api = "outbound|80||api.shop.svc.cluster.local";
    // Istio's defaults without the mesh's: 10s and no keepalive.
    assert_eq!(cluster(services, db), (10, None, None, None));
    assert_eq!(cluster(services, api), (1, Some(2), None, Some(30)));
    assert_eq!(cluster(&with_mesh, db), (3, Some(5), Some(600), None));
    // The rule's keepalive over the mesh's, field by field; its own timeout.
    assert_eq!(cluster(&with_mesh, api), (1, Some(2), Some(600), Some(30)));
    assert_eq!(
        cluster(&with_mesh, "PassthroughCluster"),
        (3, Some(5), Some(600), None)
    );
    assert_eq!(
        cluster(&with_mesh, "BlackHoleCluster"),
        (3, None, None, None)
    );
    // The sidecar's own inbound cluster for db's port.
    assert_eq!(
        cluster(&with_mesh, "inbound|5432||"),
        (3, Some(5), Some(600), None)
    );
}

/// The upstream protocol a cluster's `HttpProtocolOptions` chose: `h1`, `h2`, the
/// client's (`downstream`), or none set.
fn upstream_protocol(c: &Cluster) -> &'static str {
    use envoy_api::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
    use envoy_api::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
        UpstreamProtocolOptions, explicit_http_config::ProtocolConfig,
    };
    use prost::Message;
    let key = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
    let Some(any) = c.typed_extension_protocol_options.get(key) else {
        return "none";
    };
    let options = HttpProtocolOptions::decode(any.value.as_slice()).unwrap();
    match options.upstream_protocol_options {
        Some(UpstreamProtocolOptions::ExplicitHttpConfig(e)) => match e.protocol_config {
            Some(ProtocolConfig::Http2ProtocolOptions(_)) => "h2",
            _ => "h1",
        },
        Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(_)) => "downstream",
        _ => "none",
    }
}

#[test]
fn the_meshs_h2_upgrade_policy_upgrades_declared_http_ports_unless_a_rule_says_not() {
    let services = "---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {clusterIP: 10.96.0.60, selector: {app: web}, ports: [{name: http, port: 80}, {name: tcp, port: 81}, {name: sniffed, port: 82}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: legacy, namespace: shop}\nspec: {clusterIP: 10.96.0.61, ports: [{name: http, port: 80}]}\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: legacy, namespace: shop}\nspec:\n  host: legacy\n  trafficPolicy: {connectionPool: {http: {h2UpgradePolicy: DO_NOT_UPGRADE}}}\n";
    let mesh = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |\n    h2UpgradePolicy: UPGRADE\n";
    let proxy = sidecar("shop", json!({"app": "web"}));
    let protocols = |yaml: &str| -> Vec<(String, &'static str)> {
        let cfg = proxy_config(&context(yaml), &proxy);
        let interesting = |n: &str| {
            n.contains("web.shop") || n.contains("legacy.shop") || n.starts_with("inbound|80|")
        };
        (cfg.clusters.iter())
            .filter(|c| interesting(&c.name))
            .map(|c| (c.name.clone(), upstream_protocol(c)))
            .collect()
    };
    let expect = |web80: &'static str| {
        vec![
            (
                "outbound|80||legacy.shop.svc.cluster.local".to_string(),
                "none",
            ),
            ("outbound|80||web.shop.svc.cluster.local".to_string(), web80),
            (
                "outbound|81||web.shop.svc.cluster.local".to_string(),
                "none",
            ),
            (
                "outbound|82||web.shop.svc.cluster.local".to_string(),
                "downstream",
            ),
            ("inbound|80||".to_string(), "none"),
        ]
    };
    let mut without = protocols(services);
    let mut with = protocols(&format!("{mesh}{services}"));
    without.sort();
    with.sort();
    let mut expected = expect("none");
    expected.sort();
    assert_eq!(without, expected);
    // Only the declared HTTP port without a rule against it; never inbound.
    let mut expected = expect("h2");
    expected.sort();
    assert_eq!(with, expected);
}

/// istiod's passthrough clusters: HTTP in the client's protocol (gRPC through `allow_any`
/// stays HTTP/2) and no circuit-breaker limits, where Envoy's defaults would allow 1024.
#[test]
fn passthrough_clusters_keep_the_clients_protocol_and_have_no_limits() {
    let cfg = proxy_config(&context(""), &sidecar("shop", json!({"app": "web"})));
    for name in ["PassthroughCluster", "InboundPassthroughCluster"] {
        let c = cfg.clusters.iter().find(|c| c.name == name).unwrap();
        assert_eq!(upstream_protocol(c), "downstream", "{name}");
        let t = &c.circuit_breakers.as_ref().unwrap().thresholds[0];
        let limits = [
            t.max_connections,
            t.max_pending_requests,
            t.max_requests,
            t.max_retries,
        ];
        assert!(
            limits.iter().all(|l| l.unwrap().value == u32::MAX),
            "{name}"
        );
    }
}
