//! `operator.meshd.io/v1alpha1`: the resources `meshd operator` reconciles, modelled on the
//! Sail Operator's `Istio`, `IstioRevision` and `IstioRevisionTag`. All three are
//! cluster-scoped, so that one object can own a revision's namespaced and cluster-wide
//! children.
//!
//! - [`Mesh`]: the mesh a platform team declares (version, update strategy, values). It
//!   becomes one [`MeshRevision`] (`InPlace`) or one per version (`RevisionBased`).
//! - [`MeshRevision`]: one control-plane revision; its name is the revision (`default`
//!   is the unsuffixed one) and it may also be created directly.
//! - [`MeshRevisionTag`]: a revision tag, pointing at a revision or at a mesh's active one.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{AnyObject, any_object};

/// The API group.
pub const GROUP: &str = "operator.meshd.io";

/// The version a mesh runs when its spec names none: this build's.
pub const DEFAULT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// A mesh: the control plane a platform team declares.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "operator.meshd.io",
    version = "v1alpha1",
    kind = "Mesh",
    plural = "meshes",
    status = "MeshStatus",
    printcolumn = r#"{"name":"Revisions","type":"integer","jsonPath":".status.revisions.total"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.revisions.ready"}"#,
    printcolumn = r#"{"name":"In use","type":"integer","jsonPath":".status.revisions.inUse"}"#,
    printcolumn = r#"{"name":"Active revision","type":"string","jsonPath":".status.activeRevisionName"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.version"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MeshSpec {
    /// The meshd version; with `RevisionBased`, a new version is a new revision.
    #[serde(default = "default_version")]
    pub version: String,
    /// The namespace the control plane runs in.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    #[serde(default)]
    pub update_strategy: UpdateStrategy,
    #[serde(default)]
    pub values: Values,
}

fn default_version() -> String {
    DEFAULT_VERSION.into()
}

fn default_namespace() -> String {
    "istio-system".into()
}

/// How a new version or new values reach the running control plane.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdateStrategy {
    #[serde(rename = "type", default)]
    pub type_: UpdateStrategyType,
    /// How long a revision no namespace, pod or tag uses is kept before it is removed
    /// (`RevisionBased`).
    #[serde(default = "default_grace_period")]
    #[schemars(range(min = 0))]
    pub inactive_revision_deletion_grace_period_seconds: u64,
}

fn default_grace_period() -> u64 {
    30
}

impl Default for UpdateStrategy {
    fn default() -> Self {
        UpdateStrategy {
            type_: UpdateStrategyType::default(),
            inactive_revision_deletion_grace_period_seconds: default_grace_period(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum UpdateStrategyType {
    /// One revision, named after the mesh, updated in place (its Deployment rolls).
    #[default]
    InPlace,
    /// A revision per version (`MESH-vX-Y-Z`) beside the old one, which is removed once
    /// nothing uses it and the grace period has passed.
    RevisionBased,
}

/// What a revision runs with, in the shape of Istio's Helm values where Istio has one.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Values {
    #[serde(default)]
    pub pilot: Pilot,
    /// The mesh configuration (Istio's `MeshConfig`), written to the revision's `istio`
    /// (or `istio-REV`) ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub mesh_config: Option<AnyObject>,
    #[serde(default)]
    pub global: Global,
    #[serde(default)]
    pub ca: Ca,
}

/// The control plane's Deployment (Istio's `values.pilot`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pilot {
    /// meshd's image; without it, `global.hub`/meshd:`version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Replicas of the Deployment (default 1); above 1 a PodDisruptionBudget keeps one up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replica_count: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Environment of meshd: the seed's tunables (`PILOT_DEBOUNCE_AFTER`,
    /// `PILOT_DEBOUNCE_MAX`, `PILOT_PUSH_THROTTLE`, `PILOT_WORKLOAD_CERT_TTL`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// Istio's `values.global`, the part meshd reads.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Global {
    /// The registry images are pulled from (default `ghcr.io/meshd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hub: Option<String>,
    #[serde(default)]
    pub proxy: Proxy,
}

/// Istio's `values.global.proxy`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Proxy {
    /// The sidecar image injected into pods; without it, `global.hub`/proxy:`version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// Where workload certificates come from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ca {
    #[serde(default)]
    pub mode: CaMode,
    /// `External`: the Istio-compatible CA requests are forwarded to (`https://HOST:PORT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_address: Option<String>,
    /// `External`: a ConfigMap in the revision's namespace whose `root-cert.pem` is the
    /// root the external CA's serving certificate chains to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_root_cert_config_map: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CaMode {
    /// meshd makes its own root (kept in the Secret `istio-ca-secret`).
    #[default]
    SelfSigned,
    /// The Secret `cacerts` (Istio's plug-in CA files) signs.
    PluggedIn,
    /// Requests are forwarded to an external CA.
    External,
}

/// What every operator kind reports: its conditions (a mesh's `Reconciled` and `Ready`,
/// the active revision's; a revision's `Reconciled`, `Ready` and `InUse`; a tag's
/// `Reconciled` and `InUse`), the generation they describe, and a summary.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Observed {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// `Healthy`, or the reason of the first condition that is not True.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// What the operator reports of a mesh.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeshStatus {
    #[serde(flatten)]
    pub observed: Observed,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_revision_name: Option<String>,
    #[serde(default)]
    pub revisions: RevisionCounts,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevisionCounts {
    pub total: i32,
    pub ready: i32,
    pub in_use: i32,
}

/// One control-plane revision; its name is the revision's.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "operator.meshd.io",
    version = "v1alpha1",
    kind = "MeshRevision",
    plural = "meshrevisions",
    shortname = "meshrev",
    status = "MeshRevisionStatus",
    printcolumn = r#"{"name":"Namespace","type":"string","jsonPath":".spec.namespace"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"In use","type":"string","jsonPath":".status.conditions[?(@.type==\"InUse\")].status"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.version"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MeshRevisionSpec {
    #[serde(default = "default_version")]
    pub version: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    #[serde(default)]
    pub values: Values,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeshRevisionStatus {
    #[serde(flatten)]
    pub observed: Observed,
}

/// A revision tag (`istio.io/rev=TAG` selects the revision it points to).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "operator.meshd.io",
    version = "v1alpha1",
    kind = "MeshRevisionTag",
    plural = "meshrevisiontags",
    shortname = "meshrevtag",
    status = "MeshRevisionTagStatus",
    printcolumn = r#"{"name":"Revision","type":"string","jsonPath":".status.revision"}"#,
    printcolumn = r#"{"name":"In use","type":"string","jsonPath":".status.conditions[?(@.type==\"InUse\")].status"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.state"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MeshRevisionTagSpec {
    pub target_ref: TargetRef,
}

/// What a tag points at: a revision, or a mesh's active revision (which follows its
/// `RevisionBased` updates).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct TargetRef {
    pub kind: TargetKind,
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TargetKind {
    Mesh,
    MeshRevision,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeshRevisionTagStatus {
    #[serde(flatten)]
    pub observed: Observed,
    /// The revision the tag resolves to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// That revision's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}
