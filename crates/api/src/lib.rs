//! Istio's configuration API, as Rust types.
//!
//! Field names follow Istio's protobuf JSON names exactly (camelCase, same nesting), so
//! manifests written for istiod load unchanged. With the `crd` feature each kind is a kube
//! `CustomResource`, which gives `meshd crds` its schemas, and `crd` adds the extra served
//! apiVersions; without it the crate is the specs alone.
//!
//! Fields meshd does not interpret yet are kept as free-form JSON ([`AnyObject`]) rather
//! than dropped, so they round-trip and never trigger an "unknown field" warning.

#[cfg(feature = "crd")]
pub mod crd;
pub mod duration;
pub mod networking;
#[cfg(feature = "crd")]
pub mod operator;
pub mod security;
pub mod telemetry;
pub mod values;
pub mod versions;

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A part of Istio's API that meshd accepts and preserves but does not interpret yet.
pub type AnyObject = serde_json::Map<String, serde_json::Value>;

/// Schema for [`AnyObject`] fields: any object, preserved as written.
pub(crate) fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Schema for a list of free-form objects.
pub(crate) fn any_object_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": { "type": "object", "x-kubernetes-preserve-unknown-fields": true }
    })
}

/// The status every Istio object carries (`IstioStatus`): conditions, validation messages
/// and the generation they describe; fields other controllers write are kept.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
// As in Istio's CRDs: a ServiceEntry's status also holds the `addresses` istiod's IP
// auto-allocation writes, which the API server would otherwise prune.
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct IstioStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<IstioCondition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validation_messages: Vec<ValidationMessage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IstioCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ValidationMessage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documentation_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "type")]
    pub type_: Option<ValidationMessageType>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ValidationMessageType {
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub name: String,
}

/// `istio.type.v1beta1.WorkloadSelector`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

/// `networking.istio.io` `WorkloadSelector` (used by Sidecar and ServiceEntry): plain labels.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct LabelSelector {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// True when every selector label is present with the same value in `labels`.
pub fn labels_match(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}
