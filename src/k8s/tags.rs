//! Revision tags as istioctl makes them: the MutatingWebhookConfiguration
//! `istio-revision-tag-T`, labelled `istio.io/tag=T` and `istio.io/rev=R`. Every tag that
//! points to this instance's revision joins [`model::Revisions`], so a namespace or an
//! object labelled `istio.io/rev=T` is this revision's, and its proxies are served here;
//! moving the tag moves them. (istiod's TagWatcher also reads tag Services in its
//! namespace; meshd reads the webhook configurations, which every istioctl and Helm
//! version makes.)

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Api;
use kube::runtime::watcher;

use super::KubeSource;
use model::REVISION_LABEL;

/// The label naming a tag.
pub const TAG_LABEL: &str = "istio.io/tag";

/// A tag webhook configuration's tag and the revision it points to.
fn tag_of(whc: &MutatingWebhookConfiguration) -> Option<(String, (String, String))> {
    let labels = whc.metadata.labels.as_ref()?;
    let tag = labels.get(TAG_LABEL)?;
    let revision = labels.get(REVISION_LABEL)?;
    let name = whc.metadata.name.clone()?;
    Some((name, (tag.clone(), revision.clone())))
}

impl KubeSource {
    /// Keeps the scope's tags equal to the tag webhook configurations; relists the Istio
    /// kinds when they change (an object labelled with a tag may now be this revision's).
    pub(super) async fn watch_tags(self: Arc<Self>) {
        let api: Api<MutatingWebhookConfiguration> = Api::all(self.client.clone());
        let mut events = watcher(api, watcher::Config::default().labels(TAG_LABEL)).boxed();
        // By configuration name: its tag and revision.
        let mut tags: BTreeMap<String, (String, String)> = BTreeMap::new();
        let mut listing: BTreeMap<String, (String, String)> = BTreeMap::new();
        // False while a list is in progress: the tags are those of the last complete one.
        let mut listed = false;
        loop {
            match events.next().await {
                Some(Ok(watcher::Event::Init)) => {
                    listing.clear();
                    listed = false;
                }
                Some(Ok(watcher::Event::InitApply(whc))) => listing.extend(tag_of(&whc)),
                Some(Ok(watcher::Event::InitDone)) => {
                    tags = std::mem::take(&mut listing);
                    listed = true;
                }
                Some(Ok(watcher::Event::Apply(whc))) => {
                    let name = whc.metadata.name.clone().unwrap_or_default();
                    match tag_of(&whc) {
                        Some((name, tag)) => tags.insert(name, tag),
                        None => tags.remove(&name),
                    };
                }
                Some(Ok(watcher::Event::Delete(whc))) => {
                    tags.remove(whc.metadata.name.as_deref().unwrap_or_default());
                }
                Some(Err(e)) => {
                    // Serving without tags beats not serving: a role without
                    // MutatingWebhookConfigurations must not keep meshd from starting.
                    tracing::warn!("watching revision tags (MutatingWebhookConfigurations): {e}");
                    self.tags_listed.send_replace(true);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                None => return,
            }
            if !listed {
                continue;
            }
            let by_tag: BTreeMap<String, String> = tags.values().cloned().collect();
            if self.scope.revisions.set_tags(&by_tag) {
                tracing::info!(
                    revision = %self.scope.revisions.revision(),
                    tags = ?self.scope.revisions.tags(),
                    "revision tags changed: relisting"
                );
                *self.selection.write().unwrap() = self.compute_selection();
                self.rescope.send_modify(|generation| *generation += 1);
            }
            self.tags_listed.send_replace(true);
        }
    }
}
