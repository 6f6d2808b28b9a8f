//! ServiceEntry addresses in a sidecar's listeners: one listener per address, a CIDR's
//! chain on the shared listener matched on the range; and the addresses IP auto-allocation
//! wrote into their status, which only proxies that capture DNS use, in their listeners,
//! domains and name tables.

use serde_json::json;

use super::{chains_to_clusters, context};
use crate::proxy_config;
use model::Proxy;

/// Two TCP databases on one port and an HTTP API, none with an address of its own, each
/// given addresses by auto-allocation; one entry that opted out and one that resolves
/// nothing, whose status addresses are not used.
const ENTRIES: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db-a, namespace: shop}
spec:
  hosts: [db-a.example.com]
  ports: [{number: 3306, name: tcp, protocol: TCP}]
  resolution: DNS
status:
  addresses:
  - {value: 240.240.0.1, host: db-a.example.com}
  - {value: "2001:2::1", host: db-a.example.com}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db-b, namespace: shop}
spec:
  hosts: [db-b.example.com]
  ports: [{number: 3306, name: tcp, protocol: TCP}]
  resolution: DNS
status:
  addresses:
  - {value: 240.240.0.2, host: db-b.example.com}
  - {value: "2001:2::2", host: db-b.example.com}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api, namespace: shop}
spec:
  hosts: [api.example.com]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: DNS
status:
  addresses:
  - {value: 240.240.0.3, host: api.example.com}
  - {value: not-an-ip, host: api.example.com}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: opted-out, namespace: shop, labels: {networking.istio.io/enable-autoallocate-ip: "False"}}
spec:
  hosts: [out.example.com]
  ports: [{number: 7000, name: tcp, protocol: TCP}]
  resolution: DNS
status:
  addresses: [{value: 240.240.0.4, host: out.example.com}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: passthrough, namespace: shop}
spec:
  hosts: [none.example.com]
  ports: [{number: 7001, name: tcp, protocol: TCP}]
  resolution: NONE
status:
  addresses: [{value: 240.240.0.5, host: none.example.com}]
"#;

fn proxy(ips: &str, capture: bool) -> Proxy {
    let meta = json!({"NAMESPACE": "app", "INSTANCE_IPS": ips, "DNS_CAPTURE": capture.to_string()});
    let id = "sidecar~10.9.9.9~p.app~app.svc.cluster.local";
    Proxy::from_node(id, meta.as_object().unwrap()).unwrap()
}

fn listener_names(p: &Proxy) -> Vec<String> {
    let cfg = proxy_config(&context(ENTRIES), p);
    (cfg.listeners.iter())
        .map(|l| l.name.clone())
        .filter(|n| n.ends_with("_3306") || n.ends_with("_7000") || n.ends_with("_7001"))
        .collect()
}

fn api_domains(p: &Proxy) -> Vec<String> {
    let cfg = proxy_config(&context(ENTRIES), p);
    let route = cfg.routes.iter().find(|r| r.name == "80").unwrap();
    let vh = (route.virtual_hosts.iter())
        .find(|v| v.name == "api.example.com:80")
        .unwrap();
    vh.domains.clone()
}

#[test]
fn a_dns_capturing_sidecar_binds_each_tcp_entry_to_its_auto_allocated_address() {
    let capturing = proxy("10.9.9.9", true);
    let mut names = listener_names(&capturing);
    names.sort();
    assert_eq!(
        names,
        [
            "0.0.0.0_7000",
            "0.0.0.0_7001",
            "240.240.0.1_3306",
            "240.240.0.2_3306"
        ]
    );
    let cfg = proxy_config(&context(ENTRIES), &capturing);
    let listener = |name: &str| cfg.listeners.iter().find(|l| l.name == name).unwrap();
    assert_eq!(
        chains_to_clusters(listener("240.240.0.2_3306")),
        [(vec![], "outbound|3306||db-b.example.com".to_string())]
    );
    let address = listener("240.240.0.1_3306").address.clone().unwrap();
    assert!(
        format!("{address:?}").contains("240.240.0.1"),
        "{address:?}"
    );
    // Without DNS capture the proxy could not be sent to those addresses: both share
    // 0.0.0.0_3306, as before.
    let mut plain = listener_names(&proxy("10.9.9.9", false));
    plain.sort();
    assert_eq!(plain, ["0.0.0.0_3306", "0.0.0.0_7000", "0.0.0.0_7001"]);
    // An IPv6-only proxy uses the IPv6 address; a dual-stack one the IPv4 address first.
    let v6 = listener_names(&proxy("fd00::9", true));
    assert!(v6.contains(&"2001:2::1_3306".to_string()), "{v6:?}");
    let dual = listener_names(&proxy("10.9.9.9,fd00::9", true));
    assert!(dual.contains(&"240.240.0.1_3306".to_string()), "{dual:?}");
}

#[test]
fn the_auto_allocated_address_is_a_domain_and_a_dns_answer_for_capturing_proxies_only() {
    let capturing = proxy("10.9.9.9", true);
    assert_eq!(
        api_domains(&capturing),
        ["api.example.com", "api.example.com.", "240.240.0.3"]
    );
    assert_eq!(
        api_domains(&proxy("10.9.9.9", false)),
        ["api.example.com", "api.example.com."]
    );

    let table = |p: &Proxy| proxy_config(&context(ENTRIES), p).name_table.unwrap().table;
    let v4 = table(&capturing);
    assert_eq!(v4["db-a.example.com"].ips, ["240.240.0.1"]);
    // The unparsable status value is skipped.
    assert_eq!(v4["api.example.com"].ips, ["240.240.0.3"]);
    assert!(!v4.contains_key("out.example.com"));
    assert!(!v4.contains_key("none.example.com"));
    let dual = table(&proxy("10.9.9.9,fd00::9", true));
    assert_eq!(dual["db-b.example.com"].ips, ["240.240.0.2", "2001:2::2"]);
    assert_eq!(
        table(&proxy("fd00::9", true))["db-b.example.com"].ips,
        ["2001:2::2"]
    );
    // A proxy whose agent serves DNS without capturing it gets no auto-allocated answers.
    let meta = json!({"NAMESPACE": "app", "ENABLE_DNS_SERVER": "true"});
    let id = "sidecar~10.9.9.9~p.app~app.svc.cluster.local";
    let server_only = Proxy::from_node(id, meta.as_object().unwrap()).unwrap();
    assert!(!table(&server_only).contains_key("db-a.example.com"));
}

#[test]
fn each_address_of_a_tcp_entry_gets_a_listener_and_a_cidr_a_matched_chain() {
    use envoy_api::pb::envoy::config::listener::v3::Listener;
    let ctx = context(concat!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: corp, namespace: shop}\nspec:\n",
        "  hosts: [db.corp.example]\n  addresses: [10.50.0.8, 192.168.8.0/24, 10.50.0.7/32]\n",
        "  ports: [{number: 5432, name: tcp, protocol: TCP}]\n  resolution: NONE\n---\n",
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: legacy, namespace: shop}\nspec:\n",
        "  hosts: [legacy.corp.example]\n  addresses: ['fd00:8::/64']\n",
        "  ports: [{number: 5432, name: tcp, protocol: TCP}]\n  resolution: NONE\n",
    ));
    let cfg = proxy_config(&ctx, &proxy("10.9.9.9", false));
    let on_port: Vec<&Listener> = (cfg.listeners.iter())
        .filter(|l| l.name.ends_with("_5432") && !l.name.starts_with("10.96."))
        .collect();
    let mut names: Vec<&str> = on_port.iter().map(|l| l.name.as_str()).collect();
    names.sort();
    // A /32 is its address; a CIDR shares 0.0.0.0 with a chain matched on it.
    assert_eq!(names, ["0.0.0.0_5432", "10.50.0.7_5432", "10.50.0.8_5432"]);
    let cluster = "outbound|5432||db.corp.example";
    let own = on_port.iter().find(|l| l.name == "10.50.0.7_5432").unwrap();
    assert_eq!(chains_to_clusters(own), [(vec![], cluster.to_string())]);
    let shared = on_port.iter().find(|l| l.name == "0.0.0.0_5432").unwrap();
    let ranges: Vec<(String, u32, String)> = (shared.filter_chains.iter())
        .map(|c| {
            let r = &c.filter_chain_match.as_ref().unwrap().prefix_ranges[0];
            let to = chains_to_clusters(&Listener {
                filter_chains: vec![c.clone()],
                ..Default::default()
            });
            (
                r.address_prefix.clone(),
                r.prefix_len.unwrap().value,
                to[0].1.clone(),
            )
        })
        .collect();
    assert_eq!(
        ranges,
        [
            ("192.168.8.0".to_string(), 24, cluster.to_string()),
            (
                "fd00:8::".to_string(),
                64,
                "outbound|5432||legacy.corp.example".to_string()
            ),
        ]
    );
    // Everything else on the port passes through; no SNI, so no TLS inspector.
    let default = shared.default_filter_chain.as_ref().unwrap();
    assert_eq!(default.name, "PassthroughFilterChain");
    assert!(shared.listener_filters.is_empty());
}
