//! The webhook port 15017: sidecar injection (`/inject`, [`crate::inject::webhook`]) and
//! the validation webhook (`/validate`), as istiod serves it to the API server
//! for the `istio-validator-*` and `istiod-default-validator` ValidatingWebhookConfigurations
//! (their Service's port 443 targets 15017). The AdmissionReview's object is parsed and
//! validated as the file and Kubernetes sources and `meshd validate` do: errors deny it,
//! naming each field; warnings are returned as the response's warnings. Verdicts are
//! counted in istiod's `galley_validation_passed`, `galley_validation_failed{reason}` and
//! `galley_validation_http_error{status}`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header::CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio_stream::StreamExt;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::inject::webhook::Injector;
use crate::metrics::Labels;
use model::config::parse::parse_value;
use model::config::{ConfigIssue, Kind, Level};

/// The validation webhook's verdicts and HTTP errors, and the writes of meshd's root into
/// the webhook configurations' `caBundle` (istiod's `galley_validation_*`).
#[derive(Clone, Default)]
pub struct ValidationMetrics {
    pub passed: Family<Labels, Counter>,
    pub failed: Family<Labels, Counter>,
    pub http_error: Family<Labels, Counter>,
    pub config_updates: Counter,
    pub config_update_error: Family<Labels, Counter>,
}

impl ValidationMetrics {
    pub fn register(registry: &mut Registry) -> ValidationMetrics {
        let m = ValidationMetrics::default();
        let r = registry;
        r.register(
            "galley_validation_passed",
            "Resource is valid",
            m.passed.clone(),
        );
        r.register(
            "galley_validation_failed",
            "Resource validation failed",
            m.failed.clone(),
        );
        r.register(
            "galley_validation_http_error",
            "Resource validation http serve errors",
            m.http_error.clone(),
        );
        r.register(
            "galley_validation_config_updates",
            "k8s webhook configuration updates",
            m.config_updates.clone(),
        );
        r.register(
            "galley_validation_config_update_error",
            "k8s webhook configuration update error",
            m.config_update_error.clone(),
        );
        m
    }
}

/// What the webhook port serves with: the validation metrics, and the injector when
/// injection is on.
#[derive(Clone)]
pub struct WebhookState {
    pub validation: ValidationMetrics,
    pub injector: Option<Arc<Injector>>,
}

/// The webhook's routes: `/validate` and `/validate/`, as istiod's, and `/inject` (with
/// any path below it) when injection is on.
pub fn router(state: WebhookState) -> Router {
    let mut router = Router::new()
        .route("/validate", post(serve_validate))
        .route("/validate/", post(serve_validate));
    if state.injector.is_some() {
        router = router
            .route("/inject", post(serve_inject))
            .route("/inject/", post(serve_inject))
            .route("/inject/{*params}", post(serve_inject));
    }
    router.with_state(state)
}

/// The TLS connections of [`transport::tls::incoming_with_alpn`], as axum accepts connections.
pub struct TlsListener<S> {
    pub incoming: S,
    pub local: SocketAddr,
}

impl<S, Io> axum::serve::Listener for TlsListener<S>
where
    S: tokio_stream::Stream<Item = std::io::Result<Io>> + Unpin + Send + 'static,
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    type Io = Io;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Io, SocketAddr) {
        loop {
            match self.incoming.next().await {
                Some(Ok(io)) => return (io, self.local),
                Some(Err(e)) => tracing::info!("webhook connection failed: {e}"),
                // The accept loop ended: nothing more will come.
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// istiod's `serve`: a JSON body, an AdmissionReview of any version answered in the same
/// version, the request's uid echoed.
async fn serve_validate(
    State(state): State<WebhookState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let metrics = &state.validation;
    let http_error = |status: StatusCode| {
        let labels: Labels = vec![("status", status.as_u16().to_string())];
        metrics.http_error.get_or_create(&labels).inc();
    };
    serve_review(&headers, &body, http_error, |request| {
        admit(metrics, request)
    })
}

/// istiod's `serveInject`: the same envelope as `/validate`, answered with a JSON patch.
async fn serve_inject(
    State(state): State<WebhookState>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(injector) = state.injector else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let http_error = |status: StatusCode| {
        let labels: Labels = vec![("type", format!("http_{}", status.as_u16()))];
        injector.metrics.failure.get_or_create(&labels).inc();
    };
    serve_review(&headers, &body, http_error, |request| {
        injector.admit(uri.path(), request)
    })
}

/// An AdmissionReview in, its `response` from `admit`, in the request's version and with
/// its uid; a missing body or a body that is not JSON is an HTTP error, counted by
/// `http_error`.
fn serve_review(
    headers: &HeaderMap,
    body: &[u8],
    http_error: impl Fn(StatusCode),
    admit: impl FnOnce(&Value) -> Value,
) -> Response {
    if body.is_empty() {
        http_error(StatusCode::BAD_REQUEST);
        return (StatusCode::BAD_REQUEST, "no body found").into_response();
    }
    let content_type = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok());
    if content_type != Some("application/json") {
        http_error(StatusCode::UNSUPPORTED_MEDIA_TYPE);
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid Content-Type, want `application/json`",
        )
            .into_response();
    }
    let review: Value = match serde_json::from_slice(body) {
        Ok(review @ Value::Object(_)) => review,
        Ok(_) => json!({}),
        Err(e) => {
            let response = denied(format!("could not decode body: {e}"));
            return axum::Json(json!({"kind": "AdmissionReview", "response": response}))
                .into_response();
        }
    };
    let request = &review["request"];
    let mut response = if request.is_object() {
        admit(request)
    } else {
        denied("could not decode object: the AdmissionReview has no request".into())
    };
    response["uid"] = request["uid"].clone();
    let api_version = review["apiVersion"]
        .as_str()
        .unwrap_or("admission.k8s.io/v1");
    axum::Json(json!({
        "apiVersion": api_version,
        "kind": "AdmissionReview",
        "response": response,
    }))
    .into_response()
}

/// istiod's `validate`: CREATE and UPDATE of an Istio kind are checked, anything else is
/// allowed (and counted as an unsupported operation).
fn admit(metrics: &ValidationMetrics, request: &Value) -> Value {
    let resource = &request["resource"];
    let field = |name: &str| resource[name].as_str().unwrap_or_default().to_string();
    let labels: Labels = vec![
        ("group", field("group")),
        ("version", field("version")),
        ("resource", field("resource")),
    ];
    let dry_run = request["dryRun"].as_bool() == Some(true);
    let failed = |reason: &str| {
        if !dry_run {
            let mut labels = labels.clone();
            labels.push(("reason", reason.to_string()));
            metrics.failed.get_or_create(&labels).inc();
        }
    };
    match request["operation"].as_str() {
        Some("CREATE" | "UPDATE") => {}
        _ => {
            failed("unsupported_operation");
            return json!({"allowed": true});
        }
    }
    let object = &request["object"];
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    match Kind::from_api(api_version, kind) {
        Some((k, _)) if k.is_istio() => {}
        _ => {
            failed("unknown_type");
            return denied(format!("unrecognized type {api_version}, Kind={kind}"));
        }
    }
    let parsed = parse_value("admission", object.clone());
    let errors: Vec<String> = parsed.errors().map(issue_text).collect();
    if !errors.is_empty() {
        failed("invalid_resource");
        return denied(format!("configuration is invalid: {}", errors.join("; ")));
    }
    metrics.passed.get_or_create(&labels).inc();
    let warnings: Vec<String> = (parsed.issues.iter())
        .filter(|i| i.level == Level::Warning)
        .map(issue_text)
        .collect();
    if warnings.is_empty() {
        json!({"allowed": true})
    } else {
        json!({"allowed": true, "warnings": warnings})
    }
}

fn denied(message: String) -> Value {
    json!({"allowed": false, "status": {"message": message}})
}

/// An issue as the API server shows it to `kubectl`: the field, then what is wrong.
fn issue_text(issue: &ConfigIssue) -> String {
    if issue.field.is_empty() {
        issue.message.clone()
    } else {
        format!("{}: {}", issue.field, issue.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(operation: &str, object: Value) -> Value {
        json!({
            "uid": "u-1",
            "operation": operation,
            "resource": {"group": "networking.istio.io", "version": "v1", "resource": "virtualservices"},
            "object": object,
        })
    }

    fn vs(regex: &str) -> Value {
        json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "VirtualService",
            "metadata": {"name": "reviews", "namespace": "shop"},
            "spec": {"hosts": ["reviews"], "http": [{"match": [{"uri": {"regex": regex}}], "route": [{"destination": {"host": "reviews"}}]}]},
        })
    }

    #[test]
    fn an_invalid_object_is_denied_naming_its_field_and_counted_by_reason() {
        let all = crate::metrics::Metrics::new();
        let metrics = &all.validation;
        let denied = admit(metrics, &request("CREATE", vs("(unclosed")));
        assert_eq!(denied["allowed"], false);
        let message = denied["status"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("configuration is invalid: spec.http[0].match[0].uri.regex: "),
            "{message}"
        );
        let allowed = admit(metrics, &request("UPDATE", vs("^/v[0-9]+$")));
        assert_eq!(allowed, json!({"allowed": true}));
        // Deletes are not checked; dry runs are not counted as failures.
        assert_eq!(
            admit(metrics, &request("DELETE", Value::Null)),
            json!({"allowed": true})
        );
        let mut dry = request("CREATE", vs("(unclosed"));
        dry["dryRun"] = json!(true);
        assert_eq!(admit(metrics, &dry)["allowed"], false);
        let text = all.render();
        for line in [
            r#"galley_validation_failed{group="networking.istio.io",version="v1",resource="virtualservices",reason="invalid_resource"} 1"#,
            r#"galley_validation_failed{group="networking.istio.io",version="v1",resource="virtualservices",reason="unsupported_operation"} 1"#,
            r#"galley_validation_passed{group="networking.istio.io",version="v1",resource="virtualservices"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }

    #[test]
    fn warnings_are_returned_and_other_kinds_refused() {
        let metrics = &ValidationMetrics::default();
        let mut object = vs("^/a$");
        object["spec"]["http"][0]["fault"] = json!({"delay": {"exponentialDelay": "1s"}});
        let allowed = admit(metrics, &request("CREATE", object));
        assert_eq!(allowed["allowed"], true);
        assert_eq!(
            allowed["warnings"],
            json!([
                "spec.http[0].fault.delay.exponentialDelay: accepted but not yet applied by meshd"
            ])
        );
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
        let refused = admit(metrics, &request("CREATE", pod));
        assert_eq!(
            refused["status"]["message"],
            "unrecognized type v1, Kind=Pod"
        );
    }
}
