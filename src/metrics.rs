//! Prometheus metrics with Istio's names, types, labels and buckets, and their exposition
//! in the Prometheus text format istiod uses (counters without a `_total` suffix, so
//! existing dashboards' queries such as `pilot_xds_pushes` keep working).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub type Labels = Vec<(&'static str, String)>;

const PUSH_BUCKETS: &[f64] = &[0.01, 0.1, 0.5, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0];
fn push_histogram() -> Histogram {
    Histogram::new(PUSH_BUCKETS.iter().copied())
}

const CONVERGENCE_BUCKETS: &[f64] = &[0.1, 0.5, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0];
const SEND_BUCKETS: &[f64] = &[0.01, 0.1, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0];
const INIT_BUCKETS: &[f64] = &[0.01, 0.1, 0.5, 1.0, 3.0, 5.0];
const DESTROY_BUCKETS: &[f64] = &[0.0001, 0.001, 0.01, 0.1, 1.0, 10.0];
const CONFIG_SIZE_BUCKETS: &[f64] = &[
    1.0,
    10_000.0,
    1_000_000.0,
    4_000_000.0,
    10_000_000.0,
    40_000_000.0,
];
fn config_size_histogram() -> Histogram {
    Histogram::new(CONFIG_SIZE_BUCKETS.iter().copied())
}

pub struct Metrics {
    pub registry: Registry,
    pub xds_pushes: Family<Labels, Counter>,
    pub total_xds_rejects: Family<Labels, Counter>,
    /// Pushes that failed at the proxy, by type: rejected (NACKed) or not taken in time.
    pub xds_push_errors: Family<Labels, Counter>,
    pub xds_expired_nonce: Family<Labels, Counter>,
    pub xds_clients: Gauge,
    pub xds_by_version: Family<Labels, Gauge>,
    pub proxy_convergence_time: Histogram,
    pub debounce_time: Histogram,
    pub xds_push_time: Family<Labels, Histogram, fn() -> Histogram>,
    /// Bytes of the resources in each response, by type URL.
    pub xds_config_size: Family<Labels, Histogram, fn() -> Histogram>,
    pub proxy_queue_time: Histogram,
    pub push_context_recompute: Counter,
    pub push_triggers: Family<Labels, Counter>,
    pub services: Gauge,
    pub virt_services: Gauge,
    pub config_errors: Family<Labels, Counter>,
    /// Watch events from Kubernetes by `type` and `event`: Istio config, and the registry.
    pub k8s_cfg_events: Family<Labels, Counter>,
    pub k8s_reg_events: Family<Labels, Counter>,
    /// 1 for each Istio kind whose CRD the cluster lacks (served as empty until installed).
    pub k8s_crd_missing: Family<Labels, Gauge>,
    /// Configuration meshd failed to build or encode for a proxy (none expected).
    pub xds_internal_errors: Counter,
    pub xds_connection_errors: Family<Labels, Counter>,
    /// TLS handshakes that failed or timed out, by `port` and `reason`.
    pub tls_handshake_errors: Family<Labels, Counter>,
    /// HTTP/2 connections that reached `ISTIO_GPRC_MAXSTREAMS` open streams.
    pub xds_streams_at_limit: Counter,
    pub csr_count: Counter,
    pub cert_issued: Counter,
    pub ca_auth_failures: Counter,
    pub ca_errors: Family<Labels, Counter>,
    /// Refusals for a CSR that does not parse or verify (istiod's parsing errors).
    pub csr_parsing_errors: Counter,
    /// Signing failures, by `error` (meshd's reason).
    pub csr_sign_errors: Family<Labels, Counter>,
    /// When the current root and the signing certificate expire, Unix seconds (0: no CA).
    pub root_cert_expiry: Gauge,
    pub cert_chain_expiry: Gauge,
    /// Seconds until the root expires, as of the last scrape.
    pub root_cert_expiry_seconds: Gauge,
    pub xds_send_time: Histogram,
    pub pushcontext_init: Histogram,
    pub destroy_time: Histogram,
    pub endpoint_no_pod: Gauge,
    /// Clusters with no endpoint in the current push.
    pub eds_no_instances: Gauge,
    /// Hosts whose merged DestinationRules name a subset twice, in the current push.
    pub destrule_subsets: Gauge,
    /// Pushes whose default tracing provider's service was not found, by provider type
    /// (istiod's `provider_lookup_cluster_failures`, which it counts per proxy).
    pub provider_lookup_cluster_failures: Family<Labels, Counter>,
    /// Fetches of RequestAuthentication key sets that worked and that failed (istiod's
    /// `pilot_jwks_resolver_network_fetch_{success,fail}_total`).
    pub jwks_fetch_success: Counter,
    pub jwks_fetch_fail: Counter,
    pub xds_cache_reads: Family<Labels, Counter>,
    pub xds_push_diffs: Family<Labels, Counter>,
    /// Pushes a connection took without a diff: the change index found nothing in them
    /// for its proxy.
    pub xds_pushes_skipped: Counter,
    pub xds_send_buffer: Gauge,
    /// The validation webhook's verdicts and HTTP errors (istiod's `galley_validation_*`).
    pub validation_passed: Family<Labels, Counter>,
    pub validation_failed: Family<Labels, Counter>,
    pub validation_http_error: Family<Labels, Counter>,
    /// Writes of meshd's root into the webhook configurations' `caBundle`, and failures.
    pub validation_config_updates: Counter,
    pub validation_config_update_error: Family<Labels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            xds_pushes: Family::default(),
            total_xds_rejects: Family::default(),
            xds_push_errors: Family::default(),
            xds_expired_nonce: Family::default(),
            xds_clients: Gauge::default(),
            xds_by_version: Family::default(),
            proxy_convergence_time: Histogram::new(CONVERGENCE_BUCKETS.iter().copied()),
            debounce_time: Histogram::new(PUSH_BUCKETS.iter().copied()),
            xds_push_time: Family::new_with_constructor(push_histogram),
            xds_config_size: Family::new_with_constructor(config_size_histogram),
            proxy_queue_time: Histogram::new(CONVERGENCE_BUCKETS.iter().copied()),
            push_context_recompute: Counter::default(),
            push_triggers: Family::default(),
            xds_cache_reads: Family::default(),
            xds_push_diffs: Family::default(),
            xds_pushes_skipped: Counter::default(),
            xds_send_buffer: Gauge::default(),
            services: Gauge::default(),
            virt_services: Gauge::default(),
            config_errors: Family::default(),
            k8s_cfg_events: Family::default(),
            k8s_crd_missing: Family::default(),
            k8s_reg_events: Family::default(),
            xds_internal_errors: Counter::default(),
            xds_connection_errors: Family::default(),
            xds_streams_at_limit: Counter::default(),
            tls_handshake_errors: Family::default(),
            csr_count: Counter::default(),
            cert_issued: Counter::default(),
            ca_auth_failures: Counter::default(),
            ca_errors: Family::default(),
            csr_parsing_errors: Counter::default(),
            csr_sign_errors: Family::default(),
            root_cert_expiry: Gauge::default(),
            cert_chain_expiry: Gauge::default(),
            root_cert_expiry_seconds: Gauge::default(),
            xds_send_time: Histogram::new(SEND_BUCKETS.iter().copied()),
            pushcontext_init: Histogram::new(INIT_BUCKETS.iter().copied()),
            destroy_time: Histogram::new(DESTROY_BUCKETS.iter().copied()),
            endpoint_no_pod: Gauge::default(),
            eds_no_instances: Gauge::default(),
            destrule_subsets: Gauge::default(),
            provider_lookup_cluster_failures: Family::default(),
            jwks_fetch_success: Counter::default(),
            jwks_fetch_fail: Counter::default(),
            validation_passed: Family::default(),
            validation_failed: Family::default(),
            validation_http_error: Family::default(),
            validation_config_updates: Counter::default(),
            validation_config_update_error: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "galley_validation_passed",
            "Resource is valid",
            m.validation_passed.clone(),
        );
        registry.register(
            "galley_validation_failed",
            "Resource validation failed",
            m.validation_failed.clone(),
        );
        registry.register(
            "galley_validation_http_error",
            "Resource validation http serve errors",
            m.validation_http_error.clone(),
        );
        registry.register(
            "galley_validation_config_updates",
            "k8s webhook configuration updates",
            m.validation_config_updates.clone(),
        );
        registry.register(
            "galley_validation_config_update_error",
            "k8s webhook configuration update error",
            m.validation_config_update_error.clone(),
        );
        registry.register(
            "pilot_xds_pushes",
            "Pilot build and send errors for lds, rds, cds and eds",
            m.xds_pushes.clone(),
        );
        registry.register(
            "pilot_total_xds_rejects",
            "Total number of XDS responses from pilot rejected by proxy",
            m.total_xds_rejects.clone(),
        );
        registry.register(
            "pilot_xds_push_errors",
            "Pushes that failed at the proxy, by type: responses it rejected and responses it did not take within PILOT_XDS_SEND_TIMEOUT",
            m.xds_push_errors.clone(),
        );
        registry.register(
            "pilot_xds_expired_nonce",
            "Total number of XDS requests with an expired nonce",
            m.xds_expired_nonce.clone(),
        );
        registry.register(
            "pilot_xds_clients",
            "Number of endpoints connected to this pilot using XDS",
            m.xds_clients.clone(),
        );
        registry.register(
            "pilot_xds",
            "Number of endpoints connected to this pilot using XDS, by proxy version",
            m.xds_by_version.clone(),
        );
        registry.register("pilot_proxy_convergence_time", "Delay in seconds between config change and a proxy receiving all required configuration", m.proxy_convergence_time.clone());
        registry.register("pilot_debounce_time", "Delay in seconds between the first config enters debouncing and the merged push request is pushed into the push queue", m.debounce_time.clone());
        registry.register(
            "pilot_xds_push_time",
            "Total time in seconds Pilot takes to push lds, rds, cds and eds",
            m.xds_push_time.clone(),
        );
        registry.register(
            "pilot_proxy_queue_time",
            "Time in seconds, a proxy is in the push queue before being dequeued",
            m.proxy_queue_time.clone(),
        );
        registry.register(
            "pilot_push_context_recompute_count",
            "Number of push context rebuilds",
            m.push_context_recompute.clone(),
        );
        registry.register(
            "pilot_push_triggers",
            "Total number of times a push was triggered, labeled by reason for the push",
            m.push_triggers.clone(),
        );
        registry.register(
            "pilot_xds_cache_reads",
            "Total xds cache reads, by hit or miss",
            m.xds_cache_reads.clone(),
        );
        registry.register(
            "meshd_xds_pushes_skipped",
            "Pushes a connection took without comparing anything, because none of the push's changes can reach its proxy",
            m.xds_pushes_skipped.clone(),
        );
        registry.register(
            "meshd_xds_push_diffs",
            "Delta pushes by how the proxy's changes were found: the difference between two views shared by every proxy making the same step, or a comparison of every subscribed name",
            m.xds_push_diffs.clone(),
        );
        registry.register(
            "pilot_services",
            "Total services known to pilot",
            m.services.clone(),
        );
        registry.register(
            "pilot_virt_services",
            "Total virtual services known to pilot",
            m.virt_services.clone(),
        );
        registry.register(
            "pilot_k8s_cfg_events",
            "Events from k8s config",
            m.k8s_cfg_events.clone(),
        );
        registry.register(
            "pilot_k8s_reg_events",
            "Events from k8s registry",
            m.k8s_reg_events.clone(),
        );
        registry.register(
            "pilot_total_xds_internal_errors",
            "Total number of internal XDS errors in pilot",
            m.xds_internal_errors.clone(),
        );
        let build: Family<Labels, Gauge> = Family::default();
        build
            .get_or_create(&vec![
                ("component", "pilot".to_string()),
                ("tag", env!("CARGO_PKG_VERSION").to_string()),
            ])
            .set(1);
        registry.register("istio_build", "Istio component build info", build);
        registry.register(
            "meshd_config_errors",
            "Configuration documents rejected, by kind",
            m.config_errors.clone(),
        );
        registry.register(
            "meshd_k8s_crd_missing",
            "Istio kinds whose CustomResourceDefinition is not installed: served as empty, watched once installed",
            m.k8s_crd_missing.clone(),
        );
        registry.register(
            "meshd_xds_send_buffer_bytes",
            "Response bytes framed for proxies and not yet written to their connections (bounded by MESHD_XDS_SEND_BUFFER_MB)",
            m.xds_send_buffer.clone(),
        );
        registry.register(
            "meshd_xds_connection_errors",
            "xDS streams refused or broken, by reason",
            m.xds_connection_errors.clone(),
        );
        registry.register(
            "meshd_tls_handshake_errors",
            "TLS handshakes on the secure and webhook ports that failed or timed out, by port and reason",
            m.tls_handshake_errors.clone(),
        );
        registry.register(
            "meshd_xds_streams_at_limit",
            "Times an HTTP/2 connection reached ISTIO_GPRC_MAXSTREAMS open streams (its client's next streams wait)",
            m.xds_streams_at_limit.clone(),
        );
        registry.register(
            "citadel_server_csr_count",
            "The number of CSRs received by Citadel server",
            m.csr_count.clone(),
        );
        registry.register(
            "citadel_server_success_cert_issuance_count",
            "The number of certificates issuances that have succeeded",
            m.cert_issued.clone(),
        );
        registry.register(
            "citadel_server_authentication_failure_count",
            "The number of authentication failures",
            m.ca_auth_failures.clone(),
        );
        registry.register(
            "meshd_ca_errors",
            "Certificate requests refused, by reason",
            m.ca_errors.clone(),
        );
        registry.register(
            "citadel_server_csr_parsing_err_count",
            "The number of errors occurred when parsing the CSR",
            m.csr_parsing_errors.clone(),
        );
        registry.register(
            "citadel_server_csr_sign_err_count",
            "The number of errors occurred when signing the CSR",
            m.csr_sign_errors.clone(),
        );
        registry.register(
            "citadel_server_root_cert_expiry_timestamp",
            "The unix timestamp, in seconds, when the root cert will expire",
            m.root_cert_expiry.clone(),
        );
        registry.register(
            "citadel_server_root_cert_expiry_seconds",
            "The time remaining, in seconds, before the root cert will expire",
            m.root_cert_expiry_seconds.clone(),
        );
        registry.register(
            "citadel_server_cert_chain_expiry_timestamp",
            "The unix timestamp, in seconds, when the CA's signing cert chain will expire",
            m.cert_chain_expiry.clone(),
        );
        registry.register(
            "pilot_xds_config_size_bytes",
            "Distribution of configuration sizes pushed to clients",
            m.xds_config_size.clone(),
        );
        registry.register(
            "pilot_xds_send_time",
            "Total time in seconds Pilot takes to send generated configuration",
            m.xds_send_time.clone(),
        );
        registry.register(
            "pilot_pushcontext_init_seconds",
            "Total time in seconds Pilot takes to init pushContext",
            m.pushcontext_init.clone(),
        );
        registry.register(
            "pilot_destroy_time_seconds",
            "Time in seconds from a proxy's stream ending to its state being freed",
            m.destroy_time.clone(),
        );
        registry.register(
            "pilot_eds_no_instances",
            "Number of clusters without instances",
            m.eds_no_instances.clone(),
        );
        registry.register(
            "pilot_destrule_subsets",
            "Duplicate subsets across destination rules for same host",
            m.destrule_subsets.clone(),
        );
        registry.register(
            "provider_lookup_cluster_failures",
            "Number of times a cluster lookup failed",
            m.provider_lookup_cluster_failures.clone(),
        );
        // Istio's names end in `_total` already; OpenMetrics adds one more, which the
        // Prometheus text drops.
        registry.register(
            "pilot_jwks_resolver_network_fetch_success_total",
            "Total number of successfully network fetch by pilot jwks resolver",
            m.jwks_fetch_success.clone(),
        );
        registry.register(
            "pilot_jwks_resolver_network_fetch_fail_total",
            "Total number of failed network fetch by pilot jwks resolver",
            m.jwks_fetch_fail.clone(),
        );
        registry.register(
            "endpoint_no_pod",
            "Endpoints of Kubernetes services with no known Pod behind them",
            m.endpoint_no_pod.clone(),
        );
        // Every type's series exists from the start, so dashboards read 0, not "no data".
        for t in ["cds", "eds", "lds", "rds", "sds"] {
            let label = type_label(t);
            let _ = m.xds_pushes.get_or_create(&label);
            let _ = m.total_xds_rejects.get_or_create(&label);
            let _ = m.xds_push_errors.get_or_create(&label);
            let _ = m.xds_expired_nonce.get_or_create(&label);
            let _ = m.xds_push_time.get_or_create(&label);
        }
        for t in ["hit", "miss"] {
            let _ = m.xds_cache_reads.get_or_create(&type_label(t));
        }
        for method in ["view", "full"] {
            let _ = m
                .xds_push_diffs
                .get_or_create(&vec![("method", method.to_string())]);
        }
        Metrics { registry, ..m }
    }

    /// The registry in Prometheus text format (version 0.0.4), as istiod serves it, then
    /// the process's own figures (read at scrape time).
    pub fn render(&self) -> String {
        // Derived at each scrape, as istiod derives it.
        let root_expiry = self.root_cert_expiry.get();
        if root_expiry != 0 {
            let now = unix_seconds(std::time::SystemTime::now());
            self.root_cert_expiry_seconds.set(root_expiry - now);
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("BUG: encoding to a String cannot fail");
        let mut out = to_prometheus_text(&text);
        out.push_str(&process_text());
        out
    }
}

/// `at` in whole seconds since the Unix epoch, as the `*_timestamp` gauges carry it.
pub fn unix_seconds(at: std::time::SystemTime) -> i64 {
    let since = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
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

pub fn type_label(t: &str) -> Labels {
    vec![("type", t.to_string())]
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
        m.xds_pushes.get_or_create(&type_label("cds")).inc();
        m.proxy_convergence_time.observe(0.2);
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
