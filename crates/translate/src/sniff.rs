//! Protocol sniffing, as istiod sets it up for a port whose protocol is not declared (a
//! port name or `appProtocol` without a known prefix): Envoy's HTTP inspector reads the
//! first bytes of a plaintext connection, and a filter chain matching the HTTP
//! application protocols it reports takes HTTP; every other connection takes the TCP
//! chains. Over mutual TLS the inspector cannot read the bytes, so a client marks HTTP by
//! the ALPN it offers (`istio-http/1.0`, `istio-http/1.1`, `istio-h2`, istiod's
//! `mtlsHTTPALPNs`), and the server matches on it.
//!
//! istiod's client sets that ALPN with its own `istio.alpn` HTTP filter, which stock Envoy
//! lacks. A sniffed listener's connection manager here sets Envoy's well-known filter state
//! `envoy.network.application_protocols` instead, which the router hands to the upstream
//! TLS handshake as its ALPN.

use envoy_api::pb::envoy::config::core::v3::{
    DataSource, SubstitutionFormatString, data_source, substitution_format_string,
};
use envoy_api::pb::envoy::config::listener::v3::ListenerFilter;
use envoy_api::pb::envoy::extensions::filters::common::set_filter_state::v3::{
    FilterStateValue, filter_state_value,
};
use envoy_api::pb::envoy::extensions::filters::http::set_filter_state::v3::Config as SetFilterState;
use envoy_api::pb::envoy::extensions::filters::listener::http_inspector::v3::HttpInspector;
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter,
};
use envoy_api::util::pack_any;

/// What the HTTP inspector reports for plaintext HTTP (istiod's `plaintextHTTPALPNs`,
/// without HTTP/1.0, which istiod matches only with `PILOT_HTTP10`).
pub const PLAINTEXT_HTTP_ALPNS: [&str; 2] = ["http/1.1", "h2c"];

/// The ALPN a mesh client offers for HTTP over mutual TLS (istiod's `mtlsHTTPALPNs`).
pub const MTLS_HTTP_ALPNS: [&str; 3] = ["istio-http/1.0", "istio-http/1.1", "istio-h2"];

/// Every ALPN a mesh client offers over mutual TLS (istiod's `allIstioMtlsALPNs`): what
/// tells a mesh client's TLS from a client's own under PERMISSIVE.
pub const ALL_MTLS_ALPNS: [&str; 5] = [
    "istio",
    "istio-peer-exchange",
    "istio-http/1.0",
    "istio-http/1.1",
    "istio-h2",
];

/// The ALPN a mesh client offers for TCP over mutual TLS (istiod's `mtlsTCPWithMxcALPNs`).
pub const MTLS_TCP_ALPNS: [&str; 2] = ["istio-peer-exchange", "istio"];

/// The well-known filter state object the router reads the upstream ALPN from.
const APPLICATION_PROTOCOLS: &str = "envoy.network.application_protocols";

/// How long a sniffing listener's inspectors wait for the client's first bytes before
/// the connection is served as TCP: MeshConfig `protocolDetectionTimeout` (0s, the
/// default: no limit, so a server-first protocol needs a named port). An unparsable value
/// is 0s (validation refuses it).
pub fn detection_timeout(mesh: &model::mesh::MeshConfig) -> std::time::Duration {
    (mesh.protocol_detection_timeout.as_deref())
        .and_then(|t| api::duration::parse(t).ok())
        .unwrap_or_default()
}

pub fn http_inspector() -> ListenerFilter {
    let config = HttpInspector::default();
    crate::listener::listener_filter("envoy.filters.listener.http_inspector", config)
}

/// The HTTP filter of a sniffed listener's connection manager that makes its requests'
/// upstream TLS offer [`MTLS_HTTP_ALPNS`], so the server's sniffed port serves them as
/// HTTP (the part of istiod's `istio.alpn` a sniffed port needs).
pub fn mtls_http_alpn_filter() -> HttpFilter {
    let value = FilterStateValue {
        key: Some(filter_state_value::Key::ObjectKey(
            APPLICATION_PROTOCOLS.into(),
        )),
        value: Some(filter_state_value::Value::FormatString(
            SubstitutionFormatString {
                format: Some(substitution_format_string::Format::TextFormatSource(
                    DataSource {
                        specifier: Some(data_source::Specifier::InlineString(
                            MTLS_HTTP_ALPNS.join(","),
                        )),
                        ..Default::default()
                    },
                )),
                ..Default::default()
            },
        )),
        shared_with_upstream: filter_state_value::SharedWithUpstream::Once as i32,
        ..Default::default()
    };
    HttpFilter {
        name: "envoy.filters.http.set_filter_state".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
            SetFilterState {
                on_request_headers: vec![value],
                clear_route_cache: false,
            },
        ))),
        ..Default::default()
    }
}

/// `names` as owned strings, for a filter chain match.
pub fn alpns(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}
