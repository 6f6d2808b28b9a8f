//! HTTP/2 for meshd's gRPC ports (xDS on 15010, CA and xDS on 15012): hyper's server,
//! through h2, on every connection, with each limit a client can reach set here rather than
//! left to a library default (the figures are in `docs/limits.md`).
//!
//! Each connection runs on its own task. Every request it carries holds the connection's
//! [`Connection`] as an extension: its number, the identities its TLS client certificate
//! proved, and how many streams are open on it, which `/debug/adsz` shows beside each xDS
//! stream. Connections closed for what the client sent (a malformed frame, bad HPACK, too
//! many resets) are counted in `meshd_xds_connection_errors` by their HTTP/2 error code.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tonic::codegen::{Service, http};

use crate::admission::{Admitted, Ticket};
use crate::identity::Identity;

/// The largest header list a request may carry once decoded (SETTINGS_MAX_HEADER_LIST_SIZE).
/// An xDS or CA request carries a few short headers and at most one service-account token.
pub const MAX_HEADER_LIST: u32 = 64 << 10;
/// The HPACK dynamic table clients may use for their requests (SETTINGS_HEADER_TABLE_SIZE):
/// none, so that once a client acknowledges the settings a connection keeps no header
/// table. Streams live for the connection's life, so there is little to compress.
pub const HEADER_TABLE: u32 = 0;
/// The largest frame a client may send (SETTINGS_MAX_FRAME_SIZE): the protocol's minimum.
pub const MAX_FRAME: u32 = 16 << 10;
/// What a stream may send before meshd reads it (its receive window), and the connection's.
/// A request larger than the window (up to `ISTIO_GPRC_MAXRECVMSGSIZE`) takes more rounds.
pub const STREAM_WINDOW: u32 = 64 << 10;
pub const CONNECTION_WINDOW: u32 = 1 << 20;
/// Response bytes h2 buffers per stream before the response waits for the client's window.
pub const SEND_BUFFER: usize = 400 << 10;
/// Streams a client may open and reset before meshd accepts them (rapid reset).
pub const PENDING_ACCEPT_RESETS: usize = 20;
/// Streams meshd itself may reset for the client's errors on one connection before it
/// closes it with ENHANCE_YOUR_CALM ("MadeYouReset").
pub const LOCAL_ERROR_RESETS: usize = 100;

/// How long a client has from being accepted (or from finishing its TLS handshake) to
/// send the connection preface. h2 arms no timer before it, and the keepalive starts only
/// after it, so without this a client that connects and stays silent would be kept for ever.
pub const PREFACE_TIMEOUT: Duration = Duration::from_secs(10);
/// The client connection preface's length (RFC 9113 §3.4), SETTINGS frame not counted.
const PREFACE_LEN: usize = 24;

/// What each connection is given.
#[derive(Clone, Debug)]
pub struct Settings {
    /// A ping after this long with nothing received; the connection is dropped if the ping
    /// is not answered within `keepalive_timeout`.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// Streams open at once per connection (`ISTIO_GPRC_MAXSTREAMS`).
    pub max_streams: u32,
    /// Connections closed for the client's fault, by reason.
    pub errors: Family<Vec<(&'static str, String)>, Counter>,
    /// Counted each time a connection reaches `max_streams`: the client's next streams wait.
    pub at_limit: Counter,
}

/// One HTTP/2 connection, as its requests see it.
#[derive(Debug)]
pub struct Connection {
    /// Its number, unique in this process.
    pub number: u64,
    /// The SPIFFE identities of the client certificate its TLS handshake verified.
    pub identities: Option<Arc<[Identity]>>,
    streams: AtomicUsize,
    /// Given back when the first response bytes leave (see [`crate::admission`]).
    ticket: Ticket,
}

impl Connection {
    /// Streams open on this connection now.
    pub fn open_streams(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }
}

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// What these ports host: a gRPC service answering with tonic's body.
pub trait GrpcService:
    Service<
        http::Request<hyper::body::Incoming>,
        Response = http::Response<tonic::body::Body>,
        Error = Infallible,
        Future: Send,
    > + Clone
    + Send
    + 'static
{
}

impl<S> GrpcService for S where
    S: Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
            Future: Send,
        > + Clone
        + Send
        + 'static
{
}

/// Serves `service` on each connection `incoming` yields (TCP, or TLS streams whose
/// handshake is done), each request carrying its connection's `identities`, until
/// `shutdown` changes; then each connection is sent GOAWAY and finishes its open streams.
/// A connection gives its admission ticket back once it sends the first bytes of a
/// response body.
pub async fn serve<S, T>(
    mut incoming: impl futures::Stream<Item = std::io::Result<Admitted<T>>> + Unpin,
    service: S,
    settings: Settings,
    identities: impl Fn(&T) -> Option<Arc<[Identity]>>,
    mut shutdown: watch::Receiver<bool>,
) where
    S: GrpcService,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let builder = Arc::new(builder(&settings));
    loop {
        let Admitted { io, ticket } = tokio::select! {
            io = incoming.next() => match io {
                Some(Ok(io)) => io,
                Some(Err(e)) => {
                    // Out of descriptors, most likely: wait instead of spinning.
                    tracing::warn!("accepting a gRPC connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                None => return,
            },
            _ = shutdown.changed() => return,
        };
        let connection = Arc::new(Connection {
            number: NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed),
            identities: identities(&io),
            streams: AtomicUsize::new(0),
            ticket,
        });
        let service = Counted {
            inner: service.clone(),
            connection,
            max: settings.max_streams as usize,
            at_limit: settings.at_limit.clone(),
        };
        let builder = builder.clone();
        let errors = settings.errors.clone();
        let mut closing = shutdown.clone();
        tokio::spawn(async move {
            let conn = builder.serve_connection(
                TokioIo::new(FirstBytes::new(io)),
                TowerToHyperService::new(service),
            );
            tokio::pin!(conn);
            let result = tokio::select! {
                result = conn.as_mut() => result,
                _ = closing.changed() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result
                && let Some(reason) = client_fault(&e)
            {
                tracing::debug!("closed an HTTP/2 connection: {e}");
                errors.get_or_create(&vec![("reason", reason)]).inc();
            }
        });
    }
}

/// hyper's HTTP/2 server with meshd's limits.
fn builder(settings: &Settings) -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .max_concurrent_streams(settings.max_streams)
        .max_header_list_size(MAX_HEADER_LIST)
        .header_table_size(HEADER_TABLE)
        .max_frame_size(MAX_FRAME)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_send_buf_size(SEND_BUFFER)
        .max_pending_accept_reset_streams(PENDING_ACCEPT_RESETS)
        .max_local_error_reset_streams(LOCAL_ERROR_RESETS)
        .keep_alive_interval(settings.keepalive_interval)
        .keep_alive_timeout(settings.keepalive_timeout)
        // gRPC has no use for a Date header on every response.
        .auto_date_header(false);
    b
}

/// The metric label of a connection error that was the client's doing: the HTTP/2 error
/// code meshd closed the connection with (`http2_protocol_error`, ...), or a timeout (no
/// preface, or no answer to a keepalive ping). A client that went away, or closed the
/// connection itself, is not an error of the server's.
fn client_fault(e: &hyper::Error) -> Option<String> {
    if e.is_timeout() {
        return Some("http2_keepalive_timeout".into());
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::TimedOut
        {
            return Some("http2_preface_timeout".into());
        }
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            if h2.is_io() || h2.is_remote() {
                return None;
            }
            let reason = h2.reason()?;
            if reason == h2::Reason::NO_ERROR {
                return None;
            }
            return Some(format!("http2_{}", reason_name(reason)));
        }
        source = err.source();
    }
    None
}

/// RFC 9113's name of an error code, lowercased; an unknown code by its number.
fn reason_name(reason: h2::Reason) -> String {
    let name = format!("{reason:?}");
    if name.starts_with("Reason(") {
        return u32::from(reason).to_string();
    }
    name.to_ascii_lowercase()
}

/// A connection whose reads fail with `TimedOut` once [`PREFACE_TIMEOUT`] has passed
/// before the client sent its first [`PREFACE_LEN`] bytes (what they are is h2's to check).
struct FirstBytes<T> {
    io: T,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    left: usize,
}

impl<T> FirstBytes<T> {
    fn new(io: T) -> FirstBytes<T> {
        FirstBytes {
            io,
            deadline: Some(Box::pin(tokio::time::sleep(PREFACE_TIMEOUT))),
            left: PREFACE_LEN,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for FirstBytes<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if let Some(deadline) = &mut this.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            let e = std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no HTTP/2 connection preface within the preface timeout",
            );
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if this.deadline.is_some() && matches!(read, Poll::Ready(Ok(()))) {
            this.left = this.left.saturating_sub(buf.filled().len() - before);
            if this.left == 0 {
                this.deadline = None;
            }
        }
        read
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FirstBytes<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The service with its connection in every request, counting the streams open on it (a
/// stream is open until its response body is dropped).
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    connection: Arc<Connection>,
    max: usize,
    at_limit: Counter,
}

impl<S: GrpcService> Service<http::Request<hyper::body::Incoming>> for Counted<S> {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<hyper::body::Incoming>) -> Self::Future {
        let connection = self.connection.clone();
        if connection.streams.fetch_add(1, Ordering::Relaxed) + 1 == self.max {
            self.at_limit.inc();
            tracing::warn!(
                "HTTP/2 connection {} has {} streams open, ISTIO_GPRC_MAXSTREAMS: its client's next streams wait",
                connection.number,
                self.max
            );
        }
        let open = OpenStream(connection.clone());
        request.extensions_mut().insert(connection);
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| {
                tonic::body::Body::new(Guarded {
                    body,
                    open,
                    answered: false,
                })
            }))
        })
    }
}

/// One open stream of a connection, for as long as it lives.
struct OpenStream(Arc<Connection>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its stream counted until it is dropped.
struct Guarded {
    body: tonic::body::Body,
    open: OpenStream,
    /// Whether this stream has sent data, and so given its connection's ticket back: the
    /// ticket's lock is taken once per stream, not on every frame of every push.
    answered: bool,
}

impl http_body::Body for Guarded {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let frame = Pin::new(&mut self.body).poll_frame(cx);
        if !self.answered
            && let Poll::Ready(Some(Ok(f))) = &frame
            && f.is_data()
        {
            self.answered = true;
            self.open.0.ticket.release();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_are_named_as_the_rfc_names_them() {
        assert_eq!(reason_name(h2::Reason::PROTOCOL_ERROR), "protocol_error");
        assert_eq!(
            reason_name(h2::Reason::ENHANCE_YOUR_CALM),
            "enhance_your_calm"
        );
        assert_eq!(reason_name(h2::Reason::from(0x77)), "119");
    }
}
