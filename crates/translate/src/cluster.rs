//! CDS and EDS: one cluster per service port (`outbound|PORT||HOST`), one per
//! DestinationRule subset (`outbound|PORT|SUBSET|HOST`, endpoints filtered by the subset's
//! labels), plus the built-in BlackHoleCluster and PassthroughCluster.

use std::sync::Arc;

use envoy_api::pb::envoy::config::cluster::v3::cluster::DnsLookupFamily;
use envoy_api::pb::envoy::config::cluster::v3::{
    Cluster,
    cluster::{
        ClusterDiscoveryType, DiscoveryType, EdsClusterConfig, LbConfig, LbPolicy, MaglevLbConfig,
        RingHashLbConfig, TransportSocketMatch,
        common_lb_config::{LocalityConfigSpecifier, LocalityWeightedLbConfig},
    },
};
use envoy_api::pb::envoy::config::core::v3::Http2ProtocolOptions;
use envoy_api::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_api::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions, http_protocol_options::explicit_http_config::ProtocolConfig,
};
use envoy_api::pb::google::protobuf::{ListValue, UInt64Value, Value, value::Kind as ValueKind};

use super::endpoint::load_assignment;
use super::locality::{self, Place};
use super::{
    BLACKHOLE_CLUSTER, PASSTHROUGH_CLUSTER, ads_config_source, istio_metadata,
    outbound_cluster_name, string_value, struct_value,
};
use super::{policy, pool};
use api::labels_match;
use api::networking::{
    ClientTlsMode, ClientTlsSettings, ConsistentHashLb, SimpleLb, TrafficPolicy,
};
use model::config::ConfigObject;
use model::destination_rule;
use model::mesh::MeshConfig;
use model::service::Discovery;
use model::{Protocol, Proxy, ProxyKind, PushContext, Service, ServicePort};

/// Outbound clusters for `services`, and the load assignments of the EDS ones.
///
/// Mutual TLS needs the workload certificate, which only a proxy that proved its identity
/// (the secure port) has: a proxy on the plaintext port gets plaintext clusters.
pub fn outbound(
    ctx: &PushContext,
    proxy: &Proxy,
    services: &[&Arc<Service>],
) -> (Vec<Cluster>, Vec<ClusterLoadAssignment>) {
    let secure = proxy.identity.is_some();
    let at = locality::place(ctx, proxy);
    let mut clusters = Vec::new();
    let mut assignments = Vec::new();
    for svc in services {
        let rule = ctx.service_rule(proxy, svc);
        let (c, a) = service(ctx, svc, rule.map(|r| &**r), proxy.kind, secure, &at);
        clusters.extend(c);
        assignments.extend(a);
    }
    clusters.extend(fallback(proxy.kind, &ctx.mesh));
    (clusters, assignments)
}

/// The effective traffic policy of each cluster of `svc` under `rule` (its
/// DestinationRule for the proxy): per port, the rule's, then each subset's merged over it.
pub fn policies<'a>(
    svc: &'a Service,
    rule: Option<&'a ConfigObject>,
) -> impl Iterator<Item = Option<std::borrow::Cow<'a, TrafficPolicy>>> + 'a {
    let dr = rule.and_then(destination_rule::spec);
    let rule_policy = dr.and_then(|d| d.traffic_policy.as_ref());
    svc.ports.iter().flat_map(move |port| {
        let subsets = dr.map_or(&[][..], |d| &d.subsets[..]);
        std::iter::once(policy::effective(rule_policy, None, port.port)).chain(
            subsets
                .iter()
                .map(move |s| policy::effective(rule_policy, s.traffic_policy.as_ref(), port.port)),
        )
    })
}

/// The clusters of one service (a port each, and one per DestinationRule subset) and the
/// load assignments of the EDS ones. They depend on the service, `rule` (its
/// DestinationRule for the proxy), the mesh config, the proxy kind, `secure`, and, for
/// clusters balanced by locality ([`locality::dependence`]), the proxy's [`Place`], so
/// callers may cache them.
pub fn service(
    ctx: &PushContext,
    svc: &Service,
    rule: Option<&ConfigObject>,
    kind: ProxyKind,
    secure: bool,
    at: &Place,
) -> (Vec<Cluster>, Vec<ClusterLoadAssignment>) {
    let mut clusters = Vec::new();
    let mut assignments = Vec::new();
    let dr = rule.and_then(|o| Some((o, destination_rule::spec(o)?)));
    let rule_policy = dr.and_then(|(_, d)| d.traffic_policy.as_ref());
    let split = super::network::split(ctx, at);
    for port in &svc.ports {
        let base = policy::effective(rule_policy, None, port.port);
        let base_policy = base.as_deref();
        let name = outbound_cluster_name(port.port, "", &svc.hostname);
        let mut meta = service_metadata(svc, dr.map(|(o, _)| o.istio_config_path()), None);
        let mut c = build(
            &name,
            svc,
            port,
            base_policy,
            (ctx, kind, secure),
            &mut meta,
        );
        if secure {
            mutual_tls(&mut c, ctx, svc, port, "", base_policy);
        }
        stat_name(&mut c, ctx, svc, port.port, "");
        proxy_protocol(&mut c, base_policy);
        let lb = locality::lb(&ctx.mesh, base_policy, svc.traffic_distribution).map(|lb| (lb, at));
        let sent = sends_unready(svc, base_policy);
        balance(&mut c, lb, svc, port.port, sent);
        if is_eds(&c) {
            assignments.push(load_assignment(&name, svc, port.port, sent, split, lb));
        }
        clusters.push(c);
        let Some((dr_obj, dr_spec)) = dr else {
            continue;
        };
        for subset in &dr_spec.subsets {
            let name = outbound_cluster_name(port.port, &subset.name, &svc.hostname);
            let merged = policy::effective(rule_policy, subset.traffic_policy.as_ref(), port.port);
            let policy = merged.as_deref();
            let mut meta =
                service_metadata(svc, Some(dr_obj.istio_config_path()), Some(&subset.name));
            let mut c = build(&name, svc, port, policy, (ctx, kind, secure), &mut meta);
            if secure {
                mutual_tls(&mut c, ctx, svc, port, &subset.name, policy);
            }
            stat_name(&mut c, ctx, svc, port.port, &subset.name);
            proxy_protocol(&mut c, policy);
            let sent = sends_unready(svc, policy);
            let in_subset =
                |e: &model::Endpoint| labels_match(&subset.labels, &e.labels) && sent(e);
            let lb = locality::lb(&ctx.mesh, policy, svc.traffic_distribution).map(|lb| (lb, at));
            balance(&mut c, lb, svc, port.port, in_subset);
            if is_eds(&c) {
                assignments.push(load_assignment(&name, svc, port.port, in_subset, split, lb));
            }
            clusters.push(c);
        }
    }
    (clusters, assignments)
}

/// Which endpoints a service cluster's load assignment holds: all, not-ready ones as
/// `UNHEALTHY` (Envoy counts them, and with panic mode off never sends them requests), but
/// where outlier detection's `minHealthPercent` turns panic mode on, only the ready ones,
/// as istiod's `supportsUnhealthyEndpoints` (a service with a `trafficDistribution` keeps
/// them: its zone spill-over is told by their health).
fn sends_unready(
    svc: &Service,
    policy: Option<&TrafficPolicy>,
) -> impl Fn(&model::Endpoint) -> bool + Copy {
    let panics = policy
        .and_then(|p| p.outlier_detection.as_ref())
        .and_then(|o| o.min_health_percent)
        .is_some_and(|p| p > 0);
    let all = !panics || svc.traffic_distribution != model::service::TrafficDistribution::Any;
    move |e: &model::Endpoint| all || e.healthy
}

/// The stat name of the cluster of `svc`'s `port` and `subset`: MeshConfig's
/// `outboundClusterStatName`, else the cluster's name, as istiod's `buildCluster` sets it
/// on every outbound cluster (SNI-DNAT ones too).
fn stat_name(c: &mut Cluster, ctx: &PushContext, svc: &Service, port: u32, subset: &str) {
    let target = || {
        Some(super::stat_name::Target {
            subset,
            ..super::stat_name::Target::outbound(svc, port)
        })
    };
    let pattern = &ctx.mesh.outbound_cluster_stat_name;
    c.alt_stat_name = super::stat_name::alt_stat_name(pattern, target, &c.name);
}

/// A gateway's SNI-DNAT clusters for `svc`, for its AUTO_PASSTHROUGH servers (istiod's
/// `buildOutboundSniDnatClusters`): the service's gateway clusters (a port each, and one
/// per subset of `rule`) named as their mTLS SNI, `outbound_.PORT_.SUBSET_.HOST`, with
/// their load assignments (mTLS endpoints only), and no TLS of their own: the client's
/// mTLS passes through to the endpoint. Mesh-external services get none.
pub fn sni_dnat(
    ctx: &PushContext,
    svc: &Service,
    rule: Option<&ConfigObject>,
    at: &Place,
) -> (Vec<Cluster>, Vec<ClusterLoadAssignment>) {
    if svc.mesh_external {
        return (Vec::new(), Vec::new());
    }
    let (mut clusters, mut assignments) = service(ctx, svc, rule, ProxyKind::Router, false, at);
    // `outbound|PORT|SUBSET|HOST`, as `service` names them, to its mTLS SNI.
    let rename = |name: &mut String| {
        let mut parts = name.splitn(4, '|').skip(1);
        if let (Some(port), Some(subset), Some(host)) = (parts.next(), parts.next(), parts.next())
            && let Ok(port) = port.parse()
        {
            *name = mtls_sni(port, subset, host);
        }
    };
    for c in &mut clusters {
        // Stats under the cluster's own name follow it; a pattern's name stays.
        let own_stat_name = c.alt_stat_name == super::stat_name::delimited(&c.name);
        rename(&mut c.name);
        if own_stat_name {
            c.alt_stat_name = super::stat_name::delimited(&c.name);
        }
        if let Some(eds) = &mut c.eds_cluster_config {
            rename(&mut eds.service_name);
        }
        if let Some(la) = &mut c.load_assignment {
            rename(&mut la.cluster_name);
        }
        c.transport_socket = None;
        c.transport_socket_matches.clear();
    }
    for a in &mut assignments {
        rename(&mut a.cluster_name);
        mtls_endpoints_only(a);
    }
    (clusters, assignments)
}

/// Keeps the endpoints that speak Istio mTLS (`tlsMode: istio`), as istiod's
/// `EndpointsWithMTLSFilter` does for SNI-DNAT clusters: the gateway cannot see whether a
/// passed-through connection is mTLS, so only workloads that require it are reachable. A
/// locality left empty goes; one weighted by its endpoints is weighted by those left.
fn mtls_endpoints_only(a: &mut ClusterLoadAssignment) {
    use envoy_api::pb::envoy::config::endpoint::v3::LbEndpoint;
    let weight = |eps: &[LbEndpoint]| -> u32 {
        (eps.iter())
            .map(|e| e.load_balancing_weight.as_ref().map_or(1, |w| w.value))
            .sum()
    };
    for group in &mut a.endpoints {
        let before = weight(&group.lb_endpoints);
        group.lb_endpoints.retain(super::endpoint::is_mtls);
        if let Some(w) = group
            .load_balancing_weight
            .as_mut()
            .filter(|w| w.value == before)
        {
            w.value = weight(&group.lb_endpoints);
        }
    }
    a.endpoints.retain(|g| !g.lb_endpoints.is_empty());
}

/// Locality balancing on the cluster itself: Envoy weighs localities when asked to, and a
/// DNS cluster's own load assignment is balanced as an EDS one is.
fn balance(
    c: &mut Cluster,
    lb: Option<(locality::Lb<'_>, &Place)>,
    svc: &Service,
    port: u32,
    filter: impl Fn(&model::Endpoint) -> bool,
) {
    let Some((balancing, _)) = lb else {
        return;
    };
    if balancing.weighted() {
        c.common_lb_config
            .get_or_insert_with(Default::default)
            .locality_config_specifier = Some(LocalityConfigSpecifier::LocalityWeightedLbConfig(
            LocalityWeightedLbConfig::default(),
        ));
    }
    if let Some(inline) = &mut c.load_assignment {
        *inline = load_assignment(&inline.cluster_name, svc, port, filter, None, lb);
    }
}

/// BlackHoleCluster, and for sidecars PassthroughCluster, with MeshConfig's connect
/// timeout (and, for PassthroughCluster, its TCP keepalive), as istiod's.
pub fn fallback(kind: ProxyKind, mesh: &MeshConfig) -> Vec<Cluster> {
    let connect_timeout = Some(pool::mesh_connect_timeout(mesh));
    let mut clusters = vec![Cluster {
        name: BLACKHOLE_CLUSTER.into(),
        alt_stat_name: super::stat_name::delimited(BLACKHOLE_CLUSTER),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
        connect_timeout,
        ..Default::default()
    }];
    if kind == ProxyKind::Sidecar {
        let mut passthrough = Cluster {
            name: PASSTHROUGH_CLUSTER.into(),
            alt_stat_name: super::stat_name::delimited(PASSTHROUGH_CLUSTER),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(
                DiscoveryType::OriginalDst as i32,
            )),
            lb_policy: LbPolicy::ClusterProvided as i32,
            connect_timeout,
            ..Default::default()
        };
        pool::keepalive(&mut passthrough, mesh, None);
        pool::passthrough(&mut passthrough);
        clusters.push(passthrough);
    }
    clusters
}

/// The `services` field of a cluster's `istio` metadata, istiod's `addTelemetryMetadata`:
/// each service's host, name and namespace, which Istio's stats filter reads for the
/// `destination_service*` labels.
pub(crate) fn services_metadata(services: &[&Service]) -> (&'static str, Value) {
    let values = (services.iter())
        .map(|svc| {
            struct_value(vec![
                ("host", string_value(&svc.hostname)),
                ("name", string_value(svc.telemetry_name())),
                ("namespace", string_value(&svc.namespace)),
            ])
        })
        .collect();
    (
        "services",
        Value {
            kind: Some(ValueKind::ListValue(ListValue { values })),
        },
    )
}

fn service_metadata(
    svc: &Service,
    config: Option<String>,
    subset: Option<&str>,
) -> Vec<(&'static str, Value)> {
    let mut fields = vec![services_metadata(&[svc])];
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
    (ctx, kind, secure): (&PushContext, ProxyKind, bool),
    meta: &mut Vec<(&'static str, Value)>,
) -> Cluster {
    let mut c = Cluster {
        name: name.to_string(),
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
            c.load_assignment = Some(load_assignment(name, svc, port.port, |_| true, None, None));
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
    if let Some(hash) = policy
        .and_then(|p| p.load_balancer.as_ref())
        .and_then(|lb| lb.consistent_hash.as_ref())
        && c.lb_policy != LbPolicy::ClusterProvided as i32
    {
        ring(&mut c, hash);
    }
    if let Some(lb) = policy.and_then(|p| p.load_balancer.as_ref())
        && lb.consistent_hash.is_none()
    {
        warm_up(&mut c, lb);
    }
    let mut http = port.protocol.is_http2().then(|| HttpProtocolOptions {
        upstream_protocol_options: Some(pool::explicit(ProtocolConfig::Http2ProtocolOptions(
            Http2ProtocolOptions::default(),
        ))),
        ..Default::default()
    });
    // A sniffed port's HTTP goes upstream in the protocol it came in (a sidecar's only, as
    // istiod's `buildCluster`: a gateway's clients negotiate h2 with it by ALPN).
    if port.protocol == Protocol::Unknown && kind == ProxyKind::Sidecar {
        http = Some(HttpProtocolOptions {
            upstream_protocol_options: Some(pool::use_downstream()),
            ..Default::default()
        });
    }
    pool::connection_pool(
        &mut c,
        policy.and_then(|p| p.connection_pool.as_ref()),
        &mut http,
        (&ctx.mesh, pool::mesh_upgrades(&ctx.mesh, port.protocol)),
    );
    pool::outlier_detection(&mut c, policy.and_then(|p| p.outlier_detection.as_ref()));
    pool::no_panic_by_default(&mut c);
    if let Some(tls) = policy.and_then(|p| p.tls.as_ref()) {
        let params = model::tls::TlsParams::originate(&ctx.mesh);
        originate_tls(&mut c, tls, &mut http, (kind, secure), &params);
    }
    pool::attach_http(&mut c, http);
    c
}

/// The policy's `proxyProtocol`: the cluster's transport socket (plaintext when it has
/// none) and each of its auto-mTLS matches' wrapped in Envoy's upstream PROXY protocol
/// transport, as istiod's `applyUpstreamProxyProtocol`.
fn proxy_protocol(c: &mut Cluster, policy: Option<&TrafficPolicy>) {
    use envoy_api::pb::envoy::config::core::v3::{
        ProxyProtocolConfig, TransportSocket, proxy_protocol_config::Version,
        transport_socket::ConfigType,
    };
    use envoy_api::pb::envoy::extensions::transport_sockets::proxy_protocol::v3::ProxyProtocolUpstreamTransport;
    let Some(pp) = policy.and_then(|p| p.proxy_protocol.as_ref()) else {
        return;
    };
    let version = match pp.version.as_deref() {
        Some("V2") => Version::V2,
        _ => Version::V1,
    };
    let wrap = |inner: TransportSocket| TransportSocket {
        name: "envoy.transport_sockets.upstream_proxy_protocol".into(),
        config_type: Some(ConfigType::TypedConfig(envoy_api::util::pack_any(
            ProxyProtocolUpstreamTransport {
                config: Some(ProxyProtocolConfig {
                    version: version as i32,
                    ..Default::default()
                }),
                transport_socket: Some(inner),
                ..Default::default()
            },
        ))),
    };
    if c.transport_socket.is_none() && c.transport_socket_matches.is_empty() {
        c.transport_socket = Some(wrap(super::tls::raw_buffer()));
        return;
    }
    if let Some(inner) = c.transport_socket.take() {
        c.transport_socket = Some(wrap(inner));
    }
    for m in &mut c.transport_socket_matches {
        if let Some(inner) = m.transport_socket.take() {
            m.transport_socket = Some(wrap(inner));
        }
    }
}

/// A round-robin or least-request cluster's slow start from the rule's `warmup` (else the
/// deprecated `warmupDurationSecs`), as istiod's `setWarmup`: the window, the minimum
/// weight (10% unless set) and the aggression (1, linear, unless set).
fn warm_up(c: &mut Cluster, lb: &api::networking::LoadBalancerSettings) {
    use envoy_api::pb::envoy::config::cluster::v3::cluster::{
        LeastRequestLbConfig, RoundRobinLbConfig, SlowStartConfig,
    };
    use envoy_api::pb::envoy::config::core::v3::RuntimeDouble;
    let slow_start = match (&lb.warmup, &lb.warmup_duration_secs) {
        (Some(w), _) => SlowStartConfig {
            slow_start_window: super::optional_duration(w.duration.as_deref()),
            aggression: Some(RuntimeDouble {
                default_value: w.aggression.unwrap_or(1.0),
                // No runtime key is meant: istiod writes one Envoy cannot look up.
                runtime_key: "(".into(),
            }),
            min_weight_percent: Some(envoy_api::pb::envoy::r#type::v3::Percent {
                value: w.minimum_percent.unwrap_or(10.0),
            }),
        },
        (None, Some(window)) => SlowStartConfig {
            slow_start_window: super::optional_duration(Some(window)),
            ..Default::default()
        },
        (None, None) => return,
    };
    let slow_start_config = Some(slow_start);
    c.lb_config = if c.lb_policy == LbPolicy::RoundRobin as i32 {
        Some(LbConfig::RoundRobinLbConfig(RoundRobinLbConfig {
            slow_start_config,
        }))
    } else if c.lb_policy == LbPolicy::LeastRequest as i32 {
        Some(LbConfig::LeastRequestLbConfig(LeastRequestLbConfig {
            slow_start_config,
            ..Default::default()
        }))
    } else {
        return;
    };
}

/// A consistent hash's ring, as istiod's `ApplyRingHashLoadBalancer` builds it: Maglev,
/// or a ring hash with Envoy's 1,024-entry minimum unless the policy sets another. The
/// key each request is hashed on is the route's (see `route::hash_policy`).
fn ring(c: &mut Cluster, hash: &ConsistentHashLb) {
    let size = |value: u64| Some(UInt64Value { value });
    if let Some(maglev) = &hash.maglev {
        c.lb_policy = LbPolicy::Maglev as i32;
        c.lb_config = maglev.table_size.filter(|n| *n > 0).map(|n| {
            LbConfig::MaglevLbConfig(MaglevLbConfig {
                table_size: size(n),
            })
        });
        return;
    }
    c.lb_policy = LbPolicy::RingHash as i32;
    let minimum = match &hash.ring_hash {
        Some(ring) => ring.minimum_ring_size.filter(|n| *n > 0),
        None => Some(hash.minimum_ring_size.filter(|n| *n > 0).unwrap_or(1024)),
    };
    c.lb_config = minimum.map(|n| {
        LbConfig::RingHashLbConfig(RingHashLbConfig {
            minimum_ring_size: size(n),
            ..Default::default()
        })
    });
}

/// `SIMPLE` or `MUTUAL` TLS to the destination ([`super::tls::originate`]), with Envoy
/// choosing the SNI from each request's host when the rule names none, and checking the
/// server's certificate against that host when it also names no SAN (istiod's
/// `auto_sni` / `auto_san_validation`). A `credentialName` is for gateways: one with a
/// proven identity gets it over SDS ([`super::tls::originate_credential`]); elsewhere such
/// a rule originates nothing, as istiod's sidecars do.
fn originate_tls(
    c: &mut Cluster,
    tls: &ClientTlsSettings,
    http: &mut Option<HttpProtocolOptions>,
    (kind, secure): (ProxyKind, bool),
    params: &model::tls::TlsParams,
) {
    let h2 = pool::http2(http).is_some();
    let credential = super::credentials::CredentialUse::of_client(tls);
    let socket = match (tls.mode, credential) {
        (_, Some(credential)) => {
            if kind != ProxyKind::Router || !secure {
                return;
            }
            super::tls::originate_credential(tls, &credential, h2, params)
        }
        (Some(ClientTlsMode::Simple), None) => super::tls::originate(tls, None, h2, secure, params),
        (Some(ClientTlsMode::Mutual), None) => match (&tls.client_certificate, &tls.private_key) {
            (Some(cert), Some(key)) => {
                let client = Some((cert.as_str(), key.as_str()));
                super::tls::originate(tls, client, h2, secure, params)
            }
            _ => return, // refused by validation
        },
        _ => return,
    };
    c.transport_socket = Some(socket);
    let auto_sni = tls.sni.as_deref().is_none_or(str::is_empty);
    let auto_san =
        auto_sni && tls.subject_alt_names.is_empty() && tls.insecure_skip_verify != Some(true);
    if auto_sni {
        let upstream = (http.get_or_insert_with(HttpProtocolOptions::default))
            .upstream_http_protocol_options
            .get_or_insert_with(Default::default);
        upstream.auto_sni = true;
        upstream.auto_san_validation = auto_san;
    }
}

/// The label the injector puts on mesh pods; their endpoints get mTLS.
pub const TLS_MODE_LABEL: &str = "security.istio.io/tlsMode";

/// Istio's mTLS SNI: `outbound_.PORT_.SUBSET_.HOST`.
pub fn mtls_sni(port: u32, subset: &str, host: &str) -> String {
    format!("outbound_.{port}_.{subset}_.{host}")
}

/// The DestinationRule's `tls.mode`, if it sets one.
fn tls_mode(policy: Option<&TrafficPolicy>) -> Option<ClientTlsMode> {
    policy?.tls.as_ref()?.mode
}

/// Auto mTLS (Istio's default): endpoints labelled `tlsMode: istio` get ISTIO_MUTUAL with
/// the service's SPIFFE identities verified, others plaintext. A DestinationRule with
/// `tls.mode: ISTIO_MUTUAL` forces it (with the rule's `sni` and `subjectAltNames` when it
/// names them); `DISABLE` turns it off. Not for mesh-external services or ORIGINAL_DST
/// clusters.
fn mutual_tls(
    c: &mut Cluster,
    ctx: &PushContext,
    svc: &Service,
    port: &ServicePort,
    subset: &str,
    policy: Option<&TrafficPolicy>,
) {
    let original_dst = c.cluster_discovery_type
        == Some(ClusterDiscoveryType::Type(
            DiscoveryType::OriginalDst as i32,
        ));
    let mode = tls_mode(policy);
    if original_dst
        || matches!(
            mode,
            Some(ClientTlsMode::Disable | ClientTlsMode::Simple | ClientTlsMode::Mutual)
        )
    {
        return;
    }
    if svc.mesh_external && mode.is_none() {
        return;
    }
    let trust_domain = ctx.mesh.trust_domain.as_deref().unwrap_or("cluster.local");
    let mut sans: Vec<String> = svc
        .endpoints
        .iter()
        .filter_map(|e| e.service_account.as_deref())
        .map(|sa| format!("spiffe://{trust_domain}/ns/{}/sa/{sa}", svc.namespace))
        .collect();
    sans.sort();
    sans.dedup();
    let mut sni = mtls_sni(port.port, subset, &svc.hostname);
    // A rule set to ISTIO_MUTUAL may name the SNI (useful through gateways) and the
    // identities to expect; what it leaves out is the automatic choice (istiod's
    // `buildUpstreamTLSSettings`).
    if mode == Some(ClientTlsMode::IstioMutual)
        && let Some(tls) = policy.and_then(|p| p.tls.as_ref())
    {
        if let Some(named) = tls.sni.as_ref().filter(|s| !s.is_empty()) {
            sni = named.clone();
        }
        if !tls.subject_alt_names.is_empty() {
            sans = tls.subject_alt_names.clone();
        }
    }
    let tls = super::tls::upstream(&sni, &sans, port.protocol.is_http2());
    if mode == Some(ClientTlsMode::IstioMutual) {
        c.transport_socket = Some(tls);
        return;
    }
    c.transport_socket_matches = vec![
        TransportSocketMatch {
            name: "tlsMode-istio".into(),
            r#match: Some(super::make_struct(vec![("tlsMode", string_value("istio"))])),
            transport_socket: Some(tls),
        },
        TransportSocketMatch {
            name: "tlsMode-disabled".into(),
            r#match: Some(Default::default()),
            transport_socket: Some(super::tls::raw_buffer()),
        },
    ];
}

fn is_eds(c: &Cluster) -> bool {
    c.cluster_discovery_type == Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32))
}
