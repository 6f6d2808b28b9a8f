//! Table tests of the translation: names, domains, defaults and scoping as istiod emits them.

use envoy_api::pb::envoy::config::route::v3::{
    RouteConfiguration, route::Action, route_action::ClusterSpecifier,
};
use envoy_api::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions,
    http_protocol_options::{
        ExplicitHttpConfig, UpstreamProtocolOptions, explicit_http_config::ProtocolConfig,
    },
};
use serde_json::json;

use super::*;
use model::{Proxy, PushContext};

const MESH: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: shop}
spec:
  clusterIP: 10.96.1.2
  ports: [{name: http, port: 9080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: reviews-a, namespace: shop, labels: {kubernetes.io/service-name: reviews}}
addressType: IPv4
ports: [{name: http, port: 9080}]
endpoints:
- {addresses: [10.0.0.1], conditions: {ready: true}, targetRef: {kind: Pod, name: reviews-v1}, zone: z1}
- {addresses: [10.0.0.2], conditions: {ready: true}, targetRef: {kind: Pod, name: reviews-v2}, zone: z2}
- {addresses: [10.0.0.3], conditions: {ready: false}, targetRef: {kind: Pod, name: reviews-v2b}}
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-v1, namespace: shop, labels: {app: reviews, version: v1}}
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-v2, namespace: shop, labels: {app: reviews, version: v2}}
---
apiVersion: v1
kind: Service
metadata: {name: ratings, namespace: other}
spec:
  clusterIP: 10.96.1.3
  ports: [{name: http, port: 9080}, {name: tcp-db, port: 5432}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: shop}
spec:
  host: reviews
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews]
  http:
  - match: [{headers: {end-user: {exact: jason}}}]
    route: [{destination: {host: reviews, subset: v2}}]
  - route:
    - {destination: {host: reviews, subset: v1}, weight: 80}
    - {destination: {host: reviews, subset: v2}, weight: 20}
    timeout: 3s
"#;

fn context(extra: &str) -> PushContext {
    PushContext::from_yaml(&format!("{MESH}\n---\n{extra}"))
}

fn sidecar(ns: &str, labels: serde_json::Value) -> Proxy {
    let meta = json!({"NAMESPACE": ns, "LABELS": labels});
    Proxy::from_node(
        &format!("sidecar~10.9.9.9~p.{ns}~{ns}.svc.cluster.local"),
        meta.as_object().unwrap(),
    )
    .unwrap()
}

/// The ingress gateway `gw-1` of istio-system (`istio: ingressgateway`).
fn ingress_gateway() -> Proxy {
    let meta = json!({"NAMESPACE": "istio-system", "LABELS": {"istio": "ingressgateway"}});
    Proxy::from_node(
        "router~10.1.1.1~gw-1.istio-system~istio-system.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap()
}

#[test]
fn clusters_are_named_outbound_port_subset_host_with_istio_metadata() {
    let cfg = proxy_config(&context(""), &sidecar("shop", json!({})));
    let names: Vec<&str> = cfg.clusters.iter().map(|c| c.name.as_str()).collect();
    for expected in [
        "outbound|9080||reviews.shop.svc.cluster.local",
        "outbound|9080|v1|reviews.shop.svc.cluster.local",
        "outbound|9080|v2|reviews.shop.svc.cluster.local",
        "outbound|5432||ratings.other.svc.cluster.local",
        "BlackHoleCluster",
        "PassthroughCluster",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    let v1 = cfg
        .clusters
        .iter()
        .find(|c| c.name.contains("|v1|"))
        .unwrap();
    let istio = &v1.metadata.as_ref().unwrap().filter_metadata["istio"];
    assert_eq!(
        istio.fields["config"],
        string_value("/apis/networking.istio.io/v1/namespaces/shop/destination-rule/reviews")
    );
    assert_eq!(istio.fields["subset"], string_value("v1"));
    assert_eq!(v1.connect_timeout.as_ref().unwrap().seconds, 10);
}

#[test]
fn subset_endpoints_are_filtered_by_labels_and_grouped_by_locality() {
    let cfg = proxy_config(&context(""), &sidecar("shop", json!({})));
    let cla = |name: &str| {
        cfg.endpoints
            .iter()
            .find(|e| e.cluster_name == name)
            .unwrap()
    };
    let all = cla("outbound|9080||reviews.shop.svc.cluster.local");
    assert_eq!(all.endpoints.len(), 3, "localities '', z1, z2");
    let v2 = cla("outbound|9080|v2|reviews.shop.svc.cluster.local");
    assert_eq!(v2.endpoints.len(), 1);
    assert_eq!(v2.endpoints[0].locality.as_ref().unwrap().zone, "z2");
    assert_eq!(v2.endpoints[0].lb_endpoints.len(), 1);
}

#[test]
fn sidecar_routes_carry_every_kubernetes_name_and_the_virtual_service() {
    let cfg = proxy_config(&context(""), &sidecar("shop", json!({})));
    let rc = cfg.routes.iter().find(|r| r.name == "9080").unwrap();
    let vh = rc
        .virtual_hosts
        .iter()
        .find(|v| v.name == "reviews.shop.svc.cluster.local:9080")
        .unwrap();
    assert_eq!(
        vh.domains,
        [
            "reviews.shop.svc.cluster.local",
            "reviews.shop.svc.cluster.local.",
            "reviews",
            "reviews.shop.svc",
            "reviews.shop",
            "10.96.1.2"
        ]
    );
    assert_eq!(vh.routes.len(), 2);
    assert_eq!(
        vh.routes[0].r#match.as_ref().unwrap().headers[0].name,
        "end-user"
    );
    let Some(Action::Route(split)) = &vh.routes[1].action else {
        panic!()
    };
    let Some(ClusterSpecifier::WeightedClusters(w)) = &split.cluster_specifier else {
        panic!()
    };
    let weights: Vec<u32> = w
        .clusters
        .iter()
        .map(|c| c.weight.as_ref().unwrap().value)
        .collect();
    assert_eq!(weights, [80, 20]);
    assert_eq!(split.timeout.as_ref().unwrap().seconds, 3);
    // istiod's `setTimeout`: the grpc-timeout header is honoured, capped by the timeout.
    #[allow(deprecated)]
    let grpc_cap = split.max_grpc_timeout.as_ref().unwrap().seconds;
    assert_eq!(grpc_cap, 3);
    // istiod's `GetRouteOperation`: one subset cluster names its host and port, a split
    // the VirtualService and the listener port; then the matched path.
    let operations: Vec<&str> = vh
        .routes
        .iter()
        .map(|r| r.decorator.as_ref().unwrap().operation.as_str())
        .collect();
    assert_eq!(
        operations,
        ["reviews.shop.svc.cluster.local:9080/*", "reviews:9080/*"]
    );
    let retry = split.retry_policy.as_ref().unwrap();
    assert_eq!(
        retry.retry_on,
        "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
    );
    assert_eq!(retry.num_retries.as_ref().unwrap().value, 2);
    // istiod's `retry.DefaultPolicy`: no status code retriable.
    assert_eq!(retry.host_selection_retry_max_attempts, 5);
    assert!(retry.retriable_status_codes.is_empty());
    assert_eq!(
        retry.retry_host_predicate[0].name,
        "envoy.retry_host_predicates.previous_hosts"
    );
    // Seen from another namespace, the bare short name is not a domain.
    let other = proxy_config(&context(""), &sidecar("other", json!({})));
    let vh = other
        .routes
        .iter()
        .find(|r| r.name == "9080")
        .unwrap()
        .virtual_hosts
        .iter()
        .find(|v| v.name.starts_with("reviews"))
        .unwrap();
    assert!(!vh.domains.contains(&"reviews".to_string()));
    assert_eq!(rc.virtual_hosts.last().unwrap().name, "allow_any");
}

#[test]
fn a_sidecar_resource_limits_what_its_proxies_receive() {
    let scope = r#"
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: shop}
spec:
  egress: [{hosts: ["./*"]}]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: ratings-only, namespace: shop}
spec:
  workloadSelector: {labels: {app: frontend}}
  egress: [{hosts: ["other/ratings.other.svc.cluster.local"]}]
"#;
    let ctx = context(scope);
    let names = |labels| -> Vec<String> {
        proxy_config(&ctx, &sidecar("shop", labels))
            .clusters
            .into_iter()
            .map(|c| c.name)
            .filter(|n| n.starts_with("outbound"))
            .collect()
    };
    let namespace_default = names(json!({}));
    assert!(
        namespace_default
            .iter()
            .all(|n| n.ends_with("reviews.shop.svc.cluster.local")),
        "{namespace_default:?}"
    );
    let selected = names(json!({"app": "frontend"}));
    assert!(
        selected
            .iter()
            .all(|n| n.ends_with("ratings.other.svc.cluster.local")),
        "{selected:?}"
    );
    assert_eq!(selected.len(), 2);
    // Another namespace has no Sidecar: it sees everything (7 outbound and built-in
    // clusters, and InboundPassthroughCluster for its virtualInbound).
    assert_eq!(
        proxy_config(&ctx, &sidecar("other", json!({})))
            .clusters
            .len(),
        8
    );
}

#[test]
fn a_gateway_gets_one_listener_per_server_port_and_routes_from_bound_virtual_services() {
    let gw = r#"
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: web, namespace: shop}
spec:
  selector: {istio: ingressgateway}
  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ["shop.example.com"]}]
---
apiVersion: v1
kind: Service
metadata: {name: istio-ingressgateway, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  ports: [{name: http2, port: 80, targetPort: 8080}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: front, namespace: shop}
spec:
  hosts: ["shop.example.com"]
  gateways: [web]
  http:
  - match: [{uri: {prefix: /reviews}}]
    route: [{destination: {host: reviews}}]
"#;
    let ctx = context(gw);
    let meta = json!({"LABELS": {"istio": "ingressgateway"}});
    let proxy = Proxy::from_node(
        "router~10.1.1.1~gw-1.istio-system~istio-system.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap();
    let cfg = proxy_config(&ctx, &proxy);
    // Server port 80 is the gateway Service's port 80, whose targetPort is 8080.
    assert_eq!(cfg.listeners.len(), 1);
    assert_eq!(cfg.listeners[0].name, "0.0.0.0_8080");
    let rc = &cfg.routes[0];
    assert_eq!(rc.name, "http.8080");
    assert_eq!(rc.virtual_hosts[0].name, "shop.example.com:80");
    assert_eq!(rc.virtual_hosts[0].domains, ["shop.example.com"]);
    let Some(Action::Route(a)) = &rc.virtual_hosts[0].routes[0].action else {
        panic!()
    };
    assert_eq!(
        a.cluster_specifier,
        Some(ClusterSpecifier::Cluster(
            "outbound|9080||reviews.shop.svc.cluster.local".into()
        ))
    );
    // The sidecar-bound VirtualService does not leak onto the gateway.
    assert_eq!(rc.virtual_hosts.len(), 1);

    // On VHDS the same route configuration goes as a shell, its virtual host apart.
    let vhds = proxy_config(
        &ctx,
        &Proxy {
            vhds: true,
            ..proxy
        },
    );
    let shell = &vhds.routes[0];
    assert!(
        shell.virtual_hosts.is_empty() && shell.vhds.is_some(),
        "{shell:?}"
    );
    let whole = RouteConfiguration {
        vhds: None,
        virtual_hosts: rc.virtual_hosts.clone(),
        ..shell.clone()
    };
    assert_eq!(
        &whole, rc,
        "the shell is the rest of the route configuration"
    );
    let mut vh = rc.virtual_hosts[0].clone();
    vh.name = "http.8080/shop.example.com:80".into();
    assert_eq!(vhds.virtual_hosts, [vh]);
    assert!(cfg.virtual_hosts.is_empty());
}

#[test]
fn translating_twice_gives_byte_identical_resources() {
    use prost::Message;
    let ctx = context("");
    let proxy = sidecar("shop", json!({}));
    let encoded = |c: &ProxyConfig| -> Vec<Vec<u8>> {
        let mut all: Vec<Vec<u8>> = c.clusters.iter().map(canonical::encode_cluster).collect();
        all.extend(c.endpoints.iter().map(Message::encode_to_vec));
        all.extend(c.listeners.iter().map(Message::encode_to_vec));
        all.extend(c.routes.iter().map(Message::encode_to_vec));
        all.extend(c.virtual_hosts.iter().map(Message::encode_to_vec));
        all
    };
    let (a, b) = (proxy_config(&ctx, &proxy), proxy_config(&ctx, &proxy));
    assert_eq!(encoded(&a), encoded(&b));
    assert!(a.clusters.len() > 3);
}

#[test]
fn service_entries_become_dns_or_eds_clusters_with_workload_entry_endpoints() {
    let entries = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: external-api, namespace: shop}
spec:
  hosts: [api.example.com]
  location: MESH_EXTERNAL
  ports: [{number: 443, name: tls, protocol: TLS}]
  resolution: DNS
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: legacy, namespace: shop}
spec:
  hosts: [legacy.internal]
  location: MESH_INTERNAL
  ports: [{number: 8080, name: http, protocol: HTTP}]
  resolution: STATIC
  workloadSelector: {labels: {app: legacy}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: legacy-vm-1, namespace: shop}
spec:
  address: 10.5.0.1
  labels: {app: legacy, version: v1}
  locality: us-east/zone-a/rack-1
  weight: 3
  ports: {http: 18080}
"#;
    let cfg = proxy_config(&context(entries), &sidecar("shop", json!({})));
    let dns = cfg
        .clusters
        .iter()
        .find(|c| c.name == "outbound|443||api.example.com")
        .unwrap();
    assert_eq!(
        dns.cluster_discovery_type,
        Some(
            envoy_api::pb::envoy::config::cluster::v3::cluster::ClusterDiscoveryType::Type(
                envoy_api::pb::envoy::config::cluster::v3::cluster::DiscoveryType::StrictDns as i32
            )
        )
    );
    assert_eq!(
        dns.metadata.as_ref().unwrap().filter_metadata["istio"].fields["external"].kind,
        Some(ValueKind::BoolValue(true))
    );
    assert!(
        cfg.listeners.iter().any(|l| l.name == "0.0.0.0_443"),
        "a TLS port gets a TCP listener"
    );

    let cla = cfg
        .endpoints
        .iter()
        .find(|e| e.cluster_name == "outbound|8080||legacy.internal")
        .unwrap();
    let group = &cla.endpoints[0];
    let locality = group.locality.as_ref().unwrap();
    assert_eq!(
        (
            locality.region.as_str(),
            locality.zone.as_str(),
            locality.sub_zone.as_str()
        ),
        ("us-east", "zone-a", "rack-1")
    );
    assert_eq!(group.load_balancing_weight.as_ref().unwrap().value, 3);
    let Some(envoy_api::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier::Endpoint(ep)) =
        &group.lb_endpoints[0].host_identifier
    else {
        panic!()
    };
    let Some(envoy_api::pb::envoy::config::core::v3::address::Address::SocketAddress(sa)) =
        &ep.address.as_ref().unwrap().address
    else {
        panic!()
    };
    assert_eq!(sa.address, "10.5.0.1");
    assert_eq!(
        sa.port_specifier,
        Some(
            envoy_api::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(18080)
        )
    );
    let vh = cfg
        .routes
        .iter()
        .find(|r| r.name == "8080")
        .unwrap()
        .virtual_hosts
        .iter()
        .find(|v| v.name == "legacy.internal:8080")
        .unwrap();
    assert_eq!(
        vh.domains,
        ["legacy.internal", "legacy.internal."],
        "no Kubernetes short names for a ServiceEntry host"
    );
}

#[test]
fn endpoint_locality_comes_from_the_node_or_the_pod_label() {
    let extra = r#"
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/region: eu-west, topology.kubernetes.io/zone: eu-west-1b, topology.istio.io/subzone: rack-7}}
---
apiVersion: v1
kind: Service
metadata: {name: ratings, namespace: shop}
spec:
  ports: [{name: http, port: 9080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ratings-a, namespace: shop, labels: {kubernetes.io/service-name: ratings}}
addressType: IPv4
ports: [{name: http, port: 9080}]
endpoints:
- {addresses: [10.0.1.1], nodeName: node-a, zone: ignored-when-the-node-says}
- {addresses: [10.0.1.2], targetRef: {kind: Pod, name: ratings-pinned}, nodeName: node-a}
---
apiVersion: v1
kind: Pod
metadata: {name: ratings-pinned, namespace: shop, labels: {app: ratings, topology.istio.io/locality: us-east.us-east-1a.r1}}
"#;
    let cfg = proxy_config(&context(extra), &sidecar("shop", json!({})));
    let cla = cfg
        .endpoints
        .iter()
        .find(|e| e.cluster_name == "outbound|9080||ratings.shop.svc.cluster.local")
        .unwrap();
    let localities: Vec<(String, String, String)> = cla
        .endpoints
        .iter()
        .map(|g| {
            let l = g.locality.as_ref().unwrap();
            (l.region.clone(), l.zone.clone(), l.sub_zone.clone())
        })
        .collect();
    assert_eq!(
        localities,
        [
            (
                "eu-west".to_string(),
                "eu-west-1b".to_string(),
                "rack-7".to_string()
            ),
            (
                "us-east".to_string(),
                "us-east-1a".to_string(),
                "r1".to_string()
            )
        ]
    );
}

#[test]
fn registry_only_from_the_mesh_config_blocks_unknown_hosts_unless_a_sidecar_allows_them() {
    let mesh = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: istio, namespace: istio-system}
data:
  mesh: |
    outboundTrafficPolicy:
      mode: REGISTRY_ONLY
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: open, namespace: other}
spec:
  outboundTrafficPolicy: {mode: ALLOW_ANY}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: via-egress, namespace: lab}
spec:
  outboundTrafficPolicy:
    mode: ALLOW_ANY
    egressProxy: {host: ratings.other.svc.cluster.local, subset: gw, port: {number: 9080}}
"#;
    let ctx = context(mesh);
    let catch_all = |ns: &str| {
        let cfg = proxy_config(&ctx, &sidecar(ns, json!({})));
        let vh = cfg
            .routes
            .iter()
            .find(|r| r.name == "9080")
            .unwrap()
            .virtual_hosts
            .last()
            .unwrap()
            .clone();
        let outbound = cfg
            .listeners
            .iter()
            .find(|l| l.name == "virtualOutbound")
            .unwrap()
            .clone();
        (vh, outbound)
    };
    let (blocked, outbound) = catch_all("shop");
    assert_eq!(blocked.name, "block_all");
    let Some(Action::DirectResponse(dr)) = &blocked.routes[0].action else {
        panic!("{blocked:?}")
    };
    assert_eq!(dr.status, 502);
    use envoy_api::pb::envoy::config::listener::v3::filter::ConfigType;
    use envoy_api::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
        TcpProxy, tcp_proxy::ClusterSpecifier as TcpCluster,
    };
    use prost::Message;
    let to = |outbound: &envoy_api::pb::envoy::config::listener::v3::Listener| {
        let catch_all = (outbound.filter_chains.iter())
            .find(|c| c.name == "virtualOutbound-catchall-tcp")
            .unwrap();
        let Some(ConfigType::TypedConfig(any)) = &catch_all.filters[0].config_type else {
            panic!()
        };
        TcpProxy::decode(any.value.as_slice())
            .unwrap()
            .cluster_specifier
    };
    assert_eq!(
        to(&outbound),
        Some(TcpCluster::Cluster("BlackHoleCluster".into()))
    );
    // An egress proxy takes what PassthroughCluster would: HTTP and TCP alike.
    let (vh, outbound) = catch_all("lab");
    let via = "outbound|9080|gw|ratings.other.svc.cluster.local";
    assert_eq!(to(&outbound), Some(TcpCluster::Cluster(via.into())));
    let Some(Action::Route(r)) = &vh.routes[0].action else {
        panic!("{vh:?}")
    };
    assert_eq!(
        (vh.name.as_str(), &r.cluster_specifier),
        ("allow_any", &Some(ClusterSpecifier::Cluster(via.into())))
    );
    assert_eq!(
        catch_all("other").0.name,
        "allow_any",
        "the Sidecar's policy wins"
    );
    let last_vhost = |ctx: &PushContext| {
        let cfg = proxy_config(ctx, &sidecar("shop", json!({})));
        cfg.routes[0].virtual_hosts.last().unwrap().name.clone()
    };
    assert_eq!(last_vhost(&context("")), "allow_any");
    // A Sidecar's policy without a mode is REGISTRY_ONLY (the enum's zero value), not the
    // mesh's ALLOW_ANY.
    let unset = "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: s, namespace: shop}\nspec:\n  outboundTrafficPolicy: {}\n";
    assert_eq!(last_vhost(&context(unset)), "block_all");
}

fn cluster<'a>(
    cfg: &'a ProxyConfig,
    name: &str,
) -> &'a envoy_api::pb::envoy::config::cluster::v3::Cluster {
    cfg.clusters.iter().find(|c| c.name == name).unwrap()
}

fn thresholds(c: &envoy_api::pb::envoy::config::cluster::v3::Cluster) -> [u32; 4] {
    let t = &c.circuit_breakers.as_ref().unwrap().thresholds[0];
    assert!(t.track_remaining, "{}", c.name);
    [
        &t.max_connections,
        &t.max_pending_requests,
        &t.max_requests,
        &t.max_retries,
    ]
    .map(|v| v.as_ref().unwrap().value)
}

const RATINGS_POOL: &str = r#"
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: ratings, namespace: other}
spec:
  host: ratings.other.svc.cluster.local
  trafficPolicy:
    connectionPool:
      tcp: {maxConnections: 7, connectTimeout: 250ms, maxConnectionDuration: 1h}
      http: {http1MaxPendingRequests: 3, http2MaxRequests: 50, maxRetries: 0, idleTimeout: 30s, maxRequestsPerConnection: 5}
    outlierDetection:
      consecutive5xxErrors: 2
      consecutiveGatewayErrors: 0
      interval: 5s
      baseEjectionTime: 1m
      maxEjectionPercent: 40
  subsets:
  - name: lax
    labels: {version: v1}
    trafficPolicy:
      outlierDetection: {consecutive5xxErrors: 9, minHealthPercent: 30}
"#;

#[test]
fn every_cluster_gets_circuit_breakers_at_the_maximum_unless_a_pool_lowers_them() {
    let cfg = proxy_config(&context(RATINGS_POOL), &sidecar("shop", json!({})));
    // No connection pool: every threshold at the maximum, so Envoy's defaults (1,024
    // connections and requests, 3 retries) never apply; no outlier detection.
    let reviews = cluster(&cfg, "outbound|9080||reviews.shop.svc.cluster.local");
    assert_eq!(thresholds(reviews), [u32::MAX; 4]);
    assert!(reviews.outlier_detection.is_none());
    assert!(reviews.typed_extension_protocol_options.is_empty());
    // The pool's limits; maxRetries 0 means unset, as in Istio.
    let ratings = cluster(&cfg, "outbound|9080||ratings.other.svc.cluster.local");
    assert_eq!(thresholds(ratings), [7, 3, 50, u32::MAX]);
    assert_eq!(ratings.connect_timeout.as_ref().unwrap().nanos, 250_000_000);
    let any = &ratings.typed_extension_protocol_options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
    let opts: HttpProtocolOptions = prost::Message::decode(&any.value[..]).unwrap();
    let common = opts.common_http_protocol_options.unwrap();
    assert_eq!(common.idle_timeout.unwrap().seconds, 30);
    assert_eq!(common.max_connection_duration.unwrap().seconds, 3600);
    assert_eq!(common.max_requests_per_connection.unwrap().value, 5);
    // An HTTP/1.1 port: Envoy needs the upstream protocol named.
    assert!(matches!(
        opts.upstream_protocol_options,
        Some(UpstreamProtocolOptions::ExplicitHttpConfig(
            ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::HttpProtocolOptions(_))
            }
        ))
    ));
    // The TCP port of the same service shares the limits.
    let db = cluster(&cfg, "outbound|5432||ratings.other.svc.cluster.local");
    assert_eq!(thresholds(db), [7, 3, 50, u32::MAX]);
}

#[test]
fn outlier_detection_ejects_on_consecutive_errors_only_and_a_subset_policy_merges_over_the_rule() {
    let cfg = proxy_config(&context(RATINGS_POOL), &sidecar("shop", json!({})));
    let ratings = cluster(&cfg, "outbound|9080||ratings.other.svc.cluster.local");
    let od = ratings.outlier_detection.as_ref().unwrap();
    let v = |x: &Option<envoy_api::pb::google::protobuf::UInt32Value>| x.as_ref().map(|x| x.value);
    assert_eq!(
        v(&od.enforcing_success_rate),
        Some(0),
        "success-rate ejection off"
    );
    assert_eq!(
        (v(&od.consecutive_5xx), v(&od.enforcing_consecutive_5xx)),
        (Some(2), Some(100))
    );
    assert_eq!(
        (
            v(&od.consecutive_gateway_failure),
            v(&od.enforcing_consecutive_gateway_failure)
        ),
        (Some(0), Some(0)),
        "set to 0: not enforced"
    );
    assert_eq!(od.interval.unwrap().seconds, 5);
    assert_eq!(od.base_ejection_time.unwrap().seconds, 60);
    assert_eq!(v(&od.max_ejection_percent), Some(40));
    assert!(!od.split_external_local_origin_errors);
    // minHealthPercent unset: the panic threshold is 0 (Envoy's default of 50 is off).
    let panic = |c: &envoy_api::pb::envoy::config::cluster::v3::Cluster| {
        c.common_lb_config
            .as_ref()
            .unwrap()
            .healthy_panic_threshold
            .unwrap()
            .value
    };
    assert_eq!(panic(ratings), 0.0);
    // A subset's policy replaces the rule's component by component, as istiod merges them:
    // its outlier detection whole (no interval inherited), the rule's connection pool.
    let lax = cluster(&cfg, "outbound|9080|lax|ratings.other.svc.cluster.local");
    let od = lax.outlier_detection.as_ref().unwrap();
    assert_eq!(v(&od.consecutive_5xx), Some(9));
    assert!(od.interval.is_none() && od.max_ejection_percent.is_none());
    assert_eq!(panic(lax), 30.0);
    assert_eq!(thresholds(lax), [7, 3, 50, u32::MAX]);
}

/// The upstream HTTP protocol options of a cluster, if it has any.
fn http_options(
    c: &envoy_api::pb::envoy::config::cluster::v3::Cluster,
) -> Option<HttpProtocolOptions> {
    let any = c
        .typed_extension_protocol_options
        .get("envoy.extensions.upstreams.http.v3.HttpProtocolOptions")?;
    Some(prost::Message::decode(&any.value[..]).unwrap())
}

const RATINGS_PORTS: &str = r#"
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: ratings, namespace: other}
spec:
  host: ratings.other.svc.cluster.local
  trafficPolicy:
    connectionPool:
      tcp: {maxConnections: 100, tcpKeepalive: {time: 2h, interval: 75s, probes: 9}}
    outlierDetection: {consecutive5xxErrors: 3}
    portLevelSettings:
    - port: {number: 9080}
      connectionPool:
        http: {h2UpgradePolicy: UPGRADE, maxConcurrentStreams: 64}
      loadBalancer:
        consistentHash: {httpHeaderName: x-user, maglev: {tableSize: 65537}}
  subsets:
  - name: v1
    labels: {version: v1}
    trafficPolicy:
      loadBalancer: {simple: ROUND_ROBIN}
      portLevelSettings:
      - port: {number: 5432}
        connectionPool: {http: {useClientProtocol: true}}
"#;

#[test]
fn port_level_settings_replace_the_rules_policy_on_their_port_and_subsets_merge_over_them() {
    use envoy_api::pb::envoy::config::cluster::v3::cluster::{LbConfig, LbPolicy};
    let cfg = proxy_config(&context(RATINGS_PORTS), &sidecar("shop", json!({})));
    let h = "ratings.other.svc.cluster.local";
    // 5432: the rule's own pool, with TCP keepalive in whole seconds, and its outlier
    // detection.
    let db = cluster(&cfg, &format!("outbound|5432||{h}"));
    assert_eq!(thresholds(db)[0], 100);
    let ka = db
        .upstream_connection_options
        .as_ref()
        .unwrap()
        .tcp_keepalive
        .unwrap();
    let v = |x: Option<envoy_api::pb::google::protobuf::UInt32Value>| x.map(|x| x.value);
    assert_eq!(
        (
            v(ka.keepalive_time),
            v(ka.keepalive_interval),
            v(ka.keepalive_probes)
        ),
        (Some(7200), Some(75), Some(9))
    );
    assert!(db.outlier_detection.is_some());
    assert_eq!(db.lb_policy, LbPolicy::LeastRequest as i32);
    // 9080: the port's entry alone: no keepalive, no outlier detection, the maximum
    // connections; upgraded to HTTP/2 with its stream limit; hashed on a Maglev table.
    let http = cluster(&cfg, &format!("outbound|9080||{h}"));
    assert_eq!(thresholds(http)[0], u32::MAX);
    assert!(http.upstream_connection_options.is_none());
    assert!(http.outlier_detection.is_none());
    match http_options(http).unwrap().upstream_protocol_options {
        Some(UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
            protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(h2)),
        })) => assert_eq!(h2.max_concurrent_streams.unwrap().value, 64),
        other => panic!("not HTTP/2: {other:?}"),
    }
    assert_eq!(http.lb_policy, LbPolicy::Maglev as i32);
    assert!(
        matches!(&http.lb_config, Some(LbConfig::MaglevLbConfig(m)) if m.table_size.unwrap().value == 65537)
    );
    // Subset v1 on 9080: the rule's port entry, the subset's load balancer over it.
    let v1 = cluster(&cfg, &format!("outbound|9080|v1|{h}"));
    assert_eq!(v1.lb_policy, LbPolicy::RoundRobin as i32);
    assert!(v1.outlier_detection.is_none());
    assert!(http_options(v1).is_some());
    // Subset v1 on 5432: its own port entry replaces everything: the client's protocol,
    // no keepalive, no outlier detection, the maximum connections.
    let v1_db = cluster(&cfg, &format!("outbound|5432|v1|{h}"));
    assert_eq!(thresholds(v1_db)[0], u32::MAX);
    assert!(v1_db.upstream_connection_options.is_none() && v1_db.outlier_detection.is_none());
    assert!(matches!(
        http_options(v1_db).unwrap().upstream_protocol_options,
        Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(_))
    ));
}

#[test]
fn a_consistent_hash_hashes_the_routes_to_its_port_and_retries_on_the_same_host() {
    use envoy_api::pb::envoy::config::cluster::v3::cluster::{LbConfig, LbPolicy};
    use envoy_api::pb::envoy::config::route::v3::route_action::hash_policy::PolicySpecifier;
    let hashed = r#"
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: shop}
spec:
  host: reviews
  trafficPolicy:
    loadBalancer:
      consistentHash: {httpCookie: {name: user, ttl: 60s, path: /}}
  subsets:
  - {name: v1, labels: {version: v1}}
  - name: v2
    labels: {version: v2}
    trafficPolicy: {loadBalancer: {consistentHash: {useSourceIp: true, ringHash: {minimumRingSize: 4096}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: ratings, namespace: other}
spec:
  host: ratings.other.svc.cluster.local
  trafficPolicy: {loadBalancer: {consistentHash: {httpQueryParameterName: user}}}
"#;
    // The same name as MESH's DestinationRule for reviews: this one replaces it.
    let ctx = context(hashed);
    let cfg = proxy_config(&ctx, &sidecar("shop", json!({})));
    // Clusters: a ring of Envoy's default size, or the subset's own.
    let reviews = cluster(&cfg, "outbound|9080||reviews.shop.svc.cluster.local");
    assert_eq!(reviews.lb_policy, LbPolicy::RingHash as i32);
    assert!(
        matches!(&reviews.lb_config, Some(LbConfig::RingHashLbConfig(r)) if r.minimum_ring_size.unwrap().value == 1024)
    );
    let v2 = cluster(&cfg, "outbound|9080|v2|reviews.shop.svc.cluster.local");
    assert!(
        matches!(&v2.lb_config, Some(LbConfig::RingHashLbConfig(r)) if r.minimum_ring_size.unwrap().value == 4096)
    );
    // Routes: the VirtualService's header match to v2 hashes on the source IP and
    // retries without the previous-hosts predicate; its 80/20 split carries both
    // subsets' keys and keeps the predicate.
    let vhosts = &cfg
        .routes
        .iter()
        .find(|r| r.name == "9080")
        .unwrap()
        .virtual_hosts;
    let vh = |name: &str| vhosts.iter().find(|v| v.name == name).unwrap();
    let action = |r: &envoy_api::pb::envoy::config::route::v3::Route| match &r.action {
        Some(Action::Route(a)) => a.clone(),
        other => panic!("{other:?}"),
    };
    let reviews_vh = vh("reviews.shop.svc.cluster.local:9080");
    let to_v2 = action(&reviews_vh.routes[0]);
    assert!(matches!(
        &to_v2.hash_policy[..],
        [h] if matches!(h.policy_specifier, Some(PolicySpecifier::ConnectionProperties(ref c)) if c.source_ip)
    ));
    assert!(to_v2.retry_policy.unwrap().retry_host_predicate.is_empty());
    let split = action(&reviews_vh.routes[1]);
    let keys: Vec<_> = split
        .hash_policy
        .iter()
        .map(|h| match &h.policy_specifier {
            Some(PolicySpecifier::Cookie(c)) => {
                assert_eq!((c.ttl.unwrap().seconds, c.path.as_str()), (60, "/"));
                format!("cookie {}", c.name)
            }
            Some(PolicySpecifier::ConnectionProperties(_)) => "source ip".into(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(keys, ["cookie user", "source ip"]);
    assert_eq!(split.retry_policy.unwrap().retry_host_predicate.len(), 1);
    // A service no VirtualService routes: its default route hashes as its rule says.
    let ratings = action(&vh("ratings.other.svc.cluster.local:9080").routes[0]);
    assert!(matches!(
        &ratings.hash_policy[..],
        [h] if matches!(&h.policy_specifier, Some(PolicySpecifier::QueryParameter(q)) if q.name == "user")
    ));
}

#[test]
fn tls_origination_names_the_files_over_sds_for_an_agent_and_as_files_otherwise() {
    use envoy_api::pb::envoy::config::core::v3::{
        data_source::Specifier, transport_socket::ConfigType,
    };
    use envoy_api::pb::envoy::extensions::transport_sockets::tls::v3::{
        UpstreamTlsContext, common_tls_context::ValidationContextType,
    };
    let rule = r#"
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: ratings, namespace: other}
spec:
  host: ratings.other.svc.cluster.local
  trafficPolicy:
    tls: {mode: MUTUAL, clientCertificate: /c.pem, privateKey: /k.pem, caCertificates: /ca.pem}
    portLevelSettings:
    - port: {number: 5432}
      tls: {mode: SIMPLE, sni: db.example.com, insecureSkipVerify: true}
"#;
    let ctx = context(rule);
    let context_of = |c: &envoy_api::pb::envoy::config::cluster::v3::Cluster| {
        let socket = c.transport_socket.as_ref().expect("a TLS transport socket");
        let Some(ConfigType::TypedConfig(any)) = &socket.config_type else {
            panic!()
        };
        let tls: UpstreamTlsContext = prost::Message::decode(&any.value[..]).unwrap();
        tls
    };
    let h = "ratings.other.svc.cluster.local";
    let mut secure = sidecar("shop", json!({}));
    secure.identity = Some("spiffe://cluster.local/ns/shop/sa/default".into());
    // With the agent: SDS names; the SNI from each request's host, and its certificate
    // checked against it.
    let cfg = proxy_config(&ctx, &secure);
    let http = cluster(&cfg, &format!("outbound|9080||{h}"));
    let tls = context_of(http).common_tls_context.unwrap();
    assert_eq!(
        tls.tls_certificate_sds_secret_configs[0].name,
        "file-cert:/c.pem~/k.pem"
    );
    match tls.validation_context_type {
        Some(ValidationContextType::CombinedValidationContext(v)) => assert_eq!(
            v.validation_context_sds_secret_config.unwrap().name,
            "file-root:/ca.pem"
        ),
        other => panic!("{other:?}"),
    }
    let upstream = http_options(http)
        .unwrap()
        .upstream_http_protocol_options
        .unwrap();
    assert!(upstream.auto_sni && upstream.auto_san_validation);
    assert!(
        http.transport_socket_matches.is_empty(),
        "no auto mTLS besides"
    );
    // The port-level entry: SIMPLE with its own SNI, nothing verified, no auto SNI.
    let db = cluster(&cfg, &format!("outbound|5432||{h}"));
    let tls = context_of(db);
    assert_eq!(tls.sni, "db.example.com");
    let common = tls.common_tls_context.unwrap();
    assert!(common.tls_certificate_sds_secret_configs.is_empty());
    assert!(matches!(
        common.validation_context_type,
        Some(ValidationContextType::ValidationContext(ref v)) if v.trusted_ca.is_none()
    ));
    assert!(http_options(db).is_none_or(|o| o.upstream_http_protocol_options.is_none()));
    // Without the agent, Envoy reads the same files itself.
    let cfg = proxy_config(&ctx, &sidecar("shop", json!({})));
    let tls = context_of(cluster(&cfg, &format!("outbound|9080||{h}")))
        .common_tls_context
        .unwrap();
    let file = |d: &Option<envoy_api::pb::envoy::config::core::v3::DataSource>| match d
        .as_ref()
        .and_then(|d| d.specifier.as_ref())
    {
        Some(Specifier::Filename(f)) => f.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(file(&tls.tls_certificates[0].certificate_chain), "/c.pem");
    assert_eq!(file(&tls.tls_certificates[0].private_key), "/k.pem");
    match tls.validation_context_type {
        Some(ValidationContextType::ValidationContext(v)) => {
            assert_eq!(file(&v.trusted_ca), "/ca.pem")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn tcp_routes_pick_the_first_fitting_route_and_name_stats_as_istiod() {
    use envoy_api::pb::envoy::config::listener::v3::filter::ConfigType;
    use envoy_api::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
        TcpProxy, tcp_proxy::ClusterSpecifier as TcpCluster,
    };
    use prost::Message;
    let ctx = context(
        "apiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: shop}\nspec:\n  clusterIP: 10.96.0.50\n  ports: [{name: tcp, port: 5432}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: db, namespace: shop}\nspec:\n  hosts: [db]\n  tcp:\n  - match: [{sourceLabels: {app: batch}}]\n    route: [{destination: {host: db, subset: v2}}]\n  - route:\n    - {destination: {host: db, subset: v1}, weight: 80}\n    - {destination: {host: db, subset: v2}, weight: 20}\n",
    );
    let tcp_proxy = |labels: serde_json::Value| {
        let cfg = proxy_config(&ctx, &sidecar("shop", labels));
        let l = cfg
            .listeners
            .iter()
            .find(|l| l.name == "10.96.0.50_5432")
            .unwrap();
        let Some(ConfigType::TypedConfig(any)) = &l.filter_chains[0].filters[0].config_type else {
            panic!("{l:?}")
        };
        TcpProxy::decode(any.value.as_slice()).unwrap()
    };
    let batch = tcp_proxy(json!({"app": "batch"}));
    let v2 = "outbound|5432|v2|db.shop.svc.cluster.local";
    assert_eq!(batch.stat_prefix, v2);
    assert_eq!(
        batch.cluster_specifier,
        Some(TcpCluster::Cluster(v2.into()))
    );
    let web = tcp_proxy(json!({"app": "web"}));
    assert_eq!(web.stat_prefix, "db.shop");
    let Some(TcpCluster::WeightedClusters(w)) = web.cluster_specifier else {
        panic!("{web:?}")
    };
    let split: Vec<(&str, u32)> = w
        .clusters
        .iter()
        .map(|c| (c.name.as_str(), c.weight))
        .collect();
    assert_eq!(
        split,
        [("outbound|5432|v1|db.shop.svc.cluster.local", 80), (v2, 20)]
    );
}

#[test]
fn a_tunnel_is_the_subsets_own_for_a_subset_and_the_rules_otherwise() {
    use envoy_api::pb::envoy::config::listener::v3::filter::ConfigType;
    use envoy_api::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
    use prost::Message;
    let ctx = context(
        "apiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: shop}\nspec:\n  clusterIP: 10.96.0.50\n  ports: [{name: tcp, port: 5432}]\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: db, namespace: shop}\nspec:\n  host: db\n  trafficPolicy:\n    tunnel: {targetHost: 'fd00::1', targetPort: 5432}\n  subsets:\n  - {name: v1, labels: {v: '1'}, trafficPolicy: {tunnel: {protocol: POST, targetHost: db.example.com, targetPort: 15432}}}\n  - {name: v2, labels: {v: '2'}}\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: db, namespace: shop}\nspec:\n  hosts: [db]\n  tcp:\n  - match: [{sourceLabels: {app: one}}]\n    route: [{destination: {host: db, subset: v1}}]\n  - match: [{sourceLabels: {app: two}}]\n    route: [{destination: {host: db, subset: v2}}]\n  - route: [{destination: {host: db}}]\n",
    );
    let tunnel = |app: &str| {
        let cfg = proxy_config(&ctx, &sidecar("shop", json!({ "app": app })));
        let l = (cfg.listeners.iter())
            .find(|l| l.name == "10.96.0.50_5432")
            .unwrap();
        let Some(ConfigType::TypedConfig(any)) = &l.filter_chains[0].filters[0].config_type else {
            panic!("{l:?}")
        };
        let t = TcpProxy::decode(any.value.as_slice())
            .unwrap()
            .tunneling_config;
        t.map(|t| (t.hostname, t.use_post))
    };
    assert_eq!(tunnel("one"), Some(("db.example.com:15432".into(), true)));
    // A subset without a tunnel of its own has none, as istiod's Apply reads it.
    assert_eq!(tunnel("two"), None);
    assert_eq!(tunnel("other"), Some(("[fd00::1]:5432".into(), false)));
}

/// The cluster each chain of a listener forwards to (one tcp_proxy each): its SNI names,
/// then the cluster; the default chain last, with no names.
fn chains_to_clusters(
    l: &envoy_api::pb::envoy::config::listener::v3::Listener,
) -> Vec<(Vec<String>, String)> {
    use envoy_api::pb::envoy::config::listener::v3::filter::ConfigType;
    use envoy_api::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
        TcpProxy, tcp_proxy::ClusterSpecifier as TcpCluster,
    };
    use prost::Message;
    l.filter_chains
        .iter()
        .chain(l.default_filter_chain.as_ref())
        .map(|c| {
            let names = (c.filter_chain_match.as_ref())
                .map(|m| m.server_names.clone())
                .unwrap_or_default();
            let Some(ConfigType::TypedConfig(any)) = &c.filters[0].config_type else {
                panic!("{c:?}")
            };
            let Some(TcpCluster::Cluster(cluster)) = TcpProxy::decode(any.value.as_slice())
                .unwrap()
                .cluster_specifier
            else {
                panic!("{c:?}")
            };
            (names, cluster)
        })
        .collect()
}

fn has_tls_inspector(l: &envoy_api::pb::envoy::config::listener::v3::Listener) -> bool {
    (l.listener_filters.iter()).any(|f| f.name == "envoy.filters.listener.tls_inspector")
}

#[test]
fn a_sidecar_routes_tls_by_sni_and_lets_addressless_tls_services_share_a_port() {
    let ctx = context(concat!(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec:\n  clusterIP: 10.96.0.60\n  ports: [{name: https, port: 443}]\n---\n",
        "apiVersion: v1\nkind: Service\nmetadata: {name: legacy, namespace: shop}\nspec:\n  clusterIP: 10.96.0.61\n  ports: [{name: tls, port: 443}]\n---\n",
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: web, namespace: shop}\nspec:\n  hosts: [web, a.example.com, b.example.com]\n  tls:\n",
        "  - match: [{sniHosts: [a.example.com], sourceLabels: {app: nobody}}]\n    route: [{destination: {host: legacy}}]\n",
        "  - match: [{sniHosts: [a.example.com]}, {sniHosts: [b.example.com], port: 443}]\n    route: [{destination: {host: web}}]\n",
        "  - match: [{sniHosts: [b.example.com]}]\n    route: [{destination: {host: legacy}}]\n---\n",
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: apis, namespace: shop}\nspec:\n  hosts: [api.one.io]\n  ports: [{number: 443, name: tls, protocol: TLS}]\n  resolution: DNS\n---\n",
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: apis-2, namespace: shop}\nspec:\n  hosts: [api.two.io]\n  ports: [{number: 443, name: tls, protocol: TLS}]\n  resolution: DNS\n",
    ));
    let cfg = proxy_config(&ctx, &sidecar("shop", json!({"app": "web"})));
    let listener = |name: &str| cfg.listeners.iter().find(|l| l.name == name).unwrap();
    let web = "outbound|443||web.shop.svc.cluster.local";
    let legacy = "outbound|443||legacy.shop.svc.cluster.local";
    // The first fitting match per SNI set wins; unmatched SNI passes through.
    let routed = listener("10.96.0.60_443");
    assert_eq!(
        chains_to_clusters(routed),
        [
            (vec!["a.example.com".to_string()], web.to_string()),
            (vec!["b.example.com".to_string()], web.to_string()),
            (vec![], "PassthroughCluster".to_string()),
        ]
    );
    assert!(has_tls_inspector(routed));
    // Without tls routes a service with its own address keeps one chain, for every
    // connection, and no inspector.
    let plain = listener("10.96.0.61_443");
    assert_eq!(chains_to_clusters(plain), [(vec![], legacy.to_string())]);
    assert!(plain.default_filter_chain.is_none() && !has_tls_inspector(plain));
    // Addressless TLS services share 0.0.0.0_443, each matched on its own hostname.
    let shared = listener("0.0.0.0_443");
    assert_eq!(
        chains_to_clusters(shared),
        [
            (
                vec!["api.one.io".to_string()],
                "outbound|443||api.one.io".to_string()
            ),
            (
                vec!["api.two.io".to_string()],
                "outbound|443||api.two.io".to_string()
            ),
            (vec![], "PassthroughCluster".to_string()),
        ]
    );
    assert!(has_tls_inspector(shared));
}

#[test]
fn a_passthrough_gateway_server_forwards_by_sni_from_bound_tls_routes() {
    let ctx = context(concat!(
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: edge, namespace: shop}\nspec:\n  selector: {istio: ingressgateway}\n  servers:\n",
        // No mode: Istio's default, PASSTHROUGH.
        "  - port: {number: 8443, name: tls, protocol: TLS}\n    hosts: ['*.example.com']\n    tls: {}\n",
        "  - port: {number: 9443, name: tls-2, protocol: HTTPS}\n    hosts: [none.example.org]\n    tls: {mode: PASSTHROUGH}\n---\n",
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: sni, namespace: shop}\nspec:\n  hosts: [a.example.com, b.example.com]\n  gateways: [edge]\n  tls:\n",
        "  - match: [{sniHosts: [a.example.com], sourceLabels: {app: ignored-at-gateways}}]\n    route: [{destination: {host: reviews, port: {number: 9080}}}]\n",
        "  - match: [{sniHosts: [b.example.com], port: 8443}]\n    route: [{destination: {host: ratings.other.svc.cluster.local, port: {number: 5432}}}]\n",
        "  - match: [{sniHosts: [a.example.com, b.example.com]}]\n    route: [{destination: {host: reviews}}]\n",
        "  - match: [{sniHosts: [b.example.com], port: 9999}]\n    route: [{destination: {host: reviews}}]\n",
    ));
    let meta = json!({"LABELS": {"istio": "ingressgateway"}});
    let proxy = Proxy::from_node(
        "router~10.1.1.1~gw-1.shop~shop.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap();
    let cfg = proxy_config(&ctx, &proxy);
    // The server without a route that fits gets no listener; no route configuration.
    let names: Vec<&str> = cfg.listeners.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["0.0.0.0_8443"]);
    assert!(cfg.routes.is_empty());
    let l = &cfg.listeners[0];
    assert!(has_tls_inspector(l) && l.default_filter_chain.is_none());
    // A match whose SNI names an earlier chain holds is skipped, as istiod skips it.
    assert_eq!(
        chains_to_clusters(l),
        [
            (
                vec!["a.example.com".to_string()],
                "outbound|9080||reviews.shop.svc.cluster.local".to_string()
            ),
            (
                vec!["b.example.com".to_string()],
                "outbound|5432||ratings.other.svc.cluster.local".to_string()
            ),
        ]
    );
}

#[test]
fn a_tcp_proxy_takes_its_destination_rules_idle_timeout_duration_and_source_ip_hash() {
    use envoy_api::pb::envoy::config::listener::v3::filter::ConfigType;
    use envoy_api::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
    use prost::Message;
    let db = "apiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: shop}\nspec:\n  clusterIP: 10.96.0.50\n  ports: [{name: tcp, port: 5432}]\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: db, namespace: shop}\nspec:\n  host: db\n  trafficPolicy:\n    connectionPool: {tcp: {idleTimeout: 30s, maxConnectionDuration: 1h}}\n    loadBalancer: {consistentHash: {useSourceIp: true}}\n  subsets:\n  - {name: v1, labels: {version: v1}, trafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}}\n  - {name: v2, labels: {version: v2}}\n";
    let tcp_proxy = |extra: &str| {
        let ctx = context(&format!("{db}---\n{extra}"));
        let cfg = proxy_config(&ctx, &sidecar("shop", json!({"app": "web"})));
        let l = cfg
            .listeners
            .iter()
            .find(|l| l.name == "10.96.0.50_5432")
            .unwrap();
        let Some(ConfigType::TypedConfig(any)) = &l.filter_chains[0].filters[0].config_type else {
            panic!("{l:?}")
        };
        TcpProxy::decode(any.value.as_slice()).unwrap()
    };
    let route = |subset: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: db, namespace: shop}}\nspec:\n  hosts: [db]\n  tcp:\n  - route: [{{destination: {{host: db, subset: {subset}}}}}]\n"
        )
    };
    let seconds = |d: Option<envoy_api::pb::google::protobuf::Duration>| d.map(|d| d.seconds);
    // The service's own chain and a route to a subset without a load balancer of its own.
    for tp in [tcp_proxy(""), tcp_proxy(&route("v2"))] {
        assert_eq!(seconds(tp.idle_timeout), Some(30));
        assert_eq!(seconds(tp.max_downstream_connection_duration), Some(3600));
        assert_eq!(tp.hash_policy.len(), 1, "{tp:?}");
    }
    // A subset whose own load balancer does not hash on the source drops the hash only.
    let v1 = tcp_proxy(&route("v1"));
    assert!(v1.hash_policy.is_empty());
    assert_eq!(seconds(v1.idle_timeout), Some(30));
}

#[test]
fn idle_timeout_metadata_sets_connection_managers_and_tcp_proxies_without_a_rules() {
    use envoy_api::pb::envoy::config::listener::v3::filter::ConfigType;
    use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    use envoy_api::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
    use prost::Message;
    let ctx = context(
        "apiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: shop}\nspec:\n  clusterIP: 10.96.0.50\n  ports: [{name: tcp, port: 5432}]\n---\napiVersion: v1\nkind: Service\nmetadata: {name: cache, namespace: shop}\nspec:\n  clusterIP: 10.96.0.51\n  ports: [{name: tcp, port: 6379}]\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: db, namespace: shop}\nspec:\n  host: db\n  trafficPolicy: {connectionPool: {tcp: {idleTimeout: 30s}}}\n",
    );
    let meta = json!({"NAMESPACE": "shop", "IDLE_TIMEOUT": "5s"});
    let proxy = Proxy::from_node(
        "sidecar~10.9.9.9~p.shop~shop.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap();
    let cfg = proxy_config(&ctx, &proxy);
    let filter = |name: &str| {
        let l = cfg.listeners.iter().find(|l| l.name == name).unwrap();
        let Some(ConfigType::TypedConfig(any)) = &l.filter_chains[0].filters[0].config_type else {
            panic!("{l:?}")
        };
        any.value.clone()
    };
    let idle = |name: &str| {
        TcpProxy::decode(filter(name).as_slice())
            .unwrap()
            .idle_timeout
            .map(|d| d.seconds)
    };
    // The rule's own timeout wins; the other service takes the proxy's.
    assert_eq!(idle("10.96.0.50_5432"), Some(30));
    assert_eq!(idle("10.96.0.51_6379"), Some(5));
    let hcm = HttpConnectionManager::decode(filter("0.0.0.0_9080").as_slice()).unwrap();
    let common = hcm.common_http_protocol_options.unwrap();
    assert_eq!(common.idle_timeout.map(|d| d.seconds), Some(5));
    // Without the metadata, neither.
    let plain = proxy_config(&ctx, &sidecar("shop", json!({})));
    let l = plain
        .listeners
        .iter()
        .find(|l| l.name == "10.96.0.51_6379")
        .unwrap();
    let Some(ConfigType::TypedConfig(any)) = &l.filter_chains[0].filters[0].config_type else {
        panic!()
    };
    assert_eq!(
        TcpProxy::decode(any.value.as_slice()).unwrap().idle_timeout,
        None
    );
}

#[test]
fn a_wildcard_host_destination_rule_applies_where_no_more_specific_rule_does() {
    let ctx = context(concat!(
        "apiVersion: v1\nkind: Service\nmetadata: {name: details, namespace: shop}\nspec:\n  clusterIP: 10.96.1.4\n  ports: [{name: http, port: 9080}]\n---\n",
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: mesh-wide, namespace: istio-system}\nspec:\n  host: '*.local'\n  trafficPolicy: {connectionPool: {tcp: {maxConnections: 7}}}\n---\n",
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: other-ns, namespace: istio-system}\nspec:\n  host: '*.other.svc.cluster.local'\n  trafficPolicy: {connectionPool: {tcp: {maxConnections: 9}}}\n",
    ));
    let cfg = proxy_config(&ctx, &sidecar("shop", json!({})));
    let max_connections = |name: &str| {
        let c = cfg.clusters.iter().find(|c| c.name == name).unwrap();
        let t = &c.circuit_breakers.as_ref().unwrap().thresholds[0];
        t.max_connections.as_ref().unwrap().value
    };
    // The most specific wildcard wins; an exact host's own rule wins over both.
    assert_eq!(
        max_connections("outbound|9080||details.shop.svc.cluster.local"),
        7
    );
    assert_eq!(
        max_connections("outbound|5432||ratings.other.svc.cluster.local"),
        9
    );
    assert_eq!(
        max_connections("outbound|9080|v1|reviews.shop.svc.cluster.local"),
        u32::MAX
    );
}

#[test]
fn a_route_with_a_fault_carries_it_and_connection_managers_hold_the_fault_filter() {
    use envoy_api::pb::envoy::extensions::filters::common::fault::v3::fault_delay::FaultDelaySecifier;
    use envoy_api::pb::envoy::extensions::filters::http::fault::v3::{
        HttpFault, fault_abort::ErrorType,
    };
    use prost::Message;
    let ctx = context(concat!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: ratings, namespace: other}\nspec:\n  hosts: [ratings]\n  http:\n",
        "  - match: [{headers: {end-user: {exact: jason}}}]\n",
        "    fault: {delay: {fixedDelay: 7s, percentage: {value: 12.5}}, abort: {httpStatus: 418, percentage: {value: 100}}}\n",
        "    route: [{destination: {host: ratings}}]\n",
        "  - fault: {abort: {grpcStatus: UNAVAILABLE}}\n    route: [{destination: {host: ratings}}]\n",
    ));
    let cfg = proxy_config(&ctx, &sidecar("shop", json!({})));
    let rc = cfg.routes.iter().find(|r| r.name == "9080").unwrap();
    let vh = (rc.virtual_hosts.iter())
        .find(|v| v.name.starts_with("ratings.other"))
        .unwrap();
    let fault = |i: usize| {
        let any = &vh.routes[i].typed_per_filter_config["envoy.filters.http.fault"];
        HttpFault::decode(any.value.as_slice()).unwrap()
    };
    let jason = fault(0);
    let delay = jason.delay.unwrap();
    assert_eq!(delay.percentage.unwrap().numerator, 125_000, "per million");
    assert_eq!(
        delay.fault_delay_secifier,
        Some(FaultDelaySecifier::FixedDelay(duration(
            std::time::Duration::from_secs(7)
        )))
    );
    let abort = jason.abort.unwrap();
    assert_eq!(abort.error_type, Some(ErrorType::HttpStatus(418)));
    assert_eq!(abort.percentage.unwrap().numerator, 1_000_000);
    // Istio's default percentage is none: the abort is there, for no request.
    let rest = fault(1).abort.unwrap();
    assert_eq!(rest.error_type, Some(ErrorType::GrpcStatus(14)));
    assert!(rest.percentage.is_none());
    // The fault filter sits before the router in the outbound connection manager.
    let l = cfg
        .listeners
        .iter()
        .find(|l| l.name == "0.0.0.0_9080")
        .unwrap();
    let Some(envoy_api::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any)) =
        &l.filter_chains[0].filters[0].config_type
    else {
        panic!("{l:?}")
    };
    let hcm = envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager::decode(any.value.as_slice()).unwrap();
    let names: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "envoy.filters.http.grpc_stats",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "envoy.filters.http.router"
        ]
    );
}

#[test]
fn mirrors_copy_their_share_of_a_routes_requests_to_their_cluster() {
    let ctx = context(concat!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: shop}\nspec:\n  hosts: [reviews]\n  http:\n",
        "  - match: [{headers: {end-user: {exact: jason}}}]\n",
        "    route: [{destination: {host: reviews, subset: v1}}]\n    mirror: {host: reviews, subset: v2}\n",
        "  - route: [{destination: {host: reviews, subset: v1}}]\n",
        "    mirrors:\n    - {destination: {host: ratings.other.svc.cluster.local, port: {number: 5432}}, percentage: {value: 2.5}}\n",
        "    - {destination: {host: reviews, subset: v2}, percentage: {value: 0}}\n",
    ));
    let cfg = proxy_config(&ctx, &sidecar("shop", json!({})));
    let rc = cfg.routes.iter().find(|r| r.name == "9080").unwrap();
    let vh = (rc.virtual_hosts.iter())
        .find(|v| v.name.starts_with("reviews.shop"))
        .unwrap();
    let mirrors = |i: usize| -> Vec<(String, u32, i32)> {
        let Some(Action::Route(a)) = &vh.routes[i].action else {
            panic!()
        };
        (a.request_mirror_policies.iter())
            .map(|m| {
                let f = m.runtime_fraction.as_ref().unwrap().default_value.unwrap();
                assert_eq!(m.trace_sampled.map(|b| b.value), Some(false));
                (m.cluster.clone(), f.numerator, f.denominator)
            })
            .collect()
    };
    // `mirror` without a percentage: all of them; a listed mirror at 0%: none.
    assert_eq!(
        mirrors(0),
        [(
            "outbound|9080|v2|reviews.shop.svc.cluster.local".to_string(),
            100,
            0
        )]
    );
    assert_eq!(
        mirrors(1),
        [(
            "outbound|5432||ratings.other.svc.cluster.local".to_string(),
            25_000,
            2
        )]
    );
}

#[test]
fn a_cors_policy_becomes_the_routes_cors_filter_config() {
    use envoy_api::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy;
    use envoy_api::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
    use prost::Message;
    let ctx = context(concat!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: ratings, namespace: other}\nspec:\n  hosts: [ratings]\n  http:\n",
        "  - route: [{destination: {host: ratings}}]\n    corsPolicy:\n",
        "      allowOrigins: [{exact: 'https://a.example.com'}, {prefix: 'https://b.'}]\n",
        "      allowMethods: [GET, POST]\n      allowHeaders: [x-user]\n      exposeHeaders: [x-trace]\n",
        "      maxAge: 24h\n      allowCredentials: true\n      unmatchedPreflights: IGNORE\n",
    ));
    let cfg = proxy_config(&ctx, &sidecar("shop", json!({})));
    let rc = cfg.routes.iter().find(|r| r.name == "9080").unwrap();
    let vh = (rc.virtual_hosts.iter())
        .find(|v| v.name.starts_with("ratings.other"))
        .unwrap();
    let any = &vh.routes[0].typed_per_filter_config["envoy.filters.http.cors"];
    let cors = CorsPolicy::decode(any.value.as_slice()).unwrap();
    let origins: Vec<_> = (cors.allow_origin_string_match.iter())
        .map(|m| m.match_pattern.clone().unwrap())
        .collect();
    assert_eq!(
        origins,
        [
            MatchPattern::Exact("https://a.example.com".into()),
            MatchPattern::Prefix("https://b.".into())
        ]
    );
    assert_eq!(
        (
            cors.allow_methods.as_str(),
            cors.allow_headers.as_str(),
            cors.expose_headers.as_str()
        ),
        ("GET,POST", "x-user", "x-trace")
    );
    assert_eq!(cors.max_age, "86400");
    assert_eq!(cors.allow_credentials.map(|b| b.value), Some(true));
    assert_eq!(
        cors.forward_not_matching_preflights.map(|b| b.value),
        Some(false)
    );
    assert_eq!(
        cors.filter_enabled
            .unwrap()
            .default_value
            .unwrap()
            .numerator,
        100
    );
}

const DETAILS_INBOUND: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: details, namespace: other}
spec:
  clusterIP: 10.96.1.4
  selector: {app: details}
  ports: [{name: http, port: 9080, targetPort: 8080}, {name: tcp-db, port: 5432}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: details, namespace: other}
spec:
  host: details
  trafficPolicy:
    connectionPool: {tcp: {maxConnections: 7}}
    portLevelSettings:
    - port: {number: 9080}
      connectionPool:
        tcp: {maxConnections: 8}
        http: {h2UpgradePolicy: UPGRADE, idleTimeout: 9s}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: details-canary, namespace: other}
spec:
  host: details
  workloadSelector: {matchLabels: {app: details}}
  trafficPolicy:
    connectionPool: {tcp: {maxConnections: 3}}
"#;

#[test]
fn a_services_destination_rule_sets_the_pool_of_its_workloads_inbound_clusters() {
    let proxy = sidecar("other", json!({"app": "details"}));
    let cfg = proxy_config(&context(DETAILS_INBOUND), &proxy);
    // Target port 8080 is service port 9080: the rule's entry for 9080, never upgraded
    // to HTTP/2 inbound, and the rule named in the cluster's metadata.
    let http = cluster(&cfg, "inbound|8080||");
    assert_eq!(thresholds(http)[0], 8);
    let options = http_options(http).unwrap();
    assert!(matches!(
        options.upstream_protocol_options,
        Some(UpstreamProtocolOptions::ExplicitHttpConfig(
            ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::HttpProtocolOptions(_)),
            }
        ))
    ));
    let idle = options.common_http_protocol_options.unwrap().idle_timeout;
    assert_eq!(idle.unwrap().seconds, 9);
    let istio = &http.metadata.as_ref().unwrap().filter_metadata["istio"];
    assert_eq!(
        istio.fields["config"],
        string_value("/apis/networking.istio.io/v1/namespaces/other/destination-rule/details")
    );
    assert_eq!(thresholds(cluster(&cfg, "inbound|5432||"))[0], 7);
    // The selector rule is the proxy's rule outbound, never inbound.
    let outbound = cluster(&cfg, "outbound|9080||details.other.svc.cluster.local");
    assert_eq!(thresholds(outbound)[0], 3);

    // A Sidecar's inbound pool replaces the rule's whole pool.
    let sidecar_pool = "---\napiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: details, namespace: other}\nspec:\n  workloadSelector: {labels: {app: details}}\n  inboundConnectionPool: {tcp: {maxConnections: 5}}\n";
    let cfg = proxy_config(
        &context(&format!("{DETAILS_INBOUND}{sidecar_pool}")),
        &proxy,
    );
    for name in ["inbound|8080||", "inbound|5432||"] {
        let c = cluster(&cfg, name);
        assert_eq!(thresholds(c)[0], 5, "{name}");
        assert!(http_options(c).is_none(), "{name}");
    }
    // Without a rule: the default circuit breakers, and no rule in the metadata.
    let plain = DETAILS_INBOUND.split("---").next().unwrap();
    let cfg = proxy_config(&context(plain), &proxy);
    let c = cluster(&cfg, "inbound|8080||");
    assert_eq!(thresholds(c)[0], u32::MAX);
    let istio = &c.metadata.as_ref().unwrap().filter_metadata["istio"];
    assert!(!istio.fields.contains_key("config"), "{istio:?}");
}

#[test]
fn a_port_without_a_protocol_is_sniffed_on_its_own_listener_and_route() {
    use envoy_api::pb::envoy::config::listener::v3::filter::ConfigType;
    use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpConnectionManager, http_connection_manager::RouteSpecifier,
    };
    use envoy_api::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
        TcpProxy, tcp_proxy::ClusterSpecifier as TcpCluster,
    };
    use prost::Message;
    let web = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {clusterIP: 10.96.1.8, ports: [{name: web, port: 7070}]}\n";
    let cfg = proxy_config(&context(web), &sidecar("shop", json!({})));
    let host = "web.shop.svc.cluster.local";
    let l = cfg
        .listeners
        .iter()
        .find(|l| l.name == "10.96.1.8_7070")
        .unwrap();
    let names: Vec<&str> = l.listener_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["envoy.filters.listener.http_inspector"]);
    assert!(l.continue_on_listener_filters_timeout);
    // HTTP: matched on what the inspector reports, to the service's own route.
    let [http] = &l.filter_chains[..] else {
        panic!("{l:?}")
    };
    let m = http.filter_chain_match.as_ref().unwrap();
    assert_eq!(
        (m.transport_protocol.as_str(), &m.application_protocols[..]),
        (
            "raw_buffer",
            &["http/1.1".to_string(), "h2c".to_string()][..]
        )
    );
    let Some(ConfigType::TypedConfig(any)) = &http.filters[0].config_type else {
        panic!()
    };
    let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
    let Some(RouteSpecifier::Rds(rds)) = &hcm.route_specifier else {
        panic!()
    };
    assert_eq!(rds.route_config_name, format!("{host}:7070"));
    let filters: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
    assert!(
        filters.contains(&"envoy.filters.http.set_filter_state"),
        "{filters:?}"
    );
    // Everything else: the service's tcp_proxy.
    let tcp = l.default_filter_chain.as_ref().unwrap();
    let Some(ConfigType::TypedConfig(any)) = &tcp.filters[0].config_type else {
        panic!()
    };
    let tp = TcpProxy::decode(any.value.as_slice()).unwrap();
    assert_eq!(
        tp.cluster_specifier,
        Some(TcpCluster::Cluster(format!("outbound|7070||{host}")))
    );
    // Its route configuration: the one virtual host, for every domain, no catch-all.
    let route = cfg
        .routes
        .iter()
        .find(|r| r.name == format!("{host}:7070"))
        .unwrap();
    let [vh] = &route.virtual_hosts[..] else {
        panic!("{route:?}")
    };
    assert_eq!(vh.domains, ["*"]);
    assert!(!cfg.routes.iter().any(|r| r.name == "7070"));
    // HTTP goes upstream in the protocol it came in.
    let c = cluster(&cfg, &format!("outbound|7070||{host}"));
    assert!(matches!(
        http_options(c).unwrap().upstream_protocol_options,
        Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(_))
    ));
    // ... unless a rule upgrades it; and never at a gateway.
    let upgrade = "---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: web, namespace: shop}\nspec: {host: web, trafficPolicy: {connectionPool: {http: {h2UpgradePolicy: UPGRADE}}}}\n";
    let cfg = proxy_config(
        &context(&format!("{web}{upgrade}")),
        &sidecar("shop", json!({})),
    );
    let c = cluster(&cfg, &format!("outbound|7070||{host}"));
    assert!(matches!(
        http_options(c).unwrap().upstream_protocol_options,
        Some(UpstreamProtocolOptions::ExplicitHttpConfig(
            ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(_)),
            }
        ))
    ));
    let gateway = Proxy::from_node(
        "router~10.9.9.8~gw.istio-system~istio-system.svc.cluster.local",
        json!({"NAMESPACE": "istio-system"}).as_object().unwrap(),
    )
    .unwrap();
    let cfg = proxy_config(&context(web), &gateway);
    assert!(http_options(cluster(&cfg, &format!("outbound|7070||{host}"))).is_none());
}

#[test]
fn authorization_policies_selecting_a_gateway_guard_its_connection_managers_and_tcp_chains() {
    use envoy_api::pb::envoy::config::listener::v3::filter::ConfigType;
    use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    use prost::Message;
    let gateway = concat!(
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: edge, namespace: shop}\nspec:\n  selector: {istio: ingressgateway}\n  servers:\n",
        "  - port: {number: 80, name: http, protocol: HTTP}\n    hosts: ['*']\n",
        "  - port: {number: 5432, name: tcp, protocol: TCP}\n    hosts: ['*']\n---\n",
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: edge, namespace: shop}\nspec:\n  hosts: ['*']\n  gateways: [edge]\n",
        "  http: [{route: [{destination: {host: reviews}}]}]\n",
        "  tcp: [{route: [{destination: {host: ratings.other.svc.cluster.local, port: {number: 5432}}}]}]\n---\n",
    );
    let policy = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: edge, namespace: shop}\nspec:\n  selector: {matchLabels: {istio: ingressgateway}}\n  action: DENY\n  rules: [{from: [{source: {ipBlocks: [10.0.0.0/8]}}]}]\n";
    let meta = json!({"LABELS": {"istio": "ingressgateway"}});
    let proxy = Proxy::from_node(
        "router~10.1.1.1~gw-1.shop~shop.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap();
    let filters = |extra: &str| -> Vec<(String, Vec<String>)> {
        let cfg = proxy_config(&context(&format!("{gateway}{extra}")), &proxy);
        (cfg.listeners.iter())
            .map(|l| {
                let chain = &l.filter_chains[0];
                let mut names: Vec<String> = chain.filters.iter().map(|f| f.name.clone()).collect();
                if let Some(ConfigType::TypedConfig(any)) = &chain.filters[0].config_type
                    && chain.filters[0].name.ends_with("http_connection_manager")
                {
                    let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
                    names.extend(hcm.http_filters.iter().map(|f| f.name.clone()));
                }
                (l.name.clone(), names)
            })
            .collect()
    };
    let without = filters("");
    assert!(
        without
            .iter()
            .all(|(_, f)| !f.iter().any(|n| n.contains("rbac"))),
        "{without:?}"
    );
    let with = filters(policy);
    let [(http, hcm), (tcp, chain)] = &with[..] else {
        panic!("{with:?}")
    };
    assert_eq!(
        (http.as_str(), tcp.as_str()),
        ("0.0.0.0_80", "0.0.0.0_5432")
    );
    assert_eq!(hcm[1], "envoy.filters.http.rbac", "{hcm:?}");
    assert_eq!(
        chain,
        &[
            "envoy.filters.network.rbac",
            "envoy.filters.network.tcp_proxy"
        ]
    );
}

#[test]
fn sidecar_egress_listeners_with_ports_take_their_own_hosts_binds_and_protocols() {
    use envoy_api::pb::envoy::config::listener::v3::filter::ConfigType;
    use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpConnectionManager, http_connection_manager::RouteSpecifier,
    };
    use prost::Message;
    let scope = r#"
apiVersion: v1
kind: Service
metadata: {name: db, namespace: other}
spec:
  clusterIP: 10.96.1.4
  ports: [{name: tcp, port: 5432}]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: shop}
spec:
  egress:
  - port: {number: 9080, protocol: HTTP, name: web}
    bind: 127.0.0.2
    captureMode: NONE
    hosts: [other/ratings.other.svc.cluster.local]
  - port: {number: 7000, protocol: TCP, name: db}
    hosts: ["other/*"]
  - hosts: ["./*", "routes/*"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ratings-elsewhere, namespace: routes}
spec:
  hosts: [ratings.other.svc.cluster.local]
  http:
  - route: [{destination: {host: reviews.shop.svc.cluster.local}}]
"#;
    let ctx = context(scope);
    let cfg = proxy_config(&ctx, &sidecar("shop", json!({})));
    let names: Vec<&str> = cfg.listeners.iter().map(|l| l.name.as_str()).collect();
    // The catch-all keeps reviews' HTTP port and the TCP and HTTP ports of nothing else:
    // ratings and db are imported by the listeners with ports only.
    assert_eq!(
        names,
        [
            "0.0.0.0_9080",
            "10.96.1.3_7000",
            "10.96.1.4_7000",
            "127.0.0.2_9080",
            "virtualOutbound",
            "virtualInbound"
        ]
    );
    let find = |name: &str| cfg.listeners.iter().find(|l| l.name == name).unwrap();
    let bound = |name: &str| find(name).bind_to_port.as_ref().unwrap().value;
    // captureMode NONE binds for real; the rest wait for captured traffic.
    assert!(bound("127.0.0.2_9080"));
    assert!(!bound("0.0.0.0_9080") && !bound("10.96.1.4_7000"));
    let rds = |name: &str| {
        let Some(ConfigType::TypedConfig(any)) =
            &find(name).filter_chains[0].filters[0].config_type
        else {
            panic!()
        };
        let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
        let Some(RouteSpecifier::Rds(rds)) = hcm.route_specifier else {
            panic!()
        };
        rds.route_config_name
    };
    assert_eq!(rds("127.0.0.2_9080"), "9080");
    // A TCP listener routes to the service's only port, or its own on a service with
    // several (istiod's choice, though that cluster does not exist).
    assert_eq!(
        chains_to_clusters(find("10.96.1.4_7000")),
        [(
            vec![],
            "outbound|5432||db.other.svc.cluster.local".to_string()
        )]
    );
    assert_eq!(
        chains_to_clusters(find("10.96.1.3_7000")),
        [(
            vec![],
            "outbound|7000||ratings.other.svc.cluster.local".to_string()
        )]
    );
    // Route "9080" is the first listener with the port's: ratings, not reviews, as
    // istiod's GetEgressListenerForRDS picks it.
    let vhosts = |cfg: &ProxyConfig| -> Vec<String> {
        let rc = cfg.routes.iter().find(|r| r.name == "9080").unwrap();
        rc.virtual_hosts.iter().map(|v| v.name.clone()).collect()
    };
    assert_eq!(
        vhosts(&cfg),
        ["ratings.other.svc.cluster.local:9080", "allow_any"]
    );
    let rc = cfg.routes.iter().find(|r| r.name == "9080").unwrap();
    // Its VirtualServices are those its own hosts import: the one in `routes` (imported
    // by the catch-all only) does not route ratings here.
    let to = |vh: &envoy_api::pb::envoy::config::route::v3::VirtualHost| match &vh.routes[0].action
    {
        Some(Action::Route(a)) => match &a.cluster_specifier {
            Some(ClusterSpecifier::Cluster(c)) => c.clone(),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    assert_eq!(
        to(&rc.virtual_hosts[0]),
        "outbound|9080||ratings.other.svc.cluster.local"
    );
    // Clusters cover every listener's services.
    for c in [
        "outbound|9080||reviews.shop.svc.cluster.local",
        "outbound|5432||ratings.other.svc.cluster.local",
        "outbound|5432||db.other.svc.cluster.local",
    ] {
        assert!(cfg.clusters.iter().any(|x| x.name == c), "{c}");
    }

    // Without capture, a listener with a port and no bind takes the loopback address (the
    // proxy's IP with meshd's metadata), and the catch-all adds nothing to the listener it
    // made.
    let none = |ip: &str, own_ip: bool| {
        let mut meta = json!({"NAMESPACE": "shop", "INTERCEPTION_MODE": "NONE"});
        if own_ip {
            meta["MESHD_OUTBOUND_BIND_INSTANCE_IP"] = json!("true");
        }
        let id = format!("sidecar~{ip}~p.shop~shop.svc.cluster.local");
        Proxy::from_node(&id, meta.as_object().unwrap()).unwrap()
    };
    let ctx = context(
        "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: default, namespace: shop}\nspec:\n  egress:\n  - {port: {number: 9080, protocol: HTTP}, hosts: [other/*]}\n  - {port: {number: 6000}, hosts: [other/ratings.other.svc.cluster.local]}\n  - {hosts: [./*]}\n",
    );
    let names = |proxy: &Proxy| -> Vec<String> {
        let cfg = proxy_config(&ctx, proxy);
        cfg.listeners.iter().map(|l| l.name.clone()).collect()
    };
    assert_eq!(
        names(&none("10.9.9.9", false)),
        ["127.0.0.1_6000", "127.0.0.1_9080"]
    );
    assert_eq!(names(&none("fd00::9", false)), ["::1_6000", "::1_9080"]);
    let cfg = proxy_config(&ctx, &none("10.9.9.9", true));
    let names: Vec<&str> = cfg.listeners.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["10.9.9.9_6000", "10.9.9.9_9080"]);
    // A port without a protocol sniffs: HTTP to route "6000", the rest to the service
    // (its port 6000 does not exist: istiod's choice for a service with several ports).
    let sniffed = cfg
        .listeners
        .iter()
        .find(|l| l.name == "10.9.9.9_6000")
        .unwrap();
    assert_eq!(
        chains_to_clusters(&envoy_api::pb::envoy::config::listener::v3::Listener {
            filter_chains: Vec::new(),
            ..sniffed.clone()
        }),
        [(
            vec![],
            "outbound|6000||ratings.other.svc.cluster.local".to_string()
        )]
    );
    assert_eq!(
        vhosts(&cfg),
        ["ratings.other.svc.cluster.local:9080", "allow_any"]
    );
}

#[test]
fn an_auto_passthrough_server_forwards_each_mtls_sni_to_its_sni_dnat_cluster() {
    let ctx = context(concat!(
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: cross-network, namespace: istio-system}\nspec:\n  selector: {istio: eastwestgateway}\n  servers:\n",
        "  - port: {number: 15443, name: tls, protocol: TLS}\n    hosts: ['*.shop.svc.cluster.local']\n    tls: {mode: AUTO_PASSTHROUGH}\n---\n",
        // v2 runs a sidecar (the injector's label); v1 does not.
        "apiVersion: v1\nkind: Pod\nmetadata: {name: reviews-v2, namespace: shop, labels: {app: reviews, version: v2, security.istio.io/tlsMode: istio}}\n",
    ));
    let meta = json!({"LABELS": {"istio": "eastwestgateway"}, "NAMESPACE": "istio-system"});
    let proxy = Proxy::from_node(
        "router~10.1.1.1~ew-1.istio-system~istio-system.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap();
    let cfg = proxy_config(&ctx, &proxy);
    let l = cfg
        .listeners
        .iter()
        .find(|l| l.name == "0.0.0.0_15443")
        .unwrap();
    assert!(has_tls_inspector(l));
    // reviews (in the server's hosts) and each subset of its rule; not ratings.
    let expected: Vec<(Vec<String>, String)> = ["", "v1", "v2"]
        .iter()
        .map(|subset| {
            let sni = format!("outbound_.9080_.{subset}_.reviews.shop.svc.cluster.local");
            (vec![sni.clone()], sni)
        })
        .collect();
    assert_eq!(chains_to_clusters(l), expected);
    let alpns = &l.filter_chains[0]
        .filter_chain_match
        .as_ref()
        .unwrap()
        .application_protocols;
    assert_eq!(
        alpns,
        &[
            "istio-peer-exchange",
            "istio",
            "istio-http/1.0",
            "istio-http/1.1",
            "istio-h2"
        ]
    );
    // The clusters: the gateway's own for every service, and the SNI-DNAT ones, over EDS
    // under their own names, without TLS.
    let dnat = cluster(&cfg, "outbound_.9080_.v2_.reviews.shop.svc.cluster.local");
    assert_eq!(
        dnat.eds_cluster_config.as_ref().unwrap().service_name,
        "outbound_.9080_.v2_.reviews.shop.svc.cluster.local"
    );
    assert!(dnat.transport_socket.is_none() && dnat.transport_socket_matches.is_empty());
    assert!(
        cfg.clusters
            .iter()
            .any(|c| c.name == "outbound|9080|v2|reviews.shop.svc.cluster.local")
    );
    let cla = (cfg.endpoints.iter())
        .find(|e| e.cluster_name == "outbound_.9080_.v2_.reviews.shop.svc.cluster.local")
        .unwrap();
    assert_eq!(
        cla.endpoints.len(),
        1,
        "v2's one ready endpoint, in its zone"
    );
    // Only endpoints that speak Istio mTLS: v1's plaintext workload is left out.
    let v1 = (cfg.endpoints.iter())
        .find(|e| e.cluster_name == "outbound_.9080_.v1_.reviews.shop.svc.cluster.local")
        .unwrap();
    assert!(v1.endpoints.is_empty(), "{v1:?}");
    let all = (cfg.endpoints.iter())
        .find(|e| e.cluster_name == "outbound|9080||reviews.shop.svc.cluster.local")
        .unwrap();
    assert_eq!(
        all.endpoints.len(),
        3,
        "the gateway's own cluster keeps them all"
    );
    // Without an AUTO_PASSTHROUGH server, no SNI-DNAT cluster.
    let plain = proxy_config(&context(""), &proxy);
    assert!(
        !plain
            .clusters
            .iter()
            .any(|c| c.name.starts_with("outbound_."))
    );
}

mod access_log;
mod addressless_sniffed;
mod destination_subnets;
mod endpoint_metadata;
mod external_name;
mod gateway_redirect;
mod gateway_topology;
mod inbound_route;
mod istio_proxy;
mod mesh_cluster_defaults;
mod outbound_listeners;
mod path_normalization;
mod protocol_detection;
mod proxy_headers;
mod retries;
mod route_headers;
mod security;
mod service_entry_addresses;
mod service_entry_workloads;
mod shared_hosts;
mod stat_names;
mod tls_params;
mod tracing;
mod unready_endpoints;
