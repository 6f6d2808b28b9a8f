//! NDS: the DNS name table istio-agent's DNS proxy answers from. An agent with DNS capture
//! on (`ISTIO_META_DNS_CAPTURE=true` on a sidecar, `ISTIO_META_ENABLE_DNS_SERVER=true` on
//! any proxy; Envoy's node carries both as metadata) asks for it on its proxy's ADS
//! stream; with it the agent resolves the mesh's hosts itself, ServiceEntry hosts that no
//! DNS server knows included.
//!
//! The table follows istiod's `BuildNameTable`: each service the proxy may reach, by host
//! name, with its addresses; a headless service (or a ServiceEntry with resolution `NONE`
//! and no address) with its ready endpoints on the proxy's network instead, and each of
//! its Pods with a hostname of its own (a StatefulSet's) by `POD.SERVICE.NS.svc...`; a
//! service with neither is left out, and the agent forwards its queries upstream. A
//! Kubernetes Service's entry names the Service and its namespace, so the agent answers
//! the short forms too (`name`, `name.namespace`, ...).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use model::service::{AutoAddresses, Discovery};
use model::{Proxy, Service};

/// The messages of `proto/nds.proto`.
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/istio.networking.nds.v1.rs"));
}

pub use proto::NameTable;
pub use proto::name_table::NameInfo;

impl prost::Name for NameTable {
    const NAME: &'static str = "NameTable";
    const PACKAGE: &'static str = "istio.networking.nds.v1";

    fn type_url() -> String {
        format!("type.googleapis.com/{}", Self::full_name())
    }
}

/// The registry names istiod writes.
const KUBERNETES: &str = "Kubernetes";
const EXTERNAL: &str = "External";

/// Multi-cluster services' hosts, which get no short forms (they would clash with the
/// cluster-local Service's).
const CLUSTERSET_SUFFIX: &str = ".clusterset.local";

/// The name table of a proxy that may reach `services`.
pub fn name_table(proxy: &Proxy, services: &[&Arc<Service>]) -> NameTable {
    let mut table = NameTable::default();
    for svc in services {
        // Of two entries for one name, the later stays (it is the service's own).
        table.table.extend(entries(proxy, svc));
    }
    table
}

/// One service's entries: its host's, after those of its Pods with hostnames of their own
/// when it is headless. Only a headless service's depend on the proxy (its network).
pub fn entries(proxy: &Proxy, svc: &Service) -> Vec<(String, NameInfo)> {
    let registry = if svc.kubernetes { KUBERNETES } else { EXTERNAL };
    let mut out = Vec::new();
    let auto = proxy.auto_addresses;
    let addressed = (svc.vip.as_deref()).is_some_and(|ip| !is_unspecified(ip))
        || svc.auto_for(auto) != AutoAddresses::None;
    let ips = match addressed {
        // Its own addresses, else those auto-allocated for it in the proxy's IP families.
        // A CIDR (a ServiceEntry may have one) is no answer to a query.
        true => (svc.addresses_for(auto))
            .filter(|a| a.parse::<IpAddr>().is_ok())
            .map(str::to_string)
            .collect(),
        false if is_headless(svc) => {
            let (ips, pods) = headless(proxy, svc);
            for (pod, ips) in pods {
                let info = NameInfo {
                    ips,
                    registry: registry.into(),
                    shortname: format!("{pod}.{}", svc.name),
                    namespace: svc.namespace.clone(),
                    ..Default::default()
                };
                out.push((format!("{pod}.{}", svc.hostname), info));
            }
            ips
        }
        // A DNS-resolved ServiceEntry without an address: nothing to answer with.
        false => Vec::new(),
    };
    if ips.is_empty() {
        return out;
    }
    let short_forms = svc.kubernetes && !svc.hostname.ends_with(CLUSTERSET_SUFFIX);
    let (shortname, namespace) = if short_forms {
        (svc.name.clone(), svc.namespace.clone())
    } else {
        Default::default()
    };
    let info = NameInfo {
        ips,
        registry: registry.into(),
        shortname,
        namespace,
        ..Default::default()
    };
    // A proxy reaches one service per host (the push context chooses among several, as
    // istiod's SidecarScope does), so there is nothing to merge.
    out.push((svc.hostname.clone(), info));
    out
}

/// Whether the table of a proxy that may reach `services` depends on endpoints: only a
/// headless service's entry does. An endpoint-only change leaves any other table as it was.
pub fn reads_endpoints(services: &[&Arc<Service>]) -> bool {
    services.iter().any(|svc| is_headless(svc))
}

/// A headless service: no address, its endpoints' addresses resolved instead.
pub fn is_headless(svc: &Service) -> bool {
    // The address is parsed last: most services are not passthrough.
    svc.discovery == Discovery::Passthrough
        && !svc.ports.is_empty()
        && svc.vip.as_deref().is_none_or(is_unspecified)
}

/// A headless service's answers, as Kubernetes' DNS gives them: its ready endpoints'
/// addresses, each once, and the addresses of each endpoint that has a hostname of its own
/// (a StatefulSet's Pod) by that name. Only those on the proxy's network, as istiod does:
/// the agent's answer bypasses the network gateways.
fn headless(proxy: &Proxy, svc: &Service) -> (Vec<String>, BTreeMap<String, Vec<String>>) {
    let mut seen = BTreeSet::new();
    let (mut ips, mut pods) = (Vec::new(), BTreeMap::<String, Vec<String>>::new());
    for e in &svc.endpoints {
        let same_network =
            e.network.is_empty() || proxy.network.is_empty() || e.network == proxy.network;
        if !e.healthy || !same_network || e.address.parse::<IpAddr>().is_err() {
            continue;
        }
        if !seen.insert(&e.address) {
            continue;
        }
        if let Some(pod) = e.hostname.as_deref().filter(|h| !h.is_empty()) {
            pods.entry(pod.to_string())
                .or_default()
                .push(e.address.clone());
        }
        ips.push(e.address.clone());
    }
    (ips, pods)
}

/// The table in istiod's protobuf JSON (empty fields left out), as `/debug/ndsz` shows it.
pub fn to_json(t: &NameTable) -> serde_json::Value {
    use serde_json::{Map, Value, json};
    let entries: Map<String, Value> = (t.table.iter())
        .map(|(host, info)| {
            let mut entry = Map::new();
            if !info.ips.is_empty() {
                entry.insert("ips".into(), json!(info.ips));
            }
            for (field, value) in [
                ("registry", &info.registry),
                ("shortname", &info.shortname),
                ("namespace", &info.namespace),
            ] {
                if !value.is_empty() {
                    entry.insert(field.into(), json!(value));
                }
            }
            (host.clone(), Value::Object(entry))
        })
        .collect();
    json!({"@type": <NameTable as prost::Name>::type_url(), "table": entries})
}

fn is_unspecified(ip: &str) -> bool {
    ip.parse::<IpAddr>().is_ok_and(|ip| ip.is_unspecified())
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::PushContext;

    const MESH: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: shop}
spec: {clusterIP: 10.96.0.7, ports: [{name: http, port: 9080}]}
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: shop}
spec: {clusterIP: None, ports: [{name: tcp, port: 5432}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: db-a, namespace: shop, labels: {kubernetes.io/service-name: db}}
addressType: IPv4
ports: [{name: tcp, port: 5432}]
endpoints:
- {addresses: [10.0.0.2], hostname: db-1, conditions: {ready: true}, targetRef: {kind: Pod, name: db-1}}
- {addresses: [10.0.0.1], hostname: db-0, conditions: {ready: true}, targetRef: {kind: Pod, name: db-0}}
- {addresses: [10.0.0.3], hostname: db-2, conditions: {ready: false}, targetRef: {kind: Pod, name: db-2}}
- {addresses: [10.9.0.4], hostname: db-3, conditions: {ready: true}, targetRef: {kind: Pod, name: db-3}}
---
apiVersion: v1
kind: Pod
metadata: {name: db-0, namespace: shop, labels: {topology.istio.io/network: net-a}}
---
apiVersion: v1
kind: Pod
metadata: {name: db-1, namespace: shop, labels: {topology.istio.io/network: net-a}}
---
apiVersion: v1
kind: Pod
metadata: {name: db-3, namespace: shop, labels: {topology.istio.io/network: net-b}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: legacy, namespace: shop}
spec:
  hosts: [legacy.corp.example]
  addresses: [192.168.7.7, 192.168.6.0/24, 192.168.7.9]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 192.168.7.70}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: range, namespace: shop}
spec:
  hosts: [range.corp.example]
  addresses: [192.168.8.0/24]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: NONE
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api, namespace: shop}
spec:
  hosts: [api.example.com]
  ports: [{number: 443, name: tls, protocol: TLS}]
  resolution: DNS
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews-decorator, namespace: shop}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  addresses: [10.200.0.1]
  ports: [{number: 9080, name: http, protocol: HTTP}]
  resolution: STATIC
---
apiVersion: v1
kind: Service
metadata: {name: ratings, namespace: other}
spec: {clusterIP: 10.96.0.8, ports: [{name: http, port: 9080}]}
"#;

    fn sidecar(namespace: &str, network: &str) -> Proxy {
        let meta = serde_json::json!({"NAMESPACE": namespace, "NETWORK": network});
        let id = format!("sidecar~10.0.0.9~web-1.{namespace}~{namespace}.svc.cluster.local");
        Proxy::from_node(&id, meta.as_object().unwrap()).unwrap()
    }

    fn table(extra: &str, proxy: &Proxy) -> NameTable {
        let ctx = PushContext::from_yaml(&format!("{MESH}\n---\n{extra}"));
        name_table(proxy, &ctx.services_for(proxy))
    }

    #[test]
    fn each_reachable_host_is_answered_as_istiod_answers_it() {
        let t = table("", &sidecar("shop", ""));
        let reviews = &t.table["reviews.shop.svc.cluster.local"];
        assert_eq!(
            reviews.ips,
            ["10.96.0.7"],
            "the Service, not its decorating entry"
        );
        assert_eq!(reviews.registry, "Kubernetes");
        assert_eq!(
            (&*reviews.shortname, &*reviews.namespace),
            ("reviews", "shop")
        );
        let ratings = &t.table["ratings.other.svc.cluster.local"];
        assert_eq!(
            (&ratings.ips[..], &*ratings.shortname),
            (&["10.96.0.8".to_string()][..], "ratings")
        );
        // Headless: the ready endpoints, each once, in the model's order; a proxy that
        // names no network sees those of every network.
        let db = &t.table["db.shop.svc.cluster.local"];
        assert_eq!(db.ips, ["10.0.0.1", "10.0.0.2", "10.9.0.4"]);
        assert_eq!((&*db.shortname, &*db.namespace), ("db", "shop"));
        // Each pod with a hostname of its own (a StatefulSet's), by that name.
        let db0 = &t.table["db-0.db.shop.svc.cluster.local"];
        assert_eq!(db0.ips, ["10.0.0.1"]);
        assert_eq!((&*db0.shortname, &*db0.namespace), ("db-0.db", "shop"));
        assert_eq!(db0.registry, "Kubernetes");
        assert!(t.table.contains_key("db-3.db.shop.svc.cluster.local"));
        assert!(
            !t.table.contains_key("db-2.db.shop.svc.cluster.local"),
            "not ready"
        );
        // Every address that is one, in order.
        let legacy = &t.table["legacy.corp.example"];
        assert_eq!(legacy.ips, ["192.168.7.7", "192.168.7.9"]);
        assert_eq!(legacy.registry, "External");
        assert_eq!((&*legacy.shortname, &*legacy.namespace), ("", ""));
        // A CIDR, and a DNS-resolved entry without an address: nothing to answer with.
        assert!(!t.table.contains_key("range.corp.example"));
        assert!(!t.table.contains_key("api.example.com"));
        assert_eq!(t.table.len(), 7);
    }

    #[test]
    fn a_headless_services_endpoints_on_another_network_are_left_out() {
        let t = table("", &sidecar("shop", "net-a"));
        assert_eq!(
            t.table["db.shop.svc.cluster.local"].ips,
            ["10.0.0.1", "10.0.0.2"]
        );
        assert!(!t.table.contains_key("db-3.db.shop.svc.cluster.local"));
        let t = table("", &sidecar("shop", "net-b"));
        assert_eq!(t.table["db.shop.svc.cluster.local"].ips, ["10.9.0.4"]);
        assert!(!t.table.contains_key("db-0.db.shop.svc.cluster.local"));
    }

    #[test]
    fn a_sidecar_scopes_the_table_like_its_clusters() {
        let scope = r#"
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: shop}
spec:
  egress: [{hosts: ["./*"]}]
"#;
        let t = table(scope, &sidecar("shop", ""));
        assert!(t.table.contains_key("reviews.shop.svc.cluster.local"));
        assert!(!t.table.contains_key("ratings.other.svc.cluster.local"));
    }
}
