//! Networks, as istiod's multi-network support sees them: which network each endpoint is
//! on, and the gateways through which a network is reached from the others
//! (`pilot/pkg/model/network.go`, `pilot/pkg/serviceregistry/kube/controller/network.go`).
//!
//! - A Kubernetes endpoint's network is its Pod's `topology.istio.io/network` label; else
//!   the system namespace's label; else MeshNetworks': the network whose `fromRegistry`
//!   names this cluster, else the one whose `fromCidr` holds the address. A WorkloadEntry's
//!   or ServiceEntry endpoint's is its own `network` field only, as istiod's endpoint has
//!   it: without one it is on no network, reachable from all.
//! - A network's gateways are the Services labelled `topology.istio.io/network` (on the
//!   port their `networking.istio.io/gatewayPort` label names, 15443 by default, which
//!   must be one of theirs), at their external addresses (load-balancer ingress IPs and
//!   `externalIPs`), and MeshNetworks' gateways, by address or by `registryServiceName`.
//! - Multi-network is on when some network has a gateway; only then does a proxy's
//!   network change its load assignments (`translate::network`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::Store;
use super::mesh::MeshConfig;
use super::push_context::ModelIssue;
use crate::config::{Kind, ObjectKey, Spec};

/// The label that puts a Pod, WorkloadEntry or the system namespace on a network, and
/// marks a Service as its network's gateway.
pub const NETWORK_LABEL: &str = "topology.istio.io/network";
/// The label naming a gateway Service's port for cross-network mTLS.
pub const GATEWAY_PORT_LABEL: &str = "networking.istio.io/gatewayPort";
/// istiod's default cross-network port.
pub const DEFAULT_GATEWAY_PORT: u32 = 15443;
/// The namespace whose network label is the cluster's network.
pub const SYSTEM_NAMESPACE: &str = "istio-system";
/// The registry (cluster) name MeshNetworks' `fromRegistry` matches: istiod's default
/// `CLUSTER_ID`.
pub const CLUSTER_ID: &str = "Kubernetes";

/// MeshNetworks: the `meshNetworks` key of the mesh ConfigMap.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MeshNetworks {
    #[serde(default)]
    pub networks: BTreeMap<String, NetworkConfig>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NetworkConfig {
    pub endpoints: Vec<NetworkEndpoints>,
    pub gateways: Vec<GatewayConfig>,
}

/// One way of telling which endpoints are on a network.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct NetworkEndpoints {
    pub from_cidr: Option<String>,
    pub from_registry: Option<String>,
}

/// A network's gateway: an address, or a Service of this cluster whose external
/// addresses are the gateway's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GatewayConfig {
    pub registry_service_name: Option<String>,
    pub address: Option<String>,
    pub port: u32,
    pub locality: Option<String>,
}

/// What is wrong with `meshNetworks`: the field and the problem.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct MeshNetworksError(String);

impl MeshNetworks {
    pub fn parse(yaml: &str) -> Result<MeshNetworks, MeshNetworksError> {
        Self::parse_checked(yaml).map_err(MeshNetworksError)
    }

    fn parse_checked(yaml: &str) -> Result<MeshNetworks, String> {
        if yaml.trim().is_empty() {
            return Ok(MeshNetworks::default());
        }
        let parsed: MeshNetworks = serde_saphyr::from_str(yaml).map_err(|e| e.to_string())?;
        for (name, network) in &parsed.networks {
            for (i, e) in network.endpoints.iter().enumerate() {
                if let Some(cidr) = &e.from_cidr
                    && Cidr::parse(cidr).is_none()
                {
                    return Err(format!(
                        "networks.{name}.endpoints[{i}].fromCidr: {cidr:?} is not a CIDR"
                    ));
                }
            }
            for (i, g) in network.gateways.iter().enumerate() {
                match (&g.address, &g.registry_service_name) {
                    (Some(_), Some(_)) | (None, None) => {
                        return Err(format!(
                            "networks.{name}.gateways[{i}]: exactly one of address and registryServiceName"
                        ));
                    }
                    _ => {}
                }
                if g.port == 0 || g.port > 65535 {
                    return Err(format!(
                        "networks.{name}.gateways[{i}].port: {} is not a port",
                        g.port
                    ));
                }
            }
        }
        Ok(parsed)
    }

    pub fn is_empty(&self) -> bool {
        self.networks.is_empty()
    }
}

/// An address block, `a.b.c.d/n` or IPv6.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Cidr {
    ip: IpAddr,
    len: u32,
}

impl Cidr {
    fn parse(text: &str) -> Option<Cidr> {
        let (ip, len) = text.split_once('/')?;
        let ip: IpAddr = ip.parse().ok()?;
        let len: u32 = len.parse().ok()?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        (len <= max).then_some(Cidr { ip, len })
    }

    fn contains(&self, address: &str) -> bool {
        let Ok(ip) = address.parse::<IpAddr>() else {
            return false;
        };
        let bits = |ip: IpAddr| -> (u128, u32) {
            match ip {
                IpAddr::V4(v) => (u128::from(u32::from(v)) << 96, 32),
                IpAddr::V6(v) => (u128::from(v), 128),
            }
        };
        let ((a, width), (b, other)) = (bits(self.ip), bits(ip));
        if width != other {
            return false;
        }
        let mask = if self.len == 0 {
            0
        } else {
            u128::MAX << (128 - self.len)
        };
        a & mask == b & mask
    }
}

/// What decides the network of an endpoint without a label of its own.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EndpointNetworks {
    /// The system namespace's network label.
    system: Option<String>,
    /// MeshNetworks' network whose `fromRegistry` names this cluster.
    registry: Option<String>,
    /// MeshNetworks' `fromCidr` blocks, in network name order.
    cidrs: Vec<(Cidr, String)>,
}

impl EndpointNetworks {
    pub fn new(store: &Store, mesh: &MeshConfig) -> EndpointNetworks {
        let system = store
            .get(&ObjectKey::new(Kind::Namespace, "", SYSTEM_NAMESPACE))
            .and_then(|ns| ns.meta.labels.get(NETWORK_LABEL))
            .filter(|n| !n.is_empty())
            .cloned();
        let mut registry = None;
        let mut cidrs = Vec::new();
        for (name, network) in &mesh.mesh_networks.networks {
            for e in &network.endpoints {
                if e.from_registry.as_deref() == Some(CLUSTER_ID) && registry.is_none() {
                    registry = Some(name.clone());
                }
                if let Some(cidr) = e.from_cidr.as_deref().and_then(Cidr::parse) {
                    cidrs.push((cidr, name.clone()));
                }
            }
        }
        EndpointNetworks {
            system,
            registry,
            cidrs,
        }
    }

    /// The network of a Kubernetes endpoint at `address` whose Pod has these labels;
    /// empty when none is known.
    pub fn network(&self, labels: &BTreeMap<String, String>, address: &str) -> String {
        (labels.get(NETWORK_LABEL))
            .map(String::as_str)
            .filter(|n| !n.is_empty())
            .or(self.system.as_deref())
            .or(self.registry.as_deref())
            .or_else(|| {
                (self.cidrs.iter())
                    .find(|(c, _)| c.contains(address))
                    .map(|(_, n)| n.as_str())
            })
            .unwrap_or_default()
            .to_string()
    }
}

/// One gateway into a network.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct NetworkGateway {
    pub network: String,
    pub address: String,
    pub port: u32,
}

/// Every network's gateways.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NetworkGateways {
    /// Sorted, without duplicates.
    by_network: BTreeMap<String, Vec<NetworkGateway>>,
    /// The least common multiple of the networks' gateway counts: endpoint weights are
    /// scaled by it so that they split evenly over a network's gateways.
    scale: u32,
    /// The Services that are gateways, and those that stopped being one in the update
    /// that built this context: a change to them reaches every proxy.
    #[serde(skip)]
    services: BTreeSet<(String, String)>,
    /// MeshNetworks' `registryServiceName`s of this cluster's networks.
    #[serde(skip)]
    registry_hosts: BTreeSet<String>,
    /// Gateway Services and MeshNetworks entries that give no gateway, and why.
    #[serde(skip)]
    pub issues: Vec<ModelIssue>,
    /// The hostnames gateways are known by (a cloud load balancer's), with the object
    /// naming each: meshd resolves them (`resolve`), and a new answer is a
    /// change to that object.
    #[serde(skip)]
    pub hostnames: BTreeMap<String, ObjectKey>,
    /// The model endpoint each network's gateways stand for in a load assignment (its
    /// network label is what locality failover compares).
    #[serde(skip)]
    models: BTreeMap<String, super::Endpoint>,
}

/// Equal when they lead to the same gateways (what load assignments depend on).
impl PartialEq for NetworkGateways {
    fn eq(&self, other: &NetworkGateways) -> bool {
        self.by_network == other.by_network
    }
}

impl NetworkGateways {
    pub fn new(store: &Store, mesh: &MeshConfig) -> NetworkGateways {
        let mut set = BTreeSet::new();
        let mut services = BTreeSet::new();
        let mut issues = Vec::new();
        let mut hostnames = BTreeMap::new();
        // A gateway known by hostname is at the addresses meshd resolved it to.
        let mut add = |network: &str, address: &str, port: u32, named_by: &ObjectKey| {
            let addresses = if address.parse::<IpAddr>().is_ok() {
                vec![address.to_string()]
            } else {
                hostnames.insert(address.to_string(), named_by.clone());
                store
                    .resolved(address)
                    .map(<[String]>::to_vec)
                    .unwrap_or_default()
            };
            for address in addresses {
                set.insert(NetworkGateway {
                    network: network.to_string(),
                    address,
                    port,
                });
            }
        };
        let mesh_key = ObjectKey::new(Kind::ConfigMap, mesh.root_namespace(), "istio");
        // `registryServiceName` → (network, port), for the networks that are this cluster's.
        let mut by_registry: BTreeMap<&str, Vec<(&str, u32)>> = BTreeMap::new();
        for (name, network) in &mesh.mesh_networks.networks {
            let ours =
                (network.endpoints.iter()).any(|e| e.from_registry.as_deref() == Some(CLUSTER_ID));
            for g in &network.gateways {
                match (&g.address, &g.registry_service_name) {
                    (Some(address), _) => add(name, address, g.port, &mesh_key),
                    (None, Some(service)) if ours => {
                        by_registry
                            .entry(service.as_str())
                            .or_default()
                            .push((name.as_str(), g.port));
                    }
                    _ => {}
                }
            }
        }
        for o in store.of_kind(Kind::Service) {
            let Spec::Service(def) = &o.spec else {
                continue;
            };
            // Most meshes name no registry service: no hostname to build per Service.
            let mut gateways: Vec<(String, u32)> = if by_registry.is_empty() {
                Vec::new()
            } else {
                let host = super::service::kubernetes_hostname(&o.key.namespace, &o.key.name);
                (by_registry.get(host.as_str()))
                    .map(|v| v.iter().map(|(n, p)| (n.to_string(), *p)).collect())
                    .unwrap_or_default()
            };
            if let Some(network) = o.meta.labels.get(NETWORK_LABEL).filter(|n| !n.is_empty()) {
                services.insert((o.key.namespace.clone(), o.key.name.clone()));
                let label = o.meta.labels.get(GATEWAY_PORT_LABEL);
                let port = match label.map(|p| p.parse::<u32>()) {
                    None => DEFAULT_GATEWAY_PORT,
                    Some(Ok(p)) => p,
                    Some(Err(_)) => {
                        issues.push(ModelIssue {
                            object: o.key.to_string(),
                            field: format!("metadata.labels[{GATEWAY_PORT_LABEL}]"),
                            message: format!(
                                "{:?} is not a port; {DEFAULT_GATEWAY_PORT} is used",
                                label.unwrap()
                            ),
                        });
                        DEFAULT_GATEWAY_PORT
                    }
                };
                if def.ports.iter().any(|p| p.port == port) {
                    gateways.push((network.clone(), port));
                } else {
                    issues.push(ModelIssue {
                        object: o.key.to_string(),
                        field: "spec.ports".into(),
                        message: format!(
                            "labelled as network {network:?}'s gateway, but has no port {port}; it is not used as one"
                        ),
                    });
                }
            }
            if gateways.is_empty() {
                continue;
            }
            if def.external_addresses.is_empty() && def.external_hostnames.is_empty() {
                issues.push(ModelIssue {
                    object: o.key.to_string(),
                    field: "status.loadBalancer.ingress".into(),
                    message: "a network gateway without an external address (load-balancer ingress or spec.externalIPs) is not used until it has one".into(),
                });
            }
            for address in def.external_addresses.iter().chain(&def.external_hostnames) {
                for (network, port) in &gateways {
                    add(network, address, *port, &o.key);
                }
            }
        }
        for host in hostnames.keys() {
            if store.resolved(host).is_none_or(<[String]>::is_empty) {
                issues.push(ModelIssue {
                    object: hostnames[host].to_string(),
                    field: "gateway address".into(),
                    message: format!(
                        "the gateway hostname {host:?} has not resolved (yet); until it does, that gateway is not used"
                    ),
                });
            }
        }
        let mut by_network: BTreeMap<String, Vec<NetworkGateway>> = BTreeMap::new();
        for g in set {
            by_network.entry(g.network.clone()).or_default().push(g);
        }
        let scale = (by_network.values()).fold(1, |acc, g| lcm(acc, g.len() as u32));
        let models = (by_network.keys())
            .map(|network| {
                let model = super::Endpoint {
                    address: String::new(),
                    ports: BTreeMap::new(),
                    labels: BTreeMap::new(),
                    locality: super::Locality::default(),
                    network: network.clone(),
                    weight: 1,
                    healthy: true,
                    service_account: None,
                    pod: None,
                    hostname: None,
                    workload: String::new(),
                };
                (network.clone(), model)
            })
            .collect();
        NetworkGateways {
            by_network,
            scale,
            services,
            registry_hosts: by_registry.keys().map(|h| h.to_string()).collect(),
            issues,
            hostnames,
            models,
        }
    }

    /// Multi-network is on: some network has a gateway.
    pub fn enabled(&self) -> bool {
        !self.by_network.is_empty()
    }

    /// The gateways into `network`, sorted.
    pub fn of(&self, network: &str) -> &[NetworkGateway] {
        self.by_network.get(network).map_or(&[], Vec::as_slice)
    }

    /// The model endpoint standing for the gateways of `network` (which has some).
    pub fn model(&self, network: &str) -> Option<&super::Endpoint> {
        self.models.get(network)
    }

    /// What endpoint weights are multiplied by (at least 1).
    pub fn scale(&self) -> u32 {
        self.scale.max(1)
    }

    /// Whether the Service `namespace/name` is (or, in the update that built this, was)
    /// a network gateway.
    pub fn names_service(&self, namespace: &str, name: &str) -> bool {
        (self.services.iter()).any(|(ns, n)| ns == namespace && n == name)
            || (!self.registry_hosts.is_empty()
                && (self.registry_hosts)
                    .contains(&super::service::kubernetes_hostname(namespace, name)))
    }

    /// Remembers gateway Services of `before` that are gateways no longer.
    pub fn remember(&mut self, before: &NetworkGateways) {
        self.services.extend(before.services.iter().cloned());
    }
}

fn lcm(a: u32, b: u32) -> u32 {
    let gcd = |mut x: u32, mut y: u32| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    if a == 0 || b == 0 {
        return a.max(b);
    }
    a / gcd(a, b) * b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PushContext;
    use crate::builders::{context, endpoints, labeled, mesh_config, namespace, object, service};
    use crate::config::Spec;

    #[test]
    fn gateways_come_from_labelled_services_and_mesh_networks() {
        let networks = serde_json::from_value(serde_json::json!({"networks": {
            "net-c": {
                "endpoints": [{"fromCidr": "10.3.0.0/16"}],
                "gateways": [
                    {"address": "198.51.100.1", "port": 443},
                    {"address": "gw.example.com", "port": 443},
                ],
            },
            "net-d": {
                "endpoints": [{"fromRegistry": "Kubernetes"}],
                "gateways": [
                    {"registryServiceName": "other.istio-system.svc.cluster.local", "port": 15443},
                ],
            },
        }}))
        .unwrap();
        let mesh = MeshConfig {
            mesh_networks: networks,
            ..MeshConfig::default()
        };
        let gateway = (service("istio-system", "eastwest", "10.96.0.7").port("tls", 15443))
            .label(NETWORK_LABEL, "net-b")
            .external_address("192.0.2.7")
            .build();
        // The load balancer's address first, then spec.externalIPs, as the source reads them.
        let other = (service("istio-system", "other", "10.96.0.8").port("tls", 15443))
            .external_address("192.0.2.9")
            .external_address("192.0.2.8")
            .build();
        let no_port = (service("istio-system", "wrong", "10.96.0.10").port("http", 80))
            .label(NETWORK_LABEL, "net-e")
            .external_address("192.0.2.10")
            .build();
        let ctx = context([gateway, mesh_config(mesh), other, no_port]);
        let g = &ctx.networks;
        assert!(g.enabled());
        let addrs = |n: &str| -> Vec<String> {
            g.of(n)
                .iter()
                .map(|g| format!("{}:{}", g.address, g.port))
                .collect()
        };
        assert_eq!(addrs("net-b"), ["192.0.2.7:15443"]);
        assert_eq!(addrs("net-c"), ["198.51.100.1:443"]);
        // The registry's service, at its external IP and its load balancer's.
        assert_eq!(addrs("net-d"), ["192.0.2.8:15443", "192.0.2.9:15443"]);
        assert!(addrs("net-e").is_empty());
        assert_eq!(g.scale(), 2);
        assert!(g.names_service("istio-system", "eastwest"));
        let fields: Vec<&str> = g.issues.iter().map(|i| i.field.as_str()).collect();
        assert_eq!(fields, ["spec.ports", "gateway address"]);
        assert!(
            ctx.issues
                .iter()
                .any(|i| i.object == "Service istio-system/wrong")
        );
        assert!(
            ctx.issues
                .iter()
                .any(|i| i.message.contains("\"gw.example.com\" has not resolved"))
        );
    }

    #[test]
    fn a_gateway_known_by_hostname_is_at_the_addresses_it_resolved_to() {
        let elb = (service("istio-system", "eastwest", "10.96.0.9").port("tls", 15443))
            .label(NETWORK_LABEL, "net-b")
            .external_hostname("gw.elb.example.com")
            .build();
        let mut store: Store = [elb].into_iter().collect();
        let key = ObjectKey::new(Kind::Service, "istio-system", "eastwest");
        let ctx = PushContext::build(&store, "v/1".into());
        assert!(!ctx.networks.enabled());
        assert_eq!(ctx.networks.hostnames["gw.elb.example.com"], key);
        let answer = vec!["192.0.2.3".to_string(), "192.0.2.4".to_string()];
        assert!(store.set_resolved("gw.elb.example.com", answer.clone()));
        assert!(!store.set_resolved("gw.elb.example.com", answer));
        // A new answer is a change to the Service that names the hostname.
        let ctx = ctx.update(&store, &[key].into(), "v/2".into());
        let addrs: Vec<&str> = ctx
            .networks
            .of("net-b")
            .iter()
            .map(|g| g.address.as_str())
            .collect();
        assert_eq!(addrs, ["192.0.2.3", "192.0.2.4"]);
        assert!(ctx.issues.is_empty(), "{:?}", ctx.issues);
        assert_eq!(
            ctx.networks,
            PushContext::build(&store, "v/3".into()).networks
        );
    }

    #[test]
    fn a_pods_network_is_its_label_then_the_systems_then_mesh_networks() {
        let mut n = EndpointNetworks::default();
        let labels = |v: &str| BTreeMap::from([(NETWORK_LABEL.to_string(), v.to_string())]);
        assert_eq!(n.network(&BTreeMap::new(), "10.3.0.1"), "");
        n.cidrs = vec![(Cidr::parse("10.3.0.0/16").unwrap(), "net-c".into())];
        assert_eq!(n.network(&BTreeMap::new(), "10.3.9.1"), "net-c");
        assert_eq!(n.network(&BTreeMap::new(), "10.4.0.1"), "");
        n.registry = Some("net-d".into());
        assert_eq!(n.network(&BTreeMap::new(), "10.3.9.1"), "net-d");
        n.system = Some("net-s".into());
        assert_eq!(n.network(&BTreeMap::new(), "10.3.9.1"), "net-s");
        assert_eq!(n.network(&labels("net-p"), "10.3.9.1"), "net-p");
        assert!(Cidr::parse("fd00::/8").unwrap().contains("fd12::1"));
        assert!(!Cidr::parse("fd00::/8").unwrap().contains("10.0.0.1"));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains("10.0.0.1"));
    }

    #[test]
    fn a_pod_falls_back_to_the_clusters_network_and_a_service_entry_does_not() {
        use api::networking::{Location, Port, Resolution, ServiceEntrySpec, WorkloadEntrySpec};
        let at = |address: &str, network: Option<&str>| WorkloadEntrySpec {
            address: address.into(),
            network: network.map(str::to_string),
            ..WorkloadEntrySpec::default()
        };
        let vm = ServiceEntrySpec {
            hosts: vec!["vm.example.com".into()],
            location: Some(Location::MeshInternal),
            resolution: Some(Resolution::Static),
            ports: vec![Port {
                number: 80,
                name: "http".into(),
                protocol: String::new(),
                target_port: None,
            }],
            endpoints: vec![at("10.1.0.1", None), at("10.1.0.2", Some("net-b"))],
            ..ServiceEntrySpec::default()
        };
        let ctx = context([
            labeled(
                namespace(SYSTEM_NAMESPACE, &[]),
                &[(NETWORK_LABEL, "net-a")],
            ),
            service("shop", "web", "10.96.0.3").port("http", 80).build(),
            (endpoints("shop", "web").port("http", 80))
                .ready("10.0.0.1", None)
                .build(),
            object("shop", "vm", Spec::ServiceEntry(vm, Vec::new())),
        ]);
        let networks = |host: &str| -> Vec<String> {
            ctx.services[host]
                .endpoints
                .iter()
                .map(|e| e.network.clone())
                .collect()
        };
        assert_eq!(networks("web.shop.svc.cluster.local"), ["net-a"]);
        assert_eq!(networks("vm.example.com"), ["", "net-b"]);
    }

    #[test]
    fn mesh_networks_name_the_field_they_get_wrong() {
        let err = |yaml: &str| MeshNetworks::parse(yaml).unwrap_err().to_string();
        assert!(
            err("networks: {a: {endpoints: [{fromCidr: 10.0.0.0}]}}")
                .contains("networks.a.endpoints[0].fromCidr")
        );
        assert!(err("networks: {a: {gateways: [{port: 1}]}}").contains("networks.a.gateways[0]"));
        assert!(
            err("networks: {a: {gateways: [{address: 1.2.3.4}]}}").contains("gateways[0].port")
        );
        assert!(MeshNetworks::parse("").unwrap().is_empty());
    }
}
