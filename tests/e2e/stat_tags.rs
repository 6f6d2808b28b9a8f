//! Envoy's statistics as Istio's dashboards read them: every cluster's and connection
//! manager's stats name ends in Istio's `;` delimiter, and `meshd agent`'s bootstrap
//! carries Istio's tag rules, so Prometheus sees `cluster_name` and
//! `http_conn_manager_prefix` as labels rather than as part of the metric's name.

use crate::mtls::mesh;

/// The lines of `prometheus` whose metric is `metric` and that carry `label`.
fn samples<'a>(prometheus: &'a str, metric: &str, label: &str) -> Vec<&'a str> {
    (prometheus.lines())
        .filter(|l| l.starts_with(&format!("{metric}{{")) && l.contains(label))
        .collect()
}

#[test]
fn prometheus_reads_the_cluster_and_connection_manager_as_istios_labels() {
    let m = mesh("stat-tags");
    let _reviews = m.reviews(&[]);
    let client = m.client_reaching_reviews("productpage", "pp-token", &[]);
    let prometheus = client.envoy.admin("/stats/prometheus").unwrap().body;
    let cluster = r#"cluster_name="outbound|9080||reviews.shop.svc.cluster.local""#;
    let requests = samples(&prometheus, "envoy_cluster_upstream_rq", cluster);
    assert!(
        requests
            .iter()
            .any(|l| l.contains(r#"response_code="200""#)),
        "{requests:?}"
    );
    let hcm = samples(
        &prometheus,
        "envoy_http_downstream_rq_total",
        "http_conn_manager_prefix=\"outbound_",
    );
    assert!(!hcm.is_empty(), "no connection manager label");
    // Nothing is left with a service's name inside the metric's own name.
    let mangled: Vec<&str> = (prometheus.lines())
        .filter(|l| !l.starts_with('#') && l.split('{').next().unwrap_or("").contains("reviews"))
        .take(3)
        .collect();
    assert!(mangled.is_empty(), "{mangled:?}");
}
