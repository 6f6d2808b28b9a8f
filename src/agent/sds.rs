//! SDS for the local Envoy on a Unix socket: `default` (the workload certificate and its
//! key) and `ROOTCA` (the trust bundle), state-of-the-world, pushed again on every renewal;
//! and the files DestinationRules name, pushed again when they change on disk.

use envoy_api::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use envoy_api::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_api::pb::envoy::service::secret::v3::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};
use envoy_api::pb::google::protobuf::Any;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::certs::WorkloadCert;
use translate::tls::{
    FILE_CERT_PREFIX, FILE_PAIR_SEPARATOR, FILE_ROOT_PREFIX, ROOT_SECRET, SYSTEM_ROOTS,
    WORKLOAD_SECRET, certificate_secret, validation_secret,
};

use xds::resource::SECRET_TYPE;

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

/// The named secret, if it is one the agent serves: the workload's own (built from
/// `cert`), or one read from files in its container.
pub fn secret(name: &str, cert: &WorkloadCert) -> Option<Secret> {
    match name {
        WORKLOAD_SECRET => Some(certificate_secret(name, &cert.chain_pem, &cert.key_pem)),
        ROOT_SECRET => Some(validation_secret(name, &cert.roots_pem)),
        _ => file_secret(name),
    }
}

/// The secrets istiod names after files for DestinationRule TLS origination:
/// `file-cert:CERT~KEY` (a client certificate and its key) and `file-root:CA` (the CAs a
/// server must chain to; `file-root:system` for the system's bundle). Read when asked; a
/// file that cannot be read leaves the secret out, and Envoy waits for it.
fn file_secret(name: &str) -> Option<Secret> {
    let read = |path: &str| match std::fs::read_to_string(path) {
        Ok(text) => Some(text),
        Err(e) => {
            tracing::warn!(secret = name, "cannot read {path}: {e}");
            None
        }
    };
    let ca = match FileSecret::parse(name)? {
        FileSecret::Pair(cert, key) => {
            return Some(certificate_secret(name, &read(cert)?, &read(key)?));
        }
        FileSecret::Roots(ca) => ca,
    };
    let path = if ca == SYSTEM_ROOTS {
        let found = SYSTEM_BUNDLES
            .iter()
            .find(|p| std::path::Path::new(p).exists());
        if found.is_none() {
            tracing::warn!(secret = name, "no system CA bundle in {SYSTEM_BUNDLES:?}");
        }
        found?
    } else {
        ca
    };
    Some(validation_secret(name, &read(path)?))
}

/// What a file secret's name points at: `file-cert:CERT~KEY` or `file-root:CA` (CA may be
/// `system`).
enum FileSecret<'a> {
    Pair(&'a str, &'a str),
    Roots(&'a str),
}

impl FileSecret<'_> {
    fn parse(name: &str) -> Option<FileSecret<'_>> {
        if let Some(pair) = name.strip_prefix(FILE_CERT_PREFIX) {
            let (cert, key) = pair.split_once(FILE_PAIR_SEPARATOR)?;
            return Some(FileSecret::Pair(cert, key));
        }
        name.strip_prefix(FILE_ROOT_PREFIX).map(FileSecret::Roots)
    }
}

/// The files the named secrets are read from (their `file-cert:` and `file-root:` paths,
/// every system bundle for `file-root:system`).
fn secret_files(names: &[String]) -> Vec<String> {
    let mut files = Vec::new();
    for name in names {
        match FileSecret::parse(name) {
            Some(FileSecret::Pair(cert, key)) => files.extend([cert.to_string(), key.to_string()]),
            Some(FileSecret::Roots(SYSTEM_ROOTS)) => {
                files.extend(SYSTEM_BUNDLES.iter().map(|p| p.to_string()))
            }
            Some(FileSecret::Roots(ca)) => files.push(ca.to_string()),
            None => {}
        }
    }
    files
}

/// What the files look like now (modification time and length, or absent): when this
/// differs from what it was at the last send, the secrets are read and sent again.
fn files_stamp(files: &[String]) -> Vec<Option<(std::time::SystemTime, u64)>> {
    files
        .iter()
        .map(|f| {
            let m = std::fs::metadata(f).ok()?;
            Some((m.modified().ok()?, m.len()))
        })
        .collect()
}

/// How often a stream looks at the files its secrets come from.
const FILE_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// Where Linux distributions keep the system's CA bundle, the first found is used.
pub(crate) const SYSTEM_BUNDLES: [&str; 5] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/ssl/cert.pem",
];

fn response(names: &[String], cert: &WorkloadCert, files: u64, nonce: u64) -> DiscoveryResponse {
    let resources = names
        .iter()
        .filter_map(|n| secret(n, cert))
        .map(|s| Any {
            type_url: SECRET_TYPE.into(),
            value: s.encode_to_vec(),
        })
        .collect();
    DiscoveryResponse {
        version_info: format!("{}.{files}", cert.generation),
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
            // The files the named secrets come from, as they were when last sent, and how
            // many times they have changed since the stream began.
            let mut files: Vec<String> = Vec::new();
            let mut stamp = Vec::new();
            let mut file_changes = 0u64;
            let mut poll = tokio::time::interval(FILE_POLL);
            poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
                    _ = poll.tick(), if !files.is_empty() => {
                        if files_stamp(&files) == stamp {
                            continue;
                        }
                        file_changes += 1;
                        tracing::info!("secret files changed on disk: {files:?}");
                    }
                }
                let current = certs.borrow_and_update().clone();
                let Some(cert) = current else { continue };
                if names.is_empty() {
                    continue;
                }
                nonce += 1;
                sent = Some(cert.generation);
                files = secret_files(&names);
                stamp = files_stamp(&files);
                let answer = response(&names, &cert, file_changes, nonce);
                if tx.send(Ok(answer)).await.is_err() {
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
            0,
        )))
    }
}

#[cfg(test)]
mod tests {
    use envoy_api::pb::envoy::extensions::transport_sockets::tls::v3::secret::Type;

    use super::*;

    fn inline(d: &Option<envoy_api::pb::envoy::config::core::v3::DataSource>) -> String {
        use envoy_api::pb::envoy::config::core::v3::data_source::Specifier;
        match d.as_ref().and_then(|d| d.specifier.as_ref()) {
            Some(Specifier::InlineBytes(b)) => String::from_utf8(b.clone()).unwrap(),
            other => panic!("not inline: {other:?}"),
        }
    }

    #[test]
    fn file_secrets_are_read_from_the_files_they_name() {
        let dir = std::env::temp_dir().join(format!("meshd-sds-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = |f: &str| dir.join(f).to_str().unwrap().to_string();
        std::fs::write(path("c.pem"), "CERT").unwrap();
        std::fs::write(path("k.pem"), "KEY").unwrap();
        std::fs::write(path("ca.pem"), "ROOTS").unwrap();
        let name = format!("file-cert:{}~{}", path("c.pem"), path("k.pem"));
        match file_secret(&name).unwrap().r#type {
            Some(Type::TlsCertificate(t)) => {
                assert_eq!(inline(&t.certificate_chain), "CERT");
                assert_eq!(inline(&t.private_key), "KEY");
            }
            other => panic!("{other:?}"),
        }
        let name = format!("file-root:{}", path("ca.pem"));
        match file_secret(&name).unwrap().r#type {
            Some(Type::ValidationContext(v)) => assert_eq!(inline(&v.trusted_ca), "ROOTS"),
            other => panic!("{other:?}"),
        }
        // A missing file, a malformed name, an unknown secret: nothing to serve.
        assert!(file_secret(&format!("file-root:{}", path("gone.pem"))).is_none());
        assert!(file_secret(&format!("file-cert:{}", path("c.pem"))).is_none());
        assert!(file_secret("kubernetes://site-cert").is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
