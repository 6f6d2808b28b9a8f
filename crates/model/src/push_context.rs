//! The push context: an immutable, indexed snapshot of the model built once per push and
//! shared (behind an `Arc`) by every proxy that push reaches. Translation reads only this.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::Serialize;

use super::destination_rule::{self, DestinationRules};
use super::egress::{self, Egress};
use super::service::{build_services, endpoint_locality, kubernetes_hostname, kubernetes_service};
use super::shared_hosts::SharedHosts;
use super::{
    Proxy, ProxyKind, REVISION_LABEL, Service, Store, host_covers, host_matches,
    namespace_revision, resolve_host,
};
use crate::Locality;
use crate::config::{ConfigObject, EndpointSliceDef, Kind, ObjectKey, Spec};
use crate::mesh::MeshConfig;
use crate::network::{EndpointNetworks, NETWORK_LABEL, NetworkGateways};
use api::labels_match;
use api::networking::{
    Destination, DestinationRuleSpec, GatewaySpec, OutboundMode, SidecarSpec, VirtualServiceSpec,
};

/// A problem that only shows when objects are put together (a route to a missing host).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelIssue {
    pub object: String,
    pub field: String,
    pub message: String,
}

/// Why an extension provider cannot be used.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderProblem {
    /// The provider's type (`zipkin`, ...) when its service was not found.
    pub lookup_failed: Option<&'static str>,
    pub message: String,
}

/// `(namespace, name)` of VirtualServices.
pub type Delegated = BTreeSet<(String, String)>;

static EMPTY_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// Pod labels by namespace, then Pod name: looked up per proxy per push, by the proxy's
/// own strings, without building a key.
pub type PodLabels = imbl::HashMap<String, imbl::HashMap<String, BTreeMap<String, String>>>;

/// Built in full by [`PushContext::build`], or from the previous push's context and the
/// keys that changed by [`PushContext::update`], which reuses everything the change does
/// not touch: unchanged services keep their `Arc`, unchanged lists are shared.
#[derive(Debug, Default, PartialEq)]
pub struct PushContext {
    /// `<RFC3339>/<counter>`, as istiod versions its pushes.
    /// Shared by every proxy's sync status that records it.
    pub version: Arc<str>,
    /// Unique to this context (and its clones) in the process: what is derived from one
    /// context can be memoized under it.
    id: ContextId,
    /// The store this context was built from (a constant-time snapshot): the next update
    /// reads what changed objects were before (an EndpointSlice's former service).
    pub(super) store: Store,
    /// By host, the service most proxies get (persistent: an update shares every untouched
    /// node with the previous context). A proxy may get another one of a host in
    /// `shared_hosts` ([`PushContext::service_for`]).
    pub services: imbl::OrdMap<String, Arc<Service>>,
    /// The hosts several services declare (usually none).
    pub shared_hosts: Arc<SharedHosts>,
    /// Root VirtualServices (those with hosts), oldest first (Istio's precedence), then by
    /// namespace/name, with their delegates' routes merged in ([`super::delegate`]).
    pub virtual_services: Arc<Vec<Arc<ConfigObject>>>,
    /// The VirtualServices some root delegates to.
    pub delegated: Arc<Delegated>,
    /// DestinationRules, indexed for istiod's precedence ([`PushContext::destination_rule`]).
    pub destination_rules: Arc<DestinationRules>,
    pub gateways: Arc<Vec<Arc<ConfigObject>>>,
    pub sidecars: Arc<Vec<Arc<ConfigObject>>>,
    /// Oldest first, then by key.
    pub peer_authentications: Arc<Vec<Arc<ConfigObject>>>,
    /// Oldest first, then by key.
    pub request_authentications: Arc<Vec<Arc<ConfigObject>>>,
    /// Oldest first, then by key.
    pub authorization_policies: Arc<Vec<Arc<ConfigObject>>>,
    /// Oldest first, then by key.
    pub telemetries: Arc<Vec<Arc<ConfigObject>>>,
    /// TLS Secrets by (namespace, name), for gateway credentials.
    pub secrets: Arc<HashMap<(String, String), Arc<ConfigObject>>>,
    pub pod_labels: PodLabels,
    pub namespace_labels: Arc<HashMap<String, BTreeMap<String, String>>>,
    /// Mesh-wide settings (the `istio` ConfigMap), defaults without one.
    pub mesh: MeshConfig,
    /// The networks' gateways: with any, load assignments depend on the proxy's network.
    pub networks: Arc<NetworkGateways>,
    pub issues: Arc<Vec<ModelIssue>>,
}

/// The objects of `kind`, oldest first, then by key.
fn oldest_first(store: &Store, kind: Kind) -> Arc<Vec<Arc<ConfigObject>>> {
    let mut objects: Vec<_> = store.of_kind(kind).cloned().collect();
    by_age(&mut objects);
    Arc::new(objects)
}

/// `old` again, or `build()` when its inputs changed.
fn rebuilt_if<T: Clone>(changed: bool, old: &T, build: impl FnOnce() -> T) -> T {
    if changed { build() } else { old.clone() }
}

/// The root VirtualServices with their delegates merged in, and the delegates' names.
fn virtual_services(
    store: &Store,
    mesh: &MeshConfig,
) -> (Arc<Vec<Arc<ConfigObject>>>, Arc<Delegated>) {
    let default = &mesh.default_virtual_service_export_to;
    let merged = super::delegate::merge(&oldest_first(store, Kind::VirtualService), default);
    (Arc::new(merged.roots), Arc::new(merged.delegated))
}

fn sidecars(store: &Store) -> Arc<Vec<Arc<ConfigObject>>> {
    Arc::new(store.of_kind(Kind::Sidecar).cloned().collect())
}

fn destination_rules(store: &Store, mesh: &MeshConfig) -> Arc<DestinationRules> {
    let rules = store.of_kind(Kind::DestinationRule).cloned().collect();
    Arc::new(DestinationRules::new(rules, mesh))
}

fn secrets(store: &Store) -> Arc<HashMap<(String, String), Arc<ConfigObject>>> {
    Arc::new(
        store
            .of_kind(Kind::Secret)
            .map(|o| ((o.key.namespace.clone(), o.key.name.clone()), o.clone()))
            .collect(),
    )
}

fn namespace_labels(store: &Store) -> Arc<HashMap<String, BTreeMap<String, String>>> {
    Arc::new(
        store
            .of_kind(Kind::Namespace)
            .map(|n| (n.key.name.clone(), n.meta.labels.clone()))
            .collect(),
    )
}

/// A service as one context held it and as a later one holds it (`None`: it had none).
pub type ServiceChange<'a> = (Option<&'a Arc<Service>>, Option<&'a Arc<Service>>);

/// The Kubernetes services (namespace, name) whose endpoints a change to these keys can
/// alter: the Service itself, the service an EndpointSlice belongs to now or belonged to
/// in `before`, and the services whose endpoints name a changed Pod.
fn touched_services(
    before: &Store,
    store: &Store,
    changed: &BTreeSet<ObjectKey>,
) -> BTreeSet<(String, String)> {
    let mut touched = BTreeSet::new();
    for key in changed {
        let ns = &key.namespace;
        match key.kind {
            Kind::Service | Kind::Endpoints => {
                touched.insert((ns.clone(), key.name.clone()));
            }
            Kind::EndpointSlice => {
                for s in [before, store] {
                    if let Some(Spec::EndpointSlice(slice)) = s.get(key).map(|o| &o.spec) {
                        touched.insert((ns.clone(), slice.service_name.clone()));
                    }
                }
            }
            Kind::Pod => {
                let names_pod = |slice: &EndpointSliceDef| {
                    slice
                        .endpoints
                        .iter()
                        .any(|e| e.pod.as_deref() == Some(key.name.as_str()))
                };
                for o in store.in_namespace(Kind::EndpointSlice, ns) {
                    if let Spec::EndpointSlice(slice) = &o.spec
                        && names_pod(slice)
                    {
                        touched.insert((ns.clone(), slice.service_name.clone()));
                    }
                }
                for o in store.in_namespace(Kind::Endpoints, ns) {
                    if let Spec::Endpoints(subsets) = &o.spec
                        && subsets.iter().any(names_pod)
                    {
                        touched.insert((ns.clone(), o.key.name.clone()));
                    }
                }
            }
            _ => {}
        }
    }
    touched
}

pub(super) fn by_age(objects: &mut [Arc<ConfigObject>]) {
    objects.sort_by(|a, b| {
        (a.meta.creation_timestamp.as_deref().unwrap_or(""), &a.key)
            .cmp(&(b.meta.creation_timestamp.as_deref().unwrap_or(""), &b.key))
    });
}

/// A context's identity. It is not part of what a context holds: contexts of equal
/// content compare equal whatever their identities.
#[derive(Clone, Copy, Debug)]
struct ContextId(u64);

impl ContextId {
    fn next() -> ContextId {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        ContextId(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

impl Default for ContextId {
    fn default() -> ContextId {
        ContextId::next()
    }
}

impl PartialEq for ContextId {
    fn eq(&self, _: &ContextId) -> bool {
        true
    }
}

impl PushContext {
    /// The clusters whose load assignment holds no endpoint, by name (istiod's
    /// `pilot_eds_no_instances`): each port of an EDS service that no endpoint serves, and
    /// each DestinationRule subset of an EDS service whose labels select no endpoint
    /// serving the port.
    pub fn clusters_without_endpoints(&self) -> Vec<String> {
        let mut out = Vec::new();
        let serving = |svc: &Service, port: u32, labels: &BTreeMap<String, String>| {
            svc.endpoints.iter().any(|e| {
                e.ports.contains_key(&port)
                    && labels.iter().all(|(k, v)| e.labels.get(k) == Some(v))
            })
        };
        let mut by_host: HashMap<&str, Vec<&Service>> = HashMap::new();
        let eds = self.all_services();
        for svc in eds.filter(|s| s.discovery == crate::service::Discovery::Eds) {
            by_host.entry(&svc.hostname).or_default().push(svc);
            for p in &svc.ports {
                if !serving(svc, p.port, &BTreeMap::new()) {
                    out.push(format!("outbound|{}||{}", p.port, svc.hostname));
                }
            }
        }
        for rule in self.destination_rules.values() {
            let Some(spec) = crate::destination_rule::spec(rule) else {
                continue;
            };
            let host = crate::resolve_host(&spec.host, &rule.key.namespace);
            for svc in by_host.get(host.as_str()).into_iter().flatten() {
                for subset in &spec.subsets {
                    for p in &svc.ports {
                        if !serving(svc, p.port, &subset.labels) {
                            out.push(format!(
                                "outbound|{}|{}|{}",
                                p.port, subset.name, svc.hostname
                            ));
                        }
                    }
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Unique to this context (and its clones) in the process.
    pub fn id(&self) -> u64 {
        self.id.0
    }

    /// A push context from YAML that must be free of errors (tests).
    #[cfg(any(test, feature = "testmesh"))]
    pub fn from_yaml(yaml: &str) -> PushContext {
        let mut store = Store::default();
        let parsed = crate::config::parse::parse_file("test.yaml", yaml);
        assert!(parsed.errors().next().is_none(), "{:?}", parsed.issues);
        for o in parsed.objects {
            store.apply(o);
        }
        PushContext::build(&store, "v/1".into())
    }

    pub fn build(store: &Store, version: String) -> PushContext {
        let mesh = MeshConfig::from_store(store);
        let (virtual_services, delegated) = virtual_services(store, &mesh);
        let networks = Arc::new(NetworkGateways::new(store, &mesh));
        let (services, shared_hosts) = build_services(store, &mesh);
        let mut ctx = PushContext {
            version: version.into(),
            id: ContextId::next(),
            store: store.clone(),
            services,
            shared_hosts: Arc::new(shared_hosts),
            virtual_services,
            delegated,
            destination_rules: destination_rules(store, &mesh),
            gateways: oldest_first(store, Kind::Gateway),
            sidecars: sidecars(store),
            peer_authentications: oldest_first(store, Kind::PeerAuthentication),
            request_authentications: oldest_first(store, Kind::RequestAuthentication),
            authorization_policies: oldest_first(store, Kind::AuthorizationPolicy),
            telemetries: oldest_first(store, Kind::Telemetry),
            secrets: secrets(store),
            pod_labels: {
                let mut by_namespace = PodLabels::default();
                for p in store.of_kind(Kind::Pod) {
                    (by_namespace.entry(p.key.namespace.clone()).or_default())
                        .insert(p.key.name.clone(), p.meta.labels.clone());
                }
                by_namespace
            },
            namespace_labels: namespace_labels(store),
            mesh,
            networks,
            issues: Arc::default(),
        };
        ctx.issues = Arc::new(ctx.cross_check());
        ctx
    }

    /// The context for `store`, which differs from the one `self` was built from in the
    /// objects `changed`: equal to [`PushContext::build`], in time proportional to the
    /// change. Kinds whose effect is not confined to known services (Nodes, which give
    /// every endpoint on them its locality; ServiceEntries and WorkloadEntries) build in
    /// full.
    pub fn update(&self, store: &Store, changed: &BTreeSet<ObjectKey>, version: String) -> Self {
        let any = |kind: Kind| changed.iter().any(|k| k.kind == kind);
        // A Namespace's annotations decide its services' traffic distribution: rare
        // enough to build in full, as Node changes are.
        if any(Kind::Node)
            || any(Kind::ServiceEntry)
            || any(Kind::WorkloadEntry)
            || any(Kind::Namespace)
        {
            return PushContext::build(store, version);
        }
        let mesh = rebuilt_if(any(Kind::ConfigMap), &self.mesh, || {
            MeshConfig::from_store(store)
        });
        // MeshNetworks decide endpoints' networks, as a Namespace's labels do.
        if mesh.mesh_networks != self.mesh.mesh_networks {
            return PushContext::build(store, version);
        }
        let mut services = self.services.clone();
        let mut hosts_changed = false;
        let endpoint_networks = EndpointNetworks::new(store, &mesh);
        for (ns, name) in touched_services(&self.store, store, changed) {
            let host = kubernetes_hostname(&ns, &name);
            // A ServiceEntry declares the host too: the choice between them is the full
            // build's.
            if self.shared_hosts.get(&host).is_some() {
                return PushContext::build(store, version);
            }
            let built = store
                .get(&ObjectKey::new(Kind::Service, &ns, &name))
                .and_then(|o| kubernetes_service(o, store, &endpoint_networks));
            match built {
                // Rebuilt but equal: keep the old `Arc`, which caches compare first.
                Some(svc) if self.services.get(&host).is_some_and(|old| **old == svc) => {}
                Some(svc) => hosts_changed |= services.insert(host, Arc::new(svc)).is_none(),
                None => hosts_changed |= services.remove(&host).is_some(),
            }
        }
        // A ServiceEntry may define a hostname a Kubernetes service gave up.
        if hosts_changed && store.of_kind(Kind::ServiceEntry).next().is_some() {
            return PushContext::build(store, version);
        }
        let mut pod_labels = self.pod_labels.clone();
        for key in changed.iter().filter(|k| k.kind == Kind::Pod) {
            let pods = pod_labels.entry(key.namespace.clone()).or_default();
            match store.get(key) {
                Some(pod) => pods.insert(key.name.clone(), pod.meta.labels.clone()),
                None => pods.remove(&key.name),
            };
            if pods.is_empty() {
                pod_labels.remove(&key.namespace);
            }
        }
        // A Service that is or was a gateway changes the networks' gateways.
        // A ConfigMap change may be MeshNetworks' gateway hostname resolving anew.
        let gateway_changed = any(Kind::ConfigMap)
            || changed.iter().any(|k| {
                k.kind == Kind::Service
                    && (self.networks.names_service(&k.namespace, &k.name)
                        || (store.get(k))
                            .is_some_and(|o| o.meta.labels.contains_key(NETWORK_LABEL)))
            });
        let networks = rebuilt_if(gateway_changed, &self.networks, || {
            let mut networks = NetworkGateways::new(store, &mesh);
            networks.remember(&self.networks);
            Arc::new(networks)
        });
        let (virtual_services, delegated) = rebuilt_if(
            any(Kind::VirtualService) || mesh != self.mesh,
            &(self.virtual_services.clone(), self.delegated.clone()),
            || virtual_services(store, &mesh),
        );
        // Each part: rebuilt when an object of its kind changed, else shared.
        let mut ctx = PushContext {
            version: version.into(),
            id: ContextId::next(),
            store: store.clone(),
            services,
            shared_hosts: self.shared_hosts.clone(),
            virtual_services,
            delegated,
            destination_rules: rebuilt_if(
                any(Kind::DestinationRule) || mesh != self.mesh,
                &self.destination_rules,
                || destination_rules(store, &mesh),
            ),
            gateways: rebuilt_if(any(Kind::Gateway), &self.gateways, || {
                oldest_first(store, Kind::Gateway)
            }),
            sidecars: rebuilt_if(any(Kind::Sidecar), &self.sidecars, || sidecars(store)),
            peer_authentications: rebuilt_if(
                any(Kind::PeerAuthentication),
                &self.peer_authentications,
                || oldest_first(store, Kind::PeerAuthentication),
            ),
            request_authentications: rebuilt_if(
                any(Kind::RequestAuthentication),
                &self.request_authentications,
                || oldest_first(store, Kind::RequestAuthentication),
            ),
            authorization_policies: rebuilt_if(
                any(Kind::AuthorizationPolicy),
                &self.authorization_policies,
                || oldest_first(store, Kind::AuthorizationPolicy),
            ),
            telemetries: rebuilt_if(any(Kind::Telemetry), &self.telemetries, || {
                oldest_first(store, Kind::Telemetry)
            }),
            secrets: rebuilt_if(any(Kind::Secret), &self.secrets, || secrets(store)),
            pod_labels,
            namespace_labels: rebuilt_if(any(Kind::Namespace), &self.namespace_labels, || {
                namespace_labels(store)
            }),
            mesh,
            networks,
            issues: self.issues.clone(),
        };
        // Route destinations are checked against hosts, subsets and gateways.
        if hosts_changed
            || any(Kind::VirtualService)
            || any(Kind::DestinationRule)
            || any(Kind::Gateway)
            || any(Kind::AuthorizationPolicy)
            || any(Kind::ConfigMap)
            || gateway_changed
        {
            ctx.issues = Arc::new(ctx.cross_check());
        }
        ctx
    }

    /// The Kubernetes services `changed` touched (by their Service, Endpoints or
    /// EndpointSlices, or a Pod behind them), as `previous` and this context hold them.
    pub fn touched_services_since<'a>(
        &'a self,
        previous: &'a PushContext,
        changed: &BTreeSet<ObjectKey>,
    ) -> Vec<ServiceChange<'a>> {
        touched_services(&previous.store, &self.store, changed)
            .into_iter()
            .map(|(ns, name)| {
                let host = kubernetes_hostname(&ns, &name);
                (previous.services.get(&host), self.services.get(&host))
            })
            .collect()
    }

    /// Endpoints of Kubernetes services with no known Pod behind them (Istio's
    /// `endpoint_no_pod`: stale slices, or Pods not yet seen).
    pub fn endpoints_without_pod(&self) -> usize {
        self.services
            .values()
            .filter(|s| s.kubernetes)
            .flat_map(|s| &s.endpoints)
            .filter(|e| e.pod.is_none())
            .count()
    }

    /// istiod's `LookupCluster`: the host of an extension provider's `service`
    /// (`[namespace/]hostname`), if a service has it (in that namespace, if named).
    pub fn provider_host<'a>(&self, service: &'a str) -> Option<&'a str> {
        let (namespace, host) = match service.split_once('/') {
            Some((ns, host)) => (Some(ns), host),
            None => (None, service),
        };
        let in_namespace = |svc: &Arc<Service>| namespace.is_none_or(|ns| ns == svc.namespace);
        let found = match self.shared_hosts.get(host) {
            Some(all) => all.declared().iter().any(in_namespace),
            None => self.services.get(host).is_some_and(in_namespace),
        };
        found.then_some(host)
    }

    /// Why the mesh's default tracing provider (`defaultProviders.tracing`) cannot be
    /// used, if it cannot: istiod then configures no tracing at all, and so does meshd.
    pub fn tracing_problem(&self) -> Option<ProviderProblem> {
        let name = self.mesh.default_providers.tracing.first()?;
        let problem = |message| ProviderProblem {
            lookup_failed: None,
            message,
        };
        let Some(p) = self.mesh.extension_provider(name) else {
            return Some(problem(format!(
                "extension provider {name:?} is not defined in MeshConfig extensionProviders"
            )));
        };
        let (kind, service) = match (&p.zipkin, &p.opentelemetry) {
            (Some(z), _) => ("zipkin", &z.service),
            (None, Some(o)) => ("opentelemetry", &o.service),
            (None, None) => {
                return Some(problem(format!(
                    "extension provider {name:?} is not a tracer meshd supports (zipkin or opentelemetry)"
                )));
            }
        };
        self.provider_host(service)
            .is_none()
            .then(|| ProviderProblem {
                lookup_failed: Some(kind),
                message: format!("extension provider {name:?}: no service {service:?}"),
            })
    }

    /// Cross-object checks: every route destination and subset must exist, every
    /// CUSTOM AuthorizationPolicy's provider, and the default tracing provider.
    fn cross_check(&self) -> Vec<ModelIssue> {
        let mut issues = self.networks.issues.clone();
        for ap in self.authorization_policies.iter() {
            let Spec::AuthorizationPolicy(spec) = &ap.spec else {
                continue;
            };
            let Some(name) = (spec.provider.as_ref()).map(|p| p.name.as_str()) else {
                continue;
            };
            let providers = &self.mesh.extension_providers;
            let problem = match providers
                .iter()
                .find(|p| p.name == name)
                .map(|p| p.authorizer())
            {
                None => format!(
                    "extension provider {name:?} is not defined in MeshConfig extensionProviders"
                ),
                Some(None) => format!(
                    "extension provider {name:?} is not envoyExtAuthzHttp or envoyExtAuthzGrpc"
                ),
                Some(Some((service, _))) if self.provider_host(service).is_none() => {
                    format!("extension provider {name:?}: no service {service:?}")
                }
                Some(Some(_)) => continue,
            };
            issues.push(ModelIssue {
                object: ap.key.to_string(),
                field: "spec.provider.name".into(),
                message: format!("{problem}; requests its rules match are denied"),
            });
        }
        if let Some(problem) = self.tracing_problem()
            && let Some((mesh, _)) = super::mesh::MeshConfig::source(&self.store)
        {
            issues.push(ModelIssue {
                object: mesh.key.to_string(),
                field: "data.mesh.defaultProviders.tracing[0]".into(),
                message: format!("{}; no proxy is configured to trace", problem.message),
            });
        }
        // Delegates that are missing, not delegates, or not exported to their root.
        for vs in self.store.of_kind(Kind::VirtualService) {
            let Spec::VirtualService(spec) = &vs.spec else {
                continue;
            };
            if spec.hosts.is_empty() {
                continue; // a delegate: validation refuses one that delegates again
            }
            for (i, http) in spec.http.iter().enumerate() {
                let Some(target) = &http.delegate else {
                    continue;
                };
                let ns = super::delegate::namespace_of(target, &vs.key.namespace);
                let key = ObjectKey::new(Kind::VirtualService, ns, &target.name);
                let found = self.store.get(&key);
                let default = &self.mesh.default_virtual_service_export_to;
                if let Some(message) = super::delegate::unusable(
                    &vs.key.namespace,
                    target,
                    found.map(|f| &**f),
                    default,
                ) {
                    issues.push(ModelIssue {
                        object: vs.key.to_string(),
                        field: format!("spec.http[{i}].delegate"),
                        message,
                    });
                }
            }
        }
        for vs in self.virtual_services.iter() {
            let Spec::VirtualService(spec) = &vs.spec else {
                continue;
            };
            let http = spec.http.iter().enumerate().flat_map(|(i, http)| {
                (http.route.iter().enumerate()).map(move |(j, d)| {
                    (
                        format!("spec.http[{i}].route[{j}].destination"),
                        &d.destination,
                    )
                })
            });
            let tcp = spec.tcp.iter().enumerate().flat_map(|(i, tcp)| {
                (tcp.route.iter().enumerate()).map(move |(j, d)| {
                    (
                        format!("spec.tcp[{i}].route[{j}].destination"),
                        &d.destination,
                    )
                })
            });
            let mirrors = spec.http.iter().enumerate().flat_map(|(i, http)| {
                let mirror =
                    (http.mirror.iter()).map(move |d| (format!("spec.http[{i}].mirror"), d));
                let listed = (http.mirrors.iter().enumerate()).map(move |(j, m)| {
                    (
                        format!("spec.http[{i}].mirrors[{j}].destination"),
                        &m.destination,
                    )
                });
                mirror.chain(listed)
            });
            let tls = spec.tls.iter().enumerate().flat_map(|(i, tls)| {
                (tls.route.iter().enumerate()).map(move |(j, d)| {
                    (
                        format!("spec.tls[{i}].route[{j}].destination"),
                        &d.destination,
                    )
                })
            });
            {
                for (field, d) in http.chain(tcp).chain(tls).chain(mirrors) {
                    let host = resolve_host(&d.host, &vs.key.namespace);
                    if !self.services.contains_key(&host)
                        && !self.services.keys().any(|h| host_matches(h, &host))
                    {
                        let outcome = if field.contains(".mirror") {
                            "copies of requests go nowhere"
                        } else {
                            "requests get 503"
                        };
                        issues.push(ModelIssue {
                            object: vs.key.to_string(),
                            field: format!("{field}.host"),
                            message: format!("no service or ServiceEntry for host {host:?}; {outcome} until one exists"),
                        });
                    } else if let Some(subset) = &d.subset {
                        let defined = self.destination_rules.defines_subset(&host, subset);
                        if !defined {
                            issues.push(ModelIssue {
                                object: vs.key.to_string(),
                                field: format!("{field}.subset"),
                                message: format!("subset {subset:?} of {host:?} is not defined by any DestinationRule"),
                            });
                        }
                    }
                }
            }
            for (i, gw) in spec.gateways.iter().enumerate() {
                if gw != "mesh" && self.gateway(gw, &vs.key.namespace).is_none() {
                    issues.push(ModelIssue {
                        object: vs.key.to_string(),
                        field: format!("spec.gateways[{i}]"),
                        message: format!("gateway {gw:?} not found"),
                    });
                }
            }
        }
        issues
    }

    fn gateway(&self, reference: &str, namespace: &str) -> Option<&Arc<ConfigObject>> {
        let (ns, name) = reference.split_once('/').unwrap_or((namespace, reference));
        self.gateways
            .iter()
            .find(|g| g.key.namespace == ns && g.key.name == name)
    }

    /// The DestinationRule istiod applies to `host` for `proxy`: see
    /// [`DestinationRules`] for the precedence of namespaces, `exportTo`, merging and
    /// `workloadSelector`.
    pub fn destination_rule(&self, proxy: &Proxy, host: &str) -> Option<&Arc<ConfigObject>> {
        match self.service_for(proxy, host) {
            Some(svc) => self.service_rule(proxy, svc),
            None => (self.destination_rules).choose(
                &proxy.namespace,
                || self.proxy_labels(proxy),
                host,
                None,
            ),
        }
    }

    /// [`PushContext::destination_rule`] for a service's own host.
    pub fn service_rule(&self, proxy: &Proxy, svc: &Service) -> Option<&Arc<ConfigObject>> {
        self.destination_rules.choose(
            &proxy.namespace,
            || self.proxy_labels(proxy),
            &svc.hostname,
            Some(&svc.namespace),
        )
    }

    /// [`PushContext::destination_rule`]'s spec.
    pub fn destination_rule_spec(&self, proxy: &Proxy, host: &str) -> Option<&DestinationRuleSpec> {
        self.destination_rule(proxy, host)
            .and_then(|r| destination_rule::spec(r))
    }

    /// The hosts whose DestinationRule for `proxy` is not the one a proxy of a namespace
    /// no rule singles out gets, with the rule it gets (by address; 0 for none), sorted.
    /// Empty for most proxies: views that agree on the rest share what they build.
    pub fn destination_rule_exceptions(&self, proxy: &Proxy) -> Vec<(String, usize)> {
        let patterns = self.destination_rules.exceptional_hosts(&proxy.namespace);
        if patterns.is_empty() {
            return Vec::new();
        }
        let address = |r: Option<&Arc<ConfigObject>>| r.map_or(0, |r| Arc::as_ptr(r) as usize);
        let mut out: Vec<(String, usize)> = Vec::new();
        let mut check = |svc: &Service| {
            let ns = Some(svc.namespace.as_str());
            let own = self.service_rule(proxy, svc);
            // A namespace no rule names, and no proxy labels.
            let common = self
                .destination_rules
                .choose("", || &EMPTY_LABELS, &svc.hostname, ns);
            if address(own) != address(common) {
                out.push((svc.hostname.clone(), address(own)));
            }
        };
        for pattern in patterns {
            if pattern.starts_with('*') {
                (self.all_services())
                    .filter(|s| host_covers(pattern, &s.hostname))
                    .for_each(|s| check(s));
            } else if let Some(all) = self.shared_hosts.get(pattern) {
                all.declared().iter().for_each(|s| check(s));
            } else if let Some(svc) = self.services.get(pattern) {
                check(svc);
            }
        }
        out.sort();
        out.dedup();
        out
    }
    /// The labels istiod uses for a proxy: its Pod's, else metadata `LABELS`.
    pub fn proxy_labels<'a>(&'a self, proxy: &'a Proxy) -> &'a BTreeMap<String, String> {
        (self.pod_labels.get(proxy.namespace.as_str()))
            .and_then(|pods| pods.get(proxy.pod_name.as_str()))
            .unwrap_or(proxy.labels.as_ref())
    }

    /// Where a proxy is: Envoy's `node.locality`; else its labels' `istio-locality` (as
    /// istio-agent reads it); else its Pod's, as its endpoints have it (the Pod's
    /// `topology.istio.io/locality` label, else its Node's topology labels), which istiod
    /// takes from the proxy's service endpoints.
    pub fn proxy_locality(&self, proxy: &Proxy) -> Locality {
        if !proxy.locality.region.is_empty() {
            return proxy.locality.clone();
        }
        if let Some(l) = self.proxy_labels(proxy).get("istio-locality") {
            return Locality::parse(&l.replace('.', "/"));
        }
        let Some((pod, node_name)) = self.proxy_pod(proxy) else {
            return Locality::default();
        };
        let node = node_name.and_then(|n| self.store.get(&ObjectKey::new(Kind::Node, "", n)));
        endpoint_locality(&pod.meta.labels, node.map(|n| &n.meta.labels), None)
    }

    /// The node a proxy runs on: its metadata `NODE_NAME` (istio-agent's, from the
    /// downward API), else its Pod's `spec.nodeName`.
    pub fn proxy_node(&self, proxy: &Proxy) -> Option<String> {
        if let Some(node) = &proxy.node_name {
            return Some(node.clone());
        }
        self.proxy_pod(proxy)?.1.cloned()
    }

    /// The proxy's Pod, if meshd knows it, and the node it is scheduled on.
    fn proxy_pod(&self, proxy: &Proxy) -> Option<(&ConfigObject, Option<&String>)> {
        let pod = self.store.get(&ObjectKey::new(
            Kind::Pod,
            &proxy.namespace,
            &proxy.pod_name,
        ))?;
        let node = match &pod.spec {
            Spec::Pod(def) => def.node_name.as_ref(),
            _ => None,
        };
        Some((pod, node))
    }

    /// The Sidecar resource that applies to a proxy: one whose workloadSelector matches,
    /// else the namespace's selector-less one.
    pub fn sidecar_for(&self, proxy: &Proxy) -> Option<(&ConfigObject, &SidecarSpec)> {
        if proxy.kind != ProxyKind::Sidecar {
            return None;
        }
        let labels = self.proxy_labels(proxy);
        let in_ns = self
            .sidecars
            .iter()
            .filter(|s| s.key.namespace == proxy.namespace);
        let mut fallback = None;
        for sc in in_ns {
            let Spec::Sidecar(spec) = &sc.spec else {
                continue;
            };
            match &spec.workload_selector {
                Some(sel) if labels_match(&sel.labels, labels) => return Some((sc, spec)),
                Some(_) => {}
                None => fallback = fallback.or(Some((&**sc, spec))),
            }
        }
        fallback
    }

    /// Whether a config object in `namespace` with host `host` is in the Sidecar scope:
    /// imported by any of its egress listeners.
    fn in_scope(scope: Option<&SidecarSpec>, proxy_ns: &str, namespace: &str, host: &str) -> bool {
        let Some(scope) = scope else { return true };
        scope.egress.is_empty()
            || (scope.egress.iter()).any(|e| egress::imports(&e.hosts, proxy_ns, namespace, host))
    }

    /// The proxy's egress listeners ([`Egress::of`] its Sidecar).
    pub fn egress_listeners(&self, proxy: &Proxy) -> Vec<Egress<'_>> {
        Egress::of(self.sidecar_for(proxy).map(|(_, s)| s))
    }

    /// Services a sidecar may reach: exportTo, then its Sidecar's egress hosts; one per
    /// host.
    pub fn services_for(&self, proxy: &Proxy) -> Vec<&Arc<Service>> {
        let scope = self.sidecar_for(proxy).map(|(_, s)| s);
        let imported =
            |s: &Service| Self::in_scope(scope, &proxy.namespace, &s.namespace, &s.hostname);
        self.exported_services(&proxy.namespace, imported)
    }

    /// The services exported to `namespace` that `usable` accepts, one per host (sorted
    /// by host): of a host several services declare, the one
    /// [`HostServices::choose`](super::shared_hosts::HostServices::choose) picks.
    pub fn exported_services(
        &self,
        namespace: &str,
        usable: impl Fn(&Service) -> bool,
    ) -> Vec<&Arc<Service>> {
        let default = &self.mesh.default_service_export_to;
        (self.services.values())
            .filter_map(|s| match self.shared_hosts.get(&s.hostname) {
                Some(all) => all.choose(namespace, default, &usable),
                None => (s.visible_from(namespace, default) && usable(s)).then_some(s),
            })
            .collect()
    }

    /// The service of `host` the proxy gets: of a host several services declare, the one
    /// its Sidecar imports, else any exported to its namespace (as [`Self::services_for`]
    /// chooses), else the one most proxies get.
    pub fn service_for(&self, proxy: &Proxy, host: &str) -> Option<&Arc<Service>> {
        let Some(all) = self.shared_hosts.get(host) else {
            return self.services.get(host);
        };
        let default = &self.mesh.default_service_export_to;
        let ns = &proxy.namespace;
        let scope = self.sidecar_for(proxy).map(|(_, s)| s);
        let imported = |s: &Service| Self::in_scope(scope, ns, &s.namespace, &s.hostname);
        (all.choose(ns, default, imported))
            .or_else(|| all.choose(ns, default, |_| true))
            .or_else(|| self.services.get(host))
    }

    /// Every service: those most proxies get, then the others of shared hosts.
    pub fn all_services(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.services.values().chain(self.shared_hosts.others())
    }

    /// How many services there are (`pilot_services`).
    pub fn service_count(&self) -> usize {
        self.services.len() + self.shared_hosts.others().count()
    }

    /// VirtualServices bound to `gateway` (`mesh` or `NS/NAME`) visible to the proxy.
    pub fn virtual_services_for<'a>(
        &'a self,
        proxy: &Proxy,
        gateway: &str,
    ) -> Vec<(&'a Arc<ConfigObject>, &'a VirtualServiceSpec)> {
        let scope = self.sidecar_for(proxy).map(|(_, s)| s);
        let imported = |ns: &str, host: &str| Self::in_scope(scope, &proxy.namespace, ns, host);
        self.virtual_services_where(proxy, gateway, imported)
    }

    /// The `mesh`-bound VirtualServices one egress listener of the proxy imports.
    pub fn virtual_services_of<'a>(
        &'a self,
        proxy: &Proxy,
        egress: &Egress<'_>,
    ) -> Vec<(&'a Arc<ConfigObject>, &'a VirtualServiceSpec)> {
        let imported = |ns: &str, host: &str| egress.imports(&proxy.namespace, ns, host);
        self.virtual_services_where(proxy, "mesh", imported)
    }

    /// VirtualServices bound to `gateway`, exported to the proxy, with a host `imported`
    /// (namespace, host) allows.
    fn virtual_services_where<'a>(
        &'a self,
        proxy: &Proxy,
        gateway: &str,
        imported: impl Fn(&str, &str) -> bool,
    ) -> Vec<(&'a Arc<ConfigObject>, &'a VirtualServiceSpec)> {
        self.virtual_services
            .iter()
            .filter_map(|vs| match &vs.spec {
                Spec::VirtualService(spec) => Some((vs, spec)),
                _ => None,
            })
            .filter(|(vs, spec)| {
                let bound = if spec.gateways.is_empty() {
                    gateway == "mesh"
                } else {
                    spec.gateways.iter().any(|g| {
                        g == gateway
                            || (!g.contains('/') && format!("{}/{g}", vs.key.namespace) == gateway)
                    })
                };
                let visible = super::exported_to(
                    &spec.export_to,
                    &self.mesh.default_virtual_service_export_to,
                    &vs.key.namespace,
                    &proxy.namespace,
                );
                bound
                    && visible
                    && (spec.hosts.iter())
                        .any(|h| imported(&vs.key.namespace, &resolve_host(h, &vs.key.namespace)))
            })
            .collect()
    }

    /// The port a gateway actually listens on for a Gateway server port: the targetPort of
    /// the gateway's own Service (one in its namespace selecting it) when that Service
    /// exposes the port, as istiod's resolvePorts does; else the port as written.
    pub fn gateway_listen_port(&self, proxy: &Proxy, port: u32) -> u32 {
        self.services_selecting(proxy)
            .filter(|s| {
                !s.labels
                    .contains_key("experimental.istio.io/disable-gateway-port-translation")
            })
            .find_map(|s| s.port(port))
            .map_or(port, |p| p.target_port.unwrap_or(port))
    }

    /// The Kubernetes services of the proxy's namespace whose selector selects it, by host.
    pub fn services_selecting<'a>(
        &'a self,
        proxy: &'a Proxy,
    ) -> impl Iterator<Item = &'a Arc<Service>> {
        let labels = self.proxy_labels(proxy);
        self.services.values().filter(move |s| {
            s.kubernetes
                && s.namespace == proxy.namespace
                && !s.selector.is_empty()
                && labels_match(&s.selector, labels)
        })
    }

    /// Whether a change to any of `keys` can alter what `proxy` receives, judged on this
    /// (new) context. Conservative: a wrong `true` costs one diff, a wrong `false` would
    /// leave a proxy stale, so every kind translation reads must be covered here.
    pub fn affects<'a>(
        &self,
        proxy: &Proxy,
        keys: impl IntoIterator<Item = &'a ObjectKey>,
    ) -> bool {
        // The proxy's Sidecar, resolved once and only if a key needs it.
        let mut sidecar: Option<Option<&SidecarSpec>> = None;
        keys.into_iter().any(|key| match key.kind {
            // Inbound policy: the proxy's namespace, or mesh-wide from the root namespace.
            // Authorization guards gateways too; peer authentication only sidecars.
            Kind::PeerAuthentication | Kind::RequestAuthentication | Kind::AuthorizationPolicy => {
                (proxy.kind == ProxyKind::Sidecar || key.kind != Kind::PeerAuthentication)
                    && (key.namespace == proxy.namespace
                        || key.namespace == self.mesh.root_namespace())
            }
            // Telemetry: the proxy's namespace, or mesh-wide from the root namespace.
            Kind::Telemetry => {
                key.namespace == proxy.namespace || key.namespace == self.mesh.root_namespace()
            }
            // A Sidecar can only select proxies of its own namespace.
            Kind::Sidecar => key.namespace == proxy.namespace,
            // Sidecars read only `mesh`-bound routes; Gateways shape routers alone, and
            // only gateways read Secrets (credentialName).
            Kind::Gateway | Kind::Secret => proxy.kind == ProxyKind::Router,
            // Found by host from any namespace, or shaping endpoints everywhere: rare.
            Kind::DestinationRule | Kind::Namespace | Kind::Node | Kind::ConfigMap => true,
            Kind::Pod if key.namespace == proxy.namespace && key.name == proxy.pod_name => true,
            // A network's gateway is in every proxy's load assignments, once multi-network.
            Kind::Service if self.networks.names_service(&key.namespace, &key.name) => true,
            // A delegate shapes its roots, wherever they are.
            Kind::VirtualService
                if self
                    .delegated
                    .contains(&(key.namespace.clone(), key.name.clone())) =>
            {
                true
            }
            Kind::VirtualService
            | Kind::Service
            | Kind::EndpointSlice
            | Kind::Endpoints
            | Kind::ServiceEntry
            | Kind::WorkloadEntry
            | Kind::Pod => {
                let scope = *sidecar.get_or_insert_with(|| self.sidecar_for(proxy).map(|(_, s)| s));
                Self::namespace_in_scope(proxy, scope, &key.namespace)
            }
        })
    }

    /// Whether config from `namespace` can be in the egress scope of `proxy`, whose
    /// Sidecar is `scope`.
    fn namespace_in_scope(proxy: &Proxy, scope: Option<&SidecarSpec>, namespace: &str) -> bool {
        if proxy.kind == ProxyKind::Router {
            return true;
        }
        let Some(scope) = scope else {
            return true;
        };
        scope.egress.is_empty()
            || scope.egress.iter().flat_map(|e| &e.hosts).any(|h| {
                let ns = h.split_once('/').map_or("*", |(ns, _)| ns);
                ns == "*" || ns == namespace || (ns == "." && namespace == proxy.namespace)
            })
    }

    /// Whether traffic from this proxy to hosts outside the registry is refused: its
    /// Sidecar's `outboundTrafficPolicy` if it has one (whose unset mode is REGISTRY_ONLY,
    /// the zero value of Istio's enum, as istiod's SidecarScope reads it), else the mesh's.
    pub fn registry_only(&self, proxy: &Proxy) -> bool {
        let policy = self
            .sidecar_for(proxy)
            .and_then(|(_, s)| s.outbound_traffic_policy.as_ref());
        match policy {
            Some(policy) => policy.mode != Some(OutboundMode::AllowAny),
            None => self.mesh.registry_only(),
        }
    }

    /// The Sidecar's `egressProxy`: where the proxy's traffic to hosts outside the registry
    /// goes under ALLOW_ANY (validation allows it with ALLOW_ANY only).
    pub fn egress_proxy(&self, proxy: &Proxy) -> Option<&Destination> {
        if self.registry_only(proxy) {
            return None;
        }
        let (_, sidecar) = self.sidecar_for(proxy)?;
        sidecar
            .outbound_traffic_policy
            .as_ref()?
            .egress_proxy
            .as_ref()
    }

    /// The control-plane revision a proxy belongs to, as Istio's injector decides it: the
    /// pod's `istio.io/rev` label, else `ISTIO_REVISION`, else its namespace's revision
    /// ([`namespace_revision`]), else `default`.
    pub fn proxy_revision(&self, proxy: &Proxy) -> String {
        self.proxy_labels(proxy)
            .get(REVISION_LABEL)
            .cloned()
            .or_else(|| proxy.revision.clone())
            .or_else(|| {
                let labels = self.namespace_labels.get(&proxy.namespace)?;
                namespace_revision(labels).map(str::to_string)
            })
            .unwrap_or_else(|| "default".to_string())
    }

    /// Gateways whose selector matches a router proxy.
    pub fn gateways_for(&self, proxy: &Proxy) -> Vec<(&ConfigObject, &GatewaySpec)> {
        let labels = self.proxy_labels(proxy);
        self.gateways
            .iter()
            .filter_map(|g| match &g.spec {
                Spec::Gateway(spec) if labels_match(&spec.selector, labels) => Some((&**g, spec)),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
