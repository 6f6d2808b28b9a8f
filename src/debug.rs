//! The monitoring port (15014): `/metrics`, `/ready`, and the debug views istiod serves
//! (`configz`, `syncz`, `registryz`, `push_status`, `authenticationz`, `adsz`, `cdsz`,
//! `edsz`, `endpointz`, `endpointShardz`, `workloadz`, `config_dump`), JSON unless noted.
//! Per-proxy views are computed from the current push's shared view for that proxy, so
//! they cost nothing while nobody asks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use axum::Router;
use std::net::SocketAddr;

use axum::extract::{ConnectInfo, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json};
use axum::routing::{MethodRouter, get};
use serde_json::{Value, json};

use crate::dump;
use crate::filesource::IssueBoard;
use crate::metrics::Metrics;
use model::Service;
use model::Store;
use xds::XdsShared;
use xds::connection::SyncStatus;
use xds::debug::{DebugViews, proxy_matches};
use xds::resource::{TypeKind, encode};

#[derive(Clone)]
pub struct DebugState {
    pub metrics: Arc<Metrics>,
    pub store: Arc<RwLock<Store>>,
    pub issues: IssueBoard,
    pub xds: Arc<XdsShared>,
    pub ready: Arc<AtomicBool>,
}

/// The debug views: path, what it shows (for the `/debug` index and `/debug/list`), and
/// its handler.
fn views() -> Vec<(&'static str, &'static str, MethodRouter<DebugState>)> {
    vec![
        (
            "/debug/configz",
            "Every accepted object, per-file errors and cross-object warnings",
            get(configz),
        ),
        (
            "/debug/syncz",
            "Per proxy and type: nonce and version sent vs ACKed, responses, NACKs",
            get(syncz),
        ),
        (
            "/debug/synz",
            "The same as /debug/syncz (the name Pilot's troubleshooting docs give it)",
            get(syncz),
        ),
        (
            "/debug/registryz",
            "The services of the current push",
            get(registryz),
        ),
        (
            "/debug/push_status",
            "The last push: number, version, revision, counts, what triggered it",
            get(push_status),
        ),
        (
            "/debug/authenticationz",
            "A proxy's effective mTLS mode per inbound port (?proxyID=)",
            get(authenticationz),
        ),
        (
            "/debug/adsz",
            "Per connection: the resource names of each type it holds",
            get(adsz),
        ),
        (
            "/debug/cdsz",
            "Clusters per proxy, as Envoy JSON",
            get(cdsz),
        ),
        (
            "/debug/edsz",
            "Load assignments per proxy, as Envoy JSON",
            get(edsz),
        ),
        (
            "/debug/ndsz",
            "A proxy's DNS name table, as NDS sends it to its agent (?proxyID=)",
            get(ndsz),
        ),
        (
            "/debug/endpointz",
            "Every service's endpoints (?brief=1: a text table)",
            get(endpointz),
        ),
        (
            "/debug/endpointShardz",
            "Endpoints per service and namespace, grouped by registry",
            get(endpoint_shardz),
        ),
        (
            "/debug/workloadz",
            "Connected proxies and their metadata",
            get(workloadz),
        ),
        (
            "/debug/config_dump",
            "A proxy's configuration in Envoy's admin /config_dump shape (?proxyID=)",
            get(config_dump),
        ),
        ("/debug/list", "The debug views' names, as JSON", get(list)),
    ]
}

/// `/metrics` and `/ready` for everyone (Prometheus, probes); the `/debug` views, which
/// expose configuration, only to local callers unless `remote_debug` is set.
pub fn router(state: DebugState, remote_debug: bool) -> Router {
    let mut debug = Router::new().route("/debug", get(index));
    for (path, _, handler) in views() {
        debug = debug.route(path, handler);
    }
    let debug = debug.layer(axum::middleware::from_fn(
        move |ConnectInfo(peer): ConnectInfo<SocketAddr>,
              request: axum::extract::Request,
              next: axum::middleware::Next| async move {
            if debug_allowed(peer, remote_debug) {
                next.run(request).await
            } else {
                (
                    StatusCode::FORBIDDEN,
                    "debug endpoints answer local callers only (meshd serve --remote-debug)\n",
                )
                    .into_response()
            }
        },
    ));
    Router::new()
        .route("/metrics", get(metrics))
        .route("/ready", get(ready))
        .merge(debug)
        .with_state(state)
}

/// The `/debug` views as `istio.io/debug` requests over xDS run them: the caller was
/// authorized by the identity it proved there, so the call is made as a local one. Holds
/// meshd's xDS state weakly (that state holds this).
pub fn in_process(state: DebugState) -> DebugViews {
    let xds = Arc::downgrade(&state.xds);
    let DebugState {
        metrics,
        store,
        issues,
        ready,
        ..
    } = state;
    Arc::new(move |path: String| {
        let state = xds.upgrade().map(|xds| DebugState {
            metrics: metrics.clone(),
            store: store.clone(),
            issues: issues.clone(),
            xds,
            ready: ready.clone(),
        });
        Box::pin(async move {
            let Some(state) = state else {
                return (503, b"meshd is shutting down".to_vec());
            };
            call(router(state, false), &path).await
        })
    })
}

/// One GET of `path` (with its query) through `router`, from the loopback address.
async fn call(router: Router, path: &str) -> (u16, Vec<u8>) {
    use tower::ServiceExt;
    let Ok(mut request) = axum::http::Request::get(path).body(axum::body::Body::empty()) else {
        return (400, format!("not a path: {path:?}").into_bytes());
    };
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 0))));
    let Ok(response) = router.oneshot(request).await;
    let status = response.status().as_u16();
    match axum::body::to_bytes(response.into_body(), usize::MAX).await {
        Ok(body) => (status, body.to_vec()),
        Err(e) => (500, format!("reading the view {path}: {e}").into_bytes()),
    }
}

/// `/debug`: every view with what it shows, as istiod's debug console lists them.
async fn index() -> axum::response::Html<String> {
    let rows: String = views()
        .iter()
        .map(|(path, help, _)| {
            format!("<tr><td><a href='{path}'>{path}</a></td><td>{help}</td></tr>\n")
        })
        .collect();
    axum::response::Html(format!(
        "<html>\n<head><title>meshd debug views</title></head>\n<body>\n\
         <table>\n<tr><th>View</th><th>Shows</th></tr>\n{rows}</table>\n</body>\n</html>\n"
    ))
}

/// `/debug/list`: the views' names (without `/debug/`), sorted, as istiod lists its
/// debug commands (itself left out).
async fn list() -> Json<Vec<&'static str>> {
    let mut names: Vec<&str> = (views().iter())
        .map(|(path, _, _)| path.trim_start_matches("/debug/"))
        .filter(|name| *name != "list")
        .collect();
    names.sort_unstable();
    Json(names)
}

/// Whether a caller at `peer` may read the debug views.
pub fn debug_allowed(peer: SocketAddr, remote_debug: bool) -> bool {
    remote_debug || peer.ip().is_loopback()
}

async fn metrics(State(s): State<DebugState>) -> impl IntoResponse {
    // Derived from the current push when scraped, as istiod derives its push-status gauges.
    let push = s.xds.current_push();
    let no_instances = push.context.clusters_without_endpoints().len();
    (s.metrics.push.eds_no_instances).set(i64::try_from(no_instances).unwrap_or(i64::MAX));
    let duplicates = push.context.destination_rules.duplicate_subsets.len();
    (s.metrics.push.destrule_subsets).set(i64::try_from(duplicates).unwrap_or(i64::MAX));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
    )
}

async fn ready(State(s): State<DebugState>) -> impl IntoResponse {
    if s.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "initial configuration not loaded yet\n",
        )
    }
}

/// Every accepted object, every problem found per file, and cross-object problems.
async fn configz(State(s): State<DebugState>) -> impl IntoResponse {
    let objects: Vec<_> = s
        .store
        .read()
        .unwrap()
        .iter()
        .map(|o| {
            json!({
                "kind": o.key.kind,
                "namespace": o.key.namespace,
                "name": o.key.name,
                "generation": o.meta.generation,
                "labels": o.meta.labels,
                "annotations": o.meta.annotations,
                "spec": o.spec,
            })
        })
        .collect();
    let issues = s.issues.read().unwrap().clone();
    let push = s.xds.current_push();
    let missing: Vec<_> = model::config::Kind::ALL
        .into_iter()
        .filter(|k| {
            let labels = vec![("type", k.to_string())];
            s.metrics
                .sources
                .crd_missing
                .get(&labels)
                .is_some_and(|g| g.get() == 1)
        })
        .map(crate::k8s::crds::crd_name)
        .collect();
    Json(json!({
        "objects": objects,
        "missingCrds": missing,
        "errors": issues,
        "crossObjectWarnings": &*push.context.issues,
    }))
}

async fn syncz(State(s): State<DebugState>) -> impl IntoResponse {
    Json(s.xds.sync_status())
}

#[derive(serde::Deserialize)]
struct ProxyQuery {
    #[serde(rename = "proxyID")]
    proxy_id: String,
}

#[derive(serde::Deserialize)]
struct OptionalProxyQuery {
    #[serde(rename = "proxyID")]
    proxy_id: Option<String>,
}

/// The connections a `proxyID` names (a full node id, or `POD.NAMESPACE` as istioctl
/// takes it); every connection when there is none.
fn connections(s: &DebugState, proxy_id: Option<&str>) -> Vec<SyncStatus> {
    s.xds
        .sync_status()
        .into_iter()
        .filter(|c| proxy_id.is_none_or(|id| proxy_matches(&c.model.id, id)))
        .collect()
}

/// The first connection of the proxy `id` names, or the answer saying there is none.
fn connection(s: &DebugState, id: &str) -> Result<SyncStatus, (StatusCode, Json<Value>)> {
    (connections(s, Some(id)).into_iter().next()).ok_or_else(|| no_proxy(id))
}

fn no_proxy(id: &str) -> (StatusCode, Json<Value>) {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"error": format!("no connected proxy {id:?}")})),
    )
}

/// The effective mTLS mode of each inbound port of a connected proxy, and the
/// PeerAuthentication that decided it.
async fn authenticationz(
    State(s): State<DebugState>,
    axum::extract::Query(q): axum::extract::Query<ProxyQuery>,
) -> impl IntoResponse {
    let proxy = match connection(&s, &q.proxy_id) {
        Ok(c) => c.model,
        Err(none) => return none,
    };
    let push = s.xds.current_push();
    let ctx = &push.context;
    let ports: Vec<_> = ctx
        .sidecar_for(&proxy)
        .map(|(_, sc)| sc.ingress.iter().map(|i| i.port.number).collect())
        .unwrap_or_else(Vec::new)
        .into_iter()
        .map(|port| {
            let d = ctx.mtls_mode(&proxy, port);
            json!({"port": port, "mode": d.mode, "policy": d.policy})
        })
        .collect();
    let applying = ctx.authorization_policies_for(&proxy);
    let names = |dry: bool| -> Vec<String> {
        (applying.iter())
            .filter(|(o, _)| (api::security::dry_run(&o.meta.annotations) == Some(true)) == dry)
            .map(|(o, _)| o.key.namespaced_name())
            .collect()
    };
    (
        StatusCode::OK,
        Json(json!({
            "proxy": proxy.id,
            "ports": ports,
            "authorizationPolicies": names(false),
            "dryRunAuthorizationPolicies": names(true),
        })),
    )
}

async fn registryz(State(s): State<DebugState>) -> impl IntoResponse {
    let push = s.xds.current_push();
    Json(
        push.context
            .all_services()
            .map(|s| (**s).clone())
            .collect::<Vec<_>>(),
    )
}

/// How many of a push's changed objects `/debug/push_status` names.
const PUSH_STATUS_CHANGED: usize = 100;

async fn push_status(State(s): State<DebugState>) -> impl IntoResponse {
    let push = s.xds.current_push();
    let proxies = s.xds.sync_status();
    // The connections that do not hold this push in full yet.
    let mut behind: Vec<&str> = (proxies.iter())
        .filter(|c| c.in_sync_push < push.number)
        .map(|c| c.model.id.as_str())
        .collect();
    behind.sort_unstable();
    let no_instances: serde_json::Map<String, Value> = (push.context)
        .clusters_without_endpoints()
        .into_iter()
        .map(|cluster| (cluster, json!({})))
        .collect();
    let wall = |at: std::time::Instant| {
        let ago = std::time::Instant::now().saturating_duration_since(at);
        xds::push::rfc3339(std::time::SystemTime::now() - ago, true)
    };
    Json(json!({
        "version": push.version(),
        "revision": s.xds.revisions.revision(),
        "tags": s.xds.revisions.tags(),
        "push": push.number,
        // When the push's first change came, and when the push went out to the proxies.
        "start": wall(push.triggered_at),
        "published": wall(push.published_at),
        "services": push.context.service_count(),
        "virtualServices": push.context.virtual_services.len(),
        "connectedProxies": proxies.len(),
        "proxiesInSync": proxies.len() - behind.len(),
        "proxiesBehind": &behind[..behind.len().min(PUSH_STATUS_CHANGED)],
        "serviceAccounts": service_accounts(&push.context),
        // istiod's push-status maps: the clusters with no endpoint, and the hosts whose
        // DestinationRules, merged, named a subset twice.
        "pilot_eds_no_instances": no_instances,
        "pilot_destrule_subsets": duplicate_subsets(&push.context),
        "crossObjectWarnings": push.context.issues.len(),
        // What the push was triggered by (null: a full push, as the first one).
        "changedObjects": push.changed.as_ref().map(|c| c.len()),
        "changed": push.changed.as_ref().map(|c| {
            c.iter().take(PUSH_STATUS_CHANGED).map(|k| k.to_string()).collect::<Vec<_>>()
        }),
    }))
}

/// istiod's `pilot_destrule_subsets` map: host -> `{"message": ...}`.
fn duplicate_subsets(ctx: &model::push_context::PushContext) -> Value {
    let map = &ctx.destination_rules.duplicate_subsets;
    let entries = map
        .iter()
        .map(|(host, message)| (host.clone(), json!({"message": message})));
    Value::Object(entries.collect())
}

/// The workload identities serving each port of each service (from its endpoints'
/// service accounts), as SPIFFE URIs: host -> port -> identities.
fn service_accounts(ctx: &model::push_context::PushContext) -> Value {
    let trust_domain = ctx.mesh.trust_domain.as_deref().unwrap_or("cluster.local");
    let mut out = serde_json::Map::new();
    for svc in ctx.services.values() {
        let mut ports = serde_json::Map::new();
        for p in &svc.ports {
            let mut ids: Vec<String> = (svc.endpoints.iter())
                .filter(|e| e.ports.contains_key(&p.port))
                .filter_map(|e| e.service_account.as_deref())
                .map(|sa| format!("spiffe://{trust_domain}/ns/{}/sa/{sa}", svc.namespace))
                .collect();
            ids.sort_unstable();
            ids.dedup();
            if !ids.is_empty() {
                ports.insert(p.port.to_string(), json!(ids));
            }
        }
        if !ports.is_empty() {
            out.insert(svc.hostname.clone(), Value::Object(ports));
        }
    }
    Value::Object(out)
}

/// Every connected proxy, its HTTP/2 connection and, per type, the resource names its
/// configuration holds now.
async fn adsz(
    State(s): State<DebugState>,
    axum::extract::Query(q): axum::extract::Query<OptionalProxyQuery>,
) -> impl IntoResponse {
    let push = s.xds.current_push();
    let out: Vec<Value> = connections(&s, q.proxy_id.as_deref())
        .into_iter()
        .map(|c| {
            let view = push.view(&c.model);
            let watched: serde_json::Map<String, Value> = [
                TypeKind::Cluster,
                TypeKind::Endpoint,
                TypeKind::Listener,
                TypeKind::Route,
                TypeKind::VirtualHost,
                TypeKind::Secret,
            ]
            .into_iter()
            .map(|k| {
                let names: Vec<&str> = view.all(k).keys().map(|n| &**n).collect();
                (k.short().to_string(), json!(names))
            })
            .collect();
            // The HTTP/2 connection the stream is on, and the streams open on it (at
            // most `ISTIO_GPRC_MAXSTREAMS`: a client's further streams wait).
            let transport = c.transport.as_ref();
            json!({
                "connectionId": c.connection_id(),
                "proxy": c.model.id,
                "delta": c.delta,
                "inSyncPush": c.in_sync_push,
                "http2Connection": transport.map(|t| t.number),
                "http2OpenStreams": transport.map(|t| t.open_streams()),
                "resources": watched,
            })
        })
        .collect();
    Json(json!({"push": push.number, "version": push.version(), "clients": out}))
}

/// One type's resources, as JSON, for each connected proxy (or the one named).
fn per_proxy(s: &DebugState, proxy_id: Option<&str>, kind: TypeKind) -> (StatusCode, Json<Value>) {
    let push = s.xds.current_push();
    let found = connections(s, proxy_id);
    if let (Some(id), true) = (proxy_id, found.is_empty()) {
        return no_proxy(id);
    }
    let out: Vec<Value> = found
        .into_iter()
        .map(|c| {
            let view = push.view(&c.model);
            json!({"proxy": c.model.id, "version": push.version(), "resources": dump::resources_json(&view, kind)})
        })
        .collect();
    (StatusCode::OK, Json(json!(out)))
}

async fn cdsz(
    State(s): State<DebugState>,
    axum::extract::Query(q): axum::extract::Query<OptionalProxyQuery>,
) -> impl IntoResponse {
    per_proxy(&s, q.proxy_id.as_deref(), TypeKind::Cluster)
}

async fn edsz(
    State(s): State<DebugState>,
    axum::extract::Query(q): axum::extract::Query<OptionalProxyQuery>,
) -> impl IntoResponse {
    per_proxy(&s, q.proxy_id.as_deref(), TypeKind::Endpoint)
}

/// A proxy's listeners, routes, clusters, endpoints and secrets in the shape of Envoy's
/// admin `/config_dump` (keys redacted).
async fn config_dump(
    State(s): State<DebugState>,
    axum::extract::Query(q): axum::extract::Query<ProxyQuery>,
) -> impl IntoResponse {
    let c = match connection(&s, &q.proxy_id) {
        Ok(c) => c,
        Err(none) => return none,
    };
    let push = s.xds.current_push();
    let view = push.view(&c.model);
    let at = push
        .version()
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    (
        StatusCode::OK,
        Json(dump::config_dump(
            &view,
            push.version(),
            &at,
            c.route_names.as_deref(),
        )),
    )
}

/// A proxy's DNS name table as istiod's `/debug/ndsz` shows it: a config dump of the one
/// table, built for any proxy (only one whose agent runs a DNS proxy is sent it).
async fn ndsz(
    State(s): State<DebugState>,
    axum::extract::Query(q): axum::extract::Query<ProxyQuery>,
) -> impl IntoResponse {
    use translate::name_table::{name_table, to_json};
    let c = match connection(&s, &q.proxy_id) {
        Ok(c) => c,
        Err(none) => return none,
    };
    let push = s.xds.current_push();
    let services = translate::services(&push.context, &c.model);
    let table = name_table(&c.model, &services);
    let configs = json!({"configs": [to_json(&table)]});
    (StatusCode::OK, Json(configs))
}

#[derive(serde::Deserialize)]
struct BriefQuery {
    brief: Option<String>,
}

/// Every service's endpoints; `?brief=1` gives a table.
async fn endpointz(
    State(s): State<DebugState>,
    axum::extract::Query(q): axum::extract::Query<BriefQuery>,
) -> axum::response::Response {
    let push = s.xds.current_push();
    let services = push.context.all_services();
    if q.brief
        .as_deref()
        .is_some_and(|b| !b.is_empty() && b != "0" && b != "false")
    {
        return endpoint_table(services.map(|s| &**s)).into_response();
    }
    let out: Vec<Value> = services
        .map(|svc| {
            json!({
                "service": svc.hostname,
                "namespace": svc.namespace,
                "ports": svc.ports,
                "endpoints": svc.endpoints,
            })
        })
        .collect();
    Json(out).into_response()
}

/// `/debug/endpointz?brief=1`: one line per endpoint and service port.
pub fn endpoint_table<'a>(services: impl Iterator<Item = &'a Service>) -> String {
    let mut rows = vec![[
        "SERVICE".to_string(),
        "PORT".into(),
        "ENDPOINT".into(),
        "HEALTHY".into(),
        "POD".into(),
        "SERVICE ACCOUNT".into(),
    ]];
    for svc in services {
        for port in &svc.ports {
            for e in &svc.endpoints {
                let Some(target) = e.ports.get(&port.port) else {
                    continue;
                };
                rows.push([
                    svc.hostname.clone(),
                    format!("{} ({})", port.port, port.name),
                    format!("{}:{target}", e.address),
                    e.healthy.to_string(),
                    e.pod.clone().unwrap_or_else(|| "-".into()),
                    e.service_account.clone().unwrap_or_else(|| "-".into()),
                ]);
            }
        }
    }
    crate::cli::table(&rows)
}

/// Endpoints per service and namespace, grouped by the registry that provided them, with
/// their network, locality, weight and the EDS form each port's cluster gives them.
async fn endpoint_shardz(State(s): State<DebugState>) -> impl IntoResponse {
    let push = s.xds.current_push();
    let mut out = serde_json::Map::new();
    for svc in push.context.all_services() {
        let shard = if svc.kubernetes {
            "Kubernetes/Kubernetes".to_string()
        } else {
            format!("External/{}", svc.name)
        };
        let xds: serde_json::Map<String, Value> = svc
            .ports
            .iter()
            .map(|p| {
                let name = format!("outbound|{}||{}", p.port, svc.hostname);
                let cla =
                    translate::endpoint::load_assignment(&name, svc, p.port, |_| true, None, None);
                let json = dump::any_to_json(&encode(&name, &cla).any())
                    .unwrap_or_else(|e| json!({"error": e.to_string()}));
                (name, json)
            })
            .collect();
        let endpoints: Vec<Value> = svc
            .endpoints
            .iter()
            .map(|e| {
                json!({
                    "address": e.address,
                    "ports": e.ports,
                    "labels": e.labels,
                    "serviceAccount": e.service_account,
                    "pod": e.pod,
                    "network": e.network,
                    "locality": e.locality,
                    "lbWeight": e.weight,
                    "healthy": e.healthy,
                })
            })
            .collect();
        out.entry(svc.hostname.clone())
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .expect("BUG: built as an object")
            .insert(
                svc.namespace.clone(),
                json!({"Shards": {shard: endpoints}, "xds": xds}),
            );
    }
    Json(Value::Object(out))
}

/// The proxies connected to this instance ("workloads") and their metadata.
async fn workloadz(State(s): State<DebugState>) -> impl IntoResponse {
    let push = s.xds.current_push();
    let out: Vec<Value> = s
        .xds
        .sync_status()
        .into_iter()
        .map(|c| {
            let p = &c.model;
            json!({
                "proxy": p.id,
                "type": p.kind,
                "namespace": p.namespace,
                "pod": p.pod_name,
                "ips": p.ips,
                "labels": push.context.proxy_labels(p),
                "serviceAccount": p.service_account,
                "identity": p.identity,
                "clusterId": p.cluster_id,
                "istioVersion": p.istio_version,
                "revision": push.context.proxy_revision(p),
                "interception": p.interception,
                "connectionId": c.connection_id(),
            })
        })
        .collect();
    Json(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_views_answer_local_callers_unless_told_otherwise() {
        let local: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let local6: SocketAddr = "[::1]:5000".parse().unwrap();
        let remote: SocketAddr = "10.1.2.3:5000".parse().unwrap();
        assert!(debug_allowed(local, false) && debug_allowed(local6, false));
        assert!(!debug_allowed(remote, false));
        assert!(debug_allowed(remote, true));
    }
}
