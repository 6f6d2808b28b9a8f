//! One HTTP/2 connection: a single task reads and answers frames, calls the service for
//! each new stream, and writes each response's body as DATA frames within the peer's
//! windows. What it keeps between frames is small: a buffer only for a frame still
//! arriving, the HPACK table, the windows, and a few words per stream.

use std::collections::VecDeque;
use std::future::Future;
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use http_body::Body as _;
use prost::bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tonic::Status;
use tonic::codegen::{Service, http};

use super::body::{Inbox, RecvBody};
use super::frame::{self, Head, Reason};
use super::headers;
use super::{PeerIdentities, Settings};

/// The response body every service here answers with.
type ResponseBody = tonic::body::Body;

/// The window this server opens for each request stream (its SETTINGS), and for the
/// connection. Only bytes the service consumed reopen it.
const STREAM_WINDOW: i64 = 1 << 20;
const CONNECTION_WINDOW: i64 = 16 << 20;

/// The largest header block accepted (HEADERS and its CONTINUATIONs).
const MAX_HEADER_BLOCK: usize = 64 * 1024;

/// Response bytes queued for the socket before the bodies stop being polled.
const QUEUE_LIMIT: usize = 1024 * 1024;

/// Queued pieces written per `writev`: a 557 KB route configuration is 35 frames, 70
/// pieces, and goes out in one call.
const WRITE_SLICES: usize = 128;

/// Bytes read per poll before the task yields to others.
const READ_PER_POLL: usize = 256 * 1024;

/// Room made in the frame-header buffer when it runs short: enough for a burst's frame
/// headers and control frames in one allocation.
const SCRATCH: usize = 256;

/// Streams a client may reset before any of their response was sent, per
/// [`EARLY_RESET_WINDOW`]. Past it the connection is closed with ENHANCE_YOUR_CALM: a
/// client that opens and cancels streams in a loop ("rapid reset", CVE-2023-44487) makes
/// the server start work it never gets to deliver, unbounded by the stream limit. An
/// Envoy resets an xDS stream only to open a new one after an error, and a stream that
/// got an answer before it was reset is not counted at all.
const MAX_EARLY_RESETS: u32 = 200;
const EARLY_RESET_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// Frames this server may queue in answer to the client (PING and SETTINGS
/// acknowledgements, resets, window updates, response headers) while the client reads
/// none of them: past it, a client flooding the connection with frames that each want an
/// answer ("ping flood", "settings flood", CVE-2019-9512 and -9515) is cut off with
/// ENHANCE_YOUR_CALM instead of growing the queue without end (Go's HTTP/2 server has
/// the same limit).
const MAX_UNWRITTEN_CONTROL: u32 = 10_000;

/// DATA, HEADERS and CONTINUATION frames in a row that carry no payload and do not end
/// their stream. Past it the client is cut off with ENHANCE_YOUR_CALM: such frames move
/// nothing on and cost a frame's handling each ("empty frames flood", CVE-2019-9518).
/// Envoy's own default (`max_consecutive_inbound_frames_with_empty_payload`) is 1 too.
const MAX_EMPTY_FRAMES: u32 = 1;

/// The most of a connection error's text sent as GOAWAY debug data.
const MAX_GOAWAY_DEBUG: usize = 256;

/// The request header decoder once the client has acknowledged this server's SETTINGS,
/// which allow no dynamic table (HEADER_TABLE_SIZE 0): the client's next header block must
/// start by shrinking its table to nothing (RFC 7541 §4.2), so no entry of the old one can
/// be referred to again. An xDS connection carries one long stream, whose headers would
/// otherwise stay indexed for the connection's life (~0.8 KB each).
fn request_header_decoder() -> loona_hpack::Decoder<'static> {
    let mut decoder = loona_hpack::Decoder::new();
    decoder.set_max_allowed_table_size(0);
    decoder.set_max_table_size(0);
    decoder
}

/// A connection error: GOAWAY with `Reason`, and why (logged, and sent to the peer).
type ConnectionError = (Reason, String);

pub struct Connection<T, S: Service<http::Request<RecvBody>>> {
    io: T,
    service: S,
    settings: Settings,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// Set once the client's preface was read.
    preface: bool,
    /// Set when the connection is to close once what is queued is written.
    closing: bool,
    inbuf: BytesMut,
    decoder: loona_hpack::Decoder<'static>,
    /// A header block waiting for its CONTINUATIONs: stream, END_STREAM, fragments.
    block: Option<(u32, bool, BytesMut)>,
    peer_max_frame: usize,
    peer_initial_window: i64,
    send_window: i64,
    recv_window: i64,
    /// Connection-level bytes consumed whose window is not yet reopened.
    ungranted: i64,
    streams: Vec<Stream<S::Future>>,
    /// The identities the TLS client's certificate names, put into each request.
    peer: Option<PeerIdentities>,
    last_stream: u32,
    goaway_received: bool,
    queue: VecDeque<Bytes>,
    queued: usize,
    /// Where frame headers and control frames are written before they join the queue.
    scratch: BytesMut,
    waker: Arc<AtomicWaker>,
    last_read: Instant,
    keepalive: Pin<Box<Sleep>>,
    ping_sent: Option<Instant>,
    /// Streams the client reset before their response began, since when.
    early_resets: (u32, Instant),
    /// Control frames queued since the queue was last written out in full.
    unwritten_control: u32,
    /// Empty DATA, HEADERS and CONTINUATION frames just read in a row.
    empty_frames: u32,
}

struct Stream<F> {
    id: u32,
    /// The request body's inbox.
    inbox: Arc<Inbox>,
    /// Whether the client may still send on the stream.
    open: bool,
    recv_window: i64,
    ungranted: i64,
    send_window: i64,
    /// Some of the response's body was sent.
    answered: bool,
    /// When the request's `grpc-timeout` runs out, if it had one.
    deadline: Option<Pin<Box<Sleep>>>,
    response: Response<F>,
}

enum Response<F> {
    Calling(Pin<Box<F>>),
    Streaming {
        body: ResponseBody,
        /// Body bytes taken and not yet framed (waiting for a window).
        chunk: Bytes,
        trailers: Option<http::HeaderMap>,
        ended: bool,
    },
    Done,
}

impl<T, S> Connection<T, S>
where
    T: AsyncRead + AsyncWrite + Unpin,
    S: Service<
            http::Request<RecvBody>,
            Response = http::Response<ResponseBody>,
            Error = std::convert::Infallible,
        >,
{
    pub fn new(
        io: T,
        service: S,
        settings: Settings,
        shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
        peer: Option<PeerIdentities>,
    ) -> Self {
        let now = Instant::now();
        // Until the client acknowledges this server's SETTINGS (HEADER_TABLE_SIZE 0, below),
        // it may index request headers in the default 4,096-byte table.
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(frame::DEFAULT_HEADER_TABLE);
        let max_streams = u32::try_from(settings.max_streams).unwrap_or(u32::MAX);
        let mut conn = Connection {
            io,
            service,
            keepalive: Box::pin(tokio::time::sleep_until(now + settings.keepalive_interval)),
            settings,
            shutdown,
            preface: false,
            closing: false,
            inbuf: BytesMut::new(),
            decoder,
            block: None,
            peer_max_frame: frame::DEFAULT_MAX_FRAME,
            peer_initial_window: frame::DEFAULT_WINDOW,
            send_window: frame::DEFAULT_WINDOW,
            recv_window: CONNECTION_WINDOW,
            ungranted: 0,
            streams: Vec::new(),
            peer,
            last_stream: 0,
            goaway_received: false,
            queue: VecDeque::new(),
            queued: 0,
            scratch: BytesMut::new(),
            waker: Arc::new(AtomicWaker::new()),
            last_read: now,
            ping_sent: None,
            early_resets: (0, now),
            unwritten_control: 0,
            empty_frames: 0,
        };
        // The server's preface: its SETTINGS, and the connection window opened wide.
        conn.control(|b| {
            frame::put_settings(
                b,
                &[
                    (frame::SETTINGS_HEADER_TABLE_SIZE, 0),
                    (frame::SETTINGS_MAX_CONCURRENT_STREAMS, max_streams),
                    (frame::SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW as u32),
                    (
                        frame::SETTINGS_MAX_HEADER_LIST_SIZE,
                        headers::MAX_HEADER_LIST as u32,
                    ),
                ],
            );
            frame::put_window_update(b, 0, (CONNECTION_WINDOW - frame::DEFAULT_WINDOW) as u32);
        });
        conn
    }

    /// Serves the connection until either side closes it.
    ///
    /// Not an `async fn`: rustc keeps an `async fn`'s `self` and the body's binding of it
    /// in separate slots of the future, so the connection would be held twice for its
    /// whole life (1,744 bytes instead of 864 on the secure port). The `async move` block
    /// uses its capture in place.
    #[allow(clippy::manual_async_fn)] // the point: see above
    pub fn run(mut self) -> impl Future<Output = ()> {
        async move {
            std::future::poll_fn(|cx| self.poll(cx)).await;
            self.end_streams("the connection closed");
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.waker.register(cx.waker());
        if !self.closing && self.shutdown.as_mut().poll(cx).is_ready() {
            self.go_away(Reason::NoError, "meshd is shutting down".to_string());
        }
        loop {
            if self.closing {
                return self.poll_close(cx);
            }
            match self.read(cx) {
                Ok(true) => {}
                Ok(false) => return Poll::Ready(()), // the peer closed it
                Err((reason, why)) => {
                    self.go_away(reason, why);
                    continue;
                }
            }
            self.reopen_windows();
            if self.poll_keepalive(cx).is_err() {
                tracing::debug!("HTTP/2 keepalive: no answer to a ping; closing");
                return Poll::Ready(());
            }
            let more = self.drive_streams(cx);
            match self.flush(cx) {
                Err(e) => {
                    tracing::debug!("HTTP/2 connection write failed: {e}");
                    return Poll::Ready(());
                }
                Ok(true) if more => continue,
                Ok(done) => {
                    if done {
                        // Idle: no buffer is kept (the next burst makes a small one).
                        self.scratch = BytesMut::new();
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    /// A closing connection: what is queued (the GOAWAY last) is written, the write side
    /// shut, and what the peer still sends read and dropped until it closes too, so that
    /// unread bytes do not turn the close into a reset that could lose the GOAWAY. All of
    /// it within the keepalive timeout.
    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.keepalive.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        match self.flush(cx) {
            Ok(true) => {}
            Ok(false) => return Poll::Pending,
            Err(_) => return Poll::Ready(()),
        }
        if Pin::new(&mut self.io).poll_shutdown(cx).is_pending() {
            return Poll::Pending;
        }
        let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
        loop {
            let mut read = ReadBuf::uninit(&mut buf);
            match Pin::new(&mut self.io).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(())) if !read.filled().is_empty() => continue,
                Poll::Ready(_) => return Poll::Ready(()),
            }
        }
    }

    /// Reads what the socket holds and handles each whole frame. `Ok(false)` when the
    /// peer closed the connection.
    fn read(&mut self, cx: &mut Context<'_>) -> Result<bool, ConnectionError> {
        let mut total = 0;
        let mut buf = [MaybeUninit::<u8>::uninit(); 16 * 1024];
        loop {
            if total >= READ_PER_POLL {
                cx.waker().wake_by_ref();
                return Ok(true);
            }
            let mut read = ReadBuf::uninit(&mut buf);
            match Pin::new(&mut self.io).poll_read(cx, &mut read) {
                Poll::Pending => return Ok(true),
                Poll::Ready(Err(e)) => {
                    tracing::debug!("HTTP/2 connection read failed: {e}");
                    return Ok(false);
                }
                Poll::Ready(Ok(())) if read.filled().is_empty() => return Ok(false),
                Poll::Ready(Ok(())) => {
                    total += read.filled().len();
                    self.last_read = Instant::now();
                    self.inbuf.extend_from_slice(read.filled());
                    self.frames(cx)?;
                    if self.closing {
                        return Ok(true);
                    }
                }
            }
        }
    }

    /// Handles every whole frame in the read buffer.
    fn frames(&mut self, cx: &mut Context<'_>) -> Result<(), ConnectionError> {
        if !self.preface {
            if self.inbuf.len() < frame::PREFACE.len() {
                return if frame::PREFACE.starts_with(&self.inbuf) {
                    Ok(())
                } else {
                    Err((Reason::ProtocolError, "not an HTTP/2 preface".into()))
                };
            }
            if !self.inbuf.starts_with(frame::PREFACE) {
                return Err((Reason::ProtocolError, "not an HTTP/2 preface".into()));
            }
            self.inbuf.advance(frame::PREFACE.len());
            self.preface = true;
        }
        while self.inbuf.len() >= frame::HEAD {
            let head = Head::parse(&self.inbuf);
            if head.len > frame::DEFAULT_MAX_FRAME {
                return Err((
                    Reason::FrameSizeError,
                    format!(
                        "a frame of {} bytes, over SETTINGS_MAX_FRAME_SIZE",
                        head.len
                    ),
                ));
            }
            if self.inbuf.len() < frame::HEAD + head.len {
                break;
            }
            self.inbuf.advance(frame::HEAD);
            // Copied out rather than split off: a payload split off the read buffer kept
            // the whole buffer (up to READ_PER_POLL) allocated while it waited for its
            // stream, and the next read then needed a new one. Requests are small next to
            // responses, and after a restart, with every proxy's reconnect requests (each
            // naming the ~2,400 resources it holds) read faster than they are answered,
            // those buffers were up to a fifth of meshd's peak (BENCHMARKS.md, session 33).
            let payload = Bytes::copy_from_slice(&self.inbuf[..head.len]);
            self.inbuf.advance(head.len);
            self.frame(cx, head, payload)?;
            if self.unwritten_control > MAX_UNWRITTEN_CONTROL {
                return Err((
                    Reason::EnhanceYourCalm,
                    format!(
                        "more than {MAX_UNWRITTEN_CONTROL} frames answered and none of the \
                         answers read"
                    ),
                ));
            }
        }
        if self.inbuf.is_empty() {
            // Nothing half-read: the buffer goes, so an idle connection holds none.
            self.inbuf = BytesMut::new();
        }
        Ok(())
    }

    fn frame(
        &mut self,
        cx: &mut Context<'_>,
        head: Head,
        payload: Bytes,
    ) -> Result<(), ConnectionError> {
        if self.block.is_some() && head.kind != frame::CONTINUATION {
            return Err((
                Reason::ProtocolError,
                "a frame inside a header block".into(),
            ));
        }
        if matches!(
            head.kind,
            frame::DATA | frame::HEADERS | frame::CONTINUATION
        ) {
            self.count_empty(&head, payload.len())?;
        }
        match head.kind {
            frame::DATA => self.data(head, payload),
            frame::HEADERS => self.headers(cx, head, payload),
            frame::CONTINUATION => self.continuation(cx, head, payload),
            frame::RST_STREAM => {
                if payload.len() != 4 || head.stream == 0 {
                    return Err((Reason::ProtocolError, "a malformed RST_STREAM".into()));
                }
                if let Some(i) = self.find(head.stream) {
                    let s = self.forget(i);
                    s.inbox
                        .end(Err(Status::cancelled("the client reset the stream")));
                    if !s.answered {
                        self.early_reset()?;
                    }
                }
                Ok(())
            }
            frame::SETTINGS => self.settings_frame(head, &payload),
            frame::PING => {
                let payload: [u8; 8] = payload[..]
                    .try_into()
                    .map_err(|_| (Reason::FrameSizeError, "a PING not of 8 bytes".to_string()))?;
                if !head.has(frame::ACK) {
                    self.control(|b| frame::put_ping(b, frame::ACK, payload));
                }
                Ok(())
            }
            frame::GOAWAY => {
                self.goaway_received = true;
                Ok(())
            }
            frame::WINDOW_UPDATE => {
                let Some(inc) = frame::window_increment(&payload) else {
                    return Err((
                        Reason::FrameSizeError,
                        "a WINDOW_UPDATE not of 4 bytes".into(),
                    ));
                };
                let inc = i64::from(inc);
                // An increment of 0 is an error (RFC 9113 §6.9): of the connection on
                // stream 0, else of its stream.
                if inc == 0 && head.stream == 0 {
                    return Err((
                        Reason::ProtocolError,
                        "a WINDOW_UPDATE of 0 for the connection".into(),
                    ));
                }
                if inc == 0 {
                    if let Some(i) = self.find(head.stream) {
                        self.reset(i, Reason::ProtocolError);
                    }
                } else if head.stream == 0 {
                    self.send_window += inc;
                    if self.send_window > frame::MAX_WINDOW {
                        return Err((
                            Reason::FlowControlError,
                            "the connection window overflowed".into(),
                        ));
                    }
                } else if let Some(i) = self.find(head.stream) {
                    self.streams[i].send_window += inc;
                    if self.streams[i].send_window > frame::MAX_WINDOW {
                        self.reset(i, Reason::FlowControlError);
                    }
                }
                Ok(())
            }
            frame::PUSH_PROMISE => {
                Err((Reason::ProtocolError, "a client sent PUSH_PROMISE".into()))
            }
            _ => Ok(()), // PRIORITY, and types this server does not know: ignored
        }
    }

    /// Counts a DATA, HEADERS or CONTINUATION frame towards [`MAX_EMPTY_FRAMES`].
    fn count_empty(&mut self, head: &Head, len: usize) -> Result<(), ConnectionError> {
        let ends_stream = head.kind != frame::CONTINUATION && head.has(frame::END_STREAM);
        if len > 0 || ends_stream {
            self.empty_frames = 0;
            return Ok(());
        }
        self.empty_frames += 1;
        if self.empty_frames > MAX_EMPTY_FRAMES {
            return Err((
                Reason::EnhanceYourCalm,
                format!(
                    "more than {MAX_EMPTY_FRAMES} DATA, HEADERS or CONTINUATION frames in a \
                     row without payload or END_STREAM"
                ),
            ));
        }
        Ok(())
    }

    fn data(&mut self, head: Head, payload: Bytes) -> Result<(), ConnectionError> {
        if head.stream == 0 {
            return Err((Reason::ProtocolError, "DATA on stream 0".into()));
        }
        let len = payload.len() as i64;
        self.recv_window -= len;
        if self.recv_window < 0 {
            return Err((
                Reason::FlowControlError,
                "DATA beyond the connection window".into(),
            ));
        }
        let Some(data) = frame::unpadded(&head, &payload) else {
            return Err((Reason::ProtocolError, "DATA with too much padding".into()));
        };
        let padding = len - data.len() as i64;
        let payload = payload.slice(data);
        let Some(i) = self.find(head.stream) else {
            if head.stream > self.last_stream {
                return Err((
                    Reason::ProtocolError,
                    "DATA on a stream never opened".into(),
                ));
            }
            self.ungranted += len; // a stream already closed: only the connection counts it
            return Ok(());
        };
        self.ungranted += padding;
        let s = &mut self.streams[i];
        s.recv_window -= len;
        s.ungranted += padding;
        if s.recv_window < 0 {
            self.reset(i, Reason::FlowControlError);
            return Ok(());
        }
        if !s.open {
            s.ungranted += len - padding; // never handed to the body
            self.ungranted += len - padding;
            self.reset(i, Reason::StreamClosed);
            return Ok(());
        }
        if !payload.is_empty() {
            s.inbox.push(payload);
        }
        if head.has(frame::END_STREAM) {
            s.inbox.end(Ok(()));
            s.open = false;
        }
        Ok(())
    }

    fn headers(
        &mut self,
        cx: &mut Context<'_>,
        head: Head,
        mut payload: Bytes,
    ) -> Result<(), ConnectionError> {
        if head.stream == 0 {
            return Err((Reason::ProtocolError, "HEADERS on stream 0".into()));
        }
        let Some(fragment) = frame::unpadded(&head, &payload) else {
            return Err((
                Reason::ProtocolError,
                "HEADERS with too much padding".into(),
            ));
        };
        payload = payload.slice(fragment);
        if head.has(frame::PRIORITY) {
            if payload.len() < 5 {
                return Err((Reason::ProtocolError, "a HEADERS priority cut short".into()));
            }
            payload.advance(5);
        }
        let end_stream = head.has(frame::END_STREAM);
        if head.has(frame::END_HEADERS) {
            self.header_block(cx, head.stream, end_stream, &payload)
        } else {
            self.block = Some((head.stream, end_stream, BytesMut::from(&payload[..])));
            Ok(())
        }
    }

    fn continuation(
        &mut self,
        cx: &mut Context<'_>,
        head: Head,
        payload: Bytes,
    ) -> Result<(), ConnectionError> {
        let Some((stream, end_stream, mut block)) = self.block.take() else {
            return Err((Reason::ProtocolError, "CONTINUATION without HEADERS".into()));
        };
        if stream != head.stream {
            return Err((
                Reason::ProtocolError,
                "CONTINUATION on another stream".into(),
            ));
        }
        block.extend_from_slice(&payload);
        if block.len() > MAX_HEADER_BLOCK {
            return Err((Reason::ProtocolError, "a header block over 64 KiB".into()));
        }
        if head.has(frame::END_HEADERS) {
            self.header_block(cx, stream, end_stream, &block)
        } else {
            self.block = Some((stream, end_stream, block));
            Ok(())
        }
    }

    /// A whole header block: a new request, or a request's trailers.
    fn header_block(
        &mut self,
        cx: &mut Context<'_>,
        id: u32,
        end_stream: bool,
        block: &[u8],
    ) -> Result<(), ConnectionError> {
        // Always decoded: the HPACK table must follow every block.
        let head =
            headers::decode(&mut self.decoder, block).map_err(|e| (Reason::CompressionError, e))?;
        if let Some(i) = self.find(id) {
            // Trailers end the request.
            let s = &mut self.streams[i];
            if s.open && end_stream {
                s.inbox.end(Ok(()));
                s.open = false;
            } else {
                self.reset(i, Reason::ProtocolError);
            }
            return Ok(());
        }
        if id.is_multiple_of(2) || id <= self.last_stream {
            return Err((
                Reason::ProtocolError,
                format!("HEADERS opening stream {id}, not a new client stream"),
            ));
        }
        self.last_stream = id;
        if self.goaway_received || self.streams.len() >= self.settings.max_streams {
            self.control(|b| frame::put_rst_stream(b, id, Reason::RefusedStream));
            return Ok(());
        }
        let inbox = Inbox::new(self.waker.clone());
        let request = head.and_then(|h| h.into_request(RecvBody::new(inbox.clone())));
        let mut request = match request {
            Ok(r) => r,
            Err(why) => {
                tracing::debug!("refusing HTTP/2 stream {id}: {why}");
                self.control(|b| frame::put_rst_stream(b, id, Reason::ProtocolError));
                return Ok(());
            }
        };
        if end_stream {
            inbox.end(Ok(()));
        }
        if let Some(peer) = &self.peer {
            request.extensions_mut().insert(peer.clone());
        }
        let deadline =
            headers::grpc_timeout(request.headers()).map(|t| Box::pin(tokio::time::sleep(t)));
        // The services here are always ready (they spawn a task per stream).
        if let Poll::Ready(Err(never)) = self.service.poll_ready(cx) {
            match never {}
        }
        let call = self.service.call(request);
        // Most connections carry one stream for their whole life: room for exactly one,
        // not the four a growing `Vec` would make (~0.6 KB per connection).
        self.streams.reserve_exact(1);
        self.streams.push(Stream {
            id,
            inbox,
            open: !end_stream,
            recv_window: STREAM_WINDOW,
            ungranted: 0,
            send_window: self.peer_initial_window,
            answered: false,
            deadline,
            response: Response::Calling(Box::pin(call)),
        });
        Ok(())
    }

    /// A SETTINGS frame; an ACK acknowledges this server's (it sends only its preface's).
    fn settings_frame(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnectionError> {
        if head.stream != 0 {
            return Err((Reason::ProtocolError, "SETTINGS on a stream".into()));
        }
        if head.has(frame::ACK) {
            self.decoder = request_header_decoder();
            return Ok(());
        }
        if !payload.len().is_multiple_of(6) {
            return Err((
                Reason::FrameSizeError,
                "SETTINGS not a multiple of 6 bytes".into(),
            ));
        }
        for (id, value) in frame::settings(payload) {
            match id {
                frame::SETTINGS_INITIAL_WINDOW_SIZE => {
                    let value = i64::from(value);
                    if value > frame::MAX_WINDOW {
                        return Err((
                            Reason::FlowControlError,
                            "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1".into(),
                        ));
                    }
                    let delta = value - self.peer_initial_window;
                    self.peer_initial_window = value;
                    for s in &mut self.streams {
                        s.send_window += delta;
                    }
                }
                frame::SETTINGS_MAX_FRAME_SIZE => {
                    if !(16_384..=16_777_215).contains(&value) {
                        return Err((
                            Reason::ProtocolError,
                            format!("SETTINGS_MAX_FRAME_SIZE {value}"),
                        ));
                    }
                    self.peer_max_frame = value as usize;
                }
                // This server's header blocks never use the dynamic table, so the
                // peer's HEADER_TABLE_SIZE changes nothing; the rest concern a client.
                _ => {}
            }
        }
        self.control(|b| frame::put_head(b, 0, frame::SETTINGS, frame::ACK, 0));
        Ok(())
    }

    /// Reopens the windows for what the services consumed (in steps of half a window, so
    /// a stream of small requests costs no WINDOW_UPDATE per request).
    fn reopen_windows(&mut self) {
        let mut updates = Vec::new();
        for s in &mut self.streams {
            let consumed = s.inbox.take_consumed() as i64;
            s.ungranted += consumed;
            self.ungranted += consumed;
            // A stream the client ended needs no window; the connection still does.
            if s.open && s.ungranted >= STREAM_WINDOW / 2 {
                updates.push((s.id, s.ungranted));
                s.recv_window += s.ungranted;
                s.ungranted = 0;
            }
        }
        if self.ungranted >= CONNECTION_WINDOW / 2 {
            updates.push((0, self.ungranted));
            self.recv_window += self.ungranted;
            self.ungranted = 0;
        }
        for (stream, inc) in updates {
            self.control(|b| frame::put_window_update(b, stream, inc as u32));
        }
    }

    /// Polls each stream's call and body, framing what they give within the windows.
    /// `true` when the queue limit stopped them (more is ready once the queue is written).
    fn drive_streams(&mut self, cx: &mut Context<'_>) -> bool {
        let mut limited = false;
        let mut i = 0;
        while i < self.streams.len() {
            limited |= self.drive(cx, i);
            if matches!(self.streams[i].response, Response::Done) {
                let s = self.forget(i);
                if s.open {
                    // The response ended first: the client is told to stop sending.
                    s.inbox.end(Ok(()));
                    self.control(|b| frame::put_rst_stream(b, s.id, Reason::NoError));
                }
                continue;
            }
            i += 1;
        }
        if limited && self.streams.len() > 1 {
            // The queue filled before every stream had its turn: the next pass starts
            // with the next stream, so one busy stream cannot starve the others.
            self.streams.rotate_left(1);
        }
        limited
    }

    fn drive(&mut self, cx: &mut Context<'_>, i: usize) -> bool {
        let s = &mut self.streams[i];
        if let Some(deadline) = &mut s.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            self.deadline_exceeded(i);
            return false;
        }
        let s = &mut self.streams[i];
        if let Response::Calling(call) = &mut s.response {
            let Poll::Ready(Ok(response)) = call.as_mut().poll(cx) else {
                return false;
            };
            let (parts, body) = response.into_parts();
            let end = body.is_end_stream();
            let id = s.id;
            s.response = if end {
                Response::Done
            } else {
                Response::Streaming {
                    body,
                    chunk: Bytes::new(),
                    trailers: None,
                    ended: false,
                }
            };
            let mut block = BytesMut::new();
            headers::encode_response(&mut block, parts.status, &parts.headers);
            self.header_frames(id, block, end);
        }
        loop {
            if self.queued >= QUEUE_LIMIT {
                return true;
            }
            let s = &mut self.streams[i];
            let Response::Streaming {
                body,
                chunk,
                trailers,
                ended,
            } = &mut s.response
            else {
                return false;
            };
            if !chunk.is_empty() {
                let n = (chunk.len() as i64)
                    .min(self.peer_max_frame as i64)
                    .min(s.send_window)
                    .min(self.send_window);
                if n <= 0 {
                    return false; // waits for a WINDOW_UPDATE
                }
                s.send_window -= n;
                s.answered = true;
                self.send_window -= n;
                let data = chunk.split_to(n as usize);
                let id = s.id;
                self.make_room(frame::HEAD);
                frame::put_head(&mut self.scratch, data.len(), frame::DATA, 0, id);
                self.enqueue_scratch();
                self.enqueue(data);
                continue;
            }
            if *ended {
                let id = s.id;
                match trailers.take() {
                    Some(t) => {
                        let mut block = BytesMut::new();
                        headers::encode_fields(&mut block, &t);
                        s.response = Response::Done;
                        self.header_frames(id, block, true);
                    }
                    None => {
                        s.response = Response::Done;
                        self.control(|b| frame::put_head(b, 0, frame::DATA, frame::END_STREAM, id));
                    }
                }
                return false;
            }
            match Pin::new(body).poll_frame(cx) {
                Poll::Pending => return false,
                Poll::Ready(None) => *ended = true,
                Poll::Ready(Some(Ok(f))) => match f.into_data() {
                    Ok(data) => *chunk = data,
                    Err(f) => {
                        if let Ok(t) = f.into_trailers() {
                            *trailers = Some(t);
                        }
                        *ended = true;
                    }
                },
                Poll::Ready(Some(Err(status))) => {
                    let mut t = http::HeaderMap::new();
                    let _ = status.add_header(&mut t);
                    *trailers = Some(t);
                    *ended = true;
                }
            }
        }
    }

    /// The request's `grpc-timeout` ran out before its response ended: the call or body
    /// is dropped, the request ends with DEADLINE_EXCEEDED, and so does the response,
    /// trailers-only if its headers were not sent yet (as gRPC's servers end it).
    fn deadline_exceeded(&mut self, i: usize) {
        let status = || Status::deadline_exceeded("the request's grpc-timeout ran out");
        let s = &mut self.streams[i];
        s.deadline = None;
        s.inbox.end(Err(status()));
        let headers_sent = !matches!(s.response, Response::Calling(_));
        s.response = Response::Done;
        let id = s.id;
        let mut block = BytesMut::new();
        if headers_sent {
            let mut trailers = http::HeaderMap::new();
            let _ = status().add_header(&mut trailers);
            headers::encode_fields(&mut block, &trailers);
        } else {
            let response = status().into_http::<()>();
            headers::encode_response(&mut block, response.status(), response.headers());
        }
        self.header_frames(id, block, true);
    }

    /// A header block as HEADERS and, past the peer's frame size, CONTINUATIONs.
    fn header_frames(&mut self, id: u32, block: BytesMut, end_stream: bool) {
        let max = self.peer_max_frame;
        let mut rest = &block[..];
        let mut kind = frame::HEADERS;
        let mut flags = if end_stream { frame::END_STREAM } else { 0 };
        loop {
            let n = rest.len().min(max);
            if n == rest.len() {
                flags |= frame::END_HEADERS;
            }
            self.control(|b| {
                frame::put_head(b, n, kind, flags, id);
                b.put_slice(&rest[..n]);
            });
            rest = &rest[n..];
            if rest.is_empty() {
                return;
            }
            kind = frame::CONTINUATION;
            flags = 0;
        }
    }

    /// A control frame written by `f`, queued.
    fn control(&mut self, f: impl FnOnce(&mut BytesMut)) {
        self.unwritten_control = self.unwritten_control.saturating_add(1);
        self.make_room(64);
        f(&mut self.scratch);
        self.enqueue_scratch();
    }

    fn make_room(&mut self, at_least: usize) {
        if self.scratch.capacity() < at_least {
            self.scratch.reserve(SCRATCH.max(at_least));
        }
    }

    fn enqueue_scratch(&mut self) {
        let bytes = self.scratch.split().freeze();
        self.enqueue(bytes);
    }

    fn enqueue(&mut self, bytes: Bytes) {
        self.queued += bytes.len();
        self.queue.push_back(bytes);
    }

    /// Writes the queue, many frames per `writev`. `Ok(true)` when all of it is written.
    fn flush(&mut self, cx: &mut Context<'_>) -> std::io::Result<bool> {
        while !self.queue.is_empty() {
            let mut slices = [IoSlice::new(&[]); WRITE_SLICES];
            let mut n = 0;
            for (slot, b) in slices.iter_mut().zip(&self.queue) {
                *slot = IoSlice::new(b);
                n += 1;
            }
            let written = match Pin::new(&mut self.io).poll_write_vectored(cx, &slices[..n]) {
                Poll::Pending => return Ok(false),
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Ready(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(w)) => w,
            };
            self.queued -= written;
            let mut left = written;
            while left > 0 {
                let front = self.queue.front_mut().expect("written bytes were queued");
                if front.len() <= left {
                    left -= front.len();
                    self.queue.pop_front();
                } else {
                    front.advance(left);
                    left = 0;
                }
            }
        }
        self.unwritten_control = 0;
        if self.queue.capacity() > 64 {
            self.queue = VecDeque::new();
        }
        Ok(true)
    }

    /// Pings a connection nothing was read from for the keepalive interval; `Err` when
    /// a ping went unanswered (nothing read) for the keepalive timeout.
    fn poll_keepalive(&mut self, cx: &mut Context<'_>) -> Result<(), ()> {
        while self.keepalive.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            if let Some(sent) = self.ping_sent.take()
                && self.last_read < sent
            {
                return Err(());
            }
            let idle_until = self.last_read + self.settings.keepalive_interval;
            if now >= idle_until {
                self.control(|b| frame::put_ping(b, 0, *b"meshd ka"));
                self.ping_sent = Some(now);
                self.keepalive
                    .as_mut()
                    .reset(now + self.settings.keepalive_timeout);
            } else {
                self.keepalive.as_mut().reset(idle_until);
            }
        }
        Ok(())
    }

    /// Removes stream `i`. What it received and the connection has not yet reopened the
    /// window for (consumed or not) is given back to the connection's window.
    fn forget(&mut self, i: usize) -> Stream<S::Future> {
        let s = self.streams.swap_remove(i);
        // Received and not reopened, less what the connection already counted as consumed.
        self.ungranted += STREAM_WINDOW - s.recv_window - s.ungranted;
        s
    }

    fn find(&self, id: u32) -> Option<usize> {
        self.streams.iter().position(|s| s.id == id)
    }

    /// A stream error: RST_STREAM, and the stream forgotten.
    fn reset(&mut self, i: usize, reason: Reason) {
        let s = self.forget(i);
        s.inbox.end(Err(Status::internal(format!(
            "HTTP/2 stream error {reason:?}"
        ))));
        self.control(|b| frame::put_rst_stream(b, s.id, reason));
    }

    /// Counts a stream the client reset before its response began; an error once there
    /// were more than [`MAX_EARLY_RESETS`] within [`EARLY_RESET_WINDOW`].
    fn early_reset(&mut self) -> Result<(), ConnectionError> {
        let now = Instant::now();
        let (count, since) = &mut self.early_resets;
        if now.duration_since(*since) > EARLY_RESET_WINDOW {
            (*count, *since) = (0, now);
        }
        *count += 1;
        if *count > MAX_EARLY_RESETS {
            return Err((
                Reason::EnhanceYourCalm,
                format!(
                    "more than {MAX_EARLY_RESETS} streams reset before their response \
                     within {EARLY_RESET_WINDOW:?} (rapid reset)"
                ),
            ));
        }
        Ok(())
    }

    /// A connection error (or shutdown): GOAWAY, with why as its debug data, then the
    /// connection closes once the queue is written. An error is logged and counted.
    fn go_away(&mut self, reason: Reason, why: String) {
        if reason != Reason::NoError {
            tracing::warn!("closing an HTTP/2 connection, {reason:?}: {why}");
            self.settings.on_error.call(reason.label());
        }
        let mut cut = why.len().min(MAX_GOAWAY_DEBUG);
        while !why.is_char_boundary(cut) {
            cut -= 1;
        }
        let last = self.last_stream;
        self.control(|b| frame::put_goaway(b, last, reason, &why.as_bytes()[..cut]));
        self.closing = true;
        let deadline = Instant::now() + self.settings.keepalive_timeout;
        self.keepalive.as_mut().reset(deadline);
    }

    /// Every stream's request ends with `why` as the connection goes.
    fn end_streams(&mut self, why: &str) {
        for s in self.streams.drain(..) {
            s.inbox.end(Err(Status::unavailable(why.to_string())));
        }
    }
}
