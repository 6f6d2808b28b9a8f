//! Sidecar: egress listeners, the outbound traffic policy's egress proxy, and the
//! subnets of MeshNetworks.

use super::*;

/// A Sidecar's `outboundTrafficPolicy.egressProxy`, as istiod checks it: only with mode
/// ALLOW_ANY (an unset mode is REGISTRY_ONLY in Istio's API), a DNS host, a port.
pub(super) fn egress_proxy(r: &mut Report, policy: &api::networking::OutboundTrafficPolicy) {
    use api::networking::OutboundMode;
    let Some(proxy) = &policy.egress_proxy else {
        return;
    };
    let f = "spec.outboundTrafficPolicy.egressProxy";
    if policy.mode != Some(OutboundMode::AllowAny) {
        r.error(
            f,
            "egressProxy must be set only with ALLOW_ANY outboundTrafficPolicy mode",
        );
    }
    if !dns_name(&proxy.host) {
        r.error(
            format!("{f}.host"),
            format!("{:?} is not a DNS name", proxy.host),
        );
    }
    if proxy
        .port
        .as_ref()
        .is_none_or(|p| !(1..=65535).contains(&p.number))
    {
        r.error(format!("{f}.port"), "egressProxy needs a port (1-65535)");
    }
}

/// A DNS name: dot-separated labels of letters, digits and inner hyphens.
pub(super) fn dns_name(host: &str) -> bool {
    let label = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    host.len() <= 255 && host.split('.').all(label)
}

/// A Sidecar's egress listeners, as istiod's `ValidateSidecar` checks them: hosts as
/// `namespace/host`, at least one; one catch-all (no `port`), and last; ports in range,
/// of a known protocol, unique among IP-bound listeners; `bind` an IP address;
/// `captureMode` one of Istio's. A Unix domain socket `bind` and the `HTTP_PROXY`
/// protocol are accepted with a warning: meshd builds no listener for them.
pub(super) fn sidecar_egress(r: &mut Report, egress: &[api::networking::IstioEgressListener]) {
    use crate::egress::UNIX_PREFIX;
    let mut ports = Vec::new();
    for (i, e) in egress.iter().enumerate() {
        let f = format!("spec.egress[{i}]");
        if e.hosts.is_empty() {
            r.error(
                format!("{f}.hosts"),
                "an egress listener needs at least one host",
            );
        }
        for (j, h) in e.hosts.iter().enumerate() {
            if !h.contains('/') {
                r.error(
                    format!("{f}.hosts[{j}]"),
                    format!("must be namespace/host, got {h:?}"),
                );
            }
        }
        let bind = e.bind.as_deref().unwrap_or("");
        let unix = bind.starts_with(UNIX_PREFIX);
        match e.capture_mode.as_deref() {
            None | Some("DEFAULT" | "IPTABLES" | "NONE") => {}
            Some(other) => r.error(
                format!("{f}.captureMode"),
                format!("{other:?} is not DEFAULT, IPTABLES or NONE"),
            ),
        }
        if unix {
            r.warn(
                format!("{f}.bind"),
                format!("{NOT_APPLIED}: a Unix domain socket"),
            );
        } else if !bind.is_empty() && bind.parse::<std::net::IpAddr>().is_err() {
            r.error(
                format!("{f}.bind"),
                format!("{bind:?} is not an IP address"),
            );
        }
        let Some(port) = &e.port else {
            if i + 1 != egress.len() {
                r.error(
                    format!("{f}.port"),
                    "only the last egress listener may omit the port (the catch-all)",
                );
            }
            continue;
        };
        let protocol = port.protocol.to_ascii_uppercase();
        if protocol == "HTTP_PROXY" {
            r.warn(
                format!("{f}.port.protocol"),
                format!("{NOT_APPLIED}: HTTP_PROXY"),
            );
        } else if !protocol.is_empty() && !ISTIO_PROTOCOLS.contains(&protocol.as_str()) {
            r.error(
                format!("{f}.port.protocol"),
                format!("unsupported protocol {:?}", port.protocol),
            );
        }
        if port.number == 0 && !unix {
            r.error(
                format!("{f}.port.number"),
                "port 0 needs a Unix domain socket bind",
            );
        } else if !unix {
            if port.number > 65535 {
                r.error(
                    format!("{f}.port.number"),
                    format!("port {} out of range", port.number),
                );
            } else if ports.contains(&port.number) {
                r.error(
                    format!("{f}.port.number"),
                    format!("port {} is taken by an earlier egress listener: ports on IP bound listeners must be unique", port.number),
                );
            }
            ports.push(port.number);
        }
    }
}

/// The protocols Istio's `protocol.Parse` knows, as a port's `protocol` spells them.
pub(super) const ISTIO_PROTOCOLS: [&str; 12] = [
    "HTTP",
    "HTTP2",
    "HTTPS",
    "GRPC",
    "GRPC-WEB",
    "TCP",
    "TLS",
    "UDP",
    "MONGO",
    "MYSQL",
    "REDIS",
    "HTTP_PROXY",
];

/// A match's `destinationSubnets`: each must parse. Sidecars match on them; a match bound
/// only to gateways (`gateways` without `mesh`) warns, as gateways ignore them (istiod's
/// `l4SingleMatch` does not read them).
pub(super) fn subnets(r: &mut Report, field: &str, subnets: &[String], gateways: &[String]) {
    let sidecars = gateways.is_empty() || gateways.iter().any(|g| g == "mesh");
    for (j, subnet) in subnets.iter().enumerate() {
        let f = format!("{field}.destinationSubnets[{j}]");
        if !valid_cidr(subnet) {
            r.error(f, format!("{subnet:?} is not an IP address or CIDR"));
        } else if !sidecars {
            r.warn(
                f,
                "ignored: a gateway does not match on destinationSubnets, as with istiod",
            );
        }
    }
}

/// An IP address, or `ADDRESS/LENGTH` with a length the address's family allows (as
/// istiod's `ValidateIPSubnet`: `10.0.0.1/`, a slash without a length, is neither).
pub(super) fn valid_cidr(text: &str) -> bool {
    let (ip, len) = match text.split_once('/') {
        Some((ip, len)) => (ip, Some(len)),
        None => (text, None),
    };
    let Ok(ip) = ip.parse::<std::net::IpAddr>() else {
        return false;
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    len.is_none_or(|l| l.parse::<u8>().is_ok_and(|l| l <= max))
}
