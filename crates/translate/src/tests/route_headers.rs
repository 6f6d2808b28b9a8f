//! A VirtualService's header operations, as istiod's `TranslateHeadersOperations` and
//! `processDestination` apply them: no route modifies `:`-prefixed headers or `host`
//! (Envoy refuses the whole route configuration); an authority set through them becomes a
//! host rewrite, the `rewrite`'s first, then the route's, then a single destination's; a
//! weighted destination's headers and authority go on its cluster.

use envoy_api::pb::envoy::config::route::v3::{
    Route, route::Action, route_action::ClusterSpecifier, route_action::HostRewriteSpecifier,
    weighted_cluster::cluster_weight,
};
use serde_json::json;

use super::{context, sidecar};
use crate::proxy_config;

/// The routes of the VirtualService whose `http` is `routes` (YAML), for reviews.
fn routes(routes: &str) -> Vec<Route> {
    let vs = format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  hosts: [reviews]\n  http:\n{routes}"
    );
    let cfg = proxy_config(&context(&vs), &sidecar("shop", json!({})));
    let rc = cfg.routes.iter().find(|r| r.name == "9080").unwrap();
    let vh = (rc.virtual_hosts.iter())
        .find(|v| v.name == "reviews.shop.svc.cluster.local:9080")
        .unwrap();
    vh.routes.clone()
}

fn added(route: &Route) -> Vec<(String, String)> {
    (route.request_headers_to_add.iter())
        .map(|h| {
            let h = h.header.as_ref().unwrap();
            (h.key.clone(), h.value.clone())
        })
        .collect()
}

fn host_rewrite(route: &Route) -> Option<String> {
    let Some(Action::Route(a)) = &route.action else {
        panic!()
    };
    match &a.host_rewrite_specifier {
        Some(HostRewriteSpecifier::HostRewriteLiteral(h)) => Some(h.clone()),
        _ => None,
    }
}

#[test]
fn an_authority_set_by_headers_is_a_host_rewrite_and_never_a_header() {
    let r = routes(
        "  - headers: {request: {set: {host: route.example, x-a: '1'}, add: {':authority': ignored}, remove: [host, x-b]}}\n    route: [{destination: {host: reviews}, headers: {request: {set: {x-c: '2', ':authority': dest.example}}}}]\n",
    );
    assert_eq!(
        added(&r[0]),
        [
            ("x-a".to_string(), "1".to_string()),
            ("x-c".into(), "2".into())
        ]
    );
    assert_eq!(r[0].request_headers_to_remove, ["x-b"]);
    assert_eq!(
        host_rewrite(&r[0]).as_deref(),
        Some("route.example"),
        "the route's first"
    );
    let r = routes(
        "  - match: [{uri: {prefix: /a}}]\n    rewrite: {authority: rewrite.example}\n    headers: {request: {set: {host: route.example}}}\n    route: [{destination: {host: reviews}}]\n  - route: [{destination: {host: reviews}, headers: {request: {set: {host: dest.example}}}}]\n",
    );
    assert_eq!(host_rewrite(&r[0]).as_deref(), Some("rewrite.example"));
    assert_eq!(
        host_rewrite(&r[1]).as_deref(),
        Some("dest.example"),
        "a single destination's"
    );
    assert!(added(&r[1]).is_empty());
}

#[test]
fn weighted_destinations_carry_their_own_headers() {
    let r = routes(
        "  - route:\n    - {destination: {host: reviews, subset: v1}, weight: 70, headers: {request: {set: {host: v1.example}}, response: {add: {x-v: '1'}}}}\n    - {destination: {host: reviews, subset: v2}, weight: 30}\n",
    );
    let Some(Action::Route(a)) = &r[0].action else {
        panic!()
    };
    let Some(ClusterSpecifier::WeightedClusters(w)) = &a.cluster_specifier else {
        panic!()
    };
    let v1 = &w.clusters[0];
    assert_eq!(
        v1.host_rewrite_specifier,
        Some(cluster_weight::HostRewriteSpecifier::HostRewriteLiteral(
            "v1.example".into()
        ))
    );
    assert!(v1.request_headers_to_add.is_empty());
    assert_eq!(
        v1.response_headers_to_add[0].header.as_ref().unwrap().key,
        "x-v"
    );
    assert!(w.clusters[1].response_headers_to_add.is_empty());
    assert_eq!(host_rewrite(&r[0]), None);
}
