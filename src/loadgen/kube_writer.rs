//! Writes the simulated mesh to a Kubernetes API server: every object of a YAML document
//! set by server-side apply (field manager `meshd-loadgen`), as `kubectl apply
//! --server-side` would.

use std::path::Path;

use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;

use crate::config::Kind;

pub struct KubeWriter {
    client: Client,
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
        Ok(KubeWriter { client })
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
        let kind_name = doc["kind"].as_str().unwrap_or_default();
        let api_version = doc["apiVersion"].as_str().unwrap_or_default();
        let (kind, _) = Kind::from_api(api_version, kind_name)
            .ok_or_else(|| format!("{api_version} {kind_name} is not a kind meshd reads"))?;
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        let ar = crate::k8s::api_resource(kind);
        let api: Api<DynamicObject> = match doc["metadata"]["namespace"].as_str() {
            Some(ns) if kind.namespaced() => Api::namespaced_with(self.client.clone(), ns, &ar),
            _ => Api::all_with(self.client.clone(), &ar),
        };
        let params = PatchParams::apply("meshd-loadgen").force();
        api.patch(name, &params, &Patch::Apply(doc))
            .await
            .map_err(|e| format!("{kind_name} {name}: {e}"))?;
        Ok(())
    }
}
