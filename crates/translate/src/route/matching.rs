//! Route matches: URI, header and query matchers, header operations, and consistent-hash
//! policies.

use super::*;

/// The hash policy of a route to `port` (and `subset`) of a host, if its DestinationRule
/// `rule` hashes consistently there: `Some(vec![])` when it hashes on no key.
pub(super) fn destination_hash(
    rule: Option<&DestinationRuleSpec>,
    subset: &str,
    port: u32,
) -> Option<Vec<HashPolicy>> {
    let rule = rule?;
    let hash = crate::policy::consistent_hash(rule, subset, port)?;
    Some(hash_policy(hash).into_iter().collect())
}

/// The request key a consistent hash hashes on, as istiod's `ConsistentHashToHashPolicy`
/// writes it.
pub fn hash_policy(hash: &ConsistentHashLb) -> Option<HashPolicy> {
    let specifier = if let Some(name) = &hash.http_header_name {
        PolicySpecifier::Header(hash_policy::Header {
            header_name: name.clone(),
            ..Default::default()
        })
    } else if let Some(cookie) = &hash.http_cookie {
        PolicySpecifier::Cookie(hash_policy::Cookie {
            name: cookie.name.clone(),
            ttl: optional_duration(cookie.ttl.as_deref()),
            path: cookie.path.clone().unwrap_or_default(),
            attributes: (cookie.attributes.iter())
                .map(|a| hash_policy::CookieAttribute {
                    name: a.name.clone(),
                    value: a.value.clone().unwrap_or_default(),
                })
                .collect(),
        })
    } else if hash.use_source_ip == Some(true) {
        PolicySpecifier::ConnectionProperties(hash_policy::ConnectionProperties { source_ip: true })
    } else if let Some(name) = &hash.http_query_parameter_name {
        PolicySpecifier::QueryParameter(hash_policy::QueryParameter { name: name.clone() })
    } else {
        return None;
    };
    Some(HashPolicy {
        policy_specifier: Some(specifier),
        terminal: false,
    })
}

pub(super) fn string_matcher(m: &StringMatch, ignore_case: bool) -> Option<StringMatcher> {
    let pattern = if let Some(e) = &m.exact {
        MatchPattern::Exact(e.clone())
    } else if let Some(p) = &m.prefix {
        MatchPattern::Prefix(p.clone())
    } else if let Some(r) = &m.regex {
        MatchPattern::SafeRegex(RegexMatcher {
            regex: r.clone(),
            ..Default::default()
        })
    } else {
        return None;
    };
    Some(StringMatcher {
        match_pattern: Some(pattern),
        ignore_case,
    })
}

pub(super) fn header_matcher(name: &str, m: &StringMatch, invert: bool) -> HeaderMatcher {
    let presence = m == &StringMatch::default() || m.regex.as_deref() == Some("*");
    HeaderMatcher {
        name: name.to_string(),
        header_match_specifier: Some(match string_matcher(m, false) {
            Some(sm) if !presence => HeaderMatchSpecifier::StringMatch(sm),
            _ => HeaderMatchSpecifier::PresentMatch(true),
        }),
        invert_match: invert,
        treat_missing_header_as_empty: invert && !presence,
    }
}

pub(super) fn route_match(m: Option<&HttpMatchRequest>) -> RouteMatch {
    let Some(m) = m else { return prefix_match("/") };
    let ignore_case = m.ignore_uri_case.unwrap_or(false);
    let path_specifier = match &m.uri {
        Some(StringMatch { exact: Some(e), .. }) => PathSpecifier::Path(e.clone()),
        Some(StringMatch {
            prefix: Some(p), ..
        }) => PathSpecifier::Prefix(p.clone()),
        Some(StringMatch { regex: Some(r), .. }) => PathSpecifier::SafeRegex(RegexMatcher {
            regex: r.clone(),
            ..Default::default()
        }),
        _ => PathSpecifier::Prefix("/".into()),
    };
    let mut headers: Vec<HeaderMatcher> = m
        .headers
        .iter()
        .map(|(n, sm)| header_matcher(n, sm, false))
        .collect();
    headers.extend(
        m.without_headers
            .iter()
            .map(|(n, sm)| header_matcher(n, sm, true)),
    );
    for (pseudo, sm) in [
        (":method", &m.method),
        (":authority", &m.authority),
        (":scheme", &m.scheme),
    ] {
        if let Some(sm) = sm {
            headers.push(header_matcher(pseudo, sm, false));
        }
    }
    headers.sort_by(|a, b| a.name.cmp(&b.name));
    RouteMatch {
        path_specifier: Some(path_specifier),
        case_sensitive: ignore_case.then_some(BoolValue { value: false }),
        headers,
        query_parameters: m
            .query_params
            .iter()
            .map(|(name, sm)| QueryParameterMatcher {
                name: name.clone(),
                query_parameter_match_specifier: string_matcher(sm, false)
                    .map(QueryParameterMatchSpecifier::StringMatch),
            })
            .collect(),
        ..Default::default()
    }
}

/// One direction's header operations as Envoy takes them, as istiod's
/// `TranslateHeadersOperations`: `set` then `add` (each sorted by name), neither of them
/// touching a header Envoy does not let a route modify (`:`-prefixed, `host`); the
/// authority `:authority` or `host` asks for (`set`'s before `add`'s), which becomes a host
/// rewrite.
#[derive(Default)]
pub(super) struct HeaderOps {
    pub add: Vec<HeaderValueOption>,
    pub remove: Vec<String>,
    pub authority: Option<String>,
}

/// Whether a route may not modify the header `name` (istiod's `isInternalHeader`).
fn internal(name: &str) -> bool {
    name.starts_with(':') || name.eq_ignore_ascii_case("host")
}

pub(super) fn header_options(ops: &HeaderOperations) -> HeaderOps {
    let mut out = HeaderOps::default();
    let authority =
        |k: &str| k.eq_ignore_ascii_case(":authority") || k.eq_ignore_ascii_case("host");
    for (set, action) in [
        (&ops.set, HeaderAppendAction::OverwriteIfExistsOrAdd),
        (&ops.add, HeaderAppendAction::AppendIfExistsOrAdd),
    ] {
        for (k, v) in set {
            if authority(k) && out.authority.is_none() {
                out.authority = Some(v.clone());
            }
            if internal(k) {
                continue;
            }
            out.add.push(HeaderValueOption {
                header: Some(HeaderValue {
                    key: k.clone(),
                    value: v.clone(),
                    ..Default::default()
                }),
                append_action: action as i32,
                ..Default::default()
            });
        }
    }
    out.remove = (ops.remove.iter())
        .filter(|k| !internal(k))
        .cloned()
        .collect();
    out
}

/// The operations of `headers`: requests' and responses'.
pub(super) fn headers_options(headers: &api::networking::Headers) -> (HeaderOps, HeaderOps) {
    let of = |ops: Option<&HeaderOperations>| ops.map(header_options).unwrap_or_default();
    (of(headers.request.as_ref()), of(headers.response.as_ref()))
}

/// The matches of an `http` entry that apply to this port, gateway and proxy (`[None]`
/// for an entry without matches); `None` when none does and the entry gives no route.
pub(super) fn kept_matches<'h>(
    http: &'h HttpRoute,
    vs_obj: &ConfigObject,
    port: u32,
    gateway: &str,
    labels: &BTreeMap<String, String>,
    proxy: &Proxy,
) -> Option<Vec<Option<&'h HttpMatchRequest>>> {
    if http.match_.is_empty() {
        return Some(vec![None]);
    }
    let kept: Vec<_> = (http.match_.iter())
        .filter(|m| m.port.is_none_or(|p| p == port))
        .filter(|m| {
            m.gateways.is_empty()
                || m.gateways
                    .iter()
                    .any(|g| g == gateway || format!("{}/{g}", vs_obj.key.namespace) == gateway)
        })
        .filter(|m| labels_match(&m.source_labels, labels))
        .filter(|m| {
            m.source_namespace
                .as_ref()
                .is_none_or(|ns| ns == &proxy.namespace)
        })
        .map(Some)
        .collect();
    (!kept.is_empty()).then_some(kept)
}
