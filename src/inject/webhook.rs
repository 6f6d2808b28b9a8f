//! `/inject` on the webhook port (15017; the revision's Service port 443), as istiod
//! serves it to the API server for the `istio-sidecar-injector[-REV]` and
//! `istio-revision-tag-TAG` MutatingWebhookConfigurations: the AdmissionReview's pod is
//! injected and the difference returned as a JSON patch. A pod left alone is allowed with
//! no patch; one that cannot be injected (an invalid annotation) is refused, naming the
//! annotation. Requests and outcomes are counted in istiod's `sidecar_injection_*`.

use std::sync::{Arc, RwLock};
use std::time::Instant;

use base64::Engine;
use k8s_openapi::api::core::v1::Pod;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use super::{InjectOptions, MeshDefaults, NodeVersions, Skip};
use crate::metrics::Labels;
use model::Store;
use model::mesh::MeshConfig;

/// istiod's injection metrics.
#[derive(Clone)]
pub struct InjectMetrics {
    pub requests: Counter,
    pub success: Counter,
    pub skip: Counter,
    pub failure: Family<Labels, Counter>,
    pub time: Histogram,
}

impl InjectMetrics {
    pub fn register(registry: &mut Registry) -> InjectMetrics {
        let m = InjectMetrics {
            requests: Counter::default(),
            success: Counter::default(),
            skip: Counter::default(),
            failure: Family::default(),
            time: Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0]),
        };
        let r = registry;
        r.register(
            "sidecar_injection_requests_total",
            "Total number of sidecar injection requests.",
            m.requests.clone(),
        );
        r.register(
            "sidecar_injection_success_total",
            "Total number of successful sidecar injection requests.",
            m.success.clone(),
        );
        r.register(
            "sidecar_injection_skip_total",
            "Total number of skipped sidecar injection requests.",
            m.skip.clone(),
        );
        r.register(
            "sidecar_injection_failure_total",
            "Total number of failed sidecar injection requests.",
            m.failure.clone(),
        );
        r.register(
            "sidecar_injection_time_seconds",
            "Total time taken for injection in seconds.",
            m.time.clone(),
        );
        m
    }
}

/// What `/inject` needs: the injection values, the mesh configuration, the nodes.
pub struct Injector {
    pub options: InjectOptions,
    pub store: Arc<RwLock<Store>>,
    pub nodes: NodeVersions,
    pub metrics: InjectMetrics,
}

impl Injector {
    /// The response to one AdmissionReview `request` (without its `uid`) sent to `path`.
    pub fn admit(&self, path: &str, request: &Value) -> Value {
        let started = Instant::now();
        self.metrics.requests.inc();
        let response = self.review(&self.options.for_path(path), request);
        self.metrics.time.observe(started.elapsed().as_secs_f64());
        response
    }

    fn review(&self, options: &InjectOptions, request: &Value) -> Value {
        let fail = |kind: &str, message: String| {
            let labels: Labels = vec![("type", kind.to_string())];
            self.metrics.failure.get_or_create(&labels).inc();
            tracing::warn!("sidecar injection refused: {message}");
            json!({"allowed": false, "status": {"message": message}})
        };
        let pod: Pod = match serde_json::from_value(request["object"].clone()) {
            Ok(pod) => pod,
            Err(e) => return fail("decode", format!("could not decode the pod: {e}")),
        };
        let namespace = (request["namespace"].as_str())
            .or(pod.metadata.namespace.as_deref())
            .unwrap_or("default")
            .to_string();
        let name = (pod.metadata.name.clone())
            .or_else(|| pod.metadata.generate_name.clone())
            .unwrap_or_default();
        if let Err(skip) = super::required(&pod, &namespace, options.policy) {
            self.metrics.skip.inc();
            tracing::debug!(pod = %format!("{namespace}/{name}"), ?skip, "not injected");
            return json!({"allowed": true});
        }
        let mesh = {
            let store = self.store.read().unwrap();
            let config = MeshConfig::from_store(&store);
            let mut default_config = config.default_config.other.clone();
            if let Some(tracing) = &config.default_config.tracing
                && let Ok(v) = serde_json::to_value(tracing)
            {
                default_config.insert("tracing".into(), v);
            }
            MeshDefaults {
                default_config,
                prometheus_merge: config.enable_prometheus_merge != Some(false),
            }
        };
        let original = match serde_json::to_value(&pod) {
            Ok(v) => v,
            Err(e) => return fail("decode", format!("could not encode the pod: {e}")),
        };
        let injected = match super::inject(pod, &namespace, options, &mesh, &self.nodes)
            .and_then(|p| Ok(serde_json::to_value(p)?))
        {
            Ok(v) => v,
            Err(e) => return fail("inject", format!("pod {namespace}/{name}: {e}")),
        };
        let patch = json_patch::diff(&original, &injected);
        let patch = match serde_json::to_vec(&patch) {
            Ok(p) => p,
            Err(e) => return fail("encode", format!("could not encode the patch: {e}")),
        };
        self.metrics.success.inc();
        tracing::info!(pod = %format!("{namespace}/{name}"), revision = %options.revision, "injected");
        json!({
            "allowed": true,
            "patchType": "JSONPatch",
            "patch": base64::engine::general_purpose::STANDARD.encode(patch),
        })
    }
}

/// Why a pod was left alone, for the debug log.
impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Skip::HostNetwork => "host network",
            Skip::IgnoredNamespace => "system namespace",
            Skip::OptedOut => "sidecar.istio.io/inject is false",
            Skip::PolicyDisabled => "policy disabled and no opt-in",
        })
    }
}
