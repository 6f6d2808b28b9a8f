//! Which Istio CRDs the cluster has installed, from a metadata watch of
//! CustomResourceDefinitions.
//!
//! istiod serves the kinds whose CRDs exist and starts an informer for a kind once its CRD
//! appears (its `crdwatcher`). meshd does the same: an Istio kind whose CRD is absent
//! counts as listed and empty (so readiness does not wait for it), is reported in the log,
//! in `meshd_k8s_crd_missing{type}` and in `/debug/configz`, and its watcher starts as soon
//! as the CRD is created. If the CRDs cannot be read (no RBAC for them), every kind is
//! assumed installed, as before this watch existed.

use std::collections::BTreeSet;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;

use model::config::Kind;

/// What is known of the installed CRDs.
#[derive(Clone, Debug, PartialEq)]
pub enum Installed {
    /// Not listed yet.
    Unknown,
    /// The CRDs cannot be read: every kind is taken as installed.
    Unreadable,
    /// The names (`PLURAL.GROUP`) of the CRDs the cluster has.
    Names(BTreeSet<String>),
}

impl Installed {
    /// Whether `kind`'s CRD is installed (`None` while that is not known yet).
    pub fn has(&self, kind: Kind) -> Option<bool> {
        match self {
            Installed::Unknown => None,
            Installed::Unreadable => Some(true),
            Installed::Names(names) => Some(names.contains(&crd_name(kind))),
        }
    }
}

/// The name of `kind`'s CustomResourceDefinition.
pub fn crd_name(kind: Kind) -> String {
    format!("{}.{}", kind.plural(), kind.group())
}

/// Watches CRDs' metadata and keeps `installed` current.
pub async fn run(client: Client, installed: &watch::Sender<Installed>) {
    let api: Api<PartialObjectMeta<CustomResourceDefinition>> = Api::all(client);
    let mut names = BTreeSet::new();
    let mut listing: Option<BTreeSet<String>> = None;
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        let name = |m: &PartialObjectMeta<CustomResourceDefinition>| {
            m.metadata.name.clone().unwrap_or_default()
        };
        match event {
            Ok(watcher::Event::Init) => listing = Some(BTreeSet::new()),
            Ok(watcher::Event::InitApply(m)) => {
                listing.get_or_insert_with(BTreeSet::new).insert(name(&m));
            }
            Ok(watcher::Event::InitDone) => names = listing.take().unwrap_or_default(),
            Ok(watcher::Event::Apply(m)) => {
                names.insert(name(&m));
            }
            Ok(watcher::Event::Delete(m)) => {
                names.remove(&name(&m));
            }
            Err(watcher::Error::InitialListFailed(kube::Error::Api(status)))
                if status.is_forbidden() =>
            {
                tracing::warn!(
                    "CustomResourceDefinitions cannot be listed ({}): every Istio kind is taken as installed",
                    status.message
                );
                installed.send_replace(Installed::Unreadable);
                return;
            }
            Err(e) => {
                tracing::warn!("watching CustomResourceDefinitions failed, retrying: {e}");
                continue;
            }
        }
        if listing.is_none() {
            let now = Installed::Names(names.clone());
            installed.send_if_modified(|current| {
                let changed = *current != now;
                *current = now.clone();
                changed
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_installed_when_its_crd_name_is_listed() {
        let names = Installed::Names(["virtualservices.networking.istio.io".to_string()].into());
        assert_eq!(names.has(Kind::VirtualService), Some(true));
        assert_eq!(names.has(Kind::Telemetry), Some(false));
        assert_eq!(Installed::Unknown.has(Kind::Telemetry), None);
        assert_eq!(Installed::Unreadable.has(Kind::Telemetry), Some(true));
        assert_eq!(crd_name(Kind::Telemetry), "telemetries.telemetry.istio.io");
    }
}
