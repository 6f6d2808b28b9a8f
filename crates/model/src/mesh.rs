//! Mesh-wide settings: Istio's MeshConfig, from the `mesh` key of the `istio` ConfigMap
//! (`istio-REV` for a revision) in the root namespace. Only the fields meshd acts on are
//! read; the rest of MeshConfig is accepted and ignored.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Store;
use super::network::MeshNetworks;
use crate::config::{ConfigObject, Kind, Spec};
use crate::proxy_headers::ProxyHeaders;
use crate::topology::{GatewayTopology, ProxyConfigError};
use api::networking::{LocalityLoadBalancerSetting, OutboundMode, OutboundTrafficPolicy};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MeshConfig {
    /// Namespaces whose objects meshd keeps at all; empty means every namespace.
    #[serde(default)]
    pub discovery_selectors: Vec<LabelSelector>,
    #[serde(default)]
    pub outbound_traffic_policy: Option<OutboundTrafficPolicy>,
    #[serde(default)]
    pub root_namespace: Option<String>,
    #[serde(default)]
    pub trust_domain: Option<String>,
    /// The locality balancing of clusters whose DestinationRule sets none; enabled by
    /// default, as Istio's.
    #[serde(default)]
    pub locality_lb_setting: Option<LocalityLoadBalancerSetting>,
    /// The `exportTo` of DestinationRules that set none: `["*"]` unless `["."]`.
    #[serde(default)]
    pub default_destination_rule_export_to: Vec<String>,
    /// The `exportTo` of Services and ServiceEntries that set none (everyone when empty).
    #[serde(default)]
    pub default_service_export_to: Vec<String>,
    /// The `exportTo` of VirtualServices that set none (everyone when empty).
    #[serde(default)]
    pub default_virtual_service_export_to: Vec<String>,
    /// The external authorizers AuthorizationPolicies with `action: CUSTOM` name, the
    /// tracers `defaultProviders.tracing` names, the access loggers and the Prometheus
    /// providers `defaultProviders.metrics` names. Other kinds are kept by name and not
    /// used.
    #[serde(default)]
    pub extension_providers: Vec<ExtensionProvider>,
    /// Where every proxy writes Envoy's access log (`/dev/stdout` usually); none when
    /// empty. istiod's legacy setting, which applies without a Telemetry resource.
    #[serde(default)]
    pub access_log_file: String,
    /// The access log's format: Envoy's command operators as text, or a JSON object of
    /// them with `accessLogEncoding: JSON`; Istio's own format when empty.
    #[serde(default)]
    pub access_log_format: String,
    /// `TEXT` (the default) or `JSON`.
    #[serde(default)]
    pub access_log_encoding: Option<String>,
    /// Leaves out the listeners' own access log (connections no filter chain matched).
    #[serde(default)]
    pub disable_envoy_listener_log: bool,
    /// Every cluster's connect timeout unless its DestinationRule sets one (10s).
    #[serde(default)]
    pub connect_timeout: Option<String>,
    /// TCP keepalive on every cluster's upstream connections; a DestinationRule's
    /// `connectionPool.tcp.tcpKeepalive` overrides what it sets, field by field.
    #[serde(default)]
    pub tcp_keepalive: Option<api::networking::TcpKeepalive>,
    /// `UPGRADE`: outbound clusters of ports declared HTTP speak HTTP/2 upstream unless
    /// their DestinationRule says `DO_NOT_UPGRADE` (default `DO_NOT_UPGRADE`).
    #[serde(default)]
    pub h2_upgrade_policy: Option<String>,
    /// `mode: LOCALHOST` sends inbound traffic to the application on loopback instead of
    /// its original destination (`PASSTHROUGH`, the default).
    #[serde(default)]
    pub inbound_traffic_policy: Option<InboundTrafficPolicy>,
    /// How long sniffing listeners wait for a client's first bytes before serving the
    /// connection as TCP (a Go duration; no limit when unset or 0s).
    #[serde(default)]
    pub protocol_detection_timeout: Option<String>,
    /// How connection managers normalize request paths (`BASE` when unset).
    #[serde(default)]
    pub path_normalization: Option<PathNormalizationSetting>,
    /// The retry policy of routes no VirtualService `retries` configures (Istio's default
    /// policy when unset; `attempts: 0` turns retries off).
    #[serde(default)]
    pub default_http_retry_policy: Option<api::networking::HttpRetry>,
    /// The retry policy of inbound routes (two retries of requests reset before they
    /// reached the application when unset; `attempts: 0` turns them off).
    #[serde(default)]
    pub default_inbound_http_retry_policy: Option<api::networking::HttpRetry>,
    /// A pattern naming outbound clusters and tcp_proxies in Envoy's statistics instead
    /// of `outbound|PORT|SUBSET|HOST` (`%SERVICE%`, `%SERVICE_PORT%`, ...;
    /// `translate::stat_name`); their Istio names when empty.
    #[serde(default)]
    pub outbound_cluster_stat_name: String,
    /// The same for inbound clusters and tcp_proxies (`inbound|PORT||`).
    #[serde(default)]
    pub inbound_cluster_stat_name: String,
    /// istiod's legacy tracing switch (default on): with no `defaultProviders.tracing`,
    /// every connection manager samples requests for the tracer the proxy's bootstrap
    /// names (`translate::tracing`).
    #[serde(default)]
    pub enable_tracing: Option<bool>,
    /// Whether the injector points Prometheus at the agent's merged metrics (on unless
    /// `false`).
    #[serde(default)]
    pub enable_prometheus_merge: Option<bool>,
    /// ProxyConfig defaults; only `tracing`, `gatewayTopology` and `proxyHeaders` are read here (the agent
    /// reads the rest).
    #[serde(default)]
    pub default_config: ProxyConfig,
    /// The providers used when no Telemetry resource names one: `tracing` and
    /// `accessLogging`.
    #[serde(default)]
    pub default_providers: DefaultProviders,
    /// The TLS versions and cipher suites sidecars accept on inbound mutual TLS
    /// (`crate::tls::TlsParams::mesh_inbound`).
    #[serde(default, rename = "meshMTLS", skip_serializing_if = "Option::is_none")]
    pub mesh_mtls: Option<crate::tls::MeshTlsConfig>,
    /// The TLS versions, cipher suites and curves of gateways' SIMPLE and MUTUAL servers
    /// and of TLS DestinationRules originate, where those set none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_defaults: Option<crate::tls::MeshTlsConfig>,
    /// MeshNetworks, from the ConfigMap's `meshNetworks` key (not part of `mesh`).
    #[serde(skip_deserializing, skip_serializing_if = "MeshNetworks::is_empty")]
    pub mesh_networks: MeshNetworks,
}

/// MeshConfig `extensionProviders[]`: authorizers, tracers, access loggers, Prometheus.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ExtensionProvider {
    pub name: String,
    pub envoy_ext_authz_http: Option<ExtAuthzHttp>,
    pub envoy_ext_authz_grpc: Option<ExtAuthzGrpc>,
    pub zipkin: Option<ZipkinProvider>,
    pub opentelemetry: Option<OpenTelemetryProvider>,
    pub envoy_file_access_log: Option<FileAccessLogProvider>,
    /// `prometheus`: Istio's stats filters on proxies built with Istio's extensions
    /// (`translate::istio_proxy`); its settings are not read.
    pub prometheus: Option<serde_json::Value>,
}

/// `envoyFileAccessLog`: Envoy's file access logger.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct FileAccessLogProvider {
    /// `/dev/stdout` when empty.
    pub path: String,
    pub log_format: Option<FileLogFormat>,
    pub omit_empty_values: bool,
}

/// `envoyFileAccessLog.logFormat`: a text format, or JSON `labels` (key → command
/// operator).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct FileLogFormat {
    pub text: Option<String>,
    pub labels: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The access log provider every mesh has, as istiod's default MeshConfig lists it (a
/// ConfigMap's provider of that name takes its place).
pub const BUILTIN_ACCESS_LOG_PROVIDER: &str = "envoy";

/// The metrics provider every mesh has, as istiod's default MeshConfig lists it.
pub const BUILTIN_METRICS_PROVIDER: &str = "prometheus";

impl ExtensionProvider {
    /// The service (`[namespace/]hostname`) and port of an external authorizer; `None`
    /// for other kinds of provider.
    pub fn authorizer(&self) -> Option<(&str, u32)> {
        match (&self.envoy_ext_authz_http, &self.envoy_ext_authz_grpc) {
            (Some(h), _) => Some((&h.service, h.port)),
            (None, Some(g)) => Some((&g.service, g.port)),
            (None, None) => None,
        }
    }
}

impl MeshConfig {
    /// The extension provider named `name` (case-insensitive, as istiod's
    /// `fetchProvider`), the built-in `envoy` access log provider included.
    pub fn extension_provider(
        &self,
        name: &str,
    ) -> Option<std::borrow::Cow<'_, ExtensionProvider>> {
        if let Some(p) =
            (self.extension_providers.iter()).find(|p| p.name.eq_ignore_ascii_case(name))
        {
            return Some(std::borrow::Cow::Borrowed(p));
        }
        if name.eq_ignore_ascii_case(BUILTIN_METRICS_PROVIDER) {
            return Some(std::borrow::Cow::Owned(ExtensionProvider {
                name: BUILTIN_METRICS_PROVIDER.into(),
                prometheus: Some(serde_json::Value::Object(Default::default())),
                ..Default::default()
            }));
        }
        name.eq_ignore_ascii_case(BUILTIN_ACCESS_LOG_PROVIDER)
            .then(|| {
                std::borrow::Cow::Owned(ExtensionProvider {
                    name: BUILTIN_ACCESS_LOG_PROVIDER.into(),
                    envoy_file_access_log: Some(FileAccessLogProvider {
                        path: "/dev/stdout".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
            })
    }

    /// `enableTracing`, on unless set false.
    pub fn tracing_enabled(&self) -> bool {
        self.enable_tracing != Some(false)
    }
}

/// MeshConfig `inboundTrafficPolicy`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct InboundTrafficPolicy {
    /// `PASSTHROUGH` or `LOCALHOST`.
    pub mode: Option<String>,
}

/// MeshConfig `pathNormalization`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PathNormalizationSetting {
    /// `NONE`, `BASE` (`DEFAULT`), `MERGE_SLASHES` or `DECODE_AND_MERGE_SLASHES`.
    pub normalization: Option<String>,
}

/// MeshConfig `defaultConfig`: the ProxyConfig fields meshd acts on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProxyConfig {
    pub tracing: Option<ProxyTracing>,
    /// Every other field, as written: the injector hands them to the agent
    /// (`PROXY_CONFIG`).
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

impl ProxyConfig {
    /// Its `gatewayTopology` ([`GatewayTopology::from_proxy_config`]).
    pub fn gateway_topology(&self) -> Result<Option<GatewayTopology>, ProxyConfigError> {
        GatewayTopology::from_proxy_config(&self.other)
    }

    /// Its `proxyHeaders` ([`ProxyHeaders::from_proxy_config`]).
    pub fn proxy_headers(&self) -> Result<Option<ProxyHeaders>, ProxyConfigError> {
        ProxyHeaders::from_proxy_config(&self.other)
    }
}

/// ProxyConfig `tracing`: what applies to every tracer (the agent reads the tracer's own
/// address from the rest of it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProxyTracing {
    /// The percentage of requests sampled (0 means `PILOT_TRACE_SAMPLING`).
    pub sampling: f64,
    pub custom_tags: BTreeMap<String, CustomTag>,
    pub max_path_tag_length: u32,
    /// Istio's own tags (canonical service, namespace, mesh and cluster); on by default.
    pub enable_istio_tags: Option<bool>,
}

pub use api::telemetry::{CustomTag, LiteralTag, NamedTag};

/// MeshConfig `defaultProviders`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DefaultProviders {
    /// The tracer every proxy reports spans to: the first name counts, as in istiod.
    pub tracing: Vec<String>,
    /// The access log providers of every proxy no Telemetry resource gives others
    /// (`translate::access_log`).
    pub access_logging: Vec<String>,
    /// The metrics providers of every proxy: a Prometheus one gives proxies built with
    /// Istio's extensions its stats filters (Istio's chart names `prometheus`).
    pub metrics: Vec<String>,
}

/// `zipkin`: a Zipkin collector (Jaeger takes the same API).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ZipkinProvider {
    /// `[namespace/]hostname` of the collector's service.
    pub service: String,
    pub port: u32,
    pub max_tag_length: u32,
    /// 64-bit trace ids instead of Istio's 128-bit ones.
    #[serde(rename = "enable64bitTraceId")]
    pub enable_64bit_trace_id: bool,
    /// The collector's span path (`/api/v2/spans` when empty).
    pub path: String,
    /// `USE_B3` (the default) or `USE_B3_WITH_W3C_PROPAGATION`.
    pub trace_context_option: Option<String>,
    /// How long a span report may take (5s when unset).
    pub timeout: Option<String>,
    pub headers: Vec<ProviderHeader>,
}

/// `opentelemetry`: an OTLP collector, over gRPC unless `http` is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct OpenTelemetryProvider {
    pub service: String,
    pub port: u32,
    pub max_tag_length: u32,
    pub http: Option<OtlpHttp>,
    pub grpc: Option<OtlpGrpc>,
}

/// OTLP over HTTP: the traces path (e.g. `/v1/traces`), timeout and headers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct OtlpHttp {
    pub path: String,
    pub timeout: Option<String>,
    pub headers: Vec<ProviderHeader>,
}

/// OTLP over gRPC: the call's timeout and initial metadata.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct OtlpGrpc {
    pub timeout: Option<String>,
    pub initial_metadata: Vec<ProviderHeader>,
}

/// A header a provider sends: `value`, or the value of meshd's own environment variable
/// `envName`, as istiod reads its own.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProviderHeader {
    pub name: String,
    pub value: String,
    pub env_name: String,
}

/// `envoyExtAuthzHttp`: an HTTP authorization service, Istio's field names.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ExtAuthzHttp {
    /// `[namespace/]hostname` of the service.
    pub service: String,
    pub port: u32,
    pub timeout: Option<String>,
    pub path_prefix: String,
    pub fail_open: bool,
    pub status_on_error: String,
    pub include_request_headers_in_check: Vec<String>,
    /// Deprecated name of `includeRequestHeadersInCheck`.
    pub include_headers_in_check: Vec<String>,
    pub include_additional_headers_in_check: BTreeMap<String, String>,
    pub headers_to_upstream_on_allow: Vec<String>,
    pub headers_to_downstream_on_deny: Vec<String>,
    pub headers_to_downstream_on_allow: Vec<String>,
    pub include_request_body_in_check: Option<ExtAuthzRequestBody>,
}

/// `envoyExtAuthzGrpc`: a gRPC authorization service (Envoy's `ext_authz` API).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ExtAuthzGrpc {
    pub service: String,
    pub port: u32,
    pub timeout: Option<String>,
    pub fail_open: bool,
    pub status_on_error: String,
    pub include_request_body_in_check: Option<ExtAuthzRequestBody>,
}

/// `includeRequestBodyInCheck`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ExtAuthzRequestBody {
    pub max_request_bytes: u32,
    pub allow_partial_message: bool,
    pub pack_as_bytes: bool,
}

/// A Kubernetes label selector (`matchLabels` and `matchExpressions`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<LabelRequirement>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LabelRequirement {
    pub key: String,
    pub operator: String,
    pub values: Vec<String>,
}

impl LabelSelector {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        api::labels_match(&self.match_labels, labels)
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator.as_str() {
                    "In" => value.is_some_and(|v| r.values.contains(v)),
                    "NotIn" => value.is_none_or(|v| !r.values.contains(v)),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    _ => false,
                }
            })
    }
}

/// istiod's variable for the percentage of requests traced when MeshConfig's
/// `defaultConfig.tracing.sampling` is unset.
pub const TRACE_SAMPLING_ENV: &str = "PILOT_TRACE_SAMPLING";

/// What is wrong with MeshConfig or a setting that stands in for it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MeshConfigError {
    #[error("{0} (MeshConfig's fields are Istio's camelCase names)")]
    Yaml(String),
    #[error("{TRACE_SAMPLING_ENV} {0:?} is not a percentage from 0 to 100; 1 is used")]
    TraceSampling(String),
}

/// `PILOT_TRACE_SAMPLING`'s value as a percentage: 1 when unset, an error naming the
/// variable when not a number from 0 to 100.
pub fn trace_sampling(value: Option<&str>) -> Result<f64, MeshConfigError> {
    let Some(v) = value else { return Ok(1.0) };
    match v.trim().parse::<f64>() {
        Ok(f) if (0.0..=100.0).contains(&f) => Ok(f),
        _ => Err(MeshConfigError::TraceSampling(v.to_string())),
    }
}

/// The namespace holding mesh-wide config when MeshConfig does not name one.
pub const DEFAULT_ROOT_NAMESPACE: &str = "istio-system";

/// The access log format `accessLogEncoding` and `accessLogFormat` ask for.
#[derive(Clone, Debug, PartialEq)]
pub enum AccessLogFormat {
    /// Envoy's command operators as text; Istio's text format when empty.
    Text(String),
    /// A JSON object of command operators.
    Json(serde_json::Map<String, serde_json::Value>),
    /// Istio's JSON format.
    IstioJson,
}

impl MeshConfig {
    /// The access log format, and what is wrong with the settings if anything (field,
    /// message): Istio's format of the encoding then applies, as with istiod.
    pub fn access_log_format(&self) -> (AccessLogFormat, Option<(&'static str, String)>) {
        let encoding = self.access_log_encoding.as_deref().unwrap_or("TEXT");
        let format = &self.access_log_format;
        match encoding.to_ascii_uppercase().as_str() {
            "TEXT" => (AccessLogFormat::Text(format.clone()), None),
            "JSON" if format.is_empty() => (AccessLogFormat::IstioJson, None),
            "JSON" => match serde_json::from_str::<serde_json::Value>(format) {
                Ok(serde_json::Value::Object(map)) => (AccessLogFormat::Json(map), None),
                _ => (
                    AccessLogFormat::IstioJson,
                    Some((
                        "accessLogFormat",
                        "is not a JSON object of command operators; Istio's JSON format is used"
                            .into(),
                    )),
                ),
            },
            other => (
                AccessLogFormat::Text(String::new()),
                Some((
                    "accessLogEncoding",
                    format!("{other:?} is neither TEXT nor JSON; TEXT is used"),
                )),
            ),
        }
    }
}

impl MeshConfig {
    /// Parses the `mesh` key's YAML; unknown MeshConfig fields are ignored.
    pub fn parse(yaml: &str) -> Result<MeshConfig, MeshConfigError> {
        if yaml.trim().is_empty() {
            return Ok(MeshConfig::default());
        }
        serde_saphyr::from_str(yaml).map_err(|e| MeshConfigError::Yaml(e.to_string()))
    }

    /// Whether objects in a namespace with these labels are kept (`discoverySelectors`).
    pub fn selects(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        self.discovery_selectors.is_empty()
            || namespace == self.root_namespace()
            || self.discovery_selectors.iter().any(|s| s.matches(labels))
    }

    pub fn root_namespace(&self) -> &str {
        self.root_namespace
            .as_deref()
            .unwrap_or(DEFAULT_ROOT_NAMESPACE)
    }

    /// REGISTRY_ONLY: traffic to hosts the mesh does not know is refused.
    pub fn registry_only(&self) -> bool {
        self.outbound_traffic_policy.as_ref().and_then(|p| p.mode)
            == Some(OutboundMode::RegistryOnly)
    }

    /// The mesh ConfigMap's settings held in `store`: the one in its root namespace, else
    /// any, else the defaults.
    pub fn from_store(store: &Store) -> MeshConfig {
        Self::source(store)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }

    /// The ConfigMap [`MeshConfig::from_store`] reads, and its settings.
    pub fn source(store: &Store) -> Option<(&ConfigObject, &MeshConfig)> {
        let configs: Vec<(&ConfigObject, &MeshConfig)> = store
            .of_kind(Kind::ConfigMap)
            .filter_map(|o| match &o.spec {
                Spec::MeshConfig(m) => Some((&**o, m)),
                _ => None,
            })
            .collect();
        configs
            .iter()
            .find(|(o, m)| o.key.namespace == m.root_namespace())
            .or(configs.first())
            .copied()
    }

    /// The name of the mesh ConfigMap for a revision.
    pub fn configmap_name(revision: &str) -> String {
        if revision == "default" {
            "istio".to_string()
        } else {
            format!("istio-{revision}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn mesh_config_reads_what_meshd_uses_and_ignores_the_rest() {
        let m = MeshConfig::parse(
            "accessLogFile: /dev/stdout\noutboundTrafficPolicy: {mode: REGISTRY_ONLY}\ndiscoverySelectors:\n- matchLabels: {mesh: on}\n- matchExpressions: [{key: team, operator: In, values: [pay, shop]}]\n",
        )
        .unwrap();
        assert!(m.registry_only());
        assert!(m.selects("a", &labels(&[("mesh", "on")])));
        assert!(m.selects("b", &labels(&[("team", "shop")])));
        assert!(!m.selects("c", &labels(&[("team", "ops")])));
        assert!(
            m.selects("istio-system", &labels(&[])),
            "the root namespace is always kept"
        );
        assert!(MeshConfig::parse("").unwrap().selects("x", &labels(&[])));
        assert!(MeshConfig::parse("discoverySelectors: 3").is_err());
    }

    #[test]
    fn label_selector_operators_follow_kubernetes() {
        let r = |op: &str, values: &[&str]| LabelSelector {
            match_labels: BTreeMap::new(),
            match_expressions: vec![LabelRequirement {
                key: "k".into(),
                operator: op.into(),
                values: values.iter().map(|v| v.to_string()).collect(),
            }],
        };
        let with = labels(&[("k", "v")]);
        let without = labels(&[]);
        assert!(r("NotIn", &["x"]).matches(&with) && r("NotIn", &["x"]).matches(&without));
        assert!(!r("NotIn", &["v"]).matches(&with));
        assert!(r("Exists", &[]).matches(&with) && !r("Exists", &[]).matches(&without));
        assert!(r("DoesNotExist", &[]).matches(&without));
        assert!(!r("Bogus", &[]).matches(&with));
    }
}
