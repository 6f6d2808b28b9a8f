//! Prometheus metrics with Istio's names, types, labels and buckets, and their exposition
//! in the Prometheus text format istiod uses (counters without a `_total` suffix, so
//! existing dashboards' queries such as `pilot_xds_pushes` keep working).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use xds::metrics::{Labels, type_label, unix_seconds};

use crate::ca::metrics::CaMetrics;
use crate::jwks::JwksMetrics;
use crate::k8s::SourceMetrics;
use crate::webhook::ValidationMetrics;
use xds::metrics::{PushMetrics, XdsMetrics};

/// Every module's metrics, each set registered on one registry by its own module, and
/// what the process itself counts.
pub struct Metrics {
    pub registry: Registry,
    pub xds: XdsMetrics,
    pub push: PushMetrics,
    pub ca: CaMetrics,
    pub sources: SourceMetrics,
    pub validation: ValidationMetrics,
    /// Sidecar injection requests and outcomes (istiod's `sidecar_injection_*`).
    pub inject: crate::inject::webhook::InjectMetrics,
    pub jwks: JwksMetrics,
    /// Configuration documents rejected, by kind, from any source.
    pub config_errors: Family<Labels, Counter>,
    /// TLS handshakes that failed or timed out, by `port` and `reason`.
    pub tls_handshake_errors: Family<Labels, Counter>,
    /// Panics: configuration meshd failed to build or encode for a proxy (none expected).
    pub internal_errors: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let r = &mut registry;
        let validation = ValidationMetrics::register(r);
        let inject = crate::inject::webhook::InjectMetrics::register(r);
        let xds = XdsMetrics::register(r);
        let push = PushMetrics::register(r);
        let sources = SourceMetrics::register(r);
        let ca = CaMetrics::register(r);
        let jwks = JwksMetrics::register(r);
        let config_errors = Family::default();
        r.register(
            "meshd_config_errors",
            "Configuration documents rejected, by kind",
            config_errors.clone(),
        );
        let tls_handshake_errors = Family::default();
        r.register(
            "meshd_tls_handshake_errors",
            "TLS handshakes on the secure and webhook ports that failed or timed out, by port and reason",
            tls_handshake_errors.clone(),
        );
        let internal_errors = Counter::default();
        r.register(
            "pilot_total_xds_internal_errors",
            "Total number of internal XDS errors in pilot",
            internal_errors.clone(),
        );
        let build: Family<Labels, Gauge> = Family::default();
        build
            .get_or_create(&vec![
                ("component", "pilot".to_string()),
                ("tag", env!("CARGO_PKG_VERSION").to_string()),
            ])
            .set(1);
        r.register("istio_build", "Istio component build info", build);
        Metrics {
            registry,
            xds,
            inject,
            push,
            ca,
            sources,
            validation,
            jwks,
            config_errors,
            tls_handshake_errors,
            internal_errors,
        }
    }

    /// The registry in Prometheus text format (version 0.0.4), as istiod serves it, then
    /// the process's own figures (read at scrape time).
    pub fn render(&self) -> String {
        self.ca.refresh();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("BUG: encoding to a String cannot fail");
        let mut out = to_prometheus_text(&text);
        out.push_str(&process_text());
        out
    }
}

/// Counts every panic in meshd in `counter` (`pilot_total_xds_internal_errors`), then
/// reports it as before. A panic is a bug: in a stream's task (building or sending a
/// proxy's configuration) tokio ends that task alone, its sender goes with it, and the
/// proxy sees its stream end and reconnects, while every other stream carries on. A
/// process-wide hook rather than a wrapper around each stream's task, which made every
/// connected proxy's task larger.
pub fn count_panics(counter: Counter) {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        counter.inc();
        report(info);
    }));
}

/// What `process_*` (as Prometheus client libraries export them) and the tokio runtime say
/// now: CPU, resident memory, threads, open files, and live tasks (the Rust counterpart of
/// `go_goroutines`: a count that grows without bound is a task leak).
pub fn process_text() -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
        );
    };
    let process = ProcessStats::read();
    if let Some(cpu) = process.cpu_seconds {
        metric(
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            cpu,
        );
    }
    if let Some(rss) = process.resident_bytes {
        metric(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            rss as f64,
        );
    }
    if let Some(threads) = process.threads {
        metric(
            "process_threads",
            "gauge",
            "Number of OS threads in the process.",
            threads as f64,
        );
    }
    if let Some(fds) = process.open_fds {
        metric(
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            fds as f64,
        );
    }
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        let runtime = handle.metrics();
        metric(
            "meshd_tokio_tasks",
            "gauge",
            "Tasks alive in the tokio runtime (go_goroutines for a Rust control plane).",
            runtime.num_alive_tasks() as f64,
        );
        metric(
            "meshd_tokio_workers",
            "gauge",
            "Worker threads of the tokio runtime.",
            runtime.num_workers() as f64,
        );
    }
    out
}

/// The process's resource use, from `/proc/self` (Linux; `None` elsewhere).
#[derive(Debug, Default)]
pub struct ProcessStats {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<u64>,
    pub threads: Option<u64>,
    pub open_fds: Option<u64>,
}

const VM_RSS: &str = "VmRSS:";

/// A numeric field of a `/proc/PID` file of `Name: value` lines (`status`, memory in kB;
/// `io`).
fn status_field(status: &str, name: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// One numeric field (`name` with its colon, e.g. `THP_enabled:`) of a process's
/// `/proc/PID/FILE` (`status`, `io`); `pid` is a number or `self`.
pub fn proc_number(pid: &str, file: &str, name: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
    status_field(&text, name)
}

/// A process's resident memory alone: cheaper than [`ProcessStats::of`], which also
/// lists the process's open files.
pub fn resident_bytes(pid: &str) -> Option<u64> {
    proc_number(pid, "status", VM_RSS).map(|kb| kb * 1024)
}

impl ProcessStats {
    pub fn read() -> ProcessStats {
        Self::of("self")
    }

    /// `pid` is a number or `self`.
    pub fn of(pid: &str) -> ProcessStats {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| status_field(&status, name);
        // utime and stime are fields 14 and 15 of /proc/PID/stat, counted after the
        // parenthesised command name (which may hold spaces), in clock ticks (USER_HZ,
        // 100 on every Linux architecture meshd runs on).
        let cpu_seconds = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                let rest = &stat[stat.rfind(')')? + 2..];
                let fields: Vec<&str> = rest.split_whitespace().collect();
                let utime: f64 = fields.get(11)?.parse().ok()?;
                let stime: f64 = fields.get(12)?.parse().ok()?;
                Some((utime + stime) / 100.0)
            });
        ProcessStats {
            cpu_seconds,
            resident_bytes: field(VM_RSS).map(|kb| kb * 1024),
            threads: field("Threads:"),
            open_fds: std::fs::read_dir(format!("/proc/{pid}/fd"))
                .ok()
                .map(|d| d.count() as u64),
        }
    }
}

/// OpenMetrics → Prometheus 0.0.4 text: counters lose the `_total` sample suffix that
/// OpenMetrics requires (istiod exports `pilot_xds_pushes`, not `pilot_xds_pushes_total`),
/// and the `# EOF` / `# UNIT` lines go.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        match name.strip_suffix("_total") {
            Some(base) if !line.starts_with('#') && counters.contains(base) => {
                out.push_str(base);
                out.push_str(&line[name_end..]);
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_panic_is_counted_and_still_reported() {
        let counter = Counter::default();
        count_panics(counter.clone());
        let before = counter.get();
        let outcome = std::thread::spawn(|| panic!("a bug")).join();
        assert!(outcome.is_err());
        // Other tests of this binary may panic meanwhile only if they fail.
        assert!(counter.get() > before);
    }

    #[test]
    fn counters_are_exposed_under_istios_names_without_total() {
        let m = Metrics::new();
        m.xds.pushes.get_or_create(&type_label("cds")).inc();
        m.xds.convergence_time.observe(0.2);
        let text = m.render();
        assert!(
            text.contains("pilot_xds_pushes{type=\"cds\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE pilot_xds_pushes counter"), "{text}");
        assert!(
            text.contains("pilot_proxy_convergence_time_bucket{le=\"0.5\"} 1"),
            "{text}"
        );
        assert!(!text.contains("# EOF"));
    }

    #[test]
    fn process_figures_follow_what_the_process_does() {
        let before = ProcessStats::read();
        let rss = before.resident_bytes.expect("VmRSS from /proc/self/status");
        assert!(before.threads.unwrap() >= 1 && before.open_fds.unwrap() >= 3);
        // Touch 128 MiB: resident memory must grow by most of it.
        let block = std::hint::black_box(vec![1u8; 128 << 20]);
        let after = ProcessStats::read().resident_bytes.unwrap();
        assert!(after >= rss + (96 << 20), "{rss} -> {after}");
        // The cheaper reading sees the same memory.
        let alone = resident_bytes(&std::process::id().to_string()).unwrap();
        assert!(alone >= rss + (96 << 20), "{rss} -> {alone}");
        drop(block);
        // Burn some CPU: the counter moves.
        let cpu = before.cpu_seconds.unwrap();
        let mut x = 0u64;
        while ProcessStats::read().cpu_seconds.unwrap() < cpu + 0.05 {
            for i in 0..1_000_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            std::hint::black_box(x);
        }
        let text = process_text();
        assert!(
            text.contains(
                "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes "
            ),
            "{text}"
        );
    }
}
