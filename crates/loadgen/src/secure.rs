//! Workload certificates for simulated proxies that connect to meshd's secure port, as
//! sidecars do in Istio: one per namespace, signed with the CA key of the meshd the run
//! started (the Istio-named files in its CA directory), named by the SPIFFE identity meshd
//! checks each node against.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use rcgen::{
    CertificateParams, DistinguishedName, ExtendedKeyUsagePurpose, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::h2c::Tls;

/// The trust domain of the meshd `loadgen` starts (meshd's default).
const TRUST_DOMAIN: &str = "cluster.local";

/// The name sidecars dial meshd by, which its serving certificate carries.
const SERVER_NAME: &str = "istiod.istio-system.svc";

/// A TLS client per namespace, presenting `spiffe://cluster.local/ns/NS/sa/default`,
/// signed by the CA in `ca_dir` and trusting its root.
pub(super) fn workload_tls(
    ca_dir: &Path,
    namespaces: &[String],
) -> Result<HashMap<String, Tls>, String> {
    let read = |name: &str| {
        let path = ca_dir.join(name);
        std::fs::read_to_string(&path).map_err(|e| format!("meshd's CA: {}: {e}", path.display()))
    };
    let (ca_cert, ca_key, chain, root) = (
        read("ca-cert.pem")?,
        read("ca-key.pem")?,
        read("cert-chain.pem")?,
        read("root-cert.pem")?,
    );
    let what = |e: &dyn std::fmt::Display| format!("meshd's CA in {}: {e}", ca_dir.display());
    let issuer_key = KeyPair::from_pem(&ca_key).map_err(|e| what(&e))?;
    let issuer = Issuer::from_ca_cert_pem(&ca_cert, issuer_key).map_err(|e| what(&e))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(root.as_bytes()) {
        roots
            .add(cert.map_err(|e| what(&e))?)
            .map_err(|e| what(&e))?;
    }
    let roots = Arc::new(roots);
    let intermediates: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(chain.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| what(&e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server_name = ServerName::try_from(SERVER_NAME)
        .map_err(|e| e.to_string())?
        .to_owned();
    namespaces
        .iter()
        .map(|ns| {
            let identity = format!("spiffe://{TRUST_DOMAIN}/ns/{ns}/sa/default");
            let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(|e| what(&e))?;
            let mut params = CertificateParams::default();
            params.distinguished_name = DistinguishedName::new();
            let uri = identity.clone().try_into().map_err(|e| what(&e))?;
            params.subject_alt_names = vec![SanType::URI(uri)];
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ClientAuth,
                ExtendedKeyUsagePurpose::ServerAuth,
            ];
            let leaf = params.signed_by(&key, &issuer).map_err(|e| what(&e))?;
            let mut certs = vec![leaf.der().clone()];
            certs.extend(intermediates.iter().cloned());
            let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes())
                .map_err(|e| what(&e))?;
            let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| what(&e))?
                .with_root_certificates(roots.clone())
                .with_client_auth_cert(certs, key)
                .map_err(|e| format!("{identity}: {e}"))?;
            config.alpn_protocols = vec![b"h2".to_vec()];
            let tls = Tls {
                connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
                server_name: server_name.clone(),
            };
            Ok((ns.clone(), tls))
        })
        .collect()
}
