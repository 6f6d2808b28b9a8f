//! The ProxyConfig `proxyHeaders` settings istiod writes into route configurations rather
//! than connection managers: `attemptCount` (every virtual host's
//! `include_request_attempt_count`) and `xForwardedHost` (`append_x_forwarded_host` on the
//! route actions that rewrite, and on the catch-all's).

use envoy_api::pb::envoy::config::route::v3::{RouteAction, VirtualHost, route::Action};
use model::proxy_headers::ProxyHeaders;

/// What a proxy's `proxyHeaders` change in its virtual hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteHeaders {
    /// `attemptCount.disabled`: Envoy adds no `x-envoy-attempt-count` to requests.
    pub attempt_count_disabled: bool,
    /// `xForwardedHost.enabled`: a rewritten host's original value is appended to
    /// `x-forwarded-host`.
    pub x_forwarded_host: bool,
}

impl RouteHeaders {
    /// The route settings of `headers`; `None` when they are Istio's defaults.
    pub fn of(headers: &ProxyHeaders) -> Option<RouteHeaders> {
        let r = RouteHeaders {
            attempt_count_disabled: headers.attempt_count_disabled,
            x_forwarded_host: headers.x_forwarded_host,
        };
        (r.attempt_count_disabled || r.x_forwarded_host).then_some(r)
    }

    /// Sets them on a virtual host as istiod's route builders do: the attempt count on
    /// every virtual host (sidecar and gateway alike), `append_x_forwarded_host` on each
    /// route action built from a VirtualService route with a `rewrite` and on the
    /// `allow_any` catch-all's (Envoy appends only when it rewrites the host).
    pub fn apply(&self, vh: &mut VirtualHost) {
        if self.attempt_count_disabled {
            vh.include_request_attempt_count = false;
        }
        if self.x_forwarded_host {
            let catch_all = vh.name == "allow_any";
            for route in &mut vh.routes {
                if let Some(Action::Route(action)) = &mut route.action
                    && (catch_all || rewrites(action))
                {
                    action.append_x_forwarded_host = true;
                }
            }
        }
    }
}

/// Whether a route action rewrites the path or the host (a VirtualService `rewrite`).
fn rewrites(action: &RouteAction) -> bool {
    !action.prefix_rewrite.is_empty()
        || action.regex_rewrite.is_some()
        || action.host_rewrite_specifier.is_some()
        || action.path_rewrite_policy.is_some()
}
