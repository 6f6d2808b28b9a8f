//! Encoded resources. Each resource is encoded once per push view and shared, behind an
//! `Arc`, by every proxy that receives it; its version is a hash of its bytes, so an
//! unchanged resource keeps its version across pushes and restarts (which is what makes
//! `initial_resource_versions` on reconnect useful). Delta pushes leave versions out
//! (see `delta::respond`).

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use envoy_api::pb::google::protobuf::Any;
use prost::{Message, Name};

use envoy_api::pb::envoy::config::cluster::v3::Cluster;
use envoy_api::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_api::pb::envoy::config::listener::v3::Listener;
use envoy_api::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_api::pb::envoy::extensions::transport_sockets::tls::v3::Secret;

use super::wire::Batch;
use translate::{self, ProxyConfig};

/// The xDS types meshd serves, in push order (make-before-break: CDS, EDS, LDS, RDS).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TypeKind {
    Cluster = 0,
    Endpoint = 1,
    Listener = 2,
    Route = 3,
    /// SDS over ADS: gateway credentials (`kubernetes://NAME`), secure port only.
    Secret = 4,
    /// VHDS: the virtual hosts of route configurations (a sidecar's outbound ones, a
    /// gateway's), one resource each, for delta proxies when `MESHD_ENABLE_VHDS` is on
    /// (see [`vhds_route_config`]).
    VirtualHost = 5,
    /// NDS: the DNS name table of a proxy whose agent runs a DNS proxy
    /// ([`model::Proxy::dns_proxy`]); one resource, named `""` as istiod's is.
    NameTable = 6,
}

/// Number of xDS types.
pub const TYPES: usize = 7;

/// Virtual hosts follow the route configurations that ask for them.
pub const PUSH_ORDER: [TypeKind; TYPES] = [
    TypeKind::Cluster,
    TypeKind::Endpoint,
    TypeKind::Listener,
    TypeKind::Route,
    TypeKind::VirtualHost,
    TypeKind::Secret,
    TypeKind::NameTable,
];

pub const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ENDPOINT_TYPE: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const ROUTE_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
pub const SECRET_TYPE: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
pub const VIRTUAL_HOST_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.VirtualHost";
pub const NAME_TABLE_TYPE: &str = "type.googleapis.com/istio.networking.nds.v1.NameTable";

/// The route configuration a VHDS resource belongs to: its name up to the last `/` (as
/// Envoy's watch map reads it; a host name has no `/`, a route configuration's may). See
/// [`translate::route::vhds_name`].
pub fn vhds_route_config(name: &str) -> Option<&str> {
    name.rfind('/').map(|i| &name[..i])
}

impl TypeKind {
    pub fn url(self) -> &'static str {
        match self {
            TypeKind::Cluster => CLUSTER_TYPE,
            TypeKind::Endpoint => ENDPOINT_TYPE,
            TypeKind::Listener => LISTENER_TYPE,
            TypeKind::Route => ROUTE_TYPE,
            TypeKind::Secret => SECRET_TYPE,
            TypeKind::VirtualHost => VIRTUAL_HOST_TYPE,
            TypeKind::NameTable => NAME_TABLE_TYPE,
        }
    }

    pub fn from_url(url: &str) -> Option<TypeKind> {
        PUSH_ORDER.into_iter().find(|t| t.url() == url)
    }

    /// Istio's short name, used as the `type` metric label.
    pub fn short(self) -> &'static str {
        match self {
            TypeKind::Cluster => "cds",
            TypeKind::Endpoint => "eds",
            TypeKind::Listener => "lds",
            TypeKind::Route => "rds",
            TypeKind::Secret => "sds",
            TypeKind::VirtualHost => "vhds",
            TypeKind::NameTable => "nds",
        }
    }

    /// LDS and CDS are wildcard types; EDS and RDS are requested by name. VHDS too is
    /// wildcard: Envoy's VHDS watches are namespaces (a route configuration's name), which
    /// it does not send, so meshd sends every virtual host of the proxy's route
    /// configurations and Envoy keeps those of the ones it holds. NDS's one table is
    /// asked for without a name.
    pub fn wildcard(self) -> bool {
        matches!(
            self,
            TypeKind::Cluster | TypeKind::Listener | TypeKind::VirtualHost | TypeKind::NameTable
        )
    }
}

#[derive(Debug)]
pub struct Resource {
    /// Shared with every proxy's record of having been sent it.
    pub name: Arc<str>,
    /// `hash` as 16 hex digits, the version on the wire.
    pub version: String,
    /// xxh3 of the encoded bytes: what per-proxy state remembers as "sent".
    pub hash: u64,
    type_url: String,
    value: Value,
}

/// A resource's encoded message.
#[derive(Debug)]
enum Value {
    /// Shared, so that a send can hold it without a copy.
    Whole(Arc<[u8]>),
    /// Assembled from pieces other resources share: a route configuration from virtual
    /// hosts that the route configurations of many views hold too. `len` is their sum.
    Pieces { pieces: Vec<Arc<[u8]>>, len: usize },
}

impl PartialEq for Resource {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.hash == other.hash
            && self.type_url == other.type_url
            && self.value() == other.value()
    }
}

impl Resource {
    pub fn type_url(&self) -> &str {
        &self.type_url
    }

    /// The encoded message's length in bytes.
    pub fn value_len(&self) -> usize {
        match &self.value {
            Value::Whole(v) => v.len(),
            Value::Pieces { len, .. } => *len,
        }
    }

    /// The encoded message as one slice (copied together if it is kept in pieces).
    pub fn value(&self) -> std::borrow::Cow<'_, [u8]> {
        match &self.value {
            Value::Whole(v) => (&v[..]).into(),
            Value::Pieces { pieces, len } => {
                let mut out = Vec::with_capacity(*len);
                for p in pieces {
                    out.extend_from_slice(p);
                }
                out.into()
            }
        }
    }

    /// The encoded message in the pieces it is kept as: the whole message as one piece,
    /// or its shared pieces (each an `Arc` so that a send can hold it without a copy).
    pub(super) fn pieces(&self) -> &[Arc<[u8]>] {
        match &self.value {
            Value::Whole(v) => std::slice::from_ref(v),
            Value::Pieces { pieces, .. } => pieces,
        }
    }

    /// As `google.protobuf.Any`.
    pub fn any(&self) -> Any {
        Any {
            type_url: self.type_url.clone(),
            value: self.value().into_owned(),
        }
    }
}

/// A version string from a proxy (delta `initial_resource_versions`) as meshd's hash;
/// anything meshd did not write reads as 0, which no resource has in practice.
pub fn parse_version(version: &str) -> u64 {
    u64::from_str_radix(version, 16).unwrap_or(0)
}

pub fn encode<T: Message + Name>(name: &str, message: &T) -> Arc<Resource> {
    from_bytes::<T>(name, message.encode_to_vec())
}

/// A cluster, in the canonical encoding (see [`translate::canonical`]).
pub(super) fn encode_cluster(c: &Cluster) -> Arc<Resource> {
    from_bytes::<Cluster>(&c.name, translate::canonical::encode_cluster(c))
}

/// A load assignment, in the canonical encoding (see [`translate::canonical`]).
pub(super) fn encode_load_assignment(a: &ClusterLoadAssignment) -> Arc<Resource> {
    let bytes = translate::canonical::encode_load_assignment(a);
    from_bytes::<ClusterLoadAssignment>(&a.cluster_name, bytes)
}

pub(super) fn from_bytes<T: Name>(name: &str, value: Vec<u8>) -> Arc<Resource> {
    let hash = xxhash_rust::xxh3::xxh3_64(&value);
    resource::<T>(name, hash, Value::Whole(value.into()))
}

/// A resource whose encoded message is `pieces` one after the other, kept as they are.
pub(super) fn from_pieces<T: Name>(name: &str, pieces: Vec<Arc<[u8]>>) -> Arc<Resource> {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for p in &pieces {
        hasher.update(p);
    }
    let len = pieces.iter().map(|p| p.len()).sum();
    resource::<T>(name, hasher.digest(), Value::Pieces { pieces, len })
}

/// A resource of a type that is no Envoy message (istiod's debug types), built on demand.
pub(super) fn with_type_url(name: &str, type_url: &str, value: Vec<u8>) -> Arc<Resource> {
    let hash = xxhash_rust::xxh3::xxh3_64(&value);
    typed(name, type_url.to_string(), hash, Value::Whole(value.into()))
}

fn resource<T: Name>(name: &str, hash: u64, value: Value) -> Arc<Resource> {
    typed(name, T::type_url(), hash, value)
}

fn typed(name: &str, type_url: String, hash: u64, value: Value) -> Arc<Resource> {
    Arc::new(Resource {
        name: name.into(),
        version: format!("{hash:016x}"),
        hash,
        type_url,
        value,
    })
}

/// By name; the key is the resource's own name string.
pub type ResourceMap = BTreeMap<Arc<str>, Arc<Resource>>;

/// The resources by name, built in bulk (sorted, then filled leaf by leaf), which is
/// several times cheaper than one insert each; of two of the same name, the later stays.
pub(super) fn resource_map(resources: Vec<Arc<Resource>>) -> ResourceMap {
    resources.into_iter().map(|r| (r.name.clone(), r)).collect()
}

/// One type's resources of a view, by name; and, built the first time a proxy is sent
/// all of them, the same resources as one [`Batch`] (reset whenever the map changes).
#[derive(Clone, Debug, Default)]
pub struct ResourceSet {
    map: ResourceMap,
    whole: OnceLock<Batch>,
}

impl From<ResourceMap> for ResourceSet {
    fn from(map: ResourceMap) -> Self {
        ResourceSet {
            map,
            whole: OnceLock::new(),
        }
    }
}

/// Everything one kind of proxy is sent in one push, encoded. A set may be shared with
/// other views (the per-service clusters and load assignments of every view with the same
/// service list); it is copied before it is changed.
#[derive(Debug, Default)]
pub struct View {
    sets: [Arc<ResourceSet>; TYPES],
}

impl View {
    pub fn new(config: ProxyConfig) -> View {
        let mut view = View::default();
        view.encode_all(
            &config.clusters,
            &config.endpoints,
            &config.listeners,
            &config.routes,
            &config.secrets,
        );
        for vh in &config.virtual_hosts {
            view.insert(TypeKind::VirtualHost, encode(&vh.name, vh));
        }
        if let Some(table) = &config.name_table {
            view.insert(TypeKind::NameTable, encode("", table));
        }
        view
    }

    /// Encodes and adds translated resources.
    pub(super) fn encode_all(
        &mut self,
        clusters: &[Cluster],
        endpoints: &[ClusterLoadAssignment],
        listeners: &[Listener],
        routes: &[RouteConfiguration],
        secrets: &[Secret],
    ) {
        for c in clusters {
            self.insert(TypeKind::Cluster, encode_cluster(c));
        }
        for e in endpoints {
            self.insert(TypeKind::Endpoint, encode_load_assignment(e));
        }
        for l in listeners {
            self.insert(TypeKind::Listener, encode(&l.name, l));
        }
        for r in routes {
            self.insert(TypeKind::Route, encode(&r.name, r));
        }
        for s in secrets {
            self.insert(TypeKind::Secret, encode(&s.name, s));
        }
    }

    pub(super) fn insert(&mut self, kind: TypeKind, resource: Arc<Resource>) {
        let set = Arc::make_mut(&mut self.sets[kind as usize]);
        set.whole = OnceLock::new();
        set.map.insert(resource.name.clone(), resource);
    }

    /// Takes `set` as the whole set of `kind`, shared.
    pub(super) fn share(&mut self, kind: TypeKind, set: Arc<ResourceSet>) {
        self.sets[kind as usize] = set;
    }

    /// The set of `kind`, to share with another view.
    pub(super) fn set(&self, kind: TypeKind) -> Arc<ResourceSet> {
        self.sets[kind as usize].clone()
    }

    /// Whether the two views hold the one same set of `kind`.
    pub(super) fn shares(&self, other: &View, kind: TypeKind) -> bool {
        Arc::ptr_eq(&self.sets[kind as usize], &other.sets[kind as usize])
    }

    pub fn all(&self, kind: TypeKind) -> &ResourceMap {
        &self.sets[kind as usize].map
    }

    /// Every resource of `kind`, in name order, as one batch shared by every response
    /// that carries all of them.
    pub fn whole(&self, kind: TypeKind) -> Batch {
        let set = &self.sets[kind as usize];
        (set.whole)
            .get_or_init(|| set.map.values().cloned().collect::<Vec<_>>().into())
            .clone()
    }

    /// A named resource; EDS and RDS names meshd does not know get an empty resource, as
    /// istiod answers every requested name (so Envoy never waits on a missing one).
    pub fn get(&self, kind: TypeKind, name: &str) -> Option<Arc<Resource>> {
        if let Some(r) = self.sets[kind as usize].map.get(name) {
            return Some(r.clone());
        }
        match kind {
            TypeKind::Endpoint => Some(encode(name, &translate::endpoint::empty_assignment(name))),
            TypeKind::Route => Some(encode(name, &translate::route::empty(name))),
            _ => None,
        }
    }
}

/// A cluster of that name and nothing else, encoded (for tests of what carries resources).
#[cfg(test)]
pub(super) fn test_cluster(name: &str) -> Arc<Resource> {
    encode(
        name,
        &Cluster {
            name: name.into(),
            ..Default::default()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sets_whole_list_is_built_once_and_again_after_a_change() {
        let mut view = View::default();
        view.insert(TypeKind::Cluster, test_cluster("b"));
        view.insert(TypeKind::Cluster, test_cluster("a"));
        let names = |batch: &Batch| batch.iter().map(|r| r.name.to_string()).collect::<Vec<_>>();
        let (first, again) = (view.whole(TypeKind::Cluster), view.whole(TypeKind::Cluster));
        assert_eq!(names(&first), ["a", "b"], "in name order");
        assert_eq!(first.as_ptr(), again.as_ptr(), "one list for every caller");
        // A view that shares the set shares the list.
        let mut other = View::default();
        other.share(
            TypeKind::Cluster,
            view.sets[TypeKind::Cluster as usize].clone(),
        );
        assert_eq!(other.whole(TypeKind::Cluster).as_ptr(), first.as_ptr());
        view.insert(TypeKind::Cluster, test_cluster("c"));
        assert_eq!(names(&view.whole(TypeKind::Cluster)), ["a", "b", "c"]);
        assert_eq!(names(&first), ["a", "b"], "a list sent is unchanged");
        assert_eq!(names(&other.whole(TypeKind::Cluster)), ["a", "b"]);
        assert!(view.whole(TypeKind::Endpoint).is_empty());
    }

    #[test]
    fn a_resource_kept_in_pieces_is_the_resource_of_their_bytes() {
        let pieces: Vec<Arc<[u8]>> = vec![vec![10u8, 3].into(), vec![b'a'; 3].into()];
        let parted = from_pieces::<RouteConfiguration>("80", pieces);
        let whole = from_bytes::<RouteConfiguration>("80", vec![10, 3, b'a', b'a', b'a']);
        assert_eq!(parted.value(), whole.value());
        assert_eq!(parted.value_len(), 5);
        assert_eq!((parted.hash, &parted.version), (whole.hash, &whole.version));
        assert_eq!(parted.any(), whole.any());
        assert_eq!(parted, whole);
        let other = from_bytes::<RouteConfiguration>("80", vec![10, 3, b'a', b'a', b'b']);
        assert_ne!(parted, other);
    }
}
