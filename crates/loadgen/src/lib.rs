//! `meshd loadgen`: a fleet simulator, outside the product (the `meshd` binary offers it
//! only with its `loadgen` feature). It writes a generated mesh into the config
//! directory a meshd serves (or starts that meshd itself), connects N simulated proxies
//! over real gRPC at a chosen rate, then makes changes one at a time and measures, per
//! proxy, the time from the change to the moment it holds the resource that reflects it.
//! A change carries a marker string (a header value, an endpoint address) that only the
//! resources built from it contain, so "converged" means the bytes arrived, not that a
//! response did. With `--kubernetes` the mesh lives in a Kubernetes API server instead
//! (`--kubeconfig`; the test bed's real kube-apiserver in the tests and benchmarks): meshd
//! watches it through kube-runtime, and the mesh and every change are written to it by
//! server-side apply (`kube_writer`).

mod args;
mod frame;
mod h2c;
mod kube_writer;
mod meshd;
mod node;
mod percentiles;
pub mod process;
pub mod proxy;
mod read_ahead;
mod response;
mod scenarios;
mod secure;
mod types;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Map, Value as Json};
use tokio::sync::watch;

pub use self::args::*;
use self::kube_writer::KubeWriter;
use self::meshd::{
    Probe, Spawned, meshd_figures, metric_sum, out_of_sync, spawn_meshd, with_identity,
};
use self::node::node;
pub use self::percentiles::Percentiles;
use self::proxy::{Marker, ProxyStats, Spec};
use self::scenarios::*;
use testkit::mesh::Shape;

#[derive(Debug, Serialize)]
struct ChangeReport {
    kind: Change,
    services: Vec<String>,
    affected: usize,
    converged: usize,
    convergence_ms: Percentiles,
    bytes_per_affected_proxy: f64,
    responses_per_affected_proxy: f64,
    /// Proxies the change does not concern that were sent anything meanwhile (must be 0).
    unaffected_pushed: usize,
}

/// Where the mesh and its changes are written, and so what meshd watches.
enum Source {
    /// YAML files in the config directory.
    Files(PathBuf),
    /// A Kubernetes API server, and the kubeconfig that points at it.
    Kubernetes(KubeWriter, PathBuf),
}

impl Source {
    async fn new(args: &LoadgenArgs) -> Result<Source, String> {
        std::fs::create_dir_all(&args.config_dir).map_err(|e| e.to_string())?;
        match (&args.kubeconfig, args.kubernetes) {
            (Some(kubeconfig), true) => Ok(Source::Kubernetes(
                KubeWriter::connect(kubeconfig).await?,
                kubeconfig.clone(),
            )),
            _ => Ok(Source::Files(args.config_dir.clone())),
        }
    }

    /// The whole mesh (replacing the directory's *.yaml files), or its Namespaces and
    /// objects applied to the API server.
    async fn put_mesh(&self, shape: &Shape) -> Result<(), String> {
        match self {
            Source::Files(dir) => {
                for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())? {
                    let path = entry.map_err(|e| e.to_string())?.path();
                    if path.extension().is_some_and(|e| e == "yaml") {
                        std::fs::remove_file(&path).map_err(|e| e.to_string())?;
                    }
                }
            }
            Source::Kubernetes(api, _) => {
                let namespaces = (0..shape.namespaces)
                    .map(|n| format!("ns-{n}"))
                    .chain(["istio-system".to_string()]);
                for ns in namespaces {
                    api.apply_yaml(&format!(
                        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n"
                    ))
                    .await?;
                }
            }
        }
        for (name, yaml) in shape.files() {
            self.put(&name, &yaml).await?;
        }
        Ok(())
    }

    /// One file's objects: written then renamed into place, as editors and config sync
    /// tools do, or applied to the API server.
    async fn put(&self, name: &str, yaml: &str) -> Result<(), String> {
        match self {
            Source::Files(dir) => {
                let tmp = dir.join(format!(".{name}.tmp"));
                std::fs::write(&tmp, yaml).map_err(|e| e.to_string())?;
                std::fs::rename(&tmp, dir.join(name)).map_err(|e| e.to_string())
            }
            Source::Kubernetes(api, _) => api
                .apply_yaml(yaml)
                .await
                .map_err(|e| format!("{name}: {e}")),
        }
    }

    fn kubeconfig(&self) -> Option<&std::path::Path> {
        match self {
            Source::Files(_) => None,
            Source::Kubernetes(_, kubeconfig) => Some(kubeconfig),
        }
    }
}

/// Opens a simulated proxy's connection to meshd's xDS address: TCP with `TCP_NODELAY`, as
/// Envoy connects, read through [`read_ahead::ReadAhead`].
#[derive(Clone)]
struct Connector(String);

impl tonic::codegen::Service<tonic::codegen::http::Uri> for Connector {
    type Response = hyper_util::rt::TokioIo<read_ahead::ReadAhead<tokio::net::TcpStream>>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = std::io::Result<Self::Response>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: tonic::codegen::http::Uri) -> Self::Future {
        let address = self.0.clone();
        Box::pin(async move {
            let stream = connect_tcp(&address).await?;
            Ok(hyper_util::rt::TokioIo::new(read_ahead::ReadAhead::new(
                stream,
            )))
        })
    }
}

/// A simulated proxy's TCP connection to meshd: with `TCP_NODELAY`, as Envoy connects.
async fn connect_tcp(address: &str) -> std::io::Result<tokio::net::TcpStream> {
    let stream = tokio::net::TcpStream::connect(address).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

struct Simulated {
    namespace: Option<String>,
    stats: Arc<ProxyStats>,
}

/// Set from `--progress-lines`.
static PROGRESS_LINES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A one-line progress display on a terminal, or plain lines with `--progress-lines`;
/// otherwise nothing when stderr is a file or pipe.
fn progress(line: &str) {
    use std::io::{IsTerminal, Write};
    if PROGRESS_LINES.load(Ordering::Relaxed) {
        eprintln!("{line}");
        return;
    }
    let mut err = std::io::stderr();
    if err.is_terminal() {
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
    }
}

/// The affected proxies that hold marker `id`.
fn holding<'a>(
    fleet: &'a [Simulated],
    affected: &'a [bool],
    id: u64,
) -> impl Iterator<Item = &'a Simulated> + 'a {
    fleet
        .iter()
        .zip(affected)
        .filter(move |(p, a)| **a && p.stats.converged_marker.load(Ordering::Relaxed) == id)
        .map(|(p, _)| p)
}

/// Waits until every affected proxy holds marker `id`, or `timeout`. Returns how many
/// hold it and, with `sample_rss`, the peak RSS sampled while waiting.
async fn await_marker(
    fleet: &[Simulated],
    affected: &[bool],
    id: u64,
    timeout: Duration,
    what: &str,
    sample_rss: Option<&Probe>,
) -> (usize, f64) {
    let want = affected.iter().filter(|a| **a).count();
    let deadline = Instant::now() + timeout;
    let mut rss_peak: f64 = 0.0;
    loop {
        let done = holding(fleet, affected, id).count();
        progress(&format!("{what}: {done}/{want} affected proxies converged"));
        if done == want || Instant::now() > deadline {
            return (done, rss_peak);
        }
        match sample_rss {
            Some(probe) => {
                rss_peak = rss_peak.max(probe.rss().await);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            None => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

pub fn run(mut args: LoadgenArgs) -> Result<Json, String> {
    PROGRESS_LINES.store(args.progress_lines, Ordering::Relaxed);
    let shape = Shape {
        services: args.services,
        namespaces: args.namespaces.max(1),
        endpoints: args.endpoints,
        routed_every: args.routed_every,
        sidecar_scoped: args.sidecar_scoped,
        gateway_routed: args.gateway_routes,
    };
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let source = Source::new(&args).await?;
        source.put_mesh(&shape).await?;
        let meshd = if args.spawn_meshd {
            Some(spawn_meshd(&mut args, &source)?)
        } else {
            None
        };
        simulate(args, source, shape, meshd).await
    })
}

/// Waits until every proxy of `fleet` holds its initial configuration (CDS, EDS, LDS
/// and RDS answered), at most `timeout`, reporting the first stream errors.
async fn await_initialised(
    fleet: &[Simulated],
    err_rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    errors: &mut usize,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let total = fleet.len();
    loop {
        while let Ok(e) = err_rx.try_recv() {
            *errors += 1;
            if *errors <= 5 {
                eprintln!("\nproxy stream failed: {e}");
            }
        }
        let ready = fleet
            .iter()
            .filter(|p| p.stats.initialised_after_us.load(Ordering::Relaxed) > 0)
            .count();
        progress(&format!("initialised {ready}/{total}"));
        if ready == total {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "only {ready} of {total} proxies initialised in {timeout:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// meshd's figures once what a connect storm freed has gone: once meshd has let go of
/// the encoded runs it shared between the storm's responses (crates/xds/src/joined.rs), a
/// second more, and then until its RSS stops falling as the heap hands the freed memory
/// back. Sampled sooner, a run could read RSS near its storm's peak; the progress line
/// tells whether RSS was still falling then.
async fn settled(args: &LoadgenArgs, probe: &Probe) -> self::meshd::MeshdFigures {
    let drained = Instant::now() + Duration::from_secs(10);
    while meshd_figures(&args.monitoring).shared_run_bytes > 0.0 && Instant::now() < drained {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (from, to, waited) = probe.settle(Duration::from_secs(10)).await;
    progress(&format!(
        "meshd RSS settled: {:.1} -> {:.1} MB in {waited:.2} s",
        from / 1e6,
        to / 1e6
    ));
    meshd_figures(&args.monitoring)
}

async fn simulate(
    args: LoadgenArgs,
    source: Source,
    shape: Shape,
    mut meshd: Option<Spawned>,
) -> Result<Json, String> {
    let base = meshd_figures(&args.monitoring);
    let probe = Probe {
        monitoring: args.monitoring.clone(),
        pid: meshd.as_ref().map(|m| m.child.id()),
    };
    // Sample meshd's RSS through the run, for its maximum.
    let peak = Arc::new(std::sync::Mutex::new(base));
    let sampler = {
        let (peak, probe) = (peak.clone(), probe.clone());
        tokio::spawn(async move {
            loop {
                let rss = probe.rss().await;
                {
                    let mut p = peak.lock().unwrap();
                    p.rss_bytes = p.rss_bytes.max(rss);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let (marker_tx, marker_rx) = watch::channel::<Option<Marker>>(None);
    let started = Instant::now();
    let total = args.proxies + args.gateways;
    let mut fleet: Vec<Simulated> = Vec::with_capacity(total);
    let mut dial: Option<proxy::Dial> = None;
    let mut errors = 0usize;
    let (err_tx, mut err_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let interval = Duration::from_secs_f64(1.0 / args.connect_rate.max(0.001));
    let mut next = tokio::time::Instant::now();
    let warm = args.warm_proxies;
    let xds_address: Arc<str> = args.xds.as_str().into();
    // With --secure, each namespace's proxies present its workload certificate.
    let identities = if args.secure {
        let ca_dir = match (&meshd, &args.ca_dir) {
            (Some(m), _) => m.ca_dir(),
            (None, Some(dir)) => dir.clone(),
            (None, None) => {
                return Err("--secure needs --spawn-meshd or the running meshd's --ca-dir".into());
            }
        };
        let mut namespaces: Vec<String> =
            (0..shape.namespaces).map(|k| format!("ns-{k}")).collect();
        namespaces.push("istio-system".into());
        Some(secure::workload_tls(&ca_dir, &namespaces)?)
    } else {
        None
    };
    if warm > 0 && warm >= total {
        return Err(format!(
            "--warm-proxies {warm} leaves none of the {total} proxies to measure"
        ));
    }
    // meshd's figures once the warm proxies were connected, and when the others began.
    let mut warmed = None;
    let mut connect_from = started;
    for i in 0..total {
        if i == warm && warm > 0 {
            await_initialised(&fleet, &mut err_rx, &mut errors, args.init_timeout).await?;
            warmed = Some(settled(&args, &probe).await);
            connect_from = Instant::now();
            next = tokio::time::Instant::now();
        }
        let (id, namespace, meta) = if i < args.proxies {
            let ns = format!("ns-{}", i % shape.namespaces);
            let ip = format!("10.{}.{}.{}", 200 + i / 65536, i / 256 % 256, i % 256);
            let mut meta = serde_json::json!({"NAMESPACE": ns, "LABELS": {"app": "loadgen"}, "ISTIO_VERSION": "1.28.0"});
            if args.dns_capture {
                meta["DNS_CAPTURE"] = "true".into();
            }
            (
                format!("sidecar~{ip}~loadgen-{i}.{ns}~{ns}.svc.cluster.local"),
                Some(ns.clone()),
                meta,
            )
        } else {
            (
                format!(
                    "router~10.255.0.{}~gateway-{i}.istio-system~istio-system.svc.cluster.local",
                    i % 250
                ),
                None,
                serde_json::json!({"NAMESPACE": "istio-system", "LABELS": {"istio": "ingressgateway"}, "ISTIO_VERSION": "1.28.0"}),
            )
        };
        if !args.through_hyper() {
            let ns = namespace.as_deref().unwrap_or("istio-system");
            dial = Some(proxy::Dial::Own {
                address: xds_address.clone(),
                tls: identities.as_ref().map(|ids| ids[ns].clone()),
            });
        } else if i % args.proxies_per_connection.max(1) == 0 {
            dial = Some(proxy::Dial::Shared(
                tonic::transport::Endpoint::from_shared(format!("http://{}", args.xds))
                    .map_err(|e| e.to_string())?
                    .connect_with_connector_lazy(Connector(args.xds.clone())),
            ));
        }
        let spec = Spec {
            node: node(&id, &meta),
            delta: !args.sotw,
            nack_routes: i < args.nack_proxies,
            name_table: args.dns_capture && i < args.proxies,
        };
        let stats = Arc::new(ProxyStats::default());
        fleet.push(Simulated {
            namespace,
            stats: stats.clone(),
        });
        let (ch, rx, err) = (
            dial.clone().expect("BUG: a connection was chosen"),
            marker_rx.clone(),
            err_tx.clone(),
        );
        // Like Envoy, a proxy whose stream ends reconnects after a jittered backoff, which
        // starts over once a stream has held its configuration.
        tokio::spawn(async move {
            let mut backoff = Backoff::default();
            let mut held = proxy::Held::default();
            loop {
                let initialised = stats.streams_initialised.load(Ordering::Relaxed);
                let run = proxy::run(
                    ch.clone(),
                    spec.clone(),
                    stats.clone(),
                    rx.clone(),
                    connect_from,
                    &mut held,
                );
                // Ended either way, Envoy opens a new stream.
                let ended = match run.await {
                    Ok(()) => "stream ended by meshd".to_string(),
                    Err(e) => e,
                };
                let _ = err.send(format!("{id}: {ended}"));
                if stats.streams_initialised.load(Ordering::Relaxed) > initialised {
                    backoff = Backoff::default();
                }
                tokio::time::sleep(backoff.next(random())).await;
            }
        });
        next += interval;
        tokio::time::sleep_until(next).await;
        if i % 100 == 0 {
            progress(&format!("connecting {}/{total}", i + 1));
        }
    }
    // Everyone initialised: CDS, EDS, LDS and RDS answered.
    await_initialised(&fleet, &mut err_rx, &mut errors, args.init_timeout).await?;
    let connect_seconds = connect_from.elapsed().as_secs_f64();
    let init_ms: Vec<f64> = fleet[warm..]
        .iter()
        .map(|p| p.stats.initialised_after_us.load(Ordering::Relaxed) as f64 / 1000.0)
        .collect();
    let initial_bytes: u64 = fleet
        .iter()
        .map(|p| p.stats.bytes.load(Ordering::Relaxed))
        .sum();
    let connected = settled(&args, &probe).await;

    let mut reports = Vec::new();
    let mut all_ms = Vec::new();
    for c in 1..=args.changes {
        if args.change == Change::None {
            break;
        }
        let routed: Vec<usize> = (0..shape.services)
            .filter(|i| {
                args.change != Change::Vs || (shape.routed_every > 0 && i % shape.routed_every == 0)
            })
            .collect();
        if routed.is_empty() {
            return Err(
                "no service to change (a VirtualService change needs --routed-every > 0)".into(),
            );
        }
        let picked: Vec<usize> = (0..args.services_per_change.max(1))
            .map(|k| routed[(c * 7919 + k * 104_729) % routed.len()])
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let namespaces: std::collections::BTreeSet<String> =
            picked.iter().map(|i| shape.namespace_of(*i)).collect();
        // The marker: a header value or endpoint address only this change's resources carry.
        let marker_text = match args.change {
            Change::Vs => format!("loadgen-{c}-{}", started.elapsed().as_micros()),
            Change::Endpoint => format!("10.254.{}.{}", c / 250 % 250, c % 250 + 1),
            Change::None => unreachable!(),
        };
        let files: Vec<(String, String)> = picked
            .iter()
            .map(|i| {
                let yaml = match args.change {
                    Change::Vs => shape.changed_service_yaml(*i, None, &marker_text),
                    _ => shape.service_yaml(*i, Some(&marker_text)),
                };
                (format!("svc-{i}.yaml"), yaml)
            })
            .collect();
        let affected: Vec<bool> = fleet
            .iter()
            .map(|p| match &p.namespace {
                // Gateways see every service, and with --gateway-routes route every
                // routed one; without it they are not measured.
                None => shape.gateway_routed,
                Some(ns) => !shape.sidecar_scoped || namespaces.contains(ns),
            })
            .collect();
        let gateways: Vec<bool> = fleet.iter().map(|p| p.namespace.is_none()).collect();
        let before: Vec<(u64, u64)> = fleet
            .iter()
            .map(|p| {
                (
                    p.stats.responses.load(Ordering::Relaxed),
                    p.stats.bytes.load(Ordering::Relaxed),
                )
            })
            .collect();
        let id = c as u64;
        let _ = marker_tx.send(Some(Marker {
            id,
            text: marker_text.as_bytes().into(),
            at: Instant::now(),
        }));
        for (name, yaml) in &files {
            source.put(name, yaml).await?;
        }
        let want = affected.iter().filter(|a| **a).count();
        let what = format!("change {c}/{}", args.changes);
        await_marker(&fleet, &affected, id, args.change_timeout, &what, None).await;
        tokio::time::sleep(args.settle).await;
        let mut ms = Vec::new();
        let (mut bytes, mut responses, mut unaffected_pushed) = (0u64, 0u64, 0usize);
        for (((p, a), (r0, b0)), gw) in fleet.iter().zip(&affected).zip(&before).zip(&gateways) {
            let r = p.stats.responses.load(Ordering::Relaxed) - r0;
            let b = p.stats.bytes.load(Ordering::Relaxed) - b0;
            if *a {
                if p.stats.converged_marker.load(Ordering::Relaxed) == id {
                    ms.push(p.stats.converged_after_us.load(Ordering::Relaxed) as f64 / 1000.0);
                }
                bytes += b;
                responses += r;
            } else if !gw && r > 0 {
                unaffected_pushed += 1;
            }
        }
        all_ms.extend(ms.iter().copied());
        reports.push(ChangeReport {
            kind: args.change,
            services: picked
                .iter()
                .map(|i| format!("svc-{i}.{}", shape.namespace_of(*i)))
                .collect(),
            affected: want,
            converged: ms.len(),
            convergence_ms: Percentiles::of(ms),
            bytes_per_affected_proxy: bytes as f64 / want.max(1) as f64,
            responses_per_affected_proxy: responses as f64 / want.max(1) as f64,
            unaffected_pushed,
        });
    }
    // meshd's CPU over the changes alone: from the settled, connected fleet to the last
    // change's convergence (and settle), per proxy each change reached. Read here only if
    // a storm follows; else the figures read at the end are the same moment's.
    let pushed: usize = reports.iter().map(|r| r.affected).sum();
    let before_storm = (args.storm_rate > 0.0).then(|| meshd_figures(&args.monitoring));
    let storm = if args.storm_rate > 0.0 {
        Some(
            storm(
                &args,
                &probe,
                &source,
                &shape,
                &fleet,
                &marker_tx,
                args.changes as u64 + 1,
            )
            .await?,
        )
    } else {
        None
    };
    progress("");
    sampler.abort();
    let end = meshd_figures(&args.monitoring);
    let after_changes = before_storm.unwrap_or(end);
    let peak_rss = peak.lock().unwrap().rss_bytes.max(end.rss_bytes);
    while let Ok(e) = err_rx.try_recv() {
        errors += 1;
        if errors <= 5 {
            eprintln!("proxy stream failed: {e}");
        }
    }
    // Last: the restart ends the meshd the figures above were read from.
    let restart = match meshd.take() {
        Some(m) if args.restart => {
            let (mut report, m) = restart(&args, &fleet, m).await?;
            meshd = Some(m);
            // Every stream broke; they reconnected (counted here, not at connect time).
            report["stream_errors_reconnected"] =
                std::iter::from_fn(|| err_rx.try_recv().ok()).count().into();
            Some(report)
        }
        other => {
            meshd = other;
            None
        }
    };
    // Asked of meshd last, not to disturb what was measured: how many proxies it holds
    // a certificate-proven identity for (all of them with --secure).
    let identified = with_identity(&args.monitoring).ok();
    let mut summary = Map::new();
    summary.insert("settings".into(), serde_json::json!({
        "proxies": args.proxies, "gateways": args.gateways, "delta": !args.sotw,
        "source": if args.kubernetes { "kubernetes" } else { "files" },
        "connect_rate": args.connect_rate, "warm_proxies": warm, "secure": args.secure, "proxies_per_connection": args.proxies_per_connection, "hyper_client": args.through_hyper(),
        "services": shape.services, "namespaces": shape.namespaces, "endpoints": shape.endpoints,
        "routed_every": shape.routed_every, "sidecar_scoped": shape.sidecar_scoped,
        "gateway_routes": shape.gateway_routed, "dns_capture": args.dns_capture,
        "change": args.change, "changes": args.changes, "services_per_change": args.services_per_change,
        // Whether the simulator's own heap may use transparent huge pages (off unless
        // MIMALLOC_ALLOW_THP says otherwise; see `heap`).
        "simulator_huge_pages": crate::process::huge_pages_allowed("self"),
    }));
    summary.insert(
        "connect".into(),
        serde_json::json!({
            "seconds": connect_seconds,
            "initialised_per_second": (total - warm) as f64 / connect_seconds,
            "initial_config_ms": Percentiles::of(init_ms),
            "initial_bytes_per_proxy": initial_bytes as f64 / total.max(1) as f64,
            "stream_errors_reconnected": errors,
        }),
    );
    summary.insert(
        "meshd".into(),
        serde_json::json!({
            "rss_before_bytes": base.rss_bytes,
            "rss_connected_bytes": connected.rss_bytes,
            "rss_per_proxy_bytes": (connected.rss_bytes - base.rss_bytes) / total.max(1) as f64,
            "rss_warm_bytes": warmed.as_ref().map(|w| w.rss_bytes),
            "rss_per_added_proxy_bytes": warmed
                .as_ref()
                .filter(|_| total > warm)
                .map(|w| (connected.rss_bytes - w.rss_bytes) / (total - warm) as f64),
            "rss_peak_bytes": peak_rss,
            "cpu_seconds": end.cpu_seconds - base.cpu_seconds,
            "cpu_seconds_connecting": connected.cpu_seconds - base.cpu_seconds,
            "cpu_seconds_changes": after_changes.cpu_seconds - connected.cpu_seconds,
            "cpu_seconds_storm": before_storm.map(|b| end.cpu_seconds - b.cpu_seconds),
            "cpu_us_per_proxy_per_push": (pushed > 0).then(|| {
                (after_changes.cpu_seconds - connected.cpu_seconds) * 1e6 / pushed as f64
            }),
            "push_diffs_by_view": end.view_diffs - connected.view_diffs,
            "push_diffs_in_full": end.full_diffs - connected.full_diffs,
            "proxies_with_identity": identified,
            // NDS responses (--dns-capture): while the fleet connected, and after.
            "name_tables_sent_connecting": connected.name_tables - base.name_tables,
            "name_tables_sent_after": end.name_tables - connected.name_tables,
        }),
    );
    summary.insert(
        "convergence_ms".into(),
        serde_json::to_value(Percentiles::of(all_ms)).unwrap_or_default(),
    );
    summary.insert(
        "changes".into(),
        serde_json::to_value(&reports).unwrap_or_default(),
    );
    if let Some(storm) = storm {
        summary.insert("storm".into(), storm);
    }
    if let Some(restart) = restart {
        summary.insert("restart".into(), restart);
    }
    let summary = Json::Object(summary);
    drop(meshd); // a restarted meshd stops with the run, as the first would have
    if let Some(path) = &args.json {
        std::fs::write(path, format!("{summary:#}\n")).map_err(|e| e.to_string())?;
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let p = Percentiles::of((1..=100).map(f64::from).collect());
        assert_eq!(
            (p.count, p.p50, p.p95, p.p99, p.max),
            (100, 50.0, 95.0, 99.0, 100.0)
        );
        let one = Percentiles::of(vec![7.0]);
        assert_eq!((one.p50, one.p99, one.max), (7.0, 7.0, 7.0));
        assert_eq!(Percentiles::of(vec![]).count, 0);
    }

    #[test]
    fn backoff_is_envoys_jittered_exponential_one() {
        let ms = Duration::from_millis;
        // The longest wait of each attempt (a draw one below a multiple of every interval):
        // just under an interval that doubles from 500 ms up to 30 s.
        let mut backoff = Backoff::default();
        let longest: Vec<Duration> = (0..9).map(|_| backoff.next(240_000 - 1)).collect();
        let intervals = [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000];
        assert_eq!(longest, intervals.map(|i| ms(i - 1)));
        // Drawn from the whole interval: the shortest is no wait at all.
        assert_eq!(Backoff::default().next(0), Duration::ZERO);
        assert_eq!(Backoff::default().next(499), ms(499));
        assert_eq!(Backoff::default().next(500), Duration::ZERO);
        // A fleet's first waits spread over the interval.
        let firsts: std::collections::BTreeSet<Duration> = (0..200)
            .map(|_| Backoff::default().next(random()))
            .collect();
        assert!(firsts.len() > 100, "{} distinct waits of 200", firsts.len());
        assert!(firsts.iter().all(|d| *d < ms(500)));
    }
}
