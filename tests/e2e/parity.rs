//! Configuration parity with istiod: the same objects in the test bed's real API server are
//! served by Istio's real istiod (`pilot-discovery`, built by `tools/build.sh istio`) and by
//! meshd, each in Kubernetes mode and scoped to one tenant's namespaces. The same sidecar and
//! gateway nodes (identical ids and metadata) fetch CDS, EDS, LDS and RDS from each over
//! delta ADS, and `parity_diff` compares the answers. Each case writes its report and both
//! sides' JSON under `target/parity/`.
//!
//! The cases are in `parity_corpus.rs`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use envoy_api::pb::envoy::config::core::v3::{Extension, Node};
use envoy_api::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, aggregated_discovery_service_client::AggregatedDiscoveryServiceClient,
};
use serde_json::{Value as Json, json};

use crate::cluster::Tenant;
use crate::harness::{Meshd, wait_until};
use crate::istiod::Istiod;
use crate::parity_diff::{TypeDiff, compare, pattern, resource_json};

pub const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const TYPES: [(&str, &str); 4] = [("cds", CDS), ("eds", EDS), ("lds", LDS), ("rds", RDS)];

/// The Istio release the proxies say they run (`ISTIO_VERSION`): the one the pinned istiod
/// is built from, so that neither side holds back a feature for an older proxy.
const PROXY_VERSION: &str = "1.29.0";

/// A proxy both control planes are asked about.
#[derive(Clone, Debug)]
pub struct Proxy {
    /// A short name for the report (`productpage`, `gateway`).
    pub name: String,
    pub node: Node,
    /// Its namespace and service account: whose token it shows meshd's secure port.
    pub namespace: String,
    pub account: String,
}

impl Proxy {
    /// A sidecar as pilot-agent identifies it: pod `pod` of `namespace` at `ip`, with
    /// `labels` and the service account `account`.
    pub fn sidecar(
        name: &str,
        namespace: &str,
        pod: &str,
        ip: &str,
        labels: Json,
        account: &str,
    ) -> Proxy {
        let id = format!("sidecar~{ip}~{pod}.{namespace}~{namespace}.svc.cluster.local");
        Proxy::node(name, &id, namespace, pod, ip, labels, account)
    }

    /// An ingress gateway (`router` node) in `namespace`.
    pub fn gateway(name: &str, namespace: &str, ip: &str) -> Proxy {
        let labels = json!({"app": "istio-ingressgateway", "istio": "ingressgateway"});
        Proxy::router(name, namespace, ip, labels)
    }

    /// A gateway (`router` node) in `namespace` with `labels`.
    pub fn router(name: &str, namespace: &str, ip: &str, labels: Json) -> Proxy {
        let pod = "istio-ingressgateway-0";
        let id = format!("router~{ip}~{pod}.{namespace}~{namespace}.svc.cluster.local");
        Proxy::node(
            name,
            &id,
            namespace,
            pod,
            ip,
            labels,
            "istio-ingressgateway-service-account",
        )
    }

    fn node(
        name: &str,
        id: &str,
        namespace: &str,
        pod: &str,
        ip: &str,
        labels: Json,
        account: &str,
    ) -> Proxy {
        let workload = labels["app"].as_str().unwrap_or(pod).to_string();
        let metadata = json!({
            "NAMESPACE": namespace,
            "NAME": pod,
            "LABELS": labels,
            "ISTIO_VERSION": PROXY_VERSION,
            "CLUSTER_ID": "Kubernetes",
            "MESH_ID": "cluster.local",
            "INTERCEPTION_MODE": "REDIRECT",
            "SERVICE_ACCOUNT": account,
            "WORKLOAD_NAME": workload,
            "INSTANCE_IPS": ip,
            "ENVOY_STATUS_PORT": 15021,
            "ENVOY_PROMETHEUS_PORT": 15090,
        });
        Proxy {
            name: name.into(),
            node: Node {
                id: id.into(),
                cluster: format!("{workload}.{namespace}"),
                metadata: metadata.as_object().map(translate::json_struct),
                // What istio-proxy's Envoy reports among the extensions it was built with,
                // by which both control planes may know it.
                extensions: vec![Extension {
                    name: model::proxy::ISTIO_STATS_EXTENSION.into(),
                    category: "envoy.filters.http".into(),
                    type_urls: vec!["stats.PluginConfig".into()],
                    ..Default::default()
                }],
                ..Default::default()
            },
            namespace: namespace.into(),
            account: account.into(),
        }
    }
}

/// What one control plane sends one proxy: per type, name → JSON.
pub type Fetched = BTreeMap<&'static str, BTreeMap<String, Json>>;

/// Where a proxy reaches a control plane, as a sidecar does.
#[derive(Clone)]
pub enum Server {
    /// istiod's plaintext port (15010), which serves any node everything, mTLS included.
    Plain(u16),
    /// meshd's secure port (15012), verified against `root`, with the proxy's service-account
    /// token (`token` of its `namespace/account`): meshd sends mTLS settings only to a
    /// proxy that proved its identity, as a sidecar does with its token or certificate.
    Secure {
        port: u16,
        root: String,
        tokens: BTreeMap<String, String>,
    },
}

impl Server {
    fn port(&self) -> u16 {
        match self {
            Server::Plain(port) | Server::Secure { port, .. } => *port,
        }
    }
}

/// Connects to `server` as `proxy` over delta ADS, asks for every cluster and listener,
/// then for the endpoints and routes they name, ACKs each answer, and returns what it
/// holds once the server has been quiet for a second.
pub async fn fetch(server: &Server, proxy: &Proxy) -> Fetched {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
    let port = server.port();
    let (channel, token) = match server {
        Server::Plain(_) => (
            Endpoint::from_shared(format!("http://127.0.0.1:{port}")).unwrap(),
            None,
        ),
        Server::Secure { root, tokens, .. } => {
            let tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(root))
                .domain_name("localhost");
            let endpoint = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
                .unwrap()
                .tls_config(tls)
                .unwrap();
            let who = format!("{}/{}", proxy.namespace, proxy.account);
            (endpoint, Some(tokens[&who].clone()))
        }
    };
    let channel = channel
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connecting to 127.0.0.1:{port}: {e}"));
    let request = |type_url: &str, subscribe: Vec<String>, nonce: String, first: bool| {
        DeltaDiscoveryRequest {
            node: first.then(|| proxy.node.clone()),
            type_url: type_url.into(),
            resource_names_subscribe: subscribe,
            response_nonce: nonce,
            ..Default::default()
        }
    };
    // The first requests go before the call: a gRPC server may send its headers only
    // with its first answer.
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tx.send(request(CDS, vec![], String::new(), true))
        .await
        .unwrap();
    tx.send(request(LDS, vec![], String::new(), false))
        .await
        .unwrap();
    let mut call = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    if let Some(token) = token {
        let bearer = format!("Bearer {token}").parse().unwrap();
        call.metadata_mut().insert("authorization", bearer);
    }
    let mut stream = AggregatedDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(64 << 20)
        .delta_aggregated_resources(call)
        .await
        .unwrap_or_else(|e| panic!("delta ADS to {port} as {}: {e}", proxy.name))
        .into_inner();
    let mut held: BTreeMap<String, BTreeMap<String, Json>> = BTreeMap::new();
    let mut asked: BTreeMap<&str, std::collections::BTreeSet<String>> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let wanted = [CDS, LDS]
            .into_iter()
            .chain(asked.iter().filter(|(_, n)| !n.is_empty()).map(|(t, _)| *t));
        let complete = wanted.into_iter().all(|t| held.contains_key(t));
        let wait = if complete {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(20)
        };
        let next = tokio::time::timeout(wait, stream.message()).await;
        let response = match next {
            Err(_) if complete => break,
            Err(_) => panic!("{} on {port}: no answer for {held:?}", proxy.name),
            Ok(r) => r
                .unwrap_or_else(|e| panic!("{} on {port}: {e}", proxy.name))
                .unwrap_or_else(|| panic!("{} on {port}: stream closed", proxy.name)),
        };
        assert!(
            Instant::now() < deadline,
            "{} on {port}: never quiet",
            proxy.name
        );
        let of_type = held.entry(response.type_url.clone()).or_default();
        for r in &response.resources {
            let Some(any) = &r.resource else { continue };
            of_type.insert(r.name.clone(), resource_json(&any.type_url, &any.value));
        }
        for gone in &response.removed_resources {
            of_type.remove(gone);
        }
        tx.send(request(
            &response.type_url,
            vec![],
            response.nonce.clone(),
            false,
        ))
        .await
        .unwrap();
        // The endpoints and routes the clusters and listeners name.
        let (dependent, names) = match response.type_url.as_str() {
            CDS => (EDS, eds_names(of_type)),
            LDS => (RDS, rds_names(of_type)),
            _ => continue,
        };
        let known = asked.entry(dependent).or_default();
        let new: Vec<String> = names.into_iter().filter(|n| !known.contains(n)).collect();
        if !new.is_empty() {
            known.extend(new.iter().cloned());
            tx.send(request(dependent, new, String::new(), false))
                .await
                .unwrap();
        }
    }
    TYPES
        .iter()
        .map(|(short, url)| (*short, held.remove(*url).unwrap_or_default()))
        .collect()
}

fn eds_names(clusters: &BTreeMap<String, Json>) -> Vec<String> {
    clusters
        .iter()
        .filter(|(_, c)| c["type"] == "EDS")
        .map(|(name, c)| {
            c["eds_cluster_config"]["service_name"]
                .as_str()
                .unwrap_or(name)
                .to_string()
        })
        .collect()
}

fn rds_names(listeners: &BTreeMap<String, Json>) -> Vec<String> {
    fn find(json: &Json, out: &mut Vec<String>) {
        match json {
            Json::Object(map) => {
                if let Some(name) = map.get("route_config_name").and_then(Json::as_str) {
                    out.push(name.to_string());
                }
                map.values().for_each(|v| find(v, out));
            }
            Json::Array(items) => items.iter().for_each(|v| find(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    listeners.values().for_each(|l| find(l, &mut out));
    out.sort();
    out.dedup();
    out
}

/// One case's result: per proxy, per type.
pub struct CaseResult {
    pub name: String,
    pub by_proxy: Vec<(String, BTreeMap<&'static str, TypeDiff>)>,
    /// Clusters and listeners both sides send whose Istio filters ([`istio_filters`])
    /// differ: `PROXY TYPE RESOURCE`.
    pub istio_filter_differences: Vec<String>,
}

impl CaseResult {
    /// Every proxy's comparison of one type, added up.
    pub fn total(&self, short: &str) -> TypeDiff {
        let mut sum = TypeDiff::default();
        for (_, types) in &self.by_proxy {
            sum.add(&types[short]);
        }
        sum
    }

    /// The report: per type, the resources only one side sends, the shares identical,
    /// and each differing field pattern with how often it differs and one example.
    pub fn report(&self) -> String {
        let mut out = format!("# Parity with istiod: {}\n\n", self.name);
        out.push_str(&share_table(std::slice::from_ref(self)));
        for (proxy, types) in &self.by_proxy {
            for (short, d) in types {
                if d.only_istiod.is_empty() && d.only_meshd.is_empty() && d.differences.is_empty() {
                    continue;
                }
                let _ = writeln!(out, "\n## {proxy} {short}\n");
                for n in &d.only_istiod {
                    let _ = writeln!(out, "- only istiod: `{n}`");
                }
                for n in &d.only_meshd {
                    let _ = writeln!(out, "- only meshd: `{n}`");
                }
                let mut patterns: BTreeMap<String, (usize, String)> = BTreeMap::new();
                for (path, theirs, ours) in &d.differences {
                    let e = patterns.entry(pattern(path)).or_insert((0, String::new()));
                    e.0 += 1;
                    if e.1.is_empty() {
                        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "—".into());
                        e.1 = format!("`{path}`: istiod {} / meshd {}", show(theirs), show(ours));
                    }
                }
                for (p, (count, example)) in patterns {
                    let _ = writeln!(out, "- `{p}` ×{count}, e.g. {example}");
                }
            }
        }
        if !self.istio_filter_differences.is_empty() {
            out.push_str("\n## Istio's filters differ in\n\n");
            for r in &self.istio_filter_differences {
                let _ = writeln!(out, "- `{r}`");
            }
        }
        out
    }
}

/// The shares of resources and of fields identical to istiod's, per type, over `cases`.
pub fn share_table(cases: &[CaseResult]) -> String {
    let mut out = String::from(
        "| type | resources (both / only istiod / only meshd) | identical resources | identical fields |\n|---|---|---|---|\n",
    );
    for (short, _) in TYPES {
        let mut sum = TypeDiff::default();
        cases.iter().for_each(|c| sum.add(&c.total(short)));
        let _ = writeln!(
            out,
            "| {short} | {} / {} / {} | {:.1}% | {:.1}% ({} of {}) |",
            sum.common,
            sum.only_istiod.len(),
            sum.only_meshd.len(),
            100.0 * sum.resource_share(),
            100.0 * sum.field_share(),
            sum.identical_fields,
            sum.fields,
        );
    }
    out
}

/// Where reports go: `target/parity/`.
pub fn report_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/parity");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Applies `yaml` (written for namespaces `shop` and `istio-system`) to a fresh tenant,
/// starts istiod and meshd on it, asks both about each of `proxies` (built for the
/// tenant's app and system namespaces), compares, and writes the report and both sides'
/// JSON under `target/parity/NAME/`.
/// The environment both control planes run with: labels the metadata exchange carries
/// beyond Istio's own (listed unsorted and once twice, as an operator might).
const ENV: &[(&str, &str)] = &[("PILOT_MX_ADDITIONAL_LABELS", "team,cost-center,team")];

pub fn run_case(name: &str, yaml: &str, proxies: impl Fn(&Tenant) -> Vec<Proxy>) -> CaseResult {
    let t = Tenant::new(&format!("parity-{name}"), "");
    // istiod watches every namespace unless told otherwise; meshd the tenant's.
    // Metrics collected by Prometheus, as Istio's chart configures every mesh.
    let mesh = format!(
        "defaultProviders:\n  metrics: [prometheus]\ndiscoverySelectors:\n- matchExpressions:\n  - {{key: kubernetes.io/metadata.name, operator: In, values: [{}, {}]}}\n",
        t.app, t.system
    );
    t.apply(&t.mesh_configmap("", &mesh)).unwrap();
    // References by `shop/NAME` (gateways, principals) too.
    t.apply(&yaml.replace("shop/", &format!("{}/", t.app)))
        .unwrap_or_else(|e| panic!("{name}: the API server refused the case: {e}"));
    // istiod first: it writes `istio-ca-secret` (its RSA root, which meshd takes over) and
    // the ServiceEntries' auto-allocated addresses, which meshd keeps. Two allocators
    // starting together give some entries the same address, and the pinned istiod panics
    // resolving such a conflict (`ipallocate.resolveConflict`).
    let istiod = Istiod::start_with_env(t.cluster, &t.system, &t.dir.join("istiod"), &[], ENV);
    let entries = || {
        t.cluster
            .kubectl(&["get", "serviceentries", "-A", "-o", "json"], None)
            .unwrap_or_default()
    };
    let mut last = entries();
    wait_until(
        "istiod's addresses to settle",
        Duration::from_secs(60),
        || {
            std::thread::sleep(Duration::from_millis(500));
            let now = entries();
            let settled = now == last;
            last = now;
            settled
        },
    );
    let meshd = Meshd::start_tenant(&t, "meshd", &[], ENV);
    let proxies = proxies(&t);
    let istiod_server = Server::Plain(istiod.xds_port);
    let meshd_server = secure_meshd(&t, &meshd, &proxies);
    let out = report_dir().join(name);
    std::fs::create_dir_all(&out).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut by_proxy = Vec::new();
    let mut istio_filter_differences = Vec::new();
    for proxy in &proxies {
        // Both have read the API by the time they answer ready; a proxy's first answer can
        // still precede the last object, so each side is asked until two answers agree.
        let theirs = runtime.block_on(settled(&istiod_server, proxy));
        let ours = runtime.block_on(settled(&meshd_server, proxy));
        for (side, fetched) in [("istiod", &theirs), ("meshd", &ours)] {
            let file = out.join(format!("{}.{side}.json", proxy.name));
            std::fs::write(file, serde_json::to_string_pretty(fetched).unwrap()).unwrap();
        }
        let types = TYPES
            .iter()
            .map(|(short, _)| (*short, compare(&theirs[short], &ours[short])))
            .collect();
        by_proxy.push((proxy.name.clone(), types));
        for short in ["cds", "lds"] {
            for (resource, json) in &theirs[short] {
                if let Some(mine) = ours[short].get(resource)
                    && istio_filters(json) != istio_filters(mine)
                {
                    istio_filter_differences.push(format!("{} {short} {resource}", proxy.name));
                }
            }
        }
    }
    let _ = std::fs::write(out.join("istiod.log"), istiod.log());
    let result = CaseResult {
        name: name.into(),
        by_proxy,
        istio_filter_differences,
    };
    std::fs::write(out.join("report.md"), result.report()).unwrap();
    result
}

/// The distinct filters named `istio.*` anywhere in a resource (cluster, network and HTTP
/// filters), each as its JSON: name and configuration, Istio's own types by their bytes.
pub fn istio_filters(resource: &Json) -> std::collections::BTreeSet<String> {
    fn walk(json: &Json, out: &mut std::collections::BTreeSet<String>) {
        match json {
            Json::Object(map) => {
                let name = map.get("name").and_then(Json::as_str);
                if name.is_some_and(|n| n.starts_with("istio.")) && map.contains_key("typed_config")
                {
                    out.insert(json.to_string());
                }
                map.values().for_each(|v| walk(v, out));
            }
            Json::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = std::collections::BTreeSet::new();
    walk(resource, &mut out);
    out
}

/// meshd's secure port, with a token (audience `istio-ca`) for each proxy's service
/// account, which it creates, and the root from `istio-ca-secret`.
fn secure_meshd(t: &Tenant, meshd: &Meshd, proxies: &[Proxy]) -> Server {
    use base64::Engine;
    let mut tokens = BTreeMap::new();
    for p in proxies {
        let who = format!("{}/{}", p.namespace, p.account);
        if tokens.contains_key(&who) {
            continue;
        }
        t.cluster
            .apply(&format!(
                "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {}, namespace: {}}}\n",
                p.account, p.namespace
            ))
            .unwrap();
        let token = t.cluster.token(&p.namespace, &p.account, "istio-ca", 3600);
        tokens.insert(who, token);
    }
    let secret = t.cluster.object("Secret", &t.system, "istio-ca-secret");
    let root = secret["data"]["root-cert.pem"].as_str().unwrap();
    let root = base64::engine::general_purpose::STANDARD
        .decode(root)
        .unwrap();
    Server::Secure {
        port: meshd.secure_port,
        root: String::from_utf8(root).unwrap(),
        tokens,
    }
}

async fn settled(server: &Server, proxy: &Proxy) -> Fetched {
    let mut last = fetch(server, proxy).await;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = fetch(server, proxy).await;
        if now == last {
            return now;
        }
        last = now;
    }
    panic!(
        "{} on {}: the answers never settled",
        proxy.name,
        server.port()
    )
}
