//! TLS at the gateway. A server terminating HTTPS with a `credentialName` Secret: `meshd
//! agent` bootstraps the gateway's Envoy onto the secure port, and meshd serves the Secret
//! over SDS on that connection only. A PASSTHROUGH server: connections forwarded by SNI,
//! still encrypted, as the VirtualService's `tls` routes say.

use std::time::Duration;

use crate::harness::*;
use crate::tls_client::*;

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

/// meshd serving `yaml` from `DIR/config/mesh.yaml`, and a gateway that `meshd agent`
/// bootstraps onto the secure port as `istio-system/ACCOUNT`, labelled `istio=ROLE`
/// (credentials reach only such a gateway).
fn secure_gateway(
    dir: &std::path::Path,
    yaml: &str,
    account: &str,
    role: &str,
) -> (Meshd, Workload) {
    let config = dir.join("config");
    std::fs::create_dir_all(&config).unwrap();
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("gw-token istio-system {account}\n")).unwrap();
    std::fs::write(config.join("mesh.yaml"), yaml).unwrap();
    let meshd = Meshd::start_with(&config, &["--ca-token-file", tokens.to_str().unwrap()]);
    let label = format!("istio={role}");
    let gateway = Workload::start(
        &meshd,
        "istio-system",
        account,
        account,
        "gw-token",
        "127.0.0.1",
        &["--proxy-type", "router", "--label", &label],
    );
    (meshd, gateway)
}

#[test]
fn a_gateway_terminates_https_with_its_credential_served_over_the_secure_port() {
    let dir = temp_dir("gateway-tls");
    let product = Upstream::start("productpage");
    let port = free_port();
    let (root, chain, key) = site_certificate("shop.example.com");
    let yaml = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: shop}}\n---\n{svc}---\napiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: web, namespace: istio-system}}\nspec:\n  selector: {{istio: ingressgateway}}\n  servers:\n  - port: {{number: {port}, name: https, protocol: HTTPS}}\n    hosts: [\"shop/shop.example.com\"]\n    tls: {{mode: SIMPLE, credentialName: shop-cert}}\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: front, namespace: shop}}\nspec:\n  hosts: [shop.example.com]\n  gateways: [istio-system/web]\n  http: [{{route: [{{destination: {{host: productpage}}}}]}}]\n---\n{secret}",
        svc = service_yaml("shop", "productpage", 9080, &[(&product, &[])]),
        secret = secret_yaml("shop-cert", &chain, &key),
    );
    let (meshd, gateway) = secure_gateway(&dir, &yaml, "istio-ingressgateway", "ingressgateway");
    let config = dir.join("config");
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

/// The TLS versions and cipher suites of a gateway's server reach Envoy: MeshConfig
/// `tlsDefaults` where the server sets none, the server's own where it does. The client
/// speaks one version and offers the suites named; the server's certificate is ECDSA.
#[test]
fn a_gateway_server_takes_the_meshs_tls_defaults_and_its_own_versions_and_suites() {
    use rustls::CipherSuite::{
        TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 as AES128,
        TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 as CHACHA20,
    };
    use rustls::version::{TLS12, TLS13};
    let dir = temp_dir("gateway-tls-params");
    let product = Upstream::start("productpage");
    let port = free_port();
    let (_, chain, key) = site_certificate("shop.example.com");
    let yaml = |server: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n    tlsDefaults: {{minProtocolVersion: TLSV1_3}}\n---\n{svc}---\napiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: web, namespace: istio-system}}\nspec:\n  selector: {{istio: ingressgateway}}\n  servers:\n  - port: {{number: {port}, name: https, protocol: HTTPS}}\n    hosts: [\"shop/shop.example.com\"]\n    tls: {{mode: SIMPLE, credentialName: shop-cert{server}}}\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: front, namespace: shop}}\nspec:\n  hosts: [shop.example.com]\n  gateways: [istio-system/web]\n  http: [{{route: [{{destination: {{host: productpage}}}}]}}]\n---\n{secret}",
            svc = service_yaml("shop", "productpage", 9080, &[(&product, &[])]),
            secret = secret_yaml("shop-cert", &chain, &key),
        )
    };
    let (meshd, _gateway) =
        secure_gateway(&dir, &yaml(""), "istio-ingressgateway", "ingressgateway");
    let addr = format!("127.0.0.1:{port}");
    let get = |version, suites: &[rustls::CipherSuite]| {
        let client = narrow_client(&[version], suites, None, &["http/1.1"]);
        tls_request(&addr, "shop.example.com", client, "GET /", &[], "")
    };
    wait_until("TLS 1.3 to be served", Duration::from_secs(10), || {
        get(&TLS13, &[]).is_ok_and(|r| r.status == 200)
    });
    let refused = get(&TLS12, &[]);
    assert!(
        refused.is_err(),
        "TLS 1.2 under tlsDefaults' TLSV1_3: {refused:?}"
    );

    let own = ", minProtocolVersion: TLSV1_2, maxProtocolVersion: TLSV1_2, cipherSuites: [ECDHE-ECDSA-AES128-GCM-SHA256]";
    meshd.write("mesh.yaml", &yaml(own));
    wait_until("the server's own versions", Duration::from_secs(10), || {
        get(&TLS12, &[AES128]).is_ok_and(|r| r.status == 200)
    });
    let above = get(&TLS13, &[]);
    assert!(
        above.is_err(),
        "TLS 1.3 above maxProtocolVersion: {above:?}"
    );
    let other = get(&TLS12, &[CHACHA20]);
    assert!(
        other.is_err(),
        "a suite the server does not list: {other:?}"
    );
}

/// A TLS service `name` in shop whose endpoint is `upstream` (port named `https`).
fn tls_service(name: &str, port: u16, upstream: &Upstream) -> String {
    service_yaml("shop", name, port, &[(upstream, &[])]).replace("{name: http,", "{name: https,")
}

#[test]
fn a_passthrough_gateway_forwards_tls_by_sni_without_terminating_it() {
    let dir = temp_dir("gateway-passthrough").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let (root_a, chain_a, key_a) = site_certificate("a.example.com");
    let (root_b, chain_b, key_b) = site_certificate("b.example.com");
    let site_a = Upstream::tls("site-a", &chain_a, &key_a, &root_a);
    let site_b = Upstream::tls("site-b", &chain_b, &key_b, &root_b);
    let (port_a, port_b, listen) = (free_port(), free_port(), free_port());
    std::fs::write(
        dir.join("services.yaml"),
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: shop}}\n---\n{}---\n{}",
            tls_service("site-a", port_a, &site_a),
            tls_service("site-b", port_b, &site_b)
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("gateway.yaml"),
        format!(
            "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: edge, namespace: shop}}\nspec:\n  selector: {{istio: ingressgateway}}\n  servers:\n  - port: {{number: {listen}, name: tls, protocol: TLS}}\n    hosts: [\"*.example.com\"]\n    tls: {{mode: PASSTHROUGH}}\n"
        ),
    )
    .unwrap();
    let route = |sni: &str, host: &str, port: u16| {
        format!(
            "  - match: [{{sniHosts: [{sni}]}}]\n    route: [{{destination: {{host: {host}, port: {{number: {port}}}}}}}]\n"
        )
    };
    let vs = |routes: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: sites, namespace: shop}}\nspec:\n  hosts: [a.example.com, b.example.com]\n  gateways: [edge]\n  tls:\n{routes}"
        )
    };
    let both = route("a.example.com", "site-a", port_a) + &route("b.example.com", "site-b", port_b);
    std::fs::write(dir.join("vs.yaml"), vs(&both)).unwrap();
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::gateway(&meshd, Ads::Delta, "gw-passthrough");
    let addr = format!("127.0.0.1:{listen}");
    // Each client completes its handshake with the site itself (verified against that
    // site's own CA, which the gateway never held): the gateway read only the SNI.
    wait_until(
        "the gateway to forward a.example.com",
        Duration::from_secs(10),
        || https_get(&addr, "a.example.com", &root_a, "/").is_ok_and(|r| r.body == "site-a"),
    );
    let b = https_get(&addr, "b.example.com", &root_b, "/").unwrap();
    assert_eq!(b.body, "site-b");
    assert_eq!(b.headers["x-tls-sni"], "b.example.com");
    // A name no route holds matches no chain: the connection is closed.
    assert!(https_get(&addr, "c.example.com", &root_a, "/").is_err());

    // Without b's route, its connections are refused and a's still pass.
    std::fs::write(
        dir.join("vs.yaml"),
        vs(&route("a.example.com", "site-a", port_a)),
    )
    .unwrap();
    wait_until(
        "b.example.com to be refused",
        Duration::from_secs(10),
        || https_get(&addr, "b.example.com", &root_b, "/").is_err(),
    );
    assert_eq!(
        https_get(&addr, "a.example.com", &root_a, "/")
            .unwrap()
            .body,
        "site-a"
    );
    let listeners = envoy.admin("/listeners").unwrap().body;
    assert!(
        listeners.contains(&format!("0.0.0.0_{listen}")),
        "{listeners}"
    );
}

/// TLS origination at an egress gateway, as Istio's egress task sets it up: the gateway
/// takes plain HTTP for api.example.com and, by the DestinationRule's `credentialName`,
/// originates mutual TLS with the client certificate and CA of a Secret in its own
/// namespace, served over SDS on its secure ADS stream. The site sees the certificate and
/// the rule's SNI; the gateway verified the site against the Secret's CA.
#[test]
fn an_egress_gateway_originates_mutual_tls_with_a_destination_rule_credential() {
    use meshd::ca::material::{Material, key_to_pem};
    use meshd::ca::{CertTtl, CertificateAuthority, Identity, csr};
    let dir = temp_dir("gateway-egress-credential");
    let hour = Duration::from_secs(3600);
    let ca = CertificateAuthority::new(
        "example-ca",
        CertTtl::default(),
        Material::self_signed("example-ca", hour).unwrap(),
    );
    let (site_chain, site_key) = ca
        .issue_server_certificate(&["api.example.com".to_string()], hour)
        .unwrap();
    let api = Upstream::tls("api", &site_chain, &site_key, &ca.roots_pem());
    let client_key = {
        use p256::elliptic_curve::Generate;
        p256::ecdsa::SigningKey::generate()
    };
    let client = Identity::new("example-ca", "istio-system", "istio-egressgateway");
    let csr = csr::build(&client_key, &client.to_string()).unwrap();
    let client_chain = ca.sign_workload(&csr, &client, 3600).unwrap().concat();
    let (port, listen) = (free_port(), free_port());
    let yaml = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: istio-system}}\n---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: api, namespace: istio-system}}\nspec:\n  hosts: [api.example.com]\n  location: MESH_EXTERNAL\n  resolution: STATIC\n  ports: [{{number: {port}, name: http, protocol: HTTP}}]\n  endpoints: [{{address: 127.0.0.1, ports: {{http: {tls}}}}}]\n---\napiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: egress, namespace: istio-system}}\nspec:\n  selector: {{istio: egressgateway}}\n  servers:\n  - port: {{number: {listen}, name: http, protocol: HTTP}}\n    hosts: [api.example.com]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: api, namespace: istio-system}}\nspec:\n  hosts: [api.example.com]\n  gateways: [egress]\n  http: [{{route: [{{destination: {{host: api.example.com, port: {{number: {port}}}}}}}]}}]\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: api, namespace: istio-system}}\nspec:\n  host: api.example.com\n  trafficPolicy:\n    tls: {{mode: MUTUAL, credentialName: api-client, sni: api.example.com}}\n---\napiVersion: v1\nkind: Secret\nmetadata: {{name: api-client, namespace: istio-system}}\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}  ca.crt: |\n{}",
        indent(&client_chain),
        indent(&key_to_pem(&client_key).unwrap()),
        indent(&ca.roots_pem()),
        tls = api.port,
    );
    let (_meshd, gateway) = secure_gateway(&dir, &yaml, "istio-egressgateway", "egressgateway");
    let addr = format!("127.0.0.1:{listen}");
    wait_until(
        "the gateway to reach api.example.com over mutual TLS",
        Duration::from_secs(15),
        || http_get(&addr, "api.example.com", "/", &[]).is_ok_and(|r| r.status == 200),
    );
    let r = http_get(&addr, "api.example.com", "/", &[]).unwrap();
    assert_eq!(r.body, "api");
    assert_eq!(r.headers["x-tls-sni"], "api.example.com");
    assert_eq!(r.headers["x-tls-client-cert"], "present");
    let secrets = gateway.envoy.config_dump("dynamic_active_secrets");
    for name in ["kubernetes://api-client", "kubernetes://api-client-cacert"] {
        assert!(secrets.contains(name), "{name} missing: {secrets}");
    }
}

/// A Gateway server of protocol TLS with a `credentialName` terminates TLS with the
/// Secret's certificate and forwards the decrypted bytes where its VirtualService's `tcp`
/// route says: here to a plain HTTP service, whose answer comes back encrypted.
#[test]
fn a_tls_gateway_server_terminates_and_forwards_by_its_tcp_route() {
    let dir = temp_dir("gateway-tls-tcp");
    let db = Upstream::start("db");
    let (port, listen) = (free_port(), free_port());
    let (root, chain, key) = site_certificate("db.example.com");
    let yaml = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: shop}}\n---\n{svc}---\napiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: db-gw, namespace: istio-system}}\nspec:\n  selector: {{istio: ingressgateway}}\n  servers:\n  - port: {{number: {listen}, name: tls, protocol: TLS}}\n    hosts: [\"shop/db.example.com\"]\n    tls: {{mode: SIMPLE, credentialName: db-cert}}\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: db, namespace: shop}}\nspec:\n  hosts: [db.example.com]\n  gateways: [istio-system/db-gw]\n  tcp: [{{route: [{{destination: {{host: db, port: {{number: {port}}}}}}}]}}]\n---\n{secret}",
        svc =
            service_yaml("shop", "db", port, &[(&db, &[])]).replace("{name: http,", "{name: tcp,"),
        secret = secret_yaml("db-cert", &chain, &key),
    );
    let (_meshd, _gateway) = secure_gateway(&dir, &yaml, "istio-ingressgateway", "ingressgateway");
    let addr = format!("127.0.0.1:{listen}");
    wait_until(
        "the gateway to terminate TLS for db.example.com",
        Duration::from_secs(15),
        || https_get(&addr, "db.example.com", &root, "/").is_ok_and(|r| r.body == "db"),
    );
    // The plain upstream saw no TLS: it answered, and saw no SNI of its own.
    let r = https_get(&addr, "db.example.com", &root, "/").unwrap();
    assert!(!r.headers.contains_key("x-tls-sni"), "{:?}", r.headers);
}

/// MUTUAL against OPTIONAL_MUTUAL at an HTTPS server whose credential carries a CA. Under
/// MUTUAL a client presenting a certificate from that CA is served and one without a
/// certificate is refused; under OPTIONAL_MUTUAL the one without is served too, while a
/// certificate from another CA is still refused. The application learns the certificate
/// a client presented from `x-forwarded-client-cert`, which the gateway sets from its own
/// handshake and never takes from the client (istiod's SANITIZE_SET).
#[test]
fn optional_mutual_serves_a_client_without_a_certificate_that_mutual_refuses() {
    let dir = temp_dir("gateway-optional-mutual");
    let product = Upstream::start("productpage");
    let port = free_port();
    let (root, chain, key, (client_chain, client_key)) =
        site_certificate_and_client("shop.example.com");
    let (_, _, _, (stranger_chain, stranger_key)) = site_certificate_and_client("stranger");
    let yaml = |mode: &str| {
        format!(
            "{svc}---\napiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: web, namespace: istio-system}}\nspec:\n  selector: {{istio: ingressgateway}}\n  servers:\n  - port: {{number: {port}, name: https, protocol: HTTPS}}\n    hosts: [\"shop/shop.example.com\"]\n    tls: {{mode: {mode}, credentialName: shop-cert}}\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: front, namespace: shop}}\nspec:\n  hosts: [shop.example.com]\n  gateways: [istio-system/web]\n  http: [{{route: [{{destination: {{host: productpage}}}}]}}]\n---\n{secret}  ca.crt: |\n{ca}",
            svc = service_yaml("shop", "productpage", 9080, &[(&product, &[])]),
            secret = secret_yaml("shop-cert", &chain, &key),
            ca = indent(&root),
        )
    };
    let (meshd, _gateway) = secure_gateway(
        &dir,
        &yaml("MUTUAL"),
        "istio-ingressgateway",
        "ingressgateway",
    );
    let addr = format!("127.0.0.1:{port}");
    let forged = [(
        "x-forwarded-client-cert",
        "By=spiffe://forged;URI=spiffe://cluster.local/ns/shop/sa/forged",
    )];
    let get = || https_request(&addr, "shop.example.com", &root, "GET /", &forged, "");
    let get_presenting = |chain: &str, key: &str| {
        let mut config = transport::tls::client_config(&root, Some((chain, key))).unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        tls_request(&addr, "shop.example.com", config, "GET /", &forged, "")
    };
    let xfcc = |r: &HttpResponse| r.headers["x-echo-xfcc"].clone();
    wait_until(
        "MUTUAL to serve a client certificate of its CA",
        Duration::from_secs(10),
        || get_presenting(&client_chain, &client_key).is_ok_and(|r| r.status == 200),
    );
    let presenting = get_presenting(&client_chain, &client_key).unwrap();
    let forwarded = xfcc(&presenting);
    assert!(
        forwarded.contains("Hash=")
            && forwarded.contains("Cert=\"")
            && forwarded.contains("Subject=\""),
        "{forwarded:?}"
    );
    assert!(!forwarded.contains("forged"), "{forwarded:?}");
    assert!(
        get().is_err(),
        "MUTUAL served a client without a certificate"
    );
    assert!(
        get_presenting(&stranger_chain, &stranger_key).is_err(),
        "MUTUAL served a client certificate of another CA"
    );
    meshd.write("mesh.yaml", &yaml("OPTIONAL_MUTUAL"));
    wait_until("OPTIONAL_MUTUAL to serve", Duration::from_secs(10), || {
        get().is_ok_and(|r| r.status == 200)
    });
    let without = get().unwrap();
    assert_eq!(without.body, "productpage");
    assert_eq!(xfcc(&without), "", "no certificate, so no header");
    let presenting = get_presenting(&client_chain, &client_key).unwrap();
    assert_eq!(
        (presenting.status, presenting.body.as_str()),
        (200, "productpage")
    );
    assert!(
        get_presenting(&stranger_chain, &stranger_key).is_err(),
        "OPTIONAL_MUTUAL served a client certificate of another CA"
    );
}

/// An HTTPS server whose certificate is files in the gateway's container
/// (`serverCertificate`, `privateKey`), as Istio's file-mounted gateway certificates: the
/// gateway's agent serves them over SDS (`file-cert:CERT~KEY`), and a new certificate
/// written to the files is served without touching the configuration.
#[test]
fn a_gateway_serves_https_from_certificate_files_and_follows_their_rotation() {
    let dir = temp_dir("gateway-files");
    let product = Upstream::start("productpage");
    let port = free_port();
    let (root, chain, key) = site_certificate("shop.example.com");
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let (cert_path, key_path) = (certs.join("tls.crt"), certs.join("tls.key"));
    std::fs::write(&cert_path, &chain).unwrap();
    std::fs::write(&key_path, &key).unwrap();
    let yaml = format!(
        "{svc}---\napiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: web, namespace: istio-system}}\nspec:\n  selector: {{istio: ingressgateway}}\n  servers:\n  - port: {{number: {port}, name: https, protocol: HTTPS}}\n    hosts: [\"shop/shop.example.com\"]\n    tls: {{mode: SIMPLE, serverCertificate: {cert}, privateKey: {key}}}\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: front, namespace: shop}}\nspec:\n  hosts: [shop.example.com]\n  gateways: [istio-system/web]\n  http: [{{route: [{{destination: {{host: productpage}}}}]}}]\n",
        svc = service_yaml("shop", "productpage", 9080, &[(&product, &[])]),
        cert = cert_path.display(),
        key = key_path.display(),
    );
    let (_meshd, _gateway) = secure_gateway(&dir, &yaml, "istio-ingressgateway", "ingressgateway");
    let addr = format!("127.0.0.1:{port}");
    let get = |root: &str| https_get(&addr, "shop.example.com", root, "/");
    wait_until(
        "the gateway to serve HTTPS",
        Duration::from_secs(10),
        || get(&root).is_ok_and(|r| r.status == 200),
    );
    assert_eq!(get(&root).unwrap().body, "productpage");
    // A new certificate (from another CA) in the same files.
    let (new_root, new_chain, new_key) = site_certificate("shop.example.com");
    std::fs::write(&key_path, &new_key).unwrap();
    std::fs::write(&cert_path, &new_chain).unwrap();
    wait_until(
        "the rotated files to be served",
        Duration::from_secs(10),
        || get(&new_root).is_ok_and(|r| r.status == 200),
    );
    assert!(get(&root).is_err(), "the old certificate is gone");
}

/// One HTTP/1.1 request over TLS to `addr` with `sni` and `alpn`, the certificate not
/// checked: the response, or why there was none.
fn request_with_sni(addr: &str, sni: &str, alpn: &[&str]) -> std::io::Result<HttpResponse> {
    tls_request(addr, sni, unverifying_client(None, alpn), "GET /", &[], "")
}

/// An AUTO_PASSTHROUGH server (an east-west gateway's) forwards a connection by its Istio
/// mTLS SNI, still encrypted, to the SNI-DNAT cluster of that name: the workload behind it
/// answers, having seen the client's SNI. A workload without a sidecar (no `tlsMode`
/// label) is not reachable this way, nor is any workload without Istio's mTLS ALPN.
#[test]
fn an_auto_passthrough_gateway_forwards_mtls_by_its_sni() {
    let (_, chain, key) = site_certificate("reviews.shop.svc.cluster.local");
    let (client_root, _, _) = site_certificate("client");
    let meshed = Upstream::tls("reviews-meshed", &chain, &key, &client_root);
    let plain = Upstream::tls("ratings-plain", &chain, &key, &client_root);
    let dir = temp_dir("auto-passthrough").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let (gw_port, reviews_port, ratings_port) = (free_port(), free_port(), free_port());
    let mesh_label = [("security.istio.io/tlsMode", "istio")];
    let write = |file: &str, text: String| std::fs::write(dir.join(file), text).unwrap();
    write(
        "reviews.yaml",
        service_yaml("shop", "reviews", reviews_port, &[(&meshed, &mesh_label)]),
    );
    write(
        "ratings.yaml",
        service_yaml("shop", "ratings", ratings_port, &[(&plain, &[])]),
    );
    write(
        "gateway.yaml",
        format!(
            "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: cross-network, namespace: istio-system}}\nspec:\n  selector: {{istio: ingressgateway}}\n  servers:\n  - port: {{number: {gw_port}, name: tls, protocol: TLS}}\n    hosts: ['*.local']\n    tls: {{mode: AUTO_PASSTHROUGH}}\n"
        ),
    );
    let meshd = Meshd::start(&dir);
    let _gateway = Envoy::gateway(&meshd, Ads::Delta, "east-west");
    let addr = format!("127.0.0.1:{gw_port}");
    let sni = format!("outbound_.{reviews_port}_._.reviews.shop.svc.cluster.local");
    wait_until(
        "the AUTO_PASSTHROUGH listener",
        Duration::from_secs(10),
        || request_with_sni(&addr, &sni, &["istio"]).is_ok(),
    );
    let answer = request_with_sni(&addr, &sni, &["istio"]).unwrap();
    assert_eq!(
        (answer.status, answer.body.as_str()),
        (200, "reviews-meshed")
    );
    assert_eq!(answer.headers["x-tls-sni"], sni);
    // No Istio mTLS ALPN: no chain matches.
    assert!(request_with_sni(&addr, &sni, &["h2"]).is_err());
    // A workload without a sidecar is filtered out of its SNI-DNAT cluster.
    let plain_sni = format!("outbound_.{ratings_port}_._.ratings.shop.svc.cluster.local");
    let refused = request_with_sni(&addr, &plain_sni, &["istio"]);
    assert!(refused.is_err(), "{refused:?}");
}
