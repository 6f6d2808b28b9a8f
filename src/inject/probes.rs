//! Application probes and Prometheus scraping through the agent, as istiod's injector
//! rewrites them: with mutual TLS the kubelet cannot reach the application itself, so
//! each HTTP, TCP and gRPC probe (and HTTP or TCP lifecycle hook) becomes an HTTP GET of
//! the agent's status port at `/app-health/CONTAINER/{readyz,livez,startupz}` (or
//! `/app-lifecycle/CONTAINER/{prestopz,poststartz}`), and the originals go to the agent in
//! `ISTIO_KUBE_APP_PROBERS`. Prometheus's annotations point at the agent's merged metrics.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, HTTPGetAction, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

const PROXY: &str = "istio-proxy";
/// The annotation turning rewriting off (or on) for one pod.
const REWRITE: &str = "sidecar.istio.io/rewriteAppHTTPProbers";

/// The HTTP GET the kubelet sends instead: the same action, at the agent.
fn at_agent(original: Option<&HTTPGetAction>, path: &str, port: u16) -> HTTPGetAction {
    let mut action = original.cloned().unwrap_or_default();
    action.port = IntOrString::Int(port.into());
    action.path = Some(path.to_string());
    if action.scheme.as_deref() == Some("HTTPS") {
        action.scheme = Some("HTTP".into());
    }
    action
}

/// The original probe as the agent runs it: named ports resolved (an unknown name drops
/// it), `None` for exec probes and probes already at the agent.
fn prober(
    http: Option<&HTTPGetAction>,
    tcp: Option<&Value>,
    grpc: Option<&Value>,
    timeout: Option<i32>,
    ports: &BTreeMap<String, i32>,
    status_port: u16,
) -> Option<Value> {
    let resolve = |port: &IntOrString| -> Option<i32> {
        match port {
            IntOrString::Int(p) if *p == i32::from(status_port) => None,
            IntOrString::Int(p) => Some(*p),
            IntOrString::String(name) => ports.get(name).copied(),
        }
    };
    let mut out = serde_json::Map::new();
    if let Some(grpc) = grpc {
        out.insert("grpc".into(), grpc.clone());
    } else if let Some(http) = http {
        let mut v = serde_json::to_value(http).ok()?;
        v["port"] = json!(resolve(&http.port)?);
        out.insert("httpGet".into(), v);
    } else if let Some(tcp) = tcp {
        let port: IntOrString = serde_json::from_value(tcp["port"].clone()).ok()?;
        let mut v = tcp.clone();
        v["port"] = json!(resolve(&port)?);
        out.insert("tcpSocket".into(), v);
    } else {
        return None;
    }
    if let Some(t) = timeout.filter(|t| *t != 0) {
        out.insert("timeoutSeconds".into(), json!(t));
    }
    Some(Value::Object(out))
}

/// Rewrites one container's probes and hooks, recording the originals in `probers`.
fn rewrite_container(c: &mut Container, status_port: u16, probers: &mut BTreeMap<String, Value>) {
    let ports: BTreeMap<String, i32> = (c.ports.iter().flatten())
        .filter_map(|p| Some((p.name.clone()?, p.container_port)))
        .collect();
    let name = c.name.clone();
    for (probe, kind) in [
        (&mut c.readiness_probe, "readyz"),
        (&mut c.liveness_probe, "livez"),
        (&mut c.startup_probe, "startupz"),
    ] {
        let Some(p) = probe.as_mut() else { continue };
        let tcp = p
            .tcp_socket
            .as_ref()
            .and_then(|t| serde_json::to_value(t).ok());
        let grpc = p.grpc.as_ref().and_then(|g| serde_json::to_value(g).ok());
        let Some(original) = prober(
            p.http_get.as_ref(),
            tcp.as_ref(),
            grpc.as_ref(),
            p.timeout_seconds,
            &ports,
            status_port,
        ) else {
            continue;
        };
        let path = format!("/app-health/{name}/{kind}");
        p.http_get = Some(at_agent(p.http_get.as_ref(), &path, status_port));
        p.tcp_socket = None;
        p.grpc = None;
        probers.insert(path, original);
    }
    let Some(lifecycle) = c.lifecycle.as_mut() else {
        return;
    };
    for (hook, kind) in [
        (&mut lifecycle.pre_stop, "prestopz"),
        (&mut lifecycle.post_start, "poststartz"),
    ] {
        let Some(h) = hook.as_mut() else { continue };
        let tcp = h
            .tcp_socket
            .as_ref()
            .and_then(|t| serde_json::to_value(t).ok());
        let Some(original) = prober(
            h.http_get.as_ref(),
            tcp.as_ref(),
            None,
            None,
            &ports,
            status_port,
        ) else {
            continue;
        };
        let path = format!("/app-lifecycle/{name}/{kind}");
        h.http_get = Some(at_agent(h.http_get.as_ref(), &path, status_port));
        h.tcp_socket = None;
        probers.insert(path, original);
    }
}

/// Sends every application probe through the agent, unless the pod's
/// `sidecar.istio.io/rewriteAppHTTPProbers` says `false`; `earlier` are the probes an
/// earlier injection sent there (kept unless rewritten again).
pub fn rewrite(pod: &mut Pod, status_port: u16, earlier: serde_json::Map<String, Value>) {
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    if annotations.get(REWRITE).map(String::as_str) == Some("false") {
        return;
    }
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let mut probers: BTreeMap<String, Value> = earlier.into_iter().collect();
    for c in spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(&mut spec.containers)
    {
        if c.name != PROXY && c.name != "istio-init" {
            rewrite_container(c, status_port, &mut probers);
        }
    }
    if !probers.is_empty() {
        let value = serde_json::to_string(&probers).unwrap_or_default();
        add_proxy_env(pod, "ISTIO_KUBE_APP_PROBERS", value);
    }
}

/// Points Prometheus at the agent's merged metrics (mesh `enablePrometheusMerge`, or the
/// pod's `prometheus.istio.io/merge-metrics`), keeping the application's own scrape
/// settings for the agent in `ISTIO_PROMETHEUS_ANNOTATIONS`. A pod that says
/// `prometheus.io/scrape: "false"` is left alone.
pub fn prometheus(pod: &mut Pod, merge: bool, status_port: u16) {
    let annotations = pod.metadata.annotations.get_or_insert_default();
    let merge = match annotations
        .get("prometheus.istio.io/merge-metrics")
        .map(String::as_str)
    {
        Some("true") => true,
        Some("false") => false,
        _ => merge,
    };
    if !merge || annotations.get("prometheus.io/scrape").map(String::as_str) == Some("false") {
        return;
    }
    // Already the agent's (a pod injected before).
    if annotations.get("prometheus.io/port") == Some(&status_port.to_string()) {
        return;
    }
    let mut kept = BTreeMap::new();
    for key in ["scrape", "port", "path"] {
        if let Some(v) = annotations.get(&format!("prometheus.io/{key}")) {
            kept.insert(key, v.clone());
        }
    }
    annotations.insert("prometheus.io/scrape".into(), "true".into());
    annotations.insert("prometheus.io/port".into(), status_port.to_string());
    annotations.insert("prometheus.io/path".into(), "/stats/prometheus".into());
    if !kept.is_empty() {
        let value = serde_json::to_string(&kept).unwrap_or_default();
        add_proxy_env(pod, "ISTIO_PROMETHEUS_ANNOTATIONS", value);
    }
}

/// Adds (or replaces) an environment variable of the `istio-proxy` container.
fn add_proxy_env(pod: &mut Pod, name: &str, value: String) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let proxy = (spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(&mut spec.containers))
    .find(|c| c.name == PROXY);
    if let Some(proxy) = proxy {
        let env = proxy.env.get_or_insert_default();
        env.retain(|e| e.name != name);
        env.push(k8s_openapi::api::core::v1::EnvVar {
            name: name.into(),
            value: Some(value),
            value_from: None,
        });
    }
}
