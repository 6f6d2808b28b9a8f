//! The `caBundle` half of istiod's validation webhook controller: every
//! ValidatingWebhookConfiguration labelled `istio.io/rev=REV` (Istio's charts install
//! `istio-validator-REV-istio-system` and `istiod-default-validator` with an empty
//! `caBundle`) gets meshd's root as each webhook's `clientConfig.caBundle`, so the API
//! server trusts the certificate of meshd's webhook port (15017). It is written when a
//! configuration appears or changes, and again after the root rotates (checked every
//! minute). Writes are counted in istiod's `galley_validation_config_updates` and
//! `galley_validation_config_update_error{reason}`.
//!
//! Its other half: a webhook installed with `failurePolicy: Ignore` is switched to `Fail`
//! once the webhook is known to work, as istiod decides it: a dry run of creating an
//! invalid Gateway (`invalid-gateway`, labelled with the revision, annotated
//! `istio.io/alwaysReject`) in meshd's namespace must be refused with `denied the
//! request` (or the API server must lack the Gateway kind, or refuse dry runs). Until
//! then the policy is left alone and the probe is tried again, after 3 s, then twice as
//! long each time up to a minute.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};

use crate::ca::CertificateAuthority;
use crate::metrics::Labels;
use crate::webhook::ValidationMetrics;

/// How often the root is compared with what the configurations hold.
const RESYNC: Duration = Duration::from_secs(60);
/// How soon a webhook not yet known to work is probed again at first; each failed
/// probe doubles it, up to [`RESYNC`].
const RETRY: Duration = Duration::from_secs(3);

/// What the controller has learned.
struct Controller {
    api: Api<ValidatingWebhookConfiguration>,
    client: Client,
    revision: String,
    /// Where the probe's invalid Gateway is (not) created: meshd's namespace.
    namespace: String,
    /// A dry run of invalid config was refused: the webhook works, fail closed.
    ready: bool,
}

/// Keeps the revision's webhook configurations' `caBundle` equal to the CA's roots, and
/// switches their failure policy to `Fail` once the webhook works.
pub async fn run(
    client: Client,
    revision: String,
    namespace: String,
    ca: Arc<CertificateAuthority>,
    metrics: ValidationMetrics,
) {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mut controller = Controller {
        api: api.clone(),
        client,
        revision: revision.clone(),
        namespace,
        ready: false,
    };
    let selector = format!("istio.io/rev={revision}");
    let config = watcher::Config::default().labels(&selector);
    let mut events = watcher(api.clone(), config).boxed();
    // The watch's initial list handles start-up; the resync catches a rotated root.
    let mut resync = tokio::time::interval_at(tokio::time::Instant::now() + RESYNC, RESYNC);
    // Set while some configuration still fails open because the webhook is not ready.
    let mut retry = false;
    let mut retry_delay = RETRY;
    loop {
        let retry_after = tokio::time::sleep(if retry { retry_delay } else { RESYNC * 2 });
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(whc) | watcher::Event::InitApply(whc))) => {
                    retry |= !controller.reconcile(whc, &ca, &metrics).await;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::warn!("watching ValidatingWebhookConfigurations: {e}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                None => return,
            },
            _ = resync.tick() => {
                retry = !controller.reconcile_all(&selector, &ca, &metrics).await;
            }
            _ = retry_after, if retry => {
                retry = !controller.reconcile_all(&selector, &ca, &metrics).await;
                retry_delay = if retry { (retry_delay * 2).min(RESYNC) } else { RETRY };
            }
        }
    }
}

impl Controller {
    /// [`Controller::reconcile`] for every configuration of the revision; false when one
    /// still fails open.
    async fn reconcile_all(
        &mut self,
        selector: &str,
        ca: &CertificateAuthority,
        metrics: &ValidationMetrics,
    ) -> bool {
        let Ok(list) = self.api.list(&ListParams::default().labels(selector)).await else {
            return false;
        };
        let mut done = true;
        for whc in list {
            done &= self.reconcile(whc, ca, metrics).await;
        }
        done
    }

    /// Writes the roots into every webhook of `whc` that does not hold them yet, and
    /// `failurePolicy: Fail` where it is `Ignore` once the webhook works, if `whc` is the
    /// revision's (the label selector decides; checked again here). False when it is
    /// left failing open.
    async fn reconcile(
        &mut self,
        mut whc: ValidatingWebhookConfiguration,
        ca: &CertificateAuthority,
        metrics: &ValidationMetrics,
    ) -> bool {
        let labels = whc.metadata.labels.as_ref();
        if labels
            .and_then(|l| l.get("istio.io/rev"))
            .map(String::as_str)
            != Some(self.revision.as_str())
        {
            return true;
        }
        let bundle = ByteString(ca.roots_pem().into_bytes());
        let webhooks = whc.webhooks.get_or_insert_default();
        let bundle_needed =
            (webhooks.iter()).any(|w| w.client_config.ca_bundle.as_ref() != Some(&bundle));
        let fails_open =
            (webhooks.iter()).any(|w| w.failure_policy.as_deref().is_some_and(|p| p != "Fail"));
        if !bundle_needed && !fails_open {
            return true;
        }
        let fail_closed = fails_open && self.ready_to_fail_closed().await;
        if !bundle_needed && !fail_closed {
            return false; // nothing to write yet: still failing open
        }
        for w in webhooks.iter_mut() {
            w.client_config.ca_bundle = Some(bundle.clone());
            if fail_closed {
                w.failure_policy = Some("Fail".into());
            }
        }
        let name = whc.metadata.name.clone().unwrap_or_default();
        write(&self.api, &name, &whc, metrics).await;
        !fails_open || fail_closed
    }

    /// Whether invalid config is refused by the API server (istiod's
    /// `readyForFailClose`): probed until it is, then remembered.
    async fn ready_to_fail_closed(&mut self) -> bool {
        if self.ready {
            return true;
        }
        let probe = api::networking::Gateway {
            metadata: ObjectMeta {
                name: Some("invalid-gateway".into()),
                namespace: Some(self.namespace.clone()),
                labels: Some([("istio.io/rev".to_string(), self.revision.clone())].into()),
                annotations: Some(
                    [(
                        model::config::validate::ALWAYS_REJECT.to_string(),
                        "true".to_string(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            spec: Default::default(),
            status: None,
        };
        let api: Api<api::networking::Gateway> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let params = PostParams {
            dry_run: true,
            ..Default::default()
        };
        let refused = match api.create(&params, &probe).await {
            Ok(_) => Err("the dry run of invalid config was accepted".to_string()),
            Err(kube::Error::Api(status)) => {
                let m = &status.message;
                if m.contains("denied the request")
                    || m.contains("the server could not find the requested resource")
                    || m.contains("does not support dry run")
                {
                    Ok(())
                } else {
                    Err(format!("the dry run was refused for another reason: {m}"))
                }
            }
            Err(e) => Err(format!("the dry run failed: {e}")),
        };
        match refused {
            Ok(()) => {
                tracing::info!(
                    "the validation webhook refused invalid config: switching to fail closed"
                );
                self.ready = true;
            }
            Err(reason) => {
                tracing::info!("not ready to switch validation to fail closed: {reason}")
            }
        }
        self.ready
    }
}

/// Replaces `whc`, counting the write.
async fn write(
    api: &Api<ValidatingWebhookConfiguration>,
    name: &str,
    whc: &ValidatingWebhookConfiguration,
    metrics: &ValidationMetrics,
) {
    match api.replace(name, &PostParams::default(), whc).await {
        Ok(_) => {
            tracing::info!(webhook = %name, "wrote the webhook configuration");
            metrics.config_updates.inc();
        }
        // A conflict is another writer's newer version: its event brings it back here.
        Err(e) => {
            let reason = match &e {
                kube::Error::Api(status) => status.reason.clone(),
                _ => "Unknown".to_string(),
            };
            tracing::warn!(webhook = %name, "writing the CA bundle failed: {e}");
            let labels: Labels = vec![("reason", reason)];
            metrics.config_update_error.get_or_create(&labels).inc();
        }
    }
}
