//! Which Prometheus providers collect a proxy's metrics, and how, from its Telemetry
//! resources' `metrics` over MeshConfig `defaultProviders.metrics`, merged as istiod's
//! `mergeMetrics` merges them, into the configurations of Istio's stats filter
//! (`stats.PluginConfig`, istiod's `generateStatsConfig`).
//!
//! - The providers are those of the most specific entry that names any, else the
//!   mesh's defaults; an entry without providers applies to its parent's.
//! - Overrides apply in order, least specific Telemetry first: each sets, for the
//!   metrics it matches (all of Istio's by default) and its side (`CLIENT`, `SERVER` or
//!   both), whether they are dropped and which tags are set (to a CEL expression) or
//!   removed. Disabling all metrics of a side leaves that side without a stats filter,
//!   until a later override matches something on it again.
//! - `reportingInterval` sets the provider's TCP reporting interval.

use std::collections::{BTreeMap, BTreeSet};

use api::telemetry::{ISTIO_METRICS, MetricSelector, Metrics, TagOverride};
use envoy_api::pb::google::protobuf::{self as pbp, Any};
use model::mesh::MeshConfig;
use prost::Message;

/// The side of the traffic a stats filter counts: `CLIENT` (a sidecar's outbound, a
/// gateway) or `SERVER` (a sidecar's inbound).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Side {
    Client,
    Server,
}

impl Side {
    fn of_mode(mode: Option<&str>) -> &'static [Side] {
        match mode {
            Some("CLIENT") => &[Side::Client],
            Some("SERVER") => &[Side::Server],
            _ => &[Side::Client, Side::Server],
        }
    }
}

/// What one Prometheus provider's stats filters do on each side.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProviderMetrics {
    /// The client side's metric overrides; `None`: no stats filter on that side.
    pub client: Option<Vec<MetricConfig>>,
    pub server: Option<Vec<MetricConfig>>,
    /// `reportingInterval`, for TCP metrics.
    pub tcp_reporting: Option<pbp::Duration>,
}

impl ProviderMetrics {
    /// The stats filter configuration for `side`; `host_header_fallback`: whether the
    /// destination service may be taken from the Host header (only a sidecar's own
    /// clients' requests). `None` when the side has no stats filter.
    pub fn config(&self, side: Side, host_header_fallback: bool) -> Option<Any> {
        let metrics = match side {
            Side::Client => self.client.as_ref()?,
            Side::Server => self.server.as_ref()?,
        };
        let config = StatsConfig {
            disable_host_header_fallback: !host_header_fallback,
            tcp_reporting_duration: self.tcp_reporting,
            metrics: metrics.clone(),
        };
        Some(Any {
            type_url: "type.googleapis.com/stats.PluginConfig".into(),
            value: config.encode_to_vec(),
        })
    }
}

/// `stats.PluginConfig`, the fields istiod sets.
#[derive(Clone, PartialEq, Message)]
struct StatsConfig {
    #[prost(bool, tag = "6")]
    disable_host_header_fallback: bool,
    #[prost(message, optional, tag = "7")]
    tcp_reporting_duration: Option<pbp::Duration>,
    #[prost(message, repeated, tag = "8")]
    metrics: Vec<MetricConfig>,
}

/// `stats.MetricConfig`: one metric's tags set (`dimensions`, CEL expressions) and
/// removed, or the metric dropped.
#[derive(Clone, PartialEq, Message)]
pub struct MetricConfig {
    #[prost(btree_map = "string, string", tag = "1")]
    pub dimensions: BTreeMap<String, String>,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, repeated, tag = "3")]
    pub tags_to_remove: Vec<String>,
    #[prost(bool, tag = "5")]
    pub drop: bool,
}

/// The overrides of one metric on one side, as merged so far.
#[derive(Default)]
struct Override<'a> {
    disabled: Option<bool>,
    tags: BTreeMap<&'a str, &'a TagOverride>,
}

/// Each Prometheus provider collecting the metrics of a proxy that `metrics` (the
/// `metrics` lists of its Telemetry resources, least specific first) apply to, by name.
pub fn prometheus_providers(
    mesh: &MeshConfig,
    metrics: &[&Metrics],
) -> BTreeMap<String, ProviderMetrics> {
    let defaults = &mesh.default_providers.metrics;
    let names =
        |m: &Metrics| -> Vec<String> { m.providers.iter().map(|p| p.name.clone()).collect() };
    // The most specific entry naming providers decides which are configured at all.
    let in_scope: BTreeSet<String> = (metrics.iter().rev())
        .map(|m| names(m))
        .find(|n| !n.is_empty())
        .unwrap_or_else(|| defaults.clone())
        .into_iter()
        .collect();
    let mut providers: BTreeMap<String, BTreeMap<(Side, &str), Override>> = BTreeMap::new();
    if metrics.is_empty() {
        for name in defaults {
            providers.entry(name.clone()).or_default();
        }
    }
    let mut all_disabled: BTreeSet<(String, Side)> = BTreeSet::new();
    let mut intervals: BTreeMap<String, pbp::Duration> = BTreeMap::new();
    let mut parent = defaults.clone();
    for m in metrics {
        let own = names(m);
        let applies_to = if own.is_empty() { parent.clone() } else { own };
        parent.clone_from(&applies_to);
        let interval = (m.reporting_interval.as_deref())
            .and_then(|d| api::duration::parse(d).ok())
            .map(crate::duration);
        for provider in applies_to.iter().filter(|p| in_scope.contains(*p)) {
            if let Some(i) = interval {
                intervals.insert(provider.clone(), i);
            }
            let overrides = providers.entry(provider.clone()).or_default();
            for o in &m.overrides {
                let selector = o.r#match.as_ref();
                let sides = Side::of_mode(selector.and_then(|s| s.mode.as_deref()));
                if all_metrics(selector) && o.disabled == Some(true) {
                    all_disabled.extend(sides.iter().map(|s| (provider.clone(), *s)));
                    continue;
                }
                for side in sides {
                    all_disabled.remove(&(provider.clone(), *side));
                    for metric in matched(selector) {
                        let entry = overrides.entry((*side, metric)).or_default();
                        if o.disabled.is_some() {
                            entry.disabled = o.disabled;
                        }
                        (entry.tags).extend(o.tag_overrides.iter().map(|(k, v)| (k.as_str(), v)));
                    }
                }
            }
        }
    }
    (providers.into_iter())
        .filter(|(name, _)| {
            mesh.extension_provider(name)
                .is_some_and(|p| p.prometheus.is_some())
        })
        .map(|(name, overrides)| {
            let side = |side: Side| {
                if all_disabled.contains(&(name.clone(), side)) {
                    return None;
                }
                let of_side = overrides.iter().filter(|((s, _), _)| *s == side);
                Some(
                    of_side
                        .map(|((_, metric), o)| metric_config(metric, o))
                        .collect(),
                )
            };
            let metrics = ProviderMetrics {
                client: side(Side::Client),
                server: side(Side::Server),
                tcp_reporting: intervals.get(&name).copied(),
            };
            (name, metrics)
        })
        .collect()
}

/// Whether a selector matches all of Istio's metrics: none, one without a metric, or
/// `ALL_METRICS`.
fn all_metrics(selector: Option<&MetricSelector>) -> bool {
    let Some(s) = selector else { return true };
    s.custom_metric.is_none() && s.metric.as_deref().is_none_or(|m| m == "ALL_METRICS")
}

/// The metrics a selector matches: a custom one, one of Istio's, or all of Istio's.
fn matched(selector: Option<&MetricSelector>) -> Vec<&str> {
    match selector {
        Some(MetricSelector {
            custom_metric: Some(custom),
            ..
        }) => vec![custom.as_str()],
        Some(MetricSelector {
            metric: Some(metric),
            ..
        }) if metric != "ALL_METRICS" => vec![metric.as_str()],
        _ => ISTIO_METRICS.iter().map(|(name, _)| *name).collect(),
    }
}

/// A metric's configuration: Istio's metrics by their Prometheus names, a custom one by
/// its own; tags to set and to remove in name order.
fn metric_config(metric: &str, o: &Override) -> MetricConfig {
    let name = (ISTIO_METRICS.iter()).find(|(m, _)| *m == metric);
    let mut config = MetricConfig {
        name: name
            .map_or(metric, |(_, prometheus)| prometheus)
            .to_string(),
        drop: o.disabled == Some(true),
        ..Default::default()
    };
    for (tag, t) in &o.tags {
        if t.operation.as_deref() == Some("REMOVE") {
            config.tags_to_remove.push(tag.to_string());
        } else {
            let value = t.value.clone().unwrap_or_default();
            config.dimensions.insert(tag.to_string(), value);
        }
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const MESH: &str = "defaultProviders: {metrics: [prometheus]}\nextensionProviders:\n- {name: prometheus, prometheus: {}}\n- {name: second, prometheus: {}}\n- {name: otel, opentelemetry: {service: otel.obs.svc.cluster.local, port: 4317}}\n";

    /// The providers of Telemetry `metrics` lists, least specific first.
    fn providers(lists: &[Value]) -> BTreeMap<String, ProviderMetrics> {
        let mesh = MeshConfig::parse(MESH).unwrap();
        let parsed: Vec<Vec<Metrics>> = (lists.iter())
            .map(|l| serde_json::from_value(l.clone()).unwrap())
            .collect();
        let all: Vec<&Metrics> = parsed.iter().flatten().collect();
        prometheus_providers(&mesh, &all)
    }

    fn names(p: &BTreeMap<String, ProviderMetrics>) -> Vec<&str> {
        p.keys().map(String::as_str).collect()
    }

    #[test]
    fn the_most_specific_providers_replace_the_meshs_and_are_inherited_below_them() {
        assert_eq!(names(&providers(&[])), ["prometheus"]);
        // A namespace naming `second` replaces the default; the workload's entry without
        // providers applies to `second`; a provider that is not Prometheus has no filter.
        let p = providers(&[
            json!([{"providers": [{"name": "second"}, {"name": "otel"}]}]),
            json!([{"overrides": [{"match": {"metric": "REQUEST_COUNT"}, "disabled": true}]}]),
        ]);
        assert_eq!(names(&p), ["second"]);
        let client = p["second"].client.as_ref().unwrap();
        assert_eq!(
            (client[0].name.as_str(), client[0].drop),
            ("requests_total", true)
        );
        // Below, a workload naming the default again leaves `second` out.
        let p = providers(&[
            json!([{"providers": [{"name": "second"}]}]),
            json!([{"providers": [{"name": "prometheus"}]}]),
        ]);
        assert_eq!(names(&p), ["prometheus"]);
    }

    #[test]
    fn disabling_all_metrics_of_a_side_removes_its_filter_until_a_later_override_matches() {
        let off = json!([{"overrides": [{"match": {"mode": "SERVER"}, "disabled": true}]}]);
        let p = providers(std::slice::from_ref(&off));
        assert_eq!(p["prometheus"].server, None);
        assert_eq!(p["prometheus"].client, Some(Vec::new()));
        assert!(p["prometheus"].config(Side::Server, false).is_none());
        let again = json!([{"overrides": [{"match": {"metric": "TCP_SENT_BYTES", "mode": "SERVER"}, "tagOverrides": {"peer": {"value": "upstream.address"}}}]}]);
        let p = providers(&[off, again]);
        let server = p["prometheus"].server.as_ref().unwrap();
        assert_eq!(server.len(), 1);
        assert_eq!(server[0].name, "tcp_sent_bytes_total");
        assert_eq!(server[0].dimensions["peer"], "upstream.address");
    }

    #[test]
    fn later_overrides_update_earlier_ones_tag_by_tag() {
        let p = providers(&[
            json!([{"reportingInterval": "20s", "overrides": [{"match": {"metric": "REQUEST_SIZE", "mode": "CLIENT"}, "tagOverrides": {"a": {"value": "x"}, "b": {"value": "y"}}}]}]),
            json!([{"overrides": [
                {"match": {"metric": "REQUEST_SIZE", "mode": "CLIENT"}, "tagOverrides": {"a": {"operation": "REMOVE"}}},
                {"match": {"customMetric": "my_total"}, "disabled": true}
            ]}]),
        ]);
        let client = p["prometheus"].client.as_ref().unwrap();
        // In the byte order of what the overrides matched: Istio's upper-case names first.
        let names: Vec<&str> = client.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["request_bytes", "my_total"]);
        assert_eq!(client[0].tags_to_remove, ["a"]);
        let b = BTreeMap::from([("b".to_string(), "y".to_string())]);
        assert_eq!(client[0].dimensions, b);
        assert!(client[1].drop);
        assert_eq!(p["prometheus"].tcp_reporting.unwrap().seconds, 20);
        // Every one of Istio's metrics, when an override names none.
        let p = providers(&[json!([{"overrides": [{"tagOverrides": {"c": {"value": "z"}}}]}])]);
        let server = p["prometheus"].server.as_ref().unwrap();
        assert_eq!(server.len(), ISTIO_METRICS.len());
    }
}
