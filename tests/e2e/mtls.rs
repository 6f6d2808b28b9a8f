//! Mutual TLS and policy with real Envoys bootstrapped by `meshd agent`: identities from
//! meshd's CA over SDS, xDS over the secure port, auto mTLS between workloads,
//! PeerAuthentication deciding what a plaintext client gets, AuthorizationPolicy allowing
//! one caller and denying another, and certificates rotating under live traffic.

use std::time::{Duration, Instant};

use crate::harness::*;

pub struct Mesh {
    pub meshd: Meshd,
    pub server_ip: String,
    _upstream: Upstream,
}

const TOKENS: &str = "pp-token shop productpage\nrv-token shop reviews\nrt-token shop ratings\ndt-token shop details\ngw-token shop gateway\n";

/// A mesh workload `NAME` in shop, as Kubernetes shows it: a Service (`app: NAME`)
/// whose `port` leads to `target` on the pod, the pod `NAME-0` (service account NAME,
/// labelled `security.istio.io/tlsMode: istio`, so clients use mutual TLS) and its
/// endpoint at `ip`.
fn mesh_workload(name: &str, cluster_ip: &str, port: u16, target: u16, ip: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: shop}}
spec: {{clusterIP: {cluster_ip}, selector: {{app: {name}}}, ports: [{{name: http, port: {port}, targetPort: {target}}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}-0, namespace: shop, labels: {{app: {name}, security.istio.io/tlsMode: istio}}}}
spec: {{serviceAccountName: {name}, containers: []}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}-0, namespace: shop, labels: {{kubernetes.io/service-name: {name}}}}}
addressType: IPv4
ports: [{{name: http, port: {target}}}]
endpoints: [{{addresses: [{ip}], conditions: {{ready: true}}, targetRef: {{kind: Pod, name: {name}-0}}}}]
"#
    )
}

/// meshd (local mode, bootstrap tokens) holding a `reviews` workload in `shop` whose
/// Sidecar ingress on 9080 leads to a real HTTP server.
pub fn mesh(name: &str) -> Mesh {
    let dir = temp_dir(name);
    let config = dir.join("config");
    std::fs::create_dir_all(&config).unwrap();
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, TOKENS).unwrap();
    let upstream = Upstream::start("reviews");
    let server_ip = loopback_ip();
    let yaml = format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: shop}}
---
{reviews}---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: reviews, namespace: shop}}
spec:
  workloadSelector: {{labels: {{app: reviews}}}}
  ingress:
  - port: {{number: 9080, protocol: HTTP, name: http}}
    defaultEndpoint: "127.0.0.1:{port}"
"#,
        port = upstream.port,
        reviews = mesh_workload("reviews", "10.96.50.1", 9080, 9080, &server_ip),
    );
    std::fs::write(config.join("mesh.yaml"), yaml).unwrap();
    let meshd = Meshd::start_with(&config, &["--ca-token-file", tokens.to_str().unwrap()]);
    Mesh {
        meshd,
        server_ip,
        _upstream: upstream,
    }
}

impl Mesh {
    /// Points reviews' Sidecar ingress at the application on 127.0.0.1:`port` instead of
    /// the HTTP server, and rewrites the rest of the configuration with `edit`.
    pub fn serve_from(&self, port: u16, edit: impl FnOnce(String) -> String) {
        let path = self.meshd.config_dir.join("mesh.yaml");
        let yaml = std::fs::read_to_string(&path).unwrap();
        let endpoint = (yaml.lines())
            .find_map(|l| l.trim().strip_prefix("defaultEndpoint: "))
            .unwrap()
            .to_string();
        let edited = edit(yaml.replace(&endpoint, &format!("\"127.0.0.1:{port}\"")));
        assert_ne!(yaml, edited);
        std::fs::write(&path, edited).unwrap();
    }

    pub fn reviews(&self, extra: &[&str]) -> Workload {
        Workload::start(
            &self.meshd,
            "shop",
            "reviews",
            "reviews",
            "rv-token",
            &self.server_ip,
            extra,
        )
    }

    pub fn client(&self, sa: &str, token: &str, extra: &[&str]) -> Workload {
        Workload::start(&self.meshd, "shop", sa, sa, token, &loopback_ip(), extra)
    }

    /// A gateway (`router`) in shop, as the service account `gateway`, at `ip`.
    fn gateway(&self, ip: &str, extra: &[&str]) -> Workload {
        let args: Vec<&str> = ["--proxy-type", "router"]
            .iter()
            .chain(extra)
            .copied()
            .collect();
        Workload::start(
            &self.meshd,
            "shop",
            "gateway",
            "gateway",
            "gw-token",
            ip,
            &args,
        )
    }

    /// A client whose requests to reviews are answered (200).
    pub fn client_reaching_reviews(&self, sa: &str, token: &str, extra: &[&str]) -> Workload {
        let client = self.client(sa, token, extra);
        wait_until(
            &format!("{sa} to reach reviews"),
            Duration::from_secs(15),
            || via(&client, "/").is_ok_and(|r| r.status == 200),
        );
        client
    }
}

impl Mesh {
    /// A plaintext request straight to reviews' inbound listener (no client sidecar).
    fn direct(&self) -> std::io::Result<HttpResponse> {
        http_get(
            &format!("{}:9080", self.server_ip),
            "reviews.shop.svc.cluster.local",
            "/",
            &[],
        )
    }
}

/// `client` made TLS handshakes on its cluster for reviews.
fn assert_reached_reviews_over_mtls(client: &Workload) {
    let cluster = "outbound|9080||reviews.shop.svc.cluster.local";
    let handshakes = client
        .envoy
        .stat(&format!("cluster.{cluster};.ssl.handshake"));
    assert!(handshakes > 0, "no TLS handshake on {cluster}");
}

/// A request to reviews through `client`'s outbound listener.
fn via(client: &Workload, path: &str) -> std::io::Result<HttpResponse> {
    http_get(
        &format!("{}:9080", client.envoy.ip),
        "reviews.shop.svc.cluster.local",
        path,
        &[],
    )
}

fn pa(mode: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {{name: default, namespace: shop}}\nspec: {{mtls: {{mode: {mode}}}}}\n"
    )
}

#[test]
fn two_workloads_talk_mutual_tls_and_peer_authentication_decides_about_plaintext() {
    let m = mesh("mtls-basic");
    let _server = m.reviews(&[]);
    let client = m.client_reaching_reviews("productpage", "pp-token", &[]);
    let r = via(&client, "/").unwrap();
    assert_eq!(r.body, "reviews");
    let xfcc = &r.headers["x-echo-xfcc"];
    assert!(
        xfcc.contains("URI=spiffe://cluster.local/ns/shop/sa/productpage"),
        "the server sees the client's identity: {xfcc:?}"
    );
    assert_reached_reviews_over_mtls(&client);

    // PERMISSIVE (no policy): a plaintext client is served too, with no identity.
    let direct = || m.direct();
    let plain = direct().unwrap();
    assert_eq!(plain.status, 200);
    assert_eq!(plain.headers["x-echo-xfcc"], "");

    // STRICT: plaintext is refused, mTLS still works.
    m.meshd.write("pa.yaml", &pa("STRICT"));
    wait_until(
        "STRICT to refuse plaintext",
        Duration::from_secs(10),
        || direct().is_err(),
    );
    assert_eq!(via(&client, "/").unwrap().status, 200);

    // Back to PERMISSIVE.
    m.meshd.write("pa.yaml", &pa("PERMISSIVE"));
    wait_until(
        "PERMISSIVE to accept plaintext",
        Duration::from_secs(10),
        || direct().is_ok_and(|r| r.status == 200),
    );
    assert_eq!(via(&client, "/").unwrap().status, 200);

    // Envoy's xDS connection to the secure port is TLS 1.3, so the policy changes above
    // reached it through meshd's own record layer (`tls::records`), not rustls's.
    assert!(
        client.envoy.stat("cluster.xds-grpc.ssl.versions.TLSv1.3") >= 1,
        "xDS over TLS 1.3: {}",
        client
            .envoy
            .admin("/stats?filter=xds-grpc.ssl")
            .unwrap()
            .body
    );

    // The effective mode per port is visible, as istioctl's authn view shows it.
    let authn = m.meshd.json(&format!(
        "/debug/authenticationz?proxyID={}",
        _server.envoy.id
    ));
    assert_eq!(authn["ports"][0]["port"], 9080, "{authn}");
    assert_eq!(authn["ports"][0]["mode"], "PERMISSIVE", "{authn}");
    assert_eq!(authn["ports"][0]["policy"], "shop/default", "{authn}");
}

/// RequestAuthentication on a sidecar's inbound side: the reviews workload's JWT filter
/// (a RequestAuthentication selecting it, its key set inline) refuses a bad token (401)
/// and passes the payload to its AuthorizationPolicy, which lets alice alone in.
#[test]
fn a_workloads_request_authentication_guards_its_inbound_port() {
    use crate::jwt::{ISSUER, Issuer};
    let m = mesh("mtls-jwt");
    let _server = m.reviews(&[]);
    wait_until("reviews' inbound listener", Duration::from_secs(15), || {
        m.direct().is_ok_and(|r| r.status == 200)
    });
    let issuer = Issuer::new();
    m.meshd.write(
        "jwt.yaml",
        &format!(
            "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  selector: {{matchLabels: {{app: reviews}}}}\n  jwtRules:\n  - issuer: {ISSUER}\n    jwks: '{}'\n---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: reviews-users, namespace: shop}}\nspec:\n  selector: {{matchLabels: {{app: reviews}}}}\n  rules:\n  - from: [{{source: {{requestPrincipals: ['{ISSUER}/alice']}}}}]\n",
            issuer.jwks()
        ),
    );
    let with = |token: &str| {
        let auth = format!("Bearer {token}");
        let headers = [("authorization", auth.as_str())];
        let addr = format!("{}:9080", m.server_ip);
        http_get(&addr, "reviews.shop.svc.cluster.local", "/", &headers).map_or(0, |r| r.status)
    };
    let alice = issuer.token("alice", serde_json::json!({}), false);
    wait_until("alice alone to be let in", Duration::from_secs(15), || {
        m.direct().is_ok_and(|r| r.status == 403) && with(&alice) == 200
    });
    assert_eq!(
        with(&issuer.token("bob", serde_json::json!({}), false)),
        403
    );
    assert_eq!(
        with(&Issuer::new().token("alice", serde_json::json!({}), false)),
        401
    );
}

#[test]
fn an_authorization_policy_allows_one_caller_and_denies_another() {
    let m = mesh("mtls-authz");
    let _server = m.reviews(&[]);
    let productpage = m.client_reaching_reviews("productpage", "pp-token", &[]);
    let ratings = m.client_reaching_reviews("ratings", "rt-token", &[]);
    m.meshd.write(
        "authz.yaml",
        r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: reviews-callers, namespace: shop}
spec:
  selector: {matchLabels: {app: reviews}}
  action: ALLOW
  rules:
  - from: [{source: {principals: [cluster.local/ns/shop/sa/productpage]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-admin, namespace: shop}
spec:
  action: DENY
  rules:
  - to: [{operation: {paths: ["/admin*"]}}]
"#,
    );
    // ratings' pooled connection to reviews was opened on the old inbound chain: Envoy
    // drains it with HTTP/2's drain_timeout (5 s) before the caller reconnects, so the
    // denial takes about 5 s, more on a loaded machine.
    wait_until("ratings to be denied", Duration::from_secs(30), || {
        via(&ratings, "/").is_ok_and(|r| r.status == 403)
    });
    let denied = via(&ratings, "/").unwrap();
    assert!(
        denied.body.contains("RBAC: access denied"),
        "{}",
        denied.body
    );
    // (A pooled connection opened before the change drains on the old config first.)
    wait_until(
        "DENY to be evaluated before ALLOW",
        Duration::from_secs(10),
        || via(&productpage, "/admin/users").is_ok_and(|r| r.status == 403),
    );
    assert_eq!(via(&productpage, "/reviews/1").unwrap().status, 200);
    // A plaintext caller has no identity, so no ALLOW rule matches it.
    let plain = http_get(
        &format!("{}:9080", m.server_ip),
        "reviews.shop.svc.cluster.local",
        "/",
        &[],
    )
    .unwrap();
    assert_eq!(plain.status, 403);

    // An unsupported field is refused, and the accepted policies stay in force.
    m.meshd.write(
        "bad-authz.yaml",
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: jwt, namespace: shop}\nspec:\n  rules: [{from: [{source: {requestPrincipals: [\"*\"]}}]}]\n",
    );
    wait_until(
        "the bad policy to be reported",
        Duration::from_secs(5),
        || {
            m.meshd
                .json("/debug/configz")
                .to_string()
                .contains("requestPrincipals")
        },
    );
    assert_eq!(via(&productpage, "/").unwrap().status, 200);
    assert_eq!(via(&ratings, "/").unwrap().status, 403);
}

/// The serial number of the workload certificate an Envoy is using.
fn serial(w: &Workload) -> String {
    let certs: serde_json::Value =
        serde_json::from_str(&w.envoy.admin("/certs").unwrap().body).unwrap();
    certs["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["cert_chain"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["serial_number"].as_str().map(String::from))
        .next()
        .unwrap_or_default()
}

#[test]
fn certificates_rotate_under_live_traffic_without_a_failed_request() {
    let m = mesh("mtls-rotate");
    // 6 s certificates, renewed with half their life left: every ~3 s.
    let short = ["--secret-ttl", "6s", "--secret-grace-period-ratio", "0.5"];
    let server = m.reviews(&short);
    let client = m.client("productpage", "pp-token", &short);
    wait_until("the first mTLS request", Duration::from_secs(10), || {
        via(&client, "/").is_ok_and(|r| r.status == 200)
    });
    let (server_serial, client_serial) = (serial(&server), serial(&client));
    assert!(!server_serial.is_empty() && !client_serial.is_empty());
    let start = Instant::now();
    let mut requests = 0;
    while start.elapsed() < Duration::from_secs(10) {
        let r = via(&client, "/").expect("a request failed during rotation");
        assert_eq!(
            r.status, 200,
            "a request failed during rotation: {}",
            r.body
        );
        requests += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(requests > 100);
    assert_ne!(
        serial(&server),
        server_serial,
        "the server's certificate rotated"
    );
    assert_ne!(
        serial(&client),
        client_serial,
        "the client's certificate rotated"
    );
    let issued = client
        .agent_log()
        .matches("workload certificate issued")
        .count();
    assert!(issued >= 3, "renewed at least twice in 10 s: {issued}");
}

/// With capture, Envoy accepts `virtualInbound` under STRICT and a sniffed port's
/// listeners at both ends: details' own port 7070 has no declared protocol, so its
/// outbound listener on the service address sniffs (with its own route configuration
/// `HOST:PORT`) and virtualInbound has the sniffed mTLS chains for it.
/// The `details` workload of shop with traffic capture (REDIRECT): Envoy binds
/// virtualOutbound (15001) and virtualInbound (15006) for real.
fn captured_details(m: &Mesh) -> Workload {
    Workload::start(
        &m.meshd,
        "shop",
        "details",
        "details",
        "dt-token",
        &loopback_ip(),
        &["--interception-mode", "REDIRECT"],
    )
}

#[test]
fn with_traffic_capture_envoy_accepts_virtual_inbound_under_strict_mtls() {
    let m = mesh("mtls-capture");
    m.meshd.write(
        "details.yaml",
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: details, namespace: shop}}\nspec: {{clusterIP: 10.96.50.2, selector: {{app: details}}, ports: [{{name: http, port: 9080, targetPort: 8080}}, {{name: web, port: 7070}}]}}\n---\n{}",
            pa("STRICT")
        ),
    );
    let details = captured_details(&m);
    let listeners = || details.envoy.config_dump("dynamic_listeners");
    // The workload is up once its certificate is served; its listeners follow over LDS.
    // The proxy may connect before meshd has read details.yaml, so its first
    // virtualInbound can hold only the passthrough chains: wait for the service's chain.
    wait_until(
        "virtualInbound with details' mTLS chain in LDS",
        Duration::from_secs(15),
        || listeners().contains("inbound|8080||-mtls"),
    );
    let dump = listeners();
    assert!(dump.contains("\"virtualInbound\""), "{dump}");
    assert!(
        !dump.contains("inbound|8080||-plaintext"),
        "STRICT: no plaintext chain"
    );
    for sniffed in [
        "inbound|7070||-mtls-http",
        "inbound|7070||-mtls-tcp",
        "\"10.96.50.2_7070\"",
        "envoy.filters.listener.http_inspector",
        "details.shop.svc.cluster.local:7070",
    ] {
        assert!(dump.contains(sniffed), "{sniffed}: {dump}");
    }
    wait_until(
        "the sniffed route configuration",
        Duration::from_secs(10),
        || {
            (details.envoy.config_dump("dynamic_route_configs"))
                .contains("\"name\": \"details.shop.svc.cluster.local:7070\"")
        },
    );
    // No update of any kind (listeners, clusters, route configurations) was rejected.
    let rejected = details.envoy.rejected_updates();
    assert!(rejected.is_empty(), "{rejected:?}");
    let stats = details.envoy.admin("/stats").unwrap().body;
    // (Envoy writes the name's `:` as `_` in stat names.)
    let sniffed_rds = ".rds.details.shop.svc.cluster.local_7070.update_success";
    assert!(
        stats
            .lines()
            .any(|l| l.contains(sniffed_rds) && !l.ends_with(": 0")),
        "{stats}"
    );
    assert!(details.envoy.stat("listener_manager.lds.update_success") > 0);
}

/// A headless Service's port without a protocol, at a sidecar with traffic capture under
/// `REGISTRY_ONLY`: Envoy accepts the shared `0.0.0.0_PORT` listener whose HTTP goes by
/// the port's route configuration and whose other traffic goes to the service's own
/// cluster, as istiod's, not to BlackHoleCluster. The listener is checked, not traffic:
/// capture needs iptables, which these tests do not set up.
#[test]
fn a_captured_sidecars_listener_for_a_headless_sniffed_port_sends_tcp_to_the_service_cluster() {
    let m = mesh("headless-sniffed");
    let kafka = "apiVersion: v1\nkind: Service\nmetadata: {name: kafka, namespace: shop}\nspec: {clusterIP: None, ports: [{name: broker, port: 9092}]}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: kafka-1, namespace: shop, labels: {kubernetes.io/service-name: kafka}}\naddressType: IPv4\nports: [{name: broker, port: 9092}]\nendpoints: [{addresses: [10.0.9.1], conditions: {ready: true}}]\n";
    let registry_only = mesh_configmap("outboundTrafficPolicy: {mode: REGISTRY_ONLY}");
    m.meshd
        .write("kafka.yaml", &format!("{registry_only}\n---\n{kafka}"));
    let client = captured_details(&m);
    let listener = || -> Option<serde_json::Value> {
        let dump = client.envoy.config_dump("dynamic_listeners");
        let dump: serde_json::Value = serde_json::from_str(&dump).ok()?;
        (dump["configs"].as_array()?.iter())
            .map(|c| c["active_state"]["listener"].clone())
            .find(|l| l["name"] == "0.0.0.0_9092")
    };
    wait_until("kafka's listener in LDS", Duration::from_secs(15), || {
        listener().is_some()
    });
    let l = listener().unwrap();
    let default = l["default_filter_chain"].to_string();
    assert!(
        default.contains("outbound|9092||kafka.shop.svc.cluster.local"),
        "{l}"
    );
    let chains = l["filter_chains"].to_string();
    assert!(chains.contains("\"route_config_name\":\"9092\""), "{l}");
    assert_eq!(client.envoy.rejected_updates(), Vec::<String>::new());
}

/// A Gateway server with `tls.mode: ISTIO_MUTUAL` (an east-west or egress gateway's):
/// the gateway, bootstrapped by `meshd agent --proxy-type router`, serves its own workload
/// certificate and requires a mesh client's. productpage's sidecar reaches it with auto
/// mTLS (the gateway's pod is labelled `tlsMode: istio`) and is routed to a plaintext
/// backend; a plaintext client is refused; and a server `subjectAltNames` naming another
/// identity refuses productpage too.
#[test]
fn a_gateway_serves_istio_mutual_to_mesh_clients_only() {
    let m = mesh("mtls-gateway");
    let backend = Upstream::start("backend");
    let (gw_ip, listen) = (loopback_ip(), free_port());
    let gateway = |sans: &str| {
        format!(
            r#"apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: east-west, namespace: shop}}
spec:
  selector: {{app: gateway}}
  servers:
  - port: {{number: 8443, name: https, protocol: HTTPS}}
    hosts: ["*"]
    tls: {{mode: ISTIO_MUTUAL{sans}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: through-gateway, namespace: shop}}
spec:
  hosts: ["*"]
  gateways: [east-west]
  http: [{{route: [{{destination: {{host: backend.shop.svc.cluster.local}}}}]}}]
---
{gateway}---
{backend}"#,
            gateway = mesh_workload("gateway", "10.96.50.9", 8443, listen, &gw_ip),
            backend = service_yaml("shop", "backend", 9090, &[(&backend, &[])]),
        )
    };
    m.meshd.write("gateway.yaml", &gateway(""));
    let _gw = m.gateway(&gw_ip, &[]);
    let client = m.client("productpage", "pp-token", &[]);
    let via_gateway = || {
        http_get(
            &format!("{}:8443", client.envoy.ip),
            "gateway.shop.svc.cluster.local",
            "/",
            &[],
        )
    };
    wait_until(
        "productpage to reach the backend through the gateway",
        Duration::from_secs(15),
        || via_gateway().is_ok_and(|r| r.status == 200),
    );
    assert_eq!(via_gateway().unwrap().body, "backend");
    let cluster = "outbound|8443||gateway.shop.svc.cluster.local";
    assert!(
        client
            .envoy
            .stat(&format!("cluster.{cluster};.ssl.handshake"))
            > 0
    );
    // Without a mesh certificate the gateway answers nothing.
    let plain = http_get(&format!("{gw_ip}:{listen}"), "gateway", "/", &[]);
    assert!(plain.is_err(), "plaintext was served: {plain:?}");

    // Only ratings may connect now: productpage's handshake is refused.
    m.meshd.write(
        "gateway.yaml",
        &gateway(", subjectAltNames: ['spiffe://cluster.local/ns/shop/sa/ratings']"),
    );
    wait_until(
        "the gateway to refuse productpage",
        Duration::from_secs(15),
        || via_gateway().is_ok_and(|r| r.status == 503),
    );
}

/// One line through a TCP connection to `addr`, and the line that comes back.
fn tcp_line(addr: &str, line: &str) -> std::io::Result<String> {
    use std::io::{BufRead, BufReader, Write};
    let mut conn = std::net::TcpStream::connect(addr)?;
    conn.set_read_timeout(Some(Duration::from_secs(3)))?;
    conn.write_all(format!("{line}\r\n").as_bytes())?;
    let mut answer = String::new();
    BufReader::new(conn).read_line(&mut answer)?;
    Ok(answer.trim_end().to_string())
}

/// A port without a declared protocol is sniffed at both ends, as istiod sets it up:
/// HTTP and a TCP protocol share it, over mutual TLS (the client marks HTTP by its ALPN,
/// so the server serves it as HTTP and forwards the client's identity) and in plaintext
/// from a client without a sidecar, under PERMISSIVE and STRICT.
#[test]
fn an_unnamed_port_carries_http_and_tcp_sniffed_at_both_ends() {
    let m = mesh("mtls-sniffed");
    let path = m.meshd.config_dir.join("mesh.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap();
    let unnamed = yaml
        .replace(
            "{number: 9080, protocol: HTTP, name: http}",
            "{number: 9080, name: web}",
        )
        .replace("name: http,", "name: web,");
    assert_ne!(yaml, unnamed);
    std::fs::write(&path, unnamed).unwrap();
    let _server = m.reviews(&[]);
    let client = m.client("productpage", "pp-token", &[]);
    let through_client = format!("{}:9080", client.envoy.ip);
    let direct = format!("{}:9080", m.server_ip);
    let both_ways = |what: &str| {
        wait_until(what, Duration::from_secs(10), || {
            via(&client, "/").is_ok_and(|r| r.status == 200)
        });
        let r = via(&client, "/").unwrap();
        assert_eq!(r.body, "reviews", "{what}");
        let xfcc = &r.headers["x-echo-xfcc"];
        assert!(
            xfcc.contains("URI=spiffe://cluster.local/ns/shop/sa/productpage"),
            "{what}: HTTP is served as HTTP by the server: {xfcc:?}"
        );
        assert_eq!(
            tcp_line(&through_client, "PING sniffed").unwrap(),
            "reviews echo: PING sniffed",
            "{what}: TCP through the client"
        );
    };
    both_ways("PERMISSIVE");
    assert_reached_reviews_over_mtls(&client);
    // Plaintext from a client without a sidecar: HTTP (no identity) and TCP.
    assert_eq!(m.direct().unwrap().headers["x-echo-xfcc"], "");
    assert_eq!(
        tcp_line(&direct, "PING plain").unwrap(),
        "reviews echo: PING plain"
    );

    m.meshd.write("pa.yaml", &pa("STRICT"));
    wait_until("plaintext to be refused", Duration::from_secs(10), || {
        tcp_line(&direct, "PING plain").is_err()
    });
    both_ways("STRICT");
}

/// The sum of an Envoy's connection-manager counters (`http.*`) whose names end in
/// `suffix`.
fn counter(envoy: &Envoy, suffix: &str) -> u64 {
    let stats = envoy.admin("/stats").unwrap().body;
    (stats.lines())
        .filter_map(|l| l.split_once(": "))
        .filter(|(name, _)| name.starts_with("http.") && name.ends_with(suffix))
        .filter_map(|(_, v)| v.parse::<u64>().ok())
        .sum()
}

/// AuthorizationPolicy `action: CUSTOM` asks the MeshConfig `extensionProviders` HTTP
/// authorizer about the requests its rules match, and only those, as istiod builds it;
/// the authorizer's answer decides. A provider meshd cannot use denies what the rules
/// match (fail closed), and nothing else.
#[test]
fn a_custom_policy_asks_its_external_authorizer_about_the_requests_it_matches() {
    let m = mesh("mtls-ext-authz");
    let authz = Upstream::deciding("authz", |path| {
        if path.contains("deny") {
            "403 Forbidden"
        } else {
            "200 OK"
        }
    });
    let server = m.reviews(&[]);
    let client = m.client("productpage", "pp-token", &[]);
    let policy = |provider: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n    extensionProviders:\n    - name: ext-authz\n      envoyExtAuthzHttp: {{service: authz.shop.svc.cluster.local, port: 8000, pathPrefix: /check}}\n---\n{}---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: admin, namespace: shop}}\nspec:\n  selector: {{matchLabels: {{app: reviews}}}}\n  action: CUSTOM\n  provider: {{name: {provider}}}\n  rules: [{{to: [{{operation: {{paths: [\"/admin*\"]}}}}]}}]\n",
            service_yaml("shop", "authz", 8000, &[(&authz, &[])])
        )
    };
    let status = |path: &str| via(&client, path).map(|r| r.status).unwrap_or(0);
    wait_until("reviews to serve", Duration::from_secs(10), || {
        status("/") == 200
    });
    m.meshd.write("authz.yaml", &policy("ext-authz"));
    wait_until("the authorizer to refuse", Duration::from_secs(10), || {
        status("/admin/deny") == 403
    });
    let asked =
        || counter(&server.envoy, ".ext_authz.ok") + counter(&server.envoy, ".ext_authz.denied");
    let before = asked();
    // Requests no CUSTOM rule matches are not sent to the authorizer, whatever their path.
    assert_eq!(status("/"), 200);
    assert_eq!(status("/deny"), 200);
    assert_eq!(
        asked(),
        before,
        "the authorizer was asked about unmatched requests"
    );
    // A matched request it allows reaches the workload.
    let allowed = via(&client, "/admin/ok").unwrap();
    assert_eq!((allowed.status, allowed.body.as_str()), (200, "reviews"));
    assert_eq!(counter(&server.envoy, ".ext_authz.ok"), 1);
    assert!(counter(&server.envoy, ".ext_authz.denied") >= 1);

    // A provider MeshConfig does not define: what the rules match is denied.
    m.meshd.write("authz.yaml", &policy("missing"));
    wait_until(
        "the unusable provider to deny",
        Duration::from_secs(10),
        || status("/admin/ok") == 403,
    );
    assert_eq!(status("/"), 200);
    let warnings = m.meshd.json("/debug/configz")["crossObjectWarnings"].clone();
    let warning = (warnings.as_array().unwrap().iter())
        .find(|w| w["field"] == "spec.provider.name")
        .unwrap_or_else(|| panic!("{warnings}"));
    let message = warning["message"].as_str().unwrap();
    assert!(message.contains("\"missing\" is not defined"), "{message}");
}

/// The DestinationRule of the service a workload serves sets the limits of the
/// workload's inbound cluster, as istiod's `buildInboundCluster` applies it (so the
/// server has the capacity its clients are given): the rule's pool, the port's entry
/// in place of it, never a rule with a workload selector, and a Sidecar's inbound pool
/// over all of them.
#[test]
fn a_services_destination_rule_sets_its_workloads_inbound_limits() {
    let m = mesh("mtls-inbound-rule");
    let server = m.reviews(&[]);
    let limit = |n: u32| format!("inbound|9080||::default_priority::max_connections::{n}");
    let holds = |what: &str, n: u32| {
        wait_until(what, Duration::from_secs(10), || {
            (server.envoy.admin("/clusters").unwrap().body).contains(&limit(n))
        });
        assert_eq!(m.direct().unwrap().status, 200, "{what}");
    };
    wait_until("the workload to serve", Duration::from_secs(10), || {
        m.direct().is_ok_and(|r| r.status == 200)
    });
    let rule = |policy: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  host: reviews\n  trafficPolicy:\n{policy}"
        )
    };
    m.meshd.write(
        "rule.yaml",
        &rule("    connectionPool: {tcp: {maxConnections: 7}}\n"),
    );
    holds("the rule's pool", 7);
    let dump = server.envoy.config_dump("dynamic_active_clusters");
    assert!(
        dump.contains("/apis/networking.istio.io/v1/namespaces/shop/destination-rule/reviews"),
        "{dump}"
    );
    // The port's entry replaces the rule's pool on 9080; a selector rule for the
    // workload does not apply inbound.
    let selector_rule = "---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews-canary, namespace: shop}\nspec:\n  host: reviews\n  workloadSelector: {matchLabels: {app: reviews}}\n  trafficPolicy: {connectionPool: {tcp: {maxConnections: 3}}}\n";
    m.meshd.write(
        "rule.yaml",
        &format!(
            "{}{selector_rule}",
            rule("    connectionPool: {tcp: {maxConnections: 7}}\n    portLevelSettings:\n    - port: {number: 9080}\n      connectionPool: {tcp: {maxConnections: 8}}\n")
        ),
    );
    holds("the port's entry", 8);
    // The Sidecar's inbound pool wins over the rule.
    let path = m.meshd.config_dir.join("mesh.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap();
    let selector = "  workloadSelector: {labels: {app: reviews}}\n";
    let pooled = yaml.replace(
        selector,
        &format!("{selector}  inboundConnectionPool: {{tcp: {{maxConnections: 5}}}}\n"),
    );
    std::fs::write(&path, pooled).unwrap();
    holds("the Sidecar's pool", 5);
}

/// A Sidecar's `inboundConnectionPool` sets the limits and HTTP idle timeout of the
/// workload's inbound cluster, and an ingress port's own `connectionPool` replaces it
/// there, as istiod's `InboundConnectionPoolForPort`; requests still reach the workload.
#[test]
fn a_sidecars_inbound_connection_pool_sets_its_inbound_clusters_limits() {
    let m = mesh("mtls-inbound-pool");
    let server = m.reviews(&[]);
    let path = m.meshd.config_dir.join("mesh.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap();
    let selector = "  workloadSelector: {labels: {app: reviews}}\n";
    assert!(yaml.contains(selector));
    let pooled = yaml.replace(
        selector,
        &format!("{selector}  inboundConnectionPool: {{tcp: {{maxConnections: 5}}, http: {{idleTimeout: 30s}}}}\n"),
    );
    let limit = |n: u32| format!("inbound|9080||::default_priority::max_connections::{n}");
    let direct = || m.direct();
    wait_until("the workload to serve", Duration::from_secs(10), || {
        direct().is_ok_and(|r| r.status == 200)
    });
    std::fs::write(&path, &pooled).unwrap();
    wait_until("the Sidecar's pool", Duration::from_secs(10), || {
        server
            .envoy
            .admin("/clusters")
            .unwrap()
            .body
            .contains(&limit(5))
    });
    let dump = server.envoy.config_dump("dynamic_active_clusters");
    assert!(dump.contains("\"idle_timeout\": \"30s\""), "{dump}");
    assert_eq!(direct().unwrap().status, 200);
    // The ingress port's own pool wins on its port.
    let endpoint = pooled
        .lines()
        .find(|l| l.contains("defaultEndpoint"))
        .unwrap()
        .to_string();
    let per_port = pooled.replace(
        &endpoint,
        &format!("{endpoint}\n    connectionPool: {{tcp: {{maxConnections: 9}}}}"),
    );
    std::fs::write(&path, per_port).unwrap();
    wait_until("the port's pool", Duration::from_secs(10), || {
        server
            .envoy
            .admin("/clusters")
            .unwrap()
            .body
            .contains(&limit(9))
    });
    assert_eq!(direct().unwrap().status, 200);
}

/// Split-horizon EDS across two networks: reviews is on net-b, reached from net-a only
/// through net-b's east-west gateway (a Service labelled `topology.istio.io/network`,
/// its external IP, an AUTO_PASSTHROUGH server). productpage on net-a is sent the
/// gateway's address for reviews, and its mTLS connection passes through the gateway to
/// reviews' sidecar, which sees productpage's identity; ratings, on net-b itself, is sent
/// reviews' own address and goes straight there.
#[test]
fn a_proxy_on_another_network_reaches_a_workload_through_its_networks_gateway() {
    through_the_gateway(false);
}

/// The same with the gateway known by its load balancer's hostname (a cloud load
/// balancer's): meshd resolves it (here `localhost`) and sends its address.
#[test]
fn a_network_gateway_known_by_hostname_is_resolved_by_meshd() {
    through_the_gateway(true);
}

fn through_the_gateway(by_hostname: bool) {
    let m = mesh(if by_hostname {
        "multi-network-dns"
    } else {
        "multi-network"
    });
    let (gw_ip, listen) = (loopback_ip(), free_port());
    let (address, gateway_address) = if by_hostname {
        (
            "status: {loadBalancer: {ingress: [{hostname: localhost}]}}".to_string(),
            "127.0.0.1".to_string(),
        )
    } else {
        (String::new(), gw_ip.clone())
    };
    let external_ips = if by_hostname {
        String::new()
    } else {
        format!("  externalIPs: [{gw_ip}]\n")
    };
    // reviews' Pod is on net-b.
    let path = m.meshd.config_dir.join("mesh.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap().replace(
        "labels: {app: reviews, security.istio.io/tlsMode: istio}",
        "labels: {app: reviews, security.istio.io/tlsMode: istio, topology.istio.io/network: net-b}",
    );
    assert!(yaml.contains("network: net-b"));
    m.meshd.write("mesh.yaml", &yaml);
    m.meshd.write(
        "eastwest.yaml",
        &format!(
            r#"apiVersion: v1
kind: Service
metadata:
  name: eastwest
  namespace: shop
  labels: {{topology.istio.io/network: net-b, networking.istio.io/gatewayPort: "{listen}"}}
spec:
  selector: {{istio: eastwestgateway}}
{external_ips}  ports: [{{name: tls, port: {listen}}}]
{address}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: cross-network, namespace: shop}}
spec:
  selector: {{istio: eastwestgateway}}
  servers:
  - port: {{number: {listen}, name: tls, protocol: TLS}}
    hosts: ['*.local']
    tls: {{mode: AUTO_PASSTHROUGH}}
"#
        ),
    );
    let _server = m.reviews(&["--network", "net-b"]);
    let gateway = m.gateway(
        &gw_ip,
        &["--label", "istio=eastwestgateway", "--network", "net-b"],
    );
    let client = m.client_reaching_reviews("productpage", "pp-token", &["--network", "net-a"]);
    let local = m.client_reaching_reviews("ratings", "rt-token", &["--network", "net-b"]);

    // net-a: reviews' endpoint is the gateway, and the request went through it.
    let cluster = "outbound|9080||reviews.shop.svc.cluster.local";
    let hosts = |w: &Workload| -> Vec<String> {
        let text = w.envoy.admin("/clusters").unwrap().body;
        let mut hosts: Vec<String> = (text.lines())
            .filter_map(|l| l.strip_prefix(&format!("{cluster}::")))
            .filter_map(|l| l.split_once("::").map(|(h, _)| h.to_string()))
            .filter(|h| h.parse::<std::net::SocketAddr>().is_ok())
            .collect();
        hosts.dedup();
        hosts
    };
    assert_eq!(hosts(&client), [format!("{gateway_address}:{listen}")]);
    let r = via(&client, "/").unwrap();
    assert_eq!(r.body, "reviews");
    let xfcc = &r.headers["x-echo-xfcc"];
    assert!(
        xfcc.contains("URI=spiffe://cluster.local/ns/shop/sa/productpage"),
        "mTLS end to end, through the gateway: {xfcc:?}"
    );
    let dnat = "cluster.outbound_.9080_._.reviews.shop.svc.cluster.local;.upstream_cx_total";
    let through = gateway.envoy.stat(dnat);
    assert!(through > 0, "the gateway forwarded nothing");

    // net-b: reviews' own address, not through the gateway.
    assert_eq!(hosts(&local), [format!("{}:9080", m.server_ip)]);
    let r = via(&local, "/").unwrap();
    assert!(r.headers["x-echo-xfcc"].contains("sa/ratings"));
    assert_eq!(gateway.envoy.stat(dnat), through);
    if by_hostname {
        return;
    }
    // A proxy on net-a that asks to see net-a only (REQUESTED_NETWORK_VIEW, from the
    // agent's ISTIO_META_ environment) is sent no endpoint of reviews at all.
    let narrow = m.client(
        "details",
        "dt-token",
        &[
            "--network",
            "net-a",
            "env:ISTIO_META_REQUESTED_NETWORK_VIEW=net-a",
        ],
    );
    wait_until(
        "details' outbound listener",
        Duration::from_secs(15),
        || via(&narrow, "/").is_ok_and(|r| r.status == 503),
    );
    assert!(hosts(&narrow).is_empty(), "{:?}", hosts(&narrow));
    assert_eq!(gateway.envoy.stat(dnat), through);
}

/// The sum of an Envoy's counters whose names end with `suffix`.
fn counters_ending(envoy: &Envoy, suffix: &str) -> u64 {
    let text = envoy.admin("/stats?filter=istio_dry_run").unwrap().body;
    (text.lines())
        .filter_map(|l| l.split_once(": "))
        .filter(|(name, _)| name.ends_with(suffix))
        .map(|(_, v)| v.trim().parse::<u64>().unwrap_or(0))
        .sum()
}

/// An `istio.io/dry-run` AuthorizationPolicy is evaluated and counted by reviews' Envoy
/// (Envoy's shadow rules, under istiod's `istio_dry_run_deny_` prefix) and never
/// enforced: the caller it would deny is served. Without the annotation it is enforced.
#[test]
fn a_dry_run_policy_is_counted_and_not_enforced() {
    let m = mesh("mtls-dry-run");
    let server = m.reviews(&[]);
    let productpage = m.client_reaching_reviews("productpage", "pp-token", &[]);
    let policy = |dry_run: &str| {
        format!(
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: no-productpage\n  namespace: shop\n  annotations: {{istio.io/dry-run: \"{dry_run}\"}}\nspec:\n  selector: {{matchLabels: {{app: reviews}}}}\n  action: DENY\n  rules:\n  - from: [{{source: {{principals: [cluster.local/ns/shop/sa/productpage]}}}}]\n"
        )
    };
    m.meshd.write("authz.yaml", &policy("true"));
    wait_until(
        "reviews' Envoy to count a dry-run denial",
        Duration::from_secs(30),
        || {
            via(&productpage, "/").is_ok_and(|r| r.status == 200)
                && counters_ending(&server.envoy, "istio_dry_run_deny_.shadow_denied") > 0
        },
    );
    let authn = m.meshd.json(&format!(
        "/debug/authenticationz?proxyID={}",
        server.envoy.id
    ));
    assert_eq!(
        authn["dryRunAuthorizationPolicies"][0],
        "shop/no-productpage"
    );
    assert_eq!(authn["authorizationPolicies"].as_array().unwrap().len(), 0);
    let before = counters_ending(&server.envoy, "istio_dry_run_deny_.shadow_denied");
    for _ in 0..3 {
        assert_eq!(via(&productpage, "/").unwrap().status, 200);
    }
    assert_eq!(
        counters_ending(&server.envoy, "istio_dry_run_deny_.shadow_denied"),
        before + 3
    );
    // The same policy, enforced.
    m.meshd.write("authz.yaml", &policy("false"));
    wait_until("productpage to be denied", Duration::from_secs(30), || {
        via(&productpage, "/").is_ok_and(|r| r.status == 403)
    });
}

/// An inbound route retries twice a request reset before it reached the application
/// (`reset-before-request`, as istiod's): with nothing listening on the application's
/// port, each request through the workload's sidecar is tried three times before its
/// 503.
#[test]
fn an_inbound_request_reset_before_the_application_took_it_is_retried_twice() {
    let m = mesh("mtls-inbound-retry");
    let server = m.reviews(&[]);
    wait_until("the workload to serve", Duration::from_secs(10), || {
        m.direct().is_ok_and(|r| r.status == 200)
    });
    let retries = || {
        server
            .envoy
            .stat("cluster.inbound|9080||;.upstream_rq_retry")
    };
    assert_eq!(retries(), 0);
    // Envoy holds the rest of istiod's inbound settings: idle streams are never cut, and
    // the span's operation names the service.
    let listeners = server.envoy.config_dump("dynamic_listeners");
    assert!(
        listeners.contains(r#""stream_idle_timeout": "0s""#),
        "{listeners}"
    );
    let operation = r#""operation": "reviews.shop.svc.cluster.local:9080/*""#;
    assert!(listeners.contains(operation), "{listeners}");
    // The application goes away.
    let path = m.meshd.config_dir.join("mesh.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap();
    let endpoint = format!("127.0.0.1:{}", m._upstream.port);
    let closed = format!("127.0.0.1:{}", free_port());
    std::fs::write(&path, yaml.replace(&endpoint, &closed)).unwrap();
    wait_until("the request refused", Duration::from_secs(10), || {
        m.direct().is_ok_and(|r| r.status == 503)
    });
    let before = retries();
    assert!(before >= 2, "{before}");
    assert_eq!(m.direct().unwrap().status, 503);
    assert_eq!(retries() - before, 2);
}

/// A gRPC application's health service (tonic's): `shop.Reviews` SERVING, `sick`
/// NOT_SERVING. Its port.
fn grpc_health_app() -> u16 {
    use tonic_health::ServingStatus;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async move {
            let (reporter, service) = tonic_health::server::health_reporter();
            reporter
                .set_service_status("shop.Reviews", ServingStatus::Serving)
                .await;
            reporter
                .set_service_status("sick", ServingStatus::NotServing)
                .await;
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
    });
    port
}

/// `meshd agent --envoy` starts Envoy itself, as pilot-agent does (the injected
/// `istio-proxy` container's command), with the pod's labels read from the downward-API
/// file (`--pod-info`): the reviews Sidecar, selected by `app: reviews`, gives it the
/// inbound port, and a client reaches reviews through it over mutual TLS. Stopping the
/// agent stops Envoy.
#[test]
fn the_agent_runs_envoy_with_the_pods_labels_from_the_downward_api() {
    let _ports = fixed_ports();
    let m = mesh("agent-runs-envoy");
    let dir = temp_dir("agent-runs-envoy-pod");
    let (pod_info, token) = (dir.join("podinfo"), dir.join("token"));
    std::fs::create_dir_all(&pod_info).unwrap();
    std::fs::write(
        pod_info.join("labels"),
        "app=\"reviews\"\nsecurity.istio.io/tlsMode=\"istio\"\nversion=\"v7\"\n",
    )
    .unwrap();
    std::fs::write(&token, "rv-token").unwrap();
    let (admin_port, status_port, closed) = (free_port(), free_port(), free_port());
    let socket = std::env::temp_dir().join(format!(
        "meshd-sds-{}-{admin_port}.sock",
        std::process::id()
    ));
    /// Kills the agent (and so its Envoy) if the test ends early.
    struct Agent(std::process::Child);
    impl Drop for Agent {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    // An application serving HTTPS (probed without verifying its certificate, as the
    // kubelet does) and one exporting its own metrics.
    let (_, chain, key) = site_certificate("app.example");
    let https_app = Upstream::tls("https-app", &chain, &key, &chain);
    let metrics_app = Upstream::start("app_requests_total 7");
    let grpc_app = grpc_health_app();
    let mut agent = std::process::Command::new(env!("CARGO_BIN_EXE_meshd"))
        .arg("agent")
        .args([
            "--ca-address",
            &format!("127.0.0.1:{}", m.meshd.secure_port),
        ])
        .arg("--ca-root-cert")
        .arg(m.meshd.ca_dir.join("root-cert.pem"))
        .args(["--ca-server-name", "localhost"])
        .arg("--token-file")
        .arg(&token)
        .args([
            "--namespace",
            "shop",
            "--service-account",
            "reviews",
            "--pod-name",
            "reviews-0",
        ])
        .args(["--instance-ip", &m.server_ip, "--interception-mode", "NONE"])
        .env("ISTIO_META_MESHD_OUTBOUND_BIND_INSTANCE_IP", "true")
        .arg("--pod-info")
        .arg(&pod_info)
        .arg("--sds-socket")
        .arg(&socket)
        .arg("--bootstrap")
        .arg(dir.join("envoy-rev.json"))
        .args(["--admin-port", &admin_port.to_string()])
        .arg("--envoy")
        .arg(envoy_bin())
        .args(["--status-port", &status_port.to_string()])
        // The application's probes as the injector rewrote them.
        .env(
            "ISTIO_KUBE_APP_PROBERS",
            serde_json::json!({
                "/app-health/app/readyz": {"httpGet": {"port": m._upstream.port, "path": "/"}},
                "/app-health/app/livez": {"tcpSocket": {"port": closed}},
                "/app-health/app/startupz": {
                    "httpGet": {"port": https_app.port, "path": "/", "scheme": "HTTPS"}
                },
                "/app-health/grpc/readyz": {"grpc": {"port": grpc_app, "service": "shop.Reviews"}},
                "/app-health/grpc/livez": {"grpc": {"port": grpc_app, "service": "sick"}},
            })
            .to_string(),
        )
        // The application's scrape settings the injector replaced.
        .env(
            "ISTIO_PROMETHEUS_ANNOTATIONS",
            serde_json::json!({"port": metrics_app.port.to_string(), "path": "/stats"}).to_string(),
        )
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(dir.join("agent.log")).unwrap())
        .spawn()
        .map(Agent)
        .unwrap();
    let admin = format!("127.0.0.1:{admin_port}");
    let listeners = || {
        http_get(&admin, "localhost", "/listeners", &[])
            .map(|r| r.body)
            .unwrap_or_default()
    };
    wait_until(
        "Envoy, started by the agent, to take the inbound port",
        Duration::from_secs(20),
        || listeners().contains(&format!("{}:9080", m.server_ip)),
    );
    // The status port: Envoy's readiness, the application's probes run from the pod.
    let status = format!("127.0.0.1:{status_port}");
    let probe = |path: &str| http_get(&status, "localhost", path, &[]).unwrap().status;
    wait_until(
        "the status port to say ready",
        Duration::from_secs(10),
        || probe("/healthz/ready") == 200,
    );
    assert_eq!(probe("/app-health/app/readyz"), 200);
    assert_eq!(probe("/app-health/app/livez"), 503);
    assert_eq!(probe("/app-health/app/startupz"), 200);
    assert_eq!(probe("/app-health/grpc/readyz"), 200);
    assert_eq!(probe("/app-health/grpc/livez"), 503);
    assert_eq!(probe("/app-health/other/readyz"), 404);
    // Envoy's metrics, then the application's.
    let metrics = http_get(&status, "localhost", "/stats/prometheus", &[]).unwrap();
    assert!(
        metrics.body.contains("envoy_server_live"),
        "{}",
        metrics.body
    );
    assert!(
        metrics.body.trim_end().ends_with("\napp_requests_total 7"),
        "{}",
        metrics.body
    );

    // The node Envoy presents carries the pod's labels.
    let info: serde_json::Value = serde_json::from_str(
        &http_get(&admin, "localhost", "/server_info", &[])
            .unwrap()
            .body,
    )
    .unwrap();
    assert_eq!(
        info["node"]["metadata"]["LABELS"]["version"], "v7",
        "{info}"
    );
    let client = m.client_reaching_reviews("productpage", "pp-token", &[]);
    let r = via(&client, "/").unwrap();
    assert_eq!(r.body, "reviews");
    assert!(r.headers["x-echo-xfcc"].contains("spiffe://cluster.local/ns/shop/sa/productpage"));
    assert_reached_reviews_over_mtls(&client);

    // The lifecycle hooks the injector writes: postStart waits for Envoy's readiness;
    // preStop asks the agent to drain Envoy's inbound listeners.
    let hook = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_meshd"))
            .arg("agent")
            .args(args)
            .output()
            .unwrap()
    };
    let ready = "http://127.0.0.1:15021/healthz/ready";
    assert!(
        hook(&["wait", "--url", ready, "--timeout-seconds", "5"])
            .status
            .success()
    );
    let never = hook(&[
        "wait",
        "--url",
        "http://127.0.0.1:1/",
        "--timeout-seconds",
        "1",
    ]);
    assert!(!never.status.success());
    assert!(String::from_utf8_lossy(&never.stderr).contains("was not ready after 1 s"));
    // A keep-alive request straight to reviews' inbound listener: Envoy closes the
    // connection after answering only while it drains.
    let inbound = format!("{}:9080", m.server_ip);
    let keep_alive = || {
        let mut conn = std::net::TcpStream::connect(&inbound).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        std::io::Write::write_all(&mut conn, b"GET / HTTP/1.1\r\nHost: reviews\r\n\r\n").unwrap();
        let mut buf = [0u8; 4096];
        let n = std::io::Read::read(&mut conn, &mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).to_lowercase()
    };
    let before = keep_alive();
    assert!(
        before.starts_with("http/1.1 200") && !before.contains("connection: close"),
        "{before}"
    );
    let debug_port = format!("--debug-port={status_port}");
    let drained = hook(&["request", &debug_port, "POST", "drain"]);
    assert!(
        drained.status.success(),
        "{}",
        String::from_utf8_lossy(&drained.stderr)
    );
    let after = keep_alive();
    assert!(after.contains("connection: close"), "{after}");

    // SIGTERM: the agent stops Envoy, then itself.
    // SAFETY: kill(2) of the agent, our child, not yet reaped.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
    let status = agent.0.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(
        http_get(&admin, "localhost", "/ready", &[]).is_err(),
        "Envoy still answers"
    );
}
