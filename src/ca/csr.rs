//! Certificate signing requests: parsed from PEM, their signature verified, their key and
//! requested identities read. Everything here treats the input as hostile.

use p256::ecdsa::{DerSignature, VerifyingKey};
use x509_cert::der::oid::{AssociatedOid, ObjectIdentifier};
use x509_cert::der::referenced::OwnedToRef;
use x509_cert::der::{Decode, DecodePem, Encode};
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::request::{CertReq, ExtensionReq};
use x509_cert::spki::SubjectPublicKeyInfoOwned;

use super::CaError;

/// The largest CSR accepted, in bytes of PEM (a P-256 CSR with one SAN is under 600).
pub const MAX_CSR_BYTES: usize = 8 * 1024;

const ECDSA_WITH_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.2");
const SHA256_WITH_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.11");
const RSA_ENCRYPTION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");

/// A CSR whose signature has been checked.
#[derive(Debug)]
pub struct VerifiedCsr {
    pub public_key: SubjectPublicKeyInfoOwned,
    /// The URI SANs the requester asked for (may be empty).
    pub uris: Vec<String>,
    /// Any other SAN kind asked for (DNS, IP, email): meshd never grants them.
    pub other_names: usize,
}

/// Parses `pem` and checks that it is a PKCS#10 request signed by the key it carries: a
/// P-256 key with ECDSA and SHA-256 (meshd's agent, pilot-agent with
/// `ECC_SIGNATURE_ALGORITHM=ECDSA`), or an RSA key of 2048 to 8192 bits with PKCS#1 v1.5
/// and SHA-256 (pilot-agent's default), as istiod accepts both.
pub fn verify(pem: &str) -> Result<VerifiedCsr, CaError> {
    if pem.len() > MAX_CSR_BYTES {
        return Err(CaError::TooLarge(format!(
            "the CSR is {} bytes; the limit is {MAX_CSR_BYTES}",
            pem.len()
        )));
    }
    let req = CertReq::from_pem(pem.trim().as_bytes())
        .map_err(|e| CaError::BadCsr(format!("not a PEM PKCS#10 request: {e}")))?;
    let algorithm: &'static dyn ring::signature::VerificationAlgorithm = match req.algorithm.oid {
        ECDSA_WITH_SHA256 => {
            // The key must be a P-256 point (this also checks the SPKI's curve).
            VerifyingKey::try_from(req.info.public_key.owned_to_ref()).map_err(|e| {
                CaError::UnsupportedKey(format!("the CSR's key is not an ECDSA P-256 key: {e}"))
            })?;
            // ring's P-256 verification is about three times faster than the pure-Rust one
            // and is already linked for TLS; the signature is the CA's largest cost per
            // request.
            &ring::signature::ECDSA_P256_SHA256_ASN1
        }
        SHA256_WITH_RSA => {
            if req.info.public_key.algorithm.oid != RSA_ENCRYPTION {
                return Err(CaError::UnsupportedKey(format!(
                    "a sha256WithRSAEncryption signature with a {} key",
                    req.info.public_key.algorithm.oid
                )));
            }
            // Also refuses keys under 2048 bits, as a signature that does not verify.
            &ring::signature::RSA_PKCS1_2048_8192_SHA256
        }
        other => {
            return Err(CaError::UnsupportedKey(format!(
                "signature algorithm {other} is neither ecdsa-with-SHA256 nor \
                 sha256WithRSAEncryption"
            )));
        }
    };
    let signature = req
        .signature
        .as_bytes()
        .ok_or_else(|| CaError::BadSignature("the CSR's signature is malformed".into()))?;
    let info = req
        .info
        .to_der()
        .map_err(|e| CaError::BadCsr(format!("cannot re-encode the request: {e}")))?;
    // The SPKI's bits: the P-256 point, or the RSAPublicKey DER ring expects.
    let key = req.info.public_key.subject_public_key.raw_bytes();
    ring::signature::UnparsedPublicKey::new(algorithm, key)
        .verify(&info, signature)
        .map_err(|_| {
            CaError::BadSignature(
                "the CSR's signature does not match its key (or the RSA key is under 2048 bits)"
                    .into(),
            )
        })?;

    let mut uris = Vec::new();
    let mut other_names = 0;
    for attribute in req.info.attributes.iter() {
        if attribute.oid != ExtensionReq::OID {
            continue;
        }
        for value in attribute.values.iter() {
            let der = value
                .to_der()
                .map_err(|e| CaError::BadCsr(format!("extension request: {e}")))?;
            let extensions = ExtensionReq::from_der(&der)
                .map_err(|e| CaError::BadCsr(format!("extension request: {e}")))?;
            for ext in extensions.0 {
                if ext.extn_id != SubjectAltName::OID {
                    continue;
                }
                let san = SubjectAltName::from_der(ext.extn_value.as_bytes())
                    .map_err(|e| CaError::BadCsr(format!("subjectAltName: {e}")))?;
                for name in san.0 {
                    match name {
                        GeneralName::UniformResourceIdentifier(uri) => uris.push(uri.to_string()),
                        _ => other_names += 1,
                    }
                }
            }
        }
    }
    Ok(VerifiedCsr {
        public_key: req.info.public_key,
        uris,
        other_names,
    })
}

/// [`verify`], and that the CSR asks for no name but `identity` (it may ask for none).
pub fn verify_for(pem: &str, identity: &super::Identity) -> Result<VerifiedCsr, CaError> {
    let csr = verify(pem)?;
    let wanted = identity.to_string();
    if let Some(other) = csr.uris.iter().find(|u| **u != wanted) {
        return Err(CaError::IdentityMismatch(format!(
            "the CSR asks for {other} but the caller is {wanted}"
        )));
    }
    if csr.other_names > 0 {
        return Err(CaError::IdentityMismatch(format!(
            "the CSR asks for {} non-SPIFFE names; workload certificates carry only {wanted}",
            csr.other_names
        )));
    }
    Ok(csr)
}

/// A CSR for `uri` (a SPIFFE id) signed by `key`, PEM: what an agent sends.
pub fn build(key: &p256::ecdsa::SigningKey, uri: &str) -> Result<String, CaError> {
    use x509_cert::builder::Builder;
    use x509_cert::der::EncodePem;
    use x509_cert::der::asn1::Ia5String;
    use x509_cert::request::RequestBuilder;
    let internal = |e: &dyn std::fmt::Display| CaError::Internal(e.to_string());
    let mut builder =
        RequestBuilder::new(x509_cert::name::Name::default()).map_err(|e| internal(&e))?;
    let name = Ia5String::new(uri).map_err(|e| internal(&e))?;
    builder
        .add_extension(&SubjectAltName(vec![
            GeneralName::UniformResourceIdentifier(name),
        ]))
        .map_err(|e| internal(&e))?;
    let req = builder
        .build::<_, DerSignature>(key)
        .map_err(|e| internal(&e))?;
    req.to_pem(x509_cert::der::pem::LineEnding::LF)
        .map_err(|e| internal(&e))
}
