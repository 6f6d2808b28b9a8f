//! istiod's debug types over xDS, which is how `istioctl proxy-status` reads a control
//! plane (through its secure port, with a Kubernetes token): `istio.io/debug/syncz` (each
//! connected proxy as a CSDS `ClientConfig`), `istio.io/debug/config_dump` (one proxy's
//! configuration as Envoy's admin dumps, for `istioctl proxy-status POD`), and
//! `istio.io/debug` (any `/debug/NAME?QUERY` view, its body as the resource, for
//! `istioctl x internal-debug`).
//!
//! A stream whose first request asks for one of these is a debug client, not a proxy: it
//! is answered request by request and never registered, pushed to or counted as a proxy.
//! Only a caller that proved an identity on the secure port is answered. One of the root
//! namespace (`istio-system`) sees every proxy and every view; any other sees the proxies
//! of its own namespace, and of the `istio.io/debug` views only `config_dump`, `edsz` and
//! `ndsz` of one of them (`?proxyID=`). istiod lets such callers read those three,
//! filtered to their namespace; meshd's HTTP views are not filtered, so it asks for the
//! proxy instead.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use envoy_api::pb::envoy::admin::v3::{
    BootstrapConfigDump, ClustersConfigDump, EcdsConfigDump, ListenersConfigDump, RoutesConfigDump,
    ScopedRoutesConfigDump, SecretsConfigDump, clusters_config_dump, listeners_config_dump,
    routes_config_dump, secrets_config_dump,
};
use envoy_api::pb::envoy::config::core::v3::{DataSource, Node, data_source};
use envoy_api::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use envoy_api::pb::envoy::extensions::transport_sockets::tls::v3::{Secret, secret};
use envoy_api::pb::envoy::service::status::v3::client_config::GenericXdsConfig;
use envoy_api::pb::envoy::service::status::v3::{ClientConfig, ConfigStatus};
use envoy_api::pb::google::protobuf::{Any, Struct, Timestamp, Value, value};
use prost::{Message, Name};
use tonic::Status;

use super::XdsShared;
use super::connection::{SyncStatus, TypeStatus};
use super::resource::{self, PUSH_ORDER, Resource, TypeKind, View, vhds_route_config};
use transport::identity::Identity;

/// `istio.io/debug`: any debug view by name (`syncz`, `config_dump?proxyID=...`).
pub const DEBUG: &str = "istio.io/debug";
/// Each connected proxy's sync status, as CSDS `ClientConfig`s.
pub const SYNCZ: &str = "istio.io/debug/syncz";
/// One proxy's configuration (the request names its id), as Envoy's admin config dumps.
pub const CONFIG_DUMP: &str = "istio.io/debug/config_dump";

/// The debug type `type_url` names, if it is one meshd serves.
pub fn debug_type(type_url: &str) -> Option<&'static str> {
    [DEBUG, SYNCZ, CONFIG_DUMP]
        .into_iter()
        .find(|t| *t == type_url)
}

/// Whether `type_url` is in istiod's debug namespace (served or not).
pub fn is_debug(type_url: &str) -> bool {
    type_url == DEBUG || type_url.starts_with("istio.io/debug/")
}

/// One answer to a debug client, before its framing ([`super::stream::Framing`]).
pub struct Answer {
    pub type_url: &'static str,
    pub version: String,
    pub nonce: String,
    pub resources: Vec<Arc<Resource>>,
    /// `control_plane.identifier`, which istiod sends with syncz.
    pub control_plane: Option<Arc<str>>,
}

/// Runs a `/debug/...` view in-process: its path and query in, status and body out. Set
/// by whoever serves the monitoring port ([`XdsShared::set_debug_views`]).
pub type DebugViews = Arc<
    dyn Fn(String) -> std::pin::Pin<Box<dyn Future<Output = (u16, Vec<u8>)> + Send>> + Send + Sync,
>;

/// What `istioctl` reads from `control_plane.identifier`: istiod's JSON of the component,
/// the instance (`POD_NAME`) and its build.
pub fn control_plane_identifier(instance: &str) -> String {
    serde_json::json!({
        "Component": "istiod",
        "ID": instance,
        "Info": {
            "version": env!("CARGO_PKG_VERSION"),
            "revision": "meshd",
            "golang_version": "",
            "status": "Clean",
            "tag": env!("CARGO_PKG_VERSION"),
        },
    })
    .to_string()
}

/// The resources that answer a debug request of `type_url` for `names`, asked by
/// `caller`, and the debug type they are of.
pub async fn answer(
    shared: &XdsShared,
    caller: Option<&Identity>,
    type_url: &str,
    names: &[String],
) -> Result<(&'static str, Vec<Arc<Resource>>), Status> {
    let Some(served) = debug_type(type_url) else {
        return Err(Status::invalid_argument(format!(
            "{type_url}: not a debug type meshd serves ({DEBUG}, {SYNCZ}, {CONFIG_DUMP})"
        )));
    };
    resources(shared, caller, served, names)
        .await
        .map(|r| (served, r))
}

async fn resources(
    shared: &XdsShared,
    caller: Option<&Identity>,
    type_url: &'static str,
    names: &[String],
) -> Result<Vec<Arc<Resource>>, Status> {
    let Some(caller) = caller else {
        return Err(Status::unauthenticated(format!(
            "{type_url}: authentication required: the debug types are served on the secure \
             port (15012) to a caller with a token or a workload certificate"
        )));
    };
    let root = shared
        .current_push()
        .context
        .mesh
        .root_namespace()
        .to_string();
    // `None`: every namespace.
    let only = (caller.namespace != root).then_some(caller.namespace.as_str());
    match type_url {
        SYNCZ => Ok(syncz(shared, only)),
        CONFIG_DUMP => {
            let [proxy] = names else {
                return Err(Status::invalid_argument(format!(
                    "{CONFIG_DUMP}: resource_names must name exactly one proxy, not {}",
                    names.len()
                )));
            };
            config_dump(shared, proxy, only)
        }
        _ => {
            // DEBUG
            let [view] = names else {
                return Err(Status::invalid_argument(format!(
                    "{DEBUG}: resource_names must name exactly one debug view \
                     (such as \"syncz\"), not {}",
                    names.len()
                )));
            };
            if let Some(namespace) = only
                && !own_proxy_view(shared, view, namespace)
            {
                return Err(Status::permission_denied(format!(
                    "{DEBUG}: {view:?} is not available to {caller}: identities of the root \
                     namespace {root:?} may read every view, others only `config_dump`, \
                     `edsz` and `ndsz` of a proxy of their own namespace (?proxyID=)"
                )));
            }
            let Some(views) = shared.debug_views() else {
                return Err(Status::unavailable(format!(
                    "{DEBUG}: this meshd serves no debug views"
                )));
            };
            let (status, body) = views(format!("/debug/{view}")).await;
            Ok(vec![debug_view(view, status, body)])
        }
    }
}

/// Whether `view` (`NAME?QUERY`) is one a caller of `namespace` may read: as istiod's
/// `activeNamespaceDebuggers`, a proxy's `config_dump`, `edsz` or `ndsz`, and here only for a
/// connected proxy of that namespace, named by `proxyID` (meshd's views are not
/// filtered by the caller's namespace, as istiod's are).
fn own_proxy_view(shared: &XdsShared, view: &str, namespace: &str) -> bool {
    let (name, query) = view.split_once('?').unwrap_or((view, ""));
    if !matches!(name, "config_dump" | "edsz" | "ndsz") {
        return false;
    }
    // Decoded as the view's own query parser (serde_urlencoded) decodes it, so that the
    // proxy checked is the proxy shown.
    let ids: Vec<String> = (form_urlencoded::parse(query.as_bytes()))
        .filter(|(key, _)| key == "proxyID")
        .map(|(_, id)| id.into_owned())
        .collect();
    let [id] = &ids[..] else {
        return false;
    };
    let proxies = shared.sync_status();
    let named: Vec<_> = proxies
        .iter()
        .filter(|s| proxy_matches(&s.model.id, id))
        .collect();
    !named.is_empty() && named.iter().all(|s| s.model.namespace == namespace)
}

/// A view's answer as istiod wraps it: the body (after `{"statusCode":"N"}` when it was
/// not a success), in an `Any` of type `istio.io/debug`.
fn debug_view(name: &str, status: u16, body: Vec<u8>) -> Arc<Resource> {
    let value = if status == 200 {
        body
    } else {
        let mut v = serde_json::json!({"statusCode": status.to_string()})
            .to_string()
            .into_bytes();
        v.extend_from_slice(&body);
        v
    };
    resource::with_type_url(name, DEBUG, value)
}

/// Every connected proxy (of namespace `only`, if set) as a `ClientConfig`, by node id.
fn syncz(shared: &XdsShared, only: Option<&str>) -> Vec<Arc<Resource>> {
    let mut statuses = shared.sync_status();
    statuses.retain(|s| only.is_none_or(|ns| s.model.namespace == ns));
    statuses.sort_by(|a, b| proxy_id(&a.model.id).cmp(proxy_id(&b.model.id)));
    statuses
        .iter()
        .map(|s| resource::encode(proxy_id(&s.model.id), &client_config(s)))
        .collect()
}

/// One connection's status as CSDS reports a client: its node (id, and the metadata
/// istioctl shows) and, per type it was sent or asked, SYNCED, STALE, NOT_SENT or ERROR.
pub fn client_config(s: &SyncStatus) -> ClientConfig {
    let p = &*s.model;
    let text = |v: &str| Value {
        kind: Some(value::Kind::StringValue(v.to_string())),
    };
    let metadata = Struct {
        fields: [
            ("CLUSTER_ID", text(&p.cluster_id)),
            ("NAMESPACE", text(&p.namespace)),
            (
                "ISTIO_VERSION",
                text(p.istio_version.as_deref().unwrap_or("")),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
    };
    let mut configs: Vec<GenericXdsConfig> = PUSH_ORDER
        .iter()
        .filter_map(|k| Some((*k, s.types[*k as usize].as_deref()?)))
        .map(|(kind, t)| GenericXdsConfig {
            type_url: kind.url().to_string(),
            config_status: config_status(t) as i32,
            last_updated: t.sent_at().map(timestamp),
            error_state: t.rejected().then(|| {
                envoy_api::pb::envoy::admin::v3::UpdateFailureState {
                    last_update_attempt: t.sent_at().map(timestamp),
                    details: t.last_error.clone().unwrap_or_default(),
                    ..Default::default()
                }
            }),
            ..Default::default()
        })
        .collect();
    configs.sort_by(|a, b| a.type_url.cmp(&b.type_url));
    ClientConfig {
        node: Some(Node {
            id: proxy_id(&p.id).to_string(),
            metadata: Some(metadata),
            ..Default::default()
        }),
        generic_xds_configs: configs,
        ..Default::default()
    }
}

/// istiod's rule: ERROR while the last response sent is rejected, NOT_SENT before any,
/// SYNCED once the last one is ACKed, STALE until then.
fn config_status(t: &TypeStatus) -> ConfigStatus {
    if t.rejected() {
        ConfigStatus::Error
    } else if t.nonce_sent.is_empty() {
        ConfigStatus::NotSent
    } else if t.nonce_sent == t.nonce_acked {
        ConfigStatus::Synced
    } else {
        ConfigStatus::Stale
    }
}

fn timestamp(at: SystemTime) -> Timestamp {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    Timestamp {
        seconds: since.as_secs() as i64,
        nanos: since.subsec_nanos() as i32,
    }
}

/// The proxy's id as istiod names it in its debug answers (its `model.Proxy.ID`): the
/// node id's third part, `POD.NAMESPACE`, or the whole node id if it has no such part.
pub fn proxy_id(node: &str) -> &str {
    node.split('~').nth(2).unwrap_or(node)
}

/// Whether node id `node` is what an operator called `id`: the whole id, or `POD.NAMESPACE`
/// as istioctl takes it.
pub fn proxy_matches(node: &str, id: &str) -> bool {
    node == id || node.split('~').nth(2) == Some(id)
}

/// The configuration of connected proxy `id` (of namespace `only`, if set) as istiod
/// answers `istio.io/debug/config_dump`: an `envoy.admin.v3.ConfigDump`'s configs, one
/// resource each, unnamed.
fn config_dump(
    shared: &XdsShared,
    id: &str,
    only: Option<&str>,
) -> Result<Vec<Arc<Resource>>, Status> {
    let found = (shared.sync_status().into_iter())
        .find(|s| proxy_matches(&s.model.id, id) && only.is_none_or(|ns| s.model.namespace == ns));
    let Some(status) = found else {
        return Err(Status::not_found(format!(
            "{CONFIG_DUMP}: config dump could not find connection for proxyID {id:?}"
        )));
    };
    let push = shared.current_push();
    let view = push.view(&status.model);
    Ok(
        config_dump_configs(&view, push.version(), status.route_names.as_deref())
            .into_iter()
            .map(|a| resource::with_type_url("", &a.type_url, a.value))
            .collect(),
    )
}

/// The route configurations of `view` a proxy subscribed to as `route_names` (one it
/// names that the view lacks as it was answered: empty), as istiod's debug dumps generate
/// them from the watched names; without a subscription on record, the view's.
pub fn subscribed_routes(view: &View, route_names: Option<&[Arc<str>]>) -> Vec<Arc<Resource>> {
    match route_names {
        Some(names) => (names.iter())
            .filter_map(|n| view.get(TypeKind::Route, n))
            .collect(),
        None => view.all(TypeKind::Route).values().cloned().collect(),
    }
}

/// What `/config_dump` holds of a proxy's dynamic configuration, in istiod's order:
/// bootstrap (empty), clusters, listeners, scoped routes (empty), routes (with the
/// virtual hosts VHDS sent folded into their route configurations, as Envoy shows them),
/// secrets (private keys redacted, as Envoy redacts them), extension configs (empty).
/// The routes are those the proxy subscribes to ([`subscribed_routes`]).
pub fn config_dump_configs(
    view: &View,
    version: &str,
    route_names: Option<&[Arc<str>]>,
) -> Vec<Any> {
    let all = |kind: TypeKind| view.all(kind).values();
    let clusters = ClustersConfigDump {
        version_info: version.to_string(),
        dynamic_active_clusters: all(TypeKind::Cluster)
            .map(|r| clusters_config_dump::DynamicCluster {
                version_info: version.to_string(),
                cluster: Some(r.any()),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let listeners = ListenersConfigDump {
        version_info: version.to_string(),
        dynamic_listeners: all(TypeKind::Listener)
            .map(|r| listeners_config_dump::DynamicListener {
                name: r.name.to_string(),
                active_state: Some(listeners_config_dump::DynamicListenerState {
                    version_info: version.to_string(),
                    listener: Some(r.any()),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let routes = RoutesConfigDump {
        dynamic_route_configs: (subscribed_routes(view, route_names).iter())
            .map(|r| routes_config_dump::DynamicRouteConfig {
                version_info: version.to_string(),
                route_config: Some(route_config_with_vhds(r, view)),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let secrets = SecretsConfigDump {
        dynamic_active_secrets: all(TypeKind::Secret)
            .map(|r| secrets_config_dump::DynamicSecret {
                name: r.name.to_string(),
                version_info: version.to_string(),
                secret: Some(redacted(r)),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    vec![
        any(&BootstrapConfigDump::default()),
        any(&clusters),
        any(&listeners),
        any(&ScopedRoutesConfigDump::default()),
        any(&routes),
        any(&secrets),
        any(&EcdsConfigDump::default()),
    ]
}

fn any<M: Message + Name>(m: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: m.encode_to_vec(),
    }
}

/// A secret with its private key (and the key's password) replaced by `[redacted]`.
fn redacted(r: &Resource) -> Any {
    let Ok(mut s) = Secret::decode(&*r.value()) else {
        return Any {
            type_url: Secret::type_url(),
            value: Vec::new(),
        };
    };
    let mark = || {
        Some(DataSource {
            specifier: Some(data_source::Specifier::InlineString("[redacted]".into())),
            ..Default::default()
        })
    };
    if let Some(secret::Type::TlsCertificate(c)) = &mut s.r#type {
        if c.private_key.is_some() {
            c.private_key = mark();
        }
        if c.password.is_some() {
            c.password = mark();
        }
    }
    any(&s)
}

/// A route configuration with the virtual hosts VHDS sent for it appended after its own
/// (in name order), as Envoy's `/config_dump` shows it.
pub fn route_config_with_vhds(route: &Resource, view: &View) -> Any {
    let mut vhosts = (view.all(TypeKind::VirtualHost).values())
        .filter(|vh| vhds_route_config(&vh.name) == Some(&*route.name))
        .peekable();
    if vhosts.peek().is_none() {
        return route.any();
    }
    let Ok(mut config) = RouteConfiguration::decode(&*route.value()) else {
        return route.any();
    };
    config
        .virtual_hosts
        .extend(vhosts.filter_map(|vh| VirtualHost::decode(&*vh.value()).ok()));
    Any {
        type_url: RouteConfiguration::type_url(),
        value: config.encode_to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::Connection;
    use crate::testing;
    use crate::wire::Batch;
    use model::Proxy;

    fn status_of(conn: &Connection) -> (i32, Option<String>) {
        let config = client_config(&conn.status.lock().unwrap());
        let cds = &config.generic_xds_configs[0];
        assert_eq!(cds.type_url, TypeKind::Cluster.url());
        let error = cds.error_state.as_ref().map(|e| e.details.clone());
        (cds.config_status, error)
    }

    #[test]
    fn a_type_is_stale_until_acked_and_an_error_only_while_its_last_response_is_rejected() {
        use model::testmesh::Load;
        let store = model::testmesh::Shape::new(3, 1, 1).store();
        let (_tx, rx) = tokio::sync::watch::channel(testing::Pushes::default().build(&store, 1));
        let shared = testing::shared(rx);
        let meta = serde_json::json!({"NAMESPACE": "ns-1"});
        let proxy = Proxy::from_node(
            "sidecar~10.9.0.1~a-0.ns-1~ns-1.svc.cluster.local",
            meta.as_object().unwrap(),
        )
        .unwrap();
        let mut conn = Connection::new(shared.clone(), proxy, true);
        let cds = TypeKind::Cluster;
        let send =
            |conn: &mut Connection| conn.record_sent(cds, &Batch::default(), &[], true, None);
        conn.status.lock().unwrap().of(cds);
        assert_eq!(status_of(&conn), (ConfigStatus::NotSent as i32, None));
        let first = send(&mut conn);
        assert_eq!(status_of(&conn), (ConfigStatus::Stale as i32, None));
        conn.record_ack(cds, &first);
        assert_eq!(status_of(&conn), (ConfigStatus::Synced as i32, None));
        let second = send(&mut conn);
        conn.record_nack(cds, &second, "bad cluster");
        assert_eq!(
            status_of(&conn),
            (ConfigStatus::Error as i32, Some("bad cluster".into()))
        );
        // Sent something new: no longer the rejected response.
        let third = send(&mut conn);
        assert_eq!(status_of(&conn), (ConfigStatus::Stale as i32, None));
        // A late NACK of an older response does not mark the newer one.
        conn.record_nack(cds, &second, "bad cluster");
        assert_eq!(status_of(&conn), (ConfigStatus::Stale as i32, None));
        conn.record_ack(cds, &third);
        assert_eq!(status_of(&conn), (ConfigStatus::Synced as i32, None));
        let config = client_config(&conn.status.lock().unwrap());
        assert!(config.generic_xds_configs[0].last_updated.is_some());
        // Named as istiod names a proxy (`model.Proxy.ID`): POD.NAMESPACE.
        assert_eq!(config.node.unwrap().id, "a-0.ns-1");
    }

    #[test]
    fn secrets_in_a_dump_keep_their_certificate_and_lose_their_key() {
        let s = Secret {
            name: "kubernetes://web-cert".into(),
            r#type: Some(secret::Type::TlsCertificate(
                envoy_api::pb::envoy::extensions::transport_sockets::tls::v3::TlsCertificate {
                    certificate_chain: Some(DataSource {
                        specifier: Some(data_source::Specifier::InlineString("CERT".into())),
                        ..Default::default()
                    }),
                    private_key: Some(DataSource {
                        specifier: Some(data_source::Specifier::InlineString("KEY".into())),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )),
        };
        let shown = redacted(&resource::encode(&s.name, &s));
        let back = Secret::decode(&shown.value[..]).unwrap();
        let Some(secret::Type::TlsCertificate(c)) = back.r#type else {
            panic!("{back:?}")
        };
        let inline = |d: Option<DataSource>| match d.and_then(|d| d.specifier) {
            Some(data_source::Specifier::InlineString(s)) => s,
            other => panic!("{other:?}"),
        };
        assert_eq!(inline(c.certificate_chain), "CERT");
        assert_eq!(inline(c.private_key), "[redacted]");
    }
}
