//! The kubelet's API for the test bed's nodes, served by the real kwok (Kubernetes SIGs,
//! built from `tools/kwok/go.mod` by `tools/build.sh kwok`): a node it manages gets the
//! address and port of kwok's server in its status, and the API server's `pods/portforward`
//! for a pod on that node reaches kwok, which runs the kubelet's own streaming code and
//! forwards each pod port to the local address its `PortForward` names. That is how
//! `istioctl proxy-config POD` reaches the admin port of an Envoy the test started.
//!
//! kwok writes the status of the node, and of the pods placed on it (running, with an IP
//! from kwok's range), by the "fast" stages it ships (read from the Go module cache at run
//! time).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::OnceLock;
use std::time::Duration;

use crate::cluster::{Cluster, built, command, module_source};
use crate::harness::{free_port, temp_dir, wait_until};

/// A pod port forwarded to a local port.
pub struct Forward<'a> {
    pub namespace: &'a str,
    pub pod: &'a str,
    pub port: u16,
    pub to: u16,
}

/// kwok managing one node of `cluster`; killed on drop, with the node deleted.
pub struct Kubelet {
    child: Child,
    cluster: &'static Cluster,
    /// The node's name: a pod with this `spec.nodeName` is reachable through it.
    pub node: String,
    dir: PathBuf,
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.cluster.delete("node", "", &self.node);
    }
}

fn kwok_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| built("kwok").join("kwok"))
}

/// kwok's source in the Go module cache, at the version `tools/kwok/go.mod` pins.
fn kwok_source() -> PathBuf {
    kwok_bin();
    module_source("kwok", "sigs.k8s.io/kwok")
}

impl Kubelet {
    /// A new node of `cluster` (its kubelet version the API server's own), managed by a
    /// kwok that forwards `forwards`.
    pub fn start(cluster: &'static Cluster, forwards: &[Forward]) -> Kubelet {
        let node = Cluster::namespace("kwok-node");
        let dir = temp_dir(&node);
        let stages = kwok_source().join("kustomize/stage");
        let mut config = String::new();
        for stage in [
            "node/fast/node-initialize.yaml",
            "pod/fast/pod-ready.yaml",
            "pod/fast/pod-complete.yaml",
            "pod/fast/pod-delete.yaml",
        ] {
            let path = stages.join(stage);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("kwok's stage {}: {e}", path.display()));
            config.push_str(&format!("---\n{text}\n"));
        }
        for f in forwards {
            config.push_str(&format!(
                "---\napiVersion: kwok.x-k8s.io/v1alpha1\nkind: PortForward\nmetadata: {{name: {}, namespace: {}}}\nspec:\n  forwards:\n  - ports: [{}]\n    target: {{address: 127.0.0.1, port: {}}}\n",
                f.pod, f.namespace, f.port, f.to
            ));
        }
        std::fs::write(dir.join("kwok.yaml"), config).unwrap();
        let (cert, key) = serving_certificate();
        std::fs::write(dir.join("kubelet.crt"), cert).unwrap();
        std::fs::write(dir.join("kubelet.key"), key).unwrap();

        // Registered as a kubelet registers its node: with its version in the status, which
        // kwok's stage keeps (meshd reads it to decide on native sidecars).
        let version: serde_json::Value = serde_json::from_str(
            &cluster
                .kubectl(&["get", "--raw", "/version"], None)
                .unwrap(),
        )
        .unwrap();
        let version = version["gitVersion"].as_str().unwrap();
        cluster
            .apply(&format!(
                "apiVersion: v1\nkind: Node\nmetadata: {{name: {node}}}\nstatus:\n  nodeInfo: {{kubeletVersion: {version}, architecture: amd64, operatingSystem: linux, bootID: '', containerRuntimeVersion: '', kernelVersion: '', kubeProxyVersion: '', machineID: '', osImage: '', systemUUID: ''}}\n"
            ))
            .unwrap();

        let d = |f: &str| dir.join(f).display().to_string();
        let log_path = dir.join("kwok.log");
        for attempt in 1.. {
            let port = free_port();
            let log = (std::fs::File::options().create(true).append(true))
                .open(&log_path)
                .unwrap();
            let mut child = command(kwok_bin())
                .args([
                    format!("--kubeconfig={}", cluster.kubeconfig.display()),
                    format!("--config={}", d("kwok.yaml")),
                    format!("--manage-single-node={node}"),
                    "--node-ip=127.0.0.1".into(),
                    // The name of the `Hostname` address, which the API server tries first.
                    "--node-name=localhost".into(),
                    format!("--node-port={port}"),
                    format!("--server-address=127.0.0.1:{port}"),
                    format!("--tls-cert-file={}", d("kubelet.crt")),
                    format!("--tls-private-key-file={}", d("kubelet.key")),
                ])
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("starting kwok");
            let mut exited = None;
            wait_until(
                "kwok to serve and give its node the kubelet's address",
                Duration::from_secs(60),
                || {
                    exited = child.try_wait().unwrap();
                    let node = cluster.object("node", "", &node);
                    exited.is_some()
                        || (node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == port
                            && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok())
                },
            );
            let Some(status) = exited else {
                return Kubelet {
                    child,
                    cluster,
                    node,
                    dir,
                };
            };
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            // kwok v0.8.0 can die while it starts: its server and its controller register
            // CEL types in one unguarded map of github.com/wzshiming/easycel v0.6.0 (the
            // newest) at the same time. Nothing of the test is wrong then: start it again.
            if attempt < 3 && log.contains("fatal error: concurrent map writes") {
                continue;
            }
            panic!("kwok exited ({status}); its log:\n{log}");
        }
        unreachable!()
    }

    /// Waits for kwok to report `namespace/pod` (placed on this node) running.
    pub fn wait_running(&self, namespace: &str, pod: &str) {
        wait_until(
            &format!("kwok to run {namespace}/{pod}"),
            Duration::from_secs(60),
            || self.cluster.object("pod", namespace, pod)["status"]["phase"] == "Running",
        );
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("kwok.log")).unwrap_or_default()
    }
}

/// A serving certificate for kwok's server (the API server does not verify a kubelet's
/// certificate unless `--kubelet-certificate-authority` names a CA).
fn serving_certificate() -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress([127, 0, 0, 1].into()));
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}
