//! `security.istio.io`: PeerAuthentication, RequestAuthentication and AuthorizationPolicy,
//! served as `v1` and `v1beta1`, with Istio's field names.

use std::collections::BTreeMap;

#[cfg(feature = "crd")]
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[cfg(feature = "crd")]
use super::IstioStatus;
use super::{AnyObject, WorkloadSelector, any_object, any_object_list};

/// The annotation that makes an ALLOW or DENY AuthorizationPolicy a dry run: its rules
/// are evaluated and counted, never enforced.
pub const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

/// The `istio.io/dry-run` annotation's value, read as Go's `strconv.ParseBool` reads it
/// (istiod's): `None` when absent, `Some(Err(value))` when not a boolean.
pub fn dry_run_value(annotations: &BTreeMap<String, String>) -> Option<Result<bool, &str>> {
    let value = annotations.get(DRY_RUN_ANNOTATION)?;
    Some(crate::duration::parse_bool(value).ok_or(value.as_str()))
}

/// Whether the annotations make a policy a dry run (an invalid value is refused at
/// validation; here it counts as absent, as istiod reads it).
pub fn dry_run(annotations: &BTreeMap<String, String>) -> Option<bool> {
    dry_run_value(annotations).and_then(Result::ok)
}

#[cfg_attr(feature = "crd", derive(CustomResource))]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[cfg_attr(
    feature = "crd",
    kube(
        group = "security.istio.io",
        version = "v1",
        kind = "PeerAuthentication",
        plural = "peerauthentications",
        shortname = "pa",
        namespaced,
        status = "IstioStatus",
        category = "istio-io",
        category = "security-istio-io"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PeerAuthenticationSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<WorkloadSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtls: Option<MutualTls>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub port_level_mtls: BTreeMap<u32, MutualTls>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct MutualTls {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<MtlsMode>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MtlsMode {
    Unset,
    Disable,
    Permissive,
    Strict,
}

#[cfg_attr(feature = "crd", derive(CustomResource))]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[cfg_attr(
    feature = "crd",
    kube(
        group = "security.istio.io",
        version = "v1",
        kind = "AuthorizationPolicy",
        plural = "authorizationpolicies",
        shortname = "ap",
        namespaced,
        status = "IstioStatus",
        category = "istio-io",
        category = "security-istio-io"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationPolicySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<WorkloadSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub target_ref: Option<AnyObject>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "any_object_list")]
    pub target_refs: Vec<AnyObject>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<Rule>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<AuthorizationAction>,
    /// The external authorizer of a CUSTOM policy (a MeshConfig `extensionProviders` name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ExtensionProviderRef>,
}

#[cfg_attr(feature = "crd", derive(CustomResource))]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[cfg_attr(
    feature = "crd",
    kube(
        group = "security.istio.io",
        version = "v1",
        kind = "RequestAuthentication",
        plural = "requestauthentications",
        shortname = "ra",
        namespaced,
        status = "IstioStatus",
        category = "istio-io",
        category = "security-istio-io"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RequestAuthenticationSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<WorkloadSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub target_ref: Option<AnyObject>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "any_object_list")]
    pub target_refs: Vec<AnyObject>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jwt_rules: Vec<JwtRule>,
}

/// `JWTRule`: how one issuer's tokens are found and checked.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JwtRule {
    #[serde(default)]
    pub issuer: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audiences: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_uri: Option<String>,
    /// The JSON Web Key Set, inline (wins over `jwksUri`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from_headers: Vec<JwtHeader>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from_params: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from_cookies: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_payload_to_header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_original_token: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_claim_to_headers: Vec<ClaimToHeader>,
    /// How long fetching `jwksUri` may take (a duration, 5s by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub space_delimited_claims: Vec<String>,
}

/// `JWTHeader`: a header a token is read from, after `prefix`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct JwtHeader {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

/// `ClaimToHeader`: a claim copied into a request header.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ClaimToHeader {
    #[serde(default)]
    pub header: String,
    #[serde(default)]
    pub claim: String,
}

/// `AuthorizationPolicy.provider`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionProviderRef {
    #[serde(default)]
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AuthorizationAction {
    Allow,
    Deny,
    Audit,
    Custom,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<RuleFrom>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<RuleTo>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<Condition>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct RuleFrom {
    #[serde(default)]
    pub source: Source,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct RuleTo {
    #[serde(default)]
    pub operation: Operation,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub principals: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_principals: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request_principals: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_request_principals: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_namespaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_blocks: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_ip_blocks: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote_ip_blocks: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_remote_ip_blocks: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_accounts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_service_accounts: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_ports: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_methods: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_paths: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    pub key: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_values: Vec<String>,
}
