//! Access logs: a file logger on every listener (for connections no chain takes),
//! connection manager and tcp_proxy, from MeshConfig's `accessLogFile` in Istio's text or
//! JSON format, or from the providers MeshConfig's `defaultProviders` and Telemetry
//! resources choose for each side of the proxy's traffic.

use envoy_api::pb::envoy::config::accesslog::v3::{AccessLog, access_log, access_log_filter};
use envoy_api::pb::envoy::config::core::v3::{
    TrafficDirection, data_source, substitution_format_string::Format,
};
use envoy_api::pb::envoy::config::listener::v3::filter::ConfigType;
use envoy_api::pb::envoy::extensions::access_loggers::file::v3::{
    FileAccessLog, file_access_log::AccessLogFormat,
};
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_api::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use prost::Message;
use serde_json::json;

use super::{context, sidecar};
use crate::access_log::ISTIO_TEXT_FORMAT;
use crate::{ProxyConfig, proxy_config};

/// A mesh ConfigMap with these `mesh` lines, a TCP service and an HTTP one.
fn config(mesh: &str) -> ProxyConfig {
    config_with(mesh, "")
}

/// [`config`] with more objects (`extra`, ending in a newline, or empty).
fn config_with(mesh: &str, extra: &str) -> ProxyConfig {
    let yaml = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n{mesh}---\napiVersion: v1\nkind: Service\nmetadata: {{name: db, namespace: shop}}\nspec: {{clusterIP: 10.96.0.50, ports: [{{name: tcp, port: 5432}}]}}\n{extra}"
    );
    proxy_config(&context(&yaml), &sidecar("shop", json!({"app": "web"})))
}

/// Every access log of the configuration: the listeners', then those of each connection
/// manager and tcp_proxy, decoded.
fn logs(cfg: &ProxyConfig) -> (Vec<&AccessLog>, Vec<Vec<AccessLog>>) {
    let listeners = cfg.listeners.iter().flat_map(|l| &l.access_log).collect();
    let mut filters = Vec::new();
    let chains = cfg.listeners.iter().flat_map(|l| {
        l.filter_chains
            .iter()
            .chain(l.default_filter_chain.as_ref())
    });
    for f in chains.flat_map(|c| &c.filters) {
        let Some(ConfigType::TypedConfig(any)) = &f.config_type else {
            continue;
        };
        match f.name.as_str() {
            "envoy.filters.network.http_connection_manager" => {
                let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
                filters.push(hcm.access_log);
            }
            "envoy.filters.network.tcp_proxy" => {
                let tp = TcpProxy::decode(any.value.as_slice()).unwrap();
                filters.push(tp.access_log);
            }
            _ => {}
        }
    }
    (listeners, filters)
}

fn file(log: &AccessLog) -> FileAccessLog {
    assert_eq!(log.name, "envoy.access_loggers.file");
    let Some(access_log::ConfigType::TypedConfig(any)) = &log.config_type else {
        panic!("{log:?}")
    };
    FileAccessLog::decode(any.value.as_slice()).unwrap()
}

fn format(log: &AccessLog) -> Format {
    let Some(AccessLogFormat::LogFormat(f)) = file(log).access_log_format else {
        panic!("{log:?}")
    };
    f.format.unwrap()
}

fn text(log: &AccessLog) -> String {
    match format(log) {
        Format::TextFormatSource(s) => match s.specifier {
            Some(data_source::Specifier::InlineString(t)) => t,
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

#[test]
fn without_an_access_log_file_nothing_logs() {
    let cfg = config("");
    let (listeners, filters) = logs(&cfg);
    assert!(listeners.is_empty());
    assert!(!filters.is_empty() && filters.iter().all(Vec::is_empty));
}

#[test]
fn every_listener_connection_manager_and_tcp_proxy_logs_in_istios_text_format() {
    let cfg = config("    accessLogFile: /dev/stdout\n");
    let (listeners, per_filter) = logs(&cfg);
    assert_eq!(listeners.len(), cfg.listeners.len());
    // The TCP service's tcp_proxy, a connection manager, the passthrough's: one each.
    assert!(per_filter.len() >= 3, "{per_filter:?}");
    assert!(
        per_filter.iter().all(|logs| logs.len() == 1),
        "{per_filter:?}"
    );
    let filters: Vec<AccessLog> = per_filter.into_iter().flatten().collect();
    for log in listeners.iter().copied().chain(&filters) {
        assert_eq!(file(log).path, "/dev/stdout");
        assert_eq!(text(log), ISTIO_TEXT_FORMAT);
    }
    // A listener logs only connections no filter chain took.
    let Some(access_log_filter::FilterSpecifier::ResponseFlagFilter(f)) =
        (listeners[0].filter.as_ref()).and_then(|f| f.filter_specifier.clone())
    else {
        panic!("{:?}", listeners[0])
    };
    assert_eq!(f.flags, ["NR"]);
    assert!(filters.iter().all(|l| l.filter.is_none()));
    let quiet = config("    accessLogFile: /dev/stdout\n    disableEnvoyListenerLog: true\n");
    assert!(logs(&quiet).0.is_empty());
}

#[test]
fn a_format_of_ones_own_gets_a_newline_and_json_its_fields() {
    let cfg = config(
        "    accessLogFile: /tmp/a.log\n    accessLogFormat: '%REQ_WITHOUT_QUERY(:PATH)% %RESPONSE_CODE%'\n",
    );
    let filters = &logs(&cfg).1[0];
    assert_eq!(
        text(&filters[0]),
        "%REQ_WITHOUT_QUERY(:PATH)% %RESPONSE_CODE%\n"
    );
    let Some(AccessLogFormat::LogFormat(f)) = file(&filters[0]).access_log_format else {
        panic!()
    };
    let formatters: Vec<&str> = f.formatters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(formatters, ["envoy.formatter.req_without_query"]);

    let istio_json = config("    accessLogFile: /dev/stdout\n    accessLogEncoding: JSON\n");
    let Format::JsonFormat(s) = format(&logs(&istio_json).1[0][0]) else {
        panic!()
    };
    assert_eq!(s.fields.len(), 24);
    let json_of =
        |s: &envoy_api::pb::google::protobuf::Struct, k: &str| format!("{:?}", s.fields[k].kind);
    assert!(json_of(&s, "upstream_cluster").contains("%UPSTREAM_CLUSTER_RAW%"));
    let own = config(
        "    accessLogFile: /dev/stdout\n    accessLogEncoding: JSON\n    accessLogFormat: '{\"code\": \"%RESPONSE_CODE%\", \"to\": \"%UPSTREAM_HOST%\"}'\n",
    );
    let Format::JsonFormat(s) = format(&logs(&own).1[0][0]) else {
        panic!()
    };
    let mut keys: Vec<&String> = s.fields.keys().collect();
    keys.sort();
    assert_eq!(keys, ["code", "to"]);
}

fn telemetry(name: &str, namespace: &str, spec: &str) -> String {
    format!(
        "---\napiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec: {spec}\n"
    )
}

/// The paths the connection managers and tcp_proxies of listeners of `direction` log
/// to (each filter's, joined by `+`), and whether any listener of it logs itself.
fn paths(cfg: &ProxyConfig, direction: TrafficDirection) -> (Vec<String>, bool) {
    let of_direction = ProxyConfig {
        listeners: (cfg.listeners.iter())
            .filter(|l| l.traffic_direction == direction as i32)
            .cloned()
            .collect(),
        ..Default::default()
    };
    let (listener_logs, filters) = logs(&of_direction);
    let mut out: Vec<String> = (filters.iter())
        .map(|f| f.iter().map(|l| file(l).path).collect::<Vec<_>>().join("+"))
        .collect();
    out.sort();
    out.dedup();
    (out, !listener_logs.is_empty())
}

#[test]
fn default_providers_log_without_an_access_log_file() {
    let cfg = config("    defaultProviders: {accessLogging: [envoy]}\n");
    let (listener_logs, filters) = logs(&cfg);
    assert!(!listener_logs.is_empty());
    assert!(filters.iter().all(|f| f.len() == 1), "{filters:?}");
    // The built-in provider writes MeshConfig's format to standard output.
    assert_eq!(file(&filters[0][0]).path, "/dev/stdout");
    assert_eq!(text(&filters[0][0]), ISTIO_TEXT_FORMAT);
    // An unknown provider logs nothing; neither does one that is not a logger.
    let cfg = config("    defaultProviders: {accessLogging: [nowhere]}\n");
    assert!(logs(&cfg).1.iter().all(Vec::is_empty));
}

#[test]
fn telemetry_resources_choose_providers_per_side_and_namespace() {
    let mesh = "    accessLogFile: /var/log/legacy\n    extensionProviders:\n    - name: json-log\n      envoyFileAccessLog:\n        path: /var/log/json\n        logFormat: {labels: {code: '%RESPONSE_CODE%'}}\n";
    // A mesh-wide Telemetry takes over from accessLogFile.
    let root = telemetry(
        "mesh",
        "istio-system",
        "{accessLogging: [{providers: [{name: json-log}]}]}",
    );
    let cfg = config_with(mesh, &root);
    assert_eq!(paths(&cfg, TrafficDirection::Outbound).0, ["/var/log/json"]);
    assert_eq!(paths(&cfg, TrafficDirection::Inbound).0, ["/var/log/json"]);
    let (_, filters) = logs(&cfg);
    match format(&filters[0][0]) {
        Format::JsonFormat(f) => assert_eq!(f.fields.keys().collect::<Vec<_>>(), ["code"]),
        other => panic!("{other:?}"),
    }
    // The namespace's resource logs its server side only, with the built-in provider
    // too; the client side keeps the mesh's.
    let shop = telemetry(
        "shop",
        "shop",
        "{accessLogging: [{match: {mode: SERVER}, providers: [{name: envoy}, {name: json-log}]}]}",
    );
    let cfg = config_with(mesh, &format!("{root}{shop}"));
    assert_eq!(
        paths(&cfg, TrafficDirection::Inbound).0,
        ["/dev/stdout+/var/log/json"]
    );
    assert_eq!(paths(&cfg, TrafficDirection::Outbound).0, ["/var/log/json"]);
    // A workload's resource disables what it inherits.
    let off = telemetry(
        "web",
        "shop",
        "{selector: {matchLabels: {app: web}}, accessLogging: [{disabled: true}]}",
    );
    let cfg = config_with(mesh, &format!("{root}{off}"));
    assert_eq!(
        paths(&cfg, TrafficDirection::Outbound),
        (vec![String::new()], false)
    );
    // Another workload's resource does not apply.
    let other = off.replace("app: web", "app: db");
    let cfg = config_with(mesh, &format!("{root}{other}"));
    assert_eq!(paths(&cfg, TrafficDirection::Outbound).0, ["/var/log/json"]);
}

#[test]
fn a_telemetry_filter_is_a_cel_filter_and_listeners_log_unrouted_connections_only() {
    use envoy_api::pb::envoy::config::accesslog::v3::extension_filter;
    use envoy_api::pb::envoy::extensions::access_loggers::filters::cel::v3::ExpressionFilter;
    let root = telemetry(
        "mesh",
        "istio-system",
        "{accessLogging: [{providers: [{name: envoy}], filter: {expression: 'response.code >= 400'}}]}",
    );
    let cfg = config_with("    enableTracing: true\n", &root);
    let (listener_logs, filters) = logs(&cfg);
    let Some(access_log_filter::FilterSpecifier::ExtensionFilter(f)) =
        &filters[0][0].filter.as_ref().unwrap().filter_specifier
    else {
        panic!("{:?}", filters[0][0])
    };
    assert_eq!(f.name, "envoy.access_loggers.extension_filters.cel");
    let Some(extension_filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        panic!()
    };
    let cel = ExpressionFilter::decode(any.value.as_slice()).unwrap();
    assert_eq!(cel.expression, "response.code >= 400");
    assert!(matches!(
        &listener_logs[0].filter.as_ref().unwrap().filter_specifier,
        Some(access_log_filter::FilterSpecifier::ResponseFlagFilter(r)) if r.flags == ["NR"]
    ));
}
