//! Encoded per-service resources, shared by every proxy and kept across pushes.
//!
//! Most of what an unscoped sidecar receives is per service: its clusters and load
//! assignments, and the virtual host of its route configuration when no VirtualService
//! routes it. Those are translated and encoded once per service here, not once per view
//! and push: an entry stays valid while the service, its DestinationRule and the trust
//! domain are the ones it was built from (the same `Arc` within a push, equal values in a
//! later push that rebuilt an unchanged service). A change to one service re-encodes only
//! that service; a view is then assembled from shared `Arc`s and byte slices.
//!
//! The per-service clusters and load assignments of a view are kept as whole sets too,
//! shared by every view of the same push with the same service list (the unscoped
//! sidecars of every namespace): only the first such view assembles them.
//!
//! A gateway's virtual hosts are assembled from the encoded routes of each VirtualService
//! bound to it, cached per VirtualService and server like a sidecar's routed virtual
//! hosts: a change to one VirtualService translates and encodes its routes only.
//!
//! Route configurations are assembled from encoded virtual hosts: protobuf concatenates
//! the occurrences of a repeated field, and `virtual_hosts` (field 2) follows `name`
//! (field 1) in prost's field order, so `name`, the virtual hosts, then the other fields
//! are exactly the bytes prost would write for the whole message.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost};
use prometheus_client::metrics::counter::Counter;
use prost::Message;

use super::resource::{
    Resource, ResourceSet, TypeKind, View, encode, encode_cluster, from_bytes, from_pieces,
    resource_map,
};
use crate::api::networking::LocalityLoadBalancerSetting;
use crate::config::{ConfigObject, Kind, ObjectKey, Spec};
use crate::metrics::{Metrics, type_label};
use crate::model::network::NetworkGateways;
use crate::model::{Proxy, ProxyKind, PushContext, Service};
use crate::translate::locality::{self, Place};
use crate::translate::route::{Audience, GatewayRoutes, GatewayVirtualHost, VirtualHostPlan};
use crate::translate::{self};

/// Field number of `RouteConfiguration.virtual_hosts`.
const VIRTUAL_HOSTS: u32 = 2;
/// Field number of `VirtualHost.routes`.
const ROUTES: u32 = 3;

/// One service's clusters and the load assignments of its EDS clusters, encoded.
#[derive(Debug)]
pub struct ServiceResources {
    pub clusters: Vec<Arc<Resource>>,
    pub endpoints: Vec<Arc<Resource>>,
}

/// What is cached for one service and one DestinationRule: a service whose proxies get
/// different rules (namespace-local rules, `exportTo`, workload selectors) has an entry
/// per rule.
struct HostEntry {
    service: Arc<Service>,
    rule: Option<Arc<ConfigObject>>,
    /// The id of the last context that read it: of too many entries for one service, the
    /// least recently read goes.
    used: u64,
    trust_domain: Option<String>,
    /// MeshConfig's `localityLbSetting` (boxed: entries stay small, and it is rarely set).
    mesh_locality: Option<Box<LocalityLoadBalancerSetting>>,
    /// The networks' gateways, which split load assignments by network.
    networks: Arc<NetworkGateways>,
    /// `Some`: the load assignments are balanced by locality and depend on the proxy's
    /// [`Place`]: its locality and these labels.
    dependence: Option<Box<[String]>>,
    /// By [`slot`]: proxy kind × plaintext/secure.
    clusters: [Option<Arc<ServiceResources>>; 4],
    /// With a dependence, by slot and (restricted) place instead.
    placed: Vec<(usize, Place, Arc<ServiceResources>)>,
    /// `(port, who reads it)` → the encoded `virtual_hosts` field.
    vhosts: Vec<(u32, Audience, Arc<[u8]>)>,
    /// The service's virtual hosts routed by a VirtualService, encoded.
    routed: Vec<RoutedHost>,
}

impl HostEntry {
    /// Whether it was built from `svc` and `ctx`'s trust domain and mesh-wide balancing
    /// (what every entry of one service shares; each has its own rule).
    fn built_from(&self, ctx: &PushContext, svc: &Arc<Service>) -> bool {
        same(Some(&self.service), Some(svc))
            && self.trust_domain == ctx.mesh.trust_domain
            && self.mesh_locality.as_deref() == ctx.mesh.locality_lb_setting.as_ref()
            && (Arc::ptr_eq(&self.networks, &ctx.networks) || self.networks == ctx.networks)
    }
}

/// One encoded routed virtual host and what it was built from besides the service.
struct RoutedHost {
    port: u32,
    audience: Audience,
    /// The context it was built for: proxies whose destinations get other rules build
    /// their own, and only what earlier contexts built is replaced.
    ctx: u64,
    vs: Arc<ConfigObject>,
    /// The services its routes lead to and their DestinationRules, as they were (the
    /// services' ports name the clusters, the rules' consistent hashes the hash policies).
    destinations: Vec<Destination>,
    bytes: Arc<[u8]>,
}

/// A host a cached virtual host routes to, as it was when the host was built.
struct Destination {
    host: String,
    service: Option<Arc<Service>>,
    rule: Option<Arc<ConfigObject>>,
}

impl Destination {
    fn now(ctx: &PushContext, proxy: &Proxy, host: String) -> Destination {
        let (service, rule) = Destination::inputs(ctx, proxy, &host);
        Destination {
            service: service.cloned(),
            rule: rule.cloned(),
            host,
        }
    }

    /// The host's service and its DestinationRule for `proxy`, in `ctx`.
    fn inputs<'a>(
        ctx: &'a PushContext,
        proxy: &Proxy,
        host: &str,
    ) -> (Option<&'a Arc<Service>>, Option<&'a Arc<ConfigObject>>) {
        match ctx.services.get(host) {
            Some(svc) => (Some(svc), ctx.service_rule(proxy, svc)),
            None => (None, ctx.destination_rule(proxy, host)),
        }
    }

    /// Whether the host's service and rule are the ones it was built from; if so, it
    /// takes `ctx`'s, so that later readers compare pointers only.
    fn unchanged(&mut self, ctx: &PushContext, proxy: &Proxy) -> bool {
        let (service, rule) = Destination::inputs(ctx, proxy, &self.host);
        if !(same(service, self.service.as_ref()) && same(rule, self.rule.as_ref())) {
            return false;
        }
        self.service = service.cloned();
        self.rule = rule.cloned();
        true
    }
}

/// Entries kept per service, one per DestinationRule its proxies get.
const RULE_VARIANTS: usize = 4;

/// Whether two optional inputs are the same: one `Arc` (the common case within a push and
/// across incremental pushes), else equal values.
fn same<T: PartialEq>(a: Option<&Arc<T>>, b: Option<&Arc<T>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || **a == **b,
        _ => false,
    }
}

fn slot(kind: ProxyKind, secure: bool) -> usize {
    (kind == ProxyKind::Router) as usize * 2 + secure as usize
}

/// What a view's shared cluster and load-assignment sets are built from: one push
/// context, the proxy kind and mTLS ([`slot`]), its services (by identity) and the
/// view's own clusters and load assignments (by content hash: the fallback and inbound
/// clusters, a gateway's SNI-DNAT ones).
#[derive(Clone, PartialEq, Eq, Hash)]
struct SetKey {
    ctx: u64,
    slot: usize,
    services: Vec<usize>,
    own: Vec<u64>,
    /// Where the proxies are (their locality and the labels failover priorities
    /// compare), when the context balances some service by locality.
    place: Option<Place>,
    /// The services whose DestinationRule for these proxies is not the common one
    /// ([`PushContext::destination_rule_exceptions`]); `None` for most proxies.
    rules: Option<Arc<[(String, usize)]>>,
}

/// A view's cluster and load-assignment sets, shared.
type Sets = (Arc<ResourceSet>, Arc<ResourceSet>);

/// The sets of the most recent push contexts' views.
#[derive(Default)]
struct SetMemo {
    /// Contexts with entries, oldest first (at most [`SET_CONTEXTS`]).
    contexts: Vec<u64>,
    sets: foldhash::HashMap<SetKey, Sets>,
}

/// Push contexts whose sets are kept: the newest, and the one before it for the views
/// an earlier push still builds.
const SET_CONTEXTS: usize = 2;

/// A context's id and, when it balances some service by locality, the proxy labels its
/// failover priorities compare.
type LocalityMemo = (u64, Option<Arc<[String]>>);

/// A context's id and, by namespace and the selecting rules a proxy's labels match, the
/// [`PushContext::destination_rule_exceptions`] of its proxies.
type ExceptionMemo = (u64, ExceptionsByProxy);
type ExceptionsByProxy = foldhash::HashMap<(String, Vec<usize>), Option<Arc<[(String, usize)]>>>;

/// The cache, shared by every push of one pipeline.
#[derive(Default)]
pub struct ResourceCache {
    hosts: Mutex<foldhash::HashMap<String, Vec<HostEntry>>>,
    sets: Mutex<SetMemo>,
    /// [`ResourceCache::locality_labels`] of the latest context asked about.
    locality_memo: Mutex<Option<LocalityMemo>>,
    /// Of the latest context asked about.
    exception_memo: Mutex<Option<ExceptionMemo>>,
    vhds: Mutex<VhdsMemo>,
    /// By [`gateway_routes_key`].
    gateway_routes: Mutex<foldhash::HashMap<u64, Vec<GatewayRoutesEntry>>>,
    gateway_hosts: Mutex<GatewayHostMemo>,
    hits: Counter,
    misses: Counter,
}

/// The routes one VirtualService gives a gateway server ([`GatewayRoutes`]), encoded as
/// a run of `VirtualHost.routes` fields, and what they were built from.
struct GatewayRoutesEntry {
    port: u32,
    gateway: Box<str>,
    /// The context it was built for, as [`RoutedHost::ctx`].
    ctx: u64,
    vs: Arc<ConfigObject>,
    destinations: Vec<Destination>,
    bytes: Arc<[u8]>,
}

/// Values kept for the newest push context asked about and the one before it: the views
/// of a push, and of the next, share them, and whatever neither used goes when a newer
/// context asks.
struct Generations<K, V> {
    /// The newest context asked about.
    ctx: u64,
    /// Used for it, and for the one before (kept until the next context).
    current: foldhash::HashMap<K, V>,
    previous: foldhash::HashMap<K, V>,
}

impl<K, V> Default for Generations<K, V> {
    fn default() -> Self {
        Generations {
            ctx: 0,
            current: Default::default(),
            previous: Default::default(),
        }
    }
}

impl<K: std::hash::Hash + Eq, V> Generations<K, V> {
    /// The value of `key` for context `ctx`: this generation's, else the last one's (kept
    /// on), else `make`'s.
    fn get(&mut self, ctx: u64, key: K, make: impl FnOnce() -> V) -> &mut V {
        if ctx > self.ctx {
            self.ctx = ctx;
            self.previous = std::mem::take(&mut self.current);
        }
        match self.current.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let kept = self.previous.remove(e.key());
                e.insert(kept.unwrap_or_else(make))
            }
        }
    }
}

/// Encoded gateway virtual hosts (`virtual_hosts` fields), by a hash of their host, port
/// and route runs (which the entries hold, so that their addresses stay theirs): the
/// gateway views of a push, and of the next, share them, and so do the VHDS resources
/// made from them.
type GatewayHostMemo = Generations<u64, Vec<GatewayHostField>>;

struct GatewayHostField {
    host: String,
    port: u32,
    runs: Vec<Arc<[u8]>>,
    field: Arc<[u8]>,
}

/// VHDS resources by the encoded virtual host they were made from (its allocation, which
/// the memo holds so that the address stays its own) and their route configuration: the
/// views of a push, and of the next, share them as they share the virtual hosts.
type VhdsMemo = Generations<(usize, Arc<str>), (Arc<[u8]>, Arc<Resource>)>;

impl ResourceCache {
    /// A cache counting its reads in `pilot_xds_cache_reads{type="hit"|"miss"}`.
    pub fn new(metrics: &Metrics) -> ResourceCache {
        ResourceCache {
            hits: metrics
                .xds_cache_reads
                .get_or_create(&type_label("hit"))
                .clone(),
            misses: metrics
                .xds_cache_reads
                .get_or_create(&type_label("miss"))
                .clone(),
            ..ResourceCache::default()
        }
    }

    /// `(hits, misses)` so far.
    pub fn reads(&self) -> (u64, u64) {
        (self.hits.get(), self.misses.get())
    }

    /// Number of services with an entry.
    pub fn len(&self) -> usize {
        self.hosts.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops what `ctx` can no longer use: the entries of services it does not have, and,
    /// when the push that brings it may have changed routing (`changed` names a
    /// VirtualService or Gateway, or is `None` for a full push), the gateway routes of
    /// VirtualServices it does not have in the form they were built from, or of Gateway
    /// servers it does not have.
    pub fn retain_services_of(&self, ctx: &PushContext, changed: Option<&BTreeSet<ObjectKey>>) {
        self.hosts
            .lock()
            .unwrap()
            .retain(|host, _| ctx.services.contains_key(host));
        let routing_changed = changed.is_none_or(|keys| {
            (keys.iter()).any(|k| matches!(k.kind, Kind::VirtualService | Kind::Gateway))
        });
        let mut gateway_routes = self.gateway_routes.lock().unwrap();
        if !routing_changed || gateway_routes.is_empty() {
            return;
        }
        let virtual_services: HashMap<&ObjectKey, &Arc<ConfigObject>> =
            (ctx.virtual_services.iter())
                .map(|vs| (&vs.key, vs))
                .collect();
        // Each Gateway's server ports, by `namespace/name`.
        let servers: HashMap<String, Vec<u32>> = (ctx.gateways.iter())
            .filter_map(|g| match &g.spec {
                Spec::Gateway(spec) => Some((
                    format!("{}/{}", g.key.namespace, g.key.name),
                    spec.servers.iter().map(|s| s.port.number).collect(),
                )),
                _ => None,
            })
            .collect();
        gateway_routes.retain(|_, entries| {
            entries.retain(|e| {
                // A changed VirtualService's entries can never be read again.
                let vs = virtual_services.get(&e.vs.key);
                vs.is_some_and(|vs| same(Some(vs), Some(&e.vs)))
                    && (servers.get(&*e.gateway)).is_some_and(|ports| ports.contains(&e.port))
            });
            !entries.is_empty()
        });
    }

    /// Runs `read` on the service's entry for `rule`, first dropping the service's
    /// entries if they were built from another service, trust domain or mesh-wide
    /// balancing; `None` when no entry exists yet.
    fn with_entry<T>(
        &self,
        ctx: &PushContext,
        svc: &Arc<Service>,
        rule: Option<&Arc<ConfigObject>>,
        read: impl FnOnce(&mut HostEntry) -> Option<T>,
    ) -> Option<T> {
        let mut hosts = self.hosts.lock().unwrap();
        let entries = hosts.get_mut(&svc.hostname)?;
        if !entries.first().is_some_and(|e| e.built_from(ctx, svc)) {
            hosts.remove(&svc.hostname);
            return None;
        }
        let entry = entries.iter_mut().find(|e| same(e.rule.as_ref(), rule))?;
        // Later readers of this push compare pointers only.
        entry.service = svc.clone();
        entry.rule = rule.cloned();
        entry.used = ctx.id();
        read(entry)
    }

    /// Stores with `write` into the service's entry for `rule`, creating it for these
    /// inputs.
    fn store(
        &self,
        ctx: &PushContext,
        svc: &Arc<Service>,
        rule: Option<&Arc<ConfigObject>>,
        write: impl FnOnce(&mut HostEntry),
    ) {
        let mut hosts = self.hosts.lock().unwrap();
        let entries = hosts.entry(svc.hostname.clone()).or_default();
        // A concurrent builder (of another push) may have replaced the entries for other
        // inputs: keep theirs.
        if entries.first().is_some_and(|e| !e.built_from(ctx, svc)) {
            return;
        }
        let i = match entries.iter().position(|e| same(e.rule.as_ref(), rule)) {
            Some(i) => i,
            None => {
                if entries.len() >= RULE_VARIANTS
                    && let Some(oldest) = (0..entries.len()).min_by_key(|&i| entries[i].used)
                {
                    entries.swap_remove(oldest);
                }
                entries.push(HostEntry {
                    service: svc.clone(),
                    rule: rule.cloned(),
                    used: ctx.id(),
                    trust_domain: ctx.mesh.trust_domain.clone(),
                    mesh_locality: ctx.mesh.locality_lb_setting.clone().map(Box::new),
                    networks: ctx.networks.clone(),
                    dependence: dependence(ctx, svc, rule).map(Vec::into_boxed_slice),
                    clusters: Default::default(),
                    placed: Vec::new(),
                    vhosts: Vec::new(),
                    routed: Vec::new(),
                });
                entries.len() - 1
            }
        };
        write(&mut entries[i]);
    }

    /// The service's clusters and load assignments under `rule` (its DestinationRule for
    /// the proxy) for a proxy of `kind` at `at`.
    pub fn service(
        &self,
        ctx: &PushContext,
        svc: &Arc<Service>,
        rule: Option<&Arc<ConfigObject>>,
        kind: ProxyKind,
        secure: bool,
        at: &Place,
    ) -> Arc<ServiceResources> {
        let i = slot(kind, secure);
        let found = self.with_entry(ctx, svc, rule, |e| {
            Some(match at.keyed(e.dependence.as_deref()) {
                None => (e.clusters[i].clone(), None),
                Some(place) => {
                    let hit = (e.placed.iter())
                        .find(|(s, p, _)| *s == i && *p == place)
                        .map(|(_, _, r)| r.clone());
                    (hit, Some(place))
                }
            })
        });
        let place = match found {
            Some((Some(hit), _)) => {
                self.hits.inc();
                return hit;
            }
            Some((None, place)) => place,
            None => at.keyed(dependence(ctx, svc, rule).as_deref()),
        };
        self.misses.inc();
        // Built for the restricted place, so that it holds for every proxy sharing it.
        let (clusters, endpoints) = translate::cluster::service(
            ctx,
            svc,
            rule.map(|r| &**r),
            kind,
            secure,
            place.as_ref().unwrap_or(&Place::default()),
        );
        let built = Arc::new(ServiceResources {
            clusters: clusters.iter().map(encode_cluster).collect(),
            endpoints: endpoints.iter().map(encode_assignment).collect(),
        });
        self.store(ctx, svc, rule, |e| match place {
            Some(place) => e.placed.push((i, place, built.clone())),
            None => e.clusters[i] = Some(built.clone()),
        });
        built
    }

    /// [`PushContext::destination_rule_exceptions`] for `proxy`, computed once per context
    /// for the proxies of a namespace whose labels select the same rules.
    fn rule_exceptions(&self, ctx: &PushContext, proxy: &Proxy) -> Option<Arc<[(String, usize)]>> {
        let rules = &ctx.destination_rules;
        if !rules.singles_out(&proxy.namespace) {
            return None;
        }
        let selecting = if rules.selects_in(&proxy.namespace) {
            let labels = ctx.proxy_labels(proxy);
            (rules.selecting(&proxy.namespace, labels))
                .map(|r| Arc::as_ptr(r) as usize)
                .collect()
        } else {
            Vec::new()
        };
        let key = (proxy.namespace.clone(), selecting);
        let mut memo = self.exception_memo.lock().unwrap();
        if memo.as_ref().is_none_or(|(id, _)| *id != ctx.id()) {
            *memo = Some((ctx.id(), Default::default()));
        }
        let (_, by_proxy) = memo.as_mut().expect("set above");
        by_proxy
            .entry(key)
            .or_insert_with(|| {
                let exceptions = ctx.destination_rule_exceptions(proxy);
                (!exceptions.is_empty()).then(|| exceptions.into())
            })
            .clone()
    }

    /// Whether some load assignment of `ctx` may depend on where the proxy is (a
    /// DestinationRule with outlier detection or `distribute`, or a mesh-wide
    /// `distribute`). Only then do views and their shared sets tell proxies apart by
    /// locality.
    pub fn locality_aware(&self, ctx: &PushContext) -> bool {
        self.locality_labels(ctx).is_some()
    }

    /// Whether some failover priority of `ctx` compares the node a proxy runs on (a
    /// service preferring the same node): then proxies are told apart by node too.
    pub fn node_aware(&self, ctx: &PushContext) -> bool {
        (self.locality_labels(ctx)).is_some_and(|l| l.iter().any(|k| k == locality::HOSTNAME_LABEL))
    }

    /// With [`ResourceCache::locality_aware`], the proxy labels any `failoverPriority` of
    /// `ctx` compares (usually none); computed once per context.
    fn locality_labels(&self, ctx: &PushContext) -> Option<Arc<[String]>> {
        let mut memo = self.locality_memo.lock().unwrap();
        if let Some((id, labels)) = &*memo
            && *id == ctx.id()
        {
            return labels.clone();
        }
        let rules = ctx
            .destination_rules
            .values()
            .filter_map(|o| match &o.spec {
                Spec::DestinationRule(d) => Some(d),
                _ => None,
            });
        let labels: Option<Arc<[String]>> = locality::context_dependence(
            &ctx.mesh,
            rules,
            ctx.services.values().map(|s| s.traffic_distribution),
        )
        .map(Into::into);
        *memo = Some((ctx.id(), labels.clone()));
        labels
    }

    /// The clusters (the services' and the view's `own`) and load assignments of a view of
    /// `ctx` for these services, shared with the other views of the same inputs.
    fn sets(
        &self,
        ctx: &PushContext,
        proxy: &Proxy,
        services: &[&Arc<Service>],
        at: &Place,
        (own, own_endpoints): (Vec<Arc<Resource>>, Vec<Arc<Resource>>),
    ) -> Sets {
        let (kind, secure) = (proxy.kind, proxy.identity.is_some());
        let key = SetKey {
            ctx: ctx.id(),
            slot: slot(kind, secure),
            services: services.iter().map(|s| Arc::as_ptr(*s) as usize).collect(),
            own: (own.iter().chain(&own_endpoints)).map(|r| r.hash).collect(),
            place: at.keyed(self.locality_labels(ctx).as_deref()),
            rules: self.rule_exceptions(ctx, proxy),
        };
        if let Some(sets) = self.sets.lock().unwrap().sets.get(&key) {
            return sets.clone();
        }
        let (mut clusters, mut endpoints) = (Vec::new(), Vec::new());
        for svc in services {
            let rule = ctx.service_rule(proxy, svc);
            let parts = self.service(ctx, svc, rule, kind, secure, at);
            clusters.extend(parts.clusters.iter().cloned());
            endpoints.extend(parts.endpoints.iter().cloned());
        }
        clusters.extend(own);
        endpoints.extend(own_endpoints);
        let sets = (
            Arc::new(resource_map(clusters).into()),
            Arc::new(resource_map(endpoints).into()),
        );
        let mut memo = self.sets.lock().unwrap();
        if !memo.contexts.contains(&key.ctx) {
            memo.contexts.push(key.ctx);
            if memo.contexts.len() > SET_CONTEXTS {
                let oldest = memo.contexts.remove(0);
                memo.sets.retain(|k, _| k.ctx != oldest);
            }
        }
        // The services are alive in `ctx`, so their addresses name them while the
        // context's entries are kept.
        memo.sets.entry(key).or_insert(sets).clone()
    }

    /// The encoded virtual host `field` of `route_config` as a VHDS resource
    /// ([`vhds_resource`]), shared with the other views of this context and the last.
    pub fn vhds_virtual_host(
        &self,
        ctx: &PushContext,
        route_config: &str,
        field: &Arc<[u8]>,
    ) -> Arc<Resource> {
        let key = (
            Arc::as_ptr(field) as *const u8 as usize,
            Arc::<str>::from(route_config),
        );
        let mut memo = self.vhds.lock().unwrap();
        let (_, r) = memo.get(ctx.id(), key, || {
            (field.clone(), vhds_resource(route_config, field))
        });
        r.clone()
    }

    /// The service's default virtual host on `port` under `rule` (its DestinationRule for
    /// the proxy), as an encoded `virtual_hosts` field.
    pub fn default_virtual_host(
        &self,
        ctx: &PushContext,
        svc: &Arc<Service>,
        rule: Option<&Arc<ConfigObject>>,
        port: u32,
        audience: Audience,
    ) -> Arc<[u8]> {
        let found = self.with_entry(ctx, svc, rule, |e| {
            e.vhosts
                .iter()
                .find(|(p, a, _)| *p == port && *a == audience)
                .map(|(_, _, bytes)| bytes.clone())
        });
        if let Some(hit) = found {
            self.hits.inc();
            return hit;
        }
        self.misses.inc();
        let vh = translate::route::default_virtual_host(svc, rule.map(|r| &**r), port, audience);
        let bytes: Arc<[u8]> = virtual_host_field(&vh).into();
        self.store(ctx, svc, rule, |e| {
            e.vhosts.push((port, audience, bytes.clone()))
        });
        bytes
    }

    /// The service's virtual host on `port` routed by `vs` (a VirtualService whose routes
    /// do not depend on the proxy), as an encoded `virtual_hosts` field.
    pub fn routed_virtual_host(
        &self,
        ctx: &PushContext,
        svc: &Arc<Service>,
        vs: &Arc<ConfigObject>,
        port: u32,
        proxy: &Proxy,
        sniffed: bool,
    ) -> Arc<[u8]> {
        let audience = Audience::new(svc, &proxy.namespace, sniffed);
        // The routes do not depend on the service's own rule: the entry of whichever
        // rule the proxy gets holds them.
        let rule = ctx.service_rule(proxy, svc);
        let found = self.with_entry(ctx, svc, rule, |e| {
            (e.routed.iter_mut())
                .filter(|r| r.port == port && r.audience == audience)
                .filter(|r| same(Some(&r.vs), Some(vs)))
                .find_map(|r| {
                    (r.destinations.iter_mut().all(|d| d.unchanged(ctx, proxy)))
                        .then(|| r.bytes.clone())
                })
        });
        if let Some(hit) = found {
            self.hits.inc();
            return hit;
        }
        self.misses.inc();
        let vh = translate::route::routed_virtual_host(ctx, proxy, vs, svc, port, audience);
        let bytes: Arc<[u8]> = virtual_host_field(&vh).into();
        let destinations = translate::route::destination_hosts(vs)
            .into_iter()
            .map(|host| Destination::now(ctx, proxy, host))
            .collect();
        self.store(ctx, svc, rule, |e| {
            // What this VirtualService built for earlier contexts, on this port and side,
            // is stale.
            e.routed.retain(|r| {
                !(r.port == port
                    && r.audience == audience
                    && r.vs.key == vs.key
                    && r.ctx != ctx.id())
            });
            e.routed.push(RoutedHost {
                port,
                audience,
                ctx: ctx.id(),
                vs: vs.clone(),
                destinations,
                bytes: bytes.clone(),
            });
        });
        bytes
    }

    /// The encoded routes `routes` gives a gateway: cached unless they depend on the
    /// proxy, and valid while the VirtualService and the services and DestinationRules of
    /// its destinations are the ones they were built from.
    fn gateway_routes(
        &self,
        ctx: &PushContext,
        proxy: &Proxy,
        routes: &GatewayRoutes,
    ) -> Arc<[u8]> {
        if !routes.shared() {
            return encode_routes(&routes.build(ctx, proxy)).into();
        }
        let key = gateway_routes_key(routes);
        let is = |e: &GatewayRoutesEntry| {
            e.port == routes.port && *e.gateway == *routes.gateway && e.vs.key == routes.vs.key
        };
        {
            let mut cached = self.gateway_routes.lock().unwrap();
            let found = (cached.get_mut(&key).into_iter().flatten())
                .filter(|e| is(e) && same(Some(&e.vs), Some(routes.vs)))
                .find_map(|e| {
                    if !e.destinations.iter_mut().all(|d| d.unchanged(ctx, proxy)) {
                        return None;
                    }
                    // Later readers of this push compare pointers only.
                    e.vs = routes.vs.clone();
                    Some(e.bytes.clone())
                });
            if let Some(bytes) = found {
                self.hits.inc();
                return bytes;
            }
        }
        self.misses.inc();
        let bytes: Arc<[u8]> = encode_routes(&routes.build(ctx, proxy)).into();
        let destinations = translate::route::destination_hosts(routes.vs)
            .into_iter()
            .map(|host| Destination::now(ctx, proxy, host))
            .collect();
        let mut cached = self.gateway_routes.lock().unwrap();
        let entries = cached.entry(key).or_default();
        // What earlier contexts built for this VirtualService and server is stale.
        entries.retain(|e| !(is(e) && e.ctx != ctx.id()));
        entries.push(GatewayRoutesEntry {
            port: routes.port,
            gateway: routes.gateway.into(),
            ctx: ctx.id(),
            vs: routes.vs.clone(),
            destinations,
            bytes: bytes.clone(),
        });
        bytes
    }

    /// A gateway's virtual host as an encoded `virtual_hosts` field: its name and domain,
    /// the cached routes of each VirtualService ([`ResourceCache::gateway_routes`]), then
    /// the fields after the routes; shared with the views of this context and the last.
    pub fn gateway_virtual_host(
        &self,
        ctx: &PushContext,
        proxy: &Proxy,
        vh: &GatewayVirtualHost,
    ) -> Arc<[u8]> {
        let runs: Vec<Arc<[u8]>> = (vh.sources.iter())
            .map(|s| self.gateway_routes(ctx, proxy, s))
            .collect();
        let key = {
            use std::hash::{BuildHasher, Hash, Hasher};
            let mut h = foldhash::fast::FixedState::default().build_hasher();
            (&vh.host, vh.port).hash(&mut h);
            for r in &runs {
                (Arc::as_ptr(r) as *const u8 as usize).hash(&mut h);
            }
            h.finish()
        };
        let mut memo = self.gateway_hosts.lock().unwrap();
        let fields = memo.get(ctx.id(), key, Vec::new);
        let found = fields.iter().find(|f| {
            f.host == vh.host
                && f.port == vh.port
                && f.runs.len() == runs.len()
                && f.runs.iter().zip(&runs).all(|(a, b)| Arc::ptr_eq(a, b))
        });
        if let Some(f) = found {
            return f.field.clone();
        }
        let head = vh.head().encode_to_vec();
        let tail = GatewayVirtualHost::tail().encode_to_vec();
        let len = head.len() + runs.iter().map(|r| r.len()).sum::<usize>() + tail.len();
        let mut out = Vec::with_capacity(len + 8);
        prost::encoding::encode_key(
            VIRTUAL_HOSTS,
            prost::encoding::WireType::LengthDelimited,
            &mut out,
        );
        prost::encoding::encode_varint(len as u64, &mut out);
        out.extend_from_slice(&head);
        for r in &runs {
            out.extend_from_slice(r);
        }
        out.extend_from_slice(&tail);
        let field: Arc<[u8]> = out.into();
        fields.push(GatewayHostField {
            host: vh.host.clone(),
            port: vh.port,
            runs,
            field: field.clone(),
        });
        field
    }
}

/// The labels the service's load assignments depend on, with the proxy's locality; `None`
/// when they do not depend on the proxy.
fn dependence(
    ctx: &PushContext,
    svc: &Service,
    rule: Option<&Arc<ConfigObject>>,
) -> Option<Vec<String>> {
    locality::dependence(
        &ctx.mesh,
        translate::cluster::policies(svc, rule.map(|r| &**r)),
        svc.traffic_distribution,
    )
}

/// Where [`ResourceCache::gateway_routes`] files the routes of one VirtualService at one
/// gateway server.
fn gateway_routes_key(routes: &GatewayRoutes) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::default().hash_one((&routes.vs.key, routes.port, routes.gateway))
}

/// Routes as a run of `VirtualHost.routes` fields.
fn encode_routes(routes: &[Route]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in routes {
        prost::encoding::message::encode(ROUTES, r, &mut out);
    }
    out
}

fn encode_assignment(a: &ClusterLoadAssignment) -> Arc<Resource> {
    encode(&a.cluster_name, a)
}

fn virtual_host_field(vh: &VirtualHost) -> Vec<u8> {
    let mut out = Vec::with_capacity(vh.encoded_len() + 4);
    prost::encoding::message::encode(VIRTUAL_HOSTS, vh, &mut out);
    out
}

/// The encoded configuration for `proxy`: what [`View::new`] of
/// [`translate::proxy_config`] holds, byte for byte, with the per-service parts from
/// `cache`.
pub fn view(ctx: &PushContext, proxy: &Proxy, cache: &ResourceCache) -> View {
    let plan = translate::plan(ctx, proxy);
    let mut view = clusters_and_endpoints(ctx, proxy, cache, &plan);
    view.encode_all(&[], &[], &plan.listeners, &[], &plan.secrets);
    for r in &plan.sidecar_routes {
        let port = r.port;
        // Each virtual host as an encoded `virtual_hosts` field, most of them cached.
        let virtual_hosts = (r.vhosts.iter().map(|v| match v {
            VirtualHostPlan::Default(svc) => {
                let rule = ctx.service_rule(proxy, svc);
                let audience = Audience::new(svc, &proxy.namespace, r.sniffed);
                cache.default_virtual_host(ctx, svc, rule, port, audience)
            }
            VirtualHostPlan::Shared { vs, service } => {
                cache.routed_virtual_host(ctx, service, vs, port, proxy, r.sniffed)
            }
            VirtualHostPlan::Routed(vh) => virtual_host_field(vh).into(),
        }))
        .chain(
            (plan.catch_all.as_ref())
                .filter(|_| !r.sniffed)
                .map(|c| virtual_host_field(c).into()),
        );
        insert_route_configuration(&mut view, ctx, proxy, cache, &r.name, virtual_hosts);
    }
    for r in &plan.gateway_routes {
        let vhosts = translate::route::gateway_plan(ctx, proxy, &r.servers);
        let fields: Vec<Arc<[u8]>> = if vhosts.is_empty() {
            let blackhole = translate::route::gateway_blackhole(r.listen_port);
            vec![virtual_host_field(&blackhole).into()]
        } else {
            (vhosts.iter())
                .map(|vh| cache.gateway_virtual_host(ctx, proxy, vh))
                .collect()
        };
        insert_route_configuration(&mut view, ctx, proxy, cache, &r.name, fields);
    }
    view
}

/// Adds the route configuration `name` holding these encoded virtual hosts: kept as its
/// pieces, so the shared virtual hosts are not copied into every view's route
/// configuration; for a proxy on VHDS, its shell and each virtual host as a resource.
fn insert_route_configuration(
    view: &mut View,
    ctx: &PushContext,
    proxy: &Proxy,
    cache: &ResourceCache,
    name: &str,
    virtual_hosts: impl IntoIterator<Item = Arc<[u8]>>,
) {
    if proxy.vhds {
        let shell = translate::route::vhds_shell(name.to_string());
        view.insert(TypeKind::Route, encode(name, &shell));
        for field in virtual_hosts {
            let vh = cache.vhds_virtual_host(ctx, name, &field);
            view.insert(TypeKind::VirtualHost, vh);
        }
        return;
    }
    let head = RouteConfiguration {
        name: name.to_string(),
        ..Default::default()
    }
    .encode_to_vec();
    let tail = translate::route::with_virtual_hosts(String::new(), Vec::new()).encode_to_vec();
    let mut pieces: Vec<Arc<[u8]>> = vec![head.into()];
    pieces.extend(virtual_hosts);
    pieces.push(tail.into());
    view.insert(
        TypeKind::Route,
        from_pieces::<RouteConfiguration>(name, pieces),
    );
}

/// A view holding the plan's clusters and load assignments, the per-service ones from
/// `cache`.
fn clusters_and_endpoints(
    ctx: &PushContext,
    proxy: &Proxy,
    cache: &ResourceCache,
    plan: &translate::Plan,
) -> View {
    let mut view = View::default();
    let own = plan.clusters.iter().map(encode_cluster).collect();
    let own_endpoints = plan.endpoints.iter().map(encode_assignment).collect();
    let at = locality::place(ctx, proxy);
    let own = (own, own_endpoints);
    let (clusters, endpoints) = cache.sets(ctx, proxy, &plan.services, &at, own);
    view.share(TypeKind::Cluster, clusters);
    view.share(TypeKind::Endpoint, endpoints);
    view
}

/// A view after a push that changed endpoints only: [`view`] byte for byte, with the
/// listeners, routes, virtual hosts and secrets of `previous` (the same view key's view
/// of the push before) shared rather than translated again, as none of them depends on
/// endpoints ([`translate::cluster_plan`]; the caller checks a sidecar's inbound ports).
/// A gateway bound to many VirtualServices is most of a push's translation otherwise
/// (1,000 virtual hosts: see BENCHMARKS.md), and a sidecar's plan most of its view.
pub fn view_after_endpoints(
    ctx: &PushContext,
    proxy: &Proxy,
    cache: &ResourceCache,
    previous: &View,
) -> View {
    let plan = translate::cluster_plan(ctx, proxy);
    let mut view = clusters_and_endpoints(ctx, proxy, cache, &plan);
    for kind in [
        TypeKind::Listener,
        TypeKind::Route,
        TypeKind::VirtualHost,
        TypeKind::Secret,
    ] {
        view.share(kind, previous.set(kind));
    }
    view
}

/// A virtual host of `route_config` as a VHDS resource, from its encoded `virtual_hosts`
/// field: the message renamed [`translate::route::vhds_name`], byte for byte what
/// encoding the renamed virtual host gives (the name is its first field).
fn vhds_resource(route_config: &str, field: &[u8]) -> Arc<Resource> {
    use prost::encoding::{decode_varint, encode_varint};
    let mut rest = field;
    let key = decode_varint(&mut rest).expect("BUG: a virtual_hosts field");
    let len = decode_varint(&mut rest).expect("BUG: a virtual_hosts field");
    debug_assert_eq!(
        (key, len as usize),
        (u64::from(VIRTUAL_HOSTS << 3 | 2), rest.len())
    );
    let mut body = rest;
    let mut old_name = "";
    if body.first() == Some(&0x0a) {
        body = &body[1..];
        let n = decode_varint(&mut body).expect("BUG: a virtual host's name") as usize;
        old_name = std::str::from_utf8(&body[..n]).expect("BUG: a name is UTF-8");
        body = &body[n..];
    }
    let name = translate::route::vhds_name(route_config, old_name);
    let mut out = Vec::with_capacity(name.len() + 4 + body.len());
    out.push(0x0a);
    encode_varint(name.len() as u64, &mut out);
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(body);
    from_bytes::<VirtualHost>(&name, out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::config::parse::parse_file;
    use crate::model::Store;
    use crate::model::testmesh::Shape;

    /// The Service svc-6 of `Shape`'s mesh (in `ns`) with one port, `port`.
    fn svc6_on_port(ns: &str, port: u32) -> String {
        format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-6, namespace: {ns}}}\nspec:\n  clusterIP: 10.100.0.6\n  ports: [{{name: http, port: {port}}}]\n"
        )
    }

    fn apply(store: &mut Store, yaml: &str) {
        let parsed = parse_file("change.yaml", yaml);
        assert!(parsed.errors().next().is_none(), "{:?}", parsed.issues);
        for o in parsed.objects {
            store.apply(o);
        }
    }

    fn proxy(kind: &str, ns: &str, labels: serde_json::Value, secure: bool) -> Proxy {
        let meta = json!({"NAMESPACE": ns, "LABELS": labels});
        let mut p = Proxy::from_node(
            &format!("{kind}~10.9.0.1~p-0.{ns}~{ns}.svc.cluster.local"),
            meta.as_object().unwrap(),
        )
        .unwrap();
        if secure {
            p.identity = Some(format!("spiffe://cluster.local/ns/{ns}/sa/default"));
        }
        p
    }

    fn vhds(mut p: Proxy) -> Proxy {
        p.vhds = true;
        p
    }

    fn proxies() -> Vec<Proxy> {
        vec![
            proxy("sidecar", "ns-0", json!({"app": "a"}), false),
            proxy("sidecar", "ns-1", json!({"app": "b"}), false),
            proxy("sidecar", "ns-1", json!({"app": "c"}), true),
            vhds(proxy("sidecar", "ns-0", json!({"app": "a"}), false)),
            vhds(proxy("sidecar", "ns-1", json!({"app": "c"}), true)),
            proxy(
                "router",
                "istio-system",
                json!({"istio": "ingressgateway"}),
                true,
            ),
            vhds(proxy(
                "router",
                "istio-system",
                json!({"istio": "ingressgateway"}),
                true,
            )),
        ]
    }

    /// The cached view of every proxy holds exactly the resources, names and bytes, of
    /// the view translated from scratch.
    fn assert_views_agree(ctx: &PushContext, cache: &ResourceCache) {
        assert_views_agree_for(ctx, cache, proxies());
    }

    fn assert_views_agree_for(ctx: &PushContext, cache: &ResourceCache, proxies: Vec<Proxy>) {
        for p in proxies {
            let cached = view(ctx, &p, cache);
            let fresh = View::new(translate::proxy_config(ctx, &p));
            crate::xds::testing::assert_same_views(&cached, &fresh, &p.id);
        }
    }

    #[test]
    fn a_gateways_sni_dnat_clusters_and_assignments_are_in_its_cached_view() {
        let mut store = Shape::new(40, 4, 2).store();
        apply(
            &mut store,
            "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: ew, namespace: istio-system}\nspec:\n  selector: {istio: ingressgateway}\n  servers:\n  - {port: {number: 15443, name: tls, protocol: TLS}, hosts: ['*.local'], tls: {mode: AUTO_PASSTHROUGH}}\n",
        );
        let ctx = PushContext::build(&store, "v/1".into());
        let cache = ResourceCache::default();
        assert_views_agree(&ctx, &cache);
        let gateway = proxies().pop().unwrap();
        let v = view(&ctx, &gateway, &cache);
        let dnat = |kind| {
            (v.all(kind).keys())
                .filter(|n| n.starts_with("outbound_."))
                .count()
        };
        assert!(dnat(TypeKind::Cluster) >= 40, "{}", dnat(TypeKind::Cluster));
        assert_eq!(dnat(TypeKind::Cluster), dnat(TypeKind::Endpoint));
    }

    #[test]
    fn cached_views_are_the_translated_views_byte_for_byte_and_are_shared() {
        let store = Shape::new(40, 4, 2).store();
        let ctx = PushContext::build(&store, "v/1".into());
        let cache = ResourceCache::default();
        assert_views_agree(&ctx, &cache);
        let (hits, misses) = cache.reads();
        assert!(misses >= 40, "every service was encoded: {misses}");
        assert!(hits > 0, "proxies of one kind share a service's clusters");
        // A second round (a later push of the same mesh) translates nothing.
        let again = PushContext::build(&store, "v/2".into());
        assert_views_agree(&again, &cache);
        assert_eq!(cache.reads().1, misses, "no miss on an unchanged mesh");
        assert!(cache.reads().0 > hits);
        assert_eq!(cache.len(), 40);
    }

    #[test]
    fn views_of_one_push_with_the_same_services_share_their_cluster_and_endpoint_sets() {
        let mut store = Shape::new(40, 4, 2).store();
        // A service selecting proxy `b` gives it an inbound cluster of its own.
        apply(
            &mut store,
            "apiVersion: v1\nkind: Service\nmetadata: {name: b, namespace: ns-1}\nspec:\n  clusterIP: 10.100.9.9\n  selector: {app: b}\n  ports: [{name: http, port: 8080}]\n",
        );
        let ctx = PushContext::build(&store, "v/1".into());
        let cache = ResourceCache::default();
        assert_views_agree(&ctx, &cache);
        let a0 = proxy("sidecar", "ns-0", json!({"app": "a"}), false);
        let a1 = proxy("sidecar", "ns-1", json!({"app": "a"}), false);
        let b1 = proxy("sidecar", "ns-1", json!({"app": "b"}), false);
        let secure = proxy("sidecar", "ns-0", json!({"app": "a"}), true);
        let [v0, v1, vb, vs] = [&a0, &a1, &b1, &secure].map(|p| view(&ctx, p, &cache));
        use TypeKind::{Cluster, Endpoint};
        // Two namespaces, one service list: one set of each.
        assert!(v0.shares(&v1, Cluster) && v0.shares(&v1, Endpoint));
        // Its own inbound cluster, or mTLS clusters: sets of their own.
        assert!(!v0.shares(&vb, Cluster));
        assert!(vb.all(Cluster).keys().any(|n| n.starts_with("inbound|")));
        assert!(!v0.shares(&vs, Cluster) && !v0.shares(&vs, Endpoint));
        // Another push's views never share this push's sets.
        let next = PushContext::build(&store, "v/2".into());
        assert!(!view(&next, &a0, &cache).shares(&v0, Cluster));
        assert_views_agree(&next, &cache);
    }

    #[test]
    fn a_gateways_routes_are_cached_per_virtual_service_and_never_stale() {
        let shape = Shape::new(40, 4, 2);
        let mut store = shape.store();
        let routing: String = (0..40).map(|i| shape.gateway_routing_yaml(i)).collect();
        apply(&mut store, &routing);
        // A second Gateway on another port admitting ns-1 only; a VirtualService bound to
        // both with two hosts; one whose routes depend on the source (never shared); one
        // for sidecars and the gateway mirroring to svc-6, whose cluster name follows
        // svc-6's port.
        let ns6 = shape.namespace_of(6);
        let extra = format!(
            "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: second, namespace: istio-system}}\nspec:\n  selector: {{istio: ingressgateway}}\n  servers: [{{port: {{number: 8080, name: http-alt, protocol: HTTP}}, hosts: [\"ns-1/*\"]}}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: both, namespace: ns-1}}\nspec:\n  hosts: [a.example.com, b.example.com]\n  gateways: [istio-system/ingress, istio-system/second]\n  http: [{{route: [{{destination: {{host: svc-1}}}}]}}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: by-source, namespace: ns-2}}\nspec:\n  hosts: [c.example.com]\n  gateways: [istio-system/ingress]\n  http:\n  - match: [{{sourceNamespace: istio-system}}]\n    route: [{{destination: {{host: svc-2}}}}]\n  - route: [{{destination: {{host: svc-10}}}}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: mirrored, namespace: ns-1}}\nspec:\n  hosts: [svc-5]\n  gateways: [istio-system/ingress, mesh]\n  http: [{{route: [{{destination: {{host: svc-5}}}}], mirror: {{host: svc-6.{ns6}.svc.cluster.local}}}}]\n"
        );
        apply(&mut store, &extra);
        let cache = ResourceCache::default();
        let gateways: Vec<Proxy> = (proxies().into_iter())
            .filter(|p| p.kind == ProxyKind::Router)
            .collect();
        let first = PushContext::build(&store, "v/1".into());
        assert_views_agree(&first, &cache);
        let config = translate::proxy_config(&first, &gateways[0]);
        let http80 = config.routes.iter().find(|r| r.name == "http.80").unwrap();
        assert_eq!(http80.virtual_hosts.len(), 44, "40 + a, b, c and svc-5");

        // One VirtualService edited: its routes are the one entry translated again, for
        // both gateways (one on VHDS) and both views of each.
        apply(
            &mut store,
            &shape
                .gateway_routing_yaml(3)
                .replace("prefix: /api", "prefix: /v2"),
        );
        let misses = cache.reads().1;
        let second = PushContext::build(&store, "v/2".into());
        assert_views_agree_for(&second, &cache, gateways.clone());
        assert_views_agree_for(&second, &cache, gateways.clone());
        assert_eq!(cache.reads().1 - misses, 1, "gw-svc-3's routes");
        // Routes matching on the source are translated for each gateway, never shared: a
        // gateway elsewhere gets c.example.com without the istio-system route.
        let elsewhere = proxy("router", "ns-2", json!({"istio": "ingressgateway"}), true);
        let c_routes = |p: &Proxy| {
            let config = translate::proxy_config(&second, p);
            let http80 = config.routes.iter().find(|r| r.name == "http.80").unwrap();
            let c = http80.virtual_hosts.iter();
            c.filter(|v| v.name == "c.example.com:80")
                .map(|v| v.routes.len())
                .sum::<usize>()
        };
        assert_eq!((c_routes(&gateways[0]), c_routes(&elsewhere)), (2, 1));
        assert_views_agree_for(&second, &cache, vec![gateways[0].clone(), elsewhere]);

        // What the routes lead to: svc-6's port (the mirror's cluster, for sidecars and
        // gateways alike), a DestinationRule
        // hashing svc-1 (the routes of `both`), then `both` deleted.
        apply(&mut store, &svc6_on_port(&ns6, 9090));
        assert_views_agree(&PushContext::build(&store, "v/3".into()), &cache);
        apply(
            &mut store,
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: svc-1, namespace: ns-1}\nspec:\n  host: svc-1\n  trafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x-user}}}\n",
        );
        let fourth = PushContext::build(&store, "v/4".into());
        assert_views_agree_for(&fourth, &cache, gateways.clone());
        let before = cache.gateway_routes.lock().unwrap().len();
        let without = |store: &Store, gone: &ObjectKey| {
            let mut smaller = Store::default();
            for o in store.iter().filter(|o| o.key != *gone) {
                smaller.apply((**o).clone());
            }
            smaller
        };
        let both = ObjectKey::new(Kind::VirtualService, "ns-1", "both");
        let mut store = without(&store, &both);
        let without_both = PushContext::build(&store, "v/5".into());
        cache.retain_services_of(&without_both, None);
        assert_eq!(
            cache.gateway_routes.lock().unwrap().len(),
            before - 2,
            "both's routes at each Gateway"
        );
        assert_views_agree_for(&without_both, &cache, gateways.clone());

        // A VirtualService no longer bound to the Gateway, then the Gateway gone: their
        // entries go with the first push that changes routing, not with one that changes
        // endpoints only.
        let count = || cache.gateway_routes.lock().unwrap().len();
        let endpoints_only = BTreeSet::from([ObjectKey::new(Kind::EndpointSlice, "ns-1", "svc-1")]);
        let mirrored = ObjectKey::new(Kind::VirtualService, "ns-1", "mirrored");
        apply(
            &mut store,
            &format!(
                "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: mirrored, namespace: ns-1}}\nspec:\n  hosts: [svc-5]\n  gateways: [mesh]\n  http: [{{route: [{{destination: {{host: svc-5}}}}], mirror: {{host: svc-6.{ns6}.svc.cluster.local}}}}]\n"
            ),
        );
        let unbound = PushContext::build(&store, "v/6".into());
        let before = count();
        cache.retain_services_of(&unbound, Some(&endpoints_only));
        assert_eq!(count(), before, "kept by an endpoint-only push");
        cache.retain_services_of(&unbound, Some(&BTreeSet::from([mirrored])));
        assert_eq!(
            count(),
            before - 1,
            "mirrored's routes at the ingress Gateway"
        );
        assert_views_agree_for(&unbound, &cache, gateways.clone());

        let ingress = ObjectKey::new(Kind::Gateway, "istio-system", "ingress");
        let no_ingress = PushContext::build(&without(&store, &ingress), "v/7".into());
        assert!(
            count() >= 40,
            "the routes of gw-svc-0 to gw-svc-39 at the ingress"
        );
        cache.retain_services_of(&no_ingress, Some(&endpoints_only));
        assert!(count() >= 40, "kept by an endpoint-only push");
        cache.retain_services_of(&no_ingress, Some(&BTreeSet::from([ingress])));
        assert_eq!(count(), 0, "no Gateway server is left to route");
        assert_views_agree_for(&no_ingress, &cache, gateways);
    }

    #[test]
    fn a_change_re_encodes_only_what_it_touches_and_never_serves_a_stale_entry() {
        let shape = Shape::new(40, 4, 2);
        let mut store = shape.store();
        let cache = ResourceCache::default();
        let first = PushContext::build(&store, "v/1".into());
        assert_views_agree(&first, &cache);

        // An endpoint-only change to svc-3 (in ns-3, no proxy's namespace): its clusters
        // for each (kind, secure) pair in use and its one default virtual host.
        apply(&mut store, &shape.service_yaml(3, Some("10.200.0.1")));
        let misses = cache.reads().1;
        let second = PushContext::build(&store, "v/2".into());
        assert_views_agree(&second, &cache);
        assert_eq!(
            cache.reads().1 - misses,
            4,
            "plaintext sidecar, secure sidecar and secure gateway clusters, one virtual host"
        );
        // Every proxy's view after it, its listeners and routes kept from the view before,
        // is the view built anew.
        for p in proxies() {
            let kept = view_after_endpoints(&second, &p, &cache, &view(&first, &p, &cache));
            let fresh = view(&second, &p, &cache);
            crate::xds::testing::assert_same_views(&kept, &fresh, &p.id);
        }

        // A DestinationRule change (svc-10's subsets), a new DestinationRule (svc-7) and a
        // new trust domain: each entry they touch is rebuilt (the byte comparison proves
        // no stale one is served).
        apply(
            &mut store,
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: svc-10, namespace: ns-2}\nspec:\n  host: svc-10\n  subsets: [{name: v1, labels: {version: v3}}, {name: v2, labels: {version: v2}}]\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: svc-7, namespace: ns-3}\nspec:\n  host: svc-7\n  trafficPolicy: {tls: {mode: DISABLE}}\n",
        );
        assert_views_agree(&PushContext::build(&store, "v/3".into()), &cache);
        apply(
            &mut store,
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |\n    trustDomain: example.org\n",
        );
        assert_views_agree(&PushContext::build(&store, "v/4".into()), &cache);

        // VirtualService routes, cached per routed service: a VirtualService edit; a route
        // to another service without a port, whose cluster name follows that service's
        // port when it changes; a route that depends on the proxy's labels (not shared).
        let (ns5, ns6) = (shape.namespace_of(5), shape.namespace_of(6));
        let cross = format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: cross, namespace: {ns5}}}\nspec:\n  hosts: [svc-5]\n  http: [{{route: [{{destination: {{host: svc-6.{ns6}.svc.cluster.local}}}}]}}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: by-source, namespace: {ns6}}}\nspec:\n  hosts: [svc-6]\n  http:\n  - match: [{{sourceLabels: {{app: b}}}}]\n    route: [{{destination: {{host: svc-6, subset: v2}}}}]\n  - route: [{{destination: {{host: svc-6}}}}]\n"
        );
        apply(&mut store, &cross);
        assert_views_agree(&PushContext::build(&store, "v/5".into()), &cache);
        apply(
            &mut store,
            &shape.changed_service_yaml(10, None, "someone-else"),
        );
        assert_views_agree(&PushContext::build(&store, "v/6".into()), &cache);
        let misses = cache.reads().1;
        apply(&mut store, &svc6_on_port(&ns6, 9090));
        assert_views_agree(&PushContext::build(&store, "v/7".into()), &cache);
        assert!(cache.reads().1 > misses);
        // The routes to svc-6 hash as its DestinationRule says: a new rule there rebuilds
        // svc-5's cached virtual host, whose own rule did not change.
        apply(
            &mut store,
            &format!(
                "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: svc-6, namespace: {ns6}}}\nspec:\n  host: svc-6\n  trafficPolicy: {{loadBalancer: {{consistentHash: {{httpHeaderName: x-user}}}}}}\n"
            ),
        );
        assert_views_agree(&PushContext::build(&store, "v/8".into()), &cache);

        // A deleted service leaves the cache with the next push.
        let ctx = {
            let mut smaller = Store::default();
            for o in store.iter().filter(|o| !o.key.name.starts_with("svc-39")) {
                smaller.apply((**o).clone());
            }
            PushContext::build(&smaller, "v/5".into())
        };
        cache.retain_services_of(&ctx, None);
        assert_eq!(cache.len(), 39);
        assert_views_agree(&ctx, &cache);
    }

    #[test]
    fn proxies_that_get_other_destination_rules_get_views_of_their_own_and_share_the_rest() {
        let mut store = Shape::new(40, 4, 2).store();
        let rule = |ns: &str, name: &str, host: &str, extra: &str| {
            format!(
                "---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  host: {host}\n{extra}"
            )
        };
        let pool = |n: u32| {
            format!("  trafficPolicy: {{connectionPool: {{tcp: {{maxConnections: {n}}}}}}}\n")
        };
        apply(
            &mut store,
            &[
                // ns-3's own rule for svc-6 of ns-2.
                rule("ns-3", "svc-6-here", "svc-6.ns-2.svc.cluster.local", &format!("  exportTo: ['.']\n{}", pool(3))),
                // For ns-1's proxies labelled app=c: hashed routes to svc-5.
                rule("ns-1", "svc-5-for-c", "svc-5", "  workloadSelector: {matchLabels: {app: c}}\n  trafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x-user}}}\n"),
                // svc-11's rule in its namespace, ns-3, exported to ns-0 alone.
                rule("ns-3", "svc-11-for-ns-0", "svc-11", &format!("  exportTo: [ns-0]\n{}", pool(5))),
            ]
            .concat(),
        );
        let ctx = PushContext::build(&store, "v/1".into());
        let cache = ResourceCache::default();
        let mut all = proxies();
        let more = [
            ("ns-3", "a"),
            ("ns-3", "d"),
            ("ns-2", "a"),
            ("ns-0", "d"),
            ("ns-1", "c"),
        ];
        all.extend(more.map(|(ns, app)| proxy("sidecar", ns, json!({ "app": app }), false)));
        assert_views_agree_for(&ctx, &cache, all.clone());

        let views: Vec<View> = all.iter().map(|p| view(&ctx, p, &cache)).collect();
        let [
            a0,
            _b1,
            _c1,
            _a0_vhds,
            _c1_vhds,
            _router,
            _router_vhds,
            a3,
            d3,
            a2,
            d0,
            c1,
        ] = &views[..]
        else {
            panic!("{} views", views.len())
        };
        use TypeKind::{Cluster, Route};
        // Proxies no rule singles out (ns-2) share with those whose namespace's rules
        // change nothing for them; ns-3's and ns-0's proxies share among themselves.
        assert!(a3.shares(d3, Cluster) && a0.shares(d0, Cluster));
        assert!(!a3.shares(a2, Cluster) && !a0.shares(a2, Cluster));
        let limit = |v: &View, cluster: &str| {
            let c = envoy_types::pb::envoy::config::cluster::v3::Cluster::decode(
                &*v.all(Cluster)[cluster].value(),
            )
            .unwrap();
            let t = c.circuit_breakers.unwrap().thresholds;
            t[0].max_connections.as_ref().unwrap().value
        };
        let (svc6, svc11) = (
            "outbound|8080||svc-6.ns-2.svc.cluster.local",
            "outbound|8080||svc-11.ns-3.svc.cluster.local",
        );
        assert_eq!(
            [limit(a3, svc6), limit(a2, svc6), limit(a0, svc6)],
            [3, u32::MAX, u32::MAX]
        );
        assert_eq!(
            [limit(a0, svc11), limit(a2, svc11), limit(a3, svc11)],
            [5, u32::MAX, u32::MAX]
        );
        // The selected proxy hashes its routes to svc-5; its neighbour does not.
        let hashed = |v: &View| {
            let r = RouteConfiguration::decode(&*v.all(Route)["8080"].value()).unwrap();
            let vh = r
                .virtual_hosts
                .iter()
                .find(|h| h.name.starts_with("svc-5."))
                .unwrap()
                .clone();
            match vh.routes[0].action.clone() {
                Some(envoy_types::pb::envoy::config::route::v3::route::Action::Route(a)) => {
                    !a.hash_policy.is_empty()
                }
                other => panic!("{other:?}"),
            }
        };
        let b1 = proxy("sidecar", "ns-1", json!({"app": "b"}), false);
        assert!(hashed(c1) && !hashed(&view(&ctx, &b1, &cache)));

        // A later push of the same mesh translates nothing again, whichever proxy asks.
        let misses = cache.reads().1;
        assert_views_agree_for(&PushContext::build(&store, "v/2".into()), &cache, all);
        assert_eq!(cache.reads().1, misses);
    }

    #[test]
    fn load_assignments_balanced_by_locality_are_shared_per_place_only() {
        let entry = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: api, namespace: shop}\nspec:\n  hosts: [api.example.com]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  endpoints:\n  - {address: 10.0.0.1, locality: r/z1}\n  - {address: 10.0.0.2, locality: r/z2}\n";
        let rule = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: api, namespace: shop}\nspec:\n  host: api.example.com\n  trafficPolicy: {outlierDetection: {consecutive5xxErrors: 1}}\n";
        let at = |zone: &str, app: &str| {
            let mut p = proxy("sidecar", "shop", json!({ "app": app }), false);
            p.locality = crate::model::Locality::parse(&format!("r/{zone}"));
            p
        };
        let (a, b, c) = (at("z1", "a"), at("z1", "b"), at("z2", "a"));
        let cla = "outbound|80||api.example.com";
        let bytes = |v: &View| v.all(TypeKind::Endpoint)[cla].value().into_owned();
        let mut store = Store::default();
        apply(&mut store, entry);
        let cache = ResourceCache::default();

        // Without outlier detection nothing depends on the locality: one shared set.
        let ctx = PushContext::build(&store, "v/1".into());
        assert!(!cache.locality_aware(&ctx));
        let [va, vc] = [&a, &c].map(|p| view(&ctx, p, &cache));
        assert!(va.shares(&vc, TypeKind::Endpoint));

        // With it, each zone's proxies get their own priorities, equal to the translation
        // from scratch, and proxies of one zone share them.
        apply(&mut store, rule);
        let ctx = PushContext::build(&store, "v/2".into());
        assert!(cache.locality_aware(&ctx));
        for p in [&a, &b, &c] {
            let fresh = View::new(translate::proxy_config(&ctx, p));
            assert_eq!(bytes(&view(&ctx, p, &cache)), bytes(&fresh), "{}", p.id);
        }
        let [va, vb, vc] = [&a, &b, &c].map(|p| view(&ctx, p, &cache));
        assert_ne!(bytes(&va), bytes(&vc));
        // Labels no failoverPriority compares do not split the shared sets.
        assert!(va.shares(&vb, TypeKind::Endpoint));
        assert!(!va.shares(&vc, TypeKind::Endpoint));
        assert!(Arc::ptr_eq(
            &va.all(TypeKind::Endpoint)[cla],
            &vb.all(TypeKind::Endpoint)[cla]
        ));
        let priorities = |v: &View| {
            let cla = ClusterLoadAssignment::decode(&*bytes(v)).unwrap();
            (cla.endpoints.iter())
                .map(|g| (g.locality.as_ref().unwrap().zone.clone(), g.priority))
                .collect::<Vec<_>>()
        };
        assert_eq!(priorities(&va), [("z1".to_string(), 0), ("z2".into(), 1)]);
        assert_eq!(priorities(&vc), [("z1".to_string(), 1), ("z2".into(), 0)]);
    }

    #[test]
    fn with_network_gateways_load_assignments_are_shared_per_network_only() {
        let entry = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: api, namespace: shop}\nspec:\n  hosts: [api.example.com]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  endpoints:\n  - {address: 10.0.0.1, network: net-a, labels: {security.istio.io/tlsMode: istio}}\n  - {address: 10.0.0.2, network: net-b, labels: {security.istio.io/tlsMode: istio}}\n";
        let gateway = |ip: &str| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: eastwest, namespace: istio-system, labels: {{topology.istio.io/network: net-b}}}}\nspec:\n  externalIPs: [{ip}]\n  ports: [{{name: tls, port: 15443}}]\n"
            )
        };
        let on = |network: &str, app: &str| {
            let mut p = proxy("sidecar", "shop", json!({ "app": app }), false);
            p.network = network.into();
            p
        };
        let (a1, a2, b) = (on("net-a", "x"), on("net-a", "y"), on("net-b", "x"));
        let cla = "outbound|80||api.example.com";
        let bytes = |v: &View| v.all(TypeKind::Endpoint)[cla].value().into_owned();
        let mut store = Store::default();
        apply(&mut store, entry);
        let cache = ResourceCache::default();

        // No gateway: the network does not matter, one shared set.
        let ctx = PushContext::build(&store, "v/1".into());
        let [va, vb] = [&a1, &b].map(|p| view(&ctx, p, &cache));
        assert!(va.shares(&vb, TypeKind::Endpoint));

        // With one, each network's proxies get their own, equal to the translation from
        // scratch, and share them.
        apply(&mut store, &gateway("192.0.2.1"));
        let ctx = PushContext::build(&store, "v/2".into());
        assert_views_agree_for(&ctx, &cache, vec![a1.clone(), a2.clone(), b.clone()]);
        let [va1, va2, vb] = [&a1, &a2, &b].map(|p| view(&ctx, p, &cache));
        assert!(va1.shares(&va2, TypeKind::Endpoint));
        assert!(!va1.shares(&vb, TypeKind::Endpoint));
        let has = |v: &View, ip: &str| String::from_utf8_lossy(&bytes(v)).contains(ip);
        assert!(has(&va1, "192.0.2.1") && !has(&va1, "10.0.0.2"));
        assert!(!has(&vb, "192.0.2.1") && has(&vb, "10.0.0.2"));

        // A new gateway address is a change to the Service alone: the update rebuilds the
        // gateways, and the cache serves no load assignment of the old ones.
        let before = ctx;
        let changed = [crate::config::ObjectKey::new(
            crate::config::Kind::Service,
            "istio-system",
            "eastwest",
        )];
        apply(&mut store, &gateway("192.0.2.9"));
        let ctx = before.update(&store, &changed.iter().cloned().collect(), "v/3".into());
        assert!(ctx.affects(&a1, changed.iter()));
        assert_views_agree_for(&ctx, &cache, vec![a1.clone(), b.clone()]);
        assert!(has(&view(&ctx, &a1, &cache), "192.0.2.9"));

        // A Service that stops being a gateway still reaches every proxy in that update.
        let plain = gateway("192.0.2.9")
            .replace("labels: {topology.istio.io/network: net-b}", "labels: {}");
        apply(&mut store, &plain);
        let ctx = ctx.update(&store, &changed.iter().cloned().collect(), "v/4".into());
        assert!(!ctx.networks.enabled());
        assert!(ctx.networks.names_service("istio-system", "eastwest"));
        assert_views_agree_for(&ctx, &cache, vec![a1.clone(), b.clone()]);
        assert!(has(&view(&ctx, &a1, &cache), "10.0.0.2"));
    }

    #[test]
    fn a_sniffed_ports_own_route_configuration_is_cached_apart_from_the_ports() {
        let mut store = Shape::new(20, 2, 2).store();
        apply(
            &mut store,
            "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns-0}\nspec: {clusterIP: 10.100.9.8, ports: [{name: web, port: 7070}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: routed, namespace: ns-1}\nspec: {clusterIP: 10.100.9.7, ports: [{port: 7070}]}\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: routed, namespace: ns-1}\nspec:\n  hosts: [routed]\n  http: [{match: [{headers: {x-team: {exact: a}}}], route: [{destination: {host: web.ns-0.svc.cluster.local}}]}, {route: [{destination: {host: routed}}]}]\n",
        );
        let ctx = PushContext::build(&store, "v/1".into());
        let cache = ResourceCache::default();
        // Without capture the sniffed services join route `7070`: the same services and
        // port, other domains.
        let meta = json!({"NAMESPACE": "ns-0", "INTERCEPTION_MODE": "NONE"});
        let no_capture = Proxy::from_node(
            "sidecar~10.9.0.2~q-0.ns-0~ns-0.svc.cluster.local",
            meta.as_object().unwrap(),
        )
        .unwrap();
        let mut proxies = proxies();
        proxies.push(no_capture.clone());
        // Twice: the second round reads what the first cached.
        assert_views_agree_for(&ctx, &cache, proxies.clone());
        assert_views_agree_for(&ctx, &cache, proxies);
        let names = |p: &Proxy| -> Vec<String> {
            let v = view(&ctx, p, &cache);
            (v.all(TypeKind::Route).keys())
                .filter(|n| n.contains("7070"))
                .map(|n| n.to_string())
                .collect()
        };
        let captured = proxy("sidecar", "ns-0", json!({"app": "a"}), false);
        assert_eq!(
            names(&captured),
            [
                "routed.ns-1.svc.cluster.local:7070",
                "web.ns-0.svc.cluster.local:7070"
            ]
        );
        assert_eq!(names(&no_capture), ["7070"]);
    }
}
