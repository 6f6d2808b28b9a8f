//! `meshd serve`: wires the config source, the model, the push pipeline, the xDS server and
//! the monitoring port together, and runs them until SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::{mpsc, watch};

use crate::debug::{self, DebugState};
use crate::filesource::{FileSource, IssueBoard, IssueHook, OnChange};
use crate::k8s::ipallocate::{Allocator, IpAllocator};
use crate::k8s::lease::LeaderElection;
use crate::k8s::status::StatusWriter;
use crate::k8s::{KubeSource, Scope};
use crate::metrics::Metrics;
use crate::secure::{Security, SecurityOptions};
use model::Store;
use model::config::ObjectKey;
use model::config::{ConfigIssue, Level};
use std::collections::BTreeSet;
use xds::cache::ResourceCache;
use xds::push::{ChangeLog, ConfigEvent, PushSettings, build_push, debounce_loop};
use xds::{AdsService, XdsShared};

/// Where configuration comes from.
#[derive(Clone, Debug)]
pub enum Source {
    /// A directory of YAML, watched.
    ConfigDir(PathBuf),
    /// The Kubernetes API (kubeconfig or in-cluster config).
    Kubernetes(Scope),
}

#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub source: Source,
    /// The plaintext xDS port (15010); `None` turns it off.
    pub xds_address: Option<SocketAddr>,
    /// The secure port (15012) and the CA.
    pub security: SecurityOptions,
    pub monitoring_address: SocketAddr,
    /// Serve the `/debug` views to non-local callers too.
    pub remote_debug: bool,
    pub push: PushSettings,
    /// The revision this instance serves (`default` unless told otherwise).
    pub revision: String,
    /// Who writes status in Kubernetes mode.
    pub leader: LeaderOptions,
    /// Sidecar injection, served on the webhook port.
    pub inject: crate::inject::InjectOptions,
}

/// Leader election among the replicas of one revision (only the leader writes status).
#[derive(Clone, Debug)]
pub struct LeaderOptions {
    /// This replica's name in the Lease (`POD_NAME`).
    pub identity: String,
    /// Where the Lease lives (`POD_NAMESPACE`).
    pub namespace: String,
    pub lease_duration: Duration,
}

fn log_issue(metrics: &Metrics, issue: &ConfigIssue) {
    match issue.level {
        Level::Error => {
            let kind = issue.kind.clone().unwrap_or_else(|| "unknown".into());
            metrics
                .config_errors
                .get_or_create(&vec![("kind", kind)])
                .inc();
            tracing::error!("rejected config: {issue}");
        }
        Level::Warning => tracing::warn!("{issue}"),
    }
}

pub async fn run(opts: ServeOptions) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new());
    crate::metrics::count_panics(metrics.internal_errors.clone());
    let store = Arc::new(RwLock::new(control_plane_store()));
    let hook_metrics = metrics.clone();
    let hook: IssueHook = Arc::new(move |i| log_issue(&hook_metrics, i));
    let (event_tx, mut event_rx) = mpsc::unbounded_channel();
    let on_change: OnChange = Arc::new(move |keys: BTreeSet<ObjectKey>| {
        let _ = event_tx.send(ConfigEvent {
            at: Instant::now(),
            keys: keys.into_iter().collect(),
        });
    });
    let (shutdown_tx, shutdown_rx) = watch::channel(false);

    // Until the initial configuration is in, proxies see nothing and /ready says so.
    let change_log: ChangeLog = Arc::default();
    let cache = Arc::new(ResourceCache::new(&metrics.xds));
    let (push_tx, push_rx) = watch::channel(Arc::new(build_push(
        &store,
        None,
        0,
        Instant::now(),
        None,
        &metrics.push,
        cache.clone(),
    )));
    // Kubernetes mode learns the revision's tags (the source's tag watch); both share them.
    let revisions = match &opts.source {
        Source::Kubernetes(scope) => scope.revisions.clone(),
        Source::ConfigDir(_) => model::Revisions::new(&opts.revision),
    };
    let xds = XdsShared::new(metrics.xds.clone(), push_rx, &opts.push, revisions);
    let ready = Arc::new(AtomicBool::new(false));
    let issues: IssueBoard = Arc::default();
    let debug_state = DebugState {
        metrics: metrics.clone(),
        store: store.clone(),
        issues: issues.clone(),
        xds: xds.clone(),
        ready: ready.clone(),
    };
    xds.set_debug_views(debug::in_process(debug_state.clone()));
    let monitoring = tokio::net::TcpListener::bind(opts.monitoring_address)
        .await
        .with_context(|| format!("binding the monitoring port {}", opts.monitoring_address))?;
    let mut debug_shutdown = shutdown_rx.clone();
    let remote_debug = opts.remote_debug;
    let debug_task = tokio::spawn(async move {
        axum::serve(
            monitoring,
            debug::router(debug_state, remote_debug)
                .into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            let _ = debug_shutdown.changed().await;
        })
        .await
    });

    let client = match &opts.source {
        Source::ConfigDir(dir) => {
            anyhow::ensure!(
                dir.exists(),
                "config directory {} does not exist",
                dir.display()
            );
            let mut source =
                FileSource::new(dir.clone(), store.clone(), issues.clone(), hook.clone());
            let loaded = source.sync();
            tracing::info!(dir = %dir.display(), objects = loaded.len(), "initial configuration loaded");
            let watch_shutdown = shutdown_rx.clone();
            let on_change = on_change.clone();
            tokio::spawn(async move {
                if let Err(e) = source.watch(on_change, watch_shutdown).await {
                    tracing::error!(
                        "config directory watch stopped: {e:#}; serving the last loaded config"
                    );
                }
            });
            None
        }
        Source::Kubernetes(scope) => {
            let client = kube::Client::try_default()
                .await
                .context("no --config-dir was given and no Kubernetes configuration (kubeconfig or in-cluster) was found")?;
            let source = KubeSource::new(
                client.clone(),
                store.clone(),
                scope.clone(),
                issues.clone(),
                hook.clone(),
                metrics.sources.clone(),
            );
            source.start(on_change.clone());
            tracing::info!(revision = %scope.revisions.revision(), "waiting for the initial list of every kind");
            source.synced().await;
            tracing::info!(
                objects = store.read().unwrap().len(),
                "initial configuration loaded from Kubernetes"
            );
            let leader = LeaderElection::new(
                client.clone(),
                &opts.leader.namespace,
                format!("meshd-status-leader-{}", opts.revision),
                opts.leader.identity.clone(),
                opts.leader.lease_duration,
            )
            .spawn();
            if opts.push.ip_autoallocate {
                let allocator = IpAllocator {
                    client: client.clone(),
                    store: store.clone(),
                    pushes: xds.subscribe(),
                    leader: leader.clone(),
                    allocator: Allocator::from_env()?,
                };
                tokio::spawn(allocator.run());
            }
            let writer = StatusWriter {
                client: client.clone(),
                store: store.clone(),
                issues: issues.clone(),
                generations: source.generations.clone(),
                pushes: xds.subscribe(),
                xds: xds.clone(),
                change_log: change_log.clone(),
                leader,
            };
            tokio::spawn(writer.run());
            Some(client)
        }
    };
    // The kubelet versions native sidecars depend on (unknown without a cluster).
    let nodes = crate::inject::NodeVersions::default();
    let security = match opts.security.address {
        Some(_) => {
            let s = Security::start(&opts.security, client.clone(), &opts.leader.namespace).await?;
            if let (Some(client), Source::Kubernetes(scope)) = (&client, &opts.source) {
                let leader = LeaderElection::new(
                    client.clone(),
                    &opts.leader.namespace,
                    crate::k8s::root_cert::ELECTION.into(),
                    opts.leader.identity.clone(),
                    opts.leader.lease_duration,
                )
                .spawn();
                let writer = crate::k8s::root_cert::RootCertWriter {
                    client: client.clone(),
                    ca: s.ca.clone(),
                    name: opts.security.root_cert_configmap.clone(),
                    watched: scope.namespaces.clone(),
                    store: store.clone(),
                    leader,
                };
                tokio::spawn(writer.run());
            }
            if let (Some(client), Some(_)) = (&client, opts.security.webhook_address) {
                tokio::spawn(crate::k8s::injection::watch_nodes(
                    client.clone(),
                    nodes.clone(),
                ));
                if opts.inject.patch_ca_bundle {
                    tokio::spawn(crate::k8s::injection::keep_ca_bundle(
                        client.clone(),
                        opts.revision.clone(),
                        s.ca.clone(),
                    ));
                }
            }
            if let (Some(client), Some(_)) = (client, opts.security.webhook_address) {
                let (revision, ca) = (opts.revision.clone(), s.ca.clone());
                tokio::spawn(crate::k8s::webhook_ca::run(
                    client,
                    revision,
                    opts.leader.namespace.clone(),
                    ca,
                    metrics.validation.clone(),
                ));
            }
            Some(s)
        }
        None => None,
    };

    // The first push is built from everything loaded so far: the events that loading
    // queued are in it already, and pushing them again would make a second push that
    // claims to change every object (and a later NACK would blame them all).
    while event_rx.try_recv().is_ok() {}
    push_tx.send_replace(Arc::new(build_push(
        &store,
        None,
        1,
        Instant::now(),
        None,
        &metrics.push,
        cache,
    )));
    tokio::spawn(crate::resolve::run(
        xds.subscribe(),
        store.clone(),
        on_change.clone(),
        shutdown_rx.clone(),
    ));
    tokio::spawn(crate::jwks::run(
        xds.subscribe(),
        store.clone(),
        on_change.clone(),
        metrics.jwks.clone(),
        shutdown_rx.clone(),
    ));
    tokio::spawn(debounce_loop(
        event_rx,
        store.clone(),
        push_tx,
        opts.push.clone(),
        metrics.push.clone(),
        change_log,
    ));
    xds::joined::spawn_sweeper(xds.framing.runs.clone());

    let mut servers = Vec::new();
    if let Some(address) = opts.xds_address {
        let listener = transport::listen(address)
            .with_context(|| format!("binding the xDS port {address}"))?;
        let ads = tonic::service::Routes::new(AdsService::new(xds.clone()).into_server());
        let settings = xds.grpc_settings();
        let incoming = transport::plaintext::incoming(listener, xds.admission());
        let shutdown = shutdown_rx.clone();
        servers.push(tokio::spawn(transport::grpc::serve(
            incoming,
            ads,
            settings,
            |_| None,
            shutdown,
        )));
    }
    if let (Some(security), Some(address)) = (&security, opts.security.address) {
        let listener = transport::listen(address)
            .with_context(|| format!("binding the secure xDS port {address}"))?;
        servers.push(security.serve(listener, xds.clone(), metrics.clone(), shutdown_rx.clone()));
    }
    let mut webhook = None;
    if let (Some(security), Some(address)) = (&security, opts.security.webhook_address) {
        let listener = transport::listen(address)
            .with_context(|| format!("binding the webhook port {address}"))?;
        let state = crate::webhook::WebhookState {
            validation: metrics.validation.clone(),
            injector: Some(Arc::new(crate::inject::webhook::Injector {
                options: opts.inject.clone(),
                store: store.clone(),
                nodes: nodes.clone(),
                metrics: metrics.inject.clone(),
            })),
        };
        webhook =
            Some(security.serve_webhook(listener, metrics.clone(), state, shutdown_rx.clone())?);
    }
    tracing::info!(
        xds = ?opts.xds_address,
        secure_xds = ?opts.security.address,
        webhook = ?opts.security.webhook_address,
        monitoring = %opts.monitoring_address,
        "meshd serving"
    );
    ready.store(true, Ordering::Release);

    shutdown_signal().await;
    tracing::info!("shutting down");
    let _ = shutdown_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        for server in servers {
            let _ = server.await;
        }
        if let Some(webhook) = webhook {
            let _ = webhook.await;
        }
        let _ = debug_task.await;
    })
    .await;
    Ok(())
}

pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("BUG: SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// An empty store holding this process's environment, which configuration reads as
/// istiod reads its own (`PILOT_TRACE_SAMPLING`, tracing providers' `envName`).
fn control_plane_store() -> Store {
    let mut store = Store::default();
    store.set_environment(std::env::vars().collect());
    let sampling = store.environment_var(model::mesh::TRACE_SAMPLING_ENV);
    if let Err(e) = model::mesh::trace_sampling(sampling) {
        tracing::warn!("{e}");
    }
    store
}
