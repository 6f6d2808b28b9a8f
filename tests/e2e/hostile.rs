//! Hostile clients against a running meshd. Each attack runs beside a healthy proxy on a
//! connection of its own, which must still be sent a change pushed after the attack, and
//! meshd's resident memory must stay within a bound. The attacks are written as raw bytes
//! here because no well-behaved client library will send them.

use std::time::Duration;

use envoy_api::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tonic::Streaming;
use tonic::codegen::http;

use crate::harness::*;

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

fn svc(name: &str, octet: u8) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  clusterIP: 10.96.9.{octet}\n  ports: [{{name: http, port: 9080}}]\n"
    )
}

/// A meshd with one service, a short keepalive, and a healthy proxy connected to it.
async fn target(name: &str) -> (Meshd, Healthy) {
    let dir = temp_dir(name).join("config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("reviews.yaml"), svc("reviews", 1)).unwrap();
    let args = ["--keepalive-interval", "5s", "--keepalive-timeout", "5s"];
    let m = tokio::task::spawn_blocking(move || Meshd::start_with(&dir, &args))
        .await
        .unwrap();
    let healthy = Healthy::open(&m).await;
    (m, healthy)
}

fn cds_request(id: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: Some(xds_node(id, "shop")),
        type_url: CDS.into(),
        ..Default::default()
    }
}

/// A well-behaved delta client on its own connection.
struct Healthy {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    rx: Streaming<DeltaDiscoveryResponse>,
}

impl Healthy {
    async fn open(m: &Meshd) -> Healthy {
        let id = "sidecar~10.1.9.8~healthy-0.shop~shop.svc.cluster.local";
        let (tx, rx, first) = open_delta(m.plain_channel().await, xds_node(id, "shop"), CDS, None)
            .await
            .unwrap();
        assert!(!first.resources.is_empty());
        let healthy = Healthy { tx, rx };
        healthy.ack(&first).await;
        healthy
    }

    async fn ack(&self, r: &DeltaDiscoveryResponse) {
        let ack = DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        };
        self.tx.send(ack).await.unwrap();
    }

    /// A new service is written; the healthy proxy must be sent its cluster.
    async fn still_served(&mut self, m: &Meshd, service: &str, octet: u8) {
        m.write(&format!("{service}.yaml"), &svc(service, octet));
        let want = format!("outbound|9080||{service}.shop.svc.cluster.local");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let r = tokio::time::timeout_at(deadline, self.rx.message())
                .await
                .unwrap_or_else(|_| panic!("the healthy proxy was not sent {want}"))
                .expect("the healthy proxy's stream failed")
                .expect("the healthy proxy's stream ended");
            self.ack(&r).await;
            if r.resources.iter().any(|r| r.name == want) {
                return;
            }
        }
    }
}

/// meshd's resident memory, in MiB.
fn rss_mib(m: &Meshd) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", m.pid())).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024.0
}

// ------------------------------------------------------------------ raw HTTP/2

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PROTOCOL_ERROR: u32 = 0x1;
const ENHANCE_YOUR_CALM: u32 = 0xb;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(9 + payload.len());
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK integer with an `n`-bit prefix whose high bits are `first`.
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// A literal header field without indexing, the name by static index or given.
fn literal(out: &mut Vec<u8>, index: usize, name: &str, value: &[u8]) {
    hpack_int(out, 0, 4, index);
    if index == 0 {
        hpack_int(out, 0, 7, name.len());
        out.extend_from_slice(name.as_bytes());
    }
    hpack_int(out, 0, 7, value.len());
    out.extend_from_slice(value);
}

/// The header block of a delta ADS request.
fn request_block() -> Vec<u8> {
    let mut b = vec![0x80 | 3, 0x80 | 6]; // :method POST, :scheme http
    literal(&mut b, 4, "", DELTA_PATH.as_bytes());
    literal(&mut b, 1, "", b"meshd");
    literal(&mut b, 31, "", b"application/grpc");
    literal(&mut b, 0, "te", b"trailers");
    b
}

/// `block` as a HEADERS frame and as many CONTINUATION frames as 16 KiB frames need.
fn header_frames(stream: u32, block: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let chunks: Vec<&[u8]> = block.chunks(16 << 10).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        let flags = if i + 1 == chunks.len() {
            END_HEADERS
        } else {
            0
        };
        out.extend(frame(kind, flags, stream, chunk));
    }
    out
}

/// A gRPC message: uncompressed, its length, its bytes.
fn grpc_message(message: &[u8]) -> Vec<u8> {
    let mut framed = vec![0];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    framed
}

/// A gRPC message in a DATA frame.
fn grpc_data(stream: u32, message: &[u8]) -> Vec<u8> {
    frame(DATA, 0, stream, &grpc_message(message))
}

/// The frames complete at the front of `buf` as (type, flags, stream, payload), taken off
/// it; a partial frame stays.
fn take_frames(buf: &mut Vec<u8>) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut frames = Vec::new();
    while buf.len() >= 9 {
        let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
        if buf.len() < 9 + len {
            break;
        }
        let stream = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
        frames.push((buf[3], buf[4], stream, buf[9..9 + len].to_vec()));
        buf.drain(..9 + len);
    }
    frames
}

/// A plaintext connection that has sent the preface and an empty SETTINGS.
async fn raw(m: &Meshd) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", m.xds_port)).await.unwrap();
    s.write_all(PREFACE).await.unwrap();
    s.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    s
}

/// How a raw connection went on after an attack.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// meshd sent GOAWAY with this code and closed it.
    GoAway(u32),
    /// Closed without GOAWAY.
    Closed,
    /// Still open when we stopped listening; `data` DATA frames arrived on `stream`.
    Open { data: usize },
}

/// Reads what meshd sends for up to `wait`: a GOAWAY, the end, or the DATA frames on
/// `stream` (which mean a request was served).
async fn outcome(s: &mut TcpStream, stream: u32, wait: Duration) -> Outcome {
    let mut buf = Vec::new();
    let mut data = 0;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        for (kind, _, id, payload) in take_frames(&mut buf) {
            if kind == GOAWAY && payload.len() >= 8 {
                let code = [payload[4], payload[5], payload[6], payload[7]];
                return Outcome::GoAway(u32::from_be_bytes(code));
            }
            if kind == DATA && id == stream && !payload.is_empty() {
                data += 1;
            }
        }
        let mut chunk = [0u8; 16 << 10];
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Err(_) => return Outcome::Open { data },
            Ok(Ok(0)) | Ok(Err(_)) => return Outcome::Closed,
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Writes `bytes`; a connection meshd closed on the way is an expected end, not a failure.
async fn send(s: &mut TcpStream, bytes: &[u8]) -> bool {
    s.write_all(bytes).await.is_ok()
}

/// Writes `frames` in batches of about 64 KiB until they run out or meshd closes the
/// connection.
async fn send_batched(s: &mut TcpStream, frames: impl Iterator<Item = Vec<u8>>) {
    let mut batch = Vec::new();
    for f in frames {
        batch.extend(f);
        if batch.len() > 64 << 10 {
            if !send(s, &batch).await {
                return;
            }
            batch.clear();
        }
    }
    let _ = send(s, &batch).await;
}

// ------------------------------------------------------------------ HTTP/2 clients (h2)

/// Opens a delta ADS stream on `client` (`origin` is `http://HOST` or `https://HOST`) and
/// sends `bytes` on it, keeping it open; its response. meshd may answer from the headers
/// alone (a refused stream) and end the stream before the bytes go: the response says so.
fn open_ads(
    client: &mut h2::client::SendRequest<prost::bytes::Bytes>,
    origin: &str,
    bytes: Vec<u8>,
) -> h2::client::ResponseFuture {
    let request = http::Request::post(format!("{origin}{DELTA_PATH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut body) = client.send_request(request, false).unwrap();
    if let Err(e) = body.send_data(bytes.into(), false) {
        assert!(
            matches!(e.reason(), None | Some(h2::Reason::NO_ERROR)) && !e.is_io(),
            "sending the request: {e}"
        );
    }
    response
}

/// A stream's gRPC status: in its headers when meshd answered with trailers only, else in
/// its trailers.
async fn grpc_status(response: h2::client::ResponseFuture) -> http::HeaderValue {
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("no answer in 10 s")
        .unwrap();
    if let Some(status) = response.headers().get("grpc-status") {
        return status.clone();
    }
    let mut rx = response.into_body();
    while rx.data().await.is_some() {}
    rx.trailers().await.unwrap().expect("trailers")["grpc-status"].clone()
}

// ------------------------------------------------------------------ attacks

/// Rapid reset (CVE-2023-44487): streams opened and reset at once, in a loop. meshd
/// closes the connection with ENHANCE_YOUR_CALM and counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_is_cut_off() {
    let (m, mut healthy) = target("hostile-rapid-reset").await;
    let before = rss_mib(&m);
    let mut s = raw(&m).await;
    let block = request_block();
    let frames = (0..20_000u32).map(|i| {
        let id = 2 * i + 1;
        let mut f = header_frames(id, &block);
        f.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
        f
    });
    send_batched(&mut s, frames).await;
    let end = outcome(&mut s, 0, Duration::from_secs(10)).await;
    assert_eq!(end, Outcome::GoAway(ENHANCE_YOUR_CALM));
    assert!(m.metric(r#"meshd_xds_connection_errors{reason="http2_enhance_your_calm"}"#) >= 1.0);
    healthy.still_served(&m, "details", 2).await;
    let grew = rss_mib(&m) - before;
    assert!(grew < 64.0, "meshd grew by {grew:.1} MiB");
}

/// Resets meshd sends itself ("MadeYouReset"): streams opened with a malformed request
/// (a connection-specific header, which HTTP/2 forbids), each of which meshd resets, in a
/// loop. Past its limit of such resets meshd closes the connection with ENHANCE_YOUR_CALM.
/// A WINDOW_UPDATE of 0 on a stream, the other classic trigger, h2 treats as a connection
/// error at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_provoked_from_the_server_side_are_cut_off() {
    let (m, mut healthy) = target("hostile-made-you-reset").await;
    let mut malformed = request_block();
    literal(&mut malformed, 0, "connection", b"close");
    let window_zero = |id: u32| frame(WINDOW_UPDATE, 0, id, &0u32.to_be_bytes());
    type Provoke<'a> = &'a dyn Fn(u32) -> Vec<u8>;
    let cases: [(Provoke, u32); 2] = [
        (&|id| header_frames(id, &malformed), ENHANCE_YOUR_CALM),
        (
            &|id| {
                let mut f = header_frames(id, &request_block());
                f.extend(window_zero(id));
                f
            },
            PROTOCOL_ERROR,
        ),
    ];
    for (provoke, code) in cases {
        let mut s = raw(&m).await;
        send_batched(&mut s, (0..5_000u32).map(|i| provoke(2 * i + 1))).await;
        let end = outcome(&mut s, 0, Duration::from_secs(10)).await;
        assert_eq!(end, Outcome::GoAway(code));
    }
    assert_eq!(
        m.metric(r#"meshd_xds_connection_errors{reason="http2_enhance_your_calm"}"#),
        1.0
    );
    healthy.still_served(&m, "details", 2).await;
}

/// CONTINUATION flood: a header block that never ends, 16 KiB at a time. meshd refuses it
/// once it passes the header list limit, long before the client runs out of frames.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_flood_is_cut_off() {
    let (m, mut healthy) = target("hostile-continuation").await;
    let before = rss_mib(&m);
    let mut s = raw(&m).await;
    let mut sent = 0usize;
    let _ = send(&mut s, &frame(HEADERS, 0, 1, &request_block())).await;
    let mut block = Vec::new();
    literal(&mut block, 0, "x-flood", &[b'a'; 16_000]);
    let continuation = frame(CONTINUATION, 0, 1, &block);
    while sent < 256 << 20 && send(&mut s, &continuation).await {
        sent += continuation.len();
    }
    assert!(sent < 256 << 20, "meshd took 256 MiB of one header block");
    assert_ne!(
        outcome(&mut s, 1, Duration::from_secs(5)).await,
        Outcome::Open { data: 0 },
        "the connection was left open"
    );
    healthy.still_served(&m, "details", 2).await;
    let grew = rss_mib(&m) - before;
    assert!(grew < 64.0, "meshd grew by {grew:.1} MiB");
}

/// A request whose header list is larger than meshd allows is not served; one just under
/// the limit is (the same request otherwise), so the refusal is the size's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_list_over_the_limit_is_refused() {
    let (m, mut healthy) = target("hostile-big-headers").await;
    let request = cds_request("sidecar~10.1.9.7~big-0.shop~shop.svc.cluster.local").encode_to_vec();
    for (size, served) in [(48 << 10, true), (200 << 10, false)] {
        let mut s = raw(&m).await;
        let mut block = request_block();
        literal(&mut block, 0, "x-big", &vec![b'a'; size]);
        let mut bytes = header_frames(1, &block);
        bytes.extend(grpc_data(1, &request));
        let _ = send(&mut s, &bytes).await;
        let end = outcome(&mut s, 1, Duration::from_secs(3)).await;
        let got = matches!(end, Outcome::Open { data } if data > 0);
        assert_eq!(got, served, "{size} bytes of header: {end:?}");
    }
    healthy.still_served(&m, "details", 2).await;
}

/// HPACK bomb: one 4 KiB entry put in the dynamic table, then referenced a thousand times
/// with one byte each, which decodes to 4 MB of headers. The request is not served and
/// meshd's memory does not follow the decoded size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hpack_bomb_is_refused() {
    let (m, mut healthy) = target("hostile-hpack-bomb").await;
    let before = rss_mib(&m);
    let request =
        cds_request("sidecar~10.1.9.6~bomb-0.shop~shop.svc.cluster.local").encode_to_vec();
    for _ in 0..20 {
        let mut s = raw(&m).await;
        let mut block = request_block();
        // Literal with incremental indexing, new name: enters the dynamic table at 62.
        hpack_int(&mut block, 0x40, 6, 0);
        hpack_int(&mut block, 0, 7, 6);
        block.extend_from_slice(b"x-bomb");
        hpack_int(&mut block, 0, 7, 4000);
        block.extend(std::iter::repeat_n(b'b', 4000));
        block.extend(std::iter::repeat_n(0x80 | 62, 1000));
        let mut bytes = header_frames(1, &block);
        bytes.extend(grpc_data(1, &request));
        let _ = send(&mut s, &bytes).await;
        let end = outcome(&mut s, 1, Duration::from_secs(2)).await;
        assert!(
            !matches!(end, Outcome::Open { data } if data > 0),
            "served: {end:?}"
        );
    }
    healthy.still_served(&m, "details", 2).await;
    let grew = rss_mib(&m) - before;
    assert!(grew < 64.0, "meshd grew by {grew:.1} MiB");
}

/// Ten thousand streams opened on one connection and never used: within
/// `ISTIO_GPRC_MAXSTREAMS`, so allowed, but each costs meshd little, and each is ended once
/// the keepalive interval and timeout (10 s here) pass without its first request, as a
/// proxy that never says who it is. The client answers meshd's pings meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_streams_on_one_connection_stay_cheap_and_end() {
    let (m, mut healthy) = target("hostile-many-streams").await;
    let before = rss_mib(&m);
    let mut s = raw(&m).await;
    let block = request_block();
    let mut batch = Vec::new();
    for i in 0..10_000u32 {
        batch.extend(header_frames(2 * i + 1, &block));
    }
    assert!(send(&mut s, &batch).await);
    healthy.still_served(&m, "details", 2).await;
    let mut ended = 0;
    let mut peak = 0f64;
    let mut buf = vec![0u8; 1 << 20];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    let mut pending = Vec::new();
    while ended < 10_000 {
        peak = peak.max(rss_mib(&m));
        let n = match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => n,
            other => panic!("{ended} streams ended, then {other:?}"),
        };
        pending.extend_from_slice(&buf[..n]);
        let mut pongs = Vec::new();
        for (kind, flags, _, payload) in take_frames(&mut pending) {
            // A stream ends with END_STREAM on its trailers (HEADERS) or a RST_STREAM.
            if (kind == HEADERS && flags & 0x1 != 0) || kind == RST_STREAM {
                ended += 1;
            }
            if kind == PING && flags & 0x1 == 0 {
                pongs.extend(frame(PING, 0x1, 0, &payload));
            }
        }
        if !pongs.is_empty() {
            assert!(send(&mut s, &pongs).await);
        }
    }
    let grew = peak - before;
    assert!(
        grew < 128.0,
        "meshd grew by {grew:.1} MiB for 10,000 streams"
    );
}

/// A client that sends the connection preface and then nothing: no SETTINGS, no
/// request. meshd's keepalive ping goes unanswered and the connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_only_the_preface_is_dropped() {
    let (m, mut healthy) = target("hostile-preface-only").await;
    let mut s = TcpStream::connect(("127.0.0.1", m.xds_port)).await.unwrap();
    s.write_all(PREFACE).await.unwrap();
    let end = outcome(&mut s, 0, Duration::from_secs(15)).await;
    assert_ne!(end, Outcome::Open { data: 0 }, "still open after 15 s");
    // And one that connects and sends nothing at all is dropped after the preface timeout.
    let mut silent = TcpStream::connect(("127.0.0.1", m.xds_port)).await.unwrap();
    let end = outcome(&mut silent, 0, Duration::from_secs(15)).await;
    assert_ne!(
        end,
        Outcome::Open { data: 0 },
        "silent client still open after 15 s"
    );
    assert_eq!(
        m.metric(r#"meshd_xds_connection_errors{reason="http2_preface_timeout"}"#),
        1.0
    );
    healthy.still_served(&m, "details", 2).await;
}

/// Connections accepted and not yet answered are bounded (`MESHD_XDS_PENDING_CONNECTIONS`,
/// here 2): a proxy gives its place back with its first response, and clients that connect
/// and send nothing hold theirs only for the admission hold (3 s), not until the preface
/// timeout (10 s), so that they cannot stop the port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_clients_cannot_hold_the_pending_connection_bound() {
    let dir = temp_dir("hostile-pending").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("reviews.yaml"), svc("reviews", 1)).unwrap();
    let m = tokio::task::spawn_blocking(move || {
        Meshd::start_with_env(&dir, &[], &[("MESHD_XDS_PENDING_CONNECTIONS", "2")])
    })
    .await
    .unwrap();
    let pending = "meshd_xds_pending_connections";
    let mut healthy = Healthy::open(&m).await;
    assert_eq!(m.metric(pending), 0.0, "answered, yet still pending");

    // Four silent clients: two take the places, two wait in the listen backlog.
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(("127.0.0.1", m.xds_port)).await.unwrap());
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while m.metric(pending) < 2.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the silent clients took no place"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(m.metric(pending), 2.0);

    // A new proxy is admitted once the silent clients' places lapse (twice 3 s), well
    // before the preface timeout would free them (10 s, then 10 s more for the next two).
    let started = tokio::time::Instant::now();
    let late = tokio::time::timeout(Duration::from_secs(9), Healthy::open(&m))
        .await
        .expect("a proxy behind four silent clients was not admitted within 9 s");
    drop(late);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "it was admitted past the bound"
    );
    healthy.still_served(&m, "details", 2).await;
    drop(silent);
}

/// A garbage first byte on every port: each connection is closed and counted, and meshd
/// goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_first_byte_on_each_port_is_refused() {
    let (m, mut healthy) = target("hostile-garbage").await;
    for port in [m.xds_port, m.secure_port, m.monitoring_port, m.webhook_port] {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let _ = s
            .write_all(&[0x16, 0xff, 0x00, 0x13, 0x37, 0xff, 0xff, 0xff])
            .await;
        let _ = s.write_all(&[0xff; 4096]).await;
        let end = outcome(&mut s, 0, Duration::from_secs(12)).await;
        assert_ne!(end, Outcome::Open { data: 0 }, "port {port} left it open");
    }
    for port in ["secure", "webhook"] {
        let series = format!(r#"meshd_tls_handshake_errors{{port="{port}",reason="failed"}}"#);
        assert_eq!(m.metric(&series), 1.0, "{series}");
    }
    assert_eq!(m.get("/ready").unwrap().status, 200);
    healthy.still_served(&m, "details", 2).await;
}

/// TLS on the secure port: a client that connects and never finishes its handshake is
/// dropped after the handshake timeout; one that sends KeyUpdate after KeyUpdate without
/// any data is cut off by rustls (32 at most).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_clients_that_stall_or_loop_key_updates_are_dropped() {
    let (m, mut healthy) = target("hostile-tls").await;
    // A ClientHello's first bytes, then silence.
    let mut stalled = TcpStream::connect(("127.0.0.1", m.secure_port))
        .await
        .unwrap();
    stalled
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();

    let mut config = transport::tls::client_config(&m.root_pem(), None).unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = TcpStream::connect(("127.0.0.1", m.secure_port))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    let mut updates = 0;
    let cut_off = loop {
        if updates == 1000 {
            break false;
        }
        if tls.get_mut().1.refresh_traffic_keys().is_err() || tls.flush().await.is_err() {
            break true;
        }
        updates += 1;
        // meshd answers each with its own KeyUpdate; read what it sent, or its close.
        let mut buf = [0u8; 1024];
        match tokio::time::timeout(Duration::from_millis(100), tls.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            _ => {}
        }
    };
    assert!(cut_off, "1000 KeyUpdates were taken");
    assert!(updates <= 40, "cut off only after {updates} KeyUpdates");

    let end = outcome(&mut stalled, 0, Duration::from_secs(15)).await;
    assert_ne!(
        end,
        Outcome::Open { data: 0 },
        "stalled handshake still open"
    );
    assert_eq!(
        m.metric(r#"meshd_tls_handshake_errors{port="secure",reason="timed_out"}"#),
        1.0
    );
    healthy.still_served(&m, "details", 2).await;
}

/// A valid gRPC stream that announces a 100 MB DiscoveryRequest: its stream is ended with
/// RESOURCE_EXHAUSTED (`ISTIO_GPRC_MAXRECVMSGSIZE`, 4 MiB) without meshd reading it into
/// memory, and the client's connection goes on serving other streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_megabyte_request_ends_its_stream_only() {
    let (m, mut healthy) = target("hostile-100mb").await;
    let before = rss_mib(&m);
    let tcp = TcpStream::connect(("127.0.0.1", m.xds_port)).await.unwrap();
    let (mut client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    // The gRPC message header, announcing 100 MB, and the first 16 KB of it.
    let mut first = vec![0];
    first.extend_from_slice(&(100_000_000u32).to_be_bytes());
    first.extend(std::iter::repeat_n(0u8, 16_000));
    let status = grpc_status(open_ads(&mut client, "http://meshd", first)).await;
    assert_eq!(status, "8", "RESOURCE_EXHAUSTED");
    let grew = rss_mib(&m) - before;
    assert!(grew < 32.0, "meshd grew by {grew:.1} MiB");
    // The same connection still opens a stream and is answered.
    let message = cds_request("sidecar~10.1.9.5~big-0.shop~shop.svc.cluster.local").encode_to_vec();
    let response = open_ads(&mut client, "http://meshd", grpc_message(&message));
    let mut rx = response.await.unwrap().into_body();
    let data = tokio::time::timeout(Duration::from_secs(10), rx.data())
        .await
        .expect("no response in 10 s");
    assert!(data.is_some_and(|d| d.is_ok_and(|d| d.len() > 5)));
    healthy.still_served(&m, "details", 2).await;
}

/// A client limited to TLS 1.2 (istiod's Go server accepts 1.2 and 1.3) still gets gRPC
/// over the secure port: its ADS stream, with no credentials, is refused with
/// UNAUTHENTICATED by meshd itself, not by the handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_1_2_client_is_served_on_the_secure_port() {
    let (m, _healthy) = target("hostile-tls12").await;
    let mut roots = rustls::RootCertStore::empty();
    for cert in transport::tls::certs(&m.root_pem()).unwrap() {
        roots.add(cert).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(transport::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = TcpStream::connect(("127.0.0.1", m.secure_port))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();
    assert_eq!(
        tls.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
    let (mut client, conn) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(conn);
    let message =
        cds_request("sidecar~10.1.9.4~tls12-0.shop~shop.svc.cluster.local").encode_to_vec();
    let response = open_ads(&mut client, "https://localhost", grpc_message(&message));
    let status = grpc_status(response).await;
    assert_eq!(status, "16", "UNAUTHENTICATED");
}
