//! `meshd operator` on the real kube-apiserver, installed from the chart: the chart rendered
//! by the real `helm` and applied server-side, the operator run as a local process from the
//! chart's Deployment (args) with the chart's ServiceAccount's token, and a revision's meshd
//! run from the Deployment the operator wrote (the test bed has no kubelet, so the test
//! plays it, and plays the Deployment controller by writing the Deployment's status).
//!
//! One operator serves every test of the binary ([`Operator::shared`]); each test keeps to
//! mesh, revision and tag names of its own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

use crate::chart::{documents, helm_template};
use crate::cluster::{Cluster, Tenant, command, started_for_good};
use crate::harness::*;

const TIMEOUT: Duration = Duration::from_secs(30);
/// The namespace the chart is installed into.
const OPERATOR_NAMESPACE: &str = "meshd-operator-e2e";

pub struct Operator {
    _child: Child,
    monitoring_port: u16,
    log: PathBuf,
}

impl Operator {
    /// The chart installed once into the shared API server and its operator running.
    pub fn shared() -> &'static Operator {
        static SHARED: OnceLock<&'static Operator> = OnceLock::new();
        SHARED.get_or_init(|| started_for_good("the operator", Operator::install))
    }

    fn install() -> Operator {
        let cluster = Cluster::shared();
        let dir = temp_dir("operator");
        cluster
            .apply(&format!(
                "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {OPERATOR_NAMESPACE}}}\n"
            ))
            .unwrap();
        let rendered = helm_template("meshd", &["--namespace", OPERATOR_NAMESPACE]);
        cluster.apply(&rendered).unwrap();
        let deployment = (documents(&rendered).into_iter())
            .find(|d| d["kind"] == "Deployment")
            .expect("the chart's operator Deployment");
        let pod = &deployment["spec"]["template"]["spec"];
        let account = pod["serviceAccountName"].as_str().unwrap();
        let kubeconfig = cluster.service_account_kubeconfig(&dir, OPERATOR_NAMESPACE, account);
        let monitoring_port = free_port();
        // The chart's arguments, but for the address: the test binary's ports are shared.
        let args: Vec<String> = (pod["containers"][0]["args"].as_array().unwrap().iter())
            .map(|a| a.as_str().unwrap().to_string())
            .map(|a| match a.starts_with("--monitoring-address") {
                true => format!("--monitoring-address=127.0.0.1:{monitoring_port}"),
                false => a,
            })
            .collect();
        let log = dir.join("operator.log");
        let child = command(Path::new(env!("CARGO_BIN_EXE_meshd")))
            .args(&args)
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAME", "meshd-operator-e2e")
            .env("RUST_LOG", "info,meshd=debug")
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::options().append(true).open(&log).unwrap())
            .spawn()
            .unwrap();
        let op = Operator {
            _child: child,
            monitoring_port,
            log,
        };
        wait_until("the operator's /readyz", TIMEOUT, || {
            op.get("/readyz").is_ok()
        });
        op
    }

    fn get(&self, path: &str) -> std::io::Result<HttpResponse> {
        http_get(
            &format!("127.0.0.1:{}", self.monitoring_port),
            "localhost",
            path,
            &[],
        )
    }

    /// One metric sample (`name{labels}` as printed), or 0.
    fn metric(&self, sample: &str) -> f64 {
        metric_value(&self.get("/metrics").unwrap().body, sample)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A condition of `obj`: (status, reason, message), empty strings if absent.
fn condition(obj: &Value, type_: &str) -> (String, String, String) {
    let found = (obj["status"]["conditions"].as_array().into_iter().flatten())
        .find(|c| c["type"] == type_)
        .cloned()
        .unwrap_or_default();
    let s = |k: &str| found[k].as_str().unwrap_or_default().to_string();
    (s("status"), s("reason"), s("message"))
}

/// Waits until `kind/name` satisfies `test`, showing the object and the operator's log
/// if it never does.
fn wait_for(
    op: &Operator,
    what: &str,
    kind: &str,
    namespace: &str,
    name: &str,
    test: impl Fn(&Value) -> bool,
) -> Value {
    let cluster = Cluster::shared();
    let start = std::time::Instant::now();
    loop {
        let obj = cluster.object(kind, namespace, name);
        if test(&obj) {
            return obj;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "timed out waiting for {what}: {kind} {namespace}/{name} is {obj:#}\noperator log:\n{}",
            op.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every object of revision `rev` in `ns`, as (kind, namespace, name), as Istio's chart
/// names them.
fn children(rev: &str, ns: &str) -> Vec<(&'static str, String, String)> {
    let istiod = format!("istiod-{rev}");
    vec![
        ("ServiceAccount", ns.into(), istiod.clone()),
        (
            "ClusterRole",
            String::new(),
            format!("istiod-clusterrole-{rev}-{ns}"),
        ),
        (
            "ClusterRoleBinding",
            String::new(),
            format!("istiod-clusterrole-{rev}-{ns}"),
        ),
        ("Role", ns.into(), istiod.clone()),
        ("RoleBinding", ns.into(), istiod.clone()),
        ("ConfigMap", ns.into(), format!("istio-{rev}")),
        ("Deployment", ns.into(), istiod.clone()),
        ("Service", ns.into(), istiod),
        (
            "ValidatingWebhookConfiguration",
            String::new(),
            format!("istio-validator-{rev}-{ns}"),
        ),
        (
            "MutatingWebhookConfiguration",
            String::new(),
            format!("istio-sidecar-injector-{rev}-{ns}"),
        ),
    ]
}

/// Asserts that no object of revision `rev` in `ns` is left.
fn assert_all_gone(rev: &str, ns: &str) {
    let cluster = Cluster::shared();
    for (kind, namespace, name) in children(rev, ns) {
        assert!(
            cluster.object(kind, &namespace, &name).is_null(),
            "{kind} {name} is left"
        );
    }
}

fn resource_versions(rev: &str, ns: &str) -> BTreeMap<String, Value> {
    let cluster = Cluster::shared();
    (children(rev, ns).into_iter())
        .map(|(kind, ns, name)| {
            let obj = cluster.object(kind, &ns, &name);
            (
                format!("{kind} {name}"),
                obj["metadata"]["resourceVersion"].clone(),
            )
        })
        .collect()
}

/// The container's environment with the downward API resolved as the kubelet would for
/// pod `pod` in `namespace`.
fn pod_env(container: &Value, pod: &str, namespace: &str) -> Vec<(String, String)> {
    (container["env"].as_array().unwrap().iter())
        .map(|e| {
            let name = e["name"].as_str().unwrap().to_string();
            let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.name") => pod.to_string(),
                Some("metadata.namespace") => namespace.to_string(),
                Some(other) => panic!("the test plays no kubelet for {other}"),
                None => e["value"].as_str().unwrap().to_string(),
            };
            (name, value)
        })
        .collect()
}

/// A Mesh becomes a revision with every object Istio's chart installs, owned and labelled;
/// a second reconcile writes nothing; the revision's meshd runs from its Deployment with
/// its ServiceAccount; readiness and use reach the status; an edited or deleted child comes
/// back; deleting the mesh is held while a namespace uses the revision, and then removes
/// everything.
#[test]
fn a_mesh_is_installed_kept_and_removed_by_the_operator() {
    let op = Operator::shared();
    let t = Tenant::new("operator", "");
    let cluster = t.cluster;
    let (ns, rev) = (t.system.clone(), format!("{}-mesh", t.app));
    let apply_mesh = |version: &str| {
        cluster
            .apply(&format!(
                "apiVersion: operator.meshd.io/v1alpha1\nkind: Mesh\nmetadata: {{name: {rev}}}\nspec:\n  version: {version}\n  namespace: {ns}\n  values:\n    meshConfig: {{accessLogFile: /dev/stdout}}\n    pilot: {{env: {{PILOT_DEBOUNCE_AFTER: 50ms}}}}\n"
            ))
            .unwrap()
    };
    apply_mesh("1.0.0");
    let revision = wait_for(
        op,
        "the revision reconciled",
        "MeshRevision",
        "",
        &rev,
        |r| condition(r, "Reconciled").0 == "True",
    );
    assert_eq!(revision["metadata"]["ownerReferences"][0]["kind"], "Mesh");
    assert_eq!(condition(&revision, "Ready").1, "DeploymentNotReady");
    assert_eq!(condition(&revision, "InUse").0, "False");
    for (kind, namespace, name) in children(&rev, &ns) {
        let obj = cluster.object(kind, &namespace, &name);
        assert!(!obj.is_null(), "{kind} {name} was not made");
        let owner = &obj["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "MeshRevision", "{kind} {name}");
        assert_eq!(owner["name"], rev.as_str(), "{kind} {name}");
        assert_eq!(owner["controller"], true, "{kind} {name}");
        assert_eq!(
            obj["metadata"]["labels"]["istio.io/rev"],
            rev.as_str(),
            "{kind} {name}"
        );
        let managers: Vec<&str> = (obj["metadata"]["managedFields"].as_array().unwrap().iter())
            .map(|m| m["manager"].as_str().unwrap())
            .collect();
        assert!(
            managers.contains(&"meshd-operator"),
            "{kind} {name}: {managers:?}"
        );
    }
    let mesh_config = cluster.object("ConfigMap", &ns, &format!("istio-{rev}"));
    let mesh_yaml = mesh_config["data"]["mesh"].as_str().unwrap();
    assert!(
        mesh_yaml.contains("accessLogFile: /dev/stdout"),
        "{mesh_yaml}"
    );
    assert!(
        mesh_yaml.contains(&format!("rootNamespace: {ns}")),
        "{mesh_yaml}"
    );
    let service = cluster.object("Service", &ns, &format!("istiod-{rev}"));
    let ports: Vec<(i64, i64)> = (service["spec"]["ports"].as_array().unwrap().iter())
        .map(|p| {
            (
                p["port"].as_i64().unwrap(),
                p["targetPort"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [(15010, 15010), (15012, 15012), (15014, 15014), (443, 15017)]
    );
    let mesh = wait_for(op, "the mesh's status", "Mesh", "", &rev, |m| {
        m["status"]["revisions"]["total"] == 1
    });
    assert_eq!(mesh["status"]["activeRevisionName"], rev.as_str());
    assert_eq!(condition(&mesh, "Reconciled").0, "True");
    assert_eq!(condition(&mesh, "Ready").0, "False");

    // A full reconcile (the last child applied deleted, and put back) writes nothing else.
    // The first settles what the operator wrote from a cache older than its own writes.
    let injector = format!("istio-sidecar-injector-{rev}-{ns}");
    let full_reconcile = || {
        let mut versions = resource_versions(&rev, &ns);
        versions.insert(
            "MeshRevision".into(),
            cluster.object("MeshRevision", "", &rev)["metadata"]["resourceVersion"].clone(),
        );
        let deleted = versions
            .remove(&format!("MutatingWebhookConfiguration {injector}"))
            .unwrap();
        cluster.delete("MutatingWebhookConfiguration", "", &injector);
        wait_for(
            op,
            "the injector put back",
            "MutatingWebhookConfiguration",
            "",
            &injector,
            |m| !m.is_null() && m["metadata"]["resourceVersion"] != deleted,
        );
        versions
    };
    full_reconcile();
    let before = full_reconcile();
    let mut after = resource_versions(&rev, &ns);
    after.insert(
        "MeshRevision".into(),
        cluster.object("MeshRevision", "", &rev)["metadata"]["resourceVersion"].clone(),
    );
    after.remove(&format!("MutatingWebhookConfiguration {injector}"));
    assert_eq!(before, after, "a reconcile with nothing to change wrote");

    // The revision's meshd, run as its Deployment says, with its ServiceAccount's token.
    let deployment = cluster.object("Deployment", &ns, &format!("istiod-{rev}"));
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .unwrap();
    let kubeconfig = cluster.service_account_kubeconfig(&t.dir, &ns, account);
    let mut args: Vec<String> = (container["args"].as_array().unwrap().iter())
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    // The harness says `serve` and gives local ports, and a local folder for the
    // plugged-in CA's mount point.
    assert_eq!(args.remove(0), "serve");
    let cacerts = args.iter().position(|a| a == "--cacerts-dir").unwrap();
    args.drain(cacerts..cacerts + 2);
    let mut env = pod_env(container, &format!("istiod-{rev}-0"), &ns);
    assert!(
        env.contains(&("PILOT_DEBOUNCE_AFTER".into(), "50ms".into())),
        "{env:?}"
    );
    // Only the test's namespaces, so that it never writes into another test's.
    env.push(("WATCHED_NAMESPACES".into(), format!("{},{}", t.app, ns)));
    let _meshd = Meshd::start_pod(&t.dir.join("meshd"), &kubeconfig, &args, &env);
    for (kind, name) in [
        ("MutatingWebhookConfiguration", injector.clone()),
        (
            "ValidatingWebhookConfiguration",
            format!("istio-validator-{rev}-{ns}"),
        ),
    ] {
        wait_for(op, "meshd's root in the caBundle", kind, "", &name, |w| {
            w["webhooks"][0]["clientConfig"]["caBundle"].is_string()
        });
    }
    wait_for(
        op,
        "the root certificate published",
        "ConfigMap",
        &t.app,
        "istio-ca-root-cert",
        |c| c["data"]["root-cert.pem"].is_string(),
    );

    // Playing the Deployment controller: one replica ready.
    cluster
        .kubectl(
            &[
                "patch",
                "deployment",
                &format!("istiod-{rev}"),
                "-n",
                &ns,
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status": {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1}}"#,
            ],
            None,
        )
        .unwrap();
    wait_for(op, "the mesh ready", "Mesh", "", &rev, |m| {
        condition(m, "Ready").0 == "True" && m["status"]["revisions"]["ready"] == 1
    });

    // InPlace: a new version rolls the same revision's Deployment.
    apply_mesh("1.1.0");
    wait_for(
        op,
        "the Deployment on the new version",
        "Deployment",
        &ns,
        &format!("istiod-{rev}"),
        |d| d["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/meshd/meshd:1.1.0",
    );
    let mesh = cluster.object("Mesh", "", &rev);
    assert_eq!(mesh["status"]["activeRevisionName"], rev.as_str());
    assert_eq!(
        cluster
            .kubectl(&["get", "meshrevisions", "-o", "name"], None)
            .unwrap()
            .matches(&format!("/{rev}\n"))
            .count(),
        1
    );

    // Edited and deleted children come back, each through its own watch.
    cluster
        .kubectl(
            &[
                "patch",
                "configmap",
                &format!("istio-{rev}"),
                "-n",
                &ns,
                "--type=merge",
                "-p",
                r#"{"data": {"mesh": "edited: true"}}"#,
            ],
            None,
        )
        .unwrap();
    wait_for(
        op,
        "the mesh ConfigMap restored",
        "ConfigMap",
        &ns,
        &format!("istio-{rev}"),
        |c| {
            c["data"]["mesh"]
                .as_str()
                .is_some_and(|m| m.contains("accessLogFile"))
        },
    );
    cluster.delete("Service", &ns, &format!("istiod-{rev}"));
    wait_for(
        op,
        "the Service recreated",
        "Service",
        &ns,
        &format!("istiod-{rev}"),
        |s| !s.is_null(),
    );

    // In use while a namespace selects it; deletion held meanwhile.
    cluster
        .kubectl(
            &["label", "namespace", &t.app, &format!("istio.io/rev={rev}")],
            None,
        )
        .unwrap();
    wait_for(op, "the revision in use", "MeshRevision", "", &rev, |r| {
        condition(r, "InUse").0 == "True"
    });
    wait_for(op, "the mesh counting it in use", "Mesh", "", &rev, |m| {
        m["status"]["revisions"]["inUse"] == 1
    });
    cluster.delete("Mesh", "", &rev);
    let held = wait_for(op, "the deletion held", "MeshRevision", "", &rev, |r| {
        condition(r, "InUse").1 == "DeletionHeld"
    });
    assert!(condition(&held, "InUse").2.contains(&t.app), "{held:#}");
    assert!(
        !cluster
            .object("Deployment", &ns, &format!("istiod-{rev}"))
            .is_null()
    );
    cluster
        .kubectl(&["label", "namespace", &t.app, "istio.io/rev-"], None)
        .unwrap();
    wait_for(op, "the mesh gone", "Mesh", "", &rev, Value::is_null);
    wait_for(
        op,
        "the revision gone",
        "MeshRevision",
        "",
        &rev,
        Value::is_null,
    );
    assert_all_gone(&rev, &ns);
}

/// `RevisionBased`: a new version is a new revision beside the old one; a tag pointing at
/// the mesh writes `istio-revision-tag-TAG` for the active revision and follows it to the
/// new one; the old revision, no longer used, goes after the grace period, its objects
/// with it; the tag's injector goes with the tag.
#[test]
fn a_revision_based_update_moves_the_tag_and_removes_the_old_revision() {
    let op = Operator::shared();
    let t = Tenant::new("operator-rb", "");
    let cluster = t.cluster;
    let (ns, mesh, tag) = (
        t.system.clone(),
        format!("{}-rb", t.app),
        format!("{}-tag", t.app),
    );
    let apply_mesh = |version: &str| {
        cluster
            .apply(&format!(
                "apiVersion: operator.meshd.io/v1alpha1\nkind: Mesh\nmetadata: {{name: {mesh}}}\nspec:\n  version: {version}\n  namespace: {ns}\n  updateStrategy: {{type: RevisionBased, inactiveRevisionDeletionGracePeriodSeconds: 1}}\n"
            ))
            .unwrap()
    };
    apply_mesh("1.0.0");
    let (old, new) = (format!("{mesh}-v1-0-0"), format!("{mesh}-v1-1-0"));
    wait_for(op, "the first revision", "MeshRevision", "", &old, |r| {
        condition(r, "Reconciled").0 == "True"
    });
    let deployment = cluster.object("Deployment", &ns, &format!("istiod-{old}"));
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        "ghcr.io/meshd/meshd:1.0.0"
    );
    cluster
        .apply(&format!(
            "apiVersion: operator.meshd.io/v1alpha1\nkind: MeshRevisionTag\nmetadata: {{name: {tag}}}\nspec:\n  targetRef: {{kind: Mesh, name: {mesh}}}\n"
        ))
        .unwrap();
    let injector = format!("istio-revision-tag-{tag}-{ns}");
    let mwc = wait_for(
        op,
        "the tag's injector",
        "MutatingWebhookConfiguration",
        "",
        &injector,
        |m| m["metadata"]["labels"]["istio.io/rev"] == old.as_str(),
    );
    assert_eq!(mwc["metadata"]["labels"]["istio.io/tag"], tag.as_str());
    let webhook = &mwc["webhooks"][0];
    assert_eq!(
        webhook["clientConfig"]["service"]["name"],
        format!("istiod-{old}").as_str()
    );
    assert_eq!(
        webhook["namespaceSelector"]["matchExpressions"][0],
        serde_json::json!({"key": "istio.io/rev", "operator": "In", "values": [tag]})
    );
    // The tag keeps its revision in use.
    wait_for(
        op,
        "the first revision in use",
        "MeshRevision",
        "",
        &old,
        |r| condition(r, "InUse").0 == "True",
    );
    cluster
        .kubectl(
            &["label", "namespace", &t.app, &format!("istio.io/rev={tag}")],
            None,
        )
        .unwrap();
    wait_for(op, "the tag in use", "MeshRevisionTag", "", &tag, |tg| {
        condition(tg, "InUse").0 == "True" && tg["status"]["revision"] == old.as_str()
    });

    apply_mesh("1.1.0");
    wait_for(
        op,
        "the tag moved",
        "MutatingWebhookConfiguration",
        "",
        &injector,
        |m| {
            m["metadata"]["labels"]["istio.io/rev"] == new.as_str()
                && m["webhooks"][0]["clientConfig"]["service"]["name"]
                    == format!("istiod-{new}").as_str()
        },
    );
    wait_for(
        op,
        "the old revision removed",
        "MeshRevision",
        "",
        &old,
        Value::is_null,
    );
    for (kind, namespace, name) in children(&old, &ns) {
        wait_for(
            op,
            "the old revision's objects removed",
            kind,
            &namespace,
            &name,
            Value::is_null,
        );
    }
    let status = wait_for(op, "one revision left", "Mesh", "", &mesh, |m| {
        m["status"]["revisions"]["total"] == 1
    });
    assert_eq!(status["status"]["activeRevisionName"], new.as_str());
    assert!(
        !cluster
            .object("Deployment", &ns, &format!("istiod-{new}"))
            .is_null()
    );

    cluster.delete("MeshRevisionTag", "", &tag);
    wait_for(
        op,
        "the tag's injector removed",
        "MutatingWebhookConfiguration",
        "",
        &injector,
        Value::is_null,
    );
    cluster
        .kubectl(&["label", "namespace", &t.app, "istio.io/rev-"], None)
        .unwrap();
    cluster.delete("Mesh", "", &mesh);
    wait_for(op, "the mesh gone", "Mesh", "", &mesh, Value::is_null);
    assert_all_gone(&new, &ns);
}

/// A revision whose mesh configuration meshd cannot read installs nothing: the reason,
/// naming the object and the field, is in its `Reconciled` condition and in a Warning
/// event, and the failure is counted.
#[test]
fn a_revision_the_operator_cannot_install_says_why() {
    let op = Operator::shared();
    let t = Tenant::new("operator-bad", "");
    let cluster = t.cluster;
    let rev = format!("{}-bad", t.app);
    let errors = "controller_runtime_reconcile_errors_total{controller=\"meshrevision\"}";
    let before = op.metric(errors);
    cluster
        .apply(&format!(
            "apiVersion: operator.meshd.io/v1alpha1\nkind: MeshRevision\nmetadata: {{name: {rev}}}\nspec:\n  namespace: {}\n  values:\n    meshConfig: {{outboundTrafficPolicy: {{mode: SOMETIMES}}}}\n",
            t.system
        ))
        .unwrap();
    let revision = wait_for(op, "the refusal", "MeshRevision", "", &rev, |r| {
        condition(r, "Reconciled").0 == "False"
    });
    let (_, reason, message) = condition(&revision, "Reconciled");
    assert_eq!(reason, "InvalidSpec");
    assert!(
        message.contains(&format!("MeshRevision {rev}: spec.values.meshConfig:")),
        "{message}"
    );
    assert_eq!(revision["status"]["state"], "InvalidSpec");
    assert!(
        cluster
            .object("Deployment", &t.system, &format!("istiod-{rev}"))
            .is_null()
    );
    wait_until("the failure counted", TIMEOUT, || {
        op.metric(errors) > before
    });
    wait_until("the Warning event", TIMEOUT, || {
        let events = cluster
            .kubectl(
                &[
                    "get",
                    "events.events.k8s.io",
                    "-A",
                    "-o",
                    "json",
                    "--field-selector",
                    &format!("regarding.name={rev}"),
                ],
                None,
            )
            .unwrap();
        let events: Value = serde_json::from_str(&events).unwrap();
        (events["items"].as_array().unwrap().iter()).any(|e| {
            e["type"] == "Warning"
                && e["reason"] == "InvalidSpec"
                && e["note"]
                    .as_str()
                    .is_some_and(|n| n.contains("spec.values.meshConfig"))
        })
    });
    cluster.delete("MeshRevision", "", &rev);
    wait_for(
        op,
        "the revision gone",
        "MeshRevision",
        "",
        &rev,
        Value::is_null,
    );
}
