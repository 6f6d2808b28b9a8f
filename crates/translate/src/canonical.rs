//! Deterministic encoding. prost writes map fields in `HashMap` iteration order, which
//! differs between map instances, so the same resource could encode to different bytes
//! (and so different versions) on every push. Every map meshd emits holds at most one entry
//! except the `Struct` fields of a cluster's `metadata.filter_metadata.istio`, an mTLS
//! endpoint's `metadata.filter_metadata` (`envoy.transport_socket_match` and `istio`) and
//! the `TypedStruct`s Istio's own filters are configured with; this module encodes
//! `Metadata` and `TypedStruct` with every map in key order, and [`encode_cluster`] and
//! [`encode_load_assignment`] append the metadata to the message's other fields.
//! Protobuf merges a repeated occurrence of a message field, so Envoy decodes exactly the
//! same message.

use std::collections::HashMap;

use envoy_api::pb::envoy::config::cluster::v3::Cluster;
use envoy_api::pb::envoy::config::core::v3::Metadata;
use envoy_api::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, LbEndpoint, LocalityLbEndpoints,
};
use envoy_api::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint};

/// Field number of `Cluster.metadata`.
const CLUSTER_METADATA: u32 = 25;

fn length_delimited(tag: u32, body: &[u8], out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

fn string_field(tag: u32, s: &str, out: &mut Vec<u8>) {
    length_delimited(tag, s.as_bytes(), out);
}

fn encode_value(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    match &v.kind {
        Some(Kind::StructValue(s)) => length_delimited(5, &encode_struct(s), &mut out),
        Some(Kind::ListValue(l)) => length_delimited(6, &encode_list(l), &mut out),
        _ => v
            .encode(&mut out)
            .expect("BUG: encoding to a Vec cannot fail"),
    }
    out
}

fn encode_list(l: &ListValue) -> Vec<u8> {
    let mut out = Vec::new();
    for v in &l.values {
        length_delimited(1, &encode_value(v), &mut out);
    }
    out
}

/// A `map<string, V>` field with its entries in key order.
fn sorted_map<V>(
    tag: u32,
    map: &HashMap<String, V>,
    value: impl Fn(&V) -> Vec<u8>,
    out: &mut Vec<u8>,
) {
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    for k in keys {
        let mut entry = Vec::new();
        string_field(1, k, &mut entry);
        length_delimited(2, &value(&map[k]), &mut entry);
        length_delimited(tag, &entry, out);
    }
}

fn encode_struct(s: &Struct) -> Vec<u8> {
    let mut out = Vec::new();
    sorted_map(1, &s.fields, encode_value, &mut out);
    out
}

/// A `TypedStruct` (`udpa.type.v1` and `xds.type.v3` alike) of `type_url` with `value`,
/// every nested Struct in key order.
pub fn encode_typed_struct(type_url: &str, value: &Struct) -> Vec<u8> {
    let mut out = Vec::new();
    string_field(1, type_url, &mut out);
    length_delimited(2, &encode_struct(value), &mut out);
    out
}

/// `Metadata` with `filter_metadata` and every nested Struct in key order.
pub fn encode_metadata(m: &Metadata) -> Vec<u8> {
    let mut out = Vec::new();
    sorted_map(1, &m.filter_metadata, encode_struct, &mut out);
    debug_assert!(
        m.typed_filter_metadata.len() <= 1,
        "BUG: typed_filter_metadata must stay deterministic"
    );
    let typed = Metadata {
        typed_filter_metadata: m.typed_filter_metadata.clone(),
        ..Default::default()
    };
    out.extend(typed.encode_to_vec());
    out
}

/// A cluster's bytes, identical for identical clusters.
pub fn encode_cluster(c: &Cluster) -> Vec<u8> {
    let Some(metadata) = &c.metadata else {
        return c.encode_to_vec();
    };
    let mut rest = c.clone();
    rest.metadata = None;
    let mut out = rest.encode_to_vec();
    length_delimited(CLUSTER_METADATA, &encode_metadata(metadata), &mut out);
    out
}

/// Field numbers: `ClusterLoadAssignment.endpoints`, `LocalityLbEndpoints.lb_endpoints`,
/// `LbEndpoint.metadata`.
const CLA_ENDPOINTS: u32 = 2;
const LOCALITY_LB_ENDPOINTS: u32 = 2;
const LB_ENDPOINT_METADATA: u32 = 3;

/// A load assignment's bytes, identical for identical assignments: each endpoint's
/// metadata in key order, after its other fields.
pub fn encode_load_assignment(a: &ClusterLoadAssignment) -> Vec<u8> {
    let several = |m: &Option<Metadata>| m.as_ref().is_some_and(|m| m.filter_metadata.len() > 1);
    let groups = &a.endpoints;
    if !(groups.iter().flat_map(|g| &g.lb_endpoints)).any(|e| several(&e.metadata)) {
        return a.encode_to_vec();
    }
    let head = ClusterLoadAssignment {
        cluster_name: a.cluster_name.clone(),
        endpoints: Vec::new(),
        named_endpoints: a.named_endpoints.clone(),
        policy: a.policy.clone(),
    };
    let mut out = head.encode_to_vec();
    for group in groups {
        let LocalityLbEndpoints {
            locality,
            metadata,
            lb_endpoints,
            load_balancing_weight,
            priority,
            proximity,
            lb_config,
        } = group;
        let mut body = LocalityLbEndpoints {
            locality: locality.clone(),
            metadata: metadata.clone(),
            lb_endpoints: Vec::new(),
            load_balancing_weight: *load_balancing_weight,
            priority: *priority,
            proximity: *proximity,
            lb_config: lb_config.clone(),
        }
        .encode_to_vec();
        for e in lb_endpoints {
            let mut endpoint = LbEndpoint {
                health_status: e.health_status,
                metadata: None,
                load_balancing_weight: e.load_balancing_weight,
                host_identifier: e.host_identifier.clone(),
            }
            .encode_to_vec();
            if let Some(m) = &e.metadata {
                length_delimited(LB_ENDPOINT_METADATA, &encode_metadata(m), &mut endpoint);
            }
            length_delimited(LOCALITY_LB_ENDPOINTS, &endpoint, &mut body);
        }
        length_delimited(CLA_ENDPOINTS, &body, &mut out);
    }
    out
}

/// An HTTP (`stat_prefix` None) or network RBAC filter config, each policy map in key
/// order (several policies are common there): `rules` are enforced; `shadow` rules are
/// only evaluated (their result goes to the stats and dynamic metadata under its prefix).
pub fn encode_rbac_filter(
    rules: Option<&envoy_api::pb::envoy::config::rbac::v3::Rbac>,
    shadow: Option<(&envoy_api::pb::envoy::config::rbac::v3::Rbac, &str)>,
    stat_prefix: Option<&str>,
) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(rules) = rules {
        length_delimited(1, &rbac_message(rules), &mut out);
    }
    if let Some((shadow, _)) = shadow {
        length_delimited(2, &rbac_message(shadow), &mut out);
    }
    let shadow_prefix = shadow.map(|(_, p)| p).filter(|p| !p.is_empty());
    match stat_prefix {
        // HTTP: shadow_rules_stat_prefix is field 3.
        None => {
            if let Some(p) = shadow_prefix {
                string_field(3, p, &mut out);
            }
        }
        // Network: stat_prefix is field 3, shadow_rules_stat_prefix field 5.
        Some(prefix) => {
            string_field(3, prefix, &mut out);
            if let Some(p) = shadow_prefix {
                string_field(5, p, &mut out);
            }
        }
    }
    out
}

/// An `Rbac` message with its policy map in key order.
fn rbac_message(rules: &envoy_api::pb::envoy::config::rbac::v3::Rbac) -> Vec<u8> {
    let without_policies = envoy_api::pb::envoy::config::rbac::v3::Rbac {
        policies: HashMap::new(),
        ..rules.clone()
    };
    let mut rbac = without_policies.encode_to_vec();
    sorted_map(2, &rules.policies, |p| p.encode_to_vec(), &mut rbac);
    rbac
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{istio_metadata, string_value, struct_value};

    fn cluster() -> Cluster {
        let services = struct_value(vec![
            ("host", string_value("a.b.svc")),
            ("name", string_value("a")),
            ("namespace", string_value("b")),
        ]);
        Cluster {
            name: "outbound|80||a.b.svc".into(),
            metadata: Some(istio_metadata(vec![
                ("services", services),
                ("config", string_value("/apis/x")),
                ("subset", string_value("v1")),
            ])),
            ..Default::default()
        }
    }

    #[test]
    fn identical_clusters_encode_to_identical_bytes() {
        let first = encode_cluster(&cluster());
        for _ in 0..20 {
            assert_eq!(encode_cluster(&cluster()), first);
        }
    }

    #[test]
    fn the_canonical_bytes_decode_to_the_same_cluster() {
        let c = cluster();
        assert_eq!(Cluster::decode(encode_cluster(&c).as_slice()).unwrap(), c);
    }

    /// An assignment of two localities whose mTLS endpoints carry two metadata keys.
    fn assignment() -> ClusterLoadAssignment {
        let endpoint = |ip: &str| {
            let mut metadata = crate::endpoint::istio_mtls_metadata();
            let workload = format!("{ip};b;a;;Kubernetes");
            metadata.filter_metadata.insert(
                "istio".into(),
                crate::make_struct(vec![("workload", string_value(workload))]),
            );
            LbEndpoint {
                host_identifier: Some(
                    envoy_api::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier::Endpoint(
                        envoy_api::pb::envoy::config::endpoint::v3::Endpoint {
                            address: Some(crate::endpoint::socket_address(ip, 80)),
                            ..Default::default()
                        },
                    ),
                ),
                metadata: Some(metadata),
                health_status: 1,
                ..Default::default()
            }
        };
        let group = |zone: &str, ips: &[&str]| LocalityLbEndpoints {
            locality: Some(envoy_api::pb::envoy::config::core::v3::Locality {
                zone: zone.into(),
                ..Default::default()
            }),
            lb_endpoints: ips.iter().map(|ip| endpoint(ip)).collect(),
            priority: 1,
            ..Default::default()
        };
        ClusterLoadAssignment {
            cluster_name: "outbound|80||a.b.svc".into(),
            endpoints: vec![
                group("z1", &["10.0.0.1", "10.0.0.2"]),
                group("z2", &["10.0.0.3"]),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn identical_assignments_encode_to_identical_bytes_that_decode_to_them() {
        let first = encode_load_assignment(&assignment());
        for _ in 0..20 {
            assert_eq!(encode_load_assignment(&assignment()), first);
        }
        let decoded = ClusterLoadAssignment::decode(first.as_slice()).unwrap();
        assert_eq!(decoded, assignment());
    }
}
