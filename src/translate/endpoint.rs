//! EDS: a ClusterLoadAssignment per cluster, endpoints grouped by locality (sorted), each
//! group weighted by the sum of its endpoints' weights.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::{
    Address, HealthStatus, Locality as PbLocality, Metadata, SocketAddress, address,
    socket_address::PortSpecifier,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint as PbEndpoint, LbEndpoint, LocalityLbEndpoints,
    lb_endpoint::HostIdentifier,
};
use envoy_types::pb::google::protobuf::UInt32Value;

use crate::model::{Endpoint, Locality, Service};

pub fn socket_address(ip: &str, port: u32) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ip.to_string(),
            port_specifier: Some(PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

/// The load assignment of cluster `name`: `svc`'s endpoints for `port` that pass `filter`.
pub fn load_assignment(
    name: &str,
    svc: &Service,
    port: u32,
    filter: impl Fn(&Endpoint) -> bool,
) -> ClusterLoadAssignment {
    let mut groups: BTreeMap<&Locality, Vec<LbEndpoint>> = BTreeMap::new();
    for e in svc.endpoints.iter().filter(|e| filter(e)) {
        let Some(target) = e.ports.get(&port) else {
            continue;
        };
        groups.entry(&e.locality).or_default().push(LbEndpoint {
            host_identifier: Some(HostIdentifier::Endpoint(PbEndpoint {
                address: Some(socket_address(&e.address, *target)),
                ..Default::default()
            })),
            metadata: tls_mode_metadata(e),
            health_status: if e.healthy {
                HealthStatus::Healthy
            } else {
                HealthStatus::Unhealthy
            } as i32,
            load_balancing_weight: Some(UInt32Value { value: e.weight }),
        });
    }
    ClusterLoadAssignment {
        cluster_name: name.to_string(),
        endpoints: groups
            .into_iter()
            .map(|(locality, lb_endpoints)| LocalityLbEndpoints {
                locality: Some(PbLocality {
                    region: locality.region.clone(),
                    zone: locality.zone.clone(),
                    sub_zone: locality.subzone.clone(),
                }),
                load_balancing_weight: Some(UInt32Value {
                    value: lb_endpoints
                        .iter()
                        .map(|e| e.load_balancing_weight.as_ref().map_or(1, |w| w.value))
                        .sum(),
                }),
                lb_endpoints,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// `envoy.transport_socket_match: {tlsMode: istio}` for a mesh endpoint (its pod carries
/// `security.istio.io/tlsMode: istio`), so the cluster's mTLS transport socket applies.
fn tls_mode_metadata(e: &Endpoint) -> Option<Metadata> {
    if e.labels
        .get(super::cluster::TLS_MODE_LABEL)
        .map(String::as_str)
        != Some("istio")
    {
        return None;
    }
    let mut m = Metadata::default();
    m.filter_metadata.insert(
        "envoy.transport_socket_match".into(),
        super::make_struct(vec![("tlsMode", super::string_value("istio"))]),
    );
    Some(m)
}

/// A load assignment with no endpoints: istiod answers every requested EDS name.
pub fn empty_assignment(name: &str) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: name.to_string(),
        ..Default::default()
    }
}
