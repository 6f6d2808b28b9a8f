//! The `MeshRevisionTag` controller: a tag becomes its `istio-revision-tag-TAG` injector
//! (as `istioctl tag set` writes it), pointing at a revision or at a mesh's active one and
//! following it when it moves.

use std::sync::Arc;
use std::time::Duration;

use api::operator::{Mesh, MeshRevision, MeshRevisionTag, MeshRevisionTagStatus, TargetKind};
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::ListParams;
use kube::core::PartialObjectMeta;
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use super::render::{self, MANAGER, Names};
use super::revision::labelled_namespace;
use super::status::{self, IN_USE, RECONCILED, condition};
use super::{Context, Error, apply};

const CONTROLLER: &str = "meshrevisiontag";

/// Runs the controller until its watches end.
pub async fn run(client: Client, ctx: Arc<Context>) {
    let controller = Controller::new(
        Api::<MeshRevisionTag>::all(client.clone()),
        Default::default(),
    );
    let tags = controller.store();
    let pointing_at = move |kind: TargetKind, name: String| {
        (tags.state().iter())
            .filter(|t| t.spec.target_ref.kind == kind && t.spec.target_ref.name == name)
            .map(|t| ObjectRef::from_obj(t.as_ref()))
            .collect::<Vec<_>>()
    };
    let to_mesh = pointing_at.clone();
    let selections = apply::Selections::default();
    let owned =
        watcher::Config::default().labels(&format!("app.kubernetes.io/managed-by={MANAGER}"));
    controller
        .watches(
            Api::<Mesh>::all(client.clone()),
            Default::default(),
            move |m| to_mesh(TargetKind::Mesh, m.name_any()),
        )
        .watches(
            Api::<MeshRevision>::all(client.clone()),
            Default::default(),
            move |r| pointing_at(TargetKind::MeshRevision, r.name_any()),
        )
        .watches(
            Api::<MutatingWebhookConfiguration>::all(client.clone()),
            owned,
            apply::owners,
        )
        // A namespace labelled with a tag makes it used.
        .watches(
            Api::<PartialObjectMeta<Namespace>>::all(client),
            watcher::Config::default(),
            move |ns| selections.changed(&ns),
        )
        .shutdown_on_signal()
        .run(
            |tag, ctx: Arc<Context>| async move {
                let run = reconcile(&tag, &ctx);
                ctx.reconcile(CONTROLLER, &*tag, run).await
            },
            |tag, _, ctx| ctx.backoff(CONTROLLER, tag.name_any()),
            ctx,
        )
        .for_each(|_| async {})
        .await;
}

/// The revision a tag points to, or why it points nowhere (reason, message).
async fn resolve(
    client: &Client,
    tag: &MeshRevisionTag,
) -> Result<Result<MeshRevision, (&'static str, String)>, Error> {
    let target = &tag.spec.target_ref;
    let revisions: Api<MeshRevision> = Api::all(client.clone());
    let revision = match target.kind {
        TargetKind::MeshRevision => target.name.clone(),
        TargetKind::Mesh => {
            let meshes: Api<Mesh> = Api::all(client.clone());
            let mesh = (meshes.get_opt(&target.name).await)
                .map_err(Error::kube("reading", format!("Mesh {}", target.name)))?;
            match mesh.and_then(|m| m.status?.active_revision_name) {
                Some(r) => r,
                None => {
                    return Ok(Err((
                        "TargetNotFound",
                        format!("Mesh {} has no active revision", target.name),
                    )));
                }
            }
        }
    };
    Ok(
        match (revisions.get_opt(&revision).await)
            .map_err(Error::kube("reading", format!("MeshRevision {revision}")))?
        {
            Some(r) => Ok(r),
            None => Err((
                "TargetNotFound",
                format!("MeshRevision {revision} does not exist"),
            )),
        },
    )
}

async fn reconcile(tag: &MeshRevisionTag, ctx: &Context) -> Result<Action, Error> {
    let client = &ctx.client;
    let api: Api<MeshRevisionTag> = Api::all(client.clone());
    let injectors: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let name = tag.name_any();
    // This tag's injectors (one, unless its revision moved namespace).
    let selector = format!("istio.io/tag={name},app.kubernetes.io/managed-by={MANAGER}");
    let existing = (injectors
        .list_metadata(&ListParams::default().labels(&selector))
        .await)
        .map_err(Error::kube("listing", "MutatingWebhookConfigurations"))?;

    if tag.metadata.deletion_timestamp.is_some() {
        for mwc in &existing {
            apply::delete(&injectors, &mwc.name_any()).await?;
        }
        apply::remove_finalizer(&api, tag).await?;
        return Ok(Action::await_change());
    }
    apply::add_finalizer(&api, tag).await?;

    let old = tag.status.clone().unwrap_or_default();
    let mut status = MeshRevisionTagStatus::default();
    let revisions: Api<MeshRevision> = Api::all(client.clone());
    let clash = (revisions.get_opt(&name).await)
        .map_err(Error::kube("reading", format!("MeshRevision {name}")))?
        .is_some();
    let reconciled = if clash {
        condition(
            RECONCILED,
            false,
            "NameAlreadyExists",
            format!("a MeshRevision is named {name}: a tag and a revision cannot share a name"),
        )
    } else {
        match resolve(client, tag).await? {
            Err((reason, message)) => condition(RECONCILED, false, reason, message),
            Ok(revision) => {
                let names = Names::of(&revision);
                let mwc = render::tag_injector(&name, &names, &render::owner(tag));
                apply::cluster(client, &mwc).await?;
                for stale in existing
                    .iter()
                    .filter(|m| m.name_any() != names.tag_injector(&name))
                {
                    apply::delete(&injectors, &stale.name_any()).await?;
                }
                status.revision = Some(names.revision);
                status.namespace = Some(names.namespace);
                condition(RECONCILED, true, "Reconciled", "")
            }
        }
    };
    let in_use = match labelled_namespace(client, &name).await? {
        Some(by) => condition(IN_USE, true, "InUse", format!("used by {by}")),
        None => condition(IN_USE, false, "NotInUse", "no namespace selects the tag"),
    };
    status.observed = status::observed(
        &old.observed,
        vec![reconciled, in_use],
        tag.metadata.generation,
    );
    apply::status(&api, tag, Some(&old), &status).await?;
    Ok(Action::requeue(Duration::from_secs(60)))
}
