//! How the parity harness (`parity.rs`) compares what istiod and meshd send one proxy:
//! each resource as proto3 JSON (Envoy's descriptors), normalised, then compared resource
//! by resource and leaf field by leaf field.
//!
//! The normalisation, which docs/compatibility.md repeats:
//! - a nested `Any` whose type is not in Envoy's descriptor set (Istio's own extensions,
//!   such as `stats.PluginConfig`) becomes `{"@type": URL, "@bytes": HEX}`: its encoding
//!   is compared (both sides encode fields in number order);
//! - lists whose order Envoy ignores are sorted; the order of `filters`, `http_filters`,
//!   `listener_filters`, `routes` and `transport_socket_matches` is kept, as Envoy applies
//!   them in order;
//! - a filter chain is addressed by its `filter_chain_match` (unique in a listener, and
//!   what Envoy selects it by), another list element that has a `name` by that name, any
//!   other by its place after sorting;
//! - versions and nonces are not part of a resource and are never compared.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, ReflectMessage, SerializeOptions, Value};
use serde_json::Value as Json;

/// Envoy's messages, from the descriptor set envoy-api was generated from.
fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| DescriptorPool::decode(envoy_api::FILE_DESCRIPTOR_SET).unwrap())
}

const ANY: &str = "google.protobuf.Any";

/// One encoded resource of type `type_url` as JSON (proto field names, `@type` on every
/// `Any`), nested `Any`s of unknown types reduced as the module says.
pub fn resource_json(type_url: &str, bytes: &[u8]) -> Json {
    let name = type_url.rsplit('/').next().unwrap();
    let descriptor = pool()
        .get_message_by_name(name)
        .unwrap_or_else(|| panic!("{type_url} is not in Envoy's descriptor set"));
    let mut message = DynamicMessage::decode(descriptor, bytes)
        .unwrap_or_else(|e| panic!("a {type_url} that does not decode: {e}"));
    let mut unknown = BTreeSet::new();
    reduce_unknown_anys(&mut message, &mut unknown);
    let options = SerializeOptions::new().use_proto_field_name(true);
    let mut json = message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .unwrap_or_else(|e| panic!("{type_url} as JSON: {e}"));
    mark_unknown(&mut json, &unknown);
    json
}

/// The type URL an unknown `Any` is rewritten to before serialising, so that the JSON
/// serialiser (which must resolve every `Any`) accepts it; `mark_unknown` then restores
/// the original URL.
const PLACEHOLDER: &str = "type.googleapis.com/google.protobuf.StringValue";

fn reduce_unknown_anys(message: &mut DynamicMessage, unknown: &mut BTreeSet<String>) {
    if message.descriptor().full_name() == ANY {
        let url = match message.get_field_by_name("type_url").as_deref() {
            Some(Value::String(u)) => u.clone(),
            _ => return,
        };
        let bytes = match message.get_field_by_name("value").as_deref() {
            Some(Value::Bytes(b)) => b.clone(),
            _ => Default::default(),
        };
        let inner = url.rsplit('/').next().unwrap_or_default();
        match pool().get_message_by_name(inner) {
            Some(descriptor) => {
                if let Ok(mut decoded) = DynamicMessage::decode(descriptor, bytes) {
                    reduce_unknown_anys(&mut decoded, unknown);
                    message
                        .set_field_by_name("value", Value::Bytes(decoded.encode_to_vec().into()));
                }
            }
            None => {
                let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                let marker = format!("{url}#{hex}");
                unknown.insert(marker.clone());
                // prost encodes a `String` as `google.protobuf.StringValue`.
                let marker = marker.encode_to_vec();
                message.set_field_by_name("type_url", Value::String(PLACEHOLDER.into()));
                message.set_field_by_name("value", Value::Bytes(marker.into()));
            }
        }
        return;
    }
    for (_, value) in message.fields_mut() {
        reduce_value(value, unknown);
    }
}

fn reduce_value(value: &mut Value, unknown: &mut BTreeSet<String>) {
    match value {
        Value::Message(m) => reduce_unknown_anys(m, unknown),
        Value::List(items) => items.iter_mut().for_each(|v| reduce_value(v, unknown)),
        Value::Map(map) => map.values_mut().for_each(|v| reduce_value(v, unknown)),
        _ => {}
    }
}

fn mark_unknown(json: &mut Json, unknown: &BTreeSet<String>) {
    match json {
        Json::Object(map) => {
            let placeholder = map.get("@type").and_then(Json::as_str) == Some(PLACEHOLDER);
            if let (true, Some(Json::String(marker))) = (placeholder, map.get("value"))
                && unknown.contains(marker)
                && let Some((url, hex)) = marker.clone().split_once('#')
            {
                map.clear();
                map.insert("@type".into(), Json::String(url.into()));
                map.insert("@bytes".into(), Json::String(hex.into()));
                return;
            }
            map.values_mut().for_each(|v| mark_unknown(v, unknown));
        }
        Json::Array(items) => items.iter_mut().for_each(|v| mark_unknown(v, unknown)),
        _ => {}
    }
}

/// Lists Envoy applies in order.
const ORDERED: &[&str] = &[
    "filters",
    "http_filters",
    "listener_filters",
    "routes",
    "transport_socket_matches",
];

/// `json` as leaf paths and their values, under the module's normalisation.
pub fn leaves(json: &Json) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    walk(json, String::new(), "", &mut out);
    out
}

fn walk(json: &Json, path: String, key: &str, out: &mut BTreeMap<String, String>) {
    match json {
        Json::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                walk(v, format!("{path}.{k}"), k, out);
            }
        }
        Json::Array(items) if !items.is_empty() => {
            // Envoy picks a filter chain by its match, which is unique in a listener.
            let id = |item: &Json| match key {
                "filter_chains" => item["filter_chain_match"].to_string(),
                _ => item["name"].as_str().unwrap_or_default().to_string(),
            };
            let mut keyed: Vec<(String, &Json)> =
                items.iter().map(|item| (id(item), item)).collect();
            let named = keyed.iter().all(|(n, _)| !n.is_empty())
                && keyed.iter().map(|(n, _)| n).collect::<BTreeSet<_>>().len() == keyed.len();
            if !named && !ORDERED.contains(&key) {
                keyed.sort_by_key(|(_, item)| item.to_string());
            }
            for (i, (name, item)) in keyed.into_iter().enumerate() {
                let at = if named {
                    format!("[{name}]")
                } else {
                    format!("[{i}]")
                };
                walk(item, format!("{path}{at}"), "", out);
            }
        }
        other => {
            out.insert(path, other.to_string());
        }
    }
}

/// One type's comparison for one proxy.
#[derive(Default, Debug, Clone)]
pub struct TypeDiff {
    pub only_istiod: Vec<String>,
    pub only_meshd: Vec<String>,
    /// Resources both send, and how many of them are identical.
    pub common: usize,
    pub identical: usize,
    /// Leaf fields over the resources both send: all (the union), identical ones.
    pub fields: usize,
    pub identical_fields: usize,
    /// Each differing leaf path (resource name first), with istiod's and meshd's value.
    pub differences: Vec<(String, Option<String>, Option<String>)>,
}

impl TypeDiff {
    pub fn resource_share(&self) -> f64 {
        let all = self.common + self.only_istiod.len() + self.only_meshd.len();
        if all == 0 {
            1.0
        } else {
            self.identical as f64 / all as f64
        }
    }

    pub fn field_share(&self) -> f64 {
        if self.fields == 0 {
            1.0
        } else {
            self.identical_fields as f64 / self.fields as f64
        }
    }

    pub fn add(&mut self, other: &TypeDiff) {
        self.only_istiod.extend(other.only_istiod.iter().cloned());
        self.only_meshd.extend(other.only_meshd.iter().cloned());
        self.common += other.common;
        self.identical += other.identical;
        self.fields += other.fields;
        self.identical_fields += other.identical_fields;
        self.differences.extend(other.differences.iter().cloned());
    }
}

/// istiod's and meshd's resources of one type (name → JSON), compared.
pub fn compare(istiod: &BTreeMap<String, Json>, meshd: &BTreeMap<String, Json>) -> TypeDiff {
    let mut diff = TypeDiff {
        only_istiod: istiod
            .keys()
            .filter(|k| !meshd.contains_key(*k))
            .cloned()
            .collect(),
        only_meshd: meshd
            .keys()
            .filter(|k| !istiod.contains_key(*k))
            .cloned()
            .collect(),
        ..Default::default()
    };
    for (name, theirs) in istiod {
        let Some(ours) = meshd.get(name) else {
            continue;
        };
        diff.common += 1;
        let (a, b) = (leaves(theirs), leaves(ours));
        let paths: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        let mut same = true;
        for path in paths {
            diff.fields += 1;
            let (x, y) = (a.get(path), b.get(path));
            if x == y {
                diff.identical_fields += 1;
            } else {
                same = false;
                diff.differences
                    .push((format!("{name} {path}"), x.cloned(), y.cloned()));
            }
        }
        if same {
            diff.identical += 1;
        }
    }
    diff
}

/// A differing path with the resource's name and every bracketed list key made generic
/// (`[…]`), so one difference repeated over many resources counts once.
pub fn pattern(path: &str) -> String {
    let field = path.split_once(' ').map_or(path, |(_, p)| p);
    let mut out = String::new();
    let mut depth = 0;
    for c in field.chars() {
        match c {
            '[' => {
                if depth == 0 {
                    out.push_str("[…]");
                }
                depth += 1;
            }
            ']' => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

#[test]
fn named_elements_are_matched_by_name_and_others_sorted_unless_order_matters() {
    let a = serde_json::json!({
        "domains": ["b", "a"],
        "routes": [{"match": 2}, {"match": 1}],
        "clusters": [{"name": "y", "w": 1}, {"name": "x", "w": 2}],
    });
    let b = serde_json::json!({
        "domains": ["a", "b"],
        "routes": [{"match": 1}, {"match": 2}],
        "clusters": [{"name": "x", "w": 2}, {"name": "y", "w": 1}],
    });
    let d = compare(
        &[("r".to_string(), a)].into(),
        &[("r".to_string(), b)].into(),
    );
    let paths: Vec<&str> = d.differences.iter().map(|(p, _, _)| p.as_str()).collect();
    assert_eq!(paths, ["r .routes[0].match", "r .routes[1].match"]);
    assert_eq!((d.fields, d.identical_fields, d.identical), (8, 6, 0));
    assert_eq!(pattern("r .clusters[x].w"), ".clusters[…].w");
}

#[test]
fn an_unknown_nested_type_is_compared_by_its_url_and_encoding() {
    use envoy_api::pb::envoy::config::listener::v3::{Filter, filter::ConfigType};
    let filter = Filter {
        name: "istio.stats".into(),
        config_type: Some(ConfigType::TypedConfig(
            envoy_api::pb::google::protobuf::Any {
                type_url: "type.googleapis.com/stats.PluginConfig".into(),
                value: vec![0x30, 1],
            },
        )),
    };
    let json = resource_json(
        "type.googleapis.com/envoy.config.listener.v3.Filter",
        &filter.encode_to_vec(),
    );
    assert_eq!(
        json["typed_config"],
        serde_json::json!({"@type": "type.googleapis.com/stats.PluginConfig", "@bytes": "3001"})
    );
}
