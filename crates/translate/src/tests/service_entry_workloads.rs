//! A ServiceEntry's `workloadSelector` selects Pods as well as WorkloadEntries, as istiod's
//! ServiceEntry registry takes both as workload instances: the Pods' addresses are its
//! endpoints, and a selected Pod's sidecar serves the entry's ports inbound.

use envoy_api::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use serde_json::json;

use super::{context, sidecar};
use crate::{ProxyConfig, proxy_config};
use model::Proxy;

/// `billing.internal`, mesh-internal and STATIC, selecting `app: billing` in shop on port
/// 7000 (the workloads listen on 7070); two Pods match, one of them without an IP yet, and
/// one Pod of another namespace has the labels too.
const ENTRY: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: billing, namespace: shop}
spec:
  hosts: [billing.internal]
  addresses: [240.0.0.7]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 7000, name: http, protocol: HTTP, targetPort: 7070}]
  workloadSelector: {labels: {app: billing}}
---
apiVersion: v1
kind: Pod
metadata: {name: billing-0, namespace: shop, labels: {app: billing}}
spec: {serviceAccountName: billing}
status: {podIP: 10.8.0.1}
---
apiVersion: v1
kind: Pod
metadata: {name: billing-1, namespace: shop, labels: {app: billing}}
spec: {serviceAccountName: billing}
---
apiVersion: v1
kind: Pod
metadata: {name: billing-0, namespace: other, labels: {app: billing}}
status: {podIP: 10.8.0.9}
"#;

const CLUSTER: &str = "outbound|7000||billing.internal";

fn addresses(cfg: &ProxyConfig, cluster: &str) -> Vec<String> {
    let cla = cfg.endpoints.iter().find(|e| e.cluster_name == cluster);
    let cla = cla.unwrap_or_else(|| panic!("no load assignment {cluster}"));
    (cla.endpoints.iter().flat_map(|g| &g.lb_endpoints))
        .map(|e| match &e.host_identifier {
            Some(HostIdentifier::Endpoint(ep)) => match &ep.address.as_ref().unwrap().address {
                Some(envoy_api::pb::envoy::config::core::v3::address::Address::SocketAddress(
                    s,
                )) => format!("{}:{:?}", s.address, s.port_specifier),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        })
        .collect()
}

#[test]
fn the_pods_a_service_entry_selects_are_its_endpoints() {
    let cfg = proxy_config(&context(ENTRY), &sidecar("shop", json!({})));
    assert_eq!(
        addresses(&cfg, CLUSTER),
        ["10.8.0.1:Some(PortValue(7070))"],
        "its namespace's Pods with an IP, at the target port"
    );
}

#[test]
fn a_selected_pods_sidecar_serves_the_entrys_port_inbound() {
    let meta = json!({"NAMESPACE": "shop", "LABELS": {"app": "billing"}});
    let pod = |ip: &str| {
        Proxy::from_node(
            &format!("sidecar~{ip}~billing-0.shop~shop.svc.cluster.local"),
            meta.as_object().unwrap(),
        )
        .unwrap()
    };
    let cfg = proxy_config(&context(ENTRY), &pod("10.8.0.1"));
    assert!(
        cfg.clusters.iter().any(|c| c.name == "inbound|7070||"),
        "{:?}",
        cfg.clusters.iter().map(|c| &c.name).collect::<Vec<_>>()
    );
    let inbound = cfg
        .listeners
        .iter()
        .find(|l| l.name == "virtualInbound")
        .unwrap();
    let ports: Vec<u32> = (inbound.filter_chains.iter())
        .filter_map(|c| {
            c.filter_chain_match
                .as_ref()?
                .destination_port
                .map(|p| p.value)
        })
        .collect();
    assert!(ports.contains(&7070), "{ports:?}");
    // Another address with the same labels is not the entry's endpoint.
    let other = proxy_config(&context(ENTRY), &pod("10.8.0.2"));
    assert!(!other.clusters.iter().any(|c| c.name == "inbound|7070||"));
}
