//! Encoded xDS resources as JSON, in the shape of Envoy's admin `/config_dump`
//! (`envoy.admin.v3.*ConfigDump`, proto field names, `@type` on every `Any`), so
//! `/debug/config_dump?proxyID=` can be diffed against what the proxy itself reports.
//! Private keys are redacted as Envoy redacts them.

use std::sync::{Arc, OnceLock};

use envoy_api::pb::google::protobuf::Any;

use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use serde_json::{Value, json};

use xds::resource::{Resource, TypeKind, View};

/// Every Envoy message, from the descriptor set envoy-api was generated from.
fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(envoy_api::FILE_DESCRIPTOR_SET)
            .expect("BUG: envoy-api's descriptor set does not decode")
    })
}

/// A resource the debug views could not render as JSON.
#[derive(Debug, thiserror::Error)]
#[error("{type_url}: {problem} (is the type in envoy-api's descriptor set?)")]
pub struct DumpError {
    pub type_url: String,
    pub problem: String,
}

/// One `Any` as proto3 JSON with Envoy's conventions (proto field names, `@type`).
pub fn any_to_json(any: &Any) -> Result<Value, DumpError> {
    let pool = pool();
    let error = |problem: String| DumpError {
        type_url: any.type_url.clone(),
        problem,
    };
    let wrapper = pool
        .get_message_by_name("google.protobuf.Any")
        .ok_or_else(|| error("no google.protobuf.Any in the descriptor set".into()))?;
    let mut message = DynamicMessage::new(wrapper);
    message.set_field_by_name(
        "type_url",
        prost_reflect::Value::String(any.type_url.clone()),
    );
    message.set_field_by_name(
        "value",
        prost_reflect::Value::Bytes(any.value.clone().into()),
    );
    let options = SerializeOptions::new().use_proto_field_name(true);
    let value = message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|e| error(e.to_string()))?;
    Ok(as_envoy_prints(value))
}

/// A resource's JSON; a resource that cannot be rendered says why instead.
fn resource_json(r: &Resource) -> Value {
    any_json(&r.any())
}

/// As [`any_to_json`], with what could not be rendered saying why instead.
fn any_json(any: &Any) -> Value {
    any_to_json(any).unwrap_or_else(|e| json!({"error": e.to_string()}))
}

/// Envoy's printing of what prost-reflect prints otherwise:
/// - private key material never leaves meshd through a debug view: Envoy prints
///   `[redacted]` in its place, and so does meshd;
/// - a whole `double` (a `Percent`'s 100) prints as `100`, not `100.0`.
fn as_envoy_prints(mut value: Value) -> Value {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for (k, child) in map.iter_mut() {
                    if k == "private_key" {
                        *child = json!({"inline_string": "[redacted]"});
                    } else {
                        walk(child);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            Value::Number(n) => {
                if let Some(f) = n.as_f64().filter(|_| n.is_f64())
                    && f.fract() == 0.0
                    && f.abs() < 9.007_199_254_740_992e15
                {
                    *n = (f as i64).into();
                }
            }
            _ => {}
        }
    }
    walk(&mut value);
    value
}

/// A proxy's configuration as Envoy's `/config_dump` shows its dynamic resources; its
/// route configurations those it subscribes to (`route_names`, see
/// [`xds::debug::subscribed_routes`]).
pub fn config_dump(
    view: &View,
    version: &str,
    sent_at: &str,
    route_names: Option<&[Arc<str>]>,
) -> Value {
    let all = |kind: TypeKind| view.all(kind).values();
    let clusters: Vec<Value> = all(TypeKind::Cluster)
        .map(|r| json!({"version_info": version, "cluster": resource_json(r), "last_updated": sent_at}))
        .collect();
    let endpoints: Vec<Value> = all(TypeKind::Endpoint)
        .map(|r| json!({"version_info": version, "endpoint_config": resource_json(r), "last_updated": sent_at}))
        .collect();
    let listeners: Vec<Value> = all(TypeKind::Listener)
        .map(|r| {
            json!({"name": &*r.name, "active_state": {"version_info": version, "listener": resource_json(r), "last_updated": sent_at}})
        })
        .collect();
    let routes: Vec<Value> = (xds::debug::subscribed_routes(view, route_names).iter())
        .map(|r| {
            let config = any_json(&xds::debug::route_config_with_vhds(r, view));
            json!({"version_info": version, "route_config": config, "last_updated": sent_at})
        })
        .collect();
    let secrets: Vec<Value> = all(TypeKind::Secret)
        .map(|r| json!({"name": &*r.name, "version_info": version, "last_updated": sent_at, "secret": resource_json(r)}))
        .collect();
    json!({"configs": [
        {"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump", "version_info": version, "dynamic_active_clusters": clusters},
        {"@type": "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump", "dynamic_endpoint_configs": endpoints},
        {"@type": "type.googleapis.com/envoy.admin.v3.ListenersConfigDump", "version_info": version, "dynamic_listeners": listeners},
        {"@type": "type.googleapis.com/envoy.admin.v3.RoutesConfigDump", "dynamic_route_configs": routes},
        {"@type": "type.googleapis.com/envoy.admin.v3.SecretsConfigDump", "dynamic_active_secrets": secrets},
    ]})
}

/// One type's resources as JSON objects (for `/debug/cdsz` and `/debug/edsz`).
pub fn resources_json(view: &View, kind: TypeKind) -> Vec<Value> {
    view.all(kind).values().map(|r| resource_json(r)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_api::pb::envoy::config::cluster::v3::Cluster;
    use envoy_api::pb::envoy::config::core::v3::{DataSource, data_source};
    use envoy_api::pb::envoy::extensions::transport_sockets::tls::v3::{
        Secret, TlsCertificate, secret,
    };
    use xds::resource::encode;

    #[test]
    fn resources_read_as_envoy_prints_them_and_keys_are_redacted() {
        let cluster = Cluster {
            name: "outbound|9080||reviews.shop.svc.cluster.local".into(),
            connect_timeout: Some(envoy_api::pb::google::protobuf::Duration {
                seconds: 10,
                nanos: 0,
            }),
            ..Default::default()
        };
        let json = any_to_json(&encode(&cluster.name, &cluster).any()).unwrap();
        assert_eq!(
            json,
            json!({
                "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                "name": "outbound|9080||reviews.shop.svc.cluster.local",
                "connect_timeout": "10s",
            })
        );
        let inline = |b: &str| DataSource {
            specifier: Some(data_source::Specifier::InlineBytes(b.as_bytes().to_vec())),
            ..Default::default()
        };
        let s = Secret {
            name: "kubernetes://web-cert".into(),
            r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
                certificate_chain: Some(inline("CERT")),
                private_key: Some(inline("-----BEGIN PRIVATE KEY-----")),
                ..Default::default()
            })),
        };
        let text = any_to_json(&encode(&s.name, &s).any()).unwrap().to_string();
        assert!(
            text.contains("[redacted]") && !text.contains("PRIVATE"),
            "{text}"
        );
        assert!(text.contains("certificate_chain"), "{text}");

        // Whole doubles print as Envoy prints them; others keep their fraction.
        use envoy_api::pb::envoy::config::cluster::v3::cluster::CommonLbConfig;
        use envoy_api::pb::envoy::r#type::v3::Percent;
        let lb = |value| CommonLbConfig {
            healthy_panic_threshold: Some(Percent { value }),
            ..Default::default()
        };
        for (value, printed) in [(100.0, "100"), (12.5, "12.5")] {
            let c = Cluster {
                name: "c".into(),
                common_lb_config: Some(lb(value)),
                ..Default::default()
            };
            let json = any_to_json(&encode(&c.name, &c).any()).unwrap();
            let threshold = &json["common_lb_config"]["healthy_panic_threshold"]["value"];
            assert_eq!(threshold.to_string(), printed);
        }
    }
}
