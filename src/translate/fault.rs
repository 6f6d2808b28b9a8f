//! VirtualService fault injection (`http[].fault`), as istiod's `TranslateFault`: Envoy's
//! fault filter sits in every outbound and gateway HTTP connection manager with an empty
//! configuration, and each route with a fault carries its own in
//! `typed_per_filter_config`.

use envoy_types::pb::envoy::extensions::filters::common::fault::v3::{
    FaultDelay, fault_delay::FaultDelaySecifier,
};
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::{
    FaultAbort, HttpFault, fault_abort::ErrorType,
};
use envoy_types::pb::envoy::r#type::v3::{FractionalPercent, fractional_percent::DenominatorType};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::util::pack_any;

use super::optional_duration;
use crate::api::networking::{HttpFaultInjection, Percent};

/// The fault filter's name, in the connection manager and in a route's per-filter config.
pub const FAULT_FILTER: &str = "envoy.filters.http.fault";

/// The filter's own (empty) configuration: a route's decides.
pub fn filter_config() -> Any {
    pack_any(HttpFault::default())
}

/// gRPC status codes by the names Istio's `grpcStatus` takes.
const GRPC_CODES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The gRPC code a status name stands for.
pub fn grpc_code(name: &str) -> Option<u32> {
    GRPC_CODES.iter().position(|c| *c == name).map(|i| i as u32)
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
                None => FractionalPercent {
                    numerator: d.percent.unwrap_or(0).max(0) as u32,
                    denominator: DenominatorType::Hundred as i32,
                },
            }),
            fault_delay_secifier: Some(FaultDelaySecifier::FixedDelay(fixed)),
        })
    });
    let abort = fault.abort.as_ref().and_then(|a| {
        let error = match (a.http_status, &a.grpc_status) {
            (Some(status), _) => ErrorType::HttpStatus(status.max(0) as u32),
            (None, Some(name)) => ErrorType::GrpcStatus(grpc_code(name)?),
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
