//! CA throughput: CreateCertificate requests per second over real gRPC and real mutual
//! TLS on loopback (the full service path: TLS, authentication by client certificate, CSR
//! signature check, signing), next to the raw P-256 sign+verify rate measured in the same
//! run on the same threads. Figures live in BENCHMARKS.md; nothing here asserts a time.
//!
//! `cargo bench --locked --bench ca [-- SECONDS]`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use transport::admission::Admission;

#[path = "support/ca_load.rs"]
mod ca_load;

use meshd::ca::authn::{Authenticator, TokenVerifier};
use meshd::ca::material::{Material, key_to_pem};
use meshd::ca::service::CaService;
use meshd::ca::{CertTtl, CertificateAuthority, Identity, csr};
use meshd::metrics::Metrics;
use p256::ecdsa::signature::{Signer, Verifier};
use p256::ecdsa::{DerSignature, SigningKey};
use p256::elliptic_curve::Generate;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity as TlsIdentity};

const THREADS: usize = 2;
const IN_FLIGHT: usize = 16;

/// Sign+verify pairs per second on `THREADS` threads: the CA's own work per request is
/// one CSR signature check and one certificate signature. `ring_verify` verifies with ring
/// (what the CA uses), else with the pure-Rust p256 crate; signing is p256 either way.
fn raw_rate(seconds: f64, ring_verify: bool) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let done = done.clone();
            std::thread::spawn(move || {
                let key = SigningKey::generate();
                let verifying = *key.verifying_key();
                let point = verifying.to_sec1_point(false).as_bytes().to_vec();
                let ring_key = ring::signature::UnparsedPublicKey::new(
                    &ring::signature::ECDSA_P256_SHA256_ASN1,
                    point,
                );
                let msg = [7u8; 300];
                while Instant::now() < deadline {
                    let sig: DerSignature = key.sign(&msg);
                    if ring_verify {
                        ring_key.verify(&msg, sig.as_bytes()).unwrap();
                    } else {
                        verifying.verify(&msg, &sig).unwrap();
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / seconds
}

async fn grpc_rate(seconds: f64) -> f64 {
    let material = Material::self_signed("cluster.local", Duration::from_secs(3600)).unwrap();
    let ca = Arc::new(CertificateAuthority::new(
        "cluster.local",
        CertTtl::default(),
        material,
    ));
    let authn = Authenticator::new("cluster.local", TokenVerifier::None);
    let (chain, key) = ca
        .issue_server_certificate(&["localhost".into()], Duration::from_secs(3600))
        .unwrap();
    let config = transport::tls::server_config(&chain, &key, &ca.roots_pem()).unwrap();
    let (_tx, configs) = tokio::sync::watch::channel(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // Served as meshd serves its secure port.
    let metrics = Arc::new(Metrics::new());
    let service = CaService::new(ca.clone(), authn, metrics.ca.clone());
    let errors = transport::tls::HandshakeErrors {
        family: metrics.tls_handshake_errors.clone(),
        port: "secure",
    };
    let settings = transport::grpc::Settings {
        keepalive_interval: Duration::from_secs(30),
        keepalive_timeout: Duration::from_secs(10),
        max_streams: 100_000,
        errors: metrics.xds.connection_errors.clone(),
        at_limit: metrics.xds.streams_at_limit.clone(),
    };
    let (_serving, shutdown) = tokio::sync::watch::channel(false);
    tokio::spawn(transport::grpc::serve(
        transport::tls::incoming(
            listener,
            configs,
            errors,
            Admission::new(0, Default::default()),
        ),
        tonic::service::Routes::new(service.into_server()),
        settings,
        transport::tls::peer_identities,
        shutdown,
    ));

    // The client authenticates with a workload certificate (renewal), as agents do.
    let id = Identity::new("cluster.local", "bench", "client");
    let client_key = SigningKey::generate();
    let csr_pem = csr::build(&client_key, &id.to_string()).unwrap();
    let client_chain = ca.sign_workload(&csr_pem, &id, 3600).unwrap();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.roots_pem()))
        .domain_name("localhost")
        .identity(TlsIdentity::from_pem(
            client_chain[0].clone(),
            key_to_pem(&client_key).unwrap(),
        ));
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();

    let (issued, took) = ca_load::drive(&[channel], None, &csr_pem, IN_FLIGHT, seconds).await;
    issued as f64 / took
}

fn main() {
    let seconds: f64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(5.0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(THREADS)
        .enable_all()
        .build()
        .unwrap();
    let pure = raw_rate(seconds, false);
    let raw = raw_rate(seconds, true);
    let grpc = runtime.block_on(grpc_rate(seconds));
    println!("raw P-256 sign+verify, p256 only ({THREADS} threads): {pure:.0}/s");
    println!(
        "raw P-256 sign+verify, as the CA does it: p256 sign + ring verify ({THREADS} threads): {raw:.0}/s"
    );
    println!(
        "CreateCertificate over gRPC + mTLS ({IN_FLIGHT} in flight): {grpc:.0}/s = {:.0}% of the CA's raw rate, {:.0}% of the p256-only rate",
        100.0 * grpc / raw,
        100.0 * grpc / pure
    );
}
