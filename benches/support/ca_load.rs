//! Load for a CA's `CreateCertificate`: a fixed number of requests in flight over the
//! given channels for a fixed time, shared by `benches/ca.rs` (meshd's CA in process) and
//! `benches/ca_istiod.rs` (meshd and istiod over their secure ports).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use meshd::ca::service::pb::IstioCertificateRequest;
use meshd::ca::service::pb::istio_certificate_service_client::IstioCertificateServiceClient;
use tonic::transport::Channel;

/// Certificates issued and the seconds taken: `in_flight` workers, spread over `channels`, each
/// sending `csr` (with `token` as its bearer token, if given) until `seconds` are up. A
/// refused request or an answer without a leaf and a root ends the run with a panic, since
/// its rate would then not be a signing rate.
pub async fn drive(
    channels: &[Channel],
    token: Option<&str>,
    csr: &str,
    in_flight: usize,
    seconds: f64,
) -> (u64, f64) {
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let authorization: Option<tonic::metadata::MetadataValue<_>> = token.map(|t| {
        format!("Bearer {t}")
            .parse()
            .expect("a token fit for a header")
    });
    let workers: Vec<_> = (0..in_flight)
        .map(|n| {
            let mut client =
                IstioCertificateServiceClient::new(channels[n % channels.len()].clone());
            let (done, csr, authorization) = (done.clone(), csr.to_string(), authorization.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    let mut request = tonic::Request::new(IstioCertificateRequest {
                        csr: csr.clone(),
                        validity_duration: 3600,
                        metadata: None,
                    });
                    if let Some(a) = &authorization {
                        request.metadata_mut().insert("authorization", a.clone());
                    }
                    let chain = client
                        .create_certificate(request)
                        .await
                        .unwrap_or_else(|e| panic!("the CA refused a valid request: {e}"))
                        .into_inner()
                        .cert_chain;
                    assert!(
                        chain.len() >= 2,
                        "an answer without leaf and root: {chain:?}"
                    );
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    (
        done.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64(),
    )
}
