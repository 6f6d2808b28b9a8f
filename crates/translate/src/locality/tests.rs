use super::*;
use crate::endpoint::{assignment, groups};
use api::networking::{LoadBalancerSettings, OutlierDetection};

/// `(address, locality, labels)` of each endpoint.
type Endpoints<'a> = &'a [(&'a str, &'a str, &'a [(&'a str, &'a str)])];

fn service(endpoints: Endpoints<'_>) -> model::Service {
    model::Service {
        hostname: "api.shop.svc.cluster.local".into(),
        namespace: "shop".into(),
        name: "api".into(),
        endpoints: endpoints
            .iter()
            .map(|(ip, locality, labels)| Endpoint {
                address: ip.to_string(),
                ports: [(80, 8080)].into(),
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                locality: Locality::parse(locality),
                weight: 1,
                healthy: true,
                service_account: None,
                pod: None,
                hostname: None,
                network: String::new(),
                workload: String::new(),
            })
            .collect(),
        kubernetes: true,
        vip: None,
        more_addresses: Vec::new(),
        auto_allocated: Default::default(),
        ports: Vec::new(),
        discovery: model::service::Discovery::Eds,
        mesh_external: false,
        export_to: Vec::new(),
        creation: None,
        selector: BTreeMap::new(),
        labels: BTreeMap::new(),
        traffic_distribution: TrafficDistribution::Any,
        alias_for: None,
        aliases: Vec::new(),
    }
}

fn policy(setting: Option<LocalityLoadBalancerSetting>, outlier: bool) -> TrafficPolicy {
    TrafficPolicy {
        load_balancer: Some(LoadBalancerSettings {
            locality_lb_setting: setting,
            ..Default::default()
        }),
        outlier_detection: outlier.then(OutlierDetection::default),
        ..Default::default()
    }
}

fn at(locality: &str, labels: &[(&str, &str)]) -> Place {
    Place {
        locality: Locality::parse(locality),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        network: None,
        network_view: None,
    }
}

/// `(locality, priority, weight, endpoint addresses)` of each group.
fn applied(
    svc: &model::Service,
    policy: &TrafficPolicy,
    place: &Place,
) -> Vec<(String, u32, u32, Vec<String>)> {
    let mesh = MeshConfig::default();
    let mut gs = groups(svc, 80, |_| true);
    if let Some(lb) = lb(&mesh, Some(policy), svc.traffic_distribution) {
        lb.apply(&mut gs, place);
    }
    assignment("c", gs)
        .endpoints
        .iter()
        .map(|g| {
            let l = g.locality.as_ref().unwrap();
            let ips = g
                .lb_endpoints
                .iter()
                .map(|e| match &e.host_identifier {
                    Some(envoy_api::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier::Endpoint(ep)) => {
                        match &ep.address.as_ref().unwrap().address {
                            Some(envoy_api::pb::envoy::config::core::v3::address::Address::SocketAddress(s)) => s.address.clone(),
                            _ => unreachable!(),
                        }
                    }
                    _ => unreachable!(),
                })
                .collect();
            (
                format!("{}/{}/{}", l.region, l.zone, l.sub_zone),
                g.priority,
                g.load_balancing_weight.as_ref().unwrap().value,
                ips,
            )
        })
        .collect()
}

/// `(locality, priority)` of each group with failover (outlier detection) on.
fn priorities(
    svc: &model::Service,
    setting: Option<LocalityLoadBalancerSetting>,
    place: &Place,
) -> Vec<(String, u32)> {
    (applied(svc, &policy(setting, true), place).into_iter())
        .map(|(l, p, _, _)| (l, p))
        .collect()
}

fn three_zones() -> model::Service {
    service(&[
        ("10.0.0.1", "us-east/a/r1", &[]),
        ("10.0.0.2", "us-east/a/r2", &[]),
        ("10.0.0.3", "us-east/b/r1", &[]),
        ("10.0.0.4", "us-west/c/r1", &[]),
        ("10.0.0.5", "eu/d/r1", &[]),
    ])
}

#[test]
fn outlier_detection_alone_orders_localities_by_distance_from_the_proxy() {
    let svc = three_zones();
    assert_eq!(
        priorities(&svc, None, &at("us-east/a/r1", &[])),
        [
            ("eu/d/r1".to_string(), 3),
            ("us-east/a/r1".into(), 0),
            ("us-east/a/r2".into(), 1),
            ("us-east/b/r1".into(), 2),
            ("us-west/c/r1".into(), 3),
        ]
    );
    // Without outlier detection, or with the setting disabled, nothing is ordered.
    for p in [
        policy(None, false),
        policy(
            Some(LocalityLoadBalancerSetting {
                enabled: Some(false),
                ..Default::default()
            }),
            true,
        ),
    ] {
        let all: Vec<u32> = applied(&svc, &p, &at("us-east/a/r1", &[]))
            .into_iter()
            .map(|(_, p, _, _)| p)
            .collect();
        assert_eq!(all, [0; 5]);
    }
    // The mesh's setting disables it for rules that have none.
    let mesh = MeshConfig {
        locality_lb_setting: Some(LocalityLoadBalancerSetting {
            enabled: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(lb(&mesh, Some(&policy(None, true)), TrafficDistribution::Any).is_none());
}

#[test]
fn failover_names_the_region_that_takes_over_and_the_others_come_last() {
    let svc = three_zones();
    let setting = LocalityLoadBalancerSetting {
        failover: vec![LocalityFailover {
            from: "us-east".into(),
            to: "eu".into(),
        }],
        ..Default::default()
    };
    assert_eq!(
        priorities(&svc, Some(setting), &at("us-east/b/r1", &[])),
        [
            ("eu/d/r1".to_string(), 2),
            ("us-east/a/r1".into(), 1),
            ("us-east/a/r2".into(), 1),
            ("us-east/b/r1".into(), 0),
            ("us-west/c/r1".into(), 3),
        ]
    );
}

#[test]
fn distribute_weighs_the_named_localities_and_empties_the_rest() {
    let svc = three_zones();
    let setting = LocalityLoadBalancerSetting {
        distribute: vec![
            LocalityDistribute {
                from: "eu/*".into(),
                to: [("eu/*".to_string(), 100)].into(),
            },
            LocalityDistribute {
                from: "us-east/a/*".into(),
                to: [("us-east/a/*".to_string(), 80), ("us-west/*".into(), 20)].into(),
            },
        ],
        ..Default::default()
    };
    // No outlier detection needed; priorities stay 0.
    let got = applied(
        &svc,
        &policy(Some(setting), false),
        &at("us-east/a/r2", &[]),
    );
    let summary: Vec<(String, u32, usize)> = got
        .into_iter()
        .map(|(l, p, w, ips)| {
            assert_eq!(p, 0);
            (l, w, ips.len())
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("eu/d/r1".to_string(), 1, 0),
            // 80% over two localities of weight 1 each: 40 each.
            ("us-east/a/r1".into(), 40, 1),
            ("us-east/a/r2".into(), 40, 1),
            ("us-east/b/r1".into(), 1, 0),
            ("us-west/c/r1".into(), 20, 1),
        ]
    );
}

#[test]
fn failover_priority_splits_localities_by_the_labels_shared_with_the_proxy() {
    let svc = service(&[
        ("10.0.0.1", "r/z/s", &[("tier", "gold"), ("rack", "1")]),
        ("10.0.0.2", "r/z/s", &[("tier", "gold"), ("rack", "2")]),
        ("10.0.0.3", "r/z/s", &[("tier", "bronze"), ("rack", "1")]),
    ]);
    let setting = LocalityLoadBalancerSetting {
        failover_priority: vec!["tier".into(), "rack".into()],
        ..Default::default()
    };
    let p = policy(Some(setting.clone()), true);
    let got: Vec<(u32, Vec<String>)> =
        applied(&svc, &p, &at("r/z/s", &[("tier", "gold"), ("rack", "1")]))
            .into_iter()
            .map(|(_, p, w, ips)| {
                assert_eq!(w as usize, ips.len(), "weight is the endpoints' sum");
                (p, ips)
            })
            .collect();
    assert_eq!(
        got,
        [
            (0, vec!["10.0.0.1".to_string()]),
            (1, vec!["10.0.0.2".into()]),
            (2, vec!["10.0.0.3".into()]),
        ]
    );
    // `name=value` compares endpoints with the value, not the proxy's label.
    let pinned = LocalityLoadBalancerSetting {
        failover_priority: vec!["tier=bronze".into()],
        ..setting
    };
    let got: Vec<(u32, Vec<String>)> = applied(
        &svc,
        &policy(Some(pinned.clone()), true),
        &at("r/z/s", &[("tier", "gold")]),
    )
    .into_iter()
    .map(|(_, p, _, ips)| (p, ips))
    .collect();
    assert_eq!(
        got,
        [
            (0, vec!["10.0.0.3".to_string()]),
            (1, vec!["10.0.0.1".into(), "10.0.0.2".into()]),
        ]
    );
    let mesh = MeshConfig::default();
    let keys = dependence(
        &mesh,
        [Some(Cow::Owned(policy(Some(pinned), true)))],
        TrafficDistribution::Any,
    );
    assert_eq!(keys, Some(vec!["tier".to_string()]));
}

#[test]
fn topology_labels_come_from_the_locality() {
    let svc = three_zones();
    let setting = LocalityLoadBalancerSetting {
        failover_priority: vec![REGION_LABEL.into(), ZONE_LABEL.into()],
        ..Default::default()
    };
    assert_eq!(
        priorities(&svc, Some(setting), &at("us-east/b/r9", &[])),
        [
            ("eu/d/r1".to_string(), 2),
            ("us-east/a/r1".into(), 1),
            ("us-east/a/r2".into(), 1),
            ("us-east/b/r1".into(), 0),
            ("us-west/c/r1".into(), 2),
        ]
    );
}

#[test]
fn a_service_preferring_close_endpoints_fails_over_by_zone_without_a_rule() {
    let mut svc = three_zones();
    let none = TrafficPolicy::default();
    let zone_a = at("us-east/a/r1", &[]);
    // Without a preference (and without outlier detection) nothing is balanced.
    assert!(
        lb(
            &MeshConfig::default(),
            Some(&none),
            svc.traffic_distribution
        )
        .is_none()
    );
    svc.traffic_distribution = TrafficDistribution::PreferSameZone;
    let got: Vec<(String, u32)> = (applied(&svc, &none, &zone_a).into_iter())
        .map(|(l, p, _, _)| (l, p))
        .collect();
    // Its zone first (both subzones), then its region, then the rest.
    let expected = [
        ("eu/d/r1", 2),
        ("us-east/a/r1", 0),
        ("us-east/a/r2", 0),
        ("us-east/b/r1", 1),
        ("us-west/c/r1", 2),
    ];
    assert_eq!(got, expected.map(|(l, p)| (l.to_string(), p)));
    // A rule's own setting wins over the service's preference: here, off.
    let off = policy(
        Some(LocalityLoadBalancerSetting {
            enabled: Some(false),
            ..Default::default()
        }),
        true,
    );
    assert!(lb(&MeshConfig::default(), Some(&off), svc.traffic_distribution).is_none());
    // The preference makes the service's assignments depend on the proxy's network,
    // region and zone only.
    let keys = dependence(&MeshConfig::default(), [None], svc.traffic_distribution);
    assert_eq!(
        keys.unwrap(),
        [NETWORK_LABEL, REGION_LABEL, ZONE_LABEL].map(String::from)
    );
}
