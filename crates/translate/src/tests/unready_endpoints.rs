//! Not-ready endpoints and Envoy's panic mode, as istiod sends them by default
//! (`PILOT_AUTO_SEND_UNHEALTHY_ENDPOINTS`): not-ready endpoints go out as `UNHEALTHY`, and
//! service clusters turn panic mode off, so Envoy never sends a request to a not-ready
//! endpoint however few are ready; where outlier detection's `minHealthPercent` turns
//! panic mode back on, the not-ready endpoints are left out instead.

use envoy_api::pb::envoy::config::cluster::v3::Cluster;
use envoy_api::pb::envoy::config::core::v3::HealthStatus;
use envoy_api::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_api::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, LbEndpoint};
use serde_json::json;

use super::{context, sidecar};
use crate::{ProxyConfig, proxy_config};

/// reviews (in the tests' mesh) has two ready endpoints and one not ready (10.0.0.3, of
/// subset v2); this rule turns panic mode on at 40% for subset v2 only.
const PANIC_AT_40: &str = r#"
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: shop}
spec:
  host: reviews
  subsets:
  - {name: v1, labels: {version: v1}}
  - name: v2
    labels: {version: v2}
    trafficPolicy: {outlierDetection: {consecutive5xxErrors: 3, minHealthPercent: 40}}
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-v2b, namespace: shop, labels: {app: reviews, version: v2}}
"#;

fn config(extra: &str) -> ProxyConfig {
    proxy_config(&context(extra), &sidecar("shop", json!({})))
}

fn cluster<'a>(cfg: &'a ProxyConfig, name: &str) -> &'a Cluster {
    let found = cfg.clusters.iter().find(|c| c.name == name);
    found.unwrap_or_else(|| panic!("no cluster {name}"))
}

fn panic_threshold(c: &Cluster) -> Option<f64> {
    Some(c.common_lb_config.as_ref()?.healthy_panic_threshold?.value)
}

/// Each endpoint's address and health, in order.
fn endpoints(cfg: &ProxyConfig, name: &str) -> Vec<(String, HealthStatus)> {
    let cla: &ClusterLoadAssignment = (cfg.endpoints.iter())
        .find(|e| e.cluster_name == name)
        .unwrap_or_else(|| panic!("no load assignment {name}"));
    let address = |e: &LbEndpoint| match &e.host_identifier {
        Some(HostIdentifier::Endpoint(ep)) => match &ep.address.as_ref().unwrap().address {
            Some(envoy_api::pb::envoy::config::core::v3::address::Address::SocketAddress(s)) => {
                s.address.clone()
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    let mut all: Vec<_> = (cla.endpoints.iter())
        .flat_map(|g| &g.lb_endpoints)
        .map(|e| (address(e), HealthStatus::try_from(e.health_status).unwrap()))
        .collect();
    all.sort();
    all
}

const REVIEWS: &str = "reviews.shop.svc.cluster.local";

#[test]
fn service_clusters_never_panic_and_carry_not_ready_endpoints_as_unhealthy() {
    let cfg = config("");
    for subset in ["", "v1", "v2"] {
        let name = format!("outbound|9080|{subset}|{REVIEWS}");
        assert_eq!(panic_threshold(cluster(&cfg, &name)), Some(0.0), "{name}");
    }
    assert_eq!(
        endpoints(&cfg, &format!("outbound|9080||{REVIEWS}")),
        [
            ("10.0.0.1".to_string(), HealthStatus::Healthy),
            ("10.0.0.2".to_string(), HealthStatus::Healthy),
            ("10.0.0.3".to_string(), HealthStatus::Unhealthy),
        ]
    );
    // The clusters whose load balancer the cluster provides keep Envoy's default.
    assert_eq!(panic_threshold(cluster(&cfg, "PassthroughCluster")), None);
}

#[test]
fn where_min_health_percent_turns_panic_on_the_not_ready_endpoints_stay_out() {
    let cfg = config(PANIC_AT_40);
    let v2 = format!("outbound|9080|v2|{REVIEWS}");
    assert_eq!(panic_threshold(cluster(&cfg, &v2)), Some(40.0));
    assert_eq!(
        endpoints(&cfg, &v2),
        [("10.0.0.2".to_string(), HealthStatus::Healthy)],
        "in panic mode Envoy would send requests to 10.0.0.3"
    );
    // The rest of the rule sets no threshold: panic off, the not-ready endpoint sent.
    let all = format!("outbound|9080||{REVIEWS}");
    assert_eq!(panic_threshold(cluster(&cfg, &all)), Some(0.0));
    assert_eq!(endpoints(&cfg, &all).len(), 3);
}

#[test]
fn a_service_with_a_traffic_distribution_keeps_its_not_ready_endpoints_for_spill_over() {
    // The same Service, with a trafficDistribution (the later definition replaces it).
    let distributed = format!(
        "{PANIC_AT_40}---\napiVersion: v1\nkind: Service\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  clusterIP: 10.96.1.2\n  trafficDistribution: PreferClose\n  ports: [{{name: http, port: 9080}}]\n"
    );
    let cfg = config(&distributed);
    let v2 = endpoints(&cfg, &format!("outbound|9080|v2|{REVIEWS}"));
    assert_eq!(
        v2,
        [
            ("10.0.0.2".to_string(), HealthStatus::Healthy),
            ("10.0.0.3".to_string(), HealthStatus::Unhealthy),
        ]
    );
}
