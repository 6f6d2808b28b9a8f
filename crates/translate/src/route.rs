//! RDS: route configurations for sidecar outbound ports (`"9080"`) and gateway ports
//! (`"http.8080"`, planned in [`gateway`]), virtual hosts with every name
//! Kubernetes users write, and routes from VirtualService `http` entries with Istio's
//! defaults (timeout 0s, default retry policy).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{
    DataSource, HeaderValue, HeaderValueOption, RuntimeFractionalPercent, data_source::Specifier,
    header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::config::route::v3::{
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
    weighted_cluster::ClusterWeight,
};
use envoy_types::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    RegexMatchAndSubstitute, RegexMatcher, StringMatcher, string_matcher::MatchPattern,
};
use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};
use envoy_types::util::pack_any;

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

pub use self::gateway::{
    GatewayRoute, GatewayRoutes, GatewayVirtualHost, gateway, gateway_blackhole, gateway_plan,
};

/// Istio's default retry policy, as the seeds specify it (older Istio: 3 host-selection
/// attempts, retriable status 503).
pub const DEFAULT_RETRY_ON: &str =
    "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes";
pub const DEFAULT_RETRIES: u32 = 2;
pub const DEFAULT_HOST_SELECTION_ATTEMPTS: i64 = 3;
pub const DEFAULT_RETRIABLE_STATUS: u32 = 503;

fn route_configuration(name: String, virtual_hosts: Vec<VirtualHost>) -> RouteConfiguration {
    RouteConfiguration {
        name,
        virtual_hosts,
        validate_clusters: Some(BoolValue { value: false }),
        ignore_port_in_host_matching: true,
        max_direct_response_body_size_bytes: Some(UInt32Value { value: 1_048_576 }),
        ..Default::default()
    }
}

/// A route configuration whose virtual hosts are sent over VHDS
/// (`vhds_virtual_host`): no virtual hosts of its own, and VHDS over ADS. It stays the
/// same while its virtual hosts change, so Envoy keeps them (a changed route configuration
/// would drop them).
pub fn vhds_shell(name: String) -> RouteConfiguration {
    RouteConfiguration {
        vhds: vhds_over_ads(),
        ..route_configuration(name, Vec::new())
    }
}

fn vhds_over_ads() -> Option<Vhds> {
    Some(Vhds {
        config_source: Some(super::ads_config_source()),
    })
}

/// A route configuration split for VHDS: its shell ([`vhds_shell`]'s shape: every field
/// but the virtual hosts, and VHDS over ADS) and its virtual hosts as VHDS resources.
pub fn into_vhds(mut rc: RouteConfiguration) -> (RouteConfiguration, Vec<VirtualHost>) {
    let vhosts = std::mem::take(&mut rc.virtual_hosts);
    let vhosts = (vhosts.into_iter())
        .map(|vh| vhds_virtual_host(&rc.name, vh))
        .collect();
    rc.vhds = vhds_over_ads();
    (rc, vhosts)
}

/// A VHDS resource's name: `ROUTE_CONFIGURATION/VIRTUAL_HOST`, as Envoy's VHDS names them.
/// Envoy subscribes to a route configuration's name and takes every resource under it
/// (namespace matching), and removes a virtual host by the resource's name, so the virtual
/// host carries this name too (`vhds_virtual_host`).
pub fn vhds_name(route_config: &str, virtual_host: &str) -> String {
    format!("{route_config}/{virtual_host}")
}

/// A virtual host of `route_config` as sent over VHDS: named [`vhds_name`].
fn vhds_virtual_host(route_config: &str, mut vh: VirtualHost) -> VirtualHost {
    vh.name = vhds_name(route_config, &vh.name);
    vh
}

/// An empty route configuration, for a name no listener defines (so listeners finish warming).
pub fn empty(name: &str) -> RouteConfiguration {
    route_configuration(name.to_string(), Vec::new())
}

/// Who reads a service's virtual host, which decides its domains: a proxy in the
/// service's namespace (the short name too), a proxy elsewhere, or a sniffed listener's
/// own route configuration `HOST:PORT` (`*`: the listener serves that service alone, as
/// istiod's `getVirtualHostsForSniffedServicePort` writes it). A proxy that knows the
/// service by an auto-allocated address ([`Service::auto_for`]) has that address among the
/// domains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audience {
    Local(AutoAddresses),
    Remote(AutoAddresses),
    Sniffed,
}

impl Audience {
    pub fn new(svc: &Service, proxy: &Proxy, sniffed: bool) -> Audience {
        let auto = svc.auto_for(proxy.auto_addresses);
        if sniffed {
            Audience::Sniffed
        } else if svc.namespace == proxy.namespace {
            Audience::Local(auto)
        } else {
            Audience::Remote(auto)
        }
    }
}

/// Every domain Istio gives a service's virtual host for `audience`.
pub fn domains(svc: &Service, audience: Audience) -> Vec<String> {
    let auto = match audience {
        Audience::Sniffed => return vec!["*".into()],
        Audience::Local(auto) | Audience::Remote(auto) => auto,
    };
    let mut out = vec![svc.hostname.clone(), format!("{}.", svc.hostname)];
    if svc.kubernetes {
        if matches!(audience, Audience::Local(_)) {
            out.push(svc.name.clone());
        }
        out.push(format!("{}.{}.svc", svc.name, svc.namespace));
        out.push(format!("{}.{}", svc.name, svc.namespace));
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

/// A route configuration with the given virtual hosts (sidecar and gateway alike).
pub fn with_virtual_hosts(name: String, virtual_hosts: Vec<VirtualHost>) -> RouteConfiguration {
    route_configuration(name, virtual_hosts)
}

/// A sidecar's route configuration: `"PORT"` (the port's services' virtual hosts, then
/// the catch-all), or a sniffed listener's `HOST:PORT` (its service's virtual host alone,
/// for every domain).
pub fn sidecar(ctx: &PushContext, proxy: &Proxy, r: &RouteServices) -> RouteConfiguration {
    let sniffed = r.sniffed.is_some();
    let mut vhosts: Vec<VirtualHost> = sidecar_plan(ctx, proxy, r)
        .into_iter()
        .map(|p| p.build(ctx, proxy, r.port, sniffed))
        .collect();
    if !sniffed {
        vhosts.push(sidecar_catch_all(ctx, proxy));
    }
    route_configuration(r.name(), vhosts)
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

fn default_retry_policy() -> RetryPolicy {
    RetryPolicy {
        retry_on: DEFAULT_RETRY_ON.into(),
        num_retries: Some(UInt32Value {
            value: DEFAULT_RETRIES,
        }),
        retry_host_predicate: vec![previous_hosts()],
        host_selection_retry_max_attempts: DEFAULT_HOST_SELECTION_ATTEMPTS,
        retriable_status_codes: vec![DEFAULT_RETRIABLE_STATUS],
        ..Default::default()
    }
}

/// A route's retry policy, as istiod's `ConvertPolicy`: Istio's default without a policy
/// (no VirtualService `retries`, no MeshConfig `defaultHttpRetryPolicy`), none with 0
/// attempts, else the default with what the policy sets: `retryOn` (its status codes as
/// retriable ones), `perTryTimeout`, `retryIgnorePreviousHosts`, `retryRemoteLocalities`
/// and `backoff`.
pub fn retry_policy(retries: Option<&HttpRetry>) -> Option<RetryPolicy> {
    let Some(r) = retries else {
        return Some(default_retry_policy());
    };
    if r.attempts <= 0 {
        return None;
    }
    let (retry_on, retriable_status_codes) =
        parse_retry_on(r.retry_on.as_deref().unwrap_or(DEFAULT_RETRY_ON));
    Some(RetryPolicy {
        retry_on,
        num_retries: Some(UInt32Value {
            value: r.attempts as u32,
        }),
        per_try_timeout: optional_duration(r.per_try_timeout.as_deref()),
        retry_host_predicate: if r.retry_ignore_previous_hosts == Some(false) {
            Vec::new()
        } else {
            vec![previous_hosts()]
        },
        host_selection_retry_max_attempts: DEFAULT_HOST_SELECTION_ATTEMPTS,
        retriable_status_codes,
        retry_priority: (r.retry_remote_localities == Some(true)).then(previous_priorities),
        retry_back_off: back_off(r),
        ..Default::default()
    })
}

/// An inbound route's retry policy, as istiod's `ConvertInboundPolicy`: without MeshConfig
/// `defaultInboundHttpRetryPolicy`, two retries of requests reset before they reached the
/// application; none with 0 attempts; else its attempts, `retryOn` and `backoff` (host
/// selection and per-try timeouts mean nothing for the one local application).
pub fn inbound_retry_policy(retries: Option<&HttpRetry>) -> Option<RetryPolicy> {
    let attempts = retries.map_or(DEFAULT_RETRIES as i32, |r| r.attempts);
    if attempts <= 0 {
        return None;
    }
    let retry_on = retries.and_then(|r| r.retry_on.as_deref());
    let (retry_on, retriable_status_codes) = parse_retry_on(retry_on.unwrap_or(INBOUND_RETRY_ON));
    Some(RetryPolicy {
        retry_on,
        num_retries: Some(UInt32Value {
            value: attempts as u32,
        }),
        retriable_status_codes,
        retry_back_off: retries.and_then(back_off),
        ..Default::default()
    })
}

/// What istiod retries on an inbound route by default: a request reset before it reached
/// the application was never processed, so retrying it is safe for any method.
pub const INBOUND_RETRY_ON: &str = "reset-before-request";

/// `retryOn`'s conditions, and its numbers as retriable status codes (adding the
/// `retriable-status-codes` condition when they need it).
fn parse_retry_on(text: &str) -> (String, Vec<u32>) {
    let mut codes = Vec::new();
    let mut on: Vec<&str> = Vec::new();
    for tok in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        match tok.parse::<u32>() {
            Ok(code) => codes.push(code),
            Err(_) => on.push(tok),
        }
    }
    if !codes.is_empty() && !on.contains(&"retriable-status-codes") {
        on.push("retriable-status-codes");
    }
    (on.join(","), codes)
}

fn back_off(r: &HttpRetry) -> Option<RetryBackOff> {
    optional_duration(r.backoff.as_deref()).map(|base| RetryBackOff {
        base_interval: Some(base),
        ..Default::default()
    })
}

/// `retryRemoteLocalities`: retries go to other localities' endpoints (istiod's
/// `previous_priorities` with update frequency 2).
fn previous_priorities() -> RetryPriority {
    use envoy_types::pb::envoy::extensions::retry::priority::previous_priorities::v3::PreviousPrioritiesConfig;
    RetryPriority {
        name: "envoy.retry_priorities.previous_priorities".into(),
        config_type: Some(retry_policy::retry_priority::ConfigType::TypedConfig(
            pack_any(PreviousPrioritiesConfig {
                update_frequency: 2,
            }),
        )),
    }
}

fn previous_hosts() -> RetryHostPredicate {
    RetryHostPredicate {
        name: "envoy.retry_host_predicates.previous_hosts".into(),
        config_type: Some(envoy_types::pb::envoy::config::route::v3::retry_policy::retry_host_predicate::ConfigType::TypedConfig(
            pack_any(PreviousHostsPredicate {}),
        )),
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

/// The hash policy of a route to `port` (and `subset`) of a host, if its DestinationRule
/// `rule` hashes consistently there: `Some(vec![])` when it hashes on no key.
fn destination_hash(
    rule: Option<&DestinationRuleSpec>,
    subset: &str,
    port: u32,
) -> Option<Vec<HashPolicy>> {
    let rule = rule?;
    let hash = super::policy::consistent_hash(rule, subset, port)?;
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

fn string_matcher(m: &StringMatch, ignore_case: bool) -> Option<StringMatcher> {
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

fn header_matcher(name: &str, m: &StringMatch, invert: bool) -> HeaderMatcher {
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

fn route_match(m: Option<&HttpMatchRequest>) -> RouteMatch {
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

fn header_options(ops: &HeaderOperations) -> (Vec<HeaderValueOption>, Vec<String>) {
    let mut add: Vec<HeaderValueOption> = Vec::new();
    for (set, action) in [
        (&ops.set, HeaderAppendAction::OverwriteIfExistsOrAdd),
        (&ops.add, HeaderAppendAction::AppendIfExistsOrAdd),
    ] {
        for (k, v) in set {
            add.push(HeaderValueOption {
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
    (add, ops.remove.clone())
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

/// The matches of an `http` entry that apply to this port, gateway and proxy (`[None]`
/// for an entry without matches); `None` when none does and the entry gives no route.
fn kept_matches<'h>(
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
    if let Some(h) = &http.headers {
        if let Some(req) = &h.request {
            (
                route.request_headers_to_add,
                route.request_headers_to_remove,
            ) = header_options(req);
        }
        if let Some(resp) = &h.response {
            (
                route.response_headers_to_add,
                route.response_headers_to_remove,
            ) = header_options(resp);
        }
    }
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
    let mut targets: Vec<(String, u32)> = Vec::new();
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
            targets.push((outbound_cluster_name(p, subset, &host), weight));
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
    let cluster_specifier = match targets.len() {
        0 => ClusterSpecifier::Cluster("BlackHoleCluster".into()),
        1 => ClusterSpecifier::Cluster(targets[0].0.clone()),
        _ => ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: targets
                .iter()
                .map(|(name, w)| ClusterWeight {
                    name: name.clone(),
                    weight: Some(UInt32Value { value: *w }),
                    ..Default::default()
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
    let rewrite = http.rewrite.as_ref();
    let request_mirror_policies = mirror_policies(ctx, proxy, http, ns, port);
    route.action = Some(Action::Route(RouteAction {
        request_mirror_policies,
        cluster_specifier: Some(cluster_specifier),
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
        host_rewrite_specifier: rewrite
            .and_then(|r| r.authority.clone())
            .map(HostRewriteSpecifier::HostRewriteLiteral),
        ..Default::default()
    }));
    if let Some((first, _)) = targets.first() {
        let host = first.rsplit('|').next().unwrap_or_default();
        route.decorator = Some(Decorator {
            operation: format!("{host}:{port}/*"),
            ..Default::default()
        });
    }
    route
}
