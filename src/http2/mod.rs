//! meshd's own HTTP/2 server for its gRPC streams.
//!
//! hyper's server (through h2) keeps ~28 KB of codec buffers per connection, of which ~14
//! KB stay resident, and moves every response through two tasks before the socket (the
//! connection's and a per-stream body pipe). At 10,000 connected proxies that is most of
//! meshd's memory per proxy and about half its CPU per push (see BENCHMARKS.md, sessions
//! 15, 16 and 28). Here one task per connection reads the frames, calls the service for
//! each new stream and writes each response's body straight from the shared bytes it is
//! made of, many frames per `writev`; between frames a connection keeps only a partial
//! frame's bytes, its windows and a few words per stream. It allows clients no HPACK
//! dynamic table (SETTINGS_HEADER_TABLE_SIZE 0), so once they acknowledge that, it keeps
//! no header table either.
//!
//! It implements what a gRPC server needs of RFC 9113: the prefaces and SETTINGS, HPACK
//! request headers (`loona-hpack`; responses are literals that never touch the dynamic
//! table, and requests may use one only until the client acknowledges this server's
//! SETTINGS), flow control both ways (a request window reopens only for bytes the service
//! consumed), PING (answered, and sent as keepalive to connections nothing was read from),
//! RST_STREAM, GOAWAY (sent on shutdown and on connection errors, saying why in its debug
//! data) and CONTINUATION. It enforces each request's `grpc-timeout`, refuses header
//! lists that decode past 64 KiB, and cuts off a client that resets streams before their
//! answer in a loop (rapid reset), floods frames and reads none of the answers, or sends
//! empty DATA, HEADERS or CONTINUATION frames in a row. It does
//! not implement server push, priorities, or HTTP/1.1 upgrades, which gRPC does not use.

mod body;
mod conn;
pub(crate) mod frame;
pub(crate) mod headers;

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::codegen::{Service, http};

pub use body::RecvBody;

/// A connection's keepalive: a ping after `keepalive_interval` with nothing read, and the
/// connection dropped if nothing is read within `keepalive_timeout` of it; and who hears
/// of the connections closed for the client's fault.
#[derive(Clone, Debug)]
pub struct Settings {
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// Streams open at once per connection (SETTINGS_MAX_CONCURRENT_STREAMS); a stream
    /// opened past it is refused (REFUSED_STREAM).
    pub max_streams: usize,
    pub on_error: ErrorHook,
}

/// Called with the reason of each connection closed because of what the client sent (a
/// malformed frame, bad HPACK, a flow-control violation, too many early resets), as
/// `frame::Reason::label` names it, for a metric.
#[derive(Clone, Default)]
pub struct ErrorHook(Option<Arc<dyn Fn(&'static str) + Send + Sync>>);

impl ErrorHook {
    pub fn new(f: impl Fn(&'static str) + Send + Sync + 'static) -> ErrorHook {
        ErrorHook(Some(Arc::new(f)))
    }

    fn call(&self, reason: &'static str) {
        if let Some(f) = &self.0 {
            f(reason);
        }
    }
}

impl std::fmt::Debug for ErrorHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ErrorHook(set)"
        } else {
            "ErrorHook(none)"
        })
    }
}

/// Who a TLS client proved to be: the SPIFFE identities of the certificate it presented
/// (its chain verified in the handshake), put into every request of its connection as an
/// extension. The certificate itself is not kept.
#[derive(Clone, Debug)]
pub struct PeerIdentities(pub Arc<[crate::ca::Identity]>);

/// What this server can host: a gRPC service answering with tonic's body.
pub trait GrpcService:
    Service<
        http::Request<RecvBody>,
        Response = http::Response<tonic::body::Body>,
        Error = std::convert::Infallible,
        Future: Send,
    > + Clone
    + Send
    + 'static
{
}

impl<S> GrpcService for S where
    S: Service<
            http::Request<RecvBody>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
            Future: Send,
        > + Clone
        + Send
        + 'static
{
}

/// Serves `service` on every connection `listener` accepts, until `shutdown` changes.
/// Connections get `TCP_NODELAY` (as Go's, and so istiod's, do).
pub async fn serve<S: GrpcService>(
    listener: TcpListener,
    service: S,
    settings: Settings,
    shutdown: watch::Receiver<bool>,
) {
    let accepted = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(io, _)| {
            if let Err(e) = io.set_nodelay(true) {
                tracing::debug!("TCP_NODELAY: {e}");
            }
            io
        });
        Some((accepted, listener))
    });
    serve_incoming(Box::pin(accepted), service, settings, |_| None, shutdown).await;
}

/// Serves `service` on each connection `incoming` yields (TLS streams whose handshake is
/// done, say), each request carrying its connection's `peer` certificates, until
/// `shutdown` changes.
pub async fn serve_incoming<S, T>(
    mut incoming: impl futures::Stream<Item = std::io::Result<T>> + Unpin,
    service: S,
    settings: Settings,
    peer: impl Fn(&T) -> Option<PeerIdentities>,
    mut shutdown: watch::Receiver<bool>,
) where
    S: GrpcService,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use futures::StreamExt;
    loop {
        let io = tokio::select! {
            io = incoming.next() => match io {
                Some(Ok(io)) => io,
                Some(Err(e)) => {
                    // Out of descriptors, most likely: wait instead of spinning.
                    tracing::warn!("accepting an xDS connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                None => return,
            },
            _ = shutdown.changed() => return,
        };
        let certs = peer(&io);
        spawn_connection(io, service.clone(), settings.clone(), &shutdown, certs);
    }
}

fn spawn_connection<S: GrpcService, T>(
    io: T,
    service: S,
    settings: Settings,
    shutdown: &watch::Receiver<bool>,
    peer: Option<PeerIdentities>,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut closed = shutdown.clone();
    let shutdown = Box::pin(async move {
        let _ = closed.changed().await;
    });
    let conn = conn::Connection::new(io, service, settings, shutdown, peer);
    tokio::spawn(conn.run());
}

#[cfg(test)]
mod tests;
