//! A sidecar's inbound side, from its Sidecar resource's `ingress` listeners (how Istio
//! serves a proxy without traffic capture): a real listener `BIND_PORT` per ingress port,
//! whose filter chains follow the port's effective PeerAuthentication mode
//!
//! - STRICT: one chain, mutual TLS only (a plaintext client is refused);
//! - PERMISSIVE: a TLS chain and a plaintext chain, told apart by the TLS inspector;
//! - DISABLE: plaintext only;
//!
//! each with the AuthorizationPolicies' RBAC filters, then (HTTP) an HCM that forwards the
//! peer's identity in `x-forwarded-client-cert` to the application and routes to the
//! `inbound|PORT||` cluster of the ingress `defaultEndpoint`.

use envoy_types::pb::envoy::config::cluster::v3::{
    Cluster,
    cluster::{ClusterDiscoveryType, DiscoveryType},
};
use envoy_types::pb::envoy::config::core::v3::{Address, Pipe, TrafficDirection, address};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint::HostIdentifier,
};
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter, filter::ConfigType,
    listener_filter,
};
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route::Action,
    route_action::ClusterSpecifier, route_match::PathSpecifier,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter,
    http_connection_manager::{
        CodecType, ForwardClientCertDetails, RouteSpecifier, ServerHeaderTransformation,
        SetCurrentClientCertDetails,
    },
    http_filter,
};
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::util::pack_any;

use super::endpoint::socket_address;
use super::listener::tcp_proxy;
use super::{authz, duration, tls};
use crate::api::networking::IstioIngressListener;
use crate::model::security::Mtls;
use crate::model::{Interception, Protocol, Proxy, PushContext};

/// Istio's inbound cluster name: `inbound|PORT||`.
pub fn inbound_cluster_name(port: u32) -> String {
    format!("inbound|{port}||")
}

/// Where an ingress listener's traffic goes: `defaultEndpoint` as an address.
fn default_endpoint(ingress: &IstioIngressListener) -> Option<Address> {
    let text = ingress.default_endpoint.as_deref()?;
    if let Some(path) = text.strip_prefix("unix://") {
        return Some(Address {
            address: Some(address::Address::Pipe(Pipe {
                path: path.into(),
                ..Default::default()
            })),
        });
    }
    let (host, port) = text.rsplit_once(':')?;
    let port: u32 = port.parse().ok()?;
    let host = if host == "0.0.0.0" { "127.0.0.1" } else { host };
    Some(socket_address(host, port))
}

fn inbound_cluster(name: &str, target: Address) -> Cluster {
    Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
        connect_timeout: Some(duration(std::time::Duration::from_secs(10))),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: name.to_string(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                        address: Some(target),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn inbound_hcm(listener_name: &str, port: u32, rbac: Vec<HttpFilter>) -> Filter {
    let cluster = inbound_cluster_name(port);
    let route = RouteConfiguration {
        name: cluster.clone(),
        validate_clusters: Some(BoolValue { value: false }),
        virtual_hosts: vec![VirtualHost {
            name: format!("inbound|http|{port}"),
            domains: vec!["*".into()],
            routes: vec![Route {
                name: "default".into(),
                r#match: Some(RouteMatch {
                    path_specifier: Some(PathSpecifier::Prefix("/".into())),
                    ..Default::default()
                }),
                action: Some(Action::Route(RouteAction {
                    cluster_specifier: Some(ClusterSpecifier::Cluster(cluster)),
                    timeout: Some(duration(std::time::Duration::ZERO)),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut http_filters = rbac;
    http_filters.push(HttpFilter {
        name: "envoy.filters.http.router".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
            Router::default(),
        ))),
        ..Default::default()
    });
    let hcm = HttpConnectionManager {
        stat_prefix: format!("inbound_{listener_name}"),
        codec_type: CodecType::Auto as i32,
        route_specifier: Some(RouteSpecifier::RouteConfig(route)),
        http_filters,
        use_remote_address: Some(BoolValue { value: false }),
        normalize_path: Some(BoolValue { value: true }),
        forward_client_cert_details: ForwardClientCertDetails::AppendForward as i32,
        set_current_client_cert_details: Some(SetCurrentClientCertDetails {
            subject: Some(BoolValue { value: true }),
            uri: true,
            dns: true,
            ..Default::default()
        }),
        server_name: "istio-envoy".into(),
        server_header_transformation: ServerHeaderTransformation::Overwrite as i32,
        ..Default::default()
    };
    Filter {
        name: "envoy.filters.network.http_connection_manager".into(),
        config_type: Some(ConfigType::TypedConfig(pack_any(hcm))),
    }
}

/// A chain that closes every connection: RBAC allowing nothing, in front of the black hole.
fn refuse_all(cluster: &str) -> FilterChain {
    FilterChain {
        name: format!("{cluster}-refused"),
        filter_chain_match: Some(FilterChainMatch::default()),
        filters: vec![
            authz::deny_all_network_filter(),
            tcp_proxy(super::BLACKHOLE_CLUSTER),
        ],
        ..Default::default()
    }
}

/// The inbound listeners and clusters of a sidecar.
pub fn sidecar(ctx: &PushContext, proxy: &Proxy) -> (Vec<Listener>, Vec<Cluster>) {
    let Some((_, sidecar)) = ctx.sidecar_for(proxy) else {
        return (Vec::new(), Vec::new());
    };
    let policies = ctx.authorization_policies_for(proxy);
    let mut listeners = Vec::new();
    let mut clusters = Vec::new();
    for ingress in &sidecar.ingress {
        let Some(target) = default_endpoint(ingress) else {
            continue; // validation reports it
        };
        let port = ingress.port.number;
        let protocol = Protocol::parse(if ingress.port.protocol.is_empty() {
            &ingress.port.name
        } else {
            &ingress.port.protocol
        });
        let bind = ingress.bind.clone().unwrap_or_else(|| {
            if proxy.interception == Interception::None {
                proxy.ip().to_string()
            } else {
                "0.0.0.0".to_string()
            }
        });
        let name = format!("{bind}_{port}");
        let cluster = inbound_cluster_name(port);
        clusters.push(inbound_cluster(&cluster, target));
        let http = protocol.is_http();
        let filters = |mut rbac_net: Vec<Filter>| -> Vec<Filter> {
            if http {
                vec![inbound_hcm(&name, port, authz::http_filters(&policies))]
            } else {
                rbac_net.push(tcp_proxy(&cluster));
                rbac_net
            }
        };
        let mtls = FilterChain {
            name: format!("{cluster}-mtls"),
            filter_chain_match: Some(FilterChainMatch {
                transport_protocol: "tls".into(),
                ..Default::default()
            }),
            transport_socket: Some(tls::downstream(http)),
            filters: filters(authz::network_filters(&policies)),
            ..Default::default()
        };
        let plaintext = FilterChain {
            name: format!("{cluster}-plaintext"),
            filter_chain_match: Some(FilterChainMatch {
                transport_protocol: "raw_buffer".into(),
                ..Default::default()
            }),
            filters: filters(authz::network_filters(&policies)),
            ..Default::default()
        };
        // A proxy without a proven identity has no certificate to serve TLS with: it gets
        // the plaintext chain, and under STRICT one that refuses everything (never open).
        let secure = proxy.identity.is_some();
        let chains = match (ctx.mtls_mode(proxy, port).mode, secure) {
            (Mtls::Strict, true) => vec![mtls],
            (Mtls::Strict, false) => vec![refuse_all(&cluster)],
            (Mtls::Permissive, true) => vec![mtls, plaintext],
            (Mtls::Permissive, false) | (Mtls::Disable, _) => vec![plaintext],
        };
        let bind_to_port = proxy.interception == Interception::None
            || ingress.capture_mode.as_deref() == Some("NONE");
        listeners.push(Listener {
            name: name.clone(),
            address: Some(socket_address(&bind, port)),
            bind_to_port: Some(BoolValue {
                value: bind_to_port,
            }),
            traffic_direction: TrafficDirection::Inbound as i32,
            listener_filters: vec![ListenerFilter {
                name: "envoy.filters.listener.tls_inspector".into(),
                config_type: Some(listener_filter::ConfigType::TypedConfig(pack_any(
                    TlsInspector::default(),
                ))),
                ..Default::default()
            }],
            listener_filters_timeout: Some(duration(std::time::Duration::ZERO)),
            continue_on_listener_filters_timeout: true,
            filter_chains: chains,
            ..Default::default()
        });
    }
    (listeners, clusters)
}
