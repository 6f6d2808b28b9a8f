//! MeshConfig's `outboundClusterStatName` and `inboundClusterStatName`: patterns that name
//! a service's clusters and tcp_proxies in Envoy's statistics in place of their Istio names
//! (`outbound|PORT|SUBSET|HOST`, `inbound|PORT||`), so dashboards can read `reviews.shop`
//! instead. istiod fills them in `BuildStatPrefix` (clusters, outbound tcp_proxies) and
//! `BuildInboundStatPrefix` (inbound tcp_proxies), and so does [`fill`]:
//!
//! - `%SERVICE%`: `NAME.NAMESPACE` of a Kubernetes Service, else the host;
//! - `%SERVICE_NAME%`: the Kubernetes Service's name, else the host;
//! - `%SERVICE_FQDN%`: the host;
//! - `%SUBSET_NAME%`: the DestinationRule subset, empty for none;
//! - `%TARGET_PORT%`: the workload port of an inbound cluster, `0` outbound; an inbound
//!   tcp_proxy leaves it as written, as istiod's does;
//! - `%SERVICE_PORT%`, `%SERVICE_PORT_NAME%`: the service port's number and name.
//!
//! A cluster's `alt_stat_name` is the filled pattern, else the cluster's name, and Istio's
//! stat prefix delimiter ([`alt_stat_name`]), as istiod names every cluster; so are the
//! connection managers' stat prefixes ([`delimited`]). Istio's bootstrap reads the
//! `cluster_name` and `http_conn_manager_prefix` tags up to the delimiter. A tcp_proxy's
//! `stat_prefix` is the filled pattern alone.

use model::Service;

/// Istio's `StatPrefixDelimiter`, after a cluster's alternative stat name and a connection
/// manager's stat prefix.
const DELIMITER: &str = ";";

/// `name` followed by Istio's delimiter.
pub fn delimited(name: &str) -> String {
    format!("{name}{DELIMITER}")
}

/// What a pattern names: a port of `service`, reached as `host` (a route's destination
/// host as the route writes it, for the tcp_proxy of a route; else the service's own).
pub struct Target<'a> {
    pub service: &'a Service,
    pub host: &'a str,
    pub subset: &'a str,
    pub port: u32,
    pub port_name: &'a str,
    /// `%TARGET_PORT%`'s value; `None` leaves it as written.
    pub target_port: Option<u32>,
}

impl<'a> Target<'a> {
    /// A port of `service`, named as the service names it, with no subset and
    /// `%TARGET_PORT%` 0: what istiod fills outbound patterns with.
    pub fn outbound(service: &'a Service, port: u32) -> Target<'a> {
        Target {
            service,
            host: &service.hostname,
            subset: "",
            port,
            port_name: port_name(service, port),
            target_port: Some(0),
        }
    }
}

/// The name of `service`'s port `port`; empty when it has none.
pub fn port_name(service: &Service, port: u32) -> &str {
    (service.ports.iter())
        .find(|p| p.port == port)
        .map_or("", |p| p.name.as_str())
}

/// `pattern` filled for `t`, replacement by replacement in istiod's order.
pub fn fill(pattern: &str, t: &Target) -> String {
    let svc = t.service;
    let (short, name) = if svc.kubernetes {
        (format!("{}.{}", svc.name, svc.namespace), svc.name.as_str())
    } else {
        (t.host.to_string(), t.host)
    };
    let mut s = pattern.replace("%SERVICE%", &short);
    s = s.replace("%SERVICE_NAME%", name);
    s = s.replace("%SERVICE_FQDN%", t.host);
    s = s.replace("%SUBSET_NAME%", t.subset);
    if let Some(target) = t.target_port {
        s = s.replace("%TARGET_PORT%", &target.to_string());
    }
    s = s.replace("%SERVICE_PORT%", &t.port.to_string());
    s.replace("%SERVICE_PORT_NAME%", t.port_name)
}

/// The `alt_stat_name` of cluster `name`: `pattern` filled for what `target` names, else
/// `name`, delimited. `target` is called only for a pattern, so the usual mesh, which
/// sets none, pays nothing for it.
pub fn alt_stat_name<'a>(
    pattern: &str,
    target: impl FnOnce() -> Option<Target<'a>>,
    name: &str,
) -> String {
    if !pattern.is_empty()
        && let Some(t) = target()
    {
        return fill(pattern, &t) + DELIMITER;
    }
    delimited(name)
}

/// A tcp_proxy's `stat_prefix` under `pattern` for what `target` names, else `default`
/// (its cluster's name, as istiod's); `target` is called only for a pattern.
pub fn stat_prefix<'a>(
    pattern: &str,
    target: impl FnOnce() -> Option<Target<'a>>,
    default: &str,
) -> String {
    if !pattern.is_empty()
        && let Some(t) = target()
    {
        return fill(pattern, &t);
    }
    default.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(kubernetes: bool) -> Service {
        Service {
            hostname: "reviews.shop.svc.cluster.local".into(),
            namespace: "shop".into(),
            name: "reviews".into(),
            kubernetes,
            vip: None,
            more_addresses: Vec::new(),
            auto_allocated: Default::default(),
            ports: vec![model::ServicePort {
                name: "http-web".into(),
                port: 9080,
                protocol: model::Protocol::Http,
                target_port: Some(8080),
            }],
            endpoints: Vec::new(),
            discovery: model::service::Discovery::Eds,
            mesh_external: false,
            export_to: Vec::new(),
            creation: None,
            selector: Default::default(),
            labels: Default::default(),
            traffic_distribution: model::TrafficDistribution::Any,
            alias_for: None,
            aliases: Vec::new(),
        }
    }

    #[test]
    fn every_placeholder_is_filled_as_istiod_fills_it() {
        let k8s = service(true);
        let pattern = "%SERVICE%|%SERVICE_NAME%|%SERVICE_FQDN%|%SUBSET_NAME%|%TARGET_PORT%|%SERVICE_PORT%|%SERVICE_PORT_NAME%";
        let t = Target {
            subset: "v2",
            ..Target::outbound(&k8s, 9080)
        };
        assert_eq!(
            fill(pattern, &t),
            "reviews.shop|reviews|reviews.shop.svc.cluster.local|v2|0|9080|http-web"
        );
        // A ServiceEntry host, reached by a route's short host: the host as written.
        let entry = service(false);
        let t = Target {
            host: "reviews",
            port: 1,
            target_port: None,
            ..Target::outbound(&entry, 9080)
        };
        assert_eq!(
            fill(pattern, &t),
            "reviews|reviews|reviews||%TARGET_PORT%|1|http-web"
        );
    }

    #[test]
    fn an_empty_pattern_keeps_the_istio_names() {
        let svc = service(true);
        let some = || Some(Target::outbound(&svc, 9080));
        assert_eq!(alt_stat_name("", some, "c"), "c;");
        assert_eq!(alt_stat_name("%SERVICE%", || None, "c"), "c;");
        // Without a pattern the target is never built (a mesh that sets none pays nothing).
        assert_eq!(alt_stat_name("", || unreachable!(), "c"), "c;");
        assert_eq!(stat_prefix("", || unreachable!(), "c"), "c");
        assert_eq!(
            alt_stat_name("%SERVICE%_%SERVICE_PORT%", some, "c"),
            "reviews.shop_9080;"
        );
        assert_eq!(
            stat_prefix("", some, "outbound|9080||x"),
            "outbound|9080||x"
        );
        assert_eq!(
            stat_prefix("%SERVICE%", || None, "outbound|9080||x"),
            "outbound|9080||x"
        );
        assert_eq!(stat_prefix("%SERVICE%", some, "x"), "reviews.shop");
    }
}
