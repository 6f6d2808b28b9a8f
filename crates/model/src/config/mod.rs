//! Configuration objects as meshd holds them: Istio kinds with their typed specs, and the
//! Kubernetes kinds (Service, EndpointSlice, Pod, Namespace) cut down at the edge to what the
//! model uses. Both sources (the YAML directory here, the Kubernetes API later) produce these
//! and apply them through one path.

pub mod cel;
pub mod parse;
pub mod validate;
pub mod workload;

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use api::networking::{
    DestinationRuleSpec, GatewaySpec, ServiceEntrySpec, SidecarSpec, VirtualServiceSpec,
    WorkloadEntrySpec,
};
use api::security::{AuthorizationPolicySpec, PeerAuthenticationSpec, RequestAuthenticationSpec};
use api::telemetry::TelemetrySpec;

/// The kinds meshd reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Kind {
    VirtualService,
    DestinationRule,
    Gateway,
    ServiceEntry,
    Sidecar,
    WorkloadEntry,
    PeerAuthentication,
    RequestAuthentication,
    AuthorizationPolicy,
    Telemetry,
    Service,
    EndpointSlice,
    /// Core v1 Endpoints: read when `PILOT_USE_ENDPOINT_SLICE=false`, and for a Service
    /// that has no EndpointSlice.
    Endpoints,
    Pod,
    Namespace,
    Node,
    /// TLS Secrets, for gateway `credentialName` (other Secret types are ignored).
    Secret,
    /// Only Istio's mesh ConfigMap (`istio`, or `istio-REV`); other ConfigMaps are ignored.
    ConfigMap,
}

impl Kind {
    pub const ALL: [Kind; 18] = [
        Kind::VirtualService,
        Kind::DestinationRule,
        Kind::Gateway,
        Kind::ServiceEntry,
        Kind::Sidecar,
        Kind::WorkloadEntry,
        Kind::PeerAuthentication,
        Kind::RequestAuthentication,
        Kind::AuthorizationPolicy,
        Kind::Telemetry,
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Endpoints,
        Kind::Pod,
        Kind::Namespace,
        Kind::Node,
        Kind::Secret,
        Kind::ConfigMap,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::VirtualService => "VirtualService",
            Kind::DestinationRule => "DestinationRule",
            Kind::Gateway => "Gateway",
            Kind::ServiceEntry => "ServiceEntry",
            Kind::Sidecar => "Sidecar",
            Kind::WorkloadEntry => "WorkloadEntry",
            Kind::PeerAuthentication => "PeerAuthentication",
            Kind::RequestAuthentication => "RequestAuthentication",
            Kind::AuthorizationPolicy => "AuthorizationPolicy",
            Kind::Telemetry => "Telemetry",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Endpoints => "Endpoints",
            Kind::Pod => "Pod",
            Kind::Namespace => "Namespace",
            Kind::Node => "Node",
            Kind::Secret => "Secret",
            Kind::ConfigMap => "ConfigMap",
        }
    }

    /// API group, as in `apiVersion: GROUP/VERSION` (empty for the core group).
    pub fn group(self) -> &'static str {
        match self {
            Kind::PeerAuthentication | Kind::RequestAuthentication | Kind::AuthorizationPolicy => {
                "security.istio.io"
            }
            Kind::Telemetry => "telemetry.istio.io",
            Kind::Service
            | Kind::Endpoints
            | Kind::Pod
            | Kind::Namespace
            | Kind::Node
            | Kind::Secret
            | Kind::ConfigMap => "",
            Kind::EndpointSlice => "discovery.k8s.io",
            _ => "networking.istio.io",
        }
    }

    /// The apiVersions under which this kind is accepted.
    pub fn versions(self) -> &'static [&'static str] {
        match self.group() {
            "networking.istio.io" => api::versions::NETWORKING_VERSIONS,
            "security.istio.io" => api::versions::SECURITY_VERSIONS,
            "telemetry.istio.io" => api::versions::TELEMETRY_VERSIONS,
            _ => &["v1"],
        }
    }

    /// The resource name in API paths (`/apis/GROUP/VERSION/PLURAL`).
    pub fn plural(self) -> &'static str {
        match self {
            Kind::VirtualService => "virtualservices",
            Kind::DestinationRule => "destinationrules",
            Kind::Gateway => "gateways",
            Kind::ServiceEntry => "serviceentries",
            Kind::Sidecar => "sidecars",
            Kind::WorkloadEntry => "workloadentries",
            Kind::PeerAuthentication => "peerauthentications",
            Kind::RequestAuthentication => "requestauthentications",
            Kind::AuthorizationPolicy => "authorizationpolicies",
            Kind::Telemetry => "telemetries",
            Kind::Service => "services",
            Kind::EndpointSlice => "endpointslices",
            Kind::Endpoints => "endpoints",
            Kind::Pod => "pods",
            Kind::Namespace => "namespaces",
            Kind::Node => "nodes",
            Kind::Secret => "secrets",
            Kind::ConfigMap => "configmaps",
        }
    }

    /// Istio's configuration kinds (as opposed to the Kubernetes workload kinds).
    pub fn is_istio(self) -> bool {
        self.group().ends_with("istio.io")
    }

    /// The path segment Istio uses in config metadata (`.../virtual-service/NAME`).
    pub fn istio_path_segment(self) -> &'static str {
        match self {
            Kind::VirtualService => "virtual-service",
            Kind::DestinationRule => "destination-rule",
            Kind::Gateway => "gateway",
            Kind::ServiceEntry => "service-entry",
            Kind::Sidecar => "sidecar",
            Kind::WorkloadEntry => "workload-entry",
            Kind::PeerAuthentication => "peer-authentication",
            Kind::RequestAuthentication => "request-authentication",
            Kind::AuthorizationPolicy => "authorization-policy",
            Kind::Telemetry => "telemetry",
            _ => "",
        }
    }

    pub fn namespaced(self) -> bool {
        !matches!(self, Kind::Namespace | Kind::Node)
    }

    pub fn from_api(api_version: &str, kind: &str) -> Option<(Kind, bool)> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let k = Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == kind && k.group() == group)?;
        Some((k, k.versions().contains(&version)))
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identity of one configuration object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ObjectKey {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(kind: Kind, namespace: &str, name: &str) -> ObjectKey {
        ObjectKey {
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// `namespace/name`, as Istio names an object in logs, debug output and Envoy
    /// metadata (the form a gateway's listeners and meshd's gateway route cache key on).
    pub fn namespaced_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// The metadata the model uses.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Meta {
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub generation: Option<i64>,
    pub creation_timestamp: Option<String>,
}

/// A Kubernetes Service, cut down.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ServiceDef {
    pub cluster_ip: Option<String>,
    pub headless: bool,
    /// `spec.trafficDistribution` (`PreferClose`, `PreferSameZone`, `PreferSameNode`).
    pub traffic_distribution: Option<String>,
    pub selector: BTreeMap<String, String>,
    pub ports: Vec<ServicePortDef>,
    /// The addresses it is reached at from outside the cluster: its load balancer's
    /// ingress IPs, then `spec.externalIPs` (what a network gateway is known by).
    pub external_addresses: Vec<String>,
    /// Its load balancer's ingress hostnames (cloud load balancers known by name).
    pub external_hostnames: Vec<String>,
    /// An `ExternalName` Service's name (lowercase, no trailing dot): the Service is an
    /// alias of that host.
    pub external_name: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ServicePortDef {
    pub name: String,
    pub port: u32,
    /// Numeric targetPort, or None when it is named (resolved from the endpoints).
    pub target_port: Option<u32>,
    pub target_port_name: Option<String>,
    pub protocol: String,
    pub app_protocol: Option<String>,
}

/// A `discovery.k8s.io/v1` EndpointSlice, cut down.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EndpointSliceDef {
    pub service_name: String,
    pub ports: Vec<(String, u32)>,
    pub endpoints: Vec<SliceEndpoint>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SliceEndpoint {
    pub addresses: Vec<String>,
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
    pub zone: Option<String>,
    pub node_name: Option<String>,
    /// Name of the Pod behind the endpoint (targetRef), used for its labels.
    pub pod: Option<String>,
    /// Its DNS name in a headless Service (`hostname`).
    pub hostname: Option<String>,
}

/// A TLS credential from a Secret (`tls.crt`/`tls.key`/`ca.crt`, or Istio's generic
/// `cert`/`key`/`cacert`), PEM. The key is never serialized (debug views print the rest).
#[derive(Clone, PartialEq, Serialize)]
pub struct SecretDef {
    pub cert: Option<String>,
    #[serde(skip)]
    pub key: Option<String>,
    pub ca: Option<String>,
}

impl fmt::Debug for SecretDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretDef")
            .field("cert", &self.cert.as_ref().map(|c| c.len()))
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field("ca", &self.ca.as_ref().map(|c| c.len()))
            .finish()
    }
}

/// A Pod, cut down to what proxies and endpoints need.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PodDef {
    pub ip: Option<String>,
    pub service_account: Option<String>,
    pub node_name: Option<String>,
    /// The workload it belongs to ([`workload::PodWorkload`]).
    pub workload: String,
}

/// An address IP auto-allocation (istiod's controller, or meshd's
/// `k8s::ipallocate`) gave one host of a ServiceEntry: an entry of its
/// `status.addresses`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AllocatedAddress {
    pub host: String,
    pub ip: std::net::IpAddr,
}

/// The typed body of a configuration object.
// Objects live behind an `Arc` in the store, so the variant sizes cost one allocation each.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Spec {
    VirtualService(VirtualServiceSpec),
    DestinationRule(DestinationRuleSpec),
    Gateway(GatewaySpec),
    /// A ServiceEntry, with the addresses IP auto-allocation wrote into its status.
    ServiceEntry(ServiceEntrySpec, Vec<AllocatedAddress>),
    Sidecar(SidecarSpec),
    WorkloadEntry(WorkloadEntrySpec),
    PeerAuthentication(PeerAuthenticationSpec),
    RequestAuthentication(RequestAuthenticationSpec),
    AuthorizationPolicy(AuthorizationPolicySpec),
    Telemetry(TelemetrySpec),
    Service(ServiceDef),
    EndpointSlice(EndpointSliceDef),
    /// Core v1 Endpoints, one slice-shaped entry per subset.
    Endpoints(Vec<EndpointSliceDef>),
    Pod(PodDef),
    Namespace,
    /// A Node: only its labels (topology) matter, and they are in `Meta`.
    Node,
    Secret(SecretDef),
    /// Istio's mesh ConfigMap, its `mesh` key parsed.
    MeshConfig(crate::mesh::MeshConfig),
}

/// One accepted configuration object.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConfigObject {
    pub key: ObjectKey,
    pub meta: Meta,
    pub spec: Spec,
}

impl ConfigObject {
    /// Istio's config path for filter metadata: `/apis/GROUP/v1/namespaces/NS/KIND/NAME`.
    pub fn istio_config_path(&self) -> String {
        format!(
            "/apis/{}/v1/namespaces/{}/{}/{}",
            self.key.kind.group(),
            self.key.namespace,
            self.key.kind.istio_path_segment(),
            self.key.name
        )
    }
}

/// How bad a reported problem is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Error,
    Warning,
}

/// A problem found in a configuration document, with everything needed to find it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConfigIssue {
    pub level: Level,
    pub file: String,
    /// Index of the document in its file, from 0.
    pub document: usize,
    pub kind: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// Field path, e.g. `spec.http[0].match[0].uri.regex`; empty for the whole document.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.level {
            Level::Error => "error",
            Level::Warning => "warning",
        };
        write!(f, "{level}: {} (document {})", self.file, self.document)?;
        if let Some(kind) = &self.kind {
            write!(f, ": {kind}")?;
            match (&self.namespace, &self.name) {
                (Some(ns), Some(name)) if !ns.is_empty() => write!(f, " {ns}/{name}")?,
                (_, Some(name)) => write!(f, " {name}")?,
                _ => {}
            }
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}
