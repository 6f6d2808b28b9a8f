//! The `Mesh` controller: a mesh becomes its revisions. `InPlace` keeps one revision named
//! after the mesh; `RevisionBased` makes `MESH-vX-Y-Z` per version and removes an old
//! revision once it has not been in use for the grace period.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use api::operator::{
    Mesh, MeshRevision, MeshRevisionSpec, MeshStatus, RevisionCounts, UpdateStrategyType,
};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use super::render::{self, MESH_LABEL};
use super::status::{self, IN_USE, READY, RECONCILED, condition};
use super::{Context, Error, apply};

const CONTROLLER: &str = "mesh";

/// Runs the controller until its watches end.
pub async fn run(client: Client, ctx: Arc<Context>) {
    Controller::new(Api::<Mesh>::all(client.clone()), Default::default())
        .owns(Api::<MeshRevision>::all(client), watcher::Config::default())
        .shutdown_on_signal()
        .run(
            |mesh, ctx: Arc<Context>| async move {
                let run = reconcile(&mesh, &ctx);
                ctx.reconcile(CONTROLLER, &*mesh, run).await
            },
            |mesh, _, ctx| ctx.backoff(CONTROLLER, mesh.name_any()),
            ctx,
        )
        .for_each(|_| async {})
        .await;
}

/// The revision a mesh runs now: its own name (`InPlace`), or `NAME-vX-Y-Z`.
pub fn active_revision(mesh: &Mesh) -> String {
    let name = mesh.name_any();
    match mesh.spec.update_strategy.type_ {
        UpdateStrategyType::InPlace => name,
        UpdateStrategyType::RevisionBased => {
            let version = mesh.spec.version.trim_start_matches('v').replace('.', "-");
            format!("{name}-v{version}")
        }
    }
}

async fn reconcile(mesh: &Mesh, ctx: &Context) -> Result<Action, Error> {
    let client = &ctx.client;
    let meshes: Api<Mesh> = Api::all(client.clone());
    let revisions: Api<MeshRevision> = Api::all(client.clone());
    let selector = format!("{MESH_LABEL}={}", mesh.name_any());
    let owned = (revisions
        .list(&ListParams::default().labels(&selector))
        .await)
        .map_err(Error::kube("listing", "MeshRevisions"))?
        .items;

    if mesh.metadata.deletion_timestamp.is_some() {
        // Each revision's own finalizer holds it while it is used.
        for rev in &owned {
            if rev.metadata.deletion_timestamp.is_none() {
                apply::delete(&revisions, &rev.name_any()).await?;
            }
        }
        if owned.is_empty() {
            apply::remove_finalizer(&meshes, mesh).await?;
            return Ok(Action::await_change());
        }
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    apply::add_finalizer(&meshes, mesh).await?;

    let active = active_revision(mesh);
    let revision = MeshRevision {
        metadata: ObjectMeta {
            name: Some(active.clone()),
            labels: Some(BTreeMap::from([
                (MESH_LABEL.into(), mesh.name_any()),
                (
                    "app.kubernetes.io/managed-by".into(),
                    render::MANAGER.into(),
                ),
            ])),
            owner_references: Some(vec![render::owner(mesh)]),
            ..ObjectMeta::default()
        },
        spec: MeshRevisionSpec {
            version: mesh.spec.version.clone(),
            namespace: mesh.spec.namespace.clone(),
            values: mesh.spec.values.clone(),
        },
        status: None,
    };
    let applied = apply::cluster(client, &revision).await;
    let old = mesh.status.clone().unwrap_or_default();
    let mut conditions = vec![match &applied {
        Ok(_) => condition(RECONCILED, true, "Reconciled", ""),
        Err(e) => condition(RECONCILED, false, e.reason(), e.to_string()),
    }];
    let active_status = (owned.iter())
        .find(|r| r.name_any() == active)
        .and_then(|r| r.status.clone())
        .unwrap_or_default();
    conditions.push(
        match status::get(&active_status.observed.conditions, READY) {
            Some(c) => condition(READY, c.status == "True", &c.reason, c.message.clone()),
            None => condition(
                READY,
                false,
                "RevisionNotReady",
                format!("MeshRevision {active} reports no readiness yet"),
            ),
        },
    );

    // Old revisions go once unused for the grace period.
    let grace = Duration::from_secs(
        mesh.spec
            .update_strategy
            .inactive_revision_deletion_grace_period_seconds,
    );
    let mut next = Duration::from_secs(60);
    for rev in owned.iter().filter(|r| r.name_any() != active) {
        let Some(unused) = (rev.status.as_ref())
            .and_then(|s| status::get(&s.observed.conditions, IN_USE).cloned())
            .filter(|c| c.status == "False")
        else {
            continue;
        };
        let idle = Timestamp::now().duration_since(unused.last_transition_time.0);
        let idle = Duration::try_from(idle).unwrap_or_default();
        if idle >= grace {
            tracing::info!(
                "mesh {}: removing unused revision {}",
                mesh.name_any(),
                rev.name_any()
            );
            apply::delete(&revisions, &rev.name_any()).await?;
        } else {
            next = next.min(grace - idle + Duration::from_millis(100));
        }
    }

    let count = |type_: &str| {
        owned
            .iter()
            .filter(|r| {
                (r.status.as_ref()).is_some_and(|s| status::is_true(&s.observed.conditions, type_))
            })
            .count() as i32
    };
    let status = MeshStatus {
        observed: status::observed(&old.observed, conditions, mesh.metadata.generation),
        active_revision_name: Some(active),
        revisions: RevisionCounts {
            total: owned.len() as i32,
            ready: count(READY),
            in_use: count(IN_USE),
        },
    };
    apply::status(&meshes, mesh, Some(&old), &status).await?;
    applied?;
    Ok(Action::requeue(next))
}
