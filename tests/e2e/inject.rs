//! Sidecar injection measured against Istio's own injector: the pods of Istio's injector
//! tests (`pkg/kube/inject/testdata/inject` of the `istio.io/istio` module the test bed
//! pins, read from the Go module cache) are sent to meshd's `/inject` as the API server
//! sends them, and the patched pod must be Istio's expected pod. What is meshd's by
//! design is set aside before comparing: the images, the proxy container's arguments, and
//! the agent's program in lifecycle hooks (`pilot-agent` there, `meshd agent` here; the
//! hooks' arguments are compared).

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::harness::*;

/// The folder of Istio's injector test cases.
fn testdata() -> PathBuf {
    crate::istiod::istio_source().join("pkg/kube/inject/testdata/inject")
}

/// The first document of a test file, as JSON.
fn read(name: &str) -> Value {
    let path = testdata().join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading Istio's {}: {e}", path.display()));
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.into_iter().next().unwrap()
}

/// The pod a test file stands for: a Pod as it is; a workload's pod template as the pod
/// its ReplicaSet makes (a generated name, the template hash, the controller).
fn pod_of(object: &Value) -> Value {
    if object["kind"] == "Pod" {
        return object.clone();
    }
    let name = object["metadata"]["name"].as_str().unwrap();
    let mut pod = object["spec"]["template"].clone();
    let meta = &mut pod["metadata"];
    meta["generateName"] = json!(format!("{name}-5f7d9-"));
    meta["labels"]["pod-template-hash"] = json!("5f7d9");
    meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "name": format!("{name}-5f7d9"), "uid": "u", "controller": true}]);
    pod
}

/// The pod part of Istio's expected output, or of meshd's, with what is meshd's by design
/// and what only serialization adds set aside.
fn normalized(mut pod: Value) -> Value {
    let meta = pod["metadata"].as_object_mut().unwrap();
    for key in [
        "generateName",
        "ownerReferences",
        "creationTimestamp",
        "namespace",
    ] {
        meta.remove(key);
    }
    if let Some(labels) = meta.get_mut("labels").and_then(Value::as_object_mut) {
        labels.remove("pod-template-hash");
    }
    if let Some(p) = pod.as_object_mut() {
        for key in ["status", "apiVersion", "kind"] {
            p.remove(key);
        }
    }
    let spec = &mut pod["spec"];
    for list in ["containers", "initContainers"] {
        for c in spec[list].as_array_mut().into_iter().flatten() {
            if c["resources"] == json!({}) {
                c.as_object_mut().unwrap().remove("resources");
            }
            let name = c["name"].as_str().unwrap_or_default().to_string();
            if name == "istio-init" {
                c["image"] = json!("IMAGE");
                let args = c["args"].as_array_mut().unwrap();
                let program = if args[0] == "istio-iptables" { 1 } else { 2 };
                args.drain(..program);
            }
            if name == "istio-proxy" {
                c["image"] = json!("IMAGE");
                c["args"] = json!("ARGS");
                for env in c["env"].as_array_mut().into_iter().flatten() {
                    let name = env["name"].as_str().unwrap_or_default();
                    if [
                        "PROXY_CONFIG",
                        "ISTIO_META_POD_PORTS",
                        "ISTIO_KUBE_APP_PROBERS",
                        "ISTIO_PROMETHEUS_ANNOTATIONS",
                    ]
                    .contains(&name)
                    {
                        let text = env["value"].as_str().unwrap();
                        env["value"] = serde_json::from_str(text).unwrap();
                    }
                }
                if let Some(lifecycle) = c.get_mut("lifecycle").and_then(Value::as_object_mut) {
                    for hook in lifecycle.values_mut() {
                        if let Some(command) = hook["exec"]["command"].as_array_mut() {
                            if command[0] == "pilot-agent" {
                                command[0] = json!("AGENT");
                            } else if command[..2] == [json!("meshd"), json!("agent")] {
                                command.splice(..2, [json!("AGENT")]);
                            }
                        }
                    }
                }
            }
        }
    }
    pod
}

/// Istio's expected pod for `expected` (a file name), from the injector test's output.
fn istio_injected(expected: &str) -> Value {
    let object = read(expected);
    if object["kind"] == "Pod" {
        object
    } else {
        object["spec"]["template"].clone()
    }
}

/// The pod `pod` becomes through meshd's `path` (`/inject...`), in namespace `default`.
fn meshd_injected(meshd: &Meshd, path: &str, pod: &Value) -> Value {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "inject-1",
            "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "default",
            "object": pod,
        }
    });
    let answer = https_request(
        &format!("127.0.0.1:{}", meshd.webhook_port),
        "istiod.istio-system.svc",
        &meshd.root_pem(),
        &format!("POST {path}"),
        &[("Content-Type", "application/json")],
        &review.to_string(),
    )
    .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    let answer: Value = serde_json::from_str(&answer.body).unwrap();
    let response = &answer["response"];
    assert_eq!(response["uid"], "inject-1");
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(response["patchType"], "JSONPatch", "{response}");
    use base64::Engine;
    let patch = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().unwrap())
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut injected = pod.clone();
    json_patch::patch(&mut injected, &patch).unwrap();
    injected
}

/// Istio's injector cases that run with its default settings (native sidecars on, as
/// Istio's test sets them): bare pods and Deployments, probes of every kind (named ports,
/// HTTPS, TCP, lifecycle hooks), opting out of native sidecars, the
/// `proxy.istio.io/config` annotation, traffic and status annotations, and long names.
const CASES: [&str; 11] = [
    "pod.yaml",
    "hello.yaml",
    "hello-probes.yaml",
    "https-probes.yaml",
    "tcp-probes.yaml",
    "native-sidecar.yaml",
    "native-sidecar-opt-out.yaml",
    "native-sidecar-opt-in.yaml",
    "hello-probes-proxyHoldApplication-ProxyConfig.yaml",
    "truncate-canonical-name-pod.yaml",
    "truncate-canonical-name-custom-controller-pod.yaml",
];

/// Every case injected by meshd is the pod Istio's injector makes of it, field for field,
/// but for meshd's image and proxy command.
#[test]
fn meshd_injects_the_pods_of_istios_injector_tests_as_istio_does() {
    let dir = temp_dir("inject-parity").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let meshd = Meshd::start_with_env(&dir, &[], &[("ENABLE_NATIVE_SIDECARS", "true")]);
    let mut failures = Vec::new();
    for case in CASES {
        let pod = pod_of(&read(case));
        let ours = normalized(meshd_injected(&meshd, "/inject", &pod));
        let istio = normalized(istio_injected(&format!("{case}.injected")));
        if ours != istio {
            let diff = json_patch::diff(&istio, &ours);
            failures.push(format!(
                "{case}: what turns Istio's pod into meshd's:\n{}",
                serde_json::to_string_pretty(&diff).unwrap()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));

    // istiod's remote-cluster path: `/inject/cluster/C/net/N`.
    let pod = pod_of(&read("pod.yaml"));
    let remote = meshd_injected(&meshd, "/inject/cluster/east/net/network-1", &pod);
    let proxy = &remote["spec"]["initContainers"][1];
    let env = |name: &str| {
        (proxy["env"].as_array().unwrap().iter())
            .find(|e| e["name"] == name)
            .map(|e| e["value"].clone())
            .unwrap_or_default()
    };
    assert_eq!(env("ISTIO_META_CLUSTER_ID"), "east");
    assert_eq!(env("ISTIO_META_NETWORK"), "network-1");
    assert_eq!(
        remote["metadata"]["labels"]["topology.istio.io/network"],
        "network-1"
    );
    assert_eq!(
        meshd.metric("sidecar_injection_success_total"),
        (CASES.len() + 1) as f64
    );
}

/// Istio's capture cases (`tools/istio-iptables/pkg/capture/testdata`, with the flags its
/// test sets) that meshd's `istio-init` command covers: IPv4 with REDIRECT.
const CAPTURE_CASES: [(&str, &[&str]); 9] = [
    ("empty", &[]),
    ("inbound-ports-include", &["-b", "32000,31000"]),
    ("inbound-ports-wildcard", &["-b", "*"]),
    ("ipnets", &["-i", "10.0.0.0/8"]),
    ("kube-virt-interfaces", &["-k", "eth1,eth2", "-i", "*"]),
    (
        "ipnets-with-kube-virt-interfaces",
        &["-k", "eth1,eth2", "-i", "10.0.0.0/8"],
    ),
    ("outbound-ports-include", &["-q", "32000,31000"]),
    ("basic-exclude-nic", &["-c", "not-istio-nic"]),
    (
        "host-ipv4-loopback-cidr",
        &["--host-ipv4-loopback-cidr", "127.0.0.1/8"],
    ),
];

/// `meshd agent iptables` writes, rule for rule and in the same order, the `nat` table
/// Istio's istio-iptables writes for the same flags (its golden files, read from the
/// module cache).
#[test]
fn the_capture_rules_are_the_ones_istio_iptables_writes() {
    let goldens = testdata().join("../../../../../tools/istio-iptables/pkg/capture/testdata");
    let mut failures = Vec::new();
    for (case, flags) in CAPTURE_CASES {
        let golden = std::fs::read_to_string(goldens.join(format!("{case}.golden")))
            .unwrap_or_else(|e| panic!("reading Istio's {case}.golden: {e}"));
        let start = golden.find("* nat").unwrap();
        let end = start + golden[start..].find("COMMIT").unwrap() + "COMMIT\n".len();
        let args = [&["agent", "iptables", "--dry-run"], flags].concat();
        let ours = String::from_utf8(run_meshd(&args, &[])).unwrap();
        if ours != golden[start..end] {
            failures.push(format!(
                "{case}:\nIstio:\n{}\nmeshd:\n{ours}",
                &golden[start..end]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
