//! The CA on the secure port: real gRPC over real TLS, local (bootstrap tokens) and
//! Kubernetes (TokenReview against the test bed's real API server) authentication, and every
//! way a request can be bad.

use std::time::Duration;

use meshd::agent::certs::{CaClientOptions, WorkloadCert, request_certificate};
use meshd::ca::Identity;
use meshd::ca::csr;
use meshd::ca::service::pb::IstioCertificateRequest;
use meshd::ca::service::pb::istio_certificate_service_client::IstioCertificateServiceClient;
use p256::ecdsa::SigningKey;
use p256::elliptic_curve::Generate;
use tonic::Code;

use crate::cluster::Tenant;
use crate::harness::*;

/// meshd in local mode with a bootstrap token for `shop/reviews`.
fn local_ca(name: &str) -> Meshd {
    local_ca_with(
        name,
        "# token namespace service-account\nreviews-token shop reviews\n",
        &[],
        |_| {},
    )
}

/// As [`local_ca`], with its own token file, extra flags, and `prepare` run on the config
/// directory before meshd starts.
fn local_ca_with(
    name: &str,
    tokens: &str,
    extra: &[&str],
    prepare: impl FnOnce(&std::path::Path),
) -> Meshd {
    let dir = temp_dir(name);
    let token_path = dir.join("tokens");
    std::fs::write(&token_path, tokens).unwrap();
    let config = dir.join("config");
    std::fs::create_dir_all(&config).unwrap();
    prepare(&config);
    let mut args = vec!["--ca-token-file", token_path.to_str().unwrap()];
    args.extend_from_slice(extra);
    Meshd::start_with(&config, &args)
}

fn client_options(
    meshd: &Meshd,
    root_pem: String,
    token: Option<&std::path::Path>,
    id: &str,
) -> CaClientOptions {
    CaClientOptions {
        address: format!("https://127.0.0.1:{}", meshd.secure_port),
        server_name: "localhost".into(),
        root_pem,
        token_file: token.map(|t| t.to_path_buf()),
        spiffe_id: id.into(),
        ttl: Duration::from_secs(3600),
        grace_ratio: 0.2,
    }
}

fn token_file(dir: &std::path::Path, token: &str) -> std::path::PathBuf {
    let path = dir.join(format!("token-{}", token.len()));
    std::fs::write(&path, token).unwrap();
    path
}

async fn raw_request(
    meshd: &Meshd,
    token: Option<&str>,
    identity: Option<(&str, &str)>,
    csr: String,
) -> Result<Vec<String>, tonic::Status> {
    let channel = meshd
        .secure_channel(&meshd.root_pem(), identity)
        .await
        .unwrap();
    let mut request = tonic::Request::new(IstioCertificateRequest {
        csr,
        validity_duration: 600,
        metadata: None,
    });
    if let Some(t) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    IstioCertificateServiceClient::new(channel)
        .create_certificate(request)
        .await
        .map(|r| r.into_inner().cert_chain)
}

const REVIEWS: &str = "spiffe://cluster.local/ns/shop/sa/reviews";

#[tokio::test(flavor = "multi_thread")]
async fn a_token_gets_a_certificate_and_the_certificate_renews_itself() {
    let meshd = local_ca("ca-local");
    let dir = meshd.config_dir.parent().unwrap().to_path_buf();
    let token = token_file(&dir, "reviews-token");
    let opts = client_options(&meshd, meshd.root_pem(), Some(&token), REVIEWS);
    let first = request_certificate(&opts, None, 1).await.unwrap();
    let leaf_der = pem_to_der(&first.chain_pem);
    assert_eq!(
        Identity::from_certificate_der(&leaf_der),
        vec![Identity::parse(REVIEWS).unwrap()]
    );
    assert_eq!(first.roots_pem, meshd.root_pem());

    // Renewal: no token at all, only the current certificate as TLS client identity.
    let no_token = CaClientOptions {
        token_file: None,
        ..opts.clone()
    };
    let renewed: WorkloadCert = request_certificate(&no_token, Some(&first), 2)
        .await
        .unwrap();
    assert_ne!(renewed.key_pem, first.key_pem, "a fresh key every time");
    // Without either, the CA refuses.
    let e = request_certificate(&no_token, None, 3).await.unwrap_err();
    assert!(
        format!("{e:#}").contains("no client certificate and no bearer token"),
        "{e:#}"
    );
    assert_eq!(meshd.metric("citadel_server_csr_count"), 3.0);
    assert_eq!(
        meshd.metric("citadel_server_success_cert_issuance_count"),
        2.0
    );
    assert_eq!(
        meshd.metric(r#"meshd_ca_errors{reason="unauthenticated"}"#),
        1.0
    );
}

fn pem_to_der(pem: &str) -> Vec<u8> {
    use x509_cert::der::{DecodePem, Encode};
    x509_cert::Certificate::from_pem(pem.as_bytes())
        .unwrap()
        .to_der()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn forged_foreign_malformed_and_oversized_requests_are_refused_and_counted() {
    let meshd = local_ca("ca-negative");
    let key = SigningKey::generate();
    let token = Some("reviews-token");

    // Someone else's identity, with a valid token for reviews.
    let e = raw_request(
        &meshd,
        token,
        None,
        csr::build(&key, "spiffe://cluster.local/ns/bank/sa/teller").unwrap(),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("ns/bank/sa/teller"), "{e:?}");

    // A signature made by another key.
    let good = csr::build(&key, REVIEWS).unwrap();
    let forged = {
        use x509_cert::der::{DecodePem, EncodePem};
        let mut req = x509_cert::request::CertReq::from_pem(good.as_bytes()).unwrap();
        let other = csr::build(&SigningKey::generate(), REVIEWS).unwrap();
        req.signature = x509_cert::request::CertReq::from_pem(other.as_bytes())
            .unwrap()
            .signature;
        req.to_pem(x509_cert::der::pem::LineEnding::LF).unwrap()
    };
    let e = raw_request(&meshd, token, None, forged).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("signature"), "{e:?}");

    // Garbage, and a request bigger than the CA reads.
    let e = raw_request(
        &meshd,
        token,
        None,
        "-----BEGIN CERTIFICATE REQUEST-----\nnot base64\n".into(),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = raw_request(&meshd, token, None, "A".repeat(100 * 1024))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("the limit is 8192"), "{e:?}");

    // An unknown token.
    let e = raw_request(&meshd, Some("guess"), None, good.clone())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");

    // And meshd is still there and still signs.
    let chain = raw_request(&meshd, token, None, good).await.unwrap();
    assert_eq!(chain.len(), 2);
    for (reason, n) in [
        ("identity_mismatch", 1.0),
        ("bad_signature", 1.0),
        ("bad_csr", 1.0),
        ("unauthenticated", 1.0),
        ("too_large", 1.0),
    ] {
        assert_eq!(
            meshd.metric(&format!(r#"meshd_ca_errors{{reason="{reason}"}}"#)),
            n,
            "{reason}"
        );
    }
    // istiod's counter of the same: the CSRs that did not parse or verify.
    assert_eq!(meshd.metric("citadel_server_csr_parsing_err_count"), 3.0);
    assert!(
        meshd.log().contains("CSR refused") && meshd.log().contains("ns/bank/sa/teller"),
        "refusals are logged"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_local_root_survives_a_restart() {
    let dir = temp_dir("ca-restart");
    let config = dir.join("config");
    std::fs::create_dir_all(&config).unwrap();
    let first = Meshd::start(&config);
    let root = first.root_pem();
    drop(first);
    let second = Meshd::start(&config);
    assert_eq!(second.root_pem(), root);
    // And the restarted CA's TLS port chains to it.
    assert!(second.secure_channel(&root, None).await.is_ok());
}

/// On the real API server: workload tokens minted by the TokenRequest API are checked by
/// the real TokenReview API with the audience `istio-ca`; the root is kept in the
/// `istio-ca-secret` Secret of meshd's namespace, which a second replica reuses.
#[tokio::test(flavor = "multi_thread")]
async fn in_kubernetes_tokens_are_checked_by_token_review_and_the_root_lives_in_a_secret() {
    let t = tokio::task::spawn_blocking(|| Tenant::new("ca-k8s", ""))
        .await
        .unwrap();
    let t = std::sync::Arc::new(t);
    let app = t.app.clone();
    let tokens = {
        let t = t.clone();
        tokio::task::spawn_blocking(move || {
            for sa in ["reviews", "gone"] {
                t.apply(&format!(
                    "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {sa}, namespace: shop}}\n"
                ))
                .unwrap();
            }
            let good = t.cluster.token(&t.app, "reviews", "istio-ca", 3600);
            let vault = t.cluster.token(&t.app, "reviews", "vault", 3600);
            let gone = t.cluster.token(&t.app, "gone", "istio-ca", 3600);
            t.delete("ServiceAccount", "gone");
            [("good", good), ("other-audience", vault), ("deleted-account", gone)]
        })
        .await
        .unwrap()
    };
    let meshd = {
        let t = t.clone();
        tokio::task::spawn_blocking(move || Meshd::start_tenant(&t, "meshd", &[], &[]))
            .await
            .unwrap()
    };
    let secret = t.cluster.object("Secret", &t.system, "istio-ca-secret");
    let root_b64 = secret["data"]["root-cert.pem"]
        .as_str()
        .unwrap()
        .to_string();
    let root = String::from_utf8(base64_decode(&root_b64)).unwrap();

    let id = format!("spiffe://cluster.local/ns/{app}/sa/reviews");
    let opts = |name: &str, token: &str| {
        let path = t.dir.join(format!("token-{name}"));
        std::fs::write(&path, token).unwrap();
        client_options(&meshd, root.clone(), Some(&path), &id)
    };
    let cert = request_certificate(&opts("good", &tokens[0].1), None, 1)
        .await
        .unwrap();
    assert_eq!(cert.roots_pem, root);
    for ((name, token), expected) in tokens[1..]
        .iter()
        .chain(&[("forged", "not.a.jwt".to_string())])
        .zip([
            "invalid for the target audiences",
            "serviceaccounts",
            "invalid bearer token",
        ])
    {
        let e = request_certificate(&opts(name, token), None, 1)
            .await
            .unwrap_err();
        assert!(format!("{e:#}").contains(expected), "{name}: {e:#}");
    }

    // A second replica (or a restart) uses the same root.
    let again = {
        let t = t.clone();
        tokio::task::spawn_blocking(move || Meshd::start_tenant(&t, "meshd2", &[], &[]))
            .await
            .unwrap()
    };
    assert!(again.secure_channel(&root, None).await.is_ok());
    let cert2 = request_certificate(
        &CaClientOptions {
            address: format!("https://127.0.0.1:{}", again.secure_port),
            ..opts("good", &tokens[0].1)
        },
        None,
        1,
    )
    .await
    .unwrap();
    assert_eq!(cert2.roots_pem, root);
}

/// A cluster moving from istiod keeps its root: istiod's self-signed CA (RSA-2048, in
/// `istio-ca-secret`) is the one meshd signs with when it takes over, so workloads that
/// trust istiod's root trust meshd's certificates. rustls checks each signature: the
/// client verifies meshd's serving certificate, and meshd the renewal's client certificate.
#[tokio::test(flavor = "multi_thread")]
async fn meshd_keeps_signing_under_the_rsa_root_istiod_made() {
    let t = tokio::task::spawn_blocking(|| Tenant::new("ca-from-istiod", ""))
        .await
        .unwrap();
    let t = std::sync::Arc::new(t);
    let secret = {
        let t = t.clone();
        tokio::task::spawn_blocking(move || {
            let istiod = crate::istiod::Istiod::start(t.cluster, &t.system, &t.dir.join("istiod"));
            t.apply("apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: reviews, namespace: shop}\n")
                .unwrap();
            wait_until("istiod's CA secret", Duration::from_secs(60), || {
                !t.cluster.object("Secret", &t.system, "istio-ca-secret").is_null()
            });
            drop(istiod);
            t.cluster.object("Secret", &t.system, "istio-ca-secret")
        })
        .await
        .unwrap()
    };
    let field = |name: &str| {
        let b64 = secret["data"][name].as_str().unwrap();
        String::from_utf8(base64_decode(b64)).unwrap()
    };
    let (root, key) = (field("root-cert.pem"), field("ca-key.pem"));
    assert!(
        key.starts_with("-----BEGIN RSA PRIVATE KEY-----"),
        "istiod's key: {key:.40}"
    );

    let meshd = {
        let t = t.clone();
        tokio::task::spawn_blocking(move || Meshd::start_tenant(&t, "meshd", &[], &[]))
            .await
            .unwrap()
    };
    let token = t.cluster.token(&t.app, "reviews", "istio-ca", 3600);
    let path = t.dir.join("token");
    std::fs::write(&path, token).unwrap();
    let id = format!("spiffe://cluster.local/ns/{}/sa/reviews", t.app);
    let opts = client_options(&meshd, root.clone(), Some(&path), &id);
    let cert = request_certificate(&opts, None, 1).await.unwrap();
    assert_eq!(cert.roots_pem, root);
    let no_token = CaClientOptions {
        token_file: None,
        ..opts
    };
    let renewed = request_certificate(&no_token, Some(&cert), 2)
        .await
        .unwrap();
    assert_eq!(renewed.roots_pem, root);
    // meshd took istiod's material as it was.
    let now = t.cluster.object("Secret", &t.system, "istio-ca-secret");
    assert_eq!(now["data"], secret["data"]);
}

/// Secret data as the API server shows it (standard base64).
fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap_or_else(|e| panic!("{text:?} is not base64: {e}"))
}

/// Opens delta ADS on the secure port as `namespace`'s proxy and returns how many clusters
/// the first answer holds.
async fn secure_ads(
    meshd: &Meshd,
    identity: Option<(&str, &str)>,
    namespace: &str,
) -> Result<usize, tonic::Status> {
    let channel = meshd
        .secure_channel(&meshd.root_pem(), identity)
        .await
        .unwrap();
    first_cds_answer(channel, namespace, None).await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_secure_xds_port_serves_only_proxies_of_the_proven_identity() {
    let meshd = local_ca("ca-xds");
    let dir = meshd.config_dir.parent().unwrap().to_path_buf();
    let opts = client_options(
        &meshd,
        meshd.root_pem(),
        Some(&token_file(&dir, "reviews-token")),
        REVIEWS,
    );
    let cert = request_certificate(&opts, None, 1).await.unwrap();
    let identity = Some((cert.chain_pem.as_str(), cert.key_pem.as_str()));

    assert!(secure_ads(&meshd, identity, "shop").await.is_ok());
    let e = secure_ads(&meshd, identity, "bank").await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("ns/shop/sa/reviews"), "{e:?}");
    let e = secure_ads(&meshd, None, "shop").await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert_eq!(
        meshd.metric(r#"meshd_xds_connection_errors{reason="identity_mismatch"}"#),
        1.0
    );
    assert_eq!(
        meshd.metric(r#"meshd_xds_connection_errors{reason="unauthenticated"}"#),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn with_an_external_ca_requests_are_checked_here_and_signed_there() {
    let upstream = local_ca("ca-upstream");
    let upstream_root = upstream.ca_dir.join("root-cert.pem");
    // The front instance also knows a token the upstream does not.
    let front = local_ca_with(
        "ca-front",
        "reviews-token shop reviews\nfront-only shop reviews\n",
        &[
            "--external-ca",
            &format!("https://127.0.0.1:{}", upstream.secure_port),
            "--external-ca-root-cert",
            upstream_root.to_str().unwrap(),
            "--external-ca-server-name",
            "localhost",
        ],
        |_| {},
    );
    let dir = front.config_dir.parent().unwrap().to_path_buf();
    let opts = |token: &str| {
        client_options(
            &front,
            front.root_pem(),
            Some(&token_file(&dir, token)),
            REVIEWS,
        )
    };
    let cert = request_certificate(&opts("reviews-token"), None, 1)
        .await
        .unwrap();
    assert_eq!(
        cert.roots_pem,
        upstream.root_pem(),
        "signed by the external CA"
    );
    assert_ne!(front.root_pem(), upstream.root_pem());
    assert_eq!(
        upstream.metric("citadel_server_success_cert_issuance_count"),
        1.0
    );

    // The external CA authenticates the workload again.
    let e = request_certificate(&opts("front-only"), None, 1)
        .await
        .unwrap_err();
    assert!(
        format!("{e:#}").contains("the external CA refused the caller"),
        "{e:#}"
    );
    // And a foreign identity never leaves this instance.
    let e = raw_request(
        &front,
        Some("reviews-token"),
        None,
        csr::build(
            &SigningKey::generate(),
            "spiffe://cluster.local/ns/bank/sa/teller",
        )
        .unwrap(),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert_eq!(upstream.metric("citadel_server_csr_count"), 2.0);
    // With the external CA gone, signing fails here: istiod's sign-error counter.
    drop(upstream);
    let e = request_certificate(&opts("reviews-token"), None, 1)
        .await
        .unwrap_err();
    assert!(format!("{e:#}").contains("upstream"), "{e:#}");
    assert_eq!(
        front.metric(r#"citadel_server_csr_sign_err_count{error="upstream"}"#),
        1.0
    );
    assert_eq!(front.metric("citadel_server_csr_parsing_err_count"), 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn plugged_in_intermediate_certificates_sign_and_chain_to_their_root() {
    use meshd::ca::material::Material;
    // An offline root, and an intermediate for this cluster in `cacerts`.
    let root = Material::self_signed("corp-root", Duration::from_secs(7200)).unwrap();
    let files = root
        .issue_intermediate("cluster-1", Duration::from_secs(3600))
        .unwrap();
    let meshd = local_ca_with(
        "ca-plugged",
        "reviews-token shop reviews\n",
        &[],
        |config| {
            Material::from_files(&files)
                .unwrap()
                .save_dir(&cacerts_dir(config))
                .unwrap()
        },
    );
    let dir = meshd.config_dir.parent().unwrap().to_path_buf();
    let root_pem = root.roots_pem.concat();
    let opts = client_options(
        &meshd,
        root_pem.clone(),
        Some(&token_file(&dir, "reviews-token")),
        REVIEWS,
    );
    let cert = request_certificate(&opts, None, 1).await.unwrap();
    assert_eq!(
        cert.roots_pem, root_pem,
        "the chain ends at the offline root"
    );
    assert!(
        cert.chain_pem.contains(files.ca_cert.trim()),
        "the intermediate travels with the leaf"
    );
    assert!(
        !meshd.ca_dir.join("ca-key.pem").exists(),
        "no self-signed root is made when certificates are plugged in"
    );
    // The root's and the intermediate's expiry, as istiod reports them for alerts.
    let unix = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as f64
    };
    let root_expiry = unix(root.not_after());
    let chain_expiry = unix(Material::from_files(&files).unwrap().not_after());
    assert!(chain_expiry < root_expiry);
    assert_eq!(
        meshd.metric("citadel_server_root_cert_expiry_timestamp"),
        root_expiry
    );
    assert_eq!(
        meshd.metric("citadel_server_cert_chain_expiry_timestamp"),
        chain_expiry
    );
    let left = meshd.metric("citadel_server_root_cert_expiry_seconds");
    let now = unix(std::time::SystemTime::now());
    assert!((left - (root_expiry - now)).abs() <= 5.0, "{left}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_proxy_may_open_secure_xds_with_its_token_and_the_plaintext_port_can_be_turned_off() {
    let meshd = local_ca_with(
        "ca-xds-token",
        "reviews-token shop reviews\n",
        &["--no-plaintext-xds"],
        |_| {},
    );
    let first = |token: &'static str| {
        let meshd = &meshd;
        async move {
            let channel = meshd.secure_channel(&meshd.root_pem(), None).await.unwrap();
            first_cds_answer(channel, "shop", Some(token)).await
        }
    };
    assert!(first("reviews-token").await.is_ok());
    assert_eq!(
        first("wrong").await.unwrap_err().code(),
        Code::Unauthenticated
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", meshd.xds_port)).is_err(),
        "--no-plaintext-xds: nothing listens on the plaintext port"
    );
}
