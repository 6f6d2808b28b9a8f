//! YAML text to [`ConfigObject`]s, with every problem reported as a [`ConfigIssue`] that
//! names the file, the document, the object and the field.
//!
//! Documents are split on `---` lines and parsed one by one, so a syntax error in one
//! document does not hide the others. Unknown fields are warnings (forward compatibility);
//! a value of the wrong type is an error naming its path.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{
    AllocatedAddress, ConfigIssue, ConfigObject, EndpointSliceDef, Kind, Level, Meta, ObjectKey,
    PodDef, SecretDef, ServiceDef, ServicePortDef, SliceEndpoint, Spec, validate,
};

/// The outcome of parsing one file.
#[derive(Debug, Default)]
pub struct Parsed {
    pub objects: Vec<ConfigObject>,
    pub issues: Vec<ConfigIssue>,
    /// Keys of documents that named an object but were rejected; the previous version of
    /// such an object stays in force.
    pub rejected: Vec<ObjectKey>,
    /// The file could not be split into documents at all (or a document had a syntax
    /// error): the caller keeps everything it previously accepted from it.
    pub syntax_error: bool,
}

impl Parsed {
    pub fn errors(&self) -> impl Iterator<Item = &ConfigIssue> {
        self.issues.iter().filter(|i| i.level == Level::Error)
    }
}

/// Splits a YAML stream into documents at `---` separator lines.
fn split_documents(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        let is_separator =
            line.starts_with("---") && line[3..].chars().next().is_none_or(|c| c.is_whitespace());
        if is_separator {
            docs.push(String::new());
            let rest = line[3..].trim();
            if !rest.is_empty() && !rest.starts_with('#') {
                docs.last_mut().unwrap().push_str(rest);
                docs.last_mut().unwrap().push('\n');
            }
        } else if line.trim_end() == "..." {
            continue;
        } else {
            let doc = docs.last_mut().unwrap();
            doc.push_str(line);
            doc.push('\n');
        }
    }
    docs
}

/// Parses every document of one file.
pub fn parse_file(file: &str, text: &str) -> Parsed {
    let mut out = Parsed::default();
    for (index, doc) in split_documents(text).iter().enumerate() {
        let only_comments = doc
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'));
        if only_comments {
            continue;
        }
        let value: Value = match serde_saphyr::from_str(doc) {
            Ok(v) => v,
            Err(e) => {
                out.syntax_error = true;
                out.issues
                    .push(issue(file, index, None, "", format!("invalid YAML: {e}")));
                continue;
            }
        };
        if value.is_null() {
            continue;
        }
        parse_document(file, index, value, &mut out);
    }
    out
}

/// Parses one object given as JSON (the Kubernetes source), reported under `source`.
pub fn parse_value(source: &str, value: Value) -> Parsed {
    let mut out = Parsed::default();
    parse_document(source, 0, value, &mut out);
    out
}

fn issue(
    file: &str,
    document: usize,
    key: Option<&ObjectKey>,
    field: &str,
    message: String,
) -> ConfigIssue {
    ConfigIssue {
        level: Level::Error,
        file: file.to_string(),
        document,
        kind: key.map(|k| k.kind.to_string()),
        namespace: key.map(|k| k.namespace.clone()),
        name: key.map(|k| k.name.clone()),
        field: field.to_string(),
        message,
    }
}

fn warning(
    file: &str,
    document: usize,
    key: Option<&ObjectKey>,
    field: &str,
    message: String,
) -> ConfigIssue {
    ConfigIssue {
        level: Level::Warning,
        ..issue(file, document, key, field, message)
    }
}

fn parse_document(file: &str, index: usize, value: Value, out: &mut Parsed) {
    let Value::Object(map) = &value else {
        out.issues.push(issue(
            file,
            index,
            None,
            "",
            "a document must be a mapping".into(),
        ));
        return;
    };
    let text = |k: &str| {
        map.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (api_version, kind_name) = (text("apiVersion"), text("kind"));
    if api_version.is_empty() || kind_name.is_empty() {
        out.issues.push(issue(
            file,
            index,
            None,
            "",
            "missing apiVersion or kind".into(),
        ));
        return;
    }
    if kind_name == "List" {
        if let Some(Value::Array(items)) = map.get("items") {
            for item in items.clone() {
                parse_document(file, index, item, out);
            }
        }
        return;
    }
    let Some((kind, version_ok)) = Kind::from_api(&api_version, &kind_name) else {
        out.issues.push(warning(
            file,
            index,
            None,
            "",
            format!("ignored: meshd does not read {kind_name} ({api_version})"),
        ));
        return;
    };
    let meta_value = map.get("metadata").cloned().unwrap_or(Value::Null);
    let meta: ObjectMeta = match serde_json::from_value(meta_value) {
        Ok(m) => m,
        Err(e) => {
            out.issues
                .push(issue(file, index, None, "metadata", e.to_string()));
            return;
        }
    };
    let Some(name) = meta.name.clone().filter(|n| !n.is_empty()) else {
        out.issues.push(issue(
            file,
            index,
            None,
            "metadata.name",
            "is required".into(),
        ));
        return;
    };
    let namespace = if kind.namespaced() {
        meta.namespace.clone().unwrap_or_else(|| "default".into())
    } else {
        String::new()
    };
    let key = ObjectKey {
        kind,
        namespace,
        name,
    };
    // Only Istio's mesh ConfigMap: `istio` or `istio-REV` with a `mesh` or `meshNetworks`
    // key (not, say, the `istio-ca-root-cert` ConfigMap Istio publishes in every namespace).
    let data = map.get("data");
    let mesh_configmap = (key.name == "istio" || key.name.starts_with("istio-"))
        && ["mesh", "meshNetworks"]
            .iter()
            .any(|k| data.and_then(|d| d.get(*k)).is_some());
    if kind == Kind::ConfigMap && !mesh_configmap {
        let message =
            "ignored: meshd reads only the istio mesh ConfigMap (data.mesh, data.meshNetworks)"
                .to_string();
        out.issues
            .push(warning(file, index, Some(&key), "", message));
        return;
    }
    if !version_ok {
        out.issues.push(issue(
            file,
            index,
            Some(&key),
            "apiVersion",
            format!(
                "{api_version} is not served for {kind}; use one of {:?}",
                kind.versions()
            ),
        ));
        out.rejected.push(key);
        return;
    }
    let mut unknown = Vec::new();
    let spec = match decode_spec(kind, value, &mut unknown) {
        Ok(spec) => spec,
        Err((field, message)) => {
            out.issues
                .push(issue(file, index, Some(&key), &field, message));
            out.rejected.push(key);
            return;
        }
    };
    for field in unknown {
        out.issues.push(warning(
            file,
            index,
            Some(&key),
            &field,
            "unknown field, ignored".into(),
        ));
    }
    let mut annotations = meta.annotations.unwrap_or_default();
    // Large and never read: kubectl's copy of the whole object.
    annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    let meta = Meta {
        name: key.name.clone(),
        namespace: key.namespace.clone(),
        labels: meta.labels.unwrap_or_default(),
        annotations,
        generation: meta.generation,
        creation_timestamp: meta.creation_timestamp.map(|t| t.0.to_string()),
    };
    let object = ConfigObject { key, meta, spec };
    let problems = validate::validate(&object);
    let mut failed = false;
    for p in problems {
        failed |= p.level == Level::Error;
        out.issues.push(ConfigIssue {
            level: p.level,
            ..issue(file, index, Some(&object.key), &p.field, p.message)
        });
    }
    if failed {
        out.rejected.push(object.key);
    } else {
        out.objects.push(object);
    }
}

/// Deserialises `value` as `T`, collecting unknown fields; an error carries its field path.
fn typed<T: DeserializeOwned>(
    value: Value,
    prefix: &str,
    unknown: &mut Vec<String>,
) -> Result<T, (String, String)> {
    let join = |path: String| match (prefix.is_empty(), path.is_empty() || path == ".") {
        (_, true) => prefix.to_string(),
        (true, false) => path,
        (false, false) => format!("{prefix}.{path}"),
    };
    let mut on_unknown = |path: serde_ignored::Path<'_>| unknown.push(join(path.to_string()));
    let de = serde_ignored::Deserializer::new(value, &mut on_unknown);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        (join(path), e.into_inner().to_string())
    })
}

fn spec_of(value: &Value) -> Value {
    value
        .get("spec")
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()))
}

/// A ServiceEntry's `status.addresses`, as istiod reads them: an entry whose value is no
/// IP address is skipped (status is written by controllers, not users, and is never an
/// error).
fn allocated_addresses(value: &Value) -> Vec<AllocatedAddress> {
    let entries = value.pointer("/status/addresses").and_then(Value::as_array);
    (entries.into_iter().flatten())
        .filter_map(|a| {
            Some(AllocatedAddress {
                host: a.get("host")?.as_str()?.to_string(),
                ip: a.get("value")?.as_str()?.parse().ok()?,
            })
        })
        .collect()
}

fn decode_spec(
    kind: Kind,
    value: Value,
    unknown: &mut Vec<String>,
) -> Result<Spec, (String, String)> {
    let spec = spec_of(&value);
    Ok(match kind {
        Kind::VirtualService => Spec::VirtualService(typed(spec, "spec", unknown)?),
        Kind::DestinationRule => Spec::DestinationRule(typed(spec, "spec", unknown)?),
        Kind::Gateway => Spec::Gateway(typed(spec, "spec", unknown)?),
        Kind::ServiceEntry => {
            Spec::ServiceEntry(typed(spec, "spec", unknown)?, allocated_addresses(&value))
        }
        Kind::Sidecar => Spec::Sidecar(typed(spec, "spec", unknown)?),
        Kind::WorkloadEntry => Spec::WorkloadEntry(typed(spec, "spec", unknown)?),
        Kind::PeerAuthentication => Spec::PeerAuthentication(typed(spec, "spec", unknown)?),
        Kind::RequestAuthentication => Spec::RequestAuthentication(typed(spec, "spec", unknown)?),
        Kind::AuthorizationPolicy => Spec::AuthorizationPolicy(typed(spec, "spec", unknown)?),
        Kind::Telemetry => Spec::Telemetry(typed(spec, "spec", unknown)?),
        Kind::Service => {
            let s: core::Service = typed(value, "", unknown)?;
            Spec::Service(service_def(s))
        }
        Kind::EndpointSlice => {
            let s: discovery::EndpointSlice = typed(value, "", unknown)?;
            Spec::EndpointSlice(endpoint_slice_def(s)?)
        }
        Kind::Endpoints => {
            let e: core::Endpoints = typed(value, "", unknown)?;
            Spec::Endpoints(endpoints_def(e))
        }
        Kind::Secret => {
            let s: core::Secret = typed(value, "", unknown)?;
            Spec::Secret(secret_def(s)?)
        }
        Kind::Pod => {
            let p: core::Pod = typed(value, "", unknown)?;
            Spec::Pod(pod_def(p))
        }
        Kind::Namespace => {
            let _: core::Namespace = typed(value, "", unknown)?;
            Spec::Namespace
        }
        Kind::Node => {
            let _: core::Node = typed(value, "", unknown)?;
            Spec::Node
        }
        Kind::ConfigMap => {
            let cm: core::ConfigMap = typed(value, "", unknown)?;
            let mut data = cm.data.unwrap_or_default();
            let mesh = data.remove("mesh").unwrap_or_default();
            let mut mesh = crate::mesh::MeshConfig::parse(&mesh)
                .map_err(|e| ("data.mesh".to_string(), e.to_string()))?;
            let networks = data.remove("meshNetworks").unwrap_or_default();
            mesh.mesh_networks = crate::network::MeshNetworks::parse(&networks)
                .map_err(|e| ("data.meshNetworks".to_string(), e.to_string()))?;
            Spec::MeshConfig(mesh)
        }
    })
}

fn service_def(s: core::Service) -> ServiceDef {
    let spec = s.spec.unwrap_or_default();
    let cluster_ip = spec.cluster_ip.filter(|ip| !ip.is_empty());
    let ingress = (s.status.and_then(|s| s.load_balancer))
        .and_then(|lb| lb.ingress)
        .unwrap_or_default();
    let mut external_addresses: Vec<String> =
        (ingress.iter()).filter_map(|i| i.ip.clone()).collect();
    external_addresses.extend(spec.external_ips.unwrap_or_default());
    external_addresses.dedup();
    let external_hostnames = (ingress.into_iter())
        .filter(|i| i.ip.is_none())
        .filter_map(|i| i.hostname)
        .collect();
    // istiod's `ConvertService`: an ExternalName Service is an alias of its external name.
    let external_name = (spec.type_.as_deref() == Some("ExternalName"))
        .then_some(spec.external_name)
        .flatten()
        .filter(|n| !n.is_empty())
        .map(|n| n.trim_end_matches('.').to_ascii_lowercase());
    ServiceDef {
        external_addresses,
        external_hostnames,
        external_name,
        headless: cluster_ip.as_deref() == Some("None"),
        cluster_ip: cluster_ip.filter(|ip| ip != "None"),
        traffic_distribution: spec.traffic_distribution,
        selector: spec.selector.unwrap_or_default(),
        ports: spec
            .ports
            .unwrap_or_default()
            .into_iter()
            .map(|p| {
                let (target_port, target_port_name) = match p.target_port {
                    Some(IntOrString::Int(n)) => (Some(n as u32), None),
                    Some(IntOrString::String(name)) => match name.parse::<u32>() {
                        Ok(n) => (Some(n), None),
                        Err(_) => (None, Some(name)),
                    },
                    None => (Some(p.port as u32), None),
                };
                ServicePortDef {
                    name: p.name.unwrap_or_default(),
                    port: p.port as u32,
                    target_port,
                    target_port_name,
                    protocol: p.protocol.unwrap_or_else(|| "TCP".into()),
                    app_protocol: p.app_protocol,
                }
            })
            .collect(),
    }
}

fn endpoint_slice_def(s: discovery::EndpointSlice) -> Result<EndpointSliceDef, (String, String)> {
    let labels: BTreeMap<String, String> = s.metadata.labels.unwrap_or_default();
    let service_name = labels
        .get("kubernetes.io/service-name")
        .cloned()
        .ok_or_else(|| {
            (
                "metadata.labels".to_string(),
                "an EndpointSlice needs the kubernetes.io/service-name label".to_string(),
            )
        })?;
    Ok(EndpointSliceDef {
        service_name,
        ports: s
            .ports
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| Some((p.name.unwrap_or_default(), p.port? as u32)))
            .collect(),
        endpoints: s
            .endpoints
            .into_iter()
            .flatten()
            .map(|e| {
                let c = e.conditions.unwrap_or_default();
                SliceEndpoint {
                    addresses: e.addresses,
                    ready: c.ready,
                    serving: c.serving,
                    terminating: c.terminating,
                    zone: e.zone,
                    node_name: e.node_name,
                    hostname: e.hostname,
                    pod: e
                        .target_ref
                        .filter(|r| r.kind.as_deref() == Some("Pod"))
                        .and_then(|r| r.name),
                }
            })
            .collect(),
    })
}

/// Core v1 Endpoints as slices, one per subset: `addresses` are ready, `notReadyAddresses`
/// are not (the same conditions an EndpointSlice would carry).
fn endpoints_def(e: core::Endpoints) -> Vec<EndpointSliceDef> {
    let service_name = e.metadata.name.unwrap_or_default();
    let address = |a: core::EndpointAddress, ready: bool| SliceEndpoint {
        addresses: vec![a.ip],
        ready: Some(ready),
        serving: Some(ready),
        terminating: None,
        zone: None,
        node_name: a.node_name,
        hostname: a.hostname,
        pod: a
            .target_ref
            .filter(|r| r.kind.as_deref() == Some("Pod"))
            .and_then(|r| r.name),
    };
    e.subsets
        .into_iter()
        .flatten()
        .map(|subset| EndpointSliceDef {
            service_name: service_name.clone(),
            ports: subset
                .ports
                .into_iter()
                .flatten()
                .map(|p| (p.name.unwrap_or_default(), p.port as u32))
                .collect(),
            endpoints: subset
                .addresses
                .into_iter()
                .flatten()
                .map(|a| address(a, true))
                .chain(
                    subset
                        .not_ready_addresses
                        .into_iter()
                        .flatten()
                        .map(|a| address(a, false)),
                )
                .collect(),
        })
        .collect()
}

/// The TLS material of a Secret, under Kubernetes' names (`tls.crt`, `tls.key`, `ca.crt`)
/// or Istio's generic ones (`cert`, `key`, `cacert`); `stringData` counts as in a manifest.
fn secret_def(s: core::Secret) -> Result<SecretDef, (String, String)> {
    let mut data: BTreeMap<String, Vec<u8>> = s
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    for (k, v) in s.string_data.unwrap_or_default() {
        data.insert(k, v.into_bytes());
    }
    let mut take = |names: [&str; 2]| -> Result<Option<String>, (String, String)> {
        for name in names {
            if let Some(bytes) = data.remove(name) {
                return String::from_utf8(bytes)
                    .map(Some)
                    .map_err(|_| (format!("data.{name}"), "is not PEM text".to_string()));
            }
        }
        Ok(None)
    };
    Ok(SecretDef {
        cert: take(["tls.crt", "cert"])?,
        key: take(["tls.key", "key"])?,
        ca: take(["ca.crt", "cacert"])?,
    })
}

fn pod_def(p: core::Pod) -> PodDef {
    let workload = super::workload::PodWorkload::of(&p.metadata).name;
    let spec = p.spec.unwrap_or_default();
    let status = p.status.unwrap_or_default();
    PodDef {
        ip: status.pod_ip,
        service_account: spec.service_account_name,
        node_name: spec.node_name,
        workload,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VS: &str = r#"
apiVersion: networking.istio.io/v1alpha3
kind: VirtualService
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews]
  http:
  - match:
    - uri: {prefix: /v2}
    route:
    - destination: {host: reviews, subset: v2}
"#;

    #[test]
    fn an_istio_manifest_in_any_served_version_loads() {
        for version in ["v1", "v1beta1", "v1alpha3"] {
            let text = VS.replace("v1alpha3", version);
            let parsed = parse_file("vs.yaml", &text);
            assert!(parsed.issues.is_empty(), "{:?}", parsed.issues);
            let obj = &parsed.objects[0];
            assert_eq!(obj.key.to_string(), "VirtualService shop/reviews");
            let Spec::VirtualService(spec) = &obj.spec else {
                panic!()
            };
            assert_eq!(
                spec.http[0].route[0].destination.subset.as_deref(),
                Some("v2")
            );
        }
    }

    #[test]
    fn an_unknown_field_is_a_warning_and_the_object_still_loads() {
        let text = VS.replace("hosts: [reviews]", "hosts: [reviews]\n  futureField: 3");
        let parsed = parse_file("vs.yaml", &text);
        assert_eq!(parsed.objects.len(), 1);
        let w = &parsed.issues[0];
        assert_eq!(w.level, Level::Warning);
        assert_eq!(w.field, "spec.futureField");
    }

    #[test]
    fn a_wrong_type_is_an_error_naming_the_field_path() {
        let text = VS.replace("subset: v2", "subset: v2, port: {number: eighty}");
        let parsed = parse_file("vs.yaml", &text);
        assert!(parsed.objects.is_empty());
        let e = parsed.errors().next().unwrap();
        assert_eq!(e.field, "spec.http[0].route[0].destination.port.number");
        assert_eq!(parsed.rejected[0].name, "reviews");
        let shown = e.to_string();
        assert!(
            shown.contains("vs.yaml (document 0): VirtualService shop/reviews"),
            "{shown}"
        );
    }

    #[test]
    fn one_broken_document_does_not_hide_the_next() {
        let text = format!("kind: [unclosed\n---\n{VS}");
        let parsed = parse_file("multi.yaml", &text);
        assert!(parsed.syntax_error);
        assert_eq!(parsed.objects.len(), 1);
        assert_eq!(parsed.issues[0].document, 0);
    }

    #[test]
    fn only_the_mesh_configmap_is_read() {
        let cm = |name: &str, key: &str| {
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: istio-system}}\ndata: {{{key}: \"accessLogFile: /dev/stdout\"}}\n"
            )
        };
        let mesh = parse_file("cm.yaml", &cm("istio", "mesh"));
        assert_eq!(mesh.objects.len(), 1, "{:?}", mesh.issues);
        for (name, key) in [("istio-ca-root-cert", "root-cert.pem"), ("other", "mesh")] {
            let ignored = parse_file("cm.yaml", &cm(name, key));
            assert!(
                ignored.objects.is_empty() && ignored.rejected.is_empty(),
                "{name}"
            );
            assert_eq!(ignored.issues[0].level, Level::Warning);
        }
    }

    #[test]
    fn an_unserved_api_version_is_rejected() {
        let parsed = parse_file("vs.yaml", &VS.replace("v1alpha3", "v2"));
        assert_eq!(parsed.errors().next().unwrap().field, "apiVersion");
    }

    #[test]
    fn kubernetes_service_and_endpoint_slice_are_cut_down_at_the_edge() {
        let text = r#"
apiVersion: v1
kind: Service
metadata: {name: details, namespace: shop}
spec:
  clusterIP: 10.96.0.7
  selector: {app: details}
  ports: [{name: http, port: 9080, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: details-abc
  namespace: shop
  labels: {kubernetes.io/service-name: details}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.1.0.5]
  conditions: {ready: true}
  zone: us-east-1a
"#;
        let parsed = parse_file("svc.yaml", text);
        assert!(parsed.issues.is_empty(), "{:?}", parsed.issues);
        let Spec::Service(svc) = &parsed.objects[0].spec else {
            panic!()
        };
        assert_eq!(svc.ports[0].target_port, Some(8080));
        let Spec::EndpointSlice(slice) = &parsed.objects[1].spec else {
            panic!()
        };
        assert_eq!(slice.service_name, "details");
        assert_eq!(slice.endpoints[0].zone.as_deref(), Some("us-east-1a"));
    }

    #[test]
    fn core_endpoints_become_one_slice_per_subset_with_readiness() {
        let yaml = "apiVersion: v1\nkind: Endpoints\nmetadata: {name: details, namespace: shop}\nsubsets:\n- addresses: [{ip: 10.0.0.1, nodeName: n1, targetRef: {kind: Pod, name: details-1}}]\n  notReadyAddresses: [{ip: 10.0.0.2}]\n  ports: [{name: http, port: 9080}]\n- addresses: [{ip: 10.0.0.3}]\n  ports: [{name: grpc, port: 9090}]\n";
        let parsed = parse_file("ep.yaml", yaml);
        assert!(parsed.issues.is_empty(), "{:?}", parsed.issues);
        let Spec::Endpoints(subsets) = &parsed.objects[0].spec else {
            panic!()
        };
        assert_eq!(subsets.len(), 2);
        assert_eq!(subsets[0].service_name, "details");
        assert_eq!(subsets[0].ports, vec![("http".to_string(), 9080)]);
        let ready: Vec<_> = subsets[0]
            .endpoints
            .iter()
            .map(|e| (e.addresses[0].as_str(), e.ready))
            .collect();
        assert_eq!(
            ready,
            vec![("10.0.0.1", Some(true)), ("10.0.0.2", Some(false))]
        );
        assert_eq!(subsets[0].endpoints[0].pod.as_deref(), Some("details-1"));
        assert_eq!(subsets[1].ports, vec![("grpc".to_string(), 9090)]);
    }

    #[test]
    fn a_tls_secret_is_read_under_either_naming_and_its_key_is_never_printed() {
        // data is base64 as the API returns it; stringData as a manifest may carry it.
        let yaml = "apiVersion: v1\nkind: Secret\nmetadata: {name: gw-cert, namespace: istio-system}\ntype: kubernetes.io/tls\ndata: {tls.crt: Q0VSVA==, tls.key: S0VZ}\nstringData: {ca.crt: ROOT}\n";
        let parsed = parse_file("s.yaml", yaml);
        assert!(parsed.issues.is_empty(), "{:?}", parsed.issues);
        let Spec::Secret(s) = &parsed.objects[0].spec else {
            panic!()
        };
        assert_eq!(s.cert.as_deref(), Some("CERT"));
        assert_eq!(s.key.as_deref(), Some("KEY"));
        assert_eq!(s.ca.as_deref(), Some("ROOT"));
        let shown = format!(
            "{} {:?}",
            serde_json::to_string(&parsed.objects[0]).unwrap(),
            parsed.objects[0]
        );
        assert!(shown.contains("CERT") && !shown.contains("KEY"), "{shown}");

        let generic = "apiVersion: v1\nkind: Secret\nmetadata: {name: gw, namespace: istio-system}\nstringData: {cert: C, key: K, cacert: A}\n";
        let Spec::Secret(s) = &parse_file("s.yaml", generic).objects[0].spec else {
            panic!()
        };
        assert_eq!(
            (s.cert.as_deref(), s.key.as_deref(), s.ca.as_deref()),
            (Some("C"), Some("K"), Some("A"))
        );
    }
}
