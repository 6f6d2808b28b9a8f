//! AuthorizationPolicy `action: CUSTOM`: external authorization by a MeshConfig
//! `extensionProviders` entry, as istiod builds it (`authz/builder/extauthz.go`).
//!
//! The CUSTOM policies of a workload become an RBAC filter in shadow mode: it enforces
//! nothing, but when one of their rules matches it records the rule's name,
//! `istio-ext-authz-PROVIDER-ns[NS]-policy[NAME]-rule[I]`, in the dynamic metadata key
//! `istio_ext_authz_shadow_effective_policy_id`. Envoy's `ext_authz` filter that follows
//! asks the provider only when that name is there. So requests no CUSTOM rule matches
//! never reach the authorizer. The pair comes before the DENY and ALLOW filters, Istio's
//! order (CUSTOM, DENY, ALLOW).
//!
//! A provider that is missing, malformed or names a service meshd does not know fails
//! closed: the CUSTOM rules become DENY rules (`...-deny-due-to-bad-CUSTOM-action`). So
//! does naming a second provider for one workload (istiod's default). On TCP ports only
//! a gRPC provider applies (Envoy's network `ext_authz`); an HTTP provider is skipped
//! there, as istiod skips it.

use std::collections::BTreeMap;

use envoy_api::pb::envoy::config::core::v3::{
    ApiVersion, GrpcService, HeaderValue, HttpUri, grpc_service, http_uri,
};
use envoy_api::pb::envoy::config::listener::v3::{Filter, filter::ConfigType};
use envoy_api::pb::envoy::config::rbac::v3::{
    Permission, Policy, Principal, Rbac, permission, principal, rbac::Action,
};
use envoy_api::pb::envoy::extensions::filters::http::ext_authz::v3::{
    AuthorizationRequest, AuthorizationResponse, BufferSettings, ExtAuthz, HttpService,
    ext_authz::Services,
};
use envoy_api::pb::envoy::extensions::filters::network::ext_authz::v3::ExtAuthz as TcpExtAuthz;
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter,
};
use envoy_api::pb::envoy::r#type::matcher::v3::{
    ListStringMatcher, MetadataMatcher, StringMatcher, ValueMatcher, metadata_matcher,
    string_matcher::MatchPattern, value_matcher,
};
use envoy_api::pb::envoy::r#type::v3::HttpStatus;
use envoy_api::util::pack_any;

use super::{authz, outbound_cluster_name};
use crate::canonical;
use api::security::{AuthorizationAction, AuthorizationPolicySpec};
use model::PushContext;
use model::config::ConfigObject;
use model::mesh::ExtAuthzRequestBody;

const MATCH_PREFIX: &str = "istio-ext-authz";
/// The RBAC filter's shadow rules' stat prefix, and so its dynamic metadata keys' prefix.
const SHADOW_PREFIX: &str = "istio_ext_authz_";
const BAD_CUSTOM_SUFFIX: &str = "-deny-due-to-bad-CUSTOM-action";

/// Why an extension provider's filters or tracer cannot be built for a proxy; such a
/// CUSTOM policy fails closed, and a tracer is left out.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("could not find service {0} in Istio service registry")]
    UnknownService(String),
    #[error("available providers are {known:?} but found {name:?}")]
    UnknownProvider { name: String, known: Vec<String> },
    #[error(transparent)]
    Invalid(#[from] model::ext_authz::ProviderError),
    #[error("multiple CUSTOM authorization providers per workload are not supported, found {0:?}")]
    Several(Vec<String>),
    #[error(
        "provider {0:?} is not an external authorizer (envoyExtAuthzHttp or envoyExtAuthzGrpc)"
    )]
    NotAnAuthorizer(String),
    #[error("provider {0:?} is not a tracer")]
    NotATracer(String),
}

/// A provider's `statusOnError` as Envoy's status.
fn status_on_error(status: &str) -> Result<Option<HttpStatus>, ProviderError> {
    let code = model::ext_authz::status_on_error(status)?;
    Ok(code.map(|code| HttpStatus { code }))
}

/// istiod's `LookupCluster`: `[namespace/]hostname` to its host and `outbound|PORT||HOST`.
pub(super) fn lookup_cluster(
    ctx: &PushContext,
    service: &str,
    port: u32,
) -> Result<(String, String), ProviderError> {
    let host = ctx
        .provider_host(service)
        .ok_or_else(|| ProviderError::UnknownService(service.to_string()))?;
    Ok((host.to_string(), outbound_cluster_name(port, "", host)))
}

/// A provider's filters: the HTTP filter always, the network one for gRPC providers.
struct Built {
    http: ExtAuthz,
    tcp: Option<TcpExtAuthz>,
}

fn build(ctx: &PushContext, name: &str) -> Result<Built, ProviderError> {
    let all = &ctx.mesh.extension_providers;
    let p =
        (all.iter())
            .find(|p| p.name == name)
            .ok_or_else(|| ProviderError::UnknownProvider {
                name: name.to_string(),
                known: all.iter().map(|p| p.name.clone()).collect(),
            })?;
    model::ext_authz::check(p, all)?;
    let timeout = |t: &Option<String>| {
        let t = t.as_deref().and_then(|t| api::duration::parse(t).ok());
        Some(super::duration(
            t.unwrap_or(std::time::Duration::from_secs(600)),
        ))
    };
    let enabled = |filter: &str| Some(filter_enabled(filter, name));
    if let Some(h) = &p.envoy_ext_authz_http {
        let (host, cluster) = lookup_cluster(ctx, &h.service, h.port)?;
        let mut service = HttpService {
            path_prefix: h.path_prefix.clone(),
            server_uri: Some(HttpUri {
                uri: format!("http://{host}"),
                timeout: timeout(&h.timeout),
                http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(cluster)),
            }),
            ..Default::default()
        };
        if !h.include_additional_headers_in_check.is_empty() {
            // Sorted by name: a BTreeMap.
            let headers_to_add = (h.include_additional_headers_in_check.iter())
                .map(|(key, value)| HeaderValue {
                    key: key.clone(),
                    value: value.clone(),
                    ..Default::default()
                })
                .collect();
            service.authorization_request = Some(AuthorizationRequest {
                headers_to_add,
                ..Default::default()
            });
        }
        let response_lists = [
            &h.headers_to_upstream_on_allow,
            &h.headers_to_downstream_on_deny,
            &h.headers_to_downstream_on_allow,
        ];
        if response_lists.iter().any(|l| !l.is_empty()) {
            service.authorization_response = Some(AuthorizationResponse {
                allowed_upstream_headers: headers(&h.headers_to_upstream_on_allow),
                allowed_client_headers: headers(&h.headers_to_downstream_on_deny),
                allowed_client_headers_on_success: headers(&h.headers_to_downstream_on_allow),
                ..Default::default()
            });
        }
        let allowed = headers(&h.include_request_headers_in_check)
            .or_else(|| headers(&h.include_headers_in_check));
        let http = ExtAuthz {
            status_on_error: status_on_error(&h.status_on_error)?,
            failure_mode_allow: h.fail_open,
            transport_api_version: ApiVersion::V3 as i32,
            services: Some(Services::HttpService(service)),
            filter_enabled_metadata: enabled(super::authz::HTTP_RBAC_FILTER),
            with_request_body: body(h.include_request_body_in_check.as_ref()),
            allowed_headers: allowed,
            ..Default::default()
        };
        return Ok(Built { http, tcp: None });
    }
    let Some(g) = &p.envoy_ext_authz_grpc else {
        return Err(ProviderError::NotAnAuthorizer(name.to_string()));
    };
    let (host, cluster) = lookup_cluster(ctx, &g.service, g.port)?;
    let grpc = GrpcService {
        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
            grpc_service::EnvoyGrpc {
                cluster_name: cluster,
                authority: host,
                ..Default::default()
            },
        )),
        timeout: timeout(&g.timeout),
        ..Default::default()
    };
    let http = ExtAuthz {
        status_on_error: status_on_error(&g.status_on_error)?,
        failure_mode_allow: g.fail_open,
        services: Some(Services::GrpcService(grpc.clone())),
        filter_enabled_metadata: enabled(super::authz::HTTP_RBAC_FILTER),
        transport_api_version: ApiVersion::V3 as i32,
        with_request_body: body(g.include_request_body_in_check.as_ref()),
        ..Default::default()
    };
    let tcp = TcpExtAuthz {
        stat_prefix: "tcp.".into(),
        failure_mode_allow: g.fail_open,
        transport_api_version: ApiVersion::V3 as i32,
        grpc_service: Some(grpc),
        filter_enabled_metadata: enabled("envoy.filters.network.rbac"),
        ..Default::default()
    };
    Ok(Built {
        http,
        tcp: Some(tcp),
    })
}

/// Header names as istiod matches them: case-insensitive, `*x` a suffix, `x*` a prefix.
fn headers(names: &[String]) -> Option<ListStringMatcher> {
    if names.is_empty() {
        return None;
    }
    let patterns = names
        .iter()
        .map(|h| {
            let pattern = if let Some(suffix) = h.strip_prefix('*') {
                MatchPattern::Suffix(suffix.into())
            } else if let Some(prefix) = h.strip_suffix('*') {
                MatchPattern::Prefix(prefix.into())
            } else {
                MatchPattern::Exact(h.clone())
            };
            StringMatcher {
                match_pattern: Some(pattern),
                ignore_case: true,
            }
        })
        .collect();
    Some(ListStringMatcher { patterns })
}

fn body(b: Option<&ExtAuthzRequestBody>) -> Option<BufferSettings> {
    b.map(|b| BufferSettings {
        max_request_bytes: b.max_request_bytes,
        allow_partial_message: b.allow_partial_message,
        pack_as_bytes: b.pack_as_bytes,
    })
}

/// Calls the authorizer only when the shadow RBAC filter `filter` recorded a CUSTOM rule of
/// `provider` as matched.
fn filter_enabled(filter: &str, provider: &str) -> MetadataMatcher {
    MetadataMatcher {
        filter: filter.into(),
        path: vec![metadata_matcher::PathSegment {
            segment: Some(metadata_matcher::path_segment::Segment::Key(format!(
                "{SHADOW_PREFIX}{}",
                super::authz::SHADOW_EFFECTIVE_POLICY_ID
            ))),
        }],
        value: Some(ValueMatcher {
            match_pattern: Some(value_matcher::MatchPattern::StringMatch(StringMatcher {
                match_pattern: Some(MatchPattern::Prefix(format!("{MATCH_PREFIX}-{provider}"))),
                ignore_case: false,
            })),
        }),
        invert: false,
    }
}

/// istiod's `rbacPolicyMatchNever`: for a CUSTOM policy without rules.
fn match_never() -> Policy {
    Policy {
        permissions: vec![Permission {
            rule: Some(permission::Rule::NotRule(Box::new(Permission {
                rule: Some(permission::Rule::Any(true)),
            }))),
        }],
        principals: vec![Principal {
            identifier: Some(principal::Identifier::NotId(Box::new(Principal {
                identifier: Some(principal::Identifier::Any(true)),
            }))),
        }],
        ..Default::default()
    }
}

/// The CUSTOM policies applying to a port, by provider: their rules as DENY-action RBAC
/// policies (so a TCP rule with HTTP-only fields matches more, never less), named for
/// the provider.
fn rules_by_provider(
    policies: &[(&ConfigObject, &AuthorizationPolicySpec)],
    http: bool,
) -> BTreeMap<String, Rbac> {
    let mut out: BTreeMap<String, Rbac> = BTreeMap::new();
    for (obj, spec) in policies {
        if spec.action != Some(AuthorizationAction::Custom) {
            continue;
        }
        let provider = spec.provider.as_ref().map_or("", |p| p.name.as_str());
        let rbac = out.entry(provider.to_string()).or_insert_with(|| Rbac {
            action: Action::Deny as i32,
            ..Default::default()
        });
        let name = |i: usize| {
            let (ns, policy) = (&obj.key.namespace, &obj.key.name);
            format!("{MATCH_PREFIX}-{provider}-ns[{ns}]-policy[{policy}]-rule[{i}]")
        };
        if spec.rules.is_empty() {
            rbac.policies.insert(name(0), match_never());
        }
        for (i, r) in spec.rules.iter().enumerate() {
            if let Some(p) = authz::rule_policy(r, http, AuthorizationAction::Deny) {
                rbac.policies.insert(name(i), p);
            }
        }
    }
    out
}

/// The CUSTOM rules as enforced DENY rules: what a provider that cannot be used gets.
fn bad_custom_deny(rules: &Rbac) -> Rbac {
    Rbac {
        action: Action::Deny as i32,
        policies: (rules.policies.iter())
            .map(|(name, p)| (format!("{name}{BAD_CUSTOM_SUFFIX}"), p.clone()))
            .collect(),
        ..Default::default()
    }
}

/// Why the providers of one port cannot be used, if they cannot: each must build, and
/// istiod allows one provider per workload by default.
fn usable(
    ctx: &PushContext,
    by_provider: &BTreeMap<String, Rbac>,
) -> Result<Vec<Built>, ProviderError> {
    if by_provider.len() > 1 {
        return Err(ProviderError::Several(
            by_provider.keys().cloned().collect(),
        ));
    }
    by_provider.keys().map(|name| build(ctx, name)).collect()
}

/// The CUSTOM filters of an inbound HTTP connection manager, before the RBAC ones.
pub fn http_filters(
    ctx: &PushContext,
    policies: &[(&ConfigObject, &AuthorizationPolicySpec)],
) -> Vec<HttpFilter> {
    let by_provider = rules_by_provider(policies, true);
    let rbac = authz::http_rbac_filter;
    match usable(ctx, &by_provider) {
        Ok(built) => (by_provider.values().zip(built))
            .flat_map(|(rules, b)| {
                [
                    rbac(canonical::encode_rbac_filter(
                        None,
                        Some((rules, SHADOW_PREFIX)),
                        None,
                    )),
                    HttpFilter {
                        name: "envoy.filters.http.ext_authz".into(),
                        config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(b.http))),
                        ..Default::default()
                    },
                ]
            })
            .collect(),
        Err(problem) => {
            // Reported by the push context's cross-checks and the mesh config's validation.
            tracing::debug!(%problem, "CUSTOM authorization denies what its rules match");
            (by_provider.values())
                .map(|r| {
                    rbac(canonical::encode_rbac_filter(
                        Some(&bad_custom_deny(r)),
                        None,
                        None,
                    ))
                })
                .collect()
        }
    }
}

/// The CUSTOM filters of an inbound TCP chain, before the RBAC ones: gRPC providers only.
pub fn network_filters(
    ctx: &PushContext,
    policies: &[(&ConfigObject, &AuthorizationPolicySpec)],
) -> Vec<Filter> {
    let by_provider = rules_by_provider(policies, false);
    let rbac = authz::network_rbac_filter;
    match usable(ctx, &by_provider) {
        Ok(built) => (by_provider.values().zip(built))
            .filter_map(|(rules, b)| Some((rules, b.tcp?)))
            .flat_map(|(rules, tcp)| {
                [
                    rbac(canonical::encode_rbac_filter(
                        None,
                        Some((rules, SHADOW_PREFIX)),
                        Some("tcp."),
                    )),
                    Filter {
                        name: "envoy.filters.network.ext_authz".into(),
                        config_type: Some(ConfigType::TypedConfig(pack_any(tcp))),
                    },
                ]
            })
            .collect(),
        Err(_) => (by_provider.values())
            .map(|r| {
                rbac(canonical::encode_rbac_filter(
                    Some(&bad_custom_deny(r)),
                    None,
                    Some("tcp."),
                ))
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use envoy_api::pb::envoy::r#type::v3::StatusCode;

    #[test]
    fn the_models_status_codes_are_envoys() {
        let envoys: Vec<i32> = (1..1000)
            .filter(|c| StatusCode::try_from(*c).is_ok())
            .collect();
        assert_eq!(envoys, model::ext_authz::ENVOY_STATUS_CODES);
    }
}
