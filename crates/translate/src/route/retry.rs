//! Retry policies: Istio's defaults, a route's `retries`, and the inbound retry of a
//! request reset before the application took it.

use super::*;

/// Istio's default retry policy, as istiod's `retry.DefaultPolicy` writes it: two retries
/// on connection failures, refused streams and gRPC `unavailable` and `cancelled`, no
/// status code retriable, 5 host-selection attempts away from the hosts already tried.
pub const DEFAULT_RETRY_ON: &str =
    "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes";
pub const DEFAULT_RETRIES: u32 = 2;
pub const DEFAULT_HOST_SELECTION_ATTEMPTS: i64 = 5;

pub(super) fn default_retry_policy() -> RetryPolicy {
    RetryPolicy {
        retry_on: DEFAULT_RETRY_ON.into(),
        num_retries: Some(UInt32Value {
            value: DEFAULT_RETRIES,
        }),
        retry_host_predicate: vec![previous_hosts()],
        host_selection_retry_max_attempts: DEFAULT_HOST_SELECTION_ATTEMPTS,
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
pub(super) fn parse_retry_on(text: &str) -> (String, Vec<u32>) {
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

pub(super) fn back_off(r: &HttpRetry) -> Option<RetryBackOff> {
    optional_duration(r.backoff.as_deref()).map(|base| RetryBackOff {
        base_interval: Some(base),
        ..Default::default()
    })
}

/// `retryRemoteLocalities`: retries go to other localities' endpoints (istiod's
/// `previous_priorities` with update frequency 2).
pub(super) fn previous_priorities() -> RetryPriority {
    use envoy_api::pb::envoy::extensions::retry::priority::previous_priorities::v3::PreviousPrioritiesConfig;
    RetryPriority {
        name: "envoy.retry_priorities.previous_priorities".into(),
        config_type: Some(retry_policy::retry_priority::ConfigType::TypedConfig(
            pack_any(PreviousPrioritiesConfig {
                update_frequency: 2,
            }),
        )),
    }
}

pub(super) fn previous_hosts() -> RetryHostPredicate {
    RetryHostPredicate {
        name: "envoy.retry_host_predicates.previous_hosts".into(),
        config_type: Some(envoy_api::pb::envoy::config::route::v3::retry_policy::retry_host_predicate::ConfigType::TypedConfig(
            pack_any(PreviousHostsPredicate {}),
        )),
    }
}
