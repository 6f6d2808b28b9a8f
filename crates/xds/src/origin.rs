//! Which configuration objects a resource was built from, read back from the
//! `metadata.filter_metadata.istio.config` paths translation writes into clusters
//! (DestinationRules) and routes (VirtualServices). Used to report a proxy's NACK on
//! the objects that produced the rejected resource.

use envoy_api::pb::envoy::config::cluster::v3::Cluster;
use envoy_api::pb::envoy::config::core::v3::Metadata;
use envoy_api::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use envoy_api::pb::google::protobuf::value::Kind as ValueKind;
use prost::Message;

use super::resource::{Resource, TypeKind};
use model::config::{Kind, ObjectKey};

/// `/apis/GROUP/VERSION/namespaces/NS/SEGMENT/NAME` back to the object's key.
pub fn parse_config_path(path: &str) -> Option<ObjectKey> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let [
        "apis",
        _group,
        _version,
        "namespaces",
        namespace,
        segment,
        name,
    ] = parts[..]
    else {
        return None;
    };
    let kind = Kind::ALL
        .into_iter()
        .find(|k| k.is_istio() && k.istio_path_segment() == segment)?;
    Some(ObjectKey {
        kind,
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}

fn config_of(metadata: Option<&Metadata>) -> Option<ObjectKey> {
    let istio = metadata?.filter_metadata.get("istio")?;
    match &istio.fields.get("config")?.kind {
        Some(ValueKind::StringValue(path)) => parse_config_path(path),
        _ => None,
    }
}

/// The objects the given resources of `kind` were built from.
pub fn origins(kind: TypeKind, resources: &[std::sync::Arc<Resource>]) -> Vec<ObjectKey> {
    let mut out = Vec::new();
    for r in resources {
        match kind {
            TypeKind::Cluster => {
                if let Ok(c) = Cluster::decode(&*r.value()) {
                    out.extend(config_of(c.metadata.as_ref()));
                }
            }
            TypeKind::Route => {
                if let Ok(rc) = RouteConfiguration::decode(&*r.value()) {
                    let routes = rc.virtual_hosts.iter().flat_map(|v| &v.routes);
                    out.extend(routes.filter_map(|route| config_of(route.metadata.as_ref())));
                }
            }
            TypeKind::VirtualHost => {
                if let Ok(vh) = VirtualHost::decode(&*r.value()) {
                    out.extend(
                        vh.routes
                            .iter()
                            .filter_map(|route| config_of(route.metadata.as_ref())),
                    );
                }
            }
            TypeKind::Endpoint | TypeKind::Listener | TypeKind::Secret | TypeKind::NameTable => {}
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn istio_config_paths_name_their_objects() {
        let key =
            parse_config_path("/apis/networking.istio.io/v1/namespaces/shop/virtual-service/front")
                .unwrap();
        assert_eq!(key.to_string(), "VirtualService shop/front");
        let dr = parse_config_path(
            "/apis/networking.istio.io/v1/namespaces/shop/destination-rule/reviews",
        )
        .unwrap();
        assert_eq!(dr.kind, Kind::DestinationRule);
        assert!(
            parse_config_path("/apis/networking.istio.io/v1/namespaces/shop/unknown/x").is_none()
        );
        assert!(parse_config_path("garbage").is_none());
    }
}
