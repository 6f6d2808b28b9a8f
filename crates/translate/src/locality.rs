//! Locality load balancing, as istiod applies it to a cluster's load assignment for one
//! proxy (`pilot/pkg/networking/core/loadbalancer`):
//!
//! - the setting is the DestinationRule's `localityLbSetting`, else MeshConfig's, which is
//!   enabled by default; `enabled: false` turns it off;
//! - `distribute` weighs the localities for proxies in the entry's `from` locality and
//!   empties the localities it does not name;
//! - otherwise, only when the cluster has outlier detection (Envoy would never fail over
//!   without it), endpoints get priorities: 0 in the proxy's region, zone and subzone,
//!   1 in its zone, 2 in its region, 3 elsewhere and 4 in a region `failover` does not
//!   name; `failoverPriority` first splits them by how many of the listed labels they
//!   share with the proxy.
//!
//! So with the defaults, a DestinationRule that sets outlierDetection keeps traffic in the
//! proxy's own zone while it has healthy endpoints there, as with istiod. The result
//! depends on the proxy only through its [`Place`].

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use api::networking::{
    DestinationRuleSpec, LoadBalancerSettings, LocalityDistribute, LocalityFailover,
    LocalityLoadBalancerSetting, TrafficPolicy,
};
use model::mesh::MeshConfig;
use model::{Endpoint, Locality, Proxy, PushContext, TrafficDistribution};

use super::endpoint::Group;

use model::network::NETWORK_LABEL;
use model::service::{HOSTNAME_LABEL, REGION_LABEL, SUBZONE_LABEL, ZONE_LABEL};

/// What a service's `trafficDistribution` balances by when no DestinationRule sets a
/// locality setting (istiod's `GetEffectiveLbSetting`): failover priorities on the
/// proxy's network, region and zone (and, for `PreferSameNode`, subzone and node), applied
/// with or without outlier detection.
static PREFER_SAME_ZONE: LazyLock<LocalityLoadBalancerSetting> =
    LazyLock::new(|| LocalityLoadBalancerSetting {
        enabled: Some(true),
        failover_priority: [NETWORK_LABEL, REGION_LABEL, ZONE_LABEL]
            .map(String::from)
            .to_vec(),
        ..Default::default()
    });
static PREFER_SAME_NODE: LazyLock<LocalityLoadBalancerSetting> =
    LazyLock::new(|| LocalityLoadBalancerSetting {
        enabled: Some(true),
        failover_priority: [
            NETWORK_LABEL,
            REGION_LABEL,
            ZONE_LABEL,
            SUBZONE_LABEL,
            HOSTNAME_LABEL,
        ]
        .map(String::from)
        .to_vec(),
        ..Default::default()
    });

/// The setting a service's `trafficDistribution` forces, if it prefers nearby endpoints.
fn forced(traffic: TrafficDistribution) -> Option<&'static LocalityLoadBalancerSetting> {
    match traffic {
        TrafficDistribution::Any => None,
        TrafficDistribution::PreferSameZone => Some(&PREFER_SAME_ZONE),
        TrafficDistribution::PreferSameNode => Some(&PREFER_SAME_NODE),
    }
}

/// MeshConfig's default: `localityLbSetting: {enabled: true}`.
static MESH_DEFAULT: LocalityLoadBalancerSetting = LocalityLoadBalancerSetting {
    distribute: Vec::new(),
    failover: Vec::new(),
    failover_priority: Vec::new(),
    enabled: Some(true),
};

/// What of a proxy a load assignment depends on: its locality, the labels failover
/// priorities compare and, with multi-network, its network.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Place {
    pub locality: Locality,
    pub labels: BTreeMap<String, String>,
    /// `Some` (empty when the proxy names none) only when some network has a gateway:
    /// then every load assignment depends on it ([`crate::network`]).
    pub network: Option<String>,
    /// The networks whose endpoints the proxy asked to see (`REQUESTED_NETWORK_VIEW`).
    pub network_view: Option<Box<[String]>>,
}

/// Where `proxy` is, for its load assignments: its locality, labels (with the node it
/// runs on, as istiod adds it) and network.
pub fn place(ctx: &PushContext, proxy: &Proxy) -> Place {
    let mut labels = ctx.proxy_labels(proxy).clone();
    if let Some(node) = ctx.proxy_node(proxy) {
        labels.entry(HOSTNAME_LABEL.to_string()).or_insert(node);
    }
    Place {
        locality: ctx.proxy_locality(proxy),
        labels,
        network: ctx.networks.enabled().then(|| proxy.network.clone()),
        network_view: proxy.network_view.clone(),
    }
}

impl Place {
    /// Only the labels named in `keys`.
    pub fn restricted(&self, keys: &[String]) -> Place {
        Place {
            locality: self.locality.clone(),
            labels: keys
                .iter()
                .filter_map(|k| Some((k.clone(), self.labels.get(k)?.clone())))
                .collect(),
            network: self.network.clone(),
            network_view: self.network_view.clone(),
        }
    }

    /// What proxies sharing a load assignment must share: with `keys` (the labels it is
    /// balanced by locality on, see [`dependence`]) the place restricted to them; without,
    /// only the network (when multi-network is on) and the network view; `None` when
    /// nothing about the proxy matters.
    pub fn keyed(&self, keys: Option<&[String]>) -> Option<Place> {
        match keys {
            Some(keys) => Some(self.restricted(keys)),
            None if self.network.is_some() || self.network_view.is_some() => Some(Place {
                network: self.network.clone(),
                network_view: self.network_view.clone(),
                ..Place::default()
            }),
            None => None,
        }
    }

    /// A label of the proxy; the topology labels come from its locality when it has one,
    /// as istiod adds them to a proxy's labels.
    fn label(&self, key: &str) -> &str {
        topology(&self.locality, key)
            .or((key == NETWORK_LABEL)
                .then_some(self.network.as_deref())
                .flatten()
                .filter(|n| !n.is_empty()))
            .or(self.labels.get(key).map(String::as_str))
            .unwrap_or_default()
    }
}

fn topology<'a>(l: &'a Locality, key: &str) -> Option<&'a str> {
    let v = match key {
        REGION_LABEL => &l.region,
        ZONE_LABEL => &l.zone,
        SUBZONE_LABEL => &l.subzone,
        _ => return None,
    };
    (!v.is_empty()).then_some(v.as_str())
}

/// An endpoint's label, the topology ones from its locality.
fn endpoint_label<'a>(e: &'a Endpoint, key: &str) -> &'a str {
    topology(&e.locality, key)
        .or((key == NETWORK_LABEL && !e.network.is_empty()).then_some(e.network.as_str()))
        .or(e.labels.get(key).map(String::as_str))
        .unwrap_or_default()
}

/// How a cluster's endpoints are weighted or prioritised relative to the proxy.
#[derive(Clone, Copy, Debug)]
pub struct Lb<'a> {
    setting: &'a LocalityLoadBalancerSetting,
    /// The cluster has outlier detection: failover applies.
    failover: bool,
}

/// The locality balancing of a cluster of a service distributing traffic as `traffic`,
/// with `policy` (its effective traffic policy), or `None` when its load assignment does
/// not depend on where the proxy is. The rule's setting wins, then the service's
/// `trafficDistribution` (which forces failover), then the mesh's.
pub fn lb<'a>(
    mesh: &'a MeshConfig,
    policy: Option<&'a TrafficPolicy>,
    traffic: TrafficDistribution,
) -> Option<Lb<'a>> {
    let rule = policy
        .and_then(|p| p.load_balancer.as_ref())
        .and_then(|lb| lb.locality_lb_setting.as_ref());
    if rule.is_none()
        && let Some(setting) = forced(traffic)
    {
        return Some(Lb {
            setting,
            failover: true,
        });
    }
    let setting = rule
        .or(mesh.locality_lb_setting.as_ref())
        .unwrap_or(&MESH_DEFAULT);
    if setting.enabled == Some(false) {
        return None;
    }
    let failover = policy.is_some_and(|p| p.outlier_detection.is_some());
    (!setting.distribute.is_empty() || failover).then_some(Lb { setting, failover })
}

impl Lb<'_> {
    /// Whether the cluster weighs localities (`common_lb_config.locality_weighted_lb_config`):
    /// with `distribute`, or with explicit failover.
    pub fn weighted(&self) -> bool {
        let s = self.setting;
        !s.distribute.is_empty()
            || (self.failover && (!s.failover.is_empty() || !s.failover_priority.is_empty()))
    }

    /// The labels of the proxy this balancing compares (`failoverPriority`'s names).
    pub fn label_keys(&self) -> impl Iterator<Item = &str> {
        let keys = if self.failover && self.setting.distribute.is_empty() {
            &self.setting.failover_priority[..]
        } else {
            &[]
        };
        keys.iter().map(|k| k.split('=').next().unwrap_or_default())
    }

    /// Applies the balancing to `groups` (a load assignment's localities) for a proxy at
    /// `at`.
    pub fn apply(&self, groups: &mut Vec<Group<'_>>, at: &Place) {
        let s = self.setting;
        if !s.distribute.is_empty() {
            distribute(groups, &at.locality, &s.distribute);
        } else if self.failover {
            if !s.failover_priority.is_empty() {
                by_labels(groups, at, &s.failover_priority);
                if !s.failover.is_empty() {
                    by_locality(groups, &at.locality, &s.failover);
                }
            } else {
                by_locality(groups, &at.locality, &s.failover);
            }
        }
    }
}

/// The labels of the proxy whose load assignments of `policies` depend on where it is, or
/// `None` when none does.
pub fn dependence<'a>(
    mesh: &MeshConfig,
    policies: impl IntoIterator<Item = Option<Cow<'a, TrafficPolicy>>>,
    traffic: TrafficDistribution,
) -> Option<Vec<String>> {
    let mut keys = BTreeSet::new();
    let mut any = false;
    for policy in policies {
        if let Some(lb) = lb(mesh, policy.as_deref(), traffic) {
            any = true;
            keys.extend(lb.label_keys().map(str::to_string));
        }
    }
    any.then(|| keys.into_iter().collect())
}

/// Whether a setting weighs localities (`distribute`) and is not disabled.
fn distributes(l: Option<&LocalityLoadBalancerSetting>) -> bool {
    l.is_some_and(|l| !l.distribute.is_empty() && l.enabled != Some(false))
}

/// Whether any load assignment of a context with these rules may depend on the proxy
/// (cheap and conservative: any outlier detection or `distribute` in a rule, or a
/// `distribute` in the mesh's setting), and if so the proxy labels any of their
/// `failoverPriority` compares (usually none).
pub fn context_dependence<'a>(
    mesh: &MeshConfig,
    rules: impl Iterator<Item = &'a DestinationRuleSpec> + Clone,
    traffic: impl Iterator<Item = TrafficDistribution>,
) -> Option<Vec<String>> {
    // The services that prefer nearby endpoints, and the labels their failover compares.
    let forced_keys: BTreeSet<&str> = traffic
        .filter_map(forced)
        .flat_map(|s| s.failover_priority.iter().map(String::as_str))
        .collect();
    // Each policy component that can balance: its outlier detection and its setting.
    let components = rules.flat_map(|rule| {
        let policies = (rule.traffic_policy.iter()).chain(
            rule.subsets
                .iter()
                .filter_map(|s| s.traffic_policy.as_ref()),
        );
        policies.flat_map(|p| {
            let setting = |lb: Option<&'a LoadBalancerSettings>| {
                lb.and_then(|l| l.locality_lb_setting.as_ref())
            };
            std::iter::once((
                p.outlier_detection.is_some(),
                setting(p.load_balancer.as_ref()),
            ))
            .chain(p.port_level_settings.iter().map(move |s| {
                (
                    s.outlier_detection.is_some(),
                    setting(s.load_balancer.as_ref()),
                )
            }))
        })
    });
    let aware = !forced_keys.is_empty()
        || distributes(mesh.locality_lb_setting.as_ref())
        || components
            .clone()
            .any(|(outlier, l)| outlier || distributes(l));
    aware.then(|| {
        let settings = (mesh.locality_lb_setting.iter()).chain(components.filter_map(|(_, l)| l));
        let keys: BTreeSet<String> = settings
            .flat_map(|s| &s.failover_priority)
            .map(|k| k.split('=').next().unwrap_or_default())
            .chain(forced_keys)
            .map(str::to_string)
            .collect();
        keys.into_iter().collect()
    })
}

/// Whether `locality` is matched by a rule's `region/zone/subzone`, where `*` or a missing
/// zone or subzone matches any.
fn matches(locality: &Locality, rule: &str) -> bool {
    let mut parts = rule.split('/');
    let (region, zone, subzone) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let part = |rule: &str, have: &str, optional: bool| {
        rule == "*" || (optional && rule.is_empty()) || rule == have
    };
    part(region, &locality.region, false)
        && part(zone, &locality.zone, true)
        && part(subzone, &locality.subzone, true)
}

/// istiod's `applyLocalityWeights`: the first entry whose `from` matches the proxy weighs
/// each locality it names by its share of the entry's weight, and empties the rest.
fn distribute(groups: &mut [Group<'_>], proxy: &Locality, entries: &[LocalityDistribute]) {
    let Some(entry) = entries.iter().find(|d| matches(proxy, &d.from)) else {
        return;
    };
    let mut unmatched: BTreeSet<usize> = (0..groups.len()).collect();
    for (to, weight) in &entry.to {
        let claimed: Vec<usize> = unmatched
            .iter()
            .copied()
            .filter(|i| matches(groups[*i].locality, to))
            .collect();
        let total: u64 = claimed.iter().map(|i| u64::from(groups[*i].weight())).sum();
        for i in claimed {
            unmatched.remove(&i);
            let share = u64::from(groups[i].weight()) * u64::from(*weight);
            let w = share.div_ceil(total.max(1));
            if w > 0 {
                groups[i].load_balancing_weight = Some(w.min(u64::from(u32::MAX)) as u32);
            }
        }
    }
    for i in unmatched {
        // The locality keeps its weight (Envoy refuses 0), with no endpoints.
        groups[i].load_balancing_weight = Some(groups[i].weight());
        groups[i].endpoints.clear();
    }
}

/// istiod's `LbPriority`: 0 for the proxy's own subzone, 1 its zone, 2 its region, else 3.
fn distance(proxy: &Locality, endpoints: &Locality) -> u32 {
    match (
        proxy.region == endpoints.region,
        proxy.zone == endpoints.zone,
        proxy.subzone == endpoints.subzone,
    ) {
        (true, true, true) => 0,
        (true, true, false) => 1,
        (true, false, _) => 2,
        (false, _, _) => 3,
    }
}

/// istiod's `applyLocalityFailover`: each locality's priority by its distance from the
/// proxy (4 for a region other than the one `failover` names for the proxy's), composed
/// with any earlier priority, then renumbered from 0 without gaps.
fn by_locality(groups: &mut [Group<'_>], proxy: &Locality, failover: &[LocalityFailover]) {
    for g in groups.iter_mut() {
        let mut p = distance(proxy, g.locality);
        if p == 3
            && let Some(f) = failover.iter().find(|f| f.from == proxy.region)
            && g.locality.region != f.to
        {
            p = 4;
        }
        g.priority = g.priority * 5 + p;
    }
    renumber(groups);
}

/// istiod's `applyFailoverPriorities`: each locality split by how many of the leading
/// `labels` (`name` or `name=value`) its endpoints share with the proxy, then renumbered.
fn by_labels(groups: &mut Vec<Group<'_>>, at: &Place, labels: &[String]) {
    let names: Vec<(&str, Option<&str>)> = labels
        .iter()
        .map(|l| match l.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (l.as_str(), None),
        })
        .collect();
    let lowest = names.len() as u32;
    let network_first = names
        .first()
        .is_some_and(|(n, _)| *n == "topology.istio.io/network");
    let priority = |e: &Endpoint| {
        let (mut priority, mut adjust) = (0, 0);
        for (j, (name, value)) in names.iter().enumerate() {
            let proxy = value.unwrap_or_else(|| at.label(name));
            if proxy != endpoint_label(e, name) {
                if j == 0 && network_first {
                    adjust = lowest;
                    continue;
                }
                priority = lowest - j as u32;
                break;
            }
        }
        priority + adjust
    };
    let mut split = Vec::with_capacity(groups.len());
    for g in groups.drain(..) {
        let mut by_priority: BTreeMap<u32, Vec<_>> = BTreeMap::new();
        for (e, lb) in g.endpoints {
            by_priority.entry(priority(e)).or_default().push((e, lb));
        }
        for (priority, endpoints) in by_priority {
            split.push(Group {
                locality: g.locality,
                endpoints,
                priority,
                load_balancing_weight: None,
            });
        }
    }
    *groups = split;
    renumber(groups);
}

/// Priorities renumbered 0, 1, 2… in their order: Envoy needs them without gaps.
fn renumber(groups: &mut [Group<'_>]) {
    let used: BTreeSet<u32> = groups.iter().map(|g| g.priority).collect();
    for g in groups.iter_mut() {
        g.priority = used.range(..g.priority).count() as u32;
    }
}

#[cfg(test)]
mod tests {
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
}
