use super::*;
use crate::builders::{
    endpoints, labeled, legacy_endpoints, namespace, object, pod_with_account, service,
};
use crate::config::{ConfigObject, SliceEndpoint};

fn services(objects: Vec<ConfigObject>) -> imbl::OrdMap<String, Arc<Service>> {
    let store: Store = objects.into_iter().collect();
    build_services(&store, &MeshConfig::from_store(&store)).0
}

#[test]
fn traffic_distribution_comes_from_the_spec_else_the_annotation() {
    let svc = |name: &str| service("shop", name, "10.0.0.9").port("http", 80);
    let annotation = "networking.istio.io/traffic-distribution";
    let all = services(vec![
        svc("close").traffic_distribution("PreferClose").build(),
        (svc("node").traffic_distribution("PreferSameNode"))
            .annotation(annotation, "PreferClose")
            .build(),
        svc("noted")
            .annotation(annotation, "prefersamezone")
            .build(),
        svc("any").traffic_distribution("Nearby").build(),
    ]);
    let of = |name: &str| all[&format!("{name}.shop.svc.cluster.local")].traffic_distribution;
    assert_eq!(of("close"), TrafficDistribution::PreferSameZone);
    assert_eq!(
        of("node"),
        TrafficDistribution::PreferSameNode,
        "the spec wins"
    );
    assert_eq!(of("noted"), TrafficDistribution::PreferSameZone);
    assert_eq!(of("any"), TrafficDistribution::Any);
}

#[test]
fn a_namespace_annotation_gives_its_services_a_traffic_distribution_they_do_not_set() {
    use api::networking::{Port, Resolution, ServiceEntrySpec};
    let annotation = "networking.istio.io/traffic-distribution";
    let entry = ServiceEntrySpec {
        hosts: vec!["api.example.com".into()],
        ports: vec![Port {
            number: 443,
            name: "tls".into(),
            protocol: "TLS".into(),
            target_port: None,
        }],
        resolution: Some(Resolution::Dns),
        ..Default::default()
    };
    let all = services(vec![
        namespace("shop", &[(annotation, "PreferSameNode")]),
        service("shop", "plain", "10.0.0.9")
            .port("http", 80)
            .build(),
        (service("shop", "spec", "10.0.0.8").port("http", 80))
            .traffic_distribution("PreferClose")
            .build(),
        // An annotation istiod does not know still decides: Any, not the namespace's.
        (service("shop", "odd", "10.0.0.7").port("http", 80))
            .annotation(annotation, "Nearby")
            .build(),
        object("shop", "api", Spec::ServiceEntry(entry, Vec::new())),
        service("other", "elsewhere", "10.0.0.6")
            .port("http", 80)
            .build(),
    ]);
    let of = |host: &str| all[host].traffic_distribution;
    assert_eq!(
        of("plain.shop.svc.cluster.local"),
        TrafficDistribution::PreferSameNode
    );
    assert_eq!(
        of("spec.shop.svc.cluster.local"),
        TrafficDistribution::PreferSameZone
    );
    assert_eq!(of("odd.shop.svc.cluster.local"), TrafficDistribution::Any);
    assert_eq!(of("api.example.com"), TrafficDistribution::PreferSameNode);
    assert_eq!(
        of("elsewhere.other.svc.cluster.local"),
        TrafficDistribution::Any
    );
}

#[test]
fn endpoints_stand_in_only_for_a_service_without_slices() {
    let svc = |name: &str| {
        service("shop", name, "10.0.0.9")
            .port("http", 80)
            .target_port(8080)
    };
    let legacy = |name: &str| {
        let subset = (endpoints("shop", name).port("http", 8080))
            .ready("10.1.0.1", None)
            .endpoint(SliceEndpoint {
                addresses: vec!["10.1.0.2".into()],
                ready: Some(false),
                serving: Some(false),
                ..SliceEndpoint::default()
            });
        legacy_endpoints("shop", name, [subset])
    };
    let all = services(vec![
        svc("a").build(),
        legacy("a"),
        (endpoints("shop", "a").port("http", 8080))
            .endpoint(SliceEndpoint {
                addresses: vec!["10.2.0.1".into()],
                ..SliceEndpoint::default()
            })
            .build(),
        svc("b").build(),
        legacy("b"),
    ]);
    let addresses = |host: &str| -> Vec<(String, bool)> {
        all[host]
            .endpoints
            .iter()
            .map(|e| (e.address.clone(), e.healthy))
            .collect()
    };
    assert_eq!(
        addresses("a.shop.svc.cluster.local"),
        vec![("10.2.0.1".to_string(), true)],
        "a Service with slices ignores its Endpoints"
    );
    assert_eq!(
        addresses("b.shop.svc.cluster.local"),
        vec![
            ("10.1.0.1".to_string(), true),
            ("10.1.0.2".to_string(), false)
        ]
    );
}

#[test]
fn a_build_spread_over_threads_equals_one_on_a_single_thread() {
    let store = crate::testmesh::generate(PARALLEL_FROM + 501, 7, 2);
    let one = build_services_on(&store, &MeshConfig::default(), 1);
    assert_eq!(one.0.len(), PARALLEL_FROM + 501);
    assert_eq!(build_services_on(&store, &MeshConfig::default(), 3), one);
}

#[test]
fn every_address_of_an_endpoint_is_an_endpoint_with_its_pod_ports_and_zone() {
    let svc = (service("shop", "a", "10.0.0.9")
        .port("http", 80)
        .target_port(8080))
    .port("grpc", 90)
    .build();
    let pod = labeled(pod_with_account("shop", "a-1", Some("sa")), &[("app", "a")]);
    let slice = (endpoints("shop", "a").port("http", 8081).port("grpc", 9091))
        .endpoint(SliceEndpoint {
            addresses: vec!["10.2.0.2".into(), "10.2.0.1".into()],
            zone: Some("z1".into()),
            pod: Some("a-1".into()),
            ..SliceEndpoint::default()
        })
        .endpoint(SliceEndpoint {
            addresses: vec!["10.2.0.3".into()],
            zone: Some("z2".into()),
            ready: Some(false),
            ..SliceEndpoint::default()
        })
        .build();
    let all = services(vec![svc, pod, slice]);
    let got: Vec<_> = all["a.shop.svc.cluster.local"]
        .endpoints
        .iter()
        .map(|e| {
            (
                e.address.as_str(),
                e.ports.iter().map(|(s, t)| (*s, *t)).collect::<Vec<_>>(),
                e.locality.zone.as_str(),
                e.labels.get("app").map(String::as_str),
                e.service_account.as_deref(),
                e.pod.as_deref(),
                e.healthy,
            )
        })
        .collect();
    let ports = vec![(80, 8081), (90, 9091)];
    let pod = (Some("a"), Some("sa"), Some("a-1"), true);
    assert_eq!(
        got,
        vec![
            ("10.2.0.1", ports.clone(), "z1", pod.0, pod.1, pod.2, pod.3),
            ("10.2.0.2", ports.clone(), "z1", pod.0, pod.1, pod.2, pod.3),
            ("10.2.0.3", ports, "z2", None, None, None, false),
        ]
    );
}
