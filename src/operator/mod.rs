//! `meshd operator`: reconciles `operator.meshd.io` resources into control-plane revisions,
//! as the Sail Operator reconciles `Istio`, `IstioRevision` and `IstioRevisionTag`.
//!
//! - [`mesh`]: a `Mesh` becomes its `MeshRevision`s (`InPlace` or `RevisionBased`); unused
//!   old revisions are removed after the grace period.
//! - [`revision`]: a `MeshRevision` becomes its ServiceAccount, RBAC, mesh ConfigMap,
//!   Deployment, Service, PodDisruptionBudget and webhook configurations ([`render`]).
//! - [`tag`]: a `MeshRevisionTag` becomes its `istio-revision-tag-TAG` injector.
//!
//! Every object is written by server-side apply with one field manager (`meshd-operator`)
//! and carries an owner reference to what made it. Each kind has a finalizer that deletes
//! its children itself, so that nothing depends on a garbage collector, and that holds a
//! revision (or mesh) whose revision namespaces or pods still use.

mod apply;
mod mesh;
mod metrics;
pub mod render;
mod revision;
pub mod status;
mod tag;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};

pub use metrics::OperatorMetrics;

/// The finalizer each operator kind carries.
pub const FINALIZER: &str = "operator.meshd.io/finalizer";

/// How the operator runs.
#[derive(Clone, Debug)]
pub struct OperatorOptions {
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub monitoring_address: SocketAddr,
    /// The name events are reported under (the operator's pod).
    pub instance: String,
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object's spec cannot be installed as written.
    #[error("{object}: {field}: {message}")]
    Invalid {
        object: String,
        field: String,
        message: String,
    },
    /// The API server refused or could not be reached.
    #[error("{action} {object}: {source}")]
    Kube {
        action: &'static str,
        object: String,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// The reason conditions and events carry.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Invalid { .. } => "InvalidSpec",
            Error::Kube { .. } => "ApiError",
        }
    }

    pub(crate) fn kube(
        action: &'static str,
        object: impl Into<String>,
    ) -> impl FnOnce(kube::Error) -> Error {
        let object = object.into();
        move |source| Error::Kube {
            action,
            object,
            source,
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub metrics: OperatorMetrics,
    recorder: Recorder,
    /// Consecutive failures per controller and object, for the back-off.
    failures: Mutex<HashMap<(&'static str, String), u32>>,
}

impl Context {
    pub fn new(client: Client, instance: &str) -> Context {
        let reporter = Reporter {
            controller: render::MANAGER.into(),
            instance: Some(instance.into()),
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics: OperatorMetrics::default(),
            failures: Mutex::default(),
        }
    }

    /// Runs one reconcile of `controller`, timing and counting it, and reporting a
    /// failure as a Warning event on the object.
    async fn reconcile<K, F>(
        &self,
        controller: &'static str,
        obj: &K,
        run: F,
    ) -> Result<Action, Error>
    where
        K: Resource<DynamicType = ()>,
        F: Future<Output = Result<Action, Error>>,
    {
        let start = std::time::Instant::now();
        let result = run.await;
        self.metrics
            .observe(controller, start.elapsed(), result.is_ok());
        let key = (controller, obj.name_any());
        match &result {
            Ok(_) => {
                self.failures.lock().unwrap().remove(&key);
            }
            Err(e) => {
                tracing::warn!("{controller} {}: {e}", obj.name_any());
                let event = Event {
                    type_: EventType::Warning,
                    reason: e.reason().into(),
                    note: Some(e.to_string()),
                    action: "Reconcile".into(),
                    secondary: None,
                };
                if let Err(e) = self.recorder.publish(&event, &obj.object_ref(&())).await {
                    tracing::debug!("publishing an event: {e}");
                }
            }
        }
        result
    }

    /// The back-off after a failed reconcile: 1 s, doubling per consecutive failure of
    /// the same object, at most 5 min.
    fn backoff(&self, controller: &'static str, name: String) -> Action {
        let mut failures = self.failures.lock().unwrap();
        let n = failures.entry((controller, name)).or_default();
        *n = (*n + 1).min(9);
        Action::requeue(Duration::from_secs(1 << (*n - 1)).min(Duration::from_secs(300)))
    }
}

/// Runs the three controllers and the monitoring server until the process is stopped.
pub async fn run(options: OperatorOptions) -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    let ctx = Arc::new(Context::new(client.clone(), &options.instance));
    let listener = tokio::net::TcpListener::bind(options.monitoring_address).await?;
    tracing::info!("meshd operator: metrics on {}", listener.local_addr()?);
    let monitoring = metrics::serve(listener, ctx.clone());
    tokio::select! {
        () = mesh::run(client.clone(), ctx.clone()) => {}
        () = revision::run(client.clone(), ctx.clone()) => {}
        () = tag::run(client, ctx.clone()) => {}
        r = monitoring => r?,
    }
    Ok(())
}
