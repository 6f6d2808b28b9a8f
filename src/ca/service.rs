//! `istio.v1.auth.IstioCertificateService/CreateCertificate`: authenticate the caller,
//! verify its CSR, sign for exactly its identity. Every refusal is logged with the reason
//! and counted in `meshd_ca_errors{reason}`; nothing here panics on input.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::authn::Authenticator;
use super::metrics::CaMetrics;
use super::{CaError, CertificateAuthority, Identity};

pub mod pb {
    tonic::include_proto!("istio.v1.auth");
}

use pb::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use pb::{IstioCertificateRequest, IstioCertificateResponse};

/// The largest CreateCertificate message read off the wire. A CSR is capped far lower
/// (`csr::MAX_CSR_BYTES`) in the handler, where the refusal is counted; this bound only
/// keeps a hostile client from making meshd buffer megabytes.
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// Another Istio-compatible CA that signs instead of this one (`EXTERNAL_CA`).
#[derive(Clone, Debug)]
pub struct UpstreamCa {
    /// `https://HOST:PORT`.
    pub address: String,
    /// PEM roots its serving certificate chains to.
    pub root_pem: String,
    /// The name its serving certificate carries.
    pub server_name: String,
}

#[derive(Clone)]
pub struct CaService {
    ca: Arc<CertificateAuthority>,
    authn: Arc<Authenticator>,
    metrics: CaMetrics,
    upstream: Option<UpstreamCa>,
}

impl CaService {
    pub fn new(
        ca: Arc<CertificateAuthority>,
        authn: Arc<Authenticator>,
        metrics: CaMetrics,
    ) -> CaService {
        CaService {
            ca,
            authn,
            metrics,
            upstream: None,
        }
    }

    /// Forward verified requests to `upstream` instead of signing them here.
    pub fn forwarding_to(mut self, upstream: Option<UpstreamCa>) -> CaService {
        self.upstream = upstream;
        self
    }

    pub fn into_server(self) -> IstioCertificateServiceServer<CaService> {
        IstioCertificateServiceServer::new(self).max_decoding_message_size(MAX_REQUEST_BYTES)
    }

    async fn handle(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Vec<String>, CaError> {
        let peer = peer_identities(&request);
        let identity = self
            .authn
            .authenticate(peer.as_deref(), request.metadata())
            .await?;
        let authorization = request.metadata().get("authorization").cloned();
        let req = request.into_inner();
        let result = match &self.upstream {
            None => self
                .ca
                .sign_workload(&req.csr, &identity, req.validity_duration),
            Some(upstream) => forward(upstream, &req, &identity, authorization).await,
        };
        let chain = result.map_err(|e| {
            tracing::warn!(caller = %identity, "CSR refused: {e}");
            e
        })?;
        tracing::debug!(identity = %identity, "certificate issued");
        Ok(chain)
    }
}

/// Checks the CSR here (signature, and that it asks for no name but the caller's), then
/// has `upstream` sign it, presenting the caller's own token: the upstream CA
/// authenticates the workload itself, so this instance can never widen what it may get.
async fn forward(
    upstream: &UpstreamCa,
    req: &IstioCertificateRequest,
    identity: &super::Identity,
    authorization: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
) -> Result<Vec<String>, CaError> {
    super::csr::verify_for(&req.csr, identity)?;
    let Some(authorization) = authorization else {
        return Err(CaError::Unauthenticated(
            "with an external CA, requests must carry the workload's token".into(),
        ));
    };
    let upstream_err =
        |e: &dyn std::fmt::Display| CaError::Upstream(format!("{}: {e}", upstream.address));
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&upstream.root_pem))
        .domain_name(upstream.server_name.clone());
    let channel = tonic::transport::Endpoint::from_shared(upstream.address.clone())
        .map_err(|e| upstream_err(&e))?
        .tls_config(tls)
        .map_err(|e| upstream_err(&e))?
        .timeout(std::time::Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| upstream_err(&e))?;
    let mut request = tonic::Request::new(req.clone());
    request
        .metadata_mut()
        .insert("authorization", authorization);
    pb::istio_certificate_service_client::IstioCertificateServiceClient::new(channel)
        .create_certificate(request)
        .await
        .map(|r| r.into_inner().cert_chain)
        .map_err(|s| match s.code() {
            tonic::Code::Unauthenticated => CaError::Unauthenticated(format!(
                "the external CA refused the caller: {}",
                s.message()
            )),
            _ => upstream_err(&s.message()),
        })
}

/// The SPIFFE identities of the certificate the TLS client presented, if it presented
/// one, as its connection ([`transport::grpc::Connection`]) holds them.
fn peer_identities<T>(request: &Request<T>) -> Option<Arc<[Identity]>> {
    let connection = request
        .extensions()
        .get::<Arc<transport::grpc::Connection>>()?;
    connection.identities.clone()
}

#[tonic::async_trait]
impl IstioCertificateService for CaService {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        self.metrics.csr_count.inc();
        match self.handle(request).await {
            Ok(cert_chain) => {
                self.metrics.cert_issued.inc();
                Ok(Response::new(IstioCertificateResponse { cert_chain }))
            }
            Err(e) => {
                if matches!(e, CaError::Unauthenticated(_)) {
                    self.metrics.auth_failures.inc();
                    tracing::warn!("CSR refused: {e}");
                }
                self.metrics
                    .errors
                    .get_or_create(&vec![("reason", e.reason().to_string())])
                    .inc();
                // istiod's own counters for the same refusals.
                match e {
                    CaError::BadCsr(_)
                    | CaError::BadSignature(_)
                    | CaError::UnsupportedKey(_)
                    | CaError::TooLarge(_) => {
                        self.metrics.csr_parsing_errors.inc();
                    }
                    CaError::Upstream(_) | CaError::Internal(_) => {
                        let error = vec![("error", e.reason().to_string())];
                        self.metrics.csr_sign_errors.get_or_create(&error).inc();
                    }
                    CaError::Unauthenticated(_) | CaError::IdentityMismatch(_) => {}
                }
                Err(e.to_status())
            }
        }
    }
}
