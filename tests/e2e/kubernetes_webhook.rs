//! The validation webhook on the real kube-apiserver: meshd writes its root into the
//! revision's ValidatingWebhookConfigurations, the API server calls meshd's webhook over
//! TLS trusting that bundle, and `kubectl apply` of invalid config is refused with meshd's
//! message. Each configuration is scoped to its test's namespaces (a `namespaceSelector`)
//! and removed when the test ends, so that other tests sharing the API server never meet
//! it; each test serves a revision of its own, as the configurations are found by
//! `istio.io/rev`.

use std::time::Duration;

use crate::cluster::{Cluster, Tenant};
use crate::harness::*;

/// Deletes a cluster-scoped ValidatingWebhookConfiguration when dropped.
struct Installed<'a>(&'a Cluster, String);

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        self.0.delete("ValidatingWebhookConfiguration", "", &self.1);
    }
}

/// A revision's webhook configuration as Istio's chart installs it (`failurePolicy:
/// Ignore`, no `caBundle`), reaching meshd at `client_config`, for `t`'s namespaces only.
fn whc(t: &Tenant, name: &str, revision: &str, client_config: &str) -> String {
    format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata: {{name: {name}, labels: {{app: istiod, istio.io/rev: {revision}}}}}\nwebhooks:\n- name: rev.validation.istio.io\n  clientConfig: {client_config}\n  failurePolicy: Ignore\n  sideEffects: None\n  admissionReviewVersions: [v1]\n  namespaceSelector:\n    matchExpressions: [{{key: kubernetes.io/metadata.name, operator: In, values: [{}, {}]}}]\n  rules: [{{operations: [CREATE, UPDATE], apiGroups: [networking.istio.io, security.istio.io], apiVersions: ['*'], resources: ['*']}}]\n",
        t.app, t.system
    )
}

/// The revision's ValidatingWebhookConfigurations get meshd's root as their `caBundle`, as
/// istiod's webhook controller writes it: with it, the webhook port's certificate verifies
/// as the API server checks it. Another revision's configuration is left alone.
#[test]
fn the_revisions_webhook_configurations_get_meshds_root_as_their_ca_bundle() {
    use base64::Engine;
    let t = Tenant::new("k8s-webhook-ca", "");
    let rev = t.app.clone();
    let (mine, other) = (
        format!("istio-validator-{rev}-{}", t.system),
        format!("istio-validator-{rev}-other-{}", t.system),
    );
    let service = format!(
        "{{service: {{name: istiod, namespace: {}, path: /validate}}}}",
        t.system
    );
    t.cluster.apply(&whc(&t, &mine, &rev, &service)).unwrap();
    let _mine = Installed(t.cluster, mine.clone());
    t.cluster
        .apply(&whc(&t, &other, &format!("{rev}-other"), &service))
        .unwrap();
    let _other = Installed(t.cluster, other.clone());
    let meshd = Meshd::start_tenant(&t, "meshd", &["--revision", &rev], &[]);
    let bundle = |name: &str| {
        let whc = t.cluster.object("ValidatingWebhookConfiguration", "", name);
        whc["webhooks"][0]["clientConfig"]["caBundle"]
            .as_str()
            .map(str::to_string)
    };
    wait_until(
        "the CA bundle to be written",
        Duration::from_secs(10),
        || bundle(&mine).is_some(),
    );
    let encoded = bundle(&mine).unwrap();
    let root = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap();
    let root = String::from_utf8(root).unwrap();
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "k-1", "operation": "DELETE", "resource": {}},
    });
    let answer = https_request(
        &format!("127.0.0.1:{}", meshd.webhook_port),
        "istiod.istio-system.svc",
        &root,
        "POST /validate",
        &[("Content-Type", "application/json")],
        &review.to_string(),
    )
    .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(bundle(&other), None);
    // The API server cannot reach a webhook by `service` here (no Service endpoints, no
    // DNS): the probe's invalid config is let through (failurePolicy Ignore), so the
    // webhook is not known to work and keeps failing open.
    std::thread::sleep(Duration::from_secs(2));
    let installed = t
        .cluster
        .object("ValidatingWebhookConfiguration", "", &mine);
    assert_eq!(installed["webhooks"][0]["failurePolicy"], "Ignore");
    let metrics = meshd.get("/metrics").unwrap().body;
    assert!(
        metrics.contains("galley_validation_config_updates 1\n"),
        "{metrics}"
    );
}

/// istiod's switch to failing closed: the revision's webhooks, installed with
/// `failurePolicy: Ignore`, become `Fail` once a dry run of invalid config sent through
/// the API server is refused by meshd's webhook (kube-apiserver calls it at its
/// `clientConfig.url`, trusting the `caBundle` meshd wrote). After that, `kubectl apply` of
/// invalid config is refused with meshd's message naming the field, and valid config is
/// created. Another revision's webhook stays as installed.
#[test]
fn the_revisions_webhooks_fail_closed_once_meshd_refuses_invalid_config() {
    let t = Tenant::new("k8s-webhook-fail-closed", "");
    let rev = t.app.clone();
    let meshd = Meshd::start_tenant(&t, "meshd", &["--revision", &rev], &[]);
    let url = format!(
        "{{url: 'https://127.0.0.1:{}/validate'}}",
        meshd.webhook_port
    );
    let (mine, other) = (
        format!("istio-validator-{rev}-{}", t.system),
        format!("istio-validator-{rev}-other-{}", t.system),
    );
    t.cluster.apply(&whc(&t, &mine, &rev, &url)).unwrap();
    let _mine = Installed(t.cluster, mine.clone());
    let policy = |name: &str| {
        t.cluster.object("ValidatingWebhookConfiguration", "", name)["webhooks"][0]["failurePolicy"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    wait_until(
        "the webhook to fail closed",
        Duration::from_secs(30),
        || policy(&mine) == "Fail",
    );
    let installed = t
        .cluster
        .object("ValidatingWebhookConfiguration", "", &mine);
    assert!(installed["webhooks"][0]["clientConfig"]["caBundle"].is_string());
    // Invalid config through the API server is refused by meshd, naming the field.
    let invalid = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: bad, namespace: shop}\nspec:\n  hosts: [a]\n  http: [{match: [{uri: {regex: \"(\"}}], route: [{destination: {host: a}}]}]\n";
    let refused = t
        .cluster
        .kubectl(&["apply", "-f", "-"], Some(&t.yaml(invalid)))
        .unwrap_err();
    assert!(refused.contains("denied the request"), "{refused}");
    assert!(refused.contains("spec.http[0].match[0].uri"), "{refused}");
    assert!(t.object("VirtualService", "bad").is_null());
    // Valid config is created.
    let valid = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: good, namespace: shop}\nspec:\n  hosts: [a]\n  http: [{route: [{destination: {host: a}}]}]\n";
    t.apply(valid).unwrap();
    assert!(!t.object("VirtualService", "good").is_null());

    // Another revision's webhook, added later, is left failing open.
    t.cluster
        .apply(&whc(&t, &other, &format!("{rev}-other"), &url))
        .unwrap();
    let _other = Installed(t.cluster, other.clone());
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(policy(&other), "Ignore");

    // With meshd gone, the failure policy decides: `Fail` refuses what it cannot check.
    drop(meshd);
    let refused = t
        .cluster
        .kubectl(
            &["apply", "-f", "-"],
            Some(&t.yaml(&valid.replace("name: good", "name: later"))),
        )
        .unwrap_err();
    assert!(refused.contains("failed calling webhook"), "{refused}");
}
