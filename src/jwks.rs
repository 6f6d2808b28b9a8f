//! The JSON Web Key Sets of RequestAuthentication rules, fetched by meshd and sent to
//! Envoy inline, as istiod's `JwksResolver` does by default
//! (`PILOT_JWT_ENABLE_REMOTE_JWKS=false`): proxies never reach the identity provider.
//!
//! A rule's `jwksUri` (or, without one, the `jwks_uri` its issuer's OpenID discovery
//! document `ISSUER/.well-known/openid-configuration` names) is fetched as soon as a push
//! names it, and every `PILOT_JWT_PUB_KEY_REFRESH_INTERVAL` (20 minutes) after; a failed
//! fetch is retried every [`RETRY`]. The sources due are fetched together. An answer goes into the store
//! ([`crate::model::Store::set_jwks`]), and a new one is a change to the objects naming
//! the source, so the next push carries it. A failed refresh keeps the last key set;
//! until one fetch succeeds a rule gets [`fail_closed`], a key nobody can sign for, so
//! its tokens are refused rather than let through. Link-local addresses (cloud metadata
//! services) are never fetched from, as istiod's `jwksBlockedIP`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use crate::config::ObjectKey;
use crate::filesource::OnChange;
use crate::model::Store;
use crate::xds::push::Push;

/// istiod's variable for how often every key set is fetched again.
pub const REFRESH_ENV: &str = "PILOT_JWT_PUB_KEY_REFRESH_INTERVAL";
const DEFAULT_REFRESH: Duration = Duration::from_secs(20 * 60);
/// How soon a failed fetch is tried again.
pub const RETRY: Duration = Duration::from_secs(10);
/// How long a fetch may take when its rule sets no `timeout` (istiod's 5 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest key set (or discovery document) read.
const MAX_BODY: usize = 1 << 20;

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

/// An http(s) URL, as istiod's `ParseJwksURI` accepts it.
#[derive(Debug, PartialEq)]
pub struct Uri {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// Path and query, `/` at least.
    pub path: String,
}

pub fn parse_uri(uri: &str) -> Result<Uri, String> {
    let (tls, rest) = if let Some(rest) = uri.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = uri.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err(format!("jwksUri {uri:?}: scheme must be http or https"));
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
            .ok_or_else(|| format!("jwksUri {uri:?}: unclosed IPv6 address"))?;
        let port = match after.strip_prefix(':') {
            Some(p) => p
                .parse()
                .map_err(|_| format!("jwksUri {uri:?}: bad port"))?,
            None => default_port,
        };
        (host.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (
                h.to_string(),
                p.parse()
                    .map_err(|_| format!("jwksUri {uri:?}: bad port"))?,
            ),
            None => (authority.to_string(), default_port),
        }
    };
    if host.is_empty() || host.contains('@') {
        return Err(format!("jwksUri {uri:?}: no host"));
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
pub fn check_key_set(text: &str) -> Result<(), String> {
    let doc: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let keys = doc
        .get("keys")
        .and_then(|k| k.as_array())
        .ok_or("no \"keys\" array")?;
    if keys.is_empty() {
        return Err("no keys".into());
    }
    for (i, key) in keys.iter().enumerate() {
        check_key(key).map_err(|e| format!("key {i}: {e}"))?;
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

/// `PILOT_JWT_PUB_KEY_REFRESH_INTERVAL` (a Go duration), 20 minutes when unset or invalid.
fn refresh_interval() -> Duration {
    match std::env::var(REFRESH_ENV) {
        Ok(v) => api::duration::parse(&v).unwrap_or_else(|e| {
            tracing::warn!("{REFRESH_ENV}: {e}; 20m is used");
            DEFAULT_REFRESH
        }),
        Err(_) => DEFAULT_REFRESH,
    }
}

/// Fetches what each push's RequestAuthentication rules need, keeps it current, and
/// reports new answers as changes to the objects naming them.
pub async fn run(
    mut pushes: watch::Receiver<Arc<Push>>,
    store: Arc<RwLock<Store>>,
    on_change: OnChange,
    metrics: Arc<crate::metrics::Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    let refresh = refresh_interval();
    // When each source was last fetched, and whether that worked.
    let mut fetched: BTreeMap<JwksSource, (Instant, bool)> = BTreeMap::new();
    loop {
        let wanted = pushes.borrow_and_update().context.jwks_sources();
        fetched.retain(|source, _| wanted.contains_key(source));
        let mut changed = BTreeSet::new();
        let now = Instant::now();
        let due: Vec<_> = (wanted.iter())
            .filter(|(source, _)| match fetched.get(*source) {
                None => true,
                Some((at, ok)) => now.duration_since(*at) >= if *ok { refresh } else { RETRY },
            })
            .collect();
        // All at once: a slow identity provider does not hold up the others.
        let answers = fetch_all(due.iter().map(|(source, (timeout, _))| (*source, *timeout))).await;
        for ((source, (_, named_by)), answer) in due.into_iter().zip(answers) {
            match &answer {
                Ok(_) => metrics.jwks_fetch_success.inc(),
                Err(_) => metrics.jwks_fetch_fail.inc(),
            };
            fetched.insert(source.clone(), (Instant::now(), answer.is_ok()));
            let key = source.key();
            let update = match answer {
                Ok(key_set) => Some(Some(key_set)),
                Err(e) => {
                    tracing::warn!(
                        issuer = source.issuer,
                        uri = source.uri,
                        "fetching a JSON Web Key Set failed: {e}"
                    );
                    // Keep what worked; record that nothing has yet.
                    let known = store.read().unwrap().jwks(&key).is_some();
                    (!known).then_some(None)
                }
            };
            if let Some(key_set) = update
                && store.write().unwrap().set_jwks(&key, key_set)
            {
                changed.extend(named_by.iter().cloned());
            }
        }
        if !changed.is_empty() {
            on_change(changed);
        }
        let next = (fetched.values())
            .map(|(at, ok)| *at + if *ok { refresh } else { RETRY })
            .min();
        let sleep = next.map_or(refresh, |t| t.saturating_duration_since(Instant::now()));
        tokio::select! {
            r = pushes.changed() => {
                if r.is_err() {
                    return;
                }
            }
            _ = tokio::time::sleep(sleep) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// The key sets of `sources`, fetched concurrently, in their order.
async fn fetch_all<'a>(
    sources: impl Iterator<Item = (&'a JwksSource, Duration)>,
) -> Vec<Result<String, String>> {
    futures::future::join_all(sources.map(|(source, timeout)| fetch(source, timeout))).await
}

/// The key set of `source`: its URI, or the one its issuer's discovery document names.
pub async fn fetch(source: &JwksSource, timeout: Duration) -> Result<String, String> {
    let uri = if source.uri.is_empty() {
        let discovery = format!(
            "{}/.well-known/openid-configuration",
            source.issuer.trim_end_matches('/')
        );
        let body = get(&discovery, timeout).await?;
        let doc: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| format!("{discovery}: not valid JSON: {e}"))?;
        (doc.get("jwks_uri").and_then(|u| u.as_str()))
            .ok_or_else(|| format!("{discovery}: no jwks_uri"))?
            .to_string()
    } else {
        source.uri.clone()
    };
    let body = get(&uri, timeout).await?;
    let text = String::from_utf8(body).map_err(|_| format!("{uri}: not UTF-8"))?;
    check_key_set(&text).map_err(|e| format!("{uri}: not a key set: {e}"))?;
    Ok(text)
}

/// The body of a `200` answer to `GET uri`, within `timeout`.
async fn get(uri: &str, timeout: Duration) -> Result<Vec<u8>, String> {
    tokio::time::timeout(timeout, get_now(uri))
        .await
        .map_err(|_| format!("{uri}: no answer within {timeout:?}"))?
}

async fn get_now(uri: &str) -> Result<Vec<u8>, String> {
    let parsed = parse_uri(uri)?;
    let addresses = tokio::net::lookup_host((parsed.host.as_str(), parsed.port))
        .await
        .map_err(|e| format!("{uri}: {e}"))?;
    let allowed: Vec<_> = addresses.filter(|a| !blocked(a.ip())).collect();
    let Some(address) = allowed.first() else {
        return Err(format!("{uri}: no address that may be fetched from"));
    };
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| format!("{uri}: {e}"))?;
    if !parsed.tls {
        return request(tcp, &parsed, uri).await;
    }
    let name = rustls::pki_types::ServerName::try_from(parsed.host.clone())
        .map_err(|e| format!("{uri}: {e}"))?;
    let tls = tokio_rustls::TlsConnector::from(system_roots()?)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("{uri}: {e}"))?;
    request(tls, &parsed, uri).await
}

async fn request<S>(io: S, parsed: &Uri, uri: &str) -> Result<Vec<u8>, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("{uri}: {e}"))?;
    tokio::spawn(conn);
    let host = match (parsed.tls, parsed.port) {
        (true, 443) | (false, 80) => parsed.host.clone(),
        (_, port) => format!("{}:{port}", parsed.host),
    };
    let req = hyper::Request::get(parsed.path.as_str())
        .header(hyper::header::HOST, host)
        .header(hyper::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("{uri}: {e}"))?;
    let response = sender
        .send_request(req)
        .await
        .map_err(|e| format!("{uri}: {e}"))?;
    if response.status() != hyper::StatusCode::OK {
        return Err(format!("{uri}: status {}", response.status()));
    }
    let body = Limited::new(response.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| format!("{uri}: {e}"))?;
    Ok(body.to_bytes().to_vec())
}

/// Link-local addresses (169.254.0.0/16, fe80::/10: cloud instance metadata) and the
/// metadata addresses outside that range, which no identity provider uses.
fn blocked(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local() || v4.octets() == [100, 100, 100, 200],
        IpAddr::V6(v6) => {
            (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6 == "fd00:ec2::254".parse::<std::net::Ipv6Addr>().unwrap()
        }
    }
}

/// A TLS client trusting the system's CA bundle, read once.
fn system_roots() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let pem = (crate::agent::sds::SYSTEM_BUNDLES.iter())
                .find_map(|path| std::fs::read_to_string(path).ok())
                .ok_or("no system CA bundle")?;
            let mut roots = rustls::RootCertStore::empty();
            let certs = crate::tls::certs(&pem).map_err(|e| e.to_string())?;
            roots.add_parsable_certificates(certs);
            let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(roots)
                .with_no_client_auth();
            Ok(Arc::new(config))
        })
        .clone()
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
        assert!(err.contains("not on P-256"), "{err}");
    }

    /// A server answering `/.well-known/openid-configuration` with `jwks_uri` on itself and
    /// `/keys` with a key set; anything else 404.
    fn identity_provider() -> String {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let jwks_uri = format!("{base}/keys");
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut request = String::new();
                reader.read_line(&mut request).unwrap();
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let path = request.split(' ').nth(1).unwrap_or("");
                let (status, body) = match path {
                    "/.well-known/openid-configuration" => {
                        ("200 OK", format!(r#"{{"jwks_uri": "{jwks_uri}"}}"#))
                    }
                    "/keys" => ("200 OK", fail_closed().to_string()),
                    "/html" => ("200 OK", "<html></html>".to_string()),
                    _ => ("404 Not Found", String::new()),
                };
                let _ = write!(
                    conn,
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        base
    }

    #[tokio::test]
    async fn a_key_set_comes_from_the_uri_or_the_issuers_discovery_document() {
        let base = identity_provider();
        let source = |issuer: &str, uri: &str| JwksSource {
            issuer: issuer.into(),
            uri: uri.into(),
        };
        let t = DEFAULT_TIMEOUT;
        let keys = fail_closed();
        assert_eq!(
            fetch(&source("i", &format!("{base}/keys")), t)
                .await
                .unwrap(),
            keys
        );
        assert_eq!(
            fetch(&source(&format!("{base}/"), ""), t).await.unwrap(),
            keys
        );
        let not_found = fetch(&source("i", &format!("{base}/missing")), t).await;
        assert!(not_found.unwrap_err().contains("404"));
        let html = fetch(&source("i", &format!("{base}/html")), t).await;
        assert!(html.unwrap_err().contains("not a key set"));
        let metadata = fetch(&source("i", "http://169.254.169.254/keys"), t).await;
        assert!(metadata.unwrap_err().contains("no address"));
    }

    /// Two identity providers, the first of which answers only once the second has been
    /// asked: fetched one after the other, the first would time out.
    #[tokio::test]
    async fn key_sets_are_fetched_together() {
        use std::io::{BufRead, BufReader, Write};
        use std::sync::mpsc;
        let (asked, wait) = mpsc::channel::<()>();
        let serve = |gate: Option<mpsc::Receiver<()>>, notify: Option<mpsc::Sender<()>>| {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            std::thread::spawn(move || {
                let (mut conn, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                if let Some(n) = notify {
                    n.send(()).unwrap();
                }
                if let Some(g) = gate {
                    g.recv().unwrap();
                }
                let body = fail_closed();
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
            port
        };
        let first = serve(Some(wait), None);
        let second = serve(None, Some(asked));
        let source = |port: u16| JwksSource {
            issuer: "i".into(),
            uri: format!("http://127.0.0.1:{port}/keys"),
        };
        let (a, b) = (source(first), source(second));
        let timeout = Duration::from_secs(5);
        let answers = fetch_all([(&a, timeout), (&b, timeout)].into_iter()).await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
    }

    #[test]
    fn metadata_addresses_are_never_fetched_from() {
        for ip in [
            "169.254.169.254",
            "fe80::1",
            "100.100.100.200",
            "fd00:ec2::254",
        ] {
            assert!(blocked(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["127.0.0.1", "10.0.0.8", "::1", "93.184.216.34"] {
            assert!(!blocked(ip.parse().unwrap()), "{ip}");
        }
    }
}
