//! A VirtualService's `destinationSubnets` in a sidecar's TCP and TLS listeners, as
//! istiod's `buildSidecarOutboundTCPFilterChainOpts` and
//! `buildSidecarOutboundTLSFilterChainOpts` match on them.

use envoy_api::pb::envoy::config::listener::v3::{FilterChain, Listener};
use serde_json::json;

use super::{chains_to_clusters, context, sidecar};
use crate::proxy_config;

/// Each chain of `l` (the default last): its SNI names, its destination CIDRs
/// (`ADDRESS/LENGTH`) and the cluster its tcp_proxy forwards to.
fn chains(l: &Listener) -> Vec<(Vec<String>, Vec<String>, String)> {
    let one = |c: &FilterChain| {
        let m = c.filter_chain_match.clone().unwrap_or_default();
        let cidrs = (m.prefix_ranges.iter())
            .map(|r| format!("{}/{}", r.address_prefix, r.prefix_len.unwrap().value))
            .collect();
        let single = Listener {
            filter_chains: vec![c.clone()],
            ..Default::default()
        };
        (
            m.server_names,
            cidrs,
            chains_to_clusters(&single)[0].1.clone(),
        )
    };
    (l.filter_chains.iter().chain(&l.default_filter_chain))
        .map(one)
        .collect()
}

fn listener<'c>(cfg: &'c crate::ProxyConfig, name: &str) -> &'c Listener {
    (cfg.listeners.iter()).find(|l| l.name == name).unwrap()
}

const DB: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: shop}\nspec:\n  clusterIP: 10.96.0.50\n  ports: [{name: tcp, port: 5432}]\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: db, namespace: shop}\nspec:\n  host: db\n  subsets: [{name: v1, labels: {v: '1'}}, {name: v2, labels: {v: '2'}}, {name: v3, labels: {v: '3'}}]\n";

fn cluster(subset: &str) -> String {
    format!("outbound|5432|{subset}|db.shop.svc.cluster.local")
}

#[test]
fn tcp_routes_with_subnets_get_chains_matched_on_them_before_the_rest() {
    let ctx = context(&format!(
        "{DB}---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: db, namespace: shop}}\nspec:\n  hosts: [db]\n  tcp:\n  - match:\n    - {{destinationSubnets: [10.2.0.0/16], sourceLabels: {{app: batch}}}}\n    - {{destinationSubnets: [10.1.0.0/16, 10.2.0.0/16]}}\n    route: [{{destination: {{host: db, subset: v2}}}}]\n  - match: [{{destinationSubnets: [10.3.0.7], port: 1}}]\n    route: [{{destination: {{host: db, subset: v3}}}}]\n  - route: [{{destination: {{host: db, subset: v1}}}}]\n  - route: [{{destination: {{host: db, subset: v3}}}}]\n"
    ));
    let cfg = proxy_config(&ctx, &sidecar("shop", json!({"app": "batch"})));
    let l = listener(&cfg, "10.96.0.50_5432");
    // The fitting matches' subnets, sorted and once each; a match for another port does
    // not fit; the first route for every connection ends the list.
    assert_eq!(
        chains(l),
        [
            (
                vec![],
                vec!["10.1.0.0/16".to_string(), "10.2.0.0/16".to_string()],
                cluster("v2")
            ),
            (vec![], vec![], cluster("v1")),
        ]
    );
    assert!(l.listener_filters.is_empty(), "no SNI: no TLS inspector");
    // Without a route for every connection, the service's own cluster takes them.
    let ctx = context(&format!(
        "{DB}---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: db, namespace: shop}}\nspec:\n  hosts: [db]\n  tcp:\n  - match: [{{destinationSubnets: ['fd00:1::/64']}}]\n    route: [{{destination: {{host: db, subset: v3}}}}]\n"
    ));
    let cfg = proxy_config(&ctx, &sidecar("shop", json!({})));
    assert_eq!(
        chains(listener(&cfg, "10.96.0.50_5432")),
        [
            (vec![], vec!["fd00:1::/64".to_string()], cluster("v3")),
            (vec![], vec![], cluster("")),
        ]
    );
}

/// A CIDR ServiceEntry's chain is matched on its range; a route for the same range takes
/// its place (Envoy refuses two chains with one match), one for another range adds a chain.
#[test]
fn a_route_for_a_cidr_entrys_own_range_replaces_its_chain() {
    let entry = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: corp, namespace: shop}\nspec:\n  hosts: [db.corp.example]\n  addresses: [192.168.8.0/24]\n  ports: [{number: 5432, name: tcp, protocol: TCP}]\n  resolution: NONE\n";
    let ctx = context(&format!(
        "{DB}---\n{entry}---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: corp, namespace: shop}}\nspec:\n  hosts: [db.corp.example]\n  tcp:\n  - match: [{{destinationSubnets: [192.168.8.0/24]}}]\n    route: [{{destination: {{host: db, subset: v2}}}}]\n  - match: [{{destinationSubnets: [192.168.9.0/24]}}]\n    route: [{{destination: {{host: db, subset: v3}}}}]\n"
    ));
    let cfg = proxy_config(&ctx, &sidecar("shop", json!({})));
    let l = listener(&cfg, "0.0.0.0_5432");
    let got = chains(l);
    assert_eq!(
        got[..2],
        [
            (vec![], vec!["192.168.8.0/24".to_string()], cluster("v2")),
            (vec![], vec!["192.168.9.0/24".to_string()], cluster("v3")),
        ]
    );
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(
        l.default_filter_chain.as_ref().unwrap().name,
        "PassthroughFilterChain"
    );
}

#[test]
fn tls_matches_are_told_apart_by_sni_and_subnets() {
    let ctx = context(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: api, namespace: shop}\nspec:\n  hosts: [api.example.com]\n  ports: [{number: 443, name: tls, protocol: TLS}]\n  resolution: DNS\n---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: backup, namespace: shop}\nspec:\n  hosts: [backup.example.com]\n  ports: [{number: 443, name: tls, protocol: TLS}]\n  resolution: DNS\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: api, namespace: shop}\nspec:\n  hosts: [api.example.com]\n  tls:\n  - match: [{sniHosts: [api.example.com], destinationSubnets: [10.9.0.0/16]}]\n    route: [{destination: {host: backup.example.com}}]\n  - match: [{sniHosts: [api.example.com], destinationSubnets: [10.9.0.0/16]}, {sniHosts: [api.example.com]}]\n    route: [{destination: {host: api.example.com}}]\n",
    );
    let cfg = proxy_config(&ctx, &sidecar("shop", json!({})));
    let l = listener(&cfg, "0.0.0.0_443");
    let api = vec!["api.example.com".to_string()];
    let got = chains(l);
    assert!(
        got.contains(&(
            api.clone(),
            vec!["10.9.0.0/16".to_string()],
            "outbound|443||backup.example.com".to_string()
        )),
        "{got:?}"
    );
    assert!(
        got.contains(&(api, vec![], "outbound|443||api.example.com".to_string())),
        "{got:?}"
    );
    // The second route's subnet match repeats the first's and is dropped.
    let on_subnet = got.iter().filter(|c| !c.1.is_empty()).count();
    assert_eq!(on_subnet, 1, "{got:?}");
}
