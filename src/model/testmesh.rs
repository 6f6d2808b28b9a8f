//! Generated meshes for benchmarks and scale tests: S services over K namespaces, E
//! endpoints each, a VirtualService and DestinationRule on every tenth service.

use std::fmt::Write;

use super::Store;
use crate::config::parse::parse_file;

/// A mesh of `services` services spread over `namespaces` namespaces.
pub fn generate(services: usize, namespaces: usize, endpoints: usize) -> Store {
    let mut yaml = String::new();
    for i in 0..services {
        let ns = format!("ns-{}", i % namespaces);
        let name = format!("svc-{i}");
        let _ = write!(
            yaml,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  clusterIP: 10.{}.{}.{}\n  ports: [{{name: http, port: 8080}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: {ns}, labels: {{kubernetes.io/service-name: {name}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints:\n",
            100 + i / 65536,
            i / 256 % 256,
            i % 256
        );
        for e in 0..endpoints {
            let _ = writeln!(
                yaml,
                "- {{addresses: [10.{}.{}.{}], conditions: {{ready: true}}, zone: z{}}}",
                i / 256 % 256,
                i % 256,
                e % 250 + 1,
                e % 3
            );
        }
        if i % 10 == 0 {
            let _ = write!(
                yaml,
                "---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  host: {name}\n  subsets: [{{name: v1, labels: {{version: v1}}}}, {{name: v2, labels: {{version: v2}}}}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  hosts: [{name}]\n  http:\n  - match: [{{headers: {{end-user: {{exact: jason}}}}}}]\n    route: [{{destination: {{host: {name}, subset: v2}}}}]\n  - route:\n    - {{destination: {{host: {name}, subset: v1}}, weight: 90}}\n    - {{destination: {{host: {name}, subset: v2}}, weight: 10}}\n"
            );
        }
    }
    let parsed = parse_file("generated.yaml", &yaml);
    assert!(
        parsed.errors().next().is_none(),
        "BUG: generated mesh is invalid: {:?}",
        parsed.issues.first()
    );
    let mut store = Store::default();
    for o in parsed.objects {
        store.apply(o);
    }
    store
}
