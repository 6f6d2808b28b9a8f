//! Sidecar injection on the real kube-apiserver: the revision's MutatingWebhookConfiguration
//! as Istio's chart installs it (no `caBundle`, `failurePolicy: Fail`), meshd writing its
//! root into it, and the API server calling meshd's `/inject` over TLS for each pod
//! created in a namespace labelled with the revision. The configuration reaches meshd by
//! `clientConfig.url` (the test bed has no Service routing) and selects only the test's
//! namespace, so that other tests sharing the API server never meet it.

use std::time::Duration;

use crate::cluster::Tenant;
use crate::harness::*;

/// Deletes a cluster-scoped MutatingWebhookConfiguration when dropped.
struct Installed<'a>(&'a Tenant, String);

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        self.0
            .cluster
            .delete("MutatingWebhookConfiguration", "", &self.1);
    }
}

/// The revision's injector configuration as Istio's chart writes its `rev.namespace`
/// entry: namespaces labelled `istio.io/rev=REV` (and not `istio-injection`), pods not
/// labelled `sidecar.istio.io/inject=false`.
fn injector(name: &str, revision: &str, url: &str) -> String {
    format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nmetadata: {{name: {name}, labels: {{istio.io/rev: {revision}}}}}\nwebhooks:\n- name: rev.namespace.sidecar-injector.istio.io\n  clientConfig: {{url: '{url}'}}\n  failurePolicy: Fail\n  sideEffects: None\n  reinvocationPolicy: Never\n  admissionReviewVersions: [v1]\n  namespaceSelector:\n    matchExpressions: [{{key: istio.io/rev, operator: In, values: [{revision}]}}, {{key: istio-injection, operator: DoesNotExist}}]\n  objectSelector:\n    matchExpressions: [{{key: sidecar.istio.io/inject, operator: NotIn, values: ['false']}}]\n  rules: [{{operations: [CREATE], apiGroups: [''], apiVersions: [v1], resources: [pods]}}]\n"
    )
}

/// A pod as the API server's ServiceAccount admission leaves it (the test bed runs without
/// that plugin, so the pod names its ServiceAccount itself).
fn pod(name: &str, labels: &str, annotations: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: shop, labels: {{app: {name}, {labels}}}, annotations: {{{annotations}}}}}\nspec:\n  serviceAccountName: default\n  containers: [{{name: app, image: app, ports: [{{name: http, containerPort: 8080}}], readinessProbe: {{httpGet: {{port: http, path: /ready}}}}}}]\n"
    )
}

fn container_names(pod: &serde_json::Value, list: &str) -> Vec<String> {
    (pod["spec"][list].as_array().into_iter().flatten())
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect()
}

/// A pod created in the revision's namespace is stored with the revision's sidecar: the
/// API server trusts meshd's webhook through the `caBundle` meshd wrote, and the stored
/// pod has the capture init container, the proxy as a native sidecar reaching the
/// revision's `istiod-REV` Service, the token and root volumes, and its probe sent through
/// the agent. A pod labelled out is never sent to meshd; one annotated out is sent and
/// left alone.
#[test]
fn pods_created_through_the_api_server_get_the_revisions_sidecar() {
    let t = Tenant::new("k8s-inject", "");
    let rev = t.app.clone();
    t.cluster
        .kubectl(
            &["label", "namespace", &t.app, &format!("istio.io/rev={rev}")],
            None,
        )
        .unwrap();
    let meshd = Meshd::start_tenant(
        &t,
        "meshd",
        &["--revision", &rev],
        &[("ENABLE_NATIVE_SIDECARS", "true")],
    );
    let name = format!("istio-sidecar-injector-{rev}");
    let url = format!("https://127.0.0.1:{}/inject", meshd.webhook_port);
    t.cluster.apply(&injector(&name, &rev, &url)).unwrap();
    let _installed = Installed(&t, name.clone());
    wait_until(
        "meshd's root in the injector's caBundle",
        Duration::from_secs(10),
        || {
            let mwc = t.cluster.object("MutatingWebhookConfiguration", "", &name);
            mwc["webhooks"][0]["clientConfig"]["caBundle"].is_string()
        },
    );

    t.apply(&pod("hello", "", "")).unwrap();
    let hello = t.object("Pod", "hello");
    assert_eq!(
        container_names(&hello, "initContainers"),
        ["istio-init", "istio-proxy"]
    );
    assert_eq!(container_names(&hello, "containers"), ["app"]);
    let proxy = &hello["spec"]["initContainers"][1];
    assert_eq!(proxy["restartPolicy"], "Always");
    let env = |name: &str| {
        (proxy["env"].as_array().unwrap().iter())
            .find(|e| e["name"] == name)
            .map(|e| e["value"].clone())
            .unwrap_or_default()
    };
    assert_eq!(
        env("CA_ADDR"),
        format!("istiod-{rev}.{}.svc:15012", t.system).as_str()
    );
    let probers: serde_json::Value =
        serde_json::from_str(env("ISTIO_KUBE_APP_PROBERS").as_str().unwrap()).unwrap();
    // The API server defaulted the probe (scheme, timeout) before calling meshd.
    assert_eq!(
        probers,
        serde_json::json!({"/app-health/app/readyz": {
            "httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP"}, "timeoutSeconds": 1
        }})
    );
    let probe = &hello["spec"]["containers"][0]["readinessProbe"]["httpGet"];
    assert_eq!(probe["path"], "/app-health/app/readyz");
    assert_eq!(probe["port"], 15020);
    let volumes: Vec<&str> = (hello["spec"]["volumes"].as_array().unwrap().iter())
        .filter_map(|v| v["name"].as_str())
        .collect();
    for v in [
        "istio-token",
        "istiod-ca-cert",
        "istio-envoy",
        "istio-podinfo",
    ] {
        assert!(volumes.contains(&v), "{v} in {volumes:?}");
    }
    // The API server made the sourceless volumes empty directories.
    let socket = (hello["spec"]["volumes"].as_array().unwrap().iter())
        .find(|v| v["name"] == "workload-socket")
        .unwrap();
    assert_eq!(socket["emptyDir"], serde_json::json!({}));
    let annotations = &hello["metadata"]["annotations"];
    assert_eq!(annotations["istio.io/rev"], rev.as_str());
    assert!(annotations["sidecar.istio.io/status"].is_string());
    assert_eq!(
        hello["metadata"]["labels"]["security.istio.io/tlsMode"],
        "istio"
    );

    // Labelled out: the API server does not call meshd. Annotated out: meshd says no.
    t.apply(&pod("labelled-out", "sidecar.istio.io/inject: 'false'", ""))
        .unwrap();
    t.apply(&pod(
        "annotated-out",
        "",
        "sidecar.istio.io/inject: 'false'",
    ))
    .unwrap();
    for name in ["labelled-out", "annotated-out"] {
        let p = t.object("Pod", name);
        assert!(p["spec"]["initContainers"].is_null(), "{name}: {p}");
        assert_eq!(container_names(&p, "containers"), ["app"], "{name}");
    }
    assert_eq!(meshd.metric("sidecar_injection_requests_total"), 2.0);
    assert_eq!(meshd.metric("sidecar_injection_success_total"), 1.0);
    assert_eq!(meshd.metric("sidecar_injection_skip_total"), 1.0);
}
