//! The workload CA: issues short-lived leaf certificates (for the CSR's P-256 or RSA key)
//! whose only name is a critical URI SAN `spiffe://TRUST_DOMAIN/ns/NS/sa/SA`, for
//! identities the caller has proved (see [`authn`]), over Istio's
//! `IstioCertificateService` (see [`service`]), signed with a P-256 or RSA CA key
//! ([`key`]).
//!
//! Signing material ([`material`]) is a self-signed root made on first start and persisted,
//! or plugged-in `cacerts`; the trust bundle may hold several roots while one is rotated.

pub mod authn;
pub mod csr;
pub use transport::identity;
pub mod key;
pub mod material;
pub mod metrics;
pub mod persist;
pub mod service;

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use p256::ecdsa::SigningKey;
use p256::elliptic_curve::Generate;
use prometheus_client::metrics::gauge::Gauge;
use x509_cert::builder::profile::BuilderProfile;
use x509_cert::builder::{Builder, CertificateBuilder};
use x509_cert::certificate::TbsCertificate;
use x509_cert::der::asn1::Ia5String;
use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::der::{EncodePem, pem::LineEnding};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::{
    AuthorityKeyIdentifier, BasicConstraints, ExtendedKeyUsage, KeyUsage, KeyUsages,
    SubjectAltName, SubjectKeyIdentifier,
};
use x509_cert::ext::{Extension, ToExtension};
use x509_cert::name::Name;
use x509_cert::serial_number::SerialNumber;
use x509_cert::spki::{SubjectPublicKeyInfoOwned, SubjectPublicKeyInfoRef};
use x509_cert::time::{Time, Validity};

use self::material::Material;
pub use transport::identity::Identity;

/// Why a certificate request was refused; the label is the `reason` of
/// `meshd_ca_errors{reason}`.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    #[error("malformed CSR: {0}")]
    BadCsr(String),
    #[error("bad CSR signature: {0}")]
    BadSignature(String),
    #[error("unsupported key: {0}")]
    UnsupportedKey(String),
    #[error("identity mismatch: {0}")]
    IdentityMismatch(String),
    #[error("request too large: {0}")]
    TooLarge(String),
    #[error("upstream CA: {0}")]
    Upstream(String),
    #[error("internal: {0}")]
    Internal(String),
}

impl CaError {
    pub fn reason(&self) -> &'static str {
        match self {
            CaError::Unauthenticated(_) => "unauthenticated",
            CaError::BadCsr(_) => "bad_csr",
            CaError::BadSignature(_) => "bad_signature",
            CaError::UnsupportedKey(_) => "unsupported_key",
            CaError::IdentityMismatch(_) => "identity_mismatch",
            CaError::TooLarge(_) => "too_large",
            CaError::Upstream(_) => "upstream",
            CaError::Internal(_) => "internal",
        }
    }

    pub fn to_status(&self) -> tonic::Status {
        let message = self.to_string();
        match self {
            CaError::Unauthenticated(_) => tonic::Status::unauthenticated(message),
            CaError::IdentityMismatch(_) => tonic::Status::permission_denied(message),
            CaError::TooLarge(_) => tonic::Status::resource_exhausted(message),
            CaError::Upstream(_) => tonic::Status::unavailable(message),
            CaError::Internal(_) => tonic::Status::internal(message),
            _ => tonic::Status::invalid_argument(message),
        }
    }
}

/// Lifetimes of issued certificates.
#[derive(Clone, Copy, Debug)]
pub struct CertTtl {
    /// Used when the request asks for 0 or less (`DEFAULT_WORKLOAD_CERT_TTL`, 24h).
    pub default: Duration,
    /// No certificate lives longer (`MAX_WORKLOAD_CERT_TTL`, 90d).
    pub max: Duration,
}

impl Default for CertTtl {
    fn default() -> CertTtl {
        CertTtl {
            default: Duration::from_secs(24 * 3600),
            max: Duration::from_secs(90 * 24 * 3600),
        }
    }
}

/// Certificates are valid from a little before they are issued, for clock skew.
const BACKDATE: Duration = Duration::from_secs(60);

/// A signing CA.
pub struct CertificateAuthority {
    pub trust_domain: String,
    pub ttl: CertTtl,
    material: RwLock<Arc<Material>>,
    /// `citadel_server_root_cert_expiry_timestamp` and
    /// `citadel_server_cert_chain_expiry_timestamp`, kept current with the material.
    expiry: std::sync::OnceLock<(Gauge, Gauge)>,
}

impl CertificateAuthority {
    pub fn new(trust_domain: &str, ttl: CertTtl, material: Material) -> CertificateAuthority {
        CertificateAuthority {
            trust_domain: trust_domain.to_string(),
            ttl,
            material: RwLock::new(Arc::new(material)),
            expiry: std::sync::OnceLock::new(),
        }
    }

    /// Reports when the root and the signing certificate expire in `root` and `chain`
    /// (Unix seconds), now and whenever the material is replaced.
    pub fn report_expiry(&self, root: Gauge, chain: Gauge) {
        if self.expiry.set((root, chain)).is_ok() {
            self.update_expiry(&self.material());
        }
    }

    fn update_expiry(&self, m: &Material) {
        let Some((root, chain)) = self.expiry.get() else {
            return;
        };
        use crate::metrics::unix_seconds;
        root.set(m.root_not_after().map_or(0, unix_seconds));
        chain.set(unix_seconds(m.not_after()));
    }

    pub fn material(&self) -> Arc<Material> {
        self.material.read().unwrap().clone()
    }

    pub fn replace_material(&self, material: Material) {
        self.update_expiry(&material);
        *self.material.write().unwrap() = Arc::new(material);
    }

    /// The PEM trust bundle (every root currently trusted).
    pub fn roots_pem(&self) -> String {
        self.material().roots_pem.concat()
    }

    /// The lifetime granted for a request of `requested` seconds.
    pub fn granted_ttl(&self, requested: i64) -> Duration {
        if requested <= 0 {
            return self.ttl.default.min(self.ttl.max);
        }
        Duration::from_secs(requested as u64).min(self.ttl.max)
    }

    /// Signs a verified CSR for `identity`; every URI the CSR asks for must be that
    /// identity. Returns the chain: leaf first, root last.
    pub fn sign_workload(
        &self,
        csr_pem: &str,
        identity: &Identity,
        requested_ttl: i64,
    ) -> Result<Vec<String>, CaError> {
        let csr = csr::verify_for(csr_pem, identity)?;
        let wanted = identity.to_string();
        let ttl = self.granted_ttl(requested_ttl);
        let names = vec![GeneralName::UniformResourceIdentifier(
            Ia5String::new(&wanted).map_err(|e| CaError::Internal(e.to_string()))?,
        )];
        let material = self.material();
        let leaf = material.issue(csr.public_key, names, ttl, Usage::Workload)?;
        Ok(material.chain_with(leaf))
    }

    /// A serving certificate for meshd's own TLS ports (15012), for `dns_names`, with a
    /// fresh key: (chain PEM, PKCS#8 key PEM).
    pub fn issue_server_certificate(
        &self,
        dns_names: &[String],
        ttl: Duration,
    ) -> Result<(String, String), CaError> {
        let key = SigningKey::generate();
        let spki = SubjectPublicKeyInfoOwned::from_key(key.verifying_key())
            .map_err(|e| CaError::Internal(e.to_string()))?;
        let mut names = Vec::new();
        for dns in dns_names {
            if let Ok(ip) = dns.parse::<std::net::IpAddr>() {
                names.push(GeneralName::from(ip));
            } else {
                names.push(GeneralName::DnsName(
                    Ia5String::new(dns).map_err(|e| CaError::Internal(e.to_string()))?,
                ));
            }
        }
        let material = self.material();
        let leaf = material.issue(spki, names, ttl, Usage::Server)?;
        let key_pem = material::key_to_pem(&key)?;
        Ok((material.chain_with(leaf).concat(), key_pem))
    }
}

/// What an issued certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Usage {
    /// A workload: client and server auth, named only by its SPIFFE URI.
    Workload,
    /// meshd's own serving certificate.
    Server,
    /// A CA certificate (the self-signed root).
    Root,
}

/// The builder profile for every certificate meshd makes.
struct Profile {
    issuer: Name,
    subject: Name,
    names: Vec<GeneralName>,
    usage: Usage,
}

impl BuilderProfile for Profile {
    fn get_issuer(&self, _subject: &Name) -> Name {
        self.issuer.clone()
    }

    fn get_subject(&self) -> Name {
        self.subject.clone()
    }

    fn build_extensions(
        &self,
        spk: SubjectPublicKeyInfoRef<'_>,
        issuer_spk: SubjectPublicKeyInfoRef<'_>,
        tbs: &TbsCertificate,
    ) -> x509_cert::builder::Result<Vec<Extension>> {
        let subject = tbs.subject();
        let mut out: Vec<Extension> = Vec::new();
        let critical = |mut e: Extension| {
            e.critical = true;
            e
        };
        match self.usage {
            Usage::Root => {
                out.push(critical(
                    BasicConstraints {
                        ca: true,
                        path_len_constraint: None,
                    }
                    .to_extension(subject, &out)?,
                ));
                out.push(critical(
                    KeyUsage(KeyUsages::KeyCertSign | KeyUsages::CRLSign)
                        .to_extension(subject, &out)?,
                ));
                out.push(SubjectKeyIdentifier::try_from(spk)?.to_extension(subject, &out)?);
            }
            Usage::Workload | Usage::Server => {
                out.push(critical(
                    BasicConstraints {
                        ca: false,
                        path_len_constraint: None,
                    }
                    .to_extension(subject, &out)?,
                ));
                out.push(critical(
                    KeyUsage(KeyUsages::DigitalSignature | KeyUsages::KeyEncipherment)
                        .to_extension(subject, &out)?,
                ));
                let mut eku = vec![SERVER_AUTH];
                if self.usage == Usage::Workload {
                    eku.push(CLIENT_AUTH);
                }
                out.push(ExtendedKeyUsage(eku).to_extension(subject, &out)?);
                let aki = AuthorityKeyIdentifier::try_from(issuer_spk)?;
                out.push(aki.to_extension(subject, &out)?);
                // Critical because the subject is empty (RFC 5280 4.2.1.6).
                let san = SubjectAltName(self.names.clone()).to_extension(subject, &out)?;
                out.push(critical(san));
            }
        }
        Ok(out)
    }
}

/// id-kp-serverAuth and id-kp-clientAuth (RFC 5280).
const SERVER_AUTH: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.1");
const CLIENT_AUTH: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.2");

fn random_serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("BUG: the OS has no random source");
    bytes[0] &= 0x7f; // positive
    bytes[0] |= 0x01; // and of full length
    SerialNumber::new(&bytes).expect("BUG: a 16-byte positive serial is valid")
}

fn validity(ttl: Duration) -> Result<Validity, CaError> {
    let now = SystemTime::now();
    let not_before =
        Time::try_from(now - BACKDATE).map_err(|e| CaError::Internal(e.to_string()))?;
    let not_after = Time::try_from(now + ttl).map_err(|e| CaError::Internal(e.to_string()))?;
    Ok(Validity::new(not_before, not_after))
}

/// PEM of one DER certificate.
fn cert_pem(cert: &x509_cert::Certificate) -> Result<String, CaError> {
    cert.to_pem(LineEnding::LF)
        .map_err(|e| CaError::Internal(e.to_string()))
}

fn build(
    profile: Profile,
    spki: SubjectPublicKeyInfoOwned,
    ttl: Duration,
    signer: &key::CaKey,
) -> Result<x509_cert::Certificate, CaError> {
    let builder = CertificateBuilder::new(profile, random_serial(), validity(ttl)?, spki)
        .map_err(|e| CaError::Internal(e.to_string()))?;
    builder
        .build::<_, key::CaSignature>(signer)
        .map_err(|e| CaError::Internal(e.to_string()))
}

/// The expiry of the first certificate in base64 (as proto3 JSON carries bytes) of PEM
/// text, RFC 3339; `None` if it is not one.
pub fn not_after_of_base64_pem(b64: &str) -> Option<String> {
    use base64::Engine;
    let pem = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let chain = x509_cert::Certificate::load_pem_chain(&pem).ok()?;
    let first = chain.first()?;
    Some(
        first
            .tbs_certificate()
            .validity()
            .not_after
            .to_date_time()
            .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::signature::Verifier;
    use p256::ecdsa::{DerSignature, VerifyingKey};
    use x509_cert::Certificate;
    use x509_cert::der::{DecodePem, Encode};

    fn ca() -> CertificateAuthority {
        let material = Material::self_signed("cluster.local", Duration::from_secs(3600)).unwrap();
        CertificateAuthority::new("cluster.local", CertTtl::default(), material)
    }

    fn shop() -> Identity {
        Identity::new("cluster.local", "shop", "reviews")
    }

    /// Checks that `cert` is signed by `issuer`'s key.
    fn signed_by(cert: &Certificate, issuer: &Certificate) -> bool {
        let spki = issuer.tbs_certificate().subject_public_key_info();
        let key = VerifyingKey::from_sec1_bytes(spki.subject_public_key.raw_bytes()).unwrap();
        let sig = DerSignature::from_bytes(cert.signature().raw_bytes()).unwrap();
        key.verify(&cert.tbs_certificate().to_der().unwrap(), &sig)
            .is_ok()
    }

    #[test]
    fn a_workload_certificate_carries_only_a_critical_spiffe_uri_and_chains_to_the_root() {
        let ca = ca();
        let key = SigningKey::generate();
        let csr = csr::build(&key, &shop().to_string()).unwrap();
        let chain = ca.sign_workload(&csr, &shop(), 600).unwrap();
        assert_eq!(chain.len(), 2, "leaf and root");
        let leaf = Certificate::from_pem(chain[0].as_bytes()).unwrap();
        let root = Certificate::from_pem(chain[1].as_bytes()).unwrap();
        assert_eq!(chain[1], ca.roots_pem());
        assert!(signed_by(&leaf, &root) && signed_by(&root, &root));
        let tbs = leaf.tbs_certificate();
        assert!(tbs.subject().is_empty(), "empty subject");
        assert_eq!(
            identity::uri_sans(&leaf),
            vec!["spiffe://cluster.local/ns/shop/sa/reviews"]
        );
        let (critical, _) = tbs
            .get_extension::<SubjectAltName>()
            .unwrap()
            .expect("a SAN");
        assert!(critical, "the SAN is critical");
        // The leaf holds the CSR's key, not one the CA made.
        let expected = SubjectPublicKeyInfoOwned::from_key(key.verifying_key()).unwrap();
        assert_eq!(*tbs.subject_public_key_info(), expected);
        let v = tbs.validity();
        let lifetime = SystemTime::from(v.not_after)
            .duration_since(SystemTime::from(v.not_before))
            .unwrap();
        assert_eq!(lifetime, Duration::from_secs(600) + BACKDATE);
    }

    #[test]
    fn requested_lifetimes_are_defaulted_and_capped() {
        let ca = CertificateAuthority {
            ttl: CertTtl {
                default: Duration::from_secs(100),
                max: Duration::from_secs(1000),
            },
            ..ca()
        };
        assert_eq!(ca.granted_ttl(0), Duration::from_secs(100));
        assert_eq!(ca.granted_ttl(-5), Duration::from_secs(100));
        assert_eq!(ca.granted_ttl(500), Duration::from_secs(500));
        assert_eq!(ca.granted_ttl(5000), Duration::from_secs(1000));
    }

    #[test]
    fn forged_malformed_and_foreign_csrs_are_refused_with_their_reason() {
        let ca = ca();
        let key = SigningKey::generate();
        // Someone else's identity.
        let other = csr::build(&key, "spiffe://cluster.local/ns/bank/sa/teller").unwrap();
        let e = ca.sign_workload(&other, &shop(), 0).unwrap_err();
        assert_eq!(e.reason(), "identity_mismatch", "{e}");
        assert!(e.to_string().contains("ns/bank/sa/teller"), "{e}");
        // A signature that does not match the key: swap in another CSR's signature.
        let good = csr::build(&key, &shop().to_string()).unwrap();
        let mut req = x509_cert::request::CertReq::from_pem(good.as_bytes()).unwrap();
        let forged_by = csr::build(&SigningKey::generate(), &shop().to_string()).unwrap();
        req.signature = x509_cert::request::CertReq::from_pem(forged_by.as_bytes())
            .unwrap()
            .signature;
        let forged = x509_cert::der::EncodePem::to_pem(&req, LineEnding::LF).unwrap();
        let e = ca.sign_workload(&forged, &shop(), 0).unwrap_err();
        assert_eq!(e.reason(), "bad_signature", "{e}");
        // Not a CSR at all, truncated, or oversized.
        for (text, reason) in [
            ("hello".to_string(), "bad_csr"),
            (good[..good.len() / 2].to_string(), "bad_csr"),
            ("A".repeat(csr::MAX_CSR_BYTES + 1), "too_large"),
        ] {
            let e = ca.sign_workload(&text, &shop(), 0).unwrap_err();
            assert_eq!(e.reason(), reason, "{e}");
        }
        // A CSR with no SAN is issued for the caller's identity.
        let bare = {
            let builder = x509_cert::request::RequestBuilder::new(Name::default()).unwrap();
            let req = builder.build::<_, DerSignature>(&key).unwrap();
            x509_cert::der::EncodePem::to_pem(&req, LineEnding::LF).unwrap()
        };
        let chain = ca.sign_workload(&bare, &shop(), 0).unwrap();
        let leaf = Certificate::from_pem(chain[0].as_bytes()).unwrap();
        assert_eq!(
            Identity::from_certificate_der(&leaf.to_der().unwrap()),
            vec![shop()]
        );
    }

    #[test]
    fn material_survives_a_round_trip_through_istio_named_files_and_rotation_keeps_both_roots() {
        let dir = std::env::temp_dir().join(format!("meshd-ca-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(Material::load_dir(&dir).unwrap().is_none());
        let first = Material::self_signed("cluster.local", Duration::from_secs(3600)).unwrap();
        first.save_dir(&dir).unwrap();
        let loaded = Material::load_dir(&dir).unwrap().unwrap();
        assert_eq!(loaded.roots_pem, first.roots_pem);
        assert!(loaded.self_signed);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("ca-key.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        // A leaf issued before rotation verifies against the new root too (same key).
        let ca = CertificateAuthority::new("cluster.local", CertTtl::default(), loaded);
        let key = SigningKey::generate();
        let chain = ca
            .sign_workload(&csr::build(&key, &shop().to_string()).unwrap(), &shop(), 0)
            .unwrap();
        let rotated = ca
            .material()
            .rotated("cluster.local", Duration::from_secs(7200))
            .unwrap();
        assert_eq!(rotated.roots_pem.len(), 2, "new root first, old kept");
        assert_eq!(rotated.roots_pem[1], first.roots_pem[0]);
        let new_root = Certificate::from_pem(rotated.roots_pem[0].as_bytes()).unwrap();
        let old_leaf = Certificate::from_pem(chain[0].as_bytes()).unwrap();
        assert!(signed_by(&old_leaf, &new_root));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
