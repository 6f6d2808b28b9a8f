//! SDS for the local Envoy on a Unix socket: `default` (the workload certificate and its
//! key) and `ROOTCA` (the trust bundle), state-of-the-world, pushed again on every renewal.

use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::secret::v3::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::certs::WorkloadCert;
use crate::translate::tls::{ROOT_SECRET, WORKLOAD_SECRET, certificate_secret, validation_secret};

use crate::xds::resource::SECRET_TYPE;

#[derive(Clone)]
pub struct Sds {
    certs: watch::Receiver<Option<WorkloadCert>>,
}

impl Sds {
    pub fn new(certs: watch::Receiver<Option<WorkloadCert>>) -> Sds {
        Sds { certs }
    }

    pub fn into_server(self) -> SecretDiscoveryServiceServer<Sds> {
        SecretDiscoveryServiceServer::new(self)
    }
}

/// The named secret built from `cert`, if it is one the agent serves.
pub fn secret(name: &str, cert: &WorkloadCert) -> Option<Secret> {
    match name {
        WORKLOAD_SECRET => Some(certificate_secret(name, &cert.chain_pem, &cert.key_pem)),
        ROOT_SECRET => Some(validation_secret(name, &cert.roots_pem)),
        _ => None,
    }
}

fn response(names: &[String], cert: &WorkloadCert, nonce: u64) -> DiscoveryResponse {
    let resources = names
        .iter()
        .filter_map(|n| secret(n, cert))
        .map(|s| Any {
            type_url: SECRET_TYPE.into(),
            value: s.encode_to_vec(),
        })
        .collect();
    DiscoveryResponse {
        version_info: cert.generation.to_string(),
        resources,
        type_url: SECRET_TYPE.into(),
        nonce: nonce.to_string(),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl SecretDiscoveryService for Sds {
    type StreamSecretsStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaSecretsStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_secrets(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamSecretsStream>, Status> {
        let mut requests = request.into_inner();
        let mut certs = self.certs.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut names: Vec<String> = Vec::new();
            let mut nonce = 0u64;
            // The generation last sent on this stream.
            let mut sent: Option<u64> = None;
            loop {
                tokio::select! {
                    req = requests.message() => {
                        let Ok(Some(req)) = req else { return };
                        if let Some(e) = &req.error_detail {
                            tracing::warn!("Envoy rejected secrets {:?}: {}", req.resource_names, e.message);
                        }
                        let changed = req.resource_names != names;
                        names = req.resource_names;
                        if !changed && sent.is_some() {
                            continue; // an ACK (or NACK) of what was sent
                        }
                    }
                    c = certs.changed() => if c.is_err() { return },
                }
                let current = certs.borrow_and_update().clone();
                let Some(cert) = current else { continue };
                if names.is_empty() {
                    continue;
                }
                nonce += 1;
                sent = Some(cert.generation);
                if tx.send(Ok(response(&names, &cert, nonce))).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn delta_secrets(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaSecretsStream>, Status> {
        Err(Status::unimplemented(
            "the agent serves SDS as state of the world (api_type GRPC)",
        ))
    }

    async fn fetch_secrets(
        &self,
        request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        let current = self.certs.borrow().clone();
        let cert = current.ok_or_else(|| Status::unavailable("no certificate yet"))?;
        Ok(Response::new(response(
            &request.into_inner().resource_names,
            &cert,
            0,
        )))
    }
}
