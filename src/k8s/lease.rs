//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several replicas of a
//! revision exactly one writes status. The holder renews every third of the lease
//! duration; another replica takes over once a lease has not been renewed for a whole
//! duration. Optimistic concurrency (resourceVersion) settles races.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;

pub struct LeaderElection {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl LeaderElection {
    pub fn new(
        client: Client,
        namespace: &str,
        name: String,
        identity: String,
        duration: Duration,
    ) -> LeaderElection {
        LeaderElection {
            api: Api::namespaced(client, namespace),
            name,
            identity,
            duration,
        }
    }

    /// Runs the election forever; the receiver says whether this replica leads now.
    pub fn spawn(self) -> watch::Receiver<bool> {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            loop {
                let leading = match self.try_acquire_or_renew().await {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::warn!(lease = %self.name, "leader election: {e}");
                        false
                    }
                };
                tx.send_if_modified(|was| {
                    if *was != leading {
                        tracing::info!(lease = %self.name, identity = %self.identity, leading, "leadership changed");
                        *was = leading;
                        true
                    } else {
                        false
                    }
                });
                tokio::time::sleep(self.duration / 3).await;
            }
        });
        rx
    }

    async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let seconds = self.duration.as_secs().max(1) as i32;
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(e) if is_conflict(&e) => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let mine = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        let duration = i64::from(spec.lease_duration_seconds.unwrap_or(seconds));
        let expired = spec
            .renew_time
            .as_ref()
            .is_none_or(|t| now.as_second() - t.0.as_second() > duration);
        if !mine && !expired && spec.holder_identity.is_some() {
            return Ok(false);
        }
        if !mine {
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(self.identity.clone());
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(seconds);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }
}
