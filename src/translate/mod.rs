//! Pure translation: `&PushContext` + `&Proxy` in, Envoy resources out. No I/O, no clocks,
//! no tonic. A sidecar and a gateway (router) each get CDS, EDS, LDS and RDS resources.

pub mod authz;
pub mod cluster;
pub mod credentials;
pub mod endpoint;
pub mod inbound;
pub mod listener;
pub mod route;
pub mod tls;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, Metadata,
    config_source::ConfigSourceSpecifier,
};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use envoy_types::pb::google::protobuf::{self as pbp, Struct, value::Kind as ValueKind};

use crate::model::{Proxy, ProxyKind, PushContext};

/// Everything one proxy is sent, before encoding.
#[derive(Debug, Default, Clone)]
pub struct ProxyConfig {
    pub clusters: Vec<Cluster>,
    pub endpoints: Vec<ClusterLoadAssignment>,
    pub listeners: Vec<Listener>,
    pub routes: Vec<RouteConfiguration>,
    /// Gateway credentials, for proxies with a proven identity only.
    pub secrets: Vec<Secret>,
}

/// Translates the push context for one proxy.
pub fn proxy_config(ctx: &PushContext, proxy: &Proxy) -> ProxyConfig {
    let services = match proxy.kind {
        ProxyKind::Sidecar => ctx.services_for(proxy),
        // Gateways see every exported service, as istiod's do without a Sidecar.
        ProxyKind::Router => ctx
            .services
            .values()
            .filter(|s| s.visible_from(&proxy.namespace))
            .collect(),
    };
    let (mut clusters, endpoints) = cluster::outbound(ctx, proxy, &services);
    let (mut listeners, routes, secrets) = match proxy.kind {
        ProxyKind::Sidecar => {
            let (l, r) = listener::sidecar(ctx, proxy, &services);
            (l, r, Vec::new())
        }
        ProxyKind::Router => listener::gateway(ctx, proxy, &services),
    };
    if proxy.kind == ProxyKind::Sidecar {
        let (inbound_listeners, inbound_clusters) = inbound::sidecar(ctx, proxy);
        // Without capture, an outbound listener may bind the proxy's IP on a port its
        // Sidecar ingress also takes: the inbound one wins, as there is one socket.
        listeners.retain(|l| !inbound_listeners.iter().any(|i| i.name == l.name));
        listeners.extend(inbound_listeners);
        clusters.extend(inbound_clusters);
    }
    ProxyConfig {
        clusters,
        endpoints,
        listeners,
        routes,
        secrets,
    }
}

/// `{ads: {}, initial_fetch_timeout: 0s, resource_api_version: V3}`, as istiod writes it.
pub fn ads_config_source() -> ConfigSource {
    ConfigSource {
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        initial_fetch_timeout: Some(duration(std::time::Duration::ZERO)),
        resource_api_version: ApiVersion::V3 as i32,
        ..Default::default()
    }
}

pub fn duration(d: std::time::Duration) -> pbp::Duration {
    pbp::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

pub fn string_value(s: impl Into<String>) -> pbp::Value {
    pbp::Value {
        kind: Some(ValueKind::StringValue(s.into())),
    }
}

pub fn struct_value(fields: Vec<(&str, pbp::Value)>) -> pbp::Value {
    pbp::Value {
        kind: Some(ValueKind::StructValue(make_struct(fields))),
    }
}

pub fn make_struct(fields: Vec<(&str, pbp::Value)>) -> Struct {
    Struct {
        fields: fields
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    }
}

/// `metadata.filter_metadata.istio` with the given fields.
pub fn istio_metadata(fields: Vec<(&str, pbp::Value)>) -> Metadata {
    Metadata {
        filter_metadata: [("istio".to_string(), make_struct(fields))]
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

/// `outbound|PORT|SUBSET|HOST`.
pub fn outbound_cluster_name(port: u32, subset: &str, host: &str) -> String {
    format!("outbound|{port}|{subset}|{host}")
}

pub const BLACKHOLE_CLUSTER: &str = "BlackHoleCluster";
pub const PASSTHROUGH_CLUSTER: &str = "PassthroughCluster";

#[cfg(test)]
mod security_tests;
#[cfg(test)]
mod tests;
