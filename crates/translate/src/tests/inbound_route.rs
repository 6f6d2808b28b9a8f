//! The route and stream settings of a sidecar's connection managers, as istiod's
//! `BuildDefaultHTTPInboundRoute` and `buildHTTPConnectionManager` set them.

use envoy_api::pb::envoy::config::listener::v3::{Listener, filter::ConfigType};
use envoy_api::pb::envoy::config::route::v3::{Route, route::Action};
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier,
};
use prost::Message;
use serde_json::json;

use super::{context, sidecar};
use crate::proxy_config;

const SERVICES: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {clusterIP: 10.96.5.1, selector: {app: web}, ports: [{name: http, port: 80, targetPort: 8080}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: rpc, namespace: shop}\nspec: {clusterIP: 10.96.5.2, selector: {app: web}, ports: [{name: grpc-api, port: 9000}]}\n";

/// The connection managers of `listener`'s chains for `port` (every chain when `None`).
fn managers(listener: &Listener, port: Option<u32>) -> Vec<HttpConnectionManager> {
    (listener.filter_chains.iter())
        .filter(|c| {
            port.is_none()
                || c.filter_chain_match
                    .as_ref()
                    .and_then(|m| m.destination_port)
                    .is_some_and(|p| Some(p.value) == port)
        })
        .flat_map(|c| &c.filters)
        .filter_map(|f| match &f.config_type {
            Some(ConfigType::TypedConfig(any)) if f.name.ends_with("http_connection_manager") => {
                Some(HttpConnectionManager::decode(any.value.as_slice()).unwrap())
            }
            _ => None,
        })
        .collect()
}

/// The only route of an inbound manager's inline route configuration, and its virtual
/// host's name.
fn inbound_route(hcm: &HttpConnectionManager) -> (String, Route) {
    let Some(RouteSpecifier::RouteConfig(rc)) = &hcm.route_specifier else {
        panic!("{hcm:?}")
    };
    let vh = &rc.virtual_hosts[0];
    (vh.name.clone(), vh.routes[0].clone())
}

#[test]
fn inbound_routes_name_the_service_port_retry_resets_except_for_grpc_and_never_time_out() {
    let cfg = proxy_config(&context(SERVICES), &sidecar("shop", json!({"app": "web"})));
    let inbound = cfg
        .listeners
        .iter()
        .find(|l| l.name == "virtualInbound")
        .unwrap();

    let http = managers(inbound, Some(8080));
    assert!(!http.is_empty());
    for hcm in &http {
        let (vhost, route) = inbound_route(hcm);
        assert_eq!(vhost, "inbound|http|80");
        assert_eq!(
            route.decorator.unwrap().operation,
            "web.shop.svc.cluster.local:80/*"
        );
        let Some(Action::Route(action)) = route.action else {
            panic!()
        };
        assert_eq!(action.timeout.unwrap().seconds, 0);
        let msd = action.max_stream_duration.unwrap();
        assert_eq!(msd.max_stream_duration.unwrap().seconds, 0);
        assert_eq!(msd.grpc_timeout_header_max.unwrap().seconds, 0);
        let retry = action.retry_policy.unwrap();
        assert_eq!(retry.retry_on, "reset-before-request");
        assert_eq!(retry.num_retries.unwrap().value, 2);
        assert_eq!(hcm.stream_idle_timeout.unwrap().seconds, 0);
    }

    // A gRPC port: no retries, which would break streams.
    let grpc = managers(inbound, Some(9000));
    assert!(!grpc.is_empty());
    for hcm in &grpc {
        let (vhost, route) = inbound_route(hcm);
        assert_eq!(vhost, "inbound|http|9000");
        let Some(Action::Route(action)) = route.action else {
            panic!()
        };
        assert_eq!(action.retry_policy, None);
        assert!(action.max_stream_duration.is_some());
    }

    // Outbound managers keep idle streams open too.
    let outbound = cfg
        .listeners
        .iter()
        .find(|l| l.name == "0.0.0.0_80")
        .unwrap();
    let managers = managers(outbound, None);
    assert!(!managers.is_empty());
    for hcm in managers {
        assert_eq!(hcm.stream_idle_timeout.unwrap().seconds, 0);
    }
}

#[test]
fn inbound_clusters_reach_the_application_at_its_original_destination_or_on_loopback() {
    use envoy_api::pb::envoy::config::cluster::v3::Cluster;
    use envoy_api::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
    let inbound = |mesh: &str, ip: &str| -> Cluster {
        let yaml = format!(
            "{SERVICES}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n    {mesh}\n"
        );
        let meta = json!({"NAMESPACE": "shop", "LABELS": {"app": "web"}});
        let proxy = model::Proxy::from_node(
            &format!("sidecar~{ip}~web-1.shop~shop.svc.cluster.local"),
            meta.as_object().unwrap(),
        )
        .unwrap();
        let cfg = proxy_config(&context(&yaml), &proxy);
        (cfg.clusters.into_iter())
            .find(|c| c.name == "inbound|8080||")
            .unwrap()
    };
    let kind = |c: &Cluster| c.cluster_discovery_type.clone();
    let kind_of = |t: DiscoveryType| Some(ClusterDiscoveryType::Type(t as i32));
    let endpoint = |c: &Cluster| {
        let lb = &c.load_assignment.as_ref().unwrap().endpoints[0].lb_endpoints[0];
        format!("{lb:?}")
    };

    // PASSTHROUGH (the default): the original destination, from 127.0.0.6, never cleaned.
    let c = inbound("trustDomain: cluster.local", "10.9.9.9");
    assert_eq!(kind(&c), kind_of(DiscoveryType::OriginalDst));
    let bind = c.upstream_bind_config.as_ref().unwrap();
    assert!(format!("{bind:?}").contains("127.0.0.6"));
    assert_eq!(c.cleanup_interval.unwrap().seconds, 9_223_372_035);

    // LOCALHOST: the application on loopback, without the bind.
    let c = inbound("inboundTrafficPolicy: {mode: LOCALHOST}", "10.9.9.9");
    assert_eq!(kind(&c), kind_of(DiscoveryType::Static));
    assert!(endpoint(&c).contains("\"127.0.0.1\"") && endpoint(&c).contains("8080"));
    assert_eq!(c.upstream_bind_config, None);
    let c = inbound("inboundTrafficPolicy: {mode: LOCALHOST}", "fd00::9");
    assert!(endpoint(&c).contains("\"::1\""), "{}", endpoint(&c));
}

/// An inbound cluster names, in its `istio` metadata, the services that reach its port
/// through the same service port as the first (istiod's `addTelemetryMetadata`): Istio's
/// stats filter reads the `destination_service*` labels of inbound requests from it.
#[test]
fn an_inbound_cluster_names_the_services_on_its_port_for_istios_stats() {
    let more = "---\napiVersion: v1\nkind: Service\nmetadata: {name: web-canary, namespace: shop}\nspec: {clusterIP: 10.96.5.3, selector: {app: web}, ports: [{name: http, port: 80, targetPort: 8080}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: zz-admin, namespace: shop}\nspec: {clusterIP: 10.96.5.4, selector: {app: web}, ports: [{name: http, port: 81, targetPort: 8080}]}\n";
    let ctx = context(&format!("{SERVICES}{more}"));
    let cfg = proxy_config(&ctx, &sidecar("shop", json!({"app": "web"})));
    assert_eq!(
        telemetry_services(&cfg, "inbound|8080||"),
        [
            "web-canary.shop.svc.cluster.local shop/web-canary",
            "web.shop.svc.cluster.local shop/web",
        ]
    );
    assert_eq!(
        telemetry_services(&cfg, "inbound|9000||"),
        ["rpc.shop.svc.cluster.local shop/rpc"]
    );

    // A ServiceEntry's service is named by its host, inbound and outbound, as istiod's.
    let entry = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: vm-api, namespace: shop}\nspec:\n  hosts: [api.internal]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{number: 7070, name: http, protocol: HTTP}]\n  endpoints: [{address: 10.9.9.9}]\n";
    let cfg = proxy_config(&context(entry), &sidecar("shop", json!({})));
    for cluster in ["inbound|7070||", "outbound|7070||api.internal"] {
        assert_eq!(
            telemetry_services(&cfg, cluster),
            ["api.internal shop/api.internal"],
            "{cluster}"
        );
    }
}

/// The services named in `cluster`'s `istio` metadata: `HOST NAMESPACE/NAME` each.
fn telemetry_services(cfg: &crate::ProxyConfig, cluster: &str) -> Vec<String> {
    use envoy_api::pb::google::protobuf::value::Kind;
    let c = (cfg.clusters.iter()).find(|c| c.name == cluster).unwrap();
    let istio = &c.metadata.as_ref().unwrap().filter_metadata["istio"];
    let Some(Kind::ListValue(list)) = &istio.fields["services"].kind else {
        panic!("{istio:?}")
    };
    (list.values.iter())
        .map(|v| {
            let Some(Kind::StructValue(s)) = &v.kind else {
                panic!("{v:?}")
            };
            let text = |k: &str| match &s.fields[k].kind {
                Some(Kind::StringValue(t)) => t.clone(),
                other => panic!("{k}: {other:?}"),
            };
            format!("{} {}/{}", text("host"), text("namespace"), text("name"))
        })
        .collect()
}
