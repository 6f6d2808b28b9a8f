//! Istio's real binaries (built by `tools/build.sh istio`) and sources (the module cache),
//! and istiod (`pilot-discovery`) in Kubernetes mode against a test bed API server: for
//! the parity harness (`parity.rs`) and the side-by-side benchmarks (`benches/istiod.rs`,
//! `benches/istio_configs.rs`).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::OnceLock;
use std::time::Duration;

use crate::cluster::{Cluster, command};
use crate::harness::{free_port, http_get, wait_until};

/// The folder holding `pilot-discovery`, `pilot-agent` and `istioctl`.
pub fn istio_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| crate::cluster::built("istio"))
}

/// Istio's source in the Go module cache, at the version `tools/istio/go.mod` pins (its
/// test data and packaging files are read from there, never copied).
pub fn istio_source() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // Building Istio's tools fetches its module into the cache.
        istio_bin();
        crate::cluster::module_source("istio", "istio.io/istio")
    })
}

/// istiod as the cluster's admin, its mesh ConfigMap (`istio`) and `POD_NAMESPACE` the
/// given namespace, its webhooks' patching off (a shared API server holds other tests'
/// webhook configurations). Its CA keeps its root in `istio-ca-secret` there.
pub struct Istiod {
    child: Child,
    /// The plaintext xDS port (Istio's 15010).
    pub xds_port: u16,
    /// The secure port, xDS and the CA over TLS (Istio's 15012), which
    /// `benches/ca_istiod.rs` signs through.
    #[allow(dead_code)]
    pub secure_port: u16,
    /// Metrics and `/debug` (Istio's 15014), which `benches/istiod.rs` reads.
    #[allow(dead_code)]
    pub monitoring_port: u16,
    http_port: u16,
    log: PathBuf,
}

impl Drop for Istiod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Istiod {
    /// Starts istiod with `namespace` as its own, working and logging in `dir`, and waits
    /// until it says it is ready. The pinned istiod now and then panics while it starts
    /// (a race in its IP auto-allocation controller, `ipallocate`): a start that exits
    /// before it is ready is tried once more, and the failure shows istiod's log.
    pub fn start(cluster: &Cluster, namespace: &str, dir: &Path) -> Istiod {
        Istiod::start_with(cluster, namespace, dir, &[])
    }

    /// As [`Istiod::start`], with `extra` flags of `pilot-discovery discovery`.
    pub fn start_with(cluster: &Cluster, namespace: &str, dir: &Path, extra: &[&str]) -> Istiod {
        Istiod::start_with_env(cluster, namespace, dir, extra, &[])
    }

    /// As [`Istiod::start_with`], with more environment variables.
    pub fn start_with_env(
        cluster: &Cluster,
        namespace: &str,
        dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Istiod {
        let once = || Istiod::start_once(cluster, namespace, dir, extra, env);
        match once() {
            Ok(istiod) => istiod,
            Err(first) => {
                eprintln!("istiod exited while starting; starting it again. {first}");
                once().unwrap_or_else(|e| panic!("{e}"))
            }
        }
    }

    /// One start: istiod ready, or why not (it exited; its log's tail).
    fn start_once(
        cluster: &Cluster,
        namespace: &str,
        dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Istiod, String> {
        std::fs::create_dir_all(dir).unwrap();
        let log = dir.join("istiod.log");
        let (xds_port, secure_port, http_port, monitoring_port) =
            (free_port(), free_port(), free_port(), free_port());
        let child = command(&istio_bin().join("pilot-discovery"))
            .arg("discovery")
            .arg("--kubeconfig")
            .arg(&cluster.kubeconfig)
            .args(["--grpcAddr", &format!("127.0.0.1:{xds_port}")])
            .args(["--secureGRPCAddr", &format!("127.0.0.1:{secure_port}")])
            .args(["--httpsAddr", &format!("127.0.0.1:{}", free_port())])
            .args(["--monitoringAddr", &format!("127.0.0.1:{monitoring_port}")])
            .args(["--httpAddr", &format!("127.0.0.1:{http_port}")])
            .args(["--domain", "cluster.local", "--clusterID", "Kubernetes"])
            .args(extra)
            .current_dir(dir)
            .env("POD_NAMESPACE", namespace)
            .env("POD_NAME", "istiod-0")
            .env("REVISION", "default")
            .env("INJECTION_WEBHOOK_CONFIG_NAME", "")
            .env("VALIDATION_WEBHOOK_CONFIG_NAME", "")
            .envs(env.iter().copied())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::options().append(true).open(&log).unwrap())
            .spawn()
            .expect("starting pilot-discovery");
        let mut istiod = Istiod {
            child,
            xds_port,
            secure_port,
            monitoring_port,
            http_port,
            log,
        };
        let ready = format!("127.0.0.1:{}", istiod.http_port);
        let mut exited = None;
        wait_until("istiod to be ready", Duration::from_secs(180), || {
            exited = istiod.child.try_wait().unwrap();
            exited.is_some()
                || http_get(&ready, "istiod", "/ready", &[]).is_ok_and(|r| r.status == 200)
        });
        match exited {
            None => Ok(istiod),
            Some(status) => {
                let log = istiod.log();
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(40)..].join("\n");
                Err(format!(
                    "istiod exited ({status}) before it was ready; the end of its log:\n{tail}"
                ))
            }
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}
