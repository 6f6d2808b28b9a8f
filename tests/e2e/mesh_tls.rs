//! What a sidecar's inbound mutual TLS accepts, tried with a client holding a certificate
//! from meshd's CA: istiod's versions and cipher suites, and MeshConfig `meshMTLS`.

use std::time::Duration;

use rustls::CipherSuite::{
    TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 as AES128,
    TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 as CHACHA20,
};
use rustls::version::{TLS12, TLS13};

use crate::harness::*;
use crate::mtls::mesh;
use crate::tls_client::*;

/// Over TLS 1.2 a sidecar accepts istiod's six AES-GCM suites only: a mesh client
/// offering ChaCha20 alone is refused, as by an istiod-configured sidecar. With
/// `meshMTLS.minProtocolVersion: TLSV1_3` no TLS 1.2 client is served.
#[test]
fn inbound_mutual_tls_takes_istiods_suites_and_the_meshs_minimum_version() {
    let m = mesh("mesh-tls");
    let _reviews = m.reviews(&[]);
    let (chain, key) = mesh_certificate(&m.meshd, "shop", "productpage");
    let addr = format!("{}:9080", m.server_ip);
    let get = |version, suites: &[rustls::CipherSuite]| {
        let client = narrow_client(
            &[version],
            suites,
            Some((&chain, &key)),
            &["istio-http/1.1"],
        );
        tls_request(
            &addr,
            "reviews.shop.svc.cluster.local",
            client,
            "GET /",
            &[],
            "",
        )
    };
    wait_until(
        "reviews to serve a mesh client over TLS 1.2",
        Duration::from_secs(15),
        || get(&TLS12, &[AES128]).is_ok_and(|r| r.status == 200),
    );
    assert_eq!(get(&TLS12, &[AES128]).unwrap().body, "reviews");
    let chacha = get(&TLS12, &[CHACHA20]);
    assert!(chacha.is_err(), "ChaCha20 over TLS 1.2: {chacha:?}");
    assert_eq!(get(&TLS13, &[]).unwrap().status, 200);

    m.meshd.write(
        "meshconfig.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |\n    meshMTLS: {minProtocolVersion: TLSV1_3}\n",
    );
    wait_until(
        "meshMTLS to refuse TLS 1.2",
        Duration::from_secs(15),
        || get(&TLS12, &[AES128]).is_err(),
    );
    assert_eq!(get(&TLS13, &[]).unwrap().body, "reviews");
}

/// Under PERMISSIVE a TCP port tells a mesh client's mutual TLS (by Istio's ALPN) from a
/// client's own TLS, which passes through to the application still encrypted, as
/// istiod's sidecars do: a client without a sidecar reaches the application's TLS server
/// and checks its certificate. Under STRICT the sidecar terminates every TLS connection
/// as mutual TLS, and that client is refused.
#[test]
fn a_tcp_port_passes_a_clients_own_tls_through_under_permissive() {
    let m = mesh("mesh-tls-passthrough");
    let (root, chain, key) = site_certificate("legacy.example.com");
    let app = Upstream::tls("legacy", &chain, &key, &root);
    m.serve_from(app.port, |yaml| {
        yaml.replace(
            "{number: 9080, protocol: HTTP, name: http}",
            "{number: 9080, protocol: TCP, name: tcp}",
        )
        .replace("name: http,", "name: tcp,")
    });
    let _reviews = m.reviews(&[]);
    let addr = format!("{}:9080", m.server_ip);
    let get = || https_get(&addr, "legacy.example.com", &root, "/");
    wait_until(
        "the application's own TLS through the sidecar",
        Duration::from_secs(15),
        || get().is_ok_and(|r| r.status == 200),
    );
    assert_eq!(get().unwrap().body, "legacy");

    m.meshd.write(
        "pa.yaml",
        "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: default, namespace: shop}\nspec: {mtls: {mode: STRICT}}\n",
    );
    wait_until(
        "STRICT to terminate the client's TLS",
        Duration::from_secs(15),
        || get().is_err(),
    );
}
