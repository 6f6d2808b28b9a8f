//! The test host: workloads that meshd finds through Kubernetes, reachable by Envoy
//! without loopback addresses, which the API server refuses in EndpointSlices.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use crate::harness::Upstream;

/// A test host: a network namespace of this test process's own, joined to the host by a
/// veth pair, whose address upstreams listen on. The API server refuses loopback
/// addresses in EndpointSlices and Endpoints (as every real cluster does), so workloads
/// that meshd finds through Kubernetes live here, and Envoy reaches them over the veth.
/// Removed when the test binary exits.
pub struct TestHost {
    netns: String,
    /// The workloads' address, inside the namespace.
    pub ip: String,
    /// The host's end of the veth pair.
    pub peer_ip: String,
}

extern "C" fn remove_test_host() {
    if let Some(host) = TEST_HOST.get() {
        let _ = Command::new("ip")
            .args(["netns", "del", &host.netns])
            .status();
    }
}

static TEST_HOST: OnceLock<TestHost> = OnceLock::new();

/// `ip ARGS`, which must succeed.
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("the test host needs iproute2's `ip` (and root): {e}"));
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn test_host() -> &'static TestHost {
    TEST_HOST.get_or_init(|| {
        // Namespaces left by test processes that are gone.
        let listed = Command::new("ip").args(["netns", "list"]).output();
        let listed = listed.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        for line in listed.unwrap_or_default().lines() {
            let name = line.split_whitespace().next().unwrap_or_default();
            if let Some(pid) = name.strip_prefix("meshd-e2e-")
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = Command::new("ip").args(["netns", "del", name]).status();
            }
        }
        let pid = std::process::id();
        let netns = format!("meshd-e2e-{pid}");
        let (outside, inside) = (format!("me{pid}a"), format!("me{pid}b"));
        let (a, b) = ((pid / 64) % 256, (pid % 64) * 4);
        let (host_ip, ns_ip) = (
            format!("10.248.{a}.{}", b + 1),
            format!("10.248.{a}.{}", b + 2),
        );
        ip(&["netns", "add", &netns]);
        ip(&[
            "link", "add", &outside, "type", "veth", "peer", "name", &inside,
        ]);
        ip(&["link", "set", &inside, "netns", &netns]);
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &outside]);
        ip(&["link", "set", &outside, "up"]);
        for args in [
            vec!["addr", "add", &format!("{ns_ip}/30"), "dev", &inside],
            vec!["link", "set", &inside, "up"],
            vec!["link", "set", "lo", "up"],
        ] {
            let mut all = vec!["netns", "exec", &netns, "ip"];
            all.extend(args);
            ip(&all);
        }
        // SAFETY: registers a plain function to run at exit.
        unsafe { libc::atexit(remove_test_host) };
        TestHost {
            netns,
            ip: ns_ip,
            peer_ip: host_ip,
        }
    })
}

/// An upstream (as [`Upstream::start`]) listening on the test host.
pub fn upstream(name: &str) -> Upstream {
    let host = test_host();
    let path = format!("/var/run/netns/{}", host.netns);
    let addr = format!("{}:0", host.ip);
    let (tx, rx) = std::sync::mpsc::channel();
    let n = name.to_string();
    std::thread::spawn(move || {
        // This thread (and the sockets it makes) enter the test host's network namespace.
        let ns = std::fs::File::open(&path).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: setns on this thread only, with a namespace file it holds open.
        let entered = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(
            entered,
            0,
            "entering {path}: {}",
            std::io::Error::last_os_error()
        );
        let listener = std::net::TcpListener::bind(&addr).unwrap();
        tx.send(listener.local_addr().unwrap().port()).unwrap();
        for conn in listener.incoming().flatten() {
            let n = n.clone();
            std::thread::spawn(move || {
                crate::harness::serve_connection(conn, &n, |_| "200 OK", "")
            });
        }
    });
    let port = rx.recv().unwrap();
    Upstream {
        name: name.to_string(),
        port,
    }
}

/// A Service in `shop` with one Pod and one EndpointSlice per upstream (started with
/// [`upstream`]), as a real cluster holds them (the Pod with a container, the Service's
/// cluster IP allocated by the API server, the slice as the EndpointSlice controller would
/// write it, with the test host's address).
pub fn service_yaml(name: &str, port: u16, upstreams: &[(&Upstream, &[(&str, &str)])]) -> String {
    let mut out = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  selector: {{app: {name}}}\n  ports: [{{name: http, port: {port}}}]\n"
    );
    for (up, labels) in upstreams {
        let labels: String = labels.iter().map(|(k, v)| format!("{k}: {v}, ")).collect();
        out.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: shop, labels: {{{labels}app: {name}}}}}\nspec:\n  containers: [{{name: app, image: app}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {pod}, namespace: shop, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: http, port: {p}}}]\nendpoints:\n- addresses: [{ip}]\n  conditions: {{ready: true}}\n  targetRef: {{kind: Pod, name: {pod}}}\n",
            pod = up.name,
            p = up.port,
            ip = test_host().ip,
        ));
    }
    out
}
