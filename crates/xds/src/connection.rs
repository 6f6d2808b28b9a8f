//! Per-connection xDS state, shared by the SotW and delta framings: what each type is
//! subscribed to, what was sent (name → version), which nonce is outstanding, and the
//! bookkeeping behind `/debug/syncz` and the convergence metric.
//!
//! Per-proxy state is kept to subscriptions and versions; the resources themselves live
//! in the push's shared views.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

use super::XdsShared;
use super::metrics::type_label;
use super::push::ChangeSet;
use super::resource::{PUSH_ORDER, Resource, ResourceMap, TYPES, TypeKind, View};
use super::snapshot::Snapshot;
use super::wire::Batch;
use model::Proxy;
use model::config::ObjectKey;

/// One type's watch on one stream.
#[derive(Debug, Default)]
pub struct Watch {
    /// The proxy has asked for this type on this stream.
    pub subscribed: bool,
    pub wildcard: bool,
    /// Subscribed names, sharing the view's name strings where the resource exists.
    pub names: BTreeSet<Arc<str>>,
    /// What the proxy was sent (or, on delta reconnect, says it has): name → version hash.
    /// This and `names` are the per-proxy state that grows with the mesh: about 30 bytes
    /// per resource, the names themselves living once in the push's view.
    pub sent: foldhash::HashMap<Arc<str>, u64>,
    pub nonce_sent: Option<String>,
    pub nonce_acked: Option<String>,
    /// Trigger time of the push whose response is not ACKed yet.
    pub pending_since: Option<Instant>,
    /// Names to resend even if unchanged (EDS after its cluster changed; re-subscriptions).
    pub force: BTreeSet<Arc<str>>,
    /// SotW: answer the next request even if it only ACKs (EDS after a CDS push).
    pub always_respond: bool,
    /// The resources of the outstanding response (to name what a NACK rejected); emptied
    /// when it is ACKed.
    pub last_response: Batch,
    /// The push of the last response sent on this type.
    pub pushed_at: Option<u64>,
    /// The objects changed by every push sent on this type since its last ACK: a NACK
    /// blames these, even when a later push has arrived before the NACK.
    pub unacked: Suspects,
    /// A view whose resources of this type are exactly what the proxy holds and is
    /// subscribed to: the next push then sends that view's difference to the new one,
    /// computed once for every proxy that shares both, instead of comparing every name.
    /// Anything else that changes `sent`, `names` or `force` drops it.
    pub basis: Option<Arc<View>>,
    /// `sent` and `names` are not kept: they are exactly `basis`'s names and hashes of
    /// this type. A synced delta proxy then keeps no per-resource state at all; the maps
    /// come back ([`Connection::materialize`]) only when its state leaves a view's.
    pub compact: bool,
}

/// A connection's watches, one per type, indexed by `TypeKind as usize`. The watches of
/// SDS (gateway credentials), VHDS and NDS are kept out of line and allocated only once
/// something is recorded on them: most sidecars use none, and each costs them one pointer
/// instead of a watch (~230 bytes of every connection, measured in RSS for VHDS).
#[derive(Debug, Default)]
pub struct Watches {
    inline: [Watch; INLINE],
    outlying: [Option<Box<Watch>>; TYPES - INLINE],
}

/// The types whose watches are inline: those every proxy uses (CDS, EDS, LDS, RDS).
const INLINE: usize = TypeKind::Secret as usize;

const _: () = assert!(
    TypeKind::Secret as usize == TYPES - 3
        && TypeKind::VirtualHost as usize == TYPES - 2
        && TypeKind::NameTable as usize == TYPES - 1,
    "SDS, VHDS and NDS are the last types"
);

/// What an unused out-of-line watch reads as.
static UNUSED: std::sync::LazyLock<Watch> = std::sync::LazyLock::new(Watch::default);

impl Watches {
    pub fn iter(&self) -> impl Iterator<Item = &Watch> {
        (self.inline.iter()).chain(self.outlying.iter().flatten().map(|w| &**w))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Watch> {
        (self.inline.iter_mut()).chain(self.outlying.iter_mut().flatten().map(|w| &mut **w))
    }

    /// Whether the watch of `kind` has been allocated (always, for an inline one).
    #[cfg(test)]
    pub(super) fn holds(&self, kind: TypeKind) -> bool {
        let i = kind as usize;
        i < INLINE || self.outlying[i - INLINE].is_some()
    }
}

impl std::ops::Index<usize> for Watches {
    type Output = Watch;
    fn index(&self, i: usize) -> &Watch {
        match self.inline.get(i) {
            Some(w) => w,
            None => self.outlying[i - INLINE].as_deref().unwrap_or(&UNUSED),
        }
    }
}

impl std::ops::IndexMut<usize> for Watches {
    fn index_mut(&mut self, i: usize) -> &mut Watch {
        if i < INLINE {
            return &mut self.inline[i];
        }
        self.outlying[i - INLINE].get_or_insert_with(Box::default)
    }
}

impl Watch {
    /// A compact watch's state of `kind`: its basis view's resources.
    fn held_view(&self, kind: TypeKind) -> Option<&ResourceMap> {
        self.basis
            .as_ref()
            .filter(|_| self.compact)
            .map(|b| b.all(kind))
    }
}

/// Objects whose changes a proxy has been sent but not yet accepted.
#[derive(Debug, Default)]
pub struct Suspects {
    /// Each response not yet ACKed, oldest first: its nonce and the change sets of the
    /// pushes since the type's previous response (`None`: unknown, as after a full push,
    /// where any object may be at fault).
    pending: VecDeque<(String, Option<Vec<ChangeSet>>)>,
    /// Older responses were dropped unACKed (a proxy that never answers): unknown.
    lost: bool,
}

/// Unanswered responses remembered per type; beyond it the oldest are forgotten.
const MAX_PENDING: usize = 64;

impl Suspects {
    fn add(&mut self, nonce: &str, changed: Option<Vec<ChangeSet>>) {
        if self.pending.len() == MAX_PENDING {
            self.pending.pop_front();
            self.lost = true;
        }
        self.pending.push_back((nonce.to_string(), changed));
    }

    /// The proxy ACKed `nonce`: it accepted that response and every earlier one (an ACK
    /// of an older response can arrive after a newer one was sent).
    pub fn accepted(&mut self, nonce: &str) {
        if let Some(i) = self.pending.iter().position(|(n, _)| n == nonce) {
            self.pending.drain(..=i);
            self.lost = false;
        }
    }

    /// Of the objects a rejected resource was built from, those to blame: the ones
    /// changed by responses sent since the last ACK, or all of them when that is unknown
    /// or none matched.
    pub fn blame(&self, origins: Vec<ObjectKey>) -> Vec<ObjectKey> {
        if self.lost || self.pending.iter().any(|(_, keys)| keys.is_none()) {
            return origins;
        }
        let changed: Vec<ObjectKey> = origins
            .iter()
            .filter(|o| {
                self.pending
                    .iter()
                    .any(|(_, sets)| sets.iter().flatten().any(|keys| keys.contains(*o)))
            })
            .cloned()
            .collect();
        if changed.is_empty() { origins } else { changed }
    }
}

/// What `/debug/syncz` shows of one type on one connection.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TypeStatus {
    pub nonce_sent: String,
    pub nonce_acked: String,
    /// The push's version, shared with every proxy that was sent it.
    #[serde(serialize_with = "as_str")]
    pub version_sent: Arc<str>,
    #[serde(serialize_with = "as_str")]
    pub version_acked: Arc<str>,
    pub responses: u64,
    pub resources: u32,
    pub rejects: u32,
    /// When the last response was sent, in seconds since the Unix epoch (CSDS's
    /// `last_updated`); 0 before any.
    #[serde(skip)]
    sent_secs: u32,
    /// Whether the last response sent was rejected (and nothing was sent since).
    rejected: bool,
    pub last_error: Option<String>,
}

impl TypeStatus {
    /// When the last response was sent, to the second.
    pub fn sent_at(&self) -> Option<std::time::SystemTime> {
        (self.sent_secs != 0)
            .then(|| std::time::UNIX_EPOCH + std::time::Duration::from_secs(self.sent_secs.into()))
    }

    /// Whether the proxy rejected the last response sent (and has not been sent another).
    pub fn rejected(&self) -> bool {
        self.rejected
    }
}

/// Now, in seconds since the Unix epoch (saturating in 2106).
fn unix_secs() -> u32 {
    let now = super::metrics::unix_seconds(std::time::SystemTime::now());
    u32::try_from(now).unwrap_or(u32::MAX)
}

fn as_str<S: serde::Serializer>(s: &Arc<str>, out: S) -> Result<S::Ok, S::Error> {
    out.serialize_str(s)
}

/// What `/debug/syncz` shows of one connection. The proxy's names are read from the
/// proxy itself (shared with the connection) when shown, not kept a second time.
#[derive(Clone, Debug)]
pub struct SyncStatus {
    /// The connection's number (its id is `PROXY-NUMBER`).
    pub number: u64,
    pub delta: bool,
    /// By [`TypeKind`], for the types a response was sent or an event recorded on. Boxed:
    /// a proxy uses four of the six types, and a status inline is 128 bytes.
    pub types: [Option<Box<TypeStatus>>; TYPES],
    /// The newest push this proxy is known to hold in full: every subscribed type ACKed,
    /// or the push could not change anything for it.
    pub in_sync_push: u64,
    /// The proxy, as the connection and the model see it.
    pub model: Arc<Proxy>,
    /// The HTTP/2 connection its stream is on.
    pub transport: Option<Arc<transport::grpc::Connection>>,
    /// The route configurations the proxy subscribes to, as of its last request that
    /// changed them: istiod's debug dump shows these (a draining listener's too), not the
    /// ones its current listeners name. `None` before its first RDS request.
    pub route_names: Option<Arc<[Arc<str>]>>,
}

impl SyncStatus {
    /// `PROXY-NUMBER`, as istiod names connections.
    pub fn connection_id(&self) -> String {
        format!("{}-{}", self.model.id, self.number)
    }

    /// The status of `kind`, created on first use.
    pub fn of(&mut self, kind: TypeKind) -> &mut TypeStatus {
        self.types[kind as usize].get_or_insert_with(Default::default)
    }
}

/// The types istiod's `/debug/syncz` shows as `NAME_sent` and `NAME_acked`.
const ISTIOD_SYNC_FIELDS: [(TypeKind, &str); 4] = [
    (TypeKind::Cluster, "cluster"),
    (TypeKind::Listener, "listener"),
    (TypeKind::Route, "route"),
    (TypeKind::Endpoint, "endpoint"),
];

impl Serialize for SyncStatus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let p = &*self.model;
        let types: BTreeMap<&str, &TypeStatus> = (PUSH_ORDER.iter())
            .filter_map(|k| Some((k.short(), &**self.types[*k as usize].as_ref()?)))
            .collect();
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("connection_id", &self.connection_id())?;
        m.serialize_entry("proxy", &p.id)?;
        m.serialize_entry("proxy_type", &p.kind)?;
        m.serialize_entry("namespace", &p.namespace)?;
        m.serialize_entry("cluster_id", &p.cluster_id)?;
        m.serialize_entry("istio_version", p.istio_version.as_deref().unwrap_or(""))?;
        // istiod's fields: nonce sent and ACKed per type, each only when not empty.
        for (kind, name) in ISTIOD_SYNC_FIELDS {
            let Some(t) = &self.types[kind as usize] else {
                continue;
            };
            for (suffix, nonce) in [("sent", &t.nonce_sent), ("acked", &t.nonce_acked)] {
                if !nonce.is_empty() {
                    m.serialize_entry(&format!("{name}_{suffix}"), nonce)?;
                }
            }
        }
        m.serialize_entry("delta", &self.delta)?;
        m.serialize_entry("types", &types)?;
        m.serialize_entry("in_sync_push", &self.in_sync_push)?;
        m.end()
    }
}

pub struct Connection {
    pub id: u64,
    /// Shared with the connection's [`SyncStatus`].
    pub proxy: Arc<Proxy>,
    /// The push it is being brought to, known only as a [`Snapshot`].
    pub push: Arc<dyn Snapshot>,
    pub watches: Watches,
    pub status: Arc<Mutex<SyncStatus>>,
    pub shared: Arc<XdsShared>,
    nonces: u64,
}

impl Connection {
    pub fn new(shared: Arc<XdsShared>, proxy: Proxy, delta: bool) -> Connection {
        let id = shared.next_connection_id();
        let proxy = Arc::new(proxy);
        let status = Arc::new(Mutex::new(SyncStatus {
            number: id,
            delta,
            types: Default::default(),
            in_sync_push: 0,
            model: proxy.clone(),
            transport: None,
            route_names: None,
        }));
        shared.register(id, &proxy, status.clone());
        let push = shared.current_push();
        Connection {
            id,
            proxy,
            push,
            watches: Default::default(),
            status,
            shared,
            nonces: 0,
        }
    }

    /// A requested name, as the view's shared string when the view has that resource.
    pub fn intern(view: &View, kind: TypeKind, name: &str) -> Arc<str> {
        view.all(kind)
            .get(name)
            .map(|r| r.name.clone())
            .unwrap_or_else(|| name.into())
    }

    pub fn next_nonce(&mut self) -> String {
        self.nonces += 1;
        format!("{}-{}", self.push.number(), self.nonces)
    }

    pub fn view(&self) -> Arc<View> {
        self.push.view(&self.proxy)
    }

    /// What the proxy should hold for `kind` now, given its subscription.
    pub fn desired(&self, view: &View, kind: TypeKind) -> Vec<Arc<Resource>> {
        let w = &self.watches[kind as usize];
        if w.wildcard {
            return view.all(kind).values().cloned().collect();
        }
        match w.held_view(kind) {
            Some(held) => held.keys().filter_map(|n| view.get(kind, n)).collect(),
            None => w.names.iter().filter_map(|n| view.get(kind, n)).collect(),
        }
    }

    /// Gives a compact watch its own `sent` and `names` back (from its basis view),
    /// before anything but a step to the next view changes them.
    pub fn materialize(&mut self, kind: TypeKind) {
        let w = &mut self.watches[kind as usize];
        if !std::mem::take(&mut w.compact) {
            return;
        }
        let Some(basis) = &w.basis else { return };
        let all = basis.all(kind);
        w.sent = all.values().map(|r| (r.name.clone(), r.hash)).collect();
        if !w.wildcard {
            w.names = all.keys().cloned().collect();
        }
    }

    /// Records the route configurations the proxy subscribes to in its status, after a
    /// request that changed them.
    pub fn note_route_names(&self) {
        let w = &self.watches[TypeKind::Route as usize];
        let names: Arc<[Arc<str>]> = match w.held_view(TypeKind::Route) {
            Some(held) => held.keys().cloned().collect(),
            None => w.names.iter().cloned().collect(),
        };
        self.status.lock().unwrap().route_names = Some(names);
    }

    /// Whether the proxy subscribed to `name` of `kind` (explicitly or by wildcard).
    fn subscribed_to(&self, kind: TypeKind, name: &str) -> bool {
        let w = &self.watches[kind as usize];
        w.wildcard
            || match w.held_view(kind) {
                Some(held) => held.contains_key(name),
                None => w.names.contains(name),
            }
    }

    /// Resources that differ from what was sent (or are forced), and names to remove.
    pub fn diff(&self, view: &View, kind: TypeKind) -> (Vec<Arc<Resource>>, Vec<String>) {
        self.diff_of(kind, &self.desired(view, kind))
    }

    /// As [`Connection::diff`], against a desired set the caller already holds.
    pub fn diff_of(
        &self,
        kind: TypeKind,
        desired: &[Arc<Resource>],
    ) -> (Vec<Arc<Resource>>, Vec<String>) {
        let w = &self.watches[kind as usize];
        // What the proxy holds: its own record, or a compact watch's basis view.
        let basis = w.held_view(kind);
        let held = |name: &str| match basis {
            Some(all) => all.get(name).map(|r| r.hash),
            None => w.sent.get(name).copied(),
        };
        let changed: Vec<Arc<Resource>> = desired
            .iter()
            .filter(|r| w.force.contains(&r.name) || held(&r.name) != Some(r.hash))
            .cloned()
            .collect();
        let keep: BTreeSet<&str> = desired.iter().map(|r| &*r.name).collect();
        let held_names: Vec<&Arc<str>> = match basis {
            Some(all) => all.keys().collect(),
            None => w.sent.keys().collect(),
        };
        let mut removed: Vec<String> = held_names
            .into_iter()
            .filter(|n| !keep.contains(&***n))
            .map(|n| n.to_string())
            .collect();
        removed.sort();
        (changed, removed)
    }

    /// As [`Connection::diff`] in time proportional to what changed, when the proxy holds
    /// exactly an earlier view's resources of `kind`; `None` when it does not, or when a
    /// requested-by-name type would gain or lose names (the full diff decides those).
    pub fn diff_from_basis(
        &self,
        view: &Arc<View>,
        kind: TypeKind,
    ) -> Option<(Batch, Vec<String>)> {
        let w = &self.watches[kind as usize];
        let basis = w.basis.as_ref()?;
        if !w.force.is_empty() {
            return None;
        }
        // The same view, or one sharing this type's set (a push's views keep the sets a
        // change cannot touch): nothing to send, without taking the push's diff table.
        if Arc::ptr_eq(basis, view) || basis.shares(view, kind) {
            return Some((Batch::default(), Vec::new()));
        }
        let d = self.push.view_diff(basis, view, kind);
        if !w.wildcard && d.names_differ {
            return None;
        }
        Some((d.changed.clone(), d.removed.clone()))
    }

    /// After a push of `kind` from `view`: remembers the view as the proxy's basis if the
    /// proxy now holds exactly its resources of that type. `from_basis`: the push was
    /// [`Connection::diff_from_basis`]'s, which leaves exactly the view's resources.
    /// An exact watch of a delta proxy becomes compact: the view holds its state.
    pub fn settle_basis(&mut self, view: &Arc<View>, kind: TypeKind, from_basis: bool) {
        if !from_basis {
            self.materialize(kind);
        }
        let w = &mut self.watches[kind as usize];
        let all = view.all(kind);
        let exact = w.force.is_empty()
            && (from_basis
                || (w.sent.len() == all.len()
                    && (w.wildcard || w.names.len() == all.len())
                    && all.values().all(|r| {
                        w.sent.get(&r.name) == Some(&r.hash)
                            && (w.wildcard || w.names.contains(&r.name))
                    })));
        if !exact {
            // Only a step from a compact basis leaves no maps; it is exact by definition.
            w.basis = None;
            return;
        }
        w.basis = Some(view.clone());
        w.compact = true;
        w.sent = Default::default();
        w.names = BTreeSet::new();
        let resources = all.len();
        let mut status = self.status.lock().unwrap();
        status.of(kind).resources = u32::try_from(resources).unwrap_or(u32::MAX);
    }

    /// Records a response about to be sent; returns its nonce.
    pub fn record_sent(
        &mut self,
        kind: TypeKind,
        changed: &Batch,
        removed: &[String],
        full: bool,
        trigger: Option<Instant>,
    ) -> String {
        let nonce = self.next_nonce();
        let push_version = self.push.version();
        let w = &mut self.watches[kind as usize];
        if w.compact {
            // A step from the basis view to the next: `settle_basis` moves the basis
            // (every other change of what the proxy holds materializes first).
            if !w.force.is_empty() {
                for r in changed.iter() {
                    w.force.remove(&r.name);
                }
            }
        } else {
            w.basis = None;
            if full {
                w.sent.clear();
            }
            for r in changed.iter() {
                w.sent.insert(r.name.clone(), r.hash);
                w.force.remove(&r.name);
            }
            for n in removed {
                w.sent.remove(n.as_str());
            }
        }
        w.nonce_sent = Some(nonce.clone());
        w.last_response = changed.clone();
        // The response carries the changes of every push since the type's last response,
        // including pushes this connection skipped.
        w.unacked.add(
            &nonce,
            self.push
                .changed_since(w.pushed_at.replace(self.push.number())),
        );
        if w.pending_since.is_none() {
            w.pending_since = trigger;
        }
        let resources = w.held_view(kind).map_or(w.sent.len(), |held| held.len());
        self.shared.pushes_of(kind).inc();
        (self.shared.config_size_of(kind)).observe(changed.values_len() as f64);
        let mut status = self.status.lock().unwrap();
        let t = status.of(kind);
        t.nonce_sent = nonce.clone();
        t.version_sent = push_version;
        t.responses += 1;
        t.resources = u32::try_from(resources).unwrap_or(u32::MAX);
        t.sent_secs = unix_secs();
        t.rejected = false;
        nonce
    }

    /// An ACK of the outstanding nonce.
    pub fn record_ack(&mut self, kind: TypeKind, nonce: &str) {
        let w = &mut self.watches[kind as usize];
        w.nonce_acked = Some(nonce.to_string());
        w.unacked = Suspects::default();
        // Only a rejection of the outstanding response needs its resources.
        w.last_response = Batch::default();
        if let Some(since) = w.pending_since.take() {
            self.shared
                .metrics
                .convergence_time
                .observe(since.elapsed().as_secs_f64());
        }
        {
            let mut status = self.status.lock().unwrap();
            let t = status.of(kind);
            t.nonce_acked = nonce.to_string();
            t.version_acked = t.version_sent.clone();
        }
        self.note_sync();
    }

    /// The connection has been brought to `self.push`: every type it was sent before now
    /// reflects that push, so the changes up to it are no news to the next response
    /// (a change that altered nothing of a type is no suspect when the type is rejected).
    pub fn caught_up(&mut self) {
        let number = self.push.number();
        for w in self.watches.iter_mut() {
            if w.pushed_at.is_some() {
                w.pushed_at = Some(number);
            }
        }
    }

    /// Records that the proxy holds its current push in full, if every response sent to
    /// it has been ACKed.
    pub fn note_sync(&self) {
        let all_acked = self.watches.iter().all(|w| w.nonce_sent == w.nonce_acked);
        if all_acked {
            self.status.lock().unwrap().in_sync_push = self.push.number();
        }
    }

    /// A NACK: the proxy keeps its last good config; meshd logs, counts and records it,
    /// and does not resend the rejected version.
    pub fn record_nack(&mut self, kind: TypeKind, nonce: &str, message: &str) {
        let label = type_label(kind.short());
        let metrics = &self.shared.metrics;
        metrics.rejects.get_or_create(&label).inc();
        metrics.push_errors.get_or_create(&label).inc();
        tracing::warn!(proxy = %self.proxy.id, r#type = kind.short(), nonce, "proxy rejected config: {message}");
        let w = &mut self.watches[kind as usize];
        w.pending_since = None;
        if w.nonce_sent.as_deref() == Some(nonce) {
            // A resource is built from several objects (a route configuration from every
            // VirtualService on its port): blame those changed since the last ACK, if any.
            let origins = super::origin::origins(kind, &w.last_response);
            let blamed = w.unacked.blame(origins);
            tracing::debug!(proxy = %self.proxy.id, r#type = kind.short(), ?blamed, "rejection attributed");
            for object in blamed {
                let rejection = super::Rejection {
                    proxy: self.proxy.id.clone(),
                    message: message.to_string(),
                    push: self.push.number(),
                };
                self.shared.record_rejection(object, rejection);
            }
        }
        let mut status = self.status.lock().unwrap();
        let t = status.of(kind);
        t.rejects += 1;
        t.last_error = Some(message.to_string());
        t.rejected = t.nonce_sent == nonce;
    }

    /// A request answering an older response than the last one sent: for an ACK, that
    /// response was accepted.
    pub fn record_expired_nonce(&mut self, kind: TypeKind, nonce: &str) {
        self.watches[kind as usize].unacked.accepted(nonce);
        self.shared
            .metrics
            .expired_nonce
            .get_or_create(&type_label(kind.short()))
            .inc();
    }

    /// After a CDS response, the changed clusters' load assignments must follow even if
    /// unchanged, or Envoy keeps those clusters warming.
    pub fn force_endpoints_after_clusters(&mut self, clusters: &[Arc<Resource>]) {
        // Only names already subscribed: a new cluster's name arrives as a subscription,
        // which is always answered.
        let subscribed: Vec<Arc<str>> = clusters
            .iter()
            .filter(|c| self.subscribed_to(TypeKind::Endpoint, &c.name))
            .map(|c| c.name.clone())
            .collect();
        let eds = &mut self.watches[TypeKind::Endpoint as usize];
        eds.force.extend(subscribed);
        eds.always_respond = true;
    }

    /// After route configurations were sent to a VHDS proxy: their virtual hosts are sent
    /// again (once VHDS is subscribed). Envoy takes a virtual host only for a route
    /// configuration it holds, so those of a new route configuration, pushed before Envoy
    /// had it, were dropped; and a changed route configuration clears its virtual hosts.
    /// Envoy asks for none by name (VHDS watches are namespaces), so meshd sends them.
    pub fn force_virtual_hosts_after_routes(&mut self, view: &View, routes: &[Arc<Resource>]) {
        let vhds = TypeKind::VirtualHost;
        if !self.proxy.vhds || routes.is_empty() || !self.watches[vhds as usize].subscribed {
            return;
        }
        let route_configs: BTreeSet<&str> = routes.iter().map(|r| &*r.name).collect();
        let forced: Vec<Arc<str>> = (view.all(vhds).keys())
            .filter(|n| vhds_subscribed(&route_configs, n))
            .cloned()
            .collect();
        self.watches[vhds as usize].force.extend(forced);
    }

    /// Types in push order that this stream has subscribed to.
    pub fn subscribed_types(&self) -> Vec<TypeKind> {
        PUSH_ORDER
            .into_iter()
            .filter(|k| self.watches[*k as usize].subscribed)
            .collect()
    }
}

/// Whether the VHDS resource `name` belongs to one of `route_configs` (as Envoy's watch
/// for a route configuration takes every resource named under it).
fn vhds_subscribed(route_configs: &BTreeSet<&str>, name: &str) -> bool {
    super::resource::vhds_route_config(name).is_some_and(|rc| route_configs.contains(rc))
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.shared.deregister(self.id, &self.proxy);
    }
}

#[cfg(test)]
mod tests;
