//! One simulated proxy: an ADS stream (delta or state of the world) that subscribes and
//! ACKs as Envoy does — CDS and LDS by wildcard, then EDS for the clusters it was sent and
//! RDS for the route names its listeners' HTTP connection managers name, and VHDS (by no
//! name, as Envoy asks) once a route configuration asks for it — and notes when a resource
//! carrying the current change's marker arrives.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Instant;

use envoy_api::pb::envoy::config::core::v3::Node;
use envoy_api::pb::envoy::config::listener::v3::Listener;
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier,
};
use envoy_api::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_api::pb::google::rpc::Status as RpcStatus;
use http_body::Frame;
use prost::Message;
use prost::bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tonic::Status;
use tonic::codegen::{Context, Pin, Poll, Service, http};

use super::response::{Body, DeltaResponse, SotwResponse};
use super::types::{
    CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, NAME_TABLE_TYPE, ROUTE_TYPE, VIRTUAL_HOST_TYPE,
};
use grpc_messages::{self as wire, Messages};

/// The change being measured: a marker string that only resources reflecting it contain,
/// and when it was made.
#[derive(Clone, Debug)]
pub struct Marker {
    pub id: u64,
    pub text: Arc<[u8]>,
    pub at: Instant,
}

/// What one simulated proxy saw, readable while it runs.
#[derive(Debug, Default)]
pub struct ProxyStats {
    pub responses: AtomicU64,
    pub bytes: AtomicU64,
    /// The marker id last seen, and how long after the change (µs).
    pub converged_marker: AtomicU64,
    pub converged_after_us: AtomicU64,
    /// Set once the proxy holds its initial configuration (see `Names::initialised`).
    pub initialised_after_us: AtomicU64,
    /// Streams that came to hold their initial configuration (each reconnect again).
    pub streams_initialised: AtomicU64,
    pub nacks_sent: AtomicU64,
}

/// `envoy.service.discovery.v3.DeltaDiscoveryRequest`, its subscribed names as bytes: copied
/// from the responses that named them without a UTF-8 check (a delta proxy's first EDS
/// subscription names every cluster of its first CDS answer).
#[derive(Clone, PartialEq, Message)]
struct DeltaRequest {
    #[prost(message, optional, tag = "1")]
    node: Option<Node>,
    #[prost(string, tag = "2")]
    type_url: String,
    #[prost(bytes = "bytes", repeated, tag = "3")]
    resource_names_subscribe: Vec<Bytes>,
    #[prost(bytes = "bytes", repeated, tag = "4")]
    resource_names_unsubscribe: Vec<Bytes>,
    #[prost(map = "string, string", tag = "5")]
    initial_resource_versions: std::collections::HashMap<String, String>,
    #[prost(string, tag = "6")]
    response_nonce: String,
    #[prost(message, optional, tag = "7")]
    error_detail: Option<RpcStatus>,
}

/// How a simulated proxy reaches meshd.
#[derive(Clone)]
pub enum Dial {
    /// A connection of its own per stream, through the simulator's HTTP/2 client
    /// (`super::h2c`), as each Envoy has its own; over TLS to the secure port with
    /// the proxy's workload certificate when `tls` is set.
    Own {
        address: Arc<str>,
        tls: Option<super::h2c::Tls>,
    },
    /// A stream on a connection of hyper's client, possibly shared with other proxies.
    Shared(tonic::transport::Channel),
}

/// Opens a bidirectional gRPC stream (`method`, the gRPC path): `requests` are sent as
/// they come, and the responses are decoded by [`Messages`], which releases its buffer
/// whenever it empties (tonic's `Streaming` kept each stream's 1.4 MB initial
/// configuration allocated).
async fn open<Req, Resp>(
    dial: Dial,
    method: &'static str,
    requests: mpsc::Receiver<Req>,
) -> Result<Messages<Resp>, String>
where
    Req: Message + Unpin + Send + Sync + 'static,
    Resp: Message + Default + Send + Sync + 'static,
{
    const LIMIT: usize = 256 << 20;
    let mut channel = match dial {
        Dial::Own { address, tls } => {
            return super::h2c::connect(&address, tls.as_ref(), method, requests, LIMIT)
                .await
                .map_err(|e| e.to_string());
        }
        Dial::Shared(channel) => channel,
    };
    std::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .map_err(|e| e.to_string())?;
    let request = http::Request::builder()
        .method(http::Method::POST)
        .uri(method)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(tonic::body::Body::new(RequestBody(requests)))
        .map_err(|e| e.to_string())?;
    let response = channel.call(request).await.map_err(|e| e.to_string())?;
    // A trailers-only response: the status came with the headers and nothing follows.
    if let Some(status) = Status::from_header_map(response.headers())
        && status.code() != tonic::Code::Ok
    {
        return Err(status.to_string());
    }
    if response.status() != http::StatusCode::OK {
        return Err(format!("HTTP status {}", response.status()));
    }
    Ok(Messages::new(response.into_body(), LIMIT))
}

/// The request side of a stream: each request as one gRPC frame, until the sender drops.
struct RequestBody<Req>(mpsc::Receiver<Req>);

impl<Req: Message> http_body::Body for RequestBody<Req> {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.0
            .poll_recv(cx)
            .map(|next| next.map(|request| Ok(Frame::data(wire::prost_frame(&request)))))
    }
}

const DELTA_ADS: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
const SOTW_ADS: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

/// What a delta proxy holds, kept across its streams: name → version per type, and the
/// route names it subscribes to. On reconnect it subscribes to those routes and to the
/// endpoints of every cluster it holds, with `initial_resource_versions`, as Envoy does,
/// so meshd sends only what differs (and a stream that broke before its EDS answer still
/// asks for every cluster).
#[derive(Default)]
pub struct Held {
    /// By type URL.
    versions: BTreeMap<String, Holding>,
    names: Names,
}

impl Held {
    /// The endpoints to unsubscribe from as `resp` removes their clusters, as Envoy does
    /// once a cluster is gone; they are no longer held either. Call before learning `resp`.
    fn endpoints_of_removed_clusters(
        versions: &mut BTreeMap<String, Holding>,
        resp: &DeltaResponse,
    ) -> Vec<Bytes> {
        if resp.type_url != CLUSTER_TYPE {
            return Vec::new();
        }
        let Some(clusters) = versions.get(CLUSTER_TYPE) else {
            return Vec::new();
        };
        let gone: Vec<Bytes> = (resp.removed_resources.iter())
            .map(|name| name.as_bytes())
            .filter(|name| wants_endpoints(name) && clusters.get(name).is_some())
            .map(Bytes::copy_from_slice)
            .collect();
        if let Some(endpoints) = versions.get_mut(ENDPOINT_TYPE) {
            for name in &gone {
                endpoints.forget(name);
            }
        }
        gone
    }

    fn learn(versions: &mut BTreeMap<String, Holding>, resp: &DeltaResponse) {
        versions
            .entry(resp.type_url.clone())
            .or_default()
            .learn(resp);
    }

    /// The first request of a stream for `type_url`: every name it subscribes to (EDS,
    /// RDS) and the versions it holds.
    fn request(&self, type_url: &str) -> DeltaRequest {
        let held = self.versions.get(type_url);
        let subscribed = match type_url {
            // The clusters it holds, as Envoy subscribes to the endpoints of each.
            ENDPOINT_TYPE => self
                .versions
                .get(CLUSTER_TYPE)
                .map(|cds| {
                    cds.iter()
                        .filter(|(name, _)| wants_endpoints(name))
                        .map(|(name, _)| Bytes::copy_from_slice(name))
                        .collect()
                })
                .unwrap_or_default(),
            ROUTE_TYPE => (self.names.routes.iter())
                .map(|r| Bytes::copy_from_slice(r.as_bytes()))
                .collect(),
            _ => Vec::new(),
        };
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        DeltaRequest {
            type_url: type_url.to_string(),
            resource_names_subscribe: subscribed,
            initial_resource_versions: held
                .map(|h| h.iter().map(|(n, v)| (text(n), text(v))).collect())
                .unwrap_or_default(),
            ..Default::default()
        }
    }
}

/// Name → version.
type VersionMap = foldhash::HashMap<Arc<[u8]>, Arc<[u8]>>;

/// The resources of one type a delta proxy holds, by name, with their versions: what it
/// names in `initial_resource_versions` when it reconnects. Every proxy of a namespace
/// receives the same initial configuration, so the first answer of each type is kept once
/// for all proxies that received the same one, and each proxy keeps only what changed
/// since. Kept per proxy, a 1,000-service mesh's ~2,000 names and versions were 420 KB
/// of the simulator's memory per proxy, and faulting that in took half its CPU in a
/// 10,000-proxy connect storm.
#[derive(Default)]
struct Holding {
    /// The first answer, shared.
    first: Option<Arc<VersionMap>>,
    /// Since the first answer: the new version, or `None` once removed.
    since: foldhash::HashMap<Arc<[u8]>, Option<Arc<[u8]>>>,
}

impl Holding {
    fn learn(&mut self, resp: &DeltaResponse) {
        // Changes are only kept against a first answer.
        if self.first.is_none() {
            self.first = Some(shared_first_answer(resp));
            return;
        }
        for r in resp.each() {
            self.since.insert(r.name.into(), Some(r.version.into()));
        }
        for name in &resp.removed_resources {
            self.forget(name.as_bytes());
        }
    }

    /// `name` is no longer held.
    fn forget(&mut self, name: &[u8]) {
        if self.get(name).is_some() {
            self.since.insert(name.into(), None);
        }
    }

    fn get(&self, name: &[u8]) -> Option<&Arc<[u8]>> {
        match self.since.get(name) {
            Some(version) => version.as_ref(),
            None => self.first.as_ref()?.get(name),
        }
    }

    /// Every resource held, with its version (in no particular order).
    fn iter(&self) -> impl Iterator<Item = (&Arc<[u8]>, &Arc<[u8]>)> {
        let first = (self.first.iter())
            .flat_map(|f| f.iter())
            .filter(|(name, _)| !self.since.contains_key(*name));
        let since = (self.since.iter()).filter_map(|(name, v)| Some((name, v.as_ref()?)));
        first.chain(since)
    }
}

/// First answers by a 128-bit hash of their names and versions, while some proxy holds
/// them.
static FIRST_ANSWERS: LazyLock<Mutex<foldhash::HashMap<u128, Weak<VersionMap>>>> =
    LazyLock::new(Default::default);

/// `resources` as a name → version map, the one other proxies already hold if they were
/// sent the same. An answer is known by its hash: comparing each name with the known
/// answer's took a tenth of the simulator's CPU in a connect storm, and two different
/// answers of one mesh share a 128-bit hash with a chance of about 2^-128.
fn shared_first_answer(resp: &DeltaResponse) -> Arc<VersionMap> {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut count = 0;
    for r in resp.each() {
        // Lengths first, so that no two different lists hash the same bytes.
        hasher.update(&(r.name.len() as u64).to_le_bytes());
        hasher.update(r.name);
        hasher.update(&(r.version.len() as u64).to_le_bytes());
        hasher.update(r.version);
        count += 1;
    }
    let key = hasher.digest128();
    let mut answers = FIRST_ANSWERS.lock().unwrap();
    if let Some(known) = answers.get(&key).and_then(Weak::upgrade)
        && known.len() == count
    {
        return known;
    }
    let map: VersionMap = (resp.each())
        .map(|r| (r.name.into(), r.version.into()))
        .collect();
    if answers.len() >= 4096 {
        answers.retain(|_, known| known.strong_count() > 0);
    }
    let map = Arc::new(map);
    answers.insert(key, Arc::downgrade(&map));
    map
}

/// Clusters whose endpoints Envoy asks EDS for (meshd's `outbound|...` clusters).
fn wants_endpoints(cluster: &[u8]) -> bool {
    cluster.starts_with(b"outbound|")
}

#[derive(Clone, Debug)]
pub struct Spec {
    pub node: Node,
    pub delta: bool,
    /// NACK every RDS response (to exercise meshd's rejection path).
    pub nack_routes: bool,
    /// Ask for the DNS name table after the listeners, as istio-agent does with DNS
    /// capture on.
    pub name_table: bool,
}

/// Route names the HTTP connection managers of `listener` ask for over RDS.
fn route_names(listener: &[u8]) -> Vec<String> {
    let Ok(l) = Listener::decode(listener) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for chain in l
        .filter_chains
        .iter()
        .chain(l.default_filter_chain.as_ref())
    {
        for filter in &chain.filters {
            use envoy_api::pb::envoy::config::listener::v3::filter::ConfigType;
            let Some(ConfigType::TypedConfig(any)) = &filter.config_type else {
                continue;
            };
            if !any.type_url.ends_with("HttpConnectionManager") {
                continue;
            }
            if let Ok(hcm) = HttpConnectionManager::decode(any.value.as_slice())
                && let Some(RouteSpecifier::Rds(rds)) = hcm.route_specifier
            {
                out.push(rds.route_config_name);
            }
        }
    }
    out
}

/// Which clusters a proxy already asks EDS for.
#[derive(Clone, Copy)]
enum Asking<'a> {
    /// State of the world: the names it lists in `Names::clusters`.
    Listed,
    /// Delta: those of the clusters it holds (none before its first CDS answer). A delta
    /// proxy keeps no list of its own: before this was explicit, its first CDS answer went
    /// down the listing path and every delta proxy kept all ~2,000 cluster names of a
    /// 1,000-service mesh, ~200 KB of the simulator's memory each.
    Held(Option<&'a Holding>),
}

/// The state one simulated proxy keeps: names per type, to subscribe to what it learns.
#[derive(Default)]
struct Names {
    /// State of the world: the clusters to ask EDS for. A delta proxy reads them from
    /// what it holds of CDS.
    clusters: BTreeSet<String>,
    /// It was sent a cluster with endpoints to ask for.
    endpoints_wanted: bool,
    routes: BTreeSet<String>,
    /// A route configuration asked for VHDS (meshd's `MESHD_ENABLE_VHDS`).
    vhds: bool,
    seen_types: BTreeSet<String>,
}

/// Whether an encoded route configuration has its virtual hosts sent over VHDS: a small
/// one (an empty shell; a whole one is hundreds of KB) with `vhds` set.
fn asks_for_vhds(body: &Body) -> bool {
    use envoy_api::pb::envoy::config::route::v3::RouteConfiguration;
    const SHELL_AT_MOST: usize = 1024;
    let body = match body {
        Body::Whole(b) if b.len() <= SHELL_AT_MOST => Cow::Borrowed(*b),
        Body::Pieces(p) if p.iter().map(|p| p.len()).sum::<usize>() <= SHELL_AT_MOST => {
            body.joined()
        }
        _ => return false,
    };
    RouteConfiguration::decode(&*body).is_ok_and(|rc| rc.vhds.is_some())
}

impl Names {
    /// State of the world: a CDS response is every cluster the proxy has, so the endpoints
    /// of those not in it are no longer asked for, as Envoy drops their subscription.
    /// Returns whether any were dropped.
    fn keep_clusters<'a>(&mut self, clusters: impl IntoIterator<Item = &'a [u8]>) -> bool {
        let present: BTreeSet<&[u8]> = clusters.into_iter().collect();
        let before = self.clusters.len();
        self.clusters.retain(|c| present.contains(c.as_bytes()));
        self.clusters.len() != before
    }

    /// Learns from one response (names and bodies); returns the EDS / RDS names to add,
    /// and whether to ask for VHDS now.
    fn learn<'a>(
        &mut self,
        type_url: &str,
        resources: impl IntoIterator<Item = (&'a [u8], Body<'a>)>,
        asking: Asking,
    ) -> (Vec<Bytes>, Vec<String>, bool) {
        self.seen_types.insert(type_url.to_string());
        let mut eds = Vec::new();
        let mut rds = Vec::new();
        let mut vhds = false;
        if type_url == CLUSTER_TYPE {
            for (name, _) in resources {
                if !wants_endpoints(name) {
                    continue;
                }
                self.endpoints_wanted = true;
                let new = match asking {
                    Asking::Held(held) => held.is_none_or(|h| h.get(name).is_none()),
                    Asking::Listed => {
                        (self.clusters).insert(String::from_utf8_lossy(name).into_owned())
                    }
                };
                if new {
                    eds.push(Bytes::copy_from_slice(name));
                }
            }
        } else if type_url == LISTENER_TYPE {
            for (_, body) in resources {
                for r in route_names(&body.joined()) {
                    if self.routes.insert(r.clone()) {
                        rds.push(r);
                    }
                }
            }
        } else if type_url == ROUTE_TYPE && !self.vhds {
            self.vhds = resources.into_iter().any(|(_, body)| asks_for_vhds(&body));
            vhds = self.vhds;
        }
        (eds, rds, vhds)
    }

    /// CDS and LDS answered, and EDS and RDS too if there was anything to ask them for.
    fn initialised(&self) -> bool {
        let seen = |t: &str| self.seen_types.contains(t);
        seen(CLUSTER_TYPE)
            && seen(LISTENER_TYPE)
            && (!self.endpoints_wanted || seen(ENDPOINT_TYPE))
            && (self.routes.is_empty() || seen(ROUTE_TYPE))
            && (!self.vhds || seen(VIRTUAL_HOST_TYPE))
    }
}

fn note<'a>(
    stats: &ProxyStats,
    marker: &watch::Receiver<Option<Marker>>,
    mut bodies: impl Iterator<Item = Body<'a>>,
    bytes: usize,
) {
    stats.responses.fetch_add(1, Ordering::Relaxed);
    stats.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    let current = marker.borrow().clone();
    if let Some(m) = current
        && stats.converged_marker.load(Ordering::Relaxed) != m.id
        && let finder = memchr::memmem::Finder::new(&m.text)
        && bodies.any(|b| b.contains(&finder))
    {
        stats
            .converged_after_us
            .store(m.at.elapsed().as_micros() as u64, Ordering::Relaxed);
        stats.converged_marker.store(m.id, Ordering::Relaxed);
    }
}

/// Runs one proxy until the stream ends; a delta proxy keeps what it holds in `held`
/// for its next stream.
pub async fn run(
    dial: Dial,
    spec: Spec,
    stats: Arc<ProxyStats>,
    marker: watch::Receiver<Option<Marker>>,
    started: Instant,
    held: &mut Held,
) -> Result<(), String> {
    if spec.delta {
        run_delta(dial, spec, stats, marker, started, held).await
    } else {
        run_sotw(dial, spec, stats, marker, started).await
    }
}

async fn run_delta(
    dial: Dial,
    spec: Spec,
    stats: Arc<ProxyStats>,
    marker: watch::Receiver<Option<Marker>>,
    started: Instant,
    held: &mut Held,
) -> Result<(), String> {
    // Boxed: a channel allocates its slots in blocks of 32, and an unboxed request (a
    // `Node` inside) made that block 20 KB per simulated proxy.
    let (tx, rx) = mpsc::channel::<Box<DeltaRequest>>(16);
    let request = |type_url: &str| DeltaRequest {
        type_url: type_url.to_string(),
        ..Default::default()
    };
    held.names.seen_types.clear(); // a new stream: nothing answered yet
    let mut first = held.request(CLUSTER_TYPE);
    first.node = Some(spec.node.clone());
    tx.send(Box::new(first)).await.map_err(|e| e.to_string())?;
    tx.send(Box::new(held.request(LISTENER_TYPE)))
        .await
        .map_err(|e| e.to_string())?;
    if spec.name_table {
        tx.send(Box::new(request(NAME_TABLE_TYPE)))
            .await
            .map_err(|e| e.to_string())?;
    }
    // A reconnect re-subscribes to the names it knows, and to VHDS if it held it.
    for type_url in [ENDPOINT_TYPE, ROUTE_TYPE, VIRTUAL_HOST_TYPE] {
        let sub = held.request(type_url);
        let vhds = type_url == VIRTUAL_HOST_TYPE && held.names.vhds;
        if !sub.resource_names_subscribe.is_empty() || vhds {
            tx.send(Box::new(sub)).await.map_err(|e| e.to_string())?;
        }
    }
    let Held { versions, names } = held;
    let mut stream = open::<_, DeltaResponse>(dial, DELTA_ADS, rx).await?;
    let mut counted = false;
    while let Some(resp) = stream.message().await.map_err(|e| e.to_string())? {
        let resources = || resp.each().filter_map(|r| Some((r.name, r.body?)));
        note(
            &stats,
            &marker,
            resources().map(|(_, b)| b),
            resp.encoded_len(),
        );
        let asking = Asking::Held(versions.get(CLUSTER_TYPE));
        let (eds, rds, vhds) = names.learn(&resp.type_url, resources(), asking);
        let gone = Held::endpoints_of_removed_clusters(versions, &resp);
        let nack = spec.nack_routes && resp.type_url == ROUTE_TYPE;
        if !nack {
            Held::learn(versions, &resp); // a rejected response is not held, as in Envoy
        }
        let ack = DeltaRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            error_detail: nack.then(|| RpcStatus {
                code: 3,
                message: "loadgen: rejected on request".into(),
                details: vec![],
            }),
            ..Default::default()
        };
        if nack {
            stats.nacks_sent.fetch_add(1, Ordering::Relaxed);
        }
        tx.send(Box::new(ack)).await.map_err(|e| e.to_string())?;
        if !eds.is_empty() || !gone.is_empty() {
            let mut sub = request(ENDPOINT_TYPE);
            sub.resource_names_subscribe = eds;
            sub.resource_names_unsubscribe = gone;
            tx.send(Box::new(sub)).await.map_err(|e| e.to_string())?;
        }
        if !rds.is_empty() {
            let mut sub = request(ROUTE_TYPE);
            sub.resource_names_subscribe = rds.into_iter().map(Bytes::from).collect();
            tx.send(Box::new(sub)).await.map_err(|e| e.to_string())?;
        }
        if vhds {
            tx.send(Box::new(request(VIRTUAL_HOST_TYPE)))
                .await
                .map_err(|e| e.to_string())?;
        }
        mark_initialised(&stats, names, started, &mut counted);
    }
    Ok(())
}

/// Counts a stream that now holds its initial configuration (once per stream).
fn mark_initialised(stats: &ProxyStats, names: &Names, started: Instant, counted: &mut bool) {
    if *counted || !names.initialised() {
        return;
    }
    *counted = true;
    stats.streams_initialised.fetch_add(1, Ordering::Relaxed);
    if stats.initialised_after_us.load(Ordering::Relaxed) == 0 {
        stats.initialised_after_us.store(
            (started.elapsed().as_micros() as u64).max(1),
            Ordering::Relaxed,
        );
    }
}

async fn run_sotw(
    dial: Dial,
    spec: Spec,
    stats: Arc<ProxyStats>,
    marker: watch::Receiver<Option<Marker>>,
    started: Instant,
) -> Result<(), String> {
    let (tx, rx) = mpsc::channel::<Box<DiscoveryRequest>>(16);
    let request = |type_url: &str, names: &BTreeSet<String>| DiscoveryRequest {
        type_url: type_url.to_string(),
        resource_names: names.iter().cloned().collect(),
        ..Default::default()
    };
    let none = BTreeSet::new();
    let mut first = request(CLUSTER_TYPE, &none);
    first.node = Some(spec.node.clone());
    tx.send(Box::new(first)).await.map_err(|e| e.to_string())?;
    tx.send(Box::new(request(LISTENER_TYPE, &none)))
        .await
        .map_err(|e| e.to_string())?;
    if spec.name_table {
        tx.send(Box::new(request(NAME_TABLE_TYPE, &none)))
            .await
            .map_err(|e| e.to_string())?;
    }
    let mut stream = open::<_, SotwResponse>(dial, SOTW_ADS, rx).await?;
    let mut names = Names::default();
    let mut counted = false;
    // SotW: the last accepted version per type, to ACK with.
    let mut versions: BTreeMap<String, String> = BTreeMap::new();
    while let Some(resp) = stream.message().await.map_err(|e| e.to_string())? {
        let bodies = || resp.resources.iter().map(|a| &a.value[..]);
        note(
            &stats,
            &marker,
            bodies().map(Body::Whole),
            resp.encoded_len(),
        );
        // SotW resources carry no names outside their bodies: CDS names come from the
        // Cluster, which is cheap to read for its first field only.
        let named: Vec<(String, &[u8])> = bodies().map(|b| (resource_name(b), b)).collect();
        let resources = named.iter().map(|(n, b)| (n.as_bytes(), Body::Whole(b)));
        let dropped = resp.type_url == CLUSTER_TYPE
            && names.keep_clusters(named.iter().map(|(n, _)| n.as_bytes()));
        let (eds, rds, _) = names.learn(&resp.type_url, resources, Asking::Listed);
        let nack = spec.nack_routes && resp.type_url == ROUTE_TYPE;
        let subscribed = match resp.type_url.as_str() {
            t if t == ENDPOINT_TYPE => names.clusters.clone(),
            t if t == ROUTE_TYPE => names.routes.clone(),
            _ => BTreeSet::new(),
        };
        let mut ack = request(&resp.type_url, &subscribed);
        ack.response_nonce = resp.nonce.clone();
        if nack {
            stats.nacks_sent.fetch_add(1, Ordering::Relaxed);
            ack.version_info = versions.get(&resp.type_url).cloned().unwrap_or_default();
            ack.error_detail = Some(RpcStatus {
                code: 3,
                message: "loadgen: rejected on request".into(),
                details: vec![],
            });
        } else {
            ack.version_info = resp.version_info.clone();
            versions.insert(resp.type_url.clone(), resp.version_info.clone());
        }
        tx.send(Box::new(ack)).await.map_err(|e| e.to_string())?;
        if !eds.is_empty() || dropped {
            let mut sub = request(ENDPOINT_TYPE, &names.clusters);
            sub.version_info = versions.get(ENDPOINT_TYPE).cloned().unwrap_or_default();
            tx.send(Box::new(sub)).await.map_err(|e| e.to_string())?;
        }
        if !rds.is_empty() {
            let mut sub = request(ROUTE_TYPE, &names.routes);
            sub.version_info = versions.get(ROUTE_TYPE).cloned().unwrap_or_default();
            tx.send(Box::new(sub)).await.map_err(|e| e.to_string())?;
        }
        mark_initialised(&stats, &names, started, &mut counted);
    }
    Ok(())
}

/// The `name` of a Cluster, Listener, RouteConfiguration or ClusterLoadAssignment: field 1
/// in all four, read without decoding the rest.
fn resource_name(body: &[u8]) -> String {
    #[derive(Clone, PartialEq, Message)]
    struct Named {
        #[prost(string, tag = "1")]
        name: String,
    }
    Named::decode(body).map(|n| n.name).unwrap_or_default()
}

#[cfg(test)]
mod tests;
