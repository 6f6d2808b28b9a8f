//! CDS and EDS: one cluster per service port (`outbound|PORT||HOST`), one per
//! DestinationRule subset (`outbound|PORT|SUBSET|HOST`, endpoints filtered by the subset's
//! labels), plus the built-in BlackHoleCluster and PassthroughCluster.

use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::cluster::DnsLookupFamily;
use envoy_types::pb::envoy::config::cluster::v3::{
    Cluster,
    cluster::{ClusterDiscoveryType, DiscoveryType, EdsClusterConfig, LbPolicy},
};
use envoy_types::pb::envoy::config::core::v3::Http2ProtocolOptions;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions,
    http_protocol_options::{
        ExplicitHttpConfig, UpstreamProtocolOptions, explicit_http_config::ProtocolConfig,
    },
};
use envoy_types::pb::google::protobuf::{ListValue, Value, value::Kind as ValueKind};
use envoy_types::util::pack_any;

use super::endpoint::load_assignment;
use super::{
    BLACKHOLE_CLUSTER, PASSTHROUGH_CLUSTER, ads_config_source, duration, istio_metadata,
    outbound_cluster_name, string_value, struct_value,
};
use crate::api::labels_match;
use crate::api::networking::{SimpleLb, TrafficPolicy};
use crate::model::service::Discovery;
use crate::model::{ProxyKind, PushContext, Service, ServicePort};

const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Outbound clusters for `services`, and the load assignments of the EDS ones.
pub fn outbound(
    ctx: &PushContext,
    services: &[&Arc<Service>],
    kind: ProxyKind,
) -> (Vec<Cluster>, Vec<ClusterLoadAssignment>) {
    let mut clusters = Vec::new();
    let mut assignments = Vec::new();
    for svc in services {
        let dr = ctx.destination_rule(&svc.hostname);
        for port in &svc.ports {
            let base_policy = dr.and_then(|(_, d)| d.traffic_policy.as_ref());
            let name = outbound_cluster_name(port.port, "", &svc.hostname);
            let mut meta = service_metadata(svc, dr.map(|(o, _)| o.istio_config_path()), None);
            let c = build(&name, svc, port, base_policy, kind, &mut meta);
            if is_eds(&c) {
                assignments.push(load_assignment(&name, svc, port.port, |_| true));
            }
            clusters.push(c);
            let Some((dr_obj, dr_spec)) = dr else {
                continue;
            };
            for subset in &dr_spec.subsets {
                let name = outbound_cluster_name(port.port, &subset.name, &svc.hostname);
                let policy = subset.traffic_policy.as_ref().or(base_policy);
                let mut meta =
                    service_metadata(svc, Some(dr_obj.istio_config_path()), Some(&subset.name));
                let c = build(&name, svc, port, policy, kind, &mut meta);
                if is_eds(&c) {
                    assignments.push(load_assignment(&name, svc, port.port, |e| {
                        labels_match(&subset.labels, &e.labels)
                    }));
                }
                clusters.push(c);
            }
        }
    }
    clusters.push(Cluster {
        name: BLACKHOLE_CLUSTER.into(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
        connect_timeout: Some(duration(CONNECT_TIMEOUT)),
        ..Default::default()
    });
    if kind == ProxyKind::Sidecar {
        clusters.push(Cluster {
            name: PASSTHROUGH_CLUSTER.into(),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(
                DiscoveryType::OriginalDst as i32,
            )),
            lb_policy: LbPolicy::ClusterProvided as i32,
            connect_timeout: Some(duration(CONNECT_TIMEOUT)),
            ..Default::default()
        });
    }
    (clusters, assignments)
}

fn service_metadata(
    svc: &Service,
    config: Option<String>,
    subset: Option<&str>,
) -> Vec<(&'static str, Value)> {
    let service = struct_value(vec![
        ("host", string_value(&svc.hostname)),
        ("name", string_value(&svc.name)),
        ("namespace", string_value(&svc.namespace)),
    ]);
    let mut fields = vec![(
        "services",
        Value {
            kind: Some(ValueKind::ListValue(ListValue {
                values: vec![service],
            })),
        },
    )];
    if let Some(config) = config {
        fields.push(("config", string_value(config)));
    }
    if let Some(subset) = subset {
        fields.push(("subset", string_value(subset)));
    }
    if svc.mesh_external {
        fields.push((
            "external",
            Value {
                kind: Some(ValueKind::BoolValue(true)),
            },
        ));
    }
    fields
}

fn build(
    name: &str,
    svc: &Service,
    port: &ServicePort,
    policy: Option<&TrafficPolicy>,
    kind: ProxyKind,
    meta: &mut Vec<(&'static str, Value)>,
) -> Cluster {
    let mut c = Cluster {
        name: name.to_string(),
        connect_timeout: Some(duration(CONNECT_TIMEOUT)),
        lb_policy: LbPolicy::LeastRequest as i32,
        metadata: Some(istio_metadata(std::mem::take(meta))),
        ..Default::default()
    };
    let discovery = if kind == ProxyKind::Router && svc.discovery == Discovery::Passthrough {
        Discovery::Eds
    } else {
        svc.discovery
    };
    match discovery {
        Discovery::Eds => {
            c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32));
            c.eds_cluster_config = Some(EdsClusterConfig {
                eds_config: Some(ads_config_source()),
                service_name: name.to_string(),
            });
        }
        Discovery::StrictDns | Discovery::LogicalDns => {
            let t = if discovery == Discovery::StrictDns {
                DiscoveryType::StrictDns
            } else {
                DiscoveryType::LogicalDns
            };
            c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(t as i32));
            c.dns_lookup_family = DnsLookupFamily::V4Only as i32;
            c.load_assignment = Some(load_assignment(name, svc, port.port, |_| true));
        }
        Discovery::Passthrough => {
            c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(
                DiscoveryType::OriginalDst as i32,
            ));
            c.lb_policy = LbPolicy::ClusterProvided as i32;
        }
    }
    if let Some(lb) = policy
        .and_then(|p| p.load_balancer.as_ref())
        .and_then(|lb| lb.simple)
    {
        c.lb_policy = match lb {
            SimpleLb::RoundRobin => LbPolicy::RoundRobin,
            SimpleLb::Random => LbPolicy::Random,
            SimpleLb::Passthrough => {
                c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(
                    DiscoveryType::OriginalDst as i32,
                ));
                c.eds_cluster_config = None;
                LbPolicy::ClusterProvided
            }
            SimpleLb::LeastConn | SimpleLb::LeastRequest | SimpleLb::Unspecified => {
                LbPolicy::LeastRequest
            }
        } as i32;
    }
    if let Some(ct) = policy
        .and_then(|p| p.connection_pool.as_ref())
        .and_then(|cp| cp.tcp.as_ref())
        .and_then(|t| t.connect_timeout.as_deref())
        .and_then(|t| crate::duration::parse(t).ok())
    {
        c.connect_timeout = Some(duration(ct));
    }
    if port.protocol.is_http2() {
        let opts = HttpProtocolOptions {
            upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
                ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(
                        Http2ProtocolOptions::default(),
                    )),
                },
            )),
            ..Default::default()
        };
        c.typed_extension_protocol_options.insert(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".into(),
            pack_any(opts),
        );
    }
    c
}

fn is_eds(c: &Cluster) -> bool {
    c.cluster_discovery_type == Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32))
}
