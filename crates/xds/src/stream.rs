//! One ADS stream's life, shared by both framings: identify the proxy from the first
//! request, then serve its requests and the pushes published to it until either side goes.
//! What differs between state-of-the-world and delta is behind [`Framing`].

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use envoy_api::pb::envoy::config::core::v3::Node;
use tokio::sync::watch;
use tonic::Status;

use super::connection::Connection;
use super::metrics::type_label;
use super::push::Push;
use super::resource::TypeKind;
use super::{Closed, XdsShared, debug, proxy_from_node};

/// Responses are boxed in the queue, so that its slots are 16 bytes each.
pub type Tx<R> = super::outbox::Sender<Result<Box<R>, Status>>;

/// The framing of one ADS variant.
pub trait Framing: 'static {
    type Request: prost::Message + Default + Send + 'static;
    type Response: Send + 'static;
    /// `SotW` or `delta`, for logs and `/debug/syncz`.
    const NAME: &'static str;

    fn node(request: &Self::Request) -> Option<&Node>;

    /// Answers one request from the proxy.
    fn handle(
        conn: &mut Connection,
        request: Self::Request,
        tx: &Tx<Self::Response>,
    ) -> impl Future<Output = Result<(), Closed>> + Send;

    /// Sends what a push changed for this proxy (`conn.push` is already the new push).
    fn push(
        conn: &mut Connection,
        tx: &Tx<Self::Response>,
    ) -> impl Future<Output = Result<(), Closed>> + Send;

    /// A request's type URL and the names it asks for; `None` for an ACK or NACK of
    /// `last_sent`, the last nonce this stream sent (for debug clients,
    /// [`super::debug`]). A request with a nonce this stream never sent asks anew, as
    /// istiod answers it: istioctl's first request carries a nonce of its own, and a
    /// client that reconnects carries the previous server's.
    fn asks<'r>(
        request: &'r Self::Request,
        last_sent: Option<&str>,
    ) -> Option<(&'r str, &'r [String])>;

    /// The answer to a debug client's request, in this framing.
    fn debug_response(answer: debug::Answer) -> Self::Response;
}

/// One ADS stream, from its first request to its end. The set-up (waiting for the first
/// request, identifying the proxy, answering it) runs in this task; serving then runs in a
/// task of its own, so what a connection keeps for its whole life is only what serving
/// needs (a task's memory is its future's size, which holds every state it can be in).
pub async fn run<F: Framing>(
    shared: Arc<XdsShared>,
    mut requests: super::wire::Messages<F::Request>,
    tx: Tx<F::Response>,
    caller: super::Caller,
) {
    if let Some((conn, pushes)) = start::<F>(&shared, &mut requests, &tx, caller).await {
        tokio::spawn(serve::<F>(conn, pushes, requests, tx));
    }
}

/// Identifies the proxy from the first request and answers it: its connection and push
/// subscription, or `None` if the stream ended or was refused.
async fn start<F: Framing>(
    shared: &Arc<XdsShared>,
    requests: &mut super::wire::Messages<F::Request>,
    tx: &Tx<F::Response>,
    super::Caller {
        identity: caller,
        transport,
    }: super::Caller,
) -> Option<(Connection, tokio::sync::watch::Receiver<Arc<Push>>)> {
    // A stream that never says who it is holds nothing for long.
    let idle = shared.settings.keepalive_interval + shared.settings.keepalive_timeout;
    let first = match tokio::time::timeout(idle, requests.message()).await {
        Ok(Ok(Some(r))) => r,
        Err(_) => {
            let status = Status::deadline_exceeded(format!(
                "no DiscoveryRequest within {idle:?} of opening the stream"
            ));
            refuse_requests(shared, tx, UNIDENTIFIED, "no_first_request", status);
            return None;
        }
        Ok(Err(status)) => {
            refuse_requests(shared, tx, UNIDENTIFIED, "stream", status);
            return None;
        }
        Ok(Ok(None)) => return None,
    };
    if F::asks(&first, None).is_some_and(|(url, _)| debug::is_debug(url)) {
        serve_debug::<F>(shared, first, requests, tx, caller.as_ref()).await;
        return None;
    }
    let proxy = match proxy_from_node(shared, F::node(&first), caller.as_ref()) {
        Ok(mut p) => {
            p.vhds = shared.settings.vhds && F::NAME == "delta";
            if !shared.settings.ip_autoallocate {
                p.auto_addresses = Default::default();
            }
            p
        }
        Err(status) => {
            let _ = tx.send(Err(status)).await;
            return None;
        }
    };
    let mut pushes = shared.subscribe();
    let mut conn = Connection::new(shared.clone(), proxy, F::NAME == "delta");
    conn.push = pushes.borrow_and_update().clone();
    conn.status.lock().expect("BUG: status lock").transport = transport;
    tracing::info!(proxy = %conn.proxy.id, "proxy connected ({})", F::NAME);
    F::handle(&mut conn, first, tx).await.ok()?;
    Some((conn, pushes))
}

/// A debug client (`istioctl`): each request for a debug type answered in turn, ACKs
/// ignored, until it goes or is refused. It is no proxy: nothing is registered or pushed.
async fn serve_debug<F: Framing>(
    shared: &Arc<XdsShared>,
    first: F::Request,
    requests: &mut super::wire::Messages<F::Request>,
    tx: &Tx<F::Response>,
    caller: Option<&transport::identity::Identity>,
) {
    let mut next = Some(first);
    let mut answered = 0u64;
    let mut last_sent: Option<String> = None;
    loop {
        let request = match next.take() {
            Some(r) => r,
            None => match requests.message().await {
                Ok(Some(r)) => r,
                Ok(None) | Err(_) => return,
            },
        };
        let Some((type_url, names)) = F::asks(&request, last_sent.as_deref()) else {
            continue; // an ACK
        };
        if !debug::is_debug(type_url) {
            tracing::debug!(
                type_url,
                "debug client: ignoring a request for another type"
            );
            continue;
        }
        match debug::answer(shared, caller, type_url, names).await {
            Ok((served, resources)) => {
                answered += 1;
                let push = shared.current_push();
                let control_plane = (served == debug::SYNCZ).then(|| shared.control_plane());
                let nonce = format!("debug-{answered}");
                last_sent = Some(nonce.clone());
                let response = F::debug_response(debug::Answer {
                    type_url: served,
                    version: push.version().to_string(),
                    nonce,
                    resources,
                    control_plane,
                });
                if tx.send(Ok(Box::new(response))).await.is_err() {
                    return;
                }
            }
            Err(status) => {
                refuse_requests(shared, tx, "a debug client", "debug_request", status);
                return;
            }
        }
    }
}

/// Serves the proxy's requests and the pushes published to it until either side goes.
///
/// Not an `async fn`: rustc keeps an `async fn`'s arguments and the body's bindings of
/// them in separate slots of the future, so the connection (about 1 KB) would be held
/// twice for the stream's whole life. The `async move` block uses its captures in place.
/// Each request or push is handled after `select!` has returned, in a boxed future: a
/// request (~620 bytes) awaited inside a `select!` branch kept the macro's output and the
/// branch's binding in the stream's future for its whole life, ~1.2 KB of every stream.
#[allow(clippy::manual_async_fn)] // the point: see above
fn serve<F: Framing>(
    mut conn: Connection,
    pushes: watch::Receiver<Arc<Push>>,
    mut requests: super::wire::Messages<F::Request>,
    tx: Tx<F::Response>,
) -> impl Future<Output = ()> + Send {
    async move {
        // The wait for the next push outlives the requests that come meanwhile: made anew
        // for each one, it left and rejoined the push channel's waiters (a lock each way)
        // at every ACK. It is remade in place, in the same allocation, after each push.
        let mut next_push = Box::pin(next_push(pushes));
        loop {
            let step: Step<'_> = tokio::select! {
                msg = requests.message() => match msg {
                    Ok(Some(req)) => Box::pin(F::handle(&mut conn, req, &tx)),
                    Ok(None) => break,
                    Err(status) => {
                        refuse_requests(&conn.shared, &tx, &conn.proxy.id, "stream", status);
                        break;
                    }
                },
                (changed, mut pushes) = &mut next_push => {
                    if changed.is_err() { break }
                    let push = pushes.borrow_and_update().clone();
                    next_push.set(self::next_push(pushes));
                    Box::pin(deliver::<F>(&mut conn, push, &tx))
                }
            };
            if step.await.is_err() {
                break;
            }
        }
        // The stream is over (closed, broken, timed out or dead by keepalive): free its
        // state.
        let ended = Instant::now();
        tracing::info!(proxy = %conn.proxy.id, "proxy disconnected");
        let shared = conn.shared.clone();
        drop(conn);
        shared
            .metrics
            .destroy_time
            .observe(ended.elapsed().as_secs_f64());
    }
}

/// Handling one request, or delivering one push.
type Step<'a> = std::pin::Pin<Box<dyn Future<Output = Result<(), Closed>> + Send + 'a>>;

/// The next push published after what `pushes` has seen, with the receiver handed back.
async fn next_push(
    mut pushes: watch::Receiver<Arc<Push>>,
) -> (
    Result<(), watch::error::RecvError>,
    watch::Receiver<Arc<Push>>,
) {
    (pushes.changed().await, pushes)
}

/// Who a stream is before its first request names its proxy.
const UNIDENTIFIED: &str = "a proxy not yet identified";

/// The request stream broke, carried something that is no request, or sent none in time:
/// counted under `reason`, and the proxy told why (if it still listens) as the stream ends.
fn refuse_requests<R>(shared: &XdsShared, tx: &Tx<R>, proxy: &str, reason: &str, status: Status) {
    tracing::info!(proxy, "stream closed with error: {}", status.message());
    shared
        .metrics
        .connection_errors
        .get_or_create(&vec![("reason", reason.to_string())])
        .inc();
    let _ = tx.try_send(Err(status));
}

/// Hands one response to the stream. Back-pressure from a slow proxy holds the sender at
/// most `PILOT_XDS_SEND_TIMEOUT`; past it the response is dropped, counted as a send error
/// (`pilot_xds_pushes{type="cds_senderr"}`, as istiod counts them) and the stream closed,
/// so the proxy reconnects and receives its full state.
pub async fn send<R>(
    conn: &Connection,
    kind: TypeKind,
    tx: &Tx<R>,
    response: R,
) -> Result<(), Closed> {
    let started = Instant::now();
    // Most sends find room: those need no timer.
    let sent = match tx.try_send(Ok(Box::new(response))) {
        Err(super::outbox::TrySendError::Full(response)) => match conn.shared.settings.send_timeout
        {
            Some(limit) => match tokio::time::timeout(limit, tx.send(response)).await {
                Ok(r) => r.map_err(|_| Closed),
                Err(_) => {
                    let metrics = &conn.shared.metrics;
                    let label = type_label(&format!("{}_senderr", kind.short()));
                    metrics.pushes.get_or_create(&label).inc();
                    let label = type_label(kind.short());
                    metrics.push_errors.get_or_create(&label).inc();
                    tracing::warn!(proxy = %conn.proxy.id, r#type = kind.short(), "proxy did not take a response within {limit:?}; closing its stream");
                    return Err(Closed);
                }
            },
            None => tx.send(response).await.map_err(|_| Closed),
        },
        done => done.map_err(|_| Closed),
    };
    conn.shared
        .metrics
        .send_time
        .observe(started.elapsed().as_secs_f64());
    sent
}

/// A push reaches a proxy only if it can change something for it, and then through the
/// throttle (`PILOT_PUSH_THROTTLE` pushes at once).
async fn deliver<F: Framing>(
    conn: &mut Connection,
    push: Arc<Push>,
    tx: &Tx<F::Response>,
) -> Result<(), Closed> {
    // The push channel keeps only the newest push: a connection that was busy may have
    // missed some, whose changes `push.changed` does not list. Then only a diff can tell.
    let skipped = push.number > conn.push.number() + 1;
    if !skipped && !push.affects(&conn.proxy) {
        conn.shared.metrics.pushes_skipped.inc();
        conn.push = push; // nothing it depends on changed: no queue, no diff, no send
        conn.caught_up();
        conn.note_sync();
        return Ok(());
    }
    let shared = conn.shared.clone();
    let _permit = shared.throttle.acquire().await.map_err(|_| Closed)?;
    shared
        .metrics
        .queue_time
        .observe(push.published_at.elapsed().as_secs_f64());
    conn.push = push;
    F::push(conn, tx).await?;
    conn.caught_up();
    conn.note_sync(); // in sync already if nothing needed sending
    Ok(())
}
