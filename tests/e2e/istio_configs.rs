//! Istio's own xDS benchmark configurations (`pilot/pkg/xds/testdata/benchmarks/*.yaml`,
//! read from the module cache), rendered by the real helm as Istio's `bench_test.go`
//! renders them: for the parity corpus (`parity_corpus.rs`) and the push-context
//! benchmark against Istio's Go benchmarks (`benches/istio_configs.rs`).

/// Each of Istio's benchmark cases as `bench_test.go` sets them up: name, services,
/// instances, and whether the proxy is a gateway (`model.Router`). `waypoint` is left
/// out: ambient is outside meshd's scope.
pub const CASES: &[(&str, usize, usize, bool)] = &[
    ("gateways", 1000, 0, true),
    ("gateways-shared", 1000, 0, true),
    ("knative-gateway", 100, 0, true),
    ("http", 100, 0, false),
    ("tcp", 100, 0, false),
    ("tls", 100, 0, false),
    ("auto", 100, 0, false),
    ("strict", 0, 0, false),
    ("disabled", 0, 0, false),
    ("externalname", 100, 0, false),
    ("telemetry-api", 100, 0, false),
    ("virtualservice", 100, 0, false),
    ("authorizationpolicy", 100, 0, false),
    ("serviceentry-workloadentry", 100, 1000, false),
];

/// The configuration `name` with `services` services and `instances` instances, one YAML
/// document per object, each in its own namespace or, without one, in `default` (as
/// Istio's benchmark sets it).
pub fn render(name: &str, services: usize, instances: usize) -> String {
    let source = crate::istiod::istio_source()
        .join("pilot/pkg/xds/testdata/benchmarks")
        .join(format!("{name}.yaml"));
    let text = std::fs::read_to_string(&source).unwrap();
    let chart = crate::harness::temp_dir(&format!("istio-config-{name}"));
    std::fs::create_dir_all(chart.join("templates")).unwrap();
    std::fs::write(
        chart.join("Chart.yaml"),
        format!("apiVersion: v2\nname: {name}\nversion: 0.1.0\n"),
    )
    .unwrap();
    // Istio's benchmark template reads `.Services` as an int; a chart's values are
    // `.Values.*`, numbers set on the command line int64s.
    let template = text
        .replace("$.Services", "(int $.Values.Services)")
        .replace(" .Services", " (int .Values.Services)")
        .replace(" .Instances", " (int .Values.Instances)");
    std::fs::write(chart.join("templates/config.yaml"), template).unwrap();
    let out = std::process::Command::new(crate::cluster::tools_bin().join("helm"))
        .arg("template")
        .arg(name)
        .arg(&chart)
        .args(["--set", &format!("Services={services}")])
        .args(["--set", &format!("Instances={instances}")])
        .output()
        .expect("running helm");
    assert!(
        out.status.success(),
        "helm rendering {}: {}",
        source.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = String::from_utf8(out.stdout).unwrap();
    rendered
        .split("\n---")
        .filter(|doc| doc.contains("kind:"))
        .map(|doc| {
            if doc.contains("\n  namespace:") {
                doc.to_string()
            } else {
                doc.replacen("\nmetadata:\n", "\nmetadata:\n  namespace: default\n", 1)
            }
        })
        .collect::<Vec<_>>()
        .join("\n---")
}
