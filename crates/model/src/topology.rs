//! ProxyConfig `gatewayTopology`: what stands in front of a gateway. A gateway reads it
//! from the `PROXY_CONFIG` its agent sends in the node metadata, or, without one, from
//! MeshConfig `defaultConfig` (istiod's `ProxyConfigOrDefault`).

use serde::Serialize;
use serde_json::Value;

/// ProxyConfig `gatewayTopology`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct GatewayTopology {
    /// `numTrustedProxies`: the `x-forwarded-for` hops the gateway trusts to name the
    /// client (Envoy's `xff_num_trusted_hops`).
    pub num_trusted_proxies: u32,
    /// `forwardClientCertDetails`; `Undefined` means istiod's gateway default,
    /// `SANITIZE_SET`.
    pub forward_client_cert_details: ForwardClientCertDetails,
    /// `proxyProtocol` is set: connections start with a PROXY protocol header.
    pub proxy_protocol: bool,
}

/// MeshConfig's `ForwardClientCertDetails`, in its order (Envoy's is the same, one lower,
/// without `UNDEFINED`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ForwardClientCertDetails {
    #[default]
    Undefined,
    Sanitize,
    ForwardOnly,
    AppendForward,
    SanitizeSet,
    AlwaysForwardOnly,
}

const FORWARD_NAMES: [(&str, ForwardClientCertDetails); 6] = [
    ("UNDEFINED", ForwardClientCertDetails::Undefined),
    ("SANITIZE", ForwardClientCertDetails::Sanitize),
    ("FORWARD_ONLY", ForwardClientCertDetails::ForwardOnly),
    ("APPEND_FORWARD", ForwardClientCertDetails::AppendForward),
    ("SANITIZE_SET", ForwardClientCertDetails::SanitizeSet),
    (
        "ALWAYS_FORWARD_ONLY",
        ForwardClientCertDetails::AlwaysForwardOnly,
    ),
];

/// What is wrong with a ProxyConfig field (`gatewayTopology`, `proxyHeaders`), naming it
/// by its path (`gatewayTopology.numTrustedProxies`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ProxyConfigError {
    pub field: String,
    pub reason: String,
}

impl GatewayTopology {
    /// Reads a ProxyConfig's `gatewayTopology` as proto JSON writes it (either case of
    /// field name, enums by name or number, integers as numbers or strings); `None` when
    /// it is absent or null. Fields it does not know are ignored, as by istiod's parser.
    pub fn from_proxy_config(
        proxy_config: &serde_json::Map<String, Value>,
    ) -> Result<Option<GatewayTopology>, ProxyConfigError> {
        let Some(value) = field(proxy_config, "gatewayTopology", "gateway_topology") else {
            return Ok(None);
        };
        let Value::Object(fields) = value else {
            return Err(ProxyConfigError {
                field: "gatewayTopology".into(),
                reason: format!("{value} is not an object"),
            });
        };
        let num_trusted_proxies = match field(fields, "numTrustedProxies", "num_trusted_proxies") {
            None => 0,
            Some(v) => uint32(v).ok_or_else(|| ProxyConfigError {
                field: "gatewayTopology.numTrustedProxies".into(),
                reason: format!("{v} is not an unsigned 32-bit integer"),
            })?,
        };
        let forward_client_cert_details = match field(
            fields,
            "forwardClientCertDetails",
            "forward_client_cert_details",
        ) {
            None => ForwardClientCertDetails::Undefined,
            Some(v) => forward(v).ok_or_else(|| ProxyConfigError {
                field: "gatewayTopology.forwardClientCertDetails".into(),
                reason: format!(
                    "{v} is not one of UNDEFINED, SANITIZE, FORWARD_ONLY, APPEND_FORWARD, \
                         SANITIZE_SET, ALWAYS_FORWARD_ONLY"
                ),
            })?,
        };
        let proxy_protocol = match field(fields, "proxyProtocol", "proxy_protocol") {
            None => false,
            Some(Value::Object(_)) => true,
            Some(v) => {
                return Err(ProxyConfigError {
                    field: "gatewayTopology.proxyProtocol".into(),
                    reason: format!("{v} is not an object"),
                });
            }
        };
        Ok(Some(GatewayTopology {
            num_trusted_proxies,
            forward_client_cert_details,
            proxy_protocol,
        }))
    }
}

/// A field by its proto JSON name or its proto name; null is absent.
pub(crate) fn field<'a>(
    fields: &'a serde_json::Map<String, Value>,
    camel: &str,
    snake: &str,
) -> Option<&'a Value> {
    (fields.get(camel).or_else(|| fields.get(snake))).filter(|v| !v.is_null())
}

fn uint32(v: &Value) -> Option<u32> {
    match v {
        Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

pub(crate) fn forward(v: &Value) -> Option<ForwardClientCertDetails> {
    match v {
        Value::String(s) => (FORWARD_NAMES.iter())
            .find(|(n, _)| n == s)
            .map(|(_, f)| *f),
        Value::Number(n) => {
            let i = usize::try_from(n.as_u64()?).ok()?;
            FORWARD_NAMES.get(i).map(|(_, f)| *f)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(v: Value) -> Result<Option<GatewayTopology>, ProxyConfigError> {
        GatewayTopology::from_proxy_config(v.as_object().unwrap())
    }

    #[test]
    fn a_topology_reads_as_proto_json_writes_it() {
        assert_eq!(read(json!({"concurrency": 2})), Ok(None));
        let t = read(
            json!({"gatewayTopology": {"numTrustedProxies": 2, "forwardClientCertDetails": "APPEND_FORWARD", "proxyProtocol": {}}}),
        );
        assert_eq!(
            t,
            Ok(Some(GatewayTopology {
                num_trusted_proxies: 2,
                forward_client_cert_details: ForwardClientCertDetails::AppendForward,
                proxy_protocol: true,
            }))
        );
        // Field names in either case, integers as strings, enums by number.
        let t = read(
            json!({"gateway_topology": {"num_trusted_proxies": "3", "forward_client_cert_details": 5}}),
        );
        let t = t.unwrap().unwrap();
        assert_eq!(t.num_trusted_proxies, 3);
        assert_eq!(
            t.forward_client_cert_details,
            ForwardClientCertDetails::AlwaysForwardOnly
        );
        assert!(!t.proxy_protocol);
    }

    #[test]
    fn a_bad_topology_names_its_field() {
        let e = read(json!({"gatewayTopology": {"numTrustedProxies": -1}})).unwrap_err();
        assert_eq!(e.field, "gatewayTopology.numTrustedProxies");
        let e = read(json!({"gatewayTopology": {"forwardClientCertDetails": "KEEP"}})).unwrap_err();
        assert_eq!(e.field, "gatewayTopology.forwardClientCertDetails");
        assert!(e.to_string().contains("\"KEEP\""), "{e}");
        let e = read(json!({"gatewayTopology": {"proxyProtocol": true}})).unwrap_err();
        assert_eq!(e.field, "gatewayTopology.proxyProtocol");
    }
}
