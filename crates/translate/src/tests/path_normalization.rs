//! MeshConfig `pathNormalization` on every connection manager, outbound, inbound and
//! gateway, and what every one of them sets alike.

use envoy_api::pb::envoy::config::listener::v3::filter::ConfigType;
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::PathWithEscapedSlashesAction,
};
use prost::Message;
use serde_json::json;

use super::{context, ingress_gateway, sidecar};
use crate::proxy_config;

const OBJECTS: &str = "---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {clusterIP: 10.96.5.1, selector: {app: web}, ports: [{name: http, port: 80}]}\n---\napiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: istio-system}\nspec:\n  selector: {istio: ingressgateway}\n  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]\n";

/// Every connection manager of a sidecar (outbound and inbound) and a gateway, with the
/// MeshConfig `mesh` (lines, each indented by four spaces).
fn managers(mesh: &str) -> Vec<HttpConnectionManager> {
    let yaml = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n{mesh}{OBJECTS}"
    );
    let ctx = context(&yaml);
    let mut all = Vec::new();
    for p in [sidecar("shop", json!({"app": "web"})), ingress_gateway()] {
        let cfg = proxy_config(&ctx, &p);
        let chains = cfg.listeners.iter().flat_map(|l| {
            l.filter_chains
                .iter()
                .chain(l.default_filter_chain.as_ref())
        });
        for f in chains.flat_map(|c| &c.filters) {
            if let Some(ConfigType::TypedConfig(any)) = &f.config_type
                && f.name == "envoy.filters.network.http_connection_manager"
            {
                all.push(HttpConnectionManager::decode(any.value.as_slice()).unwrap());
            }
        }
    }
    all
}

/// The path settings of every connection manager of a sidecar (outbound and inbound) and
/// a gateway: (normalize_path, merge_slashes, escaped slashes action), and how many.
fn settings(normalization: &str) -> (Vec<(bool, bool, i32)>, usize) {
    let mesh = if normalization.is_empty() {
        "    trustDomain: cluster.local\n".to_string()
    } else {
        format!("    pathNormalization: {{normalization: {normalization}}}\n")
    };
    let mut all: Vec<(bool, bool, i32)> = (managers(&mesh).iter())
        .map(|h| {
            let normalize = h.normalize_path.unwrap().value;
            (
                normalize,
                h.merge_slashes,
                h.path_with_escaped_slashes_action,
            )
        })
        .collect();
    let n = all.len();
    all.sort();
    all.dedup();
    (all, n)
}

/// `Expect: 100-continue` is the server's to answer, on every side, as istiod's
/// `ENABLE_100_CONTINUE_HEADERS` default has it.
#[test]
fn every_connection_manager_proxies_100_continue() {
    let all = managers("    trustDomain: cluster.local\n");
    assert!(
        all.len() >= 3,
        "outbound, inbound and gateway: {}",
        all.len()
    );
    assert!(all.iter().all(|h| h.proxy_100_continue));
}

#[test]
fn every_connection_manager_normalizes_paths_as_the_mesh_says() {
    let keep = PathWithEscapedSlashesAction::KeepUnchanged as i32;
    let unescape = PathWithEscapedSlashesAction::UnescapeAndForward as i32;
    let (base, count) = settings("");
    // Outbound, inbound (plaintext and mutual TLS chains) and the gateway's.
    assert!(count >= 4, "{count}");
    assert_eq!(base, [(true, false, keep)]);
    for (mode, expected) in [
        ("BASE", (true, false, keep)),
        ("DEFAULT", (true, false, keep)),
        ("NONE", (false, false, keep)),
        ("MERGE_SLASHES", (true, true, keep)),
        ("DECODE_AND_MERGE_SLASHES", (true, true, unescape)),
    ] {
        assert_eq!(settings(mode), (vec![expected], count), "{mode}");
    }
}
