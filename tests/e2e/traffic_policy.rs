//! A DestinationRule's connection pool, outlier detection, port-level settings,
//! consistent hashing and TLS origination, as Envoy applies them.

use std::time::Duration;

use meshd::ca::material::{Material, key_to_pem};
use meshd::ca::{CertTtl, CertificateAuthority, Identity, csr};

use crate::harness::*;

/// The endpoints of `cluster` that `envoy`'s outlier detection has ejected so far.
fn ejections(envoy: &Envoy, cluster: &str) -> u64 {
    envoy.stat(&format!(
        "cluster.{cluster};.outlier_detection.ejections_enforced_total"
    ))
}

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
    // Until Envoy has ejected the failing endpoint (on its first 503; Envoy's main thread
    // tells the workers a moment later) it may answer; after that, never.
    let cluster = format!("outbound|{port}||reviews.shop.svc.cluster.local");
    let ejected = || ejections(&envoy, &cluster) >= 1;
    wait_until(
        "Envoy to eject the failing endpoint",
        Duration::from_secs(10),
        || {
            let r = get().unwrap();
            match (r.status, r.body.as_str()) {
                (200, "reviews-ok") | (503, "reviews-bad") => {}
                other => panic!("unexpected answer {other:?}"),
            }
            ejected()
        },
    );
    for i in 0..30 {
        let r = get().unwrap();
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, "reviews-ok"),
            "request {i} after the ejection"
        );
    }
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

/// A mesh-wide rule for `*.local` in istio-system, the pattern Istio's docs use, applies
/// to reviews, which has no rule of its own: its failing endpoint is ejected and its
/// cluster carries the rule's pool limit. A rule for reviews' own host then wins.
#[test]
fn a_mesh_wide_wildcard_destination_rule_applies_to_services_without_their_own() {
    let ok = Upstream::start("reviews-ok");
    let bad = Upstream::answering("reviews-bad", "503 Service Unavailable");
    let (dir, port) = reviews_config("tp-wildcard-dr", &[(&ok, &[]), (&bad, &[])], "");
    std::fs::remove_file(dir.join("dr.yaml")).unwrap();
    std::fs::write(
        dir.join("mesh-dr.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: default, namespace: istio-system}\nspec:\n  host: '*.local'\n  trafficPolicy:\n    connectionPool: {tcp: {maxConnections: 7}}\n    outlierDetection: {consecutive5xxErrors: 1, interval: 1s, baseEjectionTime: 10m, maxEjectionPercent: 100}\n",
    )
    .unwrap();
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let get = || http_get(&format!("{}:{port}", envoy.ip), "reviews", "/", &[]);
    wait_until("the sidecar to route", Duration::from_secs(10), || {
        get().is_ok_and(|r| r.status == 200)
    });
    let cluster = format!("outbound|{port}||reviews.shop.svc.cluster.local");
    // The ejection is what Envoy counts, and what its /clusters shows of the endpoint;
    // after it, no request reaches the failing endpoint.
    wait_until(
        "Envoy to eject the failing endpoint",
        Duration::from_secs(10),
        || get().is_ok() && ejections(&envoy, &cluster) >= 1,
    );
    let failures = (0..20).filter(|_| get().unwrap().status == 503).count();
    assert_eq!(failures, 0, "the failing endpoint was not ejected");
    let bad_host = format!(
        "{cluster}::127.0.0.1:{}::health_flags::/failed_outlier_check",
        bad.port
    );
    let clusters = envoy.admin("/clusters").unwrap().body;
    assert!(clusters.contains(&bad_host), "{bad_host} not in {clusters}");
    let limit = |value: &str| format!("{cluster}::default_priority::max_connections::{value}");
    let clusters = envoy.admin("/clusters").unwrap().body;
    assert!(clusters.contains(&limit("7")), "{clusters}");
    std::fs::write(
        dir.join("dr.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews, namespace: shop}\nspec:\n  host: reviews\n  trafficPolicy: {connectionPool: {tcp: {maxConnections: 11}}}\n",
    )
    .unwrap();
    wait_until("reviews' own rule to win", Duration::from_secs(10), || {
        envoy
            .admin("/clusters")
            .unwrap()
            .body
            .contains(&limit("11"))
    });
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

/// reviews has an endpoint in each of four localities: zone-a and zone-b of us-east, zone-w
/// of us-west, and zone-f of us-east, whose one endpoint answers 503. Its rule sets only
/// outlier detection, which with Istio's default `localityLbSetting` makes each sidecar
/// prefer its own zone, then its region:
/// - a sidecar in zone-a (its node's locality) reaches only zone-a, and one in zone-w (its
///   `istio-locality` label) only zone-w; Envoy holds zone-a's priorities as sent;
/// - a sidecar in zone-f fails until it ejects zone-f's endpoint, then fails over to its
///   region (zone-a or zone-b), never to us-west;
/// - a `distribute` rule sends zone-a's traffic to us-west;
/// - MeshConfig's `localityLbSetting: {enabled: false}` (the rule no longer has one)
///   spreads zone-a's traffic again, as without locality balancing.
#[test]
fn outlier_detection_keeps_traffic_in_the_proxys_zone_and_fails_over_within_its_region() {
    let ups = [
        Upstream::start("reviews-a"),
        Upstream::start("reviews-b"),
        Upstream::start("reviews-w"),
        Upstream::answering("reviews-f", "503 Service Unavailable"),
    ];
    let zones: [&[(&str, &str)]; 4] = [
        &[("topology.istio.io/locality", "us-east.zone-a")],
        &[("topology.istio.io/locality", "us-east.zone-b")],
        &[("topology.istio.io/locality", "us-west.zone-w")],
        &[("topology.istio.io/locality", "us-east.zone-f")],
    ];
    let upstreams: Vec<_> = ups.iter().zip(zones).collect();
    let outlier = "  trafficPolicy:\n    outlierDetection: {consecutive5xxErrors: 1, interval: 1s, baseEjectionTime: 10m, maxEjectionPercent: 100}\n";
    let (dir, port) = reviews_config("tp-locality", &upstreams, outlier);
    let meshd = Meshd::start(&dir);
    let in_a = Envoy::sidecar_in(&meshd, Ads::Delta, "shop", "client-a", "us-east/zone-a", "");
    let in_w = Envoy::sidecar_in(
        &meshd,
        Ads::Delta,
        "shop",
        "client-w",
        "",
        "istio-locality: us-west.zone-w",
    );
    let in_f = Envoy::sidecar_in(&meshd, Ads::Sotw, "shop", "client-f", "us-east/zone-f", "");
    let get = |envoy: &Envoy| {
        let r = http_get(&format!("{}:{port}", envoy.ip), "reviews", "/", &[]).unwrap();
        (r.status, r.body)
    };
    // What twenty requests reach.
    let reached = |envoy: &Envoy| {
        (0..20)
            .map(|_| get(envoy).1)
            .collect::<std::collections::BTreeSet<_>>()
    };
    let only = |name: &str| std::collections::BTreeSet::from([name.to_string()]);
    for (envoy, zone) in [(&in_a, "reviews-a"), (&in_w, "reviews-w")] {
        wait_until("the sidecar to route", Duration::from_secs(10), || {
            get(envoy).0 == 200
        });
        assert_eq!(reached(envoy), only(zone), "{}", envoy.id);
    }
    let cluster = format!("outbound|{port}||reviews.shop.svc.cluster.local");
    let hosts = in_a.admin("/clusters").unwrap().body;
    for (up, priority) in [(&ups[0], 0), (&ups[1], 1), (&ups[3], 1), (&ups[2], 2)] {
        let line = format!("{cluster}::127.0.0.1:{}::priority::{priority}", up.port);
        assert!(hosts.contains(&line), "no {line} in:\n{hosts}");
    }

    // zone-f's one endpoint fails: after it is ejected, its region takes over.
    wait_until(
        "the zone-f sidecar to route",
        Duration::from_secs(10),
        || http_get(&format!("{}:{port}", in_f.ip), "reviews", "/", &[]).is_ok(),
    );
    // Until Envoy has ejected it (on its first 503; the main thread tells the workers a
    // moment later) the endpoint may still answer; after that, only zone-a and zone-b do.
    let in_region = |body: &str| body == "reviews-a" || body == "reviews-b";
    let ejected = || ejections(&in_f, &cluster) >= 1;
    wait_until(
        "the zone-f sidecar to eject zone-f's endpoint",
        Duration::from_secs(10),
        || {
            match get(&in_f) {
                (503, body) if body == "reviews-f" => {}
                (200, body) if in_region(&body) => {}
                other => panic!("unexpected answer {other:?}"),
            }
            ejected()
        },
    );
    for i in 0..30 {
        match get(&in_f) {
            (200, body) if in_region(&body) => {}
            other => panic!("request {i} after the ejection: {other:?}"),
        }
    }

    // `distribute`: zone-a's traffic all to us-west.
    let rule = |rest: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  host: reviews\n{rest}"
        )
    };
    let distribute = "  trafficPolicy:\n    loadBalancer:\n      localityLbSetting:\n        distribute: [{from: us-east/zone-a/*, to: {us-west/*: 100}}]\n";
    std::fs::write(dir.join("dr.yaml"), rule(distribute)).unwrap();
    wait_until(
        "zone-a's traffic to reach us-west",
        Duration::from_secs(10),
        || get(&in_a).1 == "reviews-w",
    );
    assert_eq!(reached(&in_a), only("reviews-w"));

    // Locality balancing off mesh-wide: zone-a's traffic spreads over every endpoint.
    std::fs::write(
        dir.join("mesh.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |\n    localityLbSetting: {enabled: false}\n",
    )
    .unwrap();
    std::fs::write(dir.join("dr.yaml"), rule(outlier)).unwrap();
    wait_until(
        "zone-a's traffic to spread",
        Duration::from_secs(10),
        || reached(&in_a).len() > 1,
    );
}

/// A Service with `trafficDistribution: PreferClose` and no DestinationRule: as with
/// istiod, each sidecar's traffic stays in its own zone, moves to another zone of its
/// region when its zone has no ready endpoint (never to another region while one is
/// left), and spreads again once the Service no longer prefers close endpoints, until its
/// namespace's annotation prefers them for it.
#[test]
fn a_service_preferring_close_endpoints_keeps_traffic_in_the_zone_without_a_rule() {
    let ups = [
        Upstream::start("reviews-a"),
        Upstream::start("reviews-b"),
        Upstream::start("reviews-w"),
    ];
    let zones: [&[(&str, &str)]; 3] = [
        &[("topology.istio.io/locality", "us-east.zone-a")],
        &[("topology.istio.io/locality", "us-east.zone-b")],
        &[("topology.istio.io/locality", "us-west.zone-w")],
    ];
    let upstreams: Vec<_> = ups.iter().zip(zones).collect();
    let (dir, port) = reviews_config("tp-traffic-distribution", &upstreams, "");
    std::fs::remove_file(dir.join("dr.yaml")).unwrap();
    let plain = std::fs::read_to_string(dir.join("reviews.yaml")).unwrap();
    let selector = "  selector: {app: reviews}\n";
    let close = plain.replacen(
        selector,
        &format!("{selector}  trafficDistribution: PreferClose\n"),
        1,
    );
    std::fs::write(dir.join("reviews.yaml"), &close).unwrap();
    let meshd = Meshd::start(&dir);
    let in_a = Envoy::sidecar_in(&meshd, Ads::Delta, "shop", "client-a", "us-east/zone-a", "");
    let in_w = Envoy::sidecar_in(&meshd, Ads::Delta, "shop", "client-w", "us-west/zone-w", "");
    let reached = |envoy: &Envoy| reached(envoy, port);
    let only = |names: &[&str]| -> std::collections::BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    };
    for (envoy, zone) in [(&in_a, "reviews-a"), (&in_w, "reviews-w")] {
        wait_until(
            "the sidecar to keep to its zone",
            Duration::from_secs(10),
            || reached(envoy) == only(&[zone]),
        );
    }
    // zone-a's endpoint is no longer ready: zone-b, in the same region, takes over.
    let not_ready = edit_slice(&close, "reviews-a", "ready: true", "ready: false");
    std::fs::write(dir.join("reviews.yaml"), &not_ready).unwrap();
    wait_until(
        "zone-a's traffic to fail over within its region",
        Duration::from_secs(10),
        || reached(&in_a) == only(&["reviews-b"]),
    );
    // Without the preference, zone-a's traffic spreads over the ready endpoints.
    std::fs::write(
        dir.join("reviews.yaml"),
        not_ready.replacen("  trafficDistribution: PreferClose\n", "", 1),
    )
    .unwrap();
    wait_until(
        "zone-a's traffic to spread",
        Duration::from_secs(10),
        || reached(&in_a) == only(&["reviews-b", "reviews-w"]),
    );
    // The namespace's annotation gives its Services the preference they do not set.
    meshd.write(
        "namespace.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, annotations: {networking.istio.io/traffic-distribution: PreferClose}}\n",
    );
    wait_until(
        "the namespace's preference to keep zone-a's traffic in its region",
        Duration::from_secs(10),
        || reached(&in_a) == only(&["reviews-b"]),
    );
}

/// api.example.com is a ServiceEntry whose one endpoint speaks only TLS, with a certificate
/// from a CA of its own. The rule originates TLS on its first port (`SIMPLE`, the CA from a
/// file) and, through a port-level entry, mutual TLS on its second (the client certificate
/// and key from files). A sidecar bootstrapped by `meshd agent` gets the files over SDS; a
/// bare Envoy reads them itself. Both reach the server, which sees the request's host as
/// SNI (no `sni` set: Envoy's auto SNI) and a client certificate on the second port only.
/// Without origination every request would be plaintext to a TLS port: no answer.
#[test]
fn simple_and_mutual_tls_are_originated_with_the_rules_files() {
    let hour = Duration::from_secs(3600);
    let material = Material::self_signed("example-ca", hour).unwrap();
    let ca = CertificateAuthority::new("example-ca", CertTtl::default(), material);
    let (chain, key) = ca
        .issue_server_certificate(&["api.example.com".to_string()], hour)
        .unwrap();
    let client_key = {
        use p256::elliptic_curve::Generate;
        p256::ecdsa::SigningKey::generate()
    };
    let client = Identity::new("example-ca", "shop", "productpage");
    let csr = csr::build(&client_key, &client.to_string()).unwrap();
    let client_chain = ca.sign_workload(&csr, &client, 3600).unwrap().concat();
    let api = Upstream::tls("api", &chain, &key, &ca.roots_pem());

    let dir = temp_dir("tls-origination");
    let config = dir.join("config");
    std::fs::create_dir_all(&config).unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let ca_file = file("ca.pem", &ca.roots_pem());
    let cert_file = file("client.pem", &client_chain);
    let key_file = file("client-key.pem", &key_to_pem(&client_key).unwrap());
    let tokens = file("tokens", "pp-token shop productpage\n");
    let (simple, mutual) = (free_port(), free_port());
    let yaml = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: shop}}\n---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: api, namespace: shop}}\nspec:\n  hosts: [api.example.com]\n  location: MESH_EXTERNAL\n  resolution: STATIC\n  ports: [{{number: {simple}, name: http-simple, protocol: HTTP}}, {{number: {mutual}, name: http-mutual, protocol: HTTP}}]\n  endpoints: [{{address: 127.0.0.1, ports: {{http-simple: {tls}, http-mutual: {tls}}}}}]\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: api, namespace: shop}}\nspec:\n  host: api.example.com\n  trafficPolicy:\n    tls: {{mode: SIMPLE, caCertificates: {ca_file}}}\n    portLevelSettings:\n    - port: {{number: {mutual}}}\n      tls: {{mode: MUTUAL, caCertificates: {ca_file}, clientCertificate: {cert_file}, privateKey: {key_file}}}\n",
        tls = api.port
    );
    std::fs::write(config.join("api.yaml"), yaml).unwrap();
    let meshd = Meshd::start_with(&config, &["--ca-token-file", &tokens]);
    let with_agent = Workload::start(
        &meshd,
        "shop",
        "productpage",
        "productpage",
        "pp-token",
        &loopback_ip(),
        &[],
    );
    let bare = Envoy::sidecar(&meshd, Ads::Delta, "shop", "bare");
    for envoy in [&with_agent.envoy, &bare] {
        let get =
            |port: u16| http_get(&format!("{}:{port}", envoy.ip), "api.example.com", "/", &[]);
        wait_until("TLS to api.example.com", Duration::from_secs(10), || {
            get(simple).is_ok_and(|r| r.status == 200)
        });
        let r = get(simple).unwrap();
        assert_eq!(r.body, "api");
        assert_eq!(r.headers["x-tls-sni"], "api.example.com");
        assert_eq!(r.headers["x-tls-client-cert"], "absent");
        wait_until(
            "mutual TLS to api.example.com",
            Duration::from_secs(10),
            || get(mutual).is_ok_and(|r| r.status == 200),
        );
        let r = get(mutual).unwrap();
        assert_eq!(r.headers["x-tls-client-cert"], "present", "{}", envoy.id);
    }
    // The agent's Envoy holds the files as the secrets istiod names them.
    let secrets = with_agent.envoy.config_dump("dynamic_active_secrets");
    for name in [
        format!("file-root:{ca_file}"),
        format!("file-cert:{cert_file}~{key_file}"),
    ] {
        assert!(secrets.contains(&name), "no secret {name} in:\n{secrets}");
    }

    // A rotated client certificate on disk reaches the agent's Envoy without a restart,
    // and mutual TLS goes on with it.
    let rotated_key = {
        use p256::elliptic_curve::Generate;
        p256::ecdsa::SigningKey::generate()
    };
    let csr = csr::build(&rotated_key, &client.to_string()).unwrap();
    let rotated = ca.sign_workload(&csr, &client, 3600).unwrap().concat();
    std::fs::write(&key_file, key_to_pem(&rotated_key).unwrap()).unwrap();
    std::fs::write(&cert_file, &rotated).unwrap();
    let encoded = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(&rotated)
    };
    wait_until(
        "the rotated certificate in the agent's Envoy",
        Duration::from_secs(10),
        || {
            (with_agent.envoy)
                .config_dump("dynamic_active_secrets")
                .contains(&encoded)
        },
    );
    let get = |port: u16| {
        http_get(
            &format!("{}:{port}", with_agent.envoy.ip),
            "api.example.com",
            "/",
            &[],
        )
    };
    assert_eq!(get(mutual).unwrap().headers["x-tls-client-cert"], "present");
}

/// Two DestinationRules for reviews, one subset each (two teams' rules, as Istio's docs
/// allow): istiod merges them, so a route to the second rule's subset reaches its
/// endpoint. Were only one rule kept, v2's cluster would not exist and every request
/// would get 503.
#[test]
fn two_destination_rules_for_one_host_merge_their_subsets() {
    let v1 = Upstream::start("reviews-v1");
    let v2 = Upstream::start("reviews-v2");
    let (dir, port) = reviews_config(
        "tp-dr-merge",
        &[(&v1, &[("version", "v1")]), (&v2, &[("version", "v2")])],
        "  subsets: [{name: v1, labels: {version: v1}}]\n",
    );
    std::fs::write(
        dir.join("dr-v2.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews-v2, namespace: shop}\nspec:\n  host: reviews\n  subsets: [{name: v2, labels: {version: v2}}]\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("vs.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: shop}\nspec:\n  hosts: [reviews]\n  http: [{route: [{destination: {host: reviews, subset: v2}}]}]\n",
    )
    .unwrap();
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let get = || http_get(&format!("{}:{port}", envoy.ip), "reviews", "/", &[]);
    wait_until("the route to v2", Duration::from_secs(10), || {
        get().is_ok_and(|r| r.status == 200)
    });
    for i in 0..10 {
        let r = get().unwrap();
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, "reviews-v2"),
            "request {i}"
        );
    }
    let clusters = envoy.admin("/clusters").unwrap().body;
    for subset in ["v1", "v2"] {
        let name = format!("outbound|{port}|{subset}|reviews.shop.svc.cluster.local::");
        assert!(clusters.contains(&name), "no {name} in:\n{clusters}");
    }
}

/// Which DestinationRule a proxy gets depends on where it runs, as istiod decides it:
/// frontend's own rule for reviews (`exportTo: ["."]`) wins for frontend's proxies and
/// no one else's; in shop a rule with a `workloadSelector` wins for the proxies it
/// selects; everyone else gets reviews' rule in its own namespace. Each proxy's cluster
/// carries its rule's connection limit.
#[test]
fn each_proxy_gets_the_destination_rule_of_its_namespace_and_workload() {
    let up = Upstream::start("reviews");
    let (dir, port) = reviews_config(
        "tp-dr-precedence",
        &[(&up, &[])],
        "  trafficPolicy: {connectionPool: {tcp: {maxConnections: 7}}}\n",
    );
    std::fs::write(
        dir.join("frontend-dr.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews, namespace: frontend}\nspec:\n  host: reviews.shop.svc.cluster.local\n  exportTo: ['.']\n  trafficPolicy: {connectionPool: {tcp: {maxConnections: 11}}}\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews-for-ratings, namespace: shop}\nspec:\n  host: reviews\n  workloadSelector: {matchLabels: {app: ratings}}\n  trafficPolicy: {connectionPool: {tcp: {maxConnections: 13}}}\n",
    )
    .unwrap();
    let meshd = Meshd::start(&dir);
    let cluster = format!("outbound|{port}||reviews.shop.svc.cluster.local");
    for (namespace, app, limit) in [
        ("frontend", "web", 11),
        ("shop", "ratings", 13),
        ("shop", "productpage", 7),
        ("billing", "web", 7),
    ] {
        let envoy = Envoy::sidecar(&meshd, Ads::Delta, namespace, app);
        let line = format!("{cluster}::default_priority::max_connections::{limit}");
        // The rule is the proxy's, and its requests reach reviews.
        let host = "reviews.shop.svc.cluster.local";
        let get = || http_get(&format!("{}:{port}", envoy.ip), host, "/", &[]);
        wait_until(
            &format!("{app} in {namespace} to route"),
            Duration::from_secs(10),
            || get().is_ok_and(|r| r.status == 200),
        );
        let clusters = envoy.admin("/clusters").unwrap().body;
        assert!(
            clusters.contains(&line),
            "{app} in {namespace}: no {line} in:\n{clusters}"
        );
    }
}

/// A rule's `loadBalancer.warmup` becomes Envoy's slow start on the round-robin cluster
/// (window, minimum weight, aggression), which the real Envoy accepts and holds; the
/// deprecated `warmupDurationSecs` gives the window alone on a least-request cluster.
#[test]
fn a_warmup_becomes_envoys_slow_start() {
    let up = Upstream::start("reviews");
    let (dir, port) = reviews_config(
        "tp-warmup",
        &[(&up, &[])],
        "  trafficPolicy:\n    loadBalancer: {simple: ROUND_ROBIN, warmup: {duration: 30s, minimumPercent: 20, aggression: 2}}\n",
    );
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let get = || http_get(&format!("{}:{port}", envoy.ip), "reviews", "/", &[]);
    wait_until("the sidecar to route", Duration::from_secs(10), || {
        get().is_ok_and(|r| r.status == 200)
    });
    let cluster = format!("outbound|{port}||reviews.shop.svc.cluster.local");
    let dumped = || {
        let dump = envoy_dump(&envoy, "dynamic_active_clusters", &["cluster"], "name");
        dump[&cluster].clone()
    };
    let c = dumped();
    // ROUND_ROBIN is Envoy's default policy, so the dump leaves `lb_policy` out.
    assert_eq!(c["lb_policy"], serde_json::Value::Null, "{c}");
    let slow = &c["round_robin_lb_config"]["slow_start_config"];
    assert_eq!(slow["slow_start_window"], "30s", "{c}");
    assert_eq!(slow["min_weight_percent"]["value"], 20.0, "{c}");
    assert_eq!(slow["aggression"]["default_value"], 2.0, "{c}");
    std::fs::write(
        dir.join("dr.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews, namespace: shop}\nspec:\n  host: reviews\n  trafficPolicy:\n    loadBalancer: {warmupDurationSecs: 15s}\n",
    )
    .unwrap();
    wait_until("the deprecated window", Duration::from_secs(10), || {
        dumped()["least_request_lb_config"]["slow_start_config"]["slow_start_window"] == "15s"
    });
    assert_eq!(get().unwrap().status, 200);
}

/// A TCP server that answers each connection's HTTP request with the PROXY protocol line
/// the connection began with (`none` without one), then closes.
fn proxy_protocol_echo() -> u16 {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut first = String::new();
                if reader.read_line(&mut first).is_err() {
                    return;
                }
                let proxy_line = first
                    .starts_with("PROXY ")
                    .then(|| first.trim_end().to_string());
                // The request's head (after the PROXY line, if there was one).
                let mut line = if proxy_line.is_some() {
                    String::new()
                } else {
                    first
                };
                loop {
                    if line == "\r\n" {
                        break;
                    }
                    line.clear();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                }
                let body = proxy_line.unwrap_or_else(|| "none".into());
                let mut conn = conn;
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}

/// A rule's `proxyProtocol` makes the sidecar open each upstream connection with a PROXY
/// protocol header (istiod's upstream_proxy_protocol transport around the plaintext one):
/// the upstream reads a `PROXY TCP4` line before the request, and none without the rule.
#[test]
fn a_proxy_protocol_rule_sends_a_proxy_header_to_the_upstream() {
    let echo = proxy_protocol_echo();
    let dir = temp_dir("tp-proxy-protocol").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    std::fs::write(
        dir.join("legacy.yaml"),
        format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: legacy, namespace: shop}}\nspec:\n  hosts: [legacy.example.com]\n  location: MESH_EXTERNAL\n  resolution: STATIC\n  ports: [{{number: {port}, name: http, protocol: HTTP}}]\n  endpoints: [{{address: 127.0.0.1, ports: {{http: {echo}}}}}]\n"
        ),
    )
    .unwrap();
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let get = || {
        http_get(
            &format!("{}:{port}", envoy.ip),
            "legacy.example.com",
            "/",
            &[],
        )
    };
    wait_until("the sidecar to route", Duration::from_secs(10), || {
        get().is_ok_and(|r| r.status == 200)
    });
    assert_eq!(get().unwrap().body, "none");
    std::fs::write(
        dir.join("dr.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: legacy, namespace: shop}\nspec:\n  host: legacy.example.com\n  trafficPolicy: {proxyProtocol: {version: V1}}\n",
    )
    .unwrap();
    wait_until("a PROXY header upstream", Duration::from_secs(10), || {
        get().is_ok_and(|r| r.body.starts_with("PROXY TCP4 "))
    });
}

/// A Service with `trafficDistribution: PreferSameNode`: each sidecar's traffic stays on
/// the endpoint of its own node (the EndpointSlice's `nodeName`, the proxy's `NODE_NAME`),
/// as istiod compares `kubernetes.io/hostname`; with its node's endpoint not ready it
/// goes to the other node.
#[test]
fn a_service_preferring_the_same_node_keeps_traffic_on_the_node() {
    let ups = [Upstream::start("reviews-n1"), Upstream::start("reviews-n2")];
    // Neither the endpoints nor the sidecars have a locality: only the node tells them
    // apart.
    let upstreams: Vec<_> = ups.iter().map(|u| (u, &[][..])).collect();
    let (dir, port) = reviews_config("tp-same-node", &upstreams, "");
    std::fs::remove_file(dir.join("dr.yaml")).unwrap();
    let mut yaml = std::fs::read_to_string(dir.join("reviews.yaml"))
        .unwrap()
        .replacen(
            "  selector: {app: reviews}\n",
            "  selector: {app: reviews}\n  trafficDistribution: PreferSameNode\n",
            1,
        );
    for (up, node) in ups.iter().zip(["n1", "n2"]) {
        let with_node = format!("  nodeName: {node}\n  conditions:");
        yaml = edit_slice(&yaml, &up.name, "  conditions:", &with_node);
    }
    std::fs::write(dir.join("reviews.yaml"), &yaml).unwrap();
    let meshd = Meshd::start(&dir);
    let on = |app: &str, node: &str| {
        Envoy::sidecar_with(
            &meshd,
            Ads::Delta,
            "shop",
            app,
            &format!("NODE_NAME: {node}"),
        )
    };
    let (c1, c2) = (on("client-1", "n1"), on("client-2", "n2"));
    let reached = |envoy: &Envoy| reached(envoy, port);
    let only = |name: &str| std::collections::BTreeSet::from([name.to_string()]);
    for (envoy, up) in [(&c1, "reviews-n1"), (&c2, "reviews-n2")] {
        wait_until(
            "the sidecar to keep to its node",
            Duration::from_secs(10),
            || reached(envoy) == only(up),
        );
    }
    // n1's endpoint is no longer ready: n2's, in the same zone, takes over.
    let not_ready = edit_slice(&yaml, "reviews-n1", "ready: true", "ready: false");
    std::fs::write(dir.join("reviews.yaml"), &not_ready).unwrap();
    wait_until("n1's traffic to fail over", Duration::from_secs(10), || {
        reached(&c1) == only("reviews-n2")
    });
}

/// The bodies twenty requests to reviews through `envoy` come back with.
fn reached(envoy: &Envoy, port: u16) -> std::collections::BTreeSet<String> {
    (0..20)
        .map(|_| {
            http_get(&format!("{}:{port}", envoy.ip), "reviews", "/", &[])
                .map(|r| r.body)
                .unwrap_or_default()
        })
        .collect()
}

/// `service` (YAML from [`service_yaml`]) with the endpoint of `upstream`'s slice `edit`ed
/// (its first occurrence of `from` replaced by `to`).
fn edit_slice(service: &str, upstream: &str, from: &str, to: &str) -> String {
    let at = service
        .find(&format!(
            "{{name: {upstream}, namespace: shop, labels: {{kubernetes.io/service-name"
        ))
        .unwrap();
    let (head, tail) = service.split_at(at);
    format!("{head}{}", tail.replacen(from, to, 1))
}
