//! The JSON Web Key Sets of RequestAuthentication rules as the model holds them: where
//! each comes from, which objects name it, whether a fetched set is one Envoy can use,
//! and the set a rule gets until one is fetched. meshd's fetcher (`src/jwks.rs`) fills
//! the store with them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;
use std::time::Duration;

use crate::config::ObjectKey;

/// How long a fetch may take when its rule sets no `timeout` (istiod's 5 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a rule's key set comes from: its `jwksUri`, or its issuer's OpenID discovery
/// when the URI is empty.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JwksSource {
    pub issuer: String,
    pub uri: String,
}

impl JwksSource {
    /// Where `rule`'s key set comes from.
    pub fn of(rule: &api::security::JwtRule) -> JwksSource {
        JwksSource {
            issuer: rule.issuer.clone(),
            uri: rule.jwks_uri.clone().unwrap_or_default(),
        }
    }

    /// Its key in the store.
    pub fn key(&self) -> String {
        format!("{}|{}", self.issuer, self.uri)
    }
}

/// What a push needs fetched: each source, the longest timeout a rule gives it, and the
/// objects naming it.
pub type Wanted = BTreeMap<JwksSource, (Duration, BTreeSet<ObjectKey>)>;

/// Why a `jwksUri` or a key set cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JwksError {
    #[error("jwksUri {uri:?}: {problem}")]
    Uri { uri: String, problem: &'static str },
    #[error("{0}")]
    KeySet(String),
}

/// An http(s) URL, as istiod's `ParseJwksURI` accepts it.
#[derive(Debug, PartialEq)]
pub struct Uri {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// Path and query, `/` at least.
    pub path: String,
}

pub fn parse_uri(uri: &str) -> Result<Uri, JwksError> {
    let bad = |problem| JwksError::Uri {
        uri: uri.to_string(),
        problem,
    };
    let (tls, rest) = if let Some(rest) = uri.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = uri.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err(bad("the scheme must be http or https"));
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    let default_port = if tls { 443 } else { 80 };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| bad("an IPv6 address without its closing ]"))?;
        let port = match after.strip_prefix(':') {
            Some(p) => p
                .parse()
                .map_err(|_| bad("the port is not a number from 0 to 65535"))?,
            None => default_port,
        };
        (host.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (
                h.to_string(),
                p.parse()
                    .map_err(|_| bad("the port is not a number from 0 to 65535"))?,
            ),
            None => (authority.to_string(), default_port),
        }
    };
    if host.is_empty() || host.contains('@') {
        return Err(bad("no host"));
    }
    Ok(Uri {
        tls,
        host,
        port,
        path,
    })
}

/// Whether `text` is a JSON Web Key Set Envoy takes: an object whose `keys` is a non-empty
/// array of public keys it can build. Envoy refuses a listener whose JWT provider holds
/// anything else (an empty set, an EC point not on its curve), so a set that fails here is
/// never sent: refused at validation when inline, not used when fetched.
pub fn check_key_set(text: &str) -> Result<(), JwksError> {
    let bad = |problem: String| JwksError::KeySet(problem);
    let doc: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let keys = doc
        .get("keys")
        .and_then(|k| k.as_array())
        .ok_or_else(|| bad("no \"keys\" array".into()))?;
    if keys.is_empty() {
        return Err(bad("no keys".into()));
    }
    for (i, key) in keys.iter().enumerate() {
        check_key(key).map_err(|e| bad(format!("key {i}: {e}")))?;
    }
    Ok(())
}

/// One JSON Web Key (RFC 7518): its members decode, and an EC point of P-256 or P-384 is
/// on its curve.
fn check_key(key: &serde_json::Value) -> Result<(), String> {
    use base64::Engine;
    let member = |name: &str| -> Result<Vec<u8>, String> {
        let text =
            (key.get(name).and_then(|v| v.as_str())).ok_or_else(|| format!("no \"{name}\""))?;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text.trim_end_matches('='))
            .map_err(|_| format!("\"{name}\" is not base64url"))?;
        if bytes.is_empty() {
            return Err(format!("\"{name}\" is empty"));
        }
        Ok(bytes)
    };
    let kty = key
        .get("kty")
        .and_then(|k| k.as_str())
        .ok_or("no \"kty\"")?;
    let crv = key.get("crv").and_then(|k| k.as_str()).unwrap_or("");
    match kty {
        "RSA" => {
            member("n")?;
            member("e")?;
        }
        "oct" => {
            member("k")?;
        }
        "OKP" if crv == "Ed25519" => {
            if member("x")?.len() != 32 {
                return Err("an Ed25519 \"x\" has 32 bytes".into());
            }
        }
        "EC" => {
            let (x, y) = (member("x")?, member("y")?);
            let (size, alg) = match crv {
                "P-256" => (32, Some(&ring::agreement::ECDH_P256)),
                "P-384" => (48, Some(&ring::agreement::ECDH_P384)),
                "P-521" => (66, None),
                other => return Err(format!("curve {other:?} is not P-256, P-384 or P-521")),
            };
            if x.len() != size || y.len() != size {
                return Err(format!("{crv} coordinates have {size} bytes"));
            }
            // ring checks a peer's point when agreeing on a key with it.
            if let Some(alg) = alg {
                let point = [&[4u8][..], &x, &y].concat();
                let rng = ring::rand::SystemRandom::new();
                let mine = ring::agreement::EphemeralPrivateKey::generate(alg, &rng)
                    .map_err(|_| "no randomness")?;
                let peer = ring::agreement::UnparsedPublicKey::new(alg, point);
                ring::agreement::agree_ephemeral(mine, &peer, |_| ())
                    .map_err(|_| format!("the point is not on {crv}"))?;
            }
        }
        other => {
            return Err(format!(
                "key type {other:?} is not RSA, EC, oct or OKP Ed25519"
            ));
        }
    }
    Ok(())
}

/// A key set with one P-256 public key whose private key was dropped the moment it was
/// made: no token verifies against it. Made once per process.
pub fn fail_closed() -> &'static str {
    static KEY_SET: OnceLock<String> = OnceLock::new();
    KEY_SET.get_or_init(|| {
        use base64::Engine;
        use p256::elliptic_curve::Generate;
        let key = p256::ecdsa::SigningKey::generate();
        let point = key.verifying_key().to_sec1_point(false);
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let (x, y) = (
            point.x().expect("uncompressed"),
            point.y().expect("uncompressed"),
        );
        serde_json::json!({"keys": [{"kty": "EC", "crv": "P-256", "alg": "ES256",
            "x": b64(x), "y": b64(y)}]})
        .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse_as_istiod_accepts_them() {
        let u = parse_uri("https://example.com/.well-known/jwks.json").unwrap();
        assert_eq!(
            u,
            Uri {
                tls: true,
                host: "example.com".into(),
                port: 443,
                path: "/.well-known/jwks.json".into()
            }
        );
        let u = parse_uri("http://[fd00::1]:8080?x=1").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("fd00::1", 8080, "/?x=1")
        );
        assert_eq!(parse_uri("http://keys:9000").unwrap().path, "/");
        for bad in [
            "ftp://x/keys",
            "https:///keys",
            "http://h:port/",
            "keys.example.com",
        ] {
            assert!(parse_uri(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn key_sets_need_keys_envoy_can_build() {
        check_key_set(fail_closed()).unwrap();
        let rsa = r#"{"keys": [{"kty": "RSA", "n": "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw", "e": "AQAB"}]}"#;
        check_key_set(rsa).unwrap();
        check_key_set(r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#).unwrap();
        for bad in [
            "[]",
            "{}",
            r#"{"keys": {}}"#,
            r#"{"keys": []}"#,
            r#"{"keys": [{"n": "x"}]}"#,
            r#"{"keys": [{"kty": "EC"}]}"#,
            r#"{"keys": [{"kty": "EC", "crv": "P-256", "x": "AAAA", "y": "AAAA"}]}"#,
            r#"{"keys": [{"kty": "RSA", "n": "not base64!", "e": "AQAB"}]}"#,
            r#"{"keys": [{"kty": "XYZ"}]}"#,
            "not json",
        ] {
            assert!(check_key_set(bad).is_err(), "{bad}");
        }
        // A P-256 point off the curve: the right sizes, a wrong point.
        let off = format!(
            r#"{{"keys": [{{"kty": "EC", "crv": "P-256", "x": "{}", "y": "{}"}}]}}"#,
            "A".repeat(42) + "E",
            "B".repeat(42) + "E"
        );
        let err = check_key_set(&off).unwrap_err();
        assert!(err.to_string().contains("not on P-256"), "{err}");
    }
}
