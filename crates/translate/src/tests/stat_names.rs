//! MeshConfig's `outboundClusterStatName` and `inboundClusterStatName`: clusters'
//! `alt_stat_name` and tcp_proxies' `stat_prefix`, as istiod's `BuildStatPrefix` and
//! `BuildInboundStatPrefix` fill them.

use envoy_api::pb::envoy::config::cluster::v3::Cluster;
use envoy_api::pb::envoy::config::listener::v3::{Listener, filter::ConfigType};
use envoy_api::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use prost::Message;
use serde_json::json;

use super::{context, sidecar};
use crate::{ProxyConfig, proxy_config};

const PATTERNS: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |\n    outboundClusterStatName: '%SERVICE%_%SUBSET_NAME%_%SERVICE_PORT_NAME%_%SERVICE_PORT%_%TARGET_PORT%'\n    inboundClusterStatName: 'LocalService_%SERVICE_NAME%_%SERVICE_PORT%_%TARGET_PORT%'\n";

/// `db` in shop selects the proxy (workload port 15432) and routes TCP to its subset
/// v2; `payments.example` is a ServiceEntry host.
const SERVICES: &str = "---\napiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: shop}\nspec: {clusterIP: 10.96.0.50, selector: {app: web}, ports: [{name: tcp-pg, port: 5432, targetPort: 15432}]}\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: db, namespace: shop}\nspec:\n  host: db\n  subsets: [{name: v2, labels: {version: v2}}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: db, namespace: shop}\nspec:\n  hosts: [db]\n  tcp: [{route: [{destination: {host: db, subset: v2}}]}]\n---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: payments, namespace: shop}\nspec:\n  hosts: [payments.example]\n  addresses: [240.1.1.1]\n  resolution: STATIC\n  endpoints: [{address: 10.1.1.1}]\n  ports: [{number: 7000, name: tcp-pay, protocol: TCP}]\n";

fn config(yaml: &str) -> ProxyConfig {
    proxy_config(&context(yaml), &sidecar("shop", json!({"app": "web"})))
}

fn cluster<'a>(cfg: &'a ProxyConfig, name: &str) -> &'a Cluster {
    let found = cfg.clusters.iter().find(|c| c.name == name);
    found.unwrap_or_else(|| panic!("no cluster {name}"))
}

/// The tcp_proxy of the listener `name`'s chain `chain` (the first when `None`).
fn tcp_proxy(cfg: &ProxyConfig, name: &str, chain: Option<&str>) -> TcpProxy {
    let l: &Listener = (cfg.listeners.iter()).find(|l| l.name == name).unwrap();
    let chain = match chain {
        Some(c) => (l.filter_chains.iter()).find(|f| f.name == c),
        None => l.filter_chains.first(),
    };
    let chain = chain.unwrap_or_else(|| panic!("{l:?}"));
    let filter = (chain.filters.iter()).find(|f| f.name == "envoy.filters.network.tcp_proxy");
    let Some(ConfigType::TypedConfig(any)) = &filter.unwrap().config_type else {
        panic!("{chain:?}")
    };
    TcpProxy::decode(any.value.as_slice()).unwrap()
}

#[test]
fn the_meshs_patterns_name_clusters_and_tcp_proxies_in_envoys_stats() {
    let cfg = config(&format!("{PATTERNS}{SERVICES}"));
    // Outbound: a Kubernetes service as NAME.NAMESPACE, `%TARGET_PORT%` 0.
    let reviews = "outbound|9080|v1|reviews.shop.svc.cluster.local";
    assert_eq!(
        cluster(&cfg, reviews).alt_stat_name,
        "reviews.shop_v1_http_9080_0;"
    );
    assert_eq!(
        cluster(&cfg, "outbound|9080||reviews.shop.svc.cluster.local").alt_stat_name,
        "reviews.shop__http_9080_0;"
    );
    // A ServiceEntry host as itself.
    assert_eq!(
        cluster(&cfg, "outbound|7000||payments.example").alt_stat_name,
        "payments.example__tcp-pay_7000_0;"
    );
    // The TCP route's tcp_proxy, to db's subset v2; the ServiceEntry's own.
    assert_eq!(
        tcp_proxy(&cfg, "10.96.0.50_5432", None).stat_prefix,
        "db.shop_v2_tcp-pg_5432_0"
    );
    assert_eq!(
        tcp_proxy(&cfg, "240.1.1.1_7000", None).stat_prefix,
        "payments.example__tcp-pay_7000_0"
    );
    // Inbound: the workload port for the cluster; the tcp_proxy leaves it as written.
    assert_eq!(
        cluster(&cfg, "inbound|15432||").alt_stat_name,
        "LocalService_db_5432_15432;"
    );
    let inbound = tcp_proxy(&cfg, "virtualInbound", Some("inbound|15432||-plaintext"));
    assert_eq!(inbound.stat_prefix, "LocalService_db_5432_%TARGET_PORT%");
    // Passthrough and blackhole keep their names, delimited.
    assert_eq!(
        cluster(&cfg, "PassthroughCluster").alt_stat_name,
        "PassthroughCluster;"
    );
}

#[test]
fn without_patterns_stats_keep_the_istio_names() {
    let cfg = config(SERVICES);
    // Every cluster's own name and Istio's delimiter, which its bootstrap's
    // `cluster_name` tag reads up to; the inbound passthrough's stats are the outbound
    // one's, as istiod names them.
    let unlike: Vec<(&str, &str)> = (cfg.clusters.iter())
        .map(|c| (c.name.as_str(), c.alt_stat_name.as_str()))
        .filter(|(name, stat)| {
            let own = if *name == "InboundPassthroughCluster" {
                "PassthroughCluster"
            } else {
                name
            };
            *stat != format!("{own};")
        })
        .collect();
    assert!(unlike.is_empty(), "{unlike:?}");
    let v2 = "outbound|5432|v2|db.shop.svc.cluster.local";
    assert_eq!(tcp_proxy(&cfg, "10.96.0.50_5432", None).stat_prefix, v2);
    let inbound = tcp_proxy(&cfg, "virtualInbound", Some("inbound|15432||-plaintext"));
    assert_eq!(inbound.stat_prefix, "inbound|15432||");
}
