//! The HTTP filters a VirtualService route configures: fault injection (`http[].fault`,
//! istiod's `TranslateFault`) and CORS (`http[].corsPolicy`, istiod's
//! `TranslateCORSPolicy`). Both filters sit in every outbound and gateway HTTP connection
//! manager with an empty configuration, and each route that sets one carries its own in
//! `typed_per_filter_config`. And the gRPC statistics filter istiod puts in every
//! connection manager.

use envoy_api::pb::envoy::config::core::v3::RuntimeFractionalPercent;
use envoy_api::pb::envoy::extensions::filters::common::fault::v3::{
    FaultDelay, fault_delay::FaultDelaySecifier,
};
use envoy_api::pb::envoy::extensions::filters::http::cors::v3::{
    Cors, CorsPolicy as EnvoyCorsPolicy,
};
use envoy_api::pb::envoy::extensions::filters::http::fault::v3::{
    FaultAbort, HttpFault, fault_abort::ErrorType,
};
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter,
};
use envoy_api::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};
use envoy_api::pb::envoy::r#type::v3::{FractionalPercent, fractional_percent::DenominatorType};
use envoy_api::pb::google::protobuf::Any;
use envoy_api::pb::google::protobuf::BoolValue;
use envoy_api::util::pack_any;

use super::optional_duration;
use api::networking::{CorsPolicy, HttpFaultInjection, Percent, StringMatch};

/// The fault filter's name, in the connection manager and in a route's per-filter config.
pub const FAULT_FILTER: &str = "envoy.filters.http.fault";

/// The CORS filter's name, in the connection manager and in a route's per-filter config.
pub const CORS_FILTER: &str = "envoy.filters.http.cors";

/// istiod's gRPC statistics filter, in every connection manager: Envoy's per-cluster
/// counters of gRPC requests by status (`cluster.NAME.grpc.*`, without per-method
/// names, which untrusted clients could multiply), and the filter state that counts a
/// stream's messages.
pub fn grpc_stats() -> HttpFilter {
    use envoy_api::pb::envoy::extensions::filters::http::grpc_stats::v3::{
        FilterConfig, filter_config::PerMethodStatSpecifier,
    };
    HttpFilter {
        name: "envoy.filters.http.grpc_stats".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
            FilterConfig {
                emit_filter_state: true,
                per_method_stat_specifier: Some(PerMethodStatSpecifier::StatsForAllMethods(
                    BoolValue { value: false },
                )),
                ..Default::default()
            },
        ))),
        ..Default::default()
    }
}

/// The fault filter's own (empty) configuration: a route's decides.
pub fn filter_config() -> Any {
    pack_any(HttpFault::default())
}

/// The CORS filter's own (empty) configuration: a route's decides.
pub fn cors_filter_config() -> Any {
    pack_any(Cors::default())
}

/// A route's CORS policy: the origins as string matchers (`allowOrigins`, else the exact
/// `allowOrigin`), the lists joined with commas, `maxAge` in seconds, enabled for every
/// request, and unmatched preflights forwarded unless `IGNORE`.
pub fn cors_config(
    cors: &CorsPolicy,
    matcher: impl Fn(&StringMatch) -> Option<StringMatcher>,
) -> Any {
    let origins: Vec<StringMatcher> = if cors.allow_origins.is_empty() {
        (cors.allow_origin.iter())
            .map(|o| StringMatcher {
                match_pattern: Some(MatchPattern::Exact(o.clone())),
                ..Default::default()
            })
            .collect()
    } else {
        cors.allow_origins.iter().filter_map(matcher).collect()
    };
    pack_any(EnvoyCorsPolicy {
        allow_origin_string_match: origins,
        allow_methods: cors.allow_methods.join(","),
        allow_headers: cors.allow_headers.join(","),
        expose_headers: cors.expose_headers.join(","),
        max_age: (cors.max_age.as_deref())
            .and_then(|m| api::duration::parse(m).ok())
            .map(|d| d.as_secs().to_string())
            .unwrap_or_default(),
        allow_credentials: cors.allow_credentials.map(|value| BoolValue { value }),
        filter_enabled: Some(RuntimeFractionalPercent {
            default_value: Some(per_hundred(100)),
            ..Default::default()
        }),
        forward_not_matching_preflights: Some(BoolValue {
            value: cors.unmatched_preflights.as_deref() != Some("IGNORE"),
        }),
        ..Default::default()
    })
}

/// A whole percentage as Envoy's.
pub(super) fn per_hundred(percent: u32) -> FractionalPercent {
    FractionalPercent {
        numerator: percent,
        denominator: DenominatorType::Hundred as i32,
    }
}

/// Istio's percentage as Envoy's: per million, so that fractions survive.
pub(super) fn per_million(p: &Percent) -> FractionalPercent {
    FractionalPercent {
        numerator: (p.value * 10_000.0) as u32,
        denominator: DenominatorType::Million as i32,
    }
}

/// A route's fault configuration, or `None` when it injects nothing meshd can translate
/// (an exponential delay or an HTTP/2 error, which istiod drops too).
pub fn route_config(fault: &HttpFaultInjection) -> Option<Any> {
    let delay = fault.delay.as_ref().and_then(|d| {
        let fixed = optional_duration(d.fixed_delay.as_deref())?;
        Some(FaultDelay {
            percentage: Some(match &d.percentage {
                Some(p) => per_million(p),
                None => per_hundred(d.percent.unwrap_or(0).max(0) as u32),
            }),
            fault_delay_secifier: Some(FaultDelaySecifier::FixedDelay(fixed)),
        })
    });
    let abort = fault.abort.as_ref().and_then(|a| {
        let error = match (a.http_status, &a.grpc_status) {
            (Some(status), _) => ErrorType::HttpStatus(status.max(0) as u32),
            (None, Some(name)) => ErrorType::GrpcStatus(api::values::grpc_code(name)?),
            (None, None) => return None,
        };
        Some(FaultAbort {
            percentage: a.percentage.as_ref().map(per_million),
            error_type: Some(error),
            ..Default::default()
        })
    });
    if delay.is_none() && abort.is_none() {
        return None;
    }
    Some(pack_any(HttpFault {
        delay,
        abort,
        ..Default::default()
    }))
}
