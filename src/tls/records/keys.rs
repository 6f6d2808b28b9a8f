//! A TLS 1.3 connection's keys for one direction: sealing records, and the next keys
//! after a KeyUpdate, derived from the direction's traffic secret (RFC 8446 §7).

use std::io;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::hkdf;
use rustls::ConnectionTrafficSecrets;

use super::{
    APPLICATION_DATA, HANDSHAKE, HEADER, KEY_UPDATE, RECORD_LIMIT, TAG, UPDATE_NOT_REQUESTED,
    invalid,
};

/// A direction's traffic secret, from which its keys derive and the next secret after a
/// KeyUpdate (RFC 8446 §7.2, §7.3).
#[derive(Clone)]
pub(super) struct TrafficSecret {
    hash: hkdf::Algorithm,
    /// The secret, in its first `hash.len()` bytes.
    pub(super) bytes: [u8; 48],
}

impl TrafficSecret {
    pub(super) fn new(hash: hkdf::Algorithm, secret: &[u8]) -> Option<TrafficSecret> {
        let mut bytes = [0; 48];
        (secret.len() == hkdf::KeyType::len(&hash)).then_some(())?;
        bytes.get_mut(..secret.len())?.copy_from_slice(secret);
        Some(TrafficSecret { hash, bytes })
    }

    fn secret(&self) -> &[u8] {
        &self.bytes[..hkdf::KeyType::len(&self.hash)]
    }

    /// HKDF-Expand-Label(secret, label, "", out.len()) (RFC 8446 §7.1).
    pub(super) fn expand(&self, label: &[u8], out: &mut [u8]) {
        struct Len(usize);
        impl hkdf::KeyType for Len {
            fn len(&self) -> usize {
                self.0
            }
        }
        let length = (out.len() as u16).to_be_bytes();
        let label_length = [(b"tls13 ".len() + label.len()) as u8];
        let info = [&length[..], &label_length, b"tls13 ", label, &[0]];
        let prk = hkdf::Prk::new_less_safe(self.hash, self.secret());
        // Infallible: the lengths asked for are the AEAD's key, its IV and the hash's.
        (prk.expand(&info, Len(out.len()))
            .and_then(|okm| okm.fill(out)))
        .expect("HKDF-Expand-Label of a valid length");
    }

    /// The key for `aead` and the IV this secret gives.
    pub(super) fn key_and_iv(&self, aead: &aead::Algorithm) -> (Vec<u8>, [u8; 12]) {
        let mut key = vec![0; aead.key_len()];
        self.expand(b"key", &mut key);
        let mut iv = [0; 12];
        self.expand(b"iv", &mut iv);
        (key, iv)
    }

    /// The secret after a KeyUpdate.
    pub(super) fn next(&self) -> TrafficSecret {
        let mut next = self.clone();
        let len = self.secret().len();
        self.expand(b"traffic upd", &mut next.bytes[..len]);
        next
    }
}

/// One direction's key, IV and next sequence number.
///
/// The key is kept as its bytes and expanded for each record: ring's expanded AES-GCM key
/// (round keys and GHASH table) is ~0.5 KB, which every connection would hold for each
/// direction; expanding it costs well under a microsecond, against a few for a full
/// record's encryption.
pub(super) struct Keys {
    algorithm: &'static aead::Algorithm,
    /// The key, in its first `algorithm.key_len()` bytes.
    key: [u8; 32],
    iv: [u8; 12],
    pub(super) seq: u64,
    /// The secret the key and IV derive from, for the next ones after a KeyUpdate; without
    /// it a KeyUpdate closes the connection.
    pub(super) secret: Option<TrafficSecret>,
}

impl Keys {
    /// The keys rustls handed over, with the traffic secret they derive from if it was
    /// captured in the handshake and agrees with them.
    pub(super) fn new(
        secrets: &ConnectionTrafficSecrets,
        seq: u64,
        captured: Option<&[u8]>,
    ) -> io::Result<Keys> {
        let (algorithm, hash, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => {
                (&aead::AES_128_GCM, hkdf::HKDF_SHA256, key, iv)
            }
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => {
                (&aead::AES_256_GCM, hkdf::HKDF_SHA384, key, iv)
            }
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, hkdf::HKDF_SHA256, key, iv)
            }
            #[allow(unreachable_patterns)]
            _ => {
                return Err(io::Error::other(
                    "a TLS cipher suite without a record layer",
                ));
            }
        };
        let iv: [u8; 12] = iv
            .as_ref()
            .try_into()
            .map_err(|_| io::Error::other("a TLS IV of the wrong length"))?;
        let secret = captured
            .and_then(|secret| TrafficSecret::new(hash, secret))
            .filter(|secret| secret.key_and_iv(algorithm) == (key.as_ref().to_vec(), iv));
        Keys::with(algorithm, key.as_ref(), iv, seq, secret)
    }

    pub(super) fn with(
        algorithm: &'static aead::Algorithm,
        key: &[u8],
        iv: [u8; 12],
        seq: u64,
        secret: Option<TrafficSecret>,
    ) -> io::Result<Keys> {
        let mut bytes = [0; 32];
        (bytes.get_mut(..key.len()))
            .filter(|_| key.len() == algorithm.key_len())
            .ok_or_else(|| io::Error::other("a TLS traffic key of the wrong length"))?
            .copy_from_slice(key);
        Ok(Keys {
            algorithm,
            key: bytes,
            iv,
            seq,
            secret,
        })
    }

    /// The keys after a KeyUpdate.
    pub(super) fn next(&self) -> io::Result<Keys> {
        let Some(secret) = &self.secret else {
            return Err(invalid(
                "a TLS KeyUpdate on a connection whose traffic secret was not kept; closing it \
                 for the peer to reconnect with new keys"
                    .into(),
            ));
        };
        let next = secret.next();
        let (key, iv) = next.key_and_iv(self.algorithm);
        Keys::with(self.algorithm, &key, iv, 0, Some(next))
    }

    /// The key, expanded for sealing or opening.
    pub(super) fn aead(&self) -> LessSafeKey {
        let key = &self.key[..self.algorithm.key_len()];
        // Infallible: `with` checked the key's length.
        LessSafeKey::new(UnboundKey::new(self.algorithm, key).expect("a key of its length"))
    }

    /// The next record's nonce: the IV XOR the sequence number (RFC 8446 §5.3).
    pub(super) fn next_nonce(&mut self) -> Nonce {
        let mut nonce = self.iv;
        for (n, s) in nonce[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        self.seq += 1;
        Nonce::assume_unique_for_key(nonce)
    }

    /// Appends one record to `out`: the header, what `fill` appends, the content type,
    /// encrypted in place, and the tag. Once the key has sealed its limit of records, a
    /// KeyUpdate goes first and the record is sealed with the next key.
    pub(super) fn seal(
        &mut self,
        content_type: u8,
        out: &mut Vec<u8>,
        fill: impl FnOnce(&mut Vec<u8>),
    ) -> io::Result<()> {
        if self.seq >= RECORD_LIMIT {
            self.update(out)?;
        }
        self.seal_one(content_type, out, fill)
    }

    /// Appends a KeyUpdate (not asking the peer for one) sealed with this key, and moves to
    /// the next key.
    pub(super) fn update(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        let next = self.next()?;
        self.seal_one(HANDSHAKE, out, |out| {
            out.extend_from_slice(&[KEY_UPDATE, 0, 0, 1, UPDATE_NOT_REQUESTED]);
        })?;
        *self = next;
        Ok(())
    }

    fn seal_one(
        &mut self,
        content_type: u8,
        out: &mut Vec<u8>,
        fill: impl FnOnce(&mut Vec<u8>),
    ) -> io::Result<()> {
        let start = out.len();
        out.extend_from_slice(&[APPLICATION_DATA, 3, 3, 0, 0]);
        fill(out);
        out.push(content_type);
        let length = out.len() - start - HEADER + TAG;
        out[start + 3..start + HEADER].copy_from_slice(&(length as u16).to_be_bytes());
        let mut header = [0; HEADER];
        header.copy_from_slice(&out[start..start + HEADER]);
        let nonce = self.next_nonce();
        let tag = (self.aead())
            .seal_in_place_separate_tag(nonce, Aad::from(header), &mut out[start + HEADER..])
            .map_err(|_| io::Error::other("sealing a TLS record failed"))?;
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }
}
