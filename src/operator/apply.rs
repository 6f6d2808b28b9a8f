//! Writing to the API server: server-side apply with the operator's field manager, deletes
//! that tolerate absence, the finalizer, and status written only when it changed.

use std::fmt::Debug;

use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Error, FINALIZER};
use crate::operator::render::MANAGER;

fn object<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    let meta = obj.meta();
    match &meta.namespace {
        Some(ns) => format!("{} {ns}/{}", K::kind(&()), obj.name_any()),
        None => format!("{} {}", K::kind(&()), obj.name_any()),
    }
}

async fn apply_with<K>(api: Api<K>, obj: &K) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + Debug,
{
    let params = PatchParams::apply(MANAGER).force();
    api.patch(&obj.name_any(), &params, &Patch::Apply(obj))
        .await
        .map_err(Error::kube("applying", object(obj)))
}

/// Applies a namespaced object (its namespace from its metadata).
pub async fn namespaced<K>(client: &Client, obj: &K) -> Result<K, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug,
{
    let ns = obj.meta().namespace.clone().unwrap_or_default();
    apply_with(Api::namespaced(client.clone(), &ns), obj).await
}

/// Applies a cluster-scoped object.
pub async fn cluster<K>(client: &Client, obj: &K) -> Result<K, Error>
where
    K: Resource<DynamicType = (), Scope = ClusterResourceScope>
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug,
{
    apply_with(Api::all(client.clone()), obj).await
}

/// Deletes `name` through `api`; true if it existed.
pub async fn delete<K>(api: &Api<K>, name: &str) -> Result<bool, Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(Error::Kube {
            action: "deleting",
            object: format!("{} {name}", K::kind(&())),
            source: e,
        }),
    }
}

/// Adds the operator's finalizer to `obj` if it lacks it.
pub async fn add_finalizer<K>(api: &Api<K>, obj: &K) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Debug,
{
    if obj.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(());
    }
    let mut finalizers = obj.finalizers().to_vec();
    finalizers.push(FINALIZER.into());
    set_finalizers(api, obj, finalizers).await
}

/// Removes the operator's finalizer, letting the API server delete `obj`.
pub async fn remove_finalizer<K>(api: &Api<K>, obj: &K) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Debug,
{
    let finalizers: Vec<String> = (obj.finalizers().iter())
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    set_finalizers(api, obj, finalizers).await
}

async fn set_finalizers<K>(api: &Api<K>, obj: &K, finalizers: Vec<String>) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Debug,
{
    // The resourceVersion makes a concurrent change fail (and be retried) rather than be
    // overwritten.
    let patch = serde_json::json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": obj.resource_version(),
    }});
    match api
        .patch(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(Error::kube("writing the finalizer of", object(obj))(e)),
    }
}

/// Writes `status` into `obj`'s status subresource unless it already holds it.
pub async fn status<K, S>(
    api: &Api<K>,
    obj: &K,
    current: Option<&S>,
    status: &S,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Debug,
    S: Serialize + PartialEq,
{
    if current == Some(status) {
        return Ok(());
    }
    let patch = serde_json::json!({ "status": status });
    api.patch_status(
        &obj.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map(drop)
    .map_err(Error::kube("writing the status of", object(obj)))
}

/// The cluster-scoped owners of kind `K` that `child` names (kube's own owner mapping
/// would look for them in the child's namespace).
pub fn owners<K, C>(child: C) -> Vec<ObjectRef<K>>
where
    K: Resource<DynamicType = ()>,
    C: Resource,
{
    (child.owner_references().iter())
        .filter(|o| o.kind == K::kind(&()) && o.api_version == K::api_version(&()))
        .map(|o| ObjectRef::new(&o.name))
        .collect()
}

/// The injection selection of each namespace seen (`istio.io/rev`, with
/// `istio-injection=enabled` as `default`), so that a namespace's change names the
/// revisions or tags it selected before as well as those it selects now.
#[derive(Default)]
pub struct Selections(std::sync::Mutex<std::collections::HashMap<String, Vec<String>>>);

impl Selections {
    /// What `ns` selected before this change and selects now (nothing once deleted).
    pub fn changed<K: Resource<DynamicType = ()>>(
        &self,
        ns: &kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::Namespace>,
    ) -> Vec<ObjectRef<K>> {
        let labels = ns.labels();
        let mut now: Vec<String> = labels.get("istio.io/rev").cloned().into_iter().collect();
        if labels
            .get("istio-injection")
            .is_some_and(|v| v == "enabled")
        {
            now.push("default".into());
        }
        if ns.metadata.deletion_timestamp.is_some() {
            now.clear();
        }
        let mut seen = self.0.lock().unwrap();
        let before = match now.is_empty() {
            true => seen.remove(&ns.name_any()),
            false => seen.insert(ns.name_any(), now.clone()),
        };
        (before.into_iter().flatten())
            .chain(now)
            .map(|name| ObjectRef::new(&name))
            .collect()
    }
}
