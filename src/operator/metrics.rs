//! The operator's metrics, under controller-runtime's names (what Sail and every Kubebuilder
//! operator export, so existing operator dashboards read them), served with `/healthz` and
//! `/readyz`.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::Context;

type Labels = Vec<(&'static str, String)>;

/// Reconciles counted and timed per controller.
pub struct OperatorMetrics {
    registry: Registry,
    /// `controller_runtime_reconcile_total{controller,result}`.
    reconciles: Family<Labels, Counter>,
    /// `controller_runtime_reconcile_errors_total{controller}`.
    errors: Family<Labels, Counter>,
    /// `controller_runtime_reconcile_time_seconds{controller}`.
    time: Family<Labels, Histogram>,
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let reconciles = Family::default();
        registry.register(
            "controller_runtime_reconcile",
            "Reconciles per controller and result",
            reconciles.clone(),
        );
        let errors = Family::default();
        registry.register(
            "controller_runtime_reconcile_errors",
            "Reconciles that failed, per controller",
            errors.clone(),
        );
        let time = Family::<Labels, Histogram>::new_with_constructor(|| {
            // controller-runtime's buckets, in seconds.
            Histogram::new([
                0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6,
                0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0,
                8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0,
            ])
        });
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Time of one reconcile, per controller",
            time.clone(),
        );
        OperatorMetrics {
            registry,
            reconciles,
            errors,
            time,
        }
    }
}

impl OperatorMetrics {
    pub fn observe(&self, controller: &str, took: Duration, ok: bool) {
        let label = vec![("controller", controller.to_string())];
        self.time.get_or_create(&label).observe(took.as_secs_f64());
        let result = if ok { "success" } else { "error" };
        let mut with_result = label.clone();
        with_result.push(("result", result.into()));
        self.reconciles.get_or_create(&with_result).inc();
        if !ok {
            self.errors.get_or_create(&label).inc();
        }
    }

    /// The Prometheus text exposition, with the process's CPU and memory.
    pub fn render(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("BUG: encoding to a String cannot fail");
        let mut out = text.replace("# EOF\n", "");
        out.push_str(&crate::metrics::process_text());
        out
    }
}

async fn metrics(State(ctx): State<Arc<Context>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        ctx.metrics.render(),
    )
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener`.
pub async fn serve(listener: tokio::net::TcpListener, ctx: Arc<Context>) -> anyhow::Result<()> {
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .with_state(ctx);
    axum::serve(listener, router).await?;
    Ok(())
}
