//! ExternalName Services as aliases, as istiod resolves them (`resolveServiceAliases`): an
//! ExternalName Service names another host; followed through other ExternalName Services
//! it ends at a concrete host, whose service then answers to the alias's names too. An
//! alias gets nothing of its own: its name resolves (through the cluster's DNS) to the
//! external name, so a client reaches whatever serves that host, in the mesh or not. A
//! chain that loops ends nowhere, as the cluster's DNS answers NXDOMAIN for it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::{Alias, Service};

/// The aliases of each concrete host, sorted by namespace and name.
pub type Aliases = BTreeMap<String, Vec<Alias>>;

/// Which host each alias among `services` ends at, inverted: concrete host -> aliases.
pub fn resolve<'a>(services: impl Iterator<Item = &'a Arc<Service>>) -> Aliases {
    // The ExternalName is not namespaced: of two aliases of one hostname (one Service
    // name), the last seen wins, as in istiod, where the outcome is undefined.
    let mut raw: Vec<(Alias, &str)> = Vec::new();
    let mut by_host: HashMap<&str, &str> = HashMap::new();
    for svc in services {
        if let Some(target) = &svc.alias_for {
            let alias = Alias {
                namespace: svc.namespace.clone(),
                name: svc.name.clone(),
            };
            raw.push((alias, target));
            by_host.insert(&svc.hostname, target);
        }
    }
    let mut out = Aliases::new();
    for (alias, mut target) in raw {
        let mut seen: HashSet<&str> = HashSet::new();
        let concrete = loop {
            let Some(next) = by_host.get(target) else {
                break Some(target);
            };
            if !seen.insert(target) {
                break None;
            }
            target = next;
        };
        if let Some(host) = concrete {
            out.entry(host.to_string()).or_default().push(alias);
        }
    }
    for aliases in out.values_mut() {
        aliases.sort();
        aliases.dedup();
    }
    out
}

/// `svc` with its aliases from `index` (the same `Arc` when it has none, or the same).
pub fn with_aliases(svc: Arc<Service>, index: &Aliases) -> Arc<Service> {
    let aliases = index.get(&svc.hostname).map_or(&[][..], Vec::as_slice);
    if svc.aliases == aliases {
        return svc;
    }
    let mut svc = Arc::unwrap_or_clone(svc);
    svc.aliases = aliases.to_vec();
    Arc::new(svc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::service;

    /// The Kubernetes Service `namespace/name`, an ExternalName of `target` if given.
    fn svc(namespace: &str, name: &str, target: Option<&str>) -> Arc<Service> {
        let mut builder = service(namespace, name, "10.0.0.1").port("http", 80);
        if let Some(target) = target {
            builder = builder.external_name(target);
        }
        let store: crate::Store = [builder.build()].into_iter().collect();
        let (services, _, _) = super::super::build_services(&store, &Default::default());
        services.values().next().unwrap().clone()
    }

    fn alias(namespace: &str, name: &str) -> Alias {
        Alias {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    #[test]
    fn aliases_resolve_through_chains_to_the_concrete_host_and_loops_to_nothing() {
        let services = [
            svc("shop", "reviews", None),
            svc("web", "rev", Some("reviews.shop.svc.cluster.local")),
            svc("app", "r", Some("rev.web.svc.cluster.local")),
            svc("app", "ext", Some("api.example.com")),
            svc("x", "a", Some("b.x.svc.cluster.local")),
            svc("x", "b", Some("a.x.svc.cluster.local")),
        ];
        let index = resolve(services.iter());
        assert_eq!(
            index,
            Aliases::from([
                ("api.example.com".into(), vec![alias("app", "ext")]),
                (
                    "reviews.shop.svc.cluster.local".into(),
                    vec![alias("app", "r"), alias("web", "rev")]
                ),
            ])
        );
        let reviews = with_aliases(services[0].clone(), &index);
        assert_eq!(reviews.aliases, [alias("app", "r"), alias("web", "rev")]);
        let same = with_aliases(services[1].clone(), &index);
        assert!(Arc::ptr_eq(&same, &services[1]), "no aliases: the same Arc");
    }
}
