//! A Gateway HTTP server with `tls.httpsRedirect`: its virtual hosts require TLS, routed
//! or not, as istiod's `buildGatewayHTTPRouteConfig` sets them.

use envoy_api::pb::envoy::config::route::v3::virtual_host::TlsRequirementType;
use serde_json::json;

use super::context;
use crate::proxy_config;
use model::Proxy;

const MESH: &str = r#"
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: web, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: [shop.example.com, "shop/admin.example.com", "*/legacy.example.com"]
    tls: {httpsRedirect: true}
  - port: {number: 80, name: http-open, protocol: HTTP}
    hosts: [open.example.com]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: shop, namespace: istio-system}
spec:
  hosts: [shop.example.com, open.example.com]
  gateways: [web]
  http: [{route: [{destination: {host: reviews}}]}]
"#;

#[test]
fn a_redirecting_servers_hosts_require_tls_and_the_others_do_not() {
    let ctx = context(MESH);
    let meta = json!({"LABELS": {"istio": "ingressgateway"}});
    let id = "router~10.1.1.1~gw-1.istio-system~istio-system.svc.cluster.local";
    let proxy = Proxy::from_node(id, meta.as_object().unwrap()).unwrap();
    let cfg = proxy_config(&ctx, &proxy);
    assert_eq!(cfg.listeners.len(), 1, "both servers share port 80");
    let rc = cfg.routes.iter().find(|r| r.name == "http.80").unwrap();
    let vhosts: Vec<(&str, String, bool, usize)> = (rc.virtual_hosts.iter())
        .map(|v| {
            let all = v.require_tls == TlsRequirementType::All as i32;
            (v.name.as_str(), v.domains.join(","), all, v.routes.len())
        })
        .collect();
    let vhost = |name, domains: &str, tls, routes| (name, domains.to_string(), tls, routes);
    assert_eq!(
        vhosts,
        [
            // Not routed, redirected all the same; the namespace is not a domain's. Alike,
            // they share one virtual host, named by the longer host.
            vhost(
                "legacy.example.com:80",
                "legacy.example.com,admin.example.com",
                true,
                0
            ),
            vhost("open.example.com:80", "open.example.com", false, 1),
            vhost("shop.example.com:80", "shop.example.com", true, 1),
        ]
    );
}

/// A VirtualService with several hosts gives a gateway one virtual host for them, named by
/// the most specific (names before wildcards, longer first, then alphabetical), as
/// istiod's `collapseDuplicateRoutes`; a host that another VirtualService also routes has
/// other routes, and a virtual host of its own.
#[test]
fn hosts_routed_by_the_same_virtual_services_share_a_virtual_host() {
    let yaml = r#"
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: web, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ["*"]}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: shop, namespace: istio-system}
spec:
  hosts: [b.example.com, "*.example.com", a.example.com, long.example.com, c.example.com]
  gateways: [web]
  http: [{route: [{destination: {host: reviews}}]}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: more, namespace: istio-system}
spec:
  hosts: [c.example.com]
  gateways: [web]
  http: [{match: [{uri: {prefix: /more}}], route: [{destination: {host: ratings}}]}]
"#;
    let ctx = context(yaml);
    let meta = json!({"LABELS": {"istio": "ingressgateway"}});
    let id = "router~10.1.1.1~gw-1.istio-system~istio-system.svc.cluster.local";
    let proxy = Proxy::from_node(id, meta.as_object().unwrap()).unwrap();
    let cfg = proxy_config(&ctx, &proxy);
    let rc = cfg.routes.iter().find(|r| r.name == "http.80").unwrap();
    let vhosts: Vec<(&str, String, usize)> = (rc.virtual_hosts.iter())
        .map(|v| (v.name.as_str(), v.domains.join(","), v.routes.len()))
        .collect();
    assert_eq!(
        vhosts,
        [
            ("c.example.com:80", "c.example.com".to_string(), 2),
            (
                "long.example.com:80",
                "long.example.com,a.example.com,b.example.com,*.example.com".to_string(),
                1
            ),
        ]
    );
}
