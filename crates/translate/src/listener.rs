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

use envoy_api::pb::envoy::config::core::v3::TrafficDirection;
use envoy_api::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter, filter::ConfigType,
    listener_filter,
};
use envoy_api::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_api::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds,
    http_connection_manager::{
        CodecType, ForwardClientCertDetails, PathWithEscapedSlashesAction, RouteSpecifier,
        ServerHeaderTransformation, SetCurrentClientCertDetails, Tracing as HcmTracing,
        UpgradeConfig,
    },
    http_filter,
};
use envoy_api::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    TcpProxy,
    tcp_proxy::{
        ClusterSpecifier, TunnelingConfig, WeightedCluster as TcpWeightedCluster,
        weighted_cluster::ClusterWeight as TcpClusterWeight,
    },
};
use envoy_api::pb::envoy::r#type::v3::{
    HashPolicy as TcpHashPolicy, hash_policy::PolicySpecifier as TcpHashSpecifier,
};
use envoy_api::pb::google::protobuf::{BoolValue, UInt32Value};
use envoy_api::util::pack_any;

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
mod hcm;
mod tcp;

pub(crate) use self::hcm::*;
pub(crate) use self::tcp::*;

pub(super) use self::gateway::server_host_pattern;
pub use self::gateway::{GatewayServer, gateway, has_auto_passthrough};

/// Ports a sidecar's wildcard listeners never take (its own capture and admin ports).
const RESERVED_PORTS: [u32; 4] = [15001, 15006, 15021, 15090];

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
            name: PASSTHROUGH_FILTER_CHAIN.into(),
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

/// The address a sidecar's shared outbound listeners take when nothing binds them.
fn is_wildcard(bind: &str) -> bool {
    bind == "0.0.0.0" || bind == "::"
}

fn tls_inspector() -> ListenerFilter {
    listener_filter(
        "envoy.filters.listener.tls_inspector",
        TlsInspector::default(),
    )
}

/// The listener filter `name` with its typed configuration.
pub(crate) fn listener_filter<T: prost::Name + prost::Message>(
    name: &str,
    config: T,
) -> ListenerFilter {
    ListenerFilter {
        name: name.into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(pack_any(config))),
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
        max_connections_to_accept_per_socket_event: bind_to_port.then(accept_one),
        ..Default::default()
    }
}

/// One connection accepted per socket event on a listener that binds (istiod's
/// `MAX_CONNECTIONS_PER_SOCKET_EVENT_LOOP` default), which spreads a burst of connections
/// over Envoy's workers instead of handing it to the one that woke first.
pub(crate) fn accept_one() -> UInt32Value {
    UInt32Value { value: 1 }
}

/// How long a client may take over its TLS handshake once a chain is chosen (istiod's
/// `GATEWAY_TRANSPORT_SOCKET_CONNECT_TIMEOUT` default, on every chain of its per-port
/// outbound and gateway listeners): a slow handshake cannot hold a connection's memory.
pub(crate) fn handshake_timeout() -> Option<envoy_api::pb::google::protobuf::Duration> {
    Some(super::duration(std::time::Duration::from_secs(15)))
}

/// What istiod's `buildListenerFromEntry` sets on every per-port outbound listener:
/// listener filters that wait without limit unless the HTTP inspector's detection
/// timeout is set (and then continue rather than close), and the handshake timeout on
/// each chain but `PassthroughFilterChain`.
fn outbound_options(l: &mut Listener) {
    l.continue_on_listener_filters_timeout = true;
    l.listener_filters_timeout
        .get_or_insert_with(|| super::duration(std::time::Duration::ZERO));
    let chains = l
        .filter_chains
        .iter_mut()
        .chain((l.default_filter_chain.as_mut()).filter(|c| c.name != PASSTHROUGH_FILTER_CHAIN));
    for c in chains {
        c.transport_socket_connect_timeout = handshake_timeout();
    }
}

const PASSTHROUGH_FILTER_CHAIN: &str = "PassthroughFilterChain";

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
        // Sniffed services on listeners of their own: also in `"PORT"`, if another service
        // makes it, as istiod gives every HTTP or sniffed service of the port a virtual host.
        let mut sniffed_own: BTreeMap<u32, Vec<&'a Arc<Service>>> = BTreeMap::new();
        for svc in imported {
            for p in &svc.ports {
                if RESERVED_PORTS.contains(&p.port) {
                    continue;
                }
                let tcp = || sidecar_tcp_chains(ctx, proxy, &egress, svc, p.port);
                match p.protocol {
                    Protocol::Unknown if binding.own_address(svc) => {
                        sniffed_own.entry(p.port).or_default().push(svc);
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
        for (port, mut services) in http_ports {
            let Some(o) = self.at(binding.shared(), port, bind_to_port) else {
                continue;
            };
            o.rds = Some(port.to_string());
            if !named.contains(&port) {
                services.extend(sniffed_own.remove(&port).unwrap_or_default());
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
///   as TCP; its virtual host is in `"PORT"` too when other services make that. Without
///   an address (or without capture) the service's HTTP joins `"PORT"` on the shared
///   listener, which sniffs and sends other traffic to the service;
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
        .map(|o| {
            let (bind, port, bound) = (&o.bind, o.port, o.bind_to_port);
            let mut l = match o.rds {
                None => outbound_listener(bind, port, bound, o.chains, fallthrough),
                // HTTP on a real bind: nothing else can arrive there.
                Some(rds) if !o.sniffed && o.chains.is_empty() && !is_wildcard(bind) => {
                    let prefix = format!("outbound_{bind}_{port}");
                    let hcm = http_connection_manager(prefix, rds, Hcm::Outbound, &ctx.mesh);
                    let direction = TrafficDirection::Outbound;
                    listener(bind, port, bound, direction, vec![hcm])
                }
                // HTTP on 0.0.0.0 takes every connection to the port whose destination no
                // other listener has: what is not HTTP passes through (or is refused), as
                // istiod's HTTP listener with its fallthrough chain.
                Some(rds) if !o.sniffed && o.chains.is_empty() => {
                    let http = (rds, Hcm::Outbound);
                    sniffed_listener(bind, port, bound, http, o.chains, fallthrough, &ctx.mesh)
                }
                Some(rds) => {
                    let http = (rds, Hcm::Sniffed);
                    sniffed_listener(bind, port, bound, http, o.chains, fallthrough, &ctx.mesh)
                }
            };
            outbound_options(&mut l);
            l
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
        // A connection to 15001 itself would pass through back to this listener.
        let blackhole = FilterChain {
            name: "virtualOutbound-blackhole".into(),
            filter_chain_match: Some(FilterChainMatch {
                destination_port: Some(UInt32Value { value: 15001 }),
                ..Default::default()
            }),
            filters: vec![tcp_proxy(BLACKHOLE_CLUSTER)],
            ..Default::default()
        };
        virtual_outbound.filter_chains.insert(0, blackhole);
        virtual_outbound.use_original_dst = Some(BoolValue { value: true });
        listeners.push(virtual_outbound);
    }
    (listeners, outbound.routes)
}

/// A sniffed outbound listener, as istiod's `buildListenerFromEntry` assembles one (its
/// connection manager `kind`'s: a sniffed port's, or an HTTP port's on 0.0.0.0): the
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
    (rds, kind): (String, Hcm),
    chains: Vec<Chain>,
    fallthrough: &str,
    mesh: &MeshConfig,
) -> Listener {
    let mut l = outbound_listener(bind, port, bind_to_port, Vec::new(), fallthrough);
    let prefix = format!("outbound_{}", l.name);
    let hcm = http_connection_manager(prefix, rds, kind, mesh);
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
