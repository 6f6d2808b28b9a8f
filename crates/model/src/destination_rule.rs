//! Which DestinationRule applies to a host for a given proxy, as istiod decides it
//! (`PushContext.destinationRule` and `SidecarScope.DestinationRule`).
//!
//! For a proxy in namespace N and a host whose service lives in namespace S:
//! 1. the rules of N that N sees (its own, unless exported only elsewhere); for a proxy
//!    in the root namespace, the root namespace's private rules instead;
//! 2. else the rules S exports to N;
//! 3. else the rules the root namespace exports to N.
//!
//! At each step the most specific host wins (an exact host, else the longest wildcard
//! covering it). Several rules for one host in one namespace are merged, oldest first:
//! the later ones add the subsets the earlier lack and give a traffic policy only when
//! none was set; rules with different `exportTo` stay apart (istiod's enhanced merge).
//! A rule with a `workloadSelector` is private to its namespace and, among that host's
//! rules, applies to the proxies it selects; the others get the rule without one.
//!
//! Built once per change to DestinationRules or the mesh config; read by every view.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use crate::config::{ConfigObject, ObjectKey, Spec};
use crate::mesh::MeshConfig;
use crate::{host_covers, resolve_host};
use api::labels_match;
use api::networking::DestinationRuleSpec;

/// One merged rule and how far it is seen.
#[derive(Debug, PartialEq)]
struct Consolidated {
    rule: Arc<ConfigObject>,
    export_to: BTreeSet<String>,
    selector: Option<BTreeMap<String, String>>,
    /// The rules merged into it, oldest first.
    from: Vec<ObjectKey>,
}

/// The merged rules of one namespace (or of one visibility) by host.
#[derive(Debug, Default, PartialEq)]
struct HostIndex {
    exact: foldhash::HashMap<String, Vec<Consolidated>>,
    /// Longest (most specific) pattern first once built.
    wildcard: Vec<(String, Vec<Consolidated>)>,
}

impl HostIndex {
    /// istiod's `MostSpecificHostMatch`: the rules of the exact host, else of the most
    /// specific wildcard covering it.
    fn most_specific(&self, host: &str) -> Option<&[Consolidated]> {
        self.exact.get(host).map(Vec::as_slice).or_else(|| {
            (self.wildcard.iter())
                .find(|(pattern, _)| host_covers(pattern, host))
                .map(|(_, rules)| rules.as_slice())
        })
    }

    fn patterns(&self) -> impl Iterator<Item = &str> {
        (self.exact.keys().map(String::as_str)).chain(self.wildcard.iter().map(|(p, _)| p.as_str()))
    }

    fn all_mut(&mut self) -> impl Iterator<Item = &mut Consolidated> {
        (self.exact.values_mut().flatten()).chain(self.wildcard.iter_mut().flat_map(|(_, r)| r))
    }

    fn list(&mut self, host: &str) -> &mut Vec<Consolidated> {
        if host.starts_with('*') {
            let i = match self.wildcard.iter().position(|(p, _)| p == host) {
                Some(i) => i,
                None => {
                    self.wildcard.push((host.to_string(), Vec::new()));
                    self.wildcard.len() - 1
                }
            };
            &mut self.wildcard[i].1
        } else {
            self.exact.entry(host.to_string()).or_default()
        }
    }

    /// istiod's `mergeDestinationRule` (with `ENABLE_ENHANCED_DESTINATIONRULE_MERGE`, on
    /// by default).
    /// Merges `rule` into the rules for `host`; a subset whose name the merged rule
    /// already has is left out and noted in `duplicates` (host -> what was left out).
    fn merge(
        &mut self,
        host: &str,
        rule: &Arc<ConfigObject>,
        export_to: &BTreeSet<String>,
        duplicates: &mut BTreeMap<String, String>,
    ) {
        let spec = spec(rule).expect("only DestinationRules are indexed");
        let selector = spec.workload_selector.as_ref().map(|s| &s.match_labels);
        let list = self.list(host);
        let mut separately = true;
        for existing in list.iter_mut() {
            if *export_to == existing.export_to {
                separately = false;
            } else if !existing.export_to.is_empty() && export_to.is_superset(&existing.export_to) {
                separately = true;
            } else {
                separately = true;
                continue;
            }
            match (existing.selector.as_ref(), selector) {
                (Some(a), Some(b)) if a != b => {
                    separately = true;
                    continue;
                }
                (None, None) | (Some(_), Some(_)) => separately = false,
                _ => {}
            }
            let mut merged = (*existing.rule).clone();
            let Spec::DestinationRule(into) = &mut merged.spec else {
                unreachable!("only DestinationRules are indexed")
            };
            for subset in &spec.subsets {
                if !into.subsets.iter().any(|s| s.name == subset.name) {
                    into.subsets.push(subset.clone());
                } else {
                    duplicates.insert(
                        host.to_string(),
                        format!(
                            "Duplicate subset {} found while merging destination rules for {host}",
                            subset.name
                        ),
                    );
                }
            }
            if into.traffic_policy.is_none() {
                into.traffic_policy = spec.traffic_policy.clone();
            }
            existing.rule = Arc::new(merged);
            existing.from.push(rule.key.clone());
        }
        if separately {
            list.push(Consolidated {
                rule: rule.clone(),
                export_to: export_to.clone(),
                selector: selector.cloned(),
                from: vec![rule.key.clone()],
            });
        }
    }

    fn finish(&mut self, merged: &mut HashMap<Vec<ObjectKey>, Arc<ConfigObject>>) {
        // Stable: equally long patterns keep their age order.
        self.wildcard
            .sort_by_key(|(h, _)| std::cmp::Reverse(h.len()));
        // The same rules merged in the same order are one rule: one `Arc`, so that
        // caches keyed by the rule tell them apart by address.
        for c in self.all_mut().filter(|c| c.from.len() > 1) {
            c.rule = merged
                .entry(c.from.clone())
                .or_insert(c.rule.clone())
                .clone();
        }
    }
}

/// The DestinationRules of a push context, indexed as istiod's `destinationRuleIndex`.
#[derive(Debug, Default, PartialEq)]
pub struct DestinationRules {
    root_namespace: String,
    /// Per namespace: its rules its own proxies see, looked up first.
    namespace_local: foldhash::HashMap<String, HostIndex>,
    /// Per namespace: its rules exported beyond it.
    exported: foldhash::HashMap<String, HostIndex>,
    /// The root namespace's private rules, first for proxies in the root namespace.
    root_local: HostIndex,
    /// Namespaces a rule's `exportTo` names (other than its own), with that rule's host:
    /// their proxies see rules others do not.
    named: foldhash::HashMap<String, Vec<String>>,
    /// Per namespace: its rules with a workload selector.
    selectors: foldhash::HashMap<String, Vec<Arc<ConfigObject>>>,
    /// Every rule as written, oldest first.
    written: Vec<Arc<ConfigObject>>,
    /// The rules as written for each exact host, and for each wildcard one.
    by_host: foldhash::HashMap<String, Vec<Arc<ConfigObject>>>,
    by_pattern: Vec<(String, Arc<ConfigObject>)>,
    /// Hosts whose rules, merged, named a subset twice (the later left out), with
    /// istiod's message: its `pilot_destrule_subsets`.
    pub duplicate_subsets: BTreeMap<String, String>,
}

/// A DestinationRule's spec.
pub fn spec(rule: &ConfigObject) -> Option<&DestinationRuleSpec> {
    match &rule.spec {
        Spec::DestinationRule(spec) => Some(spec),
        _ => None,
    }
}

impl DestinationRules {
    /// Indexes `rules` (DestinationRules, in any order) as istiod's `setDestinationRules`.
    pub fn new(mut rules: Vec<Arc<ConfigObject>>, mesh: &MeshConfig) -> DestinationRules {
        rules.retain(|r| spec(r).is_some());
        // Oldest first, then by key; rules with a selector before the rest.
        super::push_context::by_age(&mut rules);
        let written = rules.clone();
        rules.sort_by_key(|r| spec(r).is_some_and(|s| s.workload_selector.is_none()));
        let root = mesh.root_namespace();
        let private_by_default = mesh
            .default_destination_rule_export_to
            .iter()
            .any(|e| e == ".");
        let mut index = DestinationRules {
            root_namespace: root.to_string(),
            written,
            ..DestinationRules::default()
        };
        for rule in &rules {
            let ns = rule.key.namespace.as_str();
            let spec = spec(rule).expect("kept above");
            let host = resolve_host(&spec.host, ns);
            if host.starts_with('*') {
                index.by_pattern.push((host.clone(), rule.clone()));
            } else {
                (index.by_host.entry(host.clone()).or_default()).push(rule.clone());
            }
            let export_to: BTreeSet<String> = match spec.workload_selector {
                // A rule for some workloads is never exported.
                Some(_) => [".".to_string()].into(),
                None => spec.export_to.iter().cloned().collect(),
            };
            if spec.workload_selector.is_some() {
                index
                    .selectors
                    .entry(ns.to_string())
                    .or_default()
                    .push(rule.clone());
            }
            let seen_at_home = export_to.is_empty()
                || export_to.contains("*")
                || export_to.contains(".")
                || export_to.contains(ns);
            if seen_at_home {
                (index.namespace_local.entry(ns.to_string()).or_default()).merge(
                    &host,
                    rule,
                    &export_to,
                    &mut index.duplicate_subsets,
                );
            }
            let private = (export_to.is_empty() && private_by_default)
                || (export_to.len() == 1 && (export_to.contains(".") || export_to.contains(ns)));
            if !private {
                (index.exported.entry(ns.to_string()).or_default()).merge(
                    &host,
                    rule,
                    &export_to,
                    &mut index.duplicate_subsets,
                );
                for other in &export_to {
                    if !matches!(other.as_str(), "*" | ".") && other != ns {
                        index
                            .named
                            .entry(other.clone())
                            .or_default()
                            .push(host.clone());
                    }
                }
            } else if ns == root {
                index
                    .root_local
                    .merge(&host, rule, &export_to, &mut index.duplicate_subsets);
            }
        }
        let mut merged = HashMap::new();
        (index.namespace_local.values_mut())
            .chain(index.exported.values_mut())
            .chain(std::iter::once(&mut index.root_local))
            .for_each(|i| i.finish(&mut merged));
        index
    }

    /// The rules a proxy of `namespace` looks at first: its namespace's own, or the root
    /// namespace's private ones for a proxy in the root namespace.
    fn own(&self, namespace: &str) -> Option<&HostIndex> {
        if namespace == self.root_namespace {
            Some(&self.root_local)
        } else {
            self.namespace_local.get(namespace)
        }
    }

    /// The rule a proxy in `namespace` with `labels` (read only when a rule of the
    /// namespace has a workload selector) gets for `host`, whose service is in
    /// `service_namespace` (`None`: no service has that host).
    pub fn choose<'a, 'l>(
        &'a self,
        namespace: &str,
        labels: impl FnOnce() -> &'l BTreeMap<String, String>,
        host: &str,
        service_namespace: Option<&str>,
    ) -> Option<&'a Arc<ConfigObject>> {
        self.find(namespace, Some(labels), host, service_namespace)
    }

    /// The rule istiod applies to a proxy's inbound cluster for its service `host`
    /// (`SidecarScope.DestinationRule` for inbound traffic): found as [`Self::choose`]
    /// finds it, but a rule with a workload selector never applies.
    pub fn choose_inbound<'a>(
        &'a self,
        namespace: &str,
        host: &str,
        service_namespace: &str,
    ) -> Option<&'a Arc<ConfigObject>> {
        let no_labels: Option<fn() -> &'static BTreeMap<String, String>> = None;
        self.find(namespace, no_labels, host, Some(service_namespace))
    }

    /// [`Self::choose`]; without `labels`, rules with a selector are passed over.
    fn find<'a, 'l>(
        &'a self,
        namespace: &str,
        labels: Option<impl FnOnce() -> &'l BTreeMap<String, String>>,
        host: &str,
        service_namespace: Option<&str>,
    ) -> Option<&'a Arc<ConfigObject>> {
        // Most hosts have no rule at all: one lookup says so.
        if self.by_pattern.is_empty() && !self.by_host.contains_key(host) {
            return None;
        }
        if let Some(rules) = self.own(namespace).and_then(|i| i.most_specific(host)) {
            return self.select(rules.iter(), namespace, labels);
        }
        let exported_to_proxy = |owner: &str| {
            let rules = self.exported.get(owner)?.most_specific(host)?;
            let mut seen = rules
                .iter()
                .filter(|c| {
                    c.export_to.is_empty()
                        || c.export_to.contains("*")
                        || c.export_to.contains(namespace)
                })
                .peekable();
            seen.peek().is_some().then_some(seen)
        };
        let found = service_namespace
            .and_then(exported_to_proxy)
            .or_else(|| exported_to_proxy(&self.root_namespace))?;
        self.select(found, namespace, labels)
    }

    /// `SidecarScope.DestinationRule`: the rule whose selector the proxy's labels match
    /// (when there are labels to match), else the last one without a selector.
    fn select<'a, 'l>(
        &'a self,
        rules: impl Iterator<Item = &'a Consolidated>,
        namespace: &str,
        mut labels: Option<impl FnOnce() -> &'l BTreeMap<String, String>>,
    ) -> Option<&'a Arc<ConfigObject>> {
        let selecting = labels.is_some();
        let mut read: Option<&'l BTreeMap<String, String>> = None;
        let mut catch_all = None;
        for c in rules {
            match &c.selector {
                None => catch_all = Some(&c.rule),
                Some(selector) if selecting && c.rule.key.namespace == namespace => {
                    let labels = *read.get_or_insert_with(|| (labels.take().unwrap())());
                    if labels_match(selector, labels) {
                        return Some(&c.rule);
                    }
                }
                Some(_) => {}
            }
        }
        catch_all
    }

    /// Whether some rule of `namespace` selects workloads: only then do a proxy's labels
    /// matter.
    pub fn selects_in(&self, namespace: &str) -> bool {
        self.selectors.contains_key(namespace)
    }

    /// The rules of `namespace` with a selector that `labels` match.
    pub fn selecting<'a>(
        &'a self,
        namespace: &str,
        labels: &'a BTreeMap<String, String>,
    ) -> impl Iterator<Item = &'a Arc<ConfigObject>> {
        (self.selectors.get(namespace).into_iter().flatten()).filter(|r| {
            spec(r)
                .and_then(|s| s.workload_selector.as_ref())
                .is_some_and(|s| labels_match(&s.match_labels, labels))
        })
    }

    /// Whether proxies of `namespace` may get a rule for some host that a proxy of a
    /// namespace no rule singles out does not ([`DestinationRules::exceptional_hosts`]).
    pub fn singles_out(&self, namespace: &str) -> bool {
        self.own(namespace)
            .is_some_and(|i| !i.exact.is_empty() || !i.wildcard.is_empty())
            || self.named.contains_key(namespace)
    }

    /// The host patterns whose rule may differ, for proxies of `namespace`, from what a
    /// proxy of a namespace no rule singles out gets. Empty for most namespaces.
    pub fn exceptional_hosts(&self, namespace: &str) -> HashSet<&str> {
        (self
            .own(namespace)
            .into_iter()
            .flat_map(HostIndex::patterns))
        .chain(
            self.named
                .get(namespace)
                .into_iter()
                .flatten()
                .map(String::as_str),
        )
        .collect()
    }

    /// Every rule as written, oldest first.
    pub fn values(&self) -> impl Iterator<Item = &Arc<ConfigObject>> + Clone {
        self.written.iter()
    }

    /// Whether some rule for `host`, in any namespace, defines `subset`.
    pub fn defines_subset(&self, host: &str, subset: &str) -> bool {
        let exact = self.by_host.get(host).into_iter().flatten();
        let wildcard = (self.by_pattern.iter())
            .filter(|(pattern, _)| host_covers(pattern, host))
            .map(|(_, rule)| rule);
        exact
            .chain(wildcard)
            .filter_map(|r| spec(r))
            .any(|s| s.subsets.iter().any(|s| s.name == subset))
    }
}

#[cfg(test)]
mod tests {
    use api::WorkloadSelector;
    use api::networking::{
        ConnectionPoolSettings, DestinationRuleSpec, Subset, TcpSettings, TrafficPolicy,
    };

    use super::*;
    use crate::builders::{created, mesh_config, object, service, sidecar};
    use crate::config::{ConfigObject, Spec};
    use crate::mesh::MeshConfig;
    use crate::{Proxy, PushContext};

    /// reviews, ratings and details in shop, each with one HTTP port.
    fn services() -> Vec<ConfigObject> {
        [
            ("reviews", "10.96.0.10"),
            ("ratings", "10.96.0.11"),
            ("details", "10.96.0.12"),
        ]
        .into_iter()
        .map(|(name, ip)| service("shop", name, ip).port("http", 9080).build())
        .collect()
    }

    /// A rule named `name` in `ns` for `host`, created at second `age`, as `edit` leaves it.
    fn rule(
        ns: &str,
        name: &str,
        age: u32,
        host: &str,
        edit: impl FnOnce(&mut DestinationRuleSpec),
    ) -> ConfigObject {
        let mut spec = DestinationRuleSpec {
            host: host.into(),
            ..DestinationRuleSpec::default()
        };
        edit(&mut spec);
        created(object(ns, name, Spec::DestinationRule(spec)), age)
    }

    fn export_to(namespaces: &[&str]) -> impl FnOnce(&mut DestinationRuleSpec) {
        let namespaces: Vec<String> = namespaces.iter().map(|n| n.to_string()).collect();
        move |r| r.export_to = namespaces
    }

    fn subset(name: &str, version: &str) -> Subset {
        Subset {
            name: name.into(),
            labels: [("version".to_string(), version.to_string())].into(),
            ..Subset::default()
        }
    }

    fn max_connections(n: i32) -> Option<TrafficPolicy> {
        Some(TrafficPolicy {
            connection_pool: Some(ConnectionPoolSettings {
                tcp: Some(TcpSettings {
                    max_connections: Some(n),
                    ..TcpSettings::default()
                }),
                ..ConnectionPoolSettings::default()
            }),
            ..TrafficPolicy::default()
        })
    }

    /// The push context of the three services and `rules`.
    fn context(rules: impl IntoIterator<Item = ConfigObject>) -> PushContext {
        crate::builders::context(services().into_iter().chain(rules))
    }

    fn proxy(ns: &str, app: &str) -> Proxy {
        sidecar(ns, app, "10.9.9.9", &[("app", app)])
    }

    /// The name of the rule `proxy` gets for `host` (a short name in shop).
    fn chosen(ctx: &PushContext, proxy: &Proxy, host: &str) -> Option<String> {
        let host = resolve_host(host, "shop");
        (ctx.destination_rule(proxy, &host)).map(|r| r.key.name.clone())
    }

    #[test]
    fn the_proxys_namespace_then_the_services_then_the_root_namespace() {
        let ctx = context([
            rule("shop", "reviews", 1, "reviews", |_| {}),
            rule("istio-system", "mesh", 2, "*.local", |_| {}),
            // Seen by frontend's proxies only.
            rule(
                "frontend",
                "frontend-reviews",
                3,
                "reviews.shop.svc.cluster.local",
                export_to(&["."]),
            ),
            // Private to shop: proxies elsewhere fall through to the mesh-wide rule.
            rule("shop", "ratings", 4, "ratings", export_to(&["."])),
        ]);
        let (shop, frontend, billing) = (
            proxy("shop", "a"),
            proxy("frontend", "a"),
            proxy("billing", "a"),
        );
        assert_eq!(
            chosen(&ctx, &frontend, "reviews").as_deref(),
            Some("frontend-reviews")
        );
        assert_eq!(chosen(&ctx, &shop, "reviews").as_deref(), Some("reviews"));
        assert_eq!(
            chosen(&ctx, &billing, "reviews").as_deref(),
            Some("reviews")
        );
        assert_eq!(chosen(&ctx, &shop, "ratings").as_deref(), Some("ratings"));
        assert_eq!(chosen(&ctx, &billing, "ratings").as_deref(), Some("mesh"));
        assert_eq!(chosen(&ctx, &billing, "details").as_deref(), Some("mesh"));
        // A host no service has: only the root namespace's rules can apply.
        assert_eq!(
            chosen(&ctx, &billing, "api.example.local").as_deref(),
            Some("mesh")
        );
        assert_eq!(chosen(&ctx, &billing, "api.example.com"), None);
        // Only frontend sees its own rule differently from everyone else.
        let rules = &ctx.destination_rules;
        assert!(rules.singles_out("frontend") && rules.singles_out("shop"));
        assert!(!rules.singles_out("billing"));
        assert_eq!(ctx.destination_rule_exceptions(&billing), []);
        let exceptions = ctx.destination_rule_exceptions(&frontend);
        assert_eq!(exceptions.len(), 1);
        assert_eq!(exceptions[0].0, "reviews.shop.svc.cluster.local");
        let shop_exceptions = ctx.destination_rule_exceptions(&shop);
        assert_eq!(
            shop_exceptions
                .iter()
                .map(|(h, _)| h.as_str())
                .collect::<Vec<_>>(),
            ["ratings.shop.svc.cluster.local"]
        );
    }

    #[test]
    fn export_to_named_namespaces_and_the_root_namespaces_private_rules() {
        let ctx = context([
            rule("shop", "details", 1, "details", export_to(&["billing"])),
            rule("istio-system", "mesh", 2, "*.local", |_| {}),
            rule(
                "istio-system",
                "gateway-only",
                3,
                "reviews.shop.svc.cluster.local",
                export_to(&["."]),
            ),
            // A third namespace's rule reaches only its own proxies, as istiod's.
            rule(
                "frontend",
                "frontends-ratings",
                4,
                "ratings.shop.svc.cluster.local",
                export_to(&["*"]),
            ),
        ]);
        let (billing, frontend, shop) = (
            proxy("billing", "a"),
            proxy("frontend", "a"),
            proxy("shop", "a"),
        );
        let gateway = proxy("istio-system", "ingressgateway");
        assert_eq!(
            chosen(&ctx, &billing, "details").as_deref(),
            Some("details")
        );
        assert_eq!(chosen(&ctx, &frontend, "details").as_deref(), Some("mesh"));
        // Exported only to billing, so not seen in its own namespace either.
        assert_eq!(chosen(&ctx, &shop, "details").as_deref(), Some("mesh"));
        assert!(ctx.destination_rules.singles_out("billing"));
        assert_eq!(ctx.destination_rule_exceptions(&billing).len(), 1);
        // The root namespace's private rule is for its own proxies.
        assert_eq!(
            chosen(&ctx, &gateway, "reviews").as_deref(),
            Some("gateway-only")
        );
        assert_eq!(chosen(&ctx, &shop, "reviews").as_deref(), Some("mesh"));
        assert_eq!(chosen(&ctx, &gateway, "ratings").as_deref(), Some("mesh"));
        assert_eq!(
            chosen(&ctx, &frontend, "ratings").as_deref(),
            Some("frontends-ratings")
        );
        assert_eq!(chosen(&ctx, &billing, "ratings").as_deref(), Some("mesh"));
    }

    #[test]
    fn rules_for_one_host_merge_their_subsets_and_the_first_traffic_policy_wins() {
        let ctx = context([
            rule("shop", "reviews-v1", 1, "reviews", |r| {
                r.subsets = vec![subset("v1", "v1")]
            }),
            rule("shop", "reviews-v2", 2, "reviews", |r| {
                r.traffic_policy = max_connections(2);
                r.subsets = vec![subset("v2", "v2"), subset("v1", "other")];
            }),
            rule("shop", "reviews-v3", 3, "reviews", |r| {
                r.traffic_policy = max_connections(3);
                r.subsets = vec![subset("v3", "v3")];
            }),
        ]);
        for p in [proxy("shop", "a"), proxy("billing", "a")] {
            let host = resolve_host("reviews", "shop");
            let merged = ctx.destination_rule_spec(&p, &host).unwrap();
            let subsets: Vec<_> = merged
                .subsets
                .iter()
                .map(|s| (&*s.name, &s.labels["version"][..]))
                .collect();
            assert_eq!(subsets, [("v1", "v1"), ("v2", "v2"), ("v3", "v3")]);
            let pool = merged
                .traffic_policy
                .as_ref()
                .unwrap()
                .connection_pool
                .as_ref();
            assert_eq!(pool.unwrap().tcp.as_ref().unwrap().max_connections, Some(2));
            assert_eq!(
                ctx.destination_rule(&p, &host).unwrap().key.name,
                "reviews-v1"
            );
        }
        // The second rule's v1 was left out, as istiod notes it (`pilot_destrule_subsets`).
        let host = resolve_host("reviews", "shop");
        assert_eq!(
            ctx.destination_rules.duplicate_subsets,
            [(
                host.clone(),
                format!("Duplicate subset v1 found while merging destination rules for {host}")
            )]
            .into()
        );
        // The namespace-local and the exported merge are one rule: no proxy is singled out.
        assert_eq!(ctx.destination_rule_exceptions(&proxy("shop", "a")), []);
        assert!(
            ctx.destination_rules
                .defines_subset(&resolve_host("reviews", "shop"), "v3")
        );
        assert!(
            !ctx.destination_rules
                .defines_subset(&resolve_host("reviews", "shop"), "v4")
        );
        // Different exportTo: kept apart. Shop's proxies see both and, as istiod's
        // `SidecarScope.DestinationRule`, take the last one without a selector.
        let apart = context([
            rule("shop", "public", 1, "reviews", |r| {
                r.subsets = vec![subset("v1", "v1")]
            }),
            rule("shop", "private", 2, "reviews", |r| {
                r.export_to = vec![".".into()];
                r.subsets = vec![subset("v2", "v2")];
            }),
        ]);
        let subsets = |p: &Proxy| {
            let rule = apart
                .destination_rule_spec(p, &resolve_host("reviews", "shop"))
                .unwrap();
            rule.subsets
                .iter()
                .map(|s| s.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(subsets(&proxy("billing", "a")), ["v1"]);
        assert_eq!(subsets(&proxy("shop", "a")), ["v2"]);
        assert!(
            apart.destination_rules.duplicate_subsets.is_empty(),
            "nothing merged"
        );
    }

    #[test]
    fn a_workload_selector_picks_the_proxies_of_its_namespace_it_selects() {
        let for_productpage = || {
            rule("shop", "for-productpage", 2, "reviews", |r| {
                r.workload_selector = Some(WorkloadSelector {
                    match_labels: [("app".to_string(), "productpage".to_string())].into(),
                })
            })
        };
        let ctx = context([
            rule("shop", "reviews", 1, "reviews", |_| {}),
            for_productpage(),
        ]);
        let (productpage, ratings) = (proxy("shop", "productpage"), proxy("shop", "ratings"));
        let billing = proxy("billing", "productpage");
        assert_eq!(
            chosen(&ctx, &productpage, "reviews").as_deref(),
            Some("for-productpage")
        );
        assert_eq!(
            chosen(&ctx, &ratings, "reviews").as_deref(),
            Some("reviews")
        );
        // A selecting rule is never exported.
        assert_eq!(
            chosen(&ctx, &billing, "reviews").as_deref(),
            Some("reviews")
        );
        assert_eq!(ctx.destination_rule_exceptions(&ratings), []);
        assert_eq!(ctx.destination_rule_exceptions(&productpage).len(), 1);
        // Only a selecting rule for the host, and a proxy it does not select: none.
        let alone = context([for_productpage()]);
        assert_eq!(chosen(&alone, &ratings, "reviews"), None);
        assert_eq!(
            chosen(&alone, &productpage, "reviews").as_deref(),
            Some("for-productpage")
        );
    }

    #[test]
    fn a_mesh_config_default_export_to_dot_keeps_rules_without_one_at_home() {
        let mesh = MeshConfig {
            default_destination_rule_export_to: vec![".".into()],
            ..MeshConfig::default()
        };
        let ctx = context([
            mesh_config(mesh),
            rule("shop", "reviews", 1, "reviews", |_| {}),
            rule("shop", "ratings", 2, "ratings", export_to(&["*"])),
        ]);
        let (shop, billing) = (proxy("shop", "a"), proxy("billing", "a"));
        assert_eq!(chosen(&ctx, &shop, "reviews").as_deref(), Some("reviews"));
        assert_eq!(chosen(&ctx, &billing, "reviews"), None);
        assert_eq!(
            chosen(&ctx, &billing, "ratings").as_deref(),
            Some("ratings")
        );
    }
}
