//! How meshd reads values of Istio's API that its types leave free-form or as names: a
//! Gateway server's `tls`, `grpcStatus` names, and AuthorizationPolicy condition keys.
//! Validation and translation both read them here, so they agree.

use crate::AnyObject;

/// A Gateway server's `tls` string field `key`, unless unset or empty.
pub fn server_tls_field<'a>(tls: &'a AnyObject, key: &str) -> Option<&'a str> {
    tls.get(key)
        .and_then(|v| v.as_str())
        .filter(|v| !v.is_empty())
}

/// Whether a Gateway server's `tls` asks for `httpsRedirect`: its HTTP virtual hosts then
/// answer every plaintext request with a redirect to HTTPS.
pub fn https_redirect(tls: Option<&AnyObject>) -> bool {
    tls.and_then(|t| t.get("httpsRedirect"))
        .and_then(|v| v.as_bool())
        .unwrap_or(false)
}

/// A Gateway server's `tls.mode`, upper-case: PASSTHROUGH when unset or empty, Istio's
/// default (the enum's zero value).
pub fn server_tls_mode(tls: &AnyObject) -> String {
    server_tls_field(tls, "mode").map_or_else(|| "PASSTHROUGH".to_string(), str::to_ascii_uppercase)
}

/// gRPC status codes by the names Istio's `grpcStatus` takes.
const GRPC_CODES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The gRPC code a status name stands for.
pub fn grpc_code(name: &str) -> Option<u32> {
    GRPC_CODES.iter().position(|c| *c == name).map(|i| i as u32)
}

/// The `when` keys meshd evaluates: Istio's documented keys.
pub const SUPPORTED_CONDITION_KEYS: [&str; 12] = [
    "source.ip",
    "remote.ip",
    "source.namespace",
    "source.principal",
    "destination.ip",
    "destination.port",
    "connection.sni",
    "request.headers[",
    "request.auth.principal",
    "request.auth.audiences",
    "request.auth.presenter",
    "request.auth.claims[",
];

pub fn condition_key_supported(key: &str) -> bool {
    SUPPORTED_CONDITION_KEYS.iter().any(|k| {
        if *k == "request.auth.claims[" {
            key.strip_prefix(k)
                .is_some_and(|rest| claim_path(&format!("[{rest}")).is_some())
        } else if k.ends_with('[') {
            key.starts_with(k) && key.ends_with(']') && key.len() > k.len() + 1
        } else {
            key == *k
        }
    })
}

/// The claim names of `[a][b]` (a nested claim), or of `[a.b]` (one claim with a dot), as
/// istiod's `extractNameInNestedBrackets`; `None` when it is not such a path.
pub fn claim_path(brackets: &str) -> Option<Vec<String>> {
    let mut names = Vec::new();
    let mut rest = brackets;
    while !rest.is_empty() {
        let inner = rest.strip_prefix('[')?;
        let end = inner.find(']')?;
        let name = &inner[..end];
        if name.is_empty() || name.contains('[') {
            return None;
        }
        names.push(name.to_string());
        rest = &inner[end + 1..];
    }
    (!names.is_empty()).then_some(names)
}
