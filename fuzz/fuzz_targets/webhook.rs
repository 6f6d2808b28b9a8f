//! Any bytes as the body of a request to the webhook port's routes (`POST /validate` and
//! `POST /inject`, JSON; the first byte picks the route), answered by the webhook's own
//! router as on port 15017. Never a panic, always an answer.
#![no_main]

use std::sync::{Arc, OnceLock, RwLock};

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

fn state() -> meshd::webhook::WebhookState {
    let metrics = meshd::metrics::Metrics::new();
    let options = meshd::inject::InjectOptions {
        revision: "default".into(),
        istio_namespace: "istio-system".into(),
        proxy_image: "meshd/proxy:fuzz".into(),
        trust_domain: "cluster.local".into(),
        cluster_id: "Kubernetes".into(),
        mesh_id: None,
        native_sidecars: meshd::inject::NativeSidecars::Auto,
        policy: meshd::inject::Policy::Enabled,
        patch_ca_bundle: false,
        network: None,
        path_env: Vec::new(),
    };
    meshd::webhook::WebhookState {
        validation: metrics.validation.clone(),
        injector: Some(Arc::new(meshd::inject::webhook::Injector {
            options,
            store: Arc::new(RwLock::new(model::Store::default())),
            nodes: meshd::inject::NodeVersions::default(),
            metrics: metrics.inject.clone(),
        })),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&route, body)) = data.split_first() else {
        return;
    };
    let path = if route % 2 == 0 {
        "/validate"
    } else {
        "/inject"
    };
    let request = http::Request::post(path)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_vec()))
        .unwrap();
    let response = runtime()
        .block_on(meshd::webhook::router(state()).oneshot(request))
        .unwrap();
    assert!(response.status().as_u16() < 500, "{}", response.status());
});
