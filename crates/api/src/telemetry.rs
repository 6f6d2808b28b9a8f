//! `telemetry.istio.io`: Telemetry, served as `v1` and `v1alpha1`, with Istio's field
//! names. meshd applies its `accessLogging` (`translate::access_log`), `tracing`
//! (`translate::tracing`) and `metrics` (`translate::istio_proxy`, for proxies with
//! Istio's stats filter).

use std::collections::BTreeMap;

#[cfg(feature = "crd")]
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[cfg(feature = "crd")]
use super::IstioStatus;
use super::{AnyObject, WorkloadSelector, any_object, any_object_list};

#[cfg_attr(feature = "crd", derive(CustomResource))]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[cfg_attr(
    feature = "crd",
    kube(
        group = "telemetry.istio.io",
        version = "v1",
        kind = "Telemetry",
        plural = "telemetries",
        shortname = "telemetry",
        namespaced,
        status = "IstioStatus",
        category = "istio-io",
        category = "telemetry-istio-io"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TelemetrySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<WorkloadSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub target_ref: Option<AnyObject>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "any_object_list")]
    pub target_refs: Vec<AnyObject>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_logging: Vec<AccessLogging>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tracing: Vec<TracingEntry>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "any_object_list")]
    pub metrics: Vec<Metrics>,
}

/// `Metrics`: which providers collect metrics, with overrides of the standard ones.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Metrics {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<ProviderRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<MetricsOverrides>,
    /// How often TCP metrics are reported (a protobuf Duration, `15s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reporting_interval: Option<String>,
}

/// `MetricsOverrides`: for the metrics it matches, whether they are dropped and which of
/// their tags are set or removed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MetricsOverrides {
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub r#match: Option<MetricSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tag_overrides: BTreeMap<String, TagOverride>,
}

/// `MetricSelector`: one of Istio's metrics (`REQUEST_COUNT`, ...; `ALL_METRICS` when
/// none is named) or a custom one, on the `CLIENT`, `SERVER` or both sides.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MetricSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_metric: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// `MetricsOverrides.TagOverride`: `UPSERT` (the default) a tag to the value of a CEL
/// expression, or `REMOVE` it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TagOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// Istio's standard metrics (`MetricSelector.IstioMetric` without `ALL_METRICS`), sorted,
/// each with the name its Prometheus provider exports it under (after `istio_`).
pub const ISTIO_METRICS: [(&str, &str); 10] = [
    ("GRPC_REQUEST_MESSAGES", "request_messages_total"),
    ("GRPC_RESPONSE_MESSAGES", "response_messages_total"),
    ("REQUEST_COUNT", "requests_total"),
    ("REQUEST_DURATION", "request_duration_milliseconds"),
    ("REQUEST_SIZE", "request_bytes"),
    ("RESPONSE_SIZE", "response_bytes"),
    ("TCP_CLOSED_CONNECTIONS", "tcp_connections_closed_total"),
    ("TCP_OPENED_CONNECTIONS", "tcp_connections_opened_total"),
    ("TCP_RECEIVED_BYTES", "tcp_received_bytes_total"),
    ("TCP_SENT_BYTES", "tcp_sent_bytes_total"),
];

/// `AccessLogging`: which providers log, for which side of the proxy's traffic.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccessLogging {
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub r#match: Option<LogSelector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<ProviderRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<LogFilter>,
}

/// `AccessLogging.LogSelector`: `CLIENT` (outbound and gateways), `SERVER` (inbound) or
/// `CLIENT_AND_SERVER` (the default).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct LogSelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// Whether an access logging or tracing entry with this `match` applies to `mode`
/// (`CLIENT` or `SERVER`), as istiod's `matchWorkloadMode`.
pub fn applies(selector: &Option<LogSelector>, mode: &str) -> bool {
    let m = selector.as_ref().and_then(|s| s.mode.as_deref());
    m.is_none_or(|m| m == "CLIENT_AND_SERVER" || m == mode)
}

/// `ProviderRef`: a MeshConfig `extensionProviders` name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ProviderRef {
    #[serde(default)]
    pub name: String,
}

/// `AccessLogging.Filter`: a CEL expression a request must satisfy to be logged.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct LogFilter {
    #[serde(default)]
    pub expression: String,
}

/// `Tracing`: which provider reports spans, and how, for which side of the traffic.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TracingEntry {
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub r#match: Option<LogSelector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<ProviderRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub random_sampling_percentage: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_span_reporting: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_tags: Option<BTreeMap<String, CustomTag>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_request_id_for_trace_sampling: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_istio_tags: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_context_propagation: Option<bool>,
}

/// A custom span tag (Telemetry's, and MeshConfig `defaultConfig.tracing.customTags`):
/// exactly one of a literal, an environment variable of the proxy, or a request header.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, rename_all = "camelCase")]
pub struct CustomTag {
    pub literal: Option<LiteralTag>,
    pub environment: Option<NamedTag>,
    pub header: Option<NamedTag>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, rename_all = "camelCase")]
pub struct LiteralTag {
    pub value: String,
}

/// An environment variable or request header, and the value used when it is absent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, rename_all = "camelCase")]
pub struct NamedTag {
    pub name: String,
    pub default_value: String,
}
