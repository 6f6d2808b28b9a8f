//! The push context: an immutable, indexed snapshot of the model built once per push and
//! shared (behind an `Arc`) by every proxy that push reaches. Translation reads only this.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::Serialize;

use super::destination_rule::{self, DestinationRules};
use super::egress::{self, Egress};
use super::service::alias::Aliases;
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
    /// The ExternalName Services aliasing each host (usually none).
    pub aliases: Arc<Aliases>,
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

/// A service as one context held it and as a later one holds it (`None`: it had none).
pub type ServiceChange<'a> = (Option<&'a Arc<Service>>, Option<&'a Arc<Service>>);

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
    /// An environment variable of the control plane's, from the store it was built from.
    pub fn environment_var(&self, name: &str) -> Option<&str> {
        self.store.environment_var(name)
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
}

mod build;
mod scope;

#[cfg(test)]
mod tests;
