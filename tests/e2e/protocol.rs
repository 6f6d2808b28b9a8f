//! xDS protocol edge cases a real Envoy will not produce on demand, driven by a scripted
//! client over real gRPC against the meshd process: reconnect with
//! initial_resource_versions, unsubscribe, removal, NACK, stale nonces, bad nodes, garbage.

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use envoy_api::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_api::pb::google::rpc::Status as RpcStatus;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::harness::*;

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const REVIEWS: &str = "outbound|9080||reviews.shop.svc.cluster.local";
const RATINGS: &str = "outbound|9080||ratings.shop.svc.cluster.local";

fn svc(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  clusterIP: 10.96.7.{}\n  ports: [{{name: http, port: 9080}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: shop, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: http, port: 9080}}]\nendpoints: [{{addresses: [10.1.0.{}], conditions: {{ready: true}}}}]\n",
        name.len(),
        name.len()
    )
}

fn meshd(name: &str) -> Meshd {
    let dir = temp_dir(name).join("config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("reviews.yaml"), svc("reviews")).unwrap();
    std::fs::write(dir.join("ratings.yaml"), svc("ratings")).unwrap();
    Meshd::start(&dir)
}

const NODE: &str = "sidecar~10.1.9.9~client-0.shop~shop.svc.cluster.local";

/// The next message on a stream, within 5 s.
async fn recv<T>(rx: &mut Streaming<T>) -> T {
    tokio::time::timeout(Duration::from_secs(5), rx.message())
        .await
        .expect("no response in 5s")
        .unwrap()
        .unwrap()
}

/// Asserts meshd sends nothing for 400 ms.
async fn expect_silence<T: std::fmt::Debug>(rx: &mut Streaming<T>) {
    if let Ok(msg) = tokio::time::timeout(Duration::from_millis(400), rx.message()).await {
        panic!("expected no response, got {msg:?}");
    }
}

struct Delta {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    rx: Streaming<DeltaDiscoveryResponse>,
}

impl Delta {
    async fn open(m: &Meshd, first: DeltaDiscoveryRequest) -> Delta {
        let (tx, rx) = mpsc::channel(16);
        tx.send(first).await.unwrap();
        let rx = xds_client(m)
            .await
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Delta { tx, rx }
    }
    async fn send(&self, req: DeltaDiscoveryRequest) {
        self.tx.send(req).await.unwrap();
    }
    async fn recv(&mut self) -> DeltaDiscoveryResponse {
        recv(&mut self.rx).await
    }
    async fn expect_silence(&mut self) {
        expect_silence(&mut self.rx).await
    }
    async fn ack(&self, r: &DeltaDiscoveryResponse) {
        self.send(DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        })
        .await;
    }
}

/// The first request of a stream for `type_url`, naming what the proxy holds.
fn first_request(
    type_url: &str,
    subscribe: &[&str],
    initial: HashMap<String, String>,
) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: Some(xds_node(NODE, "shop")),
        type_url: type_url.into(),
        resource_names_subscribe: subscribe.iter().map(|n| n.to_string()).collect(),
        initial_resource_versions: initial,
        ..Default::default()
    }
}

fn cds_request(initial: HashMap<String, String>) -> DeltaDiscoveryRequest {
    first_request(CDS, &[], initial)
}

/// The versions of a response's resources, by name.
fn versions_of(r: &DeltaDiscoveryResponse) -> HashMap<String, String> {
    (r.resources.iter())
        .map(|r| (r.name.clone(), r.version.clone()))
        .collect()
}

#[tokio::test]
async fn delta_reconnect_with_initial_versions_receives_only_what_differs() {
    let m = meshd("proto-reconnect");
    let mut first = Delta::open(&m, cds_request(HashMap::new())).await;
    let all = first.recv().await;
    let versions = versions_of(&all);
    assert!(
        versions.contains_key(REVIEWS) && versions.contains_key(RATINGS),
        "{:?}",
        versions.keys()
    );
    drop(first);

    // Same versions: nothing to send (an empty response completes the handshake).
    let mut same = Delta::open(&m, cds_request(versions.clone())).await;
    let r = same.recv().await;
    assert!(
        r.resources.is_empty() && r.removed_resources.is_empty(),
        "{r:?}"
    );
    drop(same);

    // One stale version and one resource that no longer exists.
    let mut stale = versions.clone();
    stale.insert(REVIEWS.into(), "stale".into());
    stale.insert("outbound|1||gone.shop.svc.cluster.local".into(), "x".into());
    let mut diff = Delta::open(&m, cds_request(stale)).await;
    let r = diff.recv().await;
    let names: Vec<&str> = r.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, [REVIEWS]);
    assert_eq!(
        r.removed_resources,
        ["outbound|1||gone.shop.svc.cluster.local"]
    );
}

/// An EDS request for reviews and ratings: the first of a stream, naming what it holds.
fn eds_request(initial: HashMap<String, String>) -> DeltaDiscoveryRequest {
    first_request(EDS, &[REVIEWS, RATINGS], initial)
}

#[tokio::test]
async fn a_delta_push_carries_no_versions_and_what_it_sent_is_resent_on_reconnect() {
    let m = meshd("proto-push-versions");
    let mut c = Delta::open(&m, eds_request(HashMap::new())).await;
    let answer = c.recv().await;
    c.ack(&answer).await;
    let held = versions_of(&answer);
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(
        held.values().all(|v| !v.is_empty()),
        "an answer to a request carries versions: {held:?}"
    );

    // reviews gains an endpoint: the push carries it, without a version (as istiod's).
    let grown = svc("reviews").replace("[10.1.0.7]", "[10.1.0.7, 10.1.0.77]");
    assert_ne!(grown, svc("reviews"));
    std::fs::write(m.config_dir.join("reviews.yaml"), grown).unwrap();
    let push = c.recv().await;
    let pushed: Vec<(&str, &str)> = (push.resources.iter())
        .map(|r| (r.name.as_str(), r.version.as_str()))
        .collect();
    assert_eq!(pushed, [(REVIEWS, "")]);
    c.ack(&push).await;
    drop(c);

    // Reconnecting, the proxy names what it holds as Envoy does: ratings at the answer's
    // version, reviews at the empty version it was pushed with. Only reviews is resent,
    // the new endpoints, with a version this time.
    let mut now = held.clone();
    now.insert(REVIEWS.into(), String::new());
    let mut again = Delta::open(&m, eds_request(now)).await;
    let r = again.recv().await;
    assert_eq!(r.resources.len(), 1, "{r:?}");
    let reviews = &r.resources[0];
    assert_eq!(reviews.name, REVIEWS);
    assert!(!reviews.version.is_empty());
    assert_ne!(reviews.version, held[REVIEWS], "the new endpoints' version");
    let body = &reviews.resource.as_ref().unwrap().value;
    assert!(
        body.windows(b"10.1.0.77".len()).any(|w| w == b"10.1.0.77"),
        "the new endpoint"
    );
    again.ack(&r).await;
    again.expect_silence().await;
}

#[tokio::test]
async fn delta_unsubscribe_and_delete_follow_the_protocol() {
    let m = meshd("proto-subscribe");
    let mut c = Delta::open(&m, cds_request(HashMap::new())).await;
    let cds = c.recv().await;
    c.ack(&cds).await;
    c.send(DeltaDiscoveryRequest {
        type_url: EDS.into(),
        resource_names_subscribe: vec![
            REVIEWS.into(),
            RATINGS.into(),
            "outbound|1||nowhere.example".into(),
        ],
        ..Default::default()
    })
    .await;
    let eds = c.recv().await;
    let mut names: Vec<&str> = eds.resources.iter().map(|r| r.name.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        ["outbound|1||nowhere.example", RATINGS, REVIEWS],
        "every requested name is answered"
    );
    c.ack(&eds).await;

    c.send(DeltaDiscoveryRequest {
        type_url: EDS.into(),
        resource_names_unsubscribe: vec![RATINGS.into()],
        ..Default::default()
    })
    .await;
    c.expect_silence().await;

    std::fs::remove_file(m.config_dir.join("ratings.yaml")).unwrap();
    let cds = c.recv().await;
    assert_eq!(cds.type_url, CDS);
    assert_eq!(cds.removed_resources, [RATINGS]);
    assert!(cds.resources.is_empty(), "nothing else changed");
    c.ack(&cds).await;
    c.expect_silence().await; // EDS for ratings was unsubscribed; reviews did not change
}

const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";

#[tokio::test]
async fn delta_removes_clusters_only_after_the_routes_that_stop_using_them() {
    let m = meshd("proto-mbb");
    let mut c = Delta::open(&m, cds_request(HashMap::new())).await;
    let cds = c.recv().await;
    c.ack(&cds).await;
    c.send(DeltaDiscoveryRequest {
        type_url: LDS.into(),
        ..Default::default()
    })
    .await;
    let lds = c.recv().await;
    c.ack(&lds).await;
    c.send(DeltaDiscoveryRequest {
        type_url: RDS.into(),
        resource_names_subscribe: vec!["9080".into()],
        ..Default::default()
    })
    .await;
    let rds = c.recv().await;
    assert_eq!(rds.resources[0].name, "9080");
    c.ack(&rds).await;

    // One change: details arrives and ratings goes, in the same debounce window.
    std::fs::write(m.config_dir.join("details.yaml"), svc("details")).unwrap();
    std::fs::remove_file(m.config_dir.join("ratings.yaml")).unwrap();
    let mut seen = Vec::new();
    while seen
        .last()
        .is_none_or(|r: &DeltaDiscoveryResponse| r.removed_resources.is_empty())
    {
        let r = c.recv().await;
        c.ack(&r).await;
        seen.push(r);
    }
    let order: Vec<&str> = seen.iter().map(|r| r.type_url.as_str()).collect();
    assert_eq!(
        order,
        [CDS, RDS, CDS],
        "add clusters, then routes, then remove clusters"
    );
    assert_eq!(
        seen[0].resources[0].name,
        "outbound|9080||details.shop.svc.cluster.local"
    );
    assert!(
        seen[0].removed_resources.is_empty(),
        "nothing is removed before the routes move"
    );
    assert_eq!(seen[2].removed_resources, [RATINGS]);
    assert!(seen[2].resources.is_empty());
}

struct Sotw {
    tx: mpsc::Sender<DiscoveryRequest>,
    rx: Streaming<DiscoveryResponse>,
}

impl Sotw {
    /// A SotW stream to `m` whose first request is `first`.
    async fn open(m: &Meshd, first: DiscoveryRequest) -> Sotw {
        let (tx, rx) = mpsc::channel(16);
        tx.send(first).await.unwrap();
        let rx = xds_client(m)
            .await
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Sotw { tx, rx }
    }

    async fn recv(&mut self) -> DiscoveryResponse {
        recv(&mut self.rx).await
    }
    async fn expect_silence(&mut self) {
        expect_silence(&mut self.rx).await
    }
}

#[tokio::test]
async fn a_sotw_nack_is_counted_and_a_stale_nonce_is_ignored() {
    let m = meshd("proto-nack");
    let first = DiscoveryRequest {
        node: Some(xds_node(NODE, "shop")),
        type_url: CDS.into(),
        ..Default::default()
    };
    let mut c = Sotw::open(&m, first).await;
    let first = c.recv().await;
    assert_eq!(
        first.resources.len(),
        5,
        "reviews, ratings, BlackHoleCluster, PassthroughCluster, InboundPassthroughCluster"
    );

    c.tx.send(DiscoveryRequest {
        type_url: CDS.into(),
        response_nonce: first.nonce.clone(),
        error_detail: Some(RpcStatus {
            code: 3,
            message: "cluster rejected for the test".into(),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    c.expect_silence().await;
    assert_eq!(m.metric("pilot_total_xds_rejects{type=\"cds\"}"), 1.0);
    assert_eq!(
        m.syncz(NODE)["types"]["cds"]["last_error"],
        "cluster rejected for the test"
    );

    c.tx.send(DiscoveryRequest {
        type_url: CDS.into(),
        response_nonce: "not-a-nonce-we-sent".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    c.expect_silence().await;
    assert_eq!(m.metric("pilot_xds_expired_nonce{type=\"cds\"}"), 1.0);

    // A later change still reaches the proxy, in full (state of the world).
    std::fs::write(m.config_dir.join("details.yaml"), svc("details")).unwrap();
    let next = c.recv().await;
    assert_eq!(next.resources.len(), 6, "and details");
    assert_ne!(next.nonce, first.nonce);
    assert_ne!(next.version_info, first.version_info);
}

#[tokio::test]
async fn a_stream_with_a_malformed_node_id_is_refused_with_the_reason() {
    let m = meshd("proto-badnode");
    let (tx, rx) = mpsc::channel(16);
    let mut bad = xds_node("sidecar~10.0.0.1", "shop");
    bad.id = "sidecar~10.0.0.1".into();
    tx.send(DeltaDiscoveryRequest {
        node: Some(bad),
        type_url: CDS.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut rx = xds_client(&m)
        .await
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let err = tokio::time::timeout(Duration::from_secs(5), rx.message())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("4 parts"), "{}", err.message());
    assert_eq!(
        m.metric("meshd_xds_connection_errors{reason=\"bad_node\"}"),
        1.0
    );
    drop(tx);
}

#[tokio::test]
async fn garbage_on_the_xds_port_does_not_disturb_meshd() {
    let m = meshd("proto-garbage");
    for payload in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        &[0xff; 64][..],
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x04\x00\x00\x00\x00\x00\xde\xad",
    ] {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", m.xds_port)).unwrap();
        let _ = s.write_all(payload);
    }
    // A well-behaved proxy is still served.
    let mut c = Delta::open(&m, cds_request(HashMap::new())).await;
    assert!(!c.recv().await.resources.is_empty());
    assert_eq!(m.get("/ready").unwrap().status, 200);
    // The two connections that were not HTTP/2 are counted (the third broke off
    // mid-frame, which is a client going away, not an error).
    let series = r#"meshd_xds_connection_errors{reason="http2_protocol_error"}"#;
    wait_until("both counted", Duration::from_secs(5), || {
        m.metric(series) == 2.0
    });
}

/// Request messages written as given: whatever bytes a broken client might frame.
struct RawFrames;

struct RawEncoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use prost::bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Codec for RawFrames {
    type Encode = Vec<u8>;
    type Decode = DeltaDiscoveryResponse;
    type Encoder = RawEncoder;
    type Decoder = tonic_prost::ProstDecoder<DeltaDiscoveryResponse>;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> Self::Decoder {
        Default::default()
    }
}

#[tokio::test]
async fn a_request_that_does_not_decode_ends_only_its_stream_with_a_clear_status() {
    use prost::Message;
    let m = meshd("proto-garbage-frame");
    let (tx, rx) = mpsc::channel::<Vec<u8>>(4);
    tx.send(cds_request(HashMap::new()).encode_to_vec())
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(m.plain_channel().await);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources",
    );
    let mut responses = grpc
        .streaming(
            tonic::Request::new(ReceiverStream::new(rx)),
            path,
            RawFrames,
        )
        .await
        .unwrap()
        .into_inner();
    assert!(!recv(&mut responses).await.resources.is_empty());
    // Not a DeltaDiscoveryRequest: a field number 0 and a length past the end.
    tx.send(vec![0x02, 0xff, 0xff, 0x03]).await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(5), responses.message())
        .await
        .expect("no answer in 5s")
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("a DeltaDiscoveryRequest that does not decode"),
        "{status:?}"
    );
    assert_eq!(
        m.metric(r#"meshd_xds_connection_errors{reason="stream"}"#),
        1.0
    );
    // Other proxies are served as before.
    let mut c = Delta::open(&m, cds_request(HashMap::new())).await;
    assert!(!c.recv().await.resources.is_empty());
}

/// Opens a delta stream over `channel` as sidecar `i` of `shop`, asks for clusters and
/// returns the stream (held open by the caller) with the number of clusters it first got.
async fn held_delta_stream(
    channel: tonic::transport::Channel,
    i: usize,
) -> Result<
    (
        mpsc::Sender<DeltaDiscoveryRequest>,
        Streaming<DeltaDiscoveryResponse>,
        usize,
    ),
    tonic::Status,
> {
    let id = format!(
        "sidecar~10.3.{}.{}~c-{i}.shop~shop.svc.cluster.local",
        i / 250,
        i % 250 + 1
    );
    let (tx, stream, first) = open_delta(channel, xds_node(&id, "shop"), CDS, None).await?;
    Ok((tx, stream, first.resources.len()))
}

/// A client that shares one connection among many xDS streams (gRPC C-core shares one per
/// address) opens 500 delta streams on it and keeps them open: every one gets its
/// configuration, as istiod allows 100,000 streams per connection
/// (`ISTIO_GPRC_MAXSTREAMS`), and `/debug/adsz` shows all 500 on one HTTP/2 connection.
/// With `ISTIO_GPRC_MAXSTREAMS=10` the eleventh waits for a slot, and the connection
/// reaching its limit is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_streams_on_one_connection_all_get_their_configuration() {
    let dir = temp_dir("many-streams").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("reviews.yaml"), svc("reviews")).unwrap();
    let d = dir.clone();
    let meshd = tokio::task::spawn_blocking(move || Meshd::start_with_env(&d, &[], &[]))
        .await
        .unwrap();
    let channel = meshd.plain_channel().await; // one HTTP/2 connection
    let opened = futures::future::join_all((0..500).map(|i| {
        let channel = channel.clone();
        tokio::time::timeout(Duration::from_secs(30), held_delta_stream(channel, i))
    }))
    .await;
    let answered = opened
        .iter()
        .filter(|r| matches!(r, Ok(Ok((_, _, n))) if *n > 0))
        .count();
    assert_eq!(answered, 500, "streams answered on one connection");
    let adsz = meshd.json("/debug/adsz");
    let clients = adsz["clients"].as_array().expect("adsz lists clients");
    assert_eq!(clients.len(), 500);
    let connections: std::collections::BTreeSet<_> = clients
        .iter()
        .map(|c| c["http2Connection"].as_u64().expect("http2Connection"))
        .collect();
    assert_eq!(connections.len(), 1, "{connections:?}");
    assert!(
        clients.iter().all(|c| c["http2OpenStreams"] == 500),
        "{:?}",
        clients[0]
    );
    assert_eq!(meshd.metric("meshd_xds_streams_at_limit"), 0.0);
    drop(opened);
    drop(meshd);

    let d = dir.clone();
    let limited = tokio::task::spawn_blocking(move || {
        Meshd::start_with_env(&d, &[], &[("ISTIO_GPRC_MAXSTREAMS", "10")])
    })
    .await
    .unwrap();
    let channel = limited.plain_channel().await;
    let mut held = Vec::new();
    for i in 0..10 {
        held.push(held_delta_stream(channel.clone(), i).await.unwrap());
    }
    let eleventh = tokio::time::timeout(
        Duration::from_secs(1),
        held_delta_stream(channel.clone(), 10),
    )
    .await;
    assert!(
        eleventh.is_err(),
        "the eleventh stream was served past the limit"
    );
    assert_eq!(limited.metric("meshd_xds_streams_at_limit"), 1.0);
    held.pop(); // a slot frees
    let eleventh =
        tokio::time::timeout(Duration::from_secs(10), held_delta_stream(channel, 10)).await;
    assert!(
        matches!(eleventh, Ok(Ok(_))),
        "the eleventh stream after a slot freed"
    );
}

/// A request over `ISTIO_GPRC_MAXRECVMSGSIZE` (4 MiB by default, as istiod) ends its own
/// stream with RESOURCE_EXHAUSTED; another stream on the same connection is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_message_size_limit_ends_only_its_stream() {
    let meshd = tokio::task::spawn_blocking(|| meshd("big-request"))
        .await
        .unwrap();
    let channel = meshd.plain_channel().await;
    let (tx, rx) = mpsc::channel(4);
    let mut node = xds_node(NODE, "shop");
    node.user_agent_name = "x".repeat(5 << 20);
    tx.send(DeltaDiscoveryRequest {
        node: Some(node),
        type_url: CDS.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let refused = async {
        let mut stream = envoy_api::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient::new(channel.clone())
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await?
            .into_inner();
        stream.message().await
    }
    .await
    .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    let (_, _, clusters) = held_delta_stream(channel, 1).await.unwrap();
    assert!(clusters > 0);
}

/// A SotW client that reconnects after its server went (or asks with a nonce of its own,
/// as istioctl does) carries a nonce this stream never sent: istiod answers it as a first
/// request, and so does meshd. A stale nonce after an answer is still ignored.
#[tokio::test]
async fn a_sotw_first_request_with_a_nonce_from_elsewhere_is_answered() {
    let m = meshd("proto-foreign-nonce");
    let request = DiscoveryRequest {
        node: Some(xds_node(NODE, "shop")),
        type_url: CDS.into(),
        response_nonce: "from-the-previous-server".into(),
        version_info: "2026-01-01T00:00:00Z/7".into(),
        ..Default::default()
    };
    let mut c = Sotw::open(&m, request).await;
    let first = c.recv().await;
    assert_eq!(first.resources.len(), 5, "{first:?}");
    c.tx.send(DiscoveryRequest {
        type_url: CDS.into(),
        response_nonce: "from-the-previous-server".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    c.expect_silence().await;
}
