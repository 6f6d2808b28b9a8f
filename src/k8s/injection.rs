//! What the injector needs from the cluster, as istiod keeps it:
//!
//! - the `caBundle` of the revision's MutatingWebhookConfigurations (istiod's webhook
//!   patcher): every configuration labelled `istio.io/rev=REV` (the revision's
//!   `istio-sidecar-injector[-REV]` and its tags' `istio-revision-tag-TAG`) gets meshd's
//!   root in each webhook whose name ends in `sidecar-injector.istio.io`, so the API
//!   server trusts the webhook port's certificate. Every replica writes (no election), on
//!   every change and after the root rotates (checked every minute).
//! - the kubelet version of every node, for native sidecars in `auto` mode.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Node;
use kube::api::{ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};

use crate::ca::CertificateAuthority;
use crate::inject::NodeVersions;

/// How often the root is compared with what the configurations hold.
const RESYNC: Duration = Duration::from_secs(60);
/// The suffix of the webhooks that are the injector's.
const INJECTOR_WEBHOOK: &str = "sidecar-injector.istio.io";

/// Keeps the `caBundle` of the revision's injection webhooks equal to the CA's roots.
pub async fn keep_ca_bundle(client: Client, revision: String, ca: Arc<CertificateAuthority>) {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client);
    let selector = format!("istio.io/rev={revision}");
    let mut events = watcher(api.clone(), watcher::Config::default().labels(&selector)).boxed();
    let mut resync = tokio::time::interval_at(tokio::time::Instant::now() + RESYNC, RESYNC);
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(mwc) | watcher::Event::InitApply(mwc))) => {
                    patch(&api, mwc, &revision, &ca).await;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::warn!("watching MutatingWebhookConfigurations: {e}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                None => return,
            },
            _ = resync.tick() => {
                if let Ok(list) = api.list(&ListParams::default().labels(&selector)).await {
                    for mwc in list {
                        patch(&api, mwc, &revision, &ca).await;
                    }
                }
            }
        }
    }
}

/// Writes the roots into the injector's webhooks of `mwc` that lack them; true when
/// something was written.
async fn patch(
    api: &Api<MutatingWebhookConfiguration>,
    mut mwc: MutatingWebhookConfiguration,
    revision: &str,
    ca: &CertificateAuthority,
) -> bool {
    let labels = mwc.metadata.labels.as_ref();
    if labels
        .and_then(|l| l.get("istio.io/rev"))
        .map(String::as_str)
        != Some(revision)
    {
        return false;
    }
    let bundle = ByteString(ca.roots_pem().into_bytes());
    let mut changed = false;
    for w in mwc.webhooks.iter_mut().flatten() {
        if w.name.ends_with(INJECTOR_WEBHOOK) && w.client_config.ca_bundle.as_ref() != Some(&bundle)
        {
            w.client_config.ca_bundle = Some(bundle.clone());
            changed = true;
        }
    }
    if !changed {
        return false;
    }
    let name = mwc.metadata.name.clone().unwrap_or_default();
    match api.replace(&name, &PostParams::default(), &mwc).await {
        Ok(_) => {
            tracing::info!(webhook = %name, "wrote the injection webhook's CA bundle");
            true
        }
        // A conflict is a newer version: its event brings it back here.
        Err(e) => {
            tracing::warn!(webhook = %name, "writing the injection webhook's CA bundle failed: {e}");
            false
        }
    }
}

/// Keeps `nodes` equal to the cluster's nodes' kubelet versions.
pub async fn watch_nodes(client: Client, nodes: NodeVersions) {
    let api: Api<Node> = Api::all(client);
    let mut known: BTreeMap<String, String> = BTreeMap::new();
    let mut listing: Option<BTreeMap<String, String>> = None;
    let mut events = watcher(api, watcher::Config::default()).boxed();
    while let Some(event) = events.next().await {
        let version = |n: &Node| {
            let info = n.status.as_ref().and_then(|s| s.node_info.as_ref());
            info.map(|i| i.kubelet_version.clone()).unwrap_or_default()
        };
        match event {
            Ok(watcher::Event::Init) => listing = Some(BTreeMap::new()),
            Ok(watcher::Event::InitApply(n)) => {
                if let Some(listing) = listing.as_mut() {
                    listing.insert(n.metadata.name.clone().unwrap_or_default(), version(&n));
                }
            }
            Ok(watcher::Event::InitDone) => {
                known = listing.take().unwrap_or_default();
                nodes.set(known.clone());
            }
            Ok(watcher::Event::Apply(n)) => {
                let (name, v) = (n.metadata.name.clone().unwrap_or_default(), version(&n));
                if known.get(&name) != Some(&v) {
                    known.insert(name, v);
                    nodes.set(known.clone());
                }
            }
            Ok(watcher::Event::Delete(n)) => {
                if known
                    .remove(n.metadata.name.as_deref().unwrap_or_default())
                    .is_some()
                {
                    nodes.set(known.clone());
                }
            }
            Err(e) => {
                tracing::warn!("watching Nodes: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
