//! Hosts that several services declare: ServiceEntries of one host in several namespaces
//! (each team declaring the same external API for its own namespace), or one beside the
//! Kubernetes Service of that name.
//!
//! istiod keeps every such service and lets each proxy pick one when it builds its
//! SidecarScope (`appendSidecarServices` over `servicesExportedToNamespace`): a Kubernetes
//! Service before any other; then services exported to the proxy's namespace by name (or
//! private to it) before public ones; of those, the oldest. Later ServiceEntries of the
//! chosen one's namespace alike in resolution, labels and `exportTo` add their ports to
//! it, and every ServiceEntry of the host in that namespace its endpoints.
//!
//! Most meshes have no such host, and then nothing here costs a proxy anything: the push
//! context's `services` holds, for each host, the one service most proxies get, and only
//! hosts listed here are chosen per proxy.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Service;

/// Of each host that more than one service declares, every such service.
#[derive(Debug, Default, PartialEq)]
pub struct SharedHosts(BTreeMap<String, HostServices>);

/// The services of one host.
#[derive(Debug, PartialEq)]
pub struct HostServices {
    /// As declared: Kubernetes first, then oldest first (then by namespace and name).
    declared: Vec<Arc<Service>>,
    /// What a proxy that picks `declared[i]` gets ([`served`]).
    served: Vec<Arc<Service>>,
}

/// istiod's order of services of one host, before each proxy's choice: a Kubernetes
/// Service first, then by creation time (`SortServicesByCreationTime`), namespace and name.
fn precedence(s: &Service) -> (bool, &str, &str, &str) {
    (
        !s.kubernetes,
        s.creation.as_deref().unwrap_or(""),
        &s.namespace,
        &s.name,
    )
}

/// Whether two services are ServiceEntries of one namespace: istiod keeps their endpoints
/// together (by host and namespace).
fn same_namespace_entries(a: &Service, b: &Service) -> bool {
    !a.kubernetes && !b.kubernetes && a.namespace == b.namespace
}

/// Whether istiod merges `later`'s ports into `first`'s (`canMergeServices`): two
/// ServiceEntries of one namespace alike in resolution, labels and `exportTo`.
fn mergeable(first: &Service, later: &Service) -> bool {
    same_namespace_entries(first, later)
        && first.discovery == later.discovery
        && first.labels == later.labels
        && first.export_to == later.export_to
}

/// What a proxy that picks each of `declared` gets: the service with the ports of the
/// later ones of its namespace that istiod merges into it, and the endpoints of every
/// ServiceEntry of its host and namespace.
fn served(declared: &[Arc<Service>]) -> Vec<Arc<Service>> {
    (declared.iter().enumerate())
        .map(|(i, first)| {
            let kin: Vec<(usize, &Arc<Service>)> = (declared.iter().enumerate())
                .filter(|&(j, s)| j != i && same_namespace_entries(first, s))
                .collect();
            if kin.is_empty() {
                return first.clone();
            }
            let mut out = Service::clone(first);
            for (j, other) in kin {
                if j > i && mergeable(first, other) {
                    for p in &other.ports {
                        if out.port(p.port).is_none() {
                            out.ports.push(p.clone());
                        }
                    }
                }
                for e in &other.endpoints {
                    if !out.endpoints.contains(e) {
                        out.endpoints.push(e.clone());
                    }
                }
            }
            Arc::new(out)
        })
        .collect()
}

impl SharedHosts {
    /// Splits `services` into the one service of each host most proxies get (the first in
    /// istiod's order, as [`HostServices::choose`] serves it) and the hosts more than one
    /// declares.
    pub fn split(
        services: impl IntoIterator<Item = Arc<Service>>,
    ) -> (imbl::OrdMap<String, Arc<Service>>, SharedHosts) {
        let mut primary = imbl::OrdMap::new();
        let mut shared: BTreeMap<String, Vec<Arc<Service>>> = BTreeMap::new();
        for svc in services {
            // One lookup per service; a host seen before keeps every service in `shared`
            // (the one replaced is already there unless this is the host's second).
            if let Some(before) = primary.insert(svc.hostname.clone(), svc.clone()) {
                let all = shared.entry(svc.hostname.clone());
                all.or_insert_with(|| vec![before]).push(svc);
            }
        }
        let mut hosts = BTreeMap::new();
        for (host, mut declared) in shared {
            declared.sort_by(|a, b| precedence(a).cmp(&precedence(b)));
            let served = served(&declared);
            primary.insert(host.clone(), served[0].clone());
            hosts.insert(host, HostServices { declared, served });
        }
        (primary, SharedHosts(hosts))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The services of `host`, if more than one declares it.
    pub fn get(&self, host: &str) -> Option<&HostServices> {
        self.0.get(host)
    }

    /// The services that are not the first of their host, as declared: with the push
    /// context's `services`, every service.
    pub fn others(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.0.values().flat_map(|h| &h.declared[1..])
    }
}

/// Whether a service is exported to `namespace` by name, or private to it (and not public):
/// istiod's `exportedToNamespace`, which a proxy of that namespace takes before public
/// services.
fn exported_by_name(svc: &Service, namespace: &str, default: &[String]) -> bool {
    let list = if svc.export_to.is_empty() {
        default
    } else {
        &svc.export_to
    };
    !list.iter().any(|e| e == "*")
        && (list.iter()).any(|e| e == namespace || (e == "." && svc.namespace == namespace))
}

impl HostServices {
    /// Every service of the host, as declared, in istiod's order.
    pub fn declared(&self) -> &[Arc<Service>] {
        &self.declared
    }

    /// The service a proxy of `namespace` gets, among those exported to it that `usable`
    /// accepts (its Sidecar's egress hosts): a Kubernetes Service; else the oldest
    /// exported to the namespace by name or private to it; else the oldest public one;
    /// with the ports istiod merges into it and its namespace's endpoints of the host.
    pub fn choose(
        &self,
        namespace: &str,
        default_export_to: &[String],
        usable: impl Fn(&Service) -> bool,
    ) -> Option<&Arc<Service>> {
        let i = (0..self.declared.len())
            .filter(|&i| {
                let s = &self.declared[i];
                s.visible_from(namespace, default_export_to) && usable(s)
            })
            // The first of equal keys: the oldest.
            .min_by_key(|&i| {
                let s = &self.declared[i];
                (
                    !s.kubernetes,
                    !exported_by_name(s, namespace, default_export_to),
                )
            })?;
        Some(&self.served[i])
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::builders::{context, created, istio, labeled, service};
    use crate::config::{ConfigObject, Kind};

    fn service_entry(namespace: &str, name: &str, second: u32, spec: Value) -> ConfigObject {
        created(istio(Kind::ServiceEntry, namespace, name, spec), second)
    }

    /// A ServiceEntry of `api.example.com` in `namespace`, created at second `second`,
    /// exported to `export_to`.
    fn entry(namespace: &str, name: &str, second: u32, export_to: &[&str]) -> ConfigObject {
        let spec = json!({
            "hosts": ["api.example.com"],
            "exportTo": export_to,
            "resolution": "DNS",
            "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}],
        });
        service_entry(namespace, name, second, spec)
    }

    fn named(picked: Option<&Arc<Service>>) -> Option<String> {
        picked.map(|s| format!("{}/{}", s.namespace, s.name))
    }

    #[test]
    fn each_namespace_gets_its_own_then_one_exported_to_it_by_name_then_the_oldest_public() {
        let ctx = context([
            entry("team-b", "api", 2, &["."]),
            entry("shared", "new", 4, &["*"]),
            entry("team-a", "api", 3, &[]),
            entry("shared", "old", 1, &[]),
            entry("egress", "api", 5, &["team-c", "team-d"]),
        ]);
        assert_eq!(ctx.services.len(), 1);
        // The oldest is what a proxy with no better choice gets.
        assert_eq!(
            named(ctx.services.get("api.example.com")),
            Some("shared/old".into())
        );
        let shared = &ctx.shared_hosts;
        let candidates = shared.get("api.example.com").unwrap();
        assert_eq!(candidates.declared().len(), 5);
        assert_eq!(shared.others().count(), 4);
        let pick = |ns: &str, default: &[String]| named(candidates.choose(ns, default, |_| true));
        let public = ["*".to_string()];
        // Private to the proxy's namespace, though public ones are older.
        assert_eq!(pick("team-b", &public), Some("team-b/api".into()));
        // The mesh default makes team-a's public: the oldest public one wins.
        assert_eq!(pick("team-a", &public), Some("shared/old".into()));
        // With a private mesh default, team-a's is its own.
        assert_eq!(
            pick("team-a", &[".".to_string()]),
            Some("team-a/api".into())
        );
        // Exported to the namespace by name, before older public ones.
        assert_eq!(pick("team-c", &public), Some("egress/api".into()));
        assert_eq!(pick("elsewhere", &public), Some("shared/old".into()));
        // What the proxy's Sidecar does not import is not chosen.
        let picked = candidates.choose("team-b", &public, |s| s.namespace == "shared");
        assert_eq!(named(picked), Some("shared/old".into()));
        assert_eq!(candidates.choose("team-b", &public, |_| false), None);
    }

    #[test]
    fn a_kubernetes_service_comes_before_older_service_entries_of_its_host() {
        let squatter = json!({
            "hosts": ["api.web.svc.cluster.local"],
            "exportTo": ["."],
            "resolution": "DNS",
            "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}],
        });
        let ctx = context([
            service_entry("web", "squatter", 1, squatter),
            created(
                service("web", "api", "10.96.0.9").port("http", 80).build(),
                2,
            ),
        ]);
        let host = "api.web.svc.cluster.local";
        assert_eq!(named(ctx.services.get(host)), Some("web/api".into()));
        let candidates = ctx.shared_hosts.get(host).unwrap();
        assert_eq!(
            named(candidates.choose("web", &[], |_| true)),
            Some("web/api".into())
        );
    }

    #[test]
    fn entries_of_one_namespace_alike_merge_ports_and_every_entry_of_it_adds_endpoints() {
        let entry = |ns: &str, name: &str, second: u32, export: &str, port: Value, ip: &str| {
            let spec = json!({
                "hosts": ["api.example.com"],
                "exportTo": [export],
                "resolution": "STATIC",
                "ports": [port],
                "endpoints": [{"address": ip}],
            });
            service_entry(ns, name, second, spec)
        };
        let (http, tls) = (
            json!({"number": 80, "name": "http"}),
            json!({"number": 443, "name": "tls"}),
        );
        let ctx = context([
            entry("web", "http", 1, "*", http.clone(), "10.0.0.1"),
            entry("web", "https", 2, "*", tls.clone(), "10.0.0.2"),
            // Other labels: not merged, but its endpoints are the namespace's.
            labeled(
                entry(
                    "web",
                    "labelled",
                    3,
                    "*",
                    json!({"number": 8080, "name": "http-alt"}),
                    "10.0.0.3",
                ),
                &[("team", "x")],
            ),
            // Private: what a proxy of `web` picks, with the namespace's endpoints.
            entry("web", "private", 4, ".", tls, "10.0.0.4"),
            entry("other", "api", 5, ".", http, "10.9.0.1"),
        ]);
        let ports = |s: &Service| s.ports.iter().map(|p| p.port).collect::<Vec<_>>();
        let ips = |s: &Service| {
            let mut ips: Vec<String> = s.endpoints.iter().map(|e| e.address.clone()).collect();
            ips.sort();
            ips
        };
        let host = ctx.shared_hosts.get("api.example.com").unwrap();
        let public = ["*".to_string()];
        let elsewhere = host.choose("default", &public, |_| true).unwrap();
        assert_eq!(elsewhere.name, "http");
        assert_eq!(ports(elsewhere), [80, 443]);
        assert_eq!(
            ips(elsewhere),
            ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
        );
        // What most proxies get is the same.
        assert_eq!(ctx.services["api.example.com"], *elsewhere);
        let own = host.choose("web", &public, |_| true).unwrap();
        assert_eq!((own.name.as_str(), ports(own)), ("private", vec![443]));
        assert_eq!(ips(own), ips(elsewhere));
        // Another namespace's entry keeps its own endpoints.
        let other = host.choose("other", &public, |_| true).unwrap();
        assert_eq!(ips(other), ["10.9.0.1"]);
        // As declared, in the registry.
        assert_eq!(host.declared()[1].ports.len(), 1);
        assert_eq!(ctx.service_count(), 5);
    }

    #[test]
    fn a_host_one_service_declares_is_not_shared() {
        let ctx = context([entry("a", "api", 1, &[])]);
        assert_eq!(ctx.services.len(), 1);
        assert!(ctx.shared_hosts.is_empty());
        assert_eq!(ctx.shared_hosts.others().count(), 0);
    }
}
