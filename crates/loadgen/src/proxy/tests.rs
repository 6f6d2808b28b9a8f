use envoy_api::pb::envoy::service::discovery::v3::Resource;

use super::*;
use crate::response::Encoded;

/// A `Resource` as meshd encodes it, without a body.
fn encoded(name: &str, version: &str) -> Encoded {
    let raw = Resource {
        name: name.into(),
        version: version.into(),
        ..Default::default()
    }
    .encode_to_vec();
    Bytes::from(raw).into()
}

#[test]
fn proxies_sent_the_same_first_answer_share_it_and_keep_only_their_changes() {
    let answer = |held: &[(&str, &str)], removed: &[&str]| DeltaResponse {
        type_url: CLUSTER_TYPE.into(),
        resources: (held.iter())
            .map(|(name, version)| encoded(name, version))
            .collect(),
        removed_resources: removed.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    };
    let sorted = |h: &Holding| {
        let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
        let mut v: Vec<(String, String)> = (h.iter()).map(|(n, v)| (text(n), text(v))).collect();
        v.sort();
        v
    };
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    };
    let first = [
        ("BlackHoleCluster", "1"),
        ("outbound|80||a.shared-test", "1"),
        ("outbound|80||b.shared-test", "1"),
    ];
    let (mut p, mut q) = (Holding::default(), Holding::default());
    p.learn(&answer(&first, &[]));
    q.learn(&answer(&first, &[]));
    assert!(Arc::ptr_eq(
        p.first.as_ref().unwrap(),
        q.first.as_ref().unwrap()
    ));
    // One proxy's changes are its own.
    p.learn(&answer(
        &[
            ("outbound|80||a.shared-test", "2"),
            ("outbound|80||c.shared-test", "1"),
        ],
        &["outbound|80||b.shared-test", "never-held"],
    ));
    assert_eq!(
        sorted(&p),
        pairs(&[
            ("BlackHoleCluster", "1"),
            ("outbound|80||a.shared-test", "2"),
            ("outbound|80||c.shared-test", "1"),
        ])
    );
    assert_eq!(sorted(&q), pairs(&first));
    // A different first answer is a map of its own.
    let mut r = Holding::default();
    r.learn(&answer(&[("outbound|80||a.shared-test", "9")], &[]));
    assert!(!Arc::ptr_eq(
        p.first.as_ref().unwrap(),
        r.first.as_ref().unwrap()
    ));
    // On a new stream the proxy names what it holds, and asks EDS for its clusters.
    let held = Held {
        versions: [(CLUSTER_TYPE.to_string(), p)].into(),
        names: Names::default(),
    };
    let cds = held.request(CLUSTER_TYPE);
    let mut versions: Vec<(String, String)> = cds.initial_resource_versions.into_iter().collect();
    versions.sort();
    assert_eq!(versions, sorted(&held.versions[CLUSTER_TYPE]));
    let mut eds = held.request(ENDPOINT_TYPE);
    eds.resource_names_subscribe.sort();
    assert_eq!(
        eds.resource_names_subscribe,
        ["outbound|80||a.shared-test", "outbound|80||c.shared-test"]
    );
    assert!(eds.initial_resource_versions.is_empty());
}

#[test]
fn a_delta_proxy_unsubscribes_from_the_endpoints_of_a_removed_cluster() {
    let answer = |type_url: &str, held: &[&str], removed: &[&str]| DeltaResponse {
        type_url: type_url.into(),
        resources: held.iter().map(|name| encoded(name, "1")).collect(),
        removed_resources: removed.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    };
    let (a, b) = ("outbound|80||a.removed-test", "outbound|80||b.removed-test");
    let mut held = Held {
        versions: BTreeMap::new(),
        names: Names::default(),
    };
    let cds = answer(CLUSTER_TYPE, &[a, b, "BlackHoleCluster"], &[]);
    let eds = answer(ENDPOINT_TYPE, &[a, b], &[]);
    for resp in [&cds, &eds] {
        assert!(Held::endpoints_of_removed_clusters(&mut held.versions, resp).is_empty());
        Held::learn(&mut held.versions, resp);
    }
    // b goes, with a cluster that needs no endpoints and one never held.
    let removal = answer(
        CLUSTER_TYPE,
        &[],
        &[b, "BlackHoleCluster", "outbound|80||x"],
    );
    let gone = Held::endpoints_of_removed_clusters(&mut held.versions, &removal);
    assert_eq!(gone, [b]);
    Held::learn(&mut held.versions, &removal);
    // A new stream neither subscribes to b's endpoints nor says it holds them.
    let request = held.request(ENDPOINT_TYPE);
    assert_eq!(request.resource_names_subscribe, [a]);
    assert_eq!(
        request.initial_resource_versions.keys().collect::<Vec<_>>(),
        [a]
    );
    // Removed again: nothing more to unsubscribe.
    assert!(Held::endpoints_of_removed_clusters(&mut held.versions, &removal).is_empty());
}

#[test]
fn a_delta_proxy_asks_for_new_clusters_endpoints_without_listing_them() {
    let empty = Body::Whole(b"");
    let cds: [(&[u8], Body); 3] = [
        (b"outbound|80||a.asking-test", empty),
        (b"outbound|80||b.asking-test", empty),
        (b"BlackHoleCluster", empty),
    ];
    let wanted = ["outbound|80||a.asking-test", "outbound|80||b.asking-test"];
    // Delta, first CDS answer: nothing held yet, nothing listed.
    let mut delta = Names::default();
    let (eds, _, _) = delta.learn(CLUSTER_TYPE, cds, Asking::Held(None));
    assert_eq!(eds, wanted);
    assert!(
        delta.clusters.is_empty(),
        "a delta proxy keeps no list of names"
    );
    // Holding them, a later answer asks only for the cluster that is new.
    let mut held = Holding::default();
    held.learn(&DeltaResponse {
        type_url: CLUSTER_TYPE.into(),
        resources: (cds.iter())
            .map(|(name, _)| encoded(std::str::from_utf8(name).unwrap(), "1"))
            .collect(),
        ..Default::default()
    });
    let later: [(&[u8], Body); 2] = [(cds[0].0, empty), (b"outbound|80||c.asking-test", empty)];
    let (eds, _, _) = delta.learn(CLUSTER_TYPE, later, Asking::Held(Some(&held)));
    assert_eq!(eds, ["outbound|80||c.asking-test"]);
    assert!(delta.clusters.is_empty());
    // State of the world lists what it asks for, and asks once.
    let mut sotw = Names::default();
    assert_eq!(sotw.learn(CLUSTER_TYPE, cds, Asking::Listed).0, wanted);
    assert_eq!(sotw.clusters.len(), 2);
    assert!(sotw.learn(CLUSTER_TYPE, cds, Asking::Listed).0.is_empty());
    // A cluster left out of the next answer is no longer asked for, once.
    let next = [cds[0].0, cds[2].0];
    assert!(sotw.keep_clusters(next));
    assert_eq!(sotw.clusters, BTreeSet::from([wanted[0].to_string()]));
    assert!(!sotw.keep_clusters(next));
}
