//! The CA's signing key: ECDSA P-256, which meshd makes for the roots and intermediates it
//! creates, or RSA, which it takes from existing material. istiod's self-signed root is
//! RSA-2048, so a cluster's `istio-ca-secret` usually holds an RSA key, and a plugged-in
//! `cacerts` may hold either. Workload certificates keep the key of their CSR; only their
//! signature is made with this key (ECDSA with SHA-256, or RSA PKCS#1 v1.5 with SHA-256,
//! as istiod signs with an RSA key).

use std::sync::Arc;

use p256::ecdsa::signature::{Error as SignatureError, Keypair, Signer};
use p256::ecdsa::{DerSignature, SigningKey};
use p256::pkcs8::DecodePrivateKey;
use ring::rand::SystemRandom;
use ring::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use x509_cert::der::asn1::{BitString, Null};
use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::der::{Any, Document};
use x509_cert::spki::{
    AlgorithmIdentifierOwned, DynSignatureAlgorithmIdentifier, EncodePublicKey,
    SignatureBitStringEncoding, SubjectPublicKeyInfoOwned,
};

use super::CaError;

/// rsaEncryption (RFC 8017): an RSA public key's algorithm.
const RSA_ENCRYPTION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
/// sha256WithRSAEncryption (RFC 8017): an RSA PKCS#1 v1.5 SHA-256 signature.
const SHA256_WITH_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.11");

/// A CA signing key.
#[derive(Clone)]
pub enum CaKey {
    P256(SigningKey),
    Rsa(RsaKey),
}

/// An RSA key as it was read, with its public key.
#[derive(Clone)]
pub struct RsaKey {
    pair: Arc<RsaKeyPair>,
    /// The PEM it was read from, written back unchanged.
    pem: String,
    spki: SubjectPublicKeyInfoOwned,
}

impl CaKey {
    /// A new P-256 key.
    pub fn generate() -> CaKey {
        use p256::elliptic_curve::Generate;
        CaKey::P256(SigningKey::generate())
    }

    /// A key from PEM: P-256 in PKCS#8 (`PRIVATE KEY`) or SEC1 (`EC PRIVATE KEY`), or RSA
    /// in PKCS#1 (`RSA PRIVATE KEY`, as istiod writes it) or PKCS#8.
    pub fn from_pem(pem: &str) -> Result<CaKey, CaError> {
        let pem = pem.trim();
        if let Ok(key) = SigningKey::from_pkcs8_pem(pem) {
            return Ok(CaKey::P256(key));
        }
        if let Ok(key) = p256::SecretKey::from_sec1_pem(pem) {
            return Ok(CaKey::P256(key.into()));
        }
        let unsupported = |why: String| {
            CaError::Internal(format!(
                "ca-key.pem is neither a P-256 key (PKCS#8 or SEC1 PEM) nor an RSA key \
                 (PKCS#1 or PKCS#8 PEM): {why}"
            ))
        };
        let (label, der) = x509_cert::der::pem::decode_vec(pem.as_bytes())
            .map_err(|e| unsupported(e.to_string()))?;
        let pair = match label {
            "RSA PRIVATE KEY" => RsaKeyPair::from_der(&der),
            "PRIVATE KEY" => RsaKeyPair::from_pkcs8(&der),
            other => return Err(unsupported(format!("a {other:?} PEM block"))),
        }
        .map_err(|e| unsupported(e.to_string()))?;
        let spki = SubjectPublicKeyInfoOwned {
            algorithm: AlgorithmIdentifierOwned {
                oid: RSA_ENCRYPTION,
                parameters: Some(Any::from(Null)),
            },
            subject_public_key: BitString::from_bytes(pair.public().as_ref())
                .map_err(|e| unsupported(e.to_string()))?,
        };
        Ok(CaKey::Rsa(RsaKey {
            pair: Arc::new(pair),
            pem: format!("{pem}\n"),
            spki,
        }))
    }

    /// The key as PEM: PKCS#8 for P-256, an RSA key as it was read.
    pub fn to_pem(&self) -> Result<String, CaError> {
        match self {
            CaKey::P256(key) => super::material::key_to_pem(key),
            CaKey::Rsa(key) => Ok(key.pem.clone()),
        }
    }

    /// Its public key as a certificate carries it.
    pub fn spki(&self) -> Result<SubjectPublicKeyInfoOwned, CaError> {
        match self {
            CaKey::P256(key) => SubjectPublicKeyInfoOwned::from_key(key.verifying_key())
                .map_err(|e| CaError::Internal(e.to_string())),
            CaKey::Rsa(key) => Ok(key.spki.clone()),
        }
    }

    /// `RSA` or `P-256`, for messages.
    pub fn algorithm(&self) -> &'static str {
        match self {
            CaKey::P256(_) => "P-256",
            CaKey::Rsa(_) => "RSA",
        }
    }
}

/// A CA key's public key, for the certificate builder.
#[derive(Clone)]
pub struct CaPublicKey(SubjectPublicKeyInfoOwned);

impl EncodePublicKey for CaPublicKey {
    fn to_public_key_der(&self) -> x509_cert::spki::Result<Document> {
        Ok(Document::encode_msg(&self.0)?)
    }
}

impl Keypair for CaKey {
    type VerifyingKey = CaPublicKey;

    fn verifying_key(&self) -> CaPublicKey {
        let spki = self.spki().expect("BUG: a P-256 public key encodes");
        CaPublicKey(spki)
    }
}

impl DynSignatureAlgorithmIdentifier for CaKey {
    fn signature_algorithm_identifier(&self) -> x509_cert::spki::Result<AlgorithmIdentifierOwned> {
        match self {
            CaKey::P256(key) => key.signature_algorithm_identifier(),
            CaKey::Rsa(_) => Ok(AlgorithmIdentifierOwned {
                oid: SHA256_WITH_RSA,
                parameters: Some(Any::from(Null)),
            }),
        }
    }
}

/// A signature's bytes: DER for ECDSA, the raw value for RSA.
pub struct CaSignature(Vec<u8>);

impl SignatureBitStringEncoding for CaSignature {
    fn to_bitstring(&self) -> x509_cert::der::Result<BitString> {
        BitString::from_bytes(&self.0)
    }
}

impl Signer<CaSignature> for CaKey {
    fn try_sign(&self, msg: &[u8]) -> Result<CaSignature, SignatureError> {
        match self {
            CaKey::P256(key) => {
                let sig: DerSignature = key.try_sign(msg)?;
                Ok(CaSignature(sig.to_bytes().to_vec()))
            }
            CaKey::Rsa(key) => {
                let mut out = vec![0; key.pair.public().modulus_len()];
                key.pair
                    .sign(&RSA_PKCS1_SHA256, &SystemRandom::new(), msg, &mut out)
                    .map_err(|_| SignatureError::new())?;
                Ok(CaSignature(out))
            }
        }
    }
}
