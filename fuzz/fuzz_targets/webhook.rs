//! Any bytes as the body of a request to the validation webhook (`POST /validate`, JSON),
//! answered by the webhook's own router as on port 15017. Never a panic, always an answer.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    let router = meshd::webhook::router(meshd::webhook::ValidationMetrics::default());
    let request = http::Request::post("/validate")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(data.to_vec()))
        .unwrap();
    let response = runtime().block_on(router.oneshot(request)).unwrap();
    assert!(response.status().as_u16() < 500, "{}", response.status());
});
