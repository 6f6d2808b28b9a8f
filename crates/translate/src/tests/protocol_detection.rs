//! MeshConfig `protocolDetectionTimeout` on the listeners that sniff.

use serde_json::json;

use super::{context, sidecar};
use crate::proxy_config;

/// An unnamed port (sniffed) selecting the sidecar, and the mesh `lines`; the listener
/// filter timeouts of the sidecar's sniffing outbound listener and its virtualInbound,
/// in milliseconds.
fn timeouts(lines: &str) -> (i64, i64) {
    let yaml = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: db, namespace: shop}}\nspec: {{clusterIP: 10.96.1.8, selector: {{app: db}}, ports: [{{name: db, port: 7070}}]}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n    {lines}\n"
    );
    let cfg = proxy_config(&context(&yaml), &sidecar("shop", json!({"app": "db"})));
    let ms = |name: &str| {
        let l = cfg.listeners.iter().find(|l| l.name == name).unwrap();
        assert!(l.continue_on_listener_filters_timeout, "{name}");
        let t = l.listener_filters_timeout.unwrap();
        t.seconds * 1000 + i64::from(t.nanos) / 1_000_000
    };
    (ms("10.96.1.8_7070"), ms("virtualInbound"))
}

#[test]
fn sniffing_listeners_wait_for_the_client_as_long_as_the_mesh_says() {
    assert_eq!(timeouts("trustDomain: cluster.local"), (0, 0), "no limit");
    assert_eq!(timeouts("protocolDetectionTimeout: 100ms"), (100, 100));
    assert_eq!(timeouts("protocolDetectionTimeout: 1s"), (1000, 1000));
}
