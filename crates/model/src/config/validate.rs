//! Checks on one object that the schema cannot express: regexes that compile, exactly one
//! StringMatch form, durations, weights, required fields. Cross-object checks (a route to a
//! host that does not exist) happen when the push context is built.

use regex::RegexBuilder;

use self::traffic_policy::{connection_pool, traffic_policy};
use super::{ConfigObject, Level, Spec};
use api::networking::{HttpRoute, StringMatch};

mod traffic_policy;

/// One problem with a field of an object.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub level: Level,
    pub field: String,
    pub message: String,
}

#[derive(Default)]
struct Report(Vec<Problem>);

impl Report {
    fn error(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            level: Level::Error,
            field: field.into(),
            message: message.into(),
        });
    }
    fn warn(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            level: Level::Warning,
            field: field.into(),
            message: message.into(),
        });
    }
    /// A warning for each of `fields` (name, set) that is set: meshd keeps it but does
    /// not translate it.
    fn not_applied<const N: usize>(&mut self, field: &str, fields: [(&str, bool); N]) {
        for (name, set) in fields {
            if set {
                self.warn(format!("{field}.{name}"), NOT_APPLIED);
            }
        }
    }
    fn duration(&mut self, field: String, value: &Option<String>) {
        if let Some(v) = value
            && let Err(e) = api::duration::parse(v)
        {
            self.error(field, e);
        }
    }
}

/// Envoy compiles regexes with RE2; the `regex` crate accepts the same syntax for what
/// Istio users write, and rejects what RE2 rejects (look-around, back-references).
pub fn check_regex(regex: &str) -> Result<(), String> {
    RegexBuilder::new(regex)
        .size_limit(1 << 20)
        .build()
        .map(|_| ())
        .map_err(|e| {
            format!(
                "invalid regex {regex:?}: {}",
                e.to_string().lines().last().unwrap_or("")
            )
        })
}

fn string_match(r: &mut Report, field: String, m: &StringMatch) {
    let set = [m.exact.is_some(), m.prefix.is_some(), m.regex.is_some()];
    match set.iter().filter(|b| **b).count() {
        1 => {}
        0 => r.error(field.clone(), "one of exact, prefix or regex is required"),
        _ => r.error(
            field.clone(),
            "only one of exact, prefix or regex may be set",
        ),
    }
    if let Some(regex) = &m.regex
        && let Err(e) = check_regex(regex)
    {
        r.error(format!("{field}.regex"), e);
    }
}

fn http_route(r: &mut Report, field: &str, route: &HttpRoute) {
    for (i, m) in route.match_.iter().enumerate() {
        let f = format!("{field}.match[{i}]");
        for (name, sm) in [
            ("uri", &m.uri),
            ("scheme", &m.scheme),
            ("method", &m.method),
            ("authority", &m.authority),
        ] {
            if let Some(sm) = sm {
                string_match(r, format!("{f}.{name}"), sm);
            }
        }
        for (h, sm) in m.headers.iter().chain(&m.without_headers) {
            if h.is_empty() || h.chars().any(|c| c.is_ascii_uppercase()) {
                r.error(
                    format!("{f}.headers.{h}"),
                    "header names must be lowercase and non-empty",
                );
            }
            if sm != &StringMatch::default() {
                string_match(r, format!("{f}.headers.{h}"), sm);
            }
        }
        for (q, sm) in &m.query_params {
            string_match(r, format!("{f}.queryParams.{q}"), sm);
        }
    }
    let actions = [
        !route.route.is_empty(),
        route.redirect.is_some(),
        route.direct_response.is_some(),
        route.delegate.is_some(),
    ];
    match actions.iter().filter(|b| **b).count() {
        0 => r.error(
            field.to_string(),
            "one of route, redirect, directResponse or delegate is required",
        ),
        1 => {}
        _ if route.redirect.is_some() && route.direct_response.is_some() => r.error(
            field.to_string(),
            "redirect and directResponse cannot both be set",
        ),
        _ if !route.route.is_empty()
            && (route.redirect.is_some() || route.direct_response.is_some()) =>
        {
            r.error(
                field.to_string(),
                "route cannot be combined with redirect or directResponse",
            )
        }
        _ => {}
    }
    let mut total = 0i64;
    for (i, d) in route.route.iter().enumerate() {
        let f = format!("{field}.route[{i}]");
        if d.destination.host.is_empty() {
            r.error(format!("{f}.destination.host"), "is required");
        }
        if let Some(p) = &d.destination.port
            && !(1..=65535).contains(&p.number)
        {
            r.error(
                format!("{f}.destination.port.number"),
                format!("port {} out of range", p.number),
            );
        }
        match d.weight {
            Some(w) if w < 0 => r.error(format!("{f}.weight"), "weight must not be negative"),
            Some(w) => total += w as i64,
            None => {}
        }
    }
    if route.route.len() > 1 && total == 0 {
        r.error(
            format!("{field}.route"),
            "with several destinations, at least one weight must be set",
        );
    }
    r.duration(format!("{field}.timeout"), &route.timeout);
    if let Some(fault) = &route.fault {
        fault_injection(r, &format!("{field}.fault"), fault);
    }
    if let Some(delegate) = &route.delegate {
        if delegate.name.is_empty() {
            r.error(format!("{field}.delegate.name"), "is required");
        }
        if !route.route.is_empty() || route.redirect.is_some() {
            r.error(
                field.to_string(),
                "a route with a delegate must not specify route or redirect",
            );
        }
    }
    mirrors(r, field, route);
    if let Some(cors) = &route.cors_policy {
        let f = format!("{field}.corsPolicy");
        for (i, m) in cors.allow_origins.iter().enumerate() {
            string_match(r, format!("{f}.allowOrigins[{i}]"), m);
        }
        r.duration(format!("{f}.maxAge"), &cors.max_age);
        if let Some(u) = cors.unmatched_preflights.as_deref()
            && !matches!(u, "UNSPECIFIED" | "FORWARD" | "IGNORE")
        {
            r.error(
                format!("{f}.unmatchedPreflights"),
                format!("{u:?} is not one of UNSPECIFIED, FORWARD, IGNORE"),
            );
        }
    }
    if let Some(policy) = &route.retries {
        retries(r, &format!("{field}.retries"), policy);
    }
    if let Some(rw) = &route.rewrite {
        if rw.uri_regex_rewrite.is_some() && rw.uri.is_some() {
            r.error(
                format!("{field}.rewrite"),
                "uri and uriRegexRewrite cannot both be set",
            );
        }
        if let Some(rr) = &rw.uri_regex_rewrite {
            let f = format!("{field}.rewrite.uriRegexRewrite.match");
            if rr.match_.is_empty() {
                r.error(f, "is required");
            } else if let Err(e) = check_regex(&rr.match_) {
                r.error(f, e);
            }
        }
    }
}

/// A Gateway server's `tls`: meshd serves SIMPLE, MUTUAL and OPTIONAL_MUTUAL from a
/// `credentialName` or from files (which must then all be named, as istiod requires),
/// ISTIO_MUTUAL with the gateway's workload certificate (which takes no other
/// certificate), and forwards PASSTHROUGH and, on TLS ports, AUTO_PASSTHROUGH (elsewhere
/// it is accepted with a warning and gets no listener).
///
/// As istiod's `validateServer`, a plaintext HTTP server may have a `tls` block only for
/// `httpsRedirect` (no mode but PASSTHROUGH, no certificate files), and other servers
/// that are neither HTTPS nor TLS none; `httpsRedirect` elsewhere than on an HTTP server
/// is warned about.
fn server_tls(r: &mut Report, field: &str, server: &api::networking::Server) {
    use api::values::{https_redirect, server_tls_field, server_tls_mode};
    let Some(tls) = &server.tls else {
        return;
    };
    let set = |key: &str| server_tls_field(tls, key).is_some();
    let credential = set("credentialName");
    let f = format!("{field}.tls");
    let protocol = server.port.protocol.to_ascii_uppercase();
    let http = matches!(
        protocol.as_str(),
        "HTTP" | "HTTP2" | "GRPC" | "GRPC-WEB" | "HTTP_PROXY"
    );
    if !http && https_redirect(Some(tls)) {
        r.warn(
            format!("{f}.httpsRedirect"),
            "tls.httpsRedirect should only be used with http servers",
        );
    }
    if !matches!(protocol.as_str(), "HTTPS" | "TLS") {
        let passthrough = matches!(
            server_tls_mode(tls).as_str(),
            "PASSTHROUGH" | "AUTO_PASSTHROUGH"
        );
        let files = ["serverCertificate", "privateKey", "caCertificates"];
        if !http {
            r.error(f, "server cannot have TLS settings for non HTTPS/TLS ports");
        } else if !passthrough || files.iter().any(|k| set(k)) {
            r.error(
                f,
                "server cannot have TLS settings for plain text HTTP ports",
            );
        }
        return;
    }
    match server_tls_mode(tls).as_str() {
        "PASSTHROUGH" => {}
        "AUTO_PASSTHROUGH" if !server.port.protocol.eq_ignore_ascii_case("TLS") => r.warn(
            format!("{f}.mode"),
            format!("{NOT_APPLIED}: AUTO_PASSTHROUGH on a port of protocol other than TLS"),
        ),
        "AUTO_PASSTHROUGH" => {}
        "ISTIO_MUTUAL" => {
            for key in [
                "serverCertificate",
                "privateKey",
                "caCertificates",
                "credentialName",
            ] {
                if set(key) {
                    r.error(
                        format!("{f}.{key}"),
                        "ISTIO_MUTUAL uses the gateway's workload certificate: set no other",
                    );
                }
            }
        }
        "SIMPLE" | "MUTUAL" | "OPTIONAL_MUTUAL" if credential => {}
        // Files in the gateway's container, served by its agent.
        mode @ ("SIMPLE" | "MUTUAL" | "OPTIONAL_MUTUAL") => {
            for key in ["serverCertificate", "privateKey"] {
                if !set(key) {
                    r.error(format!("{f}.{key}"), "is required without a credentialName");
                }
            }
            if mode != "SIMPLE" && !set("caCertificates") {
                r.error(
                    format!("{f}.caCertificates"),
                    format!("{mode} needs the clients' CA without a credentialName"),
                );
            }
        }
        other => r.warn(format!("{f}.mode"), format!("{NOT_APPLIED}: mode {other}")),
    }
}

/// An Istio `Percent`, if set, within 0–100.
fn percent(r: &mut Report, field: String, p: Option<&api::networking::Percent>) {
    if let Some(p) = p
        && !(0.0..=100.0).contains(&p.value)
    {
        r.error(field, format!("{} is not within 0-100", p.value));
    }
}

/// Mirrors, as Istio validates them: `mirror` or `mirrors`, not both; each destination
/// with a host; percentages within 0–100.
fn mirrors(r: &mut Report, field: &str, route: &api::networking::HttpRoute) {
    if route.mirror.is_some() && !route.mirrors.is_empty() {
        r.error(
            format!("{field}.mirrors"),
            "mirror and mirrors cannot both be set",
        );
    }
    if let Some(m) = &route.mirror
        && m.host.is_empty()
    {
        r.error(format!("{field}.mirror.host"), "is required");
    }
    percent(
        r,
        format!("{field}.mirrorPercentage.value"),
        route.mirror_percentage.as_ref(),
    );
    if let Some(p) = route.mirror_percent.filter(|p| *p > 100) {
        r.error(
            format!("{field}.mirrorPercent"),
            format!("{p} is not within 0-100"),
        );
    }
    for (i, m) in route.mirrors.iter().enumerate() {
        let f = format!("{field}.mirrors[{i}]");
        if m.destination.host.is_empty() {
            r.error(format!("{f}.destination.host"), "is required");
        }
        percent(r, format!("{f}.percentage.value"), m.percentage.as_ref());
    }
}

/// Fault injection, as Istio validates it: a delay or an abort; a delay's duration and
/// percentages within 0–100; an abort's HTTP status within 200–599 or a gRPC status by
/// name. An exponential delay or an HTTP/2 error is accepted and not applied (istiod
/// drops them too).
fn fault_injection(r: &mut Report, field: &str, fault: &api::networking::HttpFaultInjection) {
    if fault.delay.is_none() && fault.abort.is_none() {
        r.error(
            field.to_string(),
            "at least one of delay or abort is required",
        );
    }
    if let Some(d) = &fault.delay {
        let f = format!("{field}.delay");
        match (&d.fixed_delay, &d.exponential_delay) {
            (Some(_), _) => r.duration(format!("{f}.fixedDelay"), &d.fixed_delay),
            (None, Some(_)) => r.warn(format!("{f}.exponentialDelay"), NOT_APPLIED),
            (None, None) => r.error(format!("{f}.fixedDelay"), "is required"),
        }
        percent(r, format!("{f}.percentage.value"), d.percentage.as_ref());
        if let Some(p) = d.percent.filter(|p| !(0..=100).contains(p)) {
            r.error(format!("{f}.percent"), format!("{p} is not within 0-100"));
        }
    }
    if let Some(a) = &fault.abort {
        let f = format!("{field}.abort");
        match (a.http_status, &a.grpc_status, &a.http2_error) {
            (Some(s), _, _) if !(200..=599).contains(&s) => r.error(
                format!("{f}.httpStatus"),
                format!("HTTP status {s} is not in range 200-599"),
            ),
            (Some(_), _, _) => {}
            (None, Some(g), _) if api::values::grpc_code(g).is_none() => r.error(
                format!("{f}.grpcStatus"),
                format!("{g:?} is not a gRPC status name"),
            ),
            (None, Some(_), _) => {}
            (None, None, Some(_)) => r.warn(format!("{f}.http2Error"), NOT_APPLIED),
            (None, None, None) => r.error(
                f.clone(),
                "one of httpStatus, grpcStatus or http2Error is required",
            ),
        }
        percent(r, format!("{f}.percentage.value"), a.percentage.as_ref());
    }
}

/// A field meshd accepts and keeps but does not yet translate: the object applies, the
/// warning says what of it does not.
const NOT_APPLIED: &str = "accepted but not yet applied by meshd";

fn hosts(r: &mut Report, field: &str, hosts: &[String]) {
    if hosts.is_empty() {
        r.error(field.to_string(), "at least one host is required");
    }
    for (i, h) in hosts.iter().enumerate() {
        let bare = h.rsplit_once('/').map_or(h.as_str(), |(_, h)| h);
        if bare.is_empty() || bare.contains(char::is_whitespace) {
            r.error(format!("{field}[{i}]"), format!("invalid host {h:?}"));
        } else if bare.len() > 1 && bare[1..].contains('*') {
            r.error(
                format!("{field}[{i}]"),
                format!("wildcard is only allowed as the first label: {h:?}"),
            );
        }
    }
}

/// A policy's `targetRef(s)` (waypoints and gateways of the Gateway API) are refused:
/// meshd attaches policies by `selector` only.
fn no_target_refs(
    r: &mut Report,
    target_ref: &Option<api::AnyObject>,
    target_refs: &[api::AnyObject],
) {
    if target_ref.is_some() || !target_refs.is_empty() {
        r.error(
            "spec.targetRefs",
            "targetRef(s) (waypoints and gateways) are not supported by meshd; use selector",
        );
    }
}

/// RequestAuthentication, as istiod's `ValidateRequestAuthentication`: each rule names an
/// issuer or a `jwksUri`, the URI is an http(s) URL, inline `jwks` is a key set, header,
/// parameter and cookie names and audiences are not empty, `timeout` is a duration.
/// `targetRef(s)` are refused, as for AuthorizationPolicy.
fn request_authentication(r: &mut Report, ra: &api::security::RequestAuthenticationSpec) {
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
            r.error(format!("{f}.jwksUri"), e);
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

/// Telemetry, as istiod's `validateTelemetry` checks it: a mode Istio knows, named
/// providers, a filter whose expression parses as CEL ([`super::cel`]; Envoy refuses the
/// whole listener update otherwise), a sampling percentage; `targetRef(s)` are
/// refused. `metrics`, and tracing's `useRequestIdForTraceSampling: false` and
/// `disableContextPropagation`, are kept but not applied (warned).
fn telemetry(r: &mut Report, t: &api::telemetry::TelemetrySpec) {
    no_target_refs(r, &t.target_ref, &t.target_refs);
    for (i, l) in t.access_logging.iter().enumerate() {
        let f = format!("spec.accessLogging[{i}]");
        telemetry_entry(r, &f, &l.r#match, &l.providers);
        if let Some(filter) = &l.filter {
            let field = format!("{f}.filter.expression");
            if filter.expression.trim().is_empty() {
                r.error(field, "must not be empty");
            } else if let Err(e) = super::cel::check(&filter.expression) {
                r.error(field, format!("not a CEL expression: {e}"));
            }
        }
    }
    for (i, e) in t.tracing.iter().enumerate() {
        let f = format!("spec.tracing[{i}]");
        telemetry_entry(r, &f, &e.r#match, &e.providers);
        if let Some(p) = e.random_sampling_percentage
            && !(0.0..=100.0).contains(&p)
        {
            let message = format!("{p} is not a percentage between 0 and 100");
            r.error(format!("{f}.randomSamplingPercentage"), message);
        }
        if e.use_request_id_for_trace_sampling == Some(false) {
            r.warn(format!("{f}.useRequestIdForTraceSampling"), NOT_APPLIED);
        }
        if e.disable_context_propagation == Some(true) {
            r.warn(format!("{f}.disableContextPropagation"), NOT_APPLIED);
        }
    }
    if !t.metrics.is_empty() {
        r.warn(
            "spec.metrics",
            format!("{NOT_APPLIED}: Istio's stats filter is not in stock Envoy"),
        );
    }
}

/// A Telemetry entry's `match.mode` (one Istio knows) and `providers` (named).
fn telemetry_entry(
    r: &mut Report,
    field: &str,
    selector: &Option<api::telemetry::LogSelector>,
    providers: &[api::telemetry::ProviderRef],
) {
    if let Some(mode) = selector.as_ref().and_then(|m| m.mode.as_deref())
        && !matches!(mode, "CLIENT" | "SERVER" | "CLIENT_AND_SERVER")
    {
        let message = format!("{mode:?} is not CLIENT, SERVER or CLIENT_AND_SERVER");
        r.error(format!("{field}.match.mode"), message);
    }
    for (j, p) in providers.iter().enumerate() {
        if p.name.is_empty() {
            r.error(format!("{field}.providers[{j}].name"), "must not be empty");
        }
    }
}

/// AuthorizationPolicy: what meshd cannot enforce is refused, never applied in part.
fn authorization_policy(r: &mut Report, ap: &api::security::AuthorizationPolicySpec) {
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

/// A TCP route: destinations with a host and weights within 0–100 (summing to 100 when
/// there are several), subnets that parse (`vs_gateways`: the VirtualService's).
fn tcp_route(
    r: &mut Report,
    field: &str,
    route: &api::networking::TcpRoute,
    vs_gateways: &[String],
) {
    route_destinations(r, field, &route.route);
    for (i, m) in route.r#match.iter().enumerate() {
        let gateways = bound_to(&m.gateways, vs_gateways);
        subnets(
            r,
            &format!("{field}.match[{i}]"),
            &m.destination_subnets,
            gateways,
        );
    }
}

/// The gateways a route's match applies to: its own, else its VirtualService's.
fn bound_to<'g>(match_gateways: &'g [String], vs_gateways: &'g [String]) -> &'g [String] {
    if match_gateways.is_empty() {
        vs_gateways
    } else {
        match_gateways
    }
}

/// A TLS route, as Istio's `validateTLSRoute`: at least one match, each naming SNI hosts
/// that are valid and fall within one of the VirtualService's `hosts`; destinations as a
/// TCP route's.
fn tls_route(
    r: &mut Report,
    field: &str,
    route: &api::networking::TlsRoute,
    vs: &api::networking::VirtualServiceSpec,
) {
    let vs_hosts = &vs.hosts;
    if route.r#match.is_empty() {
        r.error(
            format!("{field}.match"),
            "a TLS route must have at least one match condition",
        );
    }
    route_destinations(r, field, &route.route);
    for (i, m) in route.r#match.iter().enumerate() {
        let f = format!("{field}.match[{i}]");
        if m.sni_hosts.is_empty() {
            r.error(
                format!("{f}.sniHosts"),
                "a TLS match must have at least one SNI host",
            );
        }
        for (j, sni) in m.sni_hosts.iter().enumerate() {
            let sf = format!("{f}.sniHosts[{j}]");
            if sni.is_empty()
                || sni.contains(char::is_whitespace)
                || (sni.len() > 1 && sni[1..].contains('*'))
            {
                r.error(sf, format!("invalid SNI host {sni:?}"));
            } else if sni.parse::<std::net::IpAddr>().is_ok() {
                r.warn(
                    sf,
                    format!("using an IP address ({sni:?}) goes against the SNI spec and most clients do not support it"),
                );
            } else if !vs_hosts.iter().any(|h| crate::host_covers(h, sni)) {
                r.error(
                    sf,
                    format!(
                        "SNI host {sni:?} is not a compatible subset of any of the virtual service hosts: [{}]",
                        vs_hosts.join(", ")
                    ),
                );
            }
        }
        let gateways = bound_to(&m.gateways, &vs.gateways);
        subnets(r, &f, &m.destination_subnets, gateways);
    }
}

/// The destinations of a TCP or TLS route: a host each, weights within 0–100, summing to
/// 100 when there are several.
fn route_destinations(r: &mut Report, field: &str, route: &[api::networking::RouteDestination]) {
    if route.is_empty() {
        r.error(
            format!("{field}.route"),
            "at least one destination is required",
        );
    }
    for (i, d) in route.iter().enumerate() {
        let f = format!("{field}.route[{i}]");
        if d.destination.host.is_empty() {
            r.error(format!("{f}.destination.host"), "is required");
        }
        if let Some(w) = d.weight.filter(|w| !(0..=100).contains(w)) {
            r.error(format!("{f}.weight"), format!("{w} is not within 0-100"));
        }
    }
    if route.len() > 1 {
        let total: i64 = route.iter().map(|d| i64::from(d.weight.unwrap_or(0))).sum();
        if total != 100 {
            r.error(
                format!("{field}.route"),
                format!("the weights sum to {total}, not 100"),
            );
        }
    }
}

/// A Sidecar's `outboundTrafficPolicy.egressProxy`, as istiod checks it: only with mode
/// ALLOW_ANY (an unset mode is REGISTRY_ONLY in Istio's API), a DNS host, a port.
fn egress_proxy(r: &mut Report, policy: &api::networking::OutboundTrafficPolicy) {
    use api::networking::OutboundMode;
    let Some(proxy) = &policy.egress_proxy else {
        return;
    };
    let f = "spec.outboundTrafficPolicy.egressProxy";
    if policy.mode != Some(OutboundMode::AllowAny) {
        r.error(
            f,
            "egressProxy must be set only with ALLOW_ANY outboundTrafficPolicy mode",
        );
    }
    if !dns_name(&proxy.host) {
        r.error(
            format!("{f}.host"),
            format!("{:?} is not a DNS name", proxy.host),
        );
    }
    if proxy
        .port
        .as_ref()
        .is_none_or(|p| !(1..=65535).contains(&p.number))
    {
        r.error(format!("{f}.port"), "egressProxy needs a port (1-65535)");
    }
}

/// A DNS name: dot-separated labels of letters, digits and inner hyphens.
fn dns_name(host: &str) -> bool {
    let label = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    host.len() <= 255 && host.split('.').all(label)
}

/// A Sidecar's egress listeners, as istiod's `ValidateSidecar` checks them: hosts as
/// `namespace/host`, at least one; one catch-all (no `port`), and last; ports in range,
/// of a known protocol, unique among IP-bound listeners; `bind` an IP address;
/// `captureMode` one of Istio's. A Unix domain socket `bind` and the `HTTP_PROXY`
/// protocol are accepted with a warning: meshd builds no listener for them.
fn sidecar_egress(r: &mut Report, egress: &[api::networking::IstioEgressListener]) {
    use crate::egress::UNIX_PREFIX;
    let mut ports = Vec::new();
    for (i, e) in egress.iter().enumerate() {
        let f = format!("spec.egress[{i}]");
        if e.hosts.is_empty() {
            r.error(
                format!("{f}.hosts"),
                "an egress listener needs at least one host",
            );
        }
        for (j, h) in e.hosts.iter().enumerate() {
            if !h.contains('/') {
                r.error(
                    format!("{f}.hosts[{j}]"),
                    format!("must be namespace/host, got {h:?}"),
                );
            }
        }
        let bind = e.bind.as_deref().unwrap_or("");
        let unix = bind.starts_with(UNIX_PREFIX);
        match e.capture_mode.as_deref() {
            None | Some("DEFAULT" | "IPTABLES" | "NONE") => {}
            Some(other) => r.error(
                format!("{f}.captureMode"),
                format!("{other:?} is not DEFAULT, IPTABLES or NONE"),
            ),
        }
        if unix {
            r.warn(
                format!("{f}.bind"),
                format!("{NOT_APPLIED}: a Unix domain socket"),
            );
        } else if !bind.is_empty() && bind.parse::<std::net::IpAddr>().is_err() {
            r.error(
                format!("{f}.bind"),
                format!("{bind:?} is not an IP address"),
            );
        }
        let Some(port) = &e.port else {
            if i + 1 != egress.len() {
                r.error(
                    format!("{f}.port"),
                    "only the last egress listener may omit the port (the catch-all)",
                );
            }
            continue;
        };
        let protocol = port.protocol.to_ascii_uppercase();
        if protocol == "HTTP_PROXY" {
            r.warn(
                format!("{f}.port.protocol"),
                format!("{NOT_APPLIED}: HTTP_PROXY"),
            );
        } else if !protocol.is_empty() && !ISTIO_PROTOCOLS.contains(&protocol.as_str()) {
            r.error(
                format!("{f}.port.protocol"),
                format!("unsupported protocol {:?}", port.protocol),
            );
        }
        if port.number == 0 && !unix {
            r.error(
                format!("{f}.port.number"),
                "port 0 needs a Unix domain socket bind",
            );
        } else if !unix {
            if port.number > 65535 {
                r.error(
                    format!("{f}.port.number"),
                    format!("port {} out of range", port.number),
                );
            } else if ports.contains(&port.number) {
                r.error(
                    format!("{f}.port.number"),
                    format!("port {} is taken by an earlier egress listener: ports on IP bound listeners must be unique", port.number),
                );
            }
            ports.push(port.number);
        }
    }
}

/// The protocols Istio's `protocol.Parse` knows, as a port's `protocol` spells them.
const ISTIO_PROTOCOLS: [&str; 12] = [
    "HTTP",
    "HTTP2",
    "HTTPS",
    "GRPC",
    "GRPC-WEB",
    "TCP",
    "TLS",
    "UDP",
    "MONGO",
    "MYSQL",
    "REDIS",
    "HTTP_PROXY",
];

/// A match's `destinationSubnets`: each must parse. Sidecars match on them; a match bound
/// only to gateways (`gateways` without `mesh`) warns, as gateways ignore them (istiod's
/// `l4SingleMatch` does not read them).
fn subnets(r: &mut Report, field: &str, subnets: &[String], gateways: &[String]) {
    let sidecars = gateways.is_empty() || gateways.iter().any(|g| g == "mesh");
    for (j, subnet) in subnets.iter().enumerate() {
        let f = format!("{field}.destinationSubnets[{j}]");
        if !valid_cidr(subnet) {
            r.error(f, format!("{subnet:?} is not an IP address or CIDR"));
        } else if !sidecars {
            r.warn(
                f,
                "ignored: a gateway does not match on destinationSubnets, as with istiod",
            );
        }
    }
}

/// An IP address, or `ADDRESS/LENGTH` with a length the address's family allows (as
/// istiod's `ValidateIPSubnet`: `10.0.0.1/`, a slash without a length, is neither).
fn valid_cidr(text: &str) -> bool {
    let (ip, len) = match text.split_once('/') {
        Some((ip, len)) => (ip, Some(len)),
        None => (text, None),
    };
    let Ok(ip) = ip.parse::<std::net::IpAddr>() else {
        return false;
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    len.is_none_or(|l| l.parse::<u8>().is_ok_and(|l| l <= max))
}

/// What an `exportTo` belongs to: a ServiceEntry may say `~` (seen by no one else), and a
/// DestinationRule with a `workloadSelector` is never seen beyond its namespace.
#[derive(Clone, Copy, PartialEq)]
enum ExportOf {
    ServiceEntry,
    SelectingRule,
    Other,
}

/// `spec.exportTo`, as istiod's `validateExportTo`: `.`, `*` or namespace names, no
/// duplicates (`.` is the object's own namespace), and `*` alone.
fn export_to(r: &mut Report, namespace: &str, values: &[String], of: ExportOf) {
    let mut seen = std::collections::BTreeSet::new();
    for (i, e) in values.iter().enumerate() {
        let field = format!("spec.exportTo[{i}]");
        let key = if e == "." { namespace } else { e.as_str() };
        let valid = matches!(key, "*") || (key == "~" && of == ExportOf::ServiceEntry) || {
            let b = key.as_bytes();
            (1..=63).contains(&b.len())
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        };
        if !seen.insert(key) {
            r.error(
                field,
                format!("duplicate entry {e:?} (. is namespace {namespace:?})"),
            );
        } else if !valid {
            r.error(field, format!("{e:?} is not ., * or a namespace name"));
        }
    }
    if of == ExportOf::SelectingRule && seen.iter().any(|k| *k != namespace) {
        r.error(
            "spec.exportTo",
            "a DestinationRule with a workloadSelector cannot be exported beyond its namespace",
        );
    }
    if values.len() > 1 && seen.iter().any(|k| *k == "*" || *k == "~") {
        r.error(
            "spec.exportTo",
            "* and ~ cannot be combined with other entries",
        );
    }
}

/// The annotation that makes istiod's (and meshd's) validation refuse an object: its
/// webhook controller's probe carries it.
pub const ALWAYS_REJECT: &str = "istio.io/alwaysReject";

/// istiod's `checkDryRunAnnotation`: only an ALLOW or DENY AuthorizationPolicy may be a
/// dry run, and the value must be a boolean.
fn dry_run_annotation(r: &mut Report, object: &ConfigObject) {
    use api::security::{AuthorizationAction, DRY_RUN_ANNOTATION, dry_run_value};
    let Some(value) = dry_run_value(&object.meta.annotations) else {
        return;
    };
    let field = format!("metadata.annotations[{DRY_RUN_ANNOTATION}]");
    match &object.spec {
        Spec::AuthorizationPolicy(ap) => match ap.action.unwrap_or(AuthorizationAction::Allow) {
            AuthorizationAction::Allow | AuthorizationAction::Deny => {
                if let Err(v) = value {
                    r.error(field, format!("{v:?} is not a boolean"));
                }
            }
            AuthorizationAction::Audit | AuthorizationAction::Custom => r.error(
                field,
                "only ALLOW and DENY policies can be a dry run (not AUDIT or CUSTOM)",
            ),
        },
        _ if object.key.kind.is_istio() => r.error(
            field,
            "only an AuthorizationPolicy supports it; remove the annotation",
        ),
        _ => {}
    }
}

/// Every problem found in `object`.
pub fn validate(object: &ConfigObject) -> Vec<Problem> {
    let mut r = Report::default();
    dry_run_annotation(&mut r, object);
    if object.key.kind.is_istio() && object.meta.annotations.contains_key(ALWAYS_REJECT) {
        r.error(
            format!("metadata.annotations[{ALWAYS_REJECT}]"),
            "the object asks to be refused",
        );
    }
    match &object.spec {
        Spec::VirtualService(vs) if vs.hosts.is_empty() => {
            // A delegate: its routes serve only the root routes that name it.
            for (field, set) in [
                ("spec.gateways", !vs.gateways.is_empty()),
                ("spec.tcp", !vs.tcp.is_empty()),
                ("spec.tls", !vs.tls.is_empty()),
            ] {
                if set {
                    r.error(
                        field,
                        "must be empty in a delegate VirtualService (one without hosts)",
                    );
                }
            }
            export_to(
                &mut r,
                &object.key.namespace,
                &vs.export_to,
                ExportOf::Other,
            );
            for (i, route) in vs.http.iter().enumerate() {
                let field = format!("spec.http[{i}]");
                if route.delegate.is_some() {
                    r.error(
                        format!("{field}.delegate"),
                        "a delegate VirtualService cannot delegate again",
                    );
                }
                http_route(&mut r, &field, route);
            }
        }
        Spec::VirtualService(vs) => {
            hosts(&mut r, "spec.hosts", &vs.hosts);
            export_to(
                &mut r,
                &object.key.namespace,
                &vs.export_to,
                ExportOf::Other,
            );
            for (i, route) in vs.http.iter().enumerate() {
                http_route(&mut r, &format!("spec.http[{i}]"), route);
            }
            for (i, route) in vs.tcp.iter().enumerate() {
                tcp_route(&mut r, &format!("spec.tcp[{i}]"), route, &vs.gateways);
            }
            for (i, route) in vs.tls.iter().enumerate() {
                tls_route(&mut r, &format!("spec.tls[{i}]"), route, vs);
            }
        }
        Spec::DestinationRule(dr) => {
            if dr.host.is_empty() {
                r.error("spec.host", "is required");
            }
            let of = match dr.workload_selector {
                Some(_) => ExportOf::SelectingRule,
                None => ExportOf::Other,
            };
            export_to(&mut r, &object.key.namespace, &dr.export_to, of);
            if let Some(p) = &dr.traffic_policy {
                traffic_policy(&mut r, "spec.trafficPolicy", p);
            }
            let mut seen = std::collections::BTreeSet::new();
            for (i, s) in dr.subsets.iter().enumerate() {
                if let Some(p) = &s.traffic_policy {
                    traffic_policy(&mut r, &format!("spec.subsets[{i}].trafficPolicy"), p);
                }
                if s.name.is_empty() {
                    r.error(format!("spec.subsets[{i}].name"), "is required");
                } else if !seen.insert(&s.name) {
                    r.error(
                        format!("spec.subsets[{i}].name"),
                        format!("duplicate subset {:?}", s.name),
                    );
                }
            }
        }
        Spec::Gateway(gw) => {
            if gw.servers.is_empty() {
                r.error("spec.servers", "at least one server is required");
            }
            for (i, s) in gw.servers.iter().enumerate() {
                let f = format!("spec.servers[{i}]");
                if !(1..=65535).contains(&s.port.number) {
                    r.error(
                        format!("{f}.port.number"),
                        format!("port {} out of range", s.port.number),
                    );
                }
                if s.port.protocol.is_empty() {
                    r.error(format!("{f}.port.protocol"), "is required");
                }
                hosts(&mut r, &format!("{f}.hosts"), &s.hosts);
                server_tls(&mut r, &f, s);
            }
        }
        Spec::ServiceEntry(se, _) => {
            hosts(&mut r, "spec.hosts", &se.hosts);
            for (i, a) in se.addresses.iter().enumerate() {
                if !valid_cidr(a) {
                    let message = format!("{a:?} is neither an IP address nor a CIDR range");
                    r.error(format!("spec.addresses[{i}]"), message);
                }
            }
            export_to(
                &mut r,
                &object.key.namespace,
                &se.export_to,
                ExportOf::ServiceEntry,
            );
            for (i, p) in se.ports.iter().enumerate() {
                if !(1..=65535).contains(&p.number) {
                    r.error(
                        format!("spec.ports[{i}].number"),
                        format!("port {} out of range", p.number),
                    );
                }
            }
        }
        Spec::Sidecar(sc) => {
            if let Some(pool) = &sc.inbound_connection_pool {
                connection_pool(&mut r, "spec.inboundConnectionPool", pool);
            }
            if let Some(policy) = &sc.outbound_traffic_policy {
                egress_proxy(&mut r, policy);
            }
            for (i, ing) in sc.ingress.iter().enumerate() {
                r.not_applied(&format!("spec.ingress[{i}]"), [("tls", ing.tls.is_some())]);
                if let Some(pool) = &ing.connection_pool {
                    connection_pool(&mut r, &format!("spec.ingress[{i}].connectionPool"), pool);
                }
                let field = format!("spec.ingress[{i}].defaultEndpoint");
                match ing.default_endpoint.as_deref() {
                    None => r.error(field, "is required: where the application listens"),
                    Some(e) if e.starts_with("unix://") => {}
                    Some(e) => {
                        let ok = e
                            .rsplit_once(':')
                            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
                        if !ok {
                            r.error(field, format!("{e:?} is not HOST:PORT or unix://PATH"));
                        }
                    }
                }
            }
            sidecar_egress(&mut r, &sc.egress);
        }
        Spec::WorkloadEntry(we) => {
            if we.address.is_empty() {
                r.warn(
                    "spec.address",
                    "no address: this entry contributes no endpoint",
                );
            }
        }
        Spec::AuthorizationPolicy(ap) => authorization_policy(&mut r, ap),
        Spec::Service(svc) => {
            for (i, p) in svc.ports.iter().enumerate() {
                if !(1..=65535).contains(&p.port) {
                    r.error(
                        format!("spec.ports[{i}].port"),
                        format!("port {} out of range", p.port),
                    );
                }
            }
        }
        Spec::RequestAuthentication(ra) => request_authentication(&mut r, ra),
        Spec::Telemetry(t) => telemetry(&mut r, t),
        Spec::PeerAuthentication(_)
        | Spec::EndpointSlice(_)
        | Spec::Pod(_)
        | Spec::Endpoints(_)
        | Spec::Secret(_)
        | Spec::Namespace
        | Spec::Node => {}
        Spec::MeshConfig(mesh) => {
            extension_providers(&mut r, &mesh.extension_providers);
            r.duration("data.mesh.connectTimeout".into(), &mesh.connect_timeout);
            if let Some(p) = &mesh.h2_upgrade_policy
                && !matches!(p.as_str(), "DO_NOT_UPGRADE" | "UPGRADE")
            {
                let message = format!("{p:?} is not DO_NOT_UPGRADE or UPGRADE");
                r.error("data.mesh.h2UpgradePolicy", message);
            }
            if let Some(k) = &mesh.tcp_keepalive {
                r.duration("data.mesh.tcpKeepalive.time".into(), &k.time);
                r.duration("data.mesh.tcpKeepalive.interval".into(), &k.interval);
            }
            if let (_, Some((field, message))) = mesh.access_log_format() {
                r.warn(format!("data.mesh.{field}"), message);
            }
            r.duration(
                "data.mesh.protocolDetectionTimeout".into(),
                &mesh.protocol_detection_timeout,
            );
            let inbound = (mesh.inbound_traffic_policy.as_ref()).and_then(|p| p.mode.as_deref());
            if let Some(m) = inbound
                && !matches!(m.to_ascii_uppercase().as_str(), "PASSTHROUGH" | "LOCALHOST")
            {
                let message = format!("{m:?} is not PASSTHROUGH or LOCALHOST");
                r.error("data.mesh.inboundTrafficPolicy.mode", message);
            }
            let normalization =
                (mesh.path_normalization.as_ref()).and_then(|p| p.normalization.as_deref());
            if let Some(n) = normalization
                && !matches!(
                    n,
                    "NONE" | "BASE" | "DEFAULT" | "MERGE_SLASHES" | "DECODE_AND_MERGE_SLASHES"
                )
            {
                let message = format!(
                    "{n:?} is not NONE, BASE, DEFAULT, MERGE_SLASHES or DECODE_AND_MERGE_SLASHES"
                );
                r.error("data.mesh.pathNormalization.normalization", message);
            }
            if let Some(p) = &mesh.default_http_retry_policy {
                retries(&mut r, "data.mesh.defaultHttpRetryPolicy", p);
            }
            if let Some(p) = &mesh.default_inbound_http_retry_policy {
                retries(&mut r, "data.mesh.defaultInboundHttpRetryPolicy", p);
            }
            if let Some(t) = &mesh.default_config.tracing {
                proxy_tracing(&mut r, t);
            }
        }
    }
    r.0
}

/// A retry policy (a route's `retries`, MeshConfig's default ones): attempts and
/// durations Envoy can take.
fn retries(r: &mut Report, field: &str, policy: &api::networking::HttpRetry) {
    if policy.attempts < 0 {
        r.error(format!("{field}.attempts"), "must not be negative");
    }
    r.duration(format!("{field}.perTryTimeout"), &policy.per_try_timeout);
    r.duration(format!("{field}.backoff"), &policy.backoff);
}

/// `defaultConfig.tracing`: a sampling percentage istiod would replace, and custom tags
/// that say nothing, are warned about.
fn proxy_tracing(r: &mut Report, t: &crate::mesh::ProxyTracing) {
    let f = "data.mesh.defaultConfig.tracing";
    if !(0.0..=100.0).contains(&t.sampling) {
        let message = format!("{} is not a percentage; 1 is used", t.sampling);
        r.warn(format!("{f}.sampling"), message);
    }
    for (name, tag) in &t.custom_tags {
        let kinds = [
            tag.literal.is_some(),
            tag.environment.is_some(),
            tag.header.is_some(),
        ];
        if kinds.iter().filter(|k| **k).count() != 1 {
            let message = "must be exactly one of literal, environment or header; it is left out";
            r.warn(format!("{f}.customTags[{name}]"), message);
        }
    }
}

/// MeshConfig's external authorizers. istiod keeps the mesh config and refuses only what
/// uses a broken provider, so these are warnings: a CUSTOM policy naming a provider with
/// a problem denies the requests it matches (see `translate::ext_authz`).
fn extension_providers(r: &mut Report, providers: &[crate::mesh::ExtensionProvider]) {
    for (i, e) in providers.iter().enumerate() {
        let f = format!("data.mesh.extensionProviders[{i}]");
        if let Err(problem) = crate::ext_authz::check(e, providers) {
            r.warn(f, problem);
        }
    }
}

#[cfg(test)]
mod tests;
