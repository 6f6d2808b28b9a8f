//! tcp_proxy filters and the outbound TCP and TLS filter chains of a sidecar: a service's
//! own, and those a VirtualService's `tcp` and `tls` routes build.

use super::*;

pub(crate) fn tcp_proxy(cluster: &str) -> Filter {
    tcp_proxy_named(cluster, cluster)
}

/// A tcp_proxy to `cluster` whose stats are named `stat_prefix`.
pub(crate) fn tcp_proxy_named(stat_prefix: &str, cluster: &str) -> Filter {
    tcp_proxy_to(stat_prefix, &[(cluster.to_string(), 100)], None)
}

/// A tcp_proxy to `targets` (cluster, weight): one cluster, or weighted clusters; with
/// `policy`, what the DestinationRule of the (first) destination sets on it.
pub(super) fn tcp_proxy_to(
    stat_prefix: &str,
    targets: &[(String, u32)],
    policy: Option<TcpPolicy>,
) -> Filter {
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
        name: super::TCP_PROXY.into(),
        config_type: Some(ConfigType::TypedConfig(pack_any(tp))),
    }
}

/// `host:port`, an IPv6 host in brackets (Go's `net.JoinHostPort`).
pub(super) fn join_host_port(host: &str, port: u32) -> String {
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
pub(super) struct TcpPolicy {
    idle_timeout: Option<envoy_api::pb::google::protobuf::Duration>,
    max_connection_duration: Option<envoy_api::pb::google::protobuf::Duration>,
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
pub(super) fn service_tcp_proxy(
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
pub(super) fn tcp_route_proxy<'a>(
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
pub(super) fn route_proxy(
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
pub(super) fn l4_fits(
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

/// The chains of a sidecar's outbound TCP listener for `svc`'s `port`, as istiod's
/// `buildSidecarOutboundTCPFilterChainOpts`: the TCP routes of the VirtualServices for the
/// host, in their precedence order, whose matches fit the proxy and port. A route that
/// fits with a match naming no `destinationSubnets` (or with no match) takes every other
/// connection and ends the list; one whose fitting matches all name subnets gets a chain
/// matched on them (a route for `10.1.0.0/16`, another for the rest). Without a route for
/// every connection, the service's own cluster takes them.
pub(super) fn sidecar_tcp_chains(
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

/// The chains of a sidecar's outbound listener for `svc`'s TLS `port` (protocol TLS or
/// HTTPS), as istiod's `buildSidecarOutboundTLSFilterChainOpts`: one per distinct SNI
/// match of the `tls` routes (of the VirtualServices for the host) that fits the proxy
/// and port, to that route's destinations. Without one, the service's own cluster,
/// matched on its hostname when the listener is not the service's own address
/// (`wildcard`), so that services without an address can share a port.
pub(super) fn sidecar_tls_chains(
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
