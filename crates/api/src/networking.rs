//! `networking.istio.io`: VirtualService, DestinationRule, Gateway, ServiceEntry, Sidecar and
//! WorkloadEntry. Served as `v1`, `v1beta1` and `v1alpha3`, all with this one schema.

use std::collections::BTreeMap;

#[cfg(feature = "crd")]
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[cfg(feature = "crd")]
use super::IstioStatus;
use super::{AnyObject, LabelSelector, any_object};

mod destination_rule;
mod virtual_service;

pub use self::destination_rule::*;
pub use self::virtual_service::*;

// ---------------------------------------------------------------- Gateway

#[cfg_attr(feature = "crd", derive(CustomResource))]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[cfg_attr(
    feature = "crd",
    kube(
        group = "networking.istio.io",
        version = "v1",
        kind = "Gateway",
        plural = "gateways",
        shortname = "gw",
        namespaced,
        status = "IstioStatus",
        category = "istio-io",
        category = "networking-istio-io"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    #[serde(default)]
    pub servers: Vec<Server>,
    #[serde(default)]
    pub selector: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Server {
    pub port: Port,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind: Option<String>,
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub tls: Option<AnyObject>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `networking.istio.io` `Port` (Gateway servers) and `ServicePort` (ServiceEntry).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    pub number: u32,
    #[serde(default)]
    pub protocol: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_port: Option<u32>,
}

// ---------------------------------------------------------------- ServiceEntry

#[cfg_attr(feature = "crd", derive(CustomResource))]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[cfg_attr(
    feature = "crd",
    kube(
        group = "networking.istio.io",
        version = "v1",
        kind = "ServiceEntry",
        plural = "serviceentries",
        shortname = "se",
        namespaced,
        status = "IstioStatus",
        category = "istio-io",
        category = "networking-istio-io"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceEntrySpec {
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    #[serde(default)]
    pub ports: Vec<Port>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<Location>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<Resolution>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<WorkloadEntrySpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub export_to: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Location {
    MeshExternal,
    MeshInternal,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Resolution {
    None,
    Static,
    Dns,
    DnsRoundRobin,
}

// ---------------------------------------------------------------- WorkloadEntry

#[cfg_attr(feature = "crd", derive(CustomResource))]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[cfg_attr(
    feature = "crd",
    kube(
        group = "networking.istio.io",
        version = "v1",
        kind = "WorkloadEntry",
        plural = "workloadentries",
        shortname = "we",
        namespaced,
        status = "IstioStatus",
        category = "istio-io",
        category = "networking-istio-io"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadEntrySpec {
    #[serde(default)]
    pub address: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ports: BTreeMap<String, u32>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
}

// ---------------------------------------------------------------- Sidecar

#[cfg_attr(feature = "crd", derive(CustomResource))]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[cfg_attr(
    feature = "crd",
    kube(
        group = "networking.istio.io",
        version = "v1",
        kind = "Sidecar",
        plural = "sidecars",
        namespaced,
        status = "IstioStatus",
        category = "istio-io",
        category = "networking-istio-io"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct SidecarSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<IstioIngressListener>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<IstioEgressListener>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbound_traffic_policy: Option<OutboundTrafficPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inbound_connection_pool: Option<ConnectionPoolSettings>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IstioIngressListener {
    pub port: Port,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture_mode: Option<String>,
    /// `127.0.0.1:PORT`, `0.0.0.0:PORT` or `unix://PATH`: where the application listens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub tls: Option<AnyObject>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_pool: Option<ConnectionPoolSettings>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IstioEgressListener {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<Port>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture_mode: Option<String>,
    #[serde(default)]
    pub hosts: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutboundTrafficPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<OutboundMode>,
    /// Where traffic to hosts outside the registry goes under ALLOW_ANY, instead of its
    /// original destination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_proxy: Option<Destination>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OutboundMode {
    RegistryOnly,
    AllowAny,
}
