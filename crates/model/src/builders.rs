//! Configuration objects built in code, for tests of the model and of what reads it: a
//! test says the objects it needs, without YAML, parsing and validation in between.
//! (`testmesh` loads generated YAML instead, where the parsing is part of what is run.)

use std::collections::BTreeMap;

use crate::config::{
    ConfigObject, EndpointSliceDef, Kind, Meta, ObjectKey, PodDef, ServiceDef, ServicePortDef,
    SliceEndpoint, Spec,
};
use crate::{Proxy, PushContext, Store};

/// The kind of object `spec` is.
fn kind_of(spec: &Spec) -> Kind {
    match spec {
        Spec::VirtualService(_) => Kind::VirtualService,
        Spec::DestinationRule(_) => Kind::DestinationRule,
        Spec::Gateway(_) => Kind::Gateway,
        Spec::ServiceEntry(..) => Kind::ServiceEntry,
        Spec::Sidecar(_) => Kind::Sidecar,
        Spec::WorkloadEntry(_) => Kind::WorkloadEntry,
        Spec::PeerAuthentication(_) => Kind::PeerAuthentication,
        Spec::RequestAuthentication(_) => Kind::RequestAuthentication,
        Spec::AuthorizationPolicy(_) => Kind::AuthorizationPolicy,
        Spec::Telemetry(_) => Kind::Telemetry,
        Spec::Service(_) => Kind::Service,
        Spec::EndpointSlice(_) => Kind::EndpointSlice,
        Spec::Endpoints(_) => Kind::Endpoints,
        Spec::Pod(_) => Kind::Pod,
        Spec::Namespace => Kind::Namespace,
        Spec::Node => Kind::Node,
        Spec::Secret(_) => Kind::Secret,
        Spec::MeshConfig(_) => Kind::ConfigMap,
    }
}

/// An object `namespace/name` holding `spec`, without labels or annotations.
pub fn object(namespace: &str, name: &str, spec: Spec) -> ConfigObject {
    ConfigObject {
        key: ObjectKey::new(kind_of(&spec), namespace, name),
        meta: Meta {
            name: name.into(),
            namespace: namespace.into(),
            ..Meta::default()
        },
        spec,
    }
}

/// `object` created at second `second` of 2026's first minute: the age that decides
/// between objects that conflict (older first, as istiod orders them).
pub fn created(mut object: ConfigObject, second: u32) -> ConfigObject {
    object.meta.creation_timestamp = Some(format!("2026-01-01T00:00:{second:02}Z"));
    object
}

/// The mesh-wide settings, as the `istio` ConfigMap of `istio-system` holds them.
pub fn mesh_config(mesh: crate::mesh::MeshConfig) -> ConfigObject {
    object("istio-system", "istio", Spec::MeshConfig(mesh))
}

/// An Istio object `namespace/name` of `kind`, its spec written as JSON in Istio's field
/// names and deserialized straight into api's type: no YAML, no validation.
pub fn istio(kind: Kind, namespace: &str, name: &str, spec: serde_json::Value) -> ConfigObject {
    fn typed<T: serde::de::DeserializeOwned>(kind: Kind, spec: serde_json::Value) -> T {
        serde_json::from_value(spec).unwrap_or_else(|e| panic!("a {kind:?} spec: {e}"))
    }
    let spec = match kind {
        Kind::VirtualService => Spec::VirtualService(typed(kind, spec)),
        Kind::DestinationRule => Spec::DestinationRule(typed(kind, spec)),
        Kind::Gateway => Spec::Gateway(typed(kind, spec)),
        Kind::ServiceEntry => Spec::ServiceEntry(typed(kind, spec), Vec::new()),
        Kind::Sidecar => Spec::Sidecar(typed(kind, spec)),
        Kind::WorkloadEntry => Spec::WorkloadEntry(typed(kind, spec)),
        Kind::PeerAuthentication => Spec::PeerAuthentication(typed(kind, spec)),
        Kind::RequestAuthentication => Spec::RequestAuthentication(typed(kind, spec)),
        Kind::AuthorizationPolicy => Spec::AuthorizationPolicy(typed(kind, spec)),
        Kind::Telemetry => Spec::Telemetry(typed(kind, spec)),
        other => panic!("{other:?} is not an Istio kind"),
    };
    object(namespace, name, spec)
}

/// A Kubernetes Service, built port by port.
pub struct ServiceBuilder {
    object: ConfigObject,
    def: ServiceDef,
}

/// The Service `namespace/name` with `cluster_ip` and no ports yet.
pub fn service(namespace: &str, name: &str, cluster_ip: &str) -> ServiceBuilder {
    let def = ServiceDef {
        cluster_ip: Some(cluster_ip.into()),
        ..ServiceDef::default()
    };
    let object = object(namespace, name, Spec::Service(ServiceDef::default()));
    ServiceBuilder { object, def }
}

impl ServiceBuilder {
    /// A TCP port named `name` (its name gives its protocol, as Istio reads it).
    pub fn port(mut self, name: &str, port: u32) -> Self {
        self.def.ports.push(ServicePortDef {
            name: name.into(),
            port,
            target_port: Some(port),
            protocol: "TCP".into(),
            ..ServicePortDef::default()
        });
        self
    }

    /// The last port's targetPort (by default its own number).
    pub fn target_port(mut self, target: u32) -> Self {
        let last = self.def.ports.last_mut().expect("a port to target");
        last.target_port = Some(target);
        self
    }

    /// `spec.trafficDistribution`.
    pub fn traffic_distribution(mut self, value: &str) -> Self {
        self.def.traffic_distribution = Some(value.into());
        self
    }

    pub fn selector(mut self, key: &str, value: &str) -> Self {
        self.def.selector.insert(key.into(), value.into());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.object.meta.labels.insert(key.into(), value.into());
        self
    }

    /// An address it is reached at from outside the cluster (an external IP, or its load
    /// balancer's ingress IP).
    pub fn external_address(mut self, address: &str) -> Self {
        self.def.external_addresses.push(address.into());
        self
    }

    /// Its load balancer's ingress hostname.
    pub fn external_hostname(mut self, hostname: &str) -> Self {
        self.def.external_hostnames.push(hostname.into());
        self
    }

    /// An ExternalName Service, the alias of `host`, with no cluster IP.
    pub fn external_name(mut self, host: &str) -> Self {
        self.def.external_name = Some(host.into());
        self.def.cluster_ip = None;
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.object
            .meta
            .annotations
            .insert(key.into(), value.into());
        self
    }

    pub fn build(self) -> ConfigObject {
        let ServiceBuilder { mut object, def } = self;
        object.spec = Spec::Service(def);
        object
    }
}

/// An EndpointSlice of `service`, ready endpoints on every port given.
pub struct SliceBuilder(String, String, EndpointSliceDef);

/// An EndpointSlice of the Service `namespace/service`, named after it.
pub fn endpoints(namespace: &str, service: &str) -> SliceBuilder {
    let def = EndpointSliceDef {
        service_name: service.into(),
        ports: Vec::new(),
        endpoints: Vec::new(),
    };
    SliceBuilder(namespace.into(), format!("{service}-slice"), def)
}

impl SliceBuilder {
    pub fn port(mut self, name: &str, port: u32) -> Self {
        self.2.ports.push((name.into(), port));
        self
    }

    /// An endpoint as written, for zones, target Pods, conditions and several addresses.
    pub fn endpoint(mut self, endpoint: SliceEndpoint) -> Self {
        self.2.endpoints.push(endpoint);
        self
    }

    /// A ready endpoint at `address`, backed by the Pod `pod` when given.
    pub fn ready(mut self, address: &str, pod: Option<&str>) -> Self {
        self.2.endpoints.push(SliceEndpoint {
            addresses: vec![address.into()],
            ready: Some(true),
            pod: pod.map(str::to_string),
            ..SliceEndpoint::default()
        });
        self
    }

    pub fn build(self) -> ConfigObject {
        let SliceBuilder(namespace, name, def) = self;
        object(&namespace, &name, Spec::EndpointSlice(def))
    }
}

/// The core v1 Endpoints of the Service `namespace/service`: each subset as a slice, its
/// ready and not-ready addresses as endpoints with those conditions.
pub fn legacy_endpoints(
    namespace: &str,
    service: &str,
    subsets: impl IntoIterator<Item = SliceBuilder>,
) -> ConfigObject {
    let subsets = subsets.into_iter().map(|s| s.2).collect();
    object(namespace, service, Spec::Endpoints(subsets))
}

/// A Namespace with `annotations`.
pub fn namespace(name: &str, annotations: &[(&str, &str)]) -> ConfigObject {
    let mut o = object("", name, Spec::Namespace);
    o.meta.annotations = labels_of(annotations);
    o
}

/// A Pod with no IP yet (as a manifest declares it), running as `service_account`.
pub fn pod_with_account(
    namespace: &str,
    name: &str,
    service_account: Option<&str>,
) -> ConfigObject {
    let spec = Spec::Pod(PodDef {
        service_account: service_account.map(str::to_string),
        ..PodDef::default()
    });
    object(namespace, name, spec)
}

/// `object` with `labels`.
pub fn labeled(mut object: ConfigObject, labels: &[(&str, &str)]) -> ConfigObject {
    object.meta.labels = labels_of(labels);
    object
}

/// A Pod with `labels` at `ip`.
pub fn pod(namespace: &str, name: &str, ip: &str, labels: &[(&str, &str)]) -> ConfigObject {
    let spec = Spec::Pod(PodDef {
        ip: Some(ip.into()),
        ..PodDef::default()
    });
    let mut o = object(namespace, name, spec);
    o.meta.labels = labels_of(labels);
    o
}

fn labels_of(labels: &[(&str, &str)]) -> BTreeMap<String, String> {
    (labels.iter())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A sidecar `pod` in `namespace` at `ip` with `labels`, as its agent names it.
pub fn sidecar(namespace: &str, pod: &str, ip: &str, labels: &[(&str, &str)]) -> Proxy {
    let labels: serde_json::Map<String, serde_json::Value> = (labels.iter())
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    let mut metadata = serde_json::Map::new();
    metadata.insert("NAMESPACE".into(), namespace.into());
    metadata.insert("LABELS".into(), labels.into());
    let id = format!("sidecar~{ip}~{pod}.{namespace}~{namespace}.svc.cluster.local");
    Proxy::from_node(&id, &metadata).expect("a well-formed node id")
}

/// The push context of exactly `objects`.
pub fn context(objects: impl IntoIterator<Item = ConfigObject>) -> PushContext {
    let store: Store = objects.into_iter().collect();
    PushContext::build(&store, "test/1".into())
}
