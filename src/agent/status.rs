//! The agent's status port (Istio's 15020, `--status-port`), what the injected pod's probes
//! and Prometheus's annotations point at, as pilot-agent serves it:
//!
//! - `/healthz/ready`: 200 once Envoy is live (its admin `/ready`), else 503;
//! - `/app-health/CONTAINER/{readyz,livez,startupz}` and `/app-lifecycle/...`: the
//!   application's own probe, from `ISTIO_KUBE_APP_PROBERS`, run from inside the pod
//!   (an HTTP or HTTPS GET answering 200–399, the HTTPS one without verifying the
//!   application's certificate as the kubelet does not either; a TCP connection; or a
//!   gRPC health check), 200 or 503; 404 for a probe the injector did not write;
//! - `/stats/prometheus`: Envoy's metrics, followed by the application's when the injector
//!   kept its scrape settings (`ISTIO_PROMETHEUS_ANNOTATIONS`);
//! - `POST /drain`: Envoy drains its inbound listeners gracefully (the `preStop` hook).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::Value;

/// What the status port knows.
pub struct StatusPort {
    /// Envoy's admin port on localhost.
    pub admin_port: u16,
    /// The application's probes by path (`ISTIO_KUBE_APP_PROBERS`).
    pub probers: BTreeMap<String, Value>,
    /// Where the application's own metrics are scraped (`ISTIO_PROMETHEUS_ANNOTATIONS`).
    pub app_metrics: Option<String>,
}

/// The application's metrics URL from `ISTIO_PROMETHEUS_ANNOTATIONS` (the `prometheus.io`
/// annotations the injector replaced: `scrape`, `path`, `port`), as pilot-agent reads it:
/// none without a port or with `scrape: "false"`; the path defaults to `/metrics`.
pub fn app_metrics_from_env() -> anyhow::Result<Option<String>> {
    let Ok(text) = std::env::var("ISTIO_PROMETHEUS_ANNOTATIONS") else {
        return Ok(None);
    };
    if text.trim().is_empty() {
        return Ok(None);
    }
    let scrape: BTreeMap<String, String> = serde_json::from_str(&text).map_err(|e| {
        anyhow::anyhow!("ISTIO_PROMETHEUS_ANNOTATIONS is not a JSON object of strings: {e}")
    })?;
    if scrape.get("scrape").is_some_and(|s| s == "false") {
        return Ok(None);
    }
    let Some(port) = scrape.get("port") else {
        return Ok(None);
    };
    let port: u16 = port.parse().map_err(|_| {
        anyhow::anyhow!("ISTIO_PROMETHEUS_ANNOTATIONS: port {port:?} is not a port")
    })?;
    let path = scrape.get("path").map_or("/metrics", String::as_str);
    let slash = if path.starts_with('/') { "" } else { "/" };
    Ok(Some(format!("http://localhost:{port}{slash}{path}")))
}

/// Reads `ISTIO_KUBE_APP_PROBERS` (a JSON object; empty when unset).
pub fn probers_from_env() -> anyhow::Result<BTreeMap<String, Value>> {
    match std::env::var("ISTIO_KUBE_APP_PROBERS") {
        Ok(text) if !text.trim().is_empty() => serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("ISTIO_KUBE_APP_PROBERS is not a JSON object: {e}")),
        _ => Ok(BTreeMap::new()),
    }
}

/// Serves the status port on `address` until the task is dropped.
pub async fn serve(address: SocketAddr, status: StatusPort) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| anyhow::anyhow!("binding the status port {address}: {e}"))?;
    let router = Router::new()
        .route("/healthz/ready", get(ready))
        .route("/stats/prometheus", get(prometheus))
        .route("/drain", post(drain))
        .route("/app-health/{container}/{kind}", get(app_health))
        .route("/app-lifecycle/{container}/{kind}", get(app_lifecycle))
        .with_state(Arc::new(status));
    axum::serve(listener, router).await?;
    Ok(())
}

/// One GET of `url`: the status and body, or why it failed.
async fn fetch(url: String, timeout: Duration) -> Result<(u16, String), String> {
    tokio::task::spawn_blocking(move || {
        // The kubelet does not verify an application's certificate for an HTTPS probe.
        let tls = ureq::tls::TlsConfig::builder()
            .disable_verification(true)
            .build();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .tls_config(tls)
            .build()
            .into();
        let mut response = agent.get(&url).call().map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = (response.body_mut().with_config().limit(64 << 20))
            .read_to_string()
            .map_err(|e| e.to_string())?;
        Ok((status, body))
    })
    .await
    .map_err(|e| e.to_string())?
}

async fn ready(State(status): State<Arc<StatusPort>>) -> Response {
    let url = format!("http://127.0.0.1:{}/ready", status.admin_port);
    match fetch(url, Duration::from_secs(1)).await {
        Ok((200, body)) if body.trim() == "LIVE" => StatusCode::OK.into_response(),
        Ok((_, body)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("Envoy: {}", body.trim()),
        )
            .into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("Envoy: {e}")).into_response(),
    }
}

/// Asks Envoy to drain its inbound listeners gracefully, as pilot-agent's `/drain`.
async fn drain(State(status): State<Arc<StatusPort>>) -> Response {
    let url = format!(
        "http://127.0.0.1:{}/drain_listeners?inboundonly&graceful",
        status.admin_port
    );
    let answer = tokio::task::spawn_blocking(move || {
        (super::lifecycle::local_client(Duration::from_secs(5)).post(&url))
            .send_empty()
            .map(|r| r.status().as_u16())
    })
    .await;
    match answer {
        Ok(Ok(200)) => StatusCode::OK.into_response(),
        Ok(Ok(code)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("Envoy answered {code}"),
        )
            .into_response(),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn prometheus(State(status): State<Arc<StatusPort>>) -> Response {
    let url = format!("http://127.0.0.1:{}/stats/prometheus", status.admin_port);
    match fetch(url, Duration::from_secs(5)).await {
        Ok((200, mut body)) => {
            // As pilot-agent: the application's metrics follow Envoy's; if they cannot be
            // had, Envoy's are still served.
            if let Some(url) = &status.app_metrics {
                match fetch(url.clone(), Duration::from_secs(5)).await {
                    Ok((200, app)) => {
                        if !body.ends_with('\n') {
                            body.push('\n');
                        }
                        body.push_str(&app);
                    }
                    Ok((code, _)) => tracing::warn!("the application's metrics {url}: {code}"),
                    Err(e) => tracing::warn!("the application's metrics {url}: {e}"),
                }
            }
            body.into_response()
        }
        Ok((code, _)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("Envoy answered {code}"),
        )
            .into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e).into_response(),
    }
}

async fn app_health(
    State(status): State<Arc<StatusPort>>,
    Path((container, kind)): Path<(String, String)>,
) -> Response {
    probe(&status, format!("/app-health/{container}/{kind}")).await
}

async fn app_lifecycle(
    State(status): State<Arc<StatusPort>>,
    Path((container, kind)): Path<(String, String)>,
) -> Response {
    probe(&status, format!("/app-lifecycle/{container}/{kind}")).await
}

/// Runs the application's probe recorded for `path`, as the kubelet would have.
async fn probe(status: &StatusPort, path: String) -> Response {
    let Some(prober) = status.probers.get(&path) else {
        return (StatusCode::NOT_FOUND, format!("no probe for {path}")).into_response();
    };
    let timeout = Duration::from_secs(prober["timeoutSeconds"].as_u64().unwrap_or(1).max(1));
    let port = |action: &Value| {
        action["port"]
            .as_u64()
            .filter(|p| *p <= u64::from(u16::MAX))
    };
    let outcome = if let Some(http) = prober.get("httpGet") {
        let Some(port) = port(http) else {
            return (StatusCode::INTERNAL_SERVER_ERROR, "the probe has no port").into_response();
        };
        let scheme = match http["scheme"].as_str() {
            Some("HTTPS") => "https",
            _ => "http",
        };
        let host = http["host"].as_str().unwrap_or("localhost");
        let target = http["path"].as_str().unwrap_or("/");
        let url = format!("{scheme}://{host}:{port}{target}");
        match fetch(url, timeout).await {
            Ok((code, _)) if (200..400).contains(&code) => Ok(()),
            Ok((code, _)) => Err(format!("the application answered {code}")),
            Err(e) => Err(e),
        }
    } else if let Some(tcp) = prober.get("tcpSocket") {
        let Some(port) = port(tcp) else {
            return (StatusCode::INTERNAL_SERVER_ERROR, "the probe has no port").into_response();
        };
        let host = tcp["host"].as_str().unwrap_or("localhost").to_string();
        match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port as u16)))
            .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("timed out".to_string()),
        }
    } else if let Some(grpc) = prober.get("grpc") {
        let Some(port) = port(grpc) else {
            return (StatusCode::INTERNAL_SERVER_ERROR, "the probe has no port").into_response();
        };
        let service = grpc["service"].as_str().unwrap_or_default().to_string();
        match tokio::time::timeout(timeout, grpc_health(port as u16, service)).await {
            Ok(outcome) => outcome,
            Err(_) => Err("timed out".to_string()),
        }
    } else {
        Err("the probe is neither httpGet, tcpSocket nor grpc".to_string())
    };
    match outcome {
        Ok(()) => StatusCode::OK.into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason).into_response(),
    }
}

/// A gRPC health check (`grpc.health.v1.Health/Check`) of `service` on the application's
/// `port`, as the kubelet's gRPC probe makes it: passes only when `SERVING`.
async fn grpc_health(port: u16, service: String) -> Result<(), String> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://localhost:{port}"))
        .map_err(|e| e.to_string())?;
    let channel = endpoint.connect().await.map_err(|e| e.to_string())?;
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest { service })
        .await
        .map_err(|status| format!("{}: {}", status.code(), status.message()))?;
    match response.into_inner().status() {
        ServingStatus::Serving => Ok(()),
        other => Err(format!(
            "the application's health is {}",
            other.as_str_name()
        )),
    }
}
