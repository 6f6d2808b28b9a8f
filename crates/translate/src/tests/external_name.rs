//! ExternalName Services, as istiod serves them: aliases of the host they name, with no
//! cluster, listener or virtual host of their own. The service they resolve to answers
//! to their names too; an alias of a host outside the mesh adds nothing, so its traffic
//! goes where any traffic to that host goes.

use serde_json::json;

use super::{context, sidecar};
use crate::{ProxyConfig, proxy_config};

/// `rev` in web aliases reviews (in shop); `ext` in web aliases a host outside the mesh;
/// `far` in shop aliases `rev`, a chain.
const ALIASES: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: rev, namespace: web}
spec: {type: ExternalName, externalName: reviews.shop.svc.cluster.local, ports: [{name: http, port: 9080}]}
---
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: web}
spec: {type: ExternalName, externalName: api.example.com., ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: far, namespace: other}
spec: {type: ExternalName, externalName: rev.web.svc.cluster.local}
"#;

fn config(ns: &str) -> ProxyConfig {
    proxy_config(&context(ALIASES), &sidecar(ns, json!({})))
}

/// The domains of the virtual host of route configuration `route` named `vhost`.
fn domains(cfg: &ProxyConfig, route: &str, vhost: &str) -> Vec<String> {
    let rc = cfg.routes.iter().find(|r| r.name == route).unwrap();
    let vh = rc.virtual_hosts.iter().find(|v| v.name == vhost);
    vh.unwrap_or_else(|| panic!("no {vhost} in {route}"))
        .domains
        .clone()
}

const REVIEWS: &str = "reviews.shop.svc.cluster.local:9080";

#[test]
fn an_alias_gets_nothing_of_its_own() {
    let cfg = config("web");
    for name in ["rev.web", "ext.web", "far.other"] {
        let listed = |names: Vec<&str>| names.into_iter().any(|n| n.contains(name));
        assert!(
            !listed(cfg.clusters.iter().map(|c| c.name.as_str()).collect()),
            "{name}"
        );
        assert!(!listed(
            cfg.endpoints
                .iter()
                .map(|e| e.cluster_name.as_str())
                .collect()
        ));
        assert!(!listed(
            cfg.listeners.iter().map(|l| l.name.as_str()).collect()
        ));
        let vhosts = cfg.routes.iter().flat_map(|r| &r.virtual_hosts);
        assert!(!listed(vhosts.map(|v| v.name.as_str()).collect()), "{name}");
    }
    let port_80 = cfg.routes.iter().find(|r| r.name == "80");
    assert!(
        port_80.is_none_or(|r| r
            .virtual_hosts
            .iter()
            .all(|v| !v.domains.iter().any(|d| d.contains("ext")))),
        "an alias of a host outside the mesh routes nowhere of its own"
    );
}

#[test]
fn the_aliased_service_answers_to_its_aliases_names() {
    let in_web = domains(&config("web"), "9080", REVIEWS);
    let rest = &in_web[in_web
        .iter()
        .position(|d| d == "far.other.svc.cluster.local")
        .unwrap()..];
    assert_eq!(
        rest,
        [
            "far.other.svc.cluster.local",
            "far.other.svc.cluster.local.",
            "far.other.svc",
            "far.other",
            "rev.web.svc.cluster.local",
            "rev.web.svc.cluster.local.",
            "rev",
            "rev.web.svc",
            "rev.web",
            "10.96.1.2",
        ],
        "aliases by namespace and name, the short name from their own namespace only"
    );
    // From shop: reviews' own short name, none of the aliases'.
    let in_shop = domains(&config("shop"), "9080", REVIEWS);
    assert!(in_shop.contains(&"reviews".to_string()));
    assert!(in_shop.contains(&"rev.web".to_string()));
    assert!(!in_shop.contains(&"rev".to_string()) && !in_shop.contains(&"far".to_string()));
    let in_other = domains(&config("other"), "9080", REVIEWS);
    assert!(in_other.contains(&"far".to_string()) && !in_other.contains(&"rev".to_string()));
}
