//! Envoy as a sidecar: outbound HTTP routes with subsets, weights and header matches.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use crate::harness::*;

pub struct ReviewsMesh {
    pub meshd: Meshd,
    pub envoy: Envoy,
    pub port: u16,
    pub _upstreams: Vec<Upstream>,
}

/// reviews v1 and v2 behind one Service, subsets from a DestinationRule, and `vs`.
pub fn reviews_mesh(name: &str, ads: Ads, vs: &str) -> ReviewsMesh {
    reviews_mesh_with_env(name, ads, vs, &[])
}

/// [`reviews_mesh`], meshd started with `env`.
pub fn reviews_mesh_with_env(name: &str, ads: Ads, vs: &str, env: &[(&str, &str)]) -> ReviewsMesh {
    let v1 = Upstream::start("reviews-v1");
    let v2 = Upstream::start("reviews-v2");
    let (dir, port) = reviews_config(
        name,
        &[(&v1, &[("version", "v1")]), (&v2, &[("version", "v2")])],
        "  subsets:\n  - {name: v1, labels: {version: v1}}\n  - {name: v2, labels: {version: v2}}\n",
    );
    std::fs::write(dir.join("vs.yaml"), vs).unwrap();
    let meshd = Meshd::start_with_env(&dir, &[], env);
    let envoy = Envoy::sidecar(&meshd, ads, "shop", "productpage");
    let m = ReviewsMesh {
        meshd,
        envoy,
        port,
        _upstreams: vec![v1, v2],
    };
    wait_until("the sidecar to route", Duration::from_secs(10), || {
        m.get(&[]).is_ok_and(|r| r.status == 200)
    });
    m
}

impl ReviewsMesh {
    pub fn get(&self, headers: &[(&str, &str)]) -> std::io::Result<HttpResponse> {
        http_get(
            &format!("{}:{}", self.envoy.ip, self.port),
            "reviews",
            "/reviews/0",
            headers,
        )
    }
}

#[test]
fn weighted_split_sends_about_a_fifth_to_v2() {
    let vs = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: shop}\nspec:\n  hosts: [reviews]\n  http:\n  - route:\n    - {destination: {host: reviews, subset: v1}, weight: 80}\n    - {destination: {host: reviews, subset: v2}, weight: 20}\n";
    let m = reviews_mesh("sc-weighted", Ads::Sotw, vs);
    let n = 400;
    let mut v2 = 0;
    for _ in 0..n {
        let r = m.get(&[]).unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        match r.body.as_str() {
            "reviews-v2" => v2 += 1,
            "reviews-v1" => {}
            other => panic!("unexpected upstream {other}"),
        }
    }
    // 80/20 over 400 requests: the standard deviation of the v2 share is 2 points; allow
    // 7 points (3.5 sigma) either side of 20%.
    let share = v2 as f64 / n as f64;
    assert!(
        (0.13..=0.27).contains(&share),
        "v2 got {:.1}% of {n} requests",
        share * 100.0
    );
    assert_eq!(m.meshd.syncz(&m.envoy.id)["delta"], false);
}

#[test]
fn a_header_match_sends_jason_to_v2_and_everyone_else_to_v1() {
    let vs = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: shop}\nspec:\n  hosts: [reviews]\n  http:\n  - match: [{headers: {end-user: {exact: jason}}}]\n    route: [{destination: {host: reviews, subset: v2}}]\n  - route: [{destination: {host: reviews, subset: v1}}]\n";
    let m = reviews_mesh("sc-header", Ads::Delta, vs);
    for _ in 0..20 {
        assert_eq!(m.get(&[("end-user", "jason")]).unwrap().body, "reviews-v2");
        assert_eq!(m.get(&[("end-user", "alice")]).unwrap().body, "reviews-v1");
        assert_eq!(m.get(&[]).unwrap().body, "reviews-v1");
    }
    // The route is reachable by every Kubernetes name of the service, and the ClusterIP.
    for host in [
        "reviews.shop",
        "reviews.shop.svc",
        "reviews.shop.svc.cluster.local",
    ] {
        let r = http_get(&format!("{}:{}", m.envoy.ip, m.port), host, "/", &[]).unwrap();
        assert_eq!(r.body, "reviews-v1", "Host: {host}");
    }
}

/// Istio's Bookinfo fault-injection task: requests from jason are delayed and then
/// aborted by the sidecar itself (Envoy's fault filter answers, reviews never sees them);
/// everyone else reaches reviews untouched, as do jason's once the fault is gone.
#[test]
fn a_fault_delays_and_aborts_jasons_requests_only() {
    let vs = |fault: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  hosts: [reviews]\n  http:\n  - match: [{{headers: {{end-user: {{exact: jason}}}}}}]\n{fault}    route: [{{destination: {{host: reviews, subset: v2}}}}]\n  - route: [{{destination: {{host: reviews, subset: v1}}}}]\n"
        )
    };
    let fault = "    fault:\n      delay: {fixedDelay: 1s, percentage: {value: 100}}\n      abort: {httpStatus: 418, percentage: {value: 100}}\n";
    let m = reviews_mesh("sc-fault", Ads::Delta, &vs(fault));
    let jason = [("end-user", "jason")];
    wait_until(
        "jason's requests to be aborted",
        Duration::from_secs(10),
        || m.get(&jason).is_ok_and(|r| r.status == 418),
    );
    let started = std::time::Instant::now();
    let r = m.get(&jason).unwrap();
    assert_eq!(r.status, 418);
    assert_ne!(r.body, "reviews-v2", "the sidecar answered, not reviews");
    // Envoy's timers run from its event loop's cached clock, so a 1 s delay may end a
    // little before 1 s by ours; without the delay the answer takes milliseconds.
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(800),
        "the abort came after the delay: {took:?}"
    );
    for _ in 0..5 {
        let r = m.get(&[]).unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "reviews-v1"));
    }
    // A fault for no share of the requests (no percentage) injects nothing.
    let none = "    fault: {abort: {httpStatus: 418}}\n";
    m.meshd.write("vs.yaml", &vs(none));
    wait_until("jason's requests to pass", Duration::from_secs(10), || {
        m.get(&jason)
            .is_ok_and(|r| r.status == 200 && r.body == "reviews-v2")
    });
}

/// Istio's mirroring task: every request is answered by v1 while a copy goes to v2,
/// whose answers Envoy drops. Envoy's own counters show v2 receiving the copies; with
/// `mirrorPercentage` 0 it receives none.
#[test]
fn a_mirror_copies_requests_to_v2_while_v1_answers() {
    let vs = |extra: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  hosts: [reviews]\n  http:\n  - route: [{{destination: {{host: reviews, subset: v1}}}}]\n    mirror: {{host: reviews, subset: v2}}\n{extra}"
        )
    };
    let m = reviews_mesh("sc-mirror", Ads::Delta, &vs(""));
    let v2 = format!(
        "cluster.outbound|{}|v2|reviews.shop.svc.cluster.local;.upstream_rq_completed",
        m.port
    );
    for _ in 0..10 {
        let r = m.get(&[]).unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "reviews-v1"));
    }
    wait_until("v2 to receive the copies", Duration::from_secs(10), || {
        m.envoy.stat(&v2) >= 10
    });
    // No share: no copies.
    m.meshd
        .write("vs.yaml", &vs("    mirrorPercentage: {value: 0}\n"));
    wait_until("the mirror to go", Duration::from_secs(10), || {
        !m.envoy
            .config_dump("dynamic_route_configs")
            .contains("request_mirror_policies")
    });
    let copied = m.envoy.stat(&v2);
    for _ in 0..10 {
        assert_eq!(m.get(&[]).unwrap().body, "reviews-v1");
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(m.envoy.stat(&v2), copied, "no copy without a share");
}

/// A route's `corsPolicy` reaches Envoy's CORS filter: a request from an allowed origin
/// is answered with that origin in `access-control-allow-origin` (and the exposed
/// headers), one from another origin without it.
#[test]
fn a_cors_policy_allows_only_its_origins() {
    let vs = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: shop}\nspec:\n  hosts: [reviews]\n  http:\n  - route: [{destination: {host: reviews, subset: v1}}]\n    corsPolicy: {allowOrigins: [{exact: 'https://shop.example.com'}], allowMethods: [GET], exposeHeaders: [x-trace]}\n";
    let m = reviews_mesh("sc-cors", Ads::Delta, vs);
    let allowed = [("origin", "https://shop.example.com")];
    wait_until(
        "the allowed origin to be echoed",
        Duration::from_secs(10),
        || {
            m.get(&allowed).is_ok_and(|r| {
                r.headers
                    .get("access-control-allow-origin")
                    .map(String::as_str)
                    == Some("https://shop.example.com")
            })
        },
    );
    let r = m.get(&allowed).unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "reviews-v1"));
    assert_eq!(r.headers["access-control-expose-headers"], "x-trace");
    let other = m.get(&[("origin", "https://evil.example.com")]).unwrap();
    assert_eq!(other.status, 200);
    assert!(
        !other.headers.contains_key("access-control-allow-origin"),
        "{:?}",
        other.headers
    );
}

/// `rewrite.uriRegexRewrite` rewrites the path with RE2 capture groups before the request
/// leaves the sidecar: reviews sees `/v2/reviews/7` for `/reviews/7`.
#[test]
fn a_regex_rewrite_changes_the_path_reviews_sees() {
    let vs = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: shop}\nspec:\n  hosts: [reviews]\n  http:\n  - match: [{uri: {prefix: /reviews/}}]\n    rewrite: {uriRegexRewrite: {match: '^/reviews/([0-9]+)$', rewrite: '/v2/reviews/\\1'}}\n    route: [{destination: {host: reviews, subset: v1}}]\n";
    let m = reviews_mesh("sc-regex-rewrite", Ads::Delta, vs);
    let get =
        |path: &str| http_get(&format!("{}:{}", m.envoy.ip, m.port), "reviews", path, &[]).unwrap();
    wait_until("the rewrite", Duration::from_secs(10), || {
        get("/reviews/7").headers.get("x-path").map(String::as_str) == Some("/v2/reviews/7")
    });
    // A path the pattern does not match passes unchanged.
    assert_eq!(get("/reviews/seven").headers["x-path"], "/reviews/seven");
}

#[test]
fn sidecars_sent_shared_runs_of_a_large_configuration_route_with_it() {
    let dir = temp_dir("sc-shared-runs").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let v1 = Upstream::start("reviews-v1");
    let port = free_port();
    let reviews = service_yaml("shop", "reviews", port, &[(&v1, &[("version", "v1")])]);
    std::fs::write(dir.join("reviews.yaml"), reviews).unwrap();
    // 300 more services: about 100 KB of clusters, far over a run's 16 KB threshold.
    many_services(&dir, 300);
    let meshd = Meshd::start(&dir);
    let envoys = [
        Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage"),
        Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage"),
        Envoy::sidecar(&meshd, Ads::Sotw, "shop", "productpage"),
    ];
    for envoy in &envoys {
        wait_until("the sidecar to route", Duration::from_secs(10), || {
            http_get(&format!("{}:{port}", envoy.ip), "reviews", "/", &[])
                .is_ok_and(|r| r.status == 200 && r.body == "reviews-v1")
        });
        let clusters = envoy
            .admin("/clusters?format=json")
            .unwrap()
            .body
            .matches("outbound|8080||svc-")
            .count();
        assert!(clusters >= 300, "{clusters} bulk clusters in {}", envoy.id);
    }
    let runs = |used: &str| meshd.metric(&format!("meshd_xds_shared_runs{{use=\"{used}\"}}"));
    assert!(runs("encoded") >= 2.0, "a delta and a SotW run at least");
    assert!(
        runs("reused") >= 1.0,
        "the second delta sidecar shares the first's"
    );
    wait_until(
        "idle meshd to drop its runs",
        Duration::from_secs(10),
        || meshd.metric("meshd_xds_shared_run_bytes") == 0.0,
    );
}

/// A sidecar forwards TLS it does not terminate by the SNI the client asks for: a
/// VirtualService's `tls` routes choose the destination per name, and TLS services without
/// an address of their own (ServiceEntries) share one port, each reached by its hostname.
/// Every client verifies the site's own certificate, so each answer proves which site
/// completed the handshake.
#[test]
fn a_sidecar_forwards_tls_by_sni() {
    let (root_a, chain_a, key_a) = site_certificate("a.example.com");
    let (root_b, chain_b, key_b) = site_certificate("b.example.com");
    let site_a = Upstream::tls("site-a", &chain_a, &key_a, &root_a);
    let site_b = Upstream::tls("site-b", &chain_b, &key_b, &root_b);
    let dir = temp_dir("sc-tls").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let (web, b_port, shared) = (free_port(), free_port(), free_port());
    let tls = |name: &str, port: u16, up: &Upstream| {
        service_yaml("shop", name, port, &[(up, &[])]).replace("{name: http,", "{name: https,")
    };
    let entry = |host: &str, up: &Upstream| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {host}, namespace: shop}}\nspec:\n  hosts: [{host}]\n  resolution: STATIC\n  ports: [{{number: {shared}, name: tls, protocol: TLS}}]\n  endpoints: [{{address: 127.0.0.1, ports: {{tls: {p}}}}}]\n",
            p = up.port
        )
    };
    std::fs::write(
        dir.join("mesh.yaml"),
        [
            tls("web", web, &site_a),
            tls("site-b", b_port, &site_b),
            entry("a.example.com", &site_a),
            entry("b.example.com", &site_b),
        ]
        .join("---\n"),
    )
    .unwrap();
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let (web_addr, shared_addr) = (
        format!("{}:{web}", envoy.ip),
        format!("{}:{shared}", envoy.ip),
    );
    // Addressless TLS services on one port: each name reaches its own site.
    wait_until(
        "a.example.com to reach site-a through the shared port",
        Duration::from_secs(10),
        || https_get(&shared_addr, "a.example.com", &root_a, "/").is_ok_and(|r| r.body == "site-a"),
    );
    let b = https_get(&shared_addr, "b.example.com", &root_b, "/").unwrap();
    assert_eq!(b.body, "site-b");
    // Without a route, web's listener sends every connection to web (site-a): b's name
    // finds a certificate for a.example.com and the client refuses it.
    assert_eq!(
        https_get(&web_addr, "a.example.com", &root_a, "/")
            .unwrap()
            .body,
        "site-a"
    );
    assert!(https_get(&web_addr, "b.example.com", &root_b, "/").is_err());
    std::fs::write(
        dir.join("vs.yaml"),
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: web, namespace: shop}}\nspec:\n  hosts: [web, a.example.com, b.example.com]\n  tls:\n  - match: [{{sniHosts: [a.example.com]}}]\n    route: [{{destination: {{host: web}}}}]\n  - match: [{{sniHosts: [b.example.com]}}]\n    route: [{{destination: {{host: site-b, port: {{number: {b_port}}}}}}}]\n"
        ),
    )
    .unwrap();
    wait_until(
        "b.example.com on web's port to reach site-b",
        Duration::from_secs(10),
        || https_get(&web_addr, "b.example.com", &root_b, "/").is_ok_and(|r| r.body == "site-b"),
    );
    let a = https_get(&web_addr, "a.example.com", &root_a, "/").unwrap();
    assert_eq!(
        (a.body.as_str(), a.headers["x-tls-sni"].as_str()),
        ("site-a", "a.example.com")
    );
}

/// Writes into `dir` (made here) a TCP service db in shop (port named `tcp`) with a v1 and
/// a v2 pod, and a DestinationRule with both subsets; its port and upstreams.
fn db_with_subsets(dir: &std::path::Path) -> (u16, [Upstream; 2]) {
    let v1 = Upstream::start("db-v1");
    let v2 = Upstream::start("db-v2");
    std::fs::create_dir_all(dir).unwrap();
    let port = free_port();
    let service = service_yaml(
        "shop",
        "db",
        port,
        &[(&v1, &[("version", "v1")]), (&v2, &[("version", "v2")])],
    )
    .replace("{name: http,", "{name: tcp,");
    std::fs::write(dir.join("db.yaml"), service).unwrap();
    std::fs::write(
        dir.join("dr.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: db, namespace: shop}\nspec:\n  host: db\n  subsets:\n  - {name: v1, labels: {version: v1}}\n  - {name: v2, labels: {version: v2}}\n",
    )
    .unwrap();
    (port, [v1, v2])
}

/// db is a TCP service (port named `tcp`) with a v1 and a v2 pod and a DestinationRule
/// with both subsets. Without a VirtualService the sidecar's TCP listener spreads
/// connections over both; a VirtualService `tcp` route sends every connection to v2; one
/// whose match names another port leaves the default; a 50/50 route reaches both again
/// through Envoy's weighted clusters. (Each request is a new connection, forwarded by
/// tcp_proxy: the upstreams answer HTTP, which passes through unchanged.)
#[test]
fn a_virtual_service_tcp_route_chooses_where_connections_go() {
    let dir = temp_dir("sc-tcp").join("config");
    let (port, _upstreams) = db_with_subsets(&dir);
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    // What twenty connections reach (the Host header is irrelevant to tcp_proxy).
    let reached = || {
        (0..20)
            .map(|_| {
                http_get(&format!("{}:{port}", envoy.ip), "db", "/", &[])
                    .map(|r| r.body)
                    .unwrap_or_default()
            })
            .collect::<std::collections::BTreeSet<_>>()
    };
    let both: std::collections::BTreeSet<String> = ["db-v1".into(), "db-v2".into()].into();
    wait_until(
        "connections to reach both pods",
        Duration::from_secs(10),
        || reached() == both,
    );
    let vs = |tcp: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: db, namespace: shop}}\nspec:\n  hosts: [db]\n  tcp:\n{tcp}"
        )
    };
    std::fs::write(
        dir.join("vs.yaml"),
        vs("  - route: [{destination: {host: db, subset: v2}}]\n"),
    )
    .unwrap();
    wait_until(
        "connections to reach v2 only",
        Duration::from_secs(10),
        || reached() == ["db-v2".to_string()].into(),
    );
    std::fs::write(
        dir.join("vs.yaml"),
        vs("  - match: [{port: 1}]\n    route: [{destination: {host: db, subset: v2}}]\n"),
    )
    .unwrap();
    wait_until(
        "a route for another port to leave the default",
        Duration::from_secs(10),
        || reached() == both,
    );
    std::fs::write(
        dir.join("vs.yaml"),
        vs("  - route:\n    - {destination: {host: db, subset: v1}, weight: 50}\n    - {destination: {host: db, subset: v2}, weight: 50}\n"),
    )
    .unwrap();
    wait_until(
        "weighted clusters in the listener",
        Duration::from_secs(10),
        || {
            envoy
                .config_dump("dynamic_listeners")
                .contains(&format!("outbound|{port}|v1|db.shop.svc.cluster.local"))
        },
    );
    wait_until(
        "connections to reach both subsets",
        Duration::from_secs(10),
        || reached() == both,
    );
}

/// A `tcp` route's `destinationSubnets` choose by the address a connection is made to:
/// the sidecar's egress listener for db binds every address (`bind: 0.0.0.0`,
/// `captureMode: NONE`), a route for one loopback address sends its connections to v2 and
/// the next route takes the rest to v1; with only the subnet route, the rest reach db's
/// own cluster (both pods), as istiod's `buildSidecarOutboundTCPFilterChainOpts` adds it.
#[test]
fn a_tcp_routes_destination_subnets_choose_by_the_address_connected_to() {
    let dir = temp_dir("sc-subnets").join("config");
    let (_port, _upstreams) = db_with_subsets(&dir);
    let egress = free_port();
    let write = |file: &str, text: &str| std::fs::write(dir.join(file), text).unwrap();
    write(
        "sidecar.yaml",
        &format!(
            "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: default, namespace: shop}}\nspec:\n  egress:\n  - port: {{number: {egress}, protocol: TCP, name: db}}\n    bind: 0.0.0.0\n    captureMode: NONE\n    hosts: [./db.shop.svc.cluster.local]\n  - hosts: [./*]\n"
        ),
    );
    let (special, other) = (loopback_ip(), loopback_ip());
    let vs = |tcp: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: db, namespace: shop}}\nspec:\n  hosts: [db]\n  tcp:\n  - match: [{{destinationSubnets: [{special}/32]}}]\n    route: [{{destination: {{host: db, subset: v2}}}}]\n{tcp}"
        )
    };
    write(
        "vs.yaml",
        &vs("  - route: [{destination: {host: db, subset: v1}}]\n"),
    );
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    // What ten connections to `ip` reach (the Host header is irrelevant to tcp_proxy).
    let reached = |ip: &str| {
        (0..10)
            .map(|_| {
                http_get(&format!("{ip}:{egress}"), "db", "/", &[])
                    .map(|r| r.body)
                    .unwrap_or_default()
            })
            .collect::<std::collections::BTreeSet<String>>()
    };
    let only = |name: &str| std::collections::BTreeSet::from([name.to_string()]);
    wait_until(
        "connections to the subnet to reach v2",
        Duration::from_secs(10),
        || reached(&special) == only("db-v2"),
    );
    assert_eq!(reached(&other), only("db-v1"));
    let listener = envoy.config_dump("dynamic_listeners");
    assert!(
        listener.contains(&format!("\"address_prefix\": \"{special}\"")),
        "{listener}"
    );
    // Without a route for the rest, db's own cluster takes it.
    write("vs.yaml", &vs(""));
    let both = std::collections::BTreeSet::from(["db-v1".to_string(), "db-v2".to_string()]);
    wait_until(
        "other connections to reach both pods",
        Duration::from_secs(10),
        || reached(&other) == both,
    );
    assert_eq!(reached(&special), only("db-v2"));
    let rejected = envoy.rejected_updates();
    assert!(rejected.is_empty(), "{rejected:?}");
}

/// Whether a connection to `addr` (a sidecar's listener for the `db` upstream), left
/// `idle` after one request on it, was closed (a read finds its end) rather than kept.
fn closed_after_idle(addr: &str, idle: Duration) -> bool {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.write_all(b"GET / HTTP/1.1\r\nHost: db\r\n\r\n")
        .unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while !answer.ends_with(b"\r\n\r\ndb") {
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "closed before answering: {answer:?}");
        answer.extend_from_slice(&buf[..n]);
    }
    std::thread::sleep(idle);
    conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    matches!(conn.read(&mut buf), Ok(0))
}

/// meshd serving a TCP service `db` in shop (its port named `tcp`), its config dir and
/// the service's port.
fn tcp_db(name: &str, db: &Upstream) -> (Meshd, std::path::PathBuf, u16) {
    let dir = temp_dir(name).join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let service =
        service_yaml("shop", "db", port, &[(db, &[])]).replace("{name: http,", "{name: tcp,");
    std::fs::write(dir.join("db.yaml"), service).unwrap();
    (Meshd::start(&dir), dir, port)
}

/// A DestinationRule's `connectionPool.tcp.idleTimeout` reaches the sidecar's tcp_proxy:
/// a connection left idle is closed by Envoy after it, and stays open without it.
#[test]
fn a_tcp_connection_left_idle_is_closed_after_the_destination_rules_idle_timeout() {
    let db = Upstream::start("db");
    let (meshd, dir, port) = tcp_db("sc-tcp-idle", &db);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let addr = format!("{}:{port}", envoy.ip);
    wait_until("connections to reach db", Duration::from_secs(10), || {
        http_get(&addr, "db", "/", &[]).is_ok_and(|r| r.body == "db")
    });
    assert!(!closed_after_idle(&addr, Duration::from_millis(2500)));
    std::fs::write(
        dir.join("dr.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: db, namespace: shop}\nspec:\n  host: db\n  trafficPolicy:\n    connectionPool: {tcp: {idleTimeout: 1s}}\n",
    )
    .unwrap();
    wait_until(
        "the idle timeout in the listener",
        Duration::from_secs(10),
        || {
            envoy
                .config_dump("dynamic_listeners")
                .contains("\"idle_timeout\": \"1s\"")
        },
    );
    assert!(closed_after_idle(&addr, Duration::from_millis(2500)));
}

/// The proxy's `IDLE_TIMEOUT` node metadata (istiod's `ISTIO_META_IDLE_TIMEOUT`) closes a
/// TCP connection left idle when no DestinationRule sets a timeout; a proxy without it
/// keeps the connection.
#[test]
fn a_proxys_idle_timeout_metadata_closes_idle_tcp_connections() {
    let db = Upstream::start("db");
    let (meshd, _dir, port) = tcp_db("sc-idle-meta", &db);
    let timed = Envoy::sidecar_with(&meshd, Ads::Delta, "shop", "web", "IDLE_TIMEOUT: 1s");
    let plain = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    for envoy in [&timed, &plain] {
        let addr = format!("{}:{port}", envoy.ip);
        wait_until("connections to reach db", Duration::from_secs(10), || {
            http_get(&addr, "db", "/", &[]).is_ok_and(|r| r.body == "db")
        });
    }
    let addr = |e: &Envoy| format!("{}:{port}", e.ip);
    assert!(closed_after_idle(
        &addr(&timed),
        Duration::from_millis(2500)
    ));
    assert!(!closed_after_idle(
        &addr(&plain),
        Duration::from_millis(2500)
    ));
    let dump = timed.config_dump("dynamic_listeners");
    assert!(dump.contains("\"idle_timeout\": \"1s\""), "{dump}");
}

/// An HTTP/1.1 `CONNECT` proxy on loopback (a corporate egress proxy): it records each
/// request line, answers `200`, and pipes the connection to the requested address. Any
/// other request is answered `405`.
struct ConnectProxy {
    port: u16,
    requests: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl ConnectProxy {
    fn start() -> ConnectProxy {
        use std::io::{Read, Write};
        use std::net::{TcpListener, TcpStream};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = requests.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let seen = seen.clone();
                std::thread::spawn(move || {
                    let mut conn = conn;
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if conn.read(&mut byte).unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let head = String::from_utf8_lossy(&head).to_string();
                    let line = head.lines().next().unwrap_or_default().to_string();
                    seen.lock().unwrap().push(line.clone());
                    let target = match line.split(' ').collect::<Vec<_>>()[..] {
                        ["CONNECT", target, _] => target.to_string(),
                        _ => {
                            let _ = conn.write_all(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                            return;
                        }
                    };
                    let Ok(upstream) = TcpStream::connect(&target) else {
                        let _ = conn.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n");
                        return;
                    };
                    let _ = conn.write_all(b"HTTP/1.1 200 OK\r\n\r\n");
                    let (mut up_r, mut down_w) =
                        (upstream.try_clone().unwrap(), conn.try_clone().unwrap());
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut up_r, &mut down_w);
                        let _ = down_w.shutdown(std::net::Shutdown::Write);
                    });
                    let (mut down_r, mut up_w) = (conn, upstream);
                    let _ = std::io::copy(&mut down_r, &mut up_w);
                    let _ = up_w.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        ConnectProxy { port, requests }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

/// A DestinationRule's `tunnel` carries a TCP service's connections in an HTTP `CONNECT`
/// to its endpoint (an egress proxy) for `targetHost:targetPort`, as istiod sets the
/// sidecar's tcp_proxy `tunneling_config`: the proxy is asked for the database's address
/// and the client's bytes reach the database through it. Without the rule, the proxy
/// gets the client's own request, which it refuses.
#[test]
fn a_destination_rules_tunnel_carries_tcp_through_an_http_connect_proxy() {
    let proxy = ConnectProxy::start();
    let db = Upstream::start("db");
    // `egress` is a TCP service whose only endpoint is the CONNECT proxy.
    let at_proxy = Upstream {
        name: "egress-0".into(),
        port: proxy.port,
    };
    let (meshd, dir, port) = tcp_db("sc-tunnel", &at_proxy);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let addr = format!("{}:{port}", envoy.ip);
    wait_until(
        "the proxy to refuse a plain request",
        Duration::from_secs(10),
        || http_get(&addr, "db", "/", &[]).is_ok_and(|r| r.status == 405),
    );
    let before = proxy.requests();
    assert!(
        !before.is_empty() && before.iter().all(|r| r == "GET / HTTP/1.1"),
        "{before:?}"
    );
    std::fs::write(
        dir.join("dr.yaml"),
        format!(
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: db, namespace: shop}}\nspec:\n  host: db\n  trafficPolicy:\n    tunnel: {{protocol: CONNECT, targetHost: 127.0.0.1, targetPort: {}}}\n",
            db.port
        ),
    )
    .unwrap();
    wait_until(
        "db to answer through the tunnel",
        Duration::from_secs(10),
        || http_get(&addr, "db", "/", &[]).is_ok_and(|r| r.body == "db"),
    );
    let connect = format!("CONNECT 127.0.0.1:{} HTTP/1.1", db.port);
    assert!(
        proxy.requests().contains(&connect),
        "{:?}",
        proxy.requests()
    );
}

/// With `MESHD_ENABLE_VHDS`, a delta sidecar's outbound route configuration arrives empty
/// and its virtual hosts over VHDS, one resource each: Envoy routes by them, a
/// VirtualService change sends its virtual host and no route configuration, and a
/// removed service's virtual host leaves Envoy's table. A state-of-the-world sidecar of
/// the same meshd still gets whole route configurations.
#[test]
fn with_vhds_a_virtual_service_change_sends_only_its_virtual_host() {
    let v1 = Upstream::start("reviews-v1");
    let v2 = Upstream::start("reviews-v2");
    let (dir, port) = reviews_config(
        "sc-vhds",
        &[(&v1, &[("version", "v1")]), (&v2, &[("version", "v2")])],
        "  subsets:\n  - {name: v1, labels: {version: v1}}\n  - {name: v2, labels: {version: v2}}\n",
    );
    let vs = |jason: &str, others: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  hosts: [reviews]\n  http:\n  - match: [{{headers: {{end-user: {{exact: jason}}}}}}]\n    route: [{{destination: {{host: reviews, subset: {jason}}}}}]\n  - route: [{{destination: {{host: reviews, subset: {others}}}}}]\n"
        )
    };
    std::fs::write(dir.join("vs.yaml"), vs("v2", "v1")).unwrap();
    let ratings = Upstream::start("ratings");
    // On the same port as reviews, so with a ClusterIP of its own.
    let ratings_yaml = service_yaml("shop", "ratings", port, &[(&ratings, &[])]).replacen(
        "clusterIP: 10.96.",
        "clusterIP: 10.97.",
        1,
    );
    std::fs::write(dir.join("ratings.yaml"), &ratings_yaml).unwrap();
    let meshd = Meshd::start_with_env(&dir, &[], &[("MESHD_ENABLE_VHDS", "true")]);
    let delta = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let sotw = Envoy::sidecar(&meshd, Ads::Sotw, "shop", "details");
    let get = |envoy: &Envoy, host: &str, user: &str| {
        http_get(
            &format!("{}:{port}", envoy.ip),
            host,
            "/",
            &[("end-user", user)],
        )
        .map(|r| r.body)
        .unwrap_or_default()
    };
    for envoy in [&delta, &sotw] {
        wait_until("the sidecar to route", Duration::from_secs(10), || {
            get(envoy, "reviews", "jason") == "reviews-v2"
                && get(envoy, "reviews", "alice") == "reviews-v1"
                && get(envoy, "ratings", "alice") == "ratings"
        });
    }
    // Envoy holds the route configuration with VHDS, and the virtual hosts it was sent.
    let routes = delta.config_dump("dynamic_route_configs");
    let reviews_vh = format!("\"{port}/reviews.shop.svc.cluster.local:{port}\"");
    let ratings_vh = format!("\"{port}/ratings.shop.svc.cluster.local:{port}\"");
    assert!(routes.contains("\"vhds\""), "{routes}");
    assert!(
        routes.contains(&reviews_vh) && routes.contains(&ratings_vh),
        "{routes}"
    );
    assert!(
        !sotw
            .config_dump("dynamic_route_configs")
            .contains("\"vhds\"")
    );
    // meshd's config_dump shows them as Envoy does: in the route configuration.
    let field = &["route_config"][..];
    let ours = meshd.json(&format!("/debug/config_dump?proxyID={}", delta.id));
    assert_eq!(
        envoy_dump(&delta, "dynamic_route_configs", field, "name"),
        meshd_dump(&ours, "dynamic_route_configs", field, "name")
    );
    let pushes = |t: &str| meshd.pushes(t);
    let (rds, vhds) = (pushes("rds"), pushes("vhds"));
    assert!(vhds >= 1.0, "{vhds}");

    // The VirtualService flips: the delta sidecar gets it as one virtual host.
    std::fs::write(dir.join("vs.yaml"), vs("v1", "v2")).unwrap();
    for envoy in [&delta, &sotw] {
        wait_until("the new routes", Duration::from_secs(10), || {
            get(envoy, "reviews", "jason") == "reviews-v1"
                && get(envoy, "reviews", "alice") == "reviews-v2"
        });
    }
    assert_eq!(pushes("vhds"), vhds + 1.0, "one VHDS push");
    assert_eq!(pushes("rds"), rds + 1.0, "one RDS push: the SotW sidecar's");
    let synced = meshd.syncz(&delta.id);
    assert_eq!(synced["types"]["vhds"]["rejects"], 0, "{synced}");
    // `meshd proxy-status` gains a VHDS column: the delta sidecar is in sync on it, the
    // SotW one is sent nothing over it.
    let status = meshd.cli(&["proxy-status"]);
    let cells = |line: &str| -> Vec<String> {
        (line.split("  ").map(str::trim))
            .filter(|c| !c.is_empty())
            .map(String::from)
            .collect()
    };
    let header = cells(status.lines().next().unwrap());
    let column = header.iter().position(|c| c == "VHDS");
    let column = column.unwrap_or_else(|| panic!("{status}"));
    let vhds_state = |id: &str| {
        let name = id.split('~').nth(2).unwrap();
        let row = status.lines().find(|l| l.starts_with(name));
        cells(row.unwrap_or_else(|| panic!("{name}: {status}")))[column].clone()
    };
    assert_eq!(vhds_state(&delta.id), "SYNCED", "{status}");
    assert_eq!(vhds_state(&sotw.id), "NOT SENT", "{status}");

    // ratings goes: Envoy drops its virtual host by name, and keeps the others.
    std::fs::remove_file(dir.join("ratings.yaml")).unwrap();
    wait_until(
        "ratings' virtual host to go",
        Duration::from_secs(10),
        || {
            !delta
                .config_dump("dynamic_route_configs")
                .contains(&ratings_vh)
        },
    );
    let routes = delta.config_dump("dynamic_route_configs");
    assert!(routes.contains(&reviews_vh), "{routes}");
    assert_eq!(get(&delta, "reviews", "jason"), "reviews-v1");
}

/// MeshConfig's `defaultHttpRetryPolicy` replaces Istio's default on routes without their
/// own `retries`: a real sidecar does not retry a 503 by default (istiod's default policy
/// retries failed connections and refused streams, no status code), not at all with
/// `attempts: 0`, four times with `attempts: 4, retryOn: '503'`, and a VirtualService's
/// own policy wins.
#[test]
fn the_meshs_default_retry_policy_decides_how_often_a_failing_request_is_retried() {
    let dir = temp_dir("mesh-retries").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let up = Upstream::answering("reviews-1", "503 Service Unavailable");
    let port = free_port();
    let service = service_yaml("shop", "reviews", port, &[(&up, &[])]);
    std::fs::write(dir.join("reviews.yaml"), service).unwrap();
    let mesh = |policy: &str| mesh_configmap(&format!("trustDomain: cluster.local\n{policy}"));
    std::fs::write(dir.join("mesh.yaml"), mesh("")).unwrap();
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let cluster = format!("outbound|{port}||reviews.shop.svc.cluster.local");
    let retries = || envoy.stat(&format!("cluster.{cluster};.upstream_rq_retry"));
    let get = || http_get(&format!("{}:{port}", envoy.ip), "reviews", "/", &[]);
    // The retries one failing request makes under the route's current policy.
    let retried = || {
        let before = retries();
        assert_eq!(get().unwrap().status, 503);
        retries() - before
    };
    let route = || envoy.config_dump("dynamic_route_configs");
    wait_until("the route", Duration::from_secs(10), || {
        route().contains(&cluster)
    });
    assert!(route().contains("\"num_retries\": 2"), "{}", route());
    assert_eq!(retried(), 0, "Istio's default retries no status code");

    meshd.write("mesh.yaml", &mesh("defaultHttpRetryPolicy: {attempts: 0}"));
    wait_until("no retry policy", Duration::from_secs(10), || {
        !route().contains("\"retry_policy\"")
    });
    assert_eq!(retried(), 0, "attempts: 0");

    let four = "defaultHttpRetryPolicy: {attempts: 4, retryOn: '503'}";
    meshd.write("mesh.yaml", &mesh(four));
    wait_until("four retries", Duration::from_secs(10), || {
        route().contains("\"num_retries\": 4")
    });
    assert_eq!(retried(), 4, "attempts: 4");

    meshd.write(
        "vs.yaml",
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: shop}\nspec:\n  hosts: [reviews]\n  http: [{route: [{destination: {host: reviews}}], retries: {attempts: 1, retryOn: '503'}}]\n",
    );
    wait_until(
        "the VirtualService's policy",
        Duration::from_secs(10),
        || route().contains("\"num_retries\": 1"),
    );
    assert_eq!(retried(), 1, "the VirtualService's own");
    assert_eq!(envoy.rejected_updates(), Vec::<String>::new());
}

/// MeshConfig `pathNormalization`: the path the application receives through a real
/// sidecar, under each mode (the upstream echoes it in `x-path`).
#[test]
fn the_mesh_decides_how_request_paths_are_normalized() {
    let dir = temp_dir("path-normalization").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let (_up, port) = write_reviews(&dir);
    let mesh =
        |mode: &str| mesh_configmap(&format!("pathNormalization: {{normalization: {mode}}}"));
    std::fs::write(dir.join("mesh.yaml"), mesh("BASE")).unwrap();
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let path = |sent: &str| {
        let r = http_get(&format!("{}:{port}", envoy.ip), "reviews", sent, &[]);
        r.ok()
            .filter(|r| r.status == 200)
            .map(|r| r.headers["x-path"].clone())
    };
    let sent = "/a/../b//c%2Fd";
    wait_until("BASE", Duration::from_secs(10), || {
        path(sent).as_deref() == Some("/b//c%2Fd")
    });
    for (mode, expected) in [
        ("MERGE_SLASHES", "/b/c%2Fd"),
        ("DECODE_AND_MERGE_SLASHES", "/b/c/d"),
        ("NONE", "/a/../b//c%2Fd"),
    ] {
        meshd.write("mesh.yaml", &mesh(mode));
        wait_until(mode, Duration::from_secs(10), || {
            path(sent).as_deref() == Some(expected)
        });
    }
    assert_eq!(envoy.rejected_updates(), Vec::<String>::new());
}

/// MeshConfig `inboundTrafficPolicy.mode: LOCALHOST`: a real sidecar with traffic capture
/// takes inbound clusters that reach the application on 127.0.0.1 (a STATIC cluster, no
/// 127.0.0.6 bind), and original-destination ones again once the mode goes.
#[test]
fn inbound_clusters_follow_the_meshs_inbound_traffic_policy() {
    let dir = temp_dir("inbound-policy").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    // The Service sets no targetPort: the workload's port is the service port.
    let (_up, port) = write_reviews(&dir);
    let mesh = |mode: &str| mesh_configmap(&format!("inboundTrafficPolicy: {{mode: {mode}}}"));
    std::fs::write(dir.join("mesh.yaml"), mesh("LOCALHOST")).unwrap();
    let meshd = Meshd::start(&dir);
    // A workload of reviews.
    let envoy = Envoy::captured_sidecar(&meshd, Ads::Delta, "shop", "reviews", "A: b");
    let name = format!("inbound|{port}||");
    let cluster = || {
        let field = &["cluster"];
        envoy_dump(&envoy, "dynamic_active_clusters", field, "name").remove(&name)
    };
    wait_until("the inbound cluster", Duration::from_secs(10), || {
        cluster().is_some_and(|c| c["type"] == "STATIC")
    });
    let c = cluster().unwrap();
    let address = &c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"];
    assert_eq!(address["socket_address"]["address"], "127.0.0.1", "{c}");
    assert_eq!(address["socket_address"]["port_value"], port, "{c}");
    assert!(c["upstream_bind_config"].is_null(), "{c}");

    meshd.write("mesh.yaml", &mesh("PASSTHROUGH"));
    wait_until(
        "an original-destination cluster",
        Duration::from_secs(10),
        || cluster().is_some_and(|c| c["type"] == "ORIGINAL_DST"),
    );
    let c = cluster().unwrap();
    let bind = &c["upstream_bind_config"]["source_address"]["address"];
    assert_eq!(bind, "127.0.0.6", "{c}");
    assert_eq!(c["cleanup_interval"], "9223372035s", "{c}");
    assert_eq!(envoy.rejected_updates(), Vec::<String>::new());
}

/// MeshConfig `protocolDetectionTimeout`: on a sniffed port (unnamed), a server that
/// speaks first (a database's greeting) is reached through a real sidecar only once the
/// inspectors give up waiting for the client. With istiod's default (no limit) the
/// client waits forever.
#[test]
fn a_server_first_protocol_on_a_sniffed_port_needs_the_meshs_detection_timeout() {
    let dir = temp_dir("protocol-detection").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    // The database: greets every connection, then waits for it to close.
    let db = TcpListener::bind("127.0.0.1:0").unwrap();
    let db_port = db.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut conn in db.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = conn.write_all(b"220 db ready\r\n");
                let _ = conn.read(&mut [0; 64]);
            });
        }
    });
    let port = free_port();
    let service = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: db, namespace: shop}}\nspec: {{clusterIP: 10.96.77.7, ports: [{{name: db, port: {port}}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: db-0, namespace: shop, labels: {{kubernetes.io/service-name: db}}}}\naddressType: IPv4\nports: [{{name: db, port: {db_port}}}]\nendpoints: [{{addresses: [127.0.0.1], conditions: {{ready: true}}}}]\n"
    );
    std::fs::write(dir.join("db.yaml"), service).unwrap();
    let mesh = mesh_configmap("trustDomain: cluster.local");
    std::fs::write(dir.join("mesh.yaml"), mesh).unwrap();
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "app");
    // The greeting a new connection through the sidecar reads within `wait`.
    let greeting = |wait: Duration| -> Option<String> {
        let addr: std::net::SocketAddr = format!("{}:{port}", envoy.ip).parse().unwrap();
        let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
        conn.set_read_timeout(Some(wait)).unwrap();
        let mut buf = [0; 64];
        let n = conn.read(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    let listening = |envoy: &Envoy| {
        let dump = envoy.config_dump("dynamic_listeners");
        dump.contains(&format!("\"port_value\": {port}"))
    };
    wait_until("the sniffed listener", Duration::from_secs(10), || {
        listening(&envoy)
    });
    assert_eq!(
        greeting(Duration::from_secs(1)),
        None,
        "no limit: nothing arrives"
    );

    meshd.write(
        "mesh.yaml",
        &mesh_configmap("protocolDetectionTimeout: 100ms"),
    );
    wait_until("the greeting", Duration::from_secs(10), || {
        greeting(Duration::from_secs(1)).as_deref() == Some("220 db ready\r\n")
    });
    assert_eq!(envoy.rejected_updates(), Vec::<String>::new());
}
