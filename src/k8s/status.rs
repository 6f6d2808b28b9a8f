//! Status written back to Istio objects: a `Reconciled` condition with the generation it
//! describes, Istio's `validationMessages`, and the reason in words when an object was
//! rejected or refers to something missing. Only the leader of a revision writes; writes
//! are server-side apply (field manager `meshd`), batched after each push, and made only
//! when an object's desired status differs from what this replica last wrote.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::filesource::IssueBoard;
use crate::k8s::Seen;
use model::Store;
use model::config::{ConfigIssue, Kind, Level, ObjectKey};
use model::push_context::ModelIssue;
use xds::push::{ChangeLog, Push};
use xds::{Rejection, XdsShared};

/// Writes in flight at once.
const CONCURRENT_WRITES: usize = 8;

/// One instance of an object: its key and `metadata.uid`.
type Instance = (ObjectKey, String);

pub struct StatusWriter {
    pub client: Client,
    pub store: Arc<RwLock<Store>>,
    pub issues: IssueBoard,
    /// The instance and latest generation seen per object, accepted or not.
    pub generations: Arc<RwLock<HashMap<ObjectKey, Seen>>>,
    pub pushes: watch::Receiver<Arc<Push>>,
    /// Connected proxies and how far each is in sync (for the ACK count).
    pub xds: Arc<XdsShared>,
    pub change_log: ChangeLog,
    pub leader: watch::Receiver<bool>,
}

/// The status an object should carry.
/// `in_sync`: how many of the connected proxies hold the configuration this generation
/// produced, out of how many.
pub fn desired_status(
    generation: Option<i64>,
    errors: &[&ConfigIssue],
    warnings: &[String],
    in_sync: (usize, usize),
    rejection: Option<&Rejection>,
) -> Value {
    let proxies = format!("{}/{} connected proxies in sync", in_sync.0, in_sync.1);
    let (status, reason, message) = if !errors.is_empty() {
        let text: Vec<String> = errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect();
        (
            "False",
            "Invalid",
            format!(
                "rejected, the last valid version stays in force: {}",
                text.join("; ")
            ),
        )
    } else if let Some(r) = rejection {
        let message = format!(
            "proxy {} rejected the configuration built from this object (it keeps its last accepted configuration): {}",
            r.proxy, r.message
        );
        ("False", "Rejected", message)
    } else if !warnings.is_empty() {
        (
            "True",
            "AcceptedWithWarnings",
            format!("{}; {proxies}", warnings.join("; ")),
        )
    } else {
        (
            "True",
            "Accepted",
            format!("accepted and translated; {proxies}"),
        )
    };
    let mut messages: Vec<Value> = Vec::new();
    if rejection.is_some() {
        messages.push(
            json!({"level": "ERROR", "type": {"code": "MESHD0001", "name": "RejectedByProxy"}}),
        );
    }
    for _ in errors {
        messages
            .push(json!({"level": "ERROR", "type": {"code": "IST0002", "name": "InvalidField"}}));
    }
    for _ in warnings {
        messages.push(json!({"level": "WARNING", "type": {"code": "IST0101", "name": "ReferencedResourceNotFound"}}));
    }
    let mut condition =
        json!({"type": "Reconciled", "status": status, "reason": reason, "message": message});
    let mut out = json!({"conditions": [], "validationMessages": messages});
    if let Some(g) = generation {
        condition["observedGeneration"] = json!(g);
        out["observedGeneration"] = json!(g);
    }
    out["conditions"] = json!([condition]);
    out
}

impl StatusWriter {
    pub async fn run(mut self) {
        // What was written, per object instance (key and uid): a recreated object is new.
        let mut written: HashMap<Instance, Value> = HashMap::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                changed = self.pushes.changed() => if changed.is_err() { return },
                // ACKs arrive after pushes: look again for changed in-sync counts.
                _ = tick.tick() => {}
                changed = self.leader.changed() => {
                    if changed.is_err() { return }
                    written.clear(); // a new leader rewrites what it cannot vouch for
                }
            }
            // Batch: let a burst of pushes settle.
            tokio::time::sleep(Duration::from_millis(200)).await;
            if !*self.leader.borrow_and_update() {
                continue;
            }
            let push = self.pushes.borrow_and_update().clone();
            let desired: HashMap<_, _> = self.desired(&push.context.issues).into_iter().collect();
            written.retain(|k, _| desired.contains_key(k));
            let todo: Vec<(Instance, Value)> = desired
                .into_iter()
                .filter(|(k, v)| written.get(k) != Some(v))
                .collect();
            let this = &self;
            let results: Vec<(Instance, Value, Result<(), kube::Error>)> =
                futures::stream::iter(todo)
                    .map(|(key, status)| async move {
                        let r = this.write(&key.0, &status).await;
                        (key, status, r)
                    })
                    .buffer_unordered(CONCURRENT_WRITES)
                    .collect()
                    .await;
            for (key, status, result) in results {
                match result {
                    Ok(()) => {
                        written.insert(key, status);
                    }
                    Err(e) => tracing::warn!(object = %key.0, "writing status: {e}"),
                }
            }
        }
    }

    /// The status each object instance (key and uid) should carry.
    fn desired(&self, model_issues: &[ModelIssue]) -> Vec<(Instance, Value)> {
        let generations = self.generations.read().unwrap();
        let proxies: Vec<u64> = self
            .xds
            .sync_status()
            .iter()
            .map(|s| s.in_sync_push)
            .collect();
        let rejections = self.xds.rejections();
        let change_log = self.change_log.lock().unwrap();
        let board = self.issues.read().unwrap();
        let mut keys: Vec<ObjectKey> = self
            .store
            .read()
            .unwrap()
            .iter()
            .map(|o| o.key.clone())
            .filter(|k| k.kind.is_istio())
            .collect();
        for issues in board.values() {
            for i in issues {
                let kind = i
                    .kind
                    .as_deref()
                    .and_then(|k| Kind::ALL.into_iter().find(|x| x.as_str() == k));
                if let (Some(kind), Some(ns), Some(name)) = (kind, &i.namespace, &i.name)
                    && kind.is_istio()
                {
                    keys.push(ObjectKey {
                        kind,
                        namespace: ns.clone(),
                        name: name.clone(),
                    });
                }
            }
        }
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .map(|key| {
                let errors: Vec<&ConfigIssue> = board
                    .get(&format!("kubernetes:{key}"))
                    .into_iter()
                    .flatten()
                    .filter(|i| i.level == Level::Error)
                    .collect();
                let object = key.to_string();
                let warnings: Vec<String> = model_issues
                    .iter()
                    .filter(|i| i.object == object)
                    .map(|i| format!("{}: {}", i.field, i.message))
                    .collect();
                let since = change_log.get(&key).copied().unwrap_or(1);
                let in_sync = (
                    proxies.iter().filter(|p| **p >= since).count(),
                    proxies.len(),
                );
                // A NACK counts while it concerns the object's current generation.
                let rejection = rejections.get(&key).filter(|r| r.push >= since);
                let seen = generations.get(&key).cloned().unwrap_or_default();
                let status =
                    desired_status(seen.generation, &errors, &warnings, in_sync, rejection);
                ((key, seen.uid), status)
            })
            .collect()
    }

    async fn write(&self, key: &ObjectKey, status: &Value) -> Result<(), kube::Error> {
        apply_status(&self.client, key, "meshd", status).await
    }
}

/// Server-side applies `status` (the fields `manager` owns) to the object `key`, taking
/// them over from any other manager.
pub async fn apply_status(
    client: &Client,
    key: &ObjectKey,
    manager: &str,
    status: &Value,
) -> Result<(), kube::Error> {
    let ar = super::api_resource(key.kind);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &key.namespace, &ar);
    let body = json!({"apiVersion": ar.api_version, "kind": ar.kind, "status": status});
    let params = PatchParams::apply(manager).force();
    api.patch_status(&key.name, &params, &Patch::Apply(&body))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejected_object_says_why_and_an_accepted_one_names_its_generation() {
        let err = ConfigIssue {
            level: Level::Error,
            file: "kubernetes:virtualservices".into(),
            document: 0,
            kind: Some("VirtualService".into()),
            namespace: Some("shop".into()),
            name: Some("front".into()),
            field: "spec.http[0].match[0].uri.regex".into(),
            message: "invalid regex".into(),
        };
        let s = desired_status(Some(4), &[&err], &[], (0, 0), None);
        assert_eq!(s["conditions"][0]["status"], "False");
        assert_eq!(s["conditions"][0]["observedGeneration"], 4);
        assert!(
            s["conditions"][0]["message"]
                .as_str()
                .unwrap()
                .contains("spec.http[0].match[0].uri.regex: invalid regex")
        );
        assert_eq!(s["validationMessages"][0]["level"], "ERROR");
        let ok = desired_status(Some(2), &[], &[], (2, 3), None);
        let text = ok["conditions"][0]["message"].as_str().unwrap().to_string();
        assert!(text.ends_with("2/3 connected proxies in sync"), "{text}");
        assert_eq!(
            (
                ok["conditions"][0]["status"].as_str(),
                ok["observedGeneration"].as_i64()
            ),
            (Some("True"), Some(2))
        );
    }
}
