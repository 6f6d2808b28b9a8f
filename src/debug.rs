//! The monitoring port (15014): `/metrics`, `/ready`, and the debug views
//! (`/debug/configz`, `/debug/syncz`, `/debug/registryz`, `/debug/push_status`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use axum::Router;
use std::net::SocketAddr;

use axum::extract::{ConnectInfo, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use serde_json::json;

use crate::filesource::IssueBoard;
use crate::metrics::Metrics;
use crate::model::Store;
use crate::xds::XdsShared;

#[derive(Clone)]
pub struct DebugState {
    pub metrics: Arc<Metrics>,
    pub store: Arc<RwLock<Store>>,
    pub issues: IssueBoard,
    pub xds: Arc<XdsShared>,
    pub ready: Arc<AtomicBool>,
}

/// `/metrics` and `/ready` for everyone (Prometheus, probes); the `/debug` views, which
/// expose configuration, only to local callers unless `remote_debug` is set.
pub fn router(state: DebugState, remote_debug: bool) -> Router {
    let debug = Router::new()
        .route("/debug/configz", get(configz))
        .route("/debug/syncz", get(syncz))
        .route("/debug/registryz", get(registryz))
        .route("/debug/push_status", get(push_status))
        .route("/debug/authenticationz", get(authenticationz))
        .layer(axum::middleware::from_fn(
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

/// Whether a caller at `peer` may read the debug views.
pub fn debug_allowed(peer: SocketAddr, remote_debug: bool) -> bool {
    remote_debug || peer.ip().is_loopback()
}

async fn metrics(State(s): State<DebugState>) -> impl IntoResponse {
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
    Json(json!({
        "objects": objects,
        "errors": issues,
        "crossObjectWarnings": push.context.issues,
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

/// The effective mTLS mode of each inbound port of a connected proxy, and the
/// PeerAuthentication that decided it.
async fn authenticationz(
    State(s): State<DebugState>,
    axum::extract::Query(q): axum::extract::Query<ProxyQuery>,
) -> impl IntoResponse {
    let Some(proxy) = s
        .xds
        .sync_status()
        .into_iter()
        .find(|c| c.proxy == q.proxy_id || c.proxy.contains(&format!("~{}~", q.proxy_id)))
        .map(|c| c.model)
    else {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"error": format!("no connected proxy {:?}", q.proxy_id)})),
        );
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
    let policies: Vec<String> = ctx
        .authorization_policies_for(&proxy)
        .iter()
        .map(|(o, _)| format!("{}/{}", o.key.namespace, o.key.name))
        .collect();
    (
        StatusCode::OK,
        Json(json!({
            "proxy": proxy.id,
            "ports": ports,
            "authorizationPolicies": policies,
        })),
    )
}

async fn registryz(State(s): State<DebugState>) -> impl IntoResponse {
    let push = s.xds.current_push();
    Json(
        push.context
            .services
            .values()
            .map(|s| (**s).clone())
            .collect::<Vec<_>>(),
    )
}

async fn push_status(State(s): State<DebugState>) -> impl IntoResponse {
    let push = s.xds.current_push();
    Json(json!({
        "version": push.version(),
        "push": push.number,
        "services": push.context.services.len(),
        "virtualServices": push.context.virtual_services.len(),
        "connectedProxies": s.xds.sync_status().len(),
        "crossObjectWarnings": push.context.issues.len(),
    }))
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
