//! Writes the simulated mesh to a Kubernetes API server: every object of a YAML document
//! set by server-side apply (field manager `meshd-loadgen`), as `kubectl apply
//! --server-side` would, with each kind's resource found by discovery as kubectl finds it.

use std::collections::HashMap;
use std::path::Path;

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{self, Scope};
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::Mutex;

pub struct KubeWriter {
    client: Client,
    /// Each kind's resource and whether it is namespaced, as discovered.
    resources: Mutex<HashMap<GroupVersionKind, (ApiResource, bool)>>,
}

impl KubeWriter {
    /// A client for the cluster `kubeconfig` names (its current context).
    pub async fn connect(kubeconfig: &Path) -> Result<KubeWriter, String> {
        let what = |e: &dyn std::fmt::Display| format!("kubeconfig {}: {e}", kubeconfig.display());
        let file = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| what(&e))?;
        let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
            .await
            .map_err(|e| what(&e))?;
        let client = Client::try_from(config).map_err(|e| what(&e))?;
        Ok(KubeWriter {
            client,
            resources: Mutex::default(),
        })
    }

    /// Applies every document of `yaml`, in order.
    pub async fn apply_yaml(&self, yaml: &str) -> Result<(), String> {
        let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).map_err(|e| e.to_string())?;
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            self.apply(&doc).await?;
        }
        Ok(())
    }

    async fn apply(&self, doc: &Value) -> Result<(), String> {
        let kind = doc["kind"].as_str().unwrap_or_default();
        let api_version = doc["apiVersion"].as_str().unwrap_or_default();
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (ar, namespaced) = self.resource(&gvk).await?;
        let api: Api<DynamicObject> = match doc["metadata"]["namespace"].as_str() {
            Some(ns) if namespaced => Api::namespaced_with(self.client.clone(), ns, &ar),
            _ => Api::all_with(self.client.clone(), &ar),
        };
        let params = PatchParams::apply("meshd-loadgen").force();
        api.patch(name, &params, &Patch::Apply(doc))
            .await
            .map_err(|e| format!("{kind} {name}: {e}"))?;
        Ok(())
    }

    async fn resource(&self, gvk: &GroupVersionKind) -> Result<(ApiResource, bool), String> {
        let mut resources = self.resources.lock().await;
        if let Some(found) = resources.get(gvk) {
            return Ok(found.clone());
        }
        let (ar, caps) = discovery::pinned_kind(&self.client, gvk)
            .await
            .map_err(|e| format!("{}/{} {}: {e}", gvk.group, gvk.version, gvk.kind))?;
        let found = (ar, caps.scope == Scope::Namespaced);
        resources.insert(gvk.clone(), found.clone());
        Ok(found)
    }
}
