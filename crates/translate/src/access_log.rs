//! Envoy's access logs, as istiod's `AccessLogBuilder` sets them: on every HTTP connection
//! manager and every tcp_proxy, and on every listener for the connections no filter chain
//! takes (response flag `NR`) unless `disableEnvoyListenerLog`.
//!
//! Which logs: with neither a Telemetry resource's `accessLogging` nor MeshConfig
//! `defaultProviders.accessLogging`, MeshConfig's `accessLogFile`, `accessLogFormat` and
//! `accessLogEncoding` (istiod's `FileAccessLogFromMeshConfig`). Otherwise the providers
//! istiod's `mergeLogs` picks for each side of the proxy's traffic (`CLIENT`: outbound and
//! gateways, `SERVER`: inbound): the default providers, replaced by each Telemetry's
//! (root namespace, then the proxy's namespace, then those selecting it), each one
//! `disabled` or given a CEL `filter` by the most specific. A provider is a MeshConfig
//! `extensionProviders` entry with `envoyFileAccessLog` (`path`, `logFormat.text` or
//! `.labels`, `omitEmptyValues`), or the built-in `envoy` (`/dev/stdout` in MeshConfig's
//! format).

use envoy_api::pb::envoy::config::accesslog::v3::{
    AccessLog, AccessLogFilter, ExtensionFilter, ResponseFlagFilter, access_log, access_log_filter,
    extension_filter,
};
use envoy_api::pb::envoy::config::core::v3::{
    DataSource, JsonFormatOptions, SubstitutionFormatString, TypedExtensionConfig,
    data_source::Specifier, substitution_format_string::Format,
};
use std::collections::{BTreeMap, BTreeSet};

use envoy_api::pb::envoy::extensions::access_loggers::file::v3::{
    FileAccessLog, file_access_log::AccessLogFormat,
};
use envoy_api::pb::envoy::extensions::access_loggers::filters::cel::v3::ExpressionFilter;
use envoy_api::pb::envoy::extensions::formatter::req_without_query::v3::ReqWithoutQuery;
use envoy_api::pb::google::protobuf::Struct;
use envoy_api::util::pack_any;

use api::telemetry::AccessLogging;
use model::mesh::{BUILTIN_ACCESS_LOG_PROVIDER, MeshConfig};

/// istiod's text format (`EnvoyTextLogFormat`, Istio 1.9 onwards).
pub const ISTIO_TEXT_FORMAT: &str = concat!(
    "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% ",
    "%PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% ",
    "%RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% ",
    "\"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% ",
    "%DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" ",
    "\"%REQ(USER-AGENT)%\" \"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" ",
    "%UPSTREAM_CLUSTER_RAW% %UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% ",
    "%DOWNSTREAM_REMOTE_ADDRESS% %REQUESTED_SERVER_NAME% %ROUTE_NAME%\n",
);

/// istiod's JSON format (`EnvoyJSONLogFormatIstio`): key, command operator.
const ISTIO_JSON_FORMAT: [(&str, &str); 24] = [
    ("start_time", "%START_TIME%"),
    ("route_name", "%ROUTE_NAME%"),
    ("method", "%REQ(:METHOD)%"),
    ("path", "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"),
    ("protocol", "%PROTOCOL%"),
    ("response_code", "%RESPONSE_CODE%"),
    ("response_flags", "%RESPONSE_FLAGS%"),
    ("response_code_details", "%RESPONSE_CODE_DETAILS%"),
    (
        "connection_termination_details",
        "%CONNECTION_TERMINATION_DETAILS%",
    ),
    ("bytes_received", "%BYTES_RECEIVED%"),
    ("bytes_sent", "%BYTES_SENT%"),
    ("duration", "%DURATION%"),
    (
        "upstream_service_time",
        "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    ),
    ("x_forwarded_for", "%REQ(X-FORWARDED-FOR)%"),
    ("user_agent", "%REQ(USER-AGENT)%"),
    ("request_id", "%REQ(X-REQUEST-ID)%"),
    ("authority", "%REQ(:AUTHORITY)%"),
    ("upstream_host", "%UPSTREAM_HOST%"),
    ("upstream_cluster", "%UPSTREAM_CLUSTER_RAW%"),
    ("upstream_local_address", "%UPSTREAM_LOCAL_ADDRESS%"),
    ("downstream_local_address", "%DOWNSTREAM_LOCAL_ADDRESS%"),
    ("downstream_remote_address", "%DOWNSTREAM_REMOTE_ADDRESS%"),
    ("requested_server_name", "%REQUESTED_SERVER_NAME%"),
    (
        "upstream_transport_failure_reason",
        "%UPSTREAM_TRANSPORT_FAILURE_REASON%",
    ),
];

/// Envoy's name for the file access logger.
const FILE_ACCESS_LOG: &str = "envoy.access_loggers.file";

/// The command operator that needs a formatter extension of its own.
const REQ_WITHOUT_QUERY: &str = "%REQ_WITHOUT_QUERY";

/// The Envoy format of the mesh's access log settings (Istio's when they are wrong).
pub fn format_of(mesh: &MeshConfig) -> Format {
    use model::mesh::AccessLogFormat as MeshLogFormat;
    match mesh.access_log_format().0 {
        MeshLogFormat::Text(text) => text_format(&text),
        MeshLogFormat::Json(map) => json_format(map.iter()),
        MeshLogFormat::IstioJson => istio_json_format(),
    }
}

/// A text format: `format`, or Istio's when empty, ending in a newline ("Istio will
/// insert a newline ('\n') on all formats (if missing)").
fn text_format(format: &str) -> Format {
    let mut text = if format.is_empty() {
        ISTIO_TEXT_FORMAT.to_string()
    } else {
        format.to_string()
    };
    if !text.ends_with('\n') {
        text.push('\n');
    }
    Format::TextFormatSource(DataSource {
        specifier: Some(Specifier::InlineString(text)),
        ..Default::default()
    })
}

/// A JSON format of these keys and command operators.
fn json_format<'a>(fields: impl Iterator<Item = (&'a String, &'a serde_json::Value)>) -> Format {
    Format::JsonFormat(Struct {
        fields: fields
            .map(|(k, v)| (k.clone(), super::json_value(v)))
            .collect(),
    })
}

/// Istio's JSON format.
fn istio_json_format() -> Format {
    let fields: Vec<(String, serde_json::Value)> = (ISTIO_JSON_FORMAT.iter())
        .map(|(k, v)| (k.to_string(), v.to_string().into()))
        .collect();
    json_format(fields.iter().map(|(k, v)| (k, v)))
}

/// Whether the text, or a value of the JSON object, of `format` holds the command
/// operator `op`.
fn uses_operator(format: &Format, op: &str) -> bool {
    use envoy_api::pb::google::protobuf::value::Kind;
    match format {
        Format::TextFormatSource(DataSource {
            specifier: Some(Specifier::InlineString(text)),
            ..
        }) => text.contains(op),
        Format::JsonFormat(s) => (s.fields.values())
            .any(|v| matches!(&v.kind, Some(Kind::StringValue(s)) if s.contains(op))),
        _ => false,
    }
}

/// A proxy's access logs on one side of its traffic.
#[derive(Clone, Default)]
pub struct Side {
    /// For connection managers and tcp_proxies.
    pub core: Vec<AccessLog>,
    /// For listeners (connections no chain took); none with `disableEnvoyListenerLog`.
    pub listener: Vec<AccessLog>,
}

/// The access logs of a proxy's outbound and gateway traffic (`client`) and of its
/// inbound traffic (`server`).
pub struct AccessLogs {
    pub client: Side,
    pub server: Side,
}

/// Envoy's CEL access log filter.
const CEL_FILTER: &str = "envoy.access_loggers.extension_filters.cel";

impl AccessLogs {
    /// What `proxy` logs; `None` when it logs nothing.
    pub fn for_proxy(ctx: &model::PushContext, proxy: &model::Proxy) -> Option<AccessLogs> {
        let mesh = &ctx.mesh;
        let logging = ctx.access_logging_for(proxy);
        let (client, server) =
            if logging.is_empty() && mesh.default_providers.access_logging.is_empty() {
                if mesh.access_log_file.is_empty() {
                    return None;
                }
                let side = side_of(
                    mesh,
                    vec![(mesh_file_log(&mesh.access_log_file, mesh), None)],
                );
                (side.clone(), side)
            } else {
                super::per_side(proxy, |mode| {
                    let logs = (merge_logs(&logging, mesh, mode).into_iter())
                        .filter_map(|(name, filter)| Some((provider_log(mesh, &name)?, filter?)));
                    side_of(mesh, logs.collect())
                })
            };
        (!client.core.is_empty() || !server.core.is_empty())
            .then_some(AccessLogs { client, server })
    }

    /// The side a listener of `direction` logs (gateways log `client` on both).
    pub fn side(&self, direction: i32) -> &Side {
        if super::is_inbound(direction) {
            &self.server
        } else {
            &self.client
        }
    }
}

/// Each log with its CEL filter expression (if any), for managers and tcp_proxies, and
/// each again for listeners, there only for connections no chain took.
fn side_of(mesh: &MeshConfig, logs: Vec<(AccessLog, Option<String>)>) -> Side {
    let mut side = Side::default();
    for (log, expression) in logs {
        if !mesh.disable_envoy_listener_log {
            side.listener.push(AccessLog {
                // NR: no filter chain took the connection.
                filter: Some(AccessLogFilter {
                    filter_specifier: Some(access_log_filter::FilterSpecifier::ResponseFlagFilter(
                        ResponseFlagFilter {
                            flags: vec!["NR".into()],
                        },
                    )),
                }),
                ..log.clone()
            });
        }
        let filter = expression.map(|expression| AccessLogFilter {
            filter_specifier: Some(access_log_filter::FilterSpecifier::ExtensionFilter(
                ExtensionFilter {
                    name: CEL_FILTER.into(),
                    config_type: Some(extension_filter::ConfigType::TypedConfig(pack_any(
                        ExpressionFilter {
                            expression,
                            ..Default::default()
                        },
                    ))),
                },
            )),
        });
        side.core.push(AccessLog { filter, ..log });
    }
    side
}

/// The providers istiod's `mergeLogs` leaves for `mode` (`CLIENT` or `SERVER`), by name:
/// `Some(filter expression)` for those that log, `None` for those disabled.
fn merge_logs(
    logging: &[&[AccessLogging]],
    mesh: &MeshConfig,
    mode: &str,
) -> BTreeMap<String, Option<Option<String>>> {
    let defaults = &mesh.default_providers.access_logging;
    let mut providers: BTreeMap<String, Option<Option<String>>> = BTreeMap::new();
    if logging.is_empty() {
        for name in defaults {
            providers.insert(name.clone(), Some(None));
        }
        return providers;
    }
    let fits = |l: &AccessLogging| api::telemetry::applies(&l.r#match, mode);
    let names =
        |l: &AccessLogging| -> Vec<String> { l.providers.iter().map(|p| p.name.clone()).collect() };
    // The providers in scope: the most specific resource's that names any for this mode.
    let mut in_scope: BTreeSet<String> = defaults.iter().cloned().collect();
    let mut filters: BTreeMap<String, Option<String>> = BTreeMap::new();
    for list in logging {
        let mut named = BTreeSet::new();
        for l in list.iter().filter(|l| fits(l)) {
            for name in names(l) {
                filters.insert(
                    name.clone(),
                    l.filter.as_ref().map(|f| f.expression.clone()),
                );
                named.insert(name);
            }
        }
        if !named.is_empty() {
            in_scope = named;
        }
    }
    let mut parent = defaults.clone();
    for list in logging {
        for l in list.iter() {
            let mut own = names(l);
            if own.is_empty() {
                own = parent.clone();
            }
            parent = own.clone();
            if !fits(l) {
                continue;
            }
            for name in own.into_iter().filter(|n| in_scope.contains(n)) {
                let spec = if l.disabled == Some(true) {
                    None
                } else {
                    Some(filters.get(&name).cloned().flatten())
                };
                providers.insert(name, spec);
            }
        }
    }
    providers
}

/// The access log of the provider `name`, if it is an Envoy file logger.
fn provider_log(mesh: &MeshConfig, name: &str) -> Option<AccessLog> {
    let provider = mesh.extension_provider(name)?;
    let file = provider.envoy_file_access_log.as_ref()?;
    let path = if file.path.is_empty() {
        "/dev/stdout"
    } else {
        &file.path
    };
    // The built-in provider without a format of its own takes MeshConfig's.
    let builtin = provider.name == BUILTIN_ACCESS_LOG_PROVIDER;
    if builtin && file.log_format.is_none() && !file.omit_empty_values {
        return Some(mesh_file_log(path, mesh));
    }
    let labels = (file.log_format.as_ref()).and_then(|f| f.labels.as_ref());
    let format = match labels {
        Some(labels) if !labels.is_empty() => json_format(labels.iter()),
        Some(_) => istio_json_format(),
        None => {
            let text = file.log_format.as_ref().and_then(|f| f.text.as_deref());
            text_format(text.unwrap_or(""))
        }
    };
    Some(file_log(path, format, file.omit_empty_values))
}

/// MeshConfig's file log at `path`, in its `accessLogFormat` and `accessLogEncoding`.
fn mesh_file_log(path: &str, mesh: &MeshConfig) -> AccessLog {
    file_log(path, format_of(mesh), false)
}

/// Envoy's file logger writing `format` to `path`.
fn file_log(path: &str, format: Format, omit_empty_values: bool) -> AccessLog {
    let needs_formatter = uses_operator(&format, REQ_WITHOUT_QUERY);
    let json = matches!(format, Format::JsonFormat(_));
    let file = FileAccessLog {
        path: path.to_string(),
        access_log_format: Some(AccessLogFormat::LogFormat(SubstitutionFormatString {
            format: Some(format),
            json_format_options: json.then(JsonFormatOptions::default),
            omit_empty_values,
            formatters: if needs_formatter {
                vec![TypedExtensionConfig {
                    name: "envoy.formatter.req_without_query".into(),
                    typed_config: Some(pack_any(ReqWithoutQuery::default())),
                }]
            } else {
                Vec::new()
            },
            ..Default::default()
        })),
    };
    AccessLog {
        name: FILE_ACCESS_LOG.into(),
        filter: None,
        config_type: Some(access_log::ConfigType::TypedConfig(pack_any(file))),
    }
}
