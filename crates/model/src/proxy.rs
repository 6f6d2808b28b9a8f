//! A connected proxy, identified the Istio way: node id `TYPE~IP~POD.NAMESPACE~DNSDOMAIN`
//! plus node metadata (`NAMESPACE`, `LABELS`, `CLUSTER_ID`, `INTERCEPTION_MODE`, ...).

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Serialize;
use serde_json::{Map, Value};

use super::Locality;
use super::proxy_headers::ProxyHeaders;
use super::service::AutoAddresses;
use super::topology::{GatewayTopology, ProxyConfigError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyKind {
    Sidecar,
    Router,
}

/// How traffic reaches the proxy (`INTERCEPTION_MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Interception {
    Redirect,
    Tproxy,
    /// No iptables capture: outbound listeners bind for real, on the loopback address
    /// (as istiod's), or on the proxy's IP with metadata `MESHD_OUTBOUND_BIND_INSTANCE_IP`.
    None,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Proxy {
    pub id: String,
    pub kind: ProxyKind,
    pub ips: Vec<String>,
    pub pod_name: String,
    pub namespace: String,
    pub dns_domain: String,
    /// Shared with the other connected proxies of the same labels
    /// (`xds::label_sets`).
    #[serde(serialize_with = "shared_labels")]
    pub labels: std::sync::Arc<BTreeMap<String, String>>,
    pub cluster_id: String,
    /// Metadata `MESH_ID` (empty when unset).
    pub mesh_id: String,
    /// Envoy's `node.cluster`, the service cluster it reports spans as (empty when unset).
    pub service_cluster: String,
    pub istio_version: Option<String>,
    pub revision: Option<String>,
    pub interception: Interception,
    pub service_account: Option<String>,
    /// The SPIFFE identity the connection proved (secure port only). Identity-bound
    /// config (secrets) is served only to proxies that have one.
    pub identity: Option<String>,
    /// Envoy's `node.locality` (empty when it sent none).
    pub locality: Locality,
    /// Metadata `IDLE_TIMEOUT` (a Go duration): the idle timeout of the proxy's
    /// connection managers and of its tcp_proxies a DestinationRule sets none for.
    pub idle_timeout: Option<std::time::Duration>,
    /// Metadata `NETWORK` (empty when unset): which of the mesh's networks it is on.
    pub network: String,
    /// Metadata `REQUESTED_NETWORK_VIEW` (`net-a,net-b`): it is sent only endpoints on
    /// these networks (and on none). Sorted; `None` when unset: every network.
    pub network_view: Option<Box<[String]>>,
    /// Metadata `NODE_NAME`: the node it runs on.
    pub node_name: Option<String>,
    /// Its route configurations' virtual hosts (a sidecar's outbound ones, a gateway's)
    /// are sent over VHDS, one resource each, instead of inside the route
    /// configurations: set for delta streams when
    /// `MESHD_ENABLE_VHDS` is on (VHDS needs delta ADS).
    pub vhds: bool,
    /// Its agent runs a DNS proxy, which answers from the name table it asks for over NDS
    /// (`translate::name_table`): metadata `DNS_CAPTURE` on a sidecar, or
    /// `ENABLE_DNS_SERVER` (Go booleans), as istio-agent decides.
    pub dns_proxy: bool,
    /// The auto-allocated ServiceEntry addresses it knows services by (in its name table,
    /// its outbound listeners and its virtual hosts' domains): with metadata `DNS_CAPTURE`,
    /// in the IP families of its own addresses, as istiod's `nodeUsesAutoallocatedIPs`
    /// decides; none when `PILOT_ENABLE_IP_AUTOALLOCATE` is off.
    pub auto_addresses: AutoAddresses,
    /// Metadata `MESHD_OUTBOUND_BIND_INSTANCE_IP` (a Go boolean; meshd's own): outbound
    /// listeners that bind for real without a Sidecar `bind` take the proxy's IP instead of
    /// the loopback address istiod binds, so that several such proxies can share a host.
    pub outbound_bind_instance_ip: bool,
    /// Its Envoy is Istio's build (istio-proxy), with Istio's telemetry extensions: its
    /// node lists [`ISTIO_STATS_EXTENSION`] among the extensions Envoy reports it has.
    /// Such a proxy gets the metadata-exchange, ALPN and stats filters istiod sends
    /// (`translate::istio_proxy`); stock Envoy would refuse them.
    pub istio_extensions: bool,
    /// A gateway's ProxyConfig `gatewayTopology`, from metadata `PROXY_CONFIG`: the
    /// default when that has none; `None` when the node sent no `PROXY_CONFIG`, for which
    /// MeshConfig `defaultConfig`'s applies. Always `None` for a sidecar.
    pub gateway_topology: Option<GatewayTopology>,
    /// ProxyConfig `proxyHeaders`, from metadata `PROXY_CONFIG`: the default when that
    /// has none; `None` when the node sent no `PROXY_CONFIG`, for which MeshConfig
    /// `defaultConfig`'s applies.
    pub proxy_headers: Option<ProxyHeaders>,
}

/// The extension name istio-proxy registers its HTTP stats filter under; Envoy lists
/// every extension it was built with in its node's `extensions`.
pub const ISTIO_STATS_EXTENSION: &str = "envoy.filters.http.istio_stats";

fn shared_labels<S: serde::Serializer>(
    labels: &std::sync::Arc<BTreeMap<String, String>>,
    out: S,
) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(labels.as_ref(), out)
}

/// A node id meshd cannot serve, said for the client (its bootstrap sets the id).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NodeError {
    #[error("node id {0:?} must have 4 parts TYPE~IP~POD.NAMESPACE~DOMAIN")]
    Parts(String),
    #[error("node id {id:?}: unsupported proxy type {kind:?} (sidecar or router)")]
    Type { id: String, kind: String },
    #[error("node id {id:?}: {ip:?} is not an IP address")]
    Ip { id: String, ip: String },
    #[error("node id {0:?}: no namespace in metadata (NAMESPACE) or DNS domain")]
    Namespace(String),
    #[error("node id {id:?}: metadata PROXY_CONFIG: {reason}")]
    ProxyConfig { id: String, reason: String },
}

impl Proxy {
    /// Parses a node id and its metadata; the error says what is wrong, for the client.
    pub fn from_node(id: &str, metadata: &Map<String, Value>) -> Result<Proxy, NodeError> {
        let parts: Vec<&str> = id.split('~').collect();
        let [kind, ip, pod_id, domain] = parts[..] else {
            return Err(NodeError::Parts(id.to_string()));
        };
        let kind = match kind {
            "sidecar" => ProxyKind::Sidecar,
            "router" => ProxyKind::Router,
            other => {
                return Err(NodeError::Type {
                    id: id.to_string(),
                    kind: other.to_string(),
                });
            }
        };
        let text = |k: &str| metadata.get(k).and_then(Value::as_str).map(str::to_string);
        let flag = |k: &str| text(k).and_then(|v| api::duration::parse_bool(&v)) == Some(true);
        let ips: Vec<String> = match text("INSTANCE_IPS") {
            Some(list) if list.split(',').all(|s| s.trim().parse::<IpAddr>().is_ok()) => {
                list.split(',').map(|s| s.trim().to_string()).collect()
            }
            _ => vec![ip.to_string()],
        };
        if ips.iter().any(|ip| ip.parse::<IpAddr>().is_err()) {
            return Err(NodeError::Ip {
                id: id.to_string(),
                ip: ip.to_string(),
            });
        }
        let (pod_name, id_namespace) = pod_id.split_once('.').unwrap_or((pod_id, ""));
        let namespace = text("NAMESPACE")
            .or_else(|| {
                domain
                    .split('.')
                    .next()
                    .map(str::to_string)
                    .filter(|s| !s.is_empty())
            })
            .or_else(|| Some(id_namespace.to_string()).filter(|s| !s.is_empty()))
            .ok_or_else(|| NodeError::Namespace(id.to_string()))?;
        let labels = match metadata.get("LABELS") {
            Some(Value::Object(m)) => m
                .iter()
                .filter(|(k, _)| k.as_str() != "pod-template-hash")
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect(),
            _ => BTreeMap::new(),
        };
        let interception = match text("INTERCEPTION_MODE").as_deref() {
            Some("NONE") => Interception::None,
            Some("TPROXY") => Interception::Tproxy,
            _ => Interception::Redirect,
        };
        let auto_addresses = if flag("DNS_CAPTURE") {
            ip_families(&ips)
        } else {
            AutoAddresses::None
        };
        // PROXY_CONFIG: the proxy's headers; and a gateway's topology, which needs it to
        // be an object if sent at all.
        let refused = |reason: String| NodeError::ProxyConfig {
            id: id.to_string(),
            reason,
        };
        let proxy_config = match metadata.get("PROXY_CONFIG") {
            Some(Value::Object(config)) => Some(config),
            Some(other) if kind == ProxyKind::Router => {
                return Err(refused(format!("{other} is not an object")));
            }
            _ => None,
        };
        let read = |e: ProxyConfigError| refused(e.to_string());
        let proxy_headers = (proxy_config.map(ProxyHeaders::from_proxy_config))
            .transpose()
            .map_err(read)?
            .map(Option::unwrap_or_default);
        let gateway_topology = (proxy_config.filter(|_| kind == ProxyKind::Router))
            .map(GatewayTopology::from_proxy_config)
            .transpose()
            .map_err(read)?
            .map(Option::unwrap_or_default);
        Ok(Proxy {
            id: id.to_string(),
            kind,
            ips,
            pod_name: pod_name.to_string(),
            namespace,
            dns_domain: domain.to_string(),
            revision: text("ISTIO_REVISION").or_else(|| labels.get(super::REVISION_LABEL).cloned()),
            labels: labels.into(),
            cluster_id: text("CLUSTER_ID").unwrap_or_else(|| "Kubernetes".into()),
            mesh_id: text("MESH_ID").unwrap_or_default(),
            service_cluster: String::new(),
            istio_version: text("ISTIO_VERSION"),
            interception,
            service_account: text("SERVICE_ACCOUNT"),
            identity: None,
            locality: Locality::default(),
            // Unparsable: ignored, as istiod's `parseDuration` does.
            idle_timeout: text("IDLE_TIMEOUT").and_then(|t| api::duration::parse(&t).ok()),
            network: text("NETWORK").unwrap_or_default(),
            network_view: text("REQUESTED_NETWORK_VIEW")
                .map(|v| {
                    let mut names: Vec<String> = (v.split(','))
                        .map(str::trim)
                        .filter(|n| !n.is_empty())
                        .map(str::to_string)
                        .collect();
                    names.sort();
                    names.dedup();
                    names.into_boxed_slice()
                })
                .filter(|v| !v.is_empty()),
            node_name: text("NODE_NAME").filter(|n| !n.is_empty()),
            vhds: false,
            outbound_bind_instance_ip: flag("MESHD_OUTBOUND_BIND_INSTANCE_IP"),
            dns_proxy: (kind == ProxyKind::Sidecar && flag("DNS_CAPTURE"))
                || flag("ENABLE_DNS_SERVER"),
            auto_addresses,
            istio_extensions: false,
            gateway_topology,
            proxy_headers,
        })
    }

    pub fn ip(&self) -> &str {
        &self.ips[0]
    }

    /// The loopback address its outbound listeners bind when they bind for real: `::1`
    /// for a proxy with IPv6 addresses only, else `127.0.0.1` (istiod's
    /// `getWildcardsAndLocalHost`; a dual-stack proxy binds the IPv4 one only).
    pub fn local_host(&self) -> &'static str {
        if self.ip_families() == AutoAddresses::Ipv6 {
            "::1"
        } else {
            "127.0.0.1"
        }
    }

    /// The IP families of its addresses.
    pub fn ip_families(&self) -> AutoAddresses {
        ip_families(&self.ips)
    }
}

/// The IP families of a proxy's addresses (all parsed already).
fn ip_families(ips: &[String]) -> AutoAddresses {
    let v6 = |ip: &String| ip.parse::<IpAddr>().is_ok_and(|ip| ip.is_ipv6());
    match (ips.iter().any(|ip| !v6(ip)), ips.iter().any(v6)) {
        (true, true) => AutoAddresses::DualStack,
        (false, true) => AutoAddresses::Ipv6,
        _ => AutoAddresses::Ipv4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_sidecar_node_id_and_metadata_parse_the_istio_way() {
        let meta = json!({"NAMESPACE": "shop", "LABELS": {"app": "reviews", "pod-template-hash": "x"}, "INTERCEPTION_MODE": "NONE"});
        let p = Proxy::from_node(
            "sidecar~10.1.2.3~reviews-v1-abc.shop~shop.svc.cluster.local",
            meta.as_object().unwrap(),
        )
        .unwrap();
        assert_eq!(p.kind, ProxyKind::Sidecar);
        assert_eq!(p.ip(), "10.1.2.3");
        assert_eq!(p.pod_name, "reviews-v1-abc");
        assert_eq!(p.namespace, "shop");
        assert_eq!(p.labels.len(), 1);
        assert_eq!(p.interception, Interception::None);
        assert_eq!(p.cluster_id, "Kubernetes");
    }

    #[test]
    fn idle_timeout_metadata_is_a_go_duration_or_nothing() {
        let parse = |v: &str| {
            let meta = json!({"NAMESPACE": "shop", "IDLE_TIMEOUT": v});
            Proxy::from_node(
                "sidecar~10.1.2.3~a.shop~shop.svc.cluster.local",
                meta.as_object().unwrap(),
            )
            .unwrap()
            .idle_timeout
        };
        assert_eq!(parse("1m30s"), Some(std::time::Duration::from_secs(90)));
        assert_eq!(parse("soon"), None);
    }

    #[test]
    fn a_dns_proxy_is_what_istio_agent_runs_one_for() {
        let dns_proxy = |kind: &str, meta: serde_json::Value| {
            let id = format!("{kind}~10.1.2.3~a.shop~shop.svc.cluster.local");
            Proxy::from_node(&id, meta.as_object().unwrap())
                .unwrap()
                .dns_proxy
        };
        assert!(dns_proxy("sidecar", json!({"DNS_CAPTURE": "true"})));
        assert!(dns_proxy("sidecar", json!({"DNS_CAPTURE": "1"})));
        assert!(!dns_proxy("sidecar", json!({"DNS_CAPTURE": "false"})));
        assert!(!dns_proxy("sidecar", json!({"DNS_CAPTURE": "yes"})));
        assert!(!dns_proxy("sidecar", json!({})));
        // A gateway's agent ignores DNS_CAPTURE; ENABLE_DNS_SERVER is for any proxy.
        assert!(!dns_proxy("router", json!({"DNS_CAPTURE": "true"})));
        assert!(dns_proxy("router", json!({"ENABLE_DNS_SERVER": "true"})));
        assert!(dns_proxy("sidecar", json!({"ENABLE_DNS_SERVER": "True"})));
    }

    #[test]
    fn a_proxy_capturing_dns_uses_auto_allocated_addresses_of_its_own_ip_families() {
        let auto = |kind: &str, ips: &str, meta: serde_json::Value| {
            let mut meta = meta.as_object().unwrap().clone();
            meta.insert("INSTANCE_IPS".into(), ips.into());
            let id = format!("{kind}~10.1.2.3~a.shop~shop.svc.cluster.local");
            Proxy::from_node(&id, &meta).unwrap().auto_addresses
        };
        let capture = json!({"DNS_CAPTURE": "true"});
        assert_eq!(
            auto("sidecar", "10.1.2.3", capture.clone()),
            AutoAddresses::Ipv4
        );
        assert_eq!(
            auto("sidecar", "fd00::3", capture.clone()),
            AutoAddresses::Ipv6
        );
        let dual = auto("sidecar", "10.1.2.3,fd00::3", capture.clone());
        assert_eq!(dual, AutoAddresses::DualStack);
        // istiod does not look at the kind; DNS_AUTO_ALLOCATE alone is not enough.
        assert_eq!(auto("router", "10.1.2.3", capture), AutoAddresses::Ipv4);
        let allocate_only = json!({"DNS_AUTO_ALLOCATE": "true"});
        assert_eq!(
            auto("sidecar", "10.1.2.3", allocate_only),
            AutoAddresses::None
        );
        let server_only = json!({"ENABLE_DNS_SERVER": "true"});
        assert_eq!(
            auto("sidecar", "10.1.2.3", server_only),
            AutoAddresses::None
        );
    }

    #[test]
    fn a_malformed_node_id_is_refused_with_a_reason() {
        let empty = Map::new();
        assert!(
            Proxy::from_node("sidecar~10.0.0.1", &empty)
                .unwrap_err()
                .to_string()
                .contains("4 parts")
        );
        assert!(
            Proxy::from_node("waiter~10.0.0.1~a.b~b.svc.cluster.local", &empty)
                .unwrap_err()
                .to_string()
                .contains("unsupported")
        );
        assert!(
            Proxy::from_node("router~nope~a.b~b.svc.cluster.local", &empty)
                .unwrap_err()
                .to_string()
                .contains("not an IP")
        );
    }
}
