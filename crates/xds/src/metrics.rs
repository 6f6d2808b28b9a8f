//! The metrics of the xDS streams and of the push pipeline, with istiod's names, types,
//! labels and buckets, each set registered on the registry it is given.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::resource;

pub type Labels = Vec<(&'static str, String)>;

/// `{type="..."}`, the label istiod puts on its per-type series.
pub fn type_label(t: &str) -> Labels {
    vec![("type", t.to_string())]
}

/// `at` in whole seconds since the Unix epoch, as the `*_timestamp` gauges carry it.
pub fn unix_seconds(at: std::time::SystemTime) -> i64 {
    let since = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
}

const PUSH_BUCKETS: &[f64] = &[0.01, 0.1, 0.5, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0];
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

fn histogram(buckets: &[f64]) -> Histogram {
    Histogram::new(buckets.iter().copied())
}

fn push_histogram() -> Histogram {
    histogram(PUSH_BUCKETS)
}

fn config_size_histogram() -> Histogram {
    histogram(CONFIG_SIZE_BUCKETS)
}

/// What the streams count: pushes, rejections, connections and their errors, timings.
#[derive(Clone)]
pub struct XdsMetrics {
    pub pushes: Family<Labels, Counter>,
    pub rejects: Family<Labels, Counter>,
    /// Pushes that failed at the proxy, by type: rejected (NACKed) or not taken in time.
    pub push_errors: Family<Labels, Counter>,
    pub expired_nonce: Family<Labels, Counter>,
    pub clients: Gauge,
    pub by_version: Family<Labels, Gauge>,
    pub convergence_time: Histogram,
    pub push_time: Family<Labels, Histogram, fn() -> Histogram>,
    /// Bytes of the resources in each response, by type URL.
    pub config_size: Family<Labels, Histogram, fn() -> Histogram>,
    pub queue_time: Histogram,
    pub send_time: Histogram,
    pub destroy_time: Histogram,
    pub connection_errors: Family<Labels, Counter>,
    /// HTTP/2 connections that reached `ISTIO_GPRC_MAXSTREAMS` open streams.
    pub streams_at_limit: Counter,
    pub cache_reads: Family<Labels, Counter>,
    pub push_diffs: Family<Labels, Counter>,
    /// Pushes a connection took without a diff: the change index found nothing in them
    /// for its proxy.
    pub pushes_skipped: Counter,
    pub send_buffer: Gauge,
    /// Connections accepted on the xDS ports and not yet answered (see
    /// `transport::admission`).
    pub pending_connections: Gauge,
    /// The shared runs of encoded resources ([`crate::joined`]).
    pub shared_runs: crate::joined::RunMetrics,
}

impl XdsMetrics {
    /// Registers the streams' series on `registry`; every type's series exists from the
    /// start, so that dashboards read 0, not "no data", as istiod's do.
    pub fn register(registry: &mut Registry) -> XdsMetrics {
        let m = XdsMetrics {
            pushes: Family::default(),
            rejects: Family::default(),
            push_errors: Family::default(),
            expired_nonce: Family::default(),
            clients: Gauge::default(),
            by_version: Family::default(),
            convergence_time: histogram(CONVERGENCE_BUCKETS),
            push_time: Family::new_with_constructor(push_histogram),
            config_size: Family::new_with_constructor(config_size_histogram),
            queue_time: histogram(CONVERGENCE_BUCKETS),
            send_time: histogram(SEND_BUCKETS),
            destroy_time: histogram(DESTROY_BUCKETS),
            connection_errors: Family::default(),
            streams_at_limit: Counter::default(),
            cache_reads: Family::default(),
            push_diffs: Family::default(),
            pushes_skipped: Counter::default(),
            send_buffer: Gauge::default(),
            pending_connections: Gauge::default(),
            shared_runs: crate::joined::RunMetrics::default(),
        };
        let r = registry;
        r.register(
            "pilot_xds_pushes",
            "Pilot build and send errors for lds, rds, cds and eds",
            m.pushes.clone(),
        );
        r.register(
            "pilot_total_xds_rejects",
            "Total number of XDS responses from pilot rejected by proxy",
            m.rejects.clone(),
        );
        r.register(
            "pilot_xds_push_errors",
            "Pushes that failed at the proxy, by type: responses it rejected and responses it did not take within PILOT_XDS_SEND_TIMEOUT",
            m.push_errors.clone(),
        );
        r.register(
            "pilot_xds_expired_nonce",
            "Total number of XDS requests with an expired nonce",
            m.expired_nonce.clone(),
        );
        r.register(
            "pilot_xds_clients",
            "Number of endpoints connected to this pilot using XDS",
            m.clients.clone(),
        );
        r.register(
            "pilot_xds",
            "Number of endpoints connected to this pilot using XDS, by proxy version",
            m.by_version.clone(),
        );
        r.register(
            "pilot_proxy_convergence_time",
            "Delay in seconds between config change and a proxy receiving all required configuration",
            m.convergence_time.clone(),
        );
        r.register(
            "pilot_xds_push_time",
            "Total time in seconds Pilot takes to push lds, rds, cds and eds",
            m.push_time.clone(),
        );
        r.register(
            "pilot_proxy_queue_time",
            "Time in seconds, a proxy is in the push queue before being dequeued",
            m.queue_time.clone(),
        );
        r.register(
            "pilot_xds_cache_reads",
            "Total xds cache reads, by hit or miss",
            m.cache_reads.clone(),
        );
        r.register(
            "meshd_xds_pushes_skipped",
            "Pushes a connection took without comparing anything, because none of the push's changes can reach its proxy",
            m.pushes_skipped.clone(),
        );
        r.register(
            "meshd_xds_push_diffs",
            "Delta pushes by how the proxy's changes were found: the difference between two views shared by every proxy making the same step, or a comparison of every subscribed name",
            m.push_diffs.clone(),
        );
        r.register(
            "meshd_xds_send_buffer_bytes",
            "Response bytes framed for proxies and not yet written to their connections (bounded by MESHD_XDS_SEND_BUFFER_MB)",
            m.send_buffer.clone(),
        );
        r.register(
            "meshd_xds_connection_errors",
            "xDS streams refused or broken, by reason",
            m.connection_errors.clone(),
        );
        r.register(
            "meshd_xds_pending_connections",
            "Connections accepted on the xDS ports that have not sent their first response yet, at most MESHD_XDS_PENDING_CONNECTIONS per port for 3 s each (further connections wait in the listen backlog)",
            m.pending_connections.clone(),
        );
        r.register(
            "meshd_xds_shared_run_bytes",
            "Encoded runs of resources kept to be shared by the responses that carry them",
            m.shared_runs.bytes.clone(),
        );
        r.register(
            "meshd_xds_shared_runs",
            "Responses whose resources went out as a shared run: encoded for the response, or reused from an earlier one",
            m.shared_runs.uses.clone(),
        );
        r.register(
            "meshd_xds_streams_at_limit",
            "Times an HTTP/2 connection reached ISTIO_GPRC_MAXSTREAMS open streams (its client's next streams wait)",
            m.streams_at_limit.clone(),
        );
        r.register(
            "pilot_xds_config_size_bytes",
            "Distribution of configuration sizes pushed to clients",
            m.config_size.clone(),
        );
        r.register(
            "pilot_xds_send_time",
            "Total time in seconds Pilot takes to send generated configuration",
            m.send_time.clone(),
        );
        r.register(
            "pilot_destroy_time_seconds",
            "Time in seconds from a proxy's stream ending to its state being freed",
            m.destroy_time.clone(),
        );
        for t in ["cds", "eds", "lds", "rds", "sds"] {
            let label = type_label(t);
            let _ = m.pushes.get_or_create(&label);
            let _ = m.rejects.get_or_create(&label);
            let _ = m.push_errors.get_or_create(&label);
            let _ = m.expired_nonce.get_or_create(&label);
            let _ = m.push_time.get_or_create(&label);
        }
        // Labelled by type URL, as istiod labels it.
        for url in [
            resource::CLUSTER_TYPE,
            resource::ENDPOINT_TYPE,
            resource::LISTENER_TYPE,
            resource::ROUTE_TYPE,
            resource::SECRET_TYPE,
        ] {
            let _ = m.config_size.get_or_create(&type_label(url));
        }
        for t in ["hit", "miss"] {
            let _ = m.cache_reads.get_or_create(&type_label(t));
        }
        for method in ["view", "full"] {
            let _ = m
                .push_diffs
                .get_or_create(&vec![("method", method.to_string())]);
        }
        m
    }

    /// A set on a registry of its own, for tests and tools that read no `/metrics`.
    pub fn unregistered() -> XdsMetrics {
        XdsMetrics::register(&mut Registry::default())
    }
}

/// What the push pipeline counts: debouncing, push-context builds and what they found.
#[derive(Clone)]
pub struct PushMetrics {
    pub debounce_time: Histogram,
    pub context_recompute: Counter,
    pub context_init: Histogram,
    pub triggers: Family<Labels, Counter>,
    pub services: Gauge,
    pub virt_services: Gauge,
    pub endpoint_no_pod: Gauge,
    /// Clusters with no endpoint in the current push.
    pub eds_no_instances: Gauge,
    /// Hosts whose merged DestinationRules name a subset twice, in the current push.
    pub destrule_subsets: Gauge,
    /// Pushes whose default tracing provider's service was not found, by provider type
    /// (istiod's `provider_lookup_cluster_failures`, which it counts per proxy).
    pub provider_lookup_cluster_failures: Family<Labels, Counter>,
}

impl PushMetrics {
    pub fn register(registry: &mut Registry) -> PushMetrics {
        let m = PushMetrics {
            debounce_time: histogram(PUSH_BUCKETS),
            context_recompute: Counter::default(),
            context_init: histogram(INIT_BUCKETS),
            triggers: Family::default(),
            services: Gauge::default(),
            virt_services: Gauge::default(),
            endpoint_no_pod: Gauge::default(),
            eds_no_instances: Gauge::default(),
            destrule_subsets: Gauge::default(),
            provider_lookup_cluster_failures: Family::default(),
        };
        let r = registry;
        r.register(
            "pilot_debounce_time",
            "Delay in seconds between the first config enters debouncing and the merged push request is pushed into the push queue",
            m.debounce_time.clone(),
        );
        r.register(
            "pilot_push_context_recompute_count",
            "Number of push context rebuilds",
            m.context_recompute.clone(),
        );
        r.register(
            "pilot_push_triggers",
            "Total number of times a push was triggered, labeled by reason for the push",
            m.triggers.clone(),
        );
        r.register(
            "pilot_services",
            "Total services known to pilot",
            m.services.clone(),
        );
        r.register(
            "pilot_virt_services",
            "Total virtual services known to pilot",
            m.virt_services.clone(),
        );
        r.register(
            "pilot_pushcontext_init_seconds",
            "Total time in seconds Pilot takes to init pushContext",
            m.context_init.clone(),
        );
        r.register(
            "pilot_eds_no_instances",
            "Number of clusters without instances",
            m.eds_no_instances.clone(),
        );
        r.register(
            "pilot_destrule_subsets",
            "Duplicate subsets across destination rules for same host",
            m.destrule_subsets.clone(),
        );
        r.register(
            "provider_lookup_cluster_failures",
            "Number of times a cluster lookup failed",
            m.provider_lookup_cluster_failures.clone(),
        );
        r.register(
            "endpoint_no_pod",
            "Endpoints of Kubernetes services with no known Pod behind them",
            m.endpoint_no_pod.clone(),
        );
        m
    }

    /// A set on a registry of its own, for tests and benches.
    pub fn unregistered() -> PushMetrics {
        PushMetrics::register(&mut Registry::default())
    }
}
