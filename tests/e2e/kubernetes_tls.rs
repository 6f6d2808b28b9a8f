//! A gateway's TLS credential from a Kubernetes Secret on the real kube-apiserver: the
//! gateway's `meshd agent` authenticates with a token from the TokenRequest API, meshd
//! serves the Secret over SDS, and a rotated Secret reaches Envoy.

use std::time::Duration;

use crate::cluster::Tenant;
use crate::harness::*;
use crate::test_host::{service_yaml, upstream};

fn tls_secret(namespace: &str, name: &str, chain: &str, key: &str) -> String {
    let indent = |pem: &str| -> String { pem.lines().map(|l| format!("    {l}\n")).collect() };
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {namespace}}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
        indent(chain),
        indent(key)
    )
}

#[test]
fn a_gateway_serves_https_with_a_kubernetes_secret_and_follows_its_rotation() {
    let t = Tenant::new("k8s-gateway-tls", "");
    let (app, system) = (t.app.clone(), t.system.clone());
    let product = upstream("productpage");
    let port = free_port();
    t.apply(&service_yaml("productpage", 9080, &[(&product, &[])]))
        .unwrap();
    let (root, chain, key) = site_certificate("shop.example.com");
    t.cluster
        .apply(&tls_secret(&system, "shop-cert", &chain, &key))
        .unwrap();
    t.cluster
        .apply(&format!(
            "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: web, namespace: {system}}}\nspec:\n  selector: {{istio: ingressgateway}}\n  servers:\n  - port: {{number: {port}, name: https, protocol: HTTPS}}\n    hosts: [\"{app}/shop.example.com\"]\n    tls: {{mode: SIMPLE, credentialName: shop-cert}}\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: front, namespace: {app}}}\nspec:\n  hosts: [shop.example.com]\n  gateways: [{system}/web]\n  http: [{{route: [{{destination: {{host: productpage}}}}]}}]\n"
        ))
        .unwrap();
    let account = "istio-ingressgateway";
    t.cluster
        .apply(&format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {account}, namespace: {system}}}\n"
        ))
        .unwrap();
    let token = t.cluster.token(&system, account, "istio-ca", 3600);
    let meshd = Meshd::start_tenant(&t, "meshd", &[], &[]);
    // In Kubernetes the root lives in the `istio-ca-secret` Secret; the agent reads it
    // from the file a pod would mount.
    use base64::Engine;
    let secret = t.cluster.object("Secret", &system, "istio-ca-secret");
    let mesh_root = base64::engine::general_purpose::STANDARD
        .decode(secret["data"]["root-cert.pem"].as_str().unwrap())
        .unwrap();
    std::fs::create_dir_all(&meshd.ca_dir).unwrap();
    std::fs::write(meshd.ca_dir.join("root-cert.pem"), mesh_root).unwrap();
    let gateway = Workload::start(
        &meshd,
        &system,
        account,
        account,
        &token,
        "127.0.0.1",
        &["--proxy-type", "router", "--label", "istio=ingressgateway"],
    );
    let addr = format!("127.0.0.1:{port}");
    wait_until(
        "the gateway to serve HTTPS",
        Duration::from_secs(15),
        || https_get(&addr, "shop.example.com", &root, "/").is_ok_and(|r| r.body == "productpage"),
    );
    let syncz = meshd.syncz(&gateway.envoy.id);
    assert!(
        syncz["types"]["sds"]["responses"].as_u64().unwrap_or(0) > 0,
        "the credential came over SDS: {syncz}"
    );

    // The Secret rotated through the API: the gateway serves the new certificate, which
    // only the new root verifies.
    let (new_root, new_chain, new_key) = site_certificate("shop.example.com");
    t.cluster
        .apply(&tls_secret(&system, "shop-cert", &new_chain, &new_key))
        .unwrap();
    wait_until(
        "the rotated certificate to be served",
        Duration::from_secs(15),
        || https_get(&addr, "shop.example.com", &new_root, "/").is_ok_and(|r| r.status == 200),
    );
    assert!(https_get(&addr, "shop.example.com", &root, "/").is_err());
}
