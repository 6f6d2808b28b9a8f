//! Endpoint metadata as istiod sets it. Every endpoint carries istiod's telemetry metadata,
//! `istio.workload: WORKLOAD;NAMESPACE;CANONICAL_NAME;CANONICAL_REVISION;CLUSTER`, which
//! Istio's stats filter labels requests with when the destination exchanged no metadata:
//! a Pod's workload by its controller, a WorkloadEntry's name, a ServiceEntry's inline
//! endpoint `ENTRY-INDEX`. A WorkloadEntry with a service account and no
//! `security.istio.io/tlsMode` label speaks mTLS.

use envoy_api::pb::envoy::config::core::v3::HealthStatus;
use envoy_api::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_api::pb::google::protobuf::value::Kind;
use serde_json::json;

use super::{context, sidecar};
use crate::proxy_config;

const OBJECTS: &str = r#"
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {clusterIP: 10.96.8.1, selector: {app: web}, ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Pod
metadata:
  name: web-v2-7d9f8c6b5-x2k4q
  generateName: web-v2-7d9f8c6b5-
  namespace: shop
  labels: {app: web, version: v2, pod-template-hash: 7d9f8c6b5}
  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: web-v2-7d9f8c6b5, uid: u1, controller: true}]
status: {podIP: 10.1.8.1}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.1.8.1], conditions: {ready: true}, targetRef: {kind: Pod, name: web-v2-7d9f8c6b5-x2k4q}}
- {addresses: [10.1.8.2], conditions: {ready: true}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: vms, namespace: shop}
spec:
  hosts: [vms.internal]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints: [{address: 10.2.0.1, labels: {app.kubernetes.io/name: legacy, version: latest}}]
  workloadSelector: {labels: {app: vm}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: vm-1, namespace: shop, annotations: {istio.io/autoRegistrationGroup: vm-group}}
spec: {address: 10.2.0.2, labels: {app: vm}}
"#;

fn workloads(cla: &ClusterLoadAssignment) -> Vec<String> {
    (cla.endpoints.iter().flat_map(|g| &g.lb_endpoints))
        .map(|e| {
            let istio = &e.metadata.as_ref().unwrap().filter_metadata["istio"];
            match &istio.fields["workload"].kind {
                Some(Kind::StringValue(s)) => s.clone(),
                other => panic!("{other:?}"),
            }
        })
        .collect()
}

#[test]
fn endpoints_carry_istiods_telemetry_metadata() {
    let cfg = proxy_config(&context(OBJECTS), &sidecar("shop", json!({})));
    let cla = |name: &str| {
        (cfg.endpoints.iter())
            .find(|e| e.cluster_name == name)
            .unwrap_or_else(|| panic!("{name}"))
    };
    assert_eq!(
        workloads(cla("outbound|80||web.shop.svc.cluster.local")),
        [
            // The Deployment behind the ReplicaSet; its app and version labels.
            "web-v2;shop;web;v2;Kubernetes",
            // An address with no Pod: no workload, no labels.
            ";shop;;;Kubernetes",
        ]
    );
    assert_eq!(
        workloads(cla("outbound|80||vms.internal")),
        [
            // Inline: the entry's name and index; `latest` is left out, as istiod does.
            "vms-0;shop;legacy;;Kubernetes",
            // Selected: the auto-registration group names the workload.
            "vm-group;shop;vm;;Kubernetes",
        ]
    );
    // A ready Kubernetes endpoint is HEALTHY, a ServiceEntry's left unset, as istiod's.
    let health = |name: &str| -> Vec<i32> {
        (cla(name).endpoints.iter().flat_map(|g| &g.lb_endpoints))
            .map(|e| e.health_status)
            .collect()
    };
    assert_eq!(
        health("outbound|80||web.shop.svc.cluster.local"),
        [HealthStatus::Healthy as i32; 2]
    );
    assert_eq!(
        health("outbound|80||vms.internal"),
        [HealthStatus::Unknown as i32; 2]
    );
}

#[test]
fn a_workload_entry_with_a_service_account_speaks_mtls_unless_its_label_says_otherwise() {
    let entries = r#"
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: vms, namespace: shop}
spec:
  hosts: [vms.internal]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints:
  - {address: 10.2.0.1, serviceAccount: vm}
  - {address: 10.2.0.2, serviceAccount: vm, labels: {security.istio.io/tlsMode: disabled}}
  - {address: 10.2.0.3}
"#;
    let cfg = proxy_config(&context(entries), &sidecar("shop", json!({})));
    let cla = (cfg.endpoints.iter())
        .find(|e| e.cluster_name == "outbound|80||vms.internal")
        .unwrap();
    let mtls: Vec<bool> = (cla.endpoints.iter().flat_map(|g| &g.lb_endpoints))
        .map(crate::endpoint::is_mtls)
        .collect();
    assert_eq!(mtls, [true, false, false]);
}
