//! RequestAuthentication at a real Envoy gateway: tokens checked against the rule's key set
//! (inline, or fetched by meshd from its `jwksUri`), and AuthorizationPolicy deciding on
//! who presented them (`requestPrincipals`, `request.auth.claims`).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use p256::ecdsa::SigningKey;
use p256::ecdsa::signature::Signer;
use p256::elliptic_curve::Generate;

use crate::gateway::gateway_mesh;
use crate::harness::*;

pub const ISSUER: &str = "https://issuer.example";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// An identity provider's signing key.
pub struct Issuer {
    key: SigningKey,
}

impl Issuer {
    pub fn new() -> Issuer {
        Issuer {
            key: SigningKey::generate(),
        }
    }

    /// Its public key as a JSON Web Key Set.
    pub fn jwks(&self) -> String {
        let point = self.key.verifying_key().to_sec1_point(false);
        serde_json::json!({"keys": [{"kty": "EC", "crv": "P-256", "alg": "ES256", "kid": "k1",
            "x": b64(point.x().unwrap()), "y": b64(point.y().unwrap())}]})
        .to_string()
    }

    /// An ES256 token for `sub` with `claims`, expiring in an hour (or an hour ago).
    pub fn token(&self, sub: &str, claims: serde_json::Value, expired: bool) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let exp = if expired { now - 3600 } else { now + 3600 };
        let mut payload = serde_json::json!({"iss": ISSUER, "sub": sub, "exp": exp});
        for (k, v) in claims.as_object().unwrap() {
            payload[k] = v.clone();
        }
        let header = b64(br#"{"alg":"ES256","kid":"k1","typ":"JWT"}"#);
        let signed = format!("{header}.{}", b64(payload.to_string().as_bytes()));
        let signature: p256::ecdsa::Signature = self.key.sign(signed.as_bytes());
        format!("{signed}.{}", b64(&signature.to_bytes()))
    }
}

fn request_authentication(rule: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: jwt, namespace: istio-system}}\nspec:\n  selector: {{matchLabels: {{istio: ingressgateway}}}}\n  jwtRules:\n  - issuer: {ISSUER}\n{rule}"
    )
}

/// ALLOW: alice at /productpage; at /reviews whoever's `groups` claim holds `admins`.
const POLICY: &str = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: jwt, namespace: istio-system}\nspec:\n  selector: {matchLabels: {istio: ingressgateway}}\n  rules:\n  - from: [{source: {requestPrincipals: ['https://issuer.example/alice']}}]\n    to: [{operation: {paths: ['/productpage*']}}]\n  - to: [{operation: {paths: ['/reviews*']}}]\n    when: [{key: 'request.auth.claims[groups]', values: [admins]}]\n";

/// The status of GET `path` at the gateway `addr`, with `token` as a bearer token.
fn status(addr: &str, path: &str, token: Option<&str>) -> u16 {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    http_get(addr, "shop.example.com", path, &headers).map_or(0, |r| r.status)
}

/// With the key set inline: no token is refused by the policy (403), a token that does
/// not verify by the JWT filter (401: another key, expired), and the policy lets through
/// alice at /productpage and an admin at /reviews only.
#[test]
fn request_authentication_checks_tokens_and_authorization_decides_on_their_claims() {
    let m = gateway_mesh(
        "gw-jwt",
        Ads::Delta,
        &[("/productpage", "productpage"), ("/reviews", "reviews")],
    );
    let issuer = Issuer::new();
    let rule = format!("    jwks: '{}'\n", issuer.jwks());
    m.meshd.write("ra.yaml", &request_authentication(&rule));
    m.meshd.write("policy.yaml", POLICY);
    let alice = issuer.token("alice", serde_json::json!({"groups": ["dev"]}), false);
    let bob = issuer.token(
        "bob",
        serde_json::json!({"groups": ["ops", "admins"]}),
        false,
    );
    wait_until(
        "alice alone to reach /productpage",
        Duration::from_secs(10),
        || {
            status(&m.addr, "/productpage", None) == 403
                && status(&m.addr, "/productpage", Some(&alice)) == 200
        },
    );
    assert_eq!(status(&m.addr, "/productpage", Some(&bob)), 403);
    assert_eq!(status(&m.addr, "/reviews", Some(&bob)), 200);
    assert_eq!(status(&m.addr, "/reviews", Some(&alice)), 403);
    let forged = Issuer::new().token("alice", serde_json::json!({}), false);
    assert_eq!(status(&m.addr, "/productpage", Some(&forged)), 401);
    let expired = issuer.token("alice", serde_json::json!({}), true);
    assert_eq!(status(&m.addr, "/productpage", Some(&expired)), 401);
    let rejected = m.envoy.rejected_updates();
    assert!(rejected.is_empty(), "{rejected:?}");
}

/// A key set server: answers every request with `body` (200), counting requests.
fn key_set_server(body: String) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, count)
}

/// With a `jwksUri`, meshd fetches the key set and Envoy gets it inline; while the URI
/// answers with a key set Envoy would refuse, meshd does not send it, every token is
/// refused (fail closed), and the failed fetches are counted.
#[test]
fn meshd_fetches_a_rules_jwks_uri_and_fails_closed_without_it() {
    let m = gateway_mesh(
        "gw-jwks-uri",
        Ads::Delta,
        &[("/productpage", "productpage"), ("/reviews", "reviews")],
    );
    let issuer = Issuer::new();
    let alice = issuer.token("alice", serde_json::json!({}), false);
    // A server answering with a key set Envoy would refuse (an EC key without its
    // point): meshd does not use it.
    let (broken, _) = key_set_server(r#"{"keys": [{"kty": "EC", "crv": "P-256"}]}"#.into());
    let rule = |port: u16| format!("    jwksUri: http://127.0.0.1:{port}/keys.json\n");
    m.meshd
        .write("ra.yaml", &request_authentication(&rule(broken)));
    m.meshd.write("policy.yaml", POLICY);
    wait_until(
        "the failed fetch to be counted",
        Duration::from_secs(10),
        || {
            m.meshd
                .metric("pilot_jwks_resolver_network_fetch_fail_total")
                >= 1.0
        },
    );
    wait_until(
        "the gateway to refuse alice's token",
        Duration::from_secs(10),
        || status(&m.addr, "/productpage", Some(&alice)) == 401,
    );
    let (port, fetches) = key_set_server(issuer.jwks());
    m.meshd
        .write("ra.yaml", &request_authentication(&rule(port)));
    wait_until(
        "alice to reach /productpage",
        Duration::from_secs(10),
        || status(&m.addr, "/productpage", Some(&alice)) == 200,
    );
    assert!(fetches.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    assert!(
        m.meshd
            .metric("pilot_jwks_resolver_network_fetch_success_total")
            >= 1.0
    );
    assert_eq!(status(&m.addr, "/productpage", None), 403);
    // The key set reached Envoy inline: it never fetched anything itself.
    let dump = m.envoy.config_dump("dynamic_listeners");
    assert!(dump.contains("local_jwks"), "{dump}");
    let rejected = m.envoy.rejected_updates();
    assert!(rejected.is_empty(), "{rejected:?}");
}
