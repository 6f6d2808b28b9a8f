//! Services and their endpoints, built from Kubernetes Services + EndpointSlices (+ Pod
//! labels) and from ServiceEntries + WorkloadEntries.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use self::selected::ByLabel;
use super::mesh::MeshConfig;
use super::network::EndpointNetworks;
use super::shared_hosts::SharedHosts;
use super::{DOMAIN_SUFFIX, Store};
use crate::config::{AllocatedAddress, ConfigObject, EndpointSliceDef, Kind, ObjectKey, Spec};
use api::networking::{Location, Resolution, ServiceEntrySpec, WorkloadEntrySpec};

pub mod alias;
mod entry;
mod locality;
mod protocol;
mod selected;

use self::entry::*;
pub use self::entry::{allocatable_hosts, auto_allocates};
pub use self::locality::Locality;
pub use self::protocol::Protocol;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServicePort {
    pub name: String,
    pub port: u32,
    pub protocol: Protocol,
    /// The numeric targetPort, when the Service names one.
    pub target_port: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Endpoint {
    pub address: String,
    /// Service port number -> the port this endpoint listens on.
    pub ports: BTreeMap<u32, u32>,
    pub labels: BTreeMap<String, String>,
    pub locality: Locality,
    /// Its network ([`super::network`]); empty when none is known.
    pub network: String,
    pub weight: u32,
    pub healthy: bool,
    pub service_account: Option<String>,
    /// The known Pod behind a Kubernetes endpoint (`None`: no such Pod, or not a Pod).
    pub pod: Option<String>,
    /// Its DNS name within a headless Service (the EndpointSlice's `hostname`, set for a
    /// Pod whose `subdomain` is the Service, as a StatefulSet's are):
    /// `HOSTNAME.SERVICE.NS.svc.cluster.local` is its address alone.
    pub hostname: Option<String>,
    /// The workload it belongs to, as istiod names it for telemetry: its Pod's
    /// ([`crate::config::workload`]), a WorkloadEntry's, a ServiceEntry's own; empty for
    /// an address with no Pod.
    pub workload: String,
}

/// How Envoy finds a service's endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Discovery {
    Eds,
    StrictDns,
    LogicalDns,
    Passthrough,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Service {
    pub hostname: String,
    pub namespace: String,
    /// The Kubernetes Service name, or the ServiceEntry name.
    pub name: String,
    pub kubernetes: bool,
    pub vip: Option<String>,
    /// A ServiceEntry's addresses after the first (`vip`), which its DNS entry holds too.
    pub more_addresses: Vec<String>,
    /// The addresses IP auto-allocation gave a ServiceEntry host that has none of its own
    /// (its `status.addresses`), which only proxies that capture DNS use
    /// ([`Service::address_for`]).
    pub auto_allocated: AutoAllocated,
    pub ports: Vec<ServicePort>,
    pub endpoints: Vec<Endpoint>,
    pub discovery: Discovery,
    pub mesh_external: bool,
    pub export_to: Vec<String>,
    pub creation: Option<String>,
    /// Kubernetes pod selector (empty for ServiceEntries).
    pub selector: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    pub traffic_distribution: TrafficDistribution,
    /// An ExternalName Service's external name: the service is an alias of that host and
    /// gets no clusters, listeners or routes of its own (istiod's `Alias` resolution).
    pub alias_for: Option<String>,
    /// The ExternalName Services that alias this one (through any chain of aliases),
    /// sorted by namespace and name: its virtual hosts answer to their names too.
    pub aliases: Vec<Alias>,
}

/// An ExternalName Service, as the alias of another service's host.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Alias {
    pub namespace: String,
    pub name: String,
}

/// A ServiceEntry host's auto-allocated addresses, one per IP family (istiod's
/// `AutoAllocatedIPv4Address` and `AutoAllocatedIPv6Address`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AutoAllocated {
    pub ipv4: Option<String>,
    pub ipv6: Option<String>,
}

/// Which auto-allocated ServiceEntry addresses a proxy uses, as istiod's
/// `nodeUsesAutoallocatedIPs` decides (its agent captures DNS, and auto-allocation is on),
/// by the IP families of its own addresses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub enum AutoAddresses {
    #[default]
    None,
    Ipv4,
    Ipv6,
    DualStack,
}

impl AutoAddresses {
    fn ipv4(self) -> bool {
        matches!(self, AutoAddresses::Ipv4 | AutoAddresses::DualStack)
    }

    fn ipv6(self) -> bool {
        matches!(self, AutoAddresses::Ipv6 | AutoAddresses::DualStack)
    }
}

impl Service {
    /// What of [`Service::auto_allocated`] a proxy that uses `auto` reads: `None` when
    /// the service has an address of its own or none was allocated in the proxy's
    /// families. A per-service cache entry that holds the service's address keys on it.
    pub fn auto_for(&self, auto: AutoAddresses) -> AutoAddresses {
        let a = &self.auto_allocated;
        let usable = self.vip.is_none()
            && ((auto.ipv4() && a.ipv4.is_some()) || (auto.ipv6() && a.ipv6.is_some()));
        if usable { auto } else { AutoAddresses::None }
    }

    /// The address a proxy that uses `auto` knows the service by (istiod's
    /// `GetAddressForProxy`): its own, else its auto-allocated one, IPv4 first.
    pub fn address_for(&self, auto: AutoAddresses) -> Option<&str> {
        let a = &self.auto_allocated;
        (self.vip.as_deref())
            .or_else(|| a.ipv4.as_deref().filter(|_| auto.ipv4()))
            .or_else(|| a.ipv6.as_deref().filter(|_| auto.ipv6()))
    }

    /// Every address of the service for such a proxy's DNS answers (istiod's
    /// `GetAllAddressesForProxy`): its own, else its auto-allocated ones in the proxy's
    /// families.
    pub fn addresses_for(&self, auto: AutoAddresses) -> impl Iterator<Item = &str> {
        let (own, more) = match &self.vip {
            Some(vip) => (Some(vip.as_str()), self.more_addresses.as_slice()),
            None => (None, &[][..]),
        };
        let a = &self.auto_allocated;
        let unowned = own.is_none();
        let v4 = a.ipv4.as_deref().filter(|_| unowned && auto.ipv4());
        let v6 = a.ipv6.as_deref().filter(|_| unowned && auto.ipv6());
        (own.into_iter())
            .chain(more.iter().map(String::as_str))
            .chain(v4)
            .chain(v6)
    }
}

/// A service's preference for nearby endpoints (Kubernetes `trafficDistribution`, or
/// Istio's `networking.istio.io/traffic-distribution` annotation): istiod balances such a
/// service by locality even without a DestinationRule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum TrafficDistribution {
    #[default]
    Any,
    /// `PreferClose` or `PreferSameZone`: the proxy's zone, then its region, then the rest.
    PreferSameZone,
    /// `PreferSameNode`: the proxy's node first, then as `PreferSameZone`.
    PreferSameNode,
}

impl TrafficDistribution {
    /// From the Service's `spec.trafficDistribution`, else its annotation, else its
    /// namespace's annotation (annotations case aside), as istiod's
    /// `GetTrafficDistribution` reads them. A value it does not know is `Any`, and an
    /// annotation with one still decides (the namespace's is not read).
    pub fn of(
        spec: Option<&str>,
        annotations: &BTreeMap<String, String>,
        namespace_annotations: Option<&BTreeMap<String, String>>,
    ) -> TrafficDistribution {
        let named = |v: &str| match v.to_ascii_lowercase().as_str() {
            "preferclose" | "prefersamezone" => Some(TrafficDistribution::PreferSameZone),
            "prefersamenode" => Some(TrafficDistribution::PreferSameNode),
            _ => None,
        };
        // The spec's values are case-sensitive in Kubernetes; the annotation's are not.
        let from_spec = spec.and_then(|v| match v {
            "PreferClose" | "PreferSameZone" => Some(TrafficDistribution::PreferSameZone),
            "PreferSameNode" => Some(TrafficDistribution::PreferSameNode),
            _ => None,
        });
        let annotated = |a: &BTreeMap<String, String>| {
            let value = a
                .get(TRAFFIC_DISTRIBUTION_ANNOTATION)
                .filter(|v| !v.is_empty())?;
            Some(named(value).unwrap_or_default())
        };
        from_spec
            .or_else(|| annotated(annotations))
            .or_else(|| namespace_annotations.and_then(annotated))
            .unwrap_or_default()
    }
}

pub const TRAFFIC_DISTRIBUTION_ANNOTATION: &str = "networking.istio.io/traffic-distribution";

/// The label naming the node a workload runs on (istiod adds it to endpoints' and
/// proxies' labels).
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// The labels that carry an endpoint's (or proxy's) locality.
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub const SUBZONE_LABEL: &str = "topology.istio.io/subzone";
pub const TOPOLOGY_LABELS: [&str; 3] = [REGION_LABEL, ZONE_LABEL, SUBZONE_LABEL];

impl Service {
    /// Its name as istiod's `ServiceAttributes.Name` gives it, which Istio's telemetry
    /// reports (`destination_service_name`): a Kubernetes Service's name, a ServiceEntry
    /// host's host.
    pub fn telemetry_name(&self) -> &str {
        if self.kubernetes {
            &self.name
        } else {
            &self.hostname
        }
    }

    pub fn port(&self, number: u32) -> Option<&ServicePort> {
        self.ports.iter().find(|p| p.port == number)
    }

    /// Whether a proxy in `namespace` may see this service (`exportTo`, else the mesh's
    /// `defaultServiceExportTo`).
    pub fn visible_from(&self, namespace: &str, default: &[String]) -> bool {
        super::exported_to(&self.export_to, default, &self.namespace, namespace)
    }
}

/// Where building a Kubernetes service looks up its EndpointSlices, Pods and Nodes:
/// indexes of the whole store for a full build ([`Indexed`]), the store itself when one
/// service is rebuilt ([`Store`]).
pub(super) trait Sources {
    /// The service's EndpointSlices, else its core Endpoints' subsets.
    fn slices(&self, namespace: &str, service: &str) -> Vec<&EndpointSliceDef>;
    /// A Pod's labels and service account.
    fn pod(&self, namespace: &str, name: &str) -> Option<PodInfo<'_>>;
    fn node(&self, name: &str) -> Option<&BTreeMap<String, String>>;
    /// A Namespace's annotations.
    fn namespace_annotations(&self, name: &str) -> Option<&BTreeMap<String, String>>;
}

/// What an endpoint takes from its Pod: labels, service account, workload.
type PodInfo<'a> = (&'a BTreeMap<String, String>, Option<&'a String>, &'a str);

fn pod_info(obj: &ConfigObject) -> PodInfo<'_> {
    let (sa, workload) = match &obj.spec {
        Spec::Pod(def) => (def.service_account.as_ref(), def.workload.as_str()),
        _ => (None, ""),
    };
    (&obj.meta.labels, sa, workload)
}

/// Every EndpointSlice, Pod and Node of a store, indexed once for a full build.
struct Indexed<'a> {
    slices: foldhash::HashMap<(&'a str, &'a str), Vec<&'a EndpointSliceDef>>,
    pods: foldhash::HashMap<(&'a str, &'a str), PodInfo<'a>>,
    nodes: foldhash::HashMap<&'a str, &'a BTreeMap<String, String>>,
    namespaces: foldhash::HashMap<&'a str, &'a BTreeMap<String, String>>,
}

impl<'a> Indexed<'a> {
    fn new(store: &'a Store) -> Indexed<'a> {
        let mut slices: foldhash::HashMap<(&str, &str), Vec<&EndpointSliceDef>> =
            foldhash::HashMap::default();
        for obj in store.of_kind(Kind::EndpointSlice) {
            if let Spec::EndpointSlice(s) = &obj.spec {
                slices
                    .entry((obj.key.namespace.as_str(), s.service_name.as_str()))
                    .or_default()
                    .push(s);
            }
        }
        // Core Endpoints stand in for a Service that has no EndpointSlice (the source
        // reads them only with PILOT_USE_ENDPOINT_SLICE=false; a directory may hold either).
        for obj in store.of_kind(Kind::Endpoints) {
            if let Spec::Endpoints(subsets) = &obj.spec {
                slices
                    .entry((obj.key.namespace.as_str(), obj.key.name.as_str()))
                    .or_insert_with(|| subsets.iter().collect());
            }
        }
        Indexed {
            slices,
            pods: store
                .of_kind(Kind::Pod)
                .map(|p| ((p.key.namespace.as_str(), p.key.name.as_str()), pod_info(p)))
                .collect(),
            nodes: store
                .of_kind(Kind::Node)
                .map(|n| (n.key.name.as_str(), &n.meta.labels))
                .collect(),
            namespaces: store
                .of_kind(Kind::Namespace)
                .map(|n| (n.key.name.as_str(), &n.meta.annotations))
                .collect(),
        }
    }
}

impl Sources for Indexed<'_> {
    fn slices(&self, namespace: &str, service: &str) -> Vec<&EndpointSliceDef> {
        self.slices
            .get(&(namespace, service))
            .cloned()
            .unwrap_or_default()
    }

    fn pod(&self, namespace: &str, name: &str) -> Option<PodInfo<'_>> {
        self.pods.get(&(namespace, name)).copied()
    }

    fn node(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.nodes.get(name).copied()
    }

    fn namespace_annotations(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.namespaces.get(name).copied()
    }
}

impl Sources for Store {
    fn slices(&self, namespace: &str, service: &str) -> Vec<&EndpointSliceDef> {
        let slices: Vec<&EndpointSliceDef> = self
            .in_namespace(Kind::EndpointSlice, namespace)
            .filter_map(|o| match &o.spec {
                Spec::EndpointSlice(s) if s.service_name == service => Some(s),
                _ => None,
            })
            .collect();
        if !slices.is_empty() {
            return slices;
        }
        match self.get(&ObjectKey::new(Kind::Endpoints, namespace, service)) {
            Some(obj) => match &obj.spec {
                Spec::Endpoints(subsets) => subsets.iter().collect(),
                _ => Vec::new(),
            },
            None => Vec::new(),
        }
    }

    fn pod(&self, namespace: &str, name: &str) -> Option<PodInfo<'_>> {
        self.get(&ObjectKey::new(Kind::Pod, namespace, name))
            .map(|p| pod_info(p))
    }

    fn node(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.get(&ObjectKey::new(Kind::Node, "", name))
            .map(|n| &n.meta.labels)
    }

    fn namespace_annotations(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.get(&ObjectKey::new(Kind::Namespace, "", name))
            .map(|n| &n.meta.annotations)
    }
}

/// Kubernetes Services from which a full build spreads over the machine's cores (at most
/// four threads); below it a thread costs more than it saves.
const PARALLEL_FROM: usize = 2_000;

/// Builds every service from the store: one per host, the hosts several services
/// declare, and the aliases of each host.
pub fn build_services(
    store: &Store,
    mesh: &MeshConfig,
) -> (
    imbl::OrdMap<String, Arc<Service>>,
    SharedHosts,
    alias::Aliases,
) {
    build_services_on(store, mesh, machine_threads())
}

/// The threads a large build may use: the machine's cores, at most four. Read once:
/// asking the operating system reads the cgroup files on every call, which costs more
/// than building a small mesh.
fn machine_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(4)))
}

/// [`build_services`] on up to `threads` threads.
fn build_services_on(
    store: &Store,
    mesh: &MeshConfig,
    threads: usize,
) -> (
    imbl::OrdMap<String, Arc<Service>>,
    SharedHosts,
    alias::Aliases,
) {
    let sources = Indexed::new(store);
    let networks = EndpointNetworks::new(store, mesh);
    let objects: Vec<&Arc<ConfigObject>> = store.of_kind(Kind::Service).collect();
    let build = |part: &[&Arc<ConfigObject>]| -> Vec<Arc<Service>> {
        part.iter()
            .filter_map(|obj| kubernetes_service(obj, &sources, &networks))
            .map(Arc::new)
            .collect()
    };
    let threads = if objects.len() < PARALLEL_FROM {
        1
    } else {
        threads.max(1)
    };
    let mut chunks = objects.chunks(objects.len().div_ceil(threads).max(1));
    let parts = std::thread::scope(|scope| {
        let build = &build;
        let mine = chunks.next().unwrap_or_default();
        let others: Vec<_> = chunks
            .map(|part| scope.spawn(move || build(part)))
            .collect();
        let mut parts = vec![build(mine)];
        for other in others {
            parts.push(
                other
                    .join()
                    .unwrap_or_else(|e| std::panic::resume_unwind(e)),
            );
        }
        parts
    });
    let mut all: Vec<Arc<Service>> = parts.into_iter().flatten().collect();
    all.extend(service_entries(store));
    let aliases = alias::resolve(all.iter());
    if !aliases.is_empty() {
        all = (all.into_iter())
            .map(|s| alias::with_aliases(s, &aliases))
            .collect();
    }
    let (services, shared) = SharedHosts::split(all);
    (services, shared, aliases)
}

/// Istio's locality for an endpoint: the pod label `topology.istio.io/locality`
/// (`region.zone.subzone`), else its Node's `topology.kubernetes.io/region|zone` and
/// `topology.istio.io/subzone` labels, else the EndpointSlice's zone.
pub(crate) fn endpoint_locality(
    pod_labels: &BTreeMap<String, String>,
    node: Option<&BTreeMap<String, String>>,
    slice_zone: Option<&str>,
) -> Locality {
    if let Some(l) = pod_labels.get("topology.istio.io/locality") {
        return Locality::parse(&l.replace('.', "/"));
    }
    let node_label = |k: &str| node.and_then(|n| n.get(k)).cloned().unwrap_or_default();
    let zone = node_label("topology.kubernetes.io/zone");
    Locality {
        region: node_label("topology.kubernetes.io/region"),
        zone: if zone.is_empty() {
            slice_zone.unwrap_or_default().to_string()
        } else {
            zone
        },
        subzone: node_label("topology.istio.io/subzone"),
    }
}

/// A Kubernetes Service's hostname.
pub fn kubernetes_hostname(namespace: &str, name: &str) -> String {
    format!("{name}.{namespace}.svc.{DOMAIN_SUFFIX}")
}

/// One Kubernetes Service with its endpoints; `None` if `obj` is not a Service.
pub(super) fn kubernetes_service(
    obj: &ConfigObject,
    sources: &impl Sources,
    networks: &EndpointNetworks,
) -> Option<Service> {
    let Spec::Service(def) = &obj.spec else {
        return None;
    };
    let hostname = kubernetes_hostname(&obj.key.namespace, &obj.key.name);
    let ports: Vec<ServicePort> = def
        .ports
        .iter()
        .map(|p| ServicePort {
            name: p.name.clone(),
            port: p.port,
            protocol: Protocol::parse(p.app_protocol.as_deref().unwrap_or(&p.name)),
            target_port: p.target_port,
        })
        .collect();
    let mut endpoints = Vec::new();
    for s in sources.slices(&obj.key.namespace, &obj.key.name) {
        // The slice's ports are every one of its endpoints' ports.
        let mut port_map = BTreeMap::new();
        for sp in &def.ports {
            let by_name = s.ports.iter().find(|(n, _)| *n == sp.name).map(|(_, p)| *p);
            if let Some(p) = by_name.or(sp.target_port) {
                port_map.insert(sp.port, p);
            }
        }
        for e in &s.endpoints {
            if e.terminating == Some(true) {
                continue;
            }
            let pod = e
                .pod
                .as_ref()
                .and_then(|name| Some((name, sources.pod(&obj.key.namespace, name)?)));
            let mut labels = pod.map(|(_, (l, _, _))| l.clone()).unwrap_or_default();
            // As istiod augments them: the node an endpoint runs on is a label of it.
            if let Some(node) = e.node_name.as_ref() {
                labels
                    .entry(HOSTNAME_LABEL.to_string())
                    .or_insert_with(|| node.clone());
            }
            let service_account = pod.and_then(|(_, (_, sa, _))| sa.cloned());
            let node = e.node_name.as_deref().and_then(|n| sources.node(n));
            let locality = endpoint_locality(&labels, node, e.zone.as_deref());
            let template = Endpoint {
                address: String::new(),
                ports: port_map.clone(),
                network: String::new(),
                labels,
                locality,
                weight: 1,
                healthy: e.ready != Some(false),
                service_account,
                pod: pod.map(|(name, _)| name.clone()),
                hostname: e.hostname.clone(),
                workload: pod.map_or_else(String::new, |(_, (_, _, w))| w.to_string()),
            };
            // Clones for all addresses but the last, which takes the template itself.
            if let Some((last, rest)) = e.addresses.split_last() {
                for address in rest {
                    endpoints.push(Endpoint {
                        address: address.clone(),
                        network: networks.network(&template.labels, address),
                        ..template.clone()
                    });
                }
                endpoints.push(Endpoint {
                    address: last.clone(),
                    network: networks.network(&template.labels, last),
                    ..template
                });
            }
        }
    }
    endpoints.sort_by(|a, b| a.address.cmp(&b.address));
    Some(Service {
        hostname,
        namespace: obj.key.namespace.clone(),
        name: obj.key.name.clone(),
        kubernetes: true,
        vip: def.cluster_ip.clone(),
        more_addresses: Vec::new(),
        auto_allocated: AutoAllocated::default(),
        ports,
        endpoints,
        discovery: if def.headless {
            Discovery::Passthrough
        } else {
            Discovery::Eds
        },
        mesh_external: false,
        export_to: obj
            .meta
            .annotations
            .get("networking.istio.io/exportTo")
            .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
            .unwrap_or_default(),
        creation: obj.meta.creation_timestamp.clone(),
        selector: def.selector.clone(),
        labels: obj.meta.labels.clone(),
        traffic_distribution: TrafficDistribution::of(
            def.traffic_distribution.as_deref(),
            &obj.meta.annotations,
            sources.namespace_annotations(&obj.key.namespace),
        ),
        alias_for: def.external_name.clone(),
        aliases: Vec::new(),
    })
}

#[cfg(test)]
mod tests;
