//! An Envoy ingress gateway configured by Gateway + VirtualService.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::harness::*;

/// A Gateway on port 80, and the gateway's own Service mapping 80 to the port the test's
/// Envoy really listens on (istiod's targetPort translation).
pub fn gateway_yaml(listen_port: u16) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: web, namespace: shop}}\nspec:\n  selector: {{istio: ingressgateway}}\n  servers:\n  - port: {{number: 80, name: http, protocol: HTTP}}\n    hosts: [\"*\"]\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: istio-ingressgateway, namespace: istio-system}}\nspec:\n  selector: {{istio: ingressgateway}}\n  ports: [{{name: http2, port: 80, targetPort: {listen_port}}}]\n"
    )
}

pub fn front_vs(prefix_routes: &[(&str, &str)]) -> String {
    let mut out = String::from(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: front, namespace: shop}\nspec:\n  hosts: [\"*\"]\n  gateways: [web]\n  http:\n",
    );
    for (prefix, host) in prefix_routes {
        out.push_str(&format!("  - match: [{{uri: {{prefix: {prefix}}}}}]\n    route: [{{destination: {{host: {host}}}}}]\n"));
    }
    out
}

/// meshd with a gateway and two services, productpage and reviews.
pub struct GatewayMesh {
    pub meshd: Meshd,
    pub envoy: Envoy,
    pub addr: String,
    pub _upstreams: Vec<Upstream>,
}

pub fn gateway_mesh(name: &str, ads: Ads, routes: &[(&str, &str)]) -> GatewayMesh {
    gateway_mesh_with_env(name, ads, routes, &[])
}

/// [`gateway_mesh`] with meshd started with `env`.
pub fn gateway_mesh_with_env(
    name: &str,
    ads: Ads,
    routes: &[(&str, &str)],
    env: &[(&str, &str)],
) -> GatewayMesh {
    let dir = temp_dir(name).join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let product = Upstream::start("productpage");
    let reviews = Upstream::start("reviews");
    let port = free_port();
    std::fs::write(
        dir.join("services.yaml"),
        format!(
            "{}---\n{}",
            service_yaml("shop", "productpage", 9080, &[(&product, &[])]),
            service_yaml("shop", "reviews", 9080, &[(&reviews, &[])])
        ),
    )
    .unwrap();
    std::fs::write(dir.join("gateway.yaml"), gateway_yaml(port)).unwrap();
    std::fs::write(dir.join("front.yaml"), front_vs(routes)).unwrap();
    let meshd = Meshd::start_with_env(&dir, &[], env);
    let envoy = Envoy::gateway(&meshd, ads, name);
    let addr = format!("127.0.0.1:{port}");
    wait_until("the gateway to route", Duration::from_secs(10), || {
        http_get(&addr, "shop.example.com", routes[0].0, &[]).is_ok_and(|r| r.status == 200)
    });
    GatewayMesh {
        meshd,
        envoy,
        addr,
        _upstreams: vec![product, reviews],
    }
}

#[test]
fn gateway_routes_by_path_prefix_to_two_services() {
    let m = gateway_mesh(
        "gw-prefix",
        Ads::Delta,
        &[("/productpage", "productpage"), ("/reviews", "reviews")],
    );
    let get = |path| http_get(&m.addr, "shop.example.com", path, &[]).unwrap();
    assert_eq!(get("/productpage").body, "productpage");
    assert_eq!(get("/reviews/1").body, "reviews");
    assert_eq!(get("/reviews/1").headers["x-path"], "/reviews/1");
    assert_eq!(get("/elsewhere").status, 404, "no route matches");
    let sync = m.meshd.syncz(&m.envoy.id);
    assert_eq!(sync["delta"], true);
    for t in ["cds", "eds", "lds", "rds"] {
        assert_eq!(
            sync["types"][t]["nonce_sent"], sync["types"][t]["nonce_acked"],
            "{t} not ACKed: {sync}"
        );
    }
    assert_eq!(m.meshd.metric("pilot_xds_clients"), 1.0);
    assert_eq!(m.meshd.metric("pilot_total_xds_rejects{type=\"rds\"}"), 0.0);

    // A second EndpointSlice for reviews: an endpoint change alone, which reaches the
    // gateway as endpoints, its listeners and routes kept (and not sent again).
    let pushes = |t: &str| m.meshd.pushes(t);
    let (lds, rds, eds) = (pushes("lds"), pushes("rds"), pushes("eds"));
    let second = Upstream::start("reviews-2");
    m.meshd.write(
        "reviews-2.yaml",
        &format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: reviews-2, namespace: shop, labels: {{kubernetes.io/service-name: reviews}}}}\naddressType: IPv4\nports: [{{name: http, port: {}}}]\nendpoints:\n- addresses: [127.0.0.1]\n  conditions: {{ready: true}}\n",
            second.port
        ),
    );
    wait_until("the new endpoint to serve", Duration::from_secs(10), || {
        get("/reviews/1").body == "reviews-2"
    });
    assert_eq!(get("/productpage").body, "productpage");
    assert_eq!((pushes("lds"), pushes("rds")), (lds, rds));
    assert!(pushes("eds") > eds);
}

#[test]
fn a_live_edit_of_a_virtual_service_changes_routing_within_two_seconds_without_failures() {
    let m = gateway_mesh("gw-live", Ads::Delta, &[("/api", "productpage")]);
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::new(Mutex::new(Vec::<(Instant, String)>::new()));
    let sent = Arc::new(AtomicUsize::new(0));
    let worker = {
        let (stop, failures, seen, sent, addr) = (
            stop.clone(),
            failures.clone(),
            seen.clone(),
            sent.clone(),
            m.addr.clone(),
        );
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                sent.fetch_add(1, Ordering::Relaxed);
                match http_get(&addr, "shop.example.com", "/api/items", &[]) {
                    Ok(r) if r.status == 200 => seen.lock().unwrap().push((Instant::now(), r.body)),
                    Ok(r) => failures
                        .lock()
                        .unwrap()
                        .push(format!("status {} {}", r.status, r.body)),
                    Err(e) => failures.lock().unwrap().push(e.to_string()),
                }
            }
        })
    };
    thread::sleep(Duration::from_millis(500));
    let edited = Instant::now();
    m.meshd
        .write("front.yaml", &front_vs(&[("/api", "reviews")]));
    wait_until("the edit to take effect", Duration::from_secs(5), || {
        seen.lock()
            .unwrap()
            .iter()
            .any(|(_, body)| body == "reviews")
    });
    thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    worker.join().unwrap();
    let seen = seen.lock().unwrap();
    let first_new = seen.iter().find(|(_, b)| b == "reviews").unwrap().0;
    let switch = first_new.duration_since(edited);
    assert!(
        switch <= Duration::from_secs(2),
        "routing changed after {switch:?}"
    );
    let after: Vec<_> = seen.iter().filter(|(t, _)| *t > first_new).collect();
    assert!(
        after.iter().all(|(_, b)| b == "reviews"),
        "traffic flapped back after the switch"
    );
    assert!(
        seen.len() > 20,
        "too few requests to mean anything: {}",
        seen.len()
    );
    assert!(
        failures.lock().unwrap().is_empty(),
        "failed requests during the change: {:?}",
        failures.lock().unwrap()
    );
}

/// With `MESHD_ENABLE_VHDS` a delta gateway gets its route configuration `http.PORT` as a
/// shell and each of its virtual hosts over VHDS: an edit of a VirtualService, or a new
/// host, reaches it as virtual hosts alone, with no RDS push.
#[test]
fn with_vhds_a_gateway_gets_virtual_service_edits_as_virtual_hosts() {
    let m = gateway_mesh_with_env(
        "gw-vhds",
        Ads::Delta,
        &[("/api", "productpage")],
        &[("MESHD_ENABLE_VHDS", "true")],
    );
    let get = |host: &str| {
        http_get(&m.addr, host, "/api/items", &[])
            .map(|r| r.body)
            .unwrap_or_default()
    };
    assert_eq!(get("shop.example.com"), "productpage");
    let port = m.addr.rsplit(':').next().unwrap();
    let routes = m.envoy.config_dump("dynamic_route_configs");
    assert!(routes.contains("\"vhds\""), "{routes}");
    assert!(
        routes.contains(&format!("\"http.{port}/*:80\"")),
        "{routes}"
    );
    let pushes = |t: &str| m.meshd.pushes(t);
    let (rds, vhds) = (pushes("rds"), pushes("vhds"));

    // The VirtualService is edited: one virtual host goes, no route configuration.
    m.meshd
        .write("front.yaml", &front_vs(&[("/api", "reviews")]));
    wait_until("the edit", Duration::from_secs(10), || {
        get("shop.example.com") == "reviews"
    });
    assert_eq!((pushes("rds"), pushes("vhds")), (rds, vhds + 1.0));

    // A VirtualService for a host of its own: a virtual host added beside the other.
    m.meshd.write(
        "api.yaml",
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: api, namespace: shop}\nspec:\n  hosts: [api.example.com]\n  gateways: [web]\n  http:\n  - route: [{destination: {host: productpage}}]\n",
    );
    wait_until("the new host", Duration::from_secs(10), || {
        get("api.example.com") == "productpage"
    });
    assert_eq!(get("shop.example.com"), "reviews");
    assert_eq!(pushes("rds"), rds, "the route configuration was not resent");
    // meshd's config_dump shows the gateway's route configuration as Envoy holds it.
    let field = &["route_config"][..];
    let ours = m
        .meshd
        .json(&format!("/debug/config_dump?proxyID={}", m.envoy.id));
    assert_eq!(
        envoy_dump(&m.envoy, "dynamic_route_configs", field, "name"),
        meshd_dump(&ours, "dynamic_route_configs", field, "name")
    );
    let synced = m.meshd.syncz(&m.envoy.id);
    assert_eq!(synced["types"]["vhds"]["rejects"], 0, "{synced}");
}

/// A Gateway TCP server and a VirtualService `tcp` route bound to it: the gateway listens
/// on the server's port and forwards every connection to the route's service (an HTTP
/// upstream, whose answer passes through unchanged). Once the route's match names another
/// port, no route fits the server and its listener goes away, as with istiod.
#[test]
fn a_gateway_tcp_server_forwards_connections_where_its_route_says() {
    let dir = temp_dir("gw-tcp").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let db = Upstream::start("db");
    let (db_port, listen) = (free_port(), free_port());
    std::fs::write(
        dir.join("db.yaml"),
        service_yaml("shop", "db", db_port, &[(&db, &[])]).replace("{name: http,", "{name: tcp,"),
    )
    .unwrap();
    std::fs::write(
        dir.join("gateway.yaml"),
        format!(
            "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: tcp-gw, namespace: shop}}\nspec:\n  selector: {{istio: ingressgateway}}\n  servers:\n  - port: {{number: {listen}, name: tcp, protocol: TCP}}\n    hosts: [\"*\"]\n"
        ),
    )
    .unwrap();
    let vs = |match_port: u16| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: db, namespace: shop}}\nspec:\n  hosts: [\"*\"]\n  gateways: [tcp-gw]\n  tcp:\n  - match: [{{port: {match_port}}}]\n    route: [{{destination: {{host: db, port: {{number: {db_port}}}}}}}]\n"
        )
    };
    std::fs::write(dir.join("vs.yaml"), vs(listen)).unwrap();
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::gateway(&meshd, Ads::Delta, "gw-tcp");
    let addr = format!("127.0.0.1:{listen}");
    wait_until(
        "the gateway to forward to db",
        Duration::from_secs(10),
        || http_get(&addr, "anything", "/", &[]).is_ok_and(|r| r.body == "db"),
    );
    let listeners = envoy.admin("/listeners").unwrap().body;
    assert!(
        listeners.contains(&format!("0.0.0.0_{listen}")),
        "{listeners}"
    );
    std::fs::write(dir.join("vs.yaml"), vs(listen - 1)).unwrap();
    wait_until(
        "the server's listener to go",
        Duration::from_secs(10),
        || {
            !envoy
                .admin("/listeners")
                .unwrap()
                .body
                .contains(&format!("0.0.0.0_{listen}"))
        },
    );
}

/// Istio's VirtualService delegation: the gateway's root VirtualService in shop hands
/// `/reviews` to a VirtualService without hosts in the reviews team's namespace. The
/// team's routes apply within the root's prefix (`/reviews/` to reviews with the team's
/// response header, the rest of `/reviews` to productpage); a team route outside it
/// (`/other`) is dropped, as istiod drops it. Without delegation the root route would
/// route nowhere and `/reviews/1` would get 404.
#[test]
fn a_root_virtual_service_delegates_a_path_to_another_teams_virtual_service() {
    let m = gateway_mesh(
        "gw-delegate",
        Ads::Delta,
        &[("/productpage", "productpage")],
    );
    let dir = &m.meshd.config_dir;
    std::fs::write(
        dir.join("team.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: team}\nspec:\n  http:\n  - match: [{uri: {prefix: /reviews/}}]\n    headers: {response: {set: {x-team: reviews}}}\n    route: [{destination: {host: reviews.shop.svc.cluster.local}}]\n  - match: [{uri: {prefix: /other}}]\n    route: [{destination: {host: reviews.shop.svc.cluster.local}}]\n  - route: [{destination: {host: productpage.shop.svc.cluster.local}}]\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("front.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: front, namespace: shop}\nspec:\n  hosts: [\"*\"]\n  gateways: [web]\n  http:\n  - match: [{uri: {prefix: /reviews}}]\n    delegate: {name: reviews, namespace: team}\n  - match: [{uri: {prefix: /productpage}}]\n    route: [{destination: {host: productpage}}]\n",
    )
    .unwrap();
    let get = |path| http_get(&m.addr, "shop.example.com", path, &[]).unwrap();
    wait_until("the delegated routes", Duration::from_secs(10), || {
        get("/reviews/1").status == 200
    });
    let r = get("/reviews/1");
    assert_eq!(
        (r.body.as_str(), r.headers.get("x-team").map(String::as_str)),
        ("reviews", Some("reviews"))
    );
    let r = get("/reviews");
    assert_eq!((r.status, r.body.as_str()), (200, "productpage"));
    assert!(!r.headers.contains_key("x-team"));
    assert_eq!(get("/other").status, 404, "outside the root's match");
    assert_eq!(get("/productpage").body, "productpage");
}

/// AuthorizationPolicies selecting a gateway guard its listeners, as istiod's do: a DENY
/// rule on a path refuses it, an ALLOW policy refuses what it does not list, and removing
/// the policies opens the gateway again.
#[test]
fn authorization_policies_guard_the_gateway() {
    let m = gateway_mesh(
        "gw-authz",
        Ads::Delta,
        &[("/productpage", "productpage"), ("/reviews", "reviews")],
    );
    let status =
        |path: &str| http_get(&m.addr, "shop.example.com", path, &[]).map_or(0, |r| r.status);
    let policy = |action: &str, path: &str| {
        format!(
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: front, namespace: istio-system}}\nspec:\n  selector: {{matchLabels: {{istio: ingressgateway}}}}\n  action: {action}\n  rules: [{{to: [{{operation: {{paths: [\"{path}\"]}}}}]}}]\n"
        )
    };
    m.meshd.write("authz.yaml", &policy("DENY", "/reviews*"));
    wait_until(
        "the gateway to deny /reviews",
        Duration::from_secs(10),
        || status("/reviews") == 403,
    );
    assert_eq!(status("/productpage"), 200);
    m.meshd
        .write("authz.yaml", &policy("ALLOW", "/productpage*"));
    wait_until(
        "the ALLOW policy to take over",
        Duration::from_secs(10),
        || status("/productpage") == 200 && status("/reviews") == 403,
    );
    assert_eq!(
        status("/other"),
        403,
        "an ALLOW policy refuses what it does not list"
    );
    m.meshd.write("authz.yaml", "");
    wait_until("the gateway to open", Duration::from_secs(10), || {
        status("/reviews") == 200
    });
}

/// A Gateway HTTP server with `tls.httpsRedirect` (the usual port-80 half of an HTTPS
/// gateway): the real Envoy answers a plaintext request with a 301 to the same URL over
/// HTTPS, for a routed host and for one of the server's hosts no VirtualService routes;
/// without the flag the request is routed again.
#[test]
fn an_https_redirect_server_redirects_plaintext_requests() {
    let m = gateway_mesh("gw-redirect", Ads::Delta, &[("/", "productpage")]);
    let listen_port = m.addr.rsplit(':').next().unwrap().parse().unwrap();
    let gateway = gateway_yaml(listen_port);
    let redirecting = gateway.replacen(
        "    hosts: [\"*\"]\n",
        "    hosts: [\"*\"]\n    tls: {httpsRedirect: true}\n  - port: {number: 80, name: http-legacy, protocol: HTTP}\n    hosts: [legacy.example.com]\n    tls: {httpsRedirect: true}\n",
        1,
    );
    assert_ne!(redirecting, gateway);
    m.meshd.write("gateway.yaml", &redirecting);
    let get = |host| http_get(&m.addr, host, "/productpage?x=1", &[]).unwrap();
    wait_until("the gateway to redirect", Duration::from_secs(10), || {
        get("shop.example.com").status == 301
    });
    let moved = get("shop.example.com");
    assert_eq!(
        moved.headers["location"],
        "https://shop.example.com/productpage?x=1"
    );
    assert_eq!(get("legacy.example.com").status, 301);
    assert_eq!(m.envoy.rejected_updates(), Vec::<String>::new());

    m.meshd.write("gateway.yaml", &gateway);
    wait_until(
        "the gateway to route again",
        Duration::from_secs(10),
        || get("shop.example.com").status == 200,
    );
    assert_eq!(get("shop.example.com").body, "productpage");
}

/// A route destination's own `headers`, as istiod applies them: a single destination's
/// join the route's (its `host` a host rewrite, as Envoy lets no route set that header),
/// each weighted destination's go with its cluster. Before, meshd left them out, and a
/// `host` among a route's headers made Envoy refuse the whole route configuration.
#[test]
fn a_destinations_headers_go_with_its_traffic() {
    let m = gateway_mesh(
        "gw-dest-headers",
        Ads::Delta,
        &[("/productpage", "productpage")],
    );
    let dest = |host: &str, weight: u32, tag: &str| {
        format!(
            "{{destination: {{host: {host}}}, weight: {weight}, headers: {{request: {{set: {{host: {host}.internal}}}}, response: {{set: {{x-dest: {tag}}}}}}}}}"
        )
    };
    m.meshd.write(
        "front.yaml",
        &format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: front, namespace: shop}}\nspec:\n  hosts: [\"*\"]\n  gateways: [web]\n  http:\n  - match: [{{uri: {{prefix: /one}}}}]\n    headers: {{request: {{set: {{host: one.example}}}}, response: {{set: {{x-route: one}}}}}}\n    route: [{}]\n  - match: [{{uri: {{prefix: /split}}}}]\n    route: [{}, {}]\n  - match: [{{uri: {{prefix: /productpage}}}}]\n    route: [{{destination: {{host: productpage}}}}]\n",
            dest("reviews", 100, "single"),
            dest("productpage", 50, "productpage"),
            dest("reviews", 50, "reviews"),
        ),
    );
    let get = |path| http_get(&m.addr, "shop.example.com", path, &[]).unwrap();
    wait_until("the routes with headers", Duration::from_secs(10), || {
        get("/one").status == 200
    });
    let one = get("/one");
    let header = |r: &HttpResponse, name: &str| r.headers.get(name).cloned().unwrap_or_default();
    assert_eq!(
        (
            one.body.as_str(),
            header(&one, "x-route").as_str(),
            header(&one, "x-dest").as_str()
        ),
        ("reviews", "one", "single")
    );
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let r = get("/split");
        assert_eq!(header(&r, "x-dest"), r.body, "each cluster's own header");
        seen.insert(r.body);
    }
    assert_eq!(seen.len(), 2, "both destinations: {seen:?}");
}

/// MeshConfig `defaultConfig.gatewayTopology`, as Istio documents it for a gateway behind
/// a load balancer: with `numTrustedProxies: 1` the client is the address the load
/// balancer put in `x-forwarded-for`, which an AuthorizationPolicy's `remoteIpBlocks`
/// then matches; with `proxyProtocol` the client is the PROXY protocol header's source.
#[test]
fn a_gateways_topology_decides_which_client_address_it_trusts() {
    let m = gateway_mesh("gw-topology", Ads::Delta, &[("/", "productpage")]);
    let client = "203.0.113.7";
    m.meshd.write(
        "authz.yaml",
        &format!("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: block, namespace: istio-system}}\nspec:\n  selector: {{matchLabels: {{istio: ingressgateway}}}}\n  action: DENY\n  rules:\n  - from: [{{source: {{remoteIpBlocks: [{client}/32]}}}}]\n  - to: [{{operation: {{paths: [/blocked]}}}}]\n"),
    );
    let forwarded_for = |xff: &str| {
        http_get(
            &m.addr,
            "shop.example.com",
            "/",
            &[("x-forwarded-for", xff)],
        )
        .map_or(0, |r| r.status)
    };
    wait_until("the policy to apply", Duration::from_secs(10), || {
        http_get(&m.addr, "shop.example.com", "/blocked", &[]).is_ok_and(|r| r.status == 403)
    });
    // Trusting no hop, the client is the connection's peer: the header is not believed.
    let served = |xff: &str| forwarded_for(xff) == 200;
    wait_until(
        "the header not to be believed",
        Duration::from_secs(10),
        || served(client),
    );
    let deny = || forwarded_for(client) == 403;
    m.meshd.write(
        "mesh.yaml",
        &mesh_configmap("defaultConfig:\n  gatewayTopology: {numTrustedProxies: 1}"),
    );
    wait_until(
        "the gateway to trust one hop",
        Duration::from_secs(10),
        deny,
    );
    wait_until("another client to pass", Duration::from_secs(10), || {
        served("198.51.100.1")
    });
    // Behind a PROXY protocol load balancer: the header names the client.
    m.meshd.write(
        "mesh.yaml",
        &mesh_configmap("defaultConfig:\n  gatewayTopology: {proxyProtocol: {}}"),
    );
    let port = m.addr.rsplit(':').next().unwrap();
    let behind = |source: &str| {
        let header = format!("PROXY TCP4 {source} 127.0.0.1 40000 {port}\r\n");
        raw_http(&m.addr, &header).map_or(0, |r| r.status)
    };
    wait_until(
        "the gateway to read the PROXY protocol",
        Duration::from_secs(10),
        || behind(client) == 403,
    );
    wait_until("another client to pass", Duration::from_secs(10), || {
        behind("198.51.100.1") == 200
    });
    assert_eq!(forwarded_for(client), 0, "a connection without the header");
}

/// One HTTP/1.1 `GET /` to `shop.example.com`, after the bytes of `preamble`.
fn raw_http(addr: &str, preamble: &str) -> std::io::Result<HttpResponse> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let request = "GET / HTTP/1.1\r\nHost: shop.example.com\r\nConnection: close\r\n\r\n";
    stream.write_all(format!("{preamble}{request}").as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_response(&raw)
}

/// MeshConfig `defaultConfig.proxyHeaders` at a real Envoy gateway: the `server` header
/// takes its value, or the application's when disabled, and the `x-envoy-*` debug
/// headers go when they are disabled; the application's `x-envoy-attempt-count` goes with
/// `attemptCount` disabled, and a rewritten authority's original value reaches it in
/// `x-forwarded-host` with `xForwardedHost` enabled.
#[test]
fn proxy_headers_decide_the_server_and_debug_headers_of_responses() {
    let m = gateway_mesh("gw-headers", Ads::Delta, &[("/", "productpage")]);
    // A response's (server, whether it has x-envoy-upstream-service-time); `None` for a
    // request that failed, which the waits below try again.
    let seen = || {
        let r = http_get(&m.addr, "shop.example.com", "/", &[]).ok()?;
        let debug = r.headers.contains_key("x-envoy-upstream-service-time");
        Some((r.headers.get("server").cloned(), debug))
    };
    let until = |what: &str, server: Option<&str>, debug: bool| {
        wait_until(what, Duration::from_secs(10), || {
            seen().is_some_and(|(s, d)| s.as_deref() == server && d == debug)
        });
    };
    until(
        "istio-envoy and the debug headers",
        Some("istio-envoy"),
        true,
    );
    m.meshd.write(
        "mesh.yaml",
        &mesh_configmap(
            "defaultConfig:\n  proxyHeaders: {server: {value: edge}, envoyDebugHeaders: {disabled: true}}",
        ),
    );
    until("edge without the debug headers", Some("edge"), false);
    m.meshd.write(
        "mesh.yaml",
        &mesh_configmap("defaultConfig:\n  proxyHeaders: {server: {disabled: true}}"),
    );
    // The upstream sends no `server` header, so none reaches the client.
    until("no server header, the debug headers back", None, true);

    // `attemptCount` and `xForwardedHost` live in the gateway's virtual hosts: the
    // application sees `x-envoy-attempt-count` unless it is disabled, and, where a route
    // rewrites the authority, the original host in `x-forwarded-host` once it is enabled.
    m.meshd.write(
        "front.yaml",
        &front_vs(&[("/", "productpage")]).replace(
            "  - match: [{uri: {prefix: /}}]",
            "  - match: [{uri: {prefix: /rw}}]\n    rewrite: {authority: rewritten.example.com}\n    route: [{destination: {host: productpage}}]\n  - match: [{uri: {prefix: /}}]",
        ),
    );
    let echoed = |path: &str| {
        let r = http_get(&m.addr, "shop.example.com", path, &[]).ok()?;
        let h = |name: &str| r.headers.get(name).cloned().unwrap_or_default();
        Some((h("x-echo-attempt-count"), h("x-echo-forwarded-host")))
    };
    let until_echoed = |what: &str, path: &str, attempts: &str, host: &str| {
        wait_until(what, Duration::from_secs(10), || {
            echoed(path) == Some((attempts.to_string(), host.to_string()))
        });
    };
    until_echoed("the attempt count, no x-forwarded-host", "/rw", "1", "");
    m.meshd.write(
        "mesh.yaml",
        &mesh_configmap(
            "defaultConfig:\n  proxyHeaders: {attemptCount: {disabled: true}, xForwardedHost: {enabled: true}}",
        ),
    );
    until_echoed(
        "no attempt count, the original host",
        "/rw",
        "",
        "shop.example.com",
    );
    // A route without a rewrite keeps the host, so it appends nothing.
    assert_eq!(echoed("/"), Some((String::new(), String::new())));
}
