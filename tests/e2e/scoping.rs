//! Per-proxy scoping: a Sidecar resource limits what a proxy receives, and a proxy whose
//! configuration an edit does not touch receives nothing.

use std::time::Duration;

use crate::harness::*;

fn namespace_mesh(ns: &str, svc: &str, port: u16, up: &Upstream) -> String {
    format!(
        "{}---\napiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: default, namespace: {ns}}}\nspec:\n  egress: [{{hosts: [\"./*\"]}}]\n",
        service_yaml(ns, svc, port, &[(up, &[])])
    )
}

fn vs(ns: &str, svc: &str, header: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {svc}, namespace: {ns}}}\nspec:\n  hosts: [{svc}]\n  http:\n  - match: [{{headers: {{x-test: {{exact: {header}}}}}}}]\n    route: [{{destination: {{host: {svc}}}}}]\n  - route: [{{destination: {{host: {svc}}}}}]\n"
    )
}

fn responses(meshd: &Meshd, proxy: &str) -> Vec<u64> {
    let s = meshd.syncz(proxy);
    ["cds", "eds", "lds", "rds"]
        .iter()
        .map(|t| s["types"][t]["responses"].as_u64().unwrap_or(0))
        .collect()
}

#[test]
fn a_proxy_whose_config_an_edit_does_not_touch_receives_no_push() {
    let dir = temp_dir("scoping").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let (ua, ub) = (Upstream::start("alpha-svc"), Upstream::start("beta-svc"));
    let (pa, pb) = (free_port(), free_port());
    std::fs::write(
        dir.join("alpha.yaml"),
        namespace_mesh("alpha", "alpha-svc", pa, &ua),
    )
    .unwrap();
    std::fs::write(
        dir.join("beta.yaml"),
        namespace_mesh("beta", "beta-svc", pb, &ub),
    )
    .unwrap();
    std::fs::write(dir.join("alpha-vs.yaml"), vs("alpha", "alpha-svc", "one")).unwrap();
    let meshd = Meshd::start(&dir);
    let a = Envoy::sidecar(&meshd, Ads::Delta, "alpha", "client");
    let b = Envoy::sidecar(&meshd, Ads::Delta, "beta", "client");
    let get = |e: &Envoy, port: u16, host: &str| {
        http_get(&format!("{}:{port}", e.ip, port = port), host, "/", &[])
    };
    wait_until("both sidecars to route", Duration::from_secs(10), || {
        get(&a, pa, "alpha-svc").is_ok_and(|r| r.body == "alpha-svc")
            && get(&b, pb, "beta-svc").is_ok_and(|r| r.body == "beta-svc")
    });
    // Scoping: each proxy holds only its own namespace's clusters.
    let clusters = |e: &Envoy| e.admin("/clusters").unwrap().body;
    assert!(!clusters(&a).contains("beta-svc") && clusters(&a).contains("alpha-svc"));
    assert!(!clusters(&b).contains("alpha-svc") && clusters(&b).contains("beta-svc"));

    thread_settle();
    let a_before = responses(&meshd, &a.id);
    let b_before = responses(&meshd, &b.id);
    let b_envoy_before = (
        b.stat("cluster_manager.cds.update_attempt"),
        b.stat("listener_manager.lds.update_attempt"),
    );
    let pushes_before = meshd.metric("pilot_push_context_recompute_count");
    let skipped_before = meshd.metric("meshd_xds_pushes_skipped");

    meshd.write("alpha-vs.yaml", &vs("alpha", "alpha-svc", "two"));
    wait_until(
        "alpha's proxy to receive the edit",
        Duration::from_secs(5),
        || responses(&meshd, &a.id)[3] > a_before[3],
    );
    thread_settle();
    assert!(
        meshd.metric("pilot_push_context_recompute_count") > pushes_before,
        "the edit did cause a push"
    );
    let a_after = responses(&meshd, &a.id);
    assert_eq!(a_after[..3], a_before[..3], "only RDS changed for alpha");
    assert_eq!(
        responses(&meshd, &b.id),
        b_before,
        "beta's proxy must receive nothing"
    );
    let b_envoy_after = (
        b.stat("cluster_manager.cds.update_attempt"),
        b.stat("listener_manager.lds.update_attempt"),
    );
    assert_eq!(
        b_envoy_after, b_envoy_before,
        "beta's Envoy saw no CDS or LDS update"
    );
    let rds_b = meshd.syncz(&b.id)["types"]["rds"].clone();
    assert_eq!(rds_b["nonce_sent"], rds_b["nonce_acked"]);
    // Nothing was sent to beta because the change index left it out, not because a diff
    // of its whole view found nothing (which costs a view per proxy per push).
    assert!(
        meshd.metric("meshd_xds_pushes_skipped") > skipped_before,
        "beta's connection compared its view instead of skipping the push"
    );
}

fn thread_settle() {
    std::thread::sleep(Duration::from_millis(400));
}

/// MeshConfig's `defaultServiceExportTo: ["."]` keeps a Service without its own
/// `exportTo` in its namespace: a sidecar in shop routes to reviews, one in billing has no
/// cluster for it (its request falls to the passthrough catch-all and fails), and the
/// Service's own `networking.istio.io/exportTo: "*"` annotation exports it again.
#[test]
fn a_mesh_default_export_to_keeps_a_service_in_its_namespace() {
    let up = Upstream::start("reviews");
    let (dir, port) = reviews_config("scope-default-export", &[(&up, &[])], "");
    std::fs::write(
        dir.join("mesh.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |\n    defaultServiceExportTo: ['.']\n",
    )
    .unwrap();
    let meshd = Meshd::start(&dir);
    let shop = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let billing = Envoy::sidecar(&meshd, Ads::Delta, "billing", "web");
    let host = "reviews.shop.svc.cluster.local";
    let get = |e: &Envoy| http_get(&format!("{}:{port}", e.ip), host, "/", &[]);
    wait_until("shop's sidecar to route", Duration::from_secs(10), || {
        get(&shop).is_ok_and(|r| r.status == 200)
    });
    let cluster = format!("outbound|{port}||{host}");
    wait_until(
        "billing's sidecar to be configured",
        Duration::from_secs(10),
        || {
            billing
                .admin("/clusters")
                .unwrap()
                .body
                .contains("PassthroughCluster")
        },
    );
    assert!(!billing.admin("/clusters").unwrap().body.contains(&cluster));
    // Exported by its own annotation: billing gets it.
    let service = std::fs::read_to_string(dir.join("reviews.yaml")).unwrap();
    std::fs::write(
        dir.join("reviews.yaml"),
        service.replacen(
            "metadata: {name: reviews, namespace: shop}",
            "metadata: {name: reviews, namespace: shop, annotations: {networking.istio.io/exportTo: '*'}}",
            1,
        ),
    )
    .unwrap();
    wait_until(
        "billing's sidecar to route",
        Duration::from_secs(10),
        || get(&billing).is_ok_and(|r| r.status == 200),
    );
}

/// A Sidecar's egress listener with a port listens where its `bind` says, for real with
/// `captureMode: NONE`, and serves its own hosts only: HTTP by the route configuration of
/// its port, TCP to the service's only port. The catch-all serves the rest of the
/// namespace on the proxy's own address.
#[test]
fn a_sidecar_egress_port_listens_on_its_bind_for_its_own_hosts() {
    use std::io::{Read, Write};
    let (reviews, ratings, db) = (
        Upstream::start("reviews"),
        Upstream::start("ratings"),
        Upstream::start("db"),
    );
    let dir = temp_dir("egress-port").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let (web_port, ratings_port, db_port, egress_tcp) =
        (free_port(), free_port(), free_port(), free_port());
    let write = |file: &str, text: String| std::fs::write(dir.join(file), text).unwrap();
    write(
        "reviews.yaml",
        service_yaml("shop", "reviews", web_port, &[(&reviews, &[])]),
    );
    write(
        "ratings.yaml",
        service_yaml("shop", "ratings", ratings_port, &[(&ratings, &[])]),
    );
    write(
        "db.yaml",
        service_yaml("shop", "db", db_port, &[(&db, &[])]).replace("{name: http,", "{name: tcp,"),
    );
    let bind = loopback_ip();
    write(
        "sidecar.yaml",
        format!(
            "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: default, namespace: shop}}\nspec:\n  outboundTrafficPolicy: {{mode: REGISTRY_ONLY}}\n  egress:\n  - port: {{number: {web_port}, protocol: HTTP, name: web}}\n    bind: {bind}\n    captureMode: NONE\n    hosts: [shop/reviews.shop.svc.cluster.local]\n  - port: {{number: {egress_tcp}, protocol: TCP, name: db}}\n    bind: {bind}\n    captureMode: NONE\n    hosts: [./db.shop.svc.cluster.local]\n  - hosts: [./*]\n"
        ),
    );
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "web");
    let via_bind = |host: &str| http_get(&format!("{bind}:{web_port}"), host, "/", &[]);
    wait_until(
        "the egress port's listener",
        Duration::from_secs(10),
        || via_bind("reviews").is_ok_and(|r| r.status == 200),
    );
    assert_eq!(via_bind("reviews").unwrap().body, "reviews");
    // ratings is not among the port's hosts: its route's catch-all refuses it
    // (REGISTRY_ONLY), while the catch-all listener serves it on the proxy's address.
    let refused = via_bind("ratings.shop.svc.cluster.local").unwrap();
    assert_eq!(refused.status, 502, "{refused:?}");
    let own = http_get(&format!("{}:{ratings_port}", envoy.ip), "ratings", "/", &[]).unwrap();
    assert_eq!((own.status, own.body.as_str()), (200, "ratings"));
    // The TCP port forwards to db's one port.
    let mut conn = std::net::TcpStream::connect(format!("{bind}:{egress_tcp}")).unwrap();
    conn.write_all(b"GET / HTTP/1.1\r\nHost: db\r\nConnection: close\r\n\r\n")
        .unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    assert!(answer.ends_with("\r\n\r\ndb"), "{answer:?}");
    // Envoy holds the two listeners on the bind, bound for real.
    let listeners = envoy_dump(
        &envoy,
        "dynamic_listeners",
        &["active_state", "listener"],
        "name",
    );
    for port in [web_port, egress_tcp] {
        let l = &listeners[&format!("{bind}_{port}")];
        assert_eq!(l["address"]["socket_address"]["address"], bind.as_str());
    }
}

/// A sidecar without traffic capture listens for its outbound services on 127.0.0.1, as
/// istiod binds them, so an application reaches `localhost:PORT`; a Sidecar egress port
/// without a `bind` does too.
#[test]
fn a_sidecar_without_capture_listens_on_the_loopback_address() {
    let (reviews, db) = (Upstream::start("reviews"), Upstream::start("db"));
    let dir = temp_dir("none-loopback").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let (web_port, db_port, egress_tcp) = (free_port(), free_port(), free_port());
    let write = |file: &str, text: String| std::fs::write(dir.join(file), text).unwrap();
    write(
        "reviews.yaml",
        service_yaml("shop", "reviews", web_port, &[(&reviews, &[])]),
    );
    write(
        "db.yaml",
        service_yaml("shop", "db", db_port, &[(&db, &[])]).replace("{name: http,", "{name: tcp,"),
    );
    write(
        "sidecar.yaml",
        format!(
            "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: default, namespace: shop}}\nspec:\n  egress:\n  - port: {{number: {egress_tcp}, protocol: TCP, name: db}}\n    hosts: [./db.shop.svc.cluster.local]\n  - hosts: [./*]\n"
        ),
    );
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::loopback_sidecar(&meshd, Ads::Delta, "shop", "web");
    let get = |port: u16| http_get(&format!("127.0.0.1:{port}"), "reviews", "/", &[]);
    wait_until(
        "reviews on the loopback address",
        Duration::from_secs(10),
        || get(web_port).is_ok_and(|r| r.status == 200),
    );
    assert_eq!(get(web_port).unwrap().body, "reviews");
    // The egress port's TCP listener forwards to db's one port.
    assert_eq!(get(egress_tcp).unwrap().body, "db");
    let listeners = envoy_dump(
        &envoy,
        "dynamic_listeners",
        &["active_state", "listener"],
        "name",
    );
    for port in [web_port, egress_tcp, db_port] {
        let l = &listeners[&format!("127.0.0.1_{port}")];
        assert_eq!(l["address"]["socket_address"]["address"], "127.0.0.1");
    }
    // Nothing listens on the proxy's own address.
    assert!(http_get(&format!("{}:{web_port}", envoy.ip), "reviews", "/", &[]).is_err());
    let rejected = envoy.rejected_updates();
    assert!(rejected.is_empty(), "{rejected:?}");
}

/// A Sidecar's `egressProxy` takes the traffic ALLOW_ANY would send to its original
/// destination: a request for a host outside the registry reaches the egress proxy's
/// service, and stops reaching it when the Sidecar drops the proxy.
#[test]
fn a_sidecar_egress_proxy_receives_requests_for_unknown_hosts() {
    let (reviews, egress) = (Upstream::start("reviews"), Upstream::start("egress-gw"));
    let dir = temp_dir("egress-proxy").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let (web_port, egress_port) = (free_port(), free_port());
    let write = |file: &str, text: String| std::fs::write(dir.join(file), text).unwrap();
    write(
        "reviews.yaml",
        service_yaml("shop", "reviews", web_port, &[(&reviews, &[])]),
    );
    write(
        "egress.yaml",
        service_yaml("shop", "egress", egress_port, &[(&egress, &[])]),
    );
    let sidecar = |policy: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: default, namespace: shop}}\nspec:\n  outboundTrafficPolicy: {policy}\n  egress: [{{hosts: [./*]}}]\n"
        )
    };
    let via_proxy = format!(
        "{{mode: ALLOW_ANY, egressProxy: {{host: egress.shop.svc.cluster.local, port: {{number: {egress_port}}}}}}}"
    );
    write("sidecar.yaml", sidecar(&via_proxy));
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "web");
    let get = |host: &str| http_get(&format!("{}:{web_port}", envoy.ip), host, "/", &[]);
    wait_until(
        "reviews through the sidecar",
        Duration::from_secs(10),
        || get("reviews").is_ok_and(|r| r.body == "reviews"),
    );
    let unknown = get("api.example.com").unwrap();
    assert_eq!((unknown.status, unknown.body.as_str()), (200, "egress-gw"));
    // REGISTRY_ONLY instead: refused at the catch-all.
    write("sidecar.yaml", sidecar("{mode: REGISTRY_ONLY}"));
    wait_until(
        "the egress proxy to be dropped",
        Duration::from_secs(10),
        || get("api.example.com").is_ok_and(|r| r.status == 502),
    );
    assert_eq!(get("reviews").unwrap().body, "reviews");
}

/// One host declared by a public ServiceEntry and by one private to each of two
/// namespaces, each entry pointing at its own upstream: each sidecar reaches the entry its
/// namespace gets (istiod's SidecarScope: its own before a public one), a namespace with
/// none reaches the public entry, and deleting a namespace's own entry moves it to the
/// public one.
#[test]
fn each_namespace_reaches_its_own_service_entry_of_a_shared_host() {
    let dir = temp_dir("shared-host").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let entries = [("shared", "'*'"), ("team-a", "'.'"), ("team-b", "'.'")];
    let upstreams: Vec<Upstream> = entries.iter().map(|(ns, _)| Upstream::start(ns)).collect();
    for (day, ((ns, export), up)) in entries.iter().zip(&upstreams).enumerate() {
        std::fs::write(
            dir.join(format!("{ns}.yaml")),
            format!(
                "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: partner, namespace: {ns}, creationTimestamp: '2024-01-0{}T00:00:00Z'}}\nspec:\n  hosts: [api.partner.example]\n  exportTo: [{export}]\n  location: MESH_EXTERNAL\n  resolution: STATIC\n  ports: [{{number: {port}, name: http, protocol: HTTP}}]\n  endpoints: [{{address: 127.0.0.1, ports: {{http: {}}}}}]\n",
                day + 1,
                up.port
            ),
        )
        .unwrap();
    }
    let meshd = Meshd::start(&dir);
    let a = Envoy::sidecar(&meshd, Ads::Delta, "team-a", "client");
    let b = Envoy::sidecar(&meshd, Ads::Sotw, "team-b", "client");
    let other = Envoy::sidecar(&meshd, Ads::Delta, "elsewhere", "client");
    let reached = |envoy: &Envoy| {
        let address = format!("{}:{port}", envoy.ip);
        http_get(&address, "api.partner.example", "/", &[])
            .ok()
            .filter(|r| r.status == 200)
            .map(|r| r.body)
    };
    for (envoy, upstream) in [(&a, "team-a"), (&b, "team-b"), (&other, "shared")] {
        wait_until(
            &format!("{} to reach {upstream}'s entry", envoy.id),
            Duration::from_secs(15),
            || reached(envoy).as_deref() == Some(upstream),
        );
    }
    // Every entry is a service of the registry.
    assert_eq!(meshd.metric("pilot_services"), 3.0);

    std::fs::remove_file(dir.join("team-a.yaml")).unwrap();
    wait_until(
        "team-a to fall back to the public entry",
        Duration::from_secs(15),
        || reached(&a).as_deref() == Some("shared"),
    );
    assert_eq!(reached(&b).as_deref(), Some("team-b"));
    for envoy in [&a, &b, &other] {
        assert_eq!(
            envoy.rejected_updates(),
            Vec::<String>::new(),
            "{}",
            envoy.id
        );
    }
}

/// Two ServiceEntries of one host and namespace, each with its own port and upstream, as
/// teams split an API's HTTP ports: a sidecar reaches both ports (istiod merges the ports
/// of such entries), and loses the second with its entry.
#[test]
fn ports_of_alike_service_entries_of_one_host_are_merged() {
    let dir = temp_dir("merged-host").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let ports = [free_port(), free_port()];
    let upstreams = [Upstream::start("v1"), Upstream::start("v2")];
    for (i, (port, up)) in ports.iter().zip(&upstreams).enumerate() {
        std::fs::write(
            dir.join(format!("{}.yaml", up.name)),
            format!(
                "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: partner-{}, namespace: shop, creationTimestamp: '2024-01-0{}T00:00:00Z'}}\nspec:\n  hosts: [api.partner.example]\n  location: MESH_EXTERNAL\n  resolution: STATIC\n  ports: [{{number: {port}, name: http-{}, protocol: HTTP}}]\n  endpoints: [{{address: 127.0.0.1, ports: {{http-{}: {}}}}}]\n",
                up.name,
                i + 1,
                up.name,
                up.name,
                up.port
            ),
        )
        .unwrap();
    }
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "client");
    let reached = |port: u16| {
        http_get(
            &format!("{}:{port}", envoy.ip),
            "api.partner.example",
            "/",
            &[],
        )
        .ok()
        .filter(|r| r.status == 200)
        .map(|r| r.body)
    };
    for (port, up) in ports.iter().zip(["v1", "v2"]) {
        wait_until(
            &format!("port {port} to reach {up}"),
            Duration::from_secs(15),
            || reached(*port).as_deref() == Some(up),
        );
    }
    std::fs::remove_file(dir.join("v2.yaml")).unwrap();
    wait_until("the second port to go", Duration::from_secs(15), || {
        reached(ports[1]).is_none()
    });
    assert_eq!(reached(ports[0]).as_deref(), Some("v1"));
    assert_eq!(envoy.rejected_updates(), Vec::<String>::new());
}
