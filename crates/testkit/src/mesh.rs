//! Generated meshes for benchmarks, scale tests and the fleet simulator: S services over K
//! namespaces, E endpoints each, a VirtualService and DestinationRule on a share of the
//! services, and optionally a Sidecar per namespace that scopes its proxies to it. The
//! mesh is Kubernetes and Istio YAML, as a user would write it.

use std::fmt::Write;

/// The shape of a generated mesh.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    pub services: usize,
    pub namespaces: usize,
    pub endpoints: usize,
    /// Every `routed_every`-th service gets a VirtualService (header match + 90/10 split)
    /// and a DestinationRule with two subsets; 0 for none.
    pub routed_every: usize,
    /// A `Sidecar` per namespace with egress `./*`: proxies see their namespace only.
    pub sidecar_scoped: bool,
    /// The routed services' VirtualServices are bound to the ingress Gateway too
    /// ([`Shape::namespaces_yaml`]), with the host `svc-i.example.com`, so that a change
    /// to one reaches the gateways as well.
    pub gateway_routed: bool,
}

impl Shape {
    /// The benchmarks' shape: a VirtualService and DestinationRule on every tenth service.
    pub fn new(services: usize, namespaces: usize, endpoints: usize) -> Shape {
        Shape {
            services,
            namespaces: namespaces.max(1),
            endpoints,
            routed_every: 10,
            sidecar_scoped: false,
            gateway_routed: false,
        }
    }

    pub fn namespace_of(&self, service: usize) -> String {
        format!("ns-{}", service % self.namespaces)
    }

    /// One service's objects: Service, EndpointSlice and, if routed, VirtualService and
    /// DestinationRule. `extra_endpoint` adds one more endpoint address (load tests use
    /// it to make an endpoint-only change).
    pub fn service_yaml(&self, i: usize, extra_endpoint: Option<&str>) -> String {
        self.changed_service_yaml(i, extra_endpoint, "jason")
    }

    /// As [`Shape::service_yaml`], with `user` as the header value of its routing.
    pub fn changed_service_yaml(
        &self,
        i: usize,
        extra_endpoint: Option<&str>,
        user: &str,
    ) -> String {
        let ns = self.namespace_of(i);
        let name = format!("svc-{i}");
        let mut yaml = String::new();
        let _ = write!(
            yaml,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  clusterIP: 10.{}.{}.{}\n  ports: [{{name: http, port: 8080}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: {ns}, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints:\n",
            100 + i / 65536,
            i / 256 % 256,
            i % 256
        );
        for e in 0..self.endpoints {
            let _ = writeln!(
                yaml,
                "- {{addresses: [10.{}.{}.{}], conditions: {{ready: true}}, zone: z{}}}",
                i / 256 % 256,
                i % 256,
                e % 250 + 1,
                e % 3
            );
        }
        if let Some(address) = extra_endpoint {
            let _ = writeln!(
                yaml,
                "- {{addresses: [{address}], conditions: {{ready: true}}, zone: z0}}"
            );
        }
        if self.routed_every > 0 && i.is_multiple_of(self.routed_every) {
            yaml.push_str(&self.routing_yaml(i, user));
        }
        yaml
    }

    /// The VirtualService and DestinationRule of service `i`; `user` is the header value
    /// that selects subset v2 (load tests change it to make a routing-only change).
    pub fn routing_yaml(&self, i: usize, user: &str) -> String {
        let ns = self.namespace_of(i);
        let name = format!("svc-{i}");
        let bound = if self.gateway_routed {
            format!("hosts: [{name}, {name}.example.com]\n  gateways: [mesh, istio-system/ingress]")
        } else {
            format!("hosts: [{name}]")
        };
        format!(
            "---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  host: {name}\n  subsets: [{{name: v1, labels: {{version: v1}}}}, {{name: v2, labels: {{version: v2}}}}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  {bound}\n  http:\n  - match: [{{headers: {{end-user: {{exact: {user}}}}}}}]\n    route: [{{destination: {{host: {name}, subset: v2}}}}]\n  - route:\n    - {{destination: {{host: {name}, subset: v1}}, weight: 90}}\n    - {{destination: {{host: {name}, subset: v2}}, weight: 10}}\n"
        )
    }

    /// A VirtualService binding host `svc-i.example.com` on the ingress Gateway
    /// ([`Shape::namespaces_yaml`]) to service `i`: one virtual host of the gateway's
    /// `http.80` each.
    pub fn gateway_routing_yaml(&self, i: usize) -> String {
        let ns = self.namespace_of(i);
        format!(
            "---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: gw-svc-{i}, namespace: {ns}}}\nspec:\n  hosts: [svc-{i}.example.com]\n  gateways: [istio-system/ingress]\n  http:\n  - match: [{{uri: {{prefix: /api}}}}]\n    route: [{{destination: {{host: svc-{i}}}}}]\n  - route: [{{destination: {{host: svc-{i}, subset: v1}}}}]\n"
        )
    }

    /// The namespace-wide objects (Sidecars when scoped), and an ingress Gateway.
    pub fn namespaces_yaml(&self) -> String {
        let mut yaml = String::from(
            "---\napiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: ingress, namespace: istio-system}\nspec:\n  selector: {istio: ingressgateway}\n  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: [\"*\"]}]\n",
        );
        for n in 0..self.namespaces {
            if self.sidecar_scoped {
                let _ = write!(
                    yaml,
                    "---\napiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: default, namespace: ns-{n}}}\nspec:\n  egress: [{{hosts: [\"./*\"]}}]\n"
                );
            }
        }
        yaml
    }

    /// The mesh as files: one per service (so a change rewrites one small file), plus
    /// `namespaces.yaml`.
    pub fn files(&self) -> Vec<(String, String)> {
        let mut files: Vec<(String, String)> = (0..self.services)
            .map(|i| (format!("svc-{i}.yaml"), self.service_yaml(i, None)))
            .collect();
        files.push(("namespaces.yaml".into(), self.namespaces_yaml()));
        files
    }

    /// The whole mesh as one YAML document set: the namespace-wide objects, then every
    /// service's.
    pub fn yaml(&self) -> String {
        let mut yaml = self.namespaces_yaml();
        for i in 0..self.services {
            yaml.push_str(&self.service_yaml(i, None));
        }
        yaml
    }
}
