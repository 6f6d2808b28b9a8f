//! meshd and Istio's real istiod side by side under the same simulated fleet, in one
//! sitting: the test bed's kube-apiserver and etcd (started as the e2e tests start them)
//! hold the generated mesh, `meshd loadgen --kubernetes` writes it and each change there,
//! and runs the same fleet first against a meshd it spawns, then against istiod
//! (`pilot-discovery`, built by `tools/build.sh istio`) watching the same API server.
//! Prints, and writes to `target/loadgen/istiod-compare.json`, both summaries and the
//! ratios in meshd's favour.
//!
//! `cargo bench --features loadgen --bench istiod -- LOADGEN_ARGS` (`just bench-istiod`).
//! `ISTIOD_ENV="NAME=VALUE ..."` gives istiod more environment (its tuning variables,
//! e.g. `PILOT_MAX_REQUESTS_PER_SECOND`); without it istiod runs as installed.

#![allow(dead_code)]

#[path = "../tests/e2e/cluster.rs"]
mod cluster;
#[path = "../tests/e2e/harness.rs"]
mod harness;
#[path = "../tests/e2e/istiod.rs"]
mod istiod;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

/// One `meshd loadgen` run with `args` (plus `extra`), its JSON summary.
fn loadgen(kubeconfig: &Path, dir: &Path, args: &[String], extra: &[String]) -> Value {
    let json = dir.with_extension("json");
    let status = Command::new(env!("CARGO_BIN_EXE_meshd"))
        .args(["loadgen", "--kubernetes", "--kubeconfig"])
        .arg(kubeconfig)
        .arg("--config-dir")
        .arg(dir)
        .arg("--json")
        .arg(&json)
        .args(args)
        .args(extra)
        .status()
        .expect("running meshd loadgen");
    assert!(status.success(), "meshd loadgen {extra:?} failed: {status}");
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

/// `istiod / meshd` of the figure at `path` in each summary (or `meshd / istiod` when
/// more is better), if both have it.
fn ratio(istiod: &Value, meshd: &Value, path: &[&str], more_is_better: bool) -> Value {
    let at = |v: &Value| path.iter().fold(v, |v, k| &v[*k]).as_f64();
    match (at(istiod), at(meshd)) {
        (Some(i), Some(m)) if i > 0.0 && m > 0.0 => {
            json!({"istiod": i, "meshd": m, "ratio": if more_is_better { m / i } else { i / m }})
        }
        _ => Value::Null,
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = root.join("target/loadgen/istiod-compare");
    std::fs::create_dir_all(&out).unwrap();
    let cluster = cluster::Cluster::start("bench-istiod", &[]);
    // meshd first: it writes the mesh and its own root to `istio-ca-secret`, which istiod
    // reads (meshd refuses the RSA root istiod would write).
    let meshd = loadgen(
        &cluster.kubeconfig,
        &out.join("meshd"),
        &args,
        &["--spawn-meshd".into()],
    );
    let istiod_env = std::env::var("ISTIOD_ENV").unwrap_or_default();
    let istiod_env: Vec<(&str, &str)> = (istiod_env.split_whitespace())
        .map(|kv| {
            kv.split_once('=')
                .unwrap_or_else(|| panic!("ISTIOD_ENV: {kv:?} is not NAME=VALUE"))
        })
        .collect();
    let istiod = istiod::Istiod::start_with_env(
        &cluster,
        "istio-system",
        &out.join("istiod"),
        &[],
        &istiod_env,
    );
    let against_istiod = [
        "--xds".to_string(),
        format!("127.0.0.1:{}", istiod.xds_port),
        "--monitoring".to_string(),
        format!("127.0.0.1:{}", istiod.monitoring_port),
    ];
    let istiod_run = loadgen(
        &cluster.kubeconfig,
        &out.join("istiod-fleet"),
        &args,
        &against_istiod,
    );
    // The summary calls the server `meshd` whichever it was.
    let ratios = json!({
        "memory_per_added_proxy": ratio(&istiod_run, &meshd, &["meshd", "rss_per_added_proxy_bytes"], false),
        "memory_per_proxy": ratio(&istiod_run, &meshd, &["meshd", "rss_per_proxy_bytes"], false),
        "cpu_per_proxy_per_push": ratio(&istiod_run, &meshd, &["meshd", "cpu_us_per_proxy_per_push"], false),
        "convergence_p50": ratio(&istiod_run, &meshd, &["convergence_ms", "p50"], false),
        "convergence_p99": ratio(&istiod_run, &meshd, &["convergence_ms", "p99"], false),
        "connect_rate": ratio(&istiod_run, &meshd, &["connect", "initialised_per_second"], true),
        // With --storm-rate: the change storm.
        "storm_final_config_p99": ratio(&istiod_run, &meshd, &["storm", "final_config_after_last_write_ms", "p99"], false),
        "storm_all_converged": ratio(&istiod_run, &meshd, &["storm", "all_converged_after_last_write_ms"], false),
        "storm_rss_peak": ratio(&istiod_run, &meshd, &["storm", "rss_peak_bytes"], false),
        "storm_cpu": ratio(&istiod_run, &meshd, &["meshd", "cpu_seconds_storm"], false),
    });
    let summary = json!({"args": args, "istiod_env": std::env::var("ISTIOD_ENV").unwrap_or_default(), "meshd": meshd, "istiod": istiod_run, "ratios": ratios});
    std::fs::write(
        root.join("target/loadgen/istiod-compare.json"),
        format!("{summary:#}\n"),
    )
    .unwrap();
    println!("{:#}", summary["ratios"]);
}
