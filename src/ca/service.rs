//! `istio.v1.auth.IstioCertificateService/CreateCertificate`: authenticate the caller,
//! verify its CSR, sign for exactly its identity. Every refusal is logged with the reason
//! and counted in `meshd_ca_errors{reason}`; nothing here panics on input.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::authn::Authenticator;
use super::{CaError, CertificateAuthority};
use crate::metrics::Metrics;

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

#[derive(Clone)]
pub struct CaService {
    ca: Arc<CertificateAuthority>,
    authn: Arc<Authenticator>,
    metrics: Arc<Metrics>,
}

impl CaService {
    pub fn new(
        ca: Arc<CertificateAuthority>,
        authn: Arc<Authenticator>,
        metrics: Arc<Metrics>,
    ) -> CaService {
        CaService { ca, authn, metrics }
    }

    pub fn into_server(self) -> IstioCertificateServiceServer<CaService> {
        IstioCertificateServiceServer::new(self).max_decoding_message_size(MAX_REQUEST_BYTES)
    }

    async fn handle(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Vec<String>, CaError> {
        let peer = peer_certs(&request);
        let identity = self
            .authn
            .authenticate(peer.as_deref(), request.metadata())
            .await?;
        let req = request.into_inner();
        let chain = self
            .ca
            .sign_workload(&req.csr, &identity, req.validity_duration)
            .map_err(|e| {
                tracing::warn!(caller = %identity, "CSR refused: {e}");
                e
            })?;
        tracing::debug!(identity = %identity, "certificate issued");
        Ok(chain)
    }
}

/// The DER certificates the TLS client presented, if any.
pub fn peer_certs<T>(request: &Request<T>) -> Option<Vec<Vec<u8>>> {
    request
        .peer_certs()
        .map(|certs| certs.iter().map(|c| c.to_vec()).collect())
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
                    self.metrics.ca_auth_failures.inc();
                    tracing::warn!("CSR refused: {e}");
                }
                self.metrics
                    .ca_errors
                    .get_or_create(&vec![("reason", e.reason().to_string())])
                    .inc();
                Err(e.to_status())
            }
        }
    }
}
