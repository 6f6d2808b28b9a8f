//! LDS: a sidecar's outbound listeners (one per HTTP port, `0.0.0.0_PORT` with RDS `"PORT"`;
//! one per TCP or TLS service port, `VIP_PORT` with tcp_proxy, TLS chains told apart by
//! SNI, at each of a ServiceEntry's addresses, a CIDR's chain on `0.0.0.0_PORT` matched on
//! the range; one per port without a declared protocol, `VIP_PORT` sniffing HTTP to RDS
//! `HOST:PORT` from the rest) and `virtualOutbound`, each Sidecar egress listener in turn
//! (one with a port first, on its own bind). A gateway's listeners are built in
//! [`gateway`]; the connection managers, tcp_proxies and chains they
//! share are here.

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter, filter::ConfigType,
    listener_filter,
};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds,
    http_connection_manager::{
        CodecType, PathWithEscapedSlashesAction, RouteSpecifier, ServerHeaderTransformation,
        Tracing as HcmTracing, UpgradeConfig,
    },
    http_filter,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    TcpProxy,
    tcp_proxy::{
        ClusterSpecifier, TunnelingConfig, WeightedCluster as TcpWeightedCluster,
        weighted_cluster::ClusterWeight as TcpClusterWeight,
    },
};
use envoy_types::pb::envoy::r#type::v3::{
    HashPolicy as TcpHashPolicy, hash_policy::PolicySpecifier as TcpHashSpecifier,
};
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::util::pack_any;

use super::endpoint::socket_address;
use super::stat_name;
use super::{
    BLACKHOLE_CLUSTER, ads_config_source, cidr_range, optional_duration, outbound_cluster_name,
    route, sniff,
};
use api::labels_match;
use api::networking::{L4MatchAttributes, RouteDestination, VirtualServiceSpec};
use model::config::ConfigObject;
use model::egress::Egress;
use model::mesh::MeshConfig;
use model::service::AutoAddresses;
use model::{Interception, Protocol, Proxy, PushContext, Service, host_matches, resolve_host};

mod gateway;

pub(super) use self::gateway::server_host_pattern;
pub use self::gateway::{GatewayServer, gateway, has_auto_passthrough};

/// Ports a sidecar's wildcard listeners never take (its own capture and admin ports).
const RESERVED_PORTS: [u32; 4] = [15001, 15006, 15021, 15090];

/// What a view sets on every connection manager and tcp_proxy of its listeners, beyond
/// what each listener's builder put there.
#[derive(Default)]
pub(super) struct ViewSettings {
    /// istiod's `IDLE_TIMEOUT` node metadata: every connection manager's idle timeout,
    /// and that of every tcp_proxy no DestinationRule gave one (inbound, outbound,
    /// passthrough and blackhole alike).
    pub idle_timeout: Option<envoy_types::pb::google::protobuf::Duration>,
    /// The proxy's access logs ([`access_log`](super::access_log)) on every listener, and
    /// on every connection manager and tcp_proxy in them, as istiod's `AccessLogBuilder`
    /// puts it there.
    pub access_logs: Option<super::access_log::AccessLogs>,
    /// The proxy's tracing ([`tracing`](super::tracing)) on every connection manager, by
    /// its listener's side.
    pub tracing: super::tracing::Sides,
}

/// Applies `settings` to `listeners`. The idle timeout and access logs decode each filter
/// they change once; the tracing is encoded once and appended to every connection
/// manager's bytes (below).
pub(super) fn apply_view_settings(listeners: &mut [Listener], settings: &ViewSettings) {
    use envoy_types::pb::envoy::config::core::v3::HttpProtocolOptions as CommonHttpOptions;
    let ViewSettings {
        idle_timeout,
        access_logs,
        tracing,
    } = settings;
    if let Some(logs) = access_logs {
        for l in listeners.iter_mut() {
            let side = logs.side(l.traffic_direction);
            l.access_log.extend(side.listener.iter().cloned());
        }
    }
    if idle_timeout.is_some() || access_logs.is_some() {
        edit_filters(
            listeners,
            |hcm, direction| {
                if let Some(timeout) = idle_timeout {
                    let common = hcm
                        .common_http_protocol_options
                        .get_or_insert_with(CommonHttpOptions::default);
                    common.idle_timeout = Some(*timeout);
                }
                if let Some(logs) = access_logs {
                    hcm.access_log
                        .extend(logs.side(direction).core.iter().cloned());
                }
                true
            },
            |tp, direction| {
                let mut changed = false;
                if let Some(timeout) = idle_timeout
                    && tp.idle_timeout.is_none()
                {
                    tp.idle_timeout = Some(*timeout);
                    changed = true;
                }
                if let Some(logs) = access_logs {
                    let core = &logs.side(direction).core;
                    tp.access_log.extend(core.iter().cloned());
                    changed |= !core.is_empty();
                }
                changed
            },
        );
    }
    append_tracing(listeners, tracing);
}

/// `HttpConnectionManager.tracing`'s field number.
const HCM_TRACING_FIELD: u32 = 7;

/// Sets each side's tracing on every connection manager of `listeners` of that side
/// without decoding them: a message field appended to an encoded message is read as set
/// (protobuf merges repeated occurrences, and no builder sets the field). Each side is
/// encoded once.
fn append_tracing(listeners: &mut [Listener], tracing: &super::tracing::Sides) {
    use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfig;
    let encode = |t: Option<&HcmTracing>| {
        t.map(|t| {
            let mut field = Vec::new();
            prost::encoding::message::encode(HCM_TRACING_FIELD, t, &mut field);
            field
        })
    };
    let client = encode(tracing.client.as_ref());
    let server = if tracing.server == tracing.client {
        client.clone()
    } else {
        encode(tracing.server.as_ref())
    };
    for listener in listeners {
        let side = if super::is_inbound(listener.traffic_direction) {
            &server
        } else {
            &client
        };
        let Some(field) = side else {
            continue;
        };
        let chains =
            (listener.filter_chains.iter_mut()).chain(listener.default_filter_chain.iter_mut());
        for filter in chains.flat_map(|c| c.filters.iter_mut()) {
            if let (HCM, Some(FilterConfig::TypedConfig(any))) =
                (filter.name.as_str(), &mut filter.config_type)
            {
                any.value.extend_from_slice(field);
            }
        }
    }
}

/// Runs `hcm` on every HTTP connection manager of `listeners` and `tcp` on every
/// tcp_proxy, with their listener's traffic direction, encoding again those they changed
/// (they say whether they did).
fn edit_filters(
    listeners: &mut [Listener],
    mut hcm: impl FnMut(&mut HttpConnectionManager, i32) -> bool,
    mut tcp: impl FnMut(&mut TcpProxy, i32) -> bool,
) {
    use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfig;
    use prost::Message;
    for listener in listeners {
        let direction = listener.traffic_direction;
        let chains =
            (listener.filter_chains.iter_mut()).chain(listener.default_filter_chain.iter_mut());
        for filter in chains.flat_map(|c| c.filters.iter_mut()) {
            let Some(FilterConfig::TypedConfig(any)) = &mut filter.config_type else {
                continue;
            };
            match filter.name.as_str() {
                "envoy.filters.network.tcp_proxy" => {
                    let Ok(mut tp) = TcpProxy::decode(any.value.as_slice()) else {
                        continue;
                    };
                    if tcp(&mut tp, direction) {
                        *any = pack_any(tp);
                    }
                }
                HCM => {
                    let Ok(mut manager) = HttpConnectionManager::decode(any.value.as_slice())
                    else {
                        continue;
                    };
                    if hcm(&mut manager, direction) {
                        *any = pack_any(manager);
                    }
                }
                _ => {}
            }
        }
    }
}

/// Whose connection manager: a sidecar's outbound one, a sniffed listener's (which marks
/// its requests' upstream mTLS as HTTP, [`sniff::mtls_http_alpn_filter`]), or a
/// gateway's, with the AuthorizationPolicy filters that apply to the gateway first.
enum Hcm {
    Outbound,
    Sniffed,
    Gateway(Vec<HttpFilter>),
}

/// How a connection manager normalizes request paths before routing and authorization,
/// as istiod sets it from MeshConfig `pathNormalization.normalization`: `BASE` (the
/// default: RFC 3986 normalization), `NONE`, `MERGE_SLASHES` (also `//` to `/`), or
/// `DECODE_AND_MERGE_SLASHES` (also `%2F` and `%5C` decoded first). An unknown value is
/// the default (validation reports it).
#[derive(Clone, Copy)]
pub(super) struct PathNormalization {
    pub normalize_path: bool,
    pub merge_slashes: bool,
    pub escaped_slashes: PathWithEscapedSlashesAction,
}

impl PathNormalization {
    pub fn of(mesh: &MeshConfig) -> PathNormalization {
        let mode = (mesh.path_normalization.as_ref()).and_then(|p| p.normalization.as_deref());
        let (normalize_path, merge_slashes, escaped_slashes) = match mode {
            Some("NONE") => (false, false, PathWithEscapedSlashesAction::KeepUnchanged),
            Some("MERGE_SLASHES") => (true, true, PathWithEscapedSlashesAction::KeepUnchanged),
            Some("DECODE_AND_MERGE_SLASHES") => {
                (true, true, PathWithEscapedSlashesAction::UnescapeAndForward)
            }
            _ => (true, false, PathWithEscapedSlashesAction::KeepUnchanged),
        };
        PathNormalization {
            normalize_path,
            merge_slashes,
            escaped_slashes,
        }
    }

    /// Sets it on `hcm`.
    pub fn apply(self, hcm: &mut HttpConnectionManager) {
        hcm.normalize_path = Some(BoolValue {
            value: self.normalize_path,
        });
        hcm.merge_slashes = self.merge_slashes;
        hcm.path_with_escaped_slashes_action = self.escaped_slashes as i32;
    }
}

/// An HCM over RDS `route_name`.
fn http_connection_manager(
    stat_prefix: String,
    route_name: String,
    kind: Hcm,
    mesh: &MeshConfig,
) -> Filter {
    let gateway = matches!(kind, Hcm::Gateway(_));
    let (authorization, alpn) = match kind {
        Hcm::Outbound => (Vec::new(), None),
        Hcm::Sniffed => (Vec::new(), Some(sniff::mtls_http_alpn_filter())),
        Hcm::Gateway(filters) => (filters, None),
    };
    let mut hcm = HttpConnectionManager {
        stat_prefix,
        codec_type: CodecType::Auto as i32,
        route_specifier: Some(RouteSpecifier::Rds(Rds {
            config_source: Some(ads_config_source()),
            route_config_name: route_name,
        })),
        // Authorization first; routes with a VirtualService `fault` or `corsPolicy`
        // configure those filters (istiod's order: authorization, gRPC statistics,
        // fault, CORS, router).
        http_filters: authorization
            .into_iter()
            .chain([
                super::filters::grpc_stats(),
                HttpFilter {
                    name: super::filters::FAULT_FILTER.into(),
                    config_type: Some(http_filter::ConfigType::TypedConfig(
                        super::filters::filter_config(),
                    )),
                    ..Default::default()
                },
                HttpFilter {
                    name: super::filters::CORS_FILTER.into(),
                    config_type: Some(http_filter::ConfigType::TypedConfig(
                        super::filters::cors_filter_config(),
                    )),
                    ..Default::default()
                },
            ])
            .chain(alpn)
            .chain(std::iter::once(HttpFilter {
                name: "envoy.filters.http.router".into(),
                config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
                    Router::default(),
                ))),
                ..Default::default()
            }))
            .collect(),
        use_remote_address: Some(BoolValue { value: gateway }),
        upgrade_configs: vec![UpgradeConfig {
            upgrade_type: "websocket".into(),
            ..Default::default()
        }],
        server_name: if gateway {
            "istio-envoy".into()
        } else {
            String::new()
        },
        server_header_transformation: ServerHeaderTransformation::Overwrite as i32,
        request_id_extension: Some(super::tracing::request_id_extension()),
        // Streams idle for long (server streaming, long polls) stay open, as istiod's.
        stream_idle_timeout: Some(super::duration(std::time::Duration::ZERO)),
        ..Default::default()
    };
    PathNormalization::of(mesh).apply(&mut hcm);
    Filter {
        name: HCM.into(),
        config_type: Some(ConfigType::TypedConfig(pack_any(hcm))),
    }
}

const HCM: &str = "envoy.filters.network.http_connection_manager";

pub(super) fn tcp_proxy(cluster: &str) -> Filter {
    tcp_proxy_named(cluster, cluster)
}

/// A tcp_proxy to `cluster` whose stats are named `stat_prefix`.
pub(super) fn tcp_proxy_named(stat_prefix: &str, cluster: &str) -> Filter {
    tcp_proxy_to(stat_prefix, &[(cluster.to_string(), 100)], None)
}

/// A tcp_proxy to `targets` (cluster, weight): one cluster, or weighted clusters; with
/// `policy`, what the DestinationRule of the (first) destination sets on it.
fn tcp_proxy_to(stat_prefix: &str, targets: &[(String, u32)], policy: Option<TcpPolicy>) -> Filter {
    let cluster_specifier = match targets {
        [] => ClusterSpecifier::Cluster(BLACKHOLE_CLUSTER.into()),
        [(one, _)] => ClusterSpecifier::Cluster(one.clone()),
        many => ClusterSpecifier::WeightedClusters(TcpWeightedCluster {
            clusters: many
                .iter()
                .map(|(name, weight)| TcpClusterWeight {
                    name: name.clone(),
                    weight: *weight,
                    ..Default::default()
                })
                .collect(),
        }),
    };
    let policy = policy.unwrap_or_default();
    let tp = TcpProxy {
        stat_prefix: stat_prefix.to_string(),
        cluster_specifier: Some(cluster_specifier),
        idle_timeout: policy.idle_timeout,
        max_downstream_connection_duration: policy.max_connection_duration,
        hash_policy: if policy.hash_source_ip {
            vec![TcpHashPolicy {
                policy_specifier: Some(TcpHashSpecifier::SourceIp(Default::default())),
            }]
        } else {
            Vec::new()
        },
        tunneling_config: policy.tunnel,
        ..Default::default()
    };
    Filter {
        name: "envoy.filters.network.tcp_proxy".into(),
        config_type: Some(ConfigType::TypedConfig(pack_any(tp))),
    }
}

/// `host:port`, an IPv6 host in brackets (Go's `net.JoinHostPort`).
fn join_host_port(host: &str, port: u32) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// What a DestinationRule sets on a tcp_proxy, as istiod's
/// `buildOutboundNetworkFiltersWithSingleDestination` takes it: the rule's own
/// `connectionPool.tcp` `idleTimeout` and `maxConnectionDuration`, and a hash on the
/// source IP when its consistent hash uses it (a subset's load balancer, if it has one,
/// decides for the subset); and, as istiod's `tunnelingconfig.Apply`, the `tunnel` of the
/// subset's own traffic policy for a subset, else the rule's: TCP goes in an HTTP
/// `CONNECT` (or `POST`) request for `targetHost:targetPort`.
#[derive(Default)]
struct TcpPolicy {
    idle_timeout: Option<envoy_types::pb::google::protobuf::Duration>,
    max_connection_duration: Option<envoy_types::pb::google::protobuf::Duration>,
    hash_source_ip: bool,
    tunnel: Option<TunnelingConfig>,
}

impl TcpPolicy {
    fn of(ctx: &PushContext, proxy: &Proxy, host: &str, subset: &str) -> Option<TcpPolicy> {
        let rule = ctx.destination_rule_spec(proxy, host)?;
        let top = rule.traffic_policy.as_ref();
        let tcp = top.and_then(|p| p.connection_pool.as_ref()?.tcp.as_ref());
        let mut lb = top.and_then(|p| p.load_balancer.as_ref());
        let named = (rule.subsets.iter()).find(|s| s.name == subset && !subset.is_empty());
        if let Some(sub_lb) = named
            .and_then(|s| s.traffic_policy.as_ref())
            .and_then(|p| p.load_balancer.as_ref())
        {
            lb = Some(sub_lb);
        }
        let tunnel = if subset.is_empty() {
            top.and_then(|p| p.tunnel.as_ref())
        } else {
            named.and_then(|s| s.traffic_policy.as_ref()?.tunnel.as_ref())
        };
        Some(TcpPolicy {
            idle_timeout: optional_duration(tcp.and_then(|t| t.idle_timeout.as_deref())),
            max_connection_duration: optional_duration(
                tcp.and_then(|t| t.max_connection_duration.as_deref()),
            ),
            hash_source_ip: lb
                .and_then(|lb| lb.consistent_hash.as_ref())
                .is_some_and(|h| h.use_source_ip == Some(true)),
            tunnel: tunnel.map(|t| TunnelingConfig {
                hostname: join_host_port(&t.target_host, t.target_port),
                use_post: t.protocol.as_deref() == Some("POST"),
                ..Default::default()
            }),
        })
    }
}

/// The tcp_proxy of `svc`'s own cluster on `port`, with what its DestinationRule sets;
/// its stats are named after the cluster, or by MeshConfig's `outboundClusterStatName`
/// with `port_name` (istiod's TLS chains fill it with none).
fn service_tcp_proxy(
    ctx: &PushContext,
    proxy: &Proxy,
    svc: &Service,
    port: u32,
    port_name: &str,
) -> Filter {
    let host = &svc.hostname;
    let cluster = outbound_cluster_name(port, "", host);
    let target = || {
        Some(stat_name::Target {
            port_name,
            ..stat_name::Target::outbound(svc, port)
        })
    };
    let pattern = &ctx.mesh.outbound_cluster_stat_name;
    tcp_proxy_to(
        &stat_name::stat_prefix(pattern, target, &cluster),
        &[(cluster.clone(), 100)],
        TcpPolicy::of(ctx, proxy, host, ""),
    )
}

/// The tcp_proxy of the first TCP route among `vss` (in their precedence order) with a
/// match that fits; `port` is the listener's, which a destination without a port of its
/// own keeps. `None` when no route fits.
fn tcp_route_proxy<'a>(
    ctx: &PushContext,
    proxy: &Proxy,
    vss: impl IntoIterator<Item = (&'a Arc<ConfigObject>, &'a VirtualServiceSpec)>,
    port: u32,
    fits: impl Fn(&L4MatchAttributes) -> bool,
) -> Option<Filter> {
    vss.into_iter().find_map(|(obj, vs)| {
        let route =
            (vs.tcp.iter()).find(|r| r.r#match.is_empty() || r.r#match.iter().any(&fits))?;
        Some(route_proxy(ctx, proxy, obj, &route.route, port))
    })
}

/// The tcp_proxy to a TCP or TLS route's destinations (of the VirtualService `obj`). As
/// istiod's, its stats are named after the one destination cluster, or `NAME.NAMESPACE`
/// of the VirtualService for weighted ones.
fn route_proxy(
    ctx: &PushContext,
    proxy: &Proxy,
    obj: &ConfigObject,
    route: &[RouteDestination],
    port: u32,
) -> Filter {
    let single = route.len() == 1;
    let targets: Vec<(String, u32)> = route
        .iter()
        .filter_map(|d| {
            let weight = d
                .weight
                .map_or(if single { 100 } else { 0 }, |w| w.max(0) as u32);
            let host = resolve_host(&d.destination.host, &obj.key.namespace);
            let p = route::destination_port(
                ctx,
                proxy,
                &host,
                d.destination.port.as_ref().map(|p| p.number),
                port,
            );
            let subset = d.destination.subset.as_deref().unwrap_or("");
            (weight > 0).then(|| (outbound_cluster_name(p, subset, &host), weight))
        })
        .collect();
    let stat_prefix = match &targets[..] {
        [] => BLACKHOLE_CLUSTER.to_string(),
        [(one, _)] if single => {
            // The destination's service named by MeshConfig's pattern, as istiod's
            // `buildOutboundNetworkFilters` fills it: the host as the route writes it,
            // the listener's port.
            let d = &route[0].destination;
            let target = || {
                let host = resolve_host(&d.host, &obj.key.namespace);
                (ctx.service_for(proxy, &host)).map(|service| stat_name::Target {
                    host: &d.host,
                    subset: d.subset.as_deref().unwrap_or(""),
                    ..stat_name::Target::outbound(service, port)
                })
            };
            stat_name::stat_prefix(&ctx.mesh.outbound_cluster_stat_name, target, one)
        }
        [(one, _)] => one.clone(),
        _ => format!("{}.{}", obj.key.name, obj.key.namespace),
    };
    // The first destination's rule, as istiod reads it; a weighted route's subsets are
    // not told apart.
    let policy = route.first().and_then(|d| {
        let host = resolve_host(&d.destination.host, &obj.key.namespace);
        let subset = if single {
            d.destination.subset.as_deref().unwrap_or("")
        } else {
            ""
        };
        TcpPolicy::of(ctx, proxy, &host, subset)
    });
    tcp_proxy_to(&stat_prefix, &targets, policy)
}

/// Whether a TCP or TLS route's match fits a sidecar's connection to `port` from `proxy`
/// (with `labels`): every field it sets, `gateways` naming `mesh` if any.
fn l4_fits(
    m: &L4MatchAttributes,
    port: u32,
    labels: &BTreeMap<String, String>,
    proxy: &Proxy,
) -> bool {
    m.port.is_none_or(|p| p == 0 || p == port)
        && labels_match(&m.source_labels, labels)
        && (m.source_namespace.as_ref()).is_none_or(|ns| *ns == proxy.namespace)
        && (m.gateways.is_empty() || m.gateways.iter().any(|g| g == "mesh"))
}

/// The VirtualServices bound to `mesh` for `svc`'s host that `egress` imports.
fn sidecar_routes<'a>(
    ctx: &'a PushContext,
    proxy: &Proxy,
    egress: &Egress,
    svc: &Service,
) -> impl Iterator<Item = (&'a Arc<ConfigObject>, &'a VirtualServiceSpec)> {
    let host = svc.hostname.clone();
    ctx.virtual_services_of(proxy, egress)
        .into_iter()
        .filter(move |(obj, vs)| {
            vs.hosts
                .iter()
                .any(|h| host_matches(&resolve_host(h, &obj.key.namespace), &host))
        })
}

/// The chains of a sidecar's outbound TCP listener for `svc`'s `port`, as istiod's
/// `buildSidecarOutboundTCPFilterChainOpts`: the TCP routes of the VirtualServices for the
/// host, in their precedence order, whose matches fit the proxy and port. A route that
/// fits with a match naming no `destinationSubnets` (or with no match) takes every other
/// connection and ends the list; one whose fitting matches all name subnets gets a chain
/// matched on them (a route for `10.1.0.0/16`, another for the rest). Without a route for
/// every connection, the service's own cluster takes them.
fn sidecar_tcp_chains(
    ctx: &PushContext,
    proxy: &Proxy,
    egress: &Egress,
    svc: &Service,
    port: u32,
) -> Vec<Chain> {
    let labels = ctx.proxy_labels(proxy);
    let mut chains = Vec::new();
    for (obj, vs) in sidecar_routes(ctx, proxy, egress, svc) {
        for route in vs.tcp.iter().filter(|r| !r.route.is_empty()) {
            let fitting = || (route.r#match.iter()).filter(|m| l4_fits(m, port, labels, proxy));
            let filter = || route_proxy(ctx, proxy, obj, &route.route, port);
            if route.r#match.is_empty() || fitting().any(|m| m.destination_subnets.is_empty()) {
                chains.push(Chain::any(filter()));
                return chains;
            }
            let mut subnets: Vec<String> = fitting()
                .flat_map(|m| m.destination_subnets.iter().cloned())
                .collect();
            if !subnets.is_empty() {
                subnets.sort();
                subnets.dedup();
                chains.push(Chain::to_subnets(subnets, filter()));
            }
        }
    }
    let port_name = stat_name::port_name(svc, port);
    chains.push(Chain::any(service_tcp_proxy(
        ctx, proxy, svc, port, port_name,
    )));
    chains
}

/// One filter chain of a listener before assembly: the SNI names and the destination
/// CIDRs it matches (none: every connection) and its network filter.
#[derive(Clone)]
struct Chain {
    server_names: Vec<String>,
    destination_cidrs: Vec<String>,
    filter: Filter,
}

impl Chain {
    /// A chain matching every connection.
    fn any(filter: Filter) -> Chain {
        Chain::sni(Vec::new(), filter)
    }

    /// A chain matching these SNI names.
    fn sni(server_names: Vec<String>, filter: Filter) -> Chain {
        Chain {
            server_names,
            destination_cidrs: Vec::new(),
            filter,
        }
    }

    /// A chain matching connections to these destination CIDRs, a route's
    /// `destinationSubnets`.
    fn to_subnets(destination_cidrs: Vec<String>, filter: Filter) -> Chain {
        Chain {
            server_names: Vec::new(),
            destination_cidrs,
            filter,
        }
    }

    /// Whether it matches every connection.
    fn matches_all(&self) -> bool {
        self.server_names.is_empty() && self.destination_cidrs.is_empty()
    }

    /// Whether it matches the same connections as `other`.
    fn same_match(&self, other: &Chain) -> bool {
        self.server_names == other.server_names && self.destination_cidrs == other.destination_cidrs
    }
}

/// The chains of a sidecar's outbound listener for `svc`'s TLS `port` (protocol TLS or
/// HTTPS), as istiod's `buildSidecarOutboundTLSFilterChainOpts`: one per distinct SNI
/// match of the `tls` routes (of the VirtualServices for the host) that fits the proxy
/// and port, to that route's destinations. Without one, the service's own cluster,
/// matched on its hostname when the listener is not the service's own address
/// (`wildcard`), so that services without an address can share a port.
fn sidecar_tls_chains(
    ctx: &PushContext,
    proxy: &Proxy,
    egress: &Egress,
    svc: &Service,
    port: u32,
    wildcard: bool,
) -> Vec<Chain> {
    let labels = ctx.proxy_labels(proxy);
    let mut chains: Vec<Chain> = Vec::new();
    for (obj, vs) in sidecar_routes(ctx, proxy, egress, svc) {
        for route in vs.tls.iter().filter(|r| !r.route.is_empty()) {
            for m in &route.r#match {
                if !l4_fits(&m.to_l4(), port, labels, proxy) {
                    continue;
                }
                let filter = route_proxy(ctx, proxy, obj, &route.route, port);
                let chain = Chain {
                    server_names: m.sni_hosts.clone(),
                    destination_cidrs: m.destination_subnets.clone(),
                    filter,
                };
                if !chains.iter().any(|c| c.same_match(&chain)) {
                    chains.push(chain);
                }
            }
        }
    }
    if chains.is_empty() {
        let names = if wildcard {
            vec![svc.hostname.clone()]
        } else {
            Vec::new()
        };
        chains.push(Chain::sni(
            names,
            service_tcp_proxy(ctx, proxy, svc, port, ""),
        ));
    }
    chains
}

/// A sidecar's outbound TCP or TLS listener from its chains, as istiod assembles one: a
/// lone chain matching every connection is the only chain; next to chains that match on
/// SNI or on destination CIDRs it becomes the default chain; without one, unmatched
/// connections take `PassthroughFilterChain` to `fallthrough`. SNI matches need the TLS inspector; chains
/// matched on destination CIDRs do not.
fn outbound_listener(
    bind: &str,
    port: u32,
    bind_to_port: bool,
    chains: Vec<Chain>,
    fallthrough: &str,
) -> Listener {
    let mut l = listener(
        bind,
        port,
        bind_to_port,
        TrafficDirection::Outbound,
        Vec::new(),
    );
    l.filter_chains.clear();
    let (match_all, matching): (Vec<Chain>, Vec<Chain>) =
        chains.into_iter().partition(Chain::matches_all);
    if matching.is_empty() {
        l.filter_chains = (match_all.into_iter().take(1)).map(filter_chain).collect();
        return l;
    }
    if matching.iter().any(|c| !c.server_names.is_empty()) {
        l.listener_filters = vec![tls_inspector()];
    }
    l.filter_chains = (matching.into_iter()).map(filter_chain).collect();
    l.default_filter_chain = Some(default_chain(match_all, fallthrough));
    l
}

/// The default chain of a listener with chains that match: the first chain matching every
/// connection, else `PassthroughFilterChain` to `fallthrough`.
fn default_chain(match_all: Vec<Chain>, fallthrough: &str) -> FilterChain {
    match match_all.into_iter().next() {
        Some(c) => filter_chain(c),
        None => FilterChain {
            name: "PassthroughFilterChain".into(),
            filter_chain_match: Some(FilterChainMatch::default()),
            filters: vec![tcp_proxy(fallthrough)],
            ..Default::default()
        },
    }
}

/// A filter chain of one network filter, matching the chain's SNI names and destination
/// CIDRs (if any).
fn filter_chain(c: Chain) -> FilterChain {
    let prefix_ranges = c.destination_cidrs.iter().map(|r| cidr_range(r)).collect();
    FilterChain {
        filter_chain_match: (!c.matches_all()).then(|| FilterChainMatch {
            server_names: c.server_names,
            prefix_ranges,
            ..Default::default()
        }),
        filters: vec![c.filter],
        ..Default::default()
    }
}

fn tls_inspector() -> ListenerFilter {
    ListenerFilter {
        name: "envoy.filters.listener.tls_inspector".into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(pack_any(
            TlsInspector::default(),
        ))),
        ..Default::default()
    }
}

fn listener(
    bind: &str,
    port: u32,
    bind_to_port: bool,
    direction: TrafficDirection,
    filters: Vec<Filter>,
) -> Listener {
    Listener {
        name: format!("{bind}_{port}"),
        address: Some(socket_address(bind, port)),
        bind_to_port: Some(BoolValue {
            value: bind_to_port,
        }),
        traffic_direction: direction as i32,
        filter_chains: vec![FilterChain {
            filters,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// A sidecar's outbound listeners and their route configurations.
pub fn sidecar(
    ctx: &PushContext,
    proxy: &Proxy,
    services: &[&Arc<Service>],
) -> (Vec<Listener>, Vec<RouteConfiguration>) {
    let (listeners, http_routes) = sidecar_listeners(ctx, proxy, services);
    let routes = http_routes
        .iter()
        .map(|r| route::sidecar(ctx, proxy, r))
        .collect();
    (listeners, routes)
}

/// The services of one sidecar route configuration: `"PORT"`, every HTTP service of the
/// port, or a sniffed listener's own `HOST:PORT` (`sniffed`: its one service); and the
/// egress listener whose VirtualServices route them.
pub struct RouteServices<'a> {
    pub port: u32,
    pub sniffed: Option<&'a Arc<Service>>,
    pub services: Vec<&'a Arc<Service>>,
    pub egress: Egress<'a>,
}

impl RouteServices<'_> {
    /// The route configuration's name, as the listener's RDS names it.
    pub fn name(&self) -> String {
        match self.sniffed {
            Some(svc) => format!("{}:{}", svc.hostname, self.port),
            None => self.port.to_string(),
        }
    }
}

/// One outbound listener of a sidecar before assembly.
struct Outbound {
    bind: String,
    port: u32,
    bind_to_port: bool,
    /// The route configuration its HTTP traffic takes; none: TCP only.
    rds: Option<String>,
    /// HTTP shares the listener with other traffic, told apart by the HTTP inspector.
    sniffed: bool,
    chains: Vec<Chain>,
    /// Made by an egress listener with a port: the catch-all adds nothing to it, as
    /// istiod's `outboundListenerEntry.locked`.
    locked: bool,
}

impl Outbound {
    /// Services sharing a listener (no address of their own, or a real bind) share its
    /// chains; of two that match the same, the first stays.
    fn add(&mut self, chains: Vec<Chain>) {
        for c in chains {
            if !(self.chains.iter()).any(|h| h.same_match(&c)) {
                self.chains.push(c);
            }
        }
    }
}

/// Where one egress listener's listeners bind, as istiod's `listenerBinding`: its `bind`,
/// else, bound for real (a proxy without capture, or `captureMode: NONE`), the loopback
/// address (the proxy's IP with its `MESHD_OUTBOUND_BIND_INSTANCE_IP`); none: the
/// service's address or 0.0.0.0, not bound for real.
struct Binding {
    bind: Option<String>,
    bind_to_port: bool,
    /// The auto-allocated addresses the proxy knows ServiceEntries by.
    auto: AutoAddresses,
}

impl Binding {
    fn of(proxy: &Proxy, egress: &Egress) -> Binding {
        let captured = proxy.interception != Interception::None;
        let bind_to_port = !captured || egress.capture_none();
        let local = || match proxy.outbound_bind_instance_ip {
            true => proxy.ip().to_string(),
            false => proxy.local_host().to_string(),
        };
        let bind = (egress.bind().map(str::to_string)).or_else(|| bind_to_port.then(local));
        Binding {
            bind,
            bind_to_port,
            auto: proxy.auto_addresses,
        }
    }

    /// The address of listeners services share (HTTP ports, services without an address).
    fn shared(&self) -> &str {
        self.bind.as_deref().unwrap_or("0.0.0.0")
    }

    /// The address of `svc`'s own sniffed listener.
    fn own<'s>(&'s self, svc: &'s Service) -> &'s str {
        (self.bind.as_deref())
            .or(svc.address_for(self.auto))
            .unwrap_or("0.0.0.0")
    }

    /// Where `svc`'s TCP and TLS chains go: the bind, else a listener at each of its
    /// addresses, a CIDR's on the shared address matched on the CIDR (as istiod gives a
    /// ServiceEntry one service per address), else the shared address.
    fn own_listeners<'s>(&'s self, svc: &'s Service) -> Vec<(&'s str, Option<&'s str>)> {
        if let Some(bind) = &self.bind {
            return vec![(bind, None)];
        }
        let addresses = (svc.address_for(self.auto).into_iter())
            .chain(svc.more_addresses.iter().map(String::as_str));
        let on = |a: &'s str| {
            if a.contains('/') {
                ("0.0.0.0", Some(a))
            } else {
                (a, None)
            }
        };
        let out: Vec<(&str, Option<&str>)> = addresses.map(on).collect();
        if out.is_empty() {
            vec![("0.0.0.0", None)]
        } else {
            out
        }
    }

    /// Whether the proxy knows `svc` by no address (a TLS service is then told apart by
    /// SNI alone).
    fn addressless(&self, svc: &Service) -> bool {
        svc.address_for(self.auto).is_none()
    }

    /// Whether the TCP of `svc`'s sniffed port on the shared listener goes to the
    /// service rather than to its original destination: on a real bind, or when the
    /// proxy knows the service by no address (a headless Service, a ServiceEntry without
    /// addresses), as istiod's `0.0.0.0_PORT` listener for it takes it (of two such
    /// services on a port, the first). A CIDR's chain is not added: matched on the
    /// destination before the HTTP inspector's protocol, it would take the HTTP too.
    fn tcp_to_service(&self, svc: &Service) -> bool {
        self.bind.is_some() || self.addressless(svc)
    }

    /// Whether `svc` has a listener of its own, at an IP address (not a CIDR).
    fn own_address(&self, svc: &Service) -> bool {
        self.bind.is_none() && svc.address_for(self.auto).is_some_and(|a| !a.contains('/'))
    }
}

/// A sidecar's outbound listeners by `BIND_PORT` and the route configurations they name,
/// as they are assembled, egress listener by egress listener.
struct SidecarOutbound<'a, 'p> {
    ctx: &'a PushContext,
    proxy: &'p Proxy,
    listeners: BTreeMap<String, Outbound>,
    routes: Vec<RouteServices<'a>>,
}

impl<'a> SidecarOutbound<'a, '_> {
    /// The listener at `bind`:`port`, made if new; `None` when it is locked.
    fn at(&mut self, bind: &str, port: u32, bind_to_port: bool) -> Option<&mut Outbound> {
        let o = (self.listeners.entry(format!("{bind}_{port}"))).or_insert_with(|| Outbound {
            bind: bind.to_string(),
            port,
            bind_to_port,
            rds: None,
            sniffed: false,
            chains: Vec::new(),
            locked: false,
        });
        (!o.locked).then_some(o)
    }

    /// Adds `svc`'s TCP or TLS `chains` on `port` to each of its own listeners
    /// ([`Binding::own_listeners`]).
    fn add_own(&mut self, binding: &Binding, svc: &Service, port: u32, mut chains: Vec<Chain>) {
        let mut listeners = binding.own_listeners(svc).into_iter().peekable();
        while let Some((bind, cidr)) = listeners.next() {
            let Some(o) = self.at(bind, port, binding.bind_to_port) else {
                continue;
            };
            // The chains are copied only for a service with several addresses.
            let mut chains = match listeners.peek() {
                Some(_) => chains.clone(),
                None => std::mem::take(&mut chains),
            };
            // A route's own `destinationSubnets` stand in for the service's CIDR.
            for c in chains.iter_mut().filter(|c| c.destination_cidrs.is_empty()) {
                c.destination_cidrs = cidr.map(str::to_string).into_iter().collect();
            }
            o.add(chains);
        }
    }

    /// The listeners of an egress listener with a port, as istiod builds one for each
    /// service it imports: HTTP on the shared address with route configuration `"PORT"`
    /// (the services that have the port; the first listener with the port names its
    /// services), TCP and TLS on each service's own address to the service's only port
    /// (or this one, if it has several), and a port without a protocol sniffed on the
    /// shared address.
    fn port_listener(
        &mut self,
        egress: Egress<'a>,
        binding: &Binding,
        (port, protocol): (u32, Protocol),
        imported: &[&'a Arc<Service>],
    ) {
        let (ctx, proxy) = (self.ctx, self.proxy);
        let bind_to_port = binding.bind_to_port;
        for svc in imported {
            let target = match svc.ports.as_slice() {
                [only] => only.port,
                _ => port,
            };
            match protocol {
                Protocol::Tcp => {
                    let chains = sidecar_tcp_chains(ctx, proxy, &egress, svc, target);
                    self.add_own(binding, svc, port, chains);
                }
                Protocol::Tls | Protocol::Https => {
                    let by_host = binding.addressless(svc);
                    let chains = sidecar_tls_chains(ctx, proxy, &egress, svc, target, by_host);
                    self.add_own(binding, svc, port, chains);
                }
                _ => {
                    // Sniffed on a real bind, or for a service without an address, other
                    // traffic goes to the service (as the catch-all's), not to an original
                    // destination.
                    let sniffed = protocol == Protocol::Unknown;
                    let tcp = (sniffed && binding.tcp_to_service(svc))
                        .then(|| sidecar_tcp_chains(ctx, proxy, &egress, svc, target));
                    if let Some(o) = self.at(binding.shared(), port, bind_to_port) {
                        o.sniffed |= sniffed || !o.chains.is_empty();
                        o.rds = Some(port.to_string());
                        if let Some(chains) = tcp {
                            o.add(chains);
                        }
                    }
                }
            }
        }
        let http = protocol.is_http() && !imported.is_empty();
        if http && !(self.routes.iter()).any(|r| r.sniffed.is_none() && r.port == port) {
            self.routes.push(RouteServices {
                port,
                sniffed: None,
                services: (imported.iter().copied())
                    .filter(|s| s.port(port).is_some())
                    .collect(),
                egress,
            });
        }
    }

    /// The catch-all egress listener's listeners: every port of every service it imports,
    /// but nothing on a listener one with a port made, and no HTTP service into a route
    /// configuration `"PORT"` one with a port named.
    fn catch_all(&mut self, egress: Egress<'a>, binding: &Binding, imported: &[&'a Arc<Service>]) {
        for o in self.listeners.values_mut() {
            o.locked = true;
        }
        let (ctx, proxy) = (self.ctx, self.proxy);
        let bind_to_port = binding.bind_to_port;
        // A listener of its own at the service's address (not a shared or real bind).
        let named: Vec<u32> = self.routes.iter().map(|r| r.port).collect();
        let mut http_ports: BTreeMap<u32, Vec<&'a Arc<Service>>> = BTreeMap::new();
        for svc in imported {
            for p in &svc.ports {
                if RESERVED_PORTS.contains(&p.port) {
                    continue;
                }
                let tcp = || sidecar_tcp_chains(ctx, proxy, &egress, svc, p.port);
                match p.protocol {
                    Protocol::Unknown if binding.own_address(svc) => {
                        let route = RouteServices {
                            port: p.port,
                            sniffed: Some(svc),
                            services: vec![svc],
                            egress,
                        };
                        let Some(o) = self.at(binding.own(svc), p.port, bind_to_port) else {
                            continue;
                        };
                        o.rds = Some(route.name());
                        o.sniffed = true;
                        o.add(tcp());
                        self.routes.push(route);
                    }
                    Protocol::Unknown => {
                        let Some(o) = self.at(binding.shared(), p.port, bind_to_port) else {
                            continue;
                        };
                        o.sniffed = true;
                        if binding.tcp_to_service(svc) {
                            o.add(tcp());
                        }
                        http_ports.entry(p.port).or_default().push(svc);
                    }
                    protocol if protocol.is_http() => {
                        http_ports.entry(p.port).or_default().push(svc);
                    }
                    Protocol::Tcp => self.add_own(binding, svc, p.port, tcp()),
                    Protocol::Tls | Protocol::Https => {
                        let by_host = binding.addressless(svc);
                        let chains = sidecar_tls_chains(ctx, proxy, &egress, svc, p.port, by_host);
                        self.add_own(binding, svc, p.port, chains);
                    }
                    _ => {}
                }
            }
        }
        for (port, services) in http_ports {
            let Some(o) = self.at(binding.shared(), port, bind_to_port) else {
                continue;
            };
            o.rds = Some(port.to_string());
            if !named.contains(&port) {
                self.routes.push(RouteServices {
                    port,
                    sniffed: None,
                    services,
                    egress,
                });
            }
        }
    }
}

/// A sidecar's outbound listeners, and the route configurations they name. Each egress
/// listener of its Sidecar ([`Egress`]) takes the services it imports: those with a port
/// first (`SidecarOutbound::port_listener`), then the catch-all on every port of its
/// services (`SidecarOutbound::catch_all`). Ports follow istiod's
/// `buildSidecarOutboundListener`:
/// - HTTP ports share `0.0.0.0_PORT` and its route configuration `"PORT"`;
/// - TCP and TLS ports get the service's own `VIP_PORT` (`0.0.0.0_PORT` without an
///   address);
/// - an undeclared protocol is sniffed: the service's `VIP_PORT` takes HTTP, told apart by
///   the HTTP inspector, to its own route configuration `HOST:PORT`, and everything else
///   as TCP. Without an address (or without capture) the service's HTTP joins `"PORT"`
///   on the shared listener, which sniffs and sends other traffic to the service;
/// - a listener that HTTP and TCP services would both take sniffs too.
pub fn sidecar_listeners<'a>(
    ctx: &'a PushContext,
    proxy: &Proxy,
    services: &[&'a Arc<Service>],
) -> (Vec<Listener>, Vec<RouteServices<'a>>) {
    let mut outbound = SidecarOutbound {
        ctx,
        proxy,
        listeners: BTreeMap::new(),
        routes: Vec::new(),
    };
    for egress in ctx.egress_listeners(proxy) {
        if !egress.translated() {
            continue;
        }
        let imported: Vec<&'a Arc<Service>> = (services.iter().copied())
            .filter(|s| egress.imports(&proxy.namespace, &s.namespace, &s.hostname))
            .collect();
        let binding = Binding::of(proxy, &egress);
        match egress.port() {
            Some(port) => outbound.port_listener(egress, &binding, port, &imported),
            None => outbound.catch_all(egress, &binding, &imported),
        }
    }
    let fallthrough = super::unknown_destination(ctx, proxy);
    let fallthrough = fallthrough.as_deref().unwrap_or(BLACKHOLE_CLUSTER);
    let mut listeners: Vec<Listener> = (outbound.listeners.into_values())
        .map(|o| match o.rds {
            None => outbound_listener(&o.bind, o.port, o.bind_to_port, o.chains, fallthrough),
            Some(rds) if !o.sniffed && o.chains.is_empty() => {
                let name = format!("{}_{}", o.bind, o.port);
                let prefix = format!("outbound_{name}");
                let hcm = http_connection_manager(prefix, rds, Hcm::Outbound, &ctx.mesh);
                let direction = TrafficDirection::Outbound;
                listener(&o.bind, o.port, o.bind_to_port, direction, vec![hcm])
            }
            Some(rds) => {
                let (bind, port, bound) = (&o.bind, o.port, o.bind_to_port);
                sniffed_listener(bind, port, bound, rds, o.chains, fallthrough, &ctx.mesh)
            }
        })
        .collect();
    if proxy.interception != Interception::None {
        let mut virtual_outbound = listener(
            "0.0.0.0",
            15001,
            true,
            TrafficDirection::Outbound,
            vec![tcp_proxy(fallthrough)],
        );
        virtual_outbound.name = "virtualOutbound".into();
        virtual_outbound.filter_chains[0].name = "virtualOutbound-catchall-tcp".into();
        virtual_outbound.use_original_dst = Some(BoolValue { value: true });
        listeners.push(virtual_outbound);
    }
    (listeners, outbound.routes)
}

/// A sniffed outbound listener, as istiod's `buildListenerFromEntry` assembles one: the
/// HTTP chain matches what the HTTP inspector reports for plaintext HTTP; chains matching
/// on SNI (with the TLS inspector) stay; a chain matching every connection becomes the
/// default chain, else `PassthroughFilterChain` to `fallthrough`. The inspectors wait for
/// the client's first bytes for MeshConfig `protocolDetectionTimeout`; with no limit
/// (unset, as istiod's default), a protocol where the server speaks first does not work
/// on a sniffed port.
fn sniffed_listener(
    bind: &str,
    port: u32,
    bind_to_port: bool,
    rds: String,
    chains: Vec<Chain>,
    fallthrough: &str,
    mesh: &MeshConfig,
) -> Listener {
    let mut l = outbound_listener(bind, port, bind_to_port, Vec::new(), fallthrough);
    let prefix = format!("outbound_{}", l.name);
    let hcm = http_connection_manager(prefix, rds, Hcm::Sniffed, mesh);
    let (match_all, matching): (Vec<Chain>, Vec<Chain>) =
        chains.into_iter().partition(Chain::matches_all);
    if matching.iter().any(|c| !c.server_names.is_empty()) {
        l.listener_filters.push(tls_inspector());
    }
    l.listener_filters.push(sniff::http_inspector());
    l.listener_filters_timeout = Some(super::duration(sniff::detection_timeout(mesh)));
    l.continue_on_listener_filters_timeout = true;
    l.filter_chains = (matching.into_iter()).map(filter_chain).collect();
    l.filter_chains.push(FilterChain {
        filter_chain_match: Some(FilterChainMatch {
            transport_protocol: "raw_buffer".into(),
            application_protocols: sniff::alpns(&sniff::PLAINTEXT_HTTP_ALPNS),
            ..Default::default()
        }),
        filters: vec![hcm],
        ..Default::default()
    });
    l.default_filter_chain = Some(default_chain(match_all, fallthrough));
    l
}
