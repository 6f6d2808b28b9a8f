//! What istiod sends a proxy built with Istio's extensions (istio-proxy) and stock Envoy
//! would refuse: the metadata-exchange filters that tell each side of a connection who
//! the other is, the ALPN override that marks upstream mTLS as Istio's, and the stats
//! filter behind `istio_requests_total` and the standard dashboards. A proxy gets them
//! when its node lists istio-proxy's stats extension (`Proxy::istio_extensions`).
//!
//! As istiod places them (`buildHTTPConnectionManager`, `buildCompleteNetworkFilters`,
//! `applyMetadataExchange`):
//! - every outbound service cluster and PassthroughCluster: the TCP metadata-exchange
//!   cluster filter;
//! - every filter chain of a sidecar's inbound listener: the TCP metadata-exchange
//!   network filter first;
//! - every connection manager: the HTTP metadata-exchange filter first (its inbound or
//!   outbound configuration), `istio.alpn` after gRPC statistics outside inbound
//!   listeners, and `istio.stats` before the router;
//! - every tcp_proxy: `istio.stats` right before it.
//!
//! The stats filters appear only while a Prometheus provider collects metrics: MeshConfig
//! `defaultProviders.metrics` names it (Istio's chart names `prometheus`), or the
//! proxy's Telemetry `metrics` do; the overrides of those decide what each counts
//! ([`crate::metrics`]).

use envoy_api::pb::envoy::config::cluster::v3::{Cluster, Filter as ClusterFilter};
use envoy_api::pb::envoy::config::listener::v3::{
    Filter, FilterChain, Listener, filter::ConfigType,
};
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_filter,
};
use envoy_api::pb::google::protobuf::{self as pbp, Any};
use envoy_api::util::pack_any;
use model::proxy_headers::ProxyHeaders;
use model::{Proxy, ProxyKind, PushContext};

use crate::metrics::{ProviderMetrics, Side};
use prost::Message;
use serde_json::json;

/// The metadata-exchange filters' name (cluster, network and HTTP alike).
pub const MX_FILTER: &str = "istio.metadata_exchange";
/// The stats filters' name (HTTP and network alike).
pub const STATS_FILTER: &str = "istio.stats";
/// The ALPN override filter's name.
pub const ALPN_FILTER: &str = "istio.alpn";

const PEER_METADATA_TYPE: &str = "type.googleapis.com/io.istio.http.peer_metadata.Config";
const TCP_MX_TYPE: &str = "type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange";

/// What a view of an istio-proxy gets on top of its listeners and clusters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IstioFilters {
    /// Per Prometheus provider collecting the proxy's metrics, in name order: what its
    /// stats filters count ([`crate::metrics`]).
    pub stats: Vec<ProviderMetrics>,
    /// The labels the metadata-exchange filters add ([`mx_labels`]).
    pub mx_labels: Vec<String>,
    /// ProxyConfig `proxyHeaders.metadataExchangeHeaders.mode: IN_MESH`: the proxy's
    /// clients send Istio's peer-metadata headers only to clusters in the mesh.
    pub mx_in_mesh: bool,
}

impl IstioFilters {
    /// For `proxy` if it has Istio's extensions, with the `proxyHeaders` it runs with
    /// ([`crate::listener::proxy_headers`]); `None` for stock Envoy.
    pub fn of(
        ctx: &PushContext,
        proxy: &Proxy,
        headers: Option<&ProxyHeaders>,
    ) -> Option<IstioFilters> {
        if !proxy.istio_extensions {
            return None;
        }
        let telemetries = ctx.telemetries_for(proxy);
        let metrics: Vec<_> = telemetries.iter().flat_map(|t| &t.metrics).collect();
        let providers = crate::metrics::prometheus_providers(&ctx.mesh, &metrics);
        Some(IstioFilters {
            stats: providers.into_values().collect(),
            mx_labels: mx_labels(ctx),
            mx_in_mesh: headers.is_some_and(|h| h.metadata_exchange_in_mesh),
        })
    }
}

/// `PILOT_MX_ADDITIONAL_LABELS`: workload labels (comma-separated) the metadata exchange
/// carries beyond Istio's own, for the stats filter's tags to read; sorted, each once.
pub fn mx_labels(ctx: &PushContext) -> Vec<String> {
    let listed = ctx
        .environment_var("PILOT_MX_ADDITIONAL_LABELS")
        .unwrap_or("");
    let mut labels: Vec<String> = (listed.split(','))
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    labels.sort();
    labels.dedup();
    labels
}

/// `fields` with the metadata exchange's `additional_labels`, when there are any.
fn with_labels(mut fields: serde_json::Value, labels: &[String]) -> serde_json::Value {
    if !labels.is_empty() {
        fields["additional_labels"] = json!(labels);
    }
    fields
}

/// `udpa.type.v1.TypedStruct`, which istiod's `TypedStructWithFields` packs Istio's own
/// filter configurations in: the configuration's type and its fields (envoy-types ships
/// the annotations of the `udpa` package only). Encoded by
/// [`canonical::encode_typed_struct`](crate::canonical::encode_typed_struct).
#[derive(Clone, PartialEq, Message)]
pub struct TypedStruct {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<pbp::Struct>,
}

/// A `udpa.type.v1.TypedStruct` of `type_url` with the object `fields`.
fn typed_struct(type_url: &str, fields: serde_json::Value) -> Any {
    let serde_json::Value::Object(fields) = fields else {
        unreachable!("BUG: the fields of a TypedStruct are an object")
    };
    Any {
        type_url: "type.googleapis.com/udpa.type.v1.TypedStruct".into(),
        value: super::canonical::encode_typed_struct(type_url, &super::json_struct(&fields)),
    }
}

/// `message` in an `Any` as the message `full_name` (one of Istio's, which Envoy's
/// generated messages do not hold).
fn pack(full_name: &str, message: impl Message) -> Any {
    Any {
        type_url: format!("type.googleapis.com/{full_name}"),
        value: message.encode_to_vec(),
    }
}

/// The TCP metadata-exchange configuration (clusters and inbound chains), carrying the
/// additional `labels`.
fn tcp_mx(labels: &[String]) -> Any {
    let fields = json!({"protocol": "istio-peer-exchange", "enable_discovery": true});
    typed_struct(TCP_MX_TYPE, with_labels(fields, labels))
}

/// The network metadata-exchange filter, as a sidecar's inbound chains and a gateway's
/// ISTIO_MUTUAL TCP chains open with it.
pub fn network_mx_filter(ctx: &PushContext) -> Filter {
    network_filter(MX_FILTER, tcp_mx(&mx_labels(ctx)))
}

/// The cluster filter every outbound service cluster and PassthroughCluster carries.
pub fn cluster_filter(labels: &[String]) -> ClusterFilter {
    ClusterFilter {
        name: MX_FILTER.into(),
        typed_config: Some(tcp_mx(labels)),
        ..Default::default()
    }
}

/// Adds the cluster filter to a service's `clusters` ([`crate::cluster::service`]).
pub fn add_cluster_filters(ctx: &PushContext, clusters: &mut [Cluster]) {
    add_cluster_filters_where(clusters, &mx_labels(ctx), |_| true);
}

/// Adds the cluster filter to a view's own outbound clusters: PassthroughCluster and a
/// gateway's SNI-DNAT clusters (inbound clusters and BlackHoleCluster get none).
/// `labels`: [`mx_labels`].
pub fn add_view_cluster_filters(clusters: &mut [Cluster], labels: &[String]) {
    let outbound =
        |c: &Cluster| c.name == crate::PASSTHROUGH_CLUSTER || c.name.starts_with("outbound");
    add_cluster_filters_where(clusters, labels, outbound);
}

fn add_cluster_filters_where(
    clusters: &mut [Cluster],
    labels: &[String],
    which: impl Fn(&Cluster) -> bool,
) {
    let filter = cluster_filter(labels);
    for c in clusters.iter_mut().filter(|c| which(c)) {
        c.filters.push(filter.clone());
    }
}

/// The HTTP metadata-exchange filter of an inbound (`downstream`) or other (`upstream`)
/// connection manager: peers are found from Istio's headers, then from the workload
/// metadata, and the proxy's own go out in Istio's headers (`in_mesh`: to clusters in the
/// mesh only), with the additional `labels`.
fn http_mx(inbound: bool, labels: &[String], in_mesh: bool) -> HttpFilter {
    let side = if inbound { "downstream" } else { "upstream" };
    let propagation = if in_mesh {
        json!({"skip_external_clusters": true})
    } else {
        json!({})
    };
    let fields = json!({
        format!("{side}_discovery"): [{"istio_headers": {}}, {"workload_discovery": {}}],
        format!("{side}_propagation"): [{"istio_headers": propagation}],
    });
    let config = typed_struct(PEER_METADATA_TYPE, with_labels(fields, labels));
    http_filter(MX_FILTER, config)
}

fn http_filter(name: &str, any: Any) -> HttpFilter {
    HttpFilter {
        name: name.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any)),
        ..Default::default()
    }
}

fn network_filter(name: &str, any: Any) -> Filter {
    Filter {
        name: name.into(),
        config_type: Some(ConfigType::TypedConfig(any)),
    }
}

/// `istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig`.
#[derive(Clone, PartialEq, Message)]
struct AlpnConfig {
    #[prost(message, repeated, tag = "1")]
    alpn_override: Vec<AlpnOverride>,
}

#[derive(Clone, PartialEq, Message)]
struct AlpnOverride {
    /// HTTP10 = 0, HTTP11 = 1, HTTP2 = 2.
    #[prost(int32, tag = "1")]
    upstream_protocol: i32,
    #[prost(string, repeated, tag = "2")]
    alpn_override: Vec<String>,
}

/// `istio.alpn`: upstream mTLS of HTTP/1.0, HTTP/1.1 and HTTP/2 requests offers Istio's
/// ALPN for that protocol first, so the server's sniffing port reads them as HTTP.
fn alpn() -> HttpFilter {
    let overrides = [
        (0, ["istio-http/1.0", "istio", "http/1.0"]),
        (1, ["istio-http/1.1", "istio", "http/1.1"]),
        (2, ["istio-h2", "istio", "h2"]),
    ];
    let config = AlpnConfig {
        alpn_override: (overrides.into_iter())
            .map(|(protocol, alpns)| AlpnOverride {
                upstream_protocol: protocol,
                alpn_override: alpns.map(str::to_string).to_vec(),
            })
            .collect(),
    };
    http_filter(
        ALPN_FILTER,
        pack(
            "istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig",
            config,
        ),
    )
}

/// The filters [`add_listener_filters`] places, built once for all of a view's listeners.
struct Built {
    /// The network metadata exchange that opens every inbound chain.
    tcp_mx: Filter,
    /// The HTTP metadata exchange of other and of inbound connection managers.
    http_mx: [HttpFilter; 2],
    alpn: HttpFilter,
    /// meshd's own ALPN filter, which `istio.alpn` replaces.
    sniffed_alpn: HttpFilter,
}

/// Adds Istio's filters to the listeners of a proxy of `kind`.
pub fn add_listener_filters(listeners: &mut [Listener], filters: &IstioFilters, kind: ProxyKind) {
    let built = Built {
        tcp_mx: network_filter(MX_FILTER, tcp_mx(&filters.mx_labels)),
        http_mx: [
            http_mx(false, &filters.mx_labels, filters.mx_in_mesh),
            http_mx(true, &filters.mx_labels, false),
        ],
        alpn: alpn(),
        sniffed_alpn: super::sniff::mtls_http_alpn_filter(),
    };
    // Inbound listeners count the server side; a sidecar's outbound ones and a gateway's
    // the client side. The Host header names the destination only for a sidecar's own
    // clients.
    let stats = |side: Side, host_header_fallback: bool| -> Vec<Any> {
        (filters.stats.iter())
            .filter_map(|p| p.config(side, host_header_fallback))
            .collect()
    };
    let outbound_stats = stats(Side::Client, kind == ProxyKind::Sidecar);
    let inbound_stats = stats(Side::Server, false);
    for listener in listeners {
        let inbound = super::is_inbound(listener.traffic_direction);
        let stats = if inbound {
            &inbound_stats
        } else {
            &outbound_stats
        };
        let chains =
            (listener.filter_chains.iter_mut()).chain(listener.default_filter_chain.iter_mut());
        for chain in chains {
            edit_chain(chain, inbound, &built, stats);
        }
    }
}

fn edit_chain(chain: &mut FilterChain, inbound: bool, built: &Built, stats: &[Any]) {
    let mut i = 0;
    while i < chain.filters.len() {
        let filter = &mut chain.filters[i];
        match (filter.name.as_str(), &mut filter.config_type) {
            (super::listener::HCM, Some(ConfigType::TypedConfig(any))) => {
                if let Ok(mut hcm) = HttpConnectionManager::decode(any.value.as_slice()) {
                    edit_hcm(&mut hcm, inbound, built, stats);
                    *any = pack_any(hcm);
                }
            }
            (super::listener::TCP_PROXY, _) => {
                for config in stats {
                    chain
                        .filters
                        .insert(i, network_filter(STATS_FILTER, config.clone()));
                    i += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    if inbound {
        chain.filters.insert(0, built.tcp_mx.clone());
    }
}

fn edit_hcm(hcm: &mut HttpConnectionManager, inbound: bool, built: &Built, stats: &[Any]) {
    let list = &mut hcm.http_filters;
    list.insert(0, built.http_mx[inbound as usize].clone());
    if !inbound {
        // istio.alpn does what meshd's own ALPN filter state does for stock Envoy.
        list.retain(|f| *f != built.sniffed_alpn);
        let at = (list.iter())
            .position(|f| f.name == super::filters::FAULT_FILTER)
            .unwrap_or(list.len().saturating_sub(1));
        list.insert(at, built.alpn.clone());
    }
    let router = list.len().saturating_sub(1);
    for (i, config) in stats.iter().enumerate() {
        list.insert(router + i, http_filter(STATS_FILTER, config.clone()));
    }
}
