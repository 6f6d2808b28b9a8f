//! State-of-the-world ADS (`StreamAggregatedResources`): every response carries the full
//! subscribed set of its type; requests ACK or NACK by nonce; a stale nonce is ignored.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use envoy_api::pb::envoy::config::core::v3::Node;
use envoy_api::pb::envoy::service::discovery::v3::DiscoveryRequest;

use super::Closed;
use super::connection::Connection;
use super::resource::{Resource, TypeKind};
use super::stream::Framing;
use super::wire::{Batch, SotwResponse};

type Tx = super::stream::Tx<SotwResponse>;

/// State-of-the-world framing.
pub struct Sotw;

impl Framing for Sotw {
    type Request = DiscoveryRequest;
    type Response = SotwResponse;
    const NAME: &'static str = "SotW";

    fn node(request: &DiscoveryRequest) -> Option<&Node> {
        request.node.as_ref()
    }

    async fn handle(
        conn: &mut Connection,
        request: DiscoveryRequest,
        tx: &Tx,
    ) -> Result<(), Closed> {
        handle(conn, request, tx).await
    }

    async fn push(conn: &mut Connection, tx: &Tx) -> Result<(), Closed> {
        push_to(conn, tx).await
    }

    fn asks<'r>(
        request: &'r DiscoveryRequest,
        last_sent: Option<&str>,
    ) -> Option<(&'r str, &'r [String])> {
        let nonce = request.response_nonce.as_str();
        (nonce.is_empty() || last_sent != Some(nonce))
            .then_some((request.type_url.as_str(), &request.resource_names[..]))
    }

    fn debug_response(a: super::debug::Answer) -> SotwResponse {
        let mut response = SotwResponse::new(a.version, a.type_url, a.nonce, a.resources);
        response.control_plane = a.control_plane;
        response
    }
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
    // A nonce for a type this stream never answered is the previous server's (a client
    // that reconnected) or the client's own: a first request, as istiod takes it.
    let never_sent = conn.watches[idx].nonce_sent.is_none();
    if !nonce.is_empty()
        && !never_sent
        && conn.watches[idx].nonce_sent.as_deref() != Some(nonce.as_str())
    {
        conn.record_expired_nonce(kind, &nonce);
        return Ok(());
    }
    let requested: BTreeSet<&str> = req
        .resource_names
        .iter()
        .map(String::as_str)
        .filter(|n| *n != "*")
        .collect();
    // An ACK repeats the names; only a changed set is interned against the view.
    let names_changed = !conn.watches[idx]
        .names
        .iter()
        .map(|n| &**n)
        .eq(requested.iter().copied());
    if names_changed {
        let view = conn.view();
        conn.watches[idx].names = requested
            .iter()
            .map(|n| Connection::intern(&view, kind, n))
            .collect();
    }
    let w = &mut conn.watches[idx];
    let first = nonce.is_empty() || never_sent;
    if kind.wildcard() {
        w.wildcard = req.resource_names.is_empty() || req.resource_names.iter().any(|n| n == "*");
    }
    w.subscribed = true;
    if !first {
        conn.record_ack(kind, &nonce);
    }
    let w = &mut conn.watches[idx];
    let always = std::mem::take(&mut w.always_respond);
    if first || names_changed || always {
        let view = conn.view();
        let desired = conn.desired(&view, kind);
        let (changed, _) = conn.diff_of(kind, &desired);
        respond(conn, kind, desired, &changed, None, tx).await?;
    }
    if kind == TypeKind::Route && (first || names_changed) {
        conn.note_route_names();
    }
    Ok(())
}

/// Sends the full subscribed set of `kind` (`resources`); `changed` is the part of it the
/// proxy does not hold yet.
async fn respond(
    conn: &mut Connection,
    kind: TypeKind,
    resources: Vec<Arc<Resource>>,
    changed: &[Arc<Resource>],
    trigger: Option<Instant>,
    tx: &Tx,
) -> Result<(), Closed> {
    let resources = Batch::from(resources);
    let nonce = conn.record_sent(kind, &resources, &[], true, trigger);
    if kind == TypeKind::Cluster && !changed.is_empty() {
        conn.force_endpoints_after_clusters(changed);
    }
    let response = SotwResponse::new(
        conn.push.version().to_string(),
        kind.url(),
        nonce,
        resources,
    );
    super::stream::send(conn, kind, tx, response).await
}

async fn push_to(conn: &mut Connection, tx: &Tx) -> Result<(), Closed> {
    let shared = conn.shared.clone();
    let trigger = Some(conn.push.triggered_at());
    let view = conn.view();
    for kind in conn.subscribed_types() {
        let started = Instant::now();
        let desired = conn.desired(&view, kind);
        let (changed, removed) = conn.diff_of(kind, &desired);
        if changed.is_empty() && removed.is_empty() {
            continue;
        }
        respond(conn, kind, desired, &changed, trigger, tx).await?;
        (shared.push_time_of(kind)).observe(started.elapsed().as_secs_f64());
    }
    Ok(())
}
