//! The xDS server: Envoy's `AggregatedDiscoveryService`, both state-of-the-world and delta,
//! on one tonic service. Streams reach the model only through the published [`Push`]es.
//!
//! Locking: `XdsShared.connections` is held only to register, deregister or snapshot the
//! per-connection status; each connection's state is owned by its task.

pub mod cache;
pub mod connection;
pub mod debug;
pub mod delta;
pub mod joined;
pub mod label_sets;
pub mod metrics;
pub mod origin;
pub mod outbox;
pub mod push;
pub mod resource;
pub mod snapshot;
pub mod sotw;
pub mod stream;
pub mod wire;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use envoy_api::pb::envoy::config::core::v3::Node;
use envoy_api::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_api::pb::google::protobuf::{Struct, Value as PbValue, value::Kind as PbKind};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::{Semaphore, watch};
use tonic::{Request, Response, Status};

use self::connection::SyncStatus;
use self::metrics::{XdsMetrics, type_label};
use self::push::{Push, PushSettings};
use self::resource::{TYPES, TypeKind};
use model::config::ObjectKey;
use model::{Locality, Proxy};
use transport::identity::Identity;

/// Proves who opened a stream on the secure port, from the client certificate its
/// connection verified (`peer`: the certificate's SPIFFE identities) or from the request's
/// metadata (a service-account token). meshd's CA implements it.
pub trait Authenticate: Send + Sync + 'static {
    fn authenticate<'a>(
        &'a self,
        peer: Option<&'a [Identity]>,
        metadata: &'a tonic::metadata::MetadataMap,
    ) -> futures::future::BoxFuture<'a, Result<Identity, Box<dyn std::error::Error + Send + Sync>>>;
}

/// The response stream went away.
#[derive(Debug)]
pub struct Closed;

/// State every connection shares.
pub struct XdsShared {
    pub metrics: XdsMetrics,
    /// The revision this instance serves, and the tags pointing to it; proxies of other
    /// revisions are refused.
    pub revisions: model::Revisions,
    pub throttle: Semaphore,
    pub settings: PushSettings,
    pushes: watch::Receiver<Arc<Push>>,
    next_id: AtomicU64,
    connections: Mutex<BTreeMap<u64, Arc<Mutex<SyncStatus>>>>,
    /// The latest NACK of a resource built from each object.
    rejections: Mutex<HashMap<ObjectKey, Rejection>>,
    series: PushSeries,
    /// Connected proxies' labels, each set kept once.
    label_sets: label_sets::LabelSets,
    /// The `/debug` views, for `istio.io/debug` requests (set by the monitoring port).
    debug_views: OnceLock<debug::DebugViews>,
    /// `control_plane.identifier` of debug responses, made on first use.
    control_plane: OnceLock<Arc<str>>,
    /// What every response body on both xDS ports shares: the send budget
    /// (`MESHD_XDS_SEND_BUFFER_MB`, across all connections) and the runs of encoded
    /// resources ([`joined`], swept by [`joined::spawn_sweeper`]).
    pub framing: wire::Framing,
}

/// The metric series a push touches for every proxy and type, each taken from its family
/// once: a family lookup allocates and hashes its label set, and a push made several per
/// proxy. Resolved at first use, so a series appears when it first counts, as before.
#[derive(Default)]
struct PushSeries {
    pushes: [OnceLock<Counter>; TYPES],
    push_time: [OnceLock<Histogram>; TYPES],
    config_size: [OnceLock<Histogram>; TYPES],
    /// `meshd_xds_push_diffs` by method: `view`, `full`.
    diffs: [OnceLock<Counter>; 2],
}

/// A proxy refused a resource built from an object.
#[derive(Clone, Debug, PartialEq)]
pub struct Rejection {
    pub proxy: String,
    /// Envoy's `error_detail`.
    pub message: String,
    /// The push the rejected response belonged to.
    pub push: u64,
}

impl XdsShared {
    /// The bound of one xDS port's accept loop on connections accepted and not yet
    /// answered (`MESHD_XDS_PENDING_CONNECTIONS`); each port has its own.
    pub fn admission(&self) -> transport::admission::Admission {
        transport::admission::Admission::new(
            self.settings.pending_connections,
            self.metrics.pending_connections.clone(),
        )
    }

    /// What each HTTP/2 connection of the gRPC ports is given: the keepalive and stream
    /// limit of the push settings, and where its errors are counted.
    pub fn grpc_settings(&self) -> transport::grpc::Settings {
        transport::grpc::Settings {
            keepalive_interval: self.settings.keepalive_interval,
            keepalive_timeout: self.settings.keepalive_timeout,
            max_streams: self.settings.max_streams,
            errors: self.metrics.connection_errors.clone(),
            at_limit: self.metrics.streams_at_limit.clone(),
        }
    }

    pub fn new(
        metrics: XdsMetrics,
        pushes: watch::Receiver<Arc<Push>>,
        settings: &PushSettings,
        revisions: model::Revisions,
    ) -> Arc<XdsShared> {
        let framing = wire::Framing {
            budget: (settings.send_buffer)
                .map(|bytes| wire::SendBudget::new(bytes, metrics.send_buffer.clone())),
            runs: Arc::new(joined::Runs::new(
                joined::CAPACITY,
                metrics.shared_runs.clone(),
            )),
        };
        Arc::new(XdsShared {
            framing,
            metrics,
            revisions,
            throttle: Semaphore::new(settings.push_throttle.max(1)),
            settings: settings.clone(),
            pushes,
            next_id: AtomicU64::new(1),
            connections: Mutex::default(),
            rejections: Mutex::default(),
            series: PushSeries::default(),
            label_sets: Default::default(),
            debug_views: OnceLock::new(),
            control_plane: OnceLock::new(),
        })
    }

    /// Lets `istio.io/debug` requests run the monitoring port's `/debug` views.
    pub fn set_debug_views(&self, views: debug::DebugViews) {
        let _ = self.debug_views.set(views);
    }

    pub fn debug_views(&self) -> Option<&debug::DebugViews> {
        self.debug_views.get()
    }

    /// Who this instance is, as istioctl reads it from a debug response: istiod's JSON
    /// with this pod's name (`POD_NAME`, else the host name).
    pub fn control_plane(&self) -> Arc<str> {
        self.control_plane
            .get_or_init(|| {
                let instance = std::env::var("POD_NAME")
                    .ok()
                    .filter(|n| !n.is_empty())
                    .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
                    .map(|n| n.trim().to_string())
                    .unwrap_or_else(|| "meshd".into());
                debug::control_plane_identifier(&instance).into()
            })
            .clone()
    }

    /// `pilot_xds_pushes{type}` of `kind`.
    pub fn pushes_of(&self, kind: TypeKind) -> &Counter {
        self.series.pushes[kind as usize].get_or_init(|| {
            let family = &self.metrics.pushes;
            family.get_or_create(&type_label(kind.short())).clone()
        })
    }

    /// `pilot_xds_push_time{type}` of `kind`.
    pub fn push_time_of(&self, kind: TypeKind) -> &Histogram {
        self.series.push_time[kind as usize].get_or_init(|| {
            let family = &self.metrics.push_time;
            family.get_or_create(&type_label(kind.short())).clone()
        })
    }

    /// `pilot_xds_config_size_bytes{type}` of `kind` (labelled by type URL, as istiod does).
    pub fn config_size_of(&self, kind: TypeKind) -> &Histogram {
        self.series.config_size[kind as usize].get_or_init(|| {
            let family = &self.metrics.config_size;
            family.get_or_create(&type_label(kind.url())).clone()
        })
    }

    /// `meshd_xds_push_diffs{method}`: `view` when a push was a step between two views,
    /// else `full`.
    pub fn push_diffs(&self, by_view: bool) -> &Counter {
        let method = if by_view { "view" } else { "full" };
        self.series.diffs[usize::from(by_view)].get_or_init(|| {
            let family = &self.metrics.push_diffs;
            family
                .get_or_create(&vec![("method", method.to_string())])
                .clone()
        })
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<Push>> {
        self.pushes.clone()
    }

    pub fn current_push(&self) -> Arc<Push> {
        self.pushes.borrow().clone()
    }

    fn next_connection_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn register(&self, id: u64, proxy: &Proxy, status: Arc<Mutex<SyncStatus>>) {
        self.connections.lock().unwrap().insert(id, status);
        self.metrics.clients.inc();
        self.metrics
            .by_version
            .get_or_create(&version_label(proxy))
            .inc();
    }

    fn deregister(&self, id: u64, proxy: &Proxy) {
        self.connections.lock().unwrap().remove(&id);
        self.label_sets.release(&proxy.labels);
        self.metrics.clients.dec();
        self.metrics
            .by_version
            .get_or_create(&version_label(proxy))
            .dec();
    }

    pub fn record_rejection(&self, object: ObjectKey, rejection: Rejection) {
        self.rejections.lock().unwrap().insert(object, rejection);
    }

    /// The latest NACK per object.
    pub fn rejections(&self) -> HashMap<ObjectKey, Rejection> {
        self.rejections.lock().unwrap().clone()
    }

    /// A snapshot of every connection's sync status, for `/debug/syncz`.
    pub fn sync_status(&self) -> Vec<SyncStatus> {
        self.connections
            .lock()
            .unwrap()
            .values()
            .map(|s| s.lock().unwrap().clone())
            .collect()
    }
}

fn version_label(proxy: &Proxy) -> Vec<(&'static str, String)> {
    vec![(
        "version",
        proxy
            .istio_version
            .clone()
            .unwrap_or_else(|| "unknown".into()),
    )]
}

/// Converts node metadata (a protobuf Struct) to JSON for the model.
pub fn struct_to_json(s: &Struct) -> serde_json::Map<String, serde_json::Value> {
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), value_to_json(v)))
        .collect()
}

fn value_to_json(v: &PbValue) -> serde_json::Value {
    use serde_json::Value as J;
    match &v.kind {
        None | Some(PbKind::NullValue(_)) => J::Null,
        Some(PbKind::NumberValue(n)) => serde_json::Number::from_f64(*n).map_or(J::Null, J::Number),
        Some(PbKind::StringValue(s)) => J::String(s.clone()),
        Some(PbKind::BoolValue(b)) => J::Bool(*b),
        Some(PbKind::StructValue(s)) => J::Object(struct_to_json(s)),
        Some(PbKind::ListValue(l)) => J::Array(l.values.iter().map(value_to_json).collect()),
    }
}

/// Identifies the proxy from the first request's node, or refuses the stream. On the
/// secure port `caller` is the identity the connection proved: the node must be a proxy of
/// that namespace and service account.
fn proxy_from_node(
    shared: &XdsShared,
    node: Option<&Node>,
    caller: Option<&Identity>,
) -> Result<Proxy, Status> {
    // Counts and logs a refusal; the caller picks the status code.
    let refuse = |reason: &str, message: String| {
        shared
            .metrics
            .connection_errors
            .get_or_create(&vec![("reason", reason.to_string())])
            .inc();
        tracing::warn!("refusing xDS stream: {message}");
        message
    };
    let node = node.ok_or_else(|| {
        Status::invalid_argument(refuse(
            "no_node",
            "the first request must carry the node".into(),
        ))
    })?;
    let metadata = node
        .metadata
        .as_ref()
        .map(struct_to_json)
        .unwrap_or_default();
    let mut proxy = Proxy::from_node(&node.id, &metadata)
        .map_err(|e| Status::invalid_argument(refuse("bad_node", e.to_string())))?;
    proxy.labels = shared.label_sets.intern(proxy.labels.clone());
    proxy.service_cluster = node.cluster.clone();
    proxy.istio_extensions =
        (node.extensions.iter()).any(|e| e.name == model::proxy::ISTIO_STATS_EXTENSION);
    if let Some(l) = &node.locality {
        proxy.locality = Locality {
            region: l.region.clone(),
            zone: l.zone.clone(),
            subzone: l.sub_zone.clone(),
        };
    }
    if let Some(identity) = caller {
        let claimed_sa = proxy.service_account.as_deref();
        if identity.namespace != proxy.namespace
            || claimed_sa.is_some_and(|sa| sa != identity.service_account)
        {
            let message = format!(
                "node {} (namespace {:?}, service account {:?}) does not match the connection's identity {identity}",
                proxy.id,
                proxy.namespace,
                claimed_sa.unwrap_or("-")
            );
            return Err(Status::permission_denied(refuse(
                "identity_mismatch",
                message,
            )));
        }
        proxy.identity = Some(identity.to_string());
    }
    let revision = shared.current_push().context.proxy_revision(&proxy);
    if !shared.revisions.answers_to(&revision) {
        let message = format!(
            "proxy {} belongs to revision {revision:?} but this meshd serves revision {:?} (tags {:?}); connect it to that revision's control plane",
            proxy.id,
            shared.revisions.revision(),
            shared.revisions.tags()
        );
        return Err(Status::failed_precondition(refuse(
            "wrong_revision",
            message,
        )));
    }
    Ok(proxy)
}

/// Who opened a stream: the identity it proved on the secure port (`None` on the
/// plaintext one), and the HTTP/2 connection it came on.
pub struct Caller {
    pub identity: Option<Identity>,
    pub transport: Option<Arc<transport::grpc::Connection>>,
}

/// The tonic service.
#[derive(Clone)]
pub struct AdsService {
    shared: Arc<XdsShared>,
    /// Set on the secure port: every stream must prove a workload identity.
    authn: Option<Arc<dyn Authenticate>>,
}

impl AdsService {
    /// The plaintext port (15010): no identity, so nothing identity-bound is served.
    pub fn new(shared: Arc<XdsShared>) -> AdsService {
        AdsService {
            shared,
            authn: None,
        }
    }

    /// The secure port (15012): a client certificate from this CA, or a token on first
    /// connect.
    pub fn secure(shared: Arc<XdsShared>, authn: Arc<dyn Authenticate>) -> AdsService {
        AdsService {
            shared,
            authn: Some(authn),
        }
    }

    /// Who opened the stream, and the requests it carries (split before authenticating,
    /// so that the requests need not be shared across the await).
    async fn caller<T>(&self, request: Request<T>) -> Result<(Caller, T), Status> {
        let transport = request
            .extensions()
            .get::<Arc<transport::grpc::Connection>>()
            .cloned();
        let peer = transport.as_ref().and_then(|t| t.identities.clone());
        let (metadata, _, requests) = request.into_parts();
        let Some(authn) = &self.authn else {
            let caller = Caller {
                identity: None,
                transport,
            };
            return Ok((caller, requests));
        };
        match authn.authenticate(peer.as_deref(), &metadata).await {
            Ok(identity) => {
                let caller = Caller {
                    identity: Some(identity),
                    transport,
                };
                Ok((caller, requests))
            }
            Err(e) => {
                self.shared
                    .metrics
                    .connection_errors
                    .get_or_create(&vec![("reason", "unauthenticated".to_string())])
                    .inc();
                tracing::warn!("refusing xDS stream: {e}");
                Err(Status::unauthenticated(e.to_string()))
            }
        }
    }

    pub fn into_server(self) -> wire::AdsServer<AdsService> {
        let max = self.shared.settings.max_recv_msg_size;
        let framing = self.shared.framing.clone();
        wire::AdsServer::new(self, max, framing)
    }
}

/// Responses buffered per stream before back-pressure holds the sender.
const STREAM_BUFFER: usize = 8;

impl wire::Ads for AdsService {
    type SotwStream = outbox::Receiver<Result<Box<wire::SotwResponse>, Status>>;
    type DeltaStream = outbox::Receiver<Result<Box<wire::DeltaResponse>, Status>>;

    async fn sotw(
        &self,
        request: Request<wire::Messages<DiscoveryRequest>>,
    ) -> Result<Response<Self::SotwStream>, Status> {
        let (caller, requests) = self.caller(request).await?;
        let (tx, rx) = outbox::channel(STREAM_BUFFER);
        let run = stream::run::<sotw::Sotw>(self.shared.clone(), requests, tx, caller);
        tokio::spawn(run);
        Ok(Response::new(rx))
    }

    async fn delta(
        &self,
        request: Request<wire::Messages<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaStream>, Status> {
        let (caller, requests) = self.caller(request).await?;
        let (tx, rx) = outbox::channel(STREAM_BUFFER);
        let run = stream::run::<delta::Delta>(self.shared.clone(), requests, tx, caller);
        tokio::spawn(run);
        Ok(Response::new(rx))
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Test fixtures shared by the xDS modules' unit tests.
    use std::sync::Arc;
    use std::time::Instant;

    use super::XdsShared;
    use super::cache::ResourceCache;
    use super::push::{Push, PushSettings};
    use model::{PushContext, Store};

    /// Pushes of a test store sharing one resource cache, as the push pipeline's do.
    #[derive(Default)]
    pub(crate) struct Pushes {
        cache: Arc<ResourceCache>,
    }

    impl Pushes {
        /// Push `n` of `store`, built from scratch.
        pub(crate) fn build(&self, store: &Store, n: u64) -> Arc<Push> {
            let ctx = PushContext::build(store, format!("v/{n}"));
            Arc::new(Push::new(ctx, n, Instant::now(), None, self.cache.clone()))
        }
    }

    /// Asserts that two views hold the same resources of every type: the same names,
    /// bytes and versions (`what` names the proxy in a failure).
    pub(crate) fn assert_same_views(
        a: &super::resource::View,
        b: &super::resource::View,
        what: &str,
    ) {
        for kind in super::resource::PUSH_ORDER {
            let names = |v: &super::resource::View| v.all(kind).keys().cloned().collect::<Vec<_>>();
            assert_eq!(names(a), names(b), "{kind:?} of {what}");
            for (name, r) in b.all(kind) {
                let other = &a.all(kind)[name];
                assert_eq!(other.value(), r.value(), "{kind:?} {name} of {what}");
                // The same version whether kept whole or in pieces.
                assert_eq!(other.hash, r.hash, "{kind:?} {name} of {what}");
            }
        }
    }

    /// The connections' shared state with default settings, following `pushes`.
    pub(crate) fn shared(pushes: tokio::sync::watch::Receiver<Arc<Push>>) -> Arc<XdsShared> {
        XdsShared::new(
            super::metrics::XdsMetrics::unregistered(),
            pushes,
            &PushSettings::default(),
            model::Revisions::new("default"),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use envoy_api::pb::envoy::config::core::v3::{Extension, Node};

    use super::proxy_from_node;
    use super::testing::{Pushes, shared};

    #[test]
    fn a_node_that_lists_istio_proxys_stats_extension_is_istio_proxy() {
        let push = Pushes::default().build(&model::Store::default(), 1);
        let (_tx, rx) = tokio::sync::watch::channel(Arc::clone(&push));
        let shared = shared(rx);
        // Envoy lists every extension it was built with; stock Envoy's list lacks Istio's.
        let node = |extensions: &[&str]| Node {
            id: "sidecar~10.0.0.1~web-0.shop~shop.svc.cluster.local".into(),
            extensions: (extensions.iter())
                .map(|name| Extension {
                    name: name.to_string(),
                    category: "envoy.filters.http".into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let istio = |extensions: &[&str]| {
            let proxy = proxy_from_node(&shared, Some(&node(extensions)), None).unwrap();
            proxy.istio_extensions
        };
        assert!(istio(&[
            "envoy.filters.http.router",
            "envoy.filters.http.istio_stats"
        ]));
        assert!(!istio(&[
            "envoy.filters.http.router",
            "envoy.filters.http.rbac"
        ]));
        assert!(!istio(&[]));
    }
}
