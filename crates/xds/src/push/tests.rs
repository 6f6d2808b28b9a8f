use super::*;
use model::config::Kind;

/// After a push that changed endpoints only, a proxy's view shares the listeners,
/// routes and secrets of its view of the push before, and is still exactly the view
/// translated from scratch; a sidecar's not when a service's workload ports moved
/// (its inbound listeners follow them), and no view after any other change.
#[test]
fn a_view_after_an_endpoint_change_keeps_its_listeners_and_routes() {
    use model::config::parse::parse_file;
    use model::testmesh::{Load, Shape};
    let shape = Shape::new(20, 4, 2);
    let mut store = shape.store();
    let apply = |store: &mut Store, yaml: &str| -> BTreeSet<ObjectKey> {
        let mut keys = BTreeSet::new();
        for o in parse_file("change.yaml", yaml).objects {
            let key = o.key.clone();
            if store.apply(o) {
                keys.insert(key);
            }
        }
        keys
    };
    let bound: String = (0..20).map(|i| shape.gateway_routing_yaml(i)).collect();
    apply(&mut store, &bound);
    // svc-4 names its targetPort: its endpoints say where it reaches its workloads.
    let named = |yaml: String| {
        yaml.replacen(
            "ports: [{name: http, port: 8080}]",
            "ports: [{name: http, port: 8080, targetPort: web}]",
            1,
        )
    };
    apply(&mut store, &named(shape.service_yaml(4, None)));
    let cache = Arc::new(ResourceCache::default());
    let first = Push::new(
        PushContext::build(&store, "v/1".into()),
        1,
        Instant::now(),
        None,
        cache.clone(),
    );
    let next = |store: &Store, before: &Push, keys: BTreeSet<ObjectKey>| {
        assert!(!keys.is_empty());
        let ctx = before
            .context
            .update(store, &keys, format!("v/{}", before.number + 1));
        Push::new(
            ctx,
            before.number + 1,
            Instant::now(),
            Some(keys),
            cache.clone(),
        )
        .after(before)
    };
    let proxy = |id: &str, meta: serde_json::Value| {
        Proxy::from_node(id, meta.as_object().unwrap()).unwrap()
    };
    let gateway = proxy(
        "router~10.9.0.2~gw-0.istio-system~istio-system.svc.cluster.local",
        serde_json::json!({"NAMESPACE": "istio-system", "LABELS": {"istio": "ingressgateway"}}),
    );
    let sidecar = proxy(
        "sidecar~10.9.0.3~a-0.ns-1~ns-1.svc.cluster.local",
        serde_json::json!({"NAMESPACE": "ns-1", "LABELS": {"app": "a"}}),
    );
    let proxies = [&gateway, &sidecar];
    let before = proxies.map(|p| first.view(p));
    assert_eq!(before[0].all(TypeKind::Route).len(), 1);
    let as_fresh = |push: &Push, p: &Proxy, view: &View| {
        let fresh = cache::view(&push.context, p, &push.cache);
        crate::testing::assert_same_views(view, &fresh, &p.id);
    };
    let kept = [TypeKind::Listener, TypeKind::Route, TypeKind::Secret];

    // One endpoint added to svc-3.
    let keys = apply(&mut store, &shape.service_yaml(3, Some("10.200.0.1")));
    assert!(
        keys.iter().all(|k| k.kind == Kind::EndpointSlice),
        "{keys:?}"
    );
    let second = next(&store, &first, keys);
    let views = proxies.map(|p| second.view(p));
    for (i, p) in proxies.iter().enumerate() {
        for kind in kept {
            assert!(views[i].shares(&before[i], kind), "{kind:?} of {}", p.id);
        }
        as_fresh(&second, p, &views[i]);
        let eds = second.view_diff(&before[i], &views[i], TypeKind::Endpoint);
        assert_eq!(eds.changed.len(), 1, "svc-3's load assignment");
        let rds = second.view_diff(&before[i], &views[i], TypeKind::Route);
        assert!(rds.changed.is_empty());
    }

    // svc-4's endpoints move to another port: its workloads' port with them, so the
    // sidecar's view is translated again; the gateway's is still kept.
    let moved = named(shape.service_yaml(4, None)).replace(
        "ports: [{name: http, port: 8080}]\nendpoints",
        "ports: [{name: http, port: 9090}]\nendpoints",
    );
    let keys = apply(&mut store, &moved);
    assert!(keys.iter().all(|k| k.kind == Kind::EndpointSlice) && !keys.is_empty());
    let third = next(&store, &second, keys);
    let moved_views = proxies.map(|p| third.view(p));
    assert!(moved_views[0].shares(&views[0], TypeKind::Route));
    assert!(!moved_views[1].shares(&views[1], TypeKind::Listener));
    for (i, p) in proxies.iter().enumerate() {
        as_fresh(&third, p, &moved_views[i]);
    }

    // A VirtualService change: the routes are translated again.
    let keys = apply(
        &mut store,
        &shape.gateway_routing_yaml(3).replace("/api", "/v2"),
    );
    let fourth = next(&store, &third, keys);
    let changed = fourth.view(&gateway);
    assert!(!changed.shares(&moved_views[0], TypeKind::Route));
    let rds = fourth.view_diff(&moved_views[0], &changed, TypeKind::Route);
    assert_eq!(rds.changed.len(), 1, "http.80");
}

#[test]
fn proxies_on_two_networks_share_a_view_only_without_network_gateways() {
    let entry = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: api, namespace: shop}\nspec:\n  hosts: [api.example.com]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  endpoints: [{address: 10.0.0.2, network: net-b, labels: {security.istio.io/tlsMode: istio}}]\n";
    let gateway = "---\napiVersion: v1\nkind: Service\nmetadata: {name: eastwest, namespace: istio-system, labels: {topology.istio.io/network: net-b}}\nspec: {externalIPs: [192.0.2.1], ports: [{name: tls, port: 15443}]}\n";
    let on = |network: &str| {
        let meta = serde_json::json!({"NAMESPACE": "shop", "NETWORK": network});
        Proxy::from_node(
            "sidecar~10.9.0.1~p-0.shop~shop.svc.cluster.local",
            meta.as_object().unwrap(),
        )
        .unwrap()
    };
    let (a, b) = (on("net-a"), on("net-b"));
    let push = |yaml: &str| {
        let ctx = PushContext::from_yaml(yaml);
        Push::new(ctx, 1, Instant::now(), None, Arc::default())
    };
    let single = push(entry);
    assert!(Arc::ptr_eq(&single.view(&a), &single.view(&b)));
    let multi = push(&format!("{entry}{gateway}"));
    assert!(!Arc::ptr_eq(&multi.view(&a), &multi.view(&b)));
    assert!(Arc::ptr_eq(&multi.view(&a), &multi.view(&on("net-a"))));
    // A network view sets a proxy apart, with or without gateways.
    let mut viewing = on("net-a");
    viewing.network_view = Some(["net-a".to_string()].into());
    assert!(!Arc::ptr_eq(&single.view(&a), &single.view(&viewing)));
}

#[test]
fn gateways_share_a_view_only_with_the_same_topology_and_headers_of_their_own() {
    let gateway = "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: istio-system}\nspec:\n  selector: {istio: ingressgateway}\n  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]\n";
    let with = |proxy_config: serde_json::Value| {
        let meta = serde_json::json!({"NAMESPACE": "istio-system", "LABELS": {"istio": "ingressgateway"}, "PROXY_CONFIG": proxy_config});
        Proxy::from_node(
            "router~10.9.0.1~gw-0.istio-system~istio-system.svc.cluster.local",
            meta.as_object().unwrap(),
        )
        .unwrap()
    };
    let trusting =
        |hops: u32| with(serde_json::json!({"gatewayTopology": {"numTrustedProxies": hops}}));
    let push = Push::new(
        PushContext::from_yaml(gateway),
        1,
        Instant::now(),
        None,
        Arc::default(),
    );
    assert!(!Arc::ptr_eq(
        &push.view(&trusting(1)),
        &push.view(&trusting(2))
    ));
    assert!(Arc::ptr_eq(
        &push.view(&trusting(1)),
        &push.view(&trusting(1))
    ));
    // Nor with other proxy headers of their own.
    let serving =
        |name: &str| with(serde_json::json!({"proxyHeaders": {"server": {"value": name}}}));
    assert!(!Arc::ptr_eq(
        &push.view(&serving("a")),
        &push.view(&serving("b"))
    ));
    assert!(Arc::ptr_eq(
        &push.view(&serving("a")),
        &push.view(&serving("a"))
    ));
}

#[test]
fn a_service_preferring_the_same_node_sends_each_node_its_own_endpoint_first() {
    use envoy_api::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use envoy_api::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
    use prost::Message;
    let yaml = "apiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: shop}\nspec:\n  clusterIP: 10.96.0.9\n  trafficDistribution: PreferSameNode\n  ports: [{name: http, port: 80}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: api-1, namespace: shop, labels: {kubernetes.io/service-name: api}}\naddressType: IPv4\nports: [{name: http, port: 80}]\nendpoints:\n- {addresses: [10.0.0.1], nodeName: n1}\n- {addresses: [10.0.0.2], nodeName: n2}\n";
    let on = |node: &str| {
        let meta = serde_json::json!({"NAMESPACE": "shop", "NODE_NAME": node});
        Proxy::from_node(
            "sidecar~10.9.0.1~p-0.shop~shop.svc.cluster.local",
            meta.as_object().unwrap(),
        )
        .unwrap()
    };
    let push = Push::new(
        PushContext::from_yaml(yaml),
        1,
        Instant::now(),
        None,
        Arc::default(),
    );
    let first = |node: &str| -> Vec<String> {
        let view = push.view(&on(node));
        let cla = &view.all(TypeKind::Endpoint)["outbound|80||api.shop.svc.cluster.local"];
        let cla = ClusterLoadAssignment::decode(&*cla.value()).unwrap();
        (cla.endpoints.iter())
            .filter(|g| g.priority == 0)
            .flat_map(|g| &g.lb_endpoints)
            .filter_map(|e| match &e.host_identifier {
                Some(HostIdentifier::Endpoint(ep)) => Some(format!("{:?}", ep.address)),
                _ => None,
            })
            .collect()
    };
    let (n1, n2) = (first("n1"), first("n2"));
    assert!(n1.len() == 1 && n1[0].contains("10.0.0.1"), "{n1:?}");
    assert!(n2.len() == 1 && n2[0].contains("10.0.0.2"), "{n2:?}");
}

#[test]
fn rfc3339_dates_are_civil() {
    let s = rfc3339_now();
    assert_eq!(s.len(), 20, "{s}");
    assert!(s.starts_with("20") && s.ends_with('Z'));
    let at = |secs: u64, millis: u64| {
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(secs * 1000 + millis)
    };
    // Dates computed independently (Python's datetime).
    assert_eq!(
        rfc3339(at(1_795_779_000, 123), true),
        "2026-11-27T11:30:00.123Z"
    );
    assert_eq!(rfc3339(at(951_868_799, 0), false), "2000-02-29T23:59:59Z");
}

#[test]
fn settings_come_from_istios_variables() {
    let d = PushSettings::from_lookup(|_| None).unwrap();
    assert_eq!(
        (d.debounce_after, d.debounce_max, d.push_throttle),
        (Duration::from_millis(100), Duration::from_secs(10), 100)
    );
    let vars = |k: &str| match k {
        "PILOT_DEBOUNCE_AFTER" => Some("250ms".to_string()),
        "PILOT_DEBOUNCE_MAX" => Some("2s".to_string()),
        "PILOT_PUSH_THROTTLE" => Some("7".to_string()),
        "PILOT_XDS_SEND_TIMEOUT" => Some("1500ms".to_string()),
        "MESHD_XDS_SEND_BUFFER_MB" => Some("3".to_string()),
        _ => None,
    };
    let s = PushSettings::from_lookup(vars).unwrap();
    assert_eq!(
        (
            s.debounce_after,
            s.debounce_max,
            s.push_throttle,
            s.send_timeout
        ),
        (
            Duration::from_millis(250),
            Duration::from_secs(2),
            7,
            Some(Duration::from_millis(1500))
        )
    );
    assert_eq!(s.send_buffer, Some(3 << 20));
    assert_eq!(d.send_buffer, Some(256 << 20));
    assert!(d.eds_debounce, "Istio debounces EDS by default");
    // One variable set.
    let only = |name: &str, value: &str| {
        PushSettings::from_lookup(|k| (k == name).then(|| value.to_string()))
    };
    assert_eq!(
        only("PILOT_XDS_SEND_TIMEOUT", "0s").unwrap().send_timeout,
        None
    );
    assert_eq!(
        only("MESHD_XDS_SEND_BUFFER_MB", "0").unwrap().send_buffer,
        None
    );
    for (value, on) in [("false", false), ("0", false), ("True", true), ("t", true)] {
        let s = only("PILOT_ENABLE_EDS_DEBOUNCE", value).unwrap();
        assert_eq!(s.eds_debounce, on, "{value}");
    }
    assert!(
        d.ip_autoallocate,
        "istiod allocates ServiceEntry addresses by default"
    );
    assert!(
        !only("PILOT_ENABLE_IP_AUTOALLOCATE", "false")
            .unwrap()
            .ip_autoallocate
    );
    assert_eq!((d.max_streams, d.max_recv_msg_size), (100_000, 4 << 20));
    assert_eq!(only("ISTIO_GPRC_MAXSTREAMS", "7").unwrap().max_streams, 7);
    assert_eq!(
        only("ISTIO_GPRC_MAXRECVMSGSIZE", "1024")
            .unwrap()
            .max_recv_msg_size,
        1024
    );
    assert_eq!(
        only("MESHD_XDS_PENDING_CONNECTIONS", "0")
            .unwrap()
            .pending_connections,
        0
    );
    let auto = only("PILOT_PUSH_THROTTLE", "0").unwrap();
    assert!((20..=100).contains(&auto.push_throttle));
    for (name, bad) in [
        ("PILOT_DEBOUNCE_AFTER", "soon"),
        ("MESHD_XDS_SEND_BUFFER_MB", "256Mi"),
        ("PILOT_ENABLE_EDS_DEBOUNCE", "no"),
        ("PILOT_ENABLE_IP_AUTOALLOCATE", "maybe"),
        ("ISTIO_GPRC_MAXSTREAMS", "0"),
        ("ISTIO_GPRC_MAXRECVMSGSIZE", "4MB"),
        ("MESHD_XDS_PENDING_CONNECTIONS", "many"),
    ] {
        let err = only(name, bad).unwrap_err().to_string();
        assert!(err.contains(name), "{err}");
    }
}

fn key(i: usize) -> ObjectKey {
    ObjectKey {
        kind: Kind::VirtualService,
        namespace: "ns".into(),
        name: format!("vs-{i}"),
    }
}

/// Runs the debounce loop with the given settings; returns the event sender, the push
/// receiver and the metrics.
fn pipeline(
    after: Duration,
    max: Duration,
) -> (
    mpsc::UnboundedSender<ConfigEvent>,
    watch::Receiver<Arc<Push>>,
    PushMetrics,
) {
    pipeline_with(PushSettings {
        debounce_after: after,
        debounce_max: max,
        push_throttle: 1,
        ..PushSettings::default()
    })
}

fn pipeline_with(
    settings: PushSettings,
) -> (
    mpsc::UnboundedSender<ConfigEvent>,
    watch::Receiver<Arc<Push>>,
    PushMetrics,
) {
    let store = Arc::new(RwLock::new(Store::default()));
    let metrics = PushMetrics::unregistered();
    let first = build_push(
        &store,
        None,
        1,
        Instant::now(),
        None,
        &metrics,
        Arc::default(),
    );
    let (push_tx, push_rx) = watch::channel(Arc::new(first));
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(debounce_loop(
        rx,
        store,
        push_tx,
        settings,
        metrics.clone(),
        Arc::default(),
    ));
    (tx, push_rx, metrics)
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_changes_becomes_one_push_carrying_all_of_them() {
    let (tx, mut pushes, _m) = pipeline(Duration::from_millis(100), Duration::from_secs(10));
    for i in 0..5 {
        tx.send(ConfigEvent {
            at: Instant::now(),
            keys: vec![key(i)],
        })
        .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pushes.changed().await.unwrap();
    let push = pushes.borrow_and_update().clone();
    assert_eq!(push.number, 2);
    assert_eq!(push.changed.as_ref().unwrap().len(), 5);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!pushes.has_changed().unwrap(), "one burst, one push");
}

#[tokio::test(start_paused = true)]
async fn a_change_storm_still_pushes_every_debounce_max() {
    let (tx, mut pushes, _m) = pipeline(Duration::from_millis(100), Duration::from_millis(500));
    let storm = tokio::spawn(async move {
        for i in 0..100 {
            tx.send(ConfigEvent {
                at: Instant::now(),
                keys: vec![key(i)],
            })
            .unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await; // never quiet for 100ms
        }
    });
    let mut seen = 0;
    while seen < 3 {
        pushes.changed().await.unwrap();
        pushes.borrow_and_update();
        seen += 1;
    }
    assert!(
        !storm.is_finished(),
        "pushes happened during the storm, bounded by PILOT_DEBOUNCE_MAX"
    );
}

#[tokio::test(start_paused = true)]
async fn without_eds_debounce_an_endpoint_change_is_pushed_at_once() {
    let (tx, mut pushes, _m) = pipeline_with(PushSettings {
        eds_debounce: false,
        ..PushSettings::default()
    });
    let slice = |name: &str| ObjectKey {
        kind: Kind::EndpointSlice,
        namespace: "ns".into(),
        name: name.into(),
    };
    let send = |keys: Vec<ObjectKey>| {
        tx.send(ConfigEvent {
            at: Instant::now(),
            keys,
        })
        .unwrap()
    };
    let start = tokio::time::Instant::now();
    send(vec![slice("a")]);
    pushes.changed().await.unwrap();
    let push = pushes.borrow_and_update().clone();
    assert_eq!(push.changed.as_deref(), Some(&BTreeSet::from([slice("a")])));
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "not debounced"
    );
    // Any other change is debounced, and an endpoint change during its window goes
    // out with it.
    let start = tokio::time::Instant::now();
    send(vec![key(1)]);
    tokio::time::sleep(Duration::from_millis(20)).await;
    send(vec![slice("b")]);
    pushes.changed().await.unwrap();
    let push = pushes.borrow_and_update().clone();
    assert_eq!(
        push.changed.as_deref(),
        Some(&BTreeSet::from([key(1), slice("b")]))
    );
    assert!(start.elapsed() >= Duration::from_millis(120), "debounced");
    // By default, endpoint changes wait out the debounce as well.
    let (tx, mut pushes, _m) = pipeline(Duration::from_millis(100), Duration::from_secs(10));
    let start = tokio::time::Instant::now();
    tx.send(ConfigEvent {
        at: Instant::now(),
        keys: vec![slice("a")],
    })
    .unwrap();
    pushes.changed().await.unwrap();
    assert!(start.elapsed() >= Duration::from_millis(100), "debounced");
}

#[test]
fn proxies_of_other_meshes_or_service_clusters_share_a_view_only_while_nothing_traces() {
    let proxy = |mesh: &str, cluster: &str| {
        let meta = serde_json::json!({"NAMESPACE": "shop", "MESH_ID": mesh});
        let mut p = Proxy::from_node(
            "sidecar~10.9.0.1~p-0.shop~shop.svc.cluster.local",
            meta.as_object().unwrap(),
        )
        .unwrap();
        p.service_cluster = cluster.into();
        p
    };
    let (a, b, c) = (proxy("m1", "web"), proxy("m2", "web"), proxy("m1", "api"));
    let push = |mesh: &str| {
        let yaml = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n    {mesh}\n"
        );
        Push::new(
            PushContext::from_yaml(&yaml),
            1,
            Instant::now(),
            None,
            Arc::default(),
        )
    };
    let off = push("enableTracing: false");
    assert!(Arc::ptr_eq(&off.view(&a), &off.view(&b)));
    assert!(Arc::ptr_eq(&off.view(&a), &off.view(&c)));
    let on = push("enableTracing: true");
    assert!(!Arc::ptr_eq(&on.view(&a), &on.view(&b)));
    assert!(!Arc::ptr_eq(&on.view(&a), &on.view(&c)));
    assert!(Arc::ptr_eq(&on.view(&a), &on.view(&proxy("m1", "web"))));
}

#[test]
fn every_variable_the_push_settings_read_is_documented() {
    let asked = std::cell::RefCell::new(Vec::new());
    PushSettings::from_lookup(|name| {
        asked.borrow_mut().push(name.to_string());
        None
    })
    .unwrap();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let asked = asked.into_inner();
    assert!(asked.len() >= 10, "{asked:?}");
    for name in asked {
        assert!(
            doc.contains(&format!("`{name}`")),
            "{name} is not in docs/configuration.md"
        );
    }
}
