//! Envoy's access log from MeshConfig's `accessLogFile`, `accessLogFormat` and
//! `accessLogEncoding`, as istiod builds it when no Telemetry resource says otherwise
//! (`FileAccessLogFromMeshConfig`): one file logger on every HTTP connection manager and
//! every tcp_proxy, and on every listener for the connections no filter chain takes
//! (response flag `NR`) unless `disableEnvoyListenerLog`.

use envoy_types::pb::envoy::config::accesslog::v3::{
    AccessLog, AccessLogFilter, ResponseFlagFilter, access_log, access_log_filter,
};
use envoy_types::pb::envoy::config::core::v3::{
    DataSource, JsonFormatOptions, SubstitutionFormatString, TypedExtensionConfig,
    data_source::Specifier, substitution_format_string::Format,
};
use envoy_types::pb::envoy::extensions::access_loggers::file::v3::{
    FileAccessLog, file_access_log::AccessLogFormat,
};
use envoy_types::pb::envoy::extensions::formatter::req_without_query::v3::ReqWithoutQuery;
use envoy_types::pb::google::protobuf::Struct;
use envoy_types::util::pack_any;

use crate::model::mesh::MeshConfig;

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

/// The format `accessLogEncoding` and `accessLogFormat` give, and what is wrong with
/// them if anything (field, message): Istio's format of the encoding then applies, as
/// with istiod.
pub fn format_of(mesh: &MeshConfig) -> (Format, Option<(&'static str, String)>) {
    let text = |format: &str| {
        let mut text = if format.is_empty() {
            ISTIO_TEXT_FORMAT.to_string()
        } else {
            format.to_string()
        };
        // "Istio will insert a newline ('\n') on all formats (if missing)."
        if !text.ends_with('\n') {
            text.push('\n');
        }
        Format::TextFormatSource(DataSource {
            specifier: Some(Specifier::InlineString(text)),
            ..Default::default()
        })
    };
    let json = |fields: Vec<(String, serde_json::Value)>| {
        let fields = fields
            .iter()
            .map(|(k, v)| (k.clone(), super::json_value(v)));
        Format::JsonFormat(Struct {
            fields: fields.collect(),
        })
    };
    let istio_json = || {
        let fields = ISTIO_JSON_FORMAT.iter();
        json(
            fields
                .map(|(k, v)| (k.to_string(), v.to_string().into()))
                .collect(),
        )
    };
    let encoding = mesh.access_log_encoding.as_deref().unwrap_or("TEXT");
    match encoding.to_ascii_uppercase().as_str() {
        "TEXT" => (text(&mesh.access_log_format), None),
        "JSON" if mesh.access_log_format.is_empty() => (istio_json(), None),
        "JSON" => match serde_json::from_str::<serde_json::Value>(&mesh.access_log_format) {
            Ok(serde_json::Value::Object(map)) => (json(map.into_iter().collect()), None),
            _ => (
                istio_json(),
                Some((
                    "accessLogFormat",
                    "is not a JSON object of command operators; Istio's JSON format is used".into(),
                )),
            ),
        },
        other => (
            text(""),
            Some((
                "accessLogEncoding",
                format!("{other:?} is neither TEXT nor JSON; TEXT is used"),
            )),
        ),
    }
}

/// Whether the text, or a value of the JSON object, of `format` holds the command
/// operator `op`.
fn uses_operator(format: &Format, op: &str) -> bool {
    use envoy_types::pb::google::protobuf::value::Kind;
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

/// The access logs a mesh asks for: `None` without an `accessLogFile`.
pub struct AccessLogs {
    /// For connection managers and tcp_proxies.
    pub core: AccessLog,
    /// For listeners (connections no chain took); `None` with `disableEnvoyListenerLog`.
    pub listener: Option<AccessLog>,
}

impl AccessLogs {
    pub fn of(mesh: &MeshConfig) -> Option<AccessLogs> {
        if mesh.access_log_file.is_empty() {
            return None;
        }
        let (format, _) = format_of(mesh);
        let needs_formatter = uses_operator(&format, REQ_WITHOUT_QUERY);
        let json = matches!(format, Format::JsonFormat(_));
        let file = FileAccessLog {
            path: mesh.access_log_file.clone(),
            access_log_format: Some(AccessLogFormat::LogFormat(SubstitutionFormatString {
                format: Some(format),
                json_format_options: json.then(JsonFormatOptions::default),
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
        let core = AccessLog {
            name: FILE_ACCESS_LOG.into(),
            filter: None,
            config_type: Some(access_log::ConfigType::TypedConfig(pack_any(file))),
        };
        let listener = (!mesh.disable_envoy_listener_log).then(|| AccessLog {
            // NR: no filter chain took the connection.
            filter: Some(AccessLogFilter {
                filter_specifier: Some(access_log_filter::FilterSpecifier::ResponseFlagFilter(
                    ResponseFlagFilter {
                        flags: vec!["NR".into()],
                    },
                )),
            }),
            ..core.clone()
        });
        Some(AccessLogs { core, listener })
    }
}
