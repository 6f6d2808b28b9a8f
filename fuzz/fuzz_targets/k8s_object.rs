//! Any bytes as a watched Kubernetes object of one of the kinds meshd follows (the first
//! byte picks the kind, the rest is the JSON the API server would send), converted into
//! the model as the Kubernetes source converts each watch event. Never a panic.
#![no_main]

use kube::api::DynamicObject;
use libfuzzer_sys::fuzz_target;
use model::config::Kind;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, json)) = data.split_first() else {
        return;
    };
    let kind = Kind::ALL[usize::from(pick) % Kind::ALL.len()];
    let Ok(obj) = serde_json::from_slice::<DynamicObject>(json) else {
        return;
    };
    let _ = meshd::k8s::parse_object(kind, &meshd::k8s::api_resource(kind), &obj);
});
