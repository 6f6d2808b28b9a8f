//! The JSON Web Key Sets of RequestAuthentication rules, fetched by meshd and sent to
//! Envoy inline, as istiod's `JwksResolver` does by default
//! (`PILOT_JWT_ENABLE_REMOTE_JWKS=false`): proxies never reach the identity provider.
//!
//! A rule's `jwksUri` (or, without one, the `jwks_uri` its issuer's OpenID discovery
//! document `ISSUER/.well-known/openid-configuration` names) is fetched as soon as a push
//! names it, and every `PILOT_JWT_PUB_KEY_REFRESH_INTERVAL` (20 minutes) after; a failed
//! fetch is retried every [`RETRY`]. The sources due are fetched together. An answer goes into the store
//! ([`model::Store::set_jwks`]), and a new one is a change to the objects naming
//! the source, so the next push carries it. A failed refresh keeps the last key set;
//! until one fetch succeeds a rule gets [`fail_closed`](model::jwks::fail_closed), a key nobody can sign for, so
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

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use crate::filesource::OnChange;
use model::Store;
use model::jwks::{JwksSource, Uri, check_key_set, parse_uri};
use xds::push::Push;

/// istiod's variable for how often every key set is fetched again.
pub const REFRESH_ENV: &str = "PILOT_JWT_PUB_KEY_REFRESH_INTERVAL";
const DEFAULT_REFRESH: Duration = Duration::from_secs(20 * 60);
/// How soon a failed fetch is tried again.
pub const RETRY: Duration = Duration::from_secs(10);
/// The largest key set (or discovery document) read.
const MAX_BODY: usize = 1 << 20;

/// Why a key set could not be fetched from `uri`; the last key set fetched stays in use.
#[derive(Debug, thiserror::Error)]
#[error("{uri}: {problem}")]
pub struct FetchError {
    uri: String,
    problem: Problem,
}

#[derive(Debug, thiserror::Error)]
enum Problem {
    #[error("{0}")]
    Uri(model::jwks::JwksError),
    #[error("cannot resolve the host: {0}")]
    Resolve(std::io::Error),
    #[error(
        "no address that may be fetched from: link-local and cloud metadata addresses never are, as with istiod"
    )]
    Blocked,
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("HTTP: {0}")]
    Http(String),
    #[error("status {0}, where 200 was expected")]
    Status(hyper::StatusCode),
    #[error("no answer within {0:?} (the rule's timeout)")]
    Timeout(Duration),
    #[error("not valid JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("the discovery document names no jwks_uri")]
    NoJwksUri,
    #[error("not UTF-8")]
    NotUtf8,
    #[error("not a key set: {0}")]
    KeySet(model::jwks::JwksError),
}

fn fail(uri: &str, problem: Problem) -> FetchError {
    FetchError {
        uri: uri.to_string(),
        problem,
    }
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

/// Fetches of RequestAuthentication key sets that worked and that failed (istiod's
/// `pilot_jwks_resolver_network_fetch_{success,fail}_total`).
#[derive(Clone, Default)]
pub struct JwksMetrics {
    pub fetch_success: Counter,
    pub fetch_fail: Counter,
}

impl JwksMetrics {
    pub fn register(registry: &mut Registry) -> JwksMetrics {
        let m = JwksMetrics::default();
        // Istio's names end in `_total` already; OpenMetrics adds one more, which the
        // Prometheus text drops.
        registry.register(
            "pilot_jwks_resolver_network_fetch_success_total",
            "Total number of successfully network fetch by pilot jwks resolver",
            m.fetch_success.clone(),
        );
        registry.register(
            "pilot_jwks_resolver_network_fetch_fail_total",
            "Total number of failed network fetch by pilot jwks resolver",
            m.fetch_fail.clone(),
        );
        m
    }
}

/// Fetches what each push's RequestAuthentication rules need, keeps it current, and
/// reports new answers as changes to the objects naming them.
pub async fn run(
    mut pushes: watch::Receiver<Arc<Push>>,
    store: Arc<RwLock<Store>>,
    on_change: OnChange,
    metrics: JwksMetrics,
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
                Ok(_) => metrics.fetch_success.inc(),
                Err(_) => metrics.fetch_fail.inc(),
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
) -> Vec<Result<String, FetchError>> {
    futures::future::join_all(sources.map(|(source, timeout)| fetch(source, timeout))).await
}

/// The key set of `source`: its URI, or the one its issuer's discovery document names.
pub async fn fetch(source: &JwksSource, timeout: Duration) -> Result<String, FetchError> {
    let uri = if source.uri.is_empty() {
        let discovery = format!(
            "{}/.well-known/openid-configuration",
            source.issuer.trim_end_matches('/')
        );
        let body = get(&discovery, timeout).await?;
        let doc: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| fail(&discovery, Problem::NotJson(e)))?;
        (doc.get("jwks_uri").and_then(|u| u.as_str()))
            .ok_or_else(|| fail(&discovery, Problem::NoJwksUri))?
            .to_string()
    } else {
        source.uri.clone()
    };
    let body = get(&uri, timeout).await?;
    let text = String::from_utf8(body).map_err(|_| fail(&uri, Problem::NotUtf8))?;
    check_key_set(&text).map_err(|e| fail(&uri, Problem::KeySet(e)))?;
    Ok(text)
}

/// The body of a `200` answer to `GET uri`, within `timeout`.
async fn get(uri: &str, timeout: Duration) -> Result<Vec<u8>, FetchError> {
    tokio::time::timeout(timeout, get_now(uri))
        .await
        .map_err(|_| fail(uri, Problem::Timeout(timeout)))?
}

async fn get_now(uri: &str) -> Result<Vec<u8>, FetchError> {
    let parsed = parse_uri(uri).map_err(|e| fail(uri, Problem::Uri(e)))?;
    let addresses = tokio::net::lookup_host((parsed.host.as_str(), parsed.port))
        .await
        .map_err(|e| fail(uri, Problem::Resolve(e)))?;
    let allowed: Vec<_> = addresses.filter(|a| !blocked(a.ip())).collect();
    let Some(address) = allowed.first() else {
        return Err(fail(uri, Problem::Blocked));
    };
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| fail(uri, Problem::Connect(e)))?;
    if !parsed.tls {
        return request(tcp, &parsed, uri).await;
    }
    let tls_error = |e: &dyn std::fmt::Display| fail(uri, Problem::Tls(e.to_string()));
    let name =
        rustls::pki_types::ServerName::try_from(parsed.host.clone()).map_err(|e| tls_error(&e))?;
    let tls = tokio_rustls::TlsConnector::from(system_roots().map_err(|e| tls_error(&e))?)
        .connect(name, tcp)
        .await
        .map_err(|e| tls_error(&e))?;
    request(tls, &parsed, uri).await
}

async fn request<S>(io: S, parsed: &Uri, uri: &str) -> Result<Vec<u8>, FetchError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let http = |e: &dyn std::fmt::Display| fail(uri, Problem::Http(e.to_string()));
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| http(&e))?;
    tokio::spawn(conn);
    let host = match (parsed.tls, parsed.port) {
        (true, 443) | (false, 80) => parsed.host.clone(),
        (_, port) => format!("{}:{port}", parsed.host),
    };
    let req = hyper::Request::get(parsed.path.as_str())
        .header(hyper::header::HOST, host)
        .header(hyper::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .map_err(|e| http(&e))?;
    let response = sender.send_request(req).await.map_err(|e| http(&e))?;
    if response.status() != hyper::StatusCode::OK {
        return Err(fail(uri, Problem::Status(response.status())));
    }
    let body = Limited::new(response.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| http(&*e))?;
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
            let certs = transport::tls::certs(&pem).map_err(|e| e.to_string())?;
            roots.add_parsable_certificates(certs);
            let config = rustls::ClientConfig::builder_with_provider(transport::tls::provider())
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
    use model::jwks::{DEFAULT_TIMEOUT, fail_closed};

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
        assert!(not_found.unwrap_err().to_string().contains("404"));
        let html = fetch(&source("i", &format!("{base}/html")), t).await;
        assert!(html.unwrap_err().to_string().contains("not a key set"));
        let metadata = fetch(&source("i", "http://169.254.169.254/keys"), t).await;
        assert!(metadata.unwrap_err().to_string().contains("no address"));
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
