//! The corpus of the parity harness (`parity.rs`): Bookinfo, plain and secured, in CI, and
//! with Istio's own xDS benchmark configurations under `just parity`.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::json;

use crate::cluster::Tenant;
use crate::parity::{CaseResult, Proxy, report_dir, run_case, share_table};

/// examples/bookinfo in the tenant's namespace (the API server assigns the cluster IPs).
pub fn bookinfo() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/bookinfo");
    let mut yaml = String::new();
    for file in [
        "services.yaml",
        "destination-rules.yaml",
        "virtual-services.yaml",
        "gateway.yaml",
    ] {
        yaml.push_str(&std::fs::read_to_string(dir.join(file)).unwrap());
        yaml.push_str("\n---\n");
    }
    // The API server refuses loopback endpoints: each pod gets an address of its own.
    let mut pods = 0;
    yaml.lines()
        .filter(|l| !l.trim_start().starts_with("clusterIP:"))
        .map(|l| {
            let l = l.replace("namespace: bookinfo", "namespace: shop");
            if l.contains("addresses: [127.0.0.1]") {
                pods += 1;
                l.replace("127.0.0.1", &format!("10.1.1.{pods}"))
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The Bookinfo proxies: productpage's and reviews-v1's sidecars and the gateway.
pub fn bookinfo_proxies(t: &Tenant) -> Vec<Proxy> {
    vec![
        Proxy::sidecar(
            "productpage",
            &t.app,
            "productpage-v1",
            "10.1.0.10",
            json!({"app": "productpage", "version": "v1"}),
            "bookinfo-productpage",
        ),
        Proxy::sidecar(
            "reviews",
            &t.app,
            "reviews-v1",
            "10.1.0.11",
            json!({"app": "reviews", "version": "v1"}),
            "bookinfo-reviews",
        ),
        Proxy::gateway("gateway", &t.system, "10.1.0.2"),
    ]
}

/// Bookinfo under STRICT mTLS, with an authorization policy on productpage, reviews'
/// sidecar scoped to ratings, Telemetry metrics overrides in the namespace and for
/// reviews (one tag set per metric: Go encodes a map in no fixed order), and a gateway
/// TLS server terminating mesh mTLS (ISTIO_MUTUAL) in front of ratings over TCP.
pub fn bookinfo_secured() -> String {
    let extra = r#"
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: shop}
spec:
  mtls: {mode: STRICT}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: productpage, namespace: shop}
spec:
  selector:
    matchLabels: {app: productpage}
  action: ALLOW
  rules:
  - from:
    - source:
        principals: [cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account]
    to:
    - operation:
        methods: [GET]
        paths: [/productpage, /static/*]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: reviews, namespace: shop}
spec:
  workloadSelector:
    labels: {app: reviews}
  egress:
  - hosts: [./ratings.shop.svc.cluster.local]
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: metrics, namespace: shop}
spec:
  metrics:
  - providers: [{name: prometheus}]
    reportingInterval: 15s
    overrides:
    - match: {metric: REQUEST_COUNT, mode: CLIENT}
      tagOverrides:
        request_host: {value: request.host}
    - match: {metric: REQUEST_DURATION}
      disabled: true
    - match: {mode: SERVER}
      tagOverrides:
        grpc_response_status: {operation: REMOVE}
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: reviews, namespace: shop}
spec:
  selector:
    matchLabels: {app: reviews}
  metrics:
  - overrides:
    - match: {metric: ALL_METRICS, mode: SERVER}
      disabled: true
    - match: {customMetric: reviews_shown_total, mode: CLIENT}
      tagOverrides:
        page: {value: "request.url_path"}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: mesh-tcp, namespace: shop}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 9443, name: tls-mesh, protocol: TLS}
    hosts: ["*"]
    tls: {mode: ISTIO_MUTUAL}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: mesh-tcp, namespace: shop}
spec:
  hosts: ["*"]
  gateways: [mesh-tcp]
  tcp:
  - route: [{destination: {host: ratings, port: {number: 9080}}}]
"#;
    format!("{}\n---\n{extra}", bookinfo())
}

/// Istio's xDS benchmark configuration `name` (`istio_configs::render`) with every object
/// in the tenant's application namespace (the benchmark's `default`, `gateway` and
/// `knative-serving`) or its system namespace.
pub fn istio_benchmark(name: &str, services: usize, instances: usize) -> String {
    crate::istio_configs::render(name, services, instances)
        .replace("namespace: default", "namespace: shop")
        .replace("namespace: gateway", "namespace: shop")
        .replace("namespace: knative-serving", "namespace: shop")
        .replace("- gateway/", "- shop/")
        .replace("- knative-serving/", "- shop/")
}

/// The proxies Istio's benchmarks generate for: a sidecar at 1.1.1.1 labelled
/// `istio.io/benchmark: "true"`, and a gateway with the same labels.
pub fn benchmark_proxies(t: &Tenant) -> Vec<Proxy> {
    let labels = json!({"istio.io/benchmark": "true"});
    vec![
        Proxy::sidecar(
            "sidecar",
            &t.app,
            "v0",
            "1.1.1.1",
            labels.clone(),
            "default",
        ),
        Proxy::router("router", &t.app, "1.1.1.2", labels),
    ]
}

/// Istio's benchmark configurations the corpus runs: those of its push-context and
/// generation benchmarks, and two more of its files (`empty`, `secrets`).
fn corpus_configs() -> impl Iterator<Item = &'static str> {
    let cases = crate::istio_configs::CASES.iter().map(|(name, ..)| *name);
    cases.chain(["empty", "secrets"])
}

/// Panics, naming each, if either side sends a resource the other does not.
fn assert_same_resources(result: &CaseResult) {
    let mut problems = String::new();
    for (proxy, types) in &result.by_proxy {
        for (short, d) in types {
            if !d.only_istiod.is_empty() || !d.only_meshd.is_empty() {
                let _ = writeln!(
                    problems,
                    "{proxy} {short}: only istiod {:?}, only meshd {:?}",
                    d.only_istiod, d.only_meshd
                );
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{}: istiod and meshd send different resources (target/parity/{}/report.md):\n{problems}",
        result.name,
        result.name
    );
    // The nodes are istio-proxy's: both send Istio's filters, byte for byte the same.
    assert!(
        result.istio_filter_differences.is_empty(),
        "{}: Istio's filters differ in {:?}",
        result.name,
        result.istio_filter_differences
    );
}

/// The CI cases: Bookinfo, plain and secured, through istiod and meshd. Every proxy gets
/// the same clusters, endpoints, listeners and routes by name from both, and the same
/// Istio filters in each cluster and listener; the shares of identical fields are reported
/// (docs/compatibility.md records them).
#[test]
fn bookinfo_gets_the_resources_istiod_sends() {
    let plain = run_case("bookinfo", &bookinfo(), bookinfo_proxies);
    let secured = run_case("bookinfo-secured", &bookinfo_secured(), bookinfo_proxies);
    let results = [plain, secured];
    std::fs::write(report_dir().join("ci.md"), share_table(&results)).unwrap();
    eprintln!("{}", share_table(&results));
    results.iter().for_each(assert_same_resources);
}

/// `just parity`: the CI cases and Istio's own benchmark configurations (20 services, 50
/// instances each), side by side with istiod; `target/parity/summary.md` has the shares
/// per case and in all, and each case's report the differences.
#[test]
#[ignore = "the whole corpus; run by `just parity`"]
fn the_corpus_side_by_side_with_istiod() {
    let mut results = vec![
        run_case("bookinfo", &bookinfo(), bookinfo_proxies),
        run_case("bookinfo-secured", &bookinfo_secured(), bookinfo_proxies),
    ];
    for name in corpus_configs() {
        results.push(run_case(
            name,
            &istio_benchmark(name, 20, 50),
            benchmark_proxies,
        ));
    }
    let mut summary = String::from("# Parity with istiod: the corpus\n\n## In all\n\n");
    summary.push_str(&share_table(&results));
    for r in &results {
        let _ = write!(
            summary,
            "\n## {}\n\n{}",
            r.name,
            share_table(std::slice::from_ref(r))
        );
    }
    std::fs::write(report_dir().join("summary.md"), &summary).unwrap();
    eprintln!("{summary}");
}
