//! Incremental ADS (`DeltaAggregatedResources`): responses carry only what changed plus
//! `removed_resources`; subscriptions change by `resource_names_subscribe` /
//! `_unsubscribe`; `initial_resource_versions` on reconnect means only differences are sent.

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource as PbResource,
};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::connection::Connection;
use super::push::Push;
use super::resource::TypeKind;
use super::{Closed, XdsShared, proxy_from_node};
use crate::metrics::type_label;

type Tx = mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>;

pub async fn run(shared: Arc<XdsShared>, mut requests: Streaming<DeltaDiscoveryRequest>, tx: Tx) {
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
    let mut conn = Connection::new(shared.clone(), proxy, true);
    conn.push = pushes.borrow_and_update().clone();
    tracing::info!(proxy = %conn.proxy.id, "proxy connected (delta)");
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

async fn handle(conn: &mut Connection, req: DeltaDiscoveryRequest, tx: &Tx) -> Result<(), Closed> {
    let Some(kind) = TypeKind::from_url(&req.type_url) else {
        tracing::debug!(proxy = %conn.proxy.id, type_url = %req.type_url, "ignoring request for an unserved type");
        return Ok(());
    };
    let idx = kind as usize;
    if let Some(err) = &req.error_detail {
        conn.record_nack(kind, &req.response_nonce, &err.message);
    } else if !req.response_nonce.is_empty() {
        if conn.watches[idx].nonce_sent.as_deref() == Some(req.response_nonce.as_str()) {
            conn.record_ack(kind, &req.response_nonce);
        } else {
            conn.record_expired_nonce(kind);
        }
    }
    // Subscription changes are honoured whatever the nonce.
    let w = &mut conn.watches[idx];
    let first = !w.subscribed;
    if first {
        w.subscribed = true;
        w.sent = req.initial_resource_versions.clone().into_iter().collect();
        w.wildcard = kind.wildcard()
            && (req.resource_names_subscribe.is_empty()
                || req.resource_names_subscribe.iter().any(|n| n == "*"));
    }
    for name in &req.resource_names_subscribe {
        if name == "*" {
            w.wildcard = true;
            continue;
        }
        w.names.insert(name.clone());
        if !first {
            // A re-subscribed resource must be resent.
            w.force.insert(name.clone());
        }
    }
    for name in &req.resource_names_unsubscribe {
        if name == "*" {
            w.wildcard = false;
            continue;
        }
        w.names.remove(name);
        w.sent.remove(name);
        w.force.remove(name);
    }
    if first || !req.resource_names_subscribe.is_empty() {
        respond(conn, kind, None, Part::Everything, first, tx).await?;
    }
    Ok(())
}

/// Which part of the difference a response carries.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Part {
    Everything,
    /// Added and changed resources only.
    Updates,
    /// Removals only.
    Removals,
}

/// Sends what differs for `kind`; with `always`, sends even an empty response.
async fn respond(
    conn: &mut Connection,
    kind: TypeKind,
    trigger: Option<Instant>,
    part: Part,
    always: bool,
    tx: &Tx,
) -> Result<bool, Closed> {
    let view = conn.view();
    let (mut changed, mut removed) = conn.diff(&view, kind);
    match part {
        Part::Everything => {}
        Part::Updates => removed.clear(),
        Part::Removals => changed.clear(),
    }
    if changed.is_empty() && removed.is_empty() && !always {
        return Ok(false);
    }
    let nonce = conn.record_sent(kind, &changed, &removed, false, trigger);
    if kind == TypeKind::Cluster && !changed.is_empty() {
        conn.force_endpoints_after_clusters(&changed);
    }
    let response = DeltaDiscoveryResponse {
        system_version_info: conn.push.version().to_string(),
        resources: changed
            .iter()
            .map(|r| PbResource {
                name: r.name.clone(),
                version: r.version.clone(),
                resource: Some(r.body.clone()),
                ..Default::default()
            })
            .collect(),
        type_url: kind.url().to_string(),
        removed_resources: removed,
        nonce,
        ..Default::default()
    };
    tx.send(Ok(response)).await.map_err(|_| Closed)?;
    Ok(true)
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
    // Make-before-break: clusters are added and updated first and removed last, after the
    // listeners and routes that stop using them.
    let types = conn.subscribed_types();
    for kind in &types {
        let kind = *kind;
        let started = Instant::now();
        let part = if kind == TypeKind::Cluster {
            Part::Updates
        } else {
            Part::Everything
        };
        if respond(conn, kind, trigger, part, false, tx).await? {
            shared
                .metrics
                .xds_push_time
                .get_or_create(&type_label(kind.short()))
                .observe(started.elapsed().as_secs_f64());
        }
    }
    if types.contains(&TypeKind::Cluster) {
        respond(conn, TypeKind::Cluster, trigger, Part::Removals, false, tx).await?;
    }
    Ok(())
}
