//! The agent's workload certificate: a P-256 key made here (it never leaves the process),
//! a CSR sent to the CA over TLS, renewal at a fixed fraction of the lifetime, and retries
//! with backoff while the CA is away.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use p256::ecdsa::SigningKey;
use p256::elliptic_curve::Generate;
use tokio::sync::watch;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity as TlsIdentity};
use x509_cert::der::DecodePem;

use crate::ca::csr;
use crate::ca::material::key_to_pem;
use crate::ca::service::pb::IstioCertificateRequest;
use crate::ca::service::pb::istio_certificate_service_client::IstioCertificateServiceClient;

/// The identity material Envoy is handed over SDS.
#[derive(Clone, PartialEq)]
pub struct WorkloadCert {
    /// Leaf first, then intermediates (no root).
    pub chain_pem: String,
    pub key_pem: String,
    /// The trust bundle (`ROOTCA`).
    pub roots_pem: String,
    /// When the agent received it (the certificate itself is valid from a little earlier,
    /// for clock skew; renewal counts the lifetime from here).
    pub received: SystemTime,
    pub not_after: SystemTime,
    /// Increases with every new certificate: the SDS version.
    pub generation: u64,
}

impl std::fmt::Debug for WorkloadCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkloadCert")
            .field("generation", &self.generation)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// How to reach the CA and what to ask for.
#[derive(Clone, Debug)]
pub struct CaClientOptions {
    /// `https://HOST:PORT` of the CA (`CA_ADDR`).
    pub address: String,
    /// The name the CA's serving certificate must carry.
    pub server_name: String,
    /// PEM roots that the CA's certificate chains to.
    pub root_pem: String,
    /// Bearer token for the first request (a service-account JWT or a bootstrap token).
    pub token_file: Option<std::path::PathBuf>,
    /// The SPIFFE id asked for.
    pub spiffe_id: String,
    /// Requested lifetime (`SECRET_TTL`).
    pub ttl: Duration,
    /// Renew when this fraction of the lifetime is left (`SECRET_GRACE_PERIOD_RATIO`).
    pub grace_ratio: f64,
}

/// Asks the CA for a certificate once: with the current certificate as TLS client identity
/// when there is one (renewal), else with the token.
pub async fn request_certificate(
    opts: &CaClientOptions,
    current: Option<&WorkloadCert>,
    generation: u64,
) -> anyhow::Result<WorkloadCert> {
    let key = SigningKey::generate();
    let csr = csr::build(&key, &opts.spiffe_id)?;
    let key_pem = key_to_pem(&key)?;
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&opts.root_pem))
        .domain_name(opts.server_name.clone());
    let valid = current.filter(|c| c.not_after > SystemTime::now());
    if let Some(cur) = valid {
        tls = tls.identity(TlsIdentity::from_pem(&cur.chain_pem, &cur.key_pem));
    }
    let channel: Channel = Endpoint::from_shared(opts.address.clone())?
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await?;
    let mut request = tonic::Request::new(IstioCertificateRequest {
        csr,
        validity_duration: opts.ttl.as_secs() as i64,
        metadata: None,
    });
    // The token goes along even on renewal: a CA that forwards to an external one needs
    // it (meshd itself prefers the certificate).
    if let Some(file) = &opts.token_file {
        let token = std::fs::read_to_string(file)
            .map_err(|e| anyhow::anyhow!("reading the token {}: {e}", file.display()))?;
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {}", token.trim()).parse()?);
    }
    let chain = IstioCertificateServiceClient::new(channel)
        .create_certificate(request)
        .await?
        .into_inner()
        .cert_chain;
    let Some(leaf) = chain.first() else {
        anyhow::bail!("the CA returned an empty chain");
    };
    let cert = x509_cert::Certificate::from_pem(leaf.trim().as_bytes())?;
    let validity = cert.tbs_certificate().validity();
    let root = chain.last().cloned().unwrap_or_default();
    let intermediates = &chain[..chain.len().saturating_sub(1).max(1)];
    Ok(WorkloadCert {
        chain_pem: intermediates.concat(),
        key_pem,
        roots_pem: if chain.len() > 1 {
            root
        } else {
            opts.root_pem.clone()
        },
        received: SystemTime::now(),
        not_after: SystemTime::from(validity.not_after),
        generation,
    })
}

/// When to renew `cert`: with `grace_ratio` of its life left.
pub fn renew_at(cert: &WorkloadCert, grace_ratio: f64) -> SystemTime {
    let life = cert
        .not_after
        .duration_since(cert.received)
        .unwrap_or_default();
    cert.not_after - life.mul_f64(grace_ratio.clamp(0.0, 1.0))
}

/// Keeps a valid certificate in `out`: fetches the first one, then renews before expiry.
/// Failures are retried with exponential backoff (1 s to 30 s); the current certificate
/// stays in use meanwhile.
pub async fn keep_fresh(opts: Arc<CaClientOptions>, out: watch::Sender<Option<WorkloadCert>>) {
    let mut generation = 0;
    let mut backoff = Duration::from_secs(1);
    loop {
        let current = out.borrow().clone();
        if let Some(cur) = &current {
            let wait = renew_at(cur, opts.grace_ratio)
                .duration_since(SystemTime::now())
                .unwrap_or_default();
            tokio::time::sleep(wait).await;
        }
        generation += 1;
        match request_certificate(&opts, current.as_ref(), generation).await {
            Ok(cert) => {
                tracing::info!(
                    id = %opts.spiffe_id,
                    expires_in = ?cert.not_after.duration_since(SystemTime::now()).unwrap_or_default(),
                    "workload certificate issued"
                );
                out.send_replace(Some(cert));
                backoff = Duration::from_secs(1);
            }
            Err(e) => {
                tracing::warn!("certificate request failed, retrying in {backoff:?}: {e:#}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
                // A certificate that has expired cannot authenticate a renewal.
                if current
                    .as_ref()
                    .is_some_and(|c| c.not_after <= SystemTime::now())
                {
                    out.send_replace(None);
                }
            }
        }
    }
}
