//! `DestinationRule`: subsets and traffic policies.

use super::*;

#[cfg_attr(feature = "crd", derive(CustomResource))]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[cfg_attr(
    feature = "crd",
    kube(
        group = "networking.istio.io",
        version = "v1",
        kind = "DestinationRule",
        plural = "destinationrules",
        shortname = "dr",
        namespaced,
        status = "IstioStatus",
        category = "istio-io",
        category = "networking-istio-io"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct DestinationRuleSpec {
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_policy: Option<TrafficPolicy>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subsets: Vec<Subset>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub export_to: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<crate::WorkloadSelector>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Subset {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_policy: Option<TrafficPolicy>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrafficPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_pool: Option<ConnectionPoolSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClientTlsSettings>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub port_level_settings: Vec<PortTrafficPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<TunnelSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<ProxyProtocol>,
}

/// `TrafficPolicy.TunnelSettings`: TCP to the destination is carried in an HTTP `CONNECT`
/// (or `POST`) request for `targetHost:targetPort` to the destination (a proxy).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TunnelSettings {
    /// `CONNECT` (the default) or `POST`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(default)]
    pub target_host: String,
    #[serde(default)]
    pub target_port: u32,
}

/// `TrafficPolicy.ProxyProtocol`: connections to the upstream start with a PROXY protocol
/// header of `version` (`V1`, the default, or `V2`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ProxyProtocol {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// `TrafficPolicy.PortTrafficPolicy`: one port's connection pool, load balancer, outlier
/// detection and TLS. On that port they replace the whole policy's four, unset ones
/// falling back to the defaults, not to the policy's (as Istio documents).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortTrafficPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<PortSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_pool: Option<ConnectionPoolSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClientTlsSettings>,
}

/// `ClientTLSSettings`: how a proxy speaks TLS to the destination. `ISTIO_MUTUAL` uses the
/// mesh's certificates; `SIMPLE` and `MUTUAL` originate TLS with files in the proxy's
/// container (served by the agent over SDS), or a `credentialName` for gateways.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientTlsSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ClientTlsMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_certificates: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_crl: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ClientTlsMode {
    Disable,
    Simple,
    Mutual,
    IstioMutual,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simple: Option<SimpleLb>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistent_hash: Option<ConsistentHashLb>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality_lb_setting: Option<LocalityLoadBalancerSetting>,
    /// Deprecated: `warmup.duration` alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_duration_secs: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<WarmupConfiguration>,
}

/// `WarmupConfiguration`: new endpoints get a share of requests that grows over
/// `duration` (Envoy's slow start), from `minimumPercent` (10 by default), the faster
/// the larger `aggression` (1 by default, linear).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarmupConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_percent: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggression: Option<f64>,
}

/// `LocalityLoadBalancerSetting`: how traffic is spread over localities (`distribute`),
/// or the order in which they take over when the nearer ones fail (`failover`,
/// `failoverPriority`). Localities are written `region/zone/subzone`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalityLoadBalancerSetting {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub distribute: Vec<LocalityDistribute>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failover: Vec<LocalityFailover>,
    /// Label names, each optionally `name=value`: endpoints sharing more of the leading
    /// labels with the proxy get a higher priority.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failover_priority: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// Traffic from proxies in locality `from` goes to the localities of `to` by weight
/// (percent, summing to 100). A trailing `*` matches any zone or subzone.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct LocalityDistribute {
    #[serde(default)]
    pub from: String,
    #[serde(default)]
    pub to: BTreeMap<String, u32>,
}

/// When region `from` has no healthy endpoint, region `to` takes over before the others.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct LocalityFailover {
    #[serde(default)]
    pub from: String,
    #[serde(default)]
    pub to: String,
}

/// `LoadBalancerSettings.ConsistentHashLB`: requests hashed on one key (a header, a
/// cookie, the source IP or a query parameter) to a ring-hash or Maglev ring.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsistentHashLb {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_header_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_cookie: Option<HttpCookie>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_source_ip: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_query_parameter_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_hash: Option<RingHash>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maglev: Option<Maglev>,
    /// Deprecated in Istio for `ringHash.minimumRingSize`; still honoured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_ring_size: Option<u64>,
}

/// `ConsistentHashLB.HTTPCookie`: Envoy generates the cookie when a request has none and
/// `ttl` is set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpCookie {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<CookieAttribute>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CookieAttribute {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RingHash {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_ring_size: Option<u64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Maglev {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_size: Option<u64>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SimpleLb {
    Unspecified,
    LeastConn,
    Random,
    Passthrough,
    RoundRobin,
    LeastRequest,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionPoolSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<TcpSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpSettings>,
}

/// `ConnectionPoolSettings.HTTPSettings`. Zero means unset, as in Istio (its fields are
/// plain integers there too).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http1_max_pending_requests: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http2_max_requests: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests_per_connection: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub h2_upgrade_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_client_protocol: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_streams: Option<i32>,
}

/// `OutlierDetection`: consecutive-error ejection of endpoints.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutlierDetection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_external_local_origin_errors: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_local_origin_failures: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_gateway_errors: Option<u32>,
    #[serde(
        default,
        rename = "consecutive5xxErrors",
        skip_serializing_if = "Option::is_none"
    )]
    pub consecutive_5xx_errors: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_ejection_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ejection_percent: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_health_percent: Option<i32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TcpSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_keepalive: Option<TcpKeepalive>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connection_duration: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
}

/// `ConnectionPoolSettings.TCPSettings.TcpKeepalive`: SO_KEEPALIVE on upstream
/// connections, the OS's values for what is unset.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TcpKeepalive {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
}
