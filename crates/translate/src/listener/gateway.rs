//! LDS for gateways: one listener per server port of the Gateways that select the proxy
//! (`0.0.0.0_PORT`), with RDS `http.PORT` for HTTP servers, SNI-matched chains for HTTPS,
//! terminated TLS, PASSTHROUGH and AUTO_PASSTHROUGH servers, and a tcp_proxy for TCP.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use envoy_api::pb::envoy::config::core::v3::TrafficDirection;
use envoy_api::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter,
};

use super::{
    Chain, HCM, Hcm, filter_chain, http_connection_manager, listener, route_proxy, tcp_proxy_named,
    tcp_route_proxy, tls_inspector,
};
use crate::credentials::{self, CredentialUse, ServerTls};
use crate::{authz, cluster, route, sniff, stat_name};
use api::networking::{L4MatchAttributes, VirtualServiceSpec};
use model::config::ConfigObject;
use model::topology::GatewayTopology;
use model::{Proxy, PushContext, Service, host_matches};

/// A Gateway server that takes TLS: an HTTPS server terminating it (with its route
/// configuration's name), a TLS server terminating it before a TCP route, or a
/// PASSTHROUGH server routing it by SNI.
enum TlsServer {
    Https(GatewayServer, ServerTls, String),
    Terminated(TcpServer, ServerTls),
    Passthrough(TcpServer),
    /// AUTO_PASSTHROUGH: a chain per SNI-DNAT cluster the server's hosts cover.
    AutoPassthrough(TcpServer),
}

/// A TCP or TLS server of a Gateway: `gateway` (`namespace/name`), its hosts and its
/// port.
struct TcpServer {
    gateway: String,
    hosts: Vec<String>,
    port: u32,
}

impl From<GatewayServer> for TcpServer {
    fn from(s: GatewayServer) -> TcpServer {
        TcpServer {
            gateway: s.gateway,
            hosts: s.hosts,
            port: s.port,
        }
    }
}

/// The VirtualServices bound to a TCP or TLS server's Gateway with a host the server
/// admits (istiod's `pickMatchingGatewayHosts`).
fn gateway_routes<'a>(
    ctx: &'a PushContext,
    proxy: &Proxy,
    server: &'a TcpServer,
) -> impl Iterator<Item = (&'a Arc<ConfigObject>, &'a VirtualServiceSpec)> {
    let gw_ns = server.gateway.split_once('/').map_or("", |(ns, _)| ns);
    ctx.virtual_services_for(proxy, &server.gateway)
        .into_iter()
        .filter(move |(obj, vs)| {
            vs.hosts.iter().any(|vs_host| {
                server.hosts.iter().any(|server_host| {
                    server_host_pattern(server_host, &obj.key.namespace, gw_ns)
                        .is_some_and(|pattern| host_matches(pattern, vs_host))
                })
            })
        })
}

/// The host pattern of a Gateway server host (`ns/host`, `./host`, `*/host` or `host`)
/// when its namespace part admits VirtualServices of `vs_ns` (`.` is the Gateway's own
/// namespace `gw_ns`); `None` when it does not.
pub(crate) fn server_host_pattern<'h>(
    server_host: &'h str,
    vs_ns: &str,
    gw_ns: &str,
) -> Option<&'h str> {
    let (ns, pattern) = server_host.split_once('/').unwrap_or(("*", server_host));
    (ns == "*" || ns == vs_ns || (ns == "." && vs_ns == gw_ns)).then_some(pattern)
}

/// Whether a TCP or TLS route's match fits a gateway's server: at a gateway only the port
/// and the `gateways` named count (istiod's `l4SingleMatch`; `sourceLabels` apply only to
/// `mesh`).
fn gateway_l4_fits(m: &L4MatchAttributes, server: &TcpServer) -> bool {
    let gw_name = server.gateway.split_once('/').map_or("", |(_, n)| n);
    m.port.is_none_or(|p| p == 0 || p == server.port)
        && (m.gateways.is_empty()
            || (m.gateways.iter()).any(|g| *g == server.gateway || g == gw_name))
}

/// The tcp_proxy of a gateway's TCP server: the first TCP route of the VirtualServices
/// bound to its Gateway, for a host the server admits, whose match fits the server
/// (istiod's `buildGatewayNetworkFiltersFromTCPRoutes`); `None` without one (the server
/// gets no listener).
fn gateway_tcp_proxy(ctx: &PushContext, proxy: &Proxy, server: &TcpServer) -> Option<Filter> {
    let fits = |m: &L4MatchAttributes| gateway_l4_fits(m, server);
    tcp_route_proxy(
        ctx,
        proxy,
        gateway_routes(ctx, proxy, server),
        server.port,
        fits,
    )
}

/// The chains of a gateway's PASSTHROUGH server: one per `tls` route match (of the
/// VirtualServices bound to its Gateway, for a host it admits) that fits the server,
/// matching the route's SNI names and forwarding the connection, still encrypted, to the
/// route's destinations (istiod's `buildGatewayNetworkFiltersFromTLSRoutes`). A match
/// naming an SNI host an earlier chain on the port (`taken`) already holds is skipped, as
/// istiod skips it: Envoy refuses two chains with the same match.
fn gateway_tls_chains(
    ctx: &PushContext,
    proxy: &Proxy,
    server: &TcpServer,
    taken: &mut HashSet<String>,
) -> Vec<FilterChain> {
    let mut chains = Vec::new();
    for (obj, vs) in gateway_routes(ctx, proxy, server) {
        for route in vs.tls.iter().filter(|r| !r.route.is_empty()) {
            for m in &route.r#match {
                if !gateway_l4_fits(&m.to_l4(), server)
                    || m.sni_hosts.iter().any(|h| taken.contains(h))
                {
                    continue;
                }
                taken.extend(m.sni_hosts.iter().cloned());
                let filter = route_proxy(ctx, proxy, obj, &route.route, server.port);
                chains.push(filter_chain(Chain::sni(m.sni_hosts.clone(), filter)));
            }
        }
    }
    chains
}

/// The chains of an AUTO_PASSTHROUGH server, as istiod's
/// `builtAutoPassthroughFilterChains`: for every port of every mesh service the server's
/// hosts cover, and every subset of its DestinationRule, one chain matching the SNI
/// `outbound_.PORT_.SUBSET_.HOST` and Istio's mTLS ALPNs, forwarding the still-encrypted
/// connection to the SNI-DNAT cluster of that name ([`cluster::sni_dnat`]). Only
/// Istio mTLS clients reach a workload this way.
fn auto_passthrough_chains(
    ctx: &PushContext,
    proxy: &Proxy,
    server: &TcpServer,
    services: &[&Arc<Service>],
    taken: &mut HashSet<String>,
) -> Vec<FilterChain> {
    let hosts: Vec<&str> = (server.hosts.iter())
        .map(|h| h.split_once('/').map_or(h.as_str(), |(_, host)| host))
        .collect();
    let alpns: Vec<String> = (sniff::MTLS_TCP_ALPNS.iter())
        .chain(&sniff::MTLS_HTTP_ALPNS)
        .map(|a| a.to_string())
        .collect();
    let mut chains = Vec::new();
    let covered = |svc: &Service| hosts.iter().any(|h| host_matches(h, &svc.hostname));
    for svc in services.iter().filter(|s| !s.mesh_external && covered(s)) {
        let rule = ctx.service_rule(proxy, svc);
        let subsets = (rule.and_then(|r| model::destination_rule::spec(r)))
            .map(|d| {
                d.subsets
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        for port in &svc.ports {
            for subset in std::iter::once("").chain(subsets.iter().copied()) {
                let sni = cluster::mtls_sni(port.port, subset, &svc.hostname);
                if !taken.insert(sni.clone()) {
                    continue;
                }
                let target = || {
                    Some(stat_name::Target {
                        subset,
                        ..stat_name::Target::outbound(svc, port.port)
                    })
                };
                let pattern = &ctx.mesh.outbound_cluster_stat_name;
                let stat_prefix = stat_name::stat_prefix(pattern, target, &sni);
                chains.push(FilterChain {
                    filter_chain_match: Some(FilterChainMatch {
                        server_names: vec![sni.clone()],
                        application_protocols: alpns.clone(),
                        ..Default::default()
                    }),
                    filters: vec![tcp_proxy_named(&stat_prefix, &sni)],
                    ..Default::default()
                });
            }
        }
    }
    chains
}

/// Whether a Gateway selecting `proxy` has an AUTO_PASSTHROUGH server: the gateway then
/// gets the SNI-DNAT clusters its chains forward to.
pub fn has_auto_passthrough(ctx: &PushContext, proxy: &Proxy) -> bool {
    (ctx.gateways_for(proxy).into_iter())
        .flat_map(|(_, gw)| &gw.servers)
        .any(auto_passthrough)
}

fn auto_passthrough(server: &api::networking::Server) -> bool {
    server.port.protocol.eq_ignore_ascii_case("TLS")
        && (server.tls.as_ref())
            .is_some_and(|t| api::values::server_tls_mode(t) == "AUTO_PASSTHROUGH")
}

/// One HTTP server of a Gateway, as the route builder needs it.
pub struct GatewayServer {
    /// `namespace/name` of the Gateway.
    pub gateway: String,
    pub hosts: Vec<String>,
    /// The port as the Gateway declares it (virtual host names and `match.port` use it).
    pub port: u32,
    /// `tls.httpsRedirect`: its virtual hosts redirect every request to HTTPS.
    pub https_redirect: bool,
}

/// A gateway's listeners: one per server port of the Gateways that select it, on the port
/// the gateway's own Service maps that port to. HTTP servers share `http.PORT`; each HTTPS
/// server with a `credentialName` gets its own SNI-matched chain and route
/// `https.PORT.PORTNAME.GATEWAY.NAMESPACE`, and a TLS one a chain to its TCP route, only
/// for a gateway with a proven identity (the credentials those chains use come back with
/// them); PASSTHROUGH servers get a chain per SNI match of their TLS routes; TCP servers a
/// tcp_proxy.
pub fn gateway(
    ctx: &PushContext,
    proxy: &Proxy,
    services: &[&Arc<Service>],
) -> (Vec<Listener>, Vec<route::GatewayRoute>, Vec<CredentialUse>) {
    // The AuthorizationPolicies selecting the gateway guard its listeners, as istiod's do:
    // every connection manager, and every chain without one.
    let authorization = authz::Authorization::for_proxy(ctx, proxy);
    let topology = gateway_topology(ctx, proxy);
    let mut http_servers: BTreeMap<u32, Vec<GatewayServer>> = BTreeMap::new();
    let mut tls_servers: BTreeMap<u32, Vec<TlsServer>> = BTreeMap::new();
    let mut tcp_servers: BTreeMap<u32, Vec<TcpServer>> = BTreeMap::new();
    for (gw_obj, gw) in ctx.gateways_for(proxy) {
        for server in &gw.servers {
            let protocol = server.port.protocol.to_ascii_uppercase();
            let listen_port = ctx.gateway_listen_port(proxy, server.port.number);
            let gs = GatewayServer {
                gateway: gw_obj.key.namespaced_name(),
                hosts: server.hosts.clone(),
                port: server.port.number,
                https_redirect: api::values::https_redirect(server.tls.as_ref()),
            };
            let tls_mode = server.tls.as_ref().map(api::values::server_tls_mode);
            // Credentials go only to a gateway with a proven identity.
            let credential = || {
                (proxy.identity.as_ref()).and_then(|_| {
                    ServerTls::from_server(server.tls.as_ref(), &proxy.namespace, &ctx.mesh)
                })
            };
            let tls_server = match protocol.as_str() {
                // A `tls` block here is only `httpsRedirect` (validation refuses more).
                "HTTP" | "HTTP2" | "GRPC" => {
                    http_servers.entry(listen_port).or_default().push(gs);
                    continue;
                }
                "TCP" if server.tls.is_none() => {
                    tcp_servers.entry(listen_port).or_default().push(gs.into());
                    continue;
                }
                "TLS" if auto_passthrough(server) => TlsServer::AutoPassthrough(gs.into()),
                "TLS" | "HTTPS"
                    if tls_mode.as_deref().unwrap_or("PASSTHROUGH") == "PASSTHROUGH" =>
                {
                    TlsServer::Passthrough(gs.into())
                }
                "HTTPS" => {
                    let Some(tls) = credential() else { continue };
                    let mut route_name = format!(
                        "https.{}.{}.{}.{}",
                        server.port.number, server.port.name, gw_obj.key.name, gw_obj.key.namespace
                    );
                    if let Some(bind) = &server.bind {
                        route_name.push_str(&format!(".{bind}"));
                    }
                    TlsServer::Https(gs, tls, route_name)
                }
                "TLS" => {
                    let Some(tls) = credential() else { continue };
                    TlsServer::Terminated(gs.into(), tls)
                }
                _ => continue,
            };
            tls_servers.entry(listen_port).or_default().push(tls_server);
        }
    }
    let mut listeners = Vec::new();
    let mut routes = Vec::new();
    let mut credentials = Vec::new();
    for (port, servers) in &mut http_servers {
        if tls_servers.contains_key(port) {
            continue; // one socket per port: the TLS servers take it
        }
        let name = format!("0.0.0.0_{port}");
        let hcm = http_connection_manager(
            format!("outbound_{name}"),
            format!("http.{port}"),
            Hcm::Gateway(authorization.http.clone(), topology),
            &ctx.mesh,
        );
        listeners.push(listener(
            "0.0.0.0",
            *port,
            true,
            TrafficDirection::Outbound,
            vec![hcm],
        ));
        routes.push(route::GatewayRoute {
            name: format!("http.{port}"),
            listen_port: *port,
            servers: std::mem::take(servers),
        });
    }
    // The TLS servers of a port share its listener, their chains told apart by SNI.
    for (port, servers) in tls_servers {
        let name = format!("0.0.0.0_{port}");
        let mut chains = Vec::new();
        let mut taken = HashSet::new();
        for server in servers {
            match server {
                TlsServer::Https(server, tls, route_name) => {
                    let hcm = http_connection_manager(
                        format!("outbound_{name}"),
                        route_name.clone(),
                        Hcm::Gateway(authorization.http.clone(), topology),
                        &ctx.mesh,
                    );
                    chains.push(credentials::https_chain(&server.hosts, &tls, vec![hcm]));
                    routes.push(route::GatewayRoute {
                        name: route_name,
                        listen_port: port,
                        servers: vec![server],
                    });
                    credentials.extend(tls.credential_use());
                }
                // TLS terminated here, then forwarded where the server's TCP route says
                // (istiod's `createGatewayTCPFilterChainOpts`); no chain without one.
                TlsServer::Terminated(server, tls) => {
                    if let Some(filter) = gateway_tcp_proxy(ctx, proxy, &server) {
                        let mut filters = vec![filter];
                        // Behind ISTIO_MUTUAL the client is a mesh workload: istio-proxy
                        // learns who from the metadata exchange, first in the chain.
                        if proxy.istio_extensions && matches!(tls, ServerTls::Mesh { .. }) {
                            filters.insert(0, crate::istio_proxy::network_mx_filter(ctx));
                        }
                        chains.push(credentials::https_chain(&server.hosts, &tls, filters));
                        credentials.extend(tls.credential_use());
                    }
                }
                TlsServer::Passthrough(server) => {
                    chains.extend(gateway_tls_chains(ctx, proxy, &server, &mut taken));
                }
                TlsServer::AutoPassthrough(server) => {
                    let found = auto_passthrough_chains(ctx, proxy, &server, services, &mut taken);
                    chains.extend(found);
                }
            }
        }
        if chains.is_empty() {
            continue; // no server with a route: no listener, as with istiod
        }
        let mut l = listener(
            "0.0.0.0",
            port,
            true,
            TrafficDirection::Outbound,
            Vec::new(),
        );
        l.filter_chains = chains;
        l.listener_filters = vec![tls_inspector()];
        listeners.push(l);
    }
    // A port HTTP or HTTPS servers hold is theirs; of the TCP servers on a port, the
    // first with a route takes it.
    for (port, servers) in tcp_servers {
        let name = format!("0.0.0.0_{port}");
        if listeners.iter().any(|l| l.name == name) {
            continue;
        }
        if let Some(filter) = servers
            .iter()
            .find_map(|s| gateway_tcp_proxy(ctx, proxy, s))
        {
            listeners.push(listener(
                "0.0.0.0",
                port,
                true,
                TrafficDirection::Outbound,
                vec![filter],
            ));
        }
    }
    for chain in listeners
        .iter_mut()
        .flat_map(|l| l.filter_chains.iter_mut())
    {
        chain.transport_socket_connect_timeout = super::handshake_timeout();
    }
    if !authorization.tcp.is_empty() {
        let chains = listeners
            .iter_mut()
            .flat_map(|l| l.filter_chains.iter_mut());
        for chain in chains.filter(|c| !c.filters.iter().any(|f| f.name == HCM)) {
            // After the metadata exchange, whose peer the policies may match.
            let mx = crate::istio_proxy::MX_FILTER;
            let at = usize::from(chain.filters.first().is_some_and(|f| f.name == mx));
            chain
                .filters
                .splice(at..at, authorization.tcp.iter().cloned());
        }
    }
    // Behind a load balancer that speaks the PROXY protocol, its header comes first.
    if topology.proxy_protocol {
        for l in &mut listeners {
            l.listener_filters.insert(0, proxy_protocol());
        }
    }
    (listeners, routes, credentials)
}

/// The `gatewayTopology` a gateway runs with: that of the `PROXY_CONFIG` it sent, else
/// MeshConfig `defaultConfig`'s (istiod's `ProxyConfigOrDefault`; an invalid one there is
/// reported by validation and read as none).
pub(crate) fn gateway_topology(ctx: &PushContext, proxy: &Proxy) -> GatewayTopology {
    proxy.gateway_topology.unwrap_or_else(|| {
        (ctx.mesh.default_config.gateway_topology())
            .ok()
            .flatten()
            .unwrap_or_default()
    })
}

/// The PROXY protocol listener filter (v1 and v2 headers), as istiod's.
fn proxy_protocol() -> ListenerFilter {
    use envoy_api::pb::envoy::extensions::filters::listener::proxy_protocol::v3::ProxyProtocol;
    super::listener_filter(
        "envoy.filters.listener.proxy_protocol",
        ProxyProtocol::default(),
    )
}
