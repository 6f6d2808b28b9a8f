//! Workload certificates for simulated proxies that connect to meshd's secure port, as
//! sidecars do in Istio: one per namespace, signed with the CA key of the meshd the run
//! started, named by the SPIFFE identity meshd checks each node against.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::h2c::Tls;
use crate::ca::material::{Material, key_to_pem};
use crate::ca::{CertTtl, CertificateAuthority, Identity, csr};

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
    let material = Material::load_dir(ca_dir)
        .map_err(|e| format!("reading meshd's CA in {}: {e}", ca_dir.display()))?
        .ok_or_else(|| format!("no CA in {}", ca_dir.display()))?;
    let ca = CertificateAuthority::new(TRUST_DOMAIN, CertTtl::default(), material);
    let roots = ca.roots_pem();
    let server_name = rustls::pki_types::ServerName::try_from(SERVER_NAME)
        .map_err(|e| e.to_string())?
        .to_owned();
    namespaces
        .iter()
        .map(|ns| {
            let key = {
                use p256::elliptic_curve::Generate;
                p256::ecdsa::SigningKey::generate()
            };
            let identity = Identity::new(TRUST_DOMAIN, ns, "default");
            let request = csr::build(&key, &identity.to_string()).map_err(|e| e.to_string())?;
            let chain = ca
                .sign_workload(&request, &identity, 24 * 3600)
                .map_err(|e| e.to_string())?
                .concat();
            let key = key_to_pem(&key).map_err(|e| e.to_string())?;
            let config = crate::tls::client_config(&roots, Some((&chain, &key)))
                .map_err(|e| e.to_string())?;
            let tls = Tls {
                connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
                server_name: server_name.clone(),
            };
            Ok((ns.clone(), tls))
        })
        .collect()
}
