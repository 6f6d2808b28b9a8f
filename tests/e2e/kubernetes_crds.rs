//! The committed CRDs against the real API server's schema validation. They were installed
//! by `kubectl apply --server-side` when the API server started (a structural-schema
//! error fails every Kubernetes test there). Here: the shipped example applies as a client
//! would apply it, and meshd's file-mode verdict and the API server's agree, object by
//! object, wherever the CRD schema can decide.

use std::path::Path;
use std::process::Command;

use crate::cluster::Tenant;
use crate::test_host::test_host;

/// Whether `meshd validate` accepts `yaml` (its output on refusal).
fn meshd_accepts(dir: &Path, name: &str, yaml: &str) -> Result<(), String> {
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_meshd"))
        .args(["validate", "-f"])
        .arg(&file)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Whether the API server accepts `yaml` (a server-side dry run, so nothing is stored).
fn api_accepts(t: &Tenant, yaml: &str) -> Result<(), String> {
    t.cluster
        .kubectl(
            &["apply", "--server-side", "--dry-run=server", "-f", "-"],
            Some(&t.yaml(yaml)),
        )
        .map(drop)
}

#[test]
fn the_shipped_example_applies_to_the_api_server_as_meshd_reads_it() {
    let t = Tenant::new("crds-example", "");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/bookinfo");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap() != "namespace.yaml")
        .collect();
    files.sort();
    assert!(files.len() >= 4, "{files:?}");
    for file in files {
        let yaml = std::fs::read_to_string(&file)
            .unwrap()
            .replace("namespace: bookinfo", "namespace: shop");
        meshd_accepts(&t.dir, "example", &yaml)
            .unwrap_or_else(|e| panic!("meshd refuses {}: {e}", file.display()));
        // The example's endpoints are loopback ports, for meshd serving it from files on
        // one machine; a cluster refuses loopback endpoint addresses, and holds pod IPs.
        let yaml = yaml.replace("127.0.0.1", &test_host().ip);
        t.apply(&yaml)
            .unwrap_or_else(|e| panic!("the API server refuses {}: {e}", file.display()));
    }
}

/// One document per Istio kind meshd serves that both accept, and documents that both
/// refuse because the CRD schema says so (a wrong type, an unknown enum value). meshd's
/// semantic checks go further than a schema can (a regex that does not compile, a
/// dangling subset): those are the validation webhook's, tested with it.
#[test]
fn meshd_and_the_api_server_agree_on_what_the_schema_decides() {
    let t = Tenant::new("crds-agree", "");
    let obj = istio_object;
    let net = "networking.istio.io";
    let sec = "security.istio.io";
    let valid = one_of_each_istio_kind("x");
    for doc in &valid {
        meshd_accepts(&t.dir, "valid", doc).unwrap_or_else(|e| panic!("meshd: {e}\n{doc}"));
        api_accepts(&t, doc).unwrap_or_else(|e| panic!("API server: {e}\n{doc}"));
    }
    let refused_by_both = [
        obj("VirtualService", net, "hosts: a-string-not-a-list"),
        obj(
            "DestinationRule",
            net,
            "host: a\ntrafficPolicy: {loadBalancer: {simple: FASTEST}}",
        ),
        obj("PeerAuthentication", sec, "mtls: {mode: SOMETIMES}"),
        obj("AuthorizationPolicy", sec, "action: MAYBE"),
        obj(
            "ServiceEntry",
            net,
            "hosts: [a.example.com]\nports: [{number: not-a-number, name: http, protocol: HTTP}]",
        ),
    ];
    for doc in &refused_by_both {
        assert!(
            meshd_accepts(&t.dir, "invalid", doc).is_err(),
            "meshd accepts what the schema refuses:\n{doc}"
        );
        assert!(
            api_accepts(&t, doc).is_err(),
            "the API server accepts what meshd refuses:\n{doc}"
        );
    }
}

/// An Istio object named `x` in `shop`.
fn istio_object(kind: &str, group: &str, spec: &str) -> String {
    format!(
        "apiVersion: {group}/v1\nkind: {kind}\nmetadata: {{name: x, namespace: shop}}\nspec:\n{}",
        spec.lines().map(|l| format!("  {l}\n")).collect::<String>()
    )
}

/// One valid object of each Istio kind meshd serves, named `name`, in `shop`.
pub fn one_of_each_istio_kind(name: &str) -> Vec<String> {
    let obj = |kind: &str, group: &str, spec: &str| {
        istio_object(kind, group, spec).replace("{name: x,", &format!("{{name: {name},"))
    };
    let net = "networking.istio.io";
    let sec = "security.istio.io";
    vec![
        obj(
            "VirtualService",
            net,
            "hosts: [a]\nhttp:\n- match: [{uri: {prefix: /x}, headers: {u: {exact: v}}}]\n  route: [{destination: {host: a, subset: v1, port: {number: 80}}, weight: 100}]\n  retries: {attempts: 3, perTryTimeout: 2s}\n  timeout: 5s",
        ),
        obj(
            "DestinationRule",
            net,
            "host: a\ntrafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}, tls: {mode: ISTIO_MUTUAL}, outlierDetection: {consecutive5xxErrors: 5, interval: 10s}}\nsubsets: [{name: v1, labels: {version: v1}}]",
        ),
        obj(
            "Gateway",
            net,
            "selector: {istio: ingressgateway}\nservers: [{port: {number: 443, name: https, protocol: HTTPS}, hosts: [\"*\"], tls: {mode: SIMPLE, credentialName: c}}]",
        ),
        obj(
            "ServiceEntry",
            net,
            "hosts: [api.example.com]\nports: [{number: 443, name: tls, protocol: TLS}]\nresolution: DNS\nlocation: MESH_EXTERNAL",
        ),
        obj(
            "Sidecar",
            net,
            "egress: [{hosts: [\"./*\", \"istio-system/*\"]}]\noutboundTrafficPolicy: {mode: REGISTRY_ONLY}",
        ),
        obj(
            "WorkloadEntry",
            net,
            "address: 10.1.2.3\nlabels: {app: a}\nports: {http: 8080}",
        ),
        obj(
            "PeerAuthentication",
            sec,
            "mtls: {mode: STRICT}\nportLevelMtls: {\"8080\": {mode: PERMISSIVE}}",
        ),
        obj(
            "RequestAuthentication",
            sec,
            "jwtRules: [{issuer: https://issuer.example, jwks: '{\"keys\": [{\"kty\": \"EC\", \"crv\": \"P-256\", \"x\": \"MKBCTNIcKUSDii11ySs3526iDZ8AiTo7Tu6KPAqv7D4\", \"y\": \"4Etl6SRW2YiLUrN5vfvVHuhp7x8PxltmWWlbbM4IFyM\"}]}'}]",
        ),
        obj(
            "AuthorizationPolicy",
            sec,
            "action: ALLOW\nrules: [{from: [{source: {principals: [cluster.local/ns/a/sa/b]}}], to: [{operation: {methods: [GET], paths: [/x]}}]}]",
        ),
        obj(
            "Telemetry",
            "telemetry.istio.io",
            "accessLogging: [{providers: [{name: envoy}]}]",
        ),
    ]
}
