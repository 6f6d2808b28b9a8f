//! A DestinationRule's connection pool, outlier detection, port-level settings and
//! consistent hashing, as Envoy applies them.

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

/// reviews has three endpoints and a rule whose port-level entry for the service's port
/// hashes on the `x-user` header. Every user's requests stay on one endpoint (were the
/// hash ignored, least-request would spread each user's eight requests over all three),
/// and the entry's pool and keepalive replace the rule's on that port.
#[test]
fn a_port_level_consistent_hash_keeps_each_user_on_one_endpoint() {
    let ups = ["reviews-a", "reviews-b", "reviews-c"].map(Upstream::start);
    let v1: &[(&str, &str)] = &[("version", "v1")];
    let upstreams: Vec<_> = ups.iter().map(|u| (u, v1)).collect();
    let (dir, port) = reviews_config("tp-hash", &upstreams, "");
    // The port is known only now: the rule is written again with its port-level entry.
    let rule = format!(
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  host: reviews\n  trafficPolicy:\n    connectionPool: {{tcp: {{maxConnections: 5}}}}\n    portLevelSettings:\n    - port: {{number: {port}}}\n      connectionPool: {{tcp: {{maxConnections: 11, tcpKeepalive: {{time: 300s}}}}}}\n      loadBalancer: {{consistentHash: {{httpHeaderName: x-user}}}}\n"
    );
    std::fs::write(dir.join("dr.yaml"), rule).unwrap();
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let get = |user: &str| {
        http_get(
            &format!("{}:{port}", envoy.ip),
            "reviews",
            "/",
            &[("x-user", user)],
        )
    };
    wait_until("the sidecar to route", Duration::from_secs(10), || {
        get("nobody").is_ok_and(|r| r.status == 200)
    });
    let mut reached = std::collections::BTreeSet::new();
    for n in 0..10 {
        let user = format!("user-{n}");
        let answers: std::collections::BTreeSet<String> = (0..8)
            .map(|_| {
                let r = get(&user).unwrap();
                assert_eq!(r.status, 200, "{user}: {}", r.body);
                r.body
            })
            .collect();
        assert_eq!(answers.len(), 1, "{user} reached {answers:?}");
        reached.extend(answers);
    }
    // Users spread over the ring (all ten on one of three endpoints: p ≈ 5e-5).
    assert!(reached.len() > 1, "every user reached {reached:?}");
    let cluster = format!("outbound|{port}||reviews.shop.svc.cluster.local");
    let clusters = envoy.admin("/clusters").unwrap().body;
    let line = format!("{cluster}::default_priority::max_connections::11");
    assert!(clusters.contains(&line), "no {line} in:\n{clusters}");
    // Envoy holds the ring and the keepalive it was sent.
    let dumped = envoy_dump(&envoy, "dynamic_active_clusters", &["cluster"], "name");
    let ours = &dumped[&cluster];
    assert_eq!(ours["lb_policy"], "RING_HASH", "{ours}");
    let keepalive = &ours["upstream_connection_options"]["tcp_keepalive"];
    assert_eq!(keepalive["keepalive_time"], 300, "{ours}");
}
