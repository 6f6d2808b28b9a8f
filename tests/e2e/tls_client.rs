//! TLS clients for tests of what a server's TLS lets through: any server certificate
//! accepted, and, when narrowed, one protocol version and the cipher suites named.

use std::sync::Arc;

use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;

use crate::harness::Meshd;

/// Accepts any server certificate, checking only its signature of the handshake: an
/// Istio mTLS client's SNI (`outbound_.PORT_.SUBSET_.HOST`) is not a name in the
/// server's certificate, nor is a workload's address in its SPIFFE certificate.
#[derive(Debug)]
pub struct AcceptAnyCertificate(std::sync::Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A client presenting `identity` (chain, key PEM) if given and offering `alpn`, that
/// takes any server certificate.
pub fn unverifying_client(identity: Option<(&str, &str)>, alpn: &[&str]) -> rustls::ClientConfig {
    narrow_client(rustls::DEFAULT_VERSIONS, &[], identity, alpn)
}

/// As [`unverifying_client`], speaking only `versions` and, unless `suites` is empty, only
/// those cipher suites.
pub fn narrow_client(
    versions: &[&'static rustls::SupportedProtocolVersion],
    suites: &[rustls::CipherSuite],
    identity: Option<(&str, &str)>,
    alpn: &[&str],
) -> rustls::ClientConfig {
    let mut provider = (*transport::tls::provider()).clone();
    if !suites.is_empty() {
        provider
            .cipher_suites
            .retain(|s| suites.contains(&s.suite()));
    }
    let provider = Arc::new(provider);
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)));
    let mut config = match identity {
        Some((chain, key)) => {
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
            let chain = transport::tls::certs(chain).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|a| a.as_bytes().to_vec()).collect();
    config
}

/// A workload certificate for `namespace/service_account` from `meshd`'s own CA (read
/// from its CA directory): (chain PEM, key PEM).
pub fn mesh_certificate(meshd: &Meshd, namespace: &str, service_account: &str) -> (String, String) {
    use meshd::ca::material::{Material, key_to_pem};
    let material = Material::load_dir(&meshd.ca_dir)
        .unwrap()
        .expect("meshd's CA files");
    let trust_domain = "cluster.local";
    let ca =
        meshd::ca::CertificateAuthority::new(trust_domain, meshd::ca::CertTtl::default(), material);
    let key = {
        use p256::elliptic_curve::Generate;
        p256::ecdsa::SigningKey::generate()
    };
    let identity = meshd::ca::Identity::new(trust_domain, namespace, service_account);
    let csr = meshd::ca::csr::build(&key, &identity.to_string()).unwrap();
    let chain = ca.sign_workload(&csr, &identity, 3600).unwrap().concat();
    (chain, key_to_pem(&key).unwrap())
}
