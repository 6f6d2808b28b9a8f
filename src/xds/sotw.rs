//! State-of-the-world ADS (`StreamAggregatedResources`): every response carries the full
//! subscribed set of its type; requests ACK or NACK by nonce; a stale nonce is ignored.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::connection::Connection;
use super::push::Push;
use super::resource::TypeKind;
use super::{Closed, XdsShared, proxy_from_node};
use crate::metrics::type_label;

type Tx = mpsc::Sender<Result<DiscoveryResponse, Status>>;

pub async fn run(shared: Arc<XdsShared>, mut requests: Streaming<DiscoveryRequest>, tx: Tx) {
    let first = match requests.message().await {
        Ok(Some(r)) => r,
        _ => return,
    };
    let proxy = match proxy_from_node(&shared, first.node.as_ref()) {
        Ok(p) => p,
        Err(status) => {
            let _ = tx.send(Err(status)).await;
            return;
        }
    };
    let mut pushes = shared.subscribe();
    let mut conn = Connection::new(shared.clone(), proxy, false);
    conn.push = pushes.borrow_and_update().clone();
    tracing::info!(proxy = %conn.proxy.id, "proxy connected (SotW)");
    if handle(&mut conn, first, &tx).await.is_err() {
        return;
    }
    loop {
        tokio::select! {
            msg = requests.message() => match msg {
                Ok(Some(req)) => if handle(&mut conn, req, &tx).await.is_err() { break },
                Ok(None) => break,
                Err(status) => {
                    shared.metrics.xds_connection_errors.get_or_create(&vec![("reason", "stream".to_string())]).inc();
                    tracing::info!(proxy = %conn.proxy.id, "stream closed with error: {}", status.message());
                    break;
                }
            },
            changed = pushes.changed() => {
                if changed.is_err() { break }
                let push = pushes.borrow_and_update().clone();
                if push_to(&mut conn, push, &tx).await.is_err() { break }
            }
        }
    }
    tracing::info!(proxy = %conn.proxy.id, "proxy disconnected");
}

async fn handle(conn: &mut Connection, req: DiscoveryRequest, tx: &Tx) -> Result<(), Closed> {
    let Some(kind) = TypeKind::from_url(&req.type_url) else {
        tracing::debug!(proxy = %conn.proxy.id, type_url = %req.type_url, "ignoring request for an unserved type");
        return Ok(());
    };
    let idx = kind as usize;
    if let Some(err) = &req.error_detail {
        conn.record_nack(kind, &req.response_nonce, &err.message);
        return Ok(());
    }
    let nonce = req.response_nonce.clone();
    if !nonce.is_empty() && conn.watches[idx].nonce_sent.as_deref() != Some(nonce.as_str()) {
        conn.record_expired_nonce(kind);
        return Ok(());
    }
    let names: BTreeSet<String> = req
        .resource_names
        .iter()
        .filter(|n| n.as_str() != "*")
        .cloned()
        .collect();
    let w = &mut conn.watches[idx];
    let first = nonce.is_empty();
    if kind.wildcard() {
        w.wildcard = req.resource_names.is_empty() || req.resource_names.iter().any(|n| n == "*");
    }
    let names_changed = w.names != names;
    w.names = names;
    w.subscribed = true;
    if !first {
        conn.record_ack(kind, &nonce);
    }
    let w = &mut conn.watches[idx];
    let always = std::mem::take(&mut w.always_respond);
    if first || names_changed || always {
        respond(conn, kind, None, tx).await?;
    }
    Ok(())
}

async fn respond(
    conn: &mut Connection,
    kind: TypeKind,
    trigger: Option<Instant>,
    tx: &Tx,
) -> Result<(), Closed> {
    let view = conn.view();
    let (changed, _) = conn.diff(&view, kind);
    let resources = conn.desired(&view, kind);
    let nonce = conn.record_sent(kind, &resources, &[], true, trigger);
    if kind == TypeKind::Cluster && !changed.is_empty() {
        conn.force_endpoints_after_clusters(&changed);
    }
    let response = DiscoveryResponse {
        version_info: conn.push.version().to_string(),
        resources: resources.iter().map(|r| r.body.clone()).collect(),
        type_url: kind.url().to_string(),
        nonce,
        ..Default::default()
    };
    tx.send(Ok(response)).await.map_err(|_| Closed)
}

async fn push_to(conn: &mut Connection, push: Arc<Push>, tx: &Tx) -> Result<(), Closed> {
    let shared = conn.shared.clone();
    if !push.affects(&conn.proxy) {
        conn.push = push; // nothing it depends on changed: no queue, no diff, no send
        return Ok(());
    }
    let _permit = shared.throttle.acquire().await.map_err(|_| Closed)?;
    shared
        .metrics
        .proxy_queue_time
        .observe(push.published_at.elapsed().as_secs_f64());
    let trigger = Some(push.triggered_at);
    conn.push = push;
    let view = conn.view();
    for kind in conn.subscribed_types() {
        let started = Instant::now();
        let (changed, removed) = conn.diff(&view, kind);
        if changed.is_empty() && removed.is_empty() {
            continue;
        }
        respond(conn, kind, trigger, tx).await?;
        shared
            .metrics
            .xds_push_time
            .get_or_create(&type_label(kind.short()))
            .observe(started.elapsed().as_secs_f64());
    }
    Ok(())
}
