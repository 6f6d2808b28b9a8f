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
mod tests;
