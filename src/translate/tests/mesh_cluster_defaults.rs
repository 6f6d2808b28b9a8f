//! MeshConfig's `connectTimeout` and `tcpKeepalive` on every cluster, under what a
//! DestinationRule sets (istiod's `applyConnectionPool` and `applyTCPKeepalive`).

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use serde_json::json;

use super::{context, sidecar};
use crate::translate::proxy_config;

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
