//! Retry policies: a VirtualService's `retries`, MeshConfig's `defaultHttpRetryPolicy`
//! for routes without them, and `defaultInboundHttpRetryPolicy` for inbound routes.

use envoy_api::pb::envoy::config::listener::v3::filter::ConfigType;
use envoy_api::pb::envoy::config::route::v3::{RetryPolicy, route::Action};
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier,
};
use prost::Message;
use serde_json::json;

use super::{context, sidecar};
use crate::ProxyConfig;
use crate::proxy_config;
use crate::route::{inbound_retry_policy, retry_policy};
use api::networking::HttpRetry;

#[test]
fn a_retry_policy_sets_what_it_says_over_istios_default() {
    let default = retry_policy(None).unwrap();
    assert_eq!(default.num_retries.unwrap().value, 2);
    assert_eq!(default.retry_host_predicate.len(), 1);
    let none = HttpRetry {
        attempts: 0,
        ..Default::default()
    };
    assert_eq!(retry_policy(Some(&none)), None);
    let all = HttpRetry {
        attempts: 4,
        retry_on: Some("gateway-error,503, 429".into()),
        per_try_timeout: Some("2s".into()),
        retry_ignore_previous_hosts: Some(false),
        retry_remote_localities: Some(true),
        backoff: Some("250ms".into()),
    };
    let p = retry_policy(Some(&all)).unwrap();
    assert_eq!(p.num_retries.unwrap().value, 4);
    assert_eq!(p.retry_on, "gateway-error,retriable-status-codes");
    assert_eq!(p.retriable_status_codes, [503, 429]);
    assert_eq!(p.per_try_timeout.unwrap().seconds, 2);
    assert!(
        p.retry_host_predicate.is_empty(),
        "previous hosts may be retried"
    );
    assert_eq!(
        p.retry_priority.unwrap().name,
        "envoy.retry_priorities.previous_priorities"
    );
    let base = p.retry_back_off.unwrap().base_interval.unwrap();
    assert_eq!(base.nanos, 250_000_000);

    // Inbound: resets before the application, twice, unless the mesh says otherwise.
    let inbound = inbound_retry_policy(None).unwrap();
    assert_eq!(
        (
            inbound.retry_on.as_str(),
            inbound.num_retries.unwrap().value
        ),
        ("reset-before-request", 2)
    );
    assert_eq!(inbound_retry_policy(Some(&none)), None);
    let four = HttpRetry {
        attempts: 4,
        ..Default::default()
    };
    let p = inbound_retry_policy(Some(&four)).unwrap();
    assert_eq!(
        (p.retry_on.as_str(), p.num_retries.unwrap().value),
        ("reset-before-request", 4)
    );
    assert!(p.retry_host_predicate.is_empty() && p.per_try_timeout.is_none());
}

const SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {clusterIP: 10.96.5.1, selector: {app: web}, ports: [{name: http, port: 80}]}\n---\n";

fn config(mesh: &str) -> ProxyConfig {
    let yaml = format!(
        "{SERVICE}apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n{mesh}"
    );
    proxy_config(&context(&yaml), &sidecar("shop", json!({"app": "web"})))
}

/// The retry policy of the route of `vhost` (by name) in the route configurations.
fn outbound(cfg: &ProxyConfig, vhost: &str) -> Option<RetryPolicy> {
    let vh = (cfg.routes.iter().flat_map(|r| &r.virtual_hosts))
        .find(|v| v.name == vhost)
        .unwrap_or_else(|| panic!("{vhost}"));
    let Some(Action::Route(a)) = &vh.routes[0].action else {
        panic!()
    };
    a.retry_policy.clone()
}

/// The retry policy of the inbound route of port 80 (virtualInbound's plaintext chain).
fn inbound(cfg: &ProxyConfig) -> Option<RetryPolicy> {
    let l = cfg
        .listeners
        .iter()
        .find(|l| l.name == "virtualInbound")
        .unwrap();
    let hcm = (l.filter_chains.iter())
        .filter(|c| {
            c.filter_chain_match
                .as_ref()
                .and_then(|m| m.destination_port)
                .is_some_and(|p| p.value == 80)
        })
        .flat_map(|c| &c.filters)
        .find_map(|f| match &f.config_type {
            Some(ConfigType::TypedConfig(any)) if f.name.ends_with("http_connection_manager") => {
                Some(HttpConnectionManager::decode(any.value.as_slice()).unwrap())
            }
            _ => None,
        })
        .unwrap();
    let Some(RouteSpecifier::RouteConfig(rc)) = hcm.route_specifier else {
        panic!()
    };
    let Some(Action::Route(a)) = &rc.virtual_hosts[0].routes[0].action else {
        panic!()
    };
    a.retry_policy.clone()
}

#[test]
fn the_meshs_default_policies_replace_istios_where_no_virtual_service_sets_one() {
    let istio = config("    trustDomain: cluster.local\n");
    let web = "web.shop.svc.cluster.local:80";
    let reviews = "reviews.shop.svc.cluster.local:9080";
    assert_eq!(outbound(&istio, web), retry_policy(None));
    assert_eq!(inbound(&istio), inbound_retry_policy(None));

    let mesh = config(
        "    defaultHttpRetryPolicy: {attempts: 5, retryOn: 5xx}\n    defaultInboundHttpRetryPolicy: {attempts: 0}\n",
    );
    // A service without a VirtualService, and a route of one without `retries`.
    for vhost in [web, reviews] {
        let p = outbound(&mesh, vhost).unwrap();
        assert_eq!(
            (p.num_retries.unwrap().value, p.retry_on.as_str()),
            (5, "5xx"),
            "{vhost}"
        );
    }
    assert_eq!(inbound(&mesh), None);

    // A VirtualService's own `retries` win.
    let own = "    defaultHttpRetryPolicy: {attempts: 5}\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: web, namespace: shop}\nspec:\n  hosts: [web]\n  http: [{route: [{destination: {host: web}}], retries: {attempts: 1}}]\n";
    let p = outbound(&config(own), web).unwrap();
    assert_eq!(p.num_retries.unwrap().value, 1);
}
