//! Telemetry, and MeshConfig's tracing and extension providers.

use super::*;

/// Telemetry, as istiod's `validateTelemetry` checks it: a mode Istio knows, named
/// providers, a filter whose expression parses as CEL ([`crate::config::cel`]; Envoy refuses the
/// whole listener update otherwise), a sampling percentage; `targetRef(s)` are
/// refused. `metrics`, and tracing's `useRequestIdForTraceSampling: false` and
/// `disableContextPropagation`, are kept but not applied (warned).
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
    if !t.metrics.is_empty() {
        r.warn(
            "spec.metrics",
            format!("{NOT_APPLIED}: Istio's stats filter is not in stock Envoy"),
        );
    }
}

/// A Telemetry entry's `match.mode` (one Istio knows) and `providers` (named).
pub(super) fn telemetry_entry(
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
