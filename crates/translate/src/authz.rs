//! AuthorizationPolicy → Envoy RBAC, evaluated as Istio does: AUDIT (a LOG filter), then
//! DENY, then ALLOW. If any ALLOW policy applies, a request no ALLOW rule matches is denied
//! (an ALLOW policy with no rules allows nothing). Each rule is one RBAC policy named
//! `ns[NS]-policy[NAME]-rule[I]`: its `from` sources become principals, its `to` operations
//! permissions, and its `when` conditions join whichever side their key belongs to.
//!
//! On TCP ports, HTTP-only fields (hosts, methods, paths, request headers) cannot be
//! checked: an ALLOW rule using them matches nothing, a DENY rule is applied without them
//! (so it denies more, never less). Fields meshd does not support are refused at
//! validation, so a policy is never half-applied open.

use envoy_api::pb::envoy::config::listener::v3::{Filter, filter::ConfigType};
use envoy_api::pb::envoy::config::rbac::v3::{
    Permission, Policy, Principal, Rbac, permission, principal, rbac::Action,
};
use envoy_api::pb::envoy::config::route::v3::{HeaderMatcher, header_matcher};
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter,
};
use envoy_api::pb::envoy::r#type::matcher::v3::{
    ListMatcher, MetadataMatcher, OrMatcher, PathMatcher, RegexMatcher, StringMatcher,
    ValueMatcher, list_matcher, metadata_matcher, path_matcher, string_matcher::MatchPattern,
    value_matcher,
};
use envoy_api::pb::google::protobuf::Any;

use super::cidr_range;
use crate::canonical;
use api::security::{AuthorizationAction, AuthorizationPolicySpec, Condition, Rule};
use api::values::claim_path;
use model::config::ConfigObject;

// ---------------------------------------------------------------- request authentication

/// A matcher on the verified JWT payload the JWT filter wrote ([`super::jwt`]) at `path`.
/// Envoy deprecates the principal's `metadata` for `sourced_metadata`; istiod still sends
/// `metadata`, and so does meshd.
#[allow(deprecated)]
fn jwt_payload(path: &[String], value: ValueMatcher) -> Principal {
    let path = std::iter::once(super::jwt::PAYLOAD.to_string())
        .chain(path.iter().cloned())
        .map(|key| metadata_matcher::PathSegment {
            segment: Some(metadata_matcher::path_segment::Segment::Key(key)),
        })
        .collect();
    id(principal::Identifier::Metadata(MetadataMatcher {
        filter: super::jwt::JWT_FILTER.into(),
        path,
        value: Some(value),
        invert: false,
    }))
}

fn string_value(m: StringMatcher) -> ValueMatcher {
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::StringMatch(m)),
    }
}

/// Any of `matchers`: the one itself when alone (Envoy's OrMatcher needs two or more).
fn value_or(mut matchers: Vec<ValueMatcher>) -> ValueMatcher {
    if matchers.len() == 1 {
        return matchers.remove(0);
    }
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
            value_matchers: matchers,
        })),
    }
}

/// A claim `path` that is one of `values` (Istio's patterns), as a string or a list
/// holding one (istiod's `MetadataListValueMatcherForJWTClaims`).
fn jwt_claim_in(path: &[String], values: &[String]) -> Principal {
    let any = value_or(
        (values.iter())
            .map(|v| string_value(string_match(v, false)))
            .collect(),
    );
    let in_list = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(
            ListMatcher {
                match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(any.clone()))),
            },
        ))),
    };
    jwt_payload(path, value_or(vec![in_list, any]))
}

/// A request principal `ISS/SUB` (split at the last `/`; `*`, `*SUFFIX`, `PREFIX*` and
/// `ISS/*` forms), as istiod's `requestPrincipalGenerator`: the payload's `iss` and `sub`.
fn request_principal(value: &str) -> Principal {
    let any = || regex(".+".into());
    let exact = |v: &str| string_match(v, false);
    let (iss, sub) = match value.rsplit_once('/') {
        Some((iss, sub)) => (iss, Some(sub)),
        None => (value, None),
    };
    let (iss, sub) = if value == "*" {
        (any(), any())
    } else if value.starts_with('*') {
        match sub {
            Some(sub) if iss == "*" => (any(), exact(sub)),
            Some(sub) => (exact(iss), exact(sub)),
            None => (any(), exact(value)),
        }
    } else if value.ends_with('*') {
        match sub {
            Some("*") => (exact(iss), any()),
            Some(sub) => (exact(iss), exact(sub)),
            None => (exact(value), any()),
        }
    } else {
        (exact(iss), exact(sub.unwrap_or("")))
    };
    all_of_ids(vec![
        jwt_payload(&["iss".into()], string_value(iss)),
        jwt_payload(&["sub".into()], string_value(sub)),
    ])
}

/// Istio's value patterns: `*` (present), `abc*` (prefix), `*abc` (suffix), exact.
fn string_match(value: &str, ignore_case: bool) -> StringMatcher {
    let pattern = if value == "*" {
        MatchPattern::SafeRegex(RegexMatcher {
            regex: ".+".into(),
            ..Default::default()
        })
    } else if let Some(p) = value.strip_suffix('*') {
        MatchPattern::Prefix(p.into())
    } else if let Some(s) = value.strip_prefix('*') {
        MatchPattern::Suffix(s.into())
    } else {
        MatchPattern::Exact(value.into())
    };
    StringMatcher {
        match_pattern: Some(pattern),
        ignore_case,
    }
}

fn regex(re: String) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(MatchPattern::SafeRegex(RegexMatcher {
            regex: re,
            ..Default::default()
        })),
        ignore_case: false,
    }
}

fn header(name: &str, value: &str, ignore_case: bool) -> HeaderMatcher {
    HeaderMatcher {
        name: name.into(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(
            string_match(value, ignore_case),
        )),
        ..Default::default()
    }
}

// ----------------------------------------------------------------- principals

fn id(p: principal::Identifier) -> Principal {
    Principal {
        identifier: Some(p),
    }
}

fn authenticated(m: StringMatcher) -> Principal {
    id(principal::Identifier::Authenticated(
        principal::Authenticated {
            principal_name: Some(m),
        },
    ))
}

/// `cluster.local/ns/shop/sa/reviews` (with `*` patterns) against the peer's URI SAN.
fn spiffe_principal(value: &str) -> Principal {
    if value.starts_with('*') {
        // `*` (any authenticated peer) or a suffix: no scheme to add.
        return authenticated(string_match(value, false));
    }
    authenticated(string_match(&format!("spiffe://{value}"), false))
}

fn namespace_principal(ns: &str) -> Principal {
    let pattern = regex_escape_with_wildcards(ns);
    authenticated(regex(format!("^spiffe://[^/]+/ns/{pattern}/.*")))
}

/// A namespace or similar with `*` wildcards, as a regex fragment.
fn regex_escape_with_wildcards(value: &str) -> String {
    value
        .split('*')
        .map(regex_escape)
        .collect::<Vec<_>>()
        .join("[^/]*")
}

fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn any_of_ids(ids: Vec<Principal>) -> Principal {
    if ids.len() == 1 {
        return ids.into_iter().next().unwrap();
    }
    id(principal::Identifier::OrIds(principal::Set { ids }))
}

fn all_of_ids(ids: Vec<Principal>) -> Principal {
    if ids.is_empty() {
        return id(principal::Identifier::Any(true));
    }
    if ids.len() == 1 {
        return ids.into_iter().next().unwrap();
    }
    id(principal::Identifier::AndIds(principal::Set { ids }))
}

fn not_id(p: Principal) -> Principal {
    id(principal::Identifier::NotId(Box::new(p)))
}

/// `values` matched by `one`, OR'ed; `not_values` NOT(OR)'ed; both AND'ed into `out`.
fn field<T>(
    out: &mut Vec<T>,
    values: &[String],
    not_values: &[String],
    one: impl Fn(&str) -> T,
    any: impl Fn(Vec<T>) -> T,
    not: impl Fn(T) -> T,
) {
    if !values.is_empty() {
        out.push(any(values.iter().map(|v| one(v)).collect()));
    }
    if !not_values.is_empty() {
        out.push(not(any(not_values.iter().map(|v| one(v)).collect())));
    }
}

/// A rule source's principal, and whether it named request principals, which only an
/// HTTP connection can have (left out of it when `http` is false).
fn source_principal(s: &api::security::Source, http: bool) -> (Principal, bool) {
    let mut and = Vec::new();
    let needs_http = !s.request_principals.is_empty() || !s.not_request_principals.is_empty();
    if http {
        field(
            &mut and,
            &s.request_principals,
            &s.not_request_principals,
            request_principal,
            any_of_ids,
            not_id,
        );
    }
    field(
        &mut and,
        &s.principals,
        &s.not_principals,
        spiffe_principal,
        any_of_ids,
        not_id,
    );
    field(
        &mut and,
        &s.namespaces,
        &s.not_namespaces,
        namespace_principal,
        any_of_ids,
        not_id,
    );
    let sa = |v: &str| {
        let (ns, sa) = v.split_once('/').unwrap_or(("*", v));
        authenticated(regex(format!(
            "^spiffe://[^/]+/ns/{}/sa/{}$",
            regex_escape_with_wildcards(ns),
            regex_escape_with_wildcards(sa)
        )))
    };
    field(
        &mut and,
        &s.service_accounts,
        &s.not_service_accounts,
        sa,
        any_of_ids,
        not_id,
    );
    let direct = |v: &str| id(principal::Identifier::DirectRemoteIp(cidr_range(v)));
    field(
        &mut and,
        &s.ip_blocks,
        &s.not_ip_blocks,
        direct,
        any_of_ids,
        not_id,
    );
    let remote = |v: &str| id(principal::Identifier::RemoteIp(cidr_range(v)));
    field(
        &mut and,
        &s.remote_ip_blocks,
        &s.not_remote_ip_blocks,
        remote,
        any_of_ids,
        not_id,
    );
    (all_of_ids(and), needs_http && !http)
}

// ---------------------------------------------------------------- permissions

fn rule(r: permission::Rule) -> Permission {
    Permission { rule: Some(r) }
}

fn any_of_rules(rules: Vec<Permission>) -> Permission {
    if rules.len() == 1 {
        return rules.into_iter().next().unwrap();
    }
    rule(permission::Rule::OrRules(permission::Set { rules }))
}

fn all_of_rules(rules: Vec<Permission>) -> Permission {
    if rules.is_empty() {
        return rule(permission::Rule::Any(true));
    }
    if rules.len() == 1 {
        return rules.into_iter().next().unwrap();
    }
    rule(permission::Rule::AndRules(permission::Set { rules }))
}

fn not_rule(p: Permission) -> Permission {
    rule(permission::Rule::NotRule(Box::new(p)))
}

fn path(value: &str) -> Permission {
    rule(permission::Rule::UrlPath(PathMatcher {
        rule: Some(path_matcher::Rule::Path(string_match(value, false))),
    }))
}

fn port(value: &str) -> Permission {
    match value.parse::<u32>() {
        Ok(p) => rule(permission::Rule::DestinationPort(p)),
        // Validation refuses non-numeric ports; never match rather than match all.
        Err(_) => not_rule(rule(permission::Rule::Any(true))),
    }
}

fn method(value: &str) -> Permission {
    rule(permission::Rule::Header(header(":method", value, false)))
}

fn host(value: &str) -> Permission {
    rule(permission::Rule::Header(header(":authority", value, true)))
}

/// The permission of one operation; `None` if it needs HTTP on a TCP port and `drop_http`
/// says such rules match nothing (ALLOW).
fn operation_permission(op: &api::security::Operation, http: bool) -> (Permission, bool) {
    let mut and = Vec::new();
    let uses_http = !(op.hosts.is_empty()
        && op.not_hosts.is_empty()
        && op.methods.is_empty()
        && op.not_methods.is_empty()
        && op.paths.is_empty()
        && op.not_paths.is_empty());
    if http {
        field(
            &mut and,
            &op.hosts,
            &op.not_hosts,
            host,
            any_of_rules,
            not_rule,
        );
        field(
            &mut and,
            &op.methods,
            &op.not_methods,
            method,
            any_of_rules,
            not_rule,
        );
        field(
            &mut and,
            &op.paths,
            &op.not_paths,
            path,
            any_of_rules,
            not_rule,
        );
    }
    field(
        &mut and,
        &op.ports,
        &op.not_ports,
        port,
        any_of_rules,
        not_rule,
    );
    (all_of_rules(and), uses_http && !http)
}

// ------------------------------------------------------------------ conditions

enum Side {
    Principal(Principal),
    Permission(Permission),
    /// An HTTP-only condition on a TCP port.
    HttpOnly,
}

fn condition(c: &Condition, http: bool) -> Side {
    let key = c.key.as_str();
    let both = |one: &dyn Fn(&str) -> Principal| -> Principal {
        let mut and = Vec::new();
        field(&mut and, &c.values, &c.not_values, one, any_of_ids, not_id);
        all_of_ids(and)
    };
    let both_rules = |one: &dyn Fn(&str) -> Permission| -> Permission {
        let mut and = Vec::new();
        field(
            &mut and,
            &c.values,
            &c.not_values,
            one,
            any_of_rules,
            not_rule,
        );
        all_of_rules(and)
    };
    let claims = |path: &[String]| -> Principal {
        let mut and = Vec::new();
        if !c.values.is_empty() {
            and.push(jwt_claim_in(path, &c.values));
        }
        if !c.not_values.is_empty() {
            and.push(not_id(jwt_claim_in(path, &c.not_values)));
        }
        all_of_ids(and)
    };
    if key.starts_with("request.auth.") {
        if !http {
            return Side::HttpOnly;
        }
        return Side::Principal(match key {
            "request.auth.principal" => both(&request_principal),
            "request.auth.audiences" => claims(&["aud".into()]),
            "request.auth.presenter" => claims(&["azp".into()]),
            _ => {
                let path = key.strip_prefix("request.auth.claims").and_then(claim_path);
                claims(&path.unwrap_or_default())
            }
        });
    }
    match key {
        "source.ip" => Side::Principal(both(&|v| {
            id(principal::Identifier::DirectRemoteIp(cidr_range(v)))
        })),
        "remote.ip" => Side::Principal(both(&|v| {
            id(principal::Identifier::RemoteIp(cidr_range(v)))
        })),
        "source.namespace" => Side::Principal(both(&namespace_principal)),
        "source.principal" => Side::Principal(both(&spiffe_principal)),
        "destination.ip" => Side::Permission(both_rules(&|v| {
            rule(permission::Rule::DestinationIp(cidr_range(v)))
        })),
        "destination.port" => Side::Permission(both_rules(&port)),
        "connection.sni" => Side::Permission(both_rules(&|v| {
            rule(permission::Rule::RequestedServerName(string_match(
                v, false,
            )))
        })),
        _ => {
            let name = key
                .strip_prefix("request.headers[")
                .and_then(|k| k.strip_suffix(']'))
                .unwrap_or(key);
            if !http {
                return Side::HttpOnly;
            }
            Side::Permission(both_rules(&|v| {
                rule(permission::Rule::Header(header(name, v, false)))
            }))
        }
    }
}

/// One rule as an RBAC policy, or `None` if it can match nothing here.
pub(super) fn rule_policy(r: &Rule, http: bool, action: AuthorizationAction) -> Option<Policy> {
    let deny = action == AuthorizationAction::Deny;
    // A rule's sources or operations, each with whether it needed HTTP it did not get: an
    // ALLOW one that cannot be checked matches nothing (`None` if none is left).
    fn checkable<T>(parts: impl Iterator<Item = (T, bool)>, deny: bool) -> Option<Vec<T>> {
        let kept: Vec<T> = parts
            .filter(|(_, needed_http)| deny || !needed_http)
            .map(|(p, _)| p)
            .collect();
        (!kept.is_empty()).then_some(kept)
    }
    let mut principals = Vec::new();
    if !r.from.is_empty() {
        let sources = r.from.iter().map(|f| source_principal(&f.source, http));
        principals.push(any_of_ids(checkable(sources, deny)?));
    }
    let mut permissions = Vec::new();
    if !r.to.is_empty() {
        let ops =
            r.to.iter()
                .map(|t| operation_permission(&t.operation, http));
        permissions.push(any_of_rules(checkable(ops, deny)?));
    }
    for c in &r.when {
        match condition(c, http) {
            Side::Principal(p) => principals.push(p),
            Side::Permission(p) => permissions.push(p),
            Side::HttpOnly if deny => {}
            Side::HttpOnly => return None,
        }
    }
    Some(Policy {
        permissions: vec![all_of_rules(permissions)],
        principals: vec![all_of_ids(principals)],
        ..Default::default()
    })
}

/// One action's RBAC filter: what its policies enforce, and what its `istio.io/dry-run`
/// policies only evaluate (shadow rules, whose results Envoy counts under `stat_prefix`).
pub struct ActionRules {
    pub enforced: Option<Rbac>,
    pub shadow: Option<Rbac>,
    pub shadow_prefix: &'static str,
}

/// Envoy's HTTP RBAC filter, by name; also the namespace of its request metadata.
pub const HTTP_RBAC_FILTER: &str = "envoy.filters.http.rbac";

/// The shadow rules' stat prefix of dry-run DENY and ALLOW policies (istiod's
/// `RBACShadowRules{Deny,Allow}StatPrefix`); the RBAC filter records their verdict in its
/// request metadata under this prefix and [`SHADOW_EFFECTIVE_POLICY_ID`] or
/// [`SHADOW_ENGINE_RESULT`].
pub const DRY_RUN_DENY_PREFIX: &str = "istio_dry_run_deny_";
pub const DRY_RUN_ALLOW_PREFIX: &str = "istio_dry_run_allow_";
/// Envoy's RBAC metadata keys (after a shadow rules' stat prefix): the policy that
/// matched, and `allowed`/`denied`.
pub const SHADOW_EFFECTIVE_POLICY_ID: &str = "shadow_effective_policy_id";
pub const SHADOW_ENGINE_RESULT: &str = "shadow_engine_result";

/// The RBAC configs for one inbound port, in evaluation order (AUDIT, DENY, ALLOW); each
/// is present only if some policy of that action applies. A dry-run policy's rules go to
/// the shadow rules, as istiod's builder puts them: an action with only dry-run policies
/// enforces nothing.
pub fn rbac_rules(
    policies: &[(&ConfigObject, &AuthorizationPolicySpec)],
    http: bool,
) -> Vec<ActionRules> {
    let mut out = Vec::new();
    for (action, envoy_action, shadow_prefix) in [
        (AuthorizationAction::Audit, Action::Log, ""),
        (AuthorizationAction::Deny, Action::Deny, DRY_RUN_DENY_PREFIX),
        (
            AuthorizationAction::Allow,
            Action::Allow,
            DRY_RUN_ALLOW_PREFIX,
        ),
    ] {
        let mut rules = ActionRules {
            enforced: None,
            shadow: None,
            shadow_prefix,
        };
        for (obj, spec) in policies {
            if spec.action.unwrap_or(AuthorizationAction::Allow) != action {
                continue;
            }
            let set = if api::security::dry_run(&obj.meta.annotations) == Some(true) {
                &mut rules.shadow
            } else {
                &mut rules.enforced
            };
            let rbac = set.get_or_insert_with(|| Rbac {
                action: envoy_action as i32,
                ..Default::default()
            });
            for (i, r) in spec.rules.iter().enumerate() {
                if let Some(p) = rule_policy(r, http, action) {
                    let name = format!(
                        "ns[{}]-policy[{}]-rule[{i}]",
                        obj.key.namespace, obj.key.name
                    );
                    rbac.policies.insert(name, p);
                }
            }
        }
        if rules.enforced.is_some() || rules.shadow.is_some() {
            out.push(rules);
        }
    }
    out
}

impl ActionRules {
    fn encode(&self, stat_prefix: Option<&str>) -> Vec<u8> {
        let shadow = self.shadow.as_ref().map(|s| (s, self.shadow_prefix));
        canonical::encode_rbac_filter(self.enforced.as_ref(), shadow, stat_prefix)
    }
}

const HTTP_RBAC: &str = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC";
const NETWORK_RBAC: &str = "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC";

/// The HTTP RBAC filter with an encoded config (see [`canonical::encode_rbac_filter`]).
pub(super) fn http_rbac_filter(config: Vec<u8>) -> HttpFilter {
    HttpFilter {
        name: HTTP_RBAC_FILTER.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(Any {
            type_url: HTTP_RBAC.into(),
            value: config,
        })),
        ..Default::default()
    }
}

/// The network RBAC filter with an encoded config (its stat prefix `tcp.`).
pub(super) fn network_rbac_filter(config: Vec<u8>) -> Filter {
    Filter {
        name: "envoy.filters.network.rbac".into(),
        config_type: Some(ConfigType::TypedConfig(Any {
            type_url: NETWORK_RBAC.into(),
            value: config,
        })),
    }
}

/// HTTP RBAC filters for the inbound HCM.
pub fn http_filters(policies: &[(&ConfigObject, &AuthorizationPolicySpec)]) -> Vec<HttpFilter> {
    (rbac_rules(policies, true).iter())
        .map(|rules| http_rbac_filter(rules.encode(None)))
        .collect()
}

/// Network RBAC filters for an inbound TCP chain.
pub fn network_filters(policies: &[(&ConfigObject, &AuthorizationPolicySpec)]) -> Vec<Filter> {
    (rbac_rules(policies, false).iter())
        .map(|rules| network_rbac_filter(rules.encode(Some("tcp."))))
        .collect()
}

/// The filters of the AuthorizationPolicies applying to a proxy's port, in Istio's order:
/// CUSTOM (external authorization, [`super::ext_authz`]), then AUDIT, DENY, ALLOW; for an
/// HTTP connection manager (after the RequestAuthentication's JWT filter, [`super::jwt`])
/// and for a TCP chain.
pub struct Authorization {
    pub http: Vec<HttpFilter>,
    pub tcp: Vec<Filter>,
}

impl Authorization {
    /// The filters of every policy applying to `proxy`: the same on each of its ports (a
    /// rule's `ports` are matched by the filters themselves), so built once per view.
    pub fn for_proxy(ctx: &model::PushContext, proxy: &model::Proxy) -> Authorization {
        let policies = ctx.authorization_policies_for(proxy);
        // Request authentication first, so that authorization sees who sent the request.
        let mut http: Vec<HttpFilter> = super::jwt::http_filter(ctx, proxy).into_iter().collect();
        http.extend(super::ext_authz::http_filters(ctx, &policies));
        http.extend(http_filters(&policies));
        let mut tcp = super::ext_authz::network_filters(ctx, &policies);
        tcp.extend(network_filters(&policies));
        Authorization { http, tcp }
    }
}

/// A network RBAC filter that allows nothing.
pub fn deny_all_network_filter() -> Filter {
    let rules = Rbac {
        action: Action::Allow as i32,
        ..Default::default()
    };
    network_rbac_filter(canonical::encode_rbac_filter(
        Some(&rules),
        None,
        Some("tcp."),
    ))
}

#[cfg(test)]
mod tests {
    use envoy_api::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
    use prost::Message;

    use super::*;
    use model::config::Spec;
    use model::config::parse::parse_file;

    #[test]
    fn dry_run_policies_are_shadow_rules_and_enforce_nothing() {
        let policy = |name: &str, action: &str, dry: &str| {
            format!(
                "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: {name}, namespace: shop, annotations: {{istio.io/dry-run: '{dry}'}}}}\nspec:\n  action: {action}\n  rules: [{{to: [{{operation: {{paths: [/x]}}}}]}}]\n---\n"
            )
        };
        let yaml = [
            policy("deny-dry", "DENY", "true"),
            policy("deny", "DENY", "false"),
            policy("allow-dry", "ALLOW", "1"),
        ]
        .concat();
        let parsed = parse_file("p.yaml", &yaml);
        let policies: Vec<_> = (parsed.objects.iter())
            .filter_map(|o| match &o.spec {
                Spec::AuthorizationPolicy(ap) => Some((o, ap)),
                _ => None,
            })
            .collect();
        let rules = rbac_rules(&policies, true);
        let names = |r: &Option<Rbac>| -> Vec<String> {
            r.as_ref()
                .map_or(Vec::new(), |r| r.policies.keys().cloned().collect())
        };
        let [deny, allow] = &rules[..] else {
            panic!("DENY and ALLOW: {}", rules.len())
        };
        assert_eq!(names(&deny.enforced), ["ns[shop]-policy[deny]-rule[0]"]);
        assert_eq!(names(&deny.shadow), ["ns[shop]-policy[deny-dry]-rule[0]"]);
        // Only dry runs: nothing is enforced, so nothing else is denied.
        assert!(allow.enforced.is_none());
        assert_eq!(names(&allow.shadow), ["ns[shop]-policy[allow-dry]-rule[0]"]);
        let filter = HttpRbac::decode(&*allow.encode(None)).unwrap();
        assert!(filter.rules.is_none());
        assert_eq!(filter.shadow_rules_stat_prefix, "istio_dry_run_allow_");
        assert_eq!(filter.shadow_rules.unwrap().policies.len(), 1);
    }
}
