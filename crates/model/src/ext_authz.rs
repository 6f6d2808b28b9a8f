//! What istiod checks of a MeshConfig `extensionProviders` authorizer before it builds
//! anything from it (`processExtensionProvider`); validation reports it, and translation
//! fails closed on it.

use super::mesh::ExtensionProvider;

/// The HTTP statuses Envoy's `envoy.type.v3.StatusCode` names (its zero value `Empty`
/// left out): istiod accepts a `statusOnError` only from these.
pub const ENVOY_STATUS_CODES: [i32; 56] = [
    100, 200, 201, 202, 203, 204, 205, 206, 207, 208, 226, 300, 301, 302, 303, 304, 305, 307, 308,
    400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415, 416, 417, 421,
    422, 423, 424, 426, 428, 429, 431, 500, 501, 502, 503, 504, 505, 506, 507, 508, 510, 511,
];

/// What istiod finds wrong with a provider before looking up its service
/// (`processExtensionProvider`): its name, its port, `statusOnError`, `pathPrefix`, and a
/// lone `*` in a header list. `Ok` for providers that are not authorizers.
pub fn check(p: &ExtensionProvider, all: &[ExtensionProvider]) -> Result<(), ProviderError> {
    use ProviderError as E;
    if p.name.is_empty() {
        return Err(E::EmptyName);
    }
    if all.iter().filter(|o| o.name == p.name).count() > 1 {
        return Err(E::DuplicateName(p.name.clone()));
    }
    let name_ok = p.name.len() <= 63
        && (p.name.bytes()).all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !p.name.starts_with('-')
        && !p.name.ends_with('-');
    if !name_ok {
        return Err(E::InvalidName(p.name.clone()));
    }
    let (port, status, timeout) = match (&p.envoy_ext_authz_http, &p.envoy_ext_authz_grpc) {
        (Some(h), _) => {
            if !h.path_prefix.is_empty() && !h.path_prefix.starts_with('/') {
                return Err(E::PathPrefix(h.path_prefix.clone()));
            }
            let lists = [
                (
                    "includeRequestHeadersInCheck",
                    &h.include_request_headers_in_check,
                ),
                ("includeHeadersInCheck", &h.include_headers_in_check),
                ("headersToUpstreamOnAllow", &h.headers_to_upstream_on_allow),
                (
                    "headersToDownstreamOnDeny",
                    &h.headers_to_downstream_on_deny,
                ),
                (
                    "headersToDownstreamOnAllow",
                    &h.headers_to_downstream_on_allow,
                ),
            ];
            if let Some((field, _)) = lists.iter().find(|(_, v)| v.iter().any(|h| h == "*")) {
                return Err(E::Wildcard(field));
            }
            (h.port, &h.status_on_error, &h.timeout)
        }
        (None, Some(g)) => (g.port, &g.status_on_error, &g.timeout),
        (None, None) => return Ok(()),
    };
    if !(1..=65535).contains(&port) {
        return Err(E::Port(port));
    }
    status_on_error(status)?;
    if let Some(t) = timeout {
        api::duration::parse(t).map_err(|error| E::Timeout {
            timeout: t.clone(),
            error,
        })?;
    }
    Ok(())
}

/// What istiod finds wrong with an extension provider, in istiod's words.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProviderError {
    #[error("extension provider name must not be empty")]
    EmptyName,
    #[error("extension provider name must be unique, found duplicate: {0}")]
    DuplicateName(String),
    #[error(
        "invalid provider name {0:?}: lowercase letters, digits and hyphens, at most 63, not starting or ending with a hyphen"
    )]
    InvalidName(String),
    #[error("pathPrefix must begin with `/`, found: {0:?}")]
    PathPrefix(String),
    #[error(
        "a single wildcard (\"*\") is not supported, change it to either prefix or suffix match: {0}"
    )]
    Wildcard(&'static str),
    #[error("port must be in the range [1, 65535], found: {0}")]
    Port(u32),
    #[error("invalid statusOnError {status:?}: {error}")]
    StatusNotANumber {
        status: String,
        error: std::num::ParseIntError,
    },
    #[error("unsupported statusOnError {0}")]
    UnsupportedStatus(String),
    #[error("invalid timeout {timeout:?}: {error}")]
    Timeout {
        timeout: String,
        error: api::duration::DurationError,
    },
}

/// A provider's `statusOnError`: `None` when unset, else an HTTP status Envoy names.
pub fn status_on_error(status: &str) -> Result<Option<i32>, ProviderError> {
    if status.is_empty() {
        return Ok(None);
    }
    let code: i32 = status
        .parse()
        .map_err(|error| ProviderError::StatusNotANumber {
            status: status.to_string(),
            error,
        })?;
    if !ENVOY_STATUS_CODES.contains(&code) {
        return Err(ProviderError::UnsupportedStatus(status.to_string()));
    }
    Ok(Some(code))
}
