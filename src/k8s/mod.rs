//! The Kubernetes source: a kube-runtime watcher per kind meshd reads, feeding the model
//! through the same parse, validate and apply path as the config directory.
//!
//! - Memory: objects are cut down at the edge (`config::parse`); managed fields and
//!   kubectl's last-applied annotation never reach the model.
//! - Relists (start-up, `410 Gone`, a dropped watch) replace one kind's set atomically
//!   at `InitDone`, applying only real differences, so proxies keep their config and
//!   only changes are pushed.
//! - Revisions: an Istio object labelled `istio.io/rev` for another revision is treated
//!   as absent; unlabelled objects apply to every revision, as in Istio.
//! - Bad objects keep their last good version and are reported like bad files.

pub mod crds;
pub mod injection;
pub mod ipallocate;
pub mod lease;
pub mod root_cert;
pub mod status;
mod tags;
pub mod webhook_ca;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::watch;

use crate::filesource::{IssueBoard, IssueHook, OnChange};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::metrics::Labels;
use model::Store;
use model::config::parse::{Parsed, parse_value};
use model::config::{ConfigObject, Kind, ObjectKey};
use model::mesh::MeshConfig;
use model::{REVISION_LABEL, namespace_revision};

/// What this instance watches and keeps.
#[derive(Clone, Debug)]
pub struct Scope {
    /// This instance's revision (`default` unless `--revision` says otherwise) and the
    /// tags pointing to it (kept by the source's tag watch); an `istio.io/rev` of either is
    /// this instance's.
    pub revisions: model::Revisions,
    /// If not empty, only these namespaces are kept (`WATCHED_NAMESPACES`).
    pub namespaces: BTreeSet<String>,
    /// Where the mesh ConfigMap lives (the root namespace, `istio-system`).
    pub config_namespace: String,
    /// EndpointSlices (Istio's default) or, when false, core v1 Endpoints
    /// (`PILOT_USE_ENDPOINT_SLICE`).
    pub use_endpoint_slice: bool,
}

impl Scope {
    /// The kinds watched: all but the endpoint kind not chosen.
    fn kinds(&self) -> Vec<Kind> {
        let unused = if self.use_endpoint_slice {
            Kind::Endpoints
        } else {
            Kind::EndpointSlice
        };
        Kind::ALL.into_iter().filter(|k| *k != unused).collect()
    }

    /// Whether the object `key`, labelled `labels`, is this instance's to keep.
    fn keeps(&self, key: &ObjectKey, labels: &BTreeMap<String, String>) -> bool {
        if !self.namespaces.is_empty()
            && key.kind.namespaced()
            && !self.namespaces.contains(&key.namespace)
        {
            return false;
        }
        if key.kind.is_istio()
            && let Some(rev) = labels.get(REVISION_LABEL)
        {
            return self.revisions.answers_to(rev);
        }
        true
    }
}

/// The API resource of `kind` (its group, first version and plural).
pub fn api_resource(kind: Kind) -> ApiResource {
    let version = kind.versions()[0];
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(kind.group(), version, kind.as_str()),
        kind.plural(),
    )
}

/// What the namespaces' labels and the mesh config say this instance keeps.
#[derive(Clone, Debug, Default, PartialEq)]
struct NamespaceScope {
    /// Namespaces selected by the mesh's `discoverySelectors`; `None` keeps all.
    selected: Option<BTreeSet<String>>,
    /// Namespaces owned by another revision (`istio.io/rev`, or `istio-injection=enabled`
    /// for `default`): their unlabelled Istio objects belong to that revision.
    other_revision: BTreeSet<String>,
}

/// Which instance of an Istio object the API holds, and its generation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Seen {
    /// `metadata.uid`: an object deleted and created again under the same name is a new
    /// instance, whose status is written afresh.
    pub uid: String,
    pub generation: Option<i64>,
}

/// What became of one object from the API.
enum Outcome {
    Keep(Box<ConfigObject>),
    /// Outside this instance's scope (revision, namespaces): absent for us.
    OutOfScope,
    /// Invalid: reported, and its last good version (if any) stays.
    Rejected,
}

/// Shared state of the watchers.
pub struct KubeSource {
    client: Client,
    store: Arc<RwLock<Store>>,
    scope: Scope,
    issues: IssueBoard,
    hook: IssueHook,
    /// Kinds listed at least once (or whose CRD is not installed).
    synced: watch::Sender<BTreeSet<Kind>>,
    /// The Istio CRDs the cluster has.
    crds: watch::Sender<crds::Installed>,
    /// Which namespaces' objects this instance keeps.
    selection: RwLock<NamespaceScope>,
    /// Bumped when the selection changes: namespaced watchers relist.
    rescope: watch::Sender<u64>,
    /// Set once the revision tags have been listed (or cannot be).
    tags_listed: watch::Sender<bool>,
    /// The instance and latest generation seen per Istio object, accepted or not (for
    /// status).
    pub generations: Arc<RwLock<HashMap<ObjectKey, Seen>>>,
    metrics: SourceMetrics,
}

/// What the Kubernetes source counts, with istiod's names.
#[derive(Clone, Default)]
pub struct SourceMetrics {
    /// Watch events by `type` and `event`: Istio config, and the registry.
    pub cfg_events: Family<Labels, Counter>,
    pub reg_events: Family<Labels, Counter>,
    /// 1 for each Istio kind whose CRD the cluster lacks (served as empty until installed).
    pub crd_missing: Family<Labels, Gauge>,
}

impl SourceMetrics {
    pub fn register(registry: &mut Registry) -> SourceMetrics {
        let m = SourceMetrics::default();
        registry.register(
            "pilot_k8s_cfg_events",
            "Events from k8s config",
            m.cfg_events.clone(),
        );
        registry.register(
            "pilot_k8s_reg_events",
            "Events from k8s registry",
            m.reg_events.clone(),
        );
        registry.register(
            "meshd_k8s_crd_missing",
            "Istio kinds whose CustomResourceDefinition is not installed: served as empty, watched once installed",
            m.crd_missing.clone(),
        );
        m
    }
}

/// The event an applied object makes: `add` if it was not held, `update` if it changed,
/// and for the registry's kinds `updatesame` if it did not (istiod's informers filter
/// those; its config client counts every update as `update`).
fn event_of(known: bool, changed: bool, kind: Kind) -> &'static str {
    match (known, changed) {
        (false, _) => "add",
        (true, false) if !kind.is_istio() => "updatesame",
        (true, _) => "update",
    }
}

/// How istiod counts a watch event: `pilot_k8s_cfg_events{type=KIND}` for Istio config,
/// `pilot_k8s_reg_events{type}` for the registry's kinds (Services, EndpointSlice, Pods,
/// Nodes); other kinds are not counted.
fn count_event(metrics: &SourceMetrics, kind: Kind, event: &str) {
    let (family, kind) = if kind.is_istio() {
        (&metrics.cfg_events, kind.as_str())
    } else {
        let registry = match kind {
            Kind::Service => "Services",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Endpoints => "Endpoints",
            Kind::Pod => "Pods",
            Kind::Node => "Nodes",
            _ => return,
        };
        (&metrics.reg_events, registry)
    };
    let labels = vec![("type", kind.to_string()), ("event", event.to_string())];
    family.get_or_create(&labels).inc();
}

/// Kinds that decide what the other watchers keep, so they are listed first.
const SCOPING_KINDS: [Kind; 2] = [Kind::Namespace, Kind::ConfigMap];

impl KubeSource {
    pub fn new(
        client: Client,
        store: Arc<RwLock<Store>>,
        scope: Scope,
        issues: IssueBoard,
        hook: IssueHook,
        metrics: SourceMetrics,
    ) -> Arc<KubeSource> {
        Arc::new(KubeSource {
            generations: Arc::default(),
            client,
            store,
            scope,
            issues,
            hook,
            synced: watch::channel(BTreeSet::new()).0,
            crds: watch::channel(crds::Installed::Unknown).0,
            selection: RwLock::new(NamespaceScope::default()),
            rescope: watch::channel(0).0,
            tags_listed: watch::channel(false).0,
            metrics,
        })
    }

    /// Starts one watcher per kind (Namespaces, the mesh ConfigMap and the revision tags
    /// first, as they decide what the others keep); `on_change` receives the keys each
    /// event changed.
    pub fn start(self: &Arc<Self>, on_change: OnChange) {
        let this = self.clone();
        tokio::spawn(async move { crds::run(this.client.clone(), &this.crds).await });
        tokio::spawn(self.clone().watch_tags());
        let this = self.clone();
        tokio::spawn(async move {
            for kind in SCOPING_KINDS {
                let (w, on_change) = (this.clone(), on_change.clone());
                tokio::spawn(async move { w.watch(kind, on_change).await });
            }
            let mut synced = this.synced.subscribe();
            let _ = synced
                .wait_for(|s| SCOPING_KINDS.iter().all(|k| s.contains(k)))
                .await;
            let _ = this
                .tags_listed
                .subscribe()
                .wait_for(|listed| *listed)
                .await;
            *this.selection.write().unwrap() = this.compute_selection();
            let kinds = this.scope.kinds();
            for kind in kinds.into_iter().filter(|k| !SCOPING_KINDS.contains(k)) {
                let (w, on_change) = (this.clone(), on_change.clone());
                tokio::spawn(async move { w.watch(kind, on_change).await });
            }
        });
    }

    /// Resolves once every kind has been listed once.
    pub async fn synced(&self) {
        let mut rx = self.synced.subscribe();
        let kinds = self.scope.kinds();
        let _ = rx.wait_for(|s| kinds.iter().all(|k| s.contains(k))).await;
    }

    /// The namespaces selected now (`discoverySelectors`) and those of other revisions.
    fn compute_selection(&self) -> NamespaceScope {
        let store = self.store.read().unwrap();
        let mesh = MeshConfig::from_store(&store);
        let namespaces = || store.of_kind(Kind::Namespace);
        let selected = (!mesh.discovery_selectors.is_empty()).then(|| {
            let selected = namespaces().filter(|n| mesh.selects(&n.key.name, &n.meta.labels));
            selected.map(|n| n.key.name.clone()).collect()
        });
        let other_revision = namespaces()
            .filter(|n| n.key.name != mesh.root_namespace())
            .filter(|n| {
                namespace_revision(&n.meta.labels)
                    .is_some_and(|r| !self.scope.revisions.answers_to(r))
            })
            .map(|n| n.key.name.clone())
            .collect();
        NamespaceScope {
            selected,
            other_revision,
        }
    }

    /// After a Namespace or mesh config change: if what is kept changed, the namespaced
    /// watchers relist (objects newly out of scope go, newly in scope come).
    fn rescope_if_needed(&self) {
        let selection = self.compute_selection();
        let mut current = self.selection.write().unwrap();
        if *current != selection {
            tracing::info!(scope = ?selection, "namespace scope changed: relisting");
            *current = selection;
            self.rescope.send_modify(|generation| *generation += 1);
        }
    }

    fn selected(&self, key: &ObjectKey, labels: &BTreeMap<String, String>) -> bool {
        let kind = key.kind;
        if !kind.namespaced() || SCOPING_KINDS.contains(&kind) {
            return true;
        }
        let scope = self.selection.read().unwrap();
        let ns = &key.namespace;
        if scope.selected.as_ref().is_some_and(|s| !s.contains(ns)) {
            return false;
        }
        // An object's own revision label decides (Scope::keeps); unlabelled Istio
        // config belongs to its namespace's revision.
        !(kind.is_istio()
            && !labels.contains_key(REVISION_LABEL)
            && scope.other_revision.contains(ns))
    }

    fn api(&self, kind: Kind, ar: &ApiResource) -> (Api<DynamicObject>, watcher::Config) {
        if kind == Kind::ConfigMap {
            let name = MeshConfig::configmap_name(self.scope.revisions.revision());
            let api = Api::namespaced_with(self.client.clone(), &self.scope.config_namespace, ar);
            return (
                api,
                watcher::Config::default().fields(&format!("metadata.name={name}")),
            );
        }
        let config = if kind == Kind::Secret {
            // As istiod: never cache service-account tokens or Helm releases.
            watcher::Config::default()
                .fields("type!=kubernetes.io/service-account-token,type!=helm.sh/release.v1")
        } else {
            watcher::Config::default()
        };
        (Api::all_with(self.client.clone(), ar), config)
    }

    /// Returns once `kind`'s CRD is installed. Until then the kind counts as listed and
    /// empty, and is reported missing.
    async fn await_crd(&self, kind: Kind) {
        let mut rx = self.crds.subscribe();
        let Ok(installed) = rx
            .wait_for(|i| i.has(kind).is_some())
            .await
            .map(|i| i.has(kind))
        else {
            return;
        };
        if installed == Some(true) {
            return;
        }
        let labels = vec![("type", kind.to_string())];
        self.metrics.crd_missing.get_or_create(&labels).set(1);
        tracing::warn!(
            kind = %kind,
            crd = %crds::crd_name(kind),
            "CRD not installed: serving without this kind; it is watched once the CRD is installed"
        );
        self.synced.send_modify(|s| {
            s.insert(kind);
        });
        let _ = rx.wait_for(|i| i.has(kind) == Some(true)).await;
        self.metrics.crd_missing.get_or_create(&labels).set(0);
        tracing::info!(kind = %kind, "CRD installed: watching this kind");
    }

    async fn watch(&self, kind: Kind, on_change: OnChange) {
        if kind.is_istio() {
            self.await_crd(kind).await;
        }
        let ar = api_resource(kind);
        let (api, config) = self.api(kind, &ar);
        let rescopable = kind.namespaced() && !SCOPING_KINDS.contains(&kind);
        let mut rescope = self.rescope.subscribe();
        rescope.mark_unchanged();
        let mut first_sync = true;
        loop {
            let mut events = watcher(api.clone(), config.clone())
                .default_backoff()
                .boxed();
            let mut buffer: Option<Vec<DynamicObject>> = None;
            loop {
                let event = tokio::select! {
                    event = events.next() => match event {
                        Some(event) => event,
                        None => return,
                    },
                    changed = rescope.changed(), if rescopable => {
                        if changed.is_err() { return }
                        break; // a fresh list under the new selection
                    }
                };
                let changed = match event {
                    Ok(watcher::Event::Apply(obj)) => self.apply(kind, &ar, obj),
                    Ok(watcher::Event::Delete(obj)) => self.delete(kind, &obj),
                    Ok(watcher::Event::Init) => {
                        buffer = Some(Vec::new());
                        BTreeSet::new()
                    }
                    Ok(watcher::Event::InitApply(obj)) => {
                        buffer.get_or_insert_with(Vec::new).push(obj);
                        BTreeSet::new()
                    }
                    Ok(watcher::Event::InitDone) => {
                        let changed = self.replace(kind, &ar, buffer.take().unwrap_or_default());
                        if std::mem::take(&mut first_sync) {
                            tracing::info!(kind = %kind, "initial list synced");
                            self.synced.send_modify(|s| {
                                s.insert(kind);
                            });
                        } else {
                            tracing::info!(kind = %kind, changed = changed.len(), "relisted");
                        }
                        changed
                    }
                    Err(e) => {
                        tracing::warn!(kind = %kind, "watch failed, retrying with backoff: {e}");
                        continue;
                    }
                };
                if SCOPING_KINDS.contains(&kind) && !changed.is_empty() && !first_sync {
                    self.rescope_if_needed();
                }
                if !changed.is_empty() {
                    on_change(changed);
                }
            }
        }
    }

    fn board_key(key: &ObjectKey) -> String {
        format!("kubernetes:{key}")
    }

    /// Parses one object (whose key is `key`), reporting its problems. An object outside
    /// this instance's scope is neither parsed nor reported: another instance (or none)
    /// owns it.
    fn convert(&self, key: &ObjectKey, ar: &ApiResource, obj: DynamicObject) -> Outcome {
        let labels = obj.metadata.labels.clone().unwrap_or_default();
        if !(self.scope.keeps(key, &labels) && self.selected(key, &labels)) {
            self.issues.write().unwrap().remove(&Self::board_key(key));
            return Outcome::OutOfScope;
        }
        if key.kind.is_istio() {
            let seen = Seen {
                uid: obj.metadata.uid.clone().unwrap_or_default(),
                generation: obj.metadata.generation,
            };
            self.generations.write().unwrap().insert(key.clone(), seen);
        }
        let Some(parsed) = parse_object(key.kind, ar, &obj) else {
            return Outcome::Rejected;
        };
        {
            let mut board = self.issues.write().unwrap();
            if parsed.issues.is_empty() {
                board.remove(&Self::board_key(key));
            } else {
                board.insert(Self::board_key(key), parsed.issues.clone());
            }
        }
        for issue in &parsed.issues {
            (self.hook)(issue);
        }
        match parsed.objects.into_iter().next() {
            Some(o) => Outcome::Keep(Box::new(o)),
            None => Outcome::Rejected,
        }
    }

    fn key_of(kind: Kind, obj: &DynamicObject) -> ObjectKey {
        ObjectKey {
            kind,
            namespace: if kind.namespaced() {
                obj.metadata.namespace.clone().unwrap_or_default()
            } else {
                String::new()
            },
            name: obj.metadata.name.clone().unwrap_or_default(),
        }
    }

    fn apply(&self, kind: Kind, ar: &ApiResource, obj: DynamicObject) -> BTreeSet<ObjectKey> {
        let key = Self::key_of(kind, &obj);
        let mut changed = BTreeSet::new();
        let known = self.store.read().unwrap().get(&key).is_some();
        let outcome = self.convert(&key, ar, obj);
        // Objects outside this instance's namespaces are not events for it (istiod filters
        // them before its handlers count), unless one held leaves the scope.
        let counted = match outcome {
            Outcome::Keep(_) => false,
            Outcome::OutOfScope => known,
            Outcome::Rejected => true,
        };
        if counted {
            count_event(&self.metrics, kind, if known { "update" } else { "add" });
        }
        match outcome {
            Outcome::Keep(o) => {
                let applied = self.store.write().unwrap().apply(*o);
                count_event(&self.metrics, kind, event_of(known, applied, kind));
                if applied {
                    changed.insert(key);
                }
            }
            // Out of scope now (e.g. relabelled to another revision): gone for us.
            Outcome::OutOfScope => {
                if self.store.write().unwrap().delete(&key) {
                    changed.insert(key);
                }
            }
            Outcome::Rejected => {} // the last good version stays
        }
        changed
    }

    fn delete(&self, kind: Kind, obj: &DynamicObject) -> BTreeSet<ObjectKey> {
        let key = Self::key_of(kind, obj);
        count_event(&self.metrics, kind, "delete");
        self.issues.write().unwrap().remove(&Self::board_key(&key));
        self.generations.write().unwrap().remove(&key);
        let mut changed = BTreeSet::new();
        if self.store.write().unwrap().delete(&key) {
            changed.insert(key);
        }
        changed
    }

    /// A relist: the listed objects replace what the store holds of `kind`.
    fn replace(
        &self,
        kind: Kind,
        ar: &ApiResource,
        listed: Vec<DynamicObject>,
    ) -> BTreeSet<ObjectKey> {
        let mut keep = BTreeSet::new();
        let mut accepted = Vec::new();
        for obj in listed {
            let key = Self::key_of(kind, &obj);
            match self.convert(&key, ar, obj) {
                Outcome::Keep(o) => {
                    keep.insert(key);
                    accepted.push(*o);
                }
                Outcome::OutOfScope => {}
                Outcome::Rejected => {
                    keep.insert(key); // rejected now, but its last good version stays
                }
            }
        }
        let mut changed = BTreeSet::new();
        let mut store = self.store.write().unwrap();
        for o in accepted {
            let key = o.key.clone();
            let known = store.get(&key).is_some();
            let applied = store.apply(o);
            count_event(&self.metrics, kind, event_of(known, applied, kind));
            if applied {
                changed.insert(key);
            }
        }
        let stale: Vec<ObjectKey> = store
            .of_kind(kind)
            .map(|o| o.key.clone())
            .filter(|k| !keep.contains(k))
            .collect();
        for key in stale {
            count_event(&self.metrics, kind, "delete");
            store.delete(&key);
            changed.insert(key);
        }
        changed
    }
}

/// One object as the API server sent it, parsed into the model with its problems: the
/// watch's `apiVersion` and `kind` put back (a watch of many kinds leaves them out), then
/// parsed as the same YAML from a file would be. `None` if the object does not serialize.
pub fn parse_object(kind: Kind, ar: &ApiResource, obj: &DynamicObject) -> Option<Parsed> {
    let mut value = serde_json::to_value(obj).ok()?;
    value["apiVersion"] = Value::String(ar.api_version.clone());
    value["kind"] = Value::String(ar.kind.clone());
    Some(parse_value(&format!("kubernetes:{}", kind.plural()), value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::config::parse::parse_file;

    fn object(yaml: &str) -> ConfigObject {
        parse_file("t.yaml", yaml).objects.remove(0)
    }

    fn keeps(scope: &Scope, o: &ConfigObject) -> bool {
        scope.keeps(&o.key, &o.meta.labels)
    }

    #[test]
    fn a_revision_label_and_the_namespace_allow_list_decide_what_is_kept() {
        let scope = Scope {
            revisions: model::Revisions::new("blue"),
            namespaces: BTreeSet::new(),
            config_namespace: "istio-system".into(),
            use_endpoint_slice: true,
        };
        let vs = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: a, namespace: shop, labels: {istio.io/rev: REV}}\nspec: {hosts: [a]}\n";
        assert!(keeps(&scope, &object(&vs.replace("REV", "blue"))));
        assert!(
            !keeps(&scope, &object(&vs.replace("REV", "green"))),
            "another revision's object"
        );
        assert!(
            keeps(
                &scope,
                &object(&vs.replace(", labels: {istio.io/rev: REV}", ""))
            ),
            "unlabelled: every revision"
        );
        let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: shop, labels: {istio.io/rev: green}}\nspec: {ports: [{port: 80}]}\n";
        assert!(
            keeps(&scope, &object(svc)),
            "workload kinds are not sharded by revision"
        );
        let only_other = Scope {
            revisions: model::Revisions::new("blue"),
            namespaces: ["other".to_string()].into(),
            config_namespace: "istio-system".into(),
            use_endpoint_slice: true,
        };
        assert!(!keeps(&only_other, &object(svc)));
        let ns = "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n";
        assert!(
            keeps(&only_other, &object(ns)),
            "namespaces themselves are cluster-scoped"
        );
    }
}
