//! The test bed's real Kubernetes control plane: etcd and kube-apiserver built from their Go
//! modules by `tools/build.sh` (on first use, cached under `target/tools/`), started on
//! loopback as controller-runtime's envtest starts them, with the real `kubectl`.
//!
//! - Certificates: one test CA signs the API server's serving certificate and the admin's
//!   client certificate (`O=system:masters`); service-account tokens are signed with a
//!   P-256 key of their own.
//! - No controller-manager, scheduler or kubelet runs: tests write EndpointSlices, service
//!   accounts and pod status themselves, and start the processes a pod would run.
//! - [`Cluster::shared`] is one API server for the whole test binary; each test keeps to
//!   namespaces of its own (its [`Cluster::namespace`] names) and to cluster-scoped names
//!   of its own. A test that restarts the server or removes a CRD starts its own with
//!   [`Cluster::start`].
//! - Every process is killed when its `Cluster` drops, and by the kernel when the test
//!   binary exits (`PR_SET_PDEATHSIG`), so none outlives a run.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine;

use crate::harness::{free_port, parse_response, temp_dir, wait_until};

/// The folder holding `etcd`, `kube-apiserver`, `kubectl` and `helm`, built once per
/// checkout by `tools/build.sh`.
pub fn tools_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| built("kube"))
}

/// The folder of a set of binaries `tools/build.sh SET` builds (and caches). A missing Go
/// or module proxy fails the test with the script's reason.
pub fn built(set: &str) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(set)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "the test bed's {set} binaries could not be built: {} {set} failed (see its output \
         above); it needs Go and the Go module proxy",
        script.display()
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The directory of Go module `module` in the module cache, at the version the set's
/// `tools/SET/go.mod` pins (building the set fetched it): where its test data and
/// packaging files are read, never copied.
pub fn module_source(set: &str, module: &str) -> PathBuf {
    let out = Command::new("go")
        .args(["list", "-m", "-f", "{{.Dir}}", module])
        .current_dir(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tools")
                .join(set),
        )
        .output()
        .unwrap_or_else(|e| panic!("running go list (Go is needed for {module}'s sources): {e}"));
    assert!(
        out.status.success(),
        "go list -m {module}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// What `start` makes, kept for the rest of the test binary's life. It is made on a
/// thread that never ends, so that the parent-death signal of the processes it spawns
/// fires only when the test binary exits (the signal follows the spawning thread).
pub fn started_for_good<T: Send + Sync + 'static>(
    what: &str,
    start: impl FnOnce() -> T + Send + 'static,
) -> &'static T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(format!("shared {what}"))
        .spawn(move || {
            let kept: &'static T = Box::leak(Box::new(start()));
            tx.send(kept).unwrap();
            loop {
                std::thread::park();
            }
        })
        .unwrap();
    rx.recv()
        .unwrap_or_else(|_| panic!("{what} failed to start (see the panic above)"))
}

/// `bin` with its parent dying taking it along (the kernel sends SIGKILL).
pub fn command(bin: &Path) -> Command {
    let mut cmd = Command::new(bin);
    // SAFETY: prctl is async-signal-safe and touches only the child's own state.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd
}

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// The test CA and what it signed, as PEM.
struct Pki {
    ca: String,
    serving: (String, String),
    admin: (String, String),
    /// The service-account signing key (PKCS#8) and its public half.
    service_account: (String, String),
}

impl Pki {
    fn new() -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, DistinguishedName, DnType,
            ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
        };
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::default();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name = DistinguishedName::new();
        ca.distinguished_name
            .push(DnType::CommonName, "meshd test bed CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);

        let serving_key = KeyPair::generate().unwrap();
        let mut serving = CertificateParams::new(vec!["localhost".into()]).unwrap();
        serving
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving.signed_by(&serving_key, &issuer).unwrap();

        let admin_key = KeyPair::generate().unwrap();
        let mut admin = CertificateParams::default();
        admin.distinguished_name = DistinguishedName::new();
        admin.distinguished_name.push(DnType::CommonName, "admin");
        admin
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin.signed_by(&admin_key, &issuer).unwrap();

        let sa_key = KeyPair::generate().unwrap();
        Pki {
            ca: ca_cert.pem(),
            serving: (serving_cert.pem(), serving_key.serialize_pem()),
            admin: (admin_cert.pem(), admin_key.serialize_pem()),
            service_account: (
                pem("PRIVATE KEY", &sa_key.serialize_der()),
                sa_key.public_key_pem(),
            ),
        }
    }
}

/// etcd and kube-apiserver on loopback, and an admin kubeconfig for them.
pub struct Cluster {
    dir: PathBuf,
    pub port: u16,
    etcd_port: u16,
    extra: Vec<String>,
    etcd: Mutex<Child>,
    apiserver: Mutex<Option<Child>>,
    ca: String,
    /// The admin's kubeconfig (client certificate, `system:masters`).
    pub kubeconfig: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut c) = self.apiserver.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let mut etcd = self.etcd.lock().unwrap();
        let _ = etcd.kill();
        let _ = etcd.wait();
    }
}

impl Cluster {
    /// The API server shared by every test of this binary (started on first use), with the
    /// committed CRDs installed.
    pub fn shared() -> &'static Cluster {
        static SHARED: OnceLock<&'static Cluster> = OnceLock::new();
        SHARED.get_or_init(|| {
            started_for_good("the shared API server", || Cluster::start("shared", &[]))
        })
    }

    /// A control plane of its own (in `target/tmp/e2e/NAME-PID`), with the committed CRDs
    /// installed; `extra` flags go to kube-apiserver.
    pub fn start(name: &str, extra: &[&str]) -> Cluster {
        let bin = tools_bin();
        let dir = temp_dir(&format!("cluster-{name}"));
        let pki = Pki::new();
        let write = |file: &str, text: &str| std::fs::write(dir.join(file), text).unwrap();
        write("ca.crt", &pki.ca);
        write("apiserver.crt", &pki.serving.0);
        write("apiserver.key", &pki.serving.1);
        write("sa.key", &pki.service_account.0);
        write("sa.pub", &pki.service_account.1);
        let kubeconfig = dir.join("kubeconfig");
        let (etcd_port, port) = (free_port(), free_port());
        let etcd = start_etcd(bin, &dir, etcd_port);
        let cluster = Cluster {
            port,
            etcd_port,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            etcd: Mutex::new(etcd),
            apiserver: Mutex::new(None),
            ca: pki.ca.clone(),
            kubeconfig,
            dir,
        };
        cluster.write_kubeconfig(
            &cluster.kubeconfig,
            &format!(
                "client-certificate-data: {}\n    client-key-data: {}",
                b64(&pki.admin.0),
                b64(&pki.admin.1)
            ),
        );
        cluster.start_apiserver();
        cluster.install_crds();
        cluster
    }

    fn write_kubeconfig(&self, path: &Path, user: &str) {
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: testbed\n  cluster:\n    server: https://127.0.0.1:{}\n    certificate-authority-data: {}\nusers:\n- name: user\n  user:\n    {user}\ncontexts:\n- name: testbed\n  context: {{cluster: testbed, user: user}}\ncurrent-context: testbed\n",
                self.port,
                b64(&self.ca)
            ),
        )
        .unwrap();
    }

    fn start_apiserver(&self) {
        let bin = tools_bin();
        let d = |f: &str| self.dir.join(f).display().to_string();
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("kube-apiserver.log"))
            .unwrap();
        let child = command(&bin.join("kube-apiserver"))
            .args([
                format!("--etcd-servers=http://127.0.0.1:{}", self.etcd_port),
                format!("--secure-port={}", self.port),
                "--bind-address=127.0.0.1".into(),
                // No address to advertise as the `kubernetes` Service's endpoint: loopback
                // is refused for it, and nothing here reaches the API server through it.
                "--endpoint-reconciler-type=none".into(),
                format!("--cert-dir={}", d("certs")),
                format!("--tls-cert-file={}", d("apiserver.crt")),
                format!("--tls-private-key-file={}", d("apiserver.key")),
                format!("--client-ca-file={}", d("ca.crt")),
                "--service-cluster-ip-range=10.96.0.0/12".into(),
                "--allow-privileged=true".into(),
                "--disable-admission-plugins=ServiceAccount".into(),
                "--authorization-mode=RBAC".into(),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!("--service-account-key-file={}", d("sa.pub")),
                format!("--service-account-signing-key-file={}", d("sa.key")),
                "--api-audiences=https://kubernetes.default.svc.cluster.local".into(),
                "--enable-priority-and-fairness=false".into(),
            ])
            .args(&self.extra)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting kube-apiserver");
        *self.apiserver.lock().unwrap() = Some(child);
        let started = Instant::now();
        loop {
            if self.kubectl(&["get", "--raw", "/readyz"], None).is_ok() {
                break;
            }
            if let Some(status) = self
                .apiserver
                .lock()
                .unwrap()
                .as_mut()
                .unwrap()
                .try_wait()
                .unwrap()
            {
                panic!(
                    "kube-apiserver exited ({status}) before it was ready; its log: {}",
                    self.dir.join("kube-apiserver.log").display()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "kube-apiserver was not ready within 120 s; its log: {}",
                self.dir.join("kube-apiserver.log").display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The process ids of kube-apiserver and etcd (for `benches/kube_source.rs`).
    #[allow(dead_code)]
    pub fn pids(&self) -> (u32, u32) {
        let apiserver = self.apiserver.lock().unwrap().as_ref().map_or(0, Child::id);
        (apiserver, self.etcd.lock().unwrap().id())
    }

    /// Stops kube-apiserver (etcd keeps running), as a crash would.
    pub fn stop_apiserver(&self) {
        if let Some(mut c) = self.apiserver.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts kube-apiserver again on the same port, with the same etcd.
    pub fn restart_apiserver(&self) {
        self.stop_apiserver();
        self.start_apiserver();
    }

    fn install_crds(&self) {
        let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
        self.kubectl(
            &["apply", "--server-side", "-f", &crds.display().to_string()],
            None,
        )
        .unwrap_or_else(|e| panic!("the committed CRDs were refused by kube-apiserver: {e}"));
        self.kubectl(
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd",
                "--all",
            ],
            None,
        )
        .unwrap();
    }

    /// `kubectl ARGS` as the admin, with `stdin`; its stdout, or its stderr on failure.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        kubectl(&self.kubeconfig, args, stdin)
    }

    /// Applies YAML (several documents allowed) as `kubectl apply --server-side` does.
    pub fn apply(&self, yaml: &str) -> Result<(), String> {
        self.kubectl(
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=e2e",
                "-f",
                "-",
            ],
            Some(yaml),
        )
        .map(drop)
    }

    /// Deletes one object (`namespace` empty for a cluster-scoped kind), not waiting for
    /// finalizers.
    pub fn delete(&self, kind: &str, namespace: &str, name: &str) {
        let mut args = vec!["delete", kind, name, "--wait=false", "--ignore-not-found"];
        if !namespace.is_empty() {
            args.extend(["-n", namespace]);
        }
        self.kubectl(&args, None).unwrap();
    }

    /// One object as the API server holds it, or `Null` if it does not exist.
    pub fn object(&self, kind: &str, namespace: &str, name: &str) -> serde_json::Value {
        let mut args = vec![
            "get",
            kind,
            name,
            "-o",
            "json",
            "--ignore-not-found",
            "--show-managed-fields",
        ];
        if !namespace.is_empty() {
            args.extend(["-n", namespace]);
        }
        let out = self.kubectl(&args, None).unwrap();
        if out.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&out).unwrap()
        }
    }

    /// A namespace name unique in this binary's run (`PREFIX-N`): tests sharing the API
    /// server keep their objects apart with it.
    pub fn namespace(prefix: &str) -> String {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// A kubeconfig for `namespace/service_account` (created if absent), authenticated by
    /// a token from the TokenRequest API, written to `dir/kubeconfig-SA`.
    pub fn service_account_kubeconfig(&self, dir: &Path, namespace: &str, name: &str) -> PathBuf {
        self.apply(&format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {name}, namespace: {namespace}}}\n"
        ))
        .unwrap();
        let token = self.token(
            namespace,
            name,
            "https://kubernetes.default.svc.cluster.local",
            3600,
        );
        let path = dir.join(format!("kubeconfig-{name}"));
        self.write_kubeconfig(&path, &format!("token: {token}"));
        path
    }

    /// A token for `namespace/service_account` from the TokenRequest API.
    pub fn token(
        &self,
        namespace: &str,
        service_account: &str,
        audience: &str,
        seconds: u32,
    ) -> String {
        self.kubectl(
            &[
                "create",
                "token",
                service_account,
                "-n",
                namespace,
                "--audience",
                audience,
                "--duration",
                &format!("{seconds}s"),
            ],
            None,
        )
        .unwrap()
        .trim()
        .to_string()
    }

    /// Grants `namespace/service_account` the role meshd ships (`manifests/rbac.yaml`):
    /// the ClusterRole through a binding named after the namespace, and the Role in
    /// `system_namespace` (where meshd keeps its Lease, CA Secret and mesh ConfigMap).
    pub fn grant_meshd_role(&self, system_namespace: &str, service_account: &str) {
        let rbac = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/rbac.yaml"),
        )
        .unwrap();
        let rbac = rbac
            .replace(
                "namespace: istio-system",
                &format!("namespace: {system_namespace}"),
            )
            .replace(
                "name: meshd-istio-system",
                &format!("name: meshd-{system_namespace}"),
            );
        self.apply(&rbac).unwrap();
        self.apply(&format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: meshd-{system_namespace}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: meshd}}\nsubjects: [{{kind: ServiceAccount, name: {service_account}, namespace: {system_namespace}}}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: meshd, namespace: {system_namespace}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: meshd}}\nsubjects: [{{kind: ServiceAccount, name: {service_account}, namespace: {system_namespace}}}]\n"
        ))
        .unwrap();
    }

    /// Compacts etcd's history up to its current revision (through etcd's JSON gateway),
    /// so that a watch resumed from an older resourceVersion gets `410 Gone`.
    pub fn compact_etcd(&self) {
        let addr = format!("127.0.0.1:{}", self.etcd_port);
        let range = etcd_post(
            &addr,
            "/v3/kv/range",
            r#"{"key":"AA==","range_end":"AA=="}"#,
        );
        let v: serde_json::Value = serde_json::from_str(&range).unwrap();
        let revision = v["header"]["revision"].as_str().unwrap().to_string();
        etcd_post(
            &addr,
            "/v3/kv/compaction",
            &format!(r#"{{"revision":"{revision}","physical":true}}"#),
        );
    }
}

/// `kubectl --kubeconfig KUBECONFIG ARGS` with `stdin`.
pub fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let mut child = Command::new(tools_bin().join("kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running kubectl");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn start_etcd(bin: &Path, dir: &Path, port: u16) -> Child {
    let peer = free_port();
    let log = std::fs::File::create(dir.join("etcd.log")).unwrap();
    let child = command(&bin.join("etcd"))
        .args([
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls=http://127.0.0.1:{port}"),
            format!("--advertise-client-urls=http://127.0.0.1:{port}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
            format!("--initial-cluster=default=http://127.0.0.1:{peer}"),
            "--unsafe-no-fsync=true".into(),
        ])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting etcd");
    let addr = format!("127.0.0.1:{port}");
    wait_until("etcd to serve", Duration::from_secs(30), || {
        std::net::TcpStream::connect(&addr).is_ok()
    });
    child
}

/// A POST to etcd's JSON gateway; the response body.
fn etcd_post(addr: &str, path: &str, body: &str) -> String {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let response = parse_response(&raw).unwrap();
    assert_eq!(response.status, 200, "etcd {path}: {}", response.body);
    response.body
}

/// One test's share of a cluster: an application namespace (written `shop` in the test's
/// YAML) and a system namespace (written `istio-system`), unique to the test, and meshd's
/// ServiceAccount in the latter, bound to the role meshd ships.
pub struct Tenant {
    pub cluster: &'static Cluster,
    /// The namespace the test's YAML calls `shop`.
    pub app: String,
    /// The namespace the test's YAML calls `istio-system`: meshd's `POD_NAMESPACE`.
    pub system: String,
    pub dir: PathBuf,
    /// meshd's kubeconfig: its ServiceAccount's token, not the admin's.
    pub kubeconfig: PathBuf,
}

impl Tenant {
    /// A tenant of the shared cluster; `labels` go on the application namespace.
    pub fn new(name: &str, labels: &str) -> Tenant {
        Tenant::of(Cluster::shared(), name, labels)
    }

    /// A tenant of `cluster`.
    pub fn of(cluster: &'static Cluster, name: &str, labels: &str) -> Tenant {
        let dir = temp_dir(name);
        let app = Cluster::namespace(name);
        let system = format!("{app}-system");
        cluster
            .apply(&format!(
                "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {app}, labels: {{{labels}}}}}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: {system}}}\n"
            ))
            .unwrap();
        cluster.grant_meshd_role(&system, "meshd");
        let kubeconfig = cluster.service_account_kubeconfig(&dir, &system, "meshd");
        let tenant = Tenant {
            cluster,
            app,
            system,
            dir,
            kubeconfig,
        };
        tenant.apply(&tenant.mesh_configmap("", "")).unwrap();
        tenant
    }

    /// The test's YAML with its namespaces: `shop` and `istio-system` become the tenant's.
    pub fn yaml(&self, yaml: &str) -> String {
        yaml.replace(
            "namespace: istio-system",
            &format!("namespace: {}", self.system),
        )
        .replace("namespace: shop", &format!("namespace: {}", self.app))
        .replace("{name: shop,", &format!("{{name: {},", self.app))
        .replace("{name: shop}", &format!("{{name: {}}}", self.app))
        .replace(".shop.svc.", &format!(".{}.svc.", self.app))
    }

    /// Applies the test's YAML in the tenant's namespaces.
    pub fn apply(&self, yaml: &str) -> Result<(), String> {
        self.cluster.apply(&self.yaml(yaml))
    }

    /// The mesh ConfigMap (`istio`, or `istio-REVISION`) with `mesh` and the tenant's
    /// system namespace as the root namespace.
    pub fn mesh_configmap(&self, revision: &str, mesh: &str) -> String {
        let name = if revision.is_empty() || revision == "default" {
            "istio".to_string()
        } else {
            format!("istio-{revision}")
        };
        let mut text = format!("rootNamespace: {}\n", self.system);
        text.push_str(mesh);
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: {}}}\ndata:\n  mesh: |\n{}",
            self.system,
            text.lines()
                .map(|l| format!("    {l}\n"))
                .collect::<String>()
        )
    }

    /// One object in the tenant's application namespace (`shop`), or `Null`.
    pub fn object(&self, kind: &str, name: &str) -> serde_json::Value {
        self.cluster.object(kind, &self.app, name)
    }

    /// Deletes one object of the tenant's application namespace.
    pub fn delete(&self, kind: &str, name: &str) {
        self.cluster.delete(kind, &self.app, name);
    }

    /// The environment meshd runs with for this tenant: its namespace, and only the
    /// tenant's namespaces watched.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("POD_NAMESPACE".into(), self.system.clone()),
            (
                "WATCHED_NAMESPACES".into(),
                format!("{},{}", self.app, self.system),
            ),
        ]
    }
}
