//! The node a simulated proxy presents, as istio-agent fills it in.

use envoy_api::pb::envoy::config::core::v3::Node;
use envoy_api::pb::google::protobuf::value::Kind;
use envoy_api::pb::google::protobuf::{ListValue, Struct, Value};
use serde_json::Value as Json;

/// A node as a sidecar agent sends it.
pub(crate) fn node(id: &str, metadata: &Json) -> Node {
    let fields = match json_value(metadata).kind {
        Some(Kind::StructValue(s)) => Some(s),
        _ => None,
    };
    Node {
        id: id.to_string(),
        metadata: fields,
        ..Default::default()
    }
}

/// A JSON value as a protobuf `Value`.
fn json_value(v: &Json) -> Value {
    let kind = match v {
        Json::Null => Kind::NullValue(0),
        Json::Bool(b) => Kind::BoolValue(*b),
        Json::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Json::String(s) => Kind::StringValue(s.clone()),
        Json::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(json_value).collect(),
        }),
        Json::Object(map) => Kind::StructValue(Struct {
            fields: map
                .iter()
                .map(|(k, v)| (k.clone(), json_value(v)))
                .collect(),
        }),
    };
    Value { kind: Some(kind) }
}
