//! ProxyConfig `proxyHeaders` on a proxy's connection managers: from the `PROXY_CONFIG`
//! its agent sends, else from MeshConfig `defaultConfig`, as istiod's
//! `GetProxyHeadersFromProxyConfig` and its listener builders apply them.

use envoy_api::pb::envoy::config::core::v3::TrafficDirection;
use envoy_api::pb::envoy::config::listener::v3::filter::ConfigType;
use envoy_api::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::ForwardClientCertDetails,
    http_connection_manager::ServerHeaderTransformation, http_filter,
};
use model::Proxy;
use prost::Message;
use serde_json::{Value, json};

use super::{context, ingress_gateway};
use crate::istio_proxy::TypedStruct;
use crate::proxy_config;

/// `web` (HTTP 80) in shop, which the sidecar serves, and an ingress gateway's server.
const OBJECTS: &str = "---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {clusterIP: 10.96.5.1, selector: {app: web}, ports: [{name: http, port: 80}]}\n---\napiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: istio-system}\nspec:\n  selector: {istio: ingressgateway}\n  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]\n";

/// `web`'s sidecar, with `PROXY_CONFIG` when given.
fn web(proxy_config: Option<Value>) -> Proxy {
    let mut meta = json!({"NAMESPACE": "shop", "LABELS": {"app": "web"}});
    if let Some(config) = proxy_config {
        meta["PROXY_CONFIG"] = config;
    }
    let id = "sidecar~10.9.9.9~web-1.shop~shop.svc.cluster.local";
    Proxy::from_node(id, meta.as_object().unwrap()).unwrap()
}

/// Every connection manager of `proxy`, and whether its listener is inbound, with
/// MeshConfig `defaultConfig` being `default_config` (YAML flow).
fn managers(default_config: &str, proxy: &Proxy) -> Vec<(bool, HttpConnectionManager)> {
    let mesh = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n    defaultProviders: {{metrics: [prometheus]}}\n    defaultConfig: {default_config}\n"
    );
    let cfg = proxy_config(&context(&format!("{mesh}{OBJECTS}")), proxy);
    let mut out = Vec::new();
    for l in &cfg.listeners {
        let inbound = l.traffic_direction == TrafficDirection::Inbound as i32;
        let chains = l.filter_chains.iter().chain(&l.default_filter_chain);
        for f in chains.flat_map(|c| &c.filters) {
            if let Some(ConfigType::TypedConfig(any)) = &f.config_type
                && f.name == "envoy.filters.network.http_connection_manager"
            {
                out.push((
                    inbound,
                    HttpConnectionManager::decode(any.value.as_slice()).unwrap(),
                ));
            }
        }
    }
    assert!(out.iter().any(|(i, _)| *i), "no inbound connection manager");
    assert!(
        out.iter().any(|(i, _)| !*i),
        "no outbound connection manager"
    );
    out
}

fn suppressed(hcm: &HttpConnectionManager) -> bool {
    let router = (hcm.http_filters.iter()).find(|f| f.name == "envoy.filters.http.router");
    let Some(http_filter::ConfigType::TypedConfig(any)) = &router.unwrap().config_type else {
        panic!("{hcm:?}")
    };
    Router::decode(any.value.as_slice())
        .unwrap()
        .suppress_envoy_headers
}

#[test]
fn without_proxy_headers_connection_managers_keep_istios_defaults() {
    for (inbound, hcm) in managers("{}", &web(None)) {
        let server = if inbound { "istio-envoy" } else { "" };
        assert_eq!(hcm.server_name, server);
        let overwrite = ServerHeaderTransformation::Overwrite as i32;
        assert_eq!(hcm.server_header_transformation, overwrite);
        assert_eq!(hcm.generate_request_id, None);
        assert!(!hcm.append_x_forwarded_port && !suppressed(&hcm));
        if inbound {
            let append = ForwardClientCertDetails::AppendForward as i32;
            assert_eq!(hcm.forward_client_cert_details, append);
            let details = hcm.set_current_client_cert_details.unwrap();
            assert!(details.uri && details.dns && !details.cert && !details.chain);
        }
    }
}

#[test]
fn the_meshs_proxy_headers_apply_to_every_connection_manager() {
    let mesh = "{proxyHeaders: {server: {value: edge}, requestId: {disabled: true}, envoyDebugHeaders: {disabled: true}, xForwardedPort: {enabled: true}, forwardedClientCert: SANITIZE_SET, setCurrentClientCertDetails: {cert: true, dns: false}}}";
    for (inbound, hcm) in managers(mesh, &web(None)) {
        assert_eq!(hcm.server_name, "edge");
        assert_eq!(hcm.generate_request_id.map(|b| b.value), Some(false));
        assert!(hcm.append_x_forwarded_port && suppressed(&hcm), "{hcm:?}");
        if inbound {
            let set = ForwardClientCertDetails::SanitizeSet as i32;
            assert_eq!(hcm.forward_client_cert_details, set);
            let details = hcm.set_current_client_cert_details.unwrap();
            assert!(details.cert && !details.dns && details.uri && !details.chain);
        } else {
            // The client side never forwards a client certificate.
            let sanitize = ForwardClientCertDetails::Sanitize as i32;
            assert_eq!(hcm.forward_client_cert_details, sanitize);
        }
    }
    // At a gateway too, whose own topology decides its XFCC.
    let gateway = managers_of_gateway(mesh);
    assert_eq!(gateway.server_name, "edge");
    let set = ForwardClientCertDetails::SanitizeSet as i32;
    assert_eq!(gateway.forward_client_cert_details, set);
}

fn managers_of_gateway(default_config: &str) -> HttpConnectionManager {
    let mesh = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n    defaultConfig: {default_config}\n"
    );
    let cfg = proxy_config(&context(&format!("{mesh}{OBJECTS}")), &ingress_gateway());
    let l = cfg
        .listeners
        .iter()
        .find(|l| l.name == "0.0.0.0_80")
        .unwrap();
    let Some(ConfigType::TypedConfig(any)) = &l.filter_chains[0].filters[0].config_type else {
        panic!("{l:?}")
    };
    HttpConnectionManager::decode(any.value.as_slice()).unwrap()
}

#[test]
fn a_disabled_server_header_passes_the_applications_through_and_proxy_config_wins() {
    let mesh = "{proxyHeaders: {server: {value: edge}}}";
    let own = json!({"proxyHeaders": {"server": {"disabled": true}}});
    for (_, hcm) in managers(mesh, &web(Some(own))) {
        assert_eq!(hcm.server_name, "");
        let pass = ServerHeaderTransformation::PassThrough as i32;
        assert_eq!(hcm.server_header_transformation, pass);
    }
    // A PROXY_CONFIG without proxyHeaders is the default, not the mesh's.
    for (inbound, hcm) in managers(mesh, &web(Some(json!({"concurrency": 2})))) {
        assert_eq!(hcm.server_name, if inbound { "istio-envoy" } else { "" });
    }
}

#[test]
fn in_mesh_metadata_exchange_headers_skip_external_clusters_on_the_client_side() {
    let mesh = "{proxyHeaders: {metadataExchangeHeaders: {mode: IN_MESH}}}";
    let mut proxy = web(None);
    proxy.istio_extensions = true;
    for (inbound, hcm) in managers(mesh, &proxy) {
        let mx = (hcm.http_filters.iter()).find(|f| f.name == "istio.metadata_exchange");
        let Some(http_filter::ConfigType::TypedConfig(any)) = &mx.unwrap().config_type else {
            panic!("{hcm:?}")
        };
        let config = TypedStruct::decode(any.value.as_slice()).unwrap();
        let text = format!("{:?}", config.value);
        assert_eq!(text.contains("skip_external_clusters"), !inbound, "{text}");
    }
}

/// `web`'s VirtualService: `/a` rewrites the authority, the rest routes as written; and
/// one for the gateway's server.
const REWRITE: &str = "---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: web, namespace: shop}\nspec:\n  hosts: [web]\n  http:\n  - match: [{uri: {prefix: /a}}]\n    rewrite: {authority: a.example.com}\n    route: [{destination: {host: web}}]\n  - route: [{destination: {host: web}}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: front, namespace: shop}\nspec:\n  hosts: [front.example.com]\n  gateways: [istio-system/gw]\n  http:\n  - route: [{destination: {host: web}}]\n";

/// Each virtual host of `proxy`'s route configurations: (name, whether it includes the
/// attempt count, the names of its routes that append `x-forwarded-host`).
fn virtual_hosts(default_config: &str, proxy: &Proxy) -> Vec<(String, bool, Vec<String>)> {
    use envoy_api::pb::envoy::config::route::v3::route::Action;
    let mesh = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n    defaultConfig: {default_config}\n"
    );
    let cfg = proxy_config(&context(&format!("{mesh}{OBJECTS}{REWRITE}")), proxy);
    let vhosts: Vec<_> = (cfg.routes.iter()).flat_map(|r| &r.virtual_hosts).collect();
    assert!(!vhosts.is_empty(), "{:?}", cfg.routes);
    (vhosts.into_iter())
        .map(|vh| {
            let appending = (vh.routes.iter())
                .filter(
                    |r| matches!(&r.action, Some(Action::Route(a)) if a.append_x_forwarded_host),
                )
                .map(|r| r.name.clone())
                .collect();
            (vh.name.clone(), vh.include_request_attempt_count, appending)
        })
        .collect()
}

#[test]
fn attempt_count_and_x_forwarded_host_are_set_in_every_virtual_host() {
    // Istio's defaults: the attempt count everywhere, no x-forwarded-host.
    for (name, attempts, appending) in virtual_hosts("{}", &web(None)) {
        assert!(attempts && appending.is_empty(), "{name}: {appending:?}");
    }
    let own = json!({"proxyHeaders": {"attemptCount": {"disabled": true}, "xForwardedHost": {"enabled": true}}});
    let vhosts = virtual_hosts("{}", &web(Some(own)));
    for (name, attempts, _) in &vhosts {
        assert!(!attempts, "{name}");
    }
    // x-forwarded-host on the route that rewrites and on the catch-all's, as istiod.
    let appending = |name: &str| {
        let vh = vhosts.iter().find(|(n, ..)| n == name);
        vh.unwrap_or_else(|| panic!("{name} in {vhosts:?}")).2.len()
    };
    assert_eq!(appending("web.shop.svc.cluster.local:80"), 1, "{vhosts:?}");
    assert_eq!(appending("allow_any"), 1, "{vhosts:?}");

    // A gateway's virtual hosts, from MeshConfig's defaultConfig.
    let mesh = "{proxyHeaders: {attemptCount: {disabled: true}}}";
    let gateway = virtual_hosts(mesh, &ingress_gateway());
    assert_eq!(gateway.len(), 1, "{gateway:?}");
    assert!(
        gateway.iter().all(|(_, attempts, _)| !attempts),
        "{gateway:?}"
    );
    let gateway = virtual_hosts("{}", &ingress_gateway());
    assert!(
        gateway.iter().all(|(_, attempts, _)| *attempts),
        "{gateway:?}"
    );
}
