//! EDS: a ClusterLoadAssignment per cluster, endpoints grouped by locality (sorted), each
//! group weighted by the sum of its endpoints' weights.

use std::collections::BTreeMap;

use envoy_api::pb::envoy::config::core::v3::{
    Address, HealthStatus, Locality as PbLocality, Metadata, SocketAddress, address,
    socket_address::PortSpecifier,
};
use envoy_api::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint as PbEndpoint, LbEndpoint, LocalityLbEndpoints,
    lb_endpoint::HostIdentifier,
};
use envoy_api::pb::google::protobuf::UInt32Value;

use model::{Endpoint, Locality, Service};

pub fn socket_address(ip: &str, port: u32) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ip.to_string(),
            port_specifier: Some(PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

/// One locality's endpoints of a load assignment, with the model endpoints behind them
/// (locality balancing compares their labels), before encoding.
pub struct Group<'a> {
    pub locality: &'a Locality,
    pub endpoints: Vec<(&'a Endpoint, LbEndpoint)>,
    pub priority: u32,
    /// `None`: the sum of the endpoints' weights.
    pub load_balancing_weight: Option<u32>,
}

impl Group<'_> {
    /// The locality's weight: as set, else the sum of its endpoints'.
    pub fn weight(&self) -> u32 {
        self.load_balancing_weight.unwrap_or_else(|| {
            (self.endpoints.iter())
                .map(|(_, e)| e.load_balancing_weight.as_ref().map_or(1, |w| w.value))
                .sum()
        })
    }
}

/// `svc`'s endpoints for `port` that pass `filter`, grouped by locality (sorted).
pub fn groups<'a>(
    svc: &'a Service,
    port: u32,
    filter: impl Fn(&Endpoint) -> bool,
) -> Vec<Group<'a>> {
    let mut groups: BTreeMap<&Locality, Vec<(&Endpoint, LbEndpoint)>> = BTreeMap::new();
    for e in svc.endpoints.iter().filter(|e| filter(e)) {
        let Some(target) = e.ports.get(&port) else {
            continue;
        };
        let lb = LbEndpoint {
            host_identifier: Some(HostIdentifier::Endpoint(PbEndpoint {
                address: Some(socket_address(&e.address, *target)),
                ..Default::default()
            })),
            metadata: Some(endpoint_metadata(e, &svc.namespace)),
            // A ready endpoint of a Kubernetes Service is HEALTHY; a ServiceEntry's is left
            // unset (UNKNOWN, which Envoy counts as healthy too), as istiod sends them.
            health_status: if e.healthy && svc.kubernetes {
                HealthStatus::Healthy
            } else if e.healthy {
                HealthStatus::Unknown
            } else {
                HealthStatus::Unhealthy
            } as i32,
            load_balancing_weight: Some(UInt32Value { value: e.weight }),
        };
        groups.entry(&e.locality).or_default().push((e, lb));
    }
    groups
        .into_iter()
        .map(|(locality, endpoints)| Group {
            locality,
            endpoints,
            priority: 0,
            load_balancing_weight: None,
        })
        .collect()
}

/// The load assignment of cluster `name` holding `groups`.
pub fn assignment(name: &str, groups: Vec<Group<'_>>) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: name.to_string(),
        endpoints: groups
            .into_iter()
            .map(|g| LocalityLbEndpoints {
                locality: Some(PbLocality {
                    region: g.locality.region.clone(),
                    zone: g.locality.zone.clone(),
                    sub_zone: g.locality.subzone.clone(),
                }),
                load_balancing_weight: Some(UInt32Value { value: g.weight() }),
                priority: g.priority,
                lb_endpoints: g.endpoints.into_iter().map(|(_, e)| e).collect(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// The load assignment of cluster `name`: `svc`'s endpoints for `port` that pass `filter`,
/// split by network by `split` and balanced over localities by `locality` for a proxy at
/// that place, in istiod's order.
pub fn load_assignment(
    name: &str,
    svc: &Service,
    port: u32,
    filter: impl Fn(&Endpoint) -> bool,
    split: Option<super::network::Split<'_>>,
    locality: Option<(super::locality::Lb<'_>, &super::locality::Place)>,
) -> ClusterLoadAssignment {
    let mut groups = groups(svc, port, filter);
    if let Some(split) = split {
        split.apply(&mut groups);
    }
    if let Some((lb, at)) = locality {
        lb.apply(&mut groups, at);
    }
    assignment(name, groups)
}

/// An endpoint's metadata: `envoy.transport_socket_match: {tlsMode: istio}` for a mesh
/// endpoint ([`speaks_mtls`]), so the cluster's mTLS transport socket applies, and, as
/// istiod's `AppendLbEndpointMetadata`,
/// `istio: {workload: WORKLOAD;NAMESPACE;CANONICAL_NAME;CANONICAL_REVISION;CLUSTER}`,
/// from which Istio's stats filter labels requests to a destination that exchanged no
/// metadata (no sidecar, or no answer).
fn endpoint_metadata(e: &Endpoint, namespace: &str) -> Metadata {
    let mut m = if speaks_mtls(e) {
        istio_mtls_metadata()
    } else {
        Metadata::default()
    };
    let (name, revision) = model::config::workload::canonical_service(&e.labels, &e.workload);
    // istiod leaves out the default revision, `latest`.
    let revision = if revision == "latest" { "" } else { revision };
    let workload = format!(
        "{};{namespace};{name};{revision};{}",
        e.workload,
        model::network::CLUSTER_ID
    );
    m.filter_metadata.insert(
        "istio".into(),
        super::make_struct(vec![("workload", super::string_value(workload))]),
    );
    m
}

/// Whether an endpoint speaks Istio mTLS: its `security.istio.io/tlsMode` label says
/// `istio`, or, for a WorkloadEntry (no Pod) without the label, it has a service account
/// (istiod's `getTLSModeFromWorkloadEntry`).
fn speaks_mtls(e: &Endpoint) -> bool {
    match e.labels.get(super::cluster::TLS_MODE_LABEL) {
        Some(mode) => mode == "istio",
        None => e.pod.is_none() && e.service_account.as_deref().is_some_and(|s| !s.is_empty()),
    }
}

const TRANSPORT_SOCKET_MATCH: &str = "envoy.transport_socket_match";

/// `envoy.transport_socket_match: {tlsMode: istio}`.
pub fn istio_mtls_metadata() -> Metadata {
    let mut m = Metadata::default();
    m.filter_metadata.insert(
        TRANSPORT_SOCKET_MATCH.into(),
        super::make_struct(vec![("tlsMode", super::string_value("istio"))]),
    );
    m
}

/// Whether the endpoint speaks Istio mTLS (carries [`istio_mtls_metadata`]).
pub fn is_mtls(e: &LbEndpoint) -> bool {
    (e.metadata.as_ref())
        .and_then(|m| m.filter_metadata.get(TRANSPORT_SOCKET_MATCH))
        .is_some_and(|s| s.fields.contains_key("tlsMode"))
}

/// A load assignment with no endpoints: istiod answers every requested EDS name.
pub fn empty_assignment(name: &str) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: name.to_string(),
        ..Default::default()
    }
}
