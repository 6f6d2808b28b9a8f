//! Pure translation: `&PushContext` + `&Proxy` in, Envoy resources out. No I/O, no clocks,
//! no tonic. A sidecar and a gateway (router) each get CDS, EDS, LDS and RDS resources.

pub mod access_log;
pub mod assemble;
pub mod authz;
pub mod canonical;
pub mod cluster;
pub mod credentials;
pub mod endpoint;
pub mod ext_authz;
pub mod filters;
pub mod inbound;
pub mod istio_proxy;
pub mod jwt;
pub mod listener;
pub mod locality;
pub mod metrics;
pub mod name_table;
pub mod network;
pub mod policy;
pub mod pool;
pub mod route;
pub mod sniff;
pub mod stat_name;
pub mod tls;
pub mod tracing;

use envoy_api::pb::envoy::config::cluster::v3::Cluster;
use envoy_api::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, CidrRange, ConfigSource, Metadata,
    config_source::ConfigSourceSpecifier,
};
use envoy_api::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_api::pb::envoy::config::listener::v3::Listener;
use envoy_api::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use envoy_api::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use envoy_api::pb::google::protobuf::{self as pbp, Struct, value::Kind as ValueKind};

use std::sync::Arc;

use model::{Proxy, ProxyKind, PushContext, Service};

pub use assemble::{Assembly, assemble, assemble_clusters, proxy_config};

/// Everything one proxy is sent, before encoding.
#[derive(Debug, Default, Clone)]
pub struct ProxyConfig {
    pub clusters: Vec<Cluster>,
    pub endpoints: Vec<ClusterLoadAssignment>,
    pub listeners: Vec<Listener>,
    pub routes: Vec<RouteConfiguration>,
    /// Gateway credentials, for proxies with a proven identity only.
    pub secrets: Vec<Secret>,
    /// The route configurations' virtual hosts, when they go over VHDS
    /// ([`Proxy::vhds`]; named [`route::vhds_name`]).
    pub virtual_hosts: Vec<VirtualHost>,
    /// The DNS name table, for a proxy whose agent runs a DNS proxy ([`Proxy::dns_proxy`]).
    pub name_table: Option<name_table::NameTable>,
}

/// A proxy's configuration with the per-service parts named rather than built: each
/// service's clusters ([`cluster::service`]) and each default virtual host
/// ([`route::default_virtual_host`]) depend on little besides the service, so the xDS layer
/// takes them from a cache of encoded resources; [`proxy_config`] builds them in full. Both
/// go through [`assemble`].
pub struct Plan<'a> {
    /// The services whose clusters and load assignments the proxy gets.
    pub services: Vec<&'a Arc<Service>>,
    /// The other clusters: BlackHole/Passthrough, the inbound ones, a gateway's SNI-DNAT
    /// ones.
    pub clusters: Vec<Cluster>,
    /// The load assignments of the other clusters (a gateway's SNI-DNAT ones).
    pub endpoints: Vec<ClusterLoadAssignment>,
    pub listeners: Vec<Listener>,
    /// A sidecar's route configurations.
    pub sidecar_routes: Vec<SidecarRoute<'a>>,
    /// The last virtual host of a sidecar's `"PORT"` route configurations.
    pub catch_all: Option<VirtualHost>,
    /// A gateway's route configurations.
    pub gateway_routes: Vec<route::GatewayRoute>,
    /// Gateway credentials, for proxies with a proven identity only.
    pub secrets: Vec<Secret>,
    /// What the proxy's `proxyHeaders` change in every virtual host it is sent.
    pub route_headers: Option<route::RouteHeaders>,
}

/// A sidecar route configuration before assembly: `"PORT"` (these virtual hosts, then the
/// plan's `catch_all`), or a sniffed listener's `HOST:PORT` (`sniffed`: its one virtual
/// host, for every domain).
pub struct SidecarRoute<'a> {
    pub name: String,
    pub port: u32,
    pub sniffed: bool,
    pub vhosts: Vec<route::VirtualHostPlan<'a>>,
}

/// The services whose clusters (and DNS names) a proxy gets: a sidecar's are scoped by
/// its Sidecar, a gateway's only by `exportTo`.
pub fn services<'a>(ctx: &'a PushContext, proxy: &Proxy) -> Vec<&'a Arc<Service>> {
    match proxy.kind {
        ProxyKind::Sidecar => ctx.services_for(proxy),
        ProxyKind::Router => gateway_services(ctx, proxy),
    }
}

/// Plans the configuration of one proxy.
pub fn plan<'a>(ctx: &'a PushContext, proxy: &Proxy) -> Plan<'a> {
    let services = services(ctx, proxy);
    let mut clusters = cluster::fallback(proxy.kind, &ctx.mesh);
    let mut plan = match proxy.kind {
        ProxyKind::Sidecar => {
            let (listeners, http_routes) = listener::sidecar_listeners(ctx, proxy, &services);
            let sidecar_routes = http_routes
                .into_iter()
                .map(|r| SidecarRoute {
                    name: r.name(),
                    port: r.port,
                    sniffed: r.sniffed.is_some(),
                    vhosts: route::sidecar_plan(ctx, proxy, &r),
                })
                .collect();
            Plan {
                services: Vec::new(),
                clusters: Vec::new(),
                endpoints: Vec::new(),
                listeners,
                sidecar_routes,
                catch_all: Some(route::sidecar_catch_all(ctx, proxy)),
                gateway_routes: Vec::new(),
                secrets: Vec::new(),
                route_headers: None,
            }
        }
        ProxyKind::Router => {
            let (listeners, routes, mut uses) = listener::gateway(ctx, proxy, &services);
            // Credentials reach only a gateway with a proven identity, as the listeners
            // that use them do.
            if proxy.identity.is_some() {
                uses.extend(credentials::destination_rule_uses(ctx, proxy, &services));
            }
            let secrets = credentials::secrets(ctx, proxy, &uses);
            let endpoints = sni_dnat(ctx, proxy, &services, &mut clusters);
            Plan {
                services: Vec::new(),
                clusters: Vec::new(),
                endpoints,
                listeners,
                sidecar_routes: Vec::new(),
                catch_all: None,
                gateway_routes: routes,
                secrets,
                route_headers: None,
            }
        }
    };
    if proxy.kind == ProxyKind::Sidecar {
        let (inbound_listeners, inbound_clusters) = inbound::sidecar(ctx, proxy);
        // Without capture, an outbound listener may bind the proxy's IP on a port its
        // Sidecar ingress also takes: the inbound one wins, as there is one socket.
        plan.listeners
            .retain(|l| !inbound_listeners.iter().any(|i| i.name == l.name));
        plan.listeners.extend(inbound_listeners);
        clusters.extend(inbound_clusters);
    }
    let settings = listener::ViewSettings {
        idle_timeout: proxy.idle_timeout.map(duration),
        access_logs: access_log::AccessLogs::for_proxy(ctx, proxy),
        tracing: tracing::of(ctx, proxy),
        headers: listener::proxy_headers(ctx, proxy).map(|h| (h, proxy.kind)),
    };
    listener::apply_view_settings(&mut plan.listeners, &settings);
    let headers = settings.headers.as_ref().map(|(h, _)| h);
    plan.route_headers = headers.and_then(route::RouteHeaders::of);
    if let Some(filters) = istio_proxy::IstioFilters::of(ctx, proxy, headers) {
        istio_proxy::add_listener_filters(&mut plan.listeners, &filters, proxy.kind);
        istio_proxy::add_view_cluster_filters(&mut clusters, &filters.mx_labels);
    }
    plan.services = services;
    plan.clusters = clusters;
    plan
}

/// Gateways see every exported service, as istiod's do without a Sidecar.
fn gateway_services<'a>(ctx: &'a PushContext, proxy: &Proxy) -> Vec<&'a Arc<Service>> {
    ctx.exported_services(&proxy.namespace, |_| true)
}

/// AUTO_PASSTHROUGH servers forward to SNI-DNAT clusters, built for this gateway (istiod
/// does not cache them either): added to `clusters`, their load assignments returned.
fn sni_dnat(
    ctx: &PushContext,
    proxy: &Proxy,
    services: &[&Arc<Service>],
    clusters: &mut Vec<Cluster>,
) -> Vec<ClusterLoadAssignment> {
    let mut endpoints = Vec::new();
    if listener::has_auto_passthrough(ctx, proxy) {
        let at = locality::place(ctx, proxy);
        for svc in services {
            let rule = ctx.service_rule(proxy, svc).map(|r| &**r);
            let (c, a) = cluster::sni_dnat(ctx, svc, rule, &at);
            clusters.extend(c);
            endpoints.extend(a);
        }
    }
    endpoints
}

/// A proxy's plan without its listeners, routes and secrets: the part of it that an
/// endpoint change alters. Listeners, routes and credentials depend on Gateways,
/// VirtualServices, DestinationRules, Sidecars, Services, policies and Secrets; on
/// endpoints only through the ports a sidecar's own services reach on it
/// ([`inbound::workload_ports`]), which the caller checks.
pub fn cluster_plan<'a>(ctx: &'a PushContext, proxy: &Proxy) -> Plan<'a> {
    let mut clusters = cluster::fallback(proxy.kind, &ctx.mesh);
    let services = services(ctx, proxy);
    let endpoints = match proxy.kind {
        ProxyKind::Sidecar => {
            clusters.extend(inbound::sidecar(ctx, proxy).1);
            Vec::new()
        }
        ProxyKind::Router => sni_dnat(ctx, proxy, &services, &mut clusters),
    };
    if proxy.istio_extensions {
        istio_proxy::add_view_cluster_filters(&mut clusters, &istio_proxy::mx_labels(ctx));
    }
    Plan {
        services,
        clusters,
        endpoints,
        listeners: Vec::new(),
        sidecar_routes: Vec::new(),
        catch_all: None,
        gateway_routes: Vec::new(),
        secrets: Vec::new(),
        route_headers: None,
    }
}

/// Where a sidecar sends traffic that matches no service: `None` under REGISTRY_ONLY
/// (refused); else its Sidecar's `egressProxy` cluster (`outbound|PORT|SUBSET|HOST` of the
/// destination as written, as istiod's `GetDestinationCluster` names it); else
/// PassthroughCluster, to the original destination.
pub fn unknown_destination(ctx: &PushContext, proxy: &Proxy) -> Option<String> {
    if ctx.registry_only(proxy) {
        return None;
    }
    Some(match ctx.egress_proxy(proxy) {
        Some(d) => outbound_cluster_name(
            d.port.as_ref().map_or(0, |p| p.number),
            d.subset.as_deref().unwrap_or(""),
            &d.host,
        ),
        None => PASSTHROUGH_CLUSTER.to_string(),
    })
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

/// What a Telemetry-shaped setting gives each side of `proxy`'s traffic: `side("CLIENT")`
/// for its outbound (and a gateway's) connections and `side("SERVER")` for its inbound
/// ones; a gateway has only the client side, as istiod's `workloadMode` has it.
pub(crate) fn per_side<T: Clone>(proxy: &Proxy, side: impl Fn(&str) -> T) -> (T, T) {
    let client = side("CLIENT");
    let server = match proxy.kind {
        ProxyKind::Router => client.clone(),
        ProxyKind::Sidecar => side("SERVER"),
    };
    (client, server)
}

/// Whether a listener of `direction` (its `traffic_direction`) takes inbound traffic, and
/// so the server side of [`per_side`].
pub(crate) fn is_inbound(direction: i32) -> bool {
    direction == envoy_api::pb::envoy::config::core::v3::TrafficDirection::Inbound as i32
}

pub fn duration(d: std::time::Duration) -> pbp::Duration {
    pbp::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// An Istio duration field (`"1.5s"`, `"250ms"`), unset or one the validator has accepted;
/// an unparsable one is left out.
pub fn optional_duration(text: Option<&str>) -> Option<pbp::Duration> {
    text.and_then(|t| api::duration::parse(t).ok())
        .map(duration)
}

/// An IP address (its whole length) or `ADDRESS/LENGTH` as Envoy's CIDR range; validation
/// has refused any other form.
pub fn cidr_range(block: &str) -> CidrRange {
    let (ip, len) = match block.split_once('/') {
        Some((ip, len)) => (ip, len.parse().unwrap_or(32)),
        None => (block, if block.contains(':') { 128 } else { 32 }),
    };
    CidrRange {
        address_prefix: ip.into(),
        prefix_len: Some(pbp::UInt32Value { value: len }),
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

/// A JSON value as a protobuf `Value` (node metadata, access log formats).
pub fn json_value(v: &serde_json::Value) -> pbp::Value {
    use pbp::value::Kind;
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(items) => Kind::ListValue(pbp::ListValue {
            values: items.iter().map(json_value).collect(),
        }),
        serde_json::Value::Object(map) => Kind::StructValue(json_struct(map)),
    };
    pbp::Value { kind: Some(kind) }
}

/// A JSON object as a protobuf `Struct`.
pub fn json_struct(map: &serde_json::Map<String, serde_json::Value>) -> Struct {
    Struct {
        fields: map
            .iter()
            .map(|(k, v)| (k.clone(), json_value(v)))
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
mod tests;
