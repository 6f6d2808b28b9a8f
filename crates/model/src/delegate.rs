//! VirtualService delegation, as istiod merges it (`mergeVirtualServices`,
//! `MergeHTTPRoutes`).
//!
//! A VirtualService without hosts is a *delegate*: it applies only where a root
//! VirtualService's HTTP route names it (`delegate: {name, namespace}`), and only if it is
//! exported to the root's namespace. Each of its HTTP routes then replaces the root route,
//! merged with it: its matches must each fall within one of the root's (a delegate's
//! `/reviews/v1` under the root's `/reviews`), else that route is dropped; what it leaves
//! unset (matches, timeout, retries, rewrite, headers, ...) it takes from the root route.
//! Its hosts resolve in its own namespace. A root route whose delegate is missing is
//! dropped; nesting is not followed.
//!
//! Input: the VirtualServices, oldest first. Output: the root VirtualServices with their
//! delegated routes merged in (the ones that delegate nothing unchanged, the same `Arc`),
//! and what each root's delegates are, for the push context.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::resolve_host;
use crate::config::{ConfigObject, Spec};
use api::networking::{HttpMatchRequest, HttpRoute, StringMatch, VirtualServiceSpec};

/// The VirtualServices of a push context after delegation.
#[derive(Debug, Default, PartialEq)]
pub struct Merged {
    /// Root VirtualServices (those with hosts), oldest first, their delegates merged in.
    pub roots: Vec<Arc<ConfigObject>>,
    /// `(namespace, name)` of every VirtualService some root delegates to: a change to
    /// one changes its roots.
    pub delegated: BTreeSet<(String, String)>,
}

fn spec(vs: &ConfigObject) -> Option<&VirtualServiceSpec> {
    match &vs.spec {
        Spec::VirtualService(spec) => Some(spec),
        _ => None,
    }
}

/// The namespace of the delegate a root in `root_namespace` names: its own unless the
/// reference says another.
pub fn namespace_of<'a>(target: &'a api::networking::Delegate, root_namespace: &'a str) -> &'a str {
    target.namespace.as_deref().unwrap_or(root_namespace)
}

/// Why a root route's delegate was not merged, if it was not.
pub fn unusable(
    root_namespace: &str,
    target: &api::networking::Delegate,
    found: Option<&ConfigObject>,
    default_export_to: &[String],
) -> Option<String> {
    let ns = namespace_of(target, root_namespace);
    let Some(delegate) = found.and_then(|d| Some((d, spec(d)?))) else {
        return Some(format!(
            "delegate VirtualService {ns}/{} not found; the route is left out",
            target.name
        ));
    };
    let (obj, vs) = delegate;
    if !vs.hosts.is_empty() {
        return Some(format!(
            "{ns}/{} has hosts, so it is not a delegate; the route is left out",
            target.name
        ));
    }
    let exported = super::exported_to(
        &vs.export_to,
        default_export_to,
        &obj.key.namespace,
        root_namespace,
    );
    (!exported).then(|| {
        format!(
            "delegate VirtualService {ns}/{} is not exported to namespace {root_namespace}; the route is left out",
            target.name
        )
    })
}

/// Merges every root VirtualService's delegates into it; `default_export_to` is the
/// mesh's `defaultVirtualServiceExportTo`.
pub fn merge(virtual_services: &[Arc<ConfigObject>], default_export_to: &[String]) -> Merged {
    let by_name: HashMap<(&str, &str), &Arc<ConfigObject>> = virtual_services
        .iter()
        .map(|v| ((v.key.namespace.as_str(), v.key.name.as_str()), v))
        .collect();
    let mut merged = Merged::default();
    for vs in virtual_services {
        let Some(root) = spec(vs) else { continue };
        if root.hosts.is_empty() {
            continue;
        }
        if !root.http.iter().any(|h| h.delegate.is_some()) {
            merged.roots.push(vs.clone());
            continue;
        }
        let mut http = Vec::new();
        for route in &root.http {
            let Some(target) = &route.delegate else {
                http.push(route.clone());
                continue;
            };
            let ns = namespace_of(target, &vs.key.namespace);
            merged
                .delegated
                .insert((ns.to_string(), target.name.clone()));
            let found = by_name.get(&(ns, target.name.as_str())).copied();
            if unusable(
                &vs.key.namespace,
                target,
                found.map(|f| &**f),
                default_export_to,
            )
            .is_some()
            {
                continue;
            }
            let delegate = found.expect("usable");
            let resolved = resolved(delegate);
            (resolved.iter())
                .filter(|sub| sub.delegate.is_none())
                .filter_map(|sub| merge_route(route, sub))
                .for_each(|r| http.push(r));
        }
        let mut root_obj = (**vs).clone();
        if let Spec::VirtualService(spec) = &mut root_obj.spec {
            spec.http = http;
        }
        merged.roots.push(Arc::new(root_obj));
    }
    merged
}

/// A delegate's HTTP routes with their hosts and gateways resolved in its own namespace.
fn resolved(delegate: &ConfigObject) -> Vec<HttpRoute> {
    let ns = &delegate.key.namespace;
    let mut routes = spec(delegate).map(|s| s.http.clone()).unwrap_or_default();
    for route in &mut routes {
        for d in &mut route.route {
            d.destination.host = resolve_host(&d.destination.host, ns);
        }
        for m in route.mirror.iter_mut() {
            m.host = resolve_host(&m.host, ns);
        }
        for m in &mut route.mirrors {
            m.destination.host = resolve_host(&m.destination.host, ns);
        }
        for m in &mut route.match_ {
            for g in &mut m.gateways {
                if g != "mesh" && !g.contains('/') {
                    *g = format!("{ns}/{g}");
                }
            }
        }
    }
    routes
}

/// A name joined as istiod joins a root's and a delegate's (route or match) names.
fn joined(root: &Option<String>, delegate: &Option<String>) -> Option<String> {
    let (r, d) = (
        root.as_deref().unwrap_or(""),
        delegate.as_deref().unwrap_or(""),
    );
    match (r.is_empty(), d.is_empty()) {
        (_, true) => root.clone(),
        (true, false) => delegate.clone(),
        (false, false) => Some(format!("{r}-{d}")),
    }
}

/// istiod's `mergeHTTPRoute`: `None` when a match of the delegate's falls within none of
/// the root's.
fn merge_route(root: &HttpRoute, delegate: &HttpRoute) -> Option<HttpRoute> {
    let mut out = delegate.clone();
    out.match_ = merge_matches(&root.match_, &delegate.match_)?;
    out.name = joined(&root.name, &delegate.name);
    fn inherit<T: Clone>(own: &mut Option<T>, root: &Option<T>) {
        if own.is_none() {
            own.clone_from(root);
        }
    }
    inherit(&mut out.rewrite, &root.rewrite);
    inherit(&mut out.direct_response, &root.direct_response);
    inherit(&mut out.timeout, &root.timeout);
    inherit(&mut out.retries, &root.retries);
    inherit(&mut out.fault, &root.fault);
    inherit(&mut out.mirror, &root.mirror);
    inherit(&mut out.mirror_percent, &root.mirror_percent);
    inherit(&mut out.mirror_percentage, &root.mirror_percentage);
    inherit(&mut out.cors_policy, &root.cors_policy);
    inherit(&mut out.headers, &root.headers);
    if out.mirrors.is_empty() {
        out.mirrors.clone_from(&root.mirrors);
    }
    out.delegate = None;
    Some(out)
}

/// istiod's `mergeHTTPMatchRequests`: each delegate match merged with every root match it
/// does not conflict with; `None` if one conflicts with them all.
fn merge_matches(
    root: &[HttpMatchRequest],
    delegate: &[HttpMatchRequest],
) -> Option<Vec<HttpMatchRequest>> {
    if root.is_empty() {
        return Some(delegate.to_vec());
    }
    if delegate.is_empty() {
        return Some(root.to_vec());
    }
    let mut out = Vec::new();
    for sub in delegate {
        let fitting: Vec<_> = (root.iter())
            .filter(|r| !conflict(r, sub))
            .map(|r| merge_match(r, sub))
            .collect();
        if fitting.is_empty() {
            return None;
        }
        out.extend(fitting);
    }
    Some(out)
}

fn merge_maps<V: Clone>(
    root: &BTreeMap<String, V>,
    delegate: &BTreeMap<String, V>,
) -> BTreeMap<String, V> {
    let mut out = root.clone();
    out.extend(delegate.iter().map(|(k, v)| (k.clone(), v.clone())));
    out
}

/// istiod's `mergeHTTPMatchRequest`: the delegate's match, with what it leaves unset
/// taken from the root's.
fn merge_match(root: &HttpMatchRequest, delegate: &HttpMatchRequest) -> HttpMatchRequest {
    let mut out = delegate.clone();
    out.name = joined(&root.name, &delegate.name);
    for (own, theirs) in [
        (&mut out.uri, &root.uri),
        (&mut out.scheme, &root.scheme),
        (&mut out.method, &root.method),
        (&mut out.authority, &root.authority),
    ] {
        if own.is_none() {
            own.clone_from(theirs);
        }
    }
    out.headers = merge_maps(&root.headers, &delegate.headers);
    out.without_headers = merge_maps(&root.without_headers, &delegate.without_headers);
    out.query_params = merge_maps(&root.query_params, &delegate.query_params);
    out.source_labels = merge_maps(&root.source_labels, &delegate.source_labels);
    out.port = out.port.or(root.port);
    if out.source_namespace.is_none() {
        out.source_namespace.clone_from(&root.source_namespace);
    }
    if out.gateways.is_empty() {
        out.gateways.clone_from(&root.gateways);
    }
    if out.stat_prefix.is_none() {
        out.stat_prefix.clone_from(&root.stat_prefix);
    }
    out
}

/// istiod's `hasConflict`: whether the delegate's match `leaf` can match what the root's
/// cannot.
fn conflict(root: &HttpMatchRequest, leaf: &HttpMatchRequest) -> bool {
    let pairs = [
        (&root.uri, &leaf.uri),
        (&root.scheme, &leaf.scheme),
        (&root.method, &leaf.method),
        (&root.authority, &leaf.authority),
    ];
    if pairs
        .iter()
        .any(|(r, l)| string_conflict(r.as_ref(), l.as_ref()))
    {
        return true;
    }
    let maps = [
        (&root.headers, &leaf.headers),
        (&root.without_headers, &leaf.without_headers),
        (&root.query_params, &leaf.query_params),
    ];
    if maps
        .iter()
        .any(|(r, l)| l.iter().any(|(k, v)| string_conflict(r.get(k), Some(v))))
    {
        return true;
    }
    let ns = |n: &Option<String>| n.clone().unwrap_or_default();
    let gateways_conflict = !root.gateways.is_empty()
        && !leaf.gateways.is_empty()
        && (root.gateways.len() < leaf.gateways.len()
            || leaf.gateways.iter().any(|g| !root.gateways.contains(g)));
    root.ignore_uri_case.unwrap_or(false) != leaf.ignore_uri_case.unwrap_or(false)
        || matches!((root.port, leaf.port), (Some(r), Some(l)) if r > 0 && l > 0 && r != l)
        || (!ns(&root.source_namespace).is_empty()
            && ns(&leaf.source_namespace) != ns(&root.source_namespace))
        || (leaf.source_labels.iter())
            .any(|(k, v)| root.source_labels.get(k).is_some_and(|r| r != v))
        || gateways_conflict
}

/// istiod's `stringMatchConflict`: whether `leaf` can match a string `root` does not.
fn string_conflict(root: Option<&StringMatch>, leaf: Option<&StringMatch>) -> bool {
    let (Some(root), Some(leaf)) = (root, leaf) else {
        return false;
    };
    let get = |s: &Option<String>| s.clone().unwrap_or_default();
    let (r_exact, r_prefix, r_regex) = (get(&root.exact), get(&root.prefix), get(&root.regex));
    let (l_exact, l_prefix, l_regex) = (get(&leaf.exact), get(&leaf.prefix), get(&leaf.regex));
    // A regex on either side conflicts with any match on the other.
    let r_any = !(r_exact.is_empty() && r_prefix.is_empty() && r_regex.is_empty());
    let l_any = !(l_exact.is_empty() && l_prefix.is_empty() && l_regex.is_empty());
    if (!r_regex.is_empty() && l_any) || (!l_regex.is_empty() && r_any) {
        return true;
    }
    if !r_exact.is_empty() {
        return !l_prefix.is_empty() || l_exact != r_exact;
    }
    if !r_prefix.is_empty() {
        if !l_prefix.is_empty() {
            return !l_prefix.starts_with(&r_prefix);
        }
        if !l_exact.is_empty() {
            return !l_exact.starts_with(&r_prefix);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::PushContext;
    use crate::builders::{context, istio};
    use crate::config::{ConfigObject, Kind};

    fn vs(ns: &str, name: &str, spec: Value) -> ConfigObject {
        istio(Kind::VirtualService, ns, name, spec)
    }

    /// shop/front: `/reviews` with header x-a delegated to team/reviews, the rest to productpage.
    fn root() -> ConfigObject {
        vs(
            "shop",
            "front",
            json!({
                "hosts": ["shop.example.com"],
                "gateways": ["web"],
                "http": [
                    {
                        "name": "reviews",
                        "match": [{"uri": {"prefix": "/reviews"}, "headers": {"x-a": {"exact": "1"}}}],
                        "timeout": "3s",
                        "delegate": {"name": "reviews", "namespace": "team"},
                    },
                    {"name": "rest", "route": [{"destination": {"host": "productpage"}}]},
                ],
            }),
        )
    }

    fn root_routes(ctx: &PushContext) -> Vec<HttpRoute> {
        let root = (ctx.virtual_services.iter())
            .find(|v| v.key.name == "front")
            .expect("the root");
        spec(root).unwrap().http.clone()
    }

    #[test]
    fn a_delegates_routes_replace_the_root_route_within_its_matches() {
        let ctx = context([
            root(),
            vs(
                "team",
                "reviews",
                json!({"http": [
                    {
                        "name": "v1",
                        "match": [{"uri": {"prefix": "/reviews/v1"}, "headers": {"x-b": {"exact": "2"}}}],
                        "route": [{"destination": {"host": "reviews"}}],
                    },
                    {
                        "name": "other",
                        "match": [{"uri": {"prefix": "/ratings"}}],
                        "route": [{"destination": {"host": "ratings"}}],
                    },
                    {
                        "timeout": "9s",
                        "route": [{"destination": {"host": "reviews.shop.svc.cluster.local"}}],
                    },
                ]}),
            ),
        ]);
        // The delegate is not a VirtualService of its own.
        assert_eq!(ctx.virtual_services.len(), 1);
        assert!(ctx.delegated.contains(&("team".into(), "reviews".into())));
        let routes = root_routes(&ctx);
        let names: Vec<_> = routes.iter().map(|r| r.name.clone().unwrap()).collect();
        // `/ratings` is outside the root's `/reviews`: dropped.
        assert_eq!(names, ["reviews-v1", "reviews", "rest"]);
        let v1 = &routes[0];
        let m = &v1.match_[0];
        assert_eq!(
            m.uri.as_ref().unwrap().prefix.as_deref(),
            Some("/reviews/v1")
        );
        assert_eq!(m.headers.keys().collect::<Vec<_>>(), ["x-a", "x-b"]);
        // Hosts resolve in the delegate's namespace; unset fields come from the root.
        assert_eq!(
            v1.route[0].destination.host,
            "reviews.team.svc.cluster.local"
        );
        assert_eq!(v1.timeout.as_deref(), Some("3s"));
        assert!(v1.delegate.is_none());
        // A route without matches takes the root's, and keeps its own timeout.
        assert_eq!(
            routes[1].match_[0].uri.as_ref().unwrap().prefix.as_deref(),
            Some("/reviews")
        );
        assert_eq!(routes[1].timeout.as_deref(), Some("9s"));
        assert!(
            !ctx.issues.iter().any(|i| i.field.ends_with(".delegate")),
            "{:?}",
            ctx.issues
        );
    }

    #[test]
    fn a_missing_or_unexported_delegate_drops_its_route_and_says_why() {
        let route = json!([{"route": [{"destination": {"host": "reviews"}}]}]);
        for (delegate, reason) in [
            (None, "team/reviews not found"),
            (
                Some(json!({"exportTo": ["."], "http": route})),
                "not exported to namespace shop",
            ),
            (
                Some(json!({"hosts": ["reviews"], "http": route})),
                "has hosts, so it is not a delegate",
            ),
        ] {
            let delegate = delegate.map(|spec| vs("team", "reviews", spec));
            let ctx = context([root()].into_iter().chain(delegate));
            let names: Vec<_> = (root_routes(&ctx).iter())
                .map(|r| r.name.clone().unwrap())
                .collect();
            assert_eq!(names, ["rest"], "{reason}");
            let issue = (ctx.issues.iter())
                .find(|i| i.field == "spec.http[0].delegate")
                .unwrap_or_else(|| panic!("no issue for {reason}: {:?}", ctx.issues));
            assert_eq!(issue.object, "VirtualService shop/front");
            assert!(issue.message.contains(reason), "{}", issue.message);
        }
    }

    #[test]
    fn string_matches_conflict_unless_the_delegates_is_within_the_roots() {
        let m = |kind: &str, v: &str| {
            let mut s = StringMatch::default();
            match kind {
                "exact" => s.exact = Some(v.into()),
                "prefix" => s.prefix = Some(v.into()),
                _ => s.regex = Some(v.into()),
            }
            s
        };
        for (root, leaf, conflicts) in [
            (m("prefix", "/a"), m("prefix", "/a/b"), false),
            (m("prefix", "/a/b"), m("prefix", "/a"), true),
            (m("prefix", "/a"), m("exact", "/a/x"), false),
            (m("prefix", "/a"), m("exact", "/b"), true),
            (m("exact", "/a"), m("exact", "/a"), false),
            (m("exact", "/a"), m("exact", "/b"), true),
            (m("exact", "/a"), m("prefix", "/a"), true),
            (m("regex", "/a.*"), m("prefix", "/a"), true),
            (m("prefix", "/a"), m("regex", "/a.*"), true),
        ] {
            assert_eq!(
                string_conflict(Some(&root), Some(&leaf)),
                conflicts,
                "{root:?} {leaf:?}"
            );
        }
        assert!(!string_conflict(None, Some(&m("regex", "x"))));
        // Other parts of a match: the root's must hold for the delegate's too.
        let root = HttpMatchRequest {
            port: Some(80),
            source_labels: [("app".to_string(), "a".to_string())].into(),
            gateways: vec!["shop/web".into()],
            ..Default::default()
        };
        let leaf = |f: &dyn Fn(&mut HttpMatchRequest)| {
            let mut l = HttpMatchRequest::default();
            f(&mut l);
            conflict(&root, &l)
        };
        assert!(!leaf(&|_| {}));
        assert!(leaf(&|l| l.port = Some(81)));
        assert!(leaf(
            &|l| l.source_labels = [("app".into(), "b".into())].into()
        ));
        assert!(leaf(&|l| l.gateways = vec!["shop/other".into()]));
        assert!(leaf(&|l| l.ignore_uri_case = Some(true)));
    }
}
