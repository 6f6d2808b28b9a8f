//! Incremental ADS (`DeltaAggregatedResources`): responses carry only what changed plus
//! `removed_resources`; subscriptions change by `resource_names_subscribe` /
//! `_unsubscribe`; `initial_resource_versions` on reconnect means only differences are sent.

use std::time::Instant;

use envoy_api::pb::envoy::config::core::v3::Node;
use envoy_api::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;

use super::Closed;
use super::connection::Connection;
use super::resource::{TypeKind, View};
use super::stream::Framing;
use super::wire::{Batch, DeltaResponse};

type Tx = super::stream::Tx<DeltaResponse>;

/// Delta framing.
pub struct Delta;

impl Framing for Delta {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaResponse;
    const NAME: &'static str = "delta";

    fn node(request: &DeltaDiscoveryRequest) -> Option<&Node> {
        request.node.as_ref()
    }

    async fn handle(
        conn: &mut Connection,
        request: DeltaDiscoveryRequest,
        tx: &Tx,
    ) -> Result<(), Closed> {
        handle(conn, request, tx).await
    }

    async fn push(conn: &mut Connection, tx: &Tx) -> Result<(), Closed> {
        push_to(conn, tx).await
    }

    fn asks<'r>(
        request: &'r DeltaDiscoveryRequest,
        last_sent: Option<&str>,
    ) -> Option<(&'r str, &'r [String])> {
        let nonce = request.response_nonce.as_str();
        (nonce.is_empty() || last_sent != Some(nonce)).then_some((
            request.type_url.as_str(),
            &request.resource_names_subscribe[..],
        ))
    }

    fn debug_response(a: super::debug::Answer) -> DeltaResponse {
        let (version, nonce) = (a.version, a.nonce);
        let mut response =
            DeltaResponse::new(version, a.type_url, nonce, a.resources, vec![], false);
        response.control_plane = a.control_plane;
        response
    }
}

async fn handle(conn: &mut Connection, req: DeltaDiscoveryRequest, tx: &Tx) -> Result<(), Closed> {
    let kind = TypeKind::from_url(&req.type_url);
    let route_names_change = kind == Some(TypeKind::Route)
        && (!conn.watches[TypeKind::Route as usize].subscribed
            || !req.resource_names_subscribe.is_empty()
            || !req.resource_names_unsubscribe.is_empty());
    handle_request(conn, req, tx).await?;
    if route_names_change {
        conn.note_route_names();
    }
    if kind == Some(TypeKind::Route) {
        // Route configurations sent in answer: their virtual hosts follow, as nothing
        // else would send them (a push sends them after its route configurations).
        let vhds = TypeKind::VirtualHost;
        if !conn.watches[vhds as usize].force.is_empty() {
            let view = conn.view();
            let (changed, removed) = conn.diff(&view, vhds);
            let answer = Answer::Request { always: false };
            respond(conn, vhds, changed.into(), removed, answer, tx).await?;
            conn.settle_basis(&view, vhds, false);
        }
    }
    Ok(())
}

async fn handle_request(
    conn: &mut Connection,
    req: DeltaDiscoveryRequest,
    tx: &Tx,
) -> Result<(), Closed> {
    let Some(kind) = TypeKind::from_url(&req.type_url) else {
        tracing::debug!(proxy = %conn.proxy.id, type_url = %req.type_url, "ignoring request for an unserved type");
        return Ok(());
    };
    let idx = kind as usize;
    tracing::trace!(
        proxy = %conn.proxy.id,
        r#type = kind.short(),
        subscribe = ?req.resource_names_subscribe,
        unsubscribe = ?req.resource_names_unsubscribe,
        nonce = %req.response_nonce,
        "delta request"
    );
    if let Some(err) = &req.error_detail {
        conn.record_nack(kind, &req.response_nonce, &err.message);
    } else if !req.response_nonce.is_empty() {
        if conn.watches[idx].nonce_sent.as_deref() == Some(req.response_nonce.as_str()) {
            conn.record_ack(kind, &req.response_nonce);
        } else {
            conn.record_expired_nonce(kind, &req.response_nonce);
        }
    }
    // Subscription changes are honoured whatever the nonce.
    let first = !conn.watches[idx].subscribed;
    if first {
        let view = conn.view();
        if asks_for_exactly(&req, kind, &view) {
            // What a new proxy asks first: the view's whole set (and what a reconnecting
            // one asks, holding the same names). Its watch starts compact on the view
            // rather than building per-name maps only to drop them.
            let Some(send) = missing_from(&req, kind, &view) else {
                return handle_in_full(conn, kind, req, tx).await;
            };
            let w = &mut conn.watches[idx];
            w.subscribed = true;
            w.wildcard = kind.wildcard();
            w.basis = Some(view.clone());
            w.compact = true;
            respond(
                conn,
                kind,
                send,
                Vec::new(),
                Answer::Request { always: true },
                tx,
            )
            .await?;
            conn.settle_basis(&view, kind, true);
            return Ok(());
        }
    }
    handle_in_full(conn, kind, req, tx).await
}

/// A request's subscription changes applied name by name, answered with the difference.
async fn handle_in_full(
    conn: &mut Connection,
    kind: TypeKind,
    req: DeltaDiscoveryRequest,
    tx: &Tx,
) -> Result<(), Closed> {
    let idx = kind as usize;
    let first = !conn.watches[idx].subscribed;
    let names_change =
        !req.resource_names_subscribe.is_empty() || !req.resource_names_unsubscribe.is_empty();
    if names_change {
        conn.materialize(kind); // the watch keeps its own maps again
    }
    // A plain ACK changes no subscription and needs no view.
    let view = (first || !req.resource_names_subscribe.is_empty()).then(|| conn.view());
    let intern = |name: &str| match &view {
        Some(view) => Connection::intern(view, kind, name),
        None => name.into(),
    };
    let w = &mut conn.watches[idx];
    if first || names_change {
        w.basis = None; // the subscription changes: the next push compares in full
    }
    if first {
        w.subscribed = true;
        w.sent = req
            .initial_resource_versions
            .iter()
            .map(|(name, version)| (intern(name), super::resource::parse_version(version)))
            .collect();
        w.wildcard = kind.wildcard()
            && (req.resource_names_subscribe.is_empty()
                || req.resource_names_subscribe.iter().any(|n| n == "*"));
    }
    for name in &req.resource_names_subscribe {
        if name == "*" {
            w.wildcard = true;
            continue;
        }
        let name = intern(name);
        if !first {
            // A re-subscribed resource must be resent.
            w.force.insert(name.clone());
        }
        w.names.insert(name);
    }
    for name in &req.resource_names_unsubscribe {
        if name == "*" {
            w.wildcard = false;
            continue;
        }
        w.names.remove(name.as_str());
        w.sent.remove(name.as_str());
        w.force.remove(name.as_str());
    }
    if let Some(view) = view {
        let (changed, removed) = conn.diff(&view, kind);
        respond(
            conn,
            kind,
            changed.into(),
            removed,
            Answer::Request { always: first },
            tx,
        )
        .await?;
        // A proxy that now holds exactly this view gets the next push as a view difference.
        conn.settle_basis(&view, kind, false);
    }
    Ok(())
}

/// Whether a first request subscribes to exactly the view's resources of `kind`: a
/// wildcard type by wildcard alone, any other by naming each of them (in any order).
fn asks_for_exactly(req: &DeltaDiscoveryRequest, kind: TypeKind, view: &View) -> bool {
    let subscribe = &req.resource_names_subscribe;
    if !req.resource_names_unsubscribe.is_empty() {
        return false;
    }
    if kind.wildcard() {
        return subscribe.is_empty() || subscribe.iter().all(|n| n == "*");
    }
    let all = view.all(kind);
    if subscribe.len() < all.len() || all.is_empty() {
        return false;
    }
    // Envoy names them in the order it received them, which is the view's (sorted).
    let mut names: Vec<&str> = subscribe.iter().map(String::as_str).collect();
    names.sort_unstable();
    names.dedup();
    names.len() == all.len() && names.iter().zip(all.keys()).all(|(a, b)| *a == &**b)
}

/// What the proxy of a first request lacks of a view's set, when it holds nothing or
/// exactly the view's names: every resource it does not hold at the view's version
/// (`initial_resource_versions` on reconnect; a resource it was pushed is named with an
/// empty version, see [`respond`]). `None` when it holds other names.
fn missing_from(req: &DeltaDiscoveryRequest, kind: TypeKind, view: &View) -> Option<Batch> {
    let held = &req.initial_resource_versions;
    if held.is_empty() {
        return Some(view.whole(kind)); // one list shared by every proxy sent all of it
    }
    let all = view.all(kind);
    if held.len() != all.len() {
        return None;
    }
    let mut missing = Vec::new();
    for r in all.values() {
        let Some(v) = held.get(&*r.name) else {
            return None; // the same number of names, but not the same names
        };
        if super::resource::parse_version(v) != r.hash {
            missing.push(r.clone());
        }
    }
    Some(missing.into())
}

/// Why a response is sent.
#[derive(Clone, Copy)]
enum Answer {
    /// It answers a request; `always`: even when empty (the first of its type).
    Request { always: bool },
    /// A push, triggered by the config change at this instant.
    Push(Instant),
}

/// Sends `changed` and `removed` for `kind`, unless both are empty and nothing asks for an
/// empty response.
///
/// Only an answer to a request carries versions. It holds what a proxy is sent when it
/// connects, nearly all it will ever hold, and the versions let it name what it holds
/// when it reconnects, so that a restarted meshd resends only what differs. A push
/// carries the changed resources without versions, as istiod sends them: a version is
/// 18 bytes of each entry, ~5% of a changed endpoint set's. A proxy names a resource
/// it was pushed with an empty version when it reconnects, which matches no version, so
/// that resource is sent again.
async fn respond(
    conn: &mut Connection,
    kind: TypeKind,
    changed: Batch,
    removed: Vec<String>,
    answer: Answer,
    tx: &Tx,
) -> Result<bool, Closed> {
    let (trigger, always, versions) = match answer {
        Answer::Request { always } => (None, always, true),
        Answer::Push(at) => (Some(at), false, false),
    };
    if changed.is_empty() && removed.is_empty() && !always {
        return Ok(false);
    }
    let nonce = conn.record_sent(kind, &changed, &removed, false, trigger);
    if kind == TypeKind::Cluster && !changed.is_empty() {
        conn.force_endpoints_after_clusters(&changed);
    }
    if kind == TypeKind::Route && conn.proxy.vhds {
        let view = conn.view();
        conn.force_virtual_hosts_after_routes(&view, &changed);
    }
    let response = DeltaResponse::new(
        conn.push.version().to_string(),
        kind.url(),
        nonce,
        changed,
        removed,
        versions,
    );
    super::stream::send(conn, kind, tx, response).await?;
    Ok(true)
}

async fn push_to(conn: &mut Connection, tx: &Tx) -> Result<(), Closed> {
    let shared = conn.shared.clone();
    let push = Answer::Push(conn.push.triggered_at());
    let view = conn.view();
    // Make-before-break: clusters are added and updated first and removed last, after the
    // listeners and routes that stop using them.
    let mut removed_clusters = Vec::new();
    let mut from_basis = [false; super::resource::TYPES];
    for kind in conn.subscribed_types() {
        let started = Instant::now();
        let (changed, mut removed) = match conn.diff_from_basis(&view, kind) {
            Some(d) => {
                from_basis[kind as usize] = true;
                d
            }
            None => {
                let (changed, removed) = conn.diff(&view, kind);
                (changed.into(), removed)
            }
        };
        if !from_basis[kind as usize] {
            conn.materialize(kind); // what it holds changes other than by a view step
        }
        shared.push_diffs(from_basis[kind as usize]).inc();
        if kind == TypeKind::Cluster {
            removed_clusters = std::mem::take(&mut removed);
        }
        if respond(conn, kind, changed, removed, push, tx).await? {
            (shared.push_time_of(kind)).observe(started.elapsed().as_secs_f64());
        }
    }
    if !removed_clusters.is_empty() {
        respond(
            conn,
            TypeKind::Cluster,
            Batch::default(),
            removed_clusters,
            push,
            tx,
        )
        .await?;
    }
    for kind in conn.subscribed_types() {
        conn.settle_basis(&view, kind, from_basis[kind as usize]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use envoy_api::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use prost::Message;

    use super::*;
    use crate::resource::encode;

    fn request(subscribe: &[&str], unsubscribe: &[&str]) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            resource_names_subscribe: subscribe.iter().map(|n| n.to_string()).collect(),
            resource_names_unsubscribe: unsubscribe.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        }
    }

    /// VHDS is asked for by no name: a VHDS proxy is sent every virtual host of its route
    /// configurations, then only those a change touched, and all of a route
    /// configuration's again whenever that is sent (Envoy drops virtual hosts of a route
    /// configuration it does not hold yet).
    #[tokio::test]
    async fn vhds_sends_every_virtual_host_then_only_the_changed_ones() {
        use crate::resource::vhds_route_config;
        use crate::testing;
        use model::testmesh::{Load, Shape};

        let shape = Shape::new(30, 3, 2);
        let mut store = shape.store();
        let pushes = testing::Pushes::default();
        let (pushed, rx) = tokio::sync::watch::channel(pushes.build(&store, 1));
        let shared = testing::shared(rx);
        let meta = serde_json::json!({"NAMESPACE": "ns-1", "LABELS": {"app": "a"}});
        let mut proxy = model::Proxy::from_node(
            "sidecar~10.9.0.1~a-0.ns-1~ns-1.svc.cluster.local",
            meta.as_object().unwrap(),
        )
        .unwrap();
        proxy.vhds = true;
        let mut conn = Connection::new(shared.clone(), proxy, true);
        type Rx = crate::outbox::Receiver<Result<Box<DeltaResponse>, tonic::Status>>;
        let (tx, mut rx) = crate::outbox::channel(16);
        let answer = |rx: &mut Rx| {
            let r = rx.try_recv().expect("a response").unwrap();
            let names: Vec<String> = r.resources.iter().map(|r| r.name.to_string()).collect();
            (r.type_url, names)
        };
        let ask = |kind: TypeKind, names: &[&str]| DeltaDiscoveryRequest {
            type_url: kind.url().into(),
            resource_names_subscribe: names.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        };

        let view = conn.view();
        let shell = &view.all(TypeKind::Route)["8080"];
        let rc =
            envoy_api::pb::envoy::config::route::v3::RouteConfiguration::decode(&*shell.value())
                .unwrap();
        assert!(rc.virtual_hosts.is_empty() && rc.vhds.is_some(), "{rc:?}");
        let all: Vec<String> = (view.all(TypeKind::VirtualHost).keys())
            .map(|n| n.to_string())
            .collect();
        assert!(all.len() > 30, "{all:?}");
        assert!(all.iter().all(|n| vhds_route_config(n) == Some("8080")));
        assert!(all.contains(&"8080/allow_any".to_string()));

        // Envoy asks for its route configuration, then (with no name) for VHDS.
        handle(&mut conn, ask(TypeKind::Route, &["8080"]), &tx)
            .await
            .unwrap();
        assert_eq!(
            answer(&mut rx),
            (TypeKind::Route.url(), vec!["8080".into()])
        );
        assert!(rx.try_recv().is_none(), "VHDS is not subscribed yet");
        assert!(!conn.watches.holds(TypeKind::VirtualHost), "nor allocated");
        handle(&mut conn, ask(TypeKind::VirtualHost, &[]), &tx)
            .await
            .unwrap();
        assert_eq!(answer(&mut rx), (TypeKind::VirtualHost.url(), all.clone()));
        assert!(conn.watches[TypeKind::VirtualHost as usize].compact);

        assert!(conn.watches.holds(TypeKind::VirtualHost));
        // A proxy without VHDS asks for its routes (and is pushed to below).
        let mut plain_proxy = (*conn.proxy).clone();
        plain_proxy.vhds = false;
        let mut plain = Connection::new(shared.clone(), plain_proxy, true);
        let (plain_tx, mut plain_rx) = crate::outbox::channel(16);
        handle(&mut plain, ask(TypeKind::Route, &["8080"]), &plain_tx)
            .await
            .unwrap();
        assert_eq!(answer(&mut plain_rx).0, TypeKind::Route.url());

        // A VirtualService of svc-0 changes: its virtual host alone is pushed.
        let parsed = model::config::parse::parse_file("vs.yaml", &shape.routing_yaml(0, "bob"));
        for o in parsed.objects {
            store.apply(o);
        }
        let next = pushes.build(&store, 2);
        pushed.send_replace(next.clone());
        conn.push = next;
        push_to(&mut conn, &tx).await.unwrap();
        let (type_url, changed) = answer(&mut rx);
        assert_eq!(type_url, TypeKind::VirtualHost.url());
        assert_eq!(
            changed,
            vec!["8080/svc-0.ns-0.svc.cluster.local:8080".to_string()]
        );
        assert!(rx.try_recv().is_none(), "nothing else");
        plain.push = pushes.build(&store, 3);
        push_to(&mut plain, &plain_tx).await.unwrap();
        assert_eq!(answer(&mut plain_rx).0, TypeKind::Route.url());
        assert!(
            !plain.watches.holds(TypeKind::VirtualHost),
            "no VHDS watch without VHDS"
        );
        for sidecar in [&conn, &plain] {
            assert!(!sidecar.watches.holds(TypeKind::Secret), "nor an SDS watch");
        }

        // The route configuration asked for again: all its virtual hosts follow.
        let mut again = ask(TypeKind::Route, &[]);
        again.resource_names_unsubscribe = vec!["8080".into()];
        handle(&mut conn, again, &tx).await.unwrap();
        handle(&mut conn, ask(TypeKind::Route, &["8080"]), &tx)
            .await
            .unwrap();
        assert_eq!(
            answer(&mut rx),
            (TypeKind::Route.url(), vec!["8080".into()])
        );
        assert_eq!(answer(&mut rx), (TypeKind::VirtualHost.url(), all));
    }

    /// The route configurations a proxy subscribes to are on record for the debug dump,
    /// one the view lacks (a draining listener's) included, as it was answered: empty.
    #[tokio::test]
    async fn the_subscribed_route_configurations_are_on_record() {
        use crate::testing;
        use model::testmesh::{Load, Shape};

        let store = Shape::new(30, 3, 2).store();
        let pushes = testing::Pushes::default();
        let (_pushed, rx) = tokio::sync::watch::channel(pushes.build(&store, 1));
        let meta = serde_json::json!({"NAMESPACE": "ns-1", "LABELS": {"app": "a"}});
        let proxy = model::Proxy::from_node(
            "sidecar~10.9.0.1~a-0.ns-1~ns-1.svc.cluster.local",
            meta.as_object().unwrap(),
        )
        .unwrap();
        let mut conn = Connection::new(testing::shared(rx), proxy, true);
        let (tx, _rx) = crate::outbox::channel(16);
        let names = |conn: &Connection| -> Option<Vec<String>> {
            let status = conn.status.lock().unwrap();
            let names = status.route_names.as_ref()?;
            Some(names.iter().map(|n| n.to_string()).collect())
        };
        assert_eq!(names(&conn), None);
        let rds = |sub: &[&str], unsub: &[&str]| DeltaDiscoveryRequest {
            type_url: TypeKind::Route.url().into(),
            ..request(sub, unsub)
        };
        handle(&mut conn, rds(&["8080"], &[]), &tx).await.unwrap();
        assert_eq!(names(&conn), Some(vec!["8080".into()]));
        handle(&mut conn, rds(&["http.9999"], &[]), &tx)
            .await
            .unwrap();
        handle(&mut conn, rds(&[], &["8080"]), &tx).await.unwrap();
        assert_eq!(names(&conn), Some(vec!["http.9999".into()]));

        let view = conn.view();
        assert!(view.all(TypeKind::Route).contains_key("8080"));
        let status = conn.status.lock().unwrap().clone();
        let dumped = crate::debug::subscribed_routes(&view, status.route_names.as_deref());
        let dumped: Vec<&str> = dumped.iter().map(|r| &*r.name).collect();
        assert_eq!(dumped, ["http.9999"]);
    }

    #[test]
    fn a_first_request_for_exactly_the_views_set_is_recognised() {
        let mut view = View::default();
        for name in ["outbound|80||a", "outbound|80||b", "outbound|80|v1|a"] {
            let cla = ClusterLoadAssignment {
                cluster_name: name.into(),
                ..Default::default()
            };
            view.insert(TypeKind::Endpoint, encode(name, &cla));
        }
        let eds = |sub: &[&str], unsub: &[&str]| {
            asks_for_exactly(&request(sub, unsub), TypeKind::Endpoint, &view)
        };
        let all = ["outbound|80||b", "outbound|80|v1|a", "outbound|80||a"];
        assert!(eds(&all, &[]), "every name, in any order");
        assert!(eds(&[all[0], all[1], all[2], all[0]], &[]), "a name twice");
        assert!(!eds(&all[..2], &[]), "one missing");
        assert!(
            !eds(&[all[0], all[1], "outbound|80||c"], &[]),
            "one unknown"
        );
        assert!(!eds(&[all[0], all[1], all[2], "outbound|80||c"], &[]));
        assert!(!eds(&all, &["outbound|80||c"]), "an unsubscription");
        let cds = |sub: &[&str]| asks_for_exactly(&request(sub, &[]), TypeKind::Cluster, &view);
        assert!(cds(&[]) && cds(&["*"]), "a wildcard type by wildcard");
        assert!(!cds(&["*", "outbound|80||a"]), "with names besides");
    }

    #[test]
    fn a_reconnecting_proxy_is_sent_what_it_lacks_of_the_views_set() {
        let mut view = View::default();
        for name in ["outbound|80||a", "outbound|80||b"] {
            let cla = ClusterLoadAssignment {
                cluster_name: name.into(),
                ..Default::default()
            };
            view.insert(TypeKind::Endpoint, encode(name, &cla));
        }
        let versions: Vec<(String, String)> = view
            .all(TypeKind::Endpoint)
            .values()
            .map(|r| (r.name.to_string(), r.version.clone()))
            .collect();
        let missing = |held: &[(String, String)]| {
            let mut req = request(&["outbound|80||a", "outbound|80||b"], &[]);
            req.initial_resource_versions = held.iter().cloned().collect();
            let missing = missing_from(&req, TypeKind::Endpoint, &view)?;
            Some(
                missing
                    .iter()
                    .map(|r| r.name.to_string())
                    .collect::<Vec<_>>(),
            )
        };
        let both = Some(vec!["outbound|80||a".to_string(), "outbound|80||b".into()]);
        assert_eq!(missing(&[]), both, "holding nothing");
        assert_eq!(missing(&versions), Some(vec![]), "holding all");
        let mut stale = versions.clone();
        stale[1].1 = "0000000000000001".into();
        assert_eq!(missing(&stale), Some(vec!["outbound|80||b".into()]));
        let mut pushed = versions.clone();
        pushed[0].1 = String::new(); // as a push sent it
        assert_eq!(missing(&pushed), Some(vec!["outbound|80||a".into()]));
        assert_eq!(missing(&versions[..1]), None, "one missing");
        let mut more = versions.clone();
        more.push(("outbound|80||c".into(), "0000000000000001".into()));
        assert_eq!(missing(&more), None, "one the view does not have");
        let mut other = versions.clone();
        other[1].0 = "outbound|80||c".into();
        assert_eq!(missing(&other), None, "as many names, not the same");
    }
}
