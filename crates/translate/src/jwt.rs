//! RequestAuthentication → Envoy's `jwt_authn` HTTP filter, as istiod's
//! `convertToEnvoyJwtConfig` builds it for a sidecar's inbound connection managers and a
//! gateway's: one provider `origins-N` per JWT rule (rules sorted by issuer), its key set
//! inline ([`model::PushContext::key_set`]), the verified payload written to the
//! request's metadata under `payload`, where AuthorizationPolicy's `requestPrincipals` and
//! `request.auth.*` conditions read it ([`super::authz`]). A request with a token that
//! does not verify is refused (401); one without a token passes, for authorization to
//! decide.

use envoy_api::pb::envoy::config::core::v3::{DataSource, data_source};
use envoy_api::pb::envoy::config::route::v3::{RouteMatch, route_match::PathSpecifier};
use envoy_api::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    JwtAuthentication, JwtClaimToHeader, JwtHeader, JwtProvider, JwtRequirement,
    JwtRequirementAndList, JwtRequirementOrList, RequirementRule, jwt_provider,
    jwt_requirement::RequiresType, requirement_rule::RequirementType,
};
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter,
};
use envoy_api::pb::google::protobuf::{Any, Empty};
use prost::Message;

use model::{Proxy, ProxyKind, PushContext};

/// Envoy's JWT filter, by name; also the namespace of the request metadata it writes.
pub const JWT_FILTER: &str = "envoy.filters.http.jwt_authn";
/// The metadata key each provider writes the verified payload under (istiod's
/// `EnvoyJwtFilterPayload`).
pub const PAYLOAD: &str = "payload";
const TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication";

/// The claims Envoy splits on spaces in the metadata, besides a rule's own
/// `spaceDelimitedClaims` (istiod's `buildSpaceDelimitedClaims`).
const SPACE_DELIMITED: [&str; 2] = ["permission", "scope"];

/// The JWT filter for `proxy`'s inbound or gateway connection managers; `None` when no
/// RequestAuthentication applies to it.
pub fn http_filter(ctx: &PushContext, proxy: &Proxy) -> Option<HttpFilter> {
    let rules = ctx.jwt_rules_for(proxy);
    if rules.is_empty() {
        return None;
    }
    let mut providers = Vec::with_capacity(rules.len());
    for (i, rule) in rules.iter().enumerate() {
        let mut claims: Vec<String> = SPACE_DELIMITED.iter().map(|c| c.to_string()).collect();
        claims.extend(rule.space_delimited_claims.iter().cloned());
        claims.sort();
        claims.dedup();
        let provider = JwtProvider {
            issuer: rule.issuer.clone(),
            audiences: rule.audiences.clone(),
            forward: rule.forward_original_token == Some(true),
            forward_payload_header: rule.output_payload_to_header.clone().unwrap_or_default(),
            payload_in_metadata: PAYLOAD.into(),
            normalize_payload_in_metadata: Some(jwt_provider::NormalizePayload {
                space_delimited_claims: claims,
            }),
            clear_route_cache: proxy.kind == ProxyKind::Router,
            claim_to_headers: (rule.output_claim_to_headers.iter())
                .map(|c| JwtClaimToHeader {
                    header_name: c.header.clone(),
                    claim_name: c.claim.clone(),
                    ..Default::default()
                })
                .collect(),
            from_headers: (rule.from_headers.iter())
                .map(|h| JwtHeader {
                    name: h.name.clone(),
                    value_prefix: h.prefix.clone().unwrap_or_default(),
                })
                .collect(),
            from_params: rule.from_params.clone(),
            from_cookies: rule.from_cookies.clone(),
            jwks_source_specifier: Some(jwt_provider::JwksSourceSpecifier::LocalJwks(DataSource {
                specifier: Some(data_source::Specifier::InlineString(
                    ctx.key_set(rule).to_string(),
                )),
                ..Default::default()
            })),
            ..Default::default()
        };
        providers.push((format!("origins-{i}"), provider));
    }
    let name = |n: &str| JwtRequirement {
        requires_type: Some(RequiresType::ProviderName(n.to_string())),
    };
    // Each provider's token verifies or is absent.
    let verified_or_missing: Vec<JwtRequirement> = (providers.iter())
        .map(|(n, _)| JwtRequirement {
            requires_type: Some(RequiresType::RequiresAny(JwtRequirementOrList {
                requirements: vec![
                    name(n),
                    JwtRequirement {
                        requires_type: Some(RequiresType::AllowMissing(Empty {})),
                    },
                ],
            })),
        })
        .collect();
    let requires = match <[JwtRequirement; 1]>::try_from(verified_or_missing) {
        Ok([one]) => one,
        // With several: one provider's token verifies, or every one is absent or valid.
        Err(all) => {
            let mut any: Vec<JwtRequirement> = providers.iter().map(|(n, _)| name(n)).collect();
            any.push(JwtRequirement {
                requires_type: Some(RequiresType::RequiresAll(JwtRequirementAndList {
                    requirements: all,
                })),
            });
            JwtRequirement {
                requires_type: Some(RequiresType::RequiresAny(JwtRequirementOrList {
                    requirements: any,
                })),
            }
        }
    };
    let config = JwtAuthentication {
        rules: vec![RequirementRule {
            r#match: Some(RouteMatch {
                path_specifier: Some(PathSpecifier::Prefix("/".into())),
                ..Default::default()
            }),
            requirement_type: Some(RequirementType::Requires(requires)),
        }],
        bypass_cors_preflight: true,
        ..Default::default()
    };
    // prost writes a map in hash order: each provider is appended as its own map entry,
    // in rule order, so that the same rules always encode to the same bytes.
    let mut value = config.encode_to_vec();
    for (name, provider) in providers {
        let entry = JwtAuthentication {
            providers: [(name, provider)].into_iter().collect(),
            ..Default::default()
        };
        entry.encode(&mut value).expect("a Vec grows");
    }
    Some(HttpFilter {
        name: JWT_FILTER.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(Any {
            type_url: TYPE_URL.into(),
            value,
        })),
        ..Default::default()
    })
}
