//! One host declared by ServiceEntries of several namespaces: each proxy gets the one
//! istiod's SidecarScope picks for it, in its clusters, load assignments, routes and name
//! table.

use serde_json::json;

use super::{context, sidecar};
use crate::{ProxyConfig, proxy_config};
use model::PushContext;

const HOST: &str = "api.partner.example";

/// A public entry, the oldest; one private to team-a; one private to team-b on another
/// port; one private to team-c, whose Sidecar imports only `shared/*`; a public
/// VirtualService that routes the host without naming a port.
fn mesh() -> PushContext {
    let entry = |ns: &str, day: u32, export: &str, port: u32, ip: &str| {
        format!(
            "---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: partner, namespace: {ns}, creationTimestamp: '2024-01-{day:02}T00:00:00Z'}}\nspec:\n  hosts: [{HOST}]\n  exportTo: [{export}]\n  location: MESH_EXTERNAL\n  resolution: STATIC\n  ports: [{{number: {port}, name: http, protocol: HTTP}}]\n  endpoints: [{{address: {ip}}}]\n"
        )
    };
    let yaml = [
        entry("shared", 1, "'*'", 80, "10.0.0.1"),
        entry("team-a", 2, "'.'", 80, "10.1.0.1"),
        entry("team-b", 3, "'.'", 9090, "10.2.0.1"),
        entry("team-c", 4, "'.'", 80, "10.3.0.1"),
        "---\napiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: default, namespace: team-c}\nspec:\n  egress: [{hosts: ['shared/*']}]\n".into(),
        format!("---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: partner, namespace: routes}}\nspec:\n  hosts: [{HOST}]\n  http: [{{route: [{{destination: {{host: {HOST}}}}}], timeout: 3s}}]\n"),
    ];
    context(&yaml.concat())
}

fn config_of(ctx: &PushContext, ns: &str) -> ProxyConfig {
    proxy_config(ctx, &sidecar(ns, json!({"app": "client"})))
}

/// The host's clusters and the addresses of their load assignments.
fn partner_endpoints(cfg: &ProxyConfig) -> Vec<(String, Vec<String>)> {
    use envoy_api::pb::envoy::config::core::v3::address::Address;
    use envoy_api::pb::envoy::config::core::v3::socket_address::PortSpecifier;
    use envoy_api::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
    (cfg.endpoints.iter())
        .filter(|a| a.cluster_name.ends_with(HOST))
        .map(|a| {
            let ips = (a.endpoints.iter().flat_map(|l| &l.lb_endpoints))
                .filter_map(|e| match &e.host_identifier {
                    Some(HostIdentifier::Endpoint(e)) => e.address.clone(),
                    _ => None,
                })
                .filter_map(|a| match a.address {
                    Some(Address::SocketAddress(s)) => Some(match s.port_specifier {
                        Some(PortSpecifier::PortValue(p)) => format!("{}:{p}", s.address),
                        _ => s.address,
                    }),
                    _ => None,
                })
                .collect();
            (a.cluster_name.clone(), ips)
        })
        .collect()
}

/// Where the VirtualService sends the host's requests on the proxy's route `port`.
fn routed_cluster(cfg: &ProxyConfig, port: &str) -> String {
    use envoy_api::pb::envoy::config::route::v3::{route::Action, route_action::ClusterSpecifier};
    let route = cfg.routes.iter().find(|r| r.name == port).unwrap();
    let vh = (route.virtual_hosts.iter())
        .find(|v| v.domains.iter().any(|d| d == HOST))
        .unwrap();
    match &vh.routes[0].action {
        Some(Action::Route(a)) => match &a.cluster_specifier {
            Some(ClusterSpecifier::Cluster(c)) => c.clone(),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

#[test]
fn each_namespace_reaches_the_entry_exported_to_it_before_a_public_one() {
    let ctx = mesh();
    let cluster80 = format!("outbound|80||{HOST}");
    let cluster9090 = format!("outbound|9090||{HOST}");
    assert_eq!(
        partner_endpoints(&config_of(&ctx, "team-a")),
        [(cluster80.clone(), vec!["10.1.0.1:80".to_string()])]
    );
    // team-b's own entry has another port: its clusters, and its route, follow it.
    let b = config_of(&ctx, "team-b");
    assert_eq!(
        partner_endpoints(&b),
        [(cluster9090.clone(), vec!["10.2.0.1:9090".to_string()])]
    );
    assert_eq!(routed_cluster(&b, "9090"), cluster9090);
    let elsewhere = config_of(&ctx, "default");
    assert_eq!(
        partner_endpoints(&elsewhere),
        [(cluster80.clone(), vec!["10.0.0.1:80".to_string()])]
    );
    assert_eq!(routed_cluster(&elsewhere, "80"), cluster80);
    // team-c's Sidecar imports only `shared/*`: the public entry, not its own.
    assert_eq!(
        partner_endpoints(&config_of(&ctx, "team-c")),
        [(cluster80, vec!["10.0.0.1:80".to_string()])]
    );
    // Every entry is a service of the registry.
    assert_eq!(ctx.service_count(), ctx.services.len() + 3);
}

#[test]
fn a_gateway_gets_the_entry_its_namespace_would() {
    let ctx = mesh();
    let meta = json!({"NAMESPACE": "team-b", "LABELS": {"istio": "ingressgateway"}});
    let id = "router~10.9.9.8~gw.team-b~team-b.svc.cluster.local";
    let gateway = model::Proxy::from_node(id, meta.as_object().unwrap()).unwrap();
    let cfg = proxy_config(&ctx, &gateway);
    assert_eq!(
        partner_endpoints(&cfg),
        [(
            format!("outbound|9090||{HOST}"),
            vec!["10.2.0.1:9090".to_string()]
        )]
    );
}

#[test]
fn a_dns_proxy_answers_with_the_entry_its_namespace_gets() {
    let mut yaml = String::new();
    for (ns, export, ip) in [
        ("shared", "'*'", "240.1.0.1"),
        ("team-a", "'.'", "240.1.0.2"),
    ] {
        yaml.push_str(&format!(
            "---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: partner, namespace: {ns}}}\nspec:\n  hosts: [{HOST}]\n  exportTo: [{export}]\n  addresses: [{ip}]\n  resolution: DNS\n  ports: [{{number: 443, name: tls, protocol: TLS}}]\n"
        ));
    }
    let ctx = context(&yaml);
    let ips = |ns: &str| {
        let meta = json!({"NAMESPACE": ns, "DNS_CAPTURE": "true"});
        let id = format!("sidecar~10.9.9.9~p.{ns}~{ns}.svc.cluster.local");
        let p = model::Proxy::from_node(&id, meta.as_object().unwrap()).unwrap();
        let table = proxy_config(&ctx, &p).name_table.unwrap().table;
        table[HOST].ips.clone()
    };
    assert_eq!(ips("team-a"), ["240.1.0.2"]);
    assert_eq!(ips("default"), ["240.1.0.1"]);
}
