//! Push-pipeline micro-benchmarks: building the shared push context, and generating plus
//! encoding everything one unscoped sidecar receives. Figures live in BENCHMARKS.md.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use serde_json::json;

use meshd::model::{Proxy, PushContext, testmesh};
use meshd::translate::proxy_config;
use meshd::xds::resource::View;

fn push_context_build(c: &mut Criterion) {
    let mut group = c.benchmark_group("push_context_build");
    group.sample_size(20);
    for services in [1_000, 10_000] {
        let store = testmesh::generate(services, 50, 3);
        group.bench_with_input(BenchmarkId::from_parameter(services), &store, |b, store| {
            b.iter(|| PushContext::build(store, "bench/1".into()))
        });
    }
    group.finish();
}

fn sidecar_generation(c: &mut Criterion) {
    let store = testmesh::generate(1_000, 50, 3);
    let ctx = PushContext::build(&store, "bench/1".into());
    let meta = json!({"NAMESPACE": "ns-1", "LABELS": {"app": "client"}});
    let proxy = Proxy::from_node(
        "sidecar~10.9.0.1~client-0.ns-1~ns-1.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap();
    let mut group = c.benchmark_group("sidecar_generation");
    group.sample_size(20);
    group.bench_function("1000_services_translate_and_encode", |b| {
        b.iter(|| View::new(proxy_config(&ctx, &proxy)))
    });
    group.finish();
}

criterion_group!(benches, push_context_build, sidecar_generation);
criterion_main!(benches);
