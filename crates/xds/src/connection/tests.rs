use super::*;
use model::config::Kind;

#[test]
fn sync_status_shows_the_proxys_names_its_types_and_istiods_nonce_fields() {
    let meta =
        serde_json::json!({"NAMESPACE": "shop", "CLUSTER_ID": "east", "ISTIO_VERSION": "1.28.0"});
    let proxy = Proxy::from_node(
        "sidecar~10.1.2.3~reviews-0.shop~shop.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap();
    let mut status = SyncStatus {
        number: 7,
        delta: true,
        types: Default::default(),
        in_sync_push: 3,
        model: Arc::new(proxy),
        transport: None,
        route_names: None,
    };
    let rds = status.of(TypeKind::Route);
    rds.nonce_sent = "3-2".into();
    rds.version_sent = "v/3".into();
    let cds = status.of(TypeKind::Cluster);
    cds.responses = 1;
    (cds.nonce_sent, cds.nonce_acked) = ("3-1".into(), "3-1".into());
    let shown = serde_json::to_value(&status).unwrap();
    assert_eq!(
        shown,
        serde_json::json!({
            "connection_id": "sidecar~10.1.2.3~reviews-0.shop~shop.svc.cluster.local-7",
            "proxy": "sidecar~10.1.2.3~reviews-0.shop~shop.svc.cluster.local",
            "proxy_type": "sidecar",
            "namespace": "shop",
            "cluster_id": "east",
            "istio_version": "1.28.0",
            "cluster_sent": "3-1",
            "cluster_acked": "3-1",
            "route_sent": "3-2",
            "delta": true,
            "in_sync_push": 3,
            "types": {
                "cds": {"nonce_sent": "3-1", "nonce_acked": "3-1", "version_sent": "", "version_acked": "",
                        "responses": 1, "resources": 0, "rejects": 0, "rejected": false, "last_error": null},
                "rds": {"nonce_sent": "3-2", "nonce_acked": "", "version_sent": "v/3", "version_acked": "",
                        "responses": 0, "resources": 0, "rejects": 0, "rejected": false, "last_error": null},
            },
        })
    );
}

fn vs(name: &str) -> ObjectKey {
    ObjectKey {
        kind: Kind::VirtualService,
        namespace: "shop".into(),
        name: name.into(),
    }
}

/// A connection that subscribed to CDS (wildcard) and to every load assignment, and
/// was sent all of them from the first push.
fn synced(shared: &Arc<XdsShared>) -> Connection {
    let meta = serde_json::json!({"NAMESPACE": "ns-1", "LABELS": {"app": "a"}});
    let proxy = Proxy::from_node(
        "sidecar~10.9.0.1~a-0.ns-1~ns-1.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap();
    let mut conn = Connection::new(shared.clone(), proxy, true);
    let view = conn.view();
    for kind in [TypeKind::Cluster, TypeKind::Endpoint] {
        let w = &mut conn.watches[kind as usize];
        w.subscribed = true;
        w.wildcard = kind == TypeKind::Cluster;
        if kind == TypeKind::Endpoint {
            w.names = view.all(kind).values().map(|r| r.name.clone()).collect();
        }
        let (changed, removed) = conn.diff(&view, kind);
        conn.record_sent(kind, &Batch::from(changed), &removed, false, None);
        conn.settle_basis(&view, kind, false);
        assert!(conn.watches[kind as usize].basis.is_some(), "{kind:?}");
    }
    conn
}

#[test]
fn a_proxy_holding_an_earlier_view_gets_the_views_difference_computed_once() {
    use crate::testing;
    use model::testmesh::{Load, Shape};
    let shape = Shape::new(30, 3, 2);
    let mut store = shape.store();
    let pushes = testing::Pushes::default();
    let (tx, rx) = tokio::sync::watch::channel(pushes.build(&store, 1));
    let shared = testing::shared(rx);
    let (mut a, mut b) = (synced(&shared), synced(&shared));

    // One endpoint added to svc-4.
    let parsed =
        model::config::parse::parse_file("c.yaml", &shape.service_yaml(4, Some("10.200.0.1")));
    for o in parsed.objects {
        store.apply(o);
    }
    let next = pushes.build(&store, 2);
    tx.send_replace(next.clone());
    a.push = next.clone();
    b.push = next.clone();
    let view = a.view();
    let (changed, removed) = a.diff_from_basis(&view, TypeKind::Endpoint).unwrap();
    assert_eq!(
        (
            changed.iter().map(|r| &*r.name).collect::<Vec<_>>(),
            removed.len()
        ),
        (vec!["outbound|8080||svc-4.ns-1.svc.cluster.local"], 0)
    );
    let full = a.diff(&view, TypeKind::Endpoint);
    assert_eq!(
        (changed.to_vec(), removed),
        full,
        "the same as comparing every name"
    );
    let (changed, removed) = a.diff_from_basis(&view, TypeKind::Cluster).unwrap();
    assert_eq!(
        (changed.to_vec(), removed),
        a.diff(&view, TypeKind::Cluster)
    );
    // The second proxy takes the same step: the same, shared difference.
    let d = next.view_diff(
        a.watches[1].basis.as_ref().unwrap(),
        &view,
        TypeKind::Endpoint,
    );
    let again = next.view_diff(
        b.watches[1].basis.as_ref().unwrap(),
        &b.view(),
        TypeKind::Endpoint,
    );
    assert!(Arc::ptr_eq(&d, &again));

    // A forced name (EDS after its cluster changed) or a new subscription: in full.
    b.watches[1].force.insert(
        view.all(TypeKind::Endpoint)
            .values()
            .next()
            .unwrap()
            .name
            .clone(),
    );
    assert!(b.diff_from_basis(&view, TypeKind::Endpoint).is_none());
    // Synced watches are compact: no per-resource maps, the basis view stands in.
    let eds = &a.watches[TypeKind::Endpoint as usize];
    assert!(eds.compact && eds.sent.is_empty() && eds.names.is_empty());
    assert_eq!(a.diff(&view, TypeKind::Endpoint), full);
    // Anything but a view step gives the watch its maps back, equal to the view's.
    a.materialize(TypeKind::Endpoint);
    let eds = &a.watches[TypeKind::Endpoint as usize];
    let basis = eds.basis.clone().unwrap();
    assert_eq!(eds.sent.len(), basis.all(TypeKind::Endpoint).len());
    assert_eq!(eds.names.len(), eds.sent.len());
    assert_eq!(a.diff(&view, TypeKind::Endpoint), full);
    a.record_sent(TypeKind::Endpoint, &Batch::default(), &[], false, None);
    assert!(
        a.diff_from_basis(&view, TypeKind::Endpoint).is_none(),
        "sent again: no basis"
    );
}

/// A snapshot written by hand: one view for every proxy, and a count of the
/// differences it was asked for.
struct Scripted {
    number: u64,
    view: Arc<View>,
    diffs: std::sync::atomic::AtomicUsize,
}

impl Scripted {
    /// Snapshot `number`, whose view holds a cluster of each name.
    fn new(number: u64, clusters: &[&str]) -> Arc<Scripted> {
        use envoy_api::pb::envoy::config::cluster::v3::Cluster;
        let config = translate::ProxyConfig {
            clusters: (clusters.iter())
                .map(|name| Cluster {
                    name: name.to_string(),
                    ..Cluster::default()
                })
                .collect(),
            ..translate::ProxyConfig::default()
        };
        Arc::new(Scripted {
            number,
            view: Arc::new(View::new(config)),
            diffs: Default::default(),
        })
    }
}

impl Snapshot for Scripted {
    fn number(&self) -> u64 {
        self.number
    }
    fn version(&self) -> Arc<str> {
        format!("scripted/{}", self.number).into()
    }
    fn triggered_at(&self) -> Instant {
        Instant::now()
    }
    fn changed_since(&self, _: Option<u64>) -> Option<Vec<ChangeSet>> {
        None
    }
    fn view(&self, _: &Proxy) -> Arc<View> {
        self.view.clone()
    }
    fn view_diff(
        &self,
        from: &Arc<View>,
        to: &Arc<View>,
        kind: TypeKind,
    ) -> Arc<crate::push::ViewDiff> {
        self.diffs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Arc::new(crate::push::ViewDiff::between(from.all(kind), to.all(kind)))
    }
}

#[test]
fn a_connection_is_brought_from_snapshot_to_snapshot_by_their_views_alone() {
    let pushes = crate::testing::Pushes::default();
    let (_tx, rx) = tokio::sync::watch::channel(pushes.build(&Default::default(), 1));
    let shared = crate::testing::shared(rx);
    let mut conn = synced(&shared);
    let cds = TypeKind::Cluster;
    let first = Scripted::new(7, &["a", "b"]);
    conn.push = first.clone();
    let view = conn.view();
    // In full, not as a step from the basis: the watch gets its maps back first.
    conn.materialize(cds);
    let (changed, removed) = conn.diff(&view, cds);
    assert_eq!(
        changed.len(),
        2,
        "a new snapshot's view replaces the push's"
    );
    assert_eq!(
        removed.len(),
        shared.current_push().view(&conn.proxy).all(cds).len()
    );
    let nonce = conn.record_sent(cds, &Batch::from(changed), &removed, false, None);
    assert!(nonce.starts_with("7-"), "{nonce}");
    conn.settle_basis(&view, cds, false);

    let second = Scripted::new(8, &["b", "c"]);
    conn.push = second.clone();
    let next = conn.view();
    let (changed, removed) = conn.diff_from_basis(&next, cds).unwrap();
    let names: Vec<&str> = changed.iter().map(|r| &*r.name).collect();
    assert_eq!((names, removed), (vec!["c"], vec!["a".to_string()]));
    assert_eq!(
        second.diffs.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "the step is the snapshot's difference"
    );
    assert_eq!(first.diffs.load(std::sync::atomic::Ordering::Relaxed), 0);
    let status = serde_json::to_value(&*conn.status.lock().unwrap()).unwrap();
    assert_eq!(status["types"]["cds"]["version_sent"], "scripted/7");
}

#[test]
fn a_connection_that_skipped_a_push_blames_the_skipped_pushs_change() {
    use crate::push::Push;
    use model::testmesh::{Load, Shape};
    let store = Shape::new(3, 1, 1).store();
    let cache = Arc::new(crate::cache::ResourceCache::default());
    let push = |n: u64, changed: Option<ObjectKey>, previous: Option<&Push>| {
        let ctx = model::PushContext::build(&store, format!("v/{n}"));
        let p = Push::new(
            ctx,
            n,
            Instant::now(),
            changed.map(|k| [k].into()),
            cache.clone(),
        );
        Arc::new(match previous {
            Some(prev) => p.after(prev),
            None => p,
        })
    };
    let first = push(1, None, None);
    let (_tx, rx) = tokio::sync::watch::channel(first.clone());
    let shared = crate::testing::shared(rx);
    let mut conn = synced(&shared);
    conn.record_ack(TypeKind::Endpoint, "any");
    // Push 2 changes `big`; the connection is busy and next sees push 3 (`other`).
    let second = push(2, Some(vs("big")), Some(&first));
    let third = push(3, Some(vs("other")), Some(&second));
    conn.push = third.clone();
    conn.record_sent(TypeKind::Endpoint, &Batch::default(), &[], false, None);
    let suspects = &conn.watches[TypeKind::Endpoint as usize].unacked;
    assert_eq!(
        suspects.blame(vec![vs("big"), vs("front")]),
        vec![vs("big")]
    );
    // A push whose change (`front`) altered nothing the proxy holds, then `big`: the
    // rejected response carries `big` only.
    conn.record_ack(TypeKind::Endpoint, "any");
    let fourth = push(4, Some(vs("front")), Some(&third));
    conn.push = fourth.clone();
    conn.caught_up();
    conn.push = push(5, Some(vs("big")), Some(&fourth));
    conn.record_sent(TypeKind::Endpoint, &Batch::default(), &[], false, None);
    let suspects = &conn.watches[TypeKind::Endpoint as usize].unacked;
    assert_eq!(
        suspects.blame(vec![vs("big"), vs("front")]),
        vec![vs("big")]
    );
    // A jump past what pushes remember, or from a full push, is unknown: all origins.
    assert_eq!(third.changed_since(Some(0)), None);
    assert_eq!(third.changed_since(None), None);
    assert_eq!(third.changed_since(Some(3)).unwrap().len(), 1, "its own");
    let mut newest = third;
    for n in 4..(4 + crate::push::RECENT_PUSHES as u64) {
        newest = push(n, Some(vs("other")), Some(&newest));
    }
    assert_eq!(newest.changed_since(Some(1)), None, "forgotten");
    assert!(newest.changed_since(Some(2)).is_some());
}

fn changes(key: ObjectKey) -> Option<Vec<ChangeSet>> {
    Some(vec![Arc::new(BTreeSet::from([key]))])
}

#[test]
fn a_nack_blames_what_changed_since_the_last_ack_even_after_a_later_push() {
    let mut s = Suspects::default();
    s.add("1", changes(vs("big")));
    // A later, unrelated push reaches the connection before the NACK does.
    s.add("2", changes(vs("elsewhere")));
    assert_eq!(s.blame(vec![vs("big"), vs("front")]), vec![vs("big")]);
    // Nothing known changed among the origins: all of them are named.
    assert_eq!(
        s.blame(vec![vs("front"), vs("other")]),
        vec![vs("front"), vs("other")]
    );
    s.add("3", None);
    assert_eq!(
        s.blame(vec![vs("big"), vs("front")]),
        vec![vs("big"), vs("front")]
    );
}

#[test]
fn an_ack_of_an_older_response_clears_what_that_response_carried() {
    let mut s = Suspects::default();
    // The first (full) push and a change to `front`, then `big` is sent before the
    // proxy's ACK of the `front` response arrives.
    s.add("1", None);
    s.add("2", changes(vs("front")));
    s.add("3", changes(vs("big")));
    s.accepted("2");
    assert_eq!(s.blame(vec![vs("big"), vs("front")]), vec![vs("big")]);
    s.accepted("unknown");
    assert_eq!(s.blame(vec![vs("big"), vs("front")]), vec![vs("big")]);
    // A proxy that never answers: past the bound, the blame is unknown again.
    for n in 4..(4 + MAX_PENDING) {
        s.add(&n.to_string(), changes(vs("big")));
    }
    assert_eq!(
        s.blame(vec![vs("big"), vs("front")]),
        vec![vs("big"), vs("front")]
    );
}
