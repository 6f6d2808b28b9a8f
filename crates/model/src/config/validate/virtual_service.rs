//! VirtualService: HTTP, TCP and TLS routes, their matches, destinations, mirrors, faults
//! and retries.

use super::*;

pub(super) fn http_route(r: &mut Report, field: &str, route: &HttpRoute) {
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
            if !header_name_or_claim(h) {
                r.error(
                    format!("{f}.headers.{h}"),
                    "not a header name (RFC 7230 token characters), pseudo-header or \
                     @request.auth.claims name",
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
                r.error(f, e.to_string());
            }
        }
    }
}

/// Mirrors, as Istio validates them: `mirror` or `mirrors`, not both; each destination
/// with a host; percentages within 0–100.
pub(super) fn mirrors(r: &mut Report, field: &str, route: &api::networking::HttpRoute) {
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
pub(super) fn fault_injection(
    r: &mut Report,
    field: &str,
    fault: &api::networking::HttpFaultInjection,
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

/// A TCP route: destinations with a host and weights within 0–100 (summing to 100 when
/// there are several), subnets that parse (`vs_gateways`: the VirtualService's).
pub(super) fn tcp_route(
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
pub(super) fn bound_to<'g>(
    match_gateways: &'g [String],
    vs_gateways: &'g [String],
) -> &'g [String] {
    if match_gateways.is_empty() {
        vs_gateways
    } else {
        match_gateways
    }
}

/// A TLS route, as Istio's `validateTLSRoute`: at least one match, each naming SNI hosts
/// that are valid and fall within one of the VirtualService's `hosts`; destinations as a
/// TCP route's.
pub(super) fn tls_route(
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
pub(super) fn route_destinations(
    r: &mut Report,
    field: &str,
    route: &[api::networking::RouteDestination],
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

/// A retry policy (a route's `retries`, MeshConfig's default ones): attempts and
/// durations Envoy can take.
pub(super) fn retries(r: &mut Report, field: &str, policy: &api::networking::HttpRetry) {
    if policy.attempts < 0 {
        r.error(format!("{field}.attempts"), "must not be negative");
    }
    r.duration(format!("{field}.perTryTimeout"), &policy.per_try_timeout);
    r.duration(format!("{field}.backoff"), &policy.backoff);
}

/// A header name a route may match, as istiod's `ValidateHTTPHeaderNameOrJwtClaimRoute`
/// accepts it: a JWT claim (`@request.auth.claims.NAME` or `[NAME]`), one of the request
/// pseudo-headers, or RFC 7230 token characters in any case (Envoy compares names without
/// case; Knative matches `K-Network-Hash`).
fn header_name_or_claim(name: &str) -> bool {
    const CLAIMS: &str = "@request.auth.claims";
    let lower = name.to_ascii_lowercase();
    if let Some(rest) = lower.strip_prefix(CLAIMS) {
        return (rest.starts_with('.') && rest.len() > 1)
            || (rest.starts_with('[') && rest.ends_with(']') && rest.len() > 2);
    }
    if [":method", ":scheme", ":authority", ":path", ":status"].contains(&name) {
        return true;
    }
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}
