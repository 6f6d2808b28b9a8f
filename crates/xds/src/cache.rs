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
//! hosts: a change to one VirtualService translates and encodes its routes only (see
//! `gateway`).
//!
//! Route configurations are assembled from encoded virtual hosts: protobuf concatenates
//! the occurrences of a repeated field, and `virtual_hosts` (field 2) follows `name`
//! (field 1) in prost's field order, so `name`, the virtual hosts, then the other fields
//! are exactly the bytes prost would write for the whole message.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use envoy_api::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_api::pb::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost};
use prometheus_client::metrics::counter::Counter;
use prost::Message;

use super::metrics::{XdsMetrics, type_label};
use super::resource::{
    Resource, ResourceSet, TypeKind, View, encode, encode_cluster, from_bytes, from_pieces,
    resource_map,
};
use api::networking::LocalityLoadBalancerSetting;
use model::config::{ConfigObject, ObjectKey, Spec};
use model::network::NetworkGateways;
use model::service::AutoAddresses;
use model::{Proxy, ProxyKind, PushContext, Service};
use translate::locality::{self, Place};
use translate::route::Audience;
use translate::{self};

mod gateway;
mod view;

use self::view::vhds_resource;
pub use self::view::{view, view_after_endpoints};

use self::gateway::{GatewayHostMemo, GatewayRoutesEntry};

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
    /// MeshConfig's cluster defaults ([`translate::pool::MeshPool`]; boxed, as rarely set).
    mesh_pool: Option<Box<translate::pool::MeshPool>>,
    /// The networks' gateways, which split load assignments by network.
    networks: Arc<NetworkGateways>,
    /// `Some`: the load assignments are balanced by locality and depend on the proxy's
    /// [`Place`]: its locality and these labels.
    dependence: Option<Box<[String]>>,
    /// By [`slot`].
    clusters: [Option<Arc<ServiceResources>>; SLOTS],
    /// With a dependence, by slot and (restricted) place instead.
    placed: Vec<(usize, Place, Arc<ServiceResources>)>,
    /// `(port, who reads it)` → the encoded `virtual_hosts` field.
    vhosts: Vec<(u32, Audience, Arc<[u8]>)>,
    /// The service's virtual hosts routed by a VirtualService, encoded.
    routed: Vec<RoutedHost>,
}

impl HostEntry {
    /// Whether it was built from `svc` and `ctx`'s trust domain, mesh-wide balancing and
    /// cluster defaults (what every entry of one service shares; each has its own rule).
    fn built_from(&self, ctx: &PushContext, svc: &Arc<Service>) -> bool {
        let mesh = &ctx.mesh;
        same(Some(&self.service), Some(svc))
            && self.trust_domain == mesh.trust_domain
            && self.mesh_locality.as_deref() == mesh.locality_lb_setting.as_ref()
            && translate::pool::same_mesh_pool(self.mesh_pool.as_deref(), mesh)
            && (Arc::ptr_eq(&self.networks, &ctx.networks) || self.networks == ctx.networks)
    }

    /// Whether it caches what the object that declares `svc` declares for its host: the
    /// entries of a host several services declare (ServiceEntries of several namespaces)
    /// are kept apart, as proxies of different namespaces read different ones.
    fn of(&self, svc: &Arc<Service>) -> bool {
        Arc::ptr_eq(&self.service, svc)
            || (self.service.namespace == svc.namespace && self.service.name == svc.name)
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
        match ctx.service_for(proxy, host) {
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

/// The slots of a service's entry: proxy kind × plaintext/secure × stock Envoy/istio-proxy.
const SLOTS: usize = 8;

fn slot(kind: ProxyKind, secure: bool, istio_extensions: bool) -> usize {
    (kind == ProxyKind::Router) as usize * 4 + secure as usize * 2 + istio_extensions as usize
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
    /// MeshConfig's `defaultHttpRetryPolicy` the gateway routes were built with.
    gateway_routes_retries: Mutex<Option<api::networking::HttpRetry>>,
    gateway_hosts: Mutex<GatewayHostMemo>,
    names: Mutex<NameMemo>,
    tables: Mutex<Vec<TableEntry>>,
    hits: Counter,
    misses: Counter,
}

/// By host (and, for a proxy that knows the service by auto-allocated addresses, what it
/// reads of them: [`Service::auto_for`]): the service's encoded name table entry
/// (istio.networking.nds.v1; empty when it has none), and the service it was built from.
/// A headless service has none here: its entries depend on the proxy's network.
#[derive(Default)]
struct NameMemo {
    plain: foldhash::HashMap<String, NameEntry>,
    auto: foldhash::HashMap<(String, AutoAddresses), NameEntry>,
}

/// A service's encoded name table entry and the service it was built from.
type NameEntry = (Arc<Service>, Arc<[u8]>);

impl NameMemo {
    fn get_mut(&mut self, svc: &Service, auto: AutoAddresses) -> Option<&mut NameEntry> {
        match auto {
            AutoAddresses::None => self.plain.get_mut(svc.hostname.as_str()),
            auto => self.auto.get_mut(&(svc.hostname.clone(), auto)),
        }
    }

    fn insert(&mut self, svc: &Arc<Service>, auto: AutoAddresses, bytes: Arc<[u8]>) {
        let entry = (svc.clone(), bytes);
        match auto {
            AutoAddresses::None => self.plain.insert(svc.hostname.clone(), entry),
            auto => self.auto.insert((svc.hostname.clone(), auto), entry),
        };
    }

    fn retain_services_of(&mut self, ctx: &PushContext) {
        self.plain.retain(|host, _| ctx.services.contains_key(host));
        self.auto
            .retain(|(host, _), _| ctx.services.contains_key(host));
    }
}

/// A name table assembled for the views of one context with one service list (and, when
/// some of them is headless, one network), shared by them: the unscoped sidecars of every
/// namespace hold the same table.
struct TableEntry {
    ctx: u64,
    /// The services' addresses: they name the services while the context's entries are
    /// kept (the context holds them).
    services: Vec<usize>,
    network: Option<String>,
    auto: AutoAddresses,
    table: Arc<Resource>,
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

/// VHDS resources by the encoded virtual host they were made from (its allocation, which
/// the memo holds so that the address stays its own) and their route configuration: the
/// views of a push, and of the next, share them as they share the virtual hosts.
type VhdsMemo = Generations<(usize, Arc<str>), (Arc<[u8]>, Arc<Resource>)>;

impl ResourceCache {
    /// A cache counting its reads in `pilot_xds_cache_reads{type="hit"|"miss"}`.
    pub fn new(metrics: &XdsMetrics) -> ResourceCache {
        ResourceCache {
            hits: metrics
                .cache_reads
                .get_or_create(&type_label("hit"))
                .clone(),
            misses: metrics
                .cache_reads
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

    /// Drops what `ctx` can no longer use: the entries of services it does not have (of a
    /// host, those of objects that no longer declare it), and,
    /// when the push that brings it may have changed routing (`changed` names a
    /// VirtualService or Gateway, or is `None` for a full push), the gateway routes of
    /// VirtualServices it does not have in the form they were built from, or of Gateway
    /// servers it does not have.
    pub fn retain_services_of(&self, ctx: &PushContext, changed: Option<&BTreeSet<ObjectKey>>) {
        self.hosts.lock().unwrap().retain(|host, entries| {
            match (ctx.shared_hosts.get(host), ctx.services.get(host)) {
                (Some(all), _) => entries.retain(|e| all.declared().iter().any(|s| e.of(s))),
                (None, Some(svc)) => entries.retain(|e| e.of(svc)),
                (None, None) => entries.clear(),
            }
            !entries.is_empty()
        });
        self.names.lock().unwrap().retain_services_of(ctx);
        self.retain_gateway_routes(ctx, changed);
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
        if !(entries.iter().find(|e| e.of(svc))).is_some_and(|e| e.built_from(ctx, svc)) {
            entries.retain(|e| !e.of(svc));
            if entries.is_empty() {
                hosts.remove(&svc.hostname);
            }
            return None;
        }
        let entry = (entries.iter_mut()).find(|e| e.of(svc) && same(e.rule.as_ref(), rule))?;
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
        if (entries.iter().find(|e| e.of(svc))).is_some_and(|e| !e.built_from(ctx, svc)) {
            return;
        }
        let i = match (entries.iter()).position(|e| e.of(svc) && same(e.rule.as_ref(), rule)) {
            Some(i) => i,
            None => {
                let own = || (0..entries.len()).filter(|&i| entries[i].of(svc));
                if own().count() >= RULE_VARIANTS
                    && let Some(oldest) = own().min_by_key(|&i| entries[i].used)
                {
                    entries.swap_remove(oldest);
                }
                entries.push(HostEntry {
                    service: svc.clone(),
                    rule: rule.cloned(),
                    used: ctx.id(),
                    trust_domain: ctx.mesh.trust_domain.clone(),
                    mesh_locality: ctx.mesh.locality_lb_setting.clone().map(Box::new),
                    mesh_pool: translate::pool::mesh_pool(&ctx.mesh),
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
        (secure, istio_extensions): (bool, bool),
        at: &Place,
    ) -> Arc<ServiceResources> {
        let i = slot(kind, secure, istio_extensions);
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
        let (mut clusters, endpoints) = translate::cluster::service(
            ctx,
            svc,
            rule.map(|r| &**r),
            kind,
            secure,
            place.as_ref().unwrap_or(&Place::default()),
        );
        if istio_extensions {
            translate::istio_proxy::add_cluster_filters(ctx, &mut clusters);
        }
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
        (self.locality_labels(ctx))
            .is_some_and(|l| l.iter().any(|k| k == model::service::HOSTNAME_LABEL))
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
            slot: slot(kind, secure, proxy.istio_extensions),
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
            let parts = self.service(ctx, svc, rule, kind, (secure, proxy.istio_extensions), at);
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
    /// (`vhds_resource`), shared with the other views of this context and the last.
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
        let retries = ctx.mesh.default_http_retry_policy.as_ref();
        let vh = translate::route::default_virtual_host(
            svc,
            rule.map(|r| &**r),
            port,
            audience,
            retries,
        );
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
        let audience = Audience::new(svc, proxy, sniffed);
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

/// Routes as a run of `VirtualHost.routes` fields.
fn encode_routes(routes: &[Route]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in routes {
        prost::encoding::message::encode(ROUTES, r, &mut out);
    }
    out
}

fn encode_assignment(a: &ClusterLoadAssignment) -> Arc<Resource> {
    super::resource::encode_load_assignment(a)
}

fn virtual_host_field(vh: &VirtualHost) -> Vec<u8> {
    let mut out = Vec::with_capacity(vh.encoded_len() + 4);
    prost::encoding::message::encode(VIRTUAL_HOSTS, vh, &mut out);
    out
}

#[cfg(test)]
mod tests;
