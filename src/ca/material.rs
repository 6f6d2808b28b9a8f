//! The CA's signing key and certificates, and where they are kept.
//!
//! Files and Secret keys use Istio's names, so existing `cacerts` Secrets and
//! `istio-ca-secret` carry over: `ca-cert.pem` (the signing certificate), `ca-key.pem`,
//! `cert-chain.pem` (signing certificate and intermediates), `root-cert.pem` (the trust
//! bundle; during a root rotation it holds the new root and the old one).

use std::path::Path;
use std::time::{Duration, SystemTime};

use p256::ecdsa::SigningKey;
use p256::pkcs8::EncodePrivateKey;
use x509_cert::Certificate;
use x509_cert::der::{DecodePem, pem::LineEnding};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::name::Name;
use x509_cert::spki::SubjectPublicKeyInfoOwned;

use super::key::CaKey;
use super::{CaError, Profile, Usage, build, cert_pem};

/// Signing material.
pub struct Material {
    key: CaKey,
    /// The signing certificate.
    cert: Certificate,
    /// The signing certificate and any intermediates, PEM, leaf-most first.
    chain_pem: Vec<String>,
    /// Every trusted root, PEM; the first is the current one.
    pub roots_pem: Vec<String>,
    /// Made by meshd (and so rotated by it), not plugged in.
    pub self_signed: bool,
}

/// The four Istio-named PEM entries.
pub struct Files {
    pub ca_cert: String,
    pub ca_key: String,
    pub cert_chain: String,
    pub root_cert: String,
}

impl Material {
    /// A new self-signed root (`O=TRUST_DOMAIN`, as istiod names it), valid for `ttl`.
    pub fn self_signed(trust_domain: &str, ttl: Duration) -> Result<Material, CaError> {
        Material::self_signed_with(CaKey::generate(), trust_domain, ttl, Vec::new())
    }

    fn self_signed_with(
        key: CaKey,
        trust_domain: &str,
        ttl: Duration,
        older_roots: Vec<String>,
    ) -> Result<Material, CaError> {
        let cert = ca_certificate(&key, trust_domain, None, ttl)?;
        let pem = cert_pem(&cert)?;
        let mut roots_pem = vec![pem.clone()];
        roots_pem.extend(older_roots);
        Ok(Material {
            key,
            cert,
            chain_pem: vec![pem],
            roots_pem,
            self_signed: true,
        })
    }

    /// A new root certificate for the same key and subject, valid for `ttl`; the old root
    /// stays trusted until it expires. Certificates issued under either verify against
    /// both, because the key is the same (as istiod's self-signed root rotation does).
    pub fn rotated(&self, trust_domain: &str, ttl: Duration) -> Result<Material, CaError> {
        let now = SystemTime::now();
        let still_valid: Vec<String> = self
            .roots_pem
            .iter()
            .filter(|pem| {
                Certificate::from_pem(pem.as_bytes())
                    .is_ok_and(|c| SystemTime::from(c.tbs_certificate().validity().not_after) > now)
            })
            .cloned()
            .collect();
        Material::self_signed_with(self.key.clone(), trust_domain, ttl, still_valid)
    }

    /// A new intermediate CA signed by this material, as Istio-named files ready to be
    /// plugged in elsewhere (`cacerts`): its certificate and key, the chain up to and
    /// including this root, and the root.
    pub fn issue_intermediate(&self, organization: &str, ttl: Duration) -> Result<Files, CaError> {
        let key = CaKey::generate();
        let issuer = (self.cert.tbs_certificate().subject(), &self.key);
        let cert = ca_certificate(&key, organization, Some(issuer), ttl)?;
        let pem = cert_pem(&cert)?;
        let mut chain = vec![pem.clone()];
        chain.extend(self.chain_pem.iter().cloned());
        Ok(Files {
            ca_cert: pem,
            ca_key: key.to_pem()?,
            cert_chain: chain.concat(),
            root_cert: self.roots_pem.concat(),
        })
    }

    /// When the current signing certificate stops being valid.
    pub fn not_after(&self) -> SystemTime {
        SystemTime::from(self.cert.tbs_certificate().validity().not_after)
    }

    /// When the current root (the first trusted one) stops being valid, if it parses.
    pub fn root_not_after(&self) -> Option<SystemTime> {
        let root = Certificate::from_pem(self.roots_pem.first()?.trim().as_bytes()).ok()?;
        Some(SystemTime::from(
            root.tbs_certificate().validity().not_after,
        ))
    }

    /// When the current signing certificate became valid.
    pub fn not_before(&self) -> SystemTime {
        SystemTime::from(self.cert.tbs_certificate().validity().not_before)
    }

    /// Material from Istio-named PEM entries (a `cacerts` Secret, `istio-ca-secret`, or a
    /// directory). `root-cert.pem` defaults to `ca-cert.pem` (a self-signed root), and
    /// `cert-chain.pem` to `ca-cert.pem`.
    pub fn from_files(files: &Files) -> Result<Material, CaError> {
        let bad = |what: &str, e: &dyn std::fmt::Display| CaError::Internal(format!("{what}: {e}"));
        let key = CaKey::from_pem(&files.ca_key)?;
        let cert = Certificate::from_pem(files.ca_cert.trim().as_bytes())
            .map_err(|e| bad("ca-cert.pem", &e))?;
        let cert_spki = cert.tbs_certificate().subject_public_key_info();
        if *cert_spki != key.spki()? {
            return Err(CaError::Internal(
                "ca-key.pem is not the key of ca-cert.pem".into(),
            ));
        }
        let split = |text: &str, what: &str| -> Result<Vec<String>, CaError> {
            let certs = Certificate::load_pem_chain(text.as_bytes()).map_err(|e| bad(what, &e))?;
            certs.iter().map(cert_pem).collect()
        };
        let chain_pem = if files.cert_chain.trim().is_empty() {
            vec![cert_pem(&cert)?]
        } else {
            split(&files.cert_chain, "cert-chain.pem")?
        };
        let roots_pem = if files.root_cert.trim().is_empty() {
            vec![cert_pem(&cert)?]
        } else {
            split(&files.root_cert, "root-cert.pem")?
        };
        let self_signed = cert.tbs_certificate().issuer() == cert.tbs_certificate().subject()
            && roots_pem.first() == chain_pem.first();
        Ok(Material {
            key,
            cert,
            chain_pem,
            roots_pem,
            self_signed,
        })
    }

    pub fn to_files(&self) -> Result<Files, CaError> {
        Ok(Files {
            ca_cert: cert_pem(&self.cert)?,
            ca_key: self.key.to_pem()?,
            cert_chain: self.chain_pem.concat(),
            root_cert: self.roots_pem.concat(),
        })
    }

    /// Reads a directory of Istio-named files; `Ok(None)` if it holds no `ca-key.pem`.
    pub fn load_dir(dir: &Path) -> Result<Option<Material>, CaError> {
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        if !dir.join("ca-key.pem").exists() {
            return Ok(None);
        }
        Material::from_files(&Files {
            ca_cert: read("ca-cert.pem"),
            ca_key: read("ca-key.pem"),
            cert_chain: read("cert-chain.pem"),
            root_cert: read("root-cert.pem"),
        })
        .map(Some)
        .map_err(|e| CaError::Internal(format!("{}: {e}", dir.display())))
    }

    /// Writes the Istio-named files; the key is readable by its owner only.
    pub fn save_dir(&self, dir: &Path) -> Result<(), CaError> {
        use std::os::unix::fs::OpenOptionsExt;
        let io = |e: std::io::Error| CaError::Internal(format!("{}: {e}", dir.display()));
        std::fs::create_dir_all(dir).map_err(io)?;
        let files = self.to_files()?;
        for (name, text, mode) in [
            ("ca-cert.pem", &files.ca_cert, 0o644),
            ("ca-key.pem", &files.ca_key, 0o600),
            ("cert-chain.pem", &files.cert_chain, 0o644),
            ("root-cert.pem", &files.root_cert, 0o644),
        ] {
            let tmp = dir.join(format!(".{name}.tmp"));
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(mode)
                .open(&tmp)
                .map_err(io)?;
            std::io::Write::write_all(&mut f, text.as_bytes()).map_err(io)?;
            std::fs::rename(&tmp, dir.join(name)).map_err(io)?;
        }
        Ok(())
    }

    /// Issues a certificate for `spki` signed by this material. Its lifetime never
    /// outlasts the signing certificate.
    pub(super) fn issue(
        &self,
        spki: SubjectPublicKeyInfoOwned,
        names: Vec<GeneralName>,
        ttl: Duration,
        usage: Usage,
    ) -> Result<Certificate, CaError> {
        let left = self
            .not_after()
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        let profile = Profile {
            issuer: self.cert.tbs_certificate().subject().clone(),
            subject: Name::default(),
            names,
            usage,
        };
        build(profile, spki, ttl.min(left), &self.key)
    }

    /// `leaf` followed by the signing chain and the root: what a workload is handed.
    pub(super) fn chain_with(&self, leaf: Certificate) -> Vec<String> {
        let mut out = vec![cert_pem(&leaf).unwrap_or_default()];
        out.extend(self.chain_pem.iter().cloned());
        if let Some(root) = self.roots_pem.first()
            && out.last() != Some(root)
        {
            out.push(root.clone());
        }
        out
    }
}

/// A CA certificate `O=ORGANIZATION` for `key`, signed by `issuer` (name and key), or
/// self-signed.
fn ca_certificate(
    key: &CaKey,
    organization: &str,
    issuer: Option<(&Name, &CaKey)>,
    ttl: Duration,
) -> Result<Certificate, CaError> {
    let subject: Name = format!("O={organization}")
        .parse()
        .map_err(|e| CaError::Internal(format!("CA subject: {e}")))?;
    let spki = key.spki()?;
    let (issuer_name, signer) = issuer.unwrap_or((&subject, key));
    let profile = Profile {
        issuer: issuer_name.clone(),
        subject: subject.clone(),
        names: Vec::new(),
        usage: Usage::Root,
    };
    build(profile, spki, ttl, signer)
}

/// A P-256 key (a workload's or meshd's own) as PKCS#8 PEM.
pub fn key_to_pem(key: &SigningKey) -> Result<String, CaError> {
    key.to_pkcs8_pem(LineEnding::LF)
        .map(|p| p.to_string())
        .map_err(|e| CaError::Internal(e.to_string()))
}
