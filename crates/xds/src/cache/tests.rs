use serde_json::json;

use super::*;
use model::Store;
use model::config::Kind;
use model::config::parse::parse_file;
use model::testmesh::{Load, Shape};

/// The Service svc-6 of `Shape`'s mesh (in `ns`) with one port, `port`.
fn svc6_on_port(ns: &str, port: u32) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-6, namespace: {ns}}}\nspec:\n  clusterIP: 10.100.0.6\n  ports: [{{name: http, port: {port}}}]\n"
    )
}

fn apply(store: &mut Store, yaml: &str) {
    let parsed = parse_file("change.yaml", yaml);
    assert!(parsed.errors().next().is_none(), "{:?}", parsed.issues);
    for o in parsed.objects {
        store.apply(o);
    }
}

fn proxy(kind: &str, ns: &str, labels: serde_json::Value, secure: bool) -> Proxy {
    let meta = json!({"NAMESPACE": ns, "LABELS": labels});
    let mut p = Proxy::from_node(
        &format!("{kind}~10.9.0.1~p-0.{ns}~{ns}.svc.cluster.local"),
        meta.as_object().unwrap(),
    )
    .unwrap();
    if secure {
        p.identity = Some(format!("spiffe://cluster.local/ns/{ns}/sa/default"));
    }
    p
}

fn vhds(mut p: Proxy) -> Proxy {
    p.vhds = true;
    p
}

/// `p` as istio-proxy: service clusters of its own, with Istio's filters.
fn istio_proxy(mut p: Proxy) -> Proxy {
    p.istio_extensions = true;
    p
}

fn proxies() -> Vec<Proxy> {
    vec![
        proxy("sidecar", "ns-0", json!({"app": "a"}), false),
        proxy("sidecar", "ns-1", json!({"app": "b"}), false),
        proxy("sidecar", "ns-1", json!({"app": "c"}), true),
        vhds(proxy("sidecar", "ns-0", json!({"app": "a"}), false)),
        vhds(proxy("sidecar", "ns-1", json!({"app": "c"}), true)),
        proxy(
            "router",
            "istio-system",
            json!({"istio": "ingressgateway"}),
            true,
        ),
        vhds(proxy(
            "router",
            "istio-system",
            json!({"istio": "ingressgateway"}),
            true,
        )),
    ]
}

/// The cached view of every proxy holds exactly the resources, names and bytes, of
/// the view translated from scratch.
fn assert_views_agree(ctx: &PushContext, cache: &ResourceCache) {
    let istio = [0, 2, 5].map(|i| istio_proxy(proxies()[i].clone()));
    assert_views_agree_for(ctx, cache, proxies().into_iter().chain(istio).collect());
}

fn assert_views_agree_for(ctx: &PushContext, cache: &ResourceCache, proxies: Vec<Proxy>) {
    for p in proxies {
        let cached = view(ctx, &p, cache);
        let fresh = View::new(translate::proxy_config(ctx, &p));
        crate::testing::assert_same_views(&cached, &fresh, &p.id);
    }
}

/// The first push of `store` and a fresh cache, its views checked against the translated
/// ones.
fn first_push(store: &Store) -> (PushContext, ResourceCache) {
    let ctx = PushContext::build(store, "v/1".into());
    let cache = ResourceCache::default();
    assert_views_agree(&ctx, &cache);
    (ctx, cache)
}

/// The `istio` ConfigMap whose `mesh` is `lines` (each indented by four spaces).
fn mesh_config_map(lines: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n{lines}"
    )
}

/// The clusters of the first of [`proxies`]' cached view.
fn view_clusters(
    ctx: &PushContext,
    cache: &ResourceCache,
) -> Vec<envoy_api::pb::envoy::config::cluster::v3::Cluster> {
    let v = view(ctx, &proxies()[0], cache);
    (v.all(TypeKind::Cluster).values())
        .map(|r| envoy_api::pb::envoy::config::cluster::v3::Cluster::decode(&*r.value()).unwrap())
        .collect()
}

#[test]
fn a_gateways_sni_dnat_clusters_and_assignments_are_in_its_cached_view() {
    let mut store = Shape::new(40, 4, 2).store();
    apply(
        &mut store,
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: ew, namespace: istio-system}\nspec:\n  selector: {istio: ingressgateway}\n  servers:\n  - {port: {number: 15443, name: tls, protocol: TLS}, hosts: ['*.local'], tls: {mode: AUTO_PASSTHROUGH}}\n",
    );
    let (ctx, cache) = first_push(&store);
    let gateway = proxies().pop().unwrap();
    let v = view(&ctx, &gateway, &cache);
    let dnat = |kind| {
        (v.all(kind).keys())
            .filter(|n| n.starts_with("outbound_."))
            .count()
    };
    assert!(dnat(TypeKind::Cluster) >= 40, "{}", dnat(TypeKind::Cluster));
    assert_eq!(dnat(TypeKind::Cluster), dnat(TypeKind::Endpoint));
}

#[test]
fn cached_views_are_the_translated_views_byte_for_byte_and_are_shared() {
    let store = Shape::new(40, 4, 2).store();
    let (_, cache) = first_push(&store);
    let (hits, misses) = cache.reads();
    assert!(misses >= 40, "every service was encoded: {misses}");
    assert!(hits > 0, "proxies of one kind share a service's clusters");
    // A second round (a later push of the same mesh) translates nothing.
    let again = PushContext::build(&store, "v/2".into());
    assert_views_agree(&again, &cache);
    assert_eq!(cache.reads().1, misses, "no miss on an unchanged mesh");
    assert!(cache.reads().0 > hits);
    assert_eq!(cache.len(), 40);
}

#[test]
fn views_of_one_push_with_the_same_services_share_their_cluster_and_endpoint_sets() {
    let mut store = Shape::new(40, 4, 2).store();
    // A service selecting proxy `b` gives it an inbound cluster of its own.
    apply(
        &mut store,
        "apiVersion: v1\nkind: Service\nmetadata: {name: b, namespace: ns-1}\nspec:\n  clusterIP: 10.100.9.9\n  selector: {app: b}\n  ports: [{name: http, port: 8080}]\n",
    );
    let (ctx, cache) = first_push(&store);
    let a0 = proxy("sidecar", "ns-0", json!({"app": "a"}), false);
    let a1 = proxy("sidecar", "ns-1", json!({"app": "a"}), false);
    let b1 = proxy("sidecar", "ns-1", json!({"app": "b"}), false);
    let secure = proxy("sidecar", "ns-0", json!({"app": "a"}), true);
    let [v0, v1, vb, vs] = [&a0, &a1, &b1, &secure].map(|p| view(&ctx, p, &cache));
    use TypeKind::{Cluster, Endpoint};
    // Two namespaces, one service list: one set of each.
    assert!(v0.shares(&v1, Cluster) && v0.shares(&v1, Endpoint));
    // Its own inbound cluster, or mTLS clusters: sets of their own.
    assert!(!v0.shares(&vb, Cluster));
    assert!(vb.all(Cluster).keys().any(|n| n.starts_with("inbound|")));
    assert!(!v0.shares(&vs, Cluster) && !v0.shares(&vs, Endpoint));
    // Another push's views never share this push's sets.
    let next = PushContext::build(&store, "v/2".into());
    assert!(!view(&next, &a0, &cache).shares(&v0, Cluster));
    assert_views_agree(&next, &cache);
}

#[test]
fn a_gateways_routes_are_cached_per_virtual_service_and_never_stale() {
    let shape = Shape::new(40, 4, 2);
    let mut store = shape.store();
    let routing: String = (0..40).map(|i| shape.gateway_routing_yaml(i)).collect();
    apply(&mut store, &routing);
    // A second Gateway on another port admitting ns-1 only; a VirtualService bound to
    // both with two hosts; one whose routes depend on the source (never shared); one
    // for sidecars and the gateway mirroring to svc-6, whose cluster name follows
    // svc-6's port.
    let ns6 = shape.namespace_of(6);
    let extra = format!(
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: second, namespace: istio-system}}\nspec:\n  selector: {{istio: ingressgateway}}\n  servers: [{{port: {{number: 8080, name: http-alt, protocol: HTTP}}, hosts: [\"ns-1/*\"]}}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: both, namespace: ns-1}}\nspec:\n  hosts: [a.example.com, b.example.com]\n  gateways: [istio-system/ingress, istio-system/second]\n  http: [{{route: [{{destination: {{host: svc-1}}}}]}}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: by-source, namespace: ns-2}}\nspec:\n  hosts: [c.example.com]\n  gateways: [istio-system/ingress]\n  http:\n  - match: [{{sourceNamespace: istio-system}}]\n    route: [{{destination: {{host: svc-2}}}}]\n  - route: [{{destination: {{host: svc-10}}}}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: mirrored, namespace: ns-1}}\nspec:\n  hosts: [svc-5]\n  gateways: [istio-system/ingress, mesh]\n  http: [{{route: [{{destination: {{host: svc-5}}}}], mirror: {{host: svc-6.{ns6}.svc.cluster.local}}}}]\n"
    );
    apply(&mut store, &extra);
    let cache = ResourceCache::default();
    let gateways: Vec<Proxy> = (proxies().into_iter())
        .filter(|p| p.kind == ProxyKind::Router)
        .collect();
    let first = PushContext::build(&store, "v/1".into());
    assert_views_agree(&first, &cache);
    let config = translate::proxy_config(&first, &gateways[0]);
    let http80 = config.routes.iter().find(|r| r.name == "http.80").unwrap();
    assert_eq!(
        http80.virtual_hosts.len(),
        43,
        "40 + a and b (one VirtualService, one virtual host), c and svc-5"
    );

    // One VirtualService edited: its routes are the one entry translated again, for
    // both gateways (one on VHDS) and both views of each.
    apply(
        &mut store,
        &shape
            .gateway_routing_yaml(3)
            .replace("prefix: /api", "prefix: /v2"),
    );
    let misses = cache.reads().1;
    let second = PushContext::build(&store, "v/2".into());
    assert_views_agree_for(&second, &cache, gateways.clone());
    assert_views_agree_for(&second, &cache, gateways.clone());
    assert_eq!(cache.reads().1 - misses, 1, "gw-svc-3's routes");
    // Routes matching on the source are translated for each gateway, never shared: a
    // gateway elsewhere gets c.example.com without the istio-system route.
    let elsewhere = proxy("router", "ns-2", json!({"istio": "ingressgateway"}), true);
    let c_routes = |p: &Proxy| {
        let config = translate::proxy_config(&second, p);
        let http80 = config.routes.iter().find(|r| r.name == "http.80").unwrap();
        let c = http80.virtual_hosts.iter();
        c.filter(|v| v.name == "c.example.com:80")
            .map(|v| v.routes.len())
            .sum::<usize>()
    };
    assert_eq!((c_routes(&gateways[0]), c_routes(&elsewhere)), (2, 1));
    assert_views_agree_for(&second, &cache, vec![gateways[0].clone(), elsewhere]);

    // What the routes lead to: svc-6's port (the mirror's cluster, for sidecars and
    // gateways alike), a DestinationRule
    // hashing svc-1 (the routes of `both`), then `both` deleted.
    apply(&mut store, &svc6_on_port(&ns6, 9090));
    assert_views_agree(&PushContext::build(&store, "v/3".into()), &cache);
    apply(
        &mut store,
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: svc-1, namespace: ns-1}\nspec:\n  host: svc-1\n  trafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x-user}}}\n",
    );
    let fourth = PushContext::build(&store, "v/4".into());
    assert_views_agree_for(&fourth, &cache, gateways.clone());
    let before = cache.gateway_routes.lock().unwrap().len();
    let without = |store: &Store, gone: &ObjectKey| {
        let mut smaller = Store::default();
        for o in store.iter().filter(|o| o.key != *gone) {
            smaller.apply((**o).clone());
        }
        smaller
    };
    let both = ObjectKey::new(Kind::VirtualService, "ns-1", "both");
    let mut store = without(&store, &both);
    let without_both = PushContext::build(&store, "v/5".into());
    cache.retain_services_of(&without_both, None);
    assert_eq!(
        cache.gateway_routes.lock().unwrap().len(),
        before - 2,
        "both's routes at each Gateway"
    );
    assert_views_agree_for(&without_both, &cache, gateways.clone());

    // A VirtualService no longer bound to the Gateway, then the Gateway gone: their
    // entries go with the first push that changes routing, not with one that changes
    // endpoints only.
    let count = || cache.gateway_routes.lock().unwrap().len();
    let endpoints_only = BTreeSet::from([ObjectKey::new(Kind::EndpointSlice, "ns-1", "svc-1")]);
    let mirrored = ObjectKey::new(Kind::VirtualService, "ns-1", "mirrored");
    apply(
        &mut store,
        &format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: mirrored, namespace: ns-1}}\nspec:\n  hosts: [svc-5]\n  gateways: [mesh]\n  http: [{{route: [{{destination: {{host: svc-5}}}}], mirror: {{host: svc-6.{ns6}.svc.cluster.local}}}}]\n"
        ),
    );
    let unbound = PushContext::build(&store, "v/6".into());
    let before = count();
    cache.retain_services_of(&unbound, Some(&endpoints_only));
    assert_eq!(count(), before, "kept by an endpoint-only push");
    cache.retain_services_of(&unbound, Some(&BTreeSet::from([mirrored])));
    assert_eq!(
        count(),
        before - 1,
        "mirrored's routes at the ingress Gateway"
    );
    assert_views_agree_for(&unbound, &cache, gateways.clone());

    let ingress = ObjectKey::new(Kind::Gateway, "istio-system", "ingress");
    let no_ingress = PushContext::build(&without(&store, &ingress), "v/7".into());
    assert!(
        count() >= 40,
        "the routes of gw-svc-0 to gw-svc-39 at the ingress"
    );
    cache.retain_services_of(&no_ingress, Some(&endpoints_only));
    assert!(count() >= 40, "kept by an endpoint-only push");
    cache.retain_services_of(&no_ingress, Some(&BTreeSet::from([ingress])));
    assert_eq!(count(), 0, "no Gateway server is left to route");
    assert_views_agree_for(&no_ingress, &cache, gateways);
}

#[test]
fn a_change_re_encodes_only_what_it_touches_and_never_serves_a_stale_entry() {
    let shape = Shape::new(40, 4, 2);
    let mut store = shape.store();
    let cache = ResourceCache::default();
    let first = PushContext::build(&store, "v/1".into());
    assert_views_agree(&first, &cache);

    // An endpoint-only change to svc-3 (in ns-3, no proxy's namespace): its clusters
    // for each (kind, secure) pair in use and its one default virtual host.
    apply(&mut store, &shape.service_yaml(3, Some("10.200.0.1")));
    let misses = cache.reads().1;
    let second = PushContext::build(&store, "v/2".into());
    assert_views_agree(&second, &cache);
    assert_eq!(
        cache.reads().1 - misses,
        7,
        "plaintext sidecar, secure sidecar and secure gateway clusters for stock Envoy and \
         for istio-proxy, one virtual host"
    );
    // Every proxy's view after it, its listeners and routes kept from the view before,
    // is the view built anew.
    for p in proxies() {
        let kept = view_after_endpoints(&second, &p, &cache, &view(&first, &p, &cache));
        let fresh = view(&second, &p, &cache);
        crate::testing::assert_same_views(&kept, &fresh, &p.id);
    }

    // A DestinationRule change (svc-10's subsets), a new DestinationRule (svc-7) and a
    // new trust domain: each entry they touch is rebuilt (the byte comparison proves
    // no stale one is served).
    apply(
        &mut store,
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: svc-10, namespace: ns-2}\nspec:\n  host: svc-10\n  subsets: [{name: v1, labels: {version: v3}}, {name: v2, labels: {version: v2}}]\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: svc-7, namespace: ns-3}\nspec:\n  host: svc-7\n  trafficPolicy: {tls: {mode: DISABLE}}\n",
    );
    assert_views_agree(&PushContext::build(&store, "v/3".into()), &cache);
    apply(
        &mut store,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |\n    trustDomain: example.org\n",
    );
    assert_views_agree(&PushContext::build(&store, "v/4".into()), &cache);

    // VirtualService routes, cached per routed service: a VirtualService edit; a route
    // to another service without a port, whose cluster name follows that service's
    // port when it changes; a route that depends on the proxy's labels (not shared).
    let (ns5, ns6) = (shape.namespace_of(5), shape.namespace_of(6));
    let cross = format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: cross, namespace: {ns5}}}\nspec:\n  hosts: [svc-5]\n  http: [{{route: [{{destination: {{host: svc-6.{ns6}.svc.cluster.local}}}}]}}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: by-source, namespace: {ns6}}}\nspec:\n  hosts: [svc-6]\n  http:\n  - match: [{{sourceLabels: {{app: b}}}}]\n    route: [{{destination: {{host: svc-6, subset: v2}}}}]\n  - route: [{{destination: {{host: svc-6}}}}]\n"
    );
    apply(&mut store, &cross);
    assert_views_agree(&PushContext::build(&store, "v/5".into()), &cache);
    apply(
        &mut store,
        &shape.changed_service_yaml(10, None, "someone-else"),
    );
    assert_views_agree(&PushContext::build(&store, "v/6".into()), &cache);
    let misses = cache.reads().1;
    apply(&mut store, &svc6_on_port(&ns6, 9090));
    assert_views_agree(&PushContext::build(&store, "v/7".into()), &cache);
    assert!(cache.reads().1 > misses);
    // The routes to svc-6 hash as its DestinationRule says: a new rule there rebuilds
    // svc-5's cached virtual host, whose own rule did not change.
    apply(
        &mut store,
        &format!(
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: svc-6, namespace: {ns6}}}\nspec:\n  host: svc-6\n  trafficPolicy: {{loadBalancer: {{consistentHash: {{httpHeaderName: x-user}}}}}}\n"
        ),
    );
    assert_views_agree(&PushContext::build(&store, "v/8".into()), &cache);

    // A deleted service leaves the cache with the next push.
    let ctx = {
        let mut smaller = Store::default();
        for o in store.iter().filter(|o| !o.key.name.starts_with("svc-39")) {
            smaller.apply((**o).clone());
        }
        PushContext::build(&smaller, "v/5".into())
    };
    cache.retain_services_of(&ctx, None);
    assert_eq!(cache.len(), 39);
    assert_views_agree(&ctx, &cache);
}

#[test]
fn proxies_that_get_other_destination_rules_get_views_of_their_own_and_share_the_rest() {
    let mut store = Shape::new(40, 4, 2).store();
    let rule = |ns: &str, name: &str, host: &str, extra: &str| {
        format!(
            "---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  host: {host}\n{extra}"
        )
    };
    let pool =
        |n: u32| format!("  trafficPolicy: {{connectionPool: {{tcp: {{maxConnections: {n}}}}}}}\n");
    apply(
            &mut store,
            &[
                // ns-3's own rule for svc-6 of ns-2.
                rule("ns-3", "svc-6-here", "svc-6.ns-2.svc.cluster.local", &format!("  exportTo: ['.']\n{}", pool(3))),
                // For ns-1's proxies labelled app=c: hashed routes to svc-5.
                rule("ns-1", "svc-5-for-c", "svc-5", "  workloadSelector: {matchLabels: {app: c}}\n  trafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x-user}}}\n"),
                // svc-11's rule in its namespace, ns-3, exported to ns-0 alone.
                rule("ns-3", "svc-11-for-ns-0", "svc-11", &format!("  exportTo: [ns-0]\n{}", pool(5))),
            ]
            .concat(),
        );
    let ctx = PushContext::build(&store, "v/1".into());
    let cache = ResourceCache::default();
    let mut all = proxies();
    let more = [
        ("ns-3", "a"),
        ("ns-3", "d"),
        ("ns-2", "a"),
        ("ns-0", "d"),
        ("ns-1", "c"),
    ];
    all.extend(more.map(|(ns, app)| proxy("sidecar", ns, json!({ "app": app }), false)));
    assert_views_agree_for(&ctx, &cache, all.clone());

    let views: Vec<View> = all.iter().map(|p| view(&ctx, p, &cache)).collect();
    let [
        a0,
        _b1,
        _c1,
        _a0_vhds,
        _c1_vhds,
        _router,
        _router_vhds,
        a3,
        d3,
        a2,
        d0,
        c1,
    ] = &views[..]
    else {
        panic!("{} views", views.len())
    };
    use TypeKind::{Cluster, Route};
    // Proxies no rule singles out (ns-2) share with those whose namespace's rules
    // change nothing for them; ns-3's and ns-0's proxies share among themselves.
    assert!(a3.shares(d3, Cluster) && a0.shares(d0, Cluster));
    assert!(!a3.shares(a2, Cluster) && !a0.shares(a2, Cluster));
    let limit = |v: &View, cluster: &str| {
        let c = envoy_api::pb::envoy::config::cluster::v3::Cluster::decode(
            &*v.all(Cluster)[cluster].value(),
        )
        .unwrap();
        let t = c.circuit_breakers.unwrap().thresholds;
        t[0].max_connections.as_ref().unwrap().value
    };
    let (svc6, svc11) = (
        "outbound|8080||svc-6.ns-2.svc.cluster.local",
        "outbound|8080||svc-11.ns-3.svc.cluster.local",
    );
    assert_eq!(
        [limit(a3, svc6), limit(a2, svc6), limit(a0, svc6)],
        [3, u32::MAX, u32::MAX]
    );
    assert_eq!(
        [limit(a0, svc11), limit(a2, svc11), limit(a3, svc11)],
        [5, u32::MAX, u32::MAX]
    );
    // The selected proxy hashes its routes to svc-5; its neighbour does not.
    let hashed = |v: &View| {
        let r = RouteConfiguration::decode(&*v.all(Route)["8080"].value()).unwrap();
        let vh = r
            .virtual_hosts
            .iter()
            .find(|h| h.name.starts_with("svc-5."))
            .unwrap()
            .clone();
        match vh.routes[0].action.clone() {
            Some(envoy_api::pb::envoy::config::route::v3::route::Action::Route(a)) => {
                !a.hash_policy.is_empty()
            }
            other => panic!("{other:?}"),
        }
    };
    let b1 = proxy("sidecar", "ns-1", json!({"app": "b"}), false);
    assert!(hashed(c1) && !hashed(&view(&ctx, &b1, &cache)));

    // A later push of the same mesh translates nothing again, whichever proxy asks.
    let misses = cache.reads().1;
    assert_views_agree_for(&PushContext::build(&store, "v/2".into()), &cache, all);
    assert_eq!(cache.reads().1, misses);
}

#[test]
fn load_assignments_balanced_by_locality_are_shared_per_place_only() {
    let entry = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: api, namespace: shop}\nspec:\n  hosts: [api.example.com]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  endpoints:\n  - {address: 10.0.0.1, locality: r/z1}\n  - {address: 10.0.0.2, locality: r/z2}\n";
    let rule = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: api, namespace: shop}\nspec:\n  host: api.example.com\n  trafficPolicy: {outlierDetection: {consecutive5xxErrors: 1}}\n";
    let at = |zone: &str, app: &str| {
        let mut p = proxy("sidecar", "shop", json!({ "app": app }), false);
        p.locality = model::Locality::parse(&format!("r/{zone}"));
        p
    };
    let (a, b, c) = (at("z1", "a"), at("z1", "b"), at("z2", "a"));
    let cla = "outbound|80||api.example.com";
    let bytes = |v: &View| v.all(TypeKind::Endpoint)[cla].value().into_owned();
    let mut store = Store::default();
    apply(&mut store, entry);
    let cache = ResourceCache::default();

    // Without outlier detection nothing depends on the locality: one shared set.
    let ctx = PushContext::build(&store, "v/1".into());
    assert!(!cache.locality_aware(&ctx));
    let [va, vc] = [&a, &c].map(|p| view(&ctx, p, &cache));
    assert!(va.shares(&vc, TypeKind::Endpoint));

    // With it, each zone's proxies get their own priorities, equal to the translation
    // from scratch, and proxies of one zone share them.
    apply(&mut store, rule);
    let ctx = PushContext::build(&store, "v/2".into());
    assert!(cache.locality_aware(&ctx));
    for p in [&a, &b, &c] {
        let fresh = View::new(translate::proxy_config(&ctx, p));
        assert_eq!(bytes(&view(&ctx, p, &cache)), bytes(&fresh), "{}", p.id);
    }
    let [va, vb, vc] = [&a, &b, &c].map(|p| view(&ctx, p, &cache));
    assert_ne!(bytes(&va), bytes(&vc));
    // Labels no failoverPriority compares do not split the shared sets.
    assert!(va.shares(&vb, TypeKind::Endpoint));
    assert!(!va.shares(&vc, TypeKind::Endpoint));
    assert!(Arc::ptr_eq(
        &va.all(TypeKind::Endpoint)[cla],
        &vb.all(TypeKind::Endpoint)[cla]
    ));
    let priorities = |v: &View| {
        let cla = ClusterLoadAssignment::decode(&*bytes(v)).unwrap();
        (cla.endpoints.iter())
            .map(|g| (g.locality.as_ref().unwrap().zone.clone(), g.priority))
            .collect::<Vec<_>>()
    };
    assert_eq!(priorities(&va), [("z1".to_string(), 0), ("z2".into(), 1)]);
    assert_eq!(priorities(&vc), [("z1".to_string(), 1), ("z2".into(), 0)]);
}

#[test]
fn with_network_gateways_load_assignments_are_shared_per_network_only() {
    let entry = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: api, namespace: shop}\nspec:\n  hosts: [api.example.com]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  endpoints:\n  - {address: 10.0.0.1, network: net-a, labels: {security.istio.io/tlsMode: istio}}\n  - {address: 10.0.0.2, network: net-b, labels: {security.istio.io/tlsMode: istio}}\n";
    let gateway = |ip: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: eastwest, namespace: istio-system, labels: {{topology.istio.io/network: net-b}}}}\nspec:\n  externalIPs: [{ip}]\n  ports: [{{name: tls, port: 15443}}]\n"
        )
    };
    let on = |network: &str, app: &str| {
        let mut p = proxy("sidecar", "shop", json!({ "app": app }), false);
        p.network = network.into();
        p
    };
    let (a1, a2, b) = (on("net-a", "x"), on("net-a", "y"), on("net-b", "x"));
    let cla = "outbound|80||api.example.com";
    let bytes = |v: &View| v.all(TypeKind::Endpoint)[cla].value().into_owned();
    let mut store = Store::default();
    apply(&mut store, entry);
    let cache = ResourceCache::default();

    // No gateway: the network does not matter, one shared set.
    let ctx = PushContext::build(&store, "v/1".into());
    let [va, vb] = [&a1, &b].map(|p| view(&ctx, p, &cache));
    assert!(va.shares(&vb, TypeKind::Endpoint));

    // With one, each network's proxies get their own, equal to the translation from
    // scratch, and share them.
    apply(&mut store, &gateway("192.0.2.1"));
    let ctx = PushContext::build(&store, "v/2".into());
    assert_views_agree_for(&ctx, &cache, vec![a1.clone(), a2.clone(), b.clone()]);
    let [va1, va2, vb] = [&a1, &a2, &b].map(|p| view(&ctx, p, &cache));
    assert!(va1.shares(&va2, TypeKind::Endpoint));
    assert!(!va1.shares(&vb, TypeKind::Endpoint));
    let has = |v: &View, ip: &str| String::from_utf8_lossy(&bytes(v)).contains(ip);
    assert!(has(&va1, "192.0.2.1") && !has(&va1, "10.0.0.2"));
    assert!(!has(&vb, "192.0.2.1") && has(&vb, "10.0.0.2"));

    // A new gateway address is a change to the Service alone: the update rebuilds the
    // gateways, and the cache serves no load assignment of the old ones.
    let before = ctx;
    let changed = [model::config::ObjectKey::new(
        model::config::Kind::Service,
        "istio-system",
        "eastwest",
    )];
    apply(&mut store, &gateway("192.0.2.9"));
    let ctx = before.update(&store, &changed.iter().cloned().collect(), "v/3".into());
    assert!(ctx.affects(&a1, changed.iter()));
    assert_views_agree_for(&ctx, &cache, vec![a1.clone(), b.clone()]);
    assert!(has(&view(&ctx, &a1, &cache), "192.0.2.9"));

    // A Service that stops being a gateway still reaches every proxy in that update.
    let plain =
        gateway("192.0.2.9").replace("labels: {topology.istio.io/network: net-b}", "labels: {}");
    apply(&mut store, &plain);
    let ctx = ctx.update(&store, &changed.iter().cloned().collect(), "v/4".into());
    assert!(!ctx.networks.enabled());
    assert!(ctx.networks.names_service("istio-system", "eastwest"));
    assert_views_agree_for(&ctx, &cache, vec![a1.clone(), b.clone()]);
    assert!(has(&view(&ctx, &a1, &cache), "10.0.0.2"));
}

#[test]
fn a_sniffed_ports_own_route_configuration_is_cached_apart_from_the_ports() {
    let mut store = Shape::new(20, 2, 2).store();
    apply(
        &mut store,
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns-0}\nspec: {clusterIP: 10.100.9.8, ports: [{name: web, port: 7070}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: routed, namespace: ns-1}\nspec: {clusterIP: 10.100.9.7, ports: [{port: 7070}]}\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: routed, namespace: ns-1}\nspec:\n  hosts: [routed]\n  http: [{match: [{headers: {x-team: {exact: a}}}], route: [{destination: {host: web.ns-0.svc.cluster.local}}]}, {route: [{destination: {host: routed}}]}]\n",
    );
    let ctx = PushContext::build(&store, "v/1".into());
    let cache = ResourceCache::default();
    // Without capture the sniffed services join route `7070`: the same services and
    // port, other domains.
    let meta = json!({"NAMESPACE": "ns-0", "INTERCEPTION_MODE": "NONE"});
    let no_capture = Proxy::from_node(
        "sidecar~10.9.0.2~q-0.ns-0~ns-0.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap();
    let mut proxies = proxies();
    proxies.push(no_capture.clone());
    // Twice: the second round reads what the first cached.
    assert_views_agree_for(&ctx, &cache, proxies.clone());
    assert_views_agree_for(&ctx, &cache, proxies);
    let names = |p: &Proxy| -> Vec<String> {
        let v = view(&ctx, p, &cache);
        (v.all(TypeKind::Route).keys())
            .filter(|n| n.contains("7070"))
            .map(|n| n.to_string())
            .collect()
    };
    let captured = proxy("sidecar", "ns-0", json!({"app": "a"}), false);
    assert_eq!(
        names(&captured),
        [
            "routed.ns-1.svc.cluster.local:7070",
            "web.ns-0.svc.cluster.local:7070"
        ]
    );
    assert_eq!(names(&no_capture), ["7070"]);
}

#[test]
fn a_dns_capturing_proxys_view_holds_its_name_table_kept_current_by_endpoint_pushes() {
    use translate::name_table::NameTable;
    let headless = |ips: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: db, namespace: ns-0, annotations: {{networking.istio.io/exportTo: .}}}}\nspec: {{clusterIP: None, ports: [{{name: tcp, port: 5432}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: db-a, namespace: ns-0, labels: {{kubernetes.io/service-name: db}}}}\naddressType: IPv4\nports: [{{name: tcp, port: 5432}}]\nendpoints: [{ips}]\n"
        )
    };
    let ready = |ip: &str| {
        let pod = ip.replace('.', "-");
        format!("{{addresses: [{ip}], hostname: zz-{pod}, conditions: {{ready: true}}}}")
    };
    let mut store = Shape::new(40, 4, 2).store();
    apply(&mut store, &headless(&ready("10.1.0.1")));
    let (first, cache) = first_push(&store);
    let mut p = proxy("sidecar", "ns-0", json!({"app": "a"}), false);
    assert!(view(&first, &p, &cache).all(TypeKind::NameTable).is_empty());
    p.dns_proxy = true;
    assert_views_agree_for(&first, &cache, vec![p.clone()]);
    let table = |v: &View| NameTable::decode(&*v.all(TypeKind::NameTable)[""].value()).unwrap();
    let before = view(&first, &p, &cache);
    let t = table(&before);
    assert_eq!(t.table.len(), 42, "40 services, db and its pod");
    assert_eq!(t.table["db.ns-0.svc.cluster.local"].ips, ["10.1.0.1"]);

    // An endpoint-only push keeps the listeners and routes, not the table: a headless
    // service's entry is its endpoints.
    apply(
        &mut store,
        &headless(&format!("{}, {}", ready("10.1.0.1"), ready("10.1.0.2"))),
    );
    let second = PushContext::build(&store, "v/2".into());
    let kept = view_after_endpoints(&second, &p, &cache, &before);
    crate::testing::assert_same_views(&kept, &view(&second, &p, &cache), &p.id);
    assert_eq!(
        table(&kept).table["db.ns-0.svc.cluster.local"].ips,
        ["10.1.0.1", "10.1.0.2"]
    );
    // A proxy that cannot reach the headless service keeps its table, shared.
    let mut other = proxy("sidecar", "ns-1", json!({"app": "b"}), false);
    other.dns_proxy = true;
    let before = view(&first, &other, &cache);
    assert_eq!(table(&before).table.len(), 40);
    // Views with the same services share one table.
    let mut third_ns = proxy("sidecar", "ns-2", json!({"app": "a"}), false);
    third_ns.dns_proxy = true;
    let shared = |v: &View| v.all(TypeKind::NameTable)[""].clone();
    assert!(Arc::ptr_eq(
        &shared(&before),
        &shared(&view(&first, &third_ns, &cache))
    ));
    let kept = view_after_endpoints(&second, &other, &cache, &before);
    assert!(kept.shares(&before, TypeKind::NameTable));
    crate::testing::assert_same_views(&kept, &view(&second, &other, &cache), &other.id);

    // A service's new address replaces its cached entry.
    let shape = Shape::new(40, 4, 2);
    let ns = shape.namespace_of(6);
    apply(
        &mut store,
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-6, namespace: {ns}}}\nspec: {{clusterIP: 10.100.99.6, ports: [{{name: http, port: 8080}}]}}\n"
        ),
    );
    let third = PushContext::build(&store, "v/3".into());
    assert_views_agree_for(&third, &cache, vec![p.clone(), other.clone()]);
    let host = format!("svc-6.{ns}.svc.cluster.local");
    assert_eq!(
        table(&view(&third, &other, &cache)).table[&host].ips,
        ["10.100.99.6"]
    );
}

#[test]
fn views_of_proxies_that_know_service_entries_by_auto_allocated_addresses_are_cached_apart() {
    use model::service::AutoAddresses;
    use translate::name_table::NameTable;
    let mut store = Shape::new(40, 4, 2).store();
    let entry = |ip: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: ext, namespace: ns-0}}\nspec:\n  hosts: [ext.example.com]\n  ports: [{{number: 80, name: http, protocol: HTTP}}, {{number: 3306, name: tcp, protocol: TCP}}]\n  resolution: DNS\nstatus:\n  addresses: [{{value: {ip}, host: ext.example.com}}, {{value: '2001:2::1', host: ext.example.com}}]\n"
        )
    };
    apply(&mut store, &entry("240.240.0.1"));
    let (first, cache) = first_push(&store);
    let with = |auto: AutoAddresses| {
        let mut p = proxy("sidecar", "ns-0", json!({"app": "a"}), false);
        p.dns_proxy = true;
        p.auto_addresses = auto;
        p
    };
    // In turn, so that each reads what the one before put in the cache.
    let kinds = [
        AutoAddresses::None,
        AutoAddresses::Ipv4,
        AutoAddresses::DualStack,
        AutoAddresses::Ipv6,
        AutoAddresses::Ipv4,
    ];
    assert_views_agree_for(&first, &cache, kinds.map(with).to_vec());
    let table = |v: &View| NameTable::decode(&*v.all(TypeKind::NameTable)[""].value()).unwrap();
    let ips = |ctx: &PushContext, auto| {
        table(&view(ctx, &with(auto), &cache)).table["ext.example.com"]
            .ips
            .clone()
    };
    assert_eq!(
        ips(&first, AutoAddresses::DualStack),
        ["240.240.0.1", "2001:2::1"]
    );

    // A new address in status is a new entry.
    apply(&mut store, &entry("240.240.0.9"));
    let second = PushContext::build(&store, "v/2".into());
    assert_views_agree_for(&second, &cache, kinds.map(with).to_vec());
    assert_eq!(ips(&second, AutoAddresses::Ipv4), ["240.240.0.9"]);
}

#[test]
fn proxies_that_get_different_entries_of_one_host_read_their_own_cache_entries() {
    let mut store = Shape::new(40, 4, 2).store();
    for (ns, day, export, port) in [
        ("ns-2", 1, "'*'", 80),
        ("ns-0", 2, "'.'", 80),
        ("ns-1", 3, "'.'", 9090),
    ] {
        apply(
            &mut store,
            &format!(
                "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: partner, namespace: {ns}, creationTimestamp: '2024-01-0{day}T00:00:00Z'}}\nspec:\n  hosts: [api.partner.example]\n  exportTo: [{export}]\n  resolution: DNS\n  ports: [{{number: {port}, name: http, protocol: HTTP}}]\n"
            ),
        );
    }
    let (first, cache) = first_push(&store);
    // In turn, so that each reads what the one before put in the cache.
    let round = || {
        ["ns-0", "ns-1", "ns-3", "ns-0", "ns-1"]
            .map(|ns| proxy("sidecar", ns, json!({"app": "a"}), false))
            .to_vec()
    };
    assert_views_agree_for(&first, &cache, round());
    let clusters = |ns: &str| -> Vec<String> {
        let v = view(
            &first,
            &proxy("sidecar", ns, json!({"app": "a"}), false),
            &cache,
        );
        (v.all(TypeKind::Cluster).keys())
            .filter(|n| n.ends_with("api.partner.example"))
            .map(|n| n.to_string())
            .collect()
    };
    assert_eq!(clusters("ns-1"), ["outbound|9090||api.partner.example"]);
    assert_eq!(clusters("ns-3"), ["outbound|80||api.partner.example"]);
    // The next push, built anew from the same objects: every entry is still there, none
    // pushed out by another namespace's entry of the host.
    let second = PushContext::build(&store, "v/2".into());
    let (_, misses) = cache.reads();
    assert_views_agree_for(&second, &cache, round());
    assert_eq!(cache.reads().1, misses);
}

#[test]
fn a_gateways_cached_virtual_hosts_follow_its_servers_https_redirect() {
    let shape = Shape::new(40, 4, 2);
    let mut store = shape.store();
    let routing: String = (0..5).map(|i| shape.gateway_routing_yaml(i)).collect();
    apply(&mut store, &routing);
    let ingress = |redirect: bool| {
        let tls = if redirect {
            ", tls: {httpsRedirect: true}"
        } else {
            ""
        };
        format!(
            "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: ingress, namespace: istio-system}}\nspec:\n  selector: {{istio: ingressgateway}}\n  servers: [{{port: {{number: 80, name: http, protocol: HTTP}}, hosts: [\"*\"]{tls}}}]\n"
        )
    };
    let gateways: Vec<Proxy> = (proxies().into_iter())
        .filter(|p| p.kind == ProxyKind::Router)
        .collect();
    let cache = ResourceCache::default();
    let mut requiring = Vec::new();
    // Each context reads the virtual hosts the one before cached.
    for (version, redirect) in [(1, true), (2, false), (3, true)] {
        apply(&mut store, &ingress(redirect));
        let ctx = PushContext::build(&store, format!("v/{version}"));
        assert_views_agree_for(&ctx, &cache, gateways.clone());
        let config = translate::proxy_config(&ctx, &gateways[0]);
        let http80 = config.routes.iter().find(|r| r.name == "http.80").unwrap();
        let all = http80.virtual_hosts.iter().filter(|v| v.require_tls != 0);
        requiring.push(all.count());
    }
    // The five routed hosts and the server's own `*`.
    assert_eq!(requiring, [6, 0, 6]);
}

#[test]
fn cached_clusters_follow_the_meshs_connect_timeout_keepalive_and_h2_upgrade() {
    let mut store = Shape::new(40, 4, 2).store();
    let (_, cache) = first_push(&store);
    let timeouts = |ctx: &PushContext| -> BTreeSet<i64> {
        (view_clusters(ctx, &cache).iter())
            .map(|c| c.connect_timeout.unwrap().seconds)
            .collect()
    };
    for (version, lines, expected) in [
        (2, "    connectTimeout: 3s\n", [3]),
        (
            3,
            "    connectTimeout: 3s\n    tcpKeepalive: {probes: 4}\n",
            [3],
        ),
        // Only the upgrade policy differs from the one before.
        (
            4,
            "    connectTimeout: 3s\n    tcpKeepalive: {probes: 4}\n    h2UpgradePolicy: UPGRADE\n",
            [3],
        ),
        (5, "    trustDomain: cluster.local\n", [10]),
    ] {
        apply(&mut store, &mesh_config_map(lines));
        let ctx = PushContext::build(&store, format!("v/{version}"));
        assert_views_agree(&ctx, &cache);
        assert_eq!(timeouts(&ctx), BTreeSet::from(expected), "v/{version}");
    }
}

#[test]
fn cached_clusters_follow_the_meshs_outbound_cluster_stat_name() {
    let mut store = Shape::new(40, 4, 2).store();
    let (_, cache) = first_push(&store);
    // The stat names of the proxy's outbound clusters.
    let names = |ctx: &PushContext| -> BTreeSet<String> {
        (view_clusters(ctx, &cache).into_iter())
            .filter(|c| c.name.starts_with("outbound|"))
            .map(|c| {
                let own = c.alt_stat_name == format!("{};", c.name);
                let last = c.alt_stat_name.split('_').next_back().unwrap();
                if own { "own;" } else { last }.to_string()
            })
            .collect()
    };
    for (version, lines, expected) in [
        (2, "    outboundClusterStatName: '%SERVICE%_A'\n", "A;"),
        (3, "    outboundClusterStatName: '%SERVICE%_B'\n", "B;"),
        // No pattern: each cluster's own name.
        (4, "    trustDomain: cluster.local\n", "own;"),
    ] {
        apply(&mut store, &mesh_config_map(lines));
        let ctx = PushContext::build(&store, format!("v/{version}"));
        assert_views_agree(&ctx, &cache);
        assert_eq!(
            names(&ctx),
            BTreeSet::from([expected.to_string()]),
            "v/{version}"
        );
    }
}

#[test]
fn a_hosts_entries_go_with_the_object_that_declared_it() {
    let mut store = Shape::new(40, 4, 2).store();
    let entry = |ns: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: partner, namespace: {ns}}}\nspec:\n  hosts: [api.partner.example]\n  resolution: DNS\n  ports: [{{number: 80, name: http, protocol: HTTP}}]\n"
        )
    };
    apply(&mut store, &entry("ns-0"));
    let (first, cache) = first_push(&store);
    cache.retain_services_of(&first, None);
    // The host moves to another namespace's entry.
    store.delete(&ObjectKey::new(Kind::ServiceEntry, "ns-0", "partner"));
    apply(&mut store, &entry("ns-1"));
    let second = PushContext::build(&store, "v/2".into());
    assert_views_agree(&second, &cache);
    cache.retain_services_of(&second, None);
    let hosts = cache.hosts.lock().unwrap();
    let namespaces: BTreeSet<&str> = (hosts["api.partner.example"].iter())
        .map(|e| e.service.namespace.as_str())
        .collect();
    assert_eq!(namespaces, BTreeSet::from(["ns-1"]));
}

#[test]
fn cached_virtual_hosts_and_gateway_routes_follow_the_meshs_default_retry_policy() {
    let shape = Shape::new(40, 4, 2);
    let mut store = shape.store();
    let routing: String = (0..5).map(|i| shape.gateway_routing_yaml(i)).collect();
    apply(&mut store, &routing);
    let (first, cache) = first_push(&store);
    cache.retain_services_of(&first, None);
    let mesh = |lines: &str| mesh_config_map(&format!("    {lines}\n"));
    // The retry counts of every route every proxy gets.
    let attempts = |ctx: &PushContext| -> BTreeSet<Option<u32>> {
        let mut all = BTreeSet::new();
        for p in proxies() {
            let config = translate::proxy_config(ctx, &p);
            let vhosts =
                (config.routes.iter().flat_map(|r| &r.virtual_hosts)).chain(&config.virtual_hosts);
            for route in vhosts.flat_map(|v| &v.routes) {
                use envoy_api::pb::envoy::config::route::v3::route::Action;
                if let Some(Action::Route(a)) = &route.action
                    && !a
                        .cluster_specifier
                        .as_ref()
                        .is_some_and(|c| format!("{c:?}").contains("Passthrough"))
                {
                    all.insert(
                        a.retry_policy
                            .as_ref()
                            .map(|r| r.num_retries.unwrap().value),
                    );
                }
            }
        }
        all
    };
    // A push that changes the mesh config only, each reading what the one before cached.
    let changed = BTreeSet::from([ObjectKey::new(Kind::ConfigMap, "istio-system", "istio")]);
    for (version, lines, expected) in [
        (2, "defaultHttpRetryPolicy: {attempts: 5}", vec![Some(5)]),
        (3, "defaultHttpRetryPolicy: {attempts: 0}", vec![None]),
        (4, "trustDomain: cluster.local", vec![Some(2)]),
    ] {
        apply(&mut store, &mesh(lines));
        let ctx = PushContext::build(&store, format!("v/{version}"));
        cache.retain_services_of(&ctx, Some(&changed));
        assert_views_agree(&ctx, &cache);
        assert_eq!(attempts(&ctx), BTreeSet::from_iter(expected), "v/{version}");
    }
}

#[test]
fn proxy_headers_in_virtual_hosts_are_in_cached_views_as_translated() {
    let store = Shape::new(40, 4, 2).store();
    let (ctx, cache) = first_push(&store);
    let with_headers = |mut p: Proxy| {
        let config = json!({"proxyHeaders": {"attemptCount": {"disabled": true}, "xForwardedHost": {"enabled": true}}});
        let meta = json!({"NAMESPACE": p.namespace, "PROXY_CONFIG": config});
        let headers = Proxy::from_node(&p.id, meta.as_object().unwrap()).unwrap();
        p.proxy_headers = headers.proxy_headers;
        p
    };
    let [sidecar, vhds_sidecar, gateway] = [0, 3, 5].map(|i| with_headers(proxies()[i].clone()));
    assert_views_agree_for(&ctx, &cache, vec![sidecar.clone(), vhds_sidecar, gateway]);
    // (The mesh's gateway has only its blackhole virtual host, which they leave alone.)
    let routes = |p: &Proxy| {
        let v = view(&ctx, p, &cache);
        (v.all(TypeKind::Route).values())
            .map(|r| r.value().into_owned())
            .collect::<Vec<_>>()
    };
    assert_ne!(routes(&sidecar), routes(&proxies()[0]));
}
