//! A DestinationRule's connection pool and outlier detection, as Envoy applies them.

use std::time::Duration;

use crate::harness::*;

/// reviews has two endpoints, one answering 503 to everything. With consecutive-5xx
/// outlier detection Envoy ejects it after its first failure and every later request
/// reaches the healthy one (were the rule ignored, about half would fail); the connection
/// pool's limits and the maximum for the rest are what Envoy's cluster reports.
#[test]
fn outlier_detection_ejects_a_failing_endpoint_and_the_pool_sets_envoys_circuit_breakers() {
    let ok = Upstream::start("reviews-ok");
    let bad = Upstream::answering("reviews-bad", "503 Service Unavailable");
    let (dir, port) = reviews_config(
        "tp-outlier",
        &[(&ok, &[("version", "v1")]), (&bad, &[("version", "v1")])],
        "  trafficPolicy:\n    connectionPool:\n      tcp: {maxConnections: 7}\n      http: {http1MaxPendingRequests: 3, idleTimeout: 30s}\n    outlierDetection: {consecutive5xxErrors: 1, interval: 1s, baseEjectionTime: 10m, maxEjectionPercent: 100}\n",
    );
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let get = || http_get(&format!("{}:{port}", envoy.ip), "reviews", "/", &[]);
    wait_until("the sidecar to route", Duration::from_secs(10), || {
        get().is_ok_and(|r| r.status == 200)
    });
    // Until the failing endpoint has been picked once it may answer; after that, never.
    let mut failures = 0;
    for _ in 0..10 {
        let r = get().unwrap();
        match (r.status, r.body.as_str()) {
            (200, "reviews-ok") => {}
            (503, "reviews-bad") => failures += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert!(failures <= 1, "{failures} failures before the ejection");
    for i in 0..30 {
        let r = get().unwrap();
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, "reviews-ok"),
            "request {i} after the ejection"
        );
    }
    let cluster = format!("outbound|{port}||reviews.shop.svc.cluster.local");
    let clusters = envoy.admin("/clusters").unwrap().body;
    let bad_host = format!(
        "{cluster}::127.0.0.1:{}::health_flags::/failed_outlier_check",
        bad.port
    );
    assert!(
        clusters.contains(&bad_host),
        "no {bad_host} in:\n{clusters}"
    );
    for (threshold, value) in [
        ("max_connections", "7"),
        ("max_pending_requests", "3"),
        ("max_requests", "4294967295"),
        ("max_retries", "4294967295"),
    ] {
        let line = format!("{cluster}::default_priority::{threshold}::{value}");
        assert!(clusters.contains(&line), "no {line} in:\n{clusters}");
    }
    // A cluster no DestinationRule touches: every limit at the maximum, not Envoy's 1,024.
    let blackhole_free = clusters
        .lines()
        .filter(|l| l.contains("::default_priority::max_connections::"))
        .filter(|l| !l.starts_with(&cluster))
        .filter(|l| l.starts_with("outbound|"))
        .collect::<Vec<_>>();
    assert!(
        blackhole_free.iter().all(|l| l.ends_with("::4294967295")),
        "{blackhole_free:?}"
    );
}
