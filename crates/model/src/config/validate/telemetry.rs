//! Telemetry, and MeshConfig's tracing and extension providers.

use super::*;

/// Telemetry, as istiod's `validateTelemetry` checks it: a mode Istio knows, named
/// providers, a filter whose expression parses as CEL ([`crate::config::cel`]; Envoy refuses the
/// whole listener update otherwise), a sampling percentage, `metrics` ([`metrics`]);
/// `targetRef(s)` are refused. Tracing's `useRequestIdForTraceSampling: false` and
/// `disableContextPropagation` are kept but not applied (warned).
pub(super) fn telemetry(r: &mut Report, t: &api::telemetry::TelemetrySpec) {
    no_target_refs(r, &t.target_ref, &t.target_refs);
    for (i, l) in t.access_logging.iter().enumerate() {
        let f = format!("spec.accessLogging[{i}]");
        telemetry_entry(r, &f, &l.r#match, &l.providers);
        if let Some(filter) = &l.filter {
            let field = format!("{f}.filter.expression");
            if filter.expression.trim().is_empty() {
                r.error(field, "must not be empty");
            } else if let Err(e) = crate::config::cel::check(&filter.expression) {
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
    for (i, m) in t.metrics.iter().enumerate() {
        metrics(r, &format!("spec.metrics[{i}]"), m);
    }
}

/// A `metrics` entry, as istiod's `validateTelemetryMetrics` checks it, and more where
/// Envoy would refuse the listener: named providers, a known metric and mode, tag values
/// only to UPSERT and then CEL expressions, a reporting interval that is a duration.
fn metrics(r: &mut Report, field: &str, m: &api::telemetry::Metrics) {
    providers_named(r, field, &m.providers);
    r.duration(format!("{field}.reportingInterval"), &m.reporting_interval);
    for (j, o) in m.overrides.iter().enumerate() {
        let f = format!("{field}.overrides[{j}]");
        let selector = o.r#match.as_ref();
        if let Some(metric) = selector.and_then(|s| s.metric.as_deref())
            && metric != "ALL_METRICS"
            && !(api::telemetry::ISTIO_METRICS.iter()).any(|(name, _)| *name == metric)
        {
            r.error(
                format!("{f}.match.metric"),
                format!("{metric:?} is not one of Istio's metrics"),
            );
        }
        if selector.and_then(|s| s.custom_metric.as_deref()) == Some("") {
            r.error(format!("{f}.match.customMetric"), "must not be empty");
        }
        workload_mode(r, &f, selector.and_then(|s| s.mode.as_deref()));
        for (tag, to) in &o.tag_overrides {
            let tf = format!("{f}.tagOverrides[{tag}]");
            if tag.is_empty() {
                r.warn(tf.clone(), "a tag name must not be empty");
            }
            let value = to.value.as_deref().unwrap_or("");
            match to.operation.as_deref().unwrap_or("UPSERT") {
                "UPSERT" if value.is_empty() => {
                    r.error(
                        format!("{tf}.value"),
                        "must be set when operation is UPSERT",
                    );
                }
                "UPSERT" => {
                    if let Err(e) = crate::config::cel::check(value) {
                        r.error(format!("{tf}.value"), format!("not a CEL expression: {e}"));
                    }
                }
                "REMOVE" if !value.is_empty() => {
                    r.error(
                        format!("{tf}.value"),
                        "may only be set when operation is UPSERT",
                    );
                }
                "REMOVE" => {}
                other => {
                    r.error(
                        format!("{tf}.operation"),
                        format!("{other:?} is not UPSERT or REMOVE"),
                    );
                }
            }
        }
    }
}

/// A Telemetry entry's `match.mode` (one Istio knows) and `providers` (named).
pub(super) fn telemetry_entry(
    r: &mut Report,
    field: &str,
    selector: &Option<api::telemetry::LogSelector>,
    providers: &[api::telemetry::ProviderRef],
) {
    workload_mode(r, field, selector.as_ref().and_then(|m| m.mode.as_deref()));
    providers_named(r, field, providers);
}

/// An entry's `match.mode`: one Istio knows.
fn workload_mode(r: &mut Report, field: &str, mode: Option<&str>) {
    if let Some(mode) = mode
        && !matches!(mode, "CLIENT" | "SERVER" | "CLIENT_AND_SERVER")
    {
        let message = format!("{mode:?} is not CLIENT, SERVER or CLIENT_AND_SERVER");
        r.error(format!("{field}.match.mode"), message);
    }
}

/// An entry's `providers`: each named.
fn providers_named(r: &mut Report, field: &str, providers: &[api::telemetry::ProviderRef]) {
    for (j, p) in providers.iter().enumerate() {
        if p.name.is_empty() {
            r.error(format!("{field}.providers[{j}].name"), "must not be empty");
        }
    }
}

/// `defaultConfig.tracing`: a sampling percentage istiod would replace, and custom tags
/// that say nothing, are warned about.
pub(super) fn proxy_tracing(r: &mut Report, t: &crate::mesh::ProxyTracing) {
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
pub(super) fn extension_providers(r: &mut Report, providers: &[crate::mesh::ExtensionProvider]) {
    for (i, e) in providers.iter().enumerate() {
        let f = format!("data.mesh.extensionProviders[{i}]");
        if let Err(problem) = crate::ext_authz::check(e, providers) {
            r.warn(f, problem.to_string());
        }
    }
}
