//! The workload a Pod belongs to, as istiod's `GetDeployMetaFromPod` names it: a
//! ReplicaSet named after its pod-template hash is its Deployment, a Job named after a
//! CronJob's schedule stamp is that CronJob, another controller is itself, and a pod with
//! no controller (or a fixed name) is its own workload. Telemetry labels
//! (`destination_workload`) and the injector's `ISTIO_META_WORKLOAD_NAME` both read it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A Pod's workload: its name and its kind's API version and kind (`apps/v1`
/// `Deployment`, or `v1` `Pod` for a pod of its own).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodWorkload {
    pub name: String,
    pub api_version: String,
    pub kind: String,
}

impl PodWorkload {
    pub fn of(meta: &ObjectMeta) -> PodWorkload {
        let label = |k: &str| meta.labels.as_ref().and_then(|l| l.get(k)).cloned();
        let mut w = PodWorkload {
            name: meta.name.clone().unwrap_or_default(),
            api_version: "v1".into(),
            kind: "Pod".into(),
        };
        let controller =
            (meta.owner_references.iter().flatten()).find(|r| r.controller == Some(true));
        if meta.generate_name.as_deref().is_some_and(|g| !g.is_empty())
            && let Some(owner) = controller
        {
            w.api_version.clone_from(&owner.api_version);
            w.kind.clone_from(&owner.kind);
            w.name.clone_from(&owner.name);
            if owner.kind == "ReplicaSet"
                && let Some(hash) = label("pod-template-hash").filter(|h| !h.is_empty())
                && let Some(deployment) = owner.name.strip_suffix(&format!("-{hash}"))
            {
                w.name = deployment.to_string();
                w.kind = "Deployment".into();
            } else if owner.kind == "Job"
                && let Some((cronjob, stamp)) = owner.name.rsplit_once('-')
                && (8..=10).contains(&stamp.len())
                && stamp.bytes().all(|b| b.is_ascii_digit())
            {
                w.name = cronjob.to_string();
                w.kind = "CronJob".into();
                w.api_version = "batch/v1".into();
            }
        }
        if w.name.is_empty() {
            w.name = meta.generate_name.clone().unwrap_or_default();
        }
        w
    }
}

/// A WorkloadEntry's workload name (istiod's `WorkloadNameFromWorkloadEntry`): its
/// auto-registration group, else its `service.istio.io/workload-name` label, else its
/// own name.
pub fn workload_entry_workload<'a>(
    name: &'a str,
    annotations: &'a std::collections::BTreeMap<String, String>,
    labels: &'a std::collections::BTreeMap<String, String>,
) -> &'a str {
    (annotations.get("istio.io/autoRegistrationGroup"))
        .or(labels.get("service.istio.io/workload-name"))
        .map_or(name, String::as_str)
}

/// A workload's canonical service name and revision, from its labels as istiod's
/// `CanonicalService` reads them: `service.istio.io/canonical-name`, else
/// `app.kubernetes.io/name`, else `app`, else the workload's name; and
/// `service.istio.io/canonical-revision`, else `app.kubernetes.io/version`, else
/// `version`, else `latest`.
pub fn canonical_service<'a>(
    labels: &'a std::collections::BTreeMap<String, String>,
    workload: &'a str,
) -> (&'a str, &'a str) {
    let first = |keys: [&str; 3]| keys.iter().find_map(|k| labels.get(*k).map(String::as_str));
    let name = first([
        "service.istio.io/canonical-name",
        "app.kubernetes.io/name",
        "app",
    ]);
    let revision = first([
        "service.istio.io/canonical-revision",
        "app.kubernetes.io/version",
        "version",
    ]);
    (name.unwrap_or(workload), revision.unwrap_or("latest"))
}
