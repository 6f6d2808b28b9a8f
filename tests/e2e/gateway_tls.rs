//! A gateway serving HTTPS from a `credentialName` Secret: `meshd agent` bootstraps the
//! gateway's Envoy onto the secure port, and meshd serves the Secret over SDS on that
//! connection only.

use std::time::Duration;

use meshd::ca::material::Material;
use meshd::ca::{CertTtl, CertificateAuthority};

use crate::harness::*;

/// A test CA (not the mesh's) and a serving certificate for `host` from it: (root PEM,
/// chain PEM, key PEM).
fn site_certificate(host: &str) -> (String, String, String) {
    let material = Material::self_signed("example-ca", Duration::from_secs(3600)).unwrap();
    let ca = CertificateAuthority::new("example-ca", CertTtl::default(), material);
    let (chain, key) = ca
        .issue_server_certificate(&[host.to_string()], Duration::from_secs(3600))
        .unwrap();
    (ca.roots_pem(), chain, key)
}

fn indent(pem: &str) -> String {
    pem.lines().map(|l| format!("    {l}\n")).collect()
}

fn secret_yaml(name: &str, chain: &str, key: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: istio-system}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
        indent(chain),
        indent(key)
    )
}

#[test]
fn a_gateway_terminates_https_with_its_credential_served_over_the_secure_port() {
    let dir = temp_dir("gateway-tls");
    let config = dir.join("config");
    std::fs::create_dir_all(&config).unwrap();
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, "gw-token istio-system istio-ingressgateway\n").unwrap();
    let product = Upstream::start("productpage");
    let port = free_port();
    let (root, chain, key) = site_certificate("shop.example.com");
    let yaml = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: shop}}\n---\n{svc}---\napiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: web, namespace: istio-system}}\nspec:\n  selector: {{istio: ingressgateway}}\n  servers:\n  - port: {{number: {port}, name: https, protocol: HTTPS}}\n    hosts: [\"shop/shop.example.com\"]\n    tls: {{mode: SIMPLE, credentialName: shop-cert}}\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: front, namespace: shop}}\nspec:\n  hosts: [shop.example.com]\n  gateways: [istio-system/web]\n  http: [{{route: [{{destination: {{host: productpage}}}}]}}]\n---\n{secret}",
        svc = service_yaml("shop", "productpage", 9080, &[(&product, &[])]),
        secret = secret_yaml("shop-cert", &chain, &key),
    );
    std::fs::write(config.join("mesh.yaml"), yaml).unwrap();
    let meshd = Meshd::start_with(&config, &["--ca-token-file", tokens.to_str().unwrap()]);
    let gateway = Workload::start(
        &meshd,
        "istio-system",
        "istio-ingressgateway",
        "istio-ingressgateway",
        "gw-token",
        "127.0.0.1",
        &["--proxy-type", "router", "--label", "istio=ingressgateway"],
    );
    let addr = format!("127.0.0.1:{port}");
    wait_until(
        "the gateway to serve HTTPS",
        Duration::from_secs(10),
        || https_get(&addr, "shop.example.com", &root, "/").is_ok_and(|r| r.status == 200),
    );
    assert_eq!(
        https_get(&addr, "shop.example.com", &root, "/")
            .unwrap()
            .body,
        "productpage"
    );
    // The gateway received the credential over SDS on its ADS stream.
    let syncz = meshd.syncz(&gateway.envoy.id);
    assert!(
        syncz["types"]["sds"]["responses"].as_u64().unwrap_or(0) > 0,
        "{syncz}"
    );

    // Rotating the Secret's certificate reaches the gateway live.
    let (new_root, new_chain, new_key) = site_certificate("shop.example.com");
    meshd.write(
        "secret.yaml",
        &secret_yaml("shop-cert", &new_chain, &new_key),
    );
    std::fs::write(
        config.join("mesh.yaml"),
        std::fs::read_to_string(config.join("mesh.yaml"))
            .unwrap()
            .split("---\napiVersion: v1\nkind: Secret")
            .next()
            .unwrap(),
    )
    .unwrap();
    wait_until(
        "the new certificate to be served",
        Duration::from_secs(10),
        || https_get(&addr, "shop.example.com", &new_root, "/").is_ok_and(|r| r.status == 200),
    );
    assert!(
        https_get(&addr, "shop.example.com", &root, "/").is_err(),
        "the old certificate is gone"
    );
}
