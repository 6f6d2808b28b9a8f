//! Hosts that several services declare: ServiceEntries of one host in several namespaces
//! (each team declaring the same external API for its own namespace), or one beside the
//! Kubernetes Service of that name.
//!
//! istiod keeps every such service and lets each proxy pick one when it builds its
//! SidecarScope (`appendSidecarServices` over `servicesExportedToNamespace`): a Kubernetes
//! Service before any other; then services exported to the proxy's namespace by name (or
//! private to it) before public ones; of those, the oldest. Ports are not merged here
//! (istiod merges the ports of mergeable services of one namespace; see README).
//!
//! Most meshes have no such host, and then nothing here costs a proxy anything: the push
//! context's `services` holds, for each host, the one service most proxies get, and only
//! hosts listed here are chosen per proxy.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Service;

/// Of each host that more than one service declares, every such service, Kubernetes first,
/// then oldest first (then by namespace and name).
#[derive(Debug, Default, PartialEq)]
pub struct SharedHosts(BTreeMap<String, Vec<Arc<Service>>>);

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

impl SharedHosts {
    /// Splits `services` into the one service of each host most proxies get (the first in
    /// istiod's order) and the hosts more than one declares.
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
        for (host, all) in &mut shared {
            all.sort_by(|a, b| precedence(a).cmp(&precedence(b)));
            primary.insert(host.clone(), all[0].clone());
        }
        (primary, SharedHosts(shared))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every service of `host`, in istiod's order, if more than one declares it.
    pub fn get(&self, host: &str) -> Option<&[Arc<Service>]> {
        self.0.get(host).map(Vec::as_slice)
    }

    /// The services that are not the first of their host: with the push context's
    /// `services`, every service.
    pub fn others(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.0.values().flat_map(|all| &all[1..])
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

/// The service of one host (`candidates`, in [`SharedHosts`]' order) a proxy of
/// `namespace` gets, among those exported to it that `usable` accepts (its Sidecar's
/// egress hosts): a Kubernetes Service; else the oldest exported to the namespace by name
/// or private to it; else the oldest public one.
pub fn choose<'a>(
    candidates: &'a [Arc<Service>],
    namespace: &str,
    default_export_to: &[String],
    usable: impl Fn(&Service) -> bool,
) -> Option<&'a Arc<Service>> {
    candidates
        .iter()
        .filter(|s| s.visible_from(namespace, default_export_to) && usable(s))
        // The first of equal keys: the oldest.
        .min_by_key(|s| {
            (
                !s.kubernetes,
                !exported_by_name(s, namespace, default_export_to),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PushContext;

    /// A ServiceEntry of `api.example.com` in `namespace`, created on day `day` of 2024.
    fn entry(namespace: &str, name: &str, day: u32, export_to: &str) -> String {
        format!(
            "---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: {namespace}, creationTimestamp: '2024-01-{day:02}T00:00:00Z'}}\nspec:\n  hosts: [api.example.com]\n  exportTo: [{export_to}]\n  resolution: DNS\n  ports: [{{number: 443, name: tls, protocol: TLS}}]\n"
        )
    }

    fn named(picked: Option<&Arc<Service>>) -> Option<String> {
        picked.map(|s| format!("{}/{}", s.namespace, s.name))
    }

    #[test]
    fn each_namespace_gets_its_own_then_one_exported_to_it_by_name_then_the_oldest_public() {
        let yaml = [
            entry("team-b", "api", 2, "'.'"),
            entry("shared", "new", 4, "'*'"),
            entry("team-a", "api", 3, ""),
            entry("shared", "old", 1, ""),
            entry("egress", "api", 5, "team-c, team-d"),
        ]
        .concat();
        let ctx = PushContext::from_yaml(&yaml);
        assert_eq!(ctx.services.len(), 1);
        // The oldest is what a proxy with no better choice gets.
        assert_eq!(
            named(ctx.services.get("api.example.com")),
            Some("shared/old".into())
        );
        let shared = &ctx.shared_hosts;
        let candidates = shared.get("api.example.com").unwrap();
        assert_eq!(candidates.len(), 5);
        assert_eq!(shared.others().count(), 4);
        let pick = |ns: &str, default: &[String]| named(choose(candidates, ns, default, |_| true));
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
        let picked = choose(candidates, "team-b", &public, |s| s.namespace == "shared");
        assert_eq!(named(picked), Some("shared/old".into()));
        assert_eq!(choose(candidates, "team-b", &public, |_| false), None);
    }

    #[test]
    fn a_kubernetes_service_comes_before_older_service_entries_of_its_host() {
        let mut yaml = entry("web", "squatter", 1, "'.'")
            .replace("api.example.com", "api.web.svc.cluster.local");
        yaml.push_str("---\napiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: web, creationTimestamp: '2024-02-01T00:00:00Z'}\nspec: {clusterIP: 10.96.0.9, ports: [{name: http, port: 80}]}\n");
        let ctx = PushContext::from_yaml(&yaml);
        let host = "api.web.svc.cluster.local";
        assert_eq!(named(ctx.services.get(host)), Some("web/api".into()));
        let candidates = ctx.shared_hosts.get(host).unwrap();
        assert_eq!(
            named(choose(candidates, "web", &[], |_| true)),
            Some("web/api".into())
        );
    }

    #[test]
    fn a_host_one_service_declares_is_not_shared() {
        let ctx = PushContext::from_yaml(&entry("a", "api", 1, ""));
        assert_eq!(ctx.services.len(), 1);
        assert!(ctx.shared_hosts.is_empty());
        assert_eq!(ctx.shared_hosts.others().count(), 0);
    }
}
