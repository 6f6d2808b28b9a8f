//! meshd's push-context build and generation on Istio's own xDS benchmark configurations,
//! next to Istio's Go benchmarks of the same (`BenchmarkInitPushContext` and
//! `Benchmark{Cluster,Listener,Route}Generation` in `pilot/pkg/xds`, run with `go test
//! -bench` in the module `tools/istio/go.mod` pins), in one sitting: the same files
//! (`testdata/benchmarks/*.yaml`, read from the module cache), rendered by the real helm
//! with the services and instances `bench_test.go` gives each. Go's push-context figure
//! also covers setting the benchmark proxy's Sidecar scope and gateways, which meshd does
//! when it first generates for a proxy; meshd's is `PushContext::build` alone.
//!
//! Generation is one proxy's resources (the benchmark's `v0.default` at 1.1.1.1), uncached
//! and encoded, for both. meshd plans a proxy's listeners and routes together and its
//! clusters with their load assignments, so its figures are CDS+EDS, compared with Go's
//! CDS, and everything (CDS, EDS, LDS, RDS), compared with the sum of the types Go's
//! benchmarks generate for the case: meshd's side does more work in both.
//!
//! Prints a table, writes `target/istio-configs.json`. With `MESHD_PROFILE_CONFIGS=NAME,...`
//! it only runs meshd's side on those configurations, for a profiler.
//! `cargo bench --features loadgen --bench istio_configs` (`just bench-istio-configs`).

#![allow(dead_code)]

#[path = "../tests/e2e/cluster.rs"]
mod cluster;
#[path = "../tests/e2e/harness.rs"]
mod harness;
#[path = "../tests/e2e/istio_configs.rs"]
mod istio_configs;
#[path = "../tests/e2e/istiod.rs"]
mod istiod;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use model::config::parse::parse_file;
use model::{Proxy, PushContext, Store};

/// The allocator the `meshd` binary ships with, so the figures are what it does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Istio's benchmarks: (benchmark, case name) → nanoseconds per operation, for
/// `BenchmarkInitPushContext` and the CDS, LDS and RDS generation benchmarks (each one
/// proxy's resources of that type, generated and encoded, xDS caching off).
fn istio_figures(root: &std::path::Path) -> BTreeMap<(String, String), f64> {
    let out = Command::new("go")
        .args(["test", "-count=1", "-run", "^$", "-benchtime", "1s"])
        .args([
            "-bench",
            "^Benchmark(InitPushContext|ClusterGeneration|ListenerGeneration|RouteGeneration)$",
        ])
        .arg("istio.io/istio/pilot/pkg/xds")
        .current_dir(root.join("tools/istio"))
        .output()
        .expect("running go test (Go is needed for Istio's benchmarks)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "go test -bench: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (bench, name) = fields.next()?.strip_prefix("Benchmark")?.split_once('/')?;
            // `NAME-GOMAXPROCS`, then iterations, then the time.
            let name = name.rsplit_once('-').map_or(name, |(n, _)| n);
            let ns: f64 = fields.nth(1)?.parse().ok()?;
            Some(((bench.to_string(), name.to_string()), ns))
        })
        .collect()
}

/// The proxy Istio's benchmarks generate for (`setupTest`): `v0.default` at 1.1.1.1,
/// labelled `istio.io/benchmark: "true"`, a sidecar or a gateway, its identity verified.
fn benchmark_proxy(router: bool) -> Proxy {
    let kind = if router { "router" } else { "sidecar" };
    let meta = serde_json::json!({
        "NAMESPACE": "default",
        "LABELS": {"istio.io/benchmark": "true"},
        "CLUSTER_ID": "Kubernetes",
        "ISTIO_VERSION": "1.26.0",
    });
    let mut proxy = Proxy::from_node(
        &format!("{kind}~1.1.1.1~v0.default~default.svc.cluster.local"),
        meta.as_object().unwrap(),
    )
    .unwrap();
    proxy.identity = Some("spiffe://cluster.local/ns/default/sa/default".into());
    proxy
}

/// Mean nanoseconds of `f` over at least a second (and three runs).
fn mean_ns(mut f: impl FnMut()) -> f64 {
    f();
    let (start, mut runs) = (Instant::now(), 0u32);
    while runs < 3 || start.elapsed() < Duration::from_secs(1) {
        f();
        runs += 1;
    }
    start.elapsed().as_nanos() as f64 / runs as f64
}

/// meshd's generation for the benchmark proxy, uncached and encoded as it goes on the
/// wire, in nanoseconds: its clusters with their load assignments (CDS and EDS), and its
/// whole configuration (CDS, EDS, LDS and RDS).
fn meshd_generation(ctx: &PushContext, router: bool) -> (f64, f64) {
    use prost::Message;
    let proxy = benchmark_proxy(router);
    let encoded = |cfg: &translate::ProxyConfig| {
        let clusters = cfg.clusters.iter().map(|r| r.encode_to_vec().len());
        let endpoints = cfg.endpoints.iter().map(|r| r.encode_to_vec().len());
        let listeners = cfg.listeners.iter().map(|r| r.encode_to_vec().len());
        let routes = cfg.routes.iter().map(|r| r.encode_to_vec().len());
        let all: usize = clusters
            .chain(endpoints)
            .chain(listeners)
            .chain(routes)
            .sum();
        std::hint::black_box(all)
    };
    let clusters = mean_ns(|| {
        let mut cfg = translate::ProxyConfig::default();
        translate::assemble::assemble_clusters(ctx, &proxy, &mut cfg);
        encoded(&cfg);
    });
    let all = mean_ns(|| {
        encoded(&translate::proxy_config(ctx, &proxy));
    });
    (clusters, all)
}

/// Istio's knative template has no `---` between the objects of consecutive loop turns,
/// so two objects share a document; Go's YAML decoder keeps the last of each duplicate key
/// (one object where two were meant), meshd's refuses the document. The two would build
/// from different objects.
const KNATIVE: &str = "knative-gateway";

/// The store of a rendered configuration, which meshd must accept whole.
fn store_of(name: &str, yaml: &str) -> Store {
    let parsed = parse_file(&format!("{name}.yaml"), yaml);
    let refused: Vec<String> = parsed.errors().map(|e| e.to_string()).collect();
    assert!(refused.is_empty(), "{name}: meshd refused {refused:?}");
    let mut store = Store::default();
    for o in parsed.objects {
        store.apply(o);
    }
    store
}

/// meshd's mean push-context build over at least a second, in nanoseconds.
fn meshd_figure(store: &Store) -> f64 {
    mean_ns(|| {
        std::hint::black_box(PushContext::build(store, "bench/1".into()));
    })
}

/// meshd's side alone, without Go's benchmarks, on each configuration named (comma
/// separated): five seconds of push-context builds, then five of the benchmark proxy's
/// whole generation, for a profiler (`perf record`) to sample.
fn profile(names: &str) {
    let repeat = |what: &str, f: &mut dyn FnMut()| {
        let (start, mut runs) = (Instant::now(), 0u32);
        while start.elapsed() < Duration::from_secs(5) {
            f();
            runs += 1;
        }
        println!("  {what}: {:?} each over {runs}", start.elapsed() / runs);
    };
    for (name, services, instances, router) in istio_configs::CASES {
        if !names.split(',').any(|n| n == *name) {
            continue;
        }
        println!("{name}:");
        let store = store_of(name, &istio_configs::render(name, *services, *instances));
        repeat("push-context build", &mut || {
            std::hint::black_box(PushContext::build(&store, "bench/1".into()));
        });
        let ctx = PushContext::build(&store, "bench/0".into());
        let proxy = benchmark_proxy(*router);
        repeat("generation", &mut || {
            std::hint::black_box(translate::proxy_config(&ctx, &proxy));
        });
    }
}

fn main() {
    meshd::heap::disable_huge_pages_unless_configured();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if let Ok(names) = std::env::var("MESHD_PROFILE_CONFIGS") {
        return profile(&names);
    }
    let istio = istio_figures(&root);
    let go = |bench: &str, name: &str| istio.get(&(bench.to_string(), name.to_string())).copied();
    let mut rows = Vec::new();
    println!(
        "| configuration | services | push context: istiod / meshd / ratio | CDS: istiod / meshd CDS+EDS / ratio | generated types: istiod (types) / meshd CDS+EDS+LDS+RDS / ratio |\n|---|---|---|---|---|"
    );
    for (name, services, instances, router) in istio_configs::CASES {
        if *name == KNATIVE {
            println!("| {name} | {services} | not compared: see `KNATIVE` | | |");
            continue;
        }
        let yaml = istio_configs::render(name, *services, *instances);
        let store = store_of(name, &yaml);
        let ours = meshd_figure(&store);
        let theirs = go("InitPushContext", name).unwrap_or_else(|| {
            panic!("no BenchmarkInitPushContext/{name} in Go's output: {istio:?}")
        });
        let ctx = PushContext::build(&store, "bench/0".into());
        let (our_clusters, our_all) = meshd_generation(&ctx, *router);
        // The types Istio's benchmarks generate for this case (some cases skip some).
        let types: Vec<(&str, f64)> = [
            ("CDS", "ClusterGeneration"),
            ("LDS", "ListenerGeneration"),
            ("RDS", "RouteGeneration"),
        ]
        .into_iter()
        .filter_map(|(t, bench)| Some((t, go(bench, name)?)))
        .collect();
        let their_total: f64 = types.iter().map(|(_, ns)| ns).sum();
        let their_clusters = go("ClusterGeneration", name);
        let us = |ns: f64| format!("{:.1} µs", ns / 1e3);
        println!(
            "| {name} | {services} | {} / {} / {:.1}× | {} | {} ({}) / {} / {:.1}× |",
            us(theirs),
            us(ours),
            theirs / ours,
            their_clusters.map_or("not generated by Istio's benchmark".into(), |c| format!(
                "{} / {} / {:.1}×",
                us(c),
                us(our_clusters),
                c / our_clusters
            )),
            us(their_total),
            types.iter().map(|(t, _)| *t).collect::<Vec<_>>().join("+"),
            us(our_all),
            their_total / our_all,
        );
        rows.push(serde_json::json!({
            "name": name, "services": services, "instances": instances,
            "istiod_ns": theirs, "meshd_ns": ours, "ratio": theirs / ours,
            "generation": {
                "istiod_types": types.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
                "istiod_ns": types.iter().map(|(t, ns)| (t.to_string(), *ns)).collect::<BTreeMap<_, _>>(),
                "istiod_total_ns": their_total,
                "meshd_clusters_ns": our_clusters,
                "meshd_all_ns": our_all,
                "clusters_ratio": their_clusters.map(|c| c / our_clusters),
                "total_ratio": their_total / our_all,
            },
        }));
    }
    let geomean = |key: &dyn Fn(&serde_json::Value) -> Option<f64>| {
        let ratios: Vec<f64> = rows.iter().filter_map(key).collect();
        (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp()
    };
    let build = geomean(&|r| r["ratio"].as_f64());
    let clusters = geomean(&|r| r["generation"]["clusters_ratio"].as_f64());
    let total = geomean(&|r| r["generation"]["total_ratio"].as_f64());
    println!(
        "geometric means: push context {build:.1}×, CDS {clusters:.1}×, generation {total:.1}×"
    );
    let summary = serde_json::json!({
        "cases": rows,
        "geomean_ratio": build,
        "generation_geomean_clusters": clusters,
        "generation_geomean_total": total,
    });
    std::fs::write(
        root.join("target/istio-configs.json"),
        format!("{summary:#}\n"),
    )
    .unwrap();
}
