//! meshd's push-context build on Istio's own xDS benchmark configurations, next to
//! Istio's Go benchmark of the same (`BenchmarkInitPushContext` in `pilot/pkg/xds`, run
//! with `go test -bench` in the module `tools/istio/go.mod` pins), in one sitting: the same
//! files (`testdata/benchmarks/*.yaml`, read from the module cache), rendered by the real
//! helm with the services and instances `bench_test.go` gives each. Go's figure also
//! covers setting the benchmark proxy's Sidecar scope and gateways, which meshd does when
//! it first generates for a proxy; meshd's is `PushContext::build` alone.
//!
//! Prints a table, writes `target/istio-configs.json`.
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
use model::{PushContext, Store};

/// The allocator the `meshd` binary ships with, so the figures are what it does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Istio's `BenchmarkInitPushContext`: case name → nanoseconds per build.
fn istio_figures(root: &std::path::Path) -> BTreeMap<String, f64> {
    let out = Command::new("go")
        .args(["test", "-count=1", "-run", "^$", "-benchtime", "1s"])
        .args(["-bench", "^BenchmarkInitPushContext$"])
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
            let name = fields.next()?.strip_prefix("BenchmarkInitPushContext/")?;
            // `NAME-GOMAXPROCS`, then iterations, then the time.
            let name = name.rsplit_once('-').map_or(name, |(n, _)| n);
            let ns: f64 = fields.nth(1)?.parse().ok()?;
            Some((name.to_string(), ns))
        })
        .collect()
}

/// Istio's knative template has no `---` between the objects of consecutive loop turns,
/// so two objects share a document; Go's YAML decoder keeps the last of each duplicate key
/// (one object where two were meant), meshd's refuses the document. The two would build
/// from different objects.
const KNATIVE: &str = "knative-gateway";

/// meshd's mean push-context build over at least a second, in nanoseconds.
fn meshd_figure(name: &str, yaml: &str) -> f64 {
    let parsed = parse_file(&format!("{name}.yaml"), yaml);
    let refused: Vec<String> = parsed.errors().map(|e| e.to_string()).collect();
    assert!(refused.is_empty(), "{name}: meshd refused {refused:?}");
    let mut store = Store::default();
    for o in parsed.objects {
        store.apply(o);
    }
    std::hint::black_box(PushContext::build(&store, "bench/0".into()));
    let (start, mut runs) = (Instant::now(), 0u32);
    while runs < 3 || start.elapsed() < Duration::from_secs(1) {
        std::hint::black_box(PushContext::build(&store, "bench/1".into()));
        runs += 1;
    }
    start.elapsed().as_nanos() as f64 / runs as f64
}

fn main() {
    meshd::heap::disable_huge_pages_unless_configured();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let istio = istio_figures(&root);
    let mut rows = Vec::new();
    println!(
        "| configuration | services | istiod | meshd | istiod ÷ meshd |\n|---|---|---|---|---|"
    );
    for (name, services, instances, _) in istio_configs::CASES {
        if *name == KNATIVE {
            println!("| {name} | {services} | not compared: see `KNATIVE` | | |");
            continue;
        }
        let yaml = istio_configs::render(name, *services, *instances);
        let ours = meshd_figure(name, &yaml);
        let Some(theirs) = istio.get(*name).copied() else {
            panic!("no BenchmarkInitPushContext/{name} in Go's output: {istio:?}");
        };
        println!(
            "| {name} | {services} | {:.1} µs | {:.1} µs | {:.1}× |",
            theirs / 1e3,
            ours / 1e3,
            theirs / ours
        );
        rows.push(
            serde_json::json!({"name": name, "services": services, "instances": instances,
            "istiod_ns": theirs, "meshd_ns": ours, "ratio": theirs / ours}),
        );
    }
    let ratios: Vec<f64> = rows.iter().map(|r| r["ratio"].as_f64().unwrap()).collect();
    let geomean = (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp();
    println!("geometric mean of the ratios: {geomean:.1}×");
    let summary = serde_json::json!({"cases": rows, "geomean_ratio": geomean});
    std::fs::write(
        root.join("target/istio-configs.json"),
        format!("{summary:#}\n"),
    )
    .unwrap();
}
