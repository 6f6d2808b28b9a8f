//! Which DestinationRule traffic policy applies to one port of one cluster, as istiod
//! resolves it (`MergeSubsetTrafficPolicy`, `HashForHTTPDestination`): a port's
//! `portLevelSettings` entry replaces the rule's connection pool, load balancer, outlier
//! detection and TLS on that port; a subset's policy is merged over the rule's component by
//! component, and a subset's own port-level entry replaces all four again.

use std::borrow::Cow;

use api::networking::{ConsistentHashLb, DestinationRuleSpec, PortTrafficPolicy, TrafficPolicy};

/// The policy's `portLevelSettings` entry for `port`: the first that names it.
fn port_entry(policy: &TrafficPolicy, port: u32) -> Option<&PortTrafficPolicy> {
    (policy.port_level_settings.iter()).find(|s| s.port.as_ref().is_some_and(|p| p.number == port))
}

/// `policy` as it applies to `port`, and whether a port-level entry decided it. A
/// port-level entry keeps only its four components: the rest (tunnel, PROXY protocol)
/// is dropped with the rule's, as istiod drops them.
fn at_port(policy: &TrafficPolicy, port: u32) -> (Cow<'_, TrafficPolicy>, bool) {
    match port_entry(policy, port) {
        None => (Cow::Borrowed(policy), false),
        Some(s) => (
            Cow::Owned(TrafficPolicy {
                connection_pool: s.connection_pool.clone(),
                load_balancer: s.load_balancer.clone(),
                outlier_detection: s.outlier_detection.clone(),
                tls: s.tls.clone(),
                ..Default::default()
            }),
            true,
        ),
    }
}

/// The policy of the cluster for `port` of a DestinationRule's host: the rule's policy
/// (`rule`), and for a subset cluster the subset's (`subset`) merged over it.
pub fn effective<'a>(
    rule: Option<&'a TrafficPolicy>,
    subset: Option<&'a TrafficPolicy>,
    port: u32,
) -> Option<Cow<'a, TrafficPolicy>> {
    let base = rule.map(|p| at_port(p, port).0);
    let Some(subset) = subset else {
        return base;
    };
    let (subset, port_level) = at_port(subset, port);
    let Some(base) = base else {
        return Some(subset);
    };
    // A component the subset sets replaces the rule's; with a port-level entry, all four
    // are the entry's, set or not.
    fn pick<T: Clone>(subset: &Option<T>, base: &Option<T>, replace: bool) -> Option<T> {
        if replace {
            subset.clone()
        } else {
            subset.as_ref().or(base.as_ref()).cloned()
        }
    }
    let (s, b) = (&*subset, &*base);
    Some(Cow::Owned(TrafficPolicy {
        connection_pool: pick(&s.connection_pool, &b.connection_pool, port_level),
        outlier_detection: pick(&s.outlier_detection, &b.outlier_detection, port_level),
        load_balancer: pick(&s.load_balancer, &b.load_balancer, port_level),
        tls: pick(&s.tls, &b.tls, port_level),
        tunnel: pick(&s.tunnel, &b.tunnel, false),
        proxy_protocol: pick(&s.proxy_protocol, &b.proxy_protocol, false),
        port_level_settings: Vec::new(),
    }))
}

/// The consistent hash a route to `port` (and `subset`) of the rule's host hashes
/// requests with, in istiod's order of precedence: the subset's port-level entry, the
/// subset, the rule's port-level entry, the rule.
pub fn consistent_hash<'a>(
    rule: &'a DestinationRuleSpec,
    subset: &str,
    port: u32,
) -> Option<&'a ConsistentHashLb> {
    let hash = |p: Option<&'a TrafficPolicy>| p?.load_balancer.as_ref()?.consistent_hash.as_ref();
    let port_level = |p: Option<&'a TrafficPolicy>| {
        port_entry(p?, port)?
            .load_balancer
            .as_ref()?
            .consistent_hash
            .as_ref()
    };
    let top = rule.traffic_policy.as_ref();
    let sub = (!subset.is_empty())
        .then(|| rule.subsets.iter().find(|s| s.name == subset))
        .flatten()
        .and_then(|s| s.traffic_policy.as_ref());
    port_level(sub)
        .or_else(|| hash(sub))
        .or_else(|| port_level(top))
        .or_else(|| hash(top))
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::networking::{
        ConnectionPoolSettings, LoadBalancerSettings, OutlierDetection, PortSelector,
        PortTrafficPolicy, SimpleLb, Subset, TcpSettings,
    };

    fn pool(max: i32) -> Option<ConnectionPoolSettings> {
        Some(ConnectionPoolSettings {
            tcp: Some(TcpSettings {
                max_connections: Some(max),
                ..Default::default()
            }),
            http: None,
        })
    }

    fn lb(simple: SimpleLb) -> Option<LoadBalancerSettings> {
        Some(LoadBalancerSettings {
            simple: Some(simple),
            ..Default::default()
        })
    }

    fn header_hash(name: &str) -> Option<LoadBalancerSettings> {
        Some(LoadBalancerSettings {
            consistent_hash: Some(ConsistentHashLb {
                http_header_name: Some(name.into()),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn outlier() -> Option<OutlierDetection> {
        Some(OutlierDetection {
            consecutive_5xx_errors: Some(1),
            ..Default::default()
        })
    }

    fn on_port(port: u32, entry: PortTrafficPolicy) -> PortTrafficPolicy {
        PortTrafficPolicy {
            port: Some(PortSelector { number: port }),
            ..entry
        }
    }

    #[test]
    fn a_port_level_entry_replaces_the_four_components_on_its_port_only() {
        let rule = TrafficPolicy {
            connection_pool: pool(10),
            outlier_detection: outlier(),
            load_balancer: lb(SimpleLb::Random),
            port_level_settings: vec![on_port(
                9080,
                PortTrafficPolicy {
                    connection_pool: pool(3),
                    ..Default::default()
                },
            )],
            ..Default::default()
        };
        let at_9080 = effective(Some(&rule), None, 9080).unwrap();
        assert_eq!(at_9080.connection_pool, pool(3));
        // Not inherited: the entry set no outlier detection and no load balancer.
        assert_eq!(at_9080.outlier_detection, None);
        assert_eq!(at_9080.load_balancer, None);
        let elsewhere = effective(Some(&rule), None, 8080).unwrap();
        assert_eq!(elsewhere.connection_pool, pool(10));
        assert_eq!(elsewhere.outlier_detection, outlier());
    }

    #[test]
    fn a_subset_merges_over_the_rules_port_level_entry_and_its_own_entry_replaces_all() {
        let rule = TrafficPolicy {
            load_balancer: lb(SimpleLb::Random),
            port_level_settings: vec![on_port(
                9080,
                PortTrafficPolicy {
                    connection_pool: pool(3),
                    outlier_detection: outlier(),
                    ..Default::default()
                },
            )],
            ..Default::default()
        };
        let subset = TrafficPolicy {
            load_balancer: lb(SimpleLb::RoundRobin),
            port_level_settings: vec![on_port(
                7070,
                PortTrafficPolicy {
                    connection_pool: pool(1),
                    ..Default::default()
                },
            )],
            ..Default::default()
        };
        // 9080: the rule's entry, with the subset's load balancer over it.
        let merged = effective(Some(&rule), Some(&subset), 9080).unwrap();
        assert_eq!(merged.connection_pool, pool(3));
        assert_eq!(merged.outlier_detection, outlier());
        assert_eq!(merged.load_balancer, lb(SimpleLb::RoundRobin));
        // 7070: the subset's own entry, nothing else.
        let merged = effective(Some(&rule), Some(&subset), 7070).unwrap();
        assert_eq!(merged.connection_pool, pool(1));
        assert_eq!(merged.load_balancer, None);
        // 8080: the rule as a whole, the subset's load balancer over it.
        let merged = effective(Some(&rule), Some(&subset), 8080).unwrap();
        assert_eq!(merged.connection_pool, None);
        assert_eq!(merged.load_balancer, lb(SimpleLb::RoundRobin));
        assert_eq!(effective(None, None, 8080), None);
    }

    #[test]
    fn the_hash_of_a_route_prefers_the_subset_then_port_level_entries() {
        let rule = DestinationRuleSpec {
            host: "reviews".into(),
            traffic_policy: Some(TrafficPolicy {
                load_balancer: header_hash("x-rule"),
                port_level_settings: vec![on_port(
                    9080,
                    PortTrafficPolicy {
                        load_balancer: header_hash("x-rule-port"),
                        ..Default::default()
                    },
                )],
                ..Default::default()
            }),
            subsets: vec![
                Subset {
                    name: "v1".into(),
                    traffic_policy: Some(TrafficPolicy {
                        load_balancer: header_hash("x-v1"),
                        port_level_settings: vec![on_port(
                            9080,
                            PortTrafficPolicy {
                                load_balancer: header_hash("x-v1-port"),
                                ..Default::default()
                            },
                        )],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Subset {
                    name: "v2".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let header = |subset: &str, port: u32| {
            consistent_hash(&rule, subset, port).and_then(|h| h.http_header_name.clone())
        };
        assert_eq!(header("v1", 9080).as_deref(), Some("x-v1-port"));
        assert_eq!(header("v1", 8080).as_deref(), Some("x-v1"));
        assert_eq!(header("v2", 9080).as_deref(), Some("x-rule-port"));
        assert_eq!(header("", 9080).as_deref(), Some("x-rule-port"));
        assert_eq!(header("", 8080).as_deref(), Some("x-rule"));
    }
}
