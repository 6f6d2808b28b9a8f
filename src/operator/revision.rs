//! The `MeshRevision` controller: a revision's objects applied and kept, its readiness and
//! use reported, and its deletion held while namespaces, pods or tags use it.

use std::sync::Arc;
use std::time::Duration;

use api::operator::{MeshRevision, MeshRevisionStatus, MeshRevisionTag};
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::ListParams;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, ResourceExt};
use model::mesh::MeshConfig;

use super::render::{self, MANAGER, Names, RevisionObjects};
use super::status::{self, IN_USE, READY, RECONCILED, condition};
use super::{Context, Error, apply};

const CONTROLLER: &str = "meshrevision";
/// How often a revision is looked at again with nothing changed (pods using it come and
/// go without an event the controller watches).
const RESYNC: Duration = Duration::from_secs(60);

/// Runs the controller until its watches end.
pub async fn run(client: Client, ctx: Arc<Context>) {
    let owned =
        || watcher::Config::default().labels(&format!("app.kubernetes.io/managed-by={MANAGER}"));
    let c = &client;
    let controller = Controller::new(Api::<MeshRevision>::all(client.clone()), Default::default());
    // A tag moving from one revision to another changes whether both are used: any tag
    // event looks at every revision (there are few).
    let revisions = controller.store();
    let selections = apply::Selections::default();
    let every_revision = move |_: MeshRevisionTag| {
        (revisions.state().iter())
            .map(|r| ObjectRef::from_obj(r.as_ref()))
            .collect::<Vec<_>>()
    };
    controller
        .watches(
            Api::<MeshRevisionTag>::all(c.clone()),
            Default::default(),
            every_revision,
        )
        .watches(
            Api::<ServiceAccount>::all(c.clone()),
            owned(),
            apply::owners,
        )
        .watches(Api::<ClusterRole>::all(c.clone()), owned(), apply::owners)
        .watches(
            Api::<ClusterRoleBinding>::all(c.clone()),
            owned(),
            apply::owners,
        )
        .watches(Api::<Role>::all(c.clone()), owned(), apply::owners)
        .watches(Api::<RoleBinding>::all(c.clone()), owned(), apply::owners)
        .watches(Api::<ConfigMap>::all(c.clone()), owned(), apply::owners)
        .watches(Api::<Deployment>::all(c.clone()), owned(), apply::owners)
        .watches(Api::<Service>::all(c.clone()), owned(), apply::owners)
        .watches(
            Api::<PodDisruptionBudget>::all(c.clone()),
            owned(),
            apply::owners,
        )
        .watches(
            Api::<ValidatingWebhookConfiguration>::all(c.clone()),
            owned(),
            apply::owners,
        )
        .watches(
            Api::<MutatingWebhookConfiguration>::all(c.clone()),
            owned(),
            apply::owners,
        )
        // A namespace labelled with a revision makes it used.
        .watches(
            Api::<PartialObjectMeta<Namespace>>::all(c.clone()),
            watcher::Config::default(),
            move |ns| selections.changed(&ns),
        )
        .shutdown_on_signal()
        .run(
            |rev, ctx: Arc<Context>| async move {
                let run = reconcile(&rev, &ctx);
                ctx.reconcile(CONTROLLER, &*rev, run).await
            },
            |rev, _, ctx| ctx.backoff(CONTROLLER, rev.name_any()),
            ctx,
        )
        .for_each(|_| async {})
        .await;
}

async fn reconcile(rev: &MeshRevision, ctx: &Context) -> Result<Action, Error> {
    let client = &ctx.client;
    let api: Api<MeshRevision> = Api::all(client.clone());
    let names = Names::of(rev);
    let in_use = users(client, &names.revision).await?;
    let old = rev.status.clone().unwrap_or_default();
    let use_condition = match &in_use {
        Some(by) => condition(IN_USE, true, "InUse", format!("used by {by}")),
        None => condition(
            IN_USE,
            false,
            "NotInUse",
            "no namespace, pod or tag uses it",
        ),
    };

    if rev.metadata.deletion_timestamp.is_some() {
        if let Some(by) = &in_use {
            let held = condition(
                IN_USE,
                true,
                "DeletionHeld",
                format!("not deleted while {by} uses it; move them to another revision"),
            );
            let mut conditions = old.observed.conditions.clone();
            conditions.retain(|c| c.type_ != IN_USE);
            conditions.push(held);
            let mut observed = status::observed(&old.observed, conditions, rev.metadata.generation);
            observed.state = Some("DeletionHeld".into());
            let status = MeshRevisionStatus { observed };
            apply::status(&api, rev, Some(&old), &status).await?;
            return Ok(Action::requeue(Duration::from_secs(10)));
        }
        delete_children(client, &names).await?;
        apply::remove_finalizer(&api, rev).await?;
        return Ok(Action::await_change());
    }
    apply::add_finalizer(&api, rev).await?;

    let deployment = match check(rev) {
        Ok(()) => install(client, rev, &names).await,
        Err(e) => Err(e),
    };
    let deployment = match deployment {
        Ok(deployment) => deployment,
        Err(e) => {
            // Reported in the status; the error goes back to the controller for the
            // event, the metric and the back-off.
            let conditions = vec![
                condition(RECONCILED, false, e.reason(), e.to_string()),
                condition(
                    READY,
                    false,
                    "NotReconciled",
                    "the revision is not installed",
                ),
                use_condition,
            ];
            let status = MeshRevisionStatus {
                observed: status::observed(&old.observed, conditions, rev.metadata.generation),
            };
            let _ = apply::status(&api, rev, Some(&old), &status).await;
            return Err(e);
        }
    };
    let conditions = vec![
        condition(RECONCILED, true, "Reconciled", ""),
        deployment_ready(&deployment),
        use_condition,
    ];
    let status = MeshRevisionStatus {
        observed: status::observed(&old.observed, conditions, rev.metadata.generation),
    };
    apply::status(&api, rev, Some(&old), &status).await?;
    Ok(Action::requeue(RESYNC))
}

/// What the spec must satisfy before anything is installed.
fn check(rev: &MeshRevision) -> Result<(), Error> {
    let object = format!("MeshRevision {}", rev.name_any());
    if let Some(mesh) = &rev.spec.values.mesh_config {
        let yaml = serde_saphyr::to_string(mesh).unwrap_or_default();
        MeshConfig::parse(&yaml).map_err(|e| Error::Invalid {
            object: object.clone(),
            field: "spec.values.meshConfig".into(),
            message: e.to_string(),
        })?;
    }
    if rev.spec.values.ca.mode == api::operator::CaMode::External
        && rev.spec.values.ca.external_address.is_none()
    {
        return Err(Error::Invalid {
            object,
            field: "spec.values.ca.externalAddress".into(),
            message: "mode External needs the external CA's address".into(),
        });
    }
    Ok(())
}

/// Applies every object of the revision; the applied Deployment.
async fn install(client: &Client, rev: &MeshRevision, names: &Names) -> Result<Deployment, Error> {
    let validators: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let failure_policy = (validators.get_opt(&names.validator()).await)
        .map_err(Error::kube(
            "reading",
            format!("ValidatingWebhookConfiguration {}", names.validator()),
        ))?
        .and_then(|v| v.webhooks?.into_iter().next()?.failure_policy);
    let RevisionObjects {
        service_account,
        cluster_role,
        cluster_role_binding,
        role,
        role_binding,
        mesh_config,
        deployment,
        service,
        pdb,
        validator,
        injector,
    } = render::revision(rev, failure_policy);
    apply::namespaced(client, &service_account).await?;
    apply::cluster(client, &cluster_role).await?;
    apply::cluster(client, &cluster_role_binding).await?;
    apply::namespaced(client, &role).await?;
    apply::namespaced(client, &role_binding).await?;
    apply::namespaced(client, &mesh_config).await?;
    let deployment = apply::namespaced(client, &deployment).await?;
    apply::namespaced(client, &service).await?;
    match pdb {
        Some(pdb) => drop(apply::namespaced(client, &pdb).await?),
        None => {
            let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &names.namespace);
            apply::delete(&pdbs, &names.istiod()).await?;
        }
    }
    apply::cluster(client, &validator).await?;
    apply::cluster(client, &injector).await?;
    Ok(deployment)
}

/// `Ready` as Sail reads it: the Deployment has as many ready replicas as it wants, and
/// wants some.
fn deployment_ready(
    deployment: &Deployment,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    let want = deployment.spec.replicas.unwrap_or(1);
    let ready = (deployment.status.as_ref())
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    if want > 0 && ready >= want {
        condition(
            READY,
            true,
            "DeploymentReady",
            format!("{ready}/{want} replicas ready"),
        )
    } else {
        condition(
            READY,
            false,
            "DeploymentNotReady",
            format!(
                "{ready}/{want} replicas of Deployment {} ready",
                deployment.name_any()
            ),
        )
    }
}

async fn delete_children(client: &Client, names: &Names) -> Result<(), Error> {
    let ns = &names.namespace;
    let c = || client.clone();
    apply::delete(
        &Api::<MutatingWebhookConfiguration>::all(c()),
        &names.injector(),
    )
    .await?;
    apply::delete(
        &Api::<ValidatingWebhookConfiguration>::all(c()),
        &names.validator(),
    )
    .await?;
    apply::delete(
        &Api::<PodDisruptionBudget>::namespaced(c(), ns),
        &names.istiod(),
    )
    .await?;
    apply::delete(&Api::<Service>::namespaced(c(), ns), &names.istiod()).await?;
    apply::delete(&Api::<Deployment>::namespaced(c(), ns), &names.istiod()).await?;
    apply::delete(&Api::<ConfigMap>::namespaced(c(), ns), &names.mesh_config()).await?;
    apply::delete(&Api::<RoleBinding>::namespaced(c(), ns), &names.istiod()).await?;
    apply::delete(&Api::<Role>::namespaced(c(), ns), &names.istiod()).await?;
    apply::delete(&Api::<ClusterRoleBinding>::all(c()), &names.cluster_role()).await?;
    apply::delete(&Api::<ClusterRole>::all(c()), &names.cluster_role()).await?;
    apply::delete(&Api::<ServiceAccount>::namespaced(c(), ns), &names.istiod()).await?;
    Ok(())
}

/// What uses `revision`, as Sail counts it: a tag pointing at it, a namespace labelled
/// with it (`istio-injection=enabled` meaning `default`), or an injected pod whose
/// `istio.io/rev` annotation names it.
pub async fn users(client: &Client, revision: &str) -> Result<Option<String>, Error> {
    let tags: Api<MeshRevisionTag> = Api::all(client.clone());
    let tags = (tags.list(&ListParams::default()).await)
        .map_err(Error::kube("listing", "MeshRevisionTags"))?;
    if let Some(tag) = (tags.iter())
        .find(|t| (t.status.as_ref()).and_then(|s| s.revision.as_deref()) == Some(revision))
    {
        return Ok(Some(format!("MeshRevisionTag {}", tag.name_any())));
    }
    if let Some(ns) = labelled_namespace(client, revision).await? {
        return Ok(Some(ns));
    }
    let pods: Api<Pod> = Api::all(client.clone());
    // Injected pods carry the tlsMode label; their revision is an annotation.
    let injected = (pods
        .list_metadata(&ListParams::default().labels("security.istio.io/tlsMode"))
        .await)
        .map_err(Error::kube("listing", "Pods"))?;
    let used = (injected.iter())
        .filter(|p| p.annotations().get("istio.io/rev").map(String::as_str) == Some(revision))
        .count();
    Ok((used > 0).then(|| format!("{used} pods")))
}

/// The first namespace selecting `name` (a revision or a tag) for injection.
pub async fn labelled_namespace(client: &Client, name: &str) -> Result<Option<String>, Error> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut selectors = vec![format!("istio.io/rev={name}")];
    if name == "default" {
        selectors.push("istio-injection=enabled".into());
    }
    for selector in selectors {
        let list = (namespaces
            .list_metadata(&ListParams::default().labels(&selector).limit(1))
            .await)
            .map_err(Error::kube("listing", "Namespaces"))?;
        if let Some(ns) = list.items.first() {
            return Ok(Some(format!("namespace {} ({selector})", ns.name_any())));
        }
    }
    Ok(None)
}
