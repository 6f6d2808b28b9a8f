//! Envoy's bootstrap, as pilot-agent writes it in spirit: the node (Istio id and metadata),
//! ADS to meshd's secure port over mutual TLS with the workload certificate, and the SDS
//! cluster on the agent's Unix socket. Envoy never reads a key from disk.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use translate::tls::{ROOT_SECRET, SDS_CLUSTER, WORKLOAD_SECRET};

/// What the bootstrap says.
#[derive(Clone, Debug)]
pub struct BootstrapOptions {
    pub node_id: String,
    pub metadata: serde_json::Map<String, Value>,
    /// meshd's secure xDS address, `HOST:PORT`.
    pub xds_host: String,
    pub xds_port: u16,
    /// The name meshd's serving certificate carries (SNI and SAN check).
    pub xds_server_name: String,
    pub sds_socket: String,
    pub admin_port: u16,
    /// DELTA_GRPC (`ISTIO_DELTA_XDS`, Istio's default) or GRPC.
    pub delta: bool,
    /// The agent's status port: with it, Envoy serves Istio's two fixed listeners,
    /// 15021 (`/healthz/ready`, answered by the agent) and 15090 (`/stats/prometheus`,
    /// Envoy's own metrics).
    pub status_port: Option<u16>,
}

/// A listener on `0.0.0.0:port` sending requests under `prefix` to `cluster`.
fn http_listener(name: &str, port: u16, prefix: &str, cluster: &str) -> Value {
    json!({
        "name": name,
        "address": {"socket_address": {"protocol": "TCP", "address": "0.0.0.0", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "codec_type": "AUTO",
                "stat_prefix": name,
                "route_config": {"virtual_hosts": [{
                    "name": "backend",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": prefix}, "route": {"cluster": cluster}}]
                }]},
                "http_filters": [{
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
                }]
            }
        }]}]
    })
}

/// A cluster of one address on localhost.
fn local_cluster(name: &str, port: u16) -> Value {
    json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "0.250s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]
        }
    })
}

fn sds(name: &str) -> Value {
    json!({
        "name": name,
        "sds_config": {
            "api_config_source": {
                "api_type": "GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": true,
                "grpc_services": [{"envoy_grpc": {"cluster_name": SDS_CLUSTER}}]
            },
            "initial_fetch_timeout": "0s",
            "resource_api_version": "V3"
        }
    })
}

/// The xDS connection's TLS: the workload certificate and the root bundle from SDS, and
/// meshd's serving certificate checked by its DNS name.
fn xds_tls_context(server_name: &str) -> Value {
    json!({
        "common_tls_context": {
            "tls_params": {"tls_minimum_protocol_version": "TLSv1_2", "tls_maximum_protocol_version": "TLSv1_3"},
            "alpn_protocols": ["h2"],
            "tls_certificate_sds_secret_configs": [sds(WORKLOAD_SECRET)],
            "combined_validation_context": {
                "default_validation_context": {
                    "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": server_name}}]
                },
                "validation_context_sds_secret_config": sds(ROOT_SECRET)
            }
        },
        "sni": server_name
    })
}

/// Istio's bootstrap `stats_config` tags, and only those: its dashboards and alerts read
/// the cluster and connection manager of a statistic from the `cluster_name` and
/// `http_conn_manager_prefix` tags, each ending at the `;` istiod (and meshd) put after
/// those names. Istio's `stats_matcher` is left out: meshd's proxies keep every statistic.
fn stats_config() -> Value {
    let tags = [
        ("cluster_name", r"^cluster(\.(.+);)"),
        (
            "http_conn_manager_prefix",
            r"^http\.(((?:[_.[:digit:]\w]*|[_\[\]aAbBcCdDeEfF[:digit:]\w\:]*));\.)",
        ),
        ("thread_name", r"^server(\.(.+))\.watchdog"),
        ("tcp_prefix", r"^tcp\.((.*?)\.)\w+?$"),
        ("response_code", r"_rq(_(\d{3}))$"),
        ("response_code_class", r"_rq(_(\dxx))$"),
        (
            "http_conn_manager_listener_prefix",
            r"^listener(?=\.).*?\.http\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)",
        ),
        (
            "listener_address",
            r"^listener\.(((?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*))\.)",
        ),
        (
            "mongo_prefix",
            r"^mongo\.(.+?)\.(collection|cmd|cx_|op_|delays_|decoding_)(.*?)$",
        ),
        ("cache", r"(cache\.(.+?)\.)"),
        ("component", r"(component\.(.+?)\.)"),
        ("tag", r"(tag\.(.+?);\.)"),
        ("wasm_filter", r"(wasm_filter\.(.+?)\.)"),
        ("authz_enforce_result", r"rbac(\.(allowed|denied))"),
        ("authz_dry_run_action", r"(\.istio_dry_run_(allow|deny)_)"),
        ("authz_dry_run_result", r"(\.shadow_(allowed|denied))"),
    ];
    let tags: Vec<Value> = (tags.iter())
        .map(|(name, regex)| json!({"tag_name": name, "regex": regex}))
        .collect();
    json!({"use_all_default_tags": false, "stats_tags": tags})
}

pub fn render(o: &BootstrapOptions) -> Value {
    let mut xds_tls = xds_tls_context(&o.xds_server_name);
    xds_tls["@type"] =
        "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext".into();
    let h2 = json!({
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}
        }
    });
    let ads_source =
        json!({"ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"});
    let metadata: BTreeMap<&String, &Value> = o.metadata.iter().collect();
    let mut bootstrap = json!({
        "node": {"id": o.node_id, "cluster": "meshd", "metadata": metadata},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": o.admin_port}}},
        "stats_config": stats_config(),
        "dynamic_resources": {
            "ads_config": {
                "api_type": if o.delta { "DELTA_GRPC" } else { "GRPC" },
                "transport_api_version": "V3",
                "set_node_on_first_message_only": true,
                "grpc_services": [{"envoy_grpc": {"cluster_name": "xds-grpc"}}]
            },
            "cds_config": ads_source,
            "lds_config": ads_source
        },
        "static_resources": {
            "clusters": [
                {
                    "name": "xds-grpc",
                    "type": "STRICT_DNS",
                    "connect_timeout": "1s",
                    "typed_extension_protocol_options": h2,
                    "load_assignment": {
                        "cluster_name": "xds-grpc",
                        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": o.xds_host, "port_value": o.xds_port}}}}]}]
                    },
                    "transport_socket": {
                        "name": "envoy.transport_sockets.tls",
                        "typed_config": xds_tls
                    }
                },
                {
                    "name": SDS_CLUSTER,
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "typed_extension_protocol_options": h2,
                    "load_assignment": {
                        "cluster_name": SDS_CLUSTER,
                        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": o.sds_socket}}}}]}]
                    }
                }
            ]
        }
    });
    if let Some(status_port) = o.status_port {
        let resources = &mut bootstrap["static_resources"];
        resources["listeners"] = json!([
            http_listener("stats", 15090, "/stats/prometheus", "prometheus_stats"),
            http_listener("agent", 15021, "/healthz/ready", "agent"),
        ]);
        let clusters = resources["clusters"].as_array_mut().expect("a list");
        clusters.push(local_cluster("prometheus_stats", o.admin_port));
        clusters.push(local_cluster("agent", status_port));
    }
    bootstrap
}
