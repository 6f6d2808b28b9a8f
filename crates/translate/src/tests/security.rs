//! Table tests of the security translation: auto mTLS on clusters and endpoints, inbound
//! chains per PeerAuthentication mode, and AuthorizationPolicy as RBAC.

use envoy_api::pb::envoy::config::listener::v3::filter::ConfigType;
use envoy_api::pb::envoy::config::rbac::v3::rbac::Action;
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_filter,
};
use envoy_api::pb::envoy::extensions::transport_sockets::tls::v3::{
    UpstreamTlsContext, common_tls_context::ValidationContextType,
};
use prost::Message;
use serde_json::json;

use crate::*;
use envoy_api::pb::envoy::config::core::v3::transport_socket;
use model::{Proxy, PushContext};

const MESH: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: shop}
spec: {clusterIP: 10.96.1.2, ports: [{name: http, port: 9080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: reviews-a, namespace: shop, labels: {kubernetes.io/service-name: reviews}}
addressType: IPv4
ports: [{name: http, port: 9080}]
endpoints:
- {addresses: [10.0.0.1], targetRef: {kind: Pod, name: reviews-mesh}}
- {addresses: [10.0.0.2], targetRef: {kind: Pod, name: reviews-legacy}}
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-mesh, namespace: shop, labels: {app: reviews, security.istio.io/tlsMode: istio}}
spec: {serviceAccountName: reviews, containers: []}
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-legacy, namespace: shop, labels: {app: reviews}}
spec: {serviceAccountName: legacy, containers: []}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: reviews, namespace: shop}
spec:
  workloadSelector: {labels: {app: reviews}}
  ingress:
  - {port: {number: 9080, protocol: HTTP, name: http}, defaultEndpoint: "127.0.0.1:8080"}
  - {port: {number: 5432, protocol: TCP, name: tcp}, defaultEndpoint: "127.0.0.1:5433"}
"#;

fn context(extra: &str) -> PushContext {
    PushContext::from_yaml(&format!("{MESH}\n---\n{extra}"))
}

fn reviews_proxy() -> Proxy {
    let meta =
        json!({"NAMESPACE": "shop", "LABELS": {"app": "reviews"}, "INTERCEPTION_MODE": "NONE"});
    let mut proxy = Proxy::from_node(
        "sidecar~127.0.0.9~reviews-mesh.shop~shop.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap();
    proxy.identity = Some("spiffe://cluster.local/ns/shop/sa/reviews".into());
    proxy
}

#[test]
fn proxy_protocol_wraps_each_auto_mtls_match_and_keeps_what_it_wraps() {
    use envoy_api::pb::envoy::extensions::transport_sockets::proxy_protocol::v3::ProxyProtocolUpstreamTransport;
    let rule = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews, namespace: shop}\nspec:\n  host: reviews\n  trafficPolicy: {proxyProtocol: {version: V2}}\n";
    let cluster = |extra: &str| {
        let cfg = proxy_config(&context(extra), &reviews_proxy());
        (cfg.clusters.into_iter())
            .find(|c| c.name == "outbound|9080||reviews.shop.svc.cluster.local")
            .unwrap()
    };
    let (plain, wrapped) = (cluster(""), cluster(rule));
    assert_eq!(plain.transport_socket_matches.len(), 2);
    for (before, after) in plain
        .transport_socket_matches
        .iter()
        .zip(&wrapped.transport_socket_matches)
    {
        let socket = after.transport_socket.as_ref().unwrap();
        assert_eq!(
            socket.name,
            "envoy.transport_sockets.upstream_proxy_protocol"
        );
        let Some(transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type else {
            panic!()
        };
        let pp = ProxyProtocolUpstreamTransport::decode(any.value.as_slice()).unwrap();
        assert_eq!(pp.config.unwrap().version, 1, "V2");
        // The mTLS (or plaintext) socket of the match, unchanged, inside.
        assert_eq!(
            pp.transport_socket.as_ref(),
            before.transport_socket.as_ref()
        );
    }
    assert!(wrapped.transport_socket.is_none());
}

#[test]
fn mesh_endpoints_get_istio_mutual_with_the_services_identities_and_others_plaintext() {
    let cfg = proxy_config(&context(""), &reviews_proxy());
    let c = cfg
        .clusters
        .iter()
        .find(|c| c.name == "outbound|9080||reviews.shop.svc.cluster.local")
        .unwrap();
    let names: Vec<&str> = c
        .transport_socket_matches
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(names, ["tlsMode-istio", "tlsMode-disabled"]);
    let tls = c.transport_socket_matches[0]
        .transport_socket
        .as_ref()
        .unwrap();
    let Some(transport_socket::ConfigType::TypedConfig(any)) = &tls.config_type else {
        panic!()
    };
    let ctx = UpstreamTlsContext::decode(any.value.as_slice()).unwrap();
    assert_eq!(ctx.sni, "outbound_.9080_._.reviews.shop.svc.cluster.local");
    let common = ctx.common_tls_context.unwrap();
    assert_eq!(common.alpn_protocols, ["istio-peer-exchange", "istio"]);
    assert_eq!(common.tls_certificate_sds_secret_configs[0].name, "default");
    let Some(ValidationContextType::CombinedValidationContext(v)) = common.validation_context_type
    else {
        panic!()
    };
    assert_eq!(
        v.validation_context_sds_secret_config.unwrap().name,
        "ROOTCA"
    );
    let sans: Vec<String> = v
        .default_validation_context
        .unwrap()
        .match_typed_subject_alt_names
        .iter()
        .map(|m| format!("{:?}", m.matcher.as_ref().unwrap().match_pattern))
        .collect();
    assert_eq!(sans.len(), 2, "{sans:?}");
    assert!(sans[0].contains("spiffe://cluster.local/ns/shop/sa/legacy"));
    assert!(sans[1].contains("spiffe://cluster.local/ns/shop/sa/reviews"));

    let cla = cfg
        .endpoints
        .iter()
        .find(|e| e.cluster_name == "outbound|9080||reviews.shop.svc.cluster.local")
        .unwrap();
    let marked: Vec<bool> = cla.endpoints[0]
        .lb_endpoints
        .iter()
        .map(crate::endpoint::is_mtls)
        .collect();
    assert_eq!(marked, [true, false], "only the injected pod opts in");

    // A DestinationRule can force it, or turn it off.
    let dr = |mode: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: r, namespace: shop}}\nspec: {{host: reviews, trafficPolicy: {{tls: {{mode: {mode}}}}}}}\n"
        )
    };
    let find = |cfg: &ProxyConfig| {
        cfg.clusters
            .iter()
            .find(|c| c.name == "outbound|9080||reviews.shop.svc.cluster.local")
            .cloned()
            .unwrap()
    };
    let forced = find(&proxy_config(
        &context(&dr("ISTIO_MUTUAL")),
        &reviews_proxy(),
    ));
    assert!(forced.transport_socket.is_some() && forced.transport_socket_matches.is_empty());
    // With its own SNI and identities, the rule's replace the automatic ones.
    let named = find(&proxy_config(
        &context(&dr(
            "ISTIO_MUTUAL, sni: reviews.gateway.example, subjectAltNames: [spiffe://other.org/ns/shop/sa/reviews]",
        )),
        &reviews_proxy(),
    ));
    let Some(transport_socket::ConfigType::TypedConfig(any)) =
        &named.transport_socket.as_ref().unwrap().config_type
    else {
        panic!()
    };
    let ctx = UpstreamTlsContext::decode(any.value.as_slice()).unwrap();
    assert_eq!(ctx.sni, "reviews.gateway.example");
    let Some(ValidationContextType::CombinedValidationContext(v)) =
        ctx.common_tls_context.unwrap().validation_context_type
    else {
        panic!()
    };
    let sans = v
        .default_validation_context
        .unwrap()
        .match_typed_subject_alt_names;
    assert_eq!(sans.len(), 1);
    assert!(format!("{:?}", sans[0].matcher).contains("spiffe://other.org/ns/shop/sa/reviews"));
    let off = find(&proxy_config(&context(&dr("DISABLE")), &reviews_proxy()));
    assert!(off.transport_socket.is_none() && off.transport_socket_matches.is_empty());
}

fn pa(mode: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {{name: default, namespace: shop}}\nspec: {{mtls: {{mode: {mode}}}}}\n"
    )
}

fn chains(ctx: &PushContext, listener: &str) -> Vec<String> {
    let cfg = proxy_config(ctx, &reviews_proxy());
    let l = cfg
        .listeners
        .iter()
        .find(|l| l.name == listener)
        .unwrap_or_else(|| panic!("no {listener}"));
    l.filter_chains
        .iter()
        .map(|c| {
            let m = c.filter_chain_match.as_ref().unwrap();
            format!("{}:{}", m.transport_protocol, c.transport_socket.is_some())
        })
        .collect()
}

#[test]
fn inbound_chains_follow_the_peer_authentication_mode() {
    assert_eq!(
        chains(&context(""), "127.0.0.9_9080"),
        ["tls:true", "raw_buffer:false"],
        "PERMISSIVE by default"
    );
    assert_eq!(
        chains(&context(&pa("STRICT")), "127.0.0.9_9080"),
        ["tls:true"]
    );
    assert_eq!(
        chains(&context(&pa("DISABLE")), "127.0.0.9_5432"),
        ["raw_buffer:false"]
    );
    let cfg = proxy_config(&context(""), &reviews_proxy());
    let inbound = cfg
        .clusters
        .iter()
        .find(|c| c.name == "inbound|9080||")
        .unwrap();
    let ep = format!("{:?}", inbound.load_assignment);
    assert!(ep.contains("127.0.0.1") && ep.contains("8080"), "{ep}");
}

/// The reviews proxy's inbound HTTP connection manager on 9080.
fn inbound_hcm(ctx: &PushContext) -> HttpConnectionManager {
    let cfg = proxy_config(ctx, &reviews_proxy());
    let l = (cfg.listeners.iter())
        .find(|l| l.name == "127.0.0.9_9080")
        .unwrap();
    let Some(ConfigType::TypedConfig(any)) = &l.filter_chains[0].filters[0].config_type else {
        panic!()
    };
    HttpConnectionManager::decode(any.value.as_slice()).unwrap()
}

fn rbac_of_http(ctx: &PushContext) -> Vec<(i32, Vec<String>)> {
    inbound_hcm(ctx)
        .http_filters
        .iter()
        .filter(|f| f.name == "envoy.filters.http.rbac")
        .map(|f| {
            let Some(http_filter::ConfigType::TypedConfig(any)) = &f.config_type else {
                panic!()
            };
            let rbac = envoy_api::pb::envoy::extensions::filters::http::rbac::v3::Rbac::decode(
                any.value.as_slice(),
            )
            .unwrap()
            .rules
            .unwrap();
            let mut names: Vec<String> = rbac.policies.keys().cloned().collect();
            names.sort();
            (rbac.action, names)
        })
        .collect()
}

fn ap(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: {name}, namespace: shop}}\nspec: {spec}\n"
    )
}

#[test]
fn authorization_policies_become_deny_then_allow_rbac_filters() {
    assert!(
        rbac_of_http(&context("")).is_empty(),
        "no policy, no filter"
    );
    let allow = ap(
        "allow-web",
        "{selector: {matchLabels: {app: reviews}}, rules: [{from: [{source: {principals: [cluster.local/ns/web/sa/web]}}], to: [{operation: {methods: [GET], paths: [/api/*]}}]}]}",
    );
    let deny = ap(
        "deny-admin",
        "{action: DENY, rules: [{to: [{operation: {paths: [/admin*]}}]}]}",
    );
    let got = rbac_of_http(&context(&format!("{allow}---\n{deny}")));
    assert_eq!(
        got,
        [
            (
                Action::Deny as i32,
                vec!["ns[shop]-policy[deny-admin]-rule[0]".to_string()]
            ),
            (
                Action::Allow as i32,
                vec!["ns[shop]-policy[allow-web]-rule[0]".to_string()]
            ),
        ]
    );
    // Allow-nothing: an ALLOW policy without rules still installs a (matchless) ALLOW.
    let nothing = rbac_of_http(&context(&ap("nothing", "{}")));
    assert_eq!(nothing, [(Action::Allow as i32, Vec::<String>::new())]);
}

#[test]
fn rbac_encoding_is_deterministic_across_many_policies() {
    let many: Vec<String> = (0..12)
        .map(|i| {
            ap(
                &format!("p{i}"),
                "{rules: [{from: [{source: {namespaces: [web]}}]}]}",
            )
        })
        .collect();
    let ctx = context(&many.join("---\n"));
    let encode = || {
        let cfg = proxy_config(&ctx, &reviews_proxy());
        let l = cfg
            .listeners
            .iter()
            .find(|l| l.name == "127.0.0.9_9080")
            .unwrap()
            .clone();
        l.encode_to_vec()
    };
    let first = encode();
    for _ in 0..5 {
        assert_eq!(encode(), first);
    }
}

#[test]
fn a_proxy_without_a_proven_identity_gets_no_identity_bound_config() {
    let mut plain = reviews_proxy();
    plain.identity = None;
    let cfg = proxy_config(&context(""), &plain);
    assert!(
        cfg.clusters
            .iter()
            .all(|c| c.transport_socket.is_none() && c.transport_socket_matches.is_empty()),
        "no SDS-backed transport sockets on the plaintext port"
    );
    let l = cfg
        .listeners
        .iter()
        .find(|l| l.name == "127.0.0.9_9080")
        .unwrap();
    assert!(l.filter_chains.iter().all(|c| c.transport_socket.is_none()));
    let strict = proxy_config(&context(&pa("STRICT")), &plain);
    let l = strict
        .listeners
        .iter()
        .find(|l| l.name == "127.0.0.9_9080")
        .unwrap();
    assert_eq!(l.filter_chains.len(), 1);
    let names: Vec<&str> = l.filter_chains[0]
        .filters
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "envoy.filters.network.rbac",
            "envoy.filters.network.tcp_proxy"
        ],
        "STRICT without a certificate: refused, never plaintext"
    );
}

const GATEWAY: &str = r#"
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: web, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8443, name: https, protocol: HTTPS}
    hosts: ["shop/shop.example.com"]
    tls: {mode: SIMPLE, credentialName: shop-cert}
---
apiVersion: v1
kind: Secret
metadata: {name: shop-cert, namespace: istio-system}
type: kubernetes.io/tls
stringData: {tls.crt: CERT, tls.key: KEY}
---
apiVersion: v1
kind: Secret
metadata: {name: shop-cert, namespace: elsewhere}
stringData: {tls.crt: OTHER, tls.key: OTHERKEY}
"#;

fn gateway_proxy(identity: bool) -> Proxy {
    let meta = json!({"NAMESPACE": "istio-system", "LABELS": {"istio": "ingressgateway"}});
    let mut p = Proxy::from_node(
        "router~10.1.1.1~gw-0.istio-system~istio-system.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap();
    if identity {
        p.identity = Some("spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway".into());
    }
    p
}

#[test]
fn an_https_server_gets_its_credential_over_sds_only_with_a_proven_identity() {
    let ctx = context(GATEWAY);
    let cfg = proxy_config(&ctx, &gateway_proxy(true));
    let l = cfg
        .listeners
        .iter()
        .find(|l| l.name == "0.0.0.0_8443")
        .unwrap();
    let chain = &l.filter_chains[0];
    assert_eq!(
        chain.filter_chain_match.as_ref().unwrap().server_names,
        ["shop.example.com"]
    );
    assert!(
        cfg.routes
            .iter()
            .any(|r| r.name == "https.8443.https.web.istio-system")
    );
    let names: Vec<&str> = cfg.secrets.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["kubernetes://shop-cert"]);
    let body = format!("{:?}", cfg.secrets[0]);
    assert!(
        body.contains(&format!("{:?}", b"CERT".to_vec())),
        "the gateway namespace's Secret, not another namespace's"
    );

    // On the plaintext port: neither the HTTPS listener nor any secret.
    let plain = proxy_config(&ctx, &gateway_proxy(false));
    assert!(plain.secrets.is_empty());
    assert!(!plain.listeners.iter().any(|l| l.name == "0.0.0.0_8443"));
}

#[test]
fn an_istio_mutual_server_serves_the_gateways_workload_certificate_to_mesh_clients() {
    use envoy_api::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
    let ctx = context(concat!(
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: east-west, namespace: istio-system}\nspec:\n  selector: {istio: ingressgateway}\n  servers:\n",
        "  - port: {number: 15443, name: https, protocol: HTTPS}\n    hosts: ['*']\n    tls: {mode: ISTIO_MUTUAL, subjectAltNames: ['spiffe://cluster.local/ns/shop/sa/productpage']}\n---\n",
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: in, namespace: istio-system}\nspec:\n  hosts: ['*']\n  gateways: [east-west]\n  http: [{route: [{destination: {host: reviews.shop.svc.cluster.local}}]}]\n",
    ));
    let cfg = proxy_config(&ctx, &gateway_proxy(true));
    let l = (cfg.listeners.iter())
        .find(|l| l.name == "0.0.0.0_15443")
        .expect("the ISTIO_MUTUAL server's listener");
    let chain = &l.filter_chains[0];
    // A server for every host takes every connection: its chain has no match, as
    // istiod's has none (an empty one would read the same to Envoy).
    assert_eq!(chain.filter_chain_match, None);
    use envoy_api::pb::envoy::config::core::v3::transport_socket::ConfigType as SocketType;
    let Some(SocketType::TypedConfig(any)) = &chain.transport_socket.as_ref().unwrap().config_type
    else {
        panic!()
    };
    let tls = DownstreamTlsContext::decode(any.value.as_slice()).unwrap();
    assert!(tls.require_client_certificate.unwrap().value);
    let common = tls.common_tls_context.unwrap();
    assert_eq!(common.tls_certificate_sds_secret_configs[0].name, "default");
    let Some(ValidationContextType::CombinedValidationContext(v)) = &common.validation_context_type
    else {
        panic!("{:?}", common.validation_context_type)
    };
    assert_eq!(
        v.validation_context_sds_secret_config
            .as_ref()
            .unwrap()
            .name,
        "ROOTCA"
    );
    let sans = &v
        .default_validation_context
        .as_ref()
        .unwrap()
        .match_typed_subject_alt_names;
    assert_eq!(sans.len(), 1);
    assert!(format!("{:?}", sans[0]).contains("spiffe://cluster.local/ns/shop/sa/productpage"));
    // The mesh's certificates come from the gateway's agent, not over ADS.
    assert!(cfg.secrets.is_empty());
    assert!(
        cfg.routes
            .iter()
            .any(|r| r.name == "https.15443.https.east-west.istio-system")
    );
    // A gateway without a proven identity has no agent certificate to serve.
    let plain = proxy_config(&ctx, &gateway_proxy(false));
    assert!(!plain.listeners.iter().any(|l| l.name == "0.0.0.0_15443"));
}

#[test]
fn a_tls_server_terminates_with_its_credential_then_forwards_by_its_tcp_route() {
    let ctx = context(&format!(
        "{GATEWAY}---\n{}",
        concat!(
            "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: db-gw, namespace: istio-system}\nspec:\n  selector: {istio: ingressgateway}\n  servers:\n",
            "  - port: {number: 9000, name: tls, protocol: TLS}\n    hosts: [\"shop/db.example.com\"]\n    tls: {mode: SIMPLE, credentialName: shop-cert}\n",
            "  - port: {number: 9001, name: tls-2, protocol: TLS}\n    hosts: [\"shop/none.example.com\"]\n    tls: {mode: SIMPLE, credentialName: shop-cert}\n---\n",
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: db, namespace: shop}\nspec:\n  hosts: [db.example.com]\n  gateways: [istio-system/db-gw]\n  tcp: [{route: [{destination: {host: reviews, port: {number: 9080}}}]}]\n",
        )
    ));
    let cfg = proxy_config(&ctx, &gateway_proxy(true));
    let names: Vec<&str> = cfg.listeners.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        ["0.0.0.0_8443", "0.0.0.0_9000"],
        "no route, no listener"
    );
    let l = &cfg.listeners[1];
    let chain = &l.filter_chains[0];
    assert_eq!(
        chain.filter_chain_match.as_ref().unwrap().server_names,
        ["db.example.com"]
    );
    assert!(chain.transport_socket.is_some(), "TLS terminated here");
    assert_eq!(chain.filters[0].name, "envoy.filters.network.tcp_proxy");
    let Some(ConfigType::TypedConfig(any)) = &chain.filters[0].config_type else {
        panic!()
    };
    let tp = envoy_api::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy::decode(
        any.value.as_slice(),
    )
    .unwrap();
    assert_eq!(
        tp.stat_prefix,
        "outbound|9080||reviews.shop.svc.cluster.local"
    );
    let secrets: Vec<&str> = cfg.secrets.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(secrets, ["kubernetes://shop-cert"]);
    // Without a proven identity, neither the server nor its credential.
    let plain = proxy_config(&ctx, &gateway_proxy(false));
    assert!(plain.listeners.is_empty() && plain.secrets.is_empty());
}

#[test]
fn a_destination_rule_credential_originates_tls_at_an_identified_gateway_only() {
    use envoy_api::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
    use prost::Message;
    let ctx = context(concat!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: api, namespace: istio-system}\nspec:\n  hosts: [api.example.com]\n  resolution: DNS\n  ports: [{number: 443, name: https, protocol: HTTPS}, {number: 8443, name: https-2, protocol: HTTPS}]\n---\n",
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: api, namespace: istio-system}\nspec:\n  host: api.example.com\n  trafficPolicy:\n    tls: {mode: MUTUAL, credentialName: api-client, sni: api.example.com}\n",
        "    portLevelSettings:\n    - port: {number: 8443}\n      tls: {mode: SIMPLE, credentialName: 'kubernetes://api-ca-only'}\n---\n",
        "apiVersion: v1\nkind: Secret\nmetadata: {name: api-client, namespace: istio-system}\nstringData: {tls.crt: CERT, tls.key: KEY, ca.crt: CA}\n---\n",
        "apiVersion: v1\nkind: Secret\nmetadata: {name: api-ca-only, namespace: istio-system}\nstringData: {ca.crt: CA2}\n",
    ));
    let context_of = |cfg: &ProxyConfig, name: &str| {
        let c = cfg.clusters.iter().find(|c| c.name == name).unwrap();
        let socket = c.transport_socket.as_ref()?;
        let Some(
            envoy_api::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(any),
        ) = &socket.config_type
        else {
            panic!("{socket:?}")
        };
        Some(UpstreamTlsContext::decode(any.value.as_slice()).unwrap())
    };
    let sds_names = |t: &UpstreamTlsContext| {
        let common = t.common_tls_context.as_ref().unwrap();
        let mut names: Vec<String> = (common.tls_certificate_sds_secret_configs.iter())
            .map(|s| s.name.clone())
            .collect();
        if let Some(ValidationContextType::CombinedValidationContext(v)) =
            &common.validation_context_type
        {
            names.extend(
                v.validation_context_sds_secret_config
                    .as_ref()
                    .map(|s| s.name.clone()),
            );
        }
        names
    };
    let gw = proxy_config(&ctx, &gateway_proxy(true));
    let mutual = context_of(&gw, "outbound|443||api.example.com").expect("TLS at the gateway");
    assert_eq!(mutual.sni, "api.example.com");
    assert_eq!(
        sds_names(&mutual),
        ["kubernetes://api-client", "kubernetes://api-client-cacert"]
    );
    let simple = context_of(&gw, "outbound|8443||api.example.com").unwrap();
    assert_eq!(sds_names(&simple), ["kubernetes://api-ca-only-cacert"]);
    // Exactly what the clusters name is served, from the gateway namespace's Secrets.
    let names: Vec<&str> = gw.secrets.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "kubernetes://api-ca-only-cacert",
            "kubernetes://api-client",
            "kubernetes://api-client-cacert"
        ]
    );
    // Neither a gateway without a proven identity nor a sidecar gets the credential.
    let plain = proxy_config(&ctx, &gateway_proxy(false));
    assert!(context_of(&plain, "outbound|443||api.example.com").is_none());
    assert!(plain.secrets.is_empty());
    let mut sidecar = Proxy::from_node(
        "sidecar~10.0.0.7~app-0.istio-system~istio-system.svc.cluster.local",
        json!({"NAMESPACE": "istio-system"}).as_object().unwrap(),
    )
    .unwrap();
    sidecar.identity = Some("spiffe://cluster.local/ns/istio-system/sa/app".into());
    let sc = proxy_config(&ctx, &sidecar);
    assert!(context_of(&sc, "outbound|443||api.example.com").is_none());
    assert!(sc.secrets.is_empty());
}

#[test]
fn with_traffic_capture_virtual_inbound_serves_the_ports_of_the_services_selecting_the_proxy() {
    let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: ratings, namespace: shop}\nspec: {clusterIP: 10.96.1.9, selector: {app: ratings}, ports: [{name: http, port: 9080, targetPort: 8080}, {name: tcp-db, port: 5432}]}\n";
    let meta = json!({"NAMESPACE": "shop", "LABELS": {"app": "ratings"}});
    let mut proxy = Proxy::from_node(
        "sidecar~10.0.0.7~ratings-0.shop~shop.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap();
    proxy.identity = Some("spiffe://cluster.local/ns/shop/sa/ratings".into());
    let chains_of = |extra: &str| -> Vec<String> {
        let cfg = proxy_config(&context(&format!("{svc}---\n{extra}")), &proxy);
        let l = cfg
            .listeners
            .iter()
            .find(|l| l.name == "virtualInbound")
            .expect("virtualInbound");
        assert_eq!(
            cfg.clusters
                .iter()
                .filter(|c| c.name.starts_with("inbound|"))
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>(),
            ["inbound|5432||", "inbound|8080||"]
        );
        // istiod's default circuit breakers (no limits) on the inbound clusters and the
        // passthrough.
        for c in &cfg.clusters {
            let max = c.circuit_breakers.as_ref().map(|b| {
                let t = &b.thresholds[0];
                [&t.max_connections, &t.max_requests].map(|v| v.as_ref().unwrap().value)
            });
            if c.name.starts_with("inbound|") || c.name == "InboundPassthroughCluster" {
                assert_eq!(max, Some([u32::MAX; 2]), "{}", c.name);
            }
        }
        l.filter_chains
            .iter()
            .map(|c| {
                let m = c.filter_chain_match.clone().unwrap_or_default();
                let alpn = match m.application_protocols.as_slice() {
                    [] => String::new(),
                    [first, ..] => format!("+{first}"),
                };
                format!(
                    "{}:{}{alpn}",
                    m.destination_port.map_or(0, |p| p.value),
                    m.transport_protocol
                )
            })
            .collect()
    };
    assert_eq!(
        chains_of(""),
        [
            "15006:",
            // Mutual TLS by the mesh's ALPN; on the TCP port, other TLS passes through to
            // the workload; then plaintext.
            "5432:tls+istio",
            "5432:tls",
            "5432:raw_buffer",
            "8080:tls+istio",
            "8080:raw_buffer",
            // Any other port: HTTP over mTLS, TCP over mTLS, HTTP, TCP, and TLS the
            // workload terminates itself.
            "0:tls+istio-http/1.0",
            "0:tls+istio-peer-exchange",
            "0:raw_buffer+http/1.1",
            "0:raw_buffer",
            "0:tls"
        ]
    );
    assert_eq!(
        chains_of(&pa("STRICT")),
        [
            "15006:",
            "5432:tls",
            "8080:tls",
            "0:tls+istio-http/1.0",
            "0:tls"
        ]
    );
}

#[test]
fn a_custom_policy_asks_its_provider_only_about_what_its_rules_match() {
    use envoy_api::pb::envoy::extensions::filters::http::ext_authz::v3::{
        ExtAuthz, ext_authz::Services,
    };
    use envoy_api::pb::envoy::extensions::filters::network::ext_authz::v3::ExtAuthz as TcpExtAuthz;
    let authz = "apiVersion: v1\nkind: Service\nmetadata: {name: authz, namespace: shop}\nspec: {clusterIP: 10.96.7.7, ports: [{name: http, port: 8000}, {name: grpc, port: 9000}]}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |\n    extensionProviders:\n    - name: opa\n      envoyExtAuthzHttp: {service: shop/authz.shop.svc.cluster.local, port: 8000, pathPrefix: /check, includeRequestHeadersInCheck: [x-user]}\n    - name: grpc\n      envoyExtAuthzGrpc: {service: authz.shop.svc.cluster.local, port: 9000, timeout: 2s}\n---\n";
    let custom = |provider: &str| {
        ap(
            "ext",
            &format!(
                "{{action: CUSTOM, provider: {{name: {provider}}}, rules: [{{to: [{{operation: {{paths: ['/admin*']}}}}]}}]}}"
            ),
        )
    };
    let deny = ap(
        "no-debug",
        "{action: DENY, rules: [{to: [{operation: {paths: ['/debug']}}]}]}",
    );
    let hcm_filters = |extra: &str| -> Vec<(String, Vec<u8>)> {
        let cfg = proxy_config(&context(&format!("{authz}{extra}")), &reviews_proxy());
        let l = (cfg.listeners.iter())
            .find(|l| l.name == "127.0.0.9_9080")
            .unwrap();
        let Some(ConfigType::TypedConfig(any)) = &l.filter_chains[0].filters[0].config_type else {
            panic!()
        };
        let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
        (hcm.http_filters.into_iter())
            .map(|f| {
                let Some(http_filter::ConfigType::TypedConfig(any)) = f.config_type else {
                    panic!()
                };
                (f.name, any.value)
            })
            .collect()
    };
    // CUSTOM first: its rules in shadow mode, then ext_authz; then DENY; then gRPC
    // statistics and the router.
    let filters = hcm_filters(&format!("{}---\n{deny}", custom("opa")));
    let names: Vec<&str> = filters.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "envoy.filters.http.rbac",
            "envoy.filters.http.ext_authz",
            "envoy.filters.http.rbac",
            "envoy.filters.http.grpc_stats",
            "envoy.filters.http.router"
        ]
    );
    use envoy_api::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
    let shadow = HttpRbac::decode(filters[0].1.as_slice()).unwrap();
    assert!(shadow.rules.is_none());
    assert_eq!(shadow.shadow_rules_stat_prefix, "istio_ext_authz_");
    let rules = shadow.shadow_rules.unwrap();
    assert_eq!(
        rules.policies.keys().collect::<Vec<_>>(),
        ["istio-ext-authz-opa-ns[shop]-policy[ext]-rule[0]"]
    );
    let ext = ExtAuthz::decode(filters[1].1.as_slice()).unwrap();
    let Some(Services::HttpService(service)) = &ext.services else {
        panic!("{ext:?}")
    };
    assert_eq!(service.path_prefix, "/check");
    let uri = service.server_uri.as_ref().unwrap();
    assert_eq!(uri.uri, "http://authz.shop.svc.cluster.local");
    assert!(
        format!("{:?}", uri.http_upstream_type)
            .contains("outbound|8000||authz.shop.svc.cluster.local")
    );
    assert_eq!(uri.timeout.unwrap().seconds, 600);
    assert_eq!(ext.allowed_headers.unwrap().patterns.len(), 1);
    let enabled = format!("{:?}", ext.filter_enabled_metadata.unwrap());
    assert!(
        enabled.contains("istio_ext_authz_shadow_effective_policy_id"),
        "{enabled}"
    );
    assert!(enabled.contains("istio-ext-authz-opa"), "{enabled}");

    // An undefined provider: the rules deny, enforced.
    let filters = hcm_filters(&custom("missing"));
    assert_eq!(
        filters.len(),
        3,
        "one RBAC filter, gRPC statistics and the router"
    );
    let bad = HttpRbac::decode(filters[0].1.as_slice())
        .unwrap()
        .rules
        .unwrap();
    assert_eq!(bad.action, Action::Deny as i32);
    assert_eq!(
        bad.policies.keys().collect::<Vec<_>>(),
        ["istio-ext-authz-missing-ns[shop]-policy[ext]-rule[0]-deny-due-to-bad-CUSTOM-action"]
    );

    // TCP: a gRPC provider guards the port, an HTTP one is skipped there.
    let tcp_filters = |extra: &str| -> Vec<(String, Vec<u8>)> {
        let cfg = proxy_config(&context(&format!("{authz}{extra}")), &reviews_proxy());
        let l = (cfg.listeners.iter())
            .find(|l| l.name == "127.0.0.9_5432")
            .unwrap();
        (l.filter_chains[0].filters.iter())
            .map(|f| {
                let Some(ConfigType::TypedConfig(any)) = &f.config_type else {
                    panic!()
                };
                (f.name.clone(), any.value.clone())
            })
            .collect()
    };
    let names = |f: &[(String, Vec<u8>)]| f.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&tcp_filters(&custom("opa"))),
        ["envoy.filters.network.tcp_proxy"]
    );
    let grpc = tcp_filters(&custom("grpc"));
    assert_eq!(
        names(&grpc),
        [
            "envoy.filters.network.rbac",
            "envoy.filters.network.ext_authz",
            "envoy.filters.network.tcp_proxy"
        ]
    );
    use envoy_api::pb::envoy::extensions::filters::network::rbac::v3::Rbac as TcpRbac;
    let shadow = TcpRbac::decode(grpc[0].1.as_slice()).unwrap();
    assert_eq!(
        (
            shadow.stat_prefix.as_str(),
            shadow.shadow_rules_stat_prefix.as_str()
        ),
        ("tcp.", "istio_ext_authz_")
    );
    assert!(shadow.rules.is_none() && shadow.shadow_rules.is_some());
    let tcp = TcpExtAuthz::decode(grpc[1].1.as_slice()).unwrap();
    assert_eq!(tcp.stat_prefix, "tcp.");
    let service = tcp.grpc_service.unwrap();
    assert_eq!(service.timeout.unwrap().seconds, 2);
    assert!(
        format!("{:?}", service.target_specifier)
            .contains("outbound|9000||authz.shop.svc.cluster.local")
    );
}

/// A RequestAuthentication; `JWKS` in `spec` stands for a valid key set.
fn ra(name: &str, namespace: &str, spec: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec: {}\n---\n",
        spec.replace("JWKS", model::jwks::fail_closed())
    )
}

/// The inbound HTTP connection manager's filters of the reviews proxy, by name, and its
/// JWT filter decoded (if any).
fn inbound_http_filters(
    ctx: &PushContext,
) -> (
    Vec<String>,
    Option<envoy_api::pb::envoy::extensions::filters::http::jwt_authn::v3::JwtAuthentication>,
) {
    use envoy_api::pb::envoy::extensions::filters::http::jwt_authn::v3::JwtAuthentication;
    let hcm = inbound_hcm(ctx);
    let names = hcm.http_filters.iter().map(|f| f.name.clone()).collect();
    let jwt = (hcm.http_filters.iter())
        .find(|f| f.name == "envoy.filters.http.jwt_authn")
        .map(|f| {
            let Some(http_filter::ConfigType::TypedConfig(any)) = &f.config_type else {
                panic!()
            };
            JwtAuthentication::decode(any.value.as_slice()).unwrap()
        });
    (names, jwt)
}

#[test]
fn request_authentications_that_apply_become_one_jwt_filter_before_authorization() {
    use envoy_api::pb::envoy::extensions::filters::http::jwt_authn::v3::{
        jwt_provider::JwksSourceSpecifier, jwt_requirement::RequiresType,
        requirement_rule::RequirementType,
    };
    let (names, jwt) = inbound_http_filters(&context(""));
    assert!(
        jwt.is_none(),
        "no RequestAuthentication, no JWT filter: {names:?}"
    );
    let policies = [
        ra("mesh", "istio-system", "{jwtRules: [{issuer: z.example, jwks: 'JWKS'}]}"),
        ra(
            "reviews",
            "shop",
            "{selector: {matchLabels: {app: reviews}}, jwtRules: [{issuer: a.example, jwks: 'JWKS', audiences: [api], fromHeaders: [{name: x-token, prefix: 'Token '}], outputClaimToHeaders: [{header: x-sub, claim: sub}], forwardOriginalToken: true, spaceDelimitedClaims: [roles]}]}",
        ),
        ra("other", "shop", "{selector: {matchLabels: {app: ratings}}, jwtRules: [{issuer: b.example, jwks: 'JWKS'}]}"),
        ra("elsewhere", "web", "{jwtRules: [{issuer: c.example, jwks: 'JWKS'}]}"),
        ap("allow", "{rules: [{from: [{source: {requestPrincipals: ['*']}}]}]}"),
    ]
    .concat();
    let (names, jwt) = inbound_http_filters(&context(&policies));
    let jwt_at = names
        .iter()
        .position(|n| n == "envoy.filters.http.jwt_authn");
    let rbac_at = names.iter().position(|n| n == "envoy.filters.http.rbac");
    assert!(jwt_at.unwrap() < rbac_at.unwrap(), "{names:?}");
    let jwt = jwt.unwrap();
    // The root namespace's and the selecting one, sorted by issuer; not another
    // workload's or another namespace's.
    let mut issuers: Vec<(String, String)> = (jwt.providers.iter())
        .map(|(n, p)| (n.clone(), p.issuer.clone()))
        .collect();
    issuers.sort();
    assert_eq!(
        issuers,
        [
            ("origins-0".to_string(), "a.example".to_string()),
            ("origins-1".to_string(), "z.example".to_string())
        ]
    );
    let a = &jwt.providers["origins-0"];
    assert_eq!(a.audiences, ["api"]);
    assert_eq!(
        (
            a.from_headers[0].name.as_str(),
            a.from_headers[0].value_prefix.as_str()
        ),
        ("x-token", "Token ")
    );
    assert_eq!(a.claim_to_headers[0].header_name, "x-sub");
    assert!(a.forward);
    assert_eq!(a.payload_in_metadata, "payload");
    assert_eq!(
        a.normalize_payload_in_metadata
            .as_ref()
            .unwrap()
            .space_delimited_claims,
        ["permission", "roles", "scope"]
    );
    assert!(
        !a.clear_route_cache,
        "a sidecar's inbound routes need no second look"
    );
    assert!(matches!(
        &a.jwks_source_specifier,
        Some(JwksSourceSpecifier::LocalJwks(_))
    ));
    // Two providers: one verifies, or each is absent or valid (istiod's requirement).
    let Some(RequirementType::Requires(r)) = &jwt.rules[0].requirement_type else {
        panic!()
    };
    let Some(RequiresType::RequiresAny(any)) = &r.requires_type else {
        panic!("{r:?}")
    };
    assert_eq!(any.requirements.len(), 3);
    assert!(matches!(
        &any.requirements[2].requires_type,
        Some(RequiresType::RequiresAll(all)) if all.requirements.len() == 2
    ));
    assert!(jwt.bypass_cors_preflight);
}

#[test]
fn a_rule_without_its_key_set_yet_fails_closed_and_a_fetched_one_is_used() {
    use envoy_api::pb::envoy::config::core::v3::data_source::Specifier;
    use envoy_api::pb::envoy::extensions::filters::http::jwt_authn::v3::jwt_provider::JwksSourceSpecifier;
    let yaml = ra(
        "reviews",
        "shop",
        "{jwtRules: [{issuer: a.example, jwksUri: 'https://a.example/keys'}]}",
    );
    let key_set = |ctx: &PushContext| -> String {
        let jwt = inbound_http_filters(ctx).1.unwrap();
        match &jwt.providers["origins-0"].jwks_source_specifier {
            Some(JwksSourceSpecifier::LocalJwks(d)) => match &d.specifier {
                Some(Specifier::InlineString(s)) => s.clone(),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    };
    let ctx = context(&yaml);
    assert_eq!(key_set(&ctx), model::jwks::fail_closed());
    let wanted = ctx.jwks_sources();
    let (source, (timeout, named_by)) = wanted.iter().next().unwrap();
    assert_eq!(source.uri, "https://a.example/keys");
    assert_eq!(*timeout, model::jwks::DEFAULT_TIMEOUT);
    assert_eq!(named_by.iter().next().unwrap().name, "reviews");
    // What meshd fetched, once in the store.
    let mut store = model::Store::default();
    for o in model::config::parse::parse_file("m.yaml", &format!("{MESH}\n---\n{yaml}")).objects {
        store.apply(o);
    }
    store.set_jwks(&source.key(), Some(r#"{"keys": [{"kty": "EC"}]}"#.into()));
    let fetched = PushContext::build(&store, "v1".into());
    assert_eq!(key_set(&fetched), r#"{"keys": [{"kty": "EC"}]}"#);
}

#[test]
fn request_principals_and_claims_are_read_from_the_jwt_payload() {
    use envoy_api::pb::envoy::config::rbac::v3::principal::Identifier;
    let policy = |spec: &str| context(&ap("p", spec));
    let rules = |ctx: &PushContext, http: bool| {
        let policies = ctx.authorization_policies_for(&reviews_proxy());
        authz::rbac_rules(&policies, http)
    };
    let ctx = policy(
        "{rules: [{from: [{source: {requestPrincipals: ['https://a.example/alice']}}], when: [{key: 'request.auth.claims[groups]', values: [admins]}]}]}",
    );
    let http = rules(&ctx, true);
    let p = &http[0].enforced.as_ref().unwrap().policies["ns[shop]-policy[p]-rule[0]"];
    let text = format!("{:?}", p.principals);
    for expected in [
        "\"payload\"",
        "\"iss\"",
        "\"https://a.example\"",
        "\"sub\"",
        "\"alice\"",
        "\"groups\"",
        "\"admins\"",
        "envoy.filters.http.jwt_authn",
    ] {
        assert!(text.contains(expected), "{expected}: {text}");
    }
    let Some(Identifier::AndIds(and)) = &p.principals[0].identifier else {
        panic!("{p:?}")
    };
    assert_eq!(and.ids.len(), 2, "the source and the condition");
    // On TCP an ALLOW rule needing a request principal matches nothing; a DENY rule is
    // applied without it.
    let tcp = rules(&ctx, false);
    assert!(tcp[0].enforced.as_ref().unwrap().policies.is_empty());
    let deny = policy(
        "{action: DENY, rules: [{from: [{source: {requestPrincipals: ['*'], namespaces: [web]}}]}]}",
    );
    let tcp = rules(&deny, false);
    let text = format!("{:?}", tcp[0].enforced.as_ref().unwrap().policies);
    assert!(text.contains("web") && !text.contains("payload"), "{text}");
}
