//! MeshConfig's access log: a file logger on every listener (for connections no chain
//! takes), connection manager and tcp_proxy, in Istio's text or JSON format.

use envoy_types::pb::envoy::config::accesslog::v3::{AccessLog, access_log, access_log_filter};
use envoy_types::pb::envoy::config::core::v3::{data_source, substitution_format_string::Format};
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
use envoy_types::pb::envoy::extensions::access_loggers::file::v3::{
    FileAccessLog, file_access_log::AccessLogFormat,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use prost::Message;
use serde_json::json;

use super::{context, sidecar};
use crate::translate::access_log::ISTIO_TEXT_FORMAT;
use crate::translate::{ProxyConfig, proxy_config};

/// A mesh ConfigMap with these `mesh` lines, a TCP service and an HTTP one.
fn config(mesh: &str) -> ProxyConfig {
    let yaml = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n{mesh}---\napiVersion: v1\nkind: Service\nmetadata: {{name: db, namespace: shop}}\nspec: {{clusterIP: 10.96.0.50, ports: [{{name: tcp, port: 5432}}]}}\n"
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
        |s: &envoy_types::pb::google::protobuf::Struct, k: &str| format!("{:?}", s.fields[k].kind);
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
