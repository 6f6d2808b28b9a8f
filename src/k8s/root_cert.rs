//! istiod's namespace controller: the ConfigMap `istio-ca-root-cert` (renamed by
//! `PILOT_CA_CERT_CONFIGMAP`) in every namespace the mesh discovers, its key
//! `root-cert.pem` holding the CA's roots and its label `istio.io/config=true`. Sidecars
//! mount it to verify meshd's serving certificate and their peers'.
//!
//! A namespace is written when `WATCHED_NAMESPACES` (if set) and the mesh's
//! `discoverySelectors` keep it, kube-system included, except `kube-public`,
//! `kube-node-lease`, `local-path-storage` and namespaces being deleted. A missing
//! ConfigMap is created; one whose `root-cert.pem` differs (edited by hand, or the root
//! rotated: checked every minute) gets it back, its other keys kept; a deleted one comes
//! back. Only the leader of the Lease `istio-namespace-controller-election` in meshd's
//! namespace writes: one meshd for every revision, as istiod does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::watch;

use crate::ca::CertificateAuthority;
use model::Store;
use model::mesh::MeshConfig;

/// The key sidecars read.
pub const KEY: &str = "root-cert.pem";
/// The ConfigMap's name unless `PILOT_CA_CERT_CONFIGMAP` says otherwise.
pub const DEFAULT_NAME: &str = "istio-ca-root-cert";
/// The Lease whose holder writes (istiod's election of the same name).
pub const ELECTION: &str = "istio-namespace-controller-election";
/// Namespaces never written, as istiod skips them.
const SKIPPED: [&str; 3] = ["kube-public", "kube-node-lease", "local-path-storage"];
/// How often every namespace is compared with the CA's roots (a rotated root).
const RESYNC: Duration = Duration::from_secs(60);

/// What the writer needs: the client, the CA, and what decides the namespaces.
pub struct RootCertWriter {
    pub client: Client,
    pub ca: Arc<CertificateAuthority>,
    /// The ConfigMap's name (`PILOT_CA_CERT_CONFIGMAP`).
    pub name: String,
    /// `WATCHED_NAMESPACES`: if not empty, only these.
    pub watched: BTreeSet<String>,
    /// Where the mesh config (its `discoverySelectors`) is read.
    pub store: Arc<RwLock<Store>>,
    /// Whether this instance holds [`ELECTION`].
    pub leader: watch::Receiver<bool>,
}

/// A namespace as the writer needs it.
#[derive(Debug, Default)]
struct Seen {
    labels: BTreeMap<String, String>,
    terminating: bool,
}

/// Whether `namespace` gets the ConfigMap.
fn written(namespace: &str, seen: &Seen, watched: &BTreeSet<String>, mesh: &MeshConfig) -> bool {
    !SKIPPED.contains(&namespace)
        && !seen.terminating
        && (watched.is_empty() || watched.contains(namespace))
        && mesh.selects(namespace, &seen.labels)
}

impl RootCertWriter {
    pub async fn run(mut self) {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let maps: Api<ConfigMap> = Api::all(self.client.clone());
        let fields = format!("metadata.name={}", self.name);
        let mut namespace_events = watcher(namespaces, watcher::Config::default()).boxed();
        let mut map_events = watcher(maps, watcher::Config::default().fields(&fields)).boxed();
        // What the API server holds: each namespace, and each ConfigMap's root by namespace.
        let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
        let mut held: BTreeMap<String, Option<String>> = BTreeMap::new();
        // Nothing is written before both lists are in: a ConfigMap not listed yet is not
        // missing.
        let (mut namespaces_listed, mut maps_listed) = (false, false);
        let mut resync = tokio::time::interval_at(tokio::time::Instant::now() + RESYNC, RESYNC);
        loop {
            let touched: Vec<String> = tokio::select! {
                event = namespace_events.next() => match event {
                    Some(Ok(watcher::Event::Apply(ns) | watcher::Event::InitApply(ns))) => {
                        let name = ns.metadata.name.clone().unwrap_or_default();
                        let terminating = ns.metadata.deletion_timestamp.is_some()
                            || ns.status.and_then(|s| s.phase).as_deref() == Some("Terminating");
                        let labels = ns.metadata.labels.unwrap_or_default();
                        seen.insert(name.clone(), Seen { labels, terminating });
                        vec![name]
                    }
                    Some(Ok(watcher::Event::Delete(ns))) => {
                        seen.remove(ns.metadata.name.as_deref().unwrap_or_default());
                        vec![]
                    }
                    Some(Ok(watcher::Event::Init)) => vec![],
                    Some(Ok(watcher::Event::InitDone)) => {
                        namespaces_listed = true;
                        seen.keys().cloned().collect()
                    }
                    Some(Err(e)) => {
                        tracing::warn!("watching Namespaces for {}: {e}", self.name);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        vec![]
                    }
                    None => return,
                },
                event = map_events.next() => match event {
                    Some(Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm))) => {
                        let namespace = cm.metadata.namespace.clone().unwrap_or_default();
                        let root = cm.data.and_then(|mut d| d.remove(KEY));
                        held.insert(namespace.clone(), root);
                        vec![namespace]
                    }
                    Some(Ok(watcher::Event::Delete(cm))) => {
                        let namespace = cm.metadata.namespace.unwrap_or_default();
                        held.remove(&namespace);
                        vec![namespace]
                    }
                    Some(Ok(watcher::Event::Init)) => {
                        held.clear();
                        vec![]
                    }
                    Some(Ok(watcher::Event::InitDone)) => {
                        maps_listed = true;
                        seen.keys().cloned().collect()
                    }
                    Some(Err(e)) => {
                        tracing::warn!("watching ConfigMaps {}: {e}", self.name);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        vec![]
                    }
                    None => return,
                },
                changed = self.leader.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    seen.keys().cloned().collect()
                }
                _ = resync.tick() => seen.keys().cloned().collect(),
            };
            if !(namespaces_listed && maps_listed && *self.leader.borrow()) {
                continue;
            }
            let mesh = MeshConfig::from_store(&self.store.read().unwrap());
            let roots = self.ca.roots_pem();
            for namespace in touched {
                let Some(ns) = seen.get(&namespace) else {
                    continue;
                };
                if !written(&namespace, ns, &self.watched, &mesh) {
                    continue;
                }
                let current = held.get(&namespace);
                if current.is_some_and(|root| root.as_deref() == Some(roots.as_str())) {
                    continue;
                }
                match self.write(&namespace, &roots, current.is_some()).await {
                    Ok(()) => {
                        // What the watch will report; a later event corrects it.
                        held.insert(namespace, Some(roots.clone()));
                    }
                    Err(e) => tracing::warn!(
                        namespace,
                        configmap = %self.name,
                        "writing the CA root: {e}"
                    ),
                }
            }
        }
    }

    /// Creates the ConfigMap in `namespace`, or (`exists`, or it turns out to) sets its
    /// root, keeping its other keys.
    async fn write(&self, namespace: &str, roots: &str, exists: bool) -> kube::Result<()> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        if !exists {
            let map = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(namespace.into()),
                    labels: Some([("istio.io/config".to_string(), "true".to_string())].into()),
                    ..ObjectMeta::default()
                },
                data: Some([(KEY.to_string(), roots.to_string())].into()),
                ..ConfigMap::default()
            };
            match api.create(&PostParams::default(), &map).await {
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                other => return other.map(|_| ()),
            }
        }
        let patch = serde_json::json!({"data": {KEY: roots}});
        api.patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_discovered_namespace_but_the_skipped_and_terminating_ones_is_written() {
        let labels = |pairs: &[(&str, &str)]| Seen {
            labels: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            terminating: false,
        };
        let all = MeshConfig::default();
        let none = BTreeSet::new();
        assert!(written("kube-system", &labels(&[]), &none, &all));
        assert!(written("shop", &labels(&[]), &none, &all));
        for skipped in SKIPPED {
            assert!(!written(skipped, &labels(&[]), &none, &all), "{skipped}");
        }
        let terminating = Seen {
            terminating: true,
            ..Seen::default()
        };
        assert!(!written("shop", &terminating, &none, &all));
        let watched: BTreeSet<String> = ["shop".to_string()].into();
        assert!(written("shop", &labels(&[]), &watched, &all));
        assert!(!written("billing", &labels(&[]), &watched, &all));
        let selective: MeshConfig =
            serde_json::from_value(serde_json::json!({"discoverySelectors": [
                {"matchLabels": {"mesh": "on"}}
            ]}))
            .unwrap();
        assert!(written(
            "shop",
            &labels(&[("mesh", "on")]),
            &none,
            &selective
        ));
        assert!(!written("billing", &labels(&[]), &none, &selective));
        assert!(
            written("istio-system", &labels(&[]), &none, &selective),
            "the root namespace is always discovered"
        );
    }
}
