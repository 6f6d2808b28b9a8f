//! Certificate signing through each server's CA API, meshd and Istio's real istiod in one
//! sitting: the test bed's kube-apiserver and etcd, meshd in Kubernetes mode (it writes
//! its P-256 root to `istio-ca-secret`) and istiod (`pilot-discovery`, built by
//! `tools/build.sh istio`) started after it in the same namespace, so both sign under the
//! same root key. The same client sends the same P-256 CSR to each server's secure port
//! (Istio's 15012) over TLS, two ways:
//! - `token`: a workload's first certificate, authenticated by a service-account token the
//!   server checks with a TokenReview (the API server shares the machine);
//! - `client_certificate`: a renewal, authenticated by the workload's current certificate.
//!
//! For each: certificates per second and the server's CPU per certificate (from its own
//! `process_cpu_seconds_total`). istiod runs twice: as installed, and with its API client's
//! rate limit raised (its TokenReviews pass through that limit). Prints, and writes to
//! `target/ca-istiod.json`, all three and the ratios in meshd's favour. Nothing here
//! asserts a time.
//!
//! `cargo bench --features loadgen --bench ca_istiod [-- SECONDS]` (`just bench-ca-istiod`).

#![allow(dead_code)]

#[path = "support/ca_load.rs"]
mod ca_load;
#[path = "../tests/e2e/cluster.rs"]
mod cluster;
#[path = "../tests/e2e/harness.rs"]
mod harness;
#[path = "../tests/e2e/istiod.rs"]
mod istiod;

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use meshd::ca::csr;
use meshd::ca::material::key_to_pem;
use meshd::ca::service::pb::IstioCertificateRequest;
use meshd::ca::service::pb::istio_certificate_service_client::IstioCertificateServiceClient;
use p256::ecdsa::SigningKey;
use p256::elliptic_curve::Generate;
use serde_json::{Value, json};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Requests in flight, spread over this many connections, as many agents renewing at once.
const IN_FLIGHT: usize = 16;
const CONNECTIONS: usize = 4;

/// One server's secure port as a client sees it.
struct Server {
    name: &'static str,
    port: u16,
    /// The name its serving certificate carries.
    domain: String,
    monitoring: String,
}

/// `CONNECTIONS` TLS channels to `server` trusting `root`, presenting `identity` if given.
async fn channels(server: &Server, root: &str, identity: Option<(&str, &str)>) -> Vec<Channel> {
    let mut all = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(root))
            .domain_name(&server.domain);
        if let Some((chain, key)) = identity {
            tls = tls.identity(Identity::from_pem(chain, key));
        }
        let channel = Endpoint::from_shared(format!("https://127.0.0.1:{}", server.port))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap_or_else(|e| panic!("TLS to {}'s secure port: {e:?}", server.name));
        all.push(channel);
    }
    all
}

/// The server's own CPU seconds so far.
fn cpu_seconds(server: &Server) -> f64 {
    let metrics = harness::http_get(&server.monitoring, server.name, "/metrics", &[])
        .unwrap_or_else(|e| panic!("{}'s /metrics: {e}", server.name));
    metrics
        .body
        .lines()
        .find_map(|l| l.strip_prefix("process_cpu_seconds_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{} exports no process_cpu_seconds_total", server.name))
}

/// One load run: rate and the server's CPU per certificate.
async fn measure(
    server: &Server,
    channels: &[Channel],
    token: Option<&str>,
    csr: &str,
    seconds: f64,
) -> Value {
    let before = cpu_seconds(server);
    let (issued, took) = ca_load::drive(channels, token, csr, IN_FLIGHT, seconds).await;
    let cpu = cpu_seconds(server) - before;
    json!({
        "certificates": issued,
        "seconds": took,
        "per_second": issued as f64 / took,
        "cpu_us_per_certificate": cpu * 1e6 / issued.max(1) as f64,
    })
}

/// Both ways through one server: a token first (whose certificate then authenticates the
/// renewals).
async fn server_figures(
    server: &Server,
    root: &str,
    token: &str,
    csr: &str,
    seconds: f64,
) -> Value {
    let plain = channels(server, root, None).await;
    let mut request = tonic::Request::new(IstioCertificateRequest {
        csr: csr.to_string(),
        validity_duration: 3600,
        metadata: None,
    });
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let chain = IstioCertificateServiceClient::new(plain[0].clone())
        .create_certificate(request)
        .await
        .unwrap_or_else(|e| panic!("{} refused the workload's token: {e}", server.name))
        .into_inner()
        .cert_chain;
    let by_token = measure(server, &plain, Some(token), csr, seconds).await;
    let key = KEY.get().unwrap();
    let with_cert = channels(server, root, Some((&chain[0], key))).await;
    let by_cert = measure(server, &with_cert, None, csr, seconds).await;
    json!({"token": by_token, "client_certificate": by_cert})
}

/// The workload's key, PEM, for its TLS client identity.
static KEY: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn main() {
    let seconds: f64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10.0);
    let root_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let cluster: &'static cluster::Cluster =
        Box::leak(Box::new(cluster::Cluster::start("bench-ca-istiod", &[])));
    let t = cluster::Tenant::of(cluster, "ca-istiod", "");
    t.apply("apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: reviews, namespace: shop}\n")
        .unwrap();
    let meshd = harness::Meshd::start_tenant(&t, "meshd", &[], &[]);
    harness::wait_until("meshd's CA secret", Duration::from_secs(60), || {
        !cluster
            .object("Secret", &t.system, "istio-ca-secret")
            .is_null()
    });
    let secret = cluster.object("Secret", &t.system, "istio-ca-secret");
    let root = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(secret["data"]["root-cert.pem"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    let token = cluster.token(&t.app, "reviews", "istio-ca", 3600);
    let key = SigningKey::generate();
    KEY.set(key_to_pem(&key).unwrap()).unwrap();
    let csr = csr::build(
        &key,
        &format!("spiffe://cluster.local/ns/{}/sa/reviews", t.app),
    )
    .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut figures = Vec::new();
    let server = Server {
        name: "meshd",
        port: meshd.secure_port,
        domain: "localhost".into(),
        monitoring: format!("127.0.0.1:{}", meshd.monitoring_port),
    };
    figures.push(runtime.block_on(server_figures(&server, &root, &token, &csr, seconds)));
    drop(meshd);
    // istiod as installed, then with its API client's rate limit (`--kubernetesApiQPS`
    // 80, `--kubernetesApiBurst` 160 by default), which every TokenReview passes through,
    // raised out of the way: one at a time, as they share the namespace.
    let unlimited: &[&str] = &[
        "--kubernetesApiQPS",
        "1000000",
        "--kubernetesApiBurst",
        "1000000",
    ];
    for (n, extra) in [&[][..], unlimited].into_iter().enumerate() {
        let dir = t.dir.join(format!("istiod-{n}"));
        let istiod = istiod::Istiod::start_with(cluster, &t.system, &dir, extra);
        let server = Server {
            name: "istiod",
            port: istiod.secure_port,
            domain: format!("istiod.{}.svc", t.system),
            monitoring: format!("127.0.0.1:{}", istiod.monitoring_port),
        };
        figures.push(runtime.block_on(server_figures(&server, &root, &token, &csr, seconds)));
    }
    let (m, i, unlimited) = (&figures[0], &figures[1], &figures[2]);
    // As `benches/istiod.rs` writes its ratios.
    let ratio = |i: &Value, way: &str, figure: &str, more_is_better: bool| {
        let (m, i) = (
            m[way][figure].as_f64().unwrap(),
            i[way][figure].as_f64().unwrap(),
        );
        json!({"istiod": i, "meshd": m, "ratio": if more_is_better { m / i } else { i / m }})
    };
    let ratios = |i: &Value| {
        json!({
            "token_per_second": ratio(i, "token", "per_second", true),
            "token_cpu_per_certificate": ratio(i, "token", "cpu_us_per_certificate", false),
            "client_certificate_per_second": ratio(i, "client_certificate", "per_second", true),
            "client_certificate_cpu_per_certificate": ratio(i, "client_certificate", "cpu_us_per_certificate", false),
        })
    };
    let summary = json!({
        "seconds": seconds,
        "in_flight": IN_FLIGHT,
        "connections": CONNECTIONS,
        "meshd": m,
        "istiod": i,
        "istiod_api_limit_raised": unlimited,
        "ratios": ratios(i),
        "ratios_api_limit_raised": ratios(unlimited),
    });
    std::fs::write(
        root_dir.join("target/ca-istiod.json"),
        format!("{summary:#}\n"),
    )
    .unwrap();
    println!("{summary:#}");
}
