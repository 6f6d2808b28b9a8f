//! RDS: route configurations for sidecar outbound ports (`"9080"`) and gateway ports
//! (`"http.8080"`, planned in [`gateway`]), virtual hosts with every name
//! Kubernetes users write, and routes from VirtualService `http` entries with Istio's
//! defaults (timeout 0s, default retry policy).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use envoy_api::pb::envoy::config::core::v3::{
    DataSource, HeaderValue, HeaderValueOption, RuntimeFractionalPercent, data_source::Specifier,
    header_value_option::HeaderAppendAction,
};
use envoy_api::pb::envoy::config::route::v3::{
    Decorator, DirectResponseAction, HeaderMatcher, QueryParameterMatcher, RedirectAction,
    RetryPolicy, Route, RouteAction, RouteConfiguration, RouteMatch, Vhds, VirtualHost,
    WeightedCluster,
    header_matcher::HeaderMatchSpecifier,
    query_parameter_matcher::QueryParameterMatchSpecifier,
    redirect_action,
    retry_policy::{self, RetryBackOff, RetryHostPredicate, RetryPriority},
    route::Action,
    route_action,
    route_action::{
        ClusterSpecifier, HashPolicy, HostRewriteSpecifier, hash_policy,
        hash_policy::PolicySpecifier,
    },
    route_match::PathSpecifier,
    weighted_cluster::{ClusterWeight, cluster_weight},
};
use envoy_api::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use envoy_api::pb::envoy::r#type::matcher::v3::{
    RegexMatchAndSubstitute, RegexMatcher, StringMatcher, string_matcher::MatchPattern,
};
use envoy_api::pb::google::protobuf::{BoolValue, UInt32Value};
use envoy_api::util::pack_any;

use super::listener::RouteServices;
use super::{duration, istio_metadata, optional_duration, outbound_cluster_name, string_value};
use api::labels_match;
use api::networking::{
    ConsistentHashLb, DestinationRuleSpec, HeaderOperations, HttpMatchRequest, HttpRetry,
    HttpRoute, StringMatch, VirtualServiceSpec,
};
use model::config::{ConfigObject, Spec};
use model::destination_rule;
use model::service::AutoAddresses;
use model::{Proxy, PushContext, Service, host_matches, resolve_host};

mod gateway;
mod headers;
mod matching;
mod retry;
mod vhds;

pub use self::headers::RouteHeaders;
pub use self::matching::*;
pub use self::retry::*;
pub use self::vhds::*;

pub use self::gateway::{
    GatewayRoute, GatewayRoutes, GatewayVirtualHost, gateway_blackhole, gateway_plan,
};

/// Who reads a service's virtual host, which decides its domains: a proxy in the
/// service's namespace (the short name too), a proxy elsewhere, or a sniffed listener's
/// own route configuration `HOST:PORT` (`*`: the listener serves that service alone, as
/// istiod's `getVirtualHostsForSniffedServicePort` writes it). A proxy that knows the
/// service by an auto-allocated address ([`Service::auto_for`]) has that address among the
/// domains; one in the namespace of some of the service's aliases, their short names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audience {
    Local(AutoAddresses, LocalAliases),
    Remote(AutoAddresses, LocalAliases),
    Sniffed,
}

/// Which of a service's aliases ([`Service::aliases`], sorted by namespace) share the
/// proxy's namespace: those of the namespace of the one at this index, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalAliases(Option<usize>);

impl Audience {
    pub fn new(svc: &Service, proxy: &Proxy, sniffed: bool) -> Audience {
        let auto = svc.auto_for(proxy.auto_addresses);
        let aliases = LocalAliases(
            svc.aliases
                .iter()
                .position(|a| a.namespace == proxy.namespace),
        );
        if sniffed {
            Audience::Sniffed
        } else if svc.namespace == proxy.namespace {
            Audience::Local(auto, aliases)
        } else {
            Audience::Remote(auto, aliases)
        }
    }
}

/// Every domain Istio gives a service's virtual host for `audience`: for the service and
/// each of its aliases, the host, the host with a trailing dot, and a Kubernetes
/// Service's `NAME.NAMESPACE.svc`, `NAME.NAMESPACE` and, from its own namespace, `NAME`;
/// then the service's address.
pub fn domains(svc: &Service, audience: Audience) -> Vec<String> {
    let (auto, local_aliases) = match audience {
        Audience::Sniffed => return vec!["*".into()],
        Audience::Local(auto, aliases) | Audience::Remote(auto, aliases) => (auto, aliases),
    };
    // A Kubernetes Service's short forms: `NAME` from its own namespace only.
    let short = |out: &mut Vec<String>, name: &str, namespace: &str, local: bool| {
        if local {
            out.push(name.to_string());
        }
        out.push(format!("{name}.{namespace}.svc"));
        out.push(format!("{name}.{namespace}"));
    };
    let mut out = vec![svc.hostname.clone(), format!("{}.", svc.hostname)];
    if svc.kubernetes {
        let local = matches!(audience, Audience::Local(..));
        short(&mut out, &svc.name, &svc.namespace, local);
    }
    let local_namespace = local_aliases.0.map(|i| svc.aliases[i].namespace.as_str());
    for alias in &svc.aliases {
        let host = model::service::kubernetes_hostname(&alias.namespace, &alias.name);
        let dotted = format!("{host}.");
        out.extend([host, dotted]);
        let local = local_namespace == Some(alias.namespace.as_str());
        short(&mut out, &alias.name, &alias.namespace, local);
    }
    if let Some(address) = svc.address_for(auto) {
        out.push(address.to_string());
    }
    let mut seen = HashSet::new();
    out.retain(|d| seen.insert(d.clone()));
    out
}

/// One virtual host of a sidecar's route configuration: the default one of a service no
/// VirtualService routes (a function of the service, the port and whether the proxy shares
/// its namespace, so callers may cache it), or one built from a VirtualService.
pub enum VirtualHostPlan<'a> {
    Default(&'a Arc<Service>),
    /// A service routed by a VirtualService whose routes do not depend on the proxy (no
    /// `sourceLabels` or `sourceNamespace` match): [`routed_virtual_host`], a function of
    /// the VirtualService, the service, the port, whether the proxy shares the service's
    /// namespace, and the services its routes lead to, so callers may cache it.
    Shared {
        vs: &'a Arc<ConfigObject>,
        service: &'a Arc<Service>,
    },
    /// Built for this proxy.
    Routed(Box<VirtualHost>),
}

impl VirtualHostPlan<'_> {
    /// The virtual host, built (for a sniffed listener's own route configuration when
    /// `sniffed`).
    pub fn build(self, ctx: &PushContext, proxy: &Proxy, port: u32, sniffed: bool) -> VirtualHost {
        match self {
            VirtualHostPlan::Default(svc) => {
                let rule = ctx.service_rule(proxy, svc);
                let audience = Audience::new(svc, proxy, sniffed);
                let retries = ctx.mesh.default_http_retry_policy.as_ref();
                default_virtual_host(svc, rule.map(|r| &**r), port, audience, retries)
            }
            VirtualHostPlan::Shared { vs, service } => {
                let audience = Audience::new(service, proxy, sniffed);
                routed_virtual_host(ctx, proxy, vs, service, port, audience)
            }
            VirtualHostPlan::Routed(vh) => *vh,
        }
    }

    fn hostname(&self) -> &str {
        match self {
            VirtualHostPlan::Default(svc) => &svc.hostname,
            VirtualHostPlan::Shared { service, .. } => &service.hostname,
            // Routed names are `HOST:PORT`; the port is the same throughout one plan.
            VirtualHostPlan::Routed(vh) => vh.name.rsplit_once(':').map_or(&vh.name, |(h, _)| h),
        }
    }
}

/// The virtual hosts of the route configuration `"PORT"`, in order, without the final
/// catch-all ([`sidecar_catch_all`]); with `sniffed`, of a sniffed listener's `HOST:PORT`.
pub fn sidecar_plan<'a>(
    ctx: &'a PushContext,
    proxy: &Proxy,
    r: &RouteServices<'a>,
) -> Vec<VirtualHostPlan<'a>> {
    let (services, port, sniffed) = (&r.services, r.port, r.sniffed.is_some());
    // VirtualService hosts are matched by name lookup, except wildcards on either side
    // (a `*.example.com` host, or a ServiceEntry for one): those are compared one by one.
    let mut by_name: foldhash::HashMap<&str, usize> =
        foldhash::HashMapExt::with_capacity(services.len());
    let mut wildcard_services = Vec::new();
    for (i, s) in services.iter().enumerate() {
        if s.hostname.starts_with('*') {
            wildcard_services.push(i);
        } else {
            by_name.insert(&s.hostname, i);
        }
    }
    let mut covered = vec![false; services.len()];
    let mut plan = Vec::new();
    for (vs_obj, vs) in ctx.virtual_services_of(proxy, &r.egress) {
        let mut matched: Vec<usize> = Vec::new();
        for h in &vs.hosts {
            let h = resolve_host(h, &vs_obj.key.namespace);
            if h.starts_with('*') {
                matched.extend(
                    (0..services.len()).filter(|&i| host_matches(&h, &services[i].hostname)),
                );
            } else {
                matched.extend(by_name.get(h.as_str()));
                matched.extend(
                    wildcard_services
                        .iter()
                        .filter(|&&i| host_matches(&h, &services[i].hostname)),
                );
            }
        }
        matched.sort_unstable();
        matched.dedup();
        matched.retain(|&i| !covered[i]);
        if matched.is_empty() {
            continue;
        }
        if !depends_on_proxy(vs) {
            for i in matched {
                covered[i] = true;
                plan.push(VirtualHostPlan::Shared {
                    vs: vs_obj,
                    service: services[i],
                });
            }
            continue;
        }
        let routes = http_routes(ctx, proxy, vs_obj, vs, port, "mesh");
        for i in matched {
            covered[i] = true;
            let svc = services[i];
            let audience = Audience::new(svc, proxy, sniffed);
            plan.push(VirtualHostPlan::Routed(Box::new(with_routes(
                svc,
                port,
                audience,
                routes.clone(),
            ))));
        }
    }
    plan.extend(
        services
            .iter()
            .zip(&covered)
            .filter(|(_, covered)| !**covered)
            .map(|(s, _)| VirtualHostPlan::Default(s)),
    );
    // By virtual host name, `HOST:PORT`: the same port throughout, so by `HOST:`.
    let sort_key = |p: &VirtualHostPlan| {
        p.hostname()
            .bytes()
            .chain(std::iter::once(b':'))
            .collect::<Vec<u8>>()
    };
    plan.sort_by_cached_key(sort_key);
    plan
}

/// Whether a VirtualService's routes differ between proxies (matches on the source).
fn depends_on_proxy(vs: &VirtualServiceSpec) -> bool {
    vs.http
        .iter()
        .flat_map(|h| &h.match_)
        .any(|m| !m.source_labels.is_empty() || m.source_namespace.is_some())
}

/// A service's virtual host with `routes`.
fn with_routes(svc: &Service, port: u32, audience: Audience, routes: Vec<Route>) -> VirtualHost {
    VirtualHost {
        name: format!("{}:{port}", svc.hostname),
        domains: domains(svc, audience),
        routes,
        include_request_attempt_count: true,
        ..Default::default()
    }
}

/// The virtual host of `svc` routed by the VirtualService `vs_obj` (see
/// [`VirtualHostPlan::Shared`]).
pub fn routed_virtual_host(
    ctx: &PushContext,
    proxy: &Proxy,
    vs_obj: &ConfigObject,
    svc: &Service,
    port: u32,
    audience: Audience,
) -> VirtualHost {
    let routes = match &vs_obj.spec {
        Spec::VirtualService(vs) => http_routes(ctx, proxy, vs_obj, vs, port, "mesh"),
        _ => Vec::new(),
    };
    with_routes(svc, port, audience, routes)
}

/// The hosts a VirtualService's HTTP routes lead to or mirror to, whose ports (and
/// DestinationRules) its routes may read.
pub fn destination_hosts(vs_obj: &ConfigObject) -> Vec<String> {
    let Spec::VirtualService(vs) = &vs_obj.spec else {
        return Vec::new();
    };
    let mut hosts: Vec<String> = (vs.http.iter())
        .flat_map(|h| {
            let routes = h.route.iter().map(|d| &d.destination);
            let mirrors = (h.mirror.iter()).chain(h.mirrors.iter().map(|m| &m.destination));
            routes.chain(mirrors)
        })
        .map(|d| resolve_host(&d.host, &vs_obj.key.namespace))
        .collect();
    hosts.sort_unstable();
    hosts.dedup();
    hosts
}

/// The virtual host of a service no VirtualService routes: its default route, hashing
/// requests as the service's DestinationRule says for this port. It depends on the service
/// and its DestinationRule only (and on whether the proxy shares its namespace).
pub fn default_virtual_host(
    svc: &Service,
    rule: Option<&ConfigObject>,
    port: u32,
    audience: Audience,
    mesh_retries: Option<&HttpRetry>,
) -> VirtualHost {
    let mut route = default_route(&svc.hostname, port, mesh_retries);
    let rule = rule.and_then(destination_rule::spec);
    if let (Some(Action::Route(action)), Some(hash)) =
        (route.action.as_mut(), destination_hash(rule, "", port))
    {
        action.hash_policy = hash;
    }
    VirtualHost {
        name: format!("{}:{port}", svc.hostname),
        domains: domains(svc, audience),
        routes: vec![route],
        include_request_attempt_count: true,
        ..Default::default()
    }
}

/// The last virtual host of every sidecar route configuration.
pub fn sidecar_catch_all(ctx: &PushContext, proxy: &Proxy) -> VirtualHost {
    catch_all(super::unknown_destination(ctx, proxy).as_deref())
}

/// The last virtual host: `allow_any` to PassthroughCluster or the Sidecar's `egressProxy`
/// cluster (ALLOW_ANY), or `block_all` answering 502 (REGISTRY_ONLY), as istiod writes
/// them.
fn catch_all(unknown_destination: Option<&str>) -> VirtualHost {
    let (name, action) = match unknown_destination {
        None => (
            "block_all",
            Action::DirectResponse(DirectResponseAction {
                status: 502,
                ..Default::default()
            }),
        ),
        Some(cluster) => {
            let onward = RouteAction {
                cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.into())),
                timeout: Some(duration(std::time::Duration::ZERO)),
                #[allow(deprecated)] // istiod's, as in `route_without_decorator`.
                max_grpc_timeout: Some(duration(std::time::Duration::ZERO)),
                ..Default::default()
            };
            ("allow_any", Action::Route(onward))
        }
    };
    VirtualHost {
        name: name.into(),
        domains: vec!["*".into()],
        routes: vec![Route {
            name: name.into(),
            r#match: Some(prefix_match("/")),
            action: Some(action),
            ..Default::default()
        }],
        include_request_attempt_count: true,
        ..Default::default()
    }
}

fn prefix_match(prefix: &str) -> RouteMatch {
    RouteMatch {
        path_specifier: Some(PathSpecifier::Prefix(prefix.into())),
        ..Default::default()
    }
}

fn default_route(host: &str, port: u32, mesh_retries: Option<&HttpRetry>) -> Route {
    Route {
        name: "default".into(),
        r#match: Some(prefix_match("/")),
        action: Some(Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::Cluster(outbound_cluster_name(
                port, "", host,
            ))),
            timeout: Some(duration(std::time::Duration::ZERO)),
            #[allow(deprecated)] // istiod's, as in `route_without_decorator`.
            max_grpc_timeout: Some(duration(std::time::Duration::ZERO)),
            retry_policy: retry_policy(mesh_retries),
            ..Default::default()
        })),
        decorator: Some(Decorator {
            operation: format!("{host}:{port}/*"),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Routes from a VirtualService's `http` list for one listener port and gateway.
pub fn http_routes(
    ctx: &PushContext,
    proxy: &Proxy,
    vs_obj: &ConfigObject,
    vs: &VirtualServiceSpec,
    port: u32,
    gateway: &str,
) -> Vec<Route> {
    let labels = ctx.proxy_labels(proxy);
    let mut out = Vec::new();
    for http in &vs.http {
        let Some(matches) = kept_matches(http, vs_obj, port, gateway, labels, proxy) else {
            continue;
        };
        for m in &matches {
            out.push(translate_route(ctx, proxy, vs_obj, http, *m, port));
        }
        if http.match_.is_empty() {
            break; // a catch-all route shadows everything after it
        }
    }
    out
}

/// A route destination's port: its own, else the one port of the host's service (as the
/// proxy knows it), else the listener's.
pub(super) fn destination_port(
    ctx: &PushContext,
    proxy: &Proxy,
    host: &str,
    explicit: Option<u32>,
    listener_port: u32,
) -> u32 {
    explicit
        .or_else(|| {
            ctx.service_for(proxy, host)
                .filter(|s| s.ports.len() == 1)
                .map(|s| s.ports[0].port)
        })
        .unwrap_or(listener_port)
}

/// The route's mirrors (`mirror` with `mirrorPercentage`, 100% by default and none at
/// 0%; each of `mirrors` with its own percentage), as istiod's
/// `TranslateRequestMirrorPolicy`: the destination's cluster, the share of requests, and
/// no trace sampling of the copies.
fn mirror_policies(
    ctx: &PushContext,
    proxy: &Proxy,
    http: &HttpRoute,
    ns: &str,
    port: u32,
) -> Vec<route_action::RequestMirrorPolicy> {
    let whole = super::filters::per_hundred;
    let share = |p: Option<&api::networking::Percent>| match p {
        Some(p) if p.value > 0.0 => Some(super::filters::per_million(p)),
        Some(_) => None,
        None => Some(whole(100)),
    };
    let first = http.mirror.as_ref().and_then(|d| {
        let fraction = match (&http.mirror_percentage, http.mirror_percent) {
            (Some(p), _) => share(Some(p))?,
            (None, Some(0)) => return None,
            (None, Some(n)) => whole(n),
            (None, None) => whole(100),
        };
        Some((d, fraction))
    });
    let rest =
        (http.mirrors.iter()).filter_map(|m| Some((&m.destination, share(m.percentage.as_ref())?)));
    first
        .into_iter()
        .chain(rest)
        .map(|(d, fraction)| {
            let host = resolve_host(&d.host, ns);
            let p = destination_port(ctx, proxy, &host, d.port.as_ref().map(|p| p.number), port);
            route_action::RequestMirrorPolicy {
                cluster: outbound_cluster_name(p, d.subset.as_deref().unwrap_or(""), &host),
                runtime_fraction: Some(RuntimeFractionalPercent {
                    default_value: Some(fraction),
                    ..Default::default()
                }),
                trace_sampled: Some(BoolValue { value: false }),
                ..Default::default()
            }
        })
        .collect()
}

fn translate_route(
    ctx: &PushContext,
    proxy: &Proxy,
    vs_obj: &ConfigObject,
    http: &HttpRoute,
    m: Option<&HttpMatchRequest>,
    port: u32,
) -> Route {
    let mut route = route_without_decorator(ctx, proxy, vs_obj, http, m, port);
    route.decorator = Some(Decorator {
        operation: route_operation(&route, &vs_obj.key.name, port),
        ..Default::default()
    });
    route
}

fn route_without_decorator(
    ctx: &PushContext,
    proxy: &Proxy,
    vs_obj: &ConfigObject,
    http: &HttpRoute,
    m: Option<&HttpMatchRequest>,
    port: u32,
) -> Route {
    let ns = &vs_obj.key.namespace;
    let name = match (&http.name, m.and_then(|m| m.name.as_ref())) {
        (Some(r), Some(mn)) => format!("{r}.{mn}"),
        (Some(r), None) => r.clone(),
        (None, Some(mn)) => mn.clone(),
        (None, None) => String::new(),
    };
    let mut route = Route {
        name,
        r#match: Some(route_match(m)),
        metadata: Some(istio_metadata(vec![(
            "config",
            string_value(vs_obj.istio_config_path()),
        )])),
        ..Default::default()
    };
    let authority = (http.headers.as_ref()).and_then(|h| add_headers(&mut route, h));
    if let Some(fault) = http.fault.as_ref().and_then(super::filters::route_config) {
        route
            .typed_per_filter_config
            .insert(super::filters::FAULT_FILTER.into(), fault);
    }
    if let Some(cors) = &http.cors_policy {
        let policy = super::filters::cors_config(cors, |m| string_matcher(m, false));
        route
            .typed_per_filter_config
            .insert(super::filters::CORS_FILTER.into(), policy);
    }
    if let Some(redirect) = &http.redirect {
        let code = match redirect.redirect_code.unwrap_or(301) {
            302 => redirect_action::RedirectResponseCode::Found,
            303 => redirect_action::RedirectResponseCode::SeeOther,
            307 => redirect_action::RedirectResponseCode::TemporaryRedirect,
            308 => redirect_action::RedirectResponseCode::PermanentRedirect,
            _ => redirect_action::RedirectResponseCode::MovedPermanently,
        };
        route.action = Some(Action::Redirect(RedirectAction {
            host_redirect: redirect.authority.clone().unwrap_or_default(),
            port_redirect: redirect.port.unwrap_or(0),
            path_rewrite_specifier: redirect
                .uri
                .clone()
                .map(redirect_action::PathRewriteSpecifier::PathRedirect),
            scheme_rewrite_specifier: redirect
                .scheme
                .clone()
                .map(redirect_action::SchemeRewriteSpecifier::SchemeRedirect),
            response_code: code as i32,
            ..Default::default()
        }));
        return route;
    }
    if let Some(dr) = &http.direct_response {
        route.action = Some(Action::DirectResponse(DirectResponseAction {
            status: dr.status,
            body: dr
                .body
                .as_ref()
                .and_then(|b| b.string.clone())
                .map(|s| DataSource {
                    specifier: Some(Specifier::InlineString(s)),
                    ..Default::default()
                }),
            ..Default::default()
        }));
        return route;
    }
    let mut targets: Vec<(String, u32, Option<&api::networking::Headers>)> = Vec::new();
    let mut hash_policy = Vec::new();
    let mut hashed = false;
    for d in &http.route {
        let host = resolve_host(&d.destination.host, ns);
        let p = destination_port(
            ctx,
            proxy,
            &host,
            d.destination.port.as_ref().map(|p| p.number),
            port,
        );
        let weight = match d.weight {
            Some(w) => w.max(0) as u32,
            None if http.route.len() == 1 => 100,
            None => 0,
        };
        if weight > 0 {
            let subset = d.destination.subset.as_deref().unwrap_or("");
            let headers = d.headers.as_ref();
            targets.push((outbound_cluster_name(p, subset, &host), weight, headers));
            if let Some(hash) = destination_hash(ctx.destination_rule_spec(proxy, &host), subset, p)
            {
                hashed = true;
                hash_policy.extend(hash);
            }
        }
    }
    // A single destination hashed consistently retries on the same host, as istiod's
    // routes do; several keep the default predicate.
    let same_host_retries = http.route.len() == 1 && hashed;
    // The rewrite's authority wins over the route's headers'; a single destination's
    // headers join the route's (its authority only where none is set), as istiod's
    // `processDestination`; each weighted one's go on its cluster.
    let rewrite = http.rewrite.as_ref();
    let mut host_rewrite = rewrite.and_then(|r| r.authority.clone()).or(authority);
    let cluster_specifier = match targets.len() {
        0 => ClusterSpecifier::Cluster("BlackHoleCluster".into()),
        1 => {
            if let Some(h) = targets[0].2 {
                let destination = add_headers(&mut route, h);
                host_rewrite = host_rewrite.or(destination);
            }
            ClusterSpecifier::Cluster(targets[0].0.clone())
        }
        _ => ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: targets
                .iter()
                .map(|(name, w, headers)| {
                    let mut c = ClusterWeight {
                        name: name.clone(),
                        weight: Some(UInt32Value { value: *w }),
                        ..Default::default()
                    };
                    if let Some(h) = headers {
                        let (request, response) = headers_options(h);
                        (c.request_headers_to_add, c.request_headers_to_remove) =
                            (request.add, request.remove);
                        (c.response_headers_to_add, c.response_headers_to_remove) =
                            (response.add, response.remove);
                        c.host_rewrite_specifier = request
                            .authority
                            .map(cluster_weight::HostRewriteSpecifier::HostRewriteLiteral);
                    }
                    c
                })
                .collect(),
            ..Default::default()
        }),
    };
    // Unset: 0s, no timeout (Istio's default for routes).
    let timeout = optional_duration(http.timeout.as_deref()).unwrap_or_default();
    // Without its own `retries`, MeshConfig's `defaultHttpRetryPolicy`, else Istio's.
    let retries = http.retries.as_ref();
    let mut retry_policy = retry_policy(retries.or(ctx.mesh.default_http_retry_policy.as_ref()));
    if same_host_retries && let Some(retry) = retry_policy.as_mut() {
        retry.retry_host_predicate.clear();
    }
    let request_mirror_policies = mirror_policies(ctx, proxy, http, ns, port);
    route.action = Some(Action::Route(RouteAction {
        request_mirror_policies,
        cluster_specifier: Some(cluster_specifier),
        // A gRPC request's `grpc-timeout` header bounds it, capped by the route's timeout
        // (istiod's `setTimeout`: the same value, 0 for no cap). istiod keeps this
        // deprecated field, as its replacement in `max_stream_duration` behaves otherwise.
        #[allow(deprecated)]
        max_grpc_timeout: Some(timeout),
        timeout: Some(timeout),
        retry_policy,
        hash_policy,
        prefix_rewrite: rewrite.and_then(|r| r.uri.clone()).unwrap_or_default(),
        // istiod's `uriRegexRewrite`: Envoy's regex_rewrite on the path.
        regex_rewrite: rewrite
            .and_then(|r| r.uri_regex_rewrite.as_ref())
            .map(|rr| RegexMatchAndSubstitute {
                pattern: Some(RegexMatcher {
                    regex: rr.match_.clone(),
                    ..Default::default()
                }),
                substitution: rr.rewrite.clone(),
            }),
        host_rewrite_specifier: host_rewrite.map(HostRewriteSpecifier::HostRewriteLiteral),
        ..Default::default()
    }));
    route
}

/// Adds `headers`' operations to `route`'s; the authority they ask for, if any.
fn add_headers(route: &mut Route, headers: &api::networking::Headers) -> Option<String> {
    let (request, response) = headers_options(headers);
    route.request_headers_to_add.extend(request.add);
    route.request_headers_to_remove.extend(request.remove);
    route.response_headers_to_add.extend(response.add);
    route.response_headers_to_remove.extend(response.remove);
    request.authority
}

/// A route's tracing operation, as istiod's `GetRouteOperation`: `HOST:PORT` of its one
/// subset-keyed cluster, else `VIRTUALSERVICE:LISTENER_PORT`, followed by the matched
/// path (`PREFIX*`, the exact path or the regex; `/*` without one).
fn route_operation(route: &Route, virtual_service: &str, port: u32) -> String {
    let path = match route
        .r#match
        .as_ref()
        .and_then(|m| m.path_specifier.as_ref())
    {
        Some(PathSpecifier::Prefix(p)) => format!("{p}*"),
        Some(PathSpecifier::Path(p)) => p.clone(),
        Some(PathSpecifier::SafeRegex(r)) => r.regex.clone(),
        _ => "/*".into(),
    };
    if let Some(Action::Route(RouteAction {
        cluster_specifier: Some(ClusterSpecifier::Cluster(cluster)),
        ..
    })) = &route.action
        && let [_, cluster_port, _, host] = cluster.split('|').collect::<Vec<_>>()[..]
    {
        return format!("{host}:{cluster_port}{path}");
    }
    format!("{virtual_service}:{port}{path}")
}
