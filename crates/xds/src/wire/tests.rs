use super::*;
use crate::resource::test_cluster as cluster;
use envoy_api::pb::envoy::config::cluster::v3::Cluster;
use envoy_api::pb::envoy::service::discovery::v3::{DeltaDiscoveryResponse, DiscoveryResponse};
use prost::Message;

/// The frame's chunks joined, checked against the gRPC header, without it.
fn unframe(message: &impl WireMessage) -> Vec<u8> {
    let bytes: Vec<u8> = Chunks::frame(message, &Runs::default())
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(bytes[0], 0, "uncompressed");
    let len = u32::from_be_bytes(bytes[1..5].try_into().unwrap()) as usize;
    assert_eq!(len, message.encoded_len());
    assert_eq!(bytes.len(), 5 + len);
    bytes[5..].to_vec()
}

#[test]
fn responses_decode_as_envoys_messages() {
    // One small body (copied into the frame), one large (sent from the shared bytes).
    let a = cluster("outbound|80||a");
    let b = cluster(&format!("outbound|80||{}", "b".repeat(3 * SHARE_AT)));
    assert!(b.value_len() >= SHARE_AT);
    // One kept in pieces: the small ones copied, the large one shared.
    let large: Arc<[u8]> = vec![7u8; 2 * SHARE_AT].into();
    let c = crate::resource::from_pieces::<Cluster>(
        "outbound|80||c",
        vec![vec![1u8, 2].into(), large.clone(), vec![3u8].into()],
    );
    let bc = SotwResponse::new(
        String::new(),
        "t",
        String::new(),
        vec![b.clone(), c.clone()],
    );
    let chunks = Chunks::frame(&bc, &Runs::default());
    // What is sent by reference is what `shared_len` counts (the copy is sized by it).
    let by_reference: usize = chunks
        .iter()
        .filter(|chunk| chunk.as_ptr() == b.value().as_ptr() || chunk.as_ptr() == large.as_ptr())
        .map(|chunk| chunk.len())
        .sum();
    assert_eq!(by_reference, bc.shared_len());
    assert_eq!(by_reference, b.value_len() + large.len());
    let total: usize = chunks.iter().map(|chunk| chunk.len()).sum();
    assert_eq!(total, FRAME_HEADER + bc.encoded_len());
    assert!(
        chunks
            .iter()
            .any(|chunk| chunk.as_ptr() == b.value().as_ptr()),
        "the large body is not copied"
    );
    assert!(
        chunks.iter().any(|chunk| chunk.as_ptr() == large.as_ptr()),
        "the large piece is not copied"
    );
    let sotw = SotwResponse::new(
        "v/3".into(),
        "type.googleapis.com/envoy.config.cluster.v3.Cluster",
        "3-1".into(),
        vec![a.clone(), b.clone(), c.clone()],
    );
    let buf = unframe(&sotw);
    let decoded = DiscoveryResponse::decode(buf.as_slice()).unwrap();
    assert_eq!(decoded.version_info, "v/3");
    assert_eq!(decoded.nonce, "3-1");
    assert_eq!(decoded.type_url, sotw.type_url);
    assert_eq!(decoded.resources, vec![a.any(), b.any(), c.any()]);
    assert_eq!(c.any().value, [&[1u8, 2][..], &large, &[3]].concat());

    // One batch for responses with and without versions: each counts its own length.
    let batch = Batch::from(vec![b.clone(), c.clone()]);
    let delta = DeltaResponse::new(
        "v/4".into(),
        sotw.type_url,
        "4-2".into(),
        batch.clone(),
        vec!["outbound|80||a".into()],
        true,
    );
    let buf = unframe(&delta);
    let decoded = DeltaDiscoveryResponse::decode(buf.as_slice()).unwrap();
    assert_eq!(decoded.system_version_info, "v/4");
    assert_eq!(decoded.removed_resources, vec!["outbound|80||a"]);
    assert_eq!(decoded.resources.len(), 2);
    let r = &decoded.resources[0];
    assert_eq!(
        (r.name.as_str(), r.version.as_str()),
        (&*b.name, b.version.as_str())
    );
    assert_eq!(r.resource.as_ref(), Some(&b.any()));
    assert!(!b.version.is_empty());

    // Without versions: the same resources, each with an empty version.
    let bare = DeltaResponse::new(
        "v/5".into(),
        sotw.type_url,
        "5-1".into(),
        batch.clone(),
        vec![],
        false,
    );
    assert_eq!(
        bare.resources.as_ptr(),
        delta.resources.as_ptr(),
        "one list"
    );
    let decoded = DeltaDiscoveryResponse::decode(unframe(&bare).as_slice()).unwrap();
    let got: Vec<_> = (decoded.resources.iter())
        .map(|r| (r.name.as_str(), r.version.as_str(), r.resource.clone()))
        .collect();
    assert_eq!(
        got,
        [(&*b.name, "", Some(b.any())), (&*c.name, "", Some(c.any()))]
    );
    let version_bytes = 2 * (2 + b.version.len());
    assert_eq!(bare.entries_len() + version_bytes, delta.entries_len());
}

#[test]
fn the_control_plane_identifier_decodes_in_both_framings() {
    use envoy_api::pb::envoy::config::core::v3::ControlPlane;
    // Large enough that the entries go out as a shared run, which comes last.
    let resources: Vec<Arc<Resource>> = (0..300)
        .map(|i| cluster(&format!("outbound|80||cp-{i}.wire-test.svc.cluster.local")))
        .collect();
    assert!(as_run(
        Batch::from(resources.clone()).entries_len(Entry::Sotw)
    ));
    let id: Arc<str> = r#"{"Component":"istiod","ID":"meshd-0"}"#.into();
    let expected = Some(ControlPlane {
        identifier: id.to_string(),
    });
    let mut sotw = SotwResponse::new("v/1".into(), "t", "1-1".into(), resources.clone());
    sotw.control_plane = Some(id.clone());
    let decoded = DiscoveryResponse::decode(unframe(&sotw).as_slice()).unwrap();
    assert_eq!(decoded.control_plane, expected);
    assert_eq!(decoded.resources.len(), 300);
    let mut delta = DeltaResponse::new("v/1".into(), "t", "1-2".into(), resources, vec![], true);
    delta.control_plane = Some(id);
    let decoded = DeltaDiscoveryResponse::decode(unframe(&delta).as_slice()).unwrap();
    assert_eq!(decoded.control_plane, expected);
    assert_eq!(decoded.nonce, "1-2");
    // Without one, none is sent (as istiod sends none outside its debug types).
    let bare = SotwResponse::new("v/1".into(), "t", "1-3".into(), vec![]);
    let decoded = DiscoveryResponse::decode(unframe(&bare).as_slice()).unwrap();
    assert_eq!(decoded.control_plane, None);
}

#[test]
fn large_responses_share_their_encoded_entries_between_frames() {
    let cds = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    let resources: Vec<Arc<Resource>> = (0..400)
        .map(|i| cluster(&format!("outbound|80||run-{i}.wire-test.svc.cluster.local")))
        .collect();
    let delta = |nonce: &str, removed: Vec<String>| {
        let r = resources.clone();
        DeltaResponse::new("v/1".into(), cds, nonce.into(), r, removed, true)
    };
    let (a, b) = (delta("1-1", vec![]), delta("7-3", vec!["gone".into()]));
    assert!(a.entries_len() >= joined::JOIN_AT);
    let runs = Runs::default();
    let (fa, fb) = (Chunks::frame(&a, &runs), Chunks::frame(&b, &runs));
    let run = |frame: &VecDeque<Bytes>| {
        let run = frame.iter().find(|c| c.len() == a.entries_len());
        run.expect("the entries are one chunk").as_ptr()
    };
    assert_eq!(
        run(&fa),
        run(&fb),
        "one copy of the entries for both frames"
    );
    assert_eq!(
        a.shared_len(),
        a.entries_len(),
        "the copied part is sized without it"
    );
    let gone = vec!["gone".to_string()];
    for (response, nonce, removed) in [(&a, "1-1", vec![]), (&b, "7-3", gone)] {
        let decoded = DeltaDiscoveryResponse::decode(unframe(response).as_slice()).unwrap();
        assert_eq!(
            (decoded.nonce.as_str(), decoded.removed_resources),
            (nonce, removed)
        );
        let names: Vec<&str> = decoded.resources.iter().map(|r| r.name.as_str()).collect();
        let expected: Vec<&str> = resources.iter().map(|r| &*r.name).collect();
        assert_eq!(names, expected);
        let last = decoded.resources.last().unwrap();
        assert_eq!(last.version, resources[399].version);
        assert_eq!(last.resource.as_ref(), Some(&resources[399].any()));
    }
    // State of the world: the same resources as bare `Any`s, a run of their own.
    let sotw = |nonce: &str| SotwResponse::new("v/1".into(), cds, nonce.into(), resources.clone());
    let (c, d) = (sotw("2-1"), sotw("9-9"));
    let (fc, fd) = (Chunks::frame(&c, &runs), Chunks::frame(&d, &runs));
    let sotw_run = |frame: &VecDeque<Bytes>| {
        let run = frame.iter().find(|chunk| chunk.len() == c.entries_len());
        run.expect("the entries are one chunk").as_ptr()
    };
    assert_eq!(sotw_run(&fc), sotw_run(&fd));
    assert_ne!(sotw_run(&fc), run(&fa));
    // Delta without versions: another run, whose entries carry no version.
    let bare = DeltaResponse::new(
        "v/2".into(),
        cds,
        "3-1".into(),
        resources.clone(),
        vec![],
        false,
    );
    let bare_run = Chunks::frame(&bare, &runs);
    let bare_run = bare_run
        .iter()
        .find(|c| c.len() == bare.entries_len())
        .unwrap();
    assert_ne!(bare_run.as_ptr(), run(&fa));
    let decoded = DeltaDiscoveryResponse::decode(unframe(&bare).as_slice()).unwrap();
    assert!(decoded.resources.iter().all(|r| r.version.is_empty()));
    assert_eq!(decoded.resources.len(), 400);
    let decoded = DiscoveryResponse::decode(unframe(&d).as_slice()).unwrap();
    assert_eq!(decoded.nonce, "9-9");
    let expected: Vec<_> = resources.iter().map(|r| r.any()).collect();
    assert_eq!(decoded.resources, expected);
}

/// Polls a response body once, as HTTP/2 does when the stream has room.
fn poll_once<B: http_body::Body<Data = Bytes, Error = Status> + Unpin>(
    body: &mut B,
) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
    Pin::new(body).poll_frame(&mut Context::from_waker(std::task::Waker::noop()))
}

/// Every data chunk a body gives until its trailers.
fn drain<B: http_body::Body<Data = Bytes, Error = Status> + Unpin>(body: &mut B) -> Vec<Bytes> {
    let mut chunks = Vec::new();
    loop {
        match poll_once(body) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(chunk) => chunks.push(chunk),
                Err(_) => return chunks, // the trailers
            },
            other => panic!("the body should be ready: {:?}", other.is_ready()),
        }
    }
}

#[test]
fn framed_bytes_wait_for_the_send_budget_until_they_are_written() {
    let response = |n: usize| {
        let resources: Vec<_> = (0..n)
            .map(|i| cluster(&format!("outbound|80||svc-{i}")))
            .collect();
        SotwResponse::new(String::new(), "t", String::new(), resources)
    };
    let len = FRAME_HEADER + response(60).encoded_len();
    let held = Gauge::default();
    // Room for one frame and a half.
    let budget = SendBudget::new(len + len / 2, held.clone());
    let body = |n: usize| {
        let stream = futures::stream::iter([Ok::<_, Status>(response(n))]);
        let framing = Framing {
            budget: Some(budget.clone()),
            runs: Arc::new(Runs::default()),
        };
        FrameBody::new(stream, framing)
    };
    let (mut a, mut b) = (body(60), body(60));
    let a_chunks = drain(&mut a);
    let joined: Vec<u8> = a_chunks.iter().flatten().copied().collect();
    let whole: Vec<u8> = Chunks::frame(&response(60), &Runs::default())
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(joined, whole, "the budget does not change the bytes");
    assert_eq!(held.get(), len as i64);
    // The second frame does not fit while the first one's bytes are unwritten...
    assert!(poll_once(&mut b).is_pending());
    let one = a_chunks[0].clone();
    drop(a_chunks);
    assert!(poll_once(&mut b).is_pending(), "a chunk is still held");
    // ...and does once HTTP/2 has dropped the last of them.
    drop(one);
    assert_eq!(held.get(), 0);
    let b_chunks = drain(&mut b);
    assert_eq!(held.get(), len as i64);
    drop(b_chunks);
    // A frame larger than the whole budget waits for all of it, not forever.
    let mut c = body(200);
    assert!(FRAME_HEADER + response(200).encoded_len() > len + len / 2);
    assert!(!drain(&mut c).is_empty());
    assert_eq!(held.get(), 0);
}
