//! `telemetry.istio.io`: Telemetry, served as `v1` and `v1alpha1`, with Istio's field
//! names. meshd applies its `accessLogging` ([`crate::translate::access_log`]); `tracing`
//! and `metrics` are kept and reported as not applied.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{AnyObject, IstioStatus, WorkloadSelector, any_object, any_object_list};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "telemetry.istio.io",
    version = "v1",
    kind = "Telemetry",
    plural = "telemetries",
    shortname = "telemetry",
    namespaced,
    status = "IstioStatus",
    category = "istio-io",
    category = "telemetry-istio-io"
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
    #[schemars(schema_with = "any_object_list")]
    pub tracing: Vec<AnyObject>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "any_object_list")]
    pub metrics: Vec<AnyObject>,
}

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
