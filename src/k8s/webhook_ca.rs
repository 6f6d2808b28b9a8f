//! The `caBundle` half of istiod's validation webhook controller: every
//! ValidatingWebhookConfiguration labelled `istio.io/rev=REV` (Istio's charts install
//! `istio-validator-REV-istio-system` and `istiod-default-validator` with an empty
//! `caBundle`) gets meshd's root as each webhook's `clientConfig.caBundle`, so the API
//! server trusts the certificate of meshd's webhook port (15017). It is written when a
//! configuration appears or changes, and again after the root rotates (checked every
//! minute). Writes are counted in istiod's `galley_validation_config_updates` and
//! `galley_validation_config_update_error{reason}`. The failure policy is left as
//! installed: istiod's switch to `Fail` after a dry-run probe is not done.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};

use crate::ca::CertificateAuthority;
use crate::metrics::{Labels, Metrics};

/// How often the root is compared with what the configurations hold.
const RESYNC: Duration = Duration::from_secs(60);

/// Keeps the revision's webhook configurations' `caBundle` equal to the CA's roots.
pub async fn run(
    client: Client,
    revision: String,
    ca: Arc<CertificateAuthority>,
    metrics: Arc<Metrics>,
) {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client);
    let selector = format!("istio.io/rev={revision}");
    let config = watcher::Config::default().labels(&selector);
    let mut events = watcher(api.clone(), config).boxed();
    // The watch's initial list handles start-up; the resync catches a rotated root.
    let mut resync = tokio::time::interval_at(tokio::time::Instant::now() + RESYNC, RESYNC);
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(whc) | watcher::Event::InitApply(whc))) => {
                    reconcile(&api, whc, &revision, &ca, &metrics).await;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::warn!("watching ValidatingWebhookConfigurations: {e}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                None => return,
            },
            _ = resync.tick() => {
                let Ok(list) = api.list(&ListParams::default().labels(&selector)).await else {
                    continue;
                };
                for whc in list {
                    reconcile(&api, whc, &revision, &ca, &metrics).await;
                }
            }
        }
    }
}

/// Writes the roots into every webhook of `whc` that does not hold them yet, if `whc` is
/// the revision's (the label selector decides; checked again here).
async fn reconcile(
    api: &Api<ValidatingWebhookConfiguration>,
    mut whc: ValidatingWebhookConfiguration,
    revision: &str,
    ca: &CertificateAuthority,
    metrics: &Metrics,
) {
    let labels = whc.metadata.labels.as_ref();
    if labels
        .and_then(|l| l.get("istio.io/rev"))
        .map(String::as_str)
        != Some(revision)
    {
        return;
    }
    let bundle = ByteString(ca.roots_pem().into_bytes());
    let webhooks = whc.webhooks.get_or_insert_default();
    if webhooks
        .iter()
        .all(|w| w.client_config.ca_bundle.as_ref() == Some(&bundle))
    {
        return;
    }
    for w in webhooks.iter_mut() {
        w.client_config.ca_bundle = Some(bundle.clone());
    }
    let name = whc.metadata.name.clone().unwrap_or_default();
    match api.replace(&name, &PostParams::default(), &whc).await {
        Ok(_) => {
            tracing::info!(webhook = %name, "wrote the CA bundle");
            metrics.validation_config_updates.inc();
        }
        // A conflict is another writer's newer version: its event brings it back here.
        Err(e) => {
            let reason = match &e {
                kube::Error::Api(status) => status.reason.clone(),
                _ => "Unknown".to_string(),
            };
            tracing::warn!(webhook = %name, "writing the CA bundle failed: {e}");
            let labels: Labels = vec![("reason", reason)];
            metrics
                .validation_config_update_error
                .get_or_create(&labels)
                .inc();
        }
    }
}
