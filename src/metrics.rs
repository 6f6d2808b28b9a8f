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

pub struct Metrics {
    pub registry: Registry,
    pub xds_pushes: Family<Labels, Counter>,
    pub total_xds_rejects: Family<Labels, Counter>,
    pub xds_expired_nonce: Family<Labels, Counter>,
    pub xds_clients: Gauge,
    pub xds_by_version: Family<Labels, Gauge>,
    pub proxy_convergence_time: Histogram,
    pub debounce_time: Histogram,
    pub xds_push_time: Family<Labels, Histogram, fn() -> Histogram>,
    pub proxy_queue_time: Histogram,
    pub push_context_recompute: Counter,
    pub push_triggers: Family<Labels, Counter>,
    pub services: Gauge,
    pub virt_services: Gauge,
    pub config_errors: Family<Labels, Counter>,
    pub xds_connection_errors: Family<Labels, Counter>,
    pub csr_count: Counter,
    pub cert_issued: Counter,
    pub ca_auth_failures: Counter,
    pub ca_errors: Family<Labels, Counter>,
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
            xds_expired_nonce: Family::default(),
            xds_clients: Gauge::default(),
            xds_by_version: Family::default(),
            proxy_convergence_time: Histogram::new(CONVERGENCE_BUCKETS.iter().copied()),
            debounce_time: Histogram::new(PUSH_BUCKETS.iter().copied()),
            xds_push_time: Family::new_with_constructor(push_histogram),
            proxy_queue_time: Histogram::new(CONVERGENCE_BUCKETS.iter().copied()),
            push_context_recompute: Counter::default(),
            push_triggers: Family::default(),
            services: Gauge::default(),
            virt_services: Gauge::default(),
            config_errors: Family::default(),
            xds_connection_errors: Family::default(),
            csr_count: Counter::default(),
            cert_issued: Counter::default(),
            ca_auth_failures: Counter::default(),
            ca_errors: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "pilot_xds_pushes",
            "Pilot build and send errors for lds, rds, cds and eds.",
            m.xds_pushes.clone(),
        );
        registry.register(
            "pilot_total_xds_rejects",
            "Total number of XDS responses from pilot rejected by proxy.",
            m.total_xds_rejects.clone(),
        );
        registry.register(
            "pilot_xds_expired_nonce",
            "Total number of XDS requests with an expired nonce.",
            m.xds_expired_nonce.clone(),
        );
        registry.register(
            "pilot_xds_clients",
            "Number of endpoints connected to this pilot using XDS.",
            m.xds_clients.clone(),
        );
        registry.register(
            "pilot_xds",
            "Number of endpoints connected to this pilot using XDS, by proxy version.",
            m.xds_by_version.clone(),
        );
        registry.register("pilot_proxy_convergence_time", "Delay in seconds between config change and a proxy receiving all required configuration", m.proxy_convergence_time.clone());
        registry.register("pilot_debounce_time", "Delay in seconds between the first config enters debouncing and the merged push request is pushed into the push queue", m.debounce_time.clone());
        registry.register(
            "pilot_xds_push_time",
            "Total time in seconds Pilot takes to push lds, rds, cds and eds.",
            m.xds_push_time.clone(),
        );
        registry.register(
            "pilot_proxy_queue_time",
            "Time in seconds, a proxy is in the push queue before being dequeued.",
            m.proxy_queue_time.clone(),
        );
        registry.register(
            "pilot_push_context_recompute_count",
            "Number of push context rebuilds.",
            m.push_context_recompute.clone(),
        );
        registry.register(
            "pilot_push_triggers",
            "Total number of times a push was triggered, labeled by reason for the push.",
            m.push_triggers.clone(),
        );
        registry.register(
            "pilot_services",
            "Total services known to pilot.",
            m.services.clone(),
        );
        registry.register(
            "pilot_virt_services",
            "Total virtual services known to pilot.",
            m.virt_services.clone(),
        );
        registry.register(
            "meshd_config_errors",
            "Configuration documents rejected, by kind.",
            m.config_errors.clone(),
        );
        registry.register(
            "meshd_xds_connection_errors",
            "xDS streams refused or broken, by reason.",
            m.xds_connection_errors.clone(),
        );
        registry.register(
            "citadel_server_csr_count",
            "The number of CSRs received by Citadel server.",
            m.csr_count.clone(),
        );
        registry.register(
            "citadel_server_success_cert_issuance_count",
            "The number of certificates issuances that have succeeded.",
            m.cert_issued.clone(),
        );
        registry.register(
            "citadel_server_authentication_failure_count",
            "The number of authentication failures.",
            m.ca_auth_failures.clone(),
        );
        registry.register(
            "meshd_ca_errors",
            "Certificate requests refused, by reason.",
            m.ca_errors.clone(),
        );
        Metrics { registry, ..m }
    }

    /// The registry in Prometheus text format (version 0.0.4), as istiod serves it.
    pub fn render(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("BUG: encoding to a String cannot fail");
        to_prometheus_text(&text)
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
}
