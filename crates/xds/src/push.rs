//! The push pipeline: config events are debounced (`PILOT_DEBOUNCE_AFTER`,
//! `PILOT_DEBOUNCE_MAX`), then one push context is built and published to every connection
//! through a `watch` channel, so a slow proxy only ever sees the newest push. Encoded views
//! are cached per push and shared by all proxies with the same view key.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use super::cache::{self, ResourceCache};
use super::metrics::{PushMetrics, type_label};
use super::resource::{ResourceMap, TypeKind, View};
use super::wire::Batch;
use model::config::{Kind, ObjectKey};
use model::proxy_headers::ProxyHeaders;
use model::service::AutoAddresses;
use model::topology::GatewayTopology;
use model::{Interception, Locality, Proxy, ProxyKind, PushContext, Store};
use translate::tracing::TraceIds;

/// Pipeline settings, from Istio's environment variables.
#[derive(Clone, Debug)]
pub struct PushSettings {
    pub debounce_after: Duration,
    pub debounce_max: Duration,
    /// Whether endpoint-only changes wait out the debounce too (`PILOT_ENABLE_EDS_DEBOUNCE`,
    /// default true). When false, a change that touches only EndpointSlices or Endpoints
    /// and arrives while no other change is waiting is pushed at once; one that arrives
    /// during another change's debounce goes out with it.
    pub eds_debounce: bool,
    pub push_throttle: usize,
    /// How long one response may wait for a proxy to take it (`PILOT_XDS_SEND_TIMEOUT`);
    /// past it the stream is closed, so a stalled proxy holds a push worker for a bounded
    /// time. `None` waits forever (Istio's default of 0s).
    pub send_timeout: Option<Duration>,
    /// HTTP/2 pings on idle xDS connections, and how long an answer may take before the
    /// connection (and every stream's state on it) is dropped (istiod's
    /// `--keepaliveInterval` / `--keepaliveTimeout`).
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// Response bytes framed for the wire and not yet written, across all connections
    /// (`MESHD_XDS_SEND_BUFFER_MB`, default 256; 0 = unbounded). A connect storm of
    /// slowly-reading proxies waits for it instead of holding every initial
    /// configuration in memory at once.
    pub send_buffer: Option<usize>,
    /// Sidecars and gateways on delta ADS get their route configurations' virtual hosts
    /// over VHDS (`MESHD_ENABLE_VHDS`, default false; meshd's own, istiod has no VHDS): a
    /// VirtualService change then sends the virtual hosts it changed, not every route
    /// configuration that holds them.
    pub vhds: bool,
    /// ServiceEntries without addresses get some (`PILOT_ENABLE_IP_AUTOALLOCATE`, default
    /// true, as in istiod): the leader writes them into their status
    /// ([`crate::k8s::ipallocate`]), and proxies that capture DNS use them.
    pub ip_autoallocate: bool,
    /// Streams open at once on one connection, advertised in SETTINGS
    /// (`ISTIO_GPRC_MAXSTREAMS`, default 100,000 as in istiod). A client that shares one
    /// connection among many xDS streams (gRPC C-core shares one per address) queues the
    /// streams past it, and long-lived xDS streams never make room.
    pub max_streams: u32,
    /// The largest request message accepted (`ISTIO_GPRC_MAXRECVMSGSIZE`, default 4 MiB
    /// as in istiod); a larger one ends its stream with `RESOURCE_EXHAUSTED`.
    pub max_recv_msg_size: usize,
    /// Connections accepted on each xDS port and not yet answered, at most
    /// (`MESHD_XDS_PENDING_CONNECTIONS`, default 1,024; 0 = unbounded; see
    /// [`transport::admission`]). During a reconnect storm the rest wait in the kernel's
    /// listen backlog instead of holding their first requests in meshd's memory.
    pub pending_connections: usize,
}

impl Default for PushSettings {
    fn default() -> Self {
        PushSettings {
            debounce_after: Duration::from_millis(100),
            debounce_max: Duration::from_secs(10),
            eds_debounce: true,
            push_throttle: 100,
            send_timeout: Some(Duration::from_secs(10)),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            send_buffer: Some(256 << 20),
            vhds: false,
            ip_autoallocate: true,
            max_streams: 100_000,
            max_recv_msg_size: 4 << 20,
            pending_connections: 1024,
        }
    }
}

/// An environment variable of the push settings that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("{variable}: {problem}")]
pub struct SettingsError {
    pub variable: &'static str,
    pub problem: String,
}

fn bad(variable: &'static str, problem: impl ToString) -> SettingsError {
    SettingsError {
        variable,
        problem: problem.to_string(),
    }
}

impl PushSettings {
    /// Reads `PILOT_DEBOUNCE_AFTER`, `PILOT_DEBOUNCE_MAX`, `PILOT_XDS_SEND_TIMEOUT` (Go
    /// durations; a send timeout of 0 disables it), `PILOT_ENABLE_EDS_DEBOUNCE` (a Go
    /// boolean) and `PILOT_PUSH_THROTTLE` (0 = Istio's
    /// automatic value, min(15 + 5 × cores, 100)).
    pub fn from_env() -> Result<PushSettings, SettingsError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// As [`PushSettings::from_env`], reading variables through `var`.
    pub fn from_lookup(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<PushSettings, SettingsError> {
        let mut s = PushSettings::default();
        let var = |name: &str| var(name).filter(|v| !v.is_empty());
        if let Some(v) = var("PILOT_DEBOUNCE_AFTER") {
            s.debounce_after =
                api::duration::parse(&v).map_err(|e| bad("PILOT_DEBOUNCE_AFTER", e))?;
        }
        if let Some(v) = var("PILOT_DEBOUNCE_MAX") {
            s.debounce_max = api::duration::parse(&v).map_err(|e| bad("PILOT_DEBOUNCE_MAX", e))?;
        }
        if let Some(v) = var("PILOT_ENABLE_EDS_DEBOUNCE") {
            s.eds_debounce = api::duration::parse_bool(&v).ok_or_else(|| {
                bad(
                    "PILOT_ENABLE_EDS_DEBOUNCE",
                    format!("{v:?} is not true or false"),
                )
            })?;
        }
        if let Some(v) = var("PILOT_XDS_SEND_TIMEOUT") {
            let t = api::duration::parse(&v).map_err(|e| bad("PILOT_XDS_SEND_TIMEOUT", e))?;
            s.send_timeout = (!t.is_zero()).then_some(t);
        }
        if let Some(v) = var("PILOT_PUSH_THROTTLE") {
            let n: usize = v
                .parse()
                .map_err(|_| bad("PILOT_PUSH_THROTTLE", format!("{v:?} is not a number")))?;
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            s.push_throttle = if n == 0 { (15 + 5 * cores).min(100) } else { n };
        }
        if let Some(v) = var("MESHD_ENABLE_VHDS") {
            s.vhds = api::duration::parse_bool(&v)
                .ok_or_else(|| bad("MESHD_ENABLE_VHDS", format!("{v:?} is not true or false")))?;
        }
        if let Some(v) = var("PILOT_ENABLE_IP_AUTOALLOCATE") {
            s.ip_autoallocate = api::duration::parse_bool(&v).ok_or_else(|| {
                bad(
                    "PILOT_ENABLE_IP_AUTOALLOCATE",
                    format!("{v:?} is not true or false"),
                )
            })?;
        }
        if let Some(v) = var("ISTIO_GPRC_MAXSTREAMS") {
            s.max_streams = v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                bad(
                    "ISTIO_GPRC_MAXSTREAMS",
                    format!("{v:?} is not a positive number"),
                )
            })?;
        }
        if let Some(v) = var("ISTIO_GPRC_MAXRECVMSGSIZE") {
            s.max_recv_msg_size = v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                bad(
                    "ISTIO_GPRC_MAXRECVMSGSIZE",
                    format!("{v:?} is not a positive number of bytes"),
                )
            })?;
        }
        if let Some(v) = var("MESHD_XDS_PENDING_CONNECTIONS") {
            s.pending_connections = v.parse().map_err(|_| {
                bad(
                    "MESHD_XDS_PENDING_CONNECTIONS",
                    format!("{v:?} is not a number of connections"),
                )
            })?;
        }
        if let Some(v) = var("MESHD_XDS_SEND_BUFFER_MB") {
            let mb: usize = v.parse().map_err(|_| {
                bad(
                    "MESHD_XDS_SEND_BUFFER_MB",
                    format!("{v:?} is not a number of MiB"),
                )
            })?;
            s.send_buffer = (mb > 0).then(|| mb.saturating_mul(1 << 20));
        }
        Ok(s)
    }
}

/// Whether `keys` are endpoint changes only (what istiod pushes as incremental EDS).
fn endpoints_only<'a>(keys: impl IntoIterator<Item = &'a ObjectKey>) -> bool {
    (keys.into_iter()).all(|k| matches!(k.kind, Kind::EndpointSlice | Kind::Endpoints))
}

/// Whether every service `changed` touched between the two contexts reaches its
/// workloads on the same ports as before, so that no sidecar's inbound listeners moved.
fn workload_ports_kept(before: &PushContext, after: &PushContext, changed: &ChangeSet) -> bool {
    (after.touched_services_since(before, changed).into_iter()).all(|pair| match pair {
        (Some(a), Some(b)) => {
            Arc::ptr_eq(a, b)
                || translate::inbound::workload_ports(a) == translate::inbound::workload_ports(b)
        }
        (None, None) => true,
        _ => false,
    })
}

/// The push in which each object last changed (objects unchanged since start-up have no
/// entry: they came with the first push).
pub type ChangeLog = Arc<Mutex<HashMap<ObjectKey, u64>>>;

/// The objects one push carries changes for, shared with the pushes after it.
pub type ChangeSet = Arc<BTreeSet<ObjectKey>>;

/// How many earlier pushes' change sets a push remembers.
pub const RECENT_PUSHES: usize = 32;

/// A config change entering the pipeline.
#[derive(Clone, Debug)]
pub struct ConfigEvent {
    pub at: Instant,
    pub keys: Vec<ObjectKey>,
}

/// What makes two proxies receive identical configuration. A view is looked up by a key
/// borrowing the proxy's own fields (per proxy per push, nothing cloned), and stored by an
/// owned one (`'static`) once per view.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ViewKey<'a> {
    kind: ProxyKind,
    namespace: Cow<'a, str>,
    labels: Cow<'a, BTreeMap<String, String>>,
    /// Only with no traffic capture, where listeners bind on the proxy's own IP.
    bind_ip: Option<String>,
    /// Connected with a proven identity (the secure port): gets identity-bound config.
    secure: bool,
    /// Only when some load assignment is balanced by locality.
    locality: Locality,
    /// Only when multi-network is on (some network has a gateway).
    network: Option<Cow<'a, str>>,
    /// The networks it asked to see endpoints of (`REQUESTED_NETWORK_VIEW`).
    network_view: Option<Cow<'a, [String]>>,
    /// Only when some failover compares the node a proxy runs on.
    node: Option<String>,
    /// Gets its virtual hosts over VHDS.
    vhds: bool,
    /// Gets a DNS name table.
    dns_proxy: bool,
    /// Knows ServiceEntries by their auto-allocated addresses.
    auto_addresses: AutoAddresses,
    /// Only while the mesh traces: its spans' tags and service name.
    trace_ids: Option<TraceIds<'a>>,
    /// Its Envoy has Istio's extensions.
    istio_extensions: bool,
    /// A gateway's own `gatewayTopology`.
    gateway_topology: Option<GatewayTopology>,
    /// Its own `proxyHeaders`.
    proxy_headers: Option<Cow<'a, ProxyHeaders>>,
}

impl ViewKey<'_> {
    fn into_owned(self) -> ViewKey<'static> {
        ViewKey {
            namespace: Cow::Owned(self.namespace.into_owned()),
            labels: Cow::Owned(self.labels.into_owned()),
            network: self.network.map(|n| Cow::Owned(n.into_owned())),
            network_view: self.network_view.map(|v| Cow::Owned(v.into_owned())),
            kind: self.kind,
            bind_ip: self.bind_ip,
            secure: self.secure,
            locality: self.locality,
            node: self.node,
            vhds: self.vhds,
            dns_proxy: self.dns_proxy,
            auto_addresses: self.auto_addresses,
            trace_ids: self.trace_ids.map(TraceIds::into_owned),
            istio_extensions: self.istio_extensions,
            gateway_topology: self.gateway_topology,
            proxy_headers: self.proxy_headers.map(|h| Cow::Owned(h.into_owned())),
        }
    }
}

/// One push: the shared context, when its first triggering event happened, and the
/// encoded views built so far.
pub struct Push {
    pub context: Arc<PushContext>,
    pub number: u64,
    /// The first config event this push carries (for convergence time).
    pub triggered_at: Instant,
    /// When the push was handed to the connections (for queue time).
    pub published_at: Instant,
    /// The objects this push carries changes for; `None` for a full push.
    pub changed: Option<ChangeSet>,
    /// The change sets of the pushes before this one, oldest first, up to
    /// [`RECENT_PUSHES`]: what a connection that skipped pushes has missed.
    earlier: VecDeque<(u64, Option<ChangeSet>)>,
    views: Mutex<ViewCells<'static>>,
    /// After a push that changed endpoints only: the views of the push before, whose
    /// listeners, routes and secrets this push's views share
    /// ([`cache::view_after_endpoints`]); only the gateways' when a changed service's
    /// workload ports moved (sidecars' inbound listeners follow them).
    views_before: ViewCells<'static>,
    /// Differences from earlier views to this push's, by (from, to, type), computed once
    /// for all the proxies that make the same step. The views are held so that their
    /// addresses stay theirs.
    diffs: Mutex<DiffMap>,
    /// Encoded per-service resources, handed from push to push.
    pub cache: Arc<ResourceCache>,
    /// Whether views tell proxies apart by locality ([`ResourceCache::locality_aware`]).
    locality_aware: bool,
    /// Whether they tell them apart by node ([`ResourceCache::node_aware`]).
    node_aware: bool,
    /// Whether they tell them apart by [`TraceIds`]: while the mesh traces.
    trace_aware: bool,
}

impl Push {
    pub fn new(
        context: PushContext,
        number: u64,
        triggered_at: Instant,
        changed: Option<BTreeSet<ObjectKey>>,
        cache: Arc<ResourceCache>,
    ) -> Push {
        cache.retain_services_of(&context, changed.as_ref());
        let locality_aware = cache.locality_aware(&context);
        let node_aware = cache.node_aware(&context);
        let trace_aware = translate::tracing::enabled(&context);
        Push {
            trace_aware,
            locality_aware,
            node_aware,
            context: Arc::new(context),
            number,
            triggered_at,
            published_at: Instant::now(),
            changed: changed.map(Arc::new),
            earlier: VecDeque::new(),
            views: Mutex::default(),
            views_before: ViewCells::default(),
            diffs: Mutex::default(),
            cache,
        }
    }

    /// This push, remembering the change sets of `previous` and the pushes before it.
    pub fn after(mut self, previous: &Push) -> Push {
        self.earlier = previous.earlier.clone();
        self.earlier
            .push_back((previous.number, previous.changed.clone()));
        while self.earlier.len() > RECENT_PUSHES {
            self.earlier.pop_front();
        }
        if let Some(keys) = &self.changed
            && !keys.is_empty()
            && endpoints_only(keys.iter())
        {
            let sidecars_too = workload_ports_kept(&previous.context, &self.context, keys);
            self.views_before = (previous.views.lock().unwrap().iter())
                .filter(|(key, _)| sidecars_too || key.kind == ProxyKind::Router)
                .map(|(key, cell)| (key.clone(), cell.clone()))
                .collect();
        }
        self
    }

    /// The change sets of the pushes after push `from` up to this one (this push's own
    /// when `from` is this push); `None` when any of them was a full push or is no longer
    /// remembered, or `from` is unknown.
    pub fn changed_since(&self, from: Option<u64>) -> Option<Vec<ChangeSet>> {
        let from = from?.min(self.number.saturating_sub(1));
        let own = (self.number, self.changed.clone());
        let remembered = self.earlier.iter().chain([&own]);
        let oldest = self.earlier.front().map_or(self.number, |(n, _)| *n);
        if oldest > from + 1 {
            return None;
        }
        remembered
            .filter(|(n, _)| *n > from)
            .map(|(_, set)| set.clone())
            .collect()
    }

    /// Whether this push can change anything for `proxy` (the change index; the per-proxy
    /// diff still decides what is sent).
    pub fn affects(&self, proxy: &Proxy) -> bool {
        match &self.changed {
            None => true,
            Some(keys) => self.context.affects(proxy, keys.iter()),
        }
    }

    pub fn version(&self) -> &str {
        &self.context.version
    }

    /// The encoded configuration for `proxy`, built once per view key and shared.
    pub fn view(&self, proxy: &Proxy) -> Arc<View> {
        let key = ViewKey {
            kind: proxy.kind,
            namespace: Cow::Borrowed(&proxy.namespace),
            labels: Cow::Borrowed(self.context.proxy_labels(proxy)),
            bind_ip: (proxy.interception == Interception::None).then(|| proxy.ip().to_string()),
            secure: proxy.identity.is_some(),
            locality: if self.locality_aware {
                self.context.proxy_locality(proxy)
            } else {
                Locality::default()
            },
            network: (self.context.networks.enabled()).then_some(Cow::Borrowed(&proxy.network)),
            network_view: proxy.network_view.as_deref().map(Cow::Borrowed),
            node: if self.node_aware {
                self.context.proxy_node(proxy)
            } else {
                None
            },
            vhds: proxy.vhds,
            dns_proxy: proxy.dns_proxy,
            auto_addresses: proxy.auto_addresses,
            trace_ids: self.trace_aware.then(|| TraceIds::of(proxy)),
            istio_extensions: proxy.istio_extensions,
            gateway_topology: proxy.gateway_topology,
            proxy_headers: proxy.proxy_headers.as_ref().map(Cow::Borrowed),
        };
        // The maps hold owned keys; read through a shared reference they are maps of
        // borrowed ones (a map is covariant in its key).
        let cell = {
            let mut views = self.views.lock().unwrap();
            let found = {
                let borrowed: &ViewCells<'_> = &views;
                borrowed.get(&key).cloned()
            };
            match found {
                Some(cell) => cell,
                None => views.entry(key.clone().into_owned()).or_default().clone(),
            }
        };
        // Every proxy but the first of a view finds it built: only the first needs the
        // previous push's view to build from.
        if let Some(view) = cell.get() {
            return view.clone();
        }
        let before = {
            let views_before: &ViewCells<'_> = &self.views_before;
            (views_before.get(&key))
                .and_then(|cell| cell.get())
                .cloned()
        };
        cell.get_or_init(|| {
            Arc::new(match before {
                Some(before) => {
                    cache::view_after_endpoints(&self.context, proxy, &self.cache, &before)
                }
                None => cache::view(&self.context, proxy, &self.cache),
            })
        })
        .clone()
    }
}

type ViewCells<'a> = foldhash::HashMap<ViewKey<'a>, Arc<OnceLock<Arc<View>>>>;

type DiffMap = foldhash::HashMap<(usize, usize, TypeKind), (Arc<View>, Arc<View>, Arc<ViewDiff>)>;

/// What changed for one type from one view to another.
#[derive(Debug, Default)]
pub struct ViewDiff {
    /// New resources and resources with a new version, in name order, shared by every
    /// proxy that steps between the two views.
    pub changed: Batch,
    /// Names the newer view no longer has, in order.
    pub removed: Vec<String>,
    /// Whether the two views hold different names.
    pub names_differ: bool,
}

impl ViewDiff {
    pub fn between(from: &ResourceMap, to: &ResourceMap) -> ViewDiff {
        use std::cmp::Ordering;
        let (mut changed, mut removed, mut names_differ) = (Vec::new(), Vec::new(), false);
        let (mut a, mut b) = (from.iter().peekable(), to.iter().peekable());
        loop {
            let order = match (a.peek(), b.peek()) {
                (None, None) => break,
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some((x, _)), Some((y, _))) => x.cmp(y),
            };
            match order {
                Ordering::Less => {
                    removed.push(a.next().unwrap().0.to_string());
                    names_differ = true;
                }
                Ordering::Greater => {
                    changed.push(b.next().unwrap().1.clone());
                    names_differ = true;
                }
                Ordering::Equal => {
                    let (old, new) = (a.next().unwrap().1, b.next().unwrap().1);
                    if old.hash != new.hash {
                        changed.push(new.clone());
                    }
                }
            }
        }
        ViewDiff {
            changed: changed.into(),
            removed,
            names_differ,
        }
    }
}

impl Push {
    /// What changed for `kind` from `from` (an earlier push's view) to `to` (this push's).
    pub fn view_diff(&self, from: &Arc<View>, to: &Arc<View>, kind: TypeKind) -> Arc<ViewDiff> {
        let key = (Arc::as_ptr(from) as usize, Arc::as_ptr(to) as usize, kind);
        if let Some((_, _, d)) = self.diffs.lock().unwrap().get(&key) {
            return d.clone();
        }
        let d = Arc::new(if from.shares(to, kind) {
            ViewDiff::default()
        } else {
            ViewDiff::between(from.all(kind), to.all(kind))
        });
        self.diffs
            .lock()
            .unwrap()
            .entry(key)
            .or_insert_with(|| (from.clone(), to.clone(), d))
            .2
            .clone()
    }
}

impl crate::snapshot::Snapshot for Push {
    fn number(&self) -> u64 {
        self.number
    }

    fn version(&self) -> Arc<str> {
        self.context.version.clone()
    }

    fn triggered_at(&self) -> Instant {
        self.triggered_at
    }

    fn changed_since(&self, from: Option<u64>) -> Option<Vec<ChangeSet>> {
        Push::changed_since(self, from)
    }

    fn view(&self, proxy: &Proxy) -> Arc<View> {
        Push::view(self, proxy)
    }

    fn view_diff(&self, from: &Arc<View>, to: &Arc<View>, kind: TypeKind) -> Arc<ViewDiff> {
        Push::view_diff(self, from, to, kind)
    }
}

/// Builds a push context from the store's current state: updated from `previous` when
/// the changed keys are known, else in full.
pub fn build_push(
    store: &RwLock<Store>,
    previous: Option<&PushContext>,
    number: u64,
    triggered_at: Instant,
    changed: Option<BTreeSet<ObjectKey>>,
    metrics: &PushMetrics,
    cache: Arc<ResourceCache>,
) -> Push {
    let snapshot = store.read().unwrap().clone(); // constant time: a persistent map
    let version = format!("{}/{number}", rfc3339_now());
    let started = Instant::now();
    let context = match (previous, &changed) {
        (Some(previous), Some(keys)) => previous.update(&snapshot, keys, version),
        _ => PushContext::build(&snapshot, version),
    };
    metrics
        .context_init
        .observe(started.elapsed().as_secs_f64());
    metrics.context_recompute.inc();
    metrics
        .endpoint_no_pod
        .set(context.endpoints_without_pod() as i64);
    metrics.services.set(context.service_count() as i64);
    metrics
        .virt_services
        .set(context.virtual_services.len() as i64);
    if let Some(kind) = context.tracing_problem().and_then(|p| p.lookup_failed) {
        (metrics.provider_lookup_cluster_failures)
            .get_or_create(&vec![("type", kind.to_string())])
            .inc();
    }
    for issue in context.issues.iter() {
        tracing::warn!(object = %issue.object, field = %issue.field, "{}", issue.message);
    }
    Push::new(context, number, triggered_at, changed, cache)
}

fn rfc3339_now() -> String {
    rfc3339(std::time::SystemTime::now(), false)
}

/// `at` in RFC 3339 (UTC), to the second or the millisecond.
pub fn rfc3339(at: std::time::SystemTime, millis: bool) -> String {
    let since = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs() as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let fraction = if millis {
        format!(".{:03}", since.subsec_millis())
    } else {
        String::new()
    };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{fraction}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Debounces config events and publishes pushes until the event channel closes.
pub async fn debounce_loop(
    mut events: mpsc::UnboundedReceiver<ConfigEvent>,
    store: Arc<RwLock<Store>>,
    pushes: watch::Sender<Arc<Push>>,
    settings: PushSettings,
    metrics: PushMetrics,
    change_log: ChangeLog,
) {
    let mut number = pushes.borrow().number;
    while let Some(first) = events.recv().await {
        let started = first.at;
        // The window is timed on tokio's clock; `started` (the event time) feeds the metrics.
        let window_start = tokio::time::Instant::now();
        let mut last = window_start;
        let mut changed = BTreeSet::new();
        let mut absorb = |ev: ConfigEvent| {
            for k in ev.keys {
                metrics
                    .triggers
                    .get_or_create(&type_label(trigger_type(k.kind)))
                    .inc();
                changed.insert(k);
            }
        };
        let at_once = !settings.eds_debounce && endpoints_only(&first.keys);
        absorb(first);
        if !at_once {
            loop {
                let deadline =
                    (last + settings.debounce_after).min(window_start + settings.debounce_max);
                tokio::select! {
                    next = events.recv() => match next {
                        Some(ev) => {
                            last = tokio::time::Instant::now();
                            absorb(ev);
                        }
                        None => break,
                    },
                    _ = tokio::time::sleep_until(deadline) => break,
                }
            }
        }
        metrics
            .debounce_time
            .observe(started.elapsed().as_secs_f64());
        number += 1;
        let (build_store, build_metrics) = (store.clone(), metrics.clone());
        let merged = changed.len();
        {
            let mut log = change_log.lock().unwrap();
            for key in &changed {
                log.insert(key.clone(), number);
            }
        }
        let previous = pushes.borrow().clone();
        let push = tokio::task::spawn_blocking(move || {
            build_push(
                &build_store,
                Some(&previous.context),
                number,
                started,
                Some(changed),
                &build_metrics,
                previous.cache.clone(),
            )
            .after(&previous)
        })
        .await
        .expect("BUG: push context build panicked");
        tracing::debug!(
            push = number,
            merged,
            version = push.version(),
            "push context built"
        );
        let _ = pushes.send(Arc::new(push));
    }
}

fn trigger_type(kind: Kind) -> &'static str {
    match kind {
        Kind::EndpointSlice | Kind::Pod | Kind::WorkloadEntry => "endpoint",
        Kind::Service | Kind::ServiceEntry => "service",
        Kind::Namespace => "namespace",
        Kind::Node => "endpoint",
        Kind::ConfigMap => "global",
        _ => "config",
    }
}

#[cfg(test)]
mod tests;
