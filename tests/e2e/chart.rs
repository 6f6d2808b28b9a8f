//! The Helm chart and the manifests rendered from it, with the real `helm` and the real
//! kube-apiserver: it lints, renders every optional part, installs the dashboard and the
//! alerts as the committed files hold them, is accepted by the API server, and
//! `manifests/meshd.yaml` is what `scripts/manifests.sh` renders from it today.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::cluster::{Cluster, tools_bin};
use crate::harness::temp_dir;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `helm ARGS` as the real helm runs it; its stdout.
fn helm(args: &[&str]) -> String {
    let out = Command::new(tools_bin().join("helm"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `helm template RELEASE charts/meshd ARGS`.
pub fn helm_template(release: &str, args: &[&str]) -> String {
    let chart = root().join("charts/meshd");
    let mut all = vec!["template", release, chart.to_str().unwrap()];
    all.extend(args);
    helm(&all)
}

/// The documents of a YAML stream, as JSON.
pub fn documents(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(yaml)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

#[test]
fn the_chart_lints_and_renders_what_the_files_hold() {
    let chart = root().join("charts/meshd");
    helm(&["lint", "--strict", chart.to_str().unwrap()]);
    let rendered = helm_template(
        "meshd",
        &[
            "--namespace",
            "meshd-system",
            "--set",
            "mesh.create=true",
            "--set",
            "prometheusRules.enabled=true",
        ],
    );
    let docs = documents(&rendered);
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    for kind in [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "ConfigMap",
        "Mesh",
        "PrometheusRule",
    ] {
        assert!(kinds.contains(&kind), "no {kind} in {kinds:?}");
    }
    let find = |kind: &str| docs.iter().find(|d| d["kind"] == kind).unwrap();
    let dashboard = find("ConfigMap");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let committed = std::fs::read_to_string(chart.join("files/dashboard.json")).unwrap();
    assert_eq!(
        dashboard["data"]["meshd-control-plane.json"]
            .as_str()
            .unwrap(),
        committed.trim_end()
    );
    let rules: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(chart.join("files/prometheus-rules.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(find("PrometheusRule")["spec"], rules);
    assert_eq!(find("Mesh")["spec"]["namespace"], "istio-system");
}

/// The default rendering and a Mesh are accepted by the real API server (a server-side
/// dry run: its schema checks, the CRDs' included).
#[test]
fn the_api_server_accepts_the_rendered_chart() {
    let cluster = Cluster::shared();
    let rendered = helm_template(
        "meshd",
        &["--namespace", "default", "--set", "mesh.create=true"],
    );
    cluster
        .kubectl(
            &["apply", "--server-side", "--dry-run=server", "-f", "-"],
            Some(&rendered),
        )
        .unwrap_or_else(|e| panic!("the API server refused the chart: {e}"));
}

#[test]
fn the_manifests_are_rendered_from_the_chart() {
    let out = temp_dir("manifests").join("meshd.yaml");
    let status = Command::new("bash")
        .arg(root().join("scripts/manifests.sh"))
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let rendered = std::fs::read_to_string(&out).unwrap();
    let committed = std::fs::read_to_string(root().join("manifests/meshd.yaml")).unwrap();
    assert!(
        rendered == committed,
        "manifests/meshd.yaml drifted from the chart: run scripts/manifests.sh and commit"
    );
    let kinds: Vec<String> = (documents(&committed).iter())
        .map(|d| d["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| *k == "CustomResourceDefinition")
            .count(),
        13,
        "every Istio and operator CRD"
    );
}
