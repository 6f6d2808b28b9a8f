//! TLS for meshd's secure port (15012): rustls configs built from the CA's current material,
//! and an accept loop that handshakes each connection on its own task (a slow or silent
//! client never holds up the others) with the config current at that moment, so a renewed
//! serving certificate or a rotated root applies to new connections without a restart.
//! Records, alerts, key updates and the key schedule are rustls's (through tokio-rustls).

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use crate::admission::{Admission, Admitted};
use crate::cork::Corked;

/// How long a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// ring's suites, AES-128-GCM first: the order Envoy's BoringSSL (and Go's crypto/tls,
/// so istiod) prefers on CPUs with AES instructions. ring's default puts AES-256-GCM
/// first, which made the simulator, offering it first, negotiate a suite a real Envoy
/// does not (meshd, like rustls's servers by default, takes the client's preference).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::CipherSuite::{TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS13_AES_128_GCM_SHA256};
    let mut p = rustls::crypto::ring::default_provider();
    let first = |s: &rustls::SupportedCipherSuite| {
        let suite = s.suite();
        !(suite == TLS13_AES_128_GCM_SHA256 || suite == TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256)
    };
    // A stable sort: AES-128-GCM moves ahead within each version, the rest keeps its order.
    p.cipher_suites.sort_by_key(|s| {
        (
            s.version().version != rustls::ProtocolVersion::TLSv1_3,
            first(s),
        )
    });
    Arc::new(p)
}

/// Why a TLS configuration could not be built from the PEM it was given.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("bad certificate PEM: {0} (expected CERTIFICATE blocks)")]
    CertificatePem(rustls::pki_types::pem::Error),
    #[error("bad key PEM: {0} (expected a PKCS#8, SEC1 or PKCS#1 private key)")]
    KeyPem(rustls::pki_types::pem::Error),
    #[error("the client certificate verifier: {0} (are the roots empty?)")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Certificates from PEM text.
pub fn certs(pem: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(TlsError::CertificatePem)
}

/// A server config presenting `chain_pem`/`key_pem`, speaking h2, that asks for a client
/// certificate and verifies it against `roots_pem` when one is sent (a first connection
/// may come with a token instead).
pub fn server_config(
    chain_pem: &str,
    key_pem: &str,
    roots_pem: &str,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certs(roots_pem)? {
        roots.add(cert)?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .allow_unauthenticated()
        .build()?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(TlsError::KeyPem)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs(chain_pem)?, key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    // Resumption as istiod's Go server offers it: one stateless ticket per handshake, sealed
    // with keys that rotate, so that a proxy reconnecting skips the signatures and meshd
    // keeps nothing per session (rustls's default keeps 256 sessions in memory, of no use
    // to a fleet of thousands).
    config.ticketer = rustls::crypto::ring::Ticketer::new()?;
    config.send_tls13_tickets = 1;
    Ok(Arc::new(config))
}

/// A client config trusting `roots_pem`, presenting `identity` (chain, key) if given.
pub fn client_config(
    roots_pem: &str,
    identity: Option<(&str, &str)>,
) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certs(roots_pem)? {
        roots.add(cert)?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((chain, key)) => {
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(TlsError::KeyPem)?;
            builder.with_client_auth_cert(certs(chain)?, key)?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The SPIFFE identities of the certificate a TLS client presented (its chain verified in
/// the handshake), if it presented one.
pub fn peer_identities(
    tls: &TlsStream<Corked<TcpStream>>,
) -> Option<Arc<[crate::identity::Identity]>> {
    let certs = tls.get_ref().1.peer_certificates()?;
    Some(crate::identity::Identity::from_certificate_der(certs.first()?).into())
}

/// A TLS connection as the accept loop yields it, with its admission ticket.
pub type Incoming = Admitted<TlsStream<Corked<TcpStream>>>;

/// Accepts TCP connections on `listener`, each once `admission` has a place for it, and
/// yields those whose TLS handshake (with the config current when they connected) succeeds.
pub fn incoming(
    listener: TcpListener,
    configs: watch::Receiver<Arc<rustls::ServerConfig>>,
    errors: HandshakeErrors,
    admission: Admission,
) -> ReceiverStream<std::io::Result<Incoming>> {
    incoming_with_alpn(listener, configs, None, errors, admission)
}

/// Where a port's failed handshakes are counted: `meshd_tls_handshake_errors{port, reason}`
/// (`reason` is `failed` or `timed_out`).
#[derive(Clone)]
pub struct HandshakeErrors {
    pub family: Family<Vec<(&'static str, String)>, Counter>,
    pub port: &'static str,
}

impl HandshakeErrors {
    fn count(&self, reason: &str) {
        let labels = vec![
            ("port", self.port.to_string()),
            ("reason", reason.to_string()),
        ];
        self.family.get_or_create(&labels).inc();
    }
}

/// [`incoming`], offering the `alpn` protocols instead of the configs' own (h2). Each
/// handshake runs on its own task, so a slow client holds up no other.
pub fn incoming_with_alpn(
    listener: TcpListener,
    configs: watch::Receiver<Arc<rustls::ServerConfig>>,
    alpn: Option<&'static [&'static [u8]]>,
    errors: HandshakeErrors,
    admission: Admission,
) -> ReceiverStream<std::io::Result<Incoming>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let reserved = admission.reserve().await;
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("secure port accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if tx.is_closed() {
                return;
            }
            // As tonic does for its own listeners: small gRPC frames must not wait for
            // Nagle's algorithm and the peer's delayed ACK (40 ms a response).
            // Large responses are still sent in full segments: see [`Corked`].
            let _ = tcp.set_nodelay(true);
            let acceptor = TlsAcceptor::from(match alpn {
                None => configs.borrow().clone(),
                Some(protocols) => {
                    let mut config = (**configs.borrow()).clone();
                    config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
                    Arc::new(config)
                }
            });
            // The handshake counts against the connection's place.
            let ticket = reserved.admit();
            let handshake = acceptor.accept(Corked::new(tcp)).into_fallible();
            let tx = tx.clone();
            let errors = errors.clone();
            tokio::spawn(async move {
                // A failed handshake is counted before its connection closes, so a client
                // that saw the close finds it counted.
                let mut handshake = std::pin::pin!(handshake);
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, &mut handshake).await {
                    Ok(Ok(io)) => {
                        let _ = tx.send(Ok(Admitted { io, ticket })).await;
                    }
                    Ok(Err((e, tcp))) => {
                        errors.count("failed");
                        tracing::info!(%peer, "TLS handshake failed: {e}");
                        drop(tcp);
                    }
                    Err(_) => {
                        errors.count("timed_out");
                        tracing::info!(%peer, "TLS handshake timed out");
                    }
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
