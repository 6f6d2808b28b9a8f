//! The one in-memory model: every accepted configuration object, keyed, plus the derived
//! views a push needs ([`PushContext`]). Sources write here through [`Store::apply`] and
//! [`Store::delete`]; nothing here knows about files, Kubernetes or protobuf.

#[cfg(any(test, feature = "testing"))]
pub mod builders;
pub mod config;
pub mod delegate;
pub mod destination_rule;
pub mod egress;
pub mod ext_authz;
pub mod jwks;
pub mod mesh;
pub mod network;
pub mod proxy;
pub mod proxy_headers;
pub mod push_context;
pub mod revisions;
pub mod security;
pub mod service;
pub mod shared_hosts;
#[cfg(any(test, feature = "testing"))]
pub mod testmesh;
pub mod tls;
pub mod topology;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::config::{ConfigObject, Kind, ObjectKey};

pub use proxy::{Interception, Proxy, ProxyKind};
pub use push_context::PushContext;
pub use revisions::Revisions;
pub use service::{Endpoint, Locality, Protocol, Service, ServicePort, TrafficDistribution};

/// The cluster-local DNS suffix (`meshConfig` `trustDomain`-independent domain suffix).
pub const DOMAIN_SUFFIX: &str = "cluster.local";

/// All accepted configuration, keyed by kind, namespace and name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Store {
    /// A persistent map: a snapshot (`clone`) shares every node with the live store, so a
    /// push takes one in constant time however large the mesh.
    objects: imbl::OrdMap<ObjectKey, Arc<ConfigObject>>,
    /// Addresses meshd resolved for hostnames the configuration names where Envoy needs
    /// IPs (network gateways behind a load balancer's hostname), by hostname.
    resolved: Arc<BTreeMap<String, Vec<String>>>,
    /// JSON Web Key Sets meshd fetched for RequestAuthentication rules, by
    /// [`crate::jwks::JwksSource::key`]; `None`: the fetch failed before any succeeded.
    jwks: Arc<BTreeMap<String, Option<String>>>,
    /// The control plane's environment variables that configuration reads as istiod
    /// reads its own: `PILOT_TRACE_SAMPLING`, and the variables tracing providers'
    /// headers name (`envName`). Set once by the binary; empty in tests unless set.
    environment: Arc<BTreeMap<String, String>>,
}

impl Store {
    /// Sets the environment variables configuration may read ([`Store::environment_var`]).
    pub fn set_environment(&mut self, vars: BTreeMap<String, String>) {
        self.environment = Arc::new(vars);
    }

    /// An environment variable of the control plane's, as the store was given it.
    pub fn environment_var(&self, name: &str) -> Option<&str> {
        self.environment.get(name).map(String::as_str)
    }

    /// The addresses `host` was last resolved to.
    pub fn resolved(&self, host: &str) -> Option<&[String]> {
        self.resolved.get(host).map(Vec::as_slice)
    }

    /// Records what `host` resolves to; returns whether that changed.
    pub fn set_resolved(&mut self, host: &str, addresses: Vec<String>) -> bool {
        if self.resolved.get(host) == Some(&addresses) {
            return false;
        }
        Arc::make_mut(&mut self.resolved).insert(host.to_string(), addresses);
        true
    }

    /// The key set last fetched for a source (`Some(None)`: its fetches failed so far).
    pub fn jwks(&self, key: &str) -> Option<Option<&str>> {
        self.jwks.get(key).map(Option::as_deref)
    }

    /// Records a source's key set; returns whether that changed.
    pub fn set_jwks(&mut self, key: &str, key_set: Option<String>) -> bool {
        if self.jwks.get(key) == Some(&key_set) {
            return false;
        }
        Arc::make_mut(&mut self.jwks).insert(key.to_string(), key_set);
        true
    }

    /// Adds or replaces an object. Returns false when the stored object was identical (an
    /// unchanged resync costs no push).
    pub fn apply(&mut self, object: ConfigObject) -> bool {
        match self.objects.get(&object.key) {
            Some(old) if **old == object => false,
            _ => {
                self.objects.insert(object.key.clone(), Arc::new(object));
                true
            }
        }
    }

    /// Removes an object. Returns whether it was present.
    pub fn delete(&mut self, key: &ObjectKey) -> bool {
        self.objects.remove(key).is_some()
    }

    pub fn get(&self, key: &ObjectKey) -> Option<&Arc<ConfigObject>> {
        self.objects.get(key)
    }

    pub fn of_kind(&self, kind: Kind) -> impl Iterator<Item = &Arc<ConfigObject>> {
        let start = ObjectKey {
            kind,
            namespace: String::new(),
            name: String::new(),
        };
        self.objects
            .range(start..)
            .take_while(move |(k, _)| k.kind == kind)
            .map(|(_, v)| v)
    }

    /// The objects of one kind in one namespace.
    pub fn in_namespace(
        &self,
        kind: Kind,
        namespace: &str,
    ) -> impl Iterator<Item = &Arc<ConfigObject>> + use<'_> {
        let start = ObjectKey::new(kind, namespace, "");
        let namespace = start.namespace.clone();
        self.objects
            .range(start..)
            .take_while(move |(k, _)| k.kind == kind && k.namespace == namespace)
            .map(|(_, v)| v)
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<ConfigObject>> {
        self.objects.values()
    }
}

/// Label naming the control-plane revision an object, pod or namespace belongs to.
pub const REVISION_LABEL: &str = "istio.io/rev";

/// A store holding these objects; of two with the same key, the later.
impl FromIterator<ConfigObject> for Store {
    fn from_iter<I: IntoIterator<Item = ConfigObject>>(objects: I) -> Store {
        let mut store = Store::default();
        for object in objects {
            store.apply(object);
        }
        store
    }
}

/// The revision a namespace belongs to, if any, as Istio's injector decides it: its
/// `istio.io/rev` label, or `default` for `istio-injection=enabled`.
pub fn namespace_revision(labels: &BTreeMap<String, String>) -> Option<&str> {
    match labels.get(REVISION_LABEL) {
        Some(rev) => Some(rev.as_str()),
        None if labels
            .get("istio-injection")
            .is_some_and(|v| v == "enabled") =>
        {
            Some("default")
        }
        None => None,
    }
}

/// Resolves a host as Istio does: a name without dots is a Kubernetes short name in
/// `namespace`; anything else is already fully qualified.
pub fn resolve_host(host: &str, namespace: &str) -> String {
    if host == "*" || host.contains('.') {
        host.to_string()
    } else {
        format!("{host}.{namespace}.svc.{DOMAIN_SUFFIX}")
    }
}

/// Whether an object of namespace `owner` with `export_to` (else the mesh's `default`;
/// both empty: everyone) is visible in namespace `client`: `*`, `.` (its own namespace)
/// or the namespace by name.
pub fn exported_to(export_to: &[String], default: &[String], owner: &str, client: &str) -> bool {
    let list = if export_to.is_empty() {
        default
    } else {
        export_to
    };
    list.is_empty()
        || list
            .iter()
            .any(|e| e == "*" || e == client || (e == "." && owner == client))
}

/// Whether every name `host` stands for is one `pattern` stands for (Istio's
/// `host.Name.SubsetOf`, the other way round): equal, `*`, or a `*.suffix` pattern whose
/// suffix ends `host` (a wildcard `host` included).
pub fn host_covers(pattern: &str, host: &str) -> bool {
    if pattern == "*" || pattern == host {
        return true;
    }
    match pattern.strip_prefix('*') {
        Some(suffix) => host.strip_prefix('*').unwrap_or(host).ends_with(suffix),
        None => false,
    }
}

/// Istio host matching: exact, or a `*.suffix` wildcard on either side, or `*`.
pub fn host_matches(pattern: &str, host: &str) -> bool {
    if pattern == "*" || pattern == host {
        return true;
    }
    match (pattern.strip_prefix('*'), host.strip_prefix('*')) {
        (Some(suffix), None) => host.ends_with(suffix),
        (None, Some(suffix)) => pattern.ends_with(suffix),
        (Some(a), Some(b)) => a.ends_with(b) || b.ends_with(a),
        (None, None) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_resolve_in_the_config_namespace() {
        assert_eq!(
            resolve_host("reviews", "shop"),
            "reviews.shop.svc.cluster.local"
        );
        assert_eq!(
            resolve_host("reviews.other.svc.cluster.local", "shop"),
            "reviews.other.svc.cluster.local"
        );
        assert_eq!(resolve_host("*", "shop"), "*");
    }

    #[test]
    fn wildcard_hosts_match_their_suffix() {
        assert!(host_matches("*.example.com", "api.example.com"));
        assert!(!host_matches("*.example.com", "example.org"));
        assert!(host_matches("*", "anything"));
        assert!(host_matches("api.example.com", "*.example.com"));
    }
}
