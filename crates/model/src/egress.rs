//! A Sidecar's egress listeners, as istiod's `IstioEgressListenerWrapper` reads them: the
//! hosts each one imports, and for one with a `port`, the port, protocol and address its
//! listener takes. A proxy without a Sidecar (or a Sidecar without `egress`) has one
//! catch-all listener that imports everything.

use api::networking::{IstioEgressListener, SidecarSpec};

use super::{Protocol, host_matches};

/// Istio's prefix for an egress `bind` that is a Unix domain socket.
pub const UNIX_PREFIX: &str = "unix://";

/// One egress listener of a proxy's Sidecar.
#[derive(Clone, Copy, Debug)]
pub struct Egress<'a> {
    /// `None`: the implicit catch-all of a proxy without egress listeners.
    listener: Option<&'a IstioEgressListener>,
}

impl<'a> Egress<'a> {
    /// The egress listeners of a proxy whose Sidecar is `scope`, in order: those with a
    /// port first (validation keeps the catch-all last), or the implicit catch-all.
    pub fn of(scope: Option<&'a SidecarSpec>) -> Vec<Egress<'a>> {
        match scope {
            Some(sc) if !sc.egress.is_empty() => (sc.egress.iter())
                .map(|l| Egress { listener: Some(l) })
                .collect(),
            _ => vec![Egress { listener: None }],
        }
    }

    /// The `namespace/host` patterns it imports; `None`: everything.
    pub fn hosts(&self) -> Option<&'a [String]> {
        self.listener.map(|l| l.hosts.as_slice())
    }

    /// Whether it imports config of `namespace` for `host`, for a proxy in `proxy_ns`.
    pub fn imports(&self, proxy_ns: &str, namespace: &str, host: &str) -> bool {
        self.hosts()
            .is_none_or(|hosts| imports(hosts, proxy_ns, namespace, host))
    }

    /// The port and protocol of a listener with a `port`; `None` for the catch-all. A
    /// port without a protocol is sniffed, as istiod parses an empty protocol.
    pub fn port(&self) -> Option<(u32, Protocol)> {
        let port = self.listener?.port.as_ref()?;
        Some((port.number, Protocol::parse(&port.protocol)))
    }

    /// The IP address its listeners bind to, if the Sidecar names one.
    pub fn bind(&self) -> Option<&'a str> {
        self.listener?.bind.as_deref().filter(|b| !b.is_empty())
    }

    /// `captureMode: NONE`: its listeners bind for real even where traffic is captured.
    pub fn capture_none(&self) -> bool {
        self.listener
            .and_then(|l| l.capture_mode.as_deref())
            .is_some_and(|m| m == "NONE")
    }

    /// Whether meshd builds its listeners: not for a Unix domain socket `bind`, nor for
    /// the `HTTP_PROXY` protocol (validation warns about both), nor for UDP (istiod builds
    /// no listener for it either).
    pub fn translated(&self) -> bool {
        let unix = self.bind().is_some_and(|b| b.starts_with(UNIX_PREFIX));
        let protocol = (self.listener.and_then(|l| l.port.as_ref())).map(|p| p.protocol.as_str());
        let skipped = protocol
            .is_some_and(|p| p.eq_ignore_ascii_case("HTTP_PROXY") || p.eq_ignore_ascii_case("UDP"));
        !unix && !skipped
    }
}

/// Whether egress `hosts` import config of `namespace` for `host`, for a proxy in
/// `proxy_ns`: `*/HOST`, `./HOST` (the proxy's namespace), `NS/HOST`; `~/HOST` imports
/// nothing.
pub fn imports(hosts: &[String], proxy_ns: &str, namespace: &str, host: &str) -> bool {
    hosts.iter().any(|h| {
        let (ns, pattern) = h.split_once('/').unwrap_or(("*", h));
        let ns_ok = match ns {
            "*" => true,
            "." => namespace == proxy_ns,
            "~" => false,
            other => other == namespace,
        };
        ns_ok && host_matches(pattern, host)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sidecar(yaml: &str) -> SidecarSpec {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn listeners_keep_their_order_ports_binds_and_hosts() {
        let sc = sidecar(
            "egress:\n- port: {number: 9080, protocol: HTTP, name: web}\n  bind: 127.0.0.2\n  captureMode: NONE\n  hosts: [shop/reviews.shop.svc.cluster.local]\n- port: {number: 3306, protocol: TCP, name: db}\n  hosts: [./*]\n- hosts: [istio-system/*]\n",
        );
        let egress = Egress::of(Some(&sc));
        assert_eq!(egress.len(), 3);
        assert_eq!(egress[0].port(), Some((9080, Protocol::Http)));
        assert_eq!(egress[0].bind(), Some("127.0.0.2"));
        assert!(egress[0].capture_none());
        assert!(egress[0].imports("web", "shop", "reviews.shop.svc.cluster.local"));
        assert!(!egress[0].imports("web", "shop", "ratings.shop.svc.cluster.local"));
        assert_eq!(egress[1].port(), Some((3306, Protocol::Tcp)));
        assert!(egress[1].imports("web", "web", "mysql.web.svc.cluster.local"));
        assert!(!egress[1].imports("web", "shop", "mysql.shop.svc.cluster.local"));
        assert!(!egress[1].capture_none() && egress[1].bind().is_none());
        assert_eq!(egress[2].port(), None);
        assert!(egress[2].imports("web", "istio-system", "x.istio-system.svc.cluster.local"));
    }

    #[test]
    fn without_egress_listeners_one_catch_all_imports_everything() {
        for scope in [None, Some(&sidecar("ingress: []\n"))] {
            let egress = Egress::of(scope);
            assert_eq!(egress.len(), 1);
            assert!(egress[0].hosts().is_none() && egress[0].port().is_none());
            assert!(egress[0].imports("a", "b", "c.b.svc.cluster.local"));
        }
    }

    #[test]
    fn unix_sockets_http_proxy_and_udp_are_not_translated() {
        let sc = sidecar(
            "egress:\n- port: {number: 0, protocol: HTTP, name: uds}\n  bind: unix:///var/run/app.sock\n  hosts: [./*]\n- port: {number: 8080, protocol: HTTP_PROXY, name: proxy}\n  hosts: [./*]\n- port: {number: 8081, name: sniffed}\n  hosts: [./*]\n- port: {number: 53, protocol: UDP, name: dns}\n  hosts: [./*]\n",
        );
        let translated: Vec<bool> = Egress::of(Some(&sc))
            .iter()
            .map(|e| e.translated())
            .collect();
        assert_eq!(translated, [false, false, true, false]);
        assert_eq!(
            Egress::of(Some(&sc))[2].port(),
            Some((8081, Protocol::Unknown))
        );
    }
}
