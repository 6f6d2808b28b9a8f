use serde_json::json;

use super::*;
use crate::config::parse::parse_file;

fn key(kind: Kind, namespace: &str, name: &str) -> ObjectKey {
    ObjectKey {
        kind,
        namespace: namespace.into(),
        name: name.into(),
    }
}

/// Applies `yaml` and deletes `deleted`, returning the keys that changed.
fn change(store: &mut Store, yaml: &str, deleted: &[ObjectKey]) -> BTreeSet<ObjectKey> {
    let parsed = parse_file("change.yaml", yaml);
    assert!(parsed.errors().next().is_none(), "{:?}", parsed.issues);
    let mut keys = BTreeSet::new();
    for o in parsed.objects {
        keys.insert(o.key.clone());
        store.apply(o);
    }
    for k in deleted {
        store.delete(k);
        keys.insert(k.clone());
    }
    keys
}

#[test]
fn mesh_default_export_to_keeps_services_and_virtual_services_without_one_at_home() {
    use crate::builders::{context, istio, mesh_config, service};
    let mesh = |mesh: MeshConfig| {
        context([
            mesh_config(mesh),
            service("shop", "reviews", "10.96.0.10")
                .port("http", 9080)
                .build(),
            service("shop", "ratings", "10.96.0.11")
                .port("http", 9080)
                .annotation("networking.istio.io/exportTo", "*")
                .build(),
            istio(
                Kind::VirtualService,
                "shop",
                "reviews",
                json!({"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}}]}]}),
            ),
        ])
    };
    let proxy = |ns: &str| {
        let meta = json!({"NAMESPACE": ns});
        Proxy::from_node(
            &format!("sidecar~10.1.1.1~a.{ns}~{ns}.svc.cluster.local"),
            meta.as_object().unwrap(),
        )
        .unwrap()
    };
    let seen = |ctx: &PushContext, ns: &str| {
        let p = proxy(ns);
        let mut hosts: Vec<String> = ctx
            .services_for(&p)
            .iter()
            .map(|s| s.hostname.clone())
            .collect();
        hosts.sort();
        let vss = ctx.virtual_services_for(&p, "mesh").len();
        (hosts, vss)
    };
    let (reviews, ratings) = (
        "reviews.shop.svc.cluster.local",
        "ratings.shop.svc.cluster.local",
    );
    let open = mesh(MeshConfig {
        trust_domain: Some("cluster.local".into()),
        ..MeshConfig::default()
    });
    assert_eq!(
        seen(&open, "billing"),
        (vec![ratings.to_string(), reviews.to_string()], 1)
    );
    let private = mesh(MeshConfig {
        default_service_export_to: vec![".".into()],
        default_virtual_service_export_to: vec![".".into()],
        ..MeshConfig::default()
    });
    // Elsewhere only what says otherwise is seen; at home, everything.
    assert_eq!(seen(&private, "billing"), (vec![ratings.to_string()], 0));
    assert_eq!(
        seen(&private, "shop"),
        (vec![ratings.to_string(), reviews.to_string()], 1)
    );
}

#[test]
fn an_update_equals_a_full_build_and_shares_what_it_did_not_touch() {
    use crate::testmesh::Load;
    let shape = crate::testmesh::Shape::new(40, 4, 2);
    let mut store = shape.store();
    let pod = "---\napiVersion: v1\nkind: Pod\nmetadata: {name: web-1, namespace: ns-1, labels: {app: web, version: v1}}\nspec: {serviceAccountName: web}\n";
    let web_service = "---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns-1}\nspec:\n  clusterIP: 10.96.9.9\n  ports: [{name: http, port: 80}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-a, namespace: ns-1, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 80}]\nendpoints:\n- {addresses: [10.1.0.1], targetRef: {kind: Pod, name: web-1}}\n";
    change(&mut store, &format!("{pod}{web_service}"), &[]);
    let mut ctx = PushContext::build(&store, "v".into());
    let web = "web.ns-1.svc.cluster.local";
    let slice = |service: &str| {
        format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-a, namespace: ns-1, labels: {{kubernetes.io/service-name: {service}}}}}\naddressType: IPv4\nports: [{{name: http, port: 80}}]\nendpoints:\n- {{addresses: [10.1.0.1], targetRef: {{kind: Pod, name: web-1}}}}\n"
        )
    };
    let steps: Vec<(&str, String, Vec<ObjectKey>)> = vec![
            ("an endpoint added", shape.service_yaml(4, Some("10.200.0.1")), vec![]),
            ("a pod relabelled", pod.replace("version: v1", "version: v2"), vec![]),
            // The slice moves from `web` to svc-1: both services change.
            ("a slice moved to another service", slice("svc-1"), vec![]),
            ("the slice back", slice("web"), vec![]),
            ("a pod deleted", String::new(), vec![key(Kind::Pod, "ns-1", "web-1")]),
            ("a slice deleted", String::new(), vec![key(Kind::EndpointSlice, "ns-1", "web-a")]),
            ("a service deleted", String::new(), vec![key(Kind::Service, "ns-1", "svc-1")]),
            ("a service added", shape.service_yaml(1, None), vec![]),
            (
                "an ExternalName alias of a service",
                "apiVersion: v1\nkind: Service\nmetadata: {name: alias, namespace: ns-3}\nspec: {type: ExternalName, externalName: svc-2.ns-2.svc.cluster.local}\n".into(),
                vec![],
            ),
            // Rebuilt by the update: it keeps its alias.
            ("an endpoint of the aliased service", shape.service_yaml(2, Some("10.200.0.2")), vec![]),
            ("the alias deleted", String::new(), vec![key(Kind::Service, "ns-3", "alias")]),
            (
                "a ServiceEntry selecting Pods",
                "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: by-pod, namespace: ns-1}\nspec:\n  hosts: [by-pod.internal]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  workloadSelector: {labels: {app: web}}\n".into(),
                vec![],
            ),
            // The Pod selected: an endpoint of the entry, which an update must rebuild.
            ("a selected pod", pod.replace("spec: {serviceAccountName: web}", "spec: {serviceAccountName: web}\nstatus: {podIP: 10.1.0.1}"), vec![]),
            ("a selected pod relabelled", pod.replace("app: web", "app: api").replace("spec: {serviceAccountName: web}", "spec: {serviceAccountName: web}\nstatus: {podIP: 10.1.0.1}"), vec![]),
            (
                "a route to a missing host",
                "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: bad, namespace: ns-1}\nspec:\n  hosts: [bad]\n  http: [{route: [{destination: {host: nowhere}}]}]\n".into(),
                vec![],
            ),
            ("a DestinationRule deleted", String::new(), vec![key(Kind::DestinationRule, "ns-0", "svc-0")]),
            ("a namespace labelled", "apiVersion: v1\nkind: Namespace\nmetadata: {name: ns-2, labels: {istio.io/rev: canary}}\n".into(), vec![]),
            ("a namespace's traffic distribution", "apiVersion: v1\nkind: Namespace\nmetadata: {name: ns-2, annotations: {networking.istio.io/traffic-distribution: PreferClose}}\n".into(), vec![]),
            (
                "a ServiceEntry",
                "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: web, namespace: ns-1}\nspec:\n  hosts: [web.ns-1.svc.cluster.local]\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  resolution: STATIC\n  endpoints: [{address: 10.3.0.1}]\n".into(),
                vec![],
            ),
            // The Kubernetes service gives its hostname up to the ServiceEntry.
            ("a service shadowing a ServiceEntry deleted", String::new(), vec![key(Kind::Service, "ns-1", "web")]),
        ];
    for (what, yaml, deleted) in steps {
        let changed = change(&mut store, &yaml, &deleted);
        let updated = ctx.update(&store, &changed, "v".into());
        let full = PushContext::build(&store, "v".into());
        assert!(
            updated == full,
            "{what}: the update differs from a full build"
        );
        if what == "an endpoint added" {
            let before = &ctx.services;
            let shared = updated
                .services
                .iter()
                .filter(|(h, s)| before.get(*h).is_some_and(|b| Arc::ptr_eq(b, s)))
                .count();
            assert_eq!(shared, updated.services.len() - 1, "only svc-4 rebuilt");
            assert!(Arc::ptr_eq(
                &updated.virtual_services,
                &ctx.virtual_services
            ));
        }
        if what == "a selected pod" {
            let entry = &updated.services["by-pod.internal"];
            assert_eq!(entry.endpoints.len(), 1, "{entry:?}");
        }
        if what == "an endpoint of the aliased service" {
            let aliased = &updated.services["svc-2.ns-2.svc.cluster.local"];
            assert_eq!(aliased.aliases.len(), 1, "{aliased:?}");
        }
        if what == "a ServiceEntry" {
            assert!(
                updated.services[web].kubernetes,
                "a Kubernetes service keeps its host"
            );
        }
        ctx = updated;
    }
    assert!(!ctx.services[web].kubernetes, "the ServiceEntry's host now");
}

#[test]
fn a_proxys_labels_and_locality_come_from_its_pod_its_node_or_its_metadata() {
    use crate::builders::{context, labeled, object};
    use crate::config::PodDef;
    let node = labeled(
        object("", "n1", Spec::Node),
        &[
            ("topology.kubernetes.io/region", "eu"),
            ("topology.kubernetes.io/zone", "eu-1b"),
        ],
    );
    let pod = PodDef {
        node_name: Some("n1".into()),
        ..PodDef::default()
    };
    let pod = labeled(object("shop", "web-1", Spec::Pod(pod)), &[("app", "web")]);
    let ctx = context([node, pod]);
    let proxy = |pod: &str, labels: serde_json::Value| {
        let meta = json!({ "LABELS": labels });
        Proxy::from_node(
            &format!("sidecar~10.0.0.1~{pod}.shop~shop.svc.cluster.local"),
            meta.as_object().unwrap(),
        )
        .unwrap()
    };
    let at = |p: &Proxy| {
        let l = ctx.proxy_locality(p);
        format!("{}/{}/{}", l.region, l.zone, l.subzone)
    };
    // The Pod on Node n1: the Node's topology labels.
    let mut p = proxy("web-1", json!({}));
    assert_eq!(at(&p), "eu/eu-1b/");
    // Envoy's node locality wins.
    p.locality = Locality::parse("us/us-1a/r1");
    assert_eq!(at(&p), "us/us-1a/r1");
    // No Pod known: the `istio-locality` label, else nowhere.
    assert_eq!(
        at(&proxy("web-2", json!({"istio-locality": "ap.ap-1c"}))),
        "ap/ap-1c/"
    );
    assert_eq!(at(&proxy("web-2", json!({}))), "//");
    // Its labels are its Pod's when the Pod is known, else its metadata's.
    let labels = |p: &Proxy| ctx.proxy_labels(p).get("app").cloned();
    assert_eq!(
        labels(&proxy("web-1", json!({"app": "stale"}))).unwrap(),
        "web"
    );
    assert_eq!(
        labels(&proxy("web-2", json!({"app": "own"}))).unwrap(),
        "own"
    );
}

#[test]
fn a_change_names_the_proxies_it_can_affect() {
    use crate::builders::{context, object, sidecar};
    use api::networking::{IstioEgressListener, SidecarSpec};
    let scope = SidecarSpec {
        egress: vec![IstioEgressListener {
            hosts: vec!["./*".into(), "istio-system/*".into()],
            ..IstioEgressListener::default()
        }],
        ..SidecarSpec::default()
    };
    let ctx = context([object("shop", "default", Spec::Sidecar(scope))]);
    let scoped = sidecar("shop", "web-1", "10.0.0.1", &[("app", "web")]);
    let open = sidecar("lab", "web-1", "10.0.0.2", &[("app", "web")]);
    let meta = json!({"LABELS": {"app": "web"}});
    let router = Proxy::from_node(
        "router~10.0.0.3~gw-1.istio-system~istio-system.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap();

    let vs_elsewhere = key(Kind::VirtualService, "billing", "x");
    assert!(
        !ctx.affects(&scoped, [&vs_elsewhere]),
        "outside the Sidecar's egress scope"
    );
    assert!(
        ctx.affects(&open, [&vs_elsewhere]),
        "no Sidecar: everything is in scope"
    );
    assert!(ctx.affects(&scoped, [&key(Kind::VirtualService, "shop", "x")]));
    let unrelated = [
        key(Kind::VirtualService, "billing", "a"),
        key(Kind::Gateway, "shop", "gw"),
    ];
    assert!(
        !ctx.affects(&scoped, &unrelated),
        "no key of the set reaches it"
    );
    let shop = key(Kind::VirtualService, "shop", "x");
    assert!(
        ctx.affects(&scoped, unrelated.iter().chain([&shop])),
        "one key of the set does"
    );
    assert!(ctx.affects(&scoped, [&key(Kind::EndpointSlice, "istio-system", "x")]));
    assert!(!ctx.affects(&scoped, [&key(Kind::Sidecar, "lab", "default")]));
    assert!(ctx.affects(&open, [&key(Kind::Sidecar, "lab", "default")]));
    assert!(!ctx.affects(&scoped, [&key(Kind::Gateway, "shop", "gw")]));
    assert!(ctx.affects(&router, [&key(Kind::Gateway, "shop", "gw")]));
    assert!(
        ctx.affects(&scoped, [&key(Kind::DestinationRule, "billing", "x")]),
        "found by host from anywhere"
    );
    assert!(
        ctx.affects(&scoped, [&key(Kind::Pod, "shop", "web-1")]),
        "its own labels"
    );
    assert!(!ctx.affects(&scoped, [&key(Kind::Pod, "billing", "other")]));
    assert!(
        !ctx.affects(&open, [&key(Kind::AuthorizationPolicy, "billing", "x")]),
        "another namespace's policy"
    );
    assert!(ctx.affects(&open, [&key(Kind::AuthorizationPolicy, "lab", "x")]));
    assert!(
        ctx.affects(&open, [&key(Kind::PeerAuthentication, "istio-system", "x")]),
        "mesh-wide"
    );
    assert!(!ctx.affects(
        &router,
        [&key(Kind::PeerAuthentication, "istio-system", "x")]
    ));
}

#[test]
fn clusters_without_endpoints_are_the_ports_and_subsets_no_endpoint_serves() {
    use crate::builders::{context, istio};
    let entry = |name: &str, spec| istio(Kind::ServiceEntry, "shop", name, spec);
    let ctx = context([
        entry(
            "db",
            json!({
                "hosts": ["db.example.com"],
                "resolution": "STATIC",
                "ports": [{"number": 5432, "name": "tcp", "protocol": "TCP"}],
                "endpoints": [{"address": "10.0.0.1", "labels": {"version": "v1"}}],
            }),
        ),
        entry(
            "empty",
            json!({
                "hosts": ["empty.example.com"],
                "resolution": "STATIC",
                "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            }),
        ),
        entry(
            "dns",
            json!({
                "hosts": ["dns.example.com"],
                "resolution": "DNS",
                "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}],
            }),
        ),
        istio(
            Kind::DestinationRule,
            "shop",
            "db",
            json!({
                "host": "db.example.com",
                "subsets": [
                    {"name": "v1", "labels": {"version": "v1"}},
                    {"name": "v2", "labels": {"version": "v2"}},
                ],
            }),
        ),
    ]);
    assert_eq!(
        ctx.clusters_without_endpoints(),
        [
            "outbound|5432|v2|db.example.com",
            "outbound|80||empty.example.com",
        ],
        "a DNS service has no load assignment to be empty"
    );
}

#[test]
fn a_services_endpoints_come_from_its_slices_with_their_pods_labels() {
    use crate::builders::{context, endpoints, pod, service, sidecar};
    let version_v1 = [("app", "reviews"), ("version", "v1")];
    let ctx = context([
        service("shop", "reviews", "10.96.0.10")
            .port("http", 9080)
            .selector("app", "reviews")
            .build(),
        endpoints("shop", "reviews")
            .port("http", 9080)
            .ready("10.1.0.1", Some("reviews-v1"))
            .ready("10.1.0.2", None)
            .build(),
        pod("shop", "reviews-v1", "10.1.0.1", &version_v1),
    ]);
    let proxy = sidecar("shop", "web-1", "10.1.9.9", &[("app", "web")]);
    let svc = ctx
        .service_for(&proxy, "reviews.shop.svc.cluster.local")
        .expect("reviews is in scope");
    assert_eq!(svc.ports[0].port, 9080);
    let mut endpoints: Vec<(&str, Option<&str>)> = svc
        .endpoints
        .iter()
        .map(|e| {
            (
                e.address.as_str(),
                e.labels.get("version").map(String::as_str),
            )
        })
        .collect();
    endpoints.sort();
    assert_eq!(endpoints, [("10.1.0.1", Some("v1")), ("10.1.0.2", None)]);
}

#[test]
fn every_host_of_a_service_entry_has_all_its_endpoints() {
    let ctx = PushContext::from_yaml(
        r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: pool, namespace: shop}
spec:
  hosts: [a.pool.internal, b.pool.internal, c.pool.internal]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  location: MESH_INTERNAL
  endpoints: [{address: 10.1.0.1}, {address: 10.1.0.2}]
"#,
    );
    for host in ["a.pool.internal", "b.pool.internal", "c.pool.internal"] {
        let addresses: Vec<&str> = (ctx.services[host].endpoints.iter())
            .map(|e| e.address.as_str())
            .collect();
        assert_eq!(addresses, ["10.1.0.1", "10.1.0.2"], "{host}");
    }
}
