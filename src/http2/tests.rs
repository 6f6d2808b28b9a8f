//! The server against h2's client, an HTTP/2 implementation independent of it, and
//! against raw frames where a well-behaved client cannot misbehave on demand.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body as _, Frame};
use prost::bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tonic::Status;
use tonic::codegen::{Service, http};

use super::frame::{self, Head};
use super::{RecvBody, Settings, serve};

/// Echoes each request's DATA back, then `grpc-status: 0`, as the ADS service works: a
/// task reads the request and hands what it read to the response body through a channel.
/// Reports how each request ended. `/refused` answers trailers-only.
#[derive(Clone)]
struct Echo {
    ended: mpsc::UnboundedSender<String>,
}

impl Service<http::Request<RecvBody>> for Echo {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<RecvBody>) -> Self::Future {
        use futures::FutureExt;
        match request.uri().path() {
            "/refused" => {
                let refused = Status::unimplemented("no such method").into_http();
                return futures::future::ready(Ok(refused)).boxed();
            }
            "/stall" => return futures::future::pending().boxed(), // never answers
            "/alone" => {
                // Answers whether the request's first DATA chunk is the only owner of its
                // memory, or shares it (with the connection's read buffer).
                let mut body = request.into_body();
                return async move {
                    let first = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx));
                    let data = first.await.unwrap().unwrap().into_data().unwrap();
                    let owner = if data.try_into_mut().is_ok() {
                        "alone"
                    } else {
                        "shared"
                    };
                    let body = Canned::Once(Some(Bytes::from_static(owner.as_bytes())));
                    Ok(http::Response::new(tonic::body::Body::new(body)))
                }
                .boxed();
            }
            _ => {}
        }
        let canned = match request.uri().path() {
            "/flood" => Some(Canned::Flood),
            "/hello" => Some(Canned::Once(Some(Bytes::from_static(b"hello")))),
            "/unread" => Some(Canned::Never),
            _ => None,
        };
        if let Some(body) = canned {
            // The request's body is dropped unread: what arrives for it stays unconsumed.
            let response = http::Response::new(tonic::body::Body::new(body));
            return futures::future::ready(Ok(response)).boxed();
        }
        let (tx, rx) = mpsc::channel(4);
        let ended = self.ended.clone();
        let mut request = request.into_body();
        tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| Pin::new(&mut request).poll_frame(cx)).await {
                    Some(Ok(frame)) => {
                        if tx.send(frame.into_data().unwrap()).await.is_err() {
                            let _ = ended.send("response dropped".to_string());
                            return;
                        }
                    }
                    Some(Err(status)) => {
                        let _ = ended.send(format!("error: {}", status.message()));
                        return;
                    }
                    None => {
                        let _ = ended.send("end".to_string());
                        return;
                    }
                }
            }
        });
        let body = EchoBody { rx, done: false };
        futures::future::ready(Ok(http::Response::new(tonic::body::Body::new(body)))).boxed()
    }
}

struct EchoBody {
    rx: mpsc::Receiver<Bytes>,
    done: bool,
}

impl http_body::Body for EchoBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(data)) => Poll::Ready(Some(Ok(Frame::data(data)))),
            Poll::Ready(None) => {
                self.done = true;
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
        }
    }
}

/// The other answers the test service gives, none reading its request.
enum Canned {
    /// 64 KiB chunks without end, each ready at once.
    Flood,
    /// One chunk.
    Once(Option<Bytes>),
    /// Never a frame.
    Never,
}

impl http_body::Body for Canned {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        match &mut *self {
            Canned::Flood => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&[1; 65_536]))))),
            Canned::Once(chunk) => Poll::Ready(chunk.take().map(|data| Ok(Frame::data(data)))),
            Canned::Never => Poll::Pending,
        }
    }
}

struct Server {
    address: std::net::SocketAddr,
    ended: mpsc::UnboundedReceiver<String>,
    shutdown: watch::Sender<bool>,
}

/// A server whose connection errors are collected, by label.
async fn counting_server() -> (Server, Arc<Mutex<Vec<&'static str>>>) {
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = errors.clone();
    let settings = Settings {
        on_error: super::ErrorHook::new(move |reason| seen.lock().unwrap().push(reason)),
        ..settings()
    };
    (server(settings).await, errors)
}

async fn server(settings: Settings) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (tx, ended) = mpsc::unbounded_channel();
    let (shutdown, rx) = watch::channel(false);
    tokio::spawn(serve(listener, Echo { ended: tx }, settings, rx));
    Server {
        address,
        ended,
        shutdown,
    }
}

fn settings() -> Settings {
    Settings {
        keepalive_interval: Duration::from_secs(30),
        keepalive_timeout: Duration::from_secs(10),
        max_streams: 100,
        on_error: Default::default(),
    }
}

async fn client(address: std::net::SocketAddr, window: u32) -> h2::client::SendRequest<Bytes> {
    let tcp = TcpStream::connect(address).await.unwrap();
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(window)
        .initial_connection_window_size(window)
        .handshake(tcp)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

fn post(path: &str) -> http::Request<()> {
    http::Request::post(format!("http://meshd{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

/// Sends `chunks` on one stream and returns what came back and the trailers' status.
async fn echo(
    client: &mut h2::client::SendRequest<Bytes>,
    chunks: Vec<Bytes>,
) -> (Vec<u8>, String) {
    let mut client = client.clone().ready().await.unwrap();
    let (response, mut send) = client.send_request(post("/echo"), false).unwrap();
    let sender = tokio::spawn(async move {
        let n = chunks.len();
        for (i, chunk) in chunks.into_iter().enumerate() {
            send.reserve_capacity(chunk.len());
            send.send_data(chunk, i + 1 == n).unwrap();
        }
        send
    });
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut received = Vec::new();
    while let Some(data) = body.data().await {
        let data = data.unwrap();
        body.flow_control().release_capacity(data.len()).unwrap();
        received.extend_from_slice(&data);
    }
    let trailers = body.trailers().await.unwrap().unwrap();
    drop(sender.await.unwrap());
    (
        received,
        trailers["grpc-status"].to_str().unwrap().to_string(),
    )
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

const LIMIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn echoes_megabytes_both_ways_within_small_and_large_windows() {
    let mut s = server(settings()).await;
    // The client's window: 1 KiB (the server waits for each WINDOW_UPDATE), then wider
    // than any response. 3 MiB of requests: more than the server's own 1 MiB stream
    // window, which reopens only as the service consumes.
    for window in [1024, 8 << 20] {
        let mut client = client(s.address, window).await;
        let sent = pattern(3 << 20, window as u8);
        let chunks = sent.chunks(100_000).map(Bytes::copy_from_slice).collect();
        let (received, status) = tokio::time::timeout(LIMIT, echo(&mut client, chunks))
            .await
            .expect("the echo finished");
        assert_eq!(received.len(), sent.len());
        assert!(received == sent, "the echo differs from what was sent");
        assert_eq!(status, "0");
        assert_eq!(s.ended.recv().await.unwrap(), "end");
    }
}

#[tokio::test]
async fn streams_on_one_connection_are_served_side_by_side() {
    let mut s = server(settings()).await;
    let client = client(s.address, 65_535).await;
    let echoes = (0..8u8).map(|i| {
        let mut client = client.clone();
        tokio::spawn(async move {
            let sent = pattern(200_000 + usize::from(i) * 1000, i);
            let chunks = sent.chunks(7_000).map(Bytes::copy_from_slice).collect();
            let (received, status) = echo(&mut client, chunks).await;
            (received == sent, status)
        })
    });
    for echo in futures::future::join_all(echoes).await {
        assert_eq!(echo.unwrap(), (true, "0".to_string()));
    }
    for _ in 0..8 {
        assert_eq!(s.ended.recv().await.unwrap(), "end");
    }
}

#[tokio::test]
async fn a_reset_ends_the_request_with_an_error_and_the_connection_serves_on() {
    let mut s = server(settings()).await;
    let mut client = client(s.address, 65_535).await;
    let mut ready = client.clone().ready().await.unwrap();
    let (response, mut send) = ready.send_request(post("/echo"), false).unwrap();
    send.send_data(Bytes::from_static(b"hello"), false).unwrap();
    let mut body = response.await.unwrap().into_body();
    assert_eq!(body.data().await.unwrap().unwrap(), "hello");
    send.send_reset(h2::Reason::CANCEL);
    let ended = tokio::time::timeout(LIMIT, s.ended.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(ended.contains("reset"), "{ended}");
    let (received, _) = echo(&mut client, vec![Bytes::from_static(b"again")]).await;
    assert_eq!(received, b"again");
}

#[tokio::test]
async fn what_reset_streams_left_unread_reopens_the_connection_window() {
    let s = server(settings()).await;
    let mut client = client(s.address, 65_535).await;
    // 40 streams of 900 KB each that the service never reads, each reset by the client:
    // 36 MB, more than twice the 16 MiB connection window. Unless what they left unread
    // is given back to the connection, the last echo finds no window left.
    for _ in 0..40 {
        let mut ready = client.clone().ready().await.unwrap();
        let (_response, mut send) = ready.send_request(post("/unread"), false).unwrap();
        send.send_data(Bytes::from(vec![7; 900_000]), false)
            .unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        send.send_reset(h2::Reason::CANCEL);
    }
    let sent = pattern(1 << 20, 9);
    let chunks = sent.chunks(65_536).map(Bytes::copy_from_slice).collect();
    let (received, _) = tokio::time::timeout(LIMIT, echo(&mut client, chunks))
        .await
        .expect("the echo found a window");
    assert!(received == sent);
}

#[tokio::test]
async fn a_stream_with_endless_data_does_not_starve_the_others() {
    let s = server(settings()).await;
    // A raw client with windows as wide as HTTP/2 allows, so that only the server's
    // turn-taking can share the connection: stream 1 asks for an endless response,
    // stream 3 for five bytes. Those must come within the first 32 MiB read, not after
    // the endless one.
    let mut tcp = TcpStream::connect(s.address).await.unwrap();
    let mut hello = BytesMut::from(frame::PREFACE);
    let max = frame::MAX_WINDOW as u32;
    frame::put_settings(&mut hello, &[(frame::SETTINGS_INITIAL_WINDOW_SIZE, max)]);
    frame::put_window_update(&mut hello, 0, max - frame::DEFAULT_WINDOW as u32);
    for (stream, path) in [(1, "/flood"), (3, "/hello")] {
        put_request(&mut hello, stream, path);
    }
    tcp.write_all(&hello).await.unwrap();
    let mut read = BytesMut::new();
    let mut total = 0;
    let found = tokio::time::timeout(LIMIT, async {
        while total < 32 << 20 {
            let n = tcp.read_buf(&mut read).await.unwrap();
            assert!(n > 0, "the server closed the connection");
            total += n;
            while read.len() >= frame::HEAD {
                let head = Head::parse(&read);
                if read.len() < frame::HEAD + head.len {
                    break;
                }
                let frame = read.split_to(frame::HEAD + head.len);
                if head.kind == frame::DATA && head.stream == 3 {
                    return Some(frame[frame::HEAD..].to_vec());
                }
            }
        }
        None
    })
    .await
    .expect("32 MiB read");
    assert_eq!(found.as_deref(), Some(&b"hello"[..]), "after {total} bytes");
}

/// A request's HEADERS (literals, no END_STREAM) opening `stream` for `path`.
fn put_request(buf: &mut BytesMut, stream: u32, path: &str) {
    let mut field = BytesMut::new();
    super::headers::literal(&mut field, 4, b"", path.as_bytes()); // :path
    put_request_with(buf, stream, b"", &field);
}

/// A request's HEADERS (no END_STREAM) for `stream`: `table` (HPACK bytes that come
/// first: a size update, or nothing), :method POST and :scheme http as literals, `path`
/// (HPACK bytes for :path) and :authority as a literal.
fn put_request_with(buf: &mut BytesMut, stream: u32, table: &[u8], path: &[u8]) {
    let mut block = BytesMut::from(table);
    super::headers::literal(&mut block, 2, b"", b"POST"); // :method
    super::headers::literal(&mut block, 6, b"", b"http"); // :scheme
    block.extend_from_slice(path);
    super::headers::literal(&mut block, 1, b"", b"meshd"); // :authority
    frame::put_head(buf, block.len(), frame::HEADERS, frame::END_HEADERS, stream);
    buf.extend_from_slice(&block);
}

fn put_cancel(buf: &mut BytesMut, stream: u32) {
    frame::put_head(buf, 4, frame::RST_STREAM, 0, stream);
    buf.extend_from_slice(&8u32.to_be_bytes()); // CANCEL
}

/// Reads frames (what is left unparsed stays in `read`) until `done` says so with a
/// frame's head and payload; a GOAWAY or a closed connection fails the test.
async fn read_until(
    tcp: &mut TcpStream,
    read: &mut BytesMut,
    mut done: impl FnMut(Head, &[u8]) -> bool,
) {
    tokio::time::timeout(LIMIT, async {
        loop {
            while read.len() >= frame::HEAD {
                let head = Head::parse(read);
                if read.len() < frame::HEAD + head.len {
                    break;
                }
                let f = read.split_to(frame::HEAD + head.len);
                assert_ne!(head.kind, frame::GOAWAY, "the server closed the connection");
                if done(head, &f[frame::HEAD..]) {
                    return;
                }
            }
            let got = tcp.read_buf(read).await.unwrap();
            assert!(got > 0, "the server closed the connection");
        }
    })
    .await
    .expect("the awaited frame");
}

/// The error code of the RST_STREAM the server sends for stream 1; a ping then shows the
/// connection still serves.
async fn stream_one_reset_and_connection_kept(tcp: &mut TcpStream) -> u32 {
    let mut read = BytesMut::new();
    let mut reset = None;
    read_until(tcp, &mut read, |head, f| {
        if head.kind == frame::RST_STREAM && head.stream == 1 {
            reset = Some(u32::from_be_bytes(f.try_into().unwrap()));
        }
        reset.is_some()
    })
    .await;
    ping_answered(tcp, &mut read, *b"still on").await;
    reset.expect("a reset")
}

/// A PING with `payload`, and its answer.
async fn ping_answered(tcp: &mut TcpStream, read: &mut BytesMut, payload: [u8; 8]) {
    let mut ping = BytesMut::new();
    frame::put_ping(&mut ping, 0, payload);
    tcp.write_all(&ping).await.unwrap();
    read_until(tcp, read, |head, f| {
        head.kind == frame::PING && head.flags == frame::ACK && f == payload
    })
    .await;
}

#[tokio::test]
async fn a_trailers_only_answer_ends_the_stream_in_its_headers() {
    let s = server(settings()).await;
    let client = client(s.address, 65_535).await;
    let mut ready = client.ready().await.unwrap();
    let (response, _send) = ready.send_request(post("/refused"), true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "12");
    assert!(response.body().is_end_stream());
}

/// A request for `path` with `grpc-timeout: 100m` (none when `timeout` is false).
fn timed(path: &str, timeout: bool) -> http::Request<()> {
    let mut request = post(path);
    if timeout {
        request
            .headers_mut()
            .insert("grpc-timeout", http::HeaderValue::from_static("100m"));
    }
    request
}

#[tokio::test]
async fn a_grpc_timeout_ends_a_call_that_never_answered_with_deadline_exceeded() {
    let s = server(settings()).await;
    let client = client(s.address, 65_535).await;
    let mut ready = client.ready().await.unwrap();
    let (response, _send) = ready.send_request(timed("/stall", true), false).unwrap();
    let response = tokio::time::timeout(LIMIT, response)
        .await
        .expect("an answer once the timeout ran out")
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["grpc-status"], "4"); // DEADLINE_EXCEEDED
    assert!(response.body().is_end_stream(), "trailers-only");
}

#[tokio::test]
async fn a_grpc_timeout_ends_an_open_response_with_deadline_exceeded_and_none_leaves_it_open() {
    let s = server(settings()).await;
    let client = client(s.address, 65_535).await;
    for timeout in [true, false] {
        let mut ready = client.clone().ready().await.unwrap();
        let (response, _send) = ready
            .send_request(timed("/unread", timeout), false)
            .unwrap();
        let response = response.await.unwrap();
        assert_eq!(response.status(), 200);
        assert!(!response.headers().contains_key("grpc-status"));
        let mut body = response.into_body();
        if timeout {
            let data = tokio::time::timeout(LIMIT, body.data()).await.unwrap();
            assert!(data.is_none(), "no data, then the end");
            let trailers = body.trailers().await.unwrap().unwrap();
            assert_eq!(trailers["grpc-status"], "4");
        } else {
            let wait = tokio::time::timeout(Duration::from_millis(400), body.data()).await;
            assert!(
                wait.is_err(),
                "without grpc-timeout the response stays open"
            );
        }
    }
}

#[tokio::test]
async fn pings_are_answered() {
    let s = server(settings()).await;
    let tcp = TcpStream::connect(s.address).await.unwrap();
    let (_client, mut connection) = h2::client::handshake(tcp).await.unwrap();
    let mut ping_pong = connection.ping_pong().unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    tokio::time::timeout(LIMIT, ping_pong.ping(h2::Ping::opaque()))
        .await
        .expect("a pong")
        .unwrap();
}

/// A raw client: the preface and empty SETTINGS written, nothing else.
async fn raw(address: std::net::SocketAddr) -> TcpStream {
    let mut tcp = TcpStream::connect(address).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let mut hello = BytesMut::from(frame::PREFACE);
    frame::put_settings(&mut hello, &[]);
    tcp.write_all(&hello).await.unwrap();
    tcp
}

/// Every frame the server sends until it closes the connection.
async fn frames_until_closed(tcp: &mut TcpStream) -> Vec<(Head, Vec<u8>)> {
    let mut all = Vec::new();
    tokio::time::timeout(LIMIT, tcp.read_to_end(&mut all))
        .await
        .expect("the server closed the connection")
        .unwrap();
    let mut frames = Vec::new();
    let mut rest = &all[..];
    while rest.len() >= frame::HEAD {
        let head = Head::parse(rest);
        frames.push((head, rest[frame::HEAD..frame::HEAD + head.len].to_vec()));
        rest = &rest[frame::HEAD + head.len..];
    }
    frames
}

/// The GOAWAY the server sends before it closes the connection: its error code and its
/// debug data, as text.
async fn goaway(tcp: &mut TcpStream) -> (u32, String) {
    let frames = frames_until_closed(tcp).await;
    let (_, payload) = (frames.iter())
        .find(|(h, _)| h.kind == frame::GOAWAY)
        .unwrap_or_else(|| panic!("a GOAWAY in {frames:?}"));
    let code = u32::from_be_bytes(payload[4..8].try_into().unwrap());
    (code, String::from_utf8(payload[8..].to_vec()).unwrap())
}

#[tokio::test]
async fn a_peer_that_answers_nothing_is_pinged_then_dropped() {
    let s = server(Settings {
        keepalive_interval: Duration::from_millis(200),
        keepalive_timeout: Duration::from_millis(200),
        ..settings()
    })
    .await;
    let mut tcp = raw(s.address).await;
    let frames = frames_until_closed(&mut tcp).await;
    assert!(
        frames
            .iter()
            .any(|(h, _)| h.kind == frame::PING && h.flags == 0),
        "{frames:?}"
    );
}

#[tokio::test]
async fn a_peer_that_answers_pings_is_kept() {
    let s = server(Settings {
        keepalive_interval: Duration::from_millis(100),
        keepalive_timeout: Duration::from_millis(100),
        ..settings()
    })
    .await;
    let mut client = client(s.address, 65_535).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (received, _) = echo(&mut client, vec![Bytes::from_static(b"still here")]).await;
    assert_eq!(received, b"still here");
}

#[tokio::test]
async fn protocol_violations_close_the_connection_with_goaway_saying_why_and_are_counted() {
    let (s, errors) = counting_server().await;
    // Not HTTP/2 at all.
    let mut tcp = TcpStream::connect(s.address).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: meshd\r\n\r\n")
        .await
        .unwrap();
    let (code, debug) = goaway(&mut tcp).await;
    assert_eq!(code, frame::Reason::ProtocolError as u32);
    assert_eq!(debug, "not an HTTP/2 preface");
    // A frame over the 16 KiB this server allows.
    let mut tcp = raw(s.address).await;
    let mut big = BytesMut::new();
    frame::put_head(&mut big, 20_000, frame::DATA, 0, 1);
    big.extend_from_slice(&[0; 20_000]);
    tcp.write_all(&big).await.unwrap();
    let (code, debug) = goaway(&mut tcp).await;
    assert_eq!(code, frame::Reason::FrameSizeError as u32);
    assert!(
        debug.contains("20000 bytes, over SETTINGS_MAX_FRAME_SIZE"),
        "{debug}"
    );
    // A header block that is no HPACK.
    let mut tcp = raw(s.address).await;
    let mut bad = BytesMut::new();
    frame::put_head(&mut bad, 3, frame::HEADERS, frame::END_HEADERS, 1);
    bad.extend_from_slice(&[0xff, 0xff, 0xff]);
    tcp.write_all(&bad).await.unwrap();
    let (code, debug) = goaway(&mut tcp).await;
    assert_eq!(code, frame::Reason::CompressionError as u32);
    assert!(!debug.is_empty());
    // A WINDOW_UPDATE of 0 for the connection.
    let mut tcp = raw(s.address).await;
    let mut zero = BytesMut::new();
    frame::put_window_update(&mut zero, 0, 0);
    tcp.write_all(&zero).await.unwrap();
    let (code, debug) = goaway(&mut tcp).await;
    assert_eq!(code, frame::Reason::ProtocolError as u32);
    assert_eq!(debug, "a WINDOW_UPDATE of 0 for the connection");
    assert_eq!(
        *errors.lock().unwrap(),
        [
            "http2_protocol_error",
            "http2_frame_size_error",
            "http2_compression_error",
            "http2_protocol_error"
        ]
    );
}

#[tokio::test]
async fn a_header_block_that_decodes_to_megabytes_refuses_only_its_stream() {
    let s = server(settings()).await;
    let mut tcp = raw(s.address).await;
    // An "HPACK bomb": a 4,000-byte field enters the HPACK table, then 40,000 one-byte
    // references to it, 160 MB once decoded, in a 44 KB block.
    let mut block = BytesMut::new();
    super::headers::literal(&mut block, 2, b"", b"POST"); // :method
    super::headers::literal(&mut block, 6, b"", b"http"); // :scheme
    super::headers::literal(&mut block, 4, b"", b"/echo"); // :path
    block.extend_from_slice(&[0x40, 5]); // literal, incremental indexing, new name
    block.extend_from_slice(b"x-big");
    block.extend_from_slice(&[0x7f, 0xa1, 0x1e]); // value length 4,000 (127 + 3,873)
    block.extend_from_slice(&[b'a'; 4000]);
    block.extend_from_slice(&[0xbe; 40_000]); // indexed field 62: the newest entry
    let mut frames = BytesMut::new();
    let mut chunks = block.chunks(frame::DEFAULT_MAX_FRAME).peekable();
    let mut kind = frame::HEADERS;
    while let Some(chunk) = chunks.next() {
        let flags = if chunks.peek().is_none() {
            frame::END_HEADERS
        } else {
            0
        };
        frame::put_head(&mut frames, chunk.len(), kind, flags, 1);
        frames.extend_from_slice(chunk);
        kind = frame::CONTINUATION;
    }
    tcp.write_all(&frames).await.unwrap();
    // The stream is refused, and the connection still answers.
    let code = stream_one_reset_and_connection_kept(&mut tcp).await;
    assert_eq!(code, frame::Reason::ProtocolError as u32);
}

#[tokio::test]
async fn a_window_update_of_zero_for_a_stream_resets_only_that_stream() {
    let s = server(settings()).await;
    let mut tcp = raw(s.address).await;
    let mut frames = BytesMut::new();
    put_request(&mut frames, 1, "/unread");
    frame::put_window_update(&mut frames, 1, 0);
    tcp.write_all(&frames).await.unwrap();
    let code = stream_one_reset_and_connection_kept(&mut tcp).await;
    assert_eq!(code, frame::Reason::ProtocolError as u32);
}

#[tokio::test]
async fn a_client_that_floods_pings_and_reads_no_answer_is_cut_off() {
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = errors.clone();
    let s = server(Settings {
        keepalive_timeout: Duration::from_millis(300),
        on_error: super::ErrorHook::new(move |reason| seen.lock().unwrap().push(reason)),
        ..settings()
    })
    .await;
    // A client that reads nothing, with a small receive buffer so that the answers pile
    // up in the server rather than in the kernel.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut tcp = socket.connect(s.address).await.unwrap();
    let mut hello = BytesMut::from(frame::PREFACE);
    frame::put_settings(&mut hello, &[]);
    tcp.write_all(&hello).await.unwrap();
    let mut pings = BytesMut::new();
    for _ in 0..10_000 {
        frame::put_ping(&mut pings, 0, *b"flooding");
    }
    // Pings until the server closes the connection (it reads them as fast as they come
    // while it is willing to).
    let closed = tokio::time::timeout(LIMIT, async {
        while tcp.write_all(&pings).await.is_ok() {}
    })
    .await;
    assert!(
        closed.is_ok(),
        "the server still took pings after {LIMIT:?}"
    );
    assert_eq!(*errors.lock().unwrap(), ["http2_enhance_your_calm"]);
}

#[tokio::test]
async fn a_client_that_resets_streams_before_their_answer_in_a_loop_is_cut_off() {
    let (s, errors) = counting_server().await;
    let mut tcp = raw(s.address).await;
    // Rapid reset (CVE-2023-44487): each stream asks for an answer that never comes
    // and is cancelled at once, 300 times in a burst.
    let mut burst = BytesMut::new();
    for n in 0..300 {
        put_request(&mut burst, 1 + 2 * n, "/unread");
        put_cancel(&mut burst, 1 + 2 * n);
    }
    tcp.write_all(&burst).await.unwrap();
    let (code, debug) = goaway(&mut tcp).await;
    assert_eq!(code, frame::Reason::EnhanceYourCalm as u32);
    assert!(debug.contains("rapid reset"));
    assert_eq!(*errors.lock().unwrap(), ["http2_enhance_your_calm"]);
}

/// :path /unread, added to the dynamic table (as its entry 62).
const PATH_INDEXED: &[u8] = b"\x44\x07/unread";
/// :path /unread as a literal that leaves the dynamic table alone.
const PATH_LITERAL: &[u8] = b"\x04\x07/unread";
/// :path as the dynamic table's entry 62.
const PATH_FROM_TABLE: &[u8] = &[0x80 | 62];
/// A dynamic table size update to 0 (RFC 7541 §6.3).
const TABLE_TO_NOTHING: &[u8] = &[0x20];

#[tokio::test]
async fn request_headers_are_indexed_only_until_the_client_acknowledges_no_table() {
    let (s, errors) = counting_server().await;
    let mut tcp = raw(s.address).await;
    let mut read = BytesMut::new();
    let mut table = None;
    read_until(&mut tcp, &mut read, |head, f| {
        let preface = head.kind == frame::SETTINGS && !head.has(frame::ACK);
        if preface {
            table = frame::settings(f).find(|&(id, _)| id == frame::SETTINGS_HEADER_TABLE_SIZE);
        }
        preface
    })
    .await;
    assert_eq!(table, Some((frame::SETTINGS_HEADER_TABLE_SIZE, 0)));
    // Until the client acknowledges that, it may index headers and refer to them.
    let mut frames = BytesMut::new();
    put_request_with(&mut frames, 1, b"", PATH_INDEXED);
    put_request_with(&mut frames, 3, b"", PATH_FROM_TABLE);
    tcp.write_all(&frames).await.unwrap();
    ping_answered(&mut tcp, &mut read, *b"indexed ").await;
    // Once it has, the table is gone: its next block must empty its own first.
    let mut frames = BytesMut::new();
    frame::put_head(&mut frames, 0, frame::SETTINGS, frame::ACK, 0);
    put_request_with(&mut frames, 5, TABLE_TO_NOTHING, PATH_LITERAL);
    tcp.write_all(&frames).await.unwrap();
    ping_answered(&mut tcp, &mut read, *b"emptied ").await;
    assert!(errors.lock().unwrap().is_empty());
    // Referring to the old table, as a client that ignored the setting would, fails.
    let mut frames = BytesMut::new();
    put_request_with(&mut frames, 7, b"", PATH_FROM_TABLE);
    tcp.write_all(&frames).await.unwrap();
    let (code, _) = goaway(&mut tcp).await;
    assert_eq!(code, frame::Reason::CompressionError as u32);
    // So does growing the table again.
    let mut tcp = raw(s.address).await;
    let mut frames = BytesMut::new();
    frame::put_head(&mut frames, 0, frame::SETTINGS, frame::ACK, 0);
    put_request_with(&mut frames, 1, &[0x3f, 0xe1, 0x1f], PATH_INDEXED); // 4,096
    tcp.write_all(&frames).await.unwrap();
    let (code, _) = goaway(&mut tcp).await;
    assert_eq!(code, frame::Reason::CompressionError as u32);
    assert_eq!(
        *errors.lock().unwrap(),
        ["http2_compression_error", "http2_compression_error"]
    );
}

/// A request's DATA is handed on in memory of its own, not as a slice of the connection's
/// read buffer: queued for a stream that has not read it yet, a slice kept the whole buffer
/// (up to 256 KiB) allocated. After a restart, with every proxy's reconnect requests read
/// faster than they were answered, that was up to a fifth of meshd's peak.
#[tokio::test]
async fn request_data_does_not_hold_the_read_buffer() {
    let s = server(settings()).await;
    let mut tcp = raw(s.address).await;
    // The request and its first DATA, and the beginning of a second DATA frame: it stays
    // in the read buffer while the service reads the first.
    let mut frames = BytesMut::new();
    put_request(&mut frames, 1, "/alone");
    frame::put_head(&mut frames, 10, frame::DATA, 0, 1);
    frames.extend_from_slice(b"0123456789");
    frame::put_head(&mut frames, 5, frame::DATA, 0, 1);
    frames.extend_from_slice(b"ab");
    tcp.write_all(&frames).await.unwrap();
    let mut answer = None;
    read_until(&mut tcp, &mut BytesMut::new(), |head, f| {
        if head.kind == frame::DATA && head.stream == 1 && !f.is_empty() {
            answer = Some(String::from_utf8_lossy(f).into_owned());
        }
        answer.is_some()
    })
    .await;
    assert_eq!(answer.as_deref(), Some("alone"));
}

#[tokio::test]
async fn empty_frames_are_allowed_one_at_a_time_and_cut_off_in_a_row() {
    let (s, errors) = counting_server().await;
    let mut tcp = raw(s.address).await;
    // One empty DATA frame between others: allowed, as Envoy allows it.
    let mut frames = BytesMut::new();
    put_request(&mut frames, 1, "/unread");
    frame::put_head(&mut frames, 0, frame::DATA, 0, 1);
    frame::put_head(&mut frames, 5, frame::DATA, 0, 1);
    frames.extend_from_slice(&[0, 0, 0, 0, 0]);
    frame::put_head(&mut frames, 0, frame::DATA, 0, 1);
    frame::put_head(&mut frames, 3, frame::DATA, 0, 1);
    frames.extend_from_slice(b"abc");
    tcp.write_all(&frames).await.unwrap();
    ping_answered(&mut tcp, &mut BytesMut::new(), *b"kept on ").await;
    // Two in a row (CVE-2019-9518's empty frames flood): cut off.
    let mut frames = BytesMut::new();
    frame::put_head(&mut frames, 0, frame::DATA, 0, 1);
    frame::put_head(&mut frames, 0, frame::DATA, 0, 1);
    tcp.write_all(&frames).await.unwrap();
    let (code, debug) = goaway(&mut tcp).await;
    assert_eq!(code, frame::Reason::EnhanceYourCalm as u32);
    assert!(debug.contains("without payload"), "{debug}");
    assert_eq!(*errors.lock().unwrap(), ["http2_enhance_your_calm"]);
}

#[tokio::test]
async fn streams_reset_after_their_answer_are_not_limited() {
    let (s, errors) = counting_server().await;
    let mut tcp = raw(s.address).await;
    let mut read = BytesMut::new();
    // Each stream, still open both ways, is answered (its request echoed) before the
    // client cancels it, as a client does that is done with a stream; more of them than
    // the early-reset limit allows.
    for n in 0..300u32 {
        let stream = 1 + 2 * n;
        let mut request = BytesMut::new();
        put_request(&mut request, stream, "/echo");
        frame::put_head(&mut request, 5, frame::DATA, 0, stream);
        request.extend_from_slice(b"hello");
        tcp.write_all(&request).await.unwrap();
        read_until(&mut tcp, &mut read, |head, _| {
            head.kind == frame::DATA && head.stream == stream
        })
        .await;
        let mut cancel = BytesMut::new();
        put_cancel(&mut cancel, stream);
        tcp.write_all(&cancel).await.unwrap();
    }
    // Still served: a ping is answered.
    ping_answered(&mut tcp, &mut read, *b"still on").await;
    assert!(errors.lock().unwrap().is_empty());
}

#[tokio::test]
async fn shutdown_says_goaway_and_closes() {
    let s = server(settings()).await;
    let mut tcp = raw(s.address).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    s.shutdown.send(true).unwrap();
    let (code, _) = goaway(&mut tcp).await;
    assert_eq!(code, frame::Reason::NoError as u32);
    assert!(
        TcpStream::connect(s.address).await.is_err() || {
            // The listener may linger in the kernel's backlog for an instant.
            tokio::time::sleep(Duration::from_millis(100)).await;
            TcpStream::connect(s.address).await.is_err()
        }
    );
}
