//! The CA's roots in every namespace, as istiod's namespace controller keeps them: the
//! ConfigMap `istio-ca-root-cert` (key `root-cert.pem`, label `istio.io/config=true`)
//! written by meshd on the real kube-apiserver, under the role meshd ships, and kept:
//! an edited root is put back with the other keys left alone, a deleted ConfigMap comes
//! back, and a namespace created later gets one.

use std::time::Duration;

use crate::cluster::Tenant;
use crate::harness::*;

const NAME: &str = "istio-ca-root-cert";

#[test]
fn every_watched_namespace_gets_the_roots_and_keeps_them() {
    let t = Tenant::new("k8s-root-cert", "");
    // A short Lease, so that the second meshd below takes over soon after the first stops.
    let lease = ["--leader-lease-duration", "2s"];
    let meshd = Meshd::start_tenant(&t, "meshd", &lease, &[]);
    // Kubernetes mode keeps the self-signed CA in the Secret istio-ca-secret.
    let root = {
        use base64::Engine;
        let secret = t.cluster.object("Secret", &t.system, "istio-ca-secret");
        let encoded = secret["data"]["ca-cert.pem"]
            .as_str()
            .expect("istio-ca-secret");
        let pem = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap();
        String::from_utf8(pem).unwrap()
    };
    let held = |namespace: &str| {
        let map = t.cluster.object("ConfigMap", namespace, NAME);
        map["data"]["root-cert.pem"].as_str().map(str::to_string)
    };
    let wait_for_root = |what: &str, namespace: &str| {
        wait_until(what, Duration::from_secs(15), || {
            held(namespace).as_deref() == Some(root.as_str())
        })
    };
    for namespace in [&t.app, &t.system] {
        wait_for_root("the roots in each of the tenant's namespaces", namespace);
    }
    let map = t.cluster.object("ConfigMap", &t.app, NAME);
    assert_eq!(map["metadata"]["labels"]["istio.io/config"], "true");

    // Edited by hand: the root comes back, a key of someone else's stays.
    t.apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {NAME}, namespace: shop}}\ndata:\n  root-cert.pem: stale\n  note: kept\n"
    ))
    .unwrap();
    wait_for_root("the edited root put back", &t.app);
    let map = t.cluster.object("ConfigMap", &t.app, NAME);
    assert_eq!(map["data"]["note"], "kept");

    // Deleted: written again.
    t.delete("ConfigMap", NAME);
    wait_for_root("the deleted ConfigMap written again", &t.app);

    // A namespace meshd watches, created after it started.
    let later = format!("{}-later", t.app);
    t.cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {later}}}\n"
        ))
        .unwrap();
    drop(meshd);
    let watched = format!("{},{},{later}", t.app, t.system);
    let _meshd = Meshd::start_tenant(&t, "meshd-2", &lease, &[("WATCHED_NAMESPACES", &watched)]);
    // The same CA: the Secret holds it.
    wait_for_root("the roots in a namespace created later", &later);
    t.cluster.delete("Namespace", "", &later);
}
