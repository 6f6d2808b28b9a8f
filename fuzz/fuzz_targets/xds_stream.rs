//! Any bytes as the request side of one ADS stream (a sequence of gRPC frames, as a proxy
//! would send them on one HTTP/2 stream), delta or state of the world by the first byte,
//! served by meshd's ADS service on a small mesh until the stream ends or goes quiet.
//! Never a panic; meshd's own errors (`pilot_total_xds_internal_errors`) stay at zero.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use model::PushContext;
use tower::ServiceExt;
use xds::push::{Push, PushSettings};
use xds::{AdsService, XdsShared};

struct Fixture {
    runtime: tokio::runtime::Runtime,
    shared: Arc<XdsShared>,
    _pushes: tokio::sync::watch::Sender<Arc<Push>>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let store = model::testmesh::generate(20, 3, 2);
        let context = PushContext::build(&store, "fuzz/1".into());
        let push = Push::new(context, 1, Instant::now(), None, Default::default());
        let (tx, rx) = tokio::sync::watch::channel(Arc::new(push));
        let metrics = xds::metrics::XdsMetrics::unregistered();
        let settings = PushSettings {
            keepalive_interval: Duration::from_millis(50),
            keepalive_timeout: Duration::from_millis(50),
            ..PushSettings::default()
        };
        let shared = runtime.block_on(async {
            XdsShared::new(metrics, rx, &settings, model::Revisions::new("default"))
        });
        Fixture {
            runtime,
            shared,
            _pushes: tx,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let f = fixture();
    let method = if pick & 1 == 0 {
        "DeltaAggregatedResources"
    } else {
        "StreamAggregatedResources"
    };
    let request = http::Request::post(format!(
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/{method}"
    ))
    .header("content-type", "application/grpc")
    .body(http_body_util::Full::new(
        prost::bytes::Bytes::copy_from_slice(body),
    ))
    .unwrap();
    let service = AdsService::new(f.shared.clone()).into_server();
    f.runtime.block_on(async {
        let response = service.oneshot(request).await.unwrap();
        let mut body = response.into_body();
        // Read the answers until the stream ends or has nothing more to say.
        while let Ok(Some(frame)) =
            tokio::time::timeout(Duration::from_millis(20), body.frame()).await
        {
            if frame.is_err() {
                break;
            }
        }
    });
    // A panic anywhere, in a stream's task too, aborts the process through the panic
    // hook libfuzzer-sys installs, and the fuzzer reports it as a crash.
});
