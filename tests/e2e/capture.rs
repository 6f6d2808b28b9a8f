//! Traffic capture for real, as an injected pod runs it: in a network namespace the test
//! creates (a veth pair to the host), the `istio-init` command (`meshd agent iptables`,
//! with the injector's flags) writes its rules with Debian's iptables (`tools/build.sh
//! iptables`), then `meshd agent --envoy` runs as the proxy's uid 1337, as the injected
//! `istio-proxy` container does. An application in the namespace calls a Service by its
//! cluster IP and is answered through Envoy, and a ServiceEntry's address whose
//! `workloadSelector` selects its own Pod; it speaks a protocol other than HTTP on the
//! Service's HTTP port to an address outside the mesh, and HTTP to an ExternalName
//! Service's outside host, which both pass through; a call from outside to the pod's port
//! reaches the application through Envoy's inbound side, and one to a port no Service
//! declares is HTTP to Envoy still, under an AuthorizationPolicy's path rule.
//! Envoy's statistics show each. Needs root (network namespaces, iptables); without it
//! the test fails saying so.

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::harness::*;

/// The proxy's user and group, which the capture rules leave alone.
const PROXY_UID: u32 = 1337;

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace joined to the host by a veth pair: the host side is
/// `10.251.K.1/30`, the namespace's `10.251.K.2/30`, its default route the host.
struct Netns {
    name: String,
    host_veth: String,
    host_ip: String,
    pod_ip: String,
    file: File,
}

impl Netns {
    fn create() -> Netns {
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "the capture test makes a network namespace and writes iptables rules: run it as root"
        );
        let id = std::process::id();
        let k = id % 250 + 1;
        let name = format!("meshd-capture-{id}");
        let (host_veth, pod_veth) = (format!("mc{id}h"), format!("mc{id}p"));
        let (host_ip, pod_ip) = (format!("10.251.{k}.1"), format!("10.251.{k}.2"));
        ip(&["netns", "add", &name]);
        let file = File::open(format!("/run/netns/{name}")).unwrap();
        let ns = Netns {
            name: name.clone(),
            host_veth: host_veth.clone(),
            host_ip: host_ip.clone(),
            pod_ip: pod_ip.clone(),
            file,
        };
        ip(&[
            "link", "add", &host_veth, "type", "veth", "peer", "name", &pod_veth,
        ]);
        ip(&["link", "set", &pod_veth, "netns", &name]);
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_veth]);
        ip(&["link", "set", &host_veth, "up"]);
        ip(&[
            "-n",
            &name,
            "addr",
            "add",
            &format!("{pod_ip}/30"),
            "dev",
            &pod_veth,
        ]);
        ip(&["-n", &name, "link", "set", &pod_veth, "up"]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        ip(&["-n", &name, "route", "add", "default", "via", &host_ip]);
        ns
    }

    fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Runs `f` on a thread inside the namespace.
    fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let fd = self.fd();
        std::thread::spawn(move || {
            enter(fd);
            f()
        })
        .join()
        .unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_veth])
            .output();
    }
}

/// Moves the calling thread into the namespace `fd`.
fn enter(fd: RawFd) {
    // SAFETY: setns(2) on an open namespace file; it changes only this thread.
    let rc = unsafe { libc::setns(fd, libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
}

/// `command` as a process in the namespace `fd`, as `uid` (and the same gid) if given.
fn in_namespace(command: &mut Command, fd: RawFd, uid: Option<u32>) -> &mut Command {
    // SAFETY: only async-signal-safe calls (setns, setgroups, setgid, setuid) between fork
    // and exec, on the child's own state.
    unsafe {
        command.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(uid) = uid
                && (libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(uid) != 0
                    || libc::setuid(uid) != 0)
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Answers every HTTP request on `listener` with `body`.
fn answer_with(listener: TcpListener, body: &'static str) {
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf);
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(response.as_bytes());
            });
        }
    });
}

/// Kills a process when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A counter from Envoy's admin `/stats` (inside the namespace), or 0.
fn envoy_stat(ns: &Netns, name: &str) -> u64 {
    let name = name.to_string();
    ns.run(move || {
        let stats = http_get("127.0.0.1:15000", "localhost", "/stats", &[])
            .map(|r| r.body)
            .unwrap_or_default();
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    })
}

#[test]
fn captured_traffic_goes_through_envoy_both_ways() {
    let iptables: PathBuf = crate::cluster::built("iptables");
    let ns = Netns::create();
    let (host_ip, pod_ip) = (ns.host_ip.clone(), ns.pod_ip.clone());

    // An upstream on the host, and the workload's own application in the namespace.
    let upstream = TcpListener::bind(format!("{host_ip}:0")).unwrap();
    let upstream_port = upstream.local_addr().unwrap().port();
    answer_with(upstream, "from-echo");
    let app = ns.run(|| TcpListener::bind("0.0.0.0:9080").unwrap());
    answer_with(app, "from-the-app");
    // A port no Service declares.
    let undeclared = ns.run(|| TcpListener::bind("0.0.0.0:7070").unwrap());
    answer_with(undeclared, "from-7070");

    let dir = temp_dir("capture");
    let config = dir.join("config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(dir.join("tokens"), "cap-token shop capture\n").unwrap();
    std::fs::write(
        config.join("mesh.yaml"),
        format!(
            r#"apiVersion: v1
kind: Namespace
metadata: {{name: shop}}
---
apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: shop}}
spec: {{clusterIP: 10.96.251.10, selector: {{app: echo}}, ports: [{{name: http, port: 80, targetPort: {upstream_port}}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: echo-1, namespace: shop, labels: {{kubernetes.io/service-name: echo}}}}
addressType: IPv4
ports: [{{name: http, port: {upstream_port}}}]
endpoints: [{{addresses: [{host_ip}], conditions: {{ready: true}}}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: no-forbidden, namespace: shop}}
spec: {{selector: {{matchLabels: {{app: capture}}}}, action: DENY, rules: [{{to: [{{operation: {{paths: [/forbidden]}}}}]}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: ext, namespace: shop}}
spec: {{type: ExternalName, externalName: api.example.com, ports: [{{name: http, port: 80}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: capture, namespace: shop}}
spec: {{clusterIP: 10.96.251.11, selector: {{app: capture}}, ports: [{{name: http, port: 9080, targetPort: 9080}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: capture-0, namespace: shop, labels: {{app: capture}}}}
spec: {{serviceAccountName: capture, containers: []}}
status: {{podIP: {pod_ip}}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: billing, namespace: shop}}
spec:
  hosts: [billing.internal]
  addresses: [240.0.0.7]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 7000, name: http, protocol: HTTP, targetPort: 9080}}]
  workloadSelector: {{labels: {{app: capture}}}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: capture-1, namespace: shop, labels: {{kubernetes.io/service-name: capture}}}}
addressType: IPv4
ports: [{{name: http, port: 9080}}]
endpoints: [{{addresses: [{pod_ip}], conditions: {{ready: true}}, targetRef: {{kind: Pod, name: capture-0}}}}]
"#
        ),
    )
    .unwrap();
    let tokens = dir.join("tokens");
    let meshd =
        Meshd::start_on_all_interfaces(&config, &["--ca-token-file", tokens.to_str().unwrap()]);

    // istio-init: the injector's flags, as root in the namespace.
    let path = format!(
        "{}:{}",
        iptables.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let init = in_namespace(
        Command::new(env!("CARGO_BIN_EXE_meshd")).env("PATH", &path),
        ns.fd(),
        None,
    )
    .args([
        "agent", "iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT",
    ])
    .args(["-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020"])
    .output()
    .unwrap();
    assert!(
        init.status.success(),
        "istio-init: {}",
        String::from_utf8_lossy(&init.stderr)
    );

    // istio-proxy: the agent and Envoy as uid 1337, with files it may read and write.
    let pod = dir.join("pod");
    std::fs::create_dir_all(&pod).unwrap();
    std::fs::write(pod.join("token"), "cap-token").unwrap();
    std::fs::copy(
        meshd.ca_dir.join("root-cert.pem"),
        pod.join("root-cert.pem"),
    )
    .unwrap();
    for (file, mode) in [
        (&pod, 0o777),
        (&pod.join("token"), 0o644),
        (&pod.join("root-cert.pem"), 0o644),
    ] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let socket = std::env::temp_dir().join(format!("meshd-capture-{}.sock", std::process::id()));
    let mut agent = Command::new(env!("CARGO_BIN_EXE_meshd"));
    in_namespace(&mut agent, ns.fd(), Some(PROXY_UID))
        .arg("agent")
        .args(["--ca-address", &format!("{host_ip}:{}", meshd.secure_port)])
        .arg("--ca-root-cert")
        .arg(pod.join("root-cert.pem"))
        .args(["--ca-server-name", "localhost"])
        .arg("--token-file")
        .arg(pod.join("token"))
        .args([
            "--namespace",
            "shop",
            "--service-account",
            "capture",
            "--pod-name",
            "capture-0",
        ])
        .args(["--instance-ip", &pod_ip, "--label", "app=capture"])
        .arg("--sds-socket")
        .arg(&socket)
        .arg("--bootstrap")
        .arg(pod.join("envoy-rev.json"))
        .arg("--envoy")
        .arg(envoy_bin())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(File::create(dir.join("agent.log")).unwrap());
    let _agent = Killed(agent.spawn().unwrap());

    // Outbound: the application calls the Service's cluster IP; Envoy answers for it.
    let call = || {
        ns.run(|| {
            http_get("10.96.251.10:80", "echo.shop.svc.cluster.local", "/", &[])
                .map(|r| r.body)
                .unwrap_or_default()
        })
    };
    wait_until(
        "the cluster IP to answer through Envoy",
        Duration::from_secs(30),
        || call() == "from-echo",
    );
    let outbound = "cluster.outbound|80||echo.shop.svc.cluster.local;.upstream_rq_total";
    assert!(envoy_stat(&ns, outbound) >= 1, "{outbound}");

    // A ServiceEntry whose workloadSelector selects the Pod: the Pod is its endpoint.
    let billing = ns.run(|| {
        http_get("240.0.0.7:7000", "billing.internal", "/", &[])
            .map(|r| format!("{} {}", r.status, r.body))
            .unwrap_or_else(|e| e.to_string())
    });
    assert_eq!(
        billing, "200 from-the-app",
        "a ServiceEntry selecting the Pod"
    );

    // Not HTTP, to an address no service has, on a port an HTTP service declares: the
    // HTTP inspector tells it apart, and it passes through to where it was going.
    let raw = TcpListener::bind(format!("{host_ip}:80")).unwrap();
    std::thread::spawn(move || {
        for mut conn in raw.incoming().flatten() {
            let mut line = [0u8; 5];
            if conn.read_exact(&mut line).is_err() {
                continue;
            }
            let answer = if &line == b"PING\n" {
                "PONG\n".to_string()
            } else {
                let mut rest = [0u8; 4096];
                let _ = conn.read(&mut rest);
                let body = "from-outside";
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            };
            let _ = conn.write_all(answer.as_bytes());
        }
    });
    let target = format!("{host_ip}:80");
    let answer = ns.run(move || {
        let mut s = std::net::TcpStream::connect(&target).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"PING\n").unwrap();
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        answer
    });
    assert_eq!(
        String::from_utf8_lossy(&answer),
        "PONG\n",
        "a non-HTTP protocol on port 80 to an address outside the mesh"
    );
    let passed = "cluster.PassthroughCluster;.upstream_cx_total";
    assert!(envoy_stat(&ns, passed) >= 1, "{passed}");

    // HTTP for an ExternalName Service of a host outside the mesh, sent where the
    // cluster's DNS would have resolved it: it goes where that host's traffic goes.
    let outside = format!("{host_ip}:80");
    let answer = ns.run(move || {
        http_get(&outside, "ext.shop.svc.cluster.local", "/", &[])
            .map(|r| format!("{} {}", r.status, r.body))
            .unwrap_or_else(|e| e.to_string())
    });
    assert_eq!(answer, "200 from-outside", "an ExternalName host");

    // Inbound: a caller outside reaches the application through Envoy's inbound side.
    let reached = http_get(
        &format!("{pod_ip}:9080"),
        "capture.shop.svc.cluster.local",
        "/",
        &[],
    )
    .unwrap();
    assert_eq!(reached.body, "from-the-app");
    let inbound = "cluster.inbound|9080||;.upstream_rq_total";
    assert!(envoy_stat(&ns, inbound) >= 1, "{inbound}");

    // HTTP to a port no Service declares is HTTP still: the policy denying one path
    // refuses that path alone, and Envoy counts requests, not connections.
    let get = |path: &'static str| {
        let to = format!("{pod_ip}:7070");
        let r = http_get(&to, "capture", path, &[]).unwrap();
        format!("{} {}", r.status, r.body)
    };
    assert_eq!(get("/"), "200 from-7070");
    assert!(
        get("/forbidden").starts_with("403 "),
        "{}",
        get("/forbidden")
    );
    let requests = "http.InboundPassthroughCluster;.downstream_rq_total";
    assert!(envoy_stat(&ns, requests) >= 2, "{requests}");
}
