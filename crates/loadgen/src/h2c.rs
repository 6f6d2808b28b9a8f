//! A simulated proxy's own HTTP/2 connection (cleartext, prior knowledge), carrying its one
//! gRPC stream: the requests it is handed go out as DATA frames, and the response's DATA
//! frames come back as the frames of an [`http_body::Body`] that [`Messages`] decodes.
//!
//! Why not hyper's client: Envoy's CPU is not meshd's, but the simulator shares the
//! machine's two cores with meshd. Through hyper, each push to a proxy crossed three of the
//! simulator's tasks (h2's connection task, the proxy's task, and the task piping its
//! requests into h2), and h2 copied each frame out of its read buffer. Here the proxy's own
//! task reads the socket, parses the frames in place and writes its ACK, with one read and
//! one write per push.
//!
//! It does what one gRPC stream needs and no more: the preface and SETTINGS (acknowledged
//! both ways), PING answered, both directions' flow control, and a header block encoded
//! once. The response's header blocks are skipped unread (HPACK state only matters to a
//! decoder): the status line and a trailer's `grpc-status` are not examined, and the end
//! of the stream is the END_STREAM flag, as a simulated proxy reconnects either way.
//!
//! [`Messages`]: grpc_messages::Messages

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::Frame;
use prost::bytes::{Buf, Bytes, BytesMut};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::frame::{self, Head, literal};
use grpc_messages as wire;

/// Its one stream's id (the first a client opens).
const STREAM: u32 = 1;
/// The receive windows it offers, hyper's client defaults (the simulator used hyper's
/// client before): 2 MiB per stream, 5 MiB for the connection.
const STREAM_WINDOW: u32 = 2 << 20;
const CONNECTION_WINDOW: u32 = 5 << 20;
/// The largest frame it accepts: the default, as it announces no other.
const MAX_FRAME: usize = frame::DEFAULT_MAX_FRAME;

/// One gRPC stream on a connection of its own. Its requests come from `requests` (the
/// stream's request side ends when that closes); it is read as the response body.
pub struct Stream<Req> {
    io: Io,
    requests: mpsc::Receiver<Req>,
    requests_ended: bool,
    /// The request side's END_STREAM is framed.
    end_sent: bool,
    /// Received, not yet parsed. Each response's DATA payload is split off it and shared,
    /// not copied.
    read: BytesMut,
    /// Frames to write, from `written` on.
    write: Vec<u8>,
    written: usize,
    /// Request bytes (gRPC frames) waiting for the peer's window.
    unsent: BytesMut,
    /// What it may still send: the connection's window, the stream's, and the peer's
    /// frame size.
    send_connection: i64,
    send_stream: i64,
    peer_initial_window: i64,
    peer_max_frame: usize,
    /// Received since the last WINDOW_UPDATE it sent (connection and stream alike, as
    /// it has one stream).
    unreleased: u32,
    /// The response's END_STREAM was read.
    ended: bool,
}

impl<Req: prost::Message> Stream<Req> {
    /// Opens the connection and the stream for gRPC method `path` (e.g.
    /// `/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources`)
    /// on `authority`. Nothing is written until the stream is first polled.
    pub fn open(io: Io, authority: &str, path: &str, requests: mpsc::Receiver<Req>) -> Self {
        let mut write = Vec::with_capacity(256);
        write.extend_from_slice(frame::PREFACE);
        frame::put_settings(
            &mut write,
            &[
                (frame::SETTINGS_ENABLE_PUSH, 0),
                (frame::SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
            ],
        );
        let opened = CONNECTION_WINDOW - frame::DEFAULT_WINDOW as u32;
        frame::put_window_update(&mut write, 0, opened);
        let block = request_headers(authority, path);
        frame::put_head(
            &mut write,
            block.len(),
            frame::HEADERS,
            frame::END_HEADERS,
            STREAM,
        );
        write.extend_from_slice(&block);
        Stream {
            io,
            requests,
            requests_ended: false,
            end_sent: false,
            read: BytesMut::new(),
            write,
            written: 0,
            unsent: BytesMut::new(),
            send_connection: frame::DEFAULT_WINDOW,
            send_stream: frame::DEFAULT_WINDOW,
            peer_initial_window: frame::DEFAULT_WINDOW,
            peer_max_frame: frame::DEFAULT_MAX_FRAME,
            unreleased: 0,
            ended: false,
        }
    }

    /// Takes the requests ready to go and frames as much of them as the peer's windows
    /// allow; the request side ends (an empty DATA frame with END_STREAM) once they are
    /// all sent and the sender is gone.
    fn take_requests(&mut self, cx: &mut Context<'_>) {
        while !self.requests_ended {
            match self.requests.poll_recv(cx) {
                Poll::Ready(Some(request)) => {
                    let len = request.encoded_len();
                    self.unsent.reserve(wire::FRAME_HEADER + len);
                    wire::put_frame_header(&mut self.unsent, len);
                    request.encode_raw(&mut self.unsent);
                }
                Poll::Ready(None) => self.requests_ended = true,
                Poll::Pending => break,
            }
        }
        while !self.unsent.is_empty() {
            let room = self.send_connection.min(self.send_stream);
            let n = (self.unsent.len() as i64)
                .min(room)
                .min(self.peer_max_frame as i64);
            if n <= 0 {
                return; // until a WINDOW_UPDATE
            }
            let n = n as usize;
            frame::put_head(&mut self.write, n, frame::DATA, 0, STREAM);
            self.write.extend_from_slice(&self.unsent[..n]);
            self.unsent.advance(n);
            self.send_connection -= n as i64;
            self.send_stream -= n as i64;
        }
        if self.unsent.is_empty() && self.unsent.capacity() > 4096 {
            self.unsent = BytesMut::new(); // a reconnect's large first requests are not kept
        }
        if self.requests_ended && self.unsent.is_empty() && !self.end_sent {
            frame::put_head(&mut self.write, 0, frame::DATA, frame::END_STREAM, STREAM);
            self.end_sent = true;
        }
    }

    /// Writes what is framed; `Pending` leaves the rest for when the socket has room.
    fn poll_flush_frames(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        while self.written < self.write.len() {
            match Pin::new(&mut self.io).poll_write(cx, &self.write[self.written..]) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => self.written += n,
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => return Ok(()),
            }
        }
        self.write.clear();
        self.written = 0;
        if self.write.capacity() > 64 << 10 {
            self.write = Vec::new(); // nor their frames
        }
        // TLS may hold records back until flushed; TCP holds nothing.
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Ready(Err(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// The next frame in what was read, handled: a DATA payload of its stream to hand
    /// on, or nothing (a control frame, answered if it asks for an answer; or no whole
    /// frame yet).
    fn next_frame(&mut self) -> Result<Parsed, Error> {
        if self.read.len() < frame::HEAD {
            return Ok(Parsed::Incomplete);
        }
        let head = Head::parse(&self.read);
        let Head {
            len,
            kind,
            flags,
            stream,
        } = head;
        if len > MAX_FRAME {
            return Err(Error::Protocol(format!(
                "a frame of {len} bytes, over the {MAX_FRAME} announced"
            )));
        }
        if self.read.len() < frame::HEAD + len {
            return Ok(Parsed::Incomplete);
        }
        self.read.advance(frame::HEAD);
        let mut payload = self.read.split_to(len);
        match kind {
            frame::DATA => {
                self.received(len as u32);
                let Some(data) = frame::unpadded(&head, &payload) else {
                    return Err(Error::Protocol("a DATA frame's padding".into()));
                };
                payload.truncate(data.end);
                payload.advance(data.start);
                if flags & frame::END_STREAM != 0 {
                    self.ended = true;
                }
                if stream != STREAM {
                    return Ok(Parsed::Handled);
                }
                Ok(Parsed::Data(payload.freeze()))
            }
            frame::HEADERS if stream == STREAM => {
                // The response's headers or its trailers: only whether they end it.
                if flags & frame::END_STREAM != 0 {
                    self.ended = true;
                }
                Ok(Parsed::Handled)
            }
            frame::SETTINGS if flags & frame::ACK == 0 => {
                for (id, value) in frame::settings(&payload) {
                    match id {
                        frame::SETTINGS_INITIAL_WINDOW_SIZE => {
                            self.send_stream += value as i64 - self.peer_initial_window;
                            self.peer_initial_window = value as i64;
                        }
                        frame::SETTINGS_MAX_FRAME_SIZE => self.peer_max_frame = value as usize,
                        _ => {}
                    }
                }
                frame::put_head(&mut self.write, 0, frame::SETTINGS, frame::ACK, 0);
                Ok(Parsed::Handled)
            }
            frame::PING if flags & frame::ACK == 0 => {
                frame::put_head(&mut self.write, len, frame::PING, frame::ACK, 0);
                self.write.extend_from_slice(&payload);
                Ok(Parsed::Handled)
            }
            frame::WINDOW_UPDATE => {
                if let Some(increment) = frame::window_increment(&payload) {
                    match stream {
                        0 => self.send_connection += i64::from(increment),
                        STREAM => self.send_stream += i64::from(increment),
                        _ => {}
                    }
                }
                Ok(Parsed::Handled)
            }
            frame::RST_STREAM if stream == STREAM && len == 4 => Err(Error::Protocol(format!(
                "meshd reset the stream (error code {})",
                u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
            ))),
            frame::GOAWAY if len >= 8 => Err(Error::Protocol(format!(
                "meshd sent GOAWAY (error code {})",
                u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]])
            ))),
            // PRIORITY, CONTINUATION (of header blocks it skips), acknowledgements and
            // frames of other streams.
            _ => Ok(Parsed::Handled),
        }
    }

    /// Counts `len` bytes of DATA received, and gives them back to the peer (a
    /// WINDOW_UPDATE for the connection and the stream) once half a window has come.
    fn received(&mut self, len: u32) {
        self.unreleased += len;
        if self.unreleased >= STREAM_WINDOW / 2 {
            frame::put_window_update(&mut self.write, 0, self.unreleased);
            frame::put_window_update(&mut self.write, STREAM, self.unreleased);
            self.unreleased = 0;
        }
    }

    /// Reads what the socket holds into `read`, up to [`AHEAD`](super::read_ahead::AHEAD)
    /// at once, as hyper's connections read ahead. A fresh buffer when the current one lacks
    /// room for a whole frame: the payloads handed on still share the old one, which goes
    /// when they do. An emptied buffer is dropped, so an idle stream holds none.
    fn poll_read_more(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.read.capacity() - self.read.len() < frame::HEAD + MAX_FRAME {
            let mut fresh = BytesMut::with_capacity(super::read_ahead::AHEAD);
            fresh.extend_from_slice(&self.read);
            self.read = fresh;
        }
        match &mut self.io {
            Io::Plain(tcp) => loop {
                std::task::ready!(tcp.poll_read_ready(cx))?;
                match tcp.try_read_buf(&mut self.read) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    done => return Poll::Ready(done),
                }
            },
            Io::Tls(tls) => tokio_util::io::poll_read_buf(Pin::new(tls), cx, &mut self.read),
        }
    }
}

/// What a stream runs over: TCP (the plaintext xDS port), or TLS over TCP presenting a
/// workload certificate (the secure port, as sidecars connect in Istio).
pub enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Io::Tls(tls) => Pin::new(tls).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Io::Tls(tls) => Pin::new(tls).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Io::Tls(tls) => Pin::new(tls).poll_shutdown(cx),
        }
    }
}

/// How a stream's connection is secured: the connector holding a proxy's workload
/// certificate and the name meshd's serving certificate is checked against.
#[derive(Clone)]
pub struct Tls {
    pub connector: tokio_rustls::TlsConnector,
    pub server_name: rustls::pki_types::ServerName<'static>,
}

enum Parsed {
    Data(Bytes),
    Handled,
    Incomplete,
}

/// Why a stream ended other than by the response's END_STREAM.
#[derive(Debug)]
pub enum Error {
    Io(io::Error),
    Protocol(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io(e) => write!(f, "{e}"),
            Error::Protocol(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for Error {}

impl<Req: prost::Message + Unpin> http_body::Body for Stream<Req> {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self.get_mut();
        loop {
            this.take_requests(cx);
            if let Err(e) = this.poll_flush_frames(cx) {
                return Poll::Ready(Some(Err(Error::Io(e))));
            }
            match this.next_frame() {
                Ok(Parsed::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(Parsed::Handled) => continue,
                Ok(Parsed::Incomplete) if this.ended => return Poll::Ready(None),
                Ok(Parsed::Incomplete) => {}
                Err(e) => return Poll::Ready(Some(Err(e))),
            }
            if this.read.is_empty() && this.read.capacity() > 0 {
                this.read = BytesMut::new();
            }
            match this.poll_read_more(cx) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Some(Err(Error::Io(io::ErrorKind::UnexpectedEof.into()))));
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(Error::Io(e)))),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// The request's header block (HPACK, RFC 7541): the static table's entries where it has
/// them, the rest as literals without indexing, none Huffman-coded.
fn request_headers(authority: &str, path: &str) -> Vec<u8> {
    let mut block = Vec::with_capacity(64 + authority.len() + path.len());
    block.push(0x80 | 3); // :method POST
    block.push(0x80 | 6); // :scheme http
    literal(&mut block, 4, b"", path.as_bytes()); // :path
    literal(&mut block, 1, b"", authority.as_bytes()); // :authority
    literal(&mut block, 31, b"", b"application/grpc"); // content-type
    literal(&mut block, 0, b"te", b"trailers");
    block
}

/// Connects to `address` ([`connect_tcp`](super::connect_tcp)), over TLS with `tls`, and
/// opens the stream: its responses, decoded.
pub async fn connect<Req, Resp>(
    address: &str,
    tls: Option<&Tls>,
    path: &str,
    requests: mpsc::Receiver<Req>,
    limit: usize,
) -> io::Result<wire::Messages<Resp>>
where
    Req: prost::Message + Unpin + Send + 'static,
    Resp: prost::Message + Default + Send + 'static,
{
    let tcp = super::connect_tcp(address).await?;
    let io = match tls {
        None => Io::Plain(tcp),
        Some(tls) => Io::Tls(Box::new(
            tls.connector.connect(tls.server_name.clone(), tcp).await?,
        )),
    };
    Ok(wire::Messages::new(
        Stream::open(io, address, path, requests),
        limit,
    ))
}

#[cfg(test)]
mod tests {
    use envoy_api::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
    use envoy_api::pb::google::protobuf::Any;
    use prost::Message;
    use tokio::net::TcpListener;
    use tonic::codegen::http;

    use super::*;

    /// A gRPC frame's messages, decoded.
    fn messages<M: Message + Default>(mut framed: &[u8]) -> Vec<M> {
        let mut out = Vec::new();
        while !framed.is_empty() {
            let len = u32::from_be_bytes(framed[1..5].try_into().unwrap()) as usize;
            out.push(M::decode(&framed[5..5 + len]).unwrap());
            framed = &framed[5 + len..];
        }
        out
    }

    fn response(i: u8, len: usize) -> DiscoveryResponse {
        DiscoveryResponse {
            nonce: format!("n{i}"),
            resources: vec![Any {
                type_url: "t".into(),
                value: vec![i; len],
            }],
            ..Default::default()
        }
    }

    /// An h2 server (hyper's HTTP/2 implementation, not the client's) that offers a
    /// window smaller, then larger, than HTTP/2's default and a ping, answers with three
    /// 1 MB messages (more than the client's 2 MiB stream window), and trailers once the
    /// client ends its side: every byte arrives, both ways, and the stream ends at the
    /// trailers.
    #[tokio::test]
    async fn carries_a_grpc_stream_through_an_independent_http2_server_both_ways() {
        round_trip(1_000).await;
        round_trip(1 << 20).await;
    }

    async fn round_trip(server_window: u32) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let long_path = format!("/test.Service/{}", "m".repeat(300));
        let path = long_path.clone();
        let server = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut conn = h2::server::Builder::new()
                .initial_window_size(server_window)
                .initial_connection_window_size(server_window)
                .handshake::<_, Bytes>(socket)
                .await
                .unwrap();
            let (request, mut respond) = conn.accept().await.unwrap().unwrap();
            let mut ping_pong = conn.ping_pong().unwrap();
            tokio::spawn(async move { while conn.accept().await.is_some() {} });
            assert_eq!(request.method(), "POST");
            assert_eq!(request.uri().path(), path);
            assert_eq!(request.headers()["content-type"], "application/grpc");
            assert_eq!(request.headers()["te"], "trailers");
            let mut body = request.into_body();
            let mut received = Vec::new();
            let mut read_until = async |received: &mut Vec<u8>, n: usize| {
                while received.len() < n {
                    let Some(chunk) = body.data().await else {
                        return false;
                    };
                    let chunk = chunk.unwrap();
                    body.flow_control().release_capacity(chunk.len()).unwrap();
                    received.extend_from_slice(&chunk);
                }
                true
            };
            // Two requests: 1.1 MB, then a small one.
            let first_len = 5 + big_request().encoded_len();
            let small_len = 5 + small_request().encoded_len();
            assert!(read_until(&mut received, first_len + small_len).await);
            ping_pong.ping(h2::Ping::opaque()).await.unwrap();
            let head = http::Response::builder()
                .header("content-type", "application/grpc")
                .body(())
                .unwrap();
            let mut send = respond.send_response(head, false).unwrap();
            for i in 0..3 {
                send.send_data(wire::prost_frame(&response(i, 1 << 20)), false)
                    .unwrap();
            }
            // The client's request side ends, then the trailers end the stream.
            assert!(!read_until(&mut received, usize::MAX).await);
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            send.send_trailers(trailers).unwrap();
            received
        });
        let (tx, rx) = mpsc::channel(4);
        tx.send(big_request()).await.unwrap();
        tx.send(small_request()).await.unwrap();
        let io = TcpStream::connect(&address).await.unwrap();
        let mut stream: wire::Messages<DiscoveryResponse> = wire::Messages::new(
            Stream::open(Io::Plain(io), &address, &long_path, rx),
            16 << 20,
        );
        // A window, ping or setting not honoured stalls one side: bounded.
        let bounded = std::time::Duration::from_secs(30);
        let client = async {
            for i in 0..3 {
                assert_eq!(stream.message().await.unwrap(), Some(response(i, 1 << 20)));
            }
            drop(tx);
            assert_eq!(
                stream.message().await.unwrap(),
                None,
                "ended by the trailers"
            );
        };
        tokio::time::timeout(bounded, client)
            .await
            .expect("stalled");
        let received = tokio::time::timeout(bounded, server)
            .await
            .expect("stalled");
        let received = received.unwrap();
        assert_eq!(
            messages::<DiscoveryRequest>(&received),
            [big_request(), small_request()]
        );
    }

    fn big_request() -> DiscoveryRequest {
        DiscoveryRequest {
            resource_names: (0..50_000)
                .map(|i| format!("outbound|80||svc-{i}"))
                .collect(),
            ..Default::default()
        }
    }

    fn small_request() -> DiscoveryRequest {
        DiscoveryRequest {
            response_nonce: "n0".into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_reset_stream_ends_with_an_error_naming_the_reset() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut conn = h2::server::handshake(socket).await.unwrap();
            let (_request, mut respond) = conn.accept().await.unwrap().unwrap();
            let head = http::Response::builder().body(()).unwrap();
            let mut send = respond.send_response(head, false).unwrap();
            send.send_reset(h2::Reason::CANCEL);
            while conn.accept().await.is_some() {}
        });
        let (_tx, rx) = mpsc::channel::<DiscoveryRequest>(1);
        let io = TcpStream::connect(&address).await.unwrap();
        let mut stream: wire::Messages<DiscoveryResponse> =
            wire::Messages::new(Stream::open(Io::Plain(io), &address, "/t.S/M", rx), 1 << 20);
        let err = stream.message().await.unwrap_err();
        assert!(
            err.message().contains("reset the stream (error code 8)"),
            "{err:?}"
        );
    }
}
