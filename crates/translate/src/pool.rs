//! A DestinationRule's `connectionPool` and `outlierDetection` on an outbound cluster, as
//! istiod applies them (`cluster_traffic_policy.go`): every cluster gets circuit-breaker
//! thresholds, at the maximum unless the connection pool lowers one, so Envoy's own
//! defaults (1,024 connections and requests, 3 retries) never cut in; zero means unset.
//! The pool also sets TCP keepalive and the upstream HTTP protocol (`h2UpgradePolicy`,
//! `useClientProtocol`, `maxConcurrentStreams`).

use envoy_api::pb::envoy::config::cluster::v3::{
    CircuitBreakers, Cluster, OutlierDetection as EnvoyOutlierDetection, UpstreamConnectionOptions,
    circuit_breakers::Thresholds, cluster::CommonLbConfig, cluster::LbPolicy,
};
use envoy_api::pb::envoy::config::core::v3::{
    Http2ProtocolOptions, HttpProtocolOptions as CommonHttpProtocolOptions,
    TcpKeepalive as EnvoyTcpKeepalive,
};
use envoy_api::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions,
    http_protocol_options::{
        ExplicitHttpConfig, UpstreamProtocolOptions, UseDownstreamHttpConfig,
        explicit_http_config::ProtocolConfig,
    },
};
use envoy_api::pb::envoy::r#type::v3::Percent;
use envoy_api::pb::google::protobuf::UInt32Value;

use super::optional_duration;
use api::networking::{ConnectionPoolSettings, OutlierDetection, TcpKeepalive};
use model::mesh::MeshConfig;

/// Istio's default connect timeout (MeshConfig `connectTimeout`).
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// MeshConfig's `connectTimeout`, else 10s (validation refuses one that does not parse).
pub fn mesh_connect_timeout(mesh: &MeshConfig) -> envoy_api::pb::google::protobuf::Duration {
    let parsed = mesh.connect_timeout.as_deref().map(api::duration::parse);
    super::duration(parsed.and_then(Result::ok).unwrap_or(CONNECT_TIMEOUT))
}

/// What MeshConfig sets on clusters before their DestinationRule: `connectTimeout`,
/// `tcpKeepalive` and `h2UpgradePolicy`; on routes without their own retries,
/// `defaultHttpRetryPolicy`; and the clusters' stat names, `outboundClusterStatName`. A
/// service's cached clusters and virtual hosts are valid while these are the same.
#[derive(Clone, Debug, PartialEq)]
pub struct MeshPool {
    connect_timeout: Option<String>,
    tcp_keepalive: Option<TcpKeepalive>,
    h2_upgrade_policy: Option<String>,
    /// Not a cluster default, but what the cached default virtual hosts and routed
    /// virtual hosts are built with.
    default_http_retry_policy: Option<api::networking::HttpRetry>,
    outbound_cluster_stat_name: String,
}

/// Whether `mesh` sets none of [`MeshPool`] (the usual case).
fn no_mesh_pool(mesh: &MeshConfig) -> bool {
    mesh.connect_timeout.is_none()
        && mesh.tcp_keepalive.is_none()
        && mesh.h2_upgrade_policy.is_none()
        && mesh.default_http_retry_policy.is_none()
        && mesh.outbound_cluster_stat_name.is_empty()
}

/// `mesh`'s [`MeshPool`], boxed; `None` when it sets none of it.
pub fn mesh_pool(mesh: &MeshConfig) -> Option<Box<MeshPool>> {
    (!no_mesh_pool(mesh)).then(|| {
        Box::new(MeshPool {
            connect_timeout: mesh.connect_timeout.clone(),
            tcp_keepalive: mesh.tcp_keepalive.clone(),
            h2_upgrade_policy: mesh.h2_upgrade_policy.clone(),
            default_http_retry_policy: mesh.default_http_retry_policy.clone(),
            outbound_cluster_stat_name: mesh.outbound_cluster_stat_name.clone(),
        })
    })
}

/// Whether `pool` is what `mesh` sets, without building `mesh`'s.
pub fn same_mesh_pool(pool: Option<&MeshPool>, mesh: &MeshConfig) -> bool {
    match pool {
        None => no_mesh_pool(mesh),
        Some(p) => {
            p.connect_timeout == mesh.connect_timeout
                && p.tcp_keepalive == mesh.tcp_keepalive
                && p.h2_upgrade_policy == mesh.h2_upgrade_policy
                && p.default_http_retry_policy == mesh.default_http_retry_policy
                && p.outbound_cluster_stat_name == mesh.outbound_cluster_stat_name
        }
    }
}

/// Whether MeshConfig's `h2UpgradePolicy: UPGRADE` makes an outbound cluster of a port
/// of `protocol` HTTP/2 when its DestinationRule does not decide: only ports declared
/// HTTP (not sniffed ones, whose clients' protocol goes upstream), as istiod's
/// `shouldH2Upgrade`.
pub fn mesh_upgrades(mesh: &MeshConfig, protocol: model::Protocol) -> bool {
    use model::Protocol;
    mesh.h2_upgrade_policy.as_deref() == Some("UPGRADE")
        && matches!(protocol, Protocol::Http | Protocol::Http2 | Protocol::Grpc)
}

/// A limit, or the maximum when `value` is unset or not positive.
fn limit(value: Option<i32>) -> UInt32Value {
    let value = value.filter(|v| *v > 0).map_or(u32::MAX, |v| v as u32);
    UInt32Value { value }
}

/// What istiod gives its passthrough clusters (PassthroughCluster,
/// InboundPassthroughCluster): no circuit-breaker limits (Envoy's defaults would cap them
/// at 1024 connections and requests), and HTTP sent on in the protocol it came in, with
/// connections idle for 5 minutes closed (an `allow_any` route's gRPC stays HTTP/2).
pub fn passthrough(c: &mut Cluster) {
    c.circuit_breakers = Some(CircuitBreakers {
        thresholds: vec![Thresholds {
            max_connections: Some(limit(None)),
            max_pending_requests: Some(limit(None)),
            max_requests: Some(limit(None)),
            max_retries: Some(limit(None)),
            ..Default::default()
        }],
        ..Default::default()
    });
    let idle = CommonHttpProtocolOptions {
        idle_timeout: Some(super::duration(PASSTHROUGH_IDLE_TIMEOUT)),
        ..Default::default()
    };
    attach_http(
        c,
        Some(HttpProtocolOptions {
            common_http_protocol_options: Some(idle),
            upstream_protocol_options: Some(use_downstream()),
            ..Default::default()
        }),
    );
}

/// istiod's idle timeout of passthrough clusters' HTTP connections.
const PASSTHROUGH_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// `protocol` as the cluster's one upstream HTTP protocol.
pub fn explicit(protocol: ProtocolConfig) -> UpstreamProtocolOptions {
    UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
        protocol_config: Some(protocol),
    })
}

/// Circuit breakers, the connect timeout, TCP keepalive, and the HTTP connection options
/// of `pool` (none: the defaults), over MeshConfig's connect timeout and keepalive (as
/// istiod's `applyConnectionPool`, which every cluster it builds goes through). The HTTP
/// options are added to `http` (the upstream protocol the port chose, if any), creating
/// it if any is set. `upgrade`: the mesh makes the cluster HTTP/2 unless the pool's
/// `h2UpgradePolicy` says otherwise ([`mesh_upgrades`]).
pub fn connection_pool(
    c: &mut Cluster,
    pool: Option<&ConnectionPoolSettings>,
    http: &mut Option<HttpProtocolOptions>,
    (mesh, upgrade): (&MeshConfig, bool),
) {
    c.connect_timeout = Some(mesh_connect_timeout(mesh));
    let tcp = pool.and_then(|p| p.tcp.as_ref());
    let h = pool.and_then(|p| p.http.as_ref());
    let use_client_protocol = h.and_then(|h| h.use_client_protocol) == Some(true);
    // `h2UpgradePolicy: UPGRADE` makes the cluster HTTP/2 unless the port chose already or
    // the client's protocol is to be kept (istiod's `applyH2Upgrade`, before the pool).
    // A sniffed port's protocol (the downstream one) is replaced too.
    let upgrade = match h.and_then(|h| h.h2_upgrade_policy.as_deref()) {
        Some("UPGRADE") => true,
        Some("DO_NOT_UPGRADE") => false,
        _ => upgrade,
    };
    if !use_client_protocol && upgrade {
        let options = http.get_or_insert_with(HttpProtocolOptions::default);
        let chosen = &mut options.upstream_protocol_options;
        if matches!(
            chosen,
            None | Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(_))
        ) {
            *chosen = Some(explicit(ProtocolConfig::Http2ProtocolOptions(
                Default::default(),
            )));
        }
    }
    keepalive(c, mesh, tcp.and_then(|t| t.tcp_keepalive.as_ref()));
    c.circuit_breakers = Some(CircuitBreakers {
        thresholds: vec![Thresholds {
            max_connections: Some(limit(tcp.and_then(|t| t.max_connections))),
            max_pending_requests: Some(limit(h.and_then(|h| h.http1_max_pending_requests))),
            max_requests: Some(limit(h.and_then(|h| h.http2_max_requests))),
            max_retries: Some(limit(h.and_then(|h| h.max_retries))),
            track_remaining: true,
            ..Default::default()
        }],
        ..Default::default()
    });
    if let Some(t) = optional_duration(tcp.and_then(|t| t.connect_timeout.as_deref())) {
        c.connect_timeout = Some(t);
    }
    // The HTTP idle timeout, else the TCP one.
    let idle_timeout = optional_duration(h.and_then(|h| h.idle_timeout.as_deref()))
        .or_else(|| optional_duration(tcp.and_then(|t| t.idle_timeout.as_deref())));
    let max_connection_duration =
        optional_duration(tcp.and_then(|t| t.max_connection_duration.as_deref()));
    let max_requests_per_connection = (h.and_then(|h| h.max_requests_per_connection))
        .filter(|v| *v > 0)
        .map(|v| UInt32Value { value: v as u32 });
    if idle_timeout.is_some()
        || max_connection_duration.is_some()
        || max_requests_per_connection.is_some()
    {
        let options = http.get_or_insert_with(HttpProtocolOptions::default);
        let common = (options.common_http_protocol_options)
            .get_or_insert_with(CommonHttpProtocolOptions::default);
        if idle_timeout.is_some() {
            common.idle_timeout = idle_timeout;
        }
        if max_connection_duration.is_some() {
            common.max_connection_duration = max_connection_duration;
        }
        if max_requests_per_connection.is_some() {
            common.max_requests_per_connection = max_requests_per_connection;
        }
    }
    // Only an HTTP/2 cluster bounds its streams per connection.
    if let Some(streams) = h.and_then(|h| h.max_concurrent_streams).filter(|v| *v > 0)
        && let Some(h2) = http2(http)
    {
        h2.max_concurrent_streams = Some(UInt32Value {
            value: streams as u32,
        });
    }
    // `useClientProtocol`: HTTP/1.1 upstream for HTTP/1.1 requests, HTTP/2 for HTTP/2.
    if use_client_protocol {
        let options = http.get_or_insert_with(HttpProtocolOptions::default);
        let http1 = match options.upstream_protocol_options.take() {
            Some(UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::HttpProtocolOptions(h1)),
            })) => h1,
            _ => Default::default(),
        };
        options.upstream_protocol_options = Some(use_downstream_with(http1));
    }
}

/// The downstream request's protocol upstream: HTTP/1.1 for HTTP/1.1, HTTP/2 for HTTP/2.
pub fn use_downstream() -> UpstreamProtocolOptions {
    use_downstream_with(Default::default())
}

fn use_downstream_with(
    http1: envoy_api::pb::envoy::config::core::v3::Http1ProtocolOptions,
) -> UpstreamProtocolOptions {
    UpstreamProtocolOptions::UseDownstreamProtocolConfig(UseDownstreamHttpConfig {
        http_protocol_options: Some(http1),
        http2_protocol_options: Some(Default::default()),
        ..Default::default()
    })
}

/// Puts `http` (if any) on the cluster as its `HttpProtocolOptions`, with HTTP/1.1
/// upstream unless it chose a protocol: Envoy requires one.
pub fn attach_http(c: &mut Cluster, http: Option<HttpProtocolOptions>) {
    if let Some(mut opts) = http {
        opts.upstream_protocol_options.get_or_insert_with(|| {
            explicit(ProtocolConfig::HttpProtocolOptions(
                envoy_api::pb::envoy::config::core::v3::Http1ProtocolOptions::default(),
            ))
        });
        c.typed_extension_protocol_options.insert(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".into(),
            envoy_api::util::pack_any(opts),
        );
    }
}

/// The HTTP/2 options of a cluster whose one upstream protocol is HTTP/2.
pub fn http2(http: &mut Option<HttpProtocolOptions>) -> Option<&mut Http2ProtocolOptions> {
    match http.as_mut()?.upstream_protocol_options.as_mut()? {
        UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
            protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(h2)),
        }) => Some(h2),
        _ => None,
    }
}

/// SO_KEEPALIVE when MeshConfig's `tcpKeepalive` or the policy's asks for it: what the
/// mesh sets, then what the policy sets over it field by field (istiod's
/// `applyTCPKeepalive`), the OS's values for the rest.
pub fn keepalive(c: &mut Cluster, mesh: &MeshConfig, policy: Option<&TcpKeepalive>) {
    for k in mesh.tcp_keepalive.iter().chain(policy) {
        let options = c
            .upstream_connection_options
            .get_or_insert_with(UpstreamConnectionOptions::default);
        merge_keepalive(
            options.tcp_keepalive.get_or_insert_with(Default::default),
            k,
        );
    }
}

/// Sets what `k` sets. Envoy counts keepalive time and interval in whole seconds.
fn merge_keepalive(out: &mut EnvoyTcpKeepalive, k: &TcpKeepalive) {
    let seconds = |d: Option<&str>| {
        let d = api::duration::parse(d?).ok()?;
        Some(UInt32Value {
            value: u32::try_from(d.as_secs()).unwrap_or(u32::MAX),
        })
    };
    if let Some(value) = k.probes.filter(|p| *p > 0) {
        out.keepalive_probes = Some(UInt32Value { value });
    }
    if let Some(time) = seconds(k.time.as_deref()) {
        out.keepalive_time = Some(time);
    }
    if let Some(interval) = seconds(k.interval.as_deref()) {
        out.keepalive_interval = Some(interval);
    }
}

/// Panic mode off (a threshold of 0) where outlier detection set no threshold, as istiod
/// does for every service that may send not-ready endpoints (all, by its default
/// `PILOT_AUTO_SEND_UNHEALTHY_ENDPOINTS`): Envoy's default of 50% would send requests to
/// the `UNHEALTHY` endpoints of a service with fewer than half of them ready. Not for
/// clusters whose load balancer the cluster provides (original destination).
pub fn no_panic_by_default(c: &mut Cluster) {
    if c.lb_policy == LbPolicy::ClusterProvided as i32 {
        return;
    }
    let lb = c
        .common_lb_config
        .get_or_insert_with(CommonLbConfig::default);
    if lb.healthy_panic_threshold.is_none() {
        lb.healthy_panic_threshold = Some(Percent { value: 0.0 });
    }
}

/// Consecutive-error ejection: success-rate ejection off, each consecutive-error kind
/// enforced fully when set above zero, and the panic threshold at `minHealthPercent` (0,
/// panic mode off, when unset).
pub fn outlier_detection(c: &mut Cluster, outlier: Option<&OutlierDetection>) {
    let Some(o) = outlier else {
        return;
    };
    let value = |value: u32| Some(UInt32Value { value });
    let enforcing = |errors: u32| value(if errors > 0 { 100 } else { 0 });
    let mut out = EnvoyOutlierDetection {
        enforcing_success_rate: value(0),
        interval: optional_duration(o.interval.as_deref()),
        base_ejection_time: optional_duration(o.base_ejection_time.as_deref()),
        ..Default::default()
    };
    if let Some(n) = o.consecutive_5xx_errors {
        out.consecutive_5xx = value(n);
        out.enforcing_consecutive_5xx = enforcing(n);
    }
    if let Some(n) = o.consecutive_gateway_errors {
        out.consecutive_gateway_failure = value(n);
        out.enforcing_consecutive_gateway_failure = enforcing(n);
    }
    if let Some(p) = o.max_ejection_percent.filter(|p| *p > 0) {
        out.max_ejection_percent = value(p as u32);
    }
    if o.split_external_local_origin_errors == Some(true) {
        out.split_external_local_origin_errors = true;
        if let Some(n) = o.consecutive_local_origin_failures.filter(|n| *n > 0) {
            out.consecutive_local_origin_failure = value(n);
            out.enforcing_consecutive_local_origin_failure = value(100);
        }
        out.enforcing_local_origin_success_rate = value(0);
    }
    c.outlier_detection = Some(out);
    let min_health = o.min_health_percent.unwrap_or(0);
    if min_health >= 0 {
        c.common_lb_config
            .get_or_insert_with(CommonLbConfig::default)
            .healthy_panic_threshold = Some(Percent {
            value: f64::from(min_health),
        });
    }
}
