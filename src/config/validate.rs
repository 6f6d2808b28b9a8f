//! Checks on one object that the schema cannot express: regexes that compile, exactly one
//! StringMatch form, durations, weights, required fields. Cross-object checks (a route to a
//! host that does not exist) happen when the push context is built.

use regex::RegexBuilder;

use super::{ConfigObject, Level, Spec};
use crate::api::networking::{
    ClientTlsMode, ClientTlsSettings, ConnectionPoolSettings, ConsistentHashLb, HttpRoute,
    LoadBalancerSettings, OutlierDetection, StringMatch, TrafficPolicy,
};

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
            && let Err(e) = crate::duration::parse(v)
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
    if let Some(retries) = &route.retries {
        if retries.attempts < 0 {
            r.error(format!("{field}.retries.attempts"), "must not be negative");
        }
        r.duration(
            format!("{field}.retries.perTryTimeout"),
            &retries.per_try_timeout,
        );
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
fn server_tls(r: &mut Report, field: &str, server: &crate::api::networking::Server) {
    let Some(tls) = &server.tls else {
        return;
    };
    let set = |key: &str| crate::translate::credentials::server_tls_field(tls, key).is_some();
    let credential = set("credentialName");
    let f = format!("{field}.tls");
    match crate::translate::credentials::server_tls_mode(tls).as_str() {
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
fn percent(r: &mut Report, field: String, p: Option<&crate::api::networking::Percent>) {
    if let Some(p) = p
        && !(0.0..=100.0).contains(&p.value)
    {
        r.error(field, format!("{} is not within 0-100", p.value));
    }
}

/// Mirrors, as Istio validates them: `mirror` or `mirrors`, not both; each destination
/// with a host; percentages within 0–100.
fn mirrors(r: &mut Report, field: &str, route: &crate::api::networking::HttpRoute) {
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
fn fault_injection(
    r: &mut Report,
    field: &str,
    fault: &crate::api::networking::HttpFaultInjection,
) {
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
            (None, Some(g), _) if crate::translate::filters::grpc_code(g).is_none() => r.error(
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

/// A DestinationRule's (or subset's) traffic policy: its components, and each port-level
/// entry's, which must name a port and set at least one component.
fn traffic_policy(r: &mut Report, field: &str, p: &TrafficPolicy) {
    policy_components(
        r,
        field,
        p.connection_pool.as_ref(),
        p.outlier_detection.as_ref(),
        p.load_balancer.as_ref(),
    );
    tls_origination(r, field, p.tls.as_ref());
    if let Some(t) = &p.tunnel {
        tunnel(r, &format!("{field}.tunnel"), t);
        if p.proxy_protocol.is_some() {
            r.error(field, "tunnel and proxyProtocol must not be set together");
        }
    }
    if let Some(pp) = &p.proxy_protocol
        && let Some(v) = pp.version.as_deref().filter(|v| !matches!(*v, "V1" | "V2"))
    {
        r.error(
            format!("{field}.proxyProtocol.version"),
            format!("{v:?} is not V1 or V2"),
        );
    }
    for (i, entry) in p.port_level_settings.iter().enumerate() {
        let f = format!("{field}.portLevelSettings[{i}]");
        match &entry.port {
            Some(port) if (1..=65535).contains(&port.number) => {}
            Some(port) => r.error(
                format!("{f}.port.number"),
                format!("{} is not a port", port.number),
            ),
            None => r.error(format!("{f}.port"), "is required"),
        }
        if entry.connection_pool.is_none()
            && entry.outlier_detection.is_none()
            && entry.load_balancer.is_none()
            && entry.tls.is_none()
        {
            r.error(
                f,
                "sets none of connectionPool, loadBalancer, outlierDetection and tls",
            );
            continue;
        }
        policy_components(
            r,
            &f,
            entry.connection_pool.as_ref(),
            entry.outlier_detection.as_ref(),
            entry.load_balancer.as_ref(),
        );
        tls_origination(r, &f, entry.tls.as_ref());
    }
}

/// A field meshd accepts and keeps but does not yet translate: the object applies, the
/// warning says what of it does not.
const NOT_APPLIED: &str = "accepted but not yet applied by meshd";

/// Client TLS as Istio validates it: `MUTUAL` needs a certificate and key (or a
/// credential), `ISTIO_MUTUAL` takes neither, nor CA files.
fn tls_origination(r: &mut Report, field: &str, tls: Option<&ClientTlsSettings>) {
    let Some(tls) = tls else {
        return;
    };
    let f = format!("{field}.tls");
    let set = |v: &Option<String>| v.as_deref().is_some_and(|v| !v.is_empty());
    let credential = set(&tls.credential_name);
    let files = set(&tls.client_certificate) || set(&tls.private_key) || set(&tls.ca_certificates);
    match tls.mode {
        Some(ClientTlsMode::Mutual) if !credential => {
            for (name, value) in [
                ("clientCertificate", &tls.client_certificate),
                ("privateKey", &tls.private_key),
            ] {
                if !set(value) {
                    r.error(format!("{f}.{name}"), "is required with mode MUTUAL");
                }
            }
        }
        Some(ClientTlsMode::IstioMutual) if files || credential => r.error(
            f.clone(),
            "ISTIO_MUTUAL uses the mesh's certificates: set no certificate, key, CA or credentialName",
        ),
        _ => {}
    }
    if credential && files {
        r.error(
            f.clone(),
            "credentialName and certificate files cannot both be set",
        );
    }
}

/// A connection pool (`field` names it): durations that parse, limits that are not
/// negative, an h2 upgrade policy Istio knows.
fn connection_pool(r: &mut Report, field: &str, pool: &ConnectionPoolSettings) {
    if let Some(tcp) = &pool.tcp {
        let f = format!("{field}.tcp");
        r.duration(format!("{f}.connectTimeout"), &tcp.connect_timeout);
        r.duration(format!("{f}.idleTimeout"), &tcp.idle_timeout);
        r.duration(
            format!("{f}.maxConnectionDuration"),
            &tcp.max_connection_duration,
        );
        if let Some(k) = &tcp.tcp_keepalive {
            r.duration(format!("{f}.tcpKeepalive.time"), &k.time);
            r.duration(format!("{f}.tcpKeepalive.interval"), &k.interval);
        }
    }
    if let Some(http) = &pool.http {
        let f = format!("{field}.http");
        r.duration(format!("{f}.idleTimeout"), &http.idle_timeout);
        for (name, value) in [
            ("http1MaxPendingRequests", http.http1_max_pending_requests),
            ("http2MaxRequests", http.http2_max_requests),
            ("maxRequestsPerConnection", http.max_requests_per_connection),
            ("maxRetries", http.max_retries),
            ("maxConcurrentStreams", http.max_concurrent_streams),
        ] {
            if let Some(v) = value.filter(|v| *v < 0) {
                r.error(format!("{f}.{name}"), format!("{v} is negative"));
            }
        }
        match http.h2_upgrade_policy.as_deref() {
            None | Some("DEFAULT" | "DO_NOT_UPGRADE") => {}
            Some("UPGRADE") if http.use_client_protocol == Some(true) => r.error(
                format!("{f}.useClientProtocol"),
                "cannot be true when h2UpgradePolicy is UPGRADE",
            ),
            Some("UPGRADE") => {}
            Some(other) => r.error(
                format!("{f}.h2UpgradePolicy"),
                format!("{other:?} is not DEFAULT, DO_NOT_UPGRADE or UPGRADE"),
            ),
        }
    }
}

/// A connection pool, outlier detection and load balancer: durations that parse,
/// percentages within 0–100, a consistent hash Envoy accepts.
fn policy_components(
    r: &mut Report,
    field: &str,
    pool: Option<&ConnectionPoolSettings>,
    outlier: Option<&OutlierDetection>,
    lb: Option<&LoadBalancerSettings>,
) {
    if let Some(pool) = pool {
        connection_pool(r, &format!("{field}.connectionPool"), pool);
    }
    if let Some(o) = outlier {
        let f = format!("{field}.outlierDetection");
        r.duration(format!("{f}.interval"), &o.interval);
        r.duration(format!("{f}.baseEjectionTime"), &o.base_ejection_time);
        for (name, value) in [
            ("maxEjectionPercent", o.max_ejection_percent),
            ("minHealthPercent", o.min_health_percent),
        ] {
            if let Some(v) = value.filter(|v| !(0..=100).contains(v)) {
                r.error(
                    format!("{f}.{name}"),
                    format!("{v} is not a percentage (0-100)"),
                );
            }
        }
    }
    if let Some(lb) = lb {
        if let Some(hash) = &lb.consistent_hash {
            consistent_hash(r, &format!("{field}.loadBalancer.consistentHash"), hash);
        }
        if let Some(l) = &lb.locality_lb_setting {
            locality_lb(
                r,
                &format!("{field}.loadBalancer.localityLbSetting"),
                l,
                outlier.is_some(),
            );
        }
        let f = format!("{field}.loadBalancer");
        r.duration(format!("{f}.warmupDurationSecs"), &lb.warmup_duration_secs);
        if let Some(w) = &lb.warmup {
            let f = format!("{f}.warmup");
            match &w.duration {
                None => r.error(format!("{f}.duration"), "is required"),
                Some(_) => r.duration(format!("{f}.duration"), &w.duration),
            }
            if let Some(m) = w.minimum_percent.filter(|m| !(0.0..=100.0).contains(m)) {
                r.error(
                    format!("{f}.minimumPercent"),
                    format!("{m} is not within 0-100"),
                );
            }
            if let Some(a) = w.aggression.filter(|a| *a < 1.0) {
                r.error(format!("{f}.aggression"), format!("{a} is below 1"));
            }
        }
    }
}

/// A locality setting as Istio's `ValidateLocalityLbSetting` checks it: `distribute` or
/// `failover`, not both; each `distribute` entry's weights within 1–100 and summing to 100;
/// a wildcard only last; failover between two different regions, named without zones or
/// wildcards; no topology label in `failoverPriority` next to `failover`. Failover without
/// outlier detection is accepted with a warning: Envoy would never fail over.
fn locality_lb(
    r: &mut Report,
    field: &str,
    l: &crate::api::networking::LocalityLoadBalancerSetting,
    outlier: bool,
) {
    if !l.distribute.is_empty() && !l.failover.is_empty() {
        r.error(
            field,
            "can not simultaneously specify 'distribute' and 'failover'",
        );
        return;
    }
    if !l.failover.is_empty() {
        for (i, label) in l.failover_priority.iter().enumerate() {
            if crate::translate::locality::TOPOLOGY_LABELS.contains(&label.as_str()) {
                r.error(
                    format!("{field}.failoverPriority[{i}]"),
                    format!("can not simultaneously set 'failover' and topology label '{label}' in 'failover_priority'"),
                );
            }
        }
    }
    let wildcard = |r: &mut Report, f: String, locality: &str| {
        let stars = locality.matches('*').count();
        if stars > 1 || (stars == 1 && !locality.ends_with('*')) {
            r.error(
                f,
                format!("locality {locality} wildcard '*' number can not exceed 1 and must be in the end"),
            );
        }
    };
    for (i, d) in l.distribute.iter().enumerate() {
        let f = format!("{field}.distribute[{i}]");
        wildcard(r, format!("{f}.from"), &d.from);
        for (to, weight) in &d.to {
            wildcard(r, format!("{f}.to"), to);
            if !(1..=100).contains(weight) {
                r.error(
                    format!("{f}.to[{to}]"),
                    format!("locality weight {weight} must be in range [1, 100]"),
                );
            }
        }
        let total: u64 = d.to.values().map(|w| u64::from(*w)).sum();
        if total != 100 {
            r.error(
                format!("{f}.to"),
                format!("total locality weight {total} != 100"),
            );
        }
    }
    for (i, fo) in l.failover.iter().enumerate() {
        let f = format!("{field}.failover[{i}]");
        if fo.from == fo.to {
            r.error(
                &f,
                "locality lb failover settings must specify different regions",
            );
        }
        if fo.from.contains('/') || fo.to.contains('/') {
            r.error(&f, "locality lb failover only specify region");
        }
        if fo.from.contains('*') || fo.to.contains('*') {
            r.error(
                &f,
                "locality lb failover region should not contain '*' wildcard",
            );
        }
    }
    if (!l.failover.is_empty() || !l.failover_priority.is_empty()) && !outlier {
        r.warn(
            field,
            "outlier detection policy must be provided for failover",
        );
    }
}

/// One hash key at most (Istio's is a oneof), a named cookie, one ring, and a Maglev
/// table of a prime size below 5,000,011 (what Envoy accepts).
fn consistent_hash(r: &mut Report, field: &str, h: &ConsistentHashLb) {
    let keys = [
        h.http_header_name.is_some(),
        h.http_cookie.is_some(),
        h.use_source_ip.is_some(),
        h.http_query_parameter_name.is_some(),
    ];
    if keys.iter().filter(|k| **k).count() > 1 {
        r.error(
            field.to_string(),
            "set only one of httpHeaderName, httpCookie, useSourceIp and httpQueryParameterName",
        );
    }
    if let Some(cookie) = &h.http_cookie {
        if cookie.name.is_empty() {
            r.error(format!("{field}.httpCookie.name"), "is required");
        }
        r.duration(format!("{field}.httpCookie.ttl"), &cookie.ttl);
        let mut seen = std::collections::BTreeSet::new();
        for (i, a) in cookie.attributes.iter().enumerate() {
            if a.name.is_empty() || !seen.insert(&a.name) {
                r.error(
                    format!("{field}.httpCookie.attributes[{i}].name"),
                    "must be set and unique",
                );
            }
        }
    }
    if h.ring_hash.is_some() && h.maglev.is_some() {
        r.error(field.to_string(), "set only one of ringHash and maglev");
    }
    if h.minimum_ring_size.is_some_and(|n| n > 0) && (h.ring_hash.is_some() || h.maglev.is_some()) {
        r.error(
            format!("{field}.minimumRingSize"),
            "cannot be set with ringHash or maglev",
        );
    }
    if let Some(maglev) = &h.maglev {
        let size = maglev.table_size.unwrap_or(0);
        if size == 0 || size >= 5_000_011 || !is_prime(size) {
            r.error(
                format!("{field}.maglev.tableSize"),
                format!("{size} is not a prime below 5000011"),
            );
        }
    }
}

/// Envoy's test (`Primes::isPrime`), which counts 1 as prime.
fn is_prime(n: u64) -> bool {
    n != 0
        && (n < 4
            || (2..)
                .take_while(|d| d * d <= n)
                .all(|d| !n.is_multiple_of(d)))
}

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

/// AuthorizationPolicy: what meshd cannot enforce is refused, never applied in part.
fn authorization_policy(r: &mut Report, ap: &crate::api::security::AuthorizationPolicySpec) {
    use crate::api::security::AuthorizationAction;
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
    if ap.target_ref.is_some() || !ap.target_refs.is_empty() {
        r.error(
            "spec.targetRefs",
            "targetRef(s) (waypoints and gateways) are not supported by meshd; use selector",
        );
    }
    for (i, rule) in ap.rules.iter().enumerate() {
        for (j, from) in rule.from.iter().enumerate() {
            let s = &from.source;
            if !s.request_principals.is_empty() || !s.not_request_principals.is_empty() {
                r.error(
                    format!("spec.rules[{i}].from[{j}].source.requestPrincipals"),
                    "request principals need RequestAuthentication, which meshd does not support",
                );
            }
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
            if !crate::translate::authz::condition_key_supported(&c.key) {
                r.error(
                    format!("spec.rules[{i}].when[{j}].key"),
                    format!("{:?} is not a condition key meshd supports", c.key),
                );
            }
        }
    }
}

/// A TCP route: destinations with a host and weights within 0–100 (summing to 100 when
/// there are several), subnets that parse; `destinationSubnets` warns, as meshd does not
/// match on it.
fn tcp_route(r: &mut Report, field: &str, route: &crate::api::networking::TcpRoute) {
    route_destinations(r, field, &route.route);
    for (i, m) in route.r#match.iter().enumerate() {
        subnets(r, &format!("{field}.match[{i}]"), &m.destination_subnets);
    }
}

/// A TLS route, as Istio's `validateTLSRoute`: at least one match, each naming SNI hosts
/// that are valid and fall within one of the VirtualService's `hosts`; destinations as a
/// TCP route's.
fn tls_route(
    r: &mut Report,
    field: &str,
    route: &crate::api::networking::TlsRoute,
    vs_hosts: &[String],
) {
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
            } else if !vs_hosts.iter().any(|h| crate::model::host_covers(h, sni)) {
                r.error(
                    sf,
                    format!(
                        "SNI host {sni:?} is not a compatible subset of any of the virtual service hosts: [{}]",
                        vs_hosts.join(", ")
                    ),
                );
            }
        }
        subnets(r, &f, &m.destination_subnets);
    }
}

/// The destinations of a TCP or TLS route: a host each, weights within 0–100, summing to
/// 100 when there are several.
fn route_destinations(
    r: &mut Report,
    field: &str,
    route: &[crate::api::networking::RouteDestination],
) {
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
fn egress_proxy(r: &mut Report, policy: &crate::api::networking::OutboundTrafficPolicy) {
    use crate::api::networking::OutboundMode;
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

/// istiod's `validateTunnelSettings`.
fn tunnel(r: &mut Report, field: &str, t: &crate::api::networking::TunnelSettings) {
    if let Some(p) = t
        .protocol
        .as_deref()
        .filter(|p| !matches!(*p, "" | "CONNECT" | "POST"))
    {
        r.error(
            format!("{field}.protocol"),
            format!("{p:?}: tunnel protocol must be \"CONNECT\" or \"POST\""),
        );
    }
    if !dns_name(&t.target_host) && t.target_host.parse::<std::net::IpAddr>().is_err() {
        r.error(
            format!("{field}.targetHost"),
            format!("{:?} must be a valid FQDN or IP address", t.target_host),
        );
    }
    if !(1..=65535).contains(&t.target_port) {
        r.error(
            format!("{field}.targetPort"),
            format!("{} is not a port (1-65535)", t.target_port),
        );
    }
}

/// A Sidecar's egress listeners, as istiod's `ValidateSidecar` checks them: hosts as
/// `namespace/host`, at least one; one catch-all (no `port`), and last; ports in range,
/// of a known protocol, unique among IP-bound listeners; `bind` an IP address;
/// `captureMode` one of Istio's. A Unix domain socket `bind` and the `HTTP_PROXY`
/// protocol are accepted with a warning: meshd builds no listener for them.
fn sidecar_egress(r: &mut Report, egress: &[crate::api::networking::IstioEgressListener]) {
    use crate::model::egress::UNIX_PREFIX;
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

/// A match's `destinationSubnets`: each must parse; meshd does not match on them yet.
fn subnets(r: &mut Report, field: &str, subnets: &[String]) {
    for (j, subnet) in subnets.iter().enumerate() {
        let f = format!("{field}.destinationSubnets[{j}]");
        if !valid_cidr(subnet) {
            r.error(f, format!("{subnet:?} is not an IP address or CIDR"));
        } else {
            r.warn(f, NOT_APPLIED);
        }
    }
}

fn valid_cidr(text: &str) -> bool {
    let (ip, len) = text.split_once('/').unwrap_or((text, ""));
    let Ok(ip) = ip.parse::<std::net::IpAddr>() else {
        return false;
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    len.is_empty() || len.parse::<u8>().is_ok_and(|l| l <= max)
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
    use crate::api::security::{AuthorizationAction, DRY_RUN_ANNOTATION, dry_run_value};
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
                tcp_route(&mut r, &format!("spec.tcp[{i}]"), route);
            }
            for (i, route) in vs.tls.iter().enumerate() {
                tls_route(&mut r, &format!("spec.tls[{i}]"), route, &vs.hosts);
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
        Spec::ServiceEntry(se) => {
            hosts(&mut r, "spec.hosts", &se.hosts);
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
        Spec::PeerAuthentication(_)
        | Spec::EndpointSlice(_)
        | Spec::Pod(_)
        | Spec::Endpoints(_)
        | Spec::Secret(_)
        | Spec::Namespace
        | Spec::Node => {}
        Spec::MeshConfig(mesh) => extension_providers(&mut r, &mesh.extension_providers),
    }
    r.0
}

/// MeshConfig's external authorizers. istiod keeps the mesh config and refuses only what
/// uses a broken provider, so these are warnings: a CUSTOM policy naming a provider with
/// a problem denies the requests it matches (see `translate::ext_authz`).
fn extension_providers(r: &mut Report, providers: &[crate::model::mesh::ExtensionProvider]) {
    for (i, e) in providers.iter().enumerate() {
        let f = format!("data.mesh.extensionProviders[{i}]");
        if let Err(problem) = crate::translate::ext_authz::check(e, providers) {
            r.warn(f, problem);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse::parse_file;

    #[test]
    fn delegate_virtual_services_hold_http_routes_only_and_roots_only_delegate() {
        let errors = |spec: &str| {
            let yaml = format!(
                "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: r, namespace: shop}}\nspec:\n{spec}"
            );
            let parsed = parse_file("vs.yaml", &yaml);
            (parsed.errors())
                .map(|e| format!("{}: {}", e.field, e.message))
                .collect::<Vec<_>>()
        };
        let route = "route: [{destination: {host: reviews}}]";
        assert_eq!(
            errors(&format!("  http: [{{{route}}}]\n")),
            Vec::<String>::new()
        );
        assert_eq!(
            errors(&format!(
                "  gateways: [web]\n  tcp: [{{{route}}}]\n  http: [{{delegate: {{name: x}}}}]\n"
            )),
            [
                "spec.gateways: must be empty in a delegate VirtualService (one without hosts)",
                "spec.tcp: must be empty in a delegate VirtualService (one without hosts)",
                "spec.http[0].delegate: a delegate VirtualService cannot delegate again",
            ]
        );
        assert_eq!(
            errors("  hosts: [reviews]\n  http: [{delegate: {namespace: team}}]\n"),
            ["spec.http[0].delegate.name: is required"]
        );
        assert_eq!(
            errors(&format!(
                "  hosts: [reviews]\n  http: [{{delegate: {{name: x}}, {route}}}]\n"
            )),
            ["spec.http[0]: a route with a delegate must not specify route or redirect"]
        );
    }

    #[test]
    fn only_allow_and_deny_policies_may_be_a_dry_run() {
        let issues = |kind: &str, dry: &str, spec: &str| {
            let yaml = format!(
                "apiVersion: {kind}\nmetadata: {{name: p, namespace: shop, annotations: {{istio.io/dry-run: '{dry}'}}}}\nspec:\n{spec}"
            );
            (parse_file("x.yaml", &yaml).issues.iter())
                .map(|e| format!("{:?} {}: {}", e.level, e.field, e.message))
                .collect::<Vec<_>>()
        };
        let ap = "security.istio.io/v1\nkind: AuthorizationPolicy";
        assert!(issues(ap, "true", "  action: DENY\n  rules: [{}]\n").is_empty());
        assert!(issues(ap, "False", "  rules: [{}]\n").is_empty());
        assert_eq!(
            issues(ap, "yes", "  action: DENY\n  rules: [{}]\n"),
            ["Error metadata.annotations[istio.io/dry-run]: \"yes\" is not a boolean"]
        );
        assert_eq!(
            issues(ap, "true", "  action: AUDIT\n  rules: [{}]\n"),
            [
                "Error metadata.annotations[istio.io/dry-run]: only ALLOW and DENY policies can be a dry run (not AUDIT or CUSTOM)"
            ]
        );
        assert_eq!(
            issues(
                "networking.istio.io/v1\nkind: VirtualService",
                "true",
                "  hosts: [a]\n"
            ),
            [
                "Error metadata.annotations[istio.io/dry-run]: only an AuthorizationPolicy supports it; remove the annotation"
            ]
        );
        let yaml = "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: invalid-gateway, namespace: istio-system, annotations: {istio.io/alwaysReject: 'true'}}\nspec: {}\n";
        let refused: Vec<String> = (parse_file("x.yaml", yaml).issues.iter())
            .map(|e| e.field.clone())
            .collect();
        assert!(
            refused.contains(&"metadata.annotations[istio.io/alwaysReject]".to_string()),
            "{refused:?}"
        );
    }

    #[test]
    fn custom_policies_name_a_provider_and_the_mesh_config_warns_about_bad_ones() {
        let issues = |yaml: &str| {
            (parse_file("x.yaml", yaml).issues.iter())
                .map(|e| format!("{:?} {}: {}", e.level, e.field, e.message))
                .collect::<Vec<_>>()
        };
        let policy = |spec: &str| {
            issues(&format!(
                "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: p, namespace: shop}}\nspec:\n{spec}"
            ))
        };
        assert_eq!(
            policy("  action: CUSTOM\n  provider: {name: opa}\n  rules: [{}]\n"),
            Vec::<String>::new()
        );
        assert_eq!(
            policy("  action: CUSTOM\n  rules: [{}]\n"),
            ["Error spec.provider: must specify provider when using CUSTOM action"]
        );
        assert_eq!(
            policy("  action: DENY\n  provider: {name: opa}\n  rules: [{}]\n"),
            ["Error spec.provider: provider must only be specified when using CUSTOM action"]
        );
        let mesh = |providers: &str| {
            issues(&format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n    extensionProviders:\n{providers}"
            ))
        };
        let http = |name: &str, rest: &str| {
            format!(
                "    - name: {name}\n      envoyExtAuthzHttp: {{service: authz.shop.svc.cluster.local, port: 8000{rest}}}\n"
            )
        };
        assert_eq!(
            mesh(&format!(
                "{}{}    - name: zipkin\n      zipkin: {{service: zipkin.istio-system.svc.cluster.local, port: 9411}}\n",
                http("opa", ", statusOnError: '503', timeout: 2s"),
                "    - name: grpc\n      envoyExtAuthzGrpc: {service: authz.shop.svc.cluster.local, port: 9000}\n"
            )),
            Vec::<String>::new()
        );
        assert_eq!(
            mesh(&format!(
                "{}{}{}{}{}",
                http("Opa", ""),
                http("a", ", pathPrefix: check"),
                http("b", ", statusOnError: '999'"),
                http("c", ", includeRequestHeadersInCheck: ['*']"),
                "    - name: d\n      envoyExtAuthzGrpc: {service: authz.shop.svc.cluster.local, port: 0}\n"
            )),
            [
                "Warning data.mesh.extensionProviders[0]: invalid provider name \"Opa\": lowercase letters, digits and hyphens, at most 63, not starting or ending with a hyphen",
                "Warning data.mesh.extensionProviders[1]: pathPrefix must begin with `/`, found: \"check\"",
                "Warning data.mesh.extensionProviders[2]: unsupported statusOnError 999",
                "Warning data.mesh.extensionProviders[3]: a single wildcard (\"*\") is not supported, change it to either prefix or suffix match: includeRequestHeadersInCheck",
                "Warning data.mesh.extensionProviders[4]: port must be in the range [1, 65535], found: 0",
            ]
        );
    }

    #[test]
    fn export_to_names_namespaces_once_and_a_selecting_rule_stays_home() {
        let errors = |kind: &str, spec: &str| {
            let yaml = format!(
                "apiVersion: networking.istio.io/v1\nkind: {kind}\nmetadata: {{name: r, namespace: shop}}\nspec:\n{spec}"
            );
            let parsed = parse_file("x.yaml", &yaml);
            (parsed.errors())
                .map(|e| format!("{}: {}", e.field, e.message))
                .collect::<Vec<_>>()
        };
        let dr = |rest: &str| errors("DestinationRule", &format!("  host: reviews\n{rest}"));
        assert_eq!(dr("  exportTo: ['.', billing]\n"), Vec::<String>::new());
        assert_eq!(
            dr("  exportTo: ['.', shop, Billing, '*', '~']\n"),
            [
                "spec.exportTo[1]: duplicate entry \"shop\" (. is namespace \"shop\")",
                "spec.exportTo[2]: \"Billing\" is not ., * or a namespace name",
                "spec.exportTo[4]: \"~\" is not ., * or a namespace name",
                "spec.exportTo: * and ~ cannot be combined with other entries",
            ]
        );
        let selecting = "  workloadSelector: {matchLabels: {app: a}}\n";
        assert_eq!(
            dr(&format!("{selecting}  exportTo: [shop]\n")),
            Vec::<String>::new()
        );
        assert_eq!(
            dr(&format!("{selecting}  exportTo: ['*']\n")),
            [
                "spec.exportTo: a DestinationRule with a workloadSelector cannot be exported beyond its namespace"
            ]
        );
        let se = "  hosts: [api.example.com]\n  ports: [{number: 443, name: tls, protocol: TLS}]\n";
        assert_eq!(
            errors("ServiceEntry", &format!("{se}  exportTo: ['~']\n")),
            Vec::<String>::new()
        );
        assert_eq!(
            errors(
                "VirtualService",
                "  hosts: [reviews]\n  exportTo: [-shop]\n"
            ),
            ["spec.exportTo[0]: \"-shop\" is not ., * or a namespace name"]
        );
    }

    #[test]
    fn a_traffic_policy_needs_durations_that_parse_and_percentages() {
        let parsed = parse_file(
            "dr.yaml",
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: r, namespace: shop}\nspec:\n  host: reviews\n  trafficPolicy:\n    connectionPool: {tcp: {connectTimeout: soon}, http: {idleTimeout: 5x}}\n    outlierDetection: {interval: 10s, baseEjectionTime: -1s, maxEjectionPercent: 120}\n  subsets:\n  - name: v1\n    trafficPolicy: {outlierDetection: {minHealthPercent: -5}}\n",
        );
        assert!(parsed.objects.is_empty(), "the DestinationRule is rejected");
        let fields: Vec<&str> = parsed.errors().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.trafficPolicy.connectionPool.tcp.connectTimeout",
                "spec.trafficPolicy.connectionPool.http.idleTimeout",
                "spec.trafficPolicy.outlierDetection.baseEjectionTime",
                "spec.trafficPolicy.outlierDetection.maxEjectionPercent",
                "spec.subsets[0].trafficPolicy.outlierDetection.minHealthPercent",
            ]
        );
    }

    #[test]
    fn port_level_settings_and_consistent_hashes_are_checked_with_their_fields() {
        let parsed = parse_file(
            "dr.yaml",
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: r, namespace: shop}\nspec:\n  host: reviews\n  trafficPolicy:\n    loadBalancer: {consistentHash: {httpHeaderName: x-user, useSourceIp: true, maglev: {tableSize: 65536}}}\n    portLevelSettings:\n    - port: {number: 9080}\n      connectionPool: {tcp: {tcpKeepalive: {time: often}}}\n    - loadBalancer: {consistentHash: {httpCookie: {ttl: 1h}}}\n    - port: {number: 70000}\n  subsets:\n  - name: v1\n    trafficPolicy: {connectionPool: {http: {h2UpgradePolicy: UPGRADE, useClientProtocol: true, maxConcurrentStreams: -1}}}\n",
        );
        assert!(parsed.objects.is_empty(), "the DestinationRule is rejected");
        let fields: Vec<&str> = parsed.errors().map(|e| e.field.as_str()).collect();
        let p = "spec.trafficPolicy";
        assert_eq!(
            fields,
            [
                format!("{p}.loadBalancer.consistentHash"),
                format!("{p}.loadBalancer.consistentHash.maglev.tableSize"),
                format!("{p}.portLevelSettings[0].connectionPool.tcp.tcpKeepalive.time"),
                format!("{p}.portLevelSettings[1].port"),
                format!("{p}.portLevelSettings[1].loadBalancer.consistentHash.httpCookie.name"),
                format!("{p}.portLevelSettings[2].port.number"),
                format!("{p}.portLevelSettings[2]"),
                "spec.subsets[0].trafficPolicy.connectionPool.http.maxConcurrentStreams".into(),
                "spec.subsets[0].trafficPolicy.connectionPool.http.useClientProtocol".into(),
            ]
        );
        let good = parse_file(
            "dr.yaml",
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: r, namespace: shop}\nspec:\n  host: reviews\n  trafficPolicy:\n    loadBalancer: {consistentHash: {httpCookie: {name: user, ttl: 1h}, maglev: {tableSize: 65537}}}\n    portLevelSettings:\n    - port: {number: 9080}\n      connectionPool: {tcp: {tcpKeepalive: {time: 7200s, interval: 75s, probes: 9}}}\n",
        );
        assert!(good.errors().next().is_none(), "{:?}", good.issues);
        assert_eq!(good.objects.len(), 1);
    }

    #[test]
    fn tcp_routes_need_hosts_and_weights_summing_to_100() {
        let vs = |tcp: &str| {
            parse_file(
                "vs.yaml",
                &format!(
                    "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: db, namespace: shop}}\nspec:\n  hosts: [db]\n  tcp:\n{tcp}"
                ),
            )
        };
        let bad = vs(
            "  - route: [{destination: {host: db, subset: v1}, weight: 60}, {destination: {host: ''}, weight: 30}]\n  - route: []\n",
        );
        assert!(bad.objects.is_empty());
        let fields: Vec<&str> = bad.errors().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.tcp[0].route[1].destination.host",
                "spec.tcp[0].route",
                "spec.tcp[1].route"
            ]
        );
        let good = vs(
            "  - match: [{port: 27017, destinationSubnets: [10.1.0.0/16]}]\n    route: [{destination: {host: db}}]\n",
        );
        assert_eq!(good.objects.len(), 1, "{:?}", good.issues);
        let warned: Vec<&str> = good.issues.iter().map(|i| i.field.as_str()).collect();
        assert_eq!(warned, ["spec.tcp[0].match[0].destinationSubnets[0]"]);
    }

    #[test]
    fn faults_mirrors_and_cors_are_checked_as_istio_checks_them() {
        let vs = |http: &str| {
            parse_file(
                "vs.yaml",
                &format!(
                    "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: r, namespace: shop}}\nspec:\n  hosts: [ratings]\n  http:\n{http}"
                ),
            )
        };
        let bad = vs(concat!(
            "  - route: [{destination: {host: ratings}}]\n    fault: {}\n",
            "  - route: [{destination: {host: ratings}}]\n",
            "    fault: {delay: {percentage: {value: 101}}, abort: {httpStatus: 700}}\n",
            "  - route: [{destination: {host: ratings}}]\n",
            "    fault: {delay: {fixedDelay: soon, percent: 200}, abort: {grpcStatus: SLOW}}\n",
            "  - route: [{destination: {host: ratings}}]\n    fault: {abort: {percentage: {value: 5}}}\n",
            "  - route: [{destination: {host: ratings}}]\n    mirror: {host: a}\n    mirrors: [{destination: {host: ''}, percentage: {value: -1}}]\n",
            "  - route: [{destination: {host: ratings}}]\n    corsPolicy: {allowOrigins: [{regex: '(a'}], maxAge: long, unmatchedPreflights: DROP}\n",
        ));
        assert!(bad.objects.is_empty());
        let fields: Vec<&str> = bad.errors().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.http[0].fault",
                "spec.http[1].fault.delay.fixedDelay",
                "spec.http[1].fault.delay.percentage.value",
                "spec.http[1].fault.abort.httpStatus",
                "spec.http[2].fault.delay.fixedDelay",
                "spec.http[2].fault.delay.percent",
                "spec.http[2].fault.abort.grpcStatus",
                "spec.http[3].fault.abort",
                "spec.http[4].mirrors",
                "spec.http[4].mirrors[0].destination.host",
                "spec.http[4].mirrors[0].percentage.value",
                "spec.http[5].corsPolicy.allowOrigins[0].regex",
                "spec.http[5].corsPolicy.maxAge",
                "spec.http[5].corsPolicy.unmatchedPreflights",
            ]
        );
        let good = vs(concat!(
            "  - route: [{destination: {host: ratings}}]\n",
            "    fault: {delay: {fixedDelay: 7s, percentage: {value: 12.5}}, abort: {grpcStatus: UNAVAILABLE}}\n",
            "  - route: [{destination: {host: ratings}}]\n",
            "    fault: {delay: {exponentialDelay: 1s}, abort: {http2Error: CANCEL}}\n",
            "    mirror: {host: ratings-copy}\n    corsPolicy: {allowOrigins: [{exact: '*'}]}\n",
        ));
        assert_eq!(good.objects.len(), 1, "{:?}", good.issues);
        let warned: Vec<&str> = good.issues.iter().map(|i| i.field.as_str()).collect();
        assert_eq!(
            warned,
            [
                "spec.http[1].fault.delay.exponentialDelay",
                "spec.http[1].fault.abort.http2Error",
            ]
        );
    }

    #[test]
    fn a_regex_rewrite_needs_a_regex_envoy_compiles() {
        let vs = |rewrite: &str| {
            parse_file(
                "vs.yaml",
                &format!(
                    "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: r, namespace: shop}}\nspec:\n  hosts: [ratings]\n  http:\n  - route: [{{destination: {{host: ratings}}}}]\n    rewrite: {rewrite}\n"
                ),
            )
        };
        let fields = |rewrite: &str| -> Vec<String> {
            vs(rewrite).errors().map(|e| e.field.clone()).collect()
        };
        let f = "spec.http[0].rewrite.uriRegexRewrite.match";
        assert_eq!(
            fields("{uriRegexRewrite: {match: '(?=x)', rewrite: /}}"),
            [f]
        );
        assert_eq!(fields("{uriRegexRewrite: {rewrite: /}}"), [f]);
        assert_eq!(
            fields("{uri: /a, uriRegexRewrite: {match: '^/b', rewrite: /}}"),
            ["spec.http[0].rewrite"]
        );
        assert_eq!(
            vs("{uriRegexRewrite: {match: '^/b/(.*)', rewrite: '/\\1'}}")
                .objects
                .len(),
            1
        );
    }

    #[test]
    fn sidecar_egress_listeners_are_checked_as_istio_checks_them() {
        let sc = |egress: &str| {
            let yaml = format!(
                "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: s, namespace: shop}}\nspec:\n  egress:\n{egress}"
            );
            let files = parse_file("sc.yaml", &yaml);
            let levels = |level| {
                (files.issues.iter())
                    .filter(|i| i.level == level)
                    .map(|i| i.field.clone())
                    .collect::<Vec<_>>()
            };
            (
                levels(super::super::Level::Error),
                levels(super::super::Level::Warning),
            )
        };
        let good = "  - {port: {number: 9080, protocol: HTTP, name: web}, bind: 127.0.0.2, captureMode: NONE, hosts: [./reviews]}\n  - {port: {number: 3306, protocol: MySQL}, hosts: [db/*]}\n  - {port: {number: 8081}, hosts: [./*]}\n  - {hosts: ['istio-system/*']}\n";
        assert_eq!(sc(good), (vec![], vec![]));
        let (errors, _) = sc(
            "  - {hosts: ['*/*']}\n  - {port: {number: 9080, protocol: FTP}, bind: localhost, captureMode: SOMETIMES, hosts: [reviews]}\n  - {port: {number: 9080, protocol: HTTP}, hosts: []}\n  - {port: {number: 0, protocol: HTTP}, hosts: [./*]}\n",
        );
        assert_eq!(
            errors,
            [
                "spec.egress[0].port",
                "spec.egress[1].hosts[0]",
                "spec.egress[1].captureMode",
                "spec.egress[1].bind",
                "spec.egress[1].port.protocol",
                "spec.egress[2].hosts",
                "spec.egress[2].port.number",
                "spec.egress[3].port.number",
            ]
        );
        let (errors, warnings) = sc(
            "  - {port: {number: 0, protocol: HTTP}, bind: 'unix:///var/run/app.sock', hosts: [./*]}\n  - {port: {number: 8080, protocol: HTTP_PROXY}, hosts: [./*]}\n",
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            warnings,
            ["spec.egress[0].bind", "spec.egress[1].port.protocol"]
        );
    }

    #[test]
    fn gateway_tls_and_sidecar_fields_meshd_does_not_serve_warn() {
        let gw = parse_file(
            "gw.yaml",
            concat!(
                "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: g, namespace: shop}\nspec:\n  servers:\n",
                "  - {port: {number: 443, name: a, protocol: HTTPS}, hosts: ['*'], tls: {mode: SIMPLE, credentialName: c}}\n",
                "  - {port: {number: 444, name: b, protocol: TLS}, hosts: ['*'], tls: {}}\n",
                "  - {port: {number: 445, name: c, protocol: HTTPS}, hosts: ['*'], tls: {mode: SIMPLE, serverCertificate: /c.pem, privateKey: /k.pem}}\n",
                "  - {port: {number: 446, name: d, protocol: TLS}, hosts: ['*'], tls: {mode: ISTIO_MUTUAL}}\n",
                "  - {port: {number: 447, name: e, protocol: TLS}, hosts: ['*'], tls: {mode: AUTO_PASSTHROUGH}}\n",
                "  - {port: {number: 448, name: f, protocol: HTTPS}, hosts: ['*'], tls: {mode: AUTO_PASSTHROUGH}}\n",
            ),
        );
        assert_eq!(gw.objects.len(), 1, "{:?}", gw.issues);
        let warned: Vec<&str> = gw.issues.iter().map(|i| i.field.as_str()).collect();
        assert_eq!(warned, ["spec.servers[5].tls.mode"]);
        let files = parse_file(
            "gw.yaml",
            "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: g, namespace: shop}\nspec:\n  servers:\n  - {port: {number: 443, name: a, protocol: HTTPS}, hosts: ['*'], tls: {mode: MUTUAL, serverCertificate: /c.pem}}\n",
        );
        let errors: Vec<&str> = files.errors().map(|e| e.field.as_str()).collect();
        assert_eq!(
            errors,
            [
                "spec.servers[0].tls.privateKey",
                "spec.servers[0].tls.caCertificates"
            ]
        );
        let istio_mutual = parse_file(
            "gw.yaml",
            "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: g, namespace: shop}\nspec:\n  servers:\n  - {port: {number: 443, name: a, protocol: HTTPS}, hosts: ['*'], tls: {mode: ISTIO_MUTUAL, credentialName: c}}\n",
        );
        let errors: Vec<&str> = istio_mutual.errors().map(|e| e.field.as_str()).collect();
        assert_eq!(errors, ["spec.servers[0].tls.credentialName"]);
        let sc = parse_file(
            "sc.yaml",
            "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: s, namespace: shop}\nspec:\n  inboundConnectionPool: {http: {http1MaxPendingRequests: 1}}\n  outboundTrafficPolicy: {mode: ALLOW_ANY, egressProxy: {host: egress.shop.svc.cluster.local, port: {number: 80}}}\n  ingress: [{port: {number: 80, protocol: HTTP, name: http}, defaultEndpoint: '127.0.0.1:8080', tls: {mode: SIMPLE}}]\n  egress: [{port: {number: 9080, protocol: HTTP, name: http}, hosts: [./reviews]}, {hosts: ['istio-system/*']}]\n",
        );
        assert_eq!(sc.objects.len(), 1, "{:?}", sc.issues);
        let warned: Vec<&str> = sc.issues.iter().map(|i| i.field.as_str()).collect();
        assert_eq!(warned, ["spec.ingress[0].tls"]);
        // An egress proxy needs ALLOW_ANY, a DNS host and a port.
        let bad_proxy = parse_file(
            "sc.yaml",
            "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: s, namespace: shop}\nspec:\n  outboundTrafficPolicy: {mode: REGISTRY_ONLY, egressProxy: {host: 'egress gw'}}\n",
        );
        let errors: Vec<&str> = bad_proxy.errors().map(|e| e.field.as_str()).collect();
        assert_eq!(
            errors,
            [
                "spec.outboundTrafficPolicy.egressProxy",
                "spec.outboundTrafficPolicy.egressProxy.host",
                "spec.outboundTrafficPolicy.egressProxy.port"
            ]
        );
        // The connection pools are applied, so checked as a DestinationRule's are.
        let bad = parse_file(
            "sc.yaml",
            "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: s, namespace: shop}\nspec:\n  inboundConnectionPool: {http: {http1MaxPendingRequests: -1}}\n  ingress: [{port: {number: 80, protocol: HTTP, name: http}, defaultEndpoint: '127.0.0.1:8080', connectionPool: {tcp: {connectTimeout: soon}}}]\n",
        );
        let errors: Vec<&str> = bad.errors().map(|e| e.field.as_str()).collect();
        assert_eq!(
            errors,
            [
                "spec.inboundConnectionPool.http.http1MaxPendingRequests",
                "spec.ingress[0].connectionPool.tcp.connectTimeout"
            ]
        );
    }

    #[test]
    fn tls_routes_need_sni_hosts_within_the_virtual_service_hosts() {
        let vs = |tls: &str| {
            parse_file(
                "vs.yaml",
                &format!(
                    "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: web, namespace: shop}}\nspec:\n  hosts: ['*.example.com', api.shop.io]\n  tls:\n{tls}"
                ),
            )
        };
        let bad = vs(concat!(
            "  - route: [{destination: {host: web}}]\n",
            "  - match: [{sniHosts: []}, {sniHosts: [other.org, 'a.*.com']}]\n",
            "    route: [{destination: {host: web}, weight: 50}]\n",
        ));
        assert!(bad.objects.is_empty());
        let fields: Vec<&str> = bad.errors().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.tls[0].match",
                "spec.tls[1].match[0].sniHosts",
                "spec.tls[1].match[1].sniHosts[0]",
                "spec.tls[1].match[1].sniHosts[1]",
            ]
        );
        let good = vs(concat!(
            "  - match: [{sniHosts: [a.example.com, '*.example.com', api.shop.io], port: 443}]\n",
            "    route: [{destination: {host: web, port: {number: 8443}}}]\n",
            "  - match: [{sniHosts: [10.0.0.1]}]\n",
            "    route: [{destination: {host: web}}]\n",
        ));
        assert_eq!(good.objects.len(), 1, "{:?}", good.issues);
        let warned: Vec<&str> = good.issues.iter().map(|i| i.field.as_str()).collect();
        assert_eq!(warned, ["spec.tls[1].match[0].sniHosts[0]"]);
    }

    #[test]
    fn locality_settings_are_checked_as_istio_checks_them() {
        let dr = |setting: &str, outlier: &str| {
            parse_file(
                "dr.yaml",
                &format!(
                    "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: r, namespace: shop}}\nspec:\n  host: reviews\n  trafficPolicy:\n    loadBalancer:\n      localityLbSetting: {setting}\n{outlier}"
                ),
            )
        };
        let errors = |setting: &str| {
            let parsed = dr(setting, "");
            assert!(parsed.objects.is_empty(), "{setting} is rejected");
            parsed
                .errors()
                .map(|e| {
                    e.field
                        .rsplit("localityLbSetting")
                        .next()
                        .unwrap()
                        .to_string()
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            errors("{distribute: [{from: a/*, to: {b/*: 100}}], failover: [{from: a, to: b}]}"),
            [""]
        );
        assert_eq!(
            errors(
                "{distribute: [{from: a/*/c, to: {b/*: 60, c/*: 30}}, {from: b, to: {a: 0, c: 100}}]}"
            ),
            [
                ".distribute[0].from",
                ".distribute[0].to",
                ".distribute[1].to[a]"
            ]
        );
        assert_eq!(
            errors(
                "{failover: [{from: a, to: a}, {from: a/z, to: b*}], failoverPriority: [topology.kubernetes.io/zone]}"
            ),
            [
                ".failoverPriority[0]",
                ".failover[0]",
                ".failover[1]",
                ".failover[1]"
            ]
        );
        // Failover without outlier detection: accepted, with a warning.
        let outlier = "    outlierDetection: {consecutive5xxErrors: 1}\n";
        for (rest, warned) in [("", true), (outlier, false)] {
            let parsed = dr(
                "{failoverPriority: [tier], failover: [{from: a, to: b}]}",
                rest,
            );
            assert_eq!(parsed.objects.len(), 1, "{:?}", parsed.issues);
            assert_eq!(
                parsed
                    .issues
                    .iter()
                    .any(|i| i.field.ends_with("localityLbSetting")),
                warned
            );
        }
    }

    #[test]
    fn a_tunnel_is_checked_as_istiod_checks_it_and_a_translated_rule_warns_about_nothing() {
        let parsed = parse_file(
            "dr.yaml",
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: r, namespace: shop}\nspec:\n  host: api.example.com\n  trafficPolicy:\n    tls: {mode: SIMPLE, credentialName: api-cert}\n    loadBalancer: {simple: ROUND_ROBIN, warmupDurationSecs: 10s}\n    tunnel: {protocol: CONNECT, targetHost: proxy.example.com, targetPort: 8080}\n    portLevelSettings:\n    - port: {number: 443}\n      tls: {mode: MUTUAL, clientCertificate: /c.pem, privateKey: /k.pem}\n",
        );
        assert_eq!(parsed.objects.len(), 1, "accepted: {:?}", parsed.issues);
        let warned: Vec<&str> = (parsed.issues.iter())
            .filter(|i| i.level == super::super::Level::Warning)
            .map(|i| i.field.as_str())
            .collect();
        assert!(warned.is_empty(), "{warned:?}");
        let errors = |tunnel: &str, extra: &str| -> Vec<String> {
            let yaml = format!(
                "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: r, namespace: shop}}\nspec:\n  host: api.example.com\n  trafficPolicy:\n    tunnel: {tunnel}\n{extra}"
            );
            (parse_file("dr.yaml", &yaml).issues.iter())
                .map(|i| format!("{} {}", i.field, i.message))
                .collect()
        };
        assert!(
            errors(
                "{targetHost: 10.0.0.1, targetPort: 3128, protocol: POST}",
                ""
            )
            .is_empty()
        );
        assert_eq!(
            errors("{protocol: GET, targetHost: 'bad host', targetPort: 0}", ""),
            [
                "spec.trafficPolicy.tunnel.protocol \"GET\": tunnel protocol must be \"CONNECT\" or \"POST\"",
                "spec.trafficPolicy.tunnel.targetHost \"bad host\" must be a valid FQDN or IP address",
                "spec.trafficPolicy.tunnel.targetPort 0 is not a port (1-65535)",
            ]
        );
        assert_eq!(
            errors(
                "{targetHost: a.example.com, targetPort: 443}",
                "    proxyProtocol: {}\n"
            ),
            ["spec.trafficPolicy tunnel and proxyProtocol must not be set together"]
        );
        // Warm-up is applied, so checked.
        let warmup = |lb: &str| {
            let parsed = parse_file(
                "dr.yaml",
                &format!(
                    "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: r, namespace: shop}}\nspec:\n  host: api.example.com\n  trafficPolicy:\n    loadBalancer: {lb}\n"
                ),
            );
            (parsed.issues.iter())
                .map(|i| i.field.clone())
                .collect::<Vec<_>>()
        };
        assert!(warmup("{warmup: {duration: 30s, minimumPercent: 20, aggression: 2}}").is_empty());
        let f = "spec.trafficPolicy.loadBalancer";
        assert_eq!(
            warmup("{warmupDurationSecs: soon, warmup: {minimumPercent: 120, aggression: 0.5}}"),
            [
                format!("{f}.warmupDurationSecs"),
                format!("{f}.warmup.duration"),
                format!("{f}.warmup.minimumPercent"),
                format!("{f}.warmup.aggression"),
            ]
        );
    }

    #[test]
    fn client_tls_needs_its_files_for_mutual_and_none_for_istio_mutual() {
        let parsed = parse_file(
            "dr.yaml",
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: r, namespace: shop}\nspec:\n  host: api.example.com\n  trafficPolicy:\n    tls: {mode: MUTUAL, clientCertificate: /c.pem}\n  subsets:\n  - name: v1\n    trafficPolicy: {tls: {mode: ISTIO_MUTUAL, caCertificates: /ca.pem}}\n",
        );
        assert!(parsed.objects.is_empty());
        let fields: Vec<&str> = parsed.errors().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.trafficPolicy.tls.privateKey",
                "spec.subsets[0].trafficPolicy.tls",
            ]
        );
    }

    #[test]
    fn an_invalid_regex_is_rejected_with_its_field() {
        let text = r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: bad, namespace: default}
spec:
  hosts: [web]
  http:
  - match: [{uri: {regex: "/(unclosed"}}]
    route: [{destination: {host: web}}]
"#;
        let parsed = parse_file("bad.yaml", text);
        assert!(parsed.objects.is_empty());
        let e = parsed.errors().next().unwrap();
        assert_eq!(e.field, "spec.http[0].match[0].uri.regex");
        assert!(e.message.contains("invalid regex"), "{}", e.message);
    }

    #[test]
    fn a_route_needs_an_action_and_a_string_match_needs_one_form() {
        let text = r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: bad}
spec:
  hosts: [web]
  http:
  - match: [{uri: {exact: /a, prefix: /b}}]
    timeout: soon
"#;
        let parsed = parse_file("bad.yaml", text);
        let fields: Vec<_> = parsed.errors().map(|e| e.field.as_str()).collect();
        assert!(fields.contains(&"spec.http[0].match[0].uri"), "{fields:?}");
        assert!(fields.contains(&"spec.http[0]"), "{fields:?}");
        assert!(fields.contains(&"spec.http[0].timeout"), "{fields:?}");
    }
}
