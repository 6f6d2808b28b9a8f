//! What a revision and a tag are made of, as Istio's `istiod` chart names them: pure
//! functions from a `MeshRevision` (or a tag) to the objects the operator applies.

use std::collections::BTreeMap;

use api::operator::{CaMode, MeshRevision, Values};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    HTTPGetAction, ObjectFieldSelector, PodSpec, PodTemplateSpec, Probe, SecretVolumeSource,
    SecurityContext, Service, ServiceAccount, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;

/// The field manager of every server-side apply, and the `managed-by` label's value.
pub const MANAGER: &str = "meshd-operator";
/// The label naming the revision an object belongs to.
pub const REVISION_LABEL: &str = "operator.meshd.io/revision";
/// The label naming the mesh a revision belongs to.
pub const MESH_LABEL: &str = "operator.meshd.io/mesh";
/// The image registry when `values.global.hub` names none.
pub const DEFAULT_HUB: &str = "ghcr.io/meshd";
/// meshd's role, as shipped in `manifests/rbac.yaml` and proven minimal by the test bed.
const RBAC: &str = include_str!("../../manifests/rbac.yaml");

/// Every object of one revision, in the order they are applied.
#[derive(Clone, Debug, Default)]
pub struct RevisionObjects {
    pub service_account: ServiceAccount,
    pub cluster_role: ClusterRole,
    pub cluster_role_binding: ClusterRoleBinding,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub mesh_config: ConfigMap,
    pub deployment: Deployment,
    pub service: Service,
    /// Only with more than one replica, as Istio 1.28+ renders it.
    pub pdb: Option<PodDisruptionBudget>,
    pub validator: ValidatingWebhookConfiguration,
    pub injector: MutatingWebhookConfiguration,
}

/// How a revision's objects are named: Istio's `-REV` suffix, absent for `default`.
#[derive(Clone, Debug, PartialEq)]
pub struct Names {
    pub revision: String,
    pub namespace: String,
}

impl Names {
    pub fn of(revision: &MeshRevision) -> Names {
        Names {
            revision: revision.metadata.name.clone().unwrap_or_default(),
            namespace: revision.spec.namespace.clone(),
        }
    }

    fn suffix(&self) -> String {
        match self.revision.as_str() {
            "default" => String::new(),
            r => format!("-{r}"),
        }
    }

    /// `istiod[-REV]`: the ServiceAccount, Role, Deployment, Service and PDB.
    pub fn istiod(&self) -> String {
        format!("istiod{}", self.suffix())
    }

    /// `istio[-REV]`: the mesh ConfigMap.
    pub fn mesh_config(&self) -> String {
        format!("istio{}", self.suffix())
    }

    /// `istiod-clusterrole[-REV]-NS`.
    pub fn cluster_role(&self) -> String {
        format!("istiod-clusterrole{}-{}", self.suffix(), self.namespace)
    }

    /// `istio-validator[-REV]-NS`.
    pub fn validator(&self) -> String {
        format!("istio-validator{}-{}", self.suffix(), self.namespace)
    }

    /// `istio-sidecar-injector[-REV][-NS]`, the namespace only outside `istio-system`.
    pub fn injector(&self) -> String {
        format!(
            "istio-sidecar-injector{}{}",
            self.suffix(),
            self.namespace_suffix()
        )
    }

    /// `istio-revision-tag-TAG[-NS]`.
    pub fn tag_injector(&self, tag: &str) -> String {
        format!("istio-revision-tag-{tag}{}", self.namespace_suffix())
    }

    fn namespace_suffix(&self) -> String {
        match self.namespace.as_str() {
            "istio-system" => String::new(),
            ns => format!("-{ns}"),
        }
    }
}

/// The images a revision runs: meshd's and the sidecar's.
pub fn images(values: &Values, version: &str) -> (String, String) {
    let hub = values.global.hub.as_deref().unwrap_or(DEFAULT_HUB);
    let meshd = (values.pilot.image.clone()).unwrap_or_else(|| format!("{hub}/meshd:{version}"));
    let proxy =
        (values.global.proxy.image.clone()).unwrap_or_else(|| format!("{hub}/proxy:{version}"));
    (meshd, proxy)
}

/// The owner reference children carry: the object that made them, as their controller.
pub fn owner<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.meta().name.clone().unwrap_or_default(),
        uid: owner.meta().uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn labels(names: &Names) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/managed-by".into(), MANAGER.into()),
        (REVISION_LABEL.into(), names.revision.clone()),
        ("istio.io/rev".into(), names.revision.clone()),
    ])
}

fn meta(names: &Names, name: String, namespaced: bool, owner: &OwnerReference) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: namespaced.then(|| names.namespace.clone()),
        labels: Some(labels(names)),
        owner_references: Some(vec![owner.clone()]),
        ..ObjectMeta::default()
    }
}

/// The rules of the ClusterRole and of the Role in `manifests/rbac.yaml`, read once.
pub fn meshd_rules() -> (Vec<PolicyRule>, Vec<PolicyRule>) {
    static RULES: std::sync::OnceLock<(Vec<PolicyRule>, Vec<PolicyRule>)> =
        std::sync::OnceLock::new();
    RULES.get_or_init(parse_rules).clone()
}

fn parse_rules() -> (Vec<PolicyRule>, Vec<PolicyRule>) {
    let mut cluster = Vec::new();
    let mut namespaced = Vec::new();
    for doc in serde_saphyr::from_multiple::<serde_json::Value>(RBAC)
        .expect("BUG: manifests/rbac.yaml is YAML (a test reads it)")
    {
        let rules: Vec<PolicyRule> = serde_json::from_value(doc["rules"].clone())
            .expect("BUG: manifests/rbac.yaml holds PolicyRules (a test reads it)");
        match doc["kind"].as_str() {
            Some("ClusterRole") => cluster.extend(rules),
            Some("Role") => namespaced.extend(rules),
            _ => {}
        }
    }
    (cluster, namespaced)
}

/// The revision's objects. `failure_policy` is the validator's current one (meshd sets
/// `Fail` once its webhook is proven), `Ignore` for a new one.
pub fn revision(rev: &MeshRevision, failure_policy: Option<String>) -> RevisionObjects {
    let names = Names::of(rev);
    let owner = owner(rev);
    let ns = names.namespace.clone();
    let (cluster_rules, rules) = meshd_rules();
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: names.istiod(),
        namespace: Some(ns.clone()),
        ..Subject::default()
    };
    let replicas = rev.spec.values.pilot.replica_count.unwrap_or(1);
    RevisionObjects {
        service_account: ServiceAccount {
            metadata: meta(&names, names.istiod(), true, &owner),
            ..ServiceAccount::default()
        },
        cluster_role: ClusterRole {
            metadata: meta(&names, names.cluster_role(), false, &owner),
            rules: Some(cluster_rules),
            ..ClusterRole::default()
        },
        cluster_role_binding: ClusterRoleBinding {
            metadata: meta(&names, names.cluster_role(), false, &owner),
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "ClusterRole".into(),
                name: names.cluster_role(),
            },
            subjects: Some(vec![subject.clone()]),
        },
        role: Role {
            metadata: meta(&names, names.istiod(), true, &owner),
            rules: Some(rules),
        },
        role_binding: RoleBinding {
            metadata: meta(&names, names.istiod(), true, &owner),
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "Role".into(),
                name: names.istiod(),
            },
            subjects: Some(vec![subject]),
        },
        mesh_config: ConfigMap {
            metadata: meta(&names, names.mesh_config(), true, &owner),
            data: Some(BTreeMap::from([("mesh".into(), mesh_yaml(rev))])),
            ..ConfigMap::default()
        },
        deployment: deployment(rev, &names, &owner, replicas),
        service: service(&names, &owner),
        pdb: (replicas > 1).then(|| PodDisruptionBudget {
            metadata: meta(&names, names.istiod(), true, &owner),
            spec: Some(PodDisruptionBudgetSpec {
                min_available: Some(IntOrString::Int(1)),
                selector: Some(pod_selector(&names)),
                ..PodDisruptionBudgetSpec::default()
            }),
            ..PodDisruptionBudget::default()
        }),
        validator: validator(&names, &owner, failure_policy),
        injector: MutatingWebhookConfiguration {
            metadata: meta(&names, names.injector(), false, &owner),
            webhooks: Some(injector_webhooks(&names, &names.revision)),
        },
    }
}

/// The mesh configuration: the values' `meshConfig`, with the revision's namespace as the
/// root namespace unless it names one.
fn mesh_yaml(rev: &MeshRevision) -> String {
    let mut mesh = rev.spec.values.mesh_config.clone().unwrap_or_default();
    mesh.entry("rootNamespace")
        .or_insert_with(|| rev.spec.namespace.clone().into());
    serde_saphyr::to_string(&mesh).expect("BUG: JSON always serialises as YAML")
}

fn pod_selector(names: &Names) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([
            ("app".into(), "istiod".into()),
            ("istio.io/rev".into(), names.revision.clone()),
        ])),
        ..LabelSelector::default()
    }
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
    }
}

fn port(name: &str, number: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: number,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    }
}

/// Where the plugged-in CA's Secret `cacerts` is mounted (meshd's `--cacerts-dir`).
const CACERTS_DIR: &str = "/etc/cacerts";
/// Where an external CA's root is mounted.
const EXTERNAL_ROOT_DIR: &str = "/etc/external-ca";

fn deployment(
    rev: &MeshRevision,
    names: &Names,
    owner: &OwnerReference,
    replicas: i32,
) -> Deployment {
    let values = &rev.spec.values;
    let (image, proxy_image) = images(values, &rev.spec.version);
    let mut env = vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        env("MESHD_PROXY_IMAGE", proxy_image),
        env("INJECTION_WEBHOOK_CONFIG_NAME", names.injector()),
    ];
    let mut volumes = vec![Volume {
        name: "cacerts".into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some("cacerts".into()),
            optional: Some(values.ca.mode != CaMode::PluggedIn),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }];
    let mut mounts = vec![VolumeMount {
        name: "cacerts".into(),
        mount_path: CACERTS_DIR.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    }];
    if values.ca.mode == CaMode::External {
        if let Some(address) = &values.ca.external_address {
            env.push(self::env("EXTERNAL_CA", address.clone()));
        }
        if let Some(config_map) = &values.ca.external_root_cert_config_map {
            env.push(self::env(
                "EXTERNAL_CA_ROOT_CERT",
                format!("{EXTERNAL_ROOT_DIR}/root-cert.pem"),
            ));
            volumes.push(Volume {
                name: "external-ca".into(),
                config_map: Some(ConfigMapVolumeSource {
                    name: config_map.clone(),
                    ..ConfigMapVolumeSource::default()
                }),
                ..Volume::default()
            });
            mounts.push(VolumeMount {
                name: "external-ca".into(),
                mount_path: EXTERNAL_ROOT_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            });
        }
    }
    env.extend((values.pilot.env.iter()).map(|(k, v)| self::env(k, v.clone())));
    let mut pod_labels = pod_selector(names).match_labels.unwrap_or_default();
    pod_labels.insert("istio".into(), "pilot".into());
    pod_labels.insert("sidecar.istio.io/inject".into(), "false".into());
    let container = Container {
        name: "discovery".into(),
        image: Some(image),
        args: Some(vec![
            "serve".into(),
            "--revision".into(),
            names.revision.clone(),
            "--cacerts-dir".into(),
            CACERTS_DIR.into(),
        ]),
        env: Some(env),
        ports: Some(vec![
            port("grpc-xds", 15010),
            port("https-dns", 15012),
            port("http-monitoring", 15014),
            port("https-webhooks", 15017),
        ]),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/ready".into()),
                port: IntOrString::Int(15014),
                ..HTTPGetAction::default()
            }),
            initial_delay_seconds: Some(1),
            period_seconds: Some(3),
            ..Probe::default()
        }),
        resources: values.pilot.resources.clone(),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(k8s_openapi::api::core::v1::Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(mounts),
        ..Container::default()
    };
    Deployment {
        metadata: meta(names, names.istiod(), true, owner),
        spec: DeploymentSpec {
            replicas: Some(replicas),
            selector: pod_selector(names),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(BTreeMap::from([(
                        "prometheus.io/port".into(),
                        "15014".into(),
                    )])),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(names.istiod()),
                    containers: vec![container],
                    volumes: Some(volumes),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        },
        ..Deployment::default()
    }
}

fn service(names: &Names, owner: &OwnerReference) -> Service {
    let port = |name: &str, port: i32, target: i32| ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::Int(target)),
        protocol: Some("TCP".into()),
        ..ServicePort::default()
    };
    Service {
        metadata: meta(names, names.istiod(), true, owner),
        spec: Some(ServiceSpec {
            selector: pod_selector(names).match_labels,
            ports: Some(vec![
                port("grpc-xds", 15010, 15010),
                port("https-dns", 15012, 15012),
                port("http-monitoring", 15014, 15014),
                port("https-webhook", 443, 15017),
            ]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn client_config(names: &Names, path: &str) -> WebhookClientConfig {
    WebhookClientConfig {
        service: Some(ServiceReference {
            name: names.istiod(),
            namespace: names.namespace.clone(),
            path: Some(path.into()),
            port: Some(443),
        }),
        ..WebhookClientConfig::default()
    }
}

fn requirement(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: key.into(),
        operator: operator.into(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
    }
}

fn selector(requirements: Vec<LabelSelectorRequirement>) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_expressions: Some(requirements),
        match_labels: None,
    })
}

fn validator(
    names: &Names,
    owner: &OwnerReference,
    failure_policy: Option<String>,
) -> ValidatingWebhookConfiguration {
    let rev = names.revision.as_str();
    ValidatingWebhookConfiguration {
        metadata: meta(names, names.validator(), false, owner),
        webhooks: Some(vec![ValidatingWebhook {
            name: "rev.validation.istio.io".into(),
            client_config: client_config(names, "/validate"),
            rules: Some(vec![RuleWithOperations {
                operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                api_groups: Some(
                    [
                        "security.istio.io",
                        "networking.istio.io",
                        "telemetry.istio.io",
                    ]
                    .map(String::from)
                    .to_vec(),
                ),
                api_versions: Some(vec!["*".into()]),
                resources: Some(vec!["*".into()]),
                scope: None,
            }]),
            failure_policy: Some(failure_policy.unwrap_or_else(|| "Ignore".into())),
            side_effects: "None".into(),
            admission_review_versions: vec!["v1".into()],
            object_selector: selector(vec![requirement("istio.io/rev", "In", &[rev])]),
            ..ValidatingWebhook::default()
        }]),
    }
}

/// The injection webhooks selecting `selected` (the revision, or a tag) as Istio's chart
/// writes them; `default` also selects `istio-injection=enabled` and pods asking for it.
pub fn injector_webhooks(names: &Names, selected: &str) -> Vec<MutatingWebhook> {
    let entry = |name: &str, namespace: Vec<LabelSelectorRequirement>, object| MutatingWebhook {
        name: format!("{name}sidecar-injector.istio.io"),
        client_config: client_config(names, "/inject"),
        rules: Some(vec![RuleWithOperations {
            operations: Some(vec!["CREATE".into()]),
            api_groups: Some(vec![String::new()]),
            api_versions: Some(vec!["v1".into()]),
            resources: Some(vec!["pods".into()]),
            scope: None,
        }]),
        failure_policy: Some("Fail".into()),
        reinvocation_policy: Some("Never".into()),
        side_effects: "None".into(),
        admission_review_versions: vec!["v1".into()],
        namespace_selector: selector(namespace),
        object_selector: selector(object),
        ..MutatingWebhook::default()
    };
    let not_false = || requirement("sidecar.istio.io/inject", "NotIn", &["false"]);
    let mut webhooks = vec![
        entry(
            "rev.namespace.",
            vec![
                requirement("istio.io/rev", "In", &[selected]),
                requirement("istio-injection", "DoesNotExist", &[]),
            ],
            vec![not_false()],
        ),
        entry(
            "rev.object.",
            vec![
                requirement("istio.io/rev", "DoesNotExist", &[]),
                requirement("istio-injection", "DoesNotExist", &[]),
            ],
            vec![not_false(), requirement("istio.io/rev", "In", &[selected])],
        ),
    ];
    if selected == "default" {
        webhooks.push(entry(
            "namespace.",
            vec![requirement("istio-injection", "In", &["enabled"])],
            vec![not_false()],
        ));
        webhooks.push(entry(
            "object.",
            vec![
                requirement("istio-injection", "DoesNotExist", &[]),
                requirement("istio.io/rev", "DoesNotExist", &[]),
            ],
            vec![
                requirement("sidecar.istio.io/inject", "In", &["true"]),
                requirement("istio.io/rev", "DoesNotExist", &[]),
            ],
        ));
    }
    webhooks
}

/// A tag's injector: `istio-revision-tag-TAG`, labelled with the tag and the revision it
/// points to (whose meshd writes its `caBundle`), calling that revision's Service.
pub fn tag_injector(
    tag: &str,
    target: &Names,
    owner: &OwnerReference,
) -> MutatingWebhookConfiguration {
    let mut metadata = meta(target, target.tag_injector(tag), false, owner);
    let labels = metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.remove(REVISION_LABEL);
    labels.insert("istio.io/tag".into(), tag.into());
    MutatingWebhookConfiguration {
        metadata,
        webhooks: Some(injector_webhooks(target, tag)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::operator::MeshRevisionSpec;

    fn revision(name: &str, namespace: &str) -> MeshRevision {
        let mut rev = MeshRevision::new(
            name,
            MeshRevisionSpec {
                version: "1.2.3".into(),
                namespace: namespace.into(),
                values: Values::default(),
            },
        );
        rev.metadata.uid = Some("uid-1".into());
        rev
    }

    #[test]
    fn objects_are_named_as_istios_chart_names_them() {
        let default = Names::of(&revision("default", "istio-system"));
        assert_eq!(default.istiod(), "istiod");
        assert_eq!(default.mesh_config(), "istio");
        assert_eq!(default.cluster_role(), "istiod-clusterrole-istio-system");
        assert_eq!(default.validator(), "istio-validator-istio-system");
        assert_eq!(default.injector(), "istio-sidecar-injector");
        assert_eq!(default.tag_injector("prod"), "istio-revision-tag-prod");
        let canary = Names::of(&revision("canary", "mesh"));
        assert_eq!(canary.istiod(), "istiod-canary");
        assert_eq!(canary.mesh_config(), "istio-canary");
        assert_eq!(canary.cluster_role(), "istiod-clusterrole-canary-mesh");
        assert_eq!(canary.validator(), "istio-validator-canary-mesh");
        assert_eq!(canary.injector(), "istio-sidecar-injector-canary-mesh");
        assert_eq!(canary.tag_injector("prod"), "istio-revision-tag-prod-mesh");
    }

    #[test]
    fn the_revisions_roles_are_the_ones_manifests_ship() {
        let (cluster, namespaced) = meshd_rules();
        let has = |rules: &[PolicyRule], resource: &str, verb: &str| {
            rules.iter().any(|r| {
                r.resources.iter().flatten().any(|x| x == resource)
                    && r.verbs.iter().any(|v| v == verb)
            })
        };
        assert!(has(&cluster, "tokenreviews", "create"));
        assert!(has(&cluster, "mutatingwebhookconfigurations", "update"));
        assert!(has(&namespaced, "leases", "update"));
        assert!(!has(&cluster, "leases", "update"));
        let objects = super::revision(&revision("canary", "mesh"), None);
        assert_eq!(objects.cluster_role.rules, Some(cluster));
        assert_eq!(objects.role.rules, Some(namespaced));
    }

    #[test]
    fn every_object_is_owned_by_the_revision_and_labelled_with_it() {
        let o = super::revision(&revision("canary", "mesh"), None);
        let metas = [
            &o.service_account.metadata,
            &o.cluster_role.metadata,
            &o.cluster_role_binding.metadata,
            &o.role.metadata,
            &o.role_binding.metadata,
            &o.mesh_config.metadata,
            &o.deployment.metadata,
            &o.service.metadata,
            &o.validator.metadata,
            &o.injector.metadata,
        ];
        for meta in metas {
            let owner = &meta.owner_references.as_ref().unwrap()[0];
            assert_eq!(
                (owner.kind.as_str(), owner.uid.as_str()),
                ("MeshRevision", "uid-1")
            );
            assert_eq!(owner.controller, Some(true));
            let labels = meta.labels.as_ref().unwrap();
            assert_eq!(labels["istio.io/rev"], "canary");
            assert_eq!(labels["app.kubernetes.io/managed-by"], MANAGER);
        }
        assert!(o.pdb.is_none(), "one replica has no PodDisruptionBudget");
    }

    #[test]
    fn the_deployment_runs_the_revision_with_its_values() {
        let mut rev = revision("canary", "mesh");
        rev.spec.values.pilot.replica_count = Some(2);
        rev.spec
            .values
            .pilot
            .env
            .insert("PILOT_PUSH_THROTTLE".into(), "50".into());
        rev.spec.values.global.hub = Some("registry.example/mesh".into());
        rev.spec.values.ca.mode = CaMode::PluggedIn;
        let o = super::revision(&rev, Some("Fail".into()));
        let pod = o.deployment.spec.template.spec.unwrap();
        let c = &pod.containers[0];
        assert_eq!(
            c.image.as_deref(),
            Some("registry.example/mesh/meshd:1.2.3")
        );
        assert_eq!(
            c.args.as_ref().unwrap()[..3],
            ["serve", "--revision", "canary"]
        );
        let env: BTreeMap<_, _> = (c.env.iter().flatten())
            .map(|e| (e.name.as_str(), e.value.as_deref()))
            .collect();
        assert_eq!(env["PILOT_PUSH_THROTTLE"], Some("50"));
        assert_eq!(
            env["MESHD_PROXY_IMAGE"],
            Some("registry.example/mesh/proxy:1.2.3")
        );
        assert_eq!(
            env["INJECTION_WEBHOOK_CONFIG_NAME"],
            Some("istio-sidecar-injector-canary-mesh")
        );
        assert_eq!(pod.service_account_name.as_deref(), Some("istiod-canary"));
        let cacerts = &pod.volumes.unwrap()[0];
        assert_eq!(cacerts.secret.as_ref().unwrap().optional, Some(false));
        assert_eq!(o.deployment.spec.replicas, Some(2));
        assert!(o.pdb.is_some(), "two replicas keep one up");
        // meshd's own choice of failure policy is kept.
        let validator = &o.validator.webhooks.unwrap()[0];
        assert_eq!(validator.failure_policy.as_deref(), Some("Fail"));
    }

    #[test]
    fn the_default_revision_also_selects_istio_injection() {
        let names = Names::of(&revision("default", "istio-system"));
        let default: Vec<String> = (injector_webhooks(&names, "default").into_iter())
            .map(|w| w.name)
            .collect();
        assert_eq!(
            default,
            [
                "rev.namespace.sidecar-injector.istio.io",
                "rev.object.sidecar-injector.istio.io",
                "namespace.sidecar-injector.istio.io",
                "object.sidecar-injector.istio.io"
            ]
        );
        assert_eq!(injector_webhooks(&names, "canary").len(), 2);
    }
}
