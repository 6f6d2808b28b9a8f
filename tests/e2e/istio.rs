//! Istio's own components against meshd, built from `istio.io/istio` by `tools/build.sh
//! istio` (on first use, cached under `target/tools/istio/`): the real `istioctl` reading
//! proxy status over xDS from meshd's secure port as it reads it from istiod's, with a
//! token from the real TokenRequest API that meshd checks with TokenReview; and the real
//! `pilot-agent` running a sidecar whose certificate and configuration come from meshd.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::cluster::Tenant;
use crate::harness::{
    envoy_bin, fixed_ports, free_port, http_get, loopback_ip, temp_dir, wait_until,
};
use crate::istiod::{istio_bin, istio_source};
use crate::kubelet::{Forward, Kubelet};
use crate::kubernetes::kube_mesh_on;

/// `istioctl ARGS` as the test bed's admin, against meshd's secure port; its stdout.
fn istioctl(t: &Tenant, secure_port: u16, args: &[&str]) -> String {
    let xds = ["--xds-address", &format!("127.0.0.1:{secure_port}")];
    istioctl_on(t, &[&xds[..], args].concat()).0
}

/// `istioctl ARGS` as the test bed's admin, which must succeed: its stdout and stderr.
fn istioctl_on(t: &Tenant, args: &[&str]) -> (String, String) {
    let out = Command::new(istio_bin().join("istioctl"))
        .arg("--kubeconfig")
        .arg(&t.cluster.kubeconfig)
        .args(["--istioNamespace", &t.system])
        .args(args)
        .output()
        .expect("running istioctl");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "istioctl {args:?}: {stdout}{stderr}");
    (stdout, stderr)
}

/// `istioctl proxy-status`, for all proxies (default and verbose) and for one proxy
/// against its Envoy's own configuration (a dump, and live), then `istioctl x precheck`. istioctl asks for a token for the `default`
/// ServiceAccount of the Istio namespace (TokenRequest), and meshd's TokenReview places
/// the caller in its root namespace, so every proxy is listed.
#[test]
fn the_real_istioctl_reads_proxy_status_from_meshd() {
    let t = Tenant::new("istioctl-real", "");
    t.cluster
        .apply(&format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: default, namespace: {}}}\n",
            t.system
        ))
        .unwrap();
    let m = kube_mesh_on(t, "istioctl-real");
    let pod = format!("istioctl-real-0.{}", m.t.system);
    let secure = m.meshd.secure_port;

    let all = istioctl(&m.t, secure, &["proxy-status"]);
    let line = all
        .lines()
        .find(|l| l.starts_with(&pod))
        .unwrap_or_else(|| panic!("{pod} not listed:\n{all}"));
    assert!(line.contains("Kubernetes"), "{all}");
    for t in ["CDS", "LDS", "EDS", "RDS"] {
        assert!(line.contains(t), "{t} subscribed: {all}");
    }

    let verbose = istioctl(&m.t, secure, &["proxy-status", "-v", "1"]);
    let line = verbose
        .lines()
        .find(|l| l.starts_with(&pod))
        .unwrap_or_else(|| panic!("{pod} not listed:\n{verbose}"));
    assert_eq!(line.matches("SYNCED").count(), 4, "{verbose}");

    // One proxy, compared with its Envoy's config: from a dump, and live through the pod's
    // port-forward (a pod on a node kwok serves, see `kubelet.rs`).
    let dump = m.t.dir.join("envoy-config-dump.json");
    std::fs::write(&dump, m.envoy.admin("/config_dump").unwrap().body).unwrap();
    let from_file = istioctl(
        &m.t,
        secure,
        &["proxy-status", &pod, "--file", dump.to_str().unwrap()],
    );
    let kubelet = Kubelet::start(
        m.t.cluster,
        &[Forward {
            namespace: &m.t.system,
            pod: "istioctl-real-0",
            port: 15000,
            to: m.envoy.admin_port,
        }],
    );
    m.t.cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: istioctl-real-0, namespace: {}, labels: {{istio: ingressgateway, app: istio-ingressgateway}}}}\nspec:\n  nodeName: {}\n  containers:\n  - {{name: istio-proxy, image: proxyv2}}\n",
            m.t.system, kubelet.node
        ))
        .unwrap();
    kubelet.wait_running(&m.t.system, "istioctl-real-0");
    let live = istioctl(&m.t, secure, &["proxy-status", &pod]);
    for (source, compared) in [("file", from_file), ("live", live)] {
        for part in ["Clusters Match", "Listeners Match", "Routes Match"] {
            assert!(compared.contains(part), "{source} {part}:\n{compared}");
        }
    }

    // The Gateway removed, Envoy drains the gateway's listener (45 s, as istio-agent runs
    // it) and keeps subscribing to its route configuration, which meshd answers empty.
    // meshd's dump holds the route configurations the proxy subscribes to, as istiod's
    // does, so the routes still match.
    m.t.delete("gateway.networking.istio.io", "web");
    wait_until(
        "the gateway's listener to drain",
        Duration::from_secs(10),
        || {
            m.envoy
                .config_dump("dynamic_listeners")
                .contains("draining_state")
        },
    );
    let draining = istioctl(&m.t, secure, &["proxy-status", &pod]);
    assert!(draining.contains("Routes Match"), "{draining}");

    // `x precheck` on the cluster meshd runs in: the API server's version, the admin's
    // permissions, Gateway API versions and the alpha-annotation analyzer over the Istio
    // namespace and the application's; it finds nothing in meshd's install.
    let (stdout, stderr) = istioctl_on(&m.t, &["x", "precheck", "--namespace", &m.t.app]);
    assert!(
        stderr.contains("No issues found when checking the cluster"),
        "{stdout}{stderr}"
    );
}

/// The workload certificate an Envoy holds over SDS (its config dump's `default` secret):
/// its key's algorithm (`rsaEncryption` or `id-ecPublicKey`, as an OID) and its serial.
fn sds_certificate(admin: &str) -> (String, String) {
    use base64::Engine;
    use x509_cert::der::DecodePem;
    let dump: serde_json::Value = serde_json::from_str(
        &http_get(
            admin,
            "localhost",
            "/config_dump?resource=dynamic_active_secrets",
            &[],
        )
        .unwrap()
        .body,
    )
    .unwrap();
    let secret = (dump["configs"].as_array().unwrap().iter())
        .find(|s| s["name"] == "default")
        .unwrap_or_else(|| panic!("no default secret: {dump:#}"));
    let chain = &secret["secret"]["tls_certificate"]["certificate_chain"]["inline_bytes"];
    let pem = base64::engine::general_purpose::STANDARD
        .decode(chain.as_str().unwrap())
        .unwrap();
    // The chain's first certificate: the workload's own.
    let pem = String::from_utf8(pem).unwrap();
    let end = "-----END CERTIFICATE-----";
    let leaf = format!("{}{end}\n", pem.split(end).next().unwrap().trim_start());
    let cert = x509_cert::Certificate::from_pem(leaf.as_bytes()).unwrap();
    let tbs = cert.tbs_certificate();
    (
        tbs.subject_public_key_info().algorithm.oid.to_string(),
        tbs.serial_number().to_string(),
    )
}

/// Istio's real `pilot-agent`, with the stock Envoy, running as one workload's sidecar
/// against meshd (local mode: the bootstrap tokens of `mtls::mesh`).
struct PilotAgent {
    /// Envoy's admin address.
    admin: String,
    log: PathBuf,
    group: std::process::Child,
}

impl Drop for PilotAgent {
    fn drop(&mut self) {
        // pilot-agent does not stop its Envoy when killed: the group goes.
        // SAFETY: signals the group the child leads; no memory is touched.
        unsafe { libc::killpg(self.group.id() as i32, libc::SIGKILL) };
        let _ = self.group.wait();
    }
}

impl PilotAgent {
    /// `shop/NAME-0` as the service account NAME with `token`, at `ip`, labelled
    /// `app: NAME`; `ecc` is `ECC_SIGNATURE_ALGORITHM` (empty: RSA, pilot-agent's default).
    fn start(m: &crate::mtls::Mesh, name: &str, token: &str, ip: &str, ecc: &str) -> PilotAgent {
        PilotAgent::start_with(m, name, token, ip, ecc, &[])
    }

    /// As [`PilotAgent::start`], with more of pilot-agent's environment.
    fn start_with(
        m: &crate::mtls::Mesh,
        name: &str,
        token: &str,
        ip: &str,
        ecc: &str,
        env: &[(&str, &str)],
    ) -> PilotAgent {
        let dir = temp_dir(&format!("pilot-agent-{name}{ecc}"));
        // What the pod's volumes mount, under the working directory pilot-agent reads
        // them from.
        let tokens = dir.join("var/run/secrets/tokens");
        let roots = dir.join("var/run/secrets/istio");
        let pod = dir.join("etc/istio/pod");
        for d in [&tokens, &roots, &pod] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(tokens.join("istio-token"), token).unwrap();
        std::fs::write(pod.join("labels"), format!("app=\"{name}\"\n")).unwrap();
        std::fs::copy(
            m.meshd.ca_dir.join("root-cert.pem"),
            roots.join("root-cert.pem"),
        )
        .unwrap();
        let (admin_port, status_port) = (free_port(), free_port());
        let meshd = format!("localhost:{}", m.meshd.secure_port);
        let proxy_config = serde_json::json!({
            "binaryPath": envoy_bin(),
            "configPath": dir.join("etc/istio/proxy"),
            "discoveryAddress": meshd,
            "proxyAdminPort": admin_port,
            "statusPort": status_port,
        });
        let log = dir.join("pilot-agent.log");
        let group = crate::cluster::command(&istio_bin().join("pilot-agent"))
            .process_group(0)
            .args(["proxy", "sidecar", "--templateFile"])
            // The bootstrap template Istio's proxy image installs.
            .arg(istio_source().join("tools/packaging/common/envoy_bootstrap.json"))
            .current_dir(&dir)
            .env("PROXY_CONFIG", proxy_config.to_string())
            .env("CA_ADDR", &meshd)
            .env("ECC_SIGNATURE_ALGORITHM", ecc)
            // Short-lived, so that a test sees pilot-agent renew it (at half its life).
            .env("SECRET_TTL", "8s")
            .env("POD_NAME", format!("{name}-0"))
            .env("POD_NAMESPACE", "shop")
            .env("SERVICE_ACCOUNT", name)
            .env("INSTANCE_IP", ip)
            .env("ISTIO_META_INTERCEPTION_MODE", "NONE")
            .env("ISTIO_META_MESHD_OUTBOUND_BIND_INSTANCE_IP", "true")
            .envs(env.iter().copied())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::options().append(true).open(&log).unwrap())
            .spawn()
            .unwrap();
        PilotAgent {
            admin: format!("127.0.0.1:{admin_port}"),
            log,
            group,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A GET of reviews through the Envoy listening at `ip:9080`: status, body and the client
/// certificate reviews' inbound Envoy saw (`x-echo-xfcc`).
fn call_reviews(ip: &str) -> std::io::Result<(u16, String, String)> {
    let r = http_get(
        &format!("{ip}:9080"),
        "reviews.shop.svc.cluster.local",
        "/",
        &[],
    )?;
    let xfcc = r.headers.get("x-echo-xfcc").cloned().unwrap_or_default();
    Ok((r.status, r.body, xfcc))
}

/// Waits until a call through `ip:9080` is answered 200 by reviews; that answer.
fn wait_for_reviews(ip: &str, log: impl Fn() -> String) -> (u16, String, String) {
    let start = Instant::now();
    loop {
        match call_reviews(ip) {
            Ok(answer) if answer.0 == 200 => return answer,
            other => assert!(
                start.elapsed() < Duration::from_secs(30),
                "reviews never answered through {ip}:9080 ({other:?}); pilot-agent's log:\n{}",
                log()
            ),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// pilot-agent as productpage's sidecar: it gets its workload certificate from meshd's CA
/// (its default RSA-2048 key, and again with `ECC_SIGNATURE_ALGORITHM=ECDSA`), serves it
/// to Envoy over SDS, proxies Envoy's xDS to meshd's secure port, and Envoy calls reviews,
/// whose sidecar is `meshd agent`, over mutual TLS; the certificate is renewed before it
/// expires and traffic carries on.
#[test]
fn the_real_pilot_agent_runs_a_client_sidecar_against_meshd() {
    let _ports = fixed_ports();
    let m = crate::mtls::mesh("pilot-agent");
    let _reviews = m.reviews(&[]);
    for (ecc, key) in [("", "1.2.840.113549.1.1.1"), ("ECDSA", "1.2.840.10045.2.1")] {
        let ip = loopback_ip();
        let agent = PilotAgent::start(&m, "productpage", "pp-token", &ip, ecc);
        let (_, body, xfcc) = wait_for_reviews(&ip, || agent.log());
        // reviews' inbound Envoy (meshd's agent) saw productpage's certificate from
        // meshd's CA: the call was mutual TLS.
        assert_eq!(body, "reviews");
        assert!(
            xfcc.contains("URI=spiffe://cluster.local/ns/shop/sa/productpage"),
            "{xfcc:?}"
        );
        let (algorithm, serial) = sds_certificate(&agent.admin);
        assert_eq!(algorithm, key, "ECC_SIGNATURE_ALGORITHM={ecc:?}");
        // Renewed from meshd's CA and pushed to Envoy; traffic carries on.
        let start = Instant::now();
        while sds_certificate(&agent.admin).1 == serial {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "pilot-agent never renewed its certificate; its log:\n{}",
                agent.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(call_reviews(&ip).unwrap().0, 200);
    }
}

/// pilot-agent as reviews' sidecar (its labels from the downward-API file): meshd gives its
/// Envoy reviews' inbound listener, which terminates mutual TLS with the certificate
/// pilot-agent got from meshd and hands the request to the application; the caller is a
/// `meshd agent` sidecar, whose identity the application sees.
#[test]
fn the_real_pilot_agent_runs_a_server_sidecar_against_meshd() {
    let _ports = fixed_ports();
    let m = crate::mtls::mesh("pilot-agent-server");
    let agent = PilotAgent::start(&m, "reviews", "rv-token", &m.server_ip, "");
    let client = m.client("productpage", "pp-token", &[]);
    let (_, body, xfcc) = wait_for_reviews(&client.envoy.ip, || agent.log());
    assert_eq!(body, "reviews");
    assert!(
        xfcc.contains("URI=spiffe://cluster.local/ns/shop/sa/productpage"),
        "{xfcc:?}"
    );
    // The certificate it presented is pilot-agent's: its RSA key.
    assert_eq!(sds_certificate(&agent.admin).0, "1.2.840.113549.1.1.1");
}

/// The IPv4 addresses `server` (a DNS server on 127.0.0.1, over UDP) answers for `name`;
/// none when it does not answer or names none.
fn resolve(server: u16, name: &str) -> Vec<std::net::Ipv4Addr> {
    use hickory_proto::op::{Message, MessageType, OpCode, Query};
    use hickory_proto::rr::{Name, RData, RecordType};
    let mut query = Message::new();
    query
        .set_id(7)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    socket
        .send_to(&query.to_vec().unwrap(), ("127.0.0.1", server))
        .unwrap();
    let mut buf = [0u8; 4096];
    let Ok(n) = socket.recv(&mut buf) else {
        return Vec::new();
    };
    let answer = Message::from_vec(&buf[..n]).unwrap();
    (answer.answers().iter())
        .filter_map(|r| match r.data() {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect()
}

/// pilot-agent capturing DNS (`ISTIO_META_DNS_CAPTURE`), its DNS proxy on a free port
/// (`DNS_PROXY_ADDR`): it asks meshd for the name table over NDS on the xDS stream it
/// proxies, and answers from it: a Kubernetes service by its cluster IP, and a
/// ServiceEntry host written while it runs by the address the entry gives it.
#[test]
fn the_real_pilot_agent_answers_dns_from_meshds_name_table() {
    let _ports = fixed_ports();
    let m = crate::mtls::mesh("pilot-agent-dns");
    let dns = free_port();
    let addr = format!("127.0.0.1:{dns}");
    let env = [
        ("ISTIO_META_DNS_CAPTURE", "true"),
        ("DNS_PROXY_ADDR", &addr),
    ];
    let agent = PilotAgent::start_with(&m, "productpage", "pp-token", &loopback_ip(), "", &env);
    let answers = |name: &str, expected: &str| {
        let start = Instant::now();
        loop {
            let got = resolve(dns, name);
            if got.iter().map(|a| a.to_string()).collect::<Vec<_>>() == [expected] {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{name}: pilot-agent answers {got:?}, not {expected}; its log:\n{}",
                agent.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    answers("reviews.shop.svc.cluster.local.", "10.96.50.1");
    m.meshd.write(
        "partner.yaml",
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: partner, namespace: shop}\nspec:\n  hosts: [api.partner.example]\n  addresses: [240.1.1.7]\n  ports: [{number: 443, name: tls, protocol: TLS}]\n  location: MESH_EXTERNAL\n  resolution: DNS\n",
    );
    answers("api.partner.example.", "240.1.1.7");
}

/// `istioctl proxy-config KIND POD` on an Envoy meshd configured (productpage's `meshd
/// agent` sidecar calling reviews), read live and from files. Live, istioctl finds the pod
/// in the test bed's API server and reaches its admin port through `pods/portforward`, which
/// the API server proxies to the pod's node: a node kwok serves (see `kubelet.rs`), whose
/// port-forward reaches the Envoy. From files, `--file` reads the same Envoy's dumps, and the
/// two print the same. istioctl reads Istio's names back out of meshd's (service, port,
/// subset and direction from the cluster name; the route's virtual host; the endpoint's
/// cluster; the SDS secrets), shows the bootstrap, and sets the Envoy's log levels.
#[test]
fn the_real_istioctl_reads_each_proxy_config_of_an_envoy_meshd_configured() {
    let m = crate::mtls::mesh("istioctl-pc");
    let _reviews = m.reviews(&[]);
    let client = m.client_reaching_reviews("productpage", "pp-token", &[]);
    let dir = temp_dir("istioctl-pc-dump");
    let dump = dir.join("config_dump.json");
    let body = client.envoy.admin("/config_dump?include_eds").unwrap().body;
    std::fs::write(&dump, body).unwrap();
    // `proxy-config endpoint` reads Envoy's /clusters, the others its config dump.
    let clusters = dir.join("clusters.json");
    let body = client.envoy.admin("/clusters?format=json").unwrap().body;
    std::fs::write(&clusters, body).unwrap();

    let cluster = crate::cluster::Cluster::shared();
    let namespace = crate::cluster::Cluster::namespace("istioctl-pc");
    let kubelet = Kubelet::start(
        cluster,
        &[Forward {
            namespace: &namespace,
            pod: "productpage-0",
            port: 15000,
            to: client.envoy.admin_port,
        }],
    );
    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {namespace}}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: productpage-0, namespace: {namespace}}}\nspec:\n  nodeName: {}\n  containers:\n  - {{name: istio-proxy, image: proxyv2}}\n",
            kubelet.node
        ))
        .unwrap();
    kubelet.wait_running(&namespace, "productpage-0");
    let pod = format!("productpage-0.{namespace}");
    let istioctl = |args: &[&str]| {
        let out = Command::new(istio_bin().join("istioctl"))
            .arg("--kubeconfig")
            .arg(&cluster.kubeconfig)
            .args(args)
            .output()
            .expect("running istioctl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "istioctl {args:?}: {text}{}\nkwok's log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            kubelet.log()
        );
        text
    };
    let proxy_config = |kind: &str| {
        let file = if kind == "endpoint" { &clusters } else { &dump };
        let from_file = istioctl(&["proxy-config", kind, "--file", file.to_str().unwrap()]);
        let live = istioctl(&["proxy-config", kind, &pod]);
        assert_eq!(
            live, from_file,
            "istioctl proxy-config {kind}, live and from a file"
        );
        live
    };
    // Each row's whitespace-separated columns.
    let rows = |text: &str| -> Vec<Vec<String>> {
        (text.lines())
            .map(|l| l.split_whitespace().map(String::from).collect())
            .collect()
    };
    let reviews = "reviews.shop.svc.cluster.local";
    let clusters = proxy_config("cluster");
    assert!(
        rows(&clusters).contains(
            &[reviews, "9080", "-", "outbound", "EDS"]
                .map(String::from)
                .to_vec()
        ),
        "{clusters}"
    );
    let routes = proxy_config("route");
    assert!(
        (rows(&routes).iter()).any(|r| r.first().is_some_and(|n| n == "9080")
            && r.iter().any(|c| *c == format!("{reviews}:9080"))),
        "{routes}"
    );
    let endpoints = proxy_config("endpoint");
    let cluster_name = format!("outbound|9080||{reviews}");
    assert!(
        rows(&endpoints).contains(&vec![
            format!("{}:9080", m.server_ip),
            "HEALTHY".into(),
            "OK".into(),
            cluster_name.clone()
        ]),
        "{endpoints}"
    );
    let listeners = proxy_config("listener");
    assert!(
        (listeners.lines()).any(|l| l.split_whitespace().nth(1) == Some("9080")
            && l.trim_end().ends_with("Route: 9080")),
        "{listeners}"
    );
    let secrets = proxy_config("secret");
    assert!(
        (rows(&secrets).iter()).any(|r| r.first().is_some_and(|n| n == "default")
            && r.contains(&"ACTIVE".to_string())),
        "{secrets}"
    );
    assert!(
        (rows(&secrets).iter()).any(|r| r.first().is_some_and(|n| n == "ROOTCA")),
        "{secrets}"
    );
    // The bootstrap, as JSON; the file's has its `lastUpdated` time, the live one not.
    let bootstrap = |source: &str| -> serde_json::Value {
        let text = istioctl(&["proxy-config", "bootstrap", source]);
        let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
        json.as_object_mut().unwrap().remove("lastUpdated");
        json
    };
    let live = bootstrap(&pod);
    assert_eq!(live, bootstrap(&format!("--file={}", dump.display())));
    let admin = &live["bootstrap"]["admin"]["address"]["socketAddress"]["portValue"];
    assert_eq!(*admin, client.envoy.admin_port, "{live}");

    // `proxy-config log` changes the Envoy's levels through the same port-forward.
    let before = client.envoy.admin_post("/logging").unwrap().body;
    assert!(!before.contains("http: debug"), "{before}");
    let levels = istioctl(&["proxy-config", "log", &pod, "--level", "http:debug"]);
    assert!(levels.contains("http: debug"), "{levels}");
    let after = client.envoy.admin_post("/logging").unwrap().body;
    assert!(after.contains("http: debug"), "{after}");
}

/// `meshd validate` against the real `istioctl analyze --use-kube=false -A` on the same
/// files: each case's meshd verdict and istioctl's message codes. They agree on schema
/// errors (istioctl's IST0106); istioctl's cross-object checks (IST0101: a referenced
/// gateway or subset that does not exist) are not `meshd validate`'s, which, like
/// `istioctl validate`, checks each object alone. docs/compatibility.md records this.
#[test]
fn meshd_validate_and_istioctl_analyze_agree_on_schema_errors() {
    let dir = temp_dir("analyze");
    let service = "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: reviews, namespace: shop}\nspec: {selector: {app: reviews}, ports: [{name: http, port: 9080}]}\n";
    std::fs::write(dir.join("service.yaml"), service).unwrap();
    let vs = |route: &str, extra: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  hosts: [reviews]\n{extra}  http:\n  - route: [{route}]\n"
        )
    };
    let cases = [
        (
            "bad-regex",
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: shop}\nspec:\n  hosts: [reviews]\n  http:\n  - match: [{uri: {regex: '(unclosed'}}]\n    route: [{destination: {host: reviews}}]\n".to_string(),
            (false, "IST0106"),
        ),
        (
            "negative-max-connections",
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews, namespace: shop}\nspec:\n  host: reviews\n  trafficPolicy: {connectionPool: {tcp: {maxConnections: -1}}}\n".to_string(),
            (false, "IST0106"),
        ),
        (
            "missing-gateway",
            vs("{destination: {host: reviews}}", "  gateways: [missing-gateway]\n"),
            (true, "IST0101 IST0132"),
        ),
        (
            "missing-subset",
            vs("{destination: {host: reviews, subset: v9}}", ""),
            (true, "IST0101"),
        ),
        ("valid", vs("{destination: {host: reviews}}", ""), (true, "")),
    ];
    for (name, yaml, expected) in cases {
        let file = dir.join(format!("{name}.yaml"));
        std::fs::write(&file, yaml).unwrap();
        let meshd = Command::new(env!("CARGO_BIN_EXE_meshd"))
            .args(["validate", "-f"])
            .arg(dir.join("service.yaml"))
            .arg("-f")
            .arg(&file)
            .output()
            .unwrap();
        let analyze = Command::new(istio_bin().join("istioctl"))
            .args(["analyze", "--use-kube=false", "-A"])
            .arg(dir.join("service.yaml"))
            .arg(&file)
            .output()
            .expect("running istioctl");
        let text = String::from_utf8_lossy(&analyze.stdout).into_owned()
            + &String::from_utf8_lossy(&analyze.stderr);
        let codes: Vec<&str> = (text.lines())
            .filter_map(|l| l.split_once(" [IST")?.1.split_once(']'))
            .map(|(code, _)| code)
            .collect();
        let codes = codes
            .iter()
            .map(|c| format!("IST{c}"))
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(
            (meshd.status.success(), codes.as_str()),
            expected,
            "{name}: meshd validate {}\nistioctl analyze {text}",
            String::from_utf8_lossy(&meshd.stderr)
        );
    }
}
