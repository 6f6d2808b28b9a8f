//! Istio's own components against meshd: the real `istioctl`, built from `istio.io/istio`
//! by `tools/build.sh istio` (on first use, cached under `target/tools/istio/`), reading
//! proxy status over xDS from meshd's secure port as it reads it from istiod's, with a
//! token from the real TokenRequest API that meshd checks with TokenReview.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::cluster::Tenant;
use crate::kubernetes::kube_mesh_on;

/// The folder holding `pilot-discovery`, `pilot-agent` and `istioctl`.
fn istio_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| crate::cluster::built("istio"))
}

/// `istioctl ARGS` as the test bed's admin, against meshd's secure port; its stdout.
fn istioctl(t: &Tenant, secure_port: u16, args: &[&str]) -> String {
    let out = Command::new(istio_bin().join("istioctl"))
        .arg("--kubeconfig")
        .arg(&t.cluster.kubeconfig)
        .args(["--istioNamespace", &t.system])
        .args(["--xds-address", &format!("127.0.0.1:{secure_port}")])
        .args(args)
        .output()
        .expect("running istioctl");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "istioctl {args:?}: {stdout}{stderr}");
    stdout
}

/// `istioctl proxy-status`, for all proxies (default and verbose) and for one proxy
/// against its Envoy's own config dump. istioctl asks for a token for the `default`
/// ServiceAccount of the Istio namespace (TokenRequest), and meshd's TokenReview places
/// the caller in its root namespace, so every proxy is listed.
#[test]
fn the_real_istioctl_reads_proxy_status_from_meshd() {
    let t = Tenant::new("istioctl-real", "");
    t.cluster
        .apply(&format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: default, namespace: {}}}\n",
            t.system
        ))
        .unwrap();
    let m = kube_mesh_on(t, "istioctl-real");
    let pod = format!("istioctl-real-0.{}", m.t.system);
    let secure = m.meshd.secure_port;

    let all = istioctl(&m.t, secure, &["proxy-status"]);
    let line = all
        .lines()
        .find(|l| l.starts_with(&pod))
        .unwrap_or_else(|| panic!("{pod} not listed:\n{all}"));
    assert!(line.contains("Kubernetes"), "{all}");
    for t in ["CDS", "LDS", "EDS", "RDS"] {
        assert!(line.contains(t), "{t} subscribed: {all}");
    }

    let verbose = istioctl(&m.t, secure, &["proxy-status", "-v", "1"]);
    let line = verbose
        .lines()
        .find(|l| l.starts_with(&pod))
        .unwrap_or_else(|| panic!("{pod} not listed:\n{verbose}"));
    assert_eq!(line.matches("SYNCED").count(), 4, "{verbose}");

    let dump = m.t.dir.join("envoy-config-dump.json");
    std::fs::write(&dump, m.envoy.admin("/config_dump").unwrap().body).unwrap();
    let compared = istioctl(
        &m.t,
        secure,
        &["proxy-status", &pod, "--file", dump.to_str().unwrap()],
    );
    for part in ["Clusters Match", "Listeners Match", "Routes Match"] {
        assert!(compared.contains(part), "{part}:\n{compared}");
    }
}
