//! Checks on one object that the schema cannot express: regexes that compile, exactly one
//! StringMatch form, durations, weights, required fields. Cross-object checks (a route to a
//! host that does not exist) happen when the push context is built.

use regex::RegexBuilder;

use self::traffic_policy::{connection_pool, traffic_policy};
use super::{ConfigObject, Level, Spec};
use api::networking::{HttpRoute, StringMatch};

mod gateway;
mod security;
mod sidecar;
mod telemetry;
mod tls;
mod traffic_policy;
mod virtual_service;

use self::gateway::*;
use self::security::*;
use self::sidecar::*;
use self::telemetry::*;
use self::tls::*;
use self::virtual_service::*;

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
            self.error(field, e.to_string());
        }
    }
}

/// A regex Envoy would refuse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid regex {regex:?}: {problem}")]
pub struct RegexError {
    pub regex: String,
    /// The compiler's own words (for RE2 syntax it does not have, such as look-around).
    pub problem: String,
}

/// Envoy compiles regexes with RE2; the `regex` crate accepts the same syntax for what
/// Istio users write, and rejects what RE2 rejects (look-around, back-references).
pub fn check_regex(regex: &str) -> Result<(), RegexError> {
    RegexBuilder::new(regex)
        .size_limit(1 << 20)
        .build()
        .map(|_| ())
        .map_err(|e| RegexError {
            regex: regex.into(),
            problem: e.to_string().lines().last().unwrap_or("").into(),
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
        r.error(format!("{field}.regex"), e.to_string());
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
            if let Err(e) = mesh.default_config.gateway_topology() {
                r.error(format!("data.mesh.defaultConfig.{}", e.field), e.reason);
            }
            if let Err(e) = mesh.default_config.proxy_headers() {
                r.error(format!("data.mesh.defaultConfig.{}", e.field), e.reason);
            }
            if let Some(t) = &mesh.mesh_mtls {
                mesh_tls(&mut r, "data.mesh.meshMTLS", t, true);
            }
            if let Some(t) = &mesh.tls_defaults {
                mesh_tls(&mut r, "data.mesh.tlsDefaults", t, false);
            }
        }
    }
    r.0
}

#[cfg(test)]
mod tests;
