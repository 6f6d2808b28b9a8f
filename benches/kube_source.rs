//! The fleet simulator with the mesh served from the test bed's real kube-apiserver and
//! etcd (started here as the e2e tests start them): `meshd loadgen --kubernetes` writes the
//! mesh and every change through the API, the meshd it spawns watches them there. Adds to
//! the simulator's JSON summary what kube-apiserver and etcd used meanwhile (CPU seconds,
//! peak RSS), sampled from /proc.
//!
//! `cargo bench --features loadgen --bench kube_source -- LOADGEN_ARGS` (`just bench-kubernetes`).

#![allow(dead_code)]

#[path = "../tests/e2e/cluster.rs"]
mod cluster;
#[path = "../tests/e2e/harness.rs"]
mod harness;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// CPU seconds (user + system) and RSS bytes of a process, from /proc.
fn usage(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): utime is the 14th field.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().ok()? + fields[12].parse::<f64>().ok()?;
    // SAFETY: sysconf only reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches(" kB")
        .parse()
        .ok()?;
    Some((ticks / hz, rss_kb * 1024))
}

/// Samples `pid` every 250 ms until `stop`: (CPU seconds used meanwhile, peak RSS).
fn sample(pid: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(f64, u64)> {
    std::thread::spawn(move || {
        let (cpu0, mut peak) = usage(pid).unwrap_or_default();
        let mut cpu = cpu0;
        while !stop.load(Ordering::Relaxed) {
            if let Some((c, rss)) = usage(pid) {
                cpu = c;
                peak = peak.max(rss);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        (cpu - cpu0, peak)
    })
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let json = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from);
    let cluster = cluster::Cluster::start("bench-kubernetes", &[]);
    let (apiserver, etcd) = cluster.pids();
    let stop = Arc::new(AtomicBool::new(false));
    let samplers = [sample(apiserver, stop.clone()), sample(etcd, stop.clone())];
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new(env!("CARGO_BIN_EXE_meshd"))
        .args(["loadgen", "--spawn-meshd", "--kubernetes", "--kubeconfig"])
        .arg(&cluster.kubeconfig)
        .arg("--config-dir")
        .arg(root.join("target/loadgen/kube-config"))
        .args(&args)
        .status()
        .expect("running meshd loadgen");
    stop.store(true, Ordering::Relaxed);
    let [(api_cpu, api_rss), (etcd_cpu, etcd_rss)] = samplers.map(|s| s.join().unwrap());
    assert!(status.success(), "meshd loadgen failed: {status}");
    let peers = serde_json::json!({
        "kube_apiserver": {"cpu_seconds": api_cpu, "rss_peak_bytes": api_rss},
        "etcd": {"cpu_seconds": etcd_cpu, "rss_peak_bytes": etcd_rss},
    });
    eprintln!("test bed during the run: {peers}");
    if let Some(path) = json {
        let text = std::fs::read_to_string(&path).expect("loadgen's --json summary");
        let mut summary: serde_json::Value = serde_json::from_str(&text).unwrap();
        summary["api_server"] = peers;
        std::fs::write(&path, serde_json::to_string_pretty(&summary).unwrap()).unwrap();
    }
}
