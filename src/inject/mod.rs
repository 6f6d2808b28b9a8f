//! Sidecar injection, as istiod's `/inject` webhook does it: whether a pod gets a proxy
//! (istiod's `injectRequired`), and the pod it becomes: Istio's `sidecar` template with
//! meshd's agent in the `istio-proxy` container, the capture init container, the volumes,
//! labels and annotations, probes rewritten through the agent, and Prometheus's
//! annotations moved to the agent. The result is what Istio's injector writes for the same
//! pod, field for field, except the images and the proxy container's command, which are
//! meshd's.

pub mod probes;
pub mod template;
pub mod webhook;

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

/// The annotation and label a pod opts in or out with.
pub const INJECT: &str = "sidecar.istio.io/inject";
/// The annotation recording what was injected.
pub const STATUS: &str = "sidecar.istio.io/status";
pub const PROXY_CONFIG: &str = "proxy.istio.io/config";
pub const NATIVE_SIDECAR: &str = "sidecar.istio.io/nativeSidecar";
/// Namespaces whose pods are never injected (istiod's `IgnoredNamespaces`).
pub const IGNORED_NAMESPACES: [&str; 4] = [
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "local-path-storage",
];
/// The minor release of Kubernetes whose kubelets run native sidecars (stable in 1.33).
const NATIVE_SIDECAR_MINOR: u32 = 33;

/// `ENABLE_NATIVE_SIDECARS`: the proxy as an init container with `restartPolicy: Always`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NativeSidecars {
    On,
    Off,
    /// On when the pod's node (or, unscheduled, every node) runs kubelet 1.33 or later.
    Auto,
}

impl std::str::FromStr for NativeSidecars {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "true" => Ok(NativeSidecars::On),
            "false" => Ok(NativeSidecars::Off),
            "auto" | "" => Ok(NativeSidecars::Auto),
            other => Err(format!("{other:?} is not true, false or auto")),
        }
    }
}

/// `global.proxy.autoInject`: whether pods that say nothing are injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Enabled,
    Disabled,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "enabled" => Ok(Policy::Enabled),
            "disabled" => Ok(Policy::Disabled),
            other => Err(format!("{other:?} is not enabled or disabled")),
        }
    }
}

/// What the injector is configured with (istiod's injection values).
#[derive(Clone, Debug)]
pub struct InjectOptions {
    /// The revision injecting (`default` for a plain install).
    pub revision: String,
    /// meshd's own namespace (`istio-system`), where its Service is.
    pub istio_namespace: String,
    /// The image of `istio-proxy` and `istio-init`: meshd's agent with Envoy.
    pub proxy_image: String,
    pub trust_domain: String,
    /// `ISTIO_META_CLUSTER_ID` (`global.multiCluster.clusterName`).
    pub cluster_id: String,
    /// `ISTIO_META_MESH_ID`; the trust domain when unset.
    pub mesh_id: Option<String>,
    pub native_sidecars: NativeSidecars,
    pub policy: Policy,
    /// Kubernetes mode: write meshd's root into the revision's MutatingWebhookConfigurations.
    pub patch_ca_bundle: bool,
    /// The network the pods are on (`ISTIO_META_NETWORK`, label
    /// `topology.istio.io/network`); from the webhook's path (`/inject/net/NET`).
    pub network: Option<String>,
    /// More proxy environment from the webhook's path (`/inject/KEY/VALUE`).
    pub path_env: Vec<(String, String)>,
}

impl InjectOptions {
    /// The options for a request to `/inject/K1/V1/K2/V2...`, as istiod reads the path:
    /// `cluster` is `ISTIO_META_CLUSTER_ID`, `net` the network, any other key an
    /// upper-cased environment variable; `--slash--` in a value is `/`.
    pub fn for_path(&self, path: &str) -> InjectOptions {
        let mut options = self.clone();
        let segments: Vec<&str> = (path.trim_start_matches("/inject").split('/'))
            .filter(|s| !s.is_empty())
            .collect();
        for pair in segments.chunks_exact(2) {
            let value = pair[1].replace("--slash--", "/");
            match pair[0] {
                "cluster" => options.cluster_id = value,
                "net" => options.network = Some(value),
                key => options.path_env.push((key.to_uppercase(), value)),
            }
        }
        options
    }
}

impl InjectOptions {
    /// The address proxies reach meshd's CA and xDS at: `istiod[-REV].NS.svc:15012`.
    pub fn ca_address(&self) -> String {
        format!("{}.{}.svc:15012", self.service_name(), self.istio_namespace)
    }

    /// meshd's Service for this revision (`istiod`, or `istiod-REV`).
    pub fn service_name(&self) -> String {
        if self.revision.is_empty() || self.revision == "default" {
            "istiod".to_string()
        } else {
            format!("istiod-{}", self.revision)
        }
    }
}

/// The kubelet versions of the cluster's nodes, for [`NativeSidecars::Auto`]; `None`
/// without a cluster (then native sidecars stay off, as istiod without a node client).
#[derive(Clone, Default)]
pub struct NodeVersions(Arc<RwLock<Option<BTreeMap<String, String>>>>);

impl NodeVersions {
    /// Replaces what is known (node name → `status.nodeInfo.kubeletVersion`).
    pub fn set(&self, nodes: BTreeMap<String, String>) {
        *self.0.write().unwrap() = Some(nodes);
    }

    /// Whether the node `node` (or every node, when `None`) runs native sidecars.
    pub fn native(&self, node: Option<&str>) -> bool {
        let nodes = self.0.read().unwrap();
        let Some(nodes) = nodes.as_ref() else {
            return false;
        };
        if let Some(version) = node.and_then(|n| nodes.get(n)) {
            return kubelet_runs_native_sidecars(version);
        }
        nodes.values().all(|v| kubelet_runs_native_sidecars(v))
    }
}

/// `v1.33.2` and later (an unreadable version counts as too old).
fn kubelet_runs_native_sidecars(version: &str) -> bool {
    let mut parts = version.trim_start_matches('v').split('.');
    let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
        return false;
    };
    let minor: String = minor.chars().take_while(char::is_ascii_digit).collect();
    major == "1"
        && minor
            .parse::<u32>()
            .is_ok_and(|m| m >= NATIVE_SIDECAR_MINOR)
}

/// Why a pod is left alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skip {
    HostNetwork,
    IgnoredNamespace,
    OptedOut,
    /// Policy `disabled` and the pod did not opt in.
    PolicyDisabled,
}

/// A pod that cannot be injected: its creation is refused, with the reason.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("annotation {annotation}: {reason}")]
    Annotation {
        annotation: &'static str,
        reason: String,
    },
    #[error("the pod could not be read: {0}")]
    Pod(#[from] serde_json::Error),
}

/// What the mesh configuration says about injection.
#[derive(Clone, Debug, Default)]
pub struct MeshDefaults {
    /// `defaultConfig`, as written in the mesh config (JSON).
    pub default_config: serde_json::Map<String, Value>,
    /// `enablePrometheusMerge` (on unless `false`).
    pub prometheus_merge: bool,
}

/// istiod's `injectRequired`: the pod's own choice first (the label wins over the
/// annotation; only `true` and `false` count), then the policy.
pub fn required(pod: &Pod, namespace: &str, policy: Policy) -> Result<(), Skip> {
    if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
        return Err(Skip::HostNetwork);
    }
    if IGNORED_NAMESPACES.contains(&namespace) {
        return Err(Skip::IgnoredNamespace);
    }
    let meta = &pod.metadata;
    let choice = (meta.labels.as_ref().and_then(|l| l.get(INJECT)))
        .or_else(|| meta.annotations.as_ref().and_then(|a| a.get(INJECT)));
    match (choice.map(String::as_str), policy) {
        (Some("true"), _) => Ok(()),
        (Some("false"), _) => Err(Skip::OptedOut),
        (_, Policy::Enabled) => Ok(()),
        (_, Policy::Disabled) => Err(Skip::PolicyDisabled),
    }
}

/// The pod with its sidecar: `pod` as the API server sent it, in `namespace`.
pub fn inject(
    mut pod: Pod,
    namespace: &str,
    options: &InjectOptions,
    mesh: &MeshDefaults,
    nodes: &NodeVersions,
) -> Result<Pod, InjectError> {
    let earlier_probers = template::remove_injected(&mut pod);
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let proxy_config = proxy_config(&mesh.default_config, annotations.get(PROXY_CONFIG))?;
    let native = match annotations.get(NATIVE_SIDECAR).map(String::as_str) {
        Some("true") => true,
        Some("false") => false,
        _ => match options.native_sidecars {
            NativeSidecars::On => true,
            NativeSidecars::Off => false,
            NativeSidecars::Auto => {
                nodes.native(pod.spec.as_ref().and_then(|s| s.node_name.as_deref()))
            }
        },
    };
    let hold = proxy_config
        .get("holdApplicationUntilProxyStarts")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let rendered = template::Rendered::new(&pod, namespace, options, &proxy_config, native, hold)?;
    rendered.apply(&mut pod, namespace);
    probes::rewrite(&mut pod, template::STATUS_PORT, earlier_probers);
    probes::prometheus(&mut pod, mesh.prometheus_merge, template::STATUS_PORT);
    Ok(pod)
}

/// The proxy's configuration: the mesh's `defaultConfig` with the pod's
/// `proxy.istio.io/config` annotation over it, field by field.
fn proxy_config(
    defaults: &serde_json::Map<String, Value>,
    annotation: Option<&String>,
) -> Result<serde_json::Map<String, Value>, InjectError> {
    let mut config = defaults.clone();
    if let Some(text) = annotation {
        let overlay: Value = serde_saphyr::from_str(text).map_err(|e| InjectError::Annotation {
            annotation: PROXY_CONFIG,
            reason: e.to_string(),
        })?;
        let Value::Object(overlay) = overlay else {
            return Err(InjectError::Annotation {
                annotation: PROXY_CONFIG,
                reason: "not an object".into(),
            });
        };
        for (k, v) in overlay {
            config.insert(k, v);
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests;
