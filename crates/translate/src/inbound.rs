//! A sidecar's inbound side, from its Sidecar resource's `ingress` listeners (how Istio
//! serves a proxy without traffic capture): a real listener `BIND_PORT` per ingress port,
//! whose filter chains follow the port's effective PeerAuthentication mode
//!
//! - STRICT: one chain, mutual TLS only (a plaintext client is refused);
//! - PERMISSIVE: a TLS chain and a plaintext chain, told apart by the TLS inspector;
//! - DISABLE: plaintext only;
//!
//! (a port without a declared protocol has an HTTP and a TCP chain of each kind, see
//! `sniffed_chains`), each with the AuthorizationPolicies' filters (CUSTOM's external
//! authorization, then RBAC), then (HTTP) an HCM that forwards the peer's identity in
//! `x-forwarded-client-cert` to the application and routes to the `inbound|PORT||`
//! cluster of the ingress `defaultEndpoint`.

use envoy_api::pb::envoy::config::cluster::v3::cluster::LbPolicy;
use envoy_api::pb::envoy::config::cluster::v3::{
    Cluster,
    cluster::{ClusterDiscoveryType, DiscoveryType},
};
use envoy_api::pb::envoy::config::core::v3::{Address, Pipe, TrafficDirection, address};
use envoy_api::pb::envoy::config::core::v3::{
    BindConfig, SocketAddress, socket_address::PortSpecifier,
};
use envoy_api::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint::HostIdentifier,
};
use envoy_api::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, filter::ConfigType,
};
use envoy_api::pb::envoy::config::route::v3::{
    Decorator, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
    route::Action,
    route_action::{ClusterSpecifier, MaxStreamDuration},
    route_match::PathSpecifier,
};
use envoy_api::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_api::pb::envoy::extensions::filters::listener::original_dst::v3::OriginalDst;
use envoy_api::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter,
    http_connection_manager::{
        CodecType, ForwardClientCertDetails, RouteSpecifier, ServerHeaderTransformation,
        SetCurrentClientCertDetails, UpgradeConfig,
    },
    http_filter,
};
use envoy_api::pb::google::protobuf::{BoolValue, UInt32Value};
use envoy_api::util::pack_any;

use super::endpoint::socket_address;
use super::listener::{tcp_proxy, tcp_proxy_named};
use super::stat_name;
use super::{authz, duration, sniff, tls};
use api::networking::SidecarSpec;
use api::networking::{HttpRetry, IstioIngressListener};
use model::destination_rule;
use model::mesh::MeshConfig;
use model::security::Mtls;
use model::service::AutoAddresses;
use model::{Interception, Protocol, Proxy, PushContext, Service, ServicePort};
use std::collections::BTreeMap;

/// Istio's inbound cluster name: `inbound|PORT||`.
pub fn inbound_cluster_name(port: u32) -> String {
    format!("inbound|{port}||")
}

/// Where an ingress listener's traffic goes: `defaultEndpoint` as an address.
fn default_endpoint(ingress: &IstioIngressListener) -> Option<Address> {
    let text = ingress.default_endpoint.as_deref()?;
    if let Some(path) = text.strip_prefix("unix://") {
        return Some(Address {
            address: Some(address::Address::Pipe(Pipe {
                path: path.into(),
                ..Default::default()
            })),
        });
    }
    let (host, port) = text.rsplit_once(':')?;
    let port: u32 = port.parse().ok()?;
    let host = if host == "0.0.0.0" { "127.0.0.1" } else { host };
    Some(socket_address(host, port))
}

/// The service an inbound cluster serves, as istiod picks it: the first service (by host)
/// selecting the proxy with that target port, the service port the DestinationRule's
/// `portLevelSettings` are looked up by, and the port's protocol.
#[derive(Clone, Copy)]
struct Served<'a> {
    service: &'a Service,
    port: u32,
    port_name: &'a str,
    protocol: Protocol,
}

impl<'a> Served<'a> {
    /// What MeshConfig's `inboundClusterStatName` is filled with for it; `target_port`
    /// as [`stat_name::Target::target_port`].
    fn stat_target(self, target_port: Option<u32>) -> stat_name::Target<'a> {
        stat_name::Target {
            port_name: self.port_name,
            target_port,
            ..stat_name::Target::outbound(self.service, self.port)
        }
    }
}

/// The `inbound|PORT||` cluster `c` of workload port `port`, named in Envoy's stats by
/// MeshConfig's `inboundClusterStatName` when a service serves it (istiod's
/// `buildInboundCluster`).
fn with_stat_name(mut c: Cluster, ctx: &PushContext, port: u32, served: Option<Served>) -> Cluster {
    let pattern = &ctx.mesh.inbound_cluster_stat_name;
    let target = || served.map(|s| s.stat_target(Some(port)));
    c.alt_stat_name = stat_name::alt_stat_name(pattern, target, &c.name);
    c
}

/// An `inbound|PORT||` cluster's connection pool and circuit breakers, as istiod's
/// `buildInboundCluster` sets them: the Sidecar's pool for the port
/// (`ingress[].connectionPool`, else `inboundConnectionPool`, istiod's
/// `InboundConnectionPoolForPort`) replaces the served service's DestinationRule pool
/// (as it applies to the service port; a rule with a workload selector never applies
/// inbound), else the rule's, else istiod's default circuit breakers. The rule, when its
/// policy is used, is named in the cluster's `istio.config` metadata. An inbound cluster
/// is never upgraded to HTTP/2 (`h2UpgradePolicy` is outbound only). Its connect timeout
/// is the pool's, else MeshConfig's ([`connection_pool`](super::pool::connection_pool)).
/// InboundPassthroughCluster gets none of this, only the mesh's connect timeout.
/// `services`, the services on the port, go in the cluster's `istio` metadata for Istio's
/// stats filter ([`telemetry_services`]).
fn with_pool(
    mut c: Cluster,
    ctx: &PushContext,
    proxy: &Proxy,
    sidecar: Option<&SidecarSpec>,
    port: u32,
    served: Option<Served>,
    services: &[&Service],
) -> Cluster {
    let sidecar_pool = sidecar.and_then(|s| {
        (s.ingress.iter())
            .filter(|i| i.port.number == port)
            .find_map(|i| i.connection_pool.as_ref())
            .or(s.inbound_connection_pool.as_ref())
    });
    let rule = served.and_then(|s| {
        let svc = s.service;
        let rule = (ctx.destination_rules).choose_inbound(
            &proxy.namespace,
            &svc.hostname,
            &svc.namespace,
        )?;
        let policy = destination_rule::spec(rule)?.traffic_policy.as_ref()?;
        Some((rule, super::policy::effective(Some(policy), None, s.port)?))
    });
    let mut metadata = Vec::new();
    if !services.is_empty() {
        metadata.push(super::cluster::services_metadata(services));
    }
    if let Some((rule, _)) = &rule {
        metadata.push(("config", super::string_value(rule.istio_config_path())));
    }
    if !metadata.is_empty() {
        c.metadata = Some(super::istio_metadata(metadata));
    }
    let rule_pool = rule.as_ref().and_then(|(_, p)| p.connection_pool.as_ref());
    let pool = sidecar_pool.or(rule_pool).map(|p| {
        let mut p = p.clone();
        if let Some(http) = p.http.as_mut() {
            http.h2_upgrade_policy = None;
        }
        p
    });
    let mut http = None;
    super::pool::connection_pool(&mut c, pool.as_ref(), &mut http, (&ctx.mesh, false));
    super::pool::attach_http(&mut c, http);
    c
}

/// The services an inbound cluster names for Istio's stats filter, as istiod's
/// `addTelemetryMetadata`: those of `selecting` with the served service port reaching
/// `target` on the workload, none when the first is outside the mesh.
fn telemetry_services<'a>(
    selecting: &[&'a Service],
    target: u32,
    served: Served,
) -> Vec<&'a Service> {
    if served.service.mesh_external {
        return Vec::new();
    }
    (selecting.iter().copied())
        .filter(|svc| {
            (svc.ports.iter()).any(|p| p.port == served.port && target_port(svc, p) == target)
        })
        .collect()
}

/// The ports `svc`'s ports reach on its workloads (`target_port`): what a sidecar's
/// inbound listeners and clusters take from the service's endpoints, and nothing else.
pub fn workload_ports(svc: &Service) -> Vec<u32> {
    svc.ports.iter().map(|p| target_port(svc, p)).collect()
}

/// The port a service port reaches on the workload: `targetPort`, else what the
/// endpoints say, else the service port.
fn target_port(svc: &Service, p: &ServicePort) -> u32 {
    p.target_port
        .or_else(|| {
            svc.endpoints
                .iter()
                .find_map(|e| e.ports.get(&p.port).copied())
        })
        .unwrap_or(p.port)
}

fn inbound_cluster(name: &str, target: Address) -> Cluster {
    Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: name.to_string(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                        address: Some(target),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The route of an inbound port's connection manager, as istiod's
/// `BuildDefaultHTTPInboundRoute`: everything to `cluster`, with no timeout and
/// `grpc-timeout` honoured uncapped; requests reset before they reach the application
/// are retried twice (or as MeshConfig's `defaultInboundHttpRetryPolicy` says,
/// [`super::route::inbound_retry_policy`]), except on gRPC ports (it breaks streaming).
/// The virtual host and the span's operation name the service port `served` says, when
/// a service serves it.
fn inbound_route(
    port: u32,
    cluster: &str,
    served: Option<&Served>,
    retries: Option<&HttpRetry>,
) -> RouteConfiguration {
    let service_port = served.map_or(port, |s| s.port);
    let grpc = served.is_some_and(|s| s.protocol == Protocol::Grpc);
    let no_timeout = || Some(duration(std::time::Duration::ZERO));
    let route = Route {
        name: "default".into(),
        r#match: Some(RouteMatch {
            path_specifier: Some(PathSpecifier::Prefix("/".into())),
            ..Default::default()
        }),
        action: Some(Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.to_string())),
            timeout: no_timeout(),
            max_stream_duration: Some(MaxStreamDuration {
                max_stream_duration: no_timeout(),
                grpc_timeout_header_max: no_timeout(),
                ..Default::default()
            }),
            retry_policy: if grpc {
                None
            } else {
                super::route::inbound_retry_policy(retries)
            },
            ..Default::default()
        })),
        // No service: `:PORT/*` (`:0/*` for the catch-all), as istiod writes it.
        decorator: Some(Decorator {
            operation: match served {
                Some(s) => format!("{}:{}/*", s.service.hostname, s.port),
                None => format!(":{port}/*"),
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    RouteConfiguration {
        name: cluster.to_string(),
        validate_clusters: Some(BoolValue { value: false }),
        virtual_hosts: vec![VirtualHost {
            name: format!("inbound|http|{service_port}"),
            domains: vec!["*".into()],
            routes: vec![route],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn inbound_hcm(
    stat_prefix: &str,
    port: u32,
    cluster: &str,
    served: Option<&Served>,
    mesh: &MeshConfig,
    rbac: Vec<HttpFilter>,
) -> Filter {
    let retries = mesh.default_inbound_http_retry_policy.as_ref();
    let route = inbound_route(port, cluster, served, retries);
    let mut http_filters = rbac;
    http_filters.push(super::filters::grpc_stats());
    http_filters.push(HttpFilter {
        name: "envoy.filters.http.router".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
            Router::default(),
        ))),
        ..Default::default()
    });
    let mut hcm = HttpConnectionManager {
        stat_prefix: stat_name::delimited(stat_prefix),
        codec_type: CodecType::Auto as i32,
        route_specifier: Some(RouteSpecifier::RouteConfig(route)),
        http_filters,
        use_remote_address: Some(BoolValue { value: false }),
        forward_client_cert_details: ForwardClientCertDetails::AppendForward as i32,
        set_current_client_cert_details: Some(SetCurrentClientCertDetails {
            subject: Some(BoolValue { value: true }),
            uri: true,
            dns: true,
            ..Default::default()
        }),
        // WebSocket upgrades reach the application, as through istiod's inbound.
        upgrade_configs: vec![UpgradeConfig {
            upgrade_type: "websocket".into(),
            ..Default::default()
        }],
        server_name: "istio-envoy".into(),
        server_header_transformation: ServerHeaderTransformation::Overwrite as i32,
        request_id_extension: Some(super::tracing::request_id_extension()),
        // Streams idle for long (server streaming, long polls) stay open, as istiod's.
        stream_idle_timeout: Some(duration(std::time::Duration::ZERO)),
        // `Expect: 100-continue` reaches the application, as istiod's.
        proxy_100_continue: true,
        ..Default::default()
    };
    super::listener::PathNormalization::of(mesh).apply(&mut hcm);
    Filter {
        name: "envoy.filters.network.http_connection_manager".into(),
        config_type: Some(ConfigType::TypedConfig(pack_any(hcm))),
    }
}

/// A chain that closes every connection: RBAC allowing nothing, in front of the black hole.
fn refuse_all(cluster: &str) -> FilterChain {
    FilterChain {
        name: format!("{cluster}-refused"),
        filter_chain_match: Some(FilterChainMatch::default()),
        filters: vec![
            authz::deny_all_network_filter(),
            tcp_proxy(super::BLACKHOLE_CLUSTER),
        ],
        ..Default::default()
    }
}

/// How an inbound port serves its traffic: by its declared protocol, or sniffed when none
/// is declared. Ordered so that of several services on one port, HTTP wins over sniffing,
/// and sniffing over TCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Serve {
    Tcp,
    Sniffed,
    Http,
}

impl Serve {
    fn of(protocol: Protocol) -> Serve {
        match protocol {
            Protocol::Unknown => Serve::Sniffed,
            p if p.is_http() => Serve::Http,
            _ => Serve::Tcp,
        }
    }
}

/// The chains serving one inbound port under its effective mTLS mode, each with the
/// proxy's `authorization` filters, then an HCM (HTTP, its stats under `hcm_stats`) or
/// tcp_proxy to `cluster`; a sniffed
/// port has both, told apart by [`sniffed_chains`]. `destination_port` narrows them to one
/// port of a shared listener (virtualInbound).
#[allow(clippy::too_many_arguments)]
fn port_chains(
    ctx: &PushContext,
    proxy: &Proxy,
    authorization: &authz::Authorization,
    port: u32,
    serve: Serve,
    cluster: &str,
    hcm_stats: &str,
    destination_port: Option<u32>,
    served: Option<Served>,
) -> Vec<FilterChain> {
    let filters = |http: bool| -> Vec<Filter> {
        if http {
            let http_filters = authorization.http.clone();
            let served = served.as_ref();
            let mesh = &ctx.mesh;
            vec![inbound_hcm(
                hcm_stats,
                port,
                cluster,
                served,
                mesh,
                http_filters,
            )]
        } else {
            let mut f = authorization.tcp.clone();
            // istiod's `BuildInboundStatPrefix` leaves `%TARGET_PORT%` as written.
            let target = || served.map(|s| s.stat_target(None));
            let pattern = &ctx.mesh.inbound_cluster_stat_name;
            let stat_prefix = stat_name::stat_prefix(pattern, target, cluster);
            f.push(tcp_proxy_named(&stat_prefix, cluster));
            f
        }
    };
    let matching = |transport: &str, alpns: &[&str]| {
        Some(FilterChainMatch {
            transport_protocol: transport.into(),
            application_protocols: sniff::alpns(alpns),
            destination_port: destination_port.map(|p| UInt32Value { value: p }),
            ..Default::default()
        })
    };
    let mesh_tls = model::tls::TlsParams::mesh_inbound(&ctx.mesh);
    let chain = |name: &str, transport: &str, alpns: &[&str], http: bool, tls: bool| FilterChain {
        name: format!("{cluster}-{name}"),
        filter_chain_match: matching(transport, alpns),
        transport_socket: tls.then(|| tls::downstream(http, &mesh_tls)),
        filters: filters(http),
        ..Default::default()
    };
    let mode = ctx.mtls_mode(proxy, port).mode;
    // A proxy without a proven identity has no certificate to serve TLS with: it gets
    // the plaintext chains, and under STRICT one that refuses everything (never open).
    let secure = proxy.identity.is_some();
    if serve == Serve::Sniffed && (secure || mode != Mtls::Strict) {
        return sniffed_chains(mode, secure, chain);
    }
    let http = serve == Serve::Http;
    let plaintext = chain("plaintext", "raw_buffer", &[], http, false);
    // Under PERMISSIVE, only TLS with a mesh client's ALPN is mutual TLS; a TCP port passes
    // other TLS to the application still encrypted, an HTTP port refuses it (istiod's
    // `inboundPermissive{HTTP,TCP}FilterChainMatchWithMxcOptions`).
    match (mode, secure) {
        (Mtls::Strict, true) => vec![chain("mtls", "tls", &[], http, true)],
        (Mtls::Strict, false) => {
            let mut refused = refuse_all(cluster);
            refused.filter_chain_match = matching("", &[]);
            vec![refused]
        }
        (Mtls::Permissive, true) => {
            let mut chains = vec![chain("mtls", "tls", &sniff::ALL_MTLS_ALPNS, http, true)];
            if !http {
                chains.push(chain("tls", "tls", &[], false, false));
            }
            chains.push(plaintext);
            chains
        }
        (Mtls::Permissive, false) | (Mtls::Disable, _) => vec![plaintext],
    }
}

/// A sniffed port's chains, as istiod's `inbound*FilterChainMatchOptions` for a port
/// without a declared protocol: HTTP by what the HTTP inspector reports for plaintext, or
/// by the mesh client's HTTP ALPN over mutual TLS; everything else as TCP. Under PERMISSIVE
/// a TLS connection without the mesh's ALPN is forwarded still encrypted (a client with
/// no sidecar speaking TLS to the application). `chain(name, transport, alpns, http,
/// terminate_tls)` builds one.
fn sniffed_chains(
    mode: Mtls,
    secure: bool,
    chain: impl Fn(&str, &str, &[&str], bool, bool) -> FilterChain,
) -> Vec<FilterChain> {
    let mtls_http = || chain("mtls-http", "tls", &sniff::MTLS_HTTP_ALPNS, true, true);
    let plaintext = || {
        [
            chain(
                "plaintext-http",
                "raw_buffer",
                &sniff::PLAINTEXT_HTTP_ALPNS,
                true,
                false,
            ),
            chain("plaintext-tcp", "raw_buffer", &[], false, false),
        ]
    };
    match (mode, secure) {
        (Mtls::Strict, _) => vec![mtls_http(), chain("mtls-tcp", "tls", &[], false, true)],
        (Mtls::Permissive, true) => {
            let mut chains = vec![
                mtls_http(),
                chain("mtls-tcp", "tls", &sniff::MTLS_TCP_ALPNS, false, true),
            ];
            chains.extend(plaintext());
            chains.push(chain("tls", "tls", &[], false, false));
            chains
        }
        (Mtls::Permissive, false) | (Mtls::Disable, _) => plaintext().into(),
    }
}

fn tls_inspected(
    name: String,
    address: Address,
    bind_to_port: bool,
    chains: Vec<FilterChain>,
    original_dst: bool,
    mesh: &MeshConfig,
) -> Listener {
    let mut listener_filters = Vec::new();
    if original_dst {
        let config = OriginalDst::default();
        listener_filters.push(crate::listener::listener_filter(
            "envoy.filters.listener.original_dst",
            config,
        ));
    }
    let config = TlsInspector::default();
    listener_filters.push(crate::listener::listener_filter(
        "envoy.filters.listener.tls_inspector",
        config,
    ));
    // The HTTP inspector when a plaintext chain matches what it reports (a sniffed port).
    let sniffing = chains
        .iter()
        .filter_map(|c| c.filter_chain_match.as_ref())
        .any(|m| m.transport_protocol == "raw_buffer" && !m.application_protocols.is_empty());
    let mut timeout = std::time::Duration::ZERO;
    if sniffing {
        listener_filters.push(sniff::http_inspector());
        timeout = sniff::detection_timeout(mesh);
    }
    Listener {
        name,
        address: Some(address),
        bind_to_port: Some(BoolValue {
            value: bind_to_port,
        }),
        traffic_direction: TrafficDirection::Inbound as i32,
        listener_filters,
        listener_filters_timeout: Some(duration(timeout)),
        continue_on_listener_filters_timeout: true,
        filter_chains: chains,
        max_connections_to_accept_per_socket_event: bind_to_port.then(super::listener::accept_one),
        ..Default::default()
    }
}

/// The inbound listeners and clusters of a sidecar: its Sidecar's `ingress` listeners if
/// it has any, else (with traffic capture) `virtualInbound` for the ports of the Services
/// that select it.
pub fn sidecar(ctx: &PushContext, proxy: &Proxy) -> (Vec<Listener>, Vec<Cluster>) {
    let sidecar = ctx.sidecar_for(proxy).map(|(_, s)| s);
    let ingress = sidecar.map(|s| s.ingress.as_slice()).unwrap_or_default();
    if ingress.is_empty() {
        if proxy.interception == Interception::None {
            return (Vec::new(), Vec::new()); // Istio: no inbound from Services without capture
        }
        return virtual_inbound(ctx, proxy);
    }
    let authorization = authz::Authorization::for_proxy(ctx, proxy);
    let selecting: Vec<&Service> = ctx.services_selecting(proxy).map(|s| &**s).collect();
    let mut listeners = Vec::new();
    let mut clusters = Vec::new();
    for ingress in ingress {
        let Some(target) = default_endpoint(ingress) else {
            continue; // validation reports it
        };
        let port = ingress.port.number;
        let protocol = Protocol::parse(if ingress.port.protocol.is_empty() {
            &ingress.port.name
        } else {
            &ingress.port.protocol
        });
        let bind = ingress.bind.clone().unwrap_or_else(|| {
            if proxy.interception == Interception::None {
                proxy.ip().to_string()
            } else {
                "0.0.0.0".to_string()
            }
        });
        let name = format!("{bind}_{port}");
        let cluster = inbound_cluster_name(port);
        // istiod's `findOrCreateService`: the service whose target port is the ingress
        // port, with the ingress port as its service port.
        let served = (selecting.iter().copied())
            .find(|svc| svc.ports.iter().any(|p| target_port(svc, p) == port))
            .map(|service| Served {
                service,
                port,
                port_name: &ingress.port.name,
                protocol,
            });
        let c = with_stat_name(inbound_cluster(&cluster, target), ctx, port, served);
        // istiod's one target for an ingress listener: the service found, if any.
        let services: Vec<&Service> = (served.iter())
            .filter(|s| !s.service.mesh_external)
            .map(|s| s.service)
            .collect();
        clusters.push(with_pool(c, ctx, proxy, sidecar, port, served, &services));
        let chains = port_chains(
            ctx,
            proxy,
            &authorization,
            port,
            Serve::of(protocol),
            &cluster,
            &format!("inbound_{name}"),
            None,
            served,
        );
        let bind_to_port = proxy.interception == Interception::None
            || ingress.capture_mode.as_deref() == Some("NONE");
        listeners.push(tls_inspected(
            name,
            socket_address(&bind, port),
            bind_to_port,
            chains,
            false,
            &ctx.mesh,
        ));
    }
    (listeners, clusters)
}

/// Istio's inbound capture port and passthrough cluster.
pub const VIRTUAL_INBOUND_PORT: u32 = 15006;
pub const INBOUND_PASSTHROUGH_CLUSTER: &str = "InboundPassthroughCluster";

/// An ORIGINAL_DST cluster that connects from 127.0.0.6, so the iptables rules let the
/// connection through to the application (Istio's default inbound policy, PASSTHROUGH).
fn original_dst_cluster(name: &str) -> Cluster {
    Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(
            DiscoveryType::OriginalDst as i32,
        )),
        lb_policy: LbPolicy::ClusterProvided as i32,
        upstream_bind_config: Some(BindConfig {
            source_address: Some(SocketAddress {
                address: "127.0.0.6".into(),
                port_specifier: Some(PortSpecifier::PortValue(0)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The longest duration Envoy takes (whole seconds of `i64` nanoseconds, ~292 years;
/// protobuf's own limit is out of Envoy's range), istiod's `maxSecondsValue`: "never".
const MAX_DURATION_SECONDS: i64 = (i64::MAX - 999_999_999) / 1_000_000_000;

/// With MeshConfig `inboundTrafficPolicy.mode: LOCALHOST`, the address an application is
/// reached at: loopback (`::1` for a proxy with IPv6 addresses only), for applications
/// that listen there rather than on the pod's IP, as istiod's inbound clusters do in that
/// mode. `None` in the default PASSTHROUGH mode: the connection's original destination.
fn localhost_mode(ctx: &PushContext, proxy: &Proxy) -> Option<&'static str> {
    let mode = (ctx.mesh.inbound_traffic_policy.as_ref()).and_then(|p| p.mode.as_deref());
    if !mode.is_some_and(|m| m.eq_ignore_ascii_case("LOCALHOST")) {
        return None;
    }
    Some(match proxy.ip_families() {
        AutoAddresses::Ipv6 => "::1",
        _ => "127.0.0.1",
    })
}

/// `virtualInbound` on 15006 (traffic capture): a blackhole chain for 15006 itself, chains
/// per target port of the Services that select the proxy, and passthrough chains for any
/// other port, all under the PeerAuthentication mode of their port.
fn virtual_inbound(ctx: &PushContext, proxy: &Proxy) -> (Vec<Listener>, Vec<Cluster>) {
    let sidecar = ctx.sidecar_for(proxy).map(|(_, s)| s);
    let localhost = localhost_mode(ctx, proxy);
    let authorization = authz::Authorization::for_proxy(ctx, proxy);
    // Per target port: how it is served, and the first service.
    let mut ports: BTreeMap<u32, (Serve, Served)> = BTreeMap::new();
    let selecting: Vec<&Service> = ctx.services_selecting(proxy).map(|s| &**s).collect();
    for svc in selecting.iter().copied() {
        for p in &svc.ports {
            let target = target_port(svc, p);
            let entry = ports.entry(target).or_insert_with(|| {
                let served = Served {
                    service: svc,
                    port: p.port,
                    port_name: &p.name,
                    protocol: p.protocol,
                };
                (Serve::Tcp, served)
            });
            entry.0 = entry.0.max(Serve::of(p.protocol));
        }
    }
    let mut chains = vec![FilterChain {
        name: "virtualInbound-blackhole".into(),
        filter_chain_match: Some(FilterChainMatch {
            destination_port: Some(UInt32Value {
                value: VIRTUAL_INBOUND_PORT,
            }),
            ..Default::default()
        }),
        filters: vec![tcp_proxy(super::BLACKHOLE_CLUSTER)],
        ..Default::default()
    }];
    let mut passthrough = original_dst_cluster(INBOUND_PASSTHROUGH_CLUSTER);
    // istiod builds both passthrough clusters alike: their stats share one name.
    passthrough.alt_stat_name = stat_name::delimited(super::PASSTHROUGH_CLUSTER);
    passthrough.connect_timeout = Some(super::pool::mesh_connect_timeout(&ctx.mesh));
    super::pool::passthrough(&mut passthrough);
    let mut clusters = vec![passthrough];
    for (port, (serve, served)) in ports {
        if port == VIRTUAL_INBOUND_PORT {
            continue;
        }
        let cluster = inbound_cluster_name(port);
        let c = match localhost {
            Some(ip) => inbound_cluster(&cluster, socket_address(ip, port)),
            None => {
                let mut c = original_dst_cluster(&cluster);
                // Its hosts are never cleaned up, as istiod's: the application's address
                // does not change.
                c.cleanup_interval = Some(envoy_api::pb::google::protobuf::Duration {
                    seconds: MAX_DURATION_SECONDS,
                    nanos: 0,
                });
                c
            }
        };
        let c = with_stat_name(c, ctx, port, Some(served));
        let services = telemetry_services(&selecting, port, served);
        clusters.push(with_pool(
            c,
            ctx,
            proxy,
            sidecar,
            port,
            Some(served),
            &services,
        ));
        let stat = format!("inbound_0.0.0.0_{port}");
        chains.extend(port_chains(
            ctx,
            proxy,
            &authorization,
            port,
            serve,
            &cluster,
            &stat,
            Some(port),
            Some(served),
        ));
    }
    // Any other port: passed through under the workload's own mode, HTTP told apart as
    // on a port without a declared protocol (istiod's `virtualInbound-catchall-http`), so
    // HTTP authorization rules and request metrics apply to it.
    chains.extend(port_chains(
        ctx,
        proxy,
        &authorization,
        0,
        Serve::Sniffed,
        INBOUND_PASSTHROUGH_CLUSTER,
        // Named by its cluster, as istiod names the catch-all's connection manager.
        INBOUND_PASSTHROUGH_CLUSTER,
        None,
        None,
    ));
    let listener = tls_inspected(
        "virtualInbound".into(),
        socket_address("0.0.0.0", VIRTUAL_INBOUND_PORT),
        true,
        chains,
        true,
        &ctx.mesh,
    );
    (vec![listener], clusters)
}
