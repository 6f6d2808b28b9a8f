//! ProxyConfig `proxyHeaders`: which headers a proxy's connection managers add, keep or
//! drop. A proxy reads it from the `PROXY_CONFIG` its agent sends in the node metadata,
//! or, without one, from MeshConfig `defaultConfig` (istiod's `ProxyConfigOrDefault`).

use serde::Serialize;
use serde_json::{Map, Value};

use crate::topology::{ForwardClientCertDetails, ProxyConfigError, field, forward};

/// ProxyConfig `proxyHeaders`, each field as written (`None`: Istio's default).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct ProxyHeaders {
    /// `forwardedClientCert`: a sidecar's inbound `x-forwarded-client-cert` handling.
    pub forwarded_client_cert: ForwardClientCertDetails,
    /// `server.disabled`: the `server` header is passed through as the application set it.
    pub server_disabled: bool,
    /// `server.value`: the `server` header's value.
    pub server_value: Option<String>,
    /// `requestId.disabled`: no `x-request-id` is generated.
    pub request_id_disabled: bool,
    /// `attemptCount.disabled`: no `x-envoy-attempt-count` (set in virtual hosts).
    pub attempt_count_disabled: bool,
    /// `envoyDebugHeaders.disabled`: no `x-envoy-*` debug headers.
    pub envoy_debug_headers_disabled: bool,
    /// `metadataExchangeHeaders.mode: IN_MESH`: Istio's peer metadata headers only to
    /// destinations in the mesh.
    pub metadata_exchange_in_mesh: bool,
    /// `setCurrentClientCertDetails`: (subject, cert, chain, dns, uri) as written.
    pub client_cert_details: [Option<bool>; 5],
    /// `xForwardedPort.enabled`: `x-forwarded-port` is appended.
    pub x_forwarded_port: bool,
    /// `xForwardedHost.enabled`: `x-forwarded-host` is appended (set in route actions).
    pub x_forwarded_host: bool,
}

impl ProxyHeaders {
    /// Reads a ProxyConfig's `proxyHeaders` as proto JSON writes it; `None` when absent.
    pub fn from_proxy_config(
        proxy_config: &Map<String, Value>,
    ) -> Result<Option<ProxyHeaders>, ProxyConfigError> {
        let Some(value) = field(proxy_config, "proxyHeaders", "proxy_headers") else {
            return Ok(None);
        };
        let fields = object(value, "proxyHeaders")?;
        let mut h = ProxyHeaders::default();
        if let Some(v) = field(fields, "forwardedClientCert", "forwarded_client_cert") {
            h.forwarded_client_cert = forward(v).ok_or_else(|| ProxyConfigError {
                field: "proxyHeaders.forwardedClientCert".into(),
                reason: format!("{v} is not a ForwardClientCertDetails"),
            })?;
        }
        let flag =
            |name: &'static str, snake: &str, inner: &str| -> Result<bool, ProxyConfigError> {
                let Some(v) = field(fields, name, snake) else {
                    return Ok(false);
                };
                let o = object(v, &format!("proxyHeaders.{name}"))?;
                let path = || format!("proxyHeaders.{name}.{inner}");
                Ok(boolean(field(o, inner, inner), path)? == Some(true))
            };
        h.server_disabled = flag("server", "server", "disabled")?;
        h.request_id_disabled = flag("requestId", "request_id", "disabled")?;
        h.attempt_count_disabled = flag("attemptCount", "attempt_count", "disabled")?;
        h.envoy_debug_headers_disabled =
            flag("envoyDebugHeaders", "envoy_debug_headers", "disabled")?;
        h.x_forwarded_port = flag("xForwardedPort", "x_forwarded_port", "enabled")?;
        h.x_forwarded_host = flag("xForwardedHost", "x_forwarded_host", "enabled")?;
        if let Some(server) = field(fields, "server", "server") {
            match field(object(server, "proxyHeaders.server")?, "value", "value") {
                None => {}
                Some(Value::String(s)) => {
                    h.server_value = Some(s.clone()).filter(|s| !s.is_empty())
                }
                Some(other) => {
                    return Err(ProxyConfigError {
                        field: "proxyHeaders.server.value".into(),
                        reason: format!("{other} is not a string"),
                    });
                }
            }
        }
        let mx = field(
            fields,
            "metadataExchangeHeaders",
            "metadata_exchange_headers",
        );
        if let Some(mx) = mx {
            let mode = field(
                object(mx, "proxyHeaders.metadataExchangeHeaders")?,
                "mode",
                "mode",
            );
            h.metadata_exchange_in_mesh = match mode {
                None => false,
                Some(Value::String(m)) if m == "UNDEFINED" => false,
                Some(Value::String(m)) if m == "IN_MESH" => true,
                Some(Value::Number(n)) if n.as_u64() == Some(0) => false,
                Some(Value::Number(n)) if n.as_u64() == Some(1) => true,
                Some(other) => {
                    return Err(ProxyConfigError {
                        field: "proxyHeaders.metadataExchangeHeaders.mode".into(),
                        reason: format!("{other} is not UNDEFINED or IN_MESH"),
                    });
                }
            };
        }
        let details = field(
            fields,
            "setCurrentClientCertDetails",
            "set_current_client_cert_details",
        );
        if let Some(details) = details {
            let d = object(details, "proxyHeaders.setCurrentClientCertDetails")?;
            for (i, name) in ["subject", "cert", "chain", "dns", "uri"]
                .iter()
                .enumerate()
            {
                let path = || format!("proxyHeaders.setCurrentClientCertDetails.{name}");
                h.client_cert_details[i] = boolean(field(d, name, name), path)?;
            }
        }
        Ok(Some(h))
    }
}

/// `v` as a boolean if present, else an error naming it by `path`.
fn boolean(v: Option<&Value>, path: impl Fn() -> String) -> Result<Option<bool>, ProxyConfigError> {
    match v {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(ProxyConfigError {
            field: path(),
            reason: format!("{other} is not a boolean"),
        }),
    }
}

/// `v` as an object, else an error naming it by `path`.
fn object<'a>(v: &'a Value, path: &str) -> Result<&'a Map<String, Value>, ProxyConfigError> {
    v.as_object().ok_or_else(|| ProxyConfigError {
        field: path.to_string(),
        reason: format!("{v} is not an object"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(v: Value) -> Result<Option<ProxyHeaders>, ProxyConfigError> {
        ProxyHeaders::from_proxy_config(v.as_object().unwrap())
    }

    #[test]
    fn proxy_headers_read_as_proto_json_writes_them() {
        assert_eq!(read(json!({})), Ok(None));
        let h = read(json!({"proxyHeaders": {
            "forwardedClientCert": "SANITIZE",
            "server": {"disabled": true, "value": "edge"},
            "requestId": {"disabled": true},
            "envoyDebugHeaders": {"disabled": true},
            "metadataExchangeHeaders": {"mode": "IN_MESH"},
            "setCurrentClientCertDetails": {"cert": true, "dns": false},
            "xForwardedPort": {"enabled": true}
        }}))
        .unwrap()
        .unwrap();
        assert_eq!(h.forwarded_client_cert, ForwardClientCertDetails::Sanitize);
        assert!(h.server_disabled && h.request_id_disabled && h.envoy_debug_headers_disabled);
        assert_eq!(h.server_value.as_deref(), Some("edge"));
        assert!(h.metadata_exchange_in_mesh && h.x_forwarded_port && !h.x_forwarded_host);
        assert_eq!(
            h.client_cert_details,
            [None, Some(true), None, Some(false), None]
        );
    }

    #[test]
    fn bad_proxy_headers_name_their_field() {
        let e = read(json!({"proxyHeaders": {"server": {"disabled": "yes"}}})).unwrap_err();
        assert_eq!(e.field, "proxyHeaders.server.disabled");
        let e = read(json!({"proxyHeaders": {"metadataExchangeHeaders": {"mode": "ALWAYS"}}}));
        assert_eq!(
            e.unwrap_err().field,
            "proxyHeaders.metadataExchangeHeaders.mode"
        );
    }
}
