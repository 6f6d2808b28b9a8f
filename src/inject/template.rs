//! Istio's `sidecar` injection template, rendered for one pod: the `istio-init` capture
//! container, the `istio-proxy` container (meshd's agent with Envoy), their volumes, and
//! the labels and annotations the injector adds. Field order, names and values follow
//! `injection-template.yaml` of Istio's `istio-discovery` chart.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, Volume};
use serde_json::{Map, Value, json};

use super::{InjectError, InjectOptions, STATUS};

/// The agent's status port: app probes and merged metrics (`status.sidecar.istio.io/port`).
pub const STATUS_PORT: u16 = 15020;
/// The user id Envoy and the agent run as; capture leaves its traffic alone.
pub const PROXY_UID: i64 = 1337;

const INIT: &str = "istio-init";
const PROXY: &str = "istio-proxy";
const TRAFFIC: &str = "traffic.sidecar.istio.io/";

/// The injected containers and volumes for one pod.
pub struct Rendered {
    /// `None` without capture (interception `NONE`, not native).
    init: Option<Container>,
    proxy: Container,
    volumes: Vec<Volume>,
    native: bool,
    hold: bool,
    revision: String,
    network: Option<String>,
}

/// The annotation `traffic.sidecar.istio.io/NAME`, or `default`.
fn traffic<'a>(annotations: &'a BTreeMap<String, String>, name: &str, default: &'a str) -> &'a str {
    annotations
        .get(&format!("{TRAFFIC}{name}"))
        .map_or(default, String::as_str)
}

/// The volumes every injected pod gets, in Istio's order.
fn volumes() -> Vec<Value> {
    vec![
        // Without a source, as Istio's template writes them (the API server makes them
        // empty directories).
        json!({"name": "workload-socket"}),
        json!({"name": "credential-socket"}),
        json!({"name": "workload-certs"}),
        json!({"name": "istio-envoy", "emptyDir": {"medium": "Memory"}}),
        json!({"name": "istio-data", "emptyDir": {}}),
        json!({"name": "istio-podinfo", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
        ]}}),
        json!({"name": "istio-token", "projected": {"sources": [
            {"serviceAccountToken": {"path": "istio-token", "expirationSeconds": 43200, "audience": "istio-ca"}},
        ]}}),
        json!({"name": "istiod-ca-cert", "configMap": {"name": "istio-ca-root-cert"}}),
        json!({"name": "istio-ca-crl", "configMap": {"name": "istio-ca-crl", "optional": true}}),
    ]
}

fn mounts() -> Value {
    json!([
        {"name": "workload-socket", "mountPath": "/var/run/secrets/workload-spiffe-uds"},
        {"name": "credential-socket", "mountPath": "/var/run/secrets/credential-uds"},
        {"name": "workload-certs", "mountPath": "/var/run/secrets/workload-spiffe-credentials"},
        {"name": "istiod-ca-cert", "mountPath": "/var/run/secrets/istio"},
        {"name": "istio-ca-crl", "mountPath": "/var/run/secrets/istio/crl"},
        {"name": "istio-data", "mountPath": "/var/lib/istio/data"},
        {"name": "istio-envoy", "mountPath": "/etc/istio/proxy"},
        {"name": "istio-token", "mountPath": "/var/run/secrets/tokens"},
        {"name": "istio-podinfo", "mountPath": "/etc/istio/pod"},
    ])
}

fn resources() -> Value {
    json!({"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "100m", "memory": "128Mi"}})
}

fn field(path: &str) -> Value {
    json!({"fieldRef": {"fieldPath": path}})
}

fn resource(name: &str) -> Value {
    json!({"resourceFieldRef": {"resource": name, "divisor": "1"}})
}

/// The workload a pod belongs to, and its `ISTIO_META_OWNER`, as istiod derives them
/// (`GetDeployMetaFromPod`): a ReplicaSet named after its pod-template hash is its
/// Deployment; a pod with no controller (or a fixed name) is its own workload.
pub fn workload(pod: &Pod, namespace: &str) -> (String, String) {
    let w = model::config::workload::PodWorkload::of(&pod.metadata);
    let owner = format!(
        "kubernetes://apis/{}/namespaces/{namespace}/{}s/{}",
        w.api_version,
        w.kind.to_lowercase(),
        w.name
    );
    (w.name, owner)
}

/// Istio's `cleanProxyConfig`: the proxy configuration without the values that are
/// ProxyConfig's defaults anyway, as compact JSON and a newline.
fn proxy_config_env(config: &Map<String, Value>) -> String {
    let defaults = [
        ("configPath", json!("./etc/istio/proxy")),
        ("binaryPath", json!("/usr/local/bin/envoy")),
        ("serviceCluster", json!("istio-proxy")),
        ("drainDuration", json!("45s")),
        ("terminationDrainDuration", json!("5s")),
        ("discoveryAddress", json!("istiod.istio-system.svc:15012")),
    ];
    let mut config = config.clone();
    for (key, default) in defaults {
        if config.get(key) == Some(&default) {
            config.remove(key);
        }
    }
    format!("{}\n", Value::Object(config))
}

impl Rendered {
    pub fn new(
        pod: &Pod,
        namespace: &str,
        options: &InjectOptions,
        proxy_config: &Map<String, Value>,
        native: bool,
        hold: bool,
    ) -> Result<Rendered, InjectError> {
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let interception = annotations
            .get("sidecar.istio.io/interceptionMode")
            .cloned()
            .or_else(|| {
                proxy_config
                    .get("interceptionMode")
                    .and_then(|v| v.as_str().map(String::from))
            })
            .unwrap_or_else(|| "REDIRECT".into());
        if !["REDIRECT", "TPROXY", "NONE"].contains(&interception.as_str()) {
            return Err(InjectError::Annotation {
                annotation: "sidecar.istio.io/interceptionMode",
                reason: format!("{interception:?} is not REDIRECT, TPROXY or NONE"),
            });
        }
        let exclude_inbound = match traffic(&annotations, "excludeInboundPorts", "") {
            "" => format!("15090,15021,{STATUS_PORT}"),
            more => format!("15090,15021,{STATUS_PORT},{more}"),
        };
        let mut init_args = vec![
            "agent".to_string(),
            "iptables".into(),
            "-p".into(),
            "15001".into(),
            "-z".into(),
            "15006".into(),
            "-u".into(),
            PROXY_UID.to_string(),
            "-m".into(),
            interception.clone(),
            "-i".into(),
            traffic(&annotations, "includeOutboundIPRanges", "*").into(),
            "-x".into(),
            traffic(&annotations, "excludeOutboundIPRanges", "").into(),
            "-b".into(),
            traffic(&annotations, "includeInboundPorts", "*").into(),
            "-d".into(),
            exclude_inbound,
        ];
        for (flag, name) in [
            ("-q", "includeOutboundPorts"),
            ("-o", "excludeOutboundPorts"),
            ("-k", "kubevirtInterfaces"),
            ("-c", "excludeInterfaces"),
        ] {
            if let Some(value) = annotations.get(&format!("{TRAFFIC}{name}")) {
                init_args.extend([flag.to_string(), value.clone()]);
            }
        }
        init_args.push("--log_output_level=default:info".into());
        let init = json!({
            "name": INIT,
            "image": options.proxy_image,
            "args": init_args,
            "resources": resources(),
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "privileged": false,
                "capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]},
                "readOnlyRootFilesystem": false,
                "runAsGroup": 0,
                "runAsNonRoot": false,
                "runAsUser": 0
            }
        });

        let spec = pod.spec.clone().unwrap_or_default();
        let app: Vec<&Container> = spec.containers.iter().filter(|c| c.name != PROXY).collect();
        let ports: Vec<Value> = (app.iter())
            .flat_map(|c| c.container_port_values())
            .collect();
        let ports = if ports.is_empty() {
            "[\n]".to_string()
        } else {
            let lines: Vec<String> = ports.iter().map(|p| format!("    {p}")).collect();
            format!("[\n{}\n]", lines.join(",\n"))
        };
        let (workload_name, owner) = workload(pod, namespace);
        let workload_name = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("service.istio.io/workload-name"))
            .cloned()
            .unwrap_or(workload_name);
        let app_names: Vec<&str> = app.iter().map(|c| c.name.as_str()).collect();
        let mesh_id = options
            .mesh_id
            .clone()
            .unwrap_or_else(|| options.trust_domain.clone());
        let env = json!([
            {"name": "PILOT_CERT_PROVIDER", "value": "istiod"},
            {"name": "CA_ADDR", "value": options.ca_address()},
            {"name": "POD_NAME", "valueFrom": field("metadata.name")},
            {"name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace")},
            {"name": "INSTANCE_IP", "valueFrom": field("status.podIP")},
            {"name": "SERVICE_ACCOUNT", "valueFrom": field("spec.serviceAccountName")},
            {"name": "HOST_IP", "valueFrom": field("status.hostIP")},
            {"name": "ISTIO_CPU_LIMIT", "valueFrom": resource("limits.cpu")},
            {"name": "PROXY_CONFIG", "value": proxy_config_env(proxy_config)},
            {"name": "ISTIO_META_POD_PORTS", "value": ports},
            {"name": "ISTIO_META_APP_CONTAINERS", "value": app_names.join(",")},
            {"name": "GOMEMLIMIT", "valueFrom": resource("limits.memory")},
            {"name": "GOMAXPROCS", "valueFrom": resource("limits.cpu")},
            {"name": "ISTIO_META_CLUSTER_ID", "value": options.cluster_id},
            {"name": "ISTIO_META_NODE_NAME", "valueFrom": field("spec.nodeName")},
            {"name": "ISTIO_META_INTERCEPTION_MODE", "value": interception},
            {"name": "ISTIO_META_WORKLOAD_NAME", "value": workload_name},
            {"name": "ISTIO_META_OWNER", "value": owner},
            {"name": "ISTIO_META_MESH_ID", "value": mesh_id},
            {"name": "TRUST_DOMAIN", "value": options.trust_domain},
        ]);
        let mut env = env;
        let list = env.as_array_mut().expect("a list");
        if let Some(network) = &options.network {
            let at = list
                .iter()
                .position(|e| e["name"] == "ISTIO_META_WORKLOAD_NAME")
                .unwrap_or(list.len());
            list.insert(at, json!({"name": "ISTIO_META_NETWORK", "value": network}));
        }
        for (name, value) in &options.path_env {
            list.retain(|e| e["name"] != name.as_str());
            list.push(json!({"name": name, "value": value}));
        }
        let ready = json!({"httpGet": {"path": "/healthz/ready", "port": 15021}});
        let mut proxy = json!({
            "name": PROXY,
            "image": options.proxy_image,
            "args": [
                "agent",
                "--proxy-type", "sidecar",
                "--ca-server-name", format!("{}.{}.svc", options.service_name(), options.istio_namespace),
                "--token-file", "/var/run/secrets/tokens/istio-token",
                "--bootstrap", "/etc/istio/proxy/envoy-rev.json",
                "--sds-socket", "/var/run/secrets/workload-spiffe-uds/socket",
                "--pod-info", "/etc/istio/pod",
                "--status-port", STATUS_PORT.to_string(),
                "--envoy", "/usr/local/bin/envoy",
            ],
            "env": env,
            "ports": [{"containerPort": 15090, "protocol": "TCP", "name": "http-envoy-prom"}],
            "readinessProbe": {
                "httpGet": ready["httpGet"],
                "periodSeconds": 15, "timeoutSeconds": 3, "failureThreshold": 4
            },
            "startupProbe": {
                "httpGet": ready["httpGet"],
                "periodSeconds": 1, "timeoutSeconds": 3, "failureThreshold": 600
            },
            "resources": resources(),
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]},
                "privileged": false,
                "readOnlyRootFilesystem": true,
                "runAsGroup": PROXY_UID,
                "runAsNonRoot": true,
                "runAsUser": PROXY_UID
            },
            "volumeMounts": mounts(),
        });
        if native {
            proxy["restartPolicy"] = json!("Always");
            // Envoy drains its inbound listeners before the pod goes.
            proxy["lifecycle"] = json!({"preStop": {"exec": {"command": [
                "meshd", "agent", "request", format!("--debug-port={STATUS_PORT}"), "POST", "drain"
            ]}}});
        } else if hold {
            // The application's containers start once Envoy is ready.
            proxy["lifecycle"] =
                json!({"postStart": {"exec": {"command": ["meshd", "agent", "wait"]}}});
        }
        let volumes = volumes()
            .into_iter()
            .map(serde_json::from_value)
            .collect::<Result<_, _>>()?;
        // Without capture there is nothing to set up, unless the proxy is a native sidecar.
        let capture = interception != "NONE" || native;
        Ok(Rendered {
            init: if capture {
                Some(serde_json::from_value(init)?)
            } else {
                None
            },
            proxy: serde_json::from_value(proxy)?,
            volumes,
            native,
            hold: hold && !native,
            revision: options.revision.clone(),
            network: options.network.clone(),
        })
    }

    /// Adds the containers, volumes, labels and annotations to `pod`.
    pub fn apply(self, pod: &mut Pod, namespace: &str) {
        let spec = pod.spec.get_or_insert_default();
        let first_app = spec
            .containers
            .first()
            .map(|c| c.name.clone())
            .unwrap_or_default();
        let has_init = self.init.is_some();
        let mut init_containers = spec.init_containers.take().unwrap_or_default();
        if self.native {
            // First, so that the user's init containers run meshed.
            let ours = self.init.into_iter().chain([self.proxy]);
            init_containers.splice(0..0, ours);
        } else {
            init_containers.extend(self.init);
            if self.hold {
                spec.containers.insert(0, self.proxy);
            } else {
                spec.containers.push(self.proxy);
            }
        }
        spec.init_containers = (!init_containers.is_empty()).then_some(init_containers);
        let volume_names: Vec<String> = self.volumes.iter().map(|v| v.name.clone()).collect();
        spec.volumes.get_or_insert_default().extend(self.volumes);

        let (init_list, container_list): (Vec<&str>, Vec<&str>) = match (self.native, has_init) {
            (true, true) => (vec![INIT, PROXY], vec![]),
            (true, false) => (vec![PROXY], vec![]),
            (false, true) => (vec![INIT], vec![PROXY]),
            (false, false) => (vec![], vec![PROXY]),
        };
        let list = |names: Vec<&str>| -> Value {
            if names.is_empty() {
                Value::Null
            } else {
                json!(names)
            }
        };
        // Compact, keys in Istio's order; empty lists are null.
        let status = format!(
            "{{\"initContainers\":{},\"containers\":{},\"volumes\":{},\"imagePullSecrets\":null,\"revision\":{}}}",
            list(init_list),
            list(container_list),
            json!(volume_names),
            json!(if self.revision.is_empty() {
                "default"
            } else {
                &self.revision
            }),
        );
        let revision = if self.revision.is_empty() {
            "default".to_string()
        } else {
            self.revision
        };
        let annotations = pod.metadata.annotations.get_or_insert_default();
        annotations.insert("istio.io/rev".into(), revision);
        if !first_app.is_empty() {
            for key in [
                "kubectl.kubernetes.io/default-container",
                "kubectl.kubernetes.io/default-logs-container",
            ] {
                annotations
                    .entry(key.into())
                    .or_insert_with(|| first_app.clone());
            }
        }
        annotations.insert(STATUS.into(), status);
        if let Some(network) = self.network {
            (pod.metadata.labels.get_or_insert_default())
                .entry("topology.istio.io/network".into())
                .or_insert(network);
        }
        canonical_labels(pod, namespace);
    }
}

/// `security.istio.io/tlsMode` and the canonical service labels, unless already set.
fn canonical_labels(pod: &mut Pod, namespace: &str) {
    let (workload, _) = workload(pod, namespace);
    let labels = pod.metadata.labels.get_or_insert_default();
    labels
        .entry("security.istio.io/tlsMode".into())
        .or_insert_with(|| "istio".into());
    let (name, revision) = model::config::workload::canonical_service(labels, &workload);
    let (mut name, revision) = (name.to_string(), revision.to_string());
    // Set only where missing: a label the pod has is what the lookup returned.
    if !labels.contains_key("service.istio.io/canonical-name") {
        if name.len() > 63 {
            name.truncate(63);
            name = name.trim_end_matches('-').to_string();
        }
        labels.insert("service.istio.io/canonical-name".into(), name);
    }
    labels
        .entry("service.istio.io/canonical-revision".into())
        .or_insert(revision);
}

/// Removes what an earlier injection added (the names `sidecar.istio.io/status` lists),
/// so that a pod injected before is injected afresh; returns the probes that injection
/// sent through the agent (its proxy's `ISTIO_KUBE_APP_PROBERS`).
pub fn remove_injected(pod: &mut Pod) -> Map<String, Value> {
    let Some(status) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(STATUS))
    else {
        return Map::new();
    };
    let Ok(status) = serde_json::from_str::<Value>(status) else {
        return Map::new();
    };
    let spec = pod.spec.as_ref();
    let probers = (spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers)))
    .filter(|c| c.name == PROXY)
    .flat_map(|c| c.env.iter().flatten())
    .find(|e| e.name == "ISTIO_KUBE_APP_PROBERS")
    .and_then(|e| serde_json::from_str(e.value.as_deref()?).ok())
    .unwrap_or_default();
    let names = |key: &str| -> Vec<String> {
        (status[key].as_array().into_iter().flatten())
            .filter_map(|v| v.as_str().map(String::from))
            .collect()
    };
    let (init, containers, volumes) = (
        names("initContainers"),
        names("containers"),
        names("volumes"),
    );
    if let Some(spec) = pod.spec.as_mut() {
        spec.containers.retain(|c| !containers.contains(&c.name));
        if let Some(list) = spec.init_containers.as_mut() {
            list.retain(|c| !init.contains(&c.name));
        }
        if let Some(list) = spec.volumes.as_mut() {
            list.retain(|v| !volumes.contains(&v.name));
        }
    }
    probers
}

/// A container's ports as `ISTIO_META_POD_PORTS` lists them (Go's field order).
trait PortValues {
    fn container_port_values(&self) -> Vec<Value>;
}

impl PortValues for Container {
    fn container_port_values(&self) -> Vec<Value> {
        (self.ports.iter().flatten())
            .map(|p| {
                let mut v = Map::new();
                if let Some(name) = &p.name {
                    v.insert("name".into(), json!(name));
                }
                if let Some(host) = p.host_port {
                    v.insert("hostPort".into(), json!(host));
                }
                v.insert("containerPort".into(), json!(p.container_port));
                if let Some(protocol) = &p.protocol {
                    v.insert("protocol".into(), json!(protocol));
                }
                if let Some(ip) = &p.host_ip {
                    v.insert("hostIP".into(), json!(ip));
                }
                Value::Object(v)
            })
            .collect()
    }
}
