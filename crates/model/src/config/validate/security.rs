//! RequestAuthentication and AuthorizationPolicy.

use super::*;

/// RequestAuthentication, as istiod's `ValidateRequestAuthentication`: each rule names an
/// issuer or a `jwksUri`, the URI is an http(s) URL, inline `jwks` is a key set, header,
/// parameter and cookie names and audiences are not empty, `timeout` is a duration.
/// `targetRef(s)` are refused, as for AuthorizationPolicy.
pub(super) fn request_authentication(
    r: &mut Report,
    ra: &api::security::RequestAuthenticationSpec,
) {
    no_target_refs(r, &ra.target_ref, &ra.target_refs);
    for (i, rule) in ra.jwt_rules.iter().enumerate() {
        let f = format!("spec.jwtRules[{i}]");
        let uri = rule.jwks_uri.as_deref().unwrap_or("");
        if rule.issuer.is_empty() && uri.is_empty() {
            r.error(
                format!("{f}.issuer"),
                "issuer or jwksUri must be non-empty string",
            );
        }
        if !uri.is_empty()
            && let Err(e) = crate::jwks::parse_uri(uri)
        {
            r.error(format!("{f}.jwksUri"), e.to_string());
        }
        if let Some(jwks) = rule.jwks.as_deref()
            && let Err(e) = crate::jwks::check_key_set(jwks)
        {
            r.error(format!("{f}.jwks"), format!("jwks parse error: {e}"));
        }
        for (j, a) in rule.audiences.iter().enumerate() {
            if a.is_empty() {
                let message = "audience must be non-empty string";
                r.error(format!("{f}.audiences[{j}]"), message);
            }
        }
        for (j, h) in rule.from_headers.iter().enumerate() {
            if h.name.is_empty() {
                let message = "location header name must be non-empty string";
                r.error(format!("{f}.fromHeaders[{j}].name"), message);
            }
        }
        for (j, p) in rule.from_params.iter().enumerate() {
            if p.is_empty() {
                let message = "location query must be non-empty string";
                r.error(format!("{f}.fromParams[{j}]"), message);
            }
        }
        for (j, c) in rule.from_cookies.iter().enumerate() {
            if c.is_empty() {
                r.error(
                    format!("{f}.fromCookies[{j}]"),
                    "cookie name must be non-empty string",
                );
            }
        }
        for (j, c) in rule.output_claim_to_headers.iter().enumerate() {
            let valid_header = !c.header.is_empty()
                && (c.header.bytes()).all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if c.claim.is_empty() || !valid_header {
                r.error(
                    format!("{f}.outputClaimToHeaders[{j}]"),
                    "header and claim value must be non-empty, the header a valid header name",
                );
            }
        }
        r.duration(format!("{f}.timeout"), &rule.timeout);
    }
}

/// AuthorizationPolicy: what meshd cannot enforce is refused, never applied in part.
pub(super) fn authorization_policy(r: &mut Report, ap: &api::security::AuthorizationPolicySpec) {
    use api::security::AuthorizationAction;
    // As istiod's validation: CUSTOM names its provider, and only CUSTOM does.
    let custom = ap.action == Some(AuthorizationAction::Custom);
    match &ap.provider {
        None if custom => r.error(
            "spec.provider",
            "must specify provider when using CUSTOM action",
        ),
        Some(p) if custom && p.name.is_empty() => {
            r.error("spec.provider.name", "must not be empty")
        }
        Some(_) if !custom => r.error(
            "spec.provider",
            "provider must only be specified when using CUSTOM action",
        ),
        _ => {}
    }
    no_target_refs(r, &ap.target_ref, &ap.target_refs);
    for (i, rule) in ap.rules.iter().enumerate() {
        for (j, from) in rule.from.iter().enumerate() {
            let s = &from.source;
            for (k, block) in s.ip_blocks.iter().chain(&s.remote_ip_blocks).enumerate() {
                if !valid_cidr(block) {
                    r.error(
                        format!("spec.rules[{i}].from[{j}].source.ipBlocks[{k}]"),
                        format!("{block:?} is not an IP or CIDR"),
                    );
                }
            }
        }
        for (j, to) in rule.to.iter().enumerate() {
            for (k, port) in to
                .operation
                .ports
                .iter()
                .chain(&to.operation.not_ports)
                .enumerate()
            {
                if port.parse::<u16>().is_err() {
                    r.error(
                        format!("spec.rules[{i}].to[{j}].operation.ports[{k}]"),
                        format!("{port:?} is not a port number"),
                    );
                }
            }
        }
        for (j, c) in rule.when.iter().enumerate() {
            if !api::values::condition_key_supported(&c.key) {
                r.error(
                    format!("spec.rules[{i}].when[{j}].key"),
                    format!("{:?} is not a condition key meshd supports", c.key),
                );
            }
        }
    }
}
