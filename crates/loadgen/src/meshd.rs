//! The meshd a run measures: started by the run (`--spawn-meshd`) on free local ports
//! and restarted on the same ones, and read through its monitoring port (`/metrics`,
//! `/debug/syncz`) or, for its memory, `/proc`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value as Json;
use testkit::ports::free_port;

use super::{LoadgenArgs, Source};

/// meshd's figures from its `/metrics`.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub(super) struct MeshdFigures {
    pub(super) rss_bytes: f64,
    pub(super) cpu_seconds: f64,
    /// Delta pushes found by view difference and by comparing every name.
    pub(super) view_diffs: f64,
    pub(super) full_diffs: f64,
    /// Encoded runs meshd keeps to share between responses (`crates/xds/src/joined.rs`).
    pub(super) shared_run_bytes: f64,
    /// DNS name tables (NDS responses) sent.
    pub(super) name_tables: f64,
}

pub(super) fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The sum of the metric `name` over its label sets (istiod's exporter adds labels of
/// its own where meshd has none).
pub(super) fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once("} ")?.1,
                None => rest.strip_prefix(' ')?,
            };
            value.trim().parse::<f64>().ok()
        })
        .sum()
}

pub(super) fn meshd_figures(monitoring: &str) -> MeshdFigures {
    match crate::process::http_get(monitoring, "/metrics") {
        Ok(text) => MeshdFigures {
            rss_bytes: metric(&text, "process_resident_memory_bytes"),
            cpu_seconds: metric(&text, "process_cpu_seconds_total"),
            view_diffs: metric(&text, "meshd_xds_push_diffs{method=\"view\"}"),
            full_diffs: metric(&text, "meshd_xds_push_diffs{method=\"full\"}"),
            shared_run_bytes: metric(&text, "meshd_xds_shared_run_bytes"),
            name_tables: metric(&text, "pilot_xds_pushes{type=\"nds\"}"),
        },
        Err(_) => MeshdFigures::default(),
    }
}

/// How meshd's RSS is sampled while a run waits: from `/proc` for a meshd this run
/// started, so that frequent samples do not make meshd render its metrics (rendering them
/// lists every open socket, 8% of meshd's CPU at 10,000 proxies sampled four times a
/// second); else from its `/metrics`.
#[derive(Clone)]
pub(super) struct Probe {
    pub(super) monitoring: String,
    pub(super) pid: Option<u32>,
}

impl Probe {
    pub(super) async fn rss(&self) -> f64 {
        let proc = self.pid.map(|pid| pid.to_string());
        if let Some(bytes) = proc.as_deref().and_then(crate::process::resident_bytes) {
            return bytes as f64;
        }
        let m = self.monitoring.clone();
        tokio::task::spawn_blocking(move || meshd_figures(&m).rss_bytes)
            .await
            .unwrap_or_default()
    }

    /// Waits, at most `limit`, until meshd's RSS stops falling (two samples in a row,
    /// 250 ms apart, within 1% of the one before), and returns how it went: the RSS
    /// first and last sampled, and the seconds waited. Memory freed after a connect storm
    /// leaves RSS only as the heap hands it back.
    pub(super) async fn settle(&self, limit: Duration) -> (f64, f64, f64) {
        let started = Instant::now();
        let first = self.rss().await;
        let (mut last, mut steady) = (first, 0);
        while steady < 2 && started.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = self.rss().await;
            steady = if now >= last * 0.99 { steady + 1 } else { 0 };
            last = now;
        }
        (first, last, started.elapsed().as_secs_f64())
    }
}

/// A meshd this run started, on fixed ports; killed on drop.
pub(super) struct Spawned {
    pub(super) child: Child,
    /// xDS, secure xDS and monitoring ports.
    ports: [u16; 3],
    config_dir: PathBuf,
    /// Set when meshd watches the Kubernetes fake rather than the config directory.
    kubeconfig: Option<PathBuf>,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts meshd (this binary) on the source and free local ports (below the ephemeral
/// range, so that the restart finds them free), and points `args` at it (at its secure
/// port with --secure).
pub(super) fn spawn_meshd(args: &mut LoadgenArgs, source: &Source) -> Result<Spawned, String> {
    let ports = [free_port(), free_port(), free_port()];
    args.xds = format!("127.0.0.1:{}", ports[if args.secure { 1 } else { 0 }]);
    args.monitoring = format!("127.0.0.1:{}", ports[2]);
    let kubeconfig = source.kubeconfig().map(PathBuf::from);
    Spawned::start(args.config_dir.clone(), kubeconfig, ports)
}

impl Spawned {
    fn start(
        config_dir: PathBuf,
        kubeconfig: Option<PathBuf>,
        ports: [u16; 3],
    ) -> Result<Spawned, String> {
        // Another build of meshd, to compare servers under the same simulator.
        let exe = match std::env::var_os("MESHD_LOADGEN_SERVER") {
            Some(path) => PathBuf::from(path),
            None => std::env::current_exe().map_err(|e| e.to_string())?,
        };
        let log = config_dir.with_extension("meshd.log");
        let [xds, secure, monitoring] = ports;
        let mut command = Command::new(exe);
        command.arg("serve");
        match &kubeconfig {
            Some(kubeconfig) => command.env("KUBECONFIG", kubeconfig),
            None => command.arg("--config-dir").arg(&config_dir),
        };
        let child = command
            .args(["--xds-address", &format!("127.0.0.1:{xds}")])
            .args(["--secure-xds-address", &format!("127.0.0.1:{secure}")])
            .args(["--webhook-address", "none"])
            .args(["--monitoring-address", &format!("127.0.0.1:{monitoring}")])
            .arg("--ca-dir")
            .arg(config_dir.with_extension("ca"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).map_err(|e| e.to_string())?)
            .spawn()
            .map_err(|e| format!("starting meshd: {e}"))?;
        let mut spawned = Spawned {
            child,
            ports,
            config_dir,
            kubeconfig,
        };
        let monitoring = format!("127.0.0.1:{monitoring}");
        let deadline = Instant::now() + Duration::from_secs(120);
        while crate::process::http_get(&monitoring, "/ready").is_err() {
            let exited = spawned.child.try_wait().map_err(|e| e.to_string())?;
            if exited.is_some() || Instant::now() > deadline {
                let said = std::fs::read_to_string(&log).unwrap_or_default();
                let lines: Vec<&str> = said.lines().collect();
                let tail = lines[lines.len().saturating_sub(20)..].join("\n");
                let state = match exited {
                    Some(status) => format!("meshd exited ({status}) before it was ready"),
                    None => "meshd not ready in 120s".to_string(),
                };
                return Err(format!("{state}; the end of {}:\n{tail}", log.display()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(spawned)
    }

    /// Where its CA keeps its root and key.
    pub(super) fn ca_dir(&self) -> PathBuf {
        self.config_dir.with_extension("ca")
    }

    /// Kills meshd and starts it again on the same ports; returns when it is ready.
    pub(super) fn restarted(mut self) -> Result<Spawned, String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        Spawned::start(self.config_dir.clone(), self.kubeconfig.take(), self.ports)
    }
}

/// Connections whose last response of some type is not ACKed, from `/debug/syncz`.
pub(super) fn out_of_sync(monitoring: &str) -> Result<usize, String> {
    let text = crate::process::http_get(monitoring, "/debug/syncz")?;
    let all: Vec<Json> = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    Ok(all.iter().filter(|c| unacked(c)).count())
}

/// Whether one `/debug/syncz` entry shows a response not ACKed: by istiod's fields
/// (`cluster_sent`, `cluster_acked`, ...), which meshd shows too, or by meshd's per type
/// (every type, VHDS and NDS included).
fn unacked(c: &Json) -> bool {
    let istiod_fields = ["cluster", "listener", "route", "endpoint"]
        .iter()
        .any(|t| {
            let sent = &c[format!("{t}_sent")];
            sent.is_string() && *sent != c[format!("{t}_acked")]
        });
    let meshd_types = c["types"]
        .as_object()
        .is_some_and(|types| types.values().any(|t| t["nonce_sent"] != t["nonce_acked"]));
    istiod_fields || meshd_types
}

/// Connected proxies meshd holds a proven identity for (their connection's client
/// certificate, on the secure port), from `/debug/workloadz`.
pub(super) fn with_identity(monitoring: &str) -> Result<usize, String> {
    let text = crate::process::http_get(monitoring, "/debug/workloadz")?;
    let all: Vec<Json> = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    Ok(all.iter().filter(|w| w["identity"].is_string()).count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_is_summed_over_its_label_sets_and_only_its_own_name_counts() {
        let text = "# HELP pilot_debounce_time x\n\
                    pilot_debounce_time_count{otel_scope_name=\"istio\"} 3\n\
                    pilot_debounce_time_count{otel_scope_name=\"other\"} 4\n\
                    pilot_debounce_time_count_extra 100\n\
                    pilot_debounce_time_sum 9\n";
        assert_eq!(metric_sum(text, "pilot_debounce_time_count"), 7.0);
        assert_eq!(
            metric_sum("pilot_debounce_time_count 5\n", "pilot_debounce_time_count"),
            5.0
        );
    }

    #[test]
    fn istiods_syncz_fields_and_meshds_types_both_show_a_connection_out_of_sync() {
        let all: Vec<Json> = serde_json::from_str(
            r#"[{"proxy": "a", "cluster_sent": "1", "cluster_acked": "1", "route_sent": "2", "route_acked": "1"},
                {"proxy": "b", "cluster_sent": "1", "cluster_acked": "1"},
                {"proxy": "c", "types": {"vhds": {"nonce_sent": "5", "nonce_acked": "4"}}},
                {"proxy": "d", "types": {"cds": {"nonce_sent": "5", "nonce_acked": "5"}}, "cluster_sent": "5", "cluster_acked": "5"},
                {"proxy": "e", "endpoint_sent": "7"}]"#,
        )
        .unwrap();
        let out: Vec<&str> = all
            .iter()
            .filter(|c| unacked(c))
            .map(|c| c["proxy"].as_str().unwrap())
            .collect();
        assert_eq!(out, ["a", "c", "e"]);
    }
}
