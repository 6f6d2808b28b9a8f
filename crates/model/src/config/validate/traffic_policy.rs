//! A DestinationRule's traffic policy, as istiod validates it: connection pools, outlier
//! detection, load balancing (consistent hash, locality), client TLS, tunnels and the
//! PROXY protocol, at the rule's, a subset's and each port's level. A Sidecar's inbound
//! connection pools are checked by the same [`connection_pool`].

use super::{Report, dns_name};
use api::networking::{
    ClientTlsMode, ClientTlsSettings, ConnectionPoolSettings, ConsistentHashLb,
    LoadBalancerSettings, OutlierDetection, TrafficPolicy,
};

/// A DestinationRule's (or subset's) traffic policy: its components, and each port-level
/// entry's, which must name a port and set at least one component.
pub(super) fn traffic_policy(r: &mut Report, field: &str, p: &TrafficPolicy) {
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
pub(super) fn connection_pool(r: &mut Report, field: &str, pool: &ConnectionPoolSettings) {
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
        if let Some(v) = tcp.max_connections.filter(|v| *v < 0) {
            r.error(format!("{f}.maxConnections"), format!("{v} is negative"));
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
    l: &api::networking::LocalityLoadBalancerSetting,
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
            if crate::service::TOPOLOGY_LABELS.contains(&label.as_str()) {
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

/// istiod's `validateTunnelSettings`.
fn tunnel(r: &mut Report, field: &str, t: &api::networking::TunnelSettings) {
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
