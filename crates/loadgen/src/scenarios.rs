//! The scenarios after the connect storm and the changes: meshd restarted under the
//! fleet, and a storm of changes.

use super::*;

/// How long a proxy waits before it opens a new stream: Envoy's xDS backoff (its
/// `GrpcStream`'s jittered exponential strategy), each wait drawn uniformly from below an
/// interval that starts at 500 ms and doubles up to 30 s. The jitter spreads a fleet whose
/// streams all broke at once (a meshd restart) over each interval, as real sidecars are.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Backoff {
    interval: Duration,
}

impl Backoff {
    const BASE: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(30);

    /// The next wait, from `random` (uniform over `u64`), and the interval doubled.
    pub(crate) fn next(&mut self, random: u64) -> Duration {
        let interval = self.interval.as_millis() as u64;
        self.interval = (self.interval * 2).min(Self::MAX);
        Duration::from_millis(random % interval)
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            interval: Self::BASE,
        }
    }
}

pub(super) fn random() -> u64 {
    getrandom::u64().expect("BUG: the OS has no random source")
}

/// The restart scenario: meshd is killed and started again on the same ports while the
/// fleet is connected. Every proxy reconnects (with backoff, as Envoy) and must hold its
/// configuration again; a delta proxy names what it holds, so only differences are sent.
/// Reports how long until every proxy's new stream held its configuration, and the new
/// meshd's RSS peak during the reconnection against its steady state after it.
pub(super) async fn restart(
    args: &LoadgenArgs,
    fleet: &[Simulated],
    meshd: Spawned,
) -> Result<(Json, Spawned), String> {
    let before: Vec<u64> = fleet
        .iter()
        .map(|p| p.stats.streams_initialised.load(Ordering::Relaxed))
        .collect();
    let bytes = || -> u64 {
        fleet
            .iter()
            .map(|p| p.stats.bytes.load(Ordering::Relaxed))
            .sum()
    };
    let bytes_before = bytes();
    let rss_before = meshd_figures(&args.monitoring).rss_bytes;
    let killed = Instant::now();
    // Blocking (process start, readiness polling): off the runtime's threads.
    let meshd = tokio::task::spawn_blocking(move || meshd.restarted())
        .await
        .map_err(|e| e.to_string())??;
    let ready_ms = killed.elapsed().as_secs_f64() * 1000.0;
    let probe = Probe {
        monitoring: args.monitoring.clone(),
        pid: Some(meshd.child.id()),
    };
    let total = fleet.len();
    let deadline = Instant::now() + args.init_timeout;
    let mut rss_peak: f64 = 0.0;
    let reconnected = loop {
        let done = fleet
            .iter()
            .zip(&before)
            .filter(|(p, b)| p.stats.streams_initialised.load(Ordering::Relaxed) > **b)
            .count();
        progress(&format!(
            "restart: {done}/{total} proxies hold their config again"
        ));
        rss_peak = rss_peak.max(probe.rss().await);
        if done == total || Instant::now() > deadline {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let reconnect_ms = killed.elapsed().as_secs_f64() * 1000.0;
    let resent = (bytes() - bytes_before) as f64 / total.max(1) as f64;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let steady = meshd_figures(&args.monitoring).rss_bytes;
    let report = serde_json::json!({
        "meshd_ready_after_ms": ready_ms,
        "proxies": total,
        "reconnected": reconnected,
        "all_reconnected_after_ms": reconnect_ms,
        "bytes_per_proxy": resent,
        "rss_before_restart_bytes": rss_before,
        "rss_peak_bytes": rss_peak.max(steady),
        "rss_steady_bytes": steady,
        "rss_peak_over_steady": rss_peak.max(steady) / steady.max(1.0),
    });
    Ok((report, meshd))
}

/// The change storm: `--storm-rate` writes per second for `--storm-duration`, cycling
/// over `--storm-services` services, each write a new endpoint address. The last
/// write's address is the marker every affected proxy must end up holding; then meshd's
/// own `/debug/syncz` must show every connection ACKed.
pub(super) async fn storm(
    args: &LoadgenArgs,
    probe: &Probe,
    source: &Source,
    shape: &Shape,
    fleet: &[Simulated],
    marker_tx: &watch::Sender<Option<Marker>>,
    id: u64,
) -> Result<Json, String> {
    let targets: Vec<usize> = (0..args.storm_services.max(1))
        .map(|k| (k * 104_729 + 13) % shape.services)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let writes = ((args.storm_rate * args.storm_duration.as_secs_f64()) as usize).max(1);
    // The marker is in the last-written service: proxies that can see it must hold it.
    let last_namespace = shape.namespace_of(targets[(writes - 1) % targets.len()]);
    if writes > 62_500 {
        return Err("a storm has at most 62,500 writes (one address each)".into());
    }
    // One per merged push, in meshd and in istiod alike (istiod rebuilds no push context
    // for an endpoint change, so its `pilot_push_context_recompute_count` would say 0).
    let recomputes = |m: &str| {
        crate::process::http_get(m, "/metrics")
            .map(|t| metric_sum(&t, "pilot_debounce_time_count"))
            .unwrap_or(0.0)
    };
    let pushes_before = recomputes(&args.monitoring);
    let interval = Duration::from_secs_f64(1.0 / args.storm_rate);
    let started = tokio::time::Instant::now();
    let mut rss_peak: f64 = 0.0;
    let mut sampled = Instant::now();
    let mut last_write = Instant::now();
    for n in 0..writes {
        let service = targets[n % targets.len()];
        let address = format!("10.253.{}.{}", n / 250 % 250, n % 250 + 1);
        if n + 1 == writes {
            // Published before the write, so no proxy can hold it before it is looked for.
            let _ = marker_tx.send(Some(Marker {
                id,
                text: address.as_bytes().into(),
                at: Instant::now(),
            }));
        }
        source
            .put(
                &format!("svc-{service}.yaml"),
                &shape.service_yaml(service, Some(&address)),
            )
            .await?;
        last_write = Instant::now();
        if sampled.elapsed() > Duration::from_millis(250) {
            sampled = Instant::now();
            rss_peak = rss_peak.max(probe.rss().await);
            progress(&format!("storm: {n}/{writes} writes"));
        }
        tokio::time::sleep_until(started + interval * (n as u32 + 1)).await;
    }
    let storm_seconds = started.elapsed().as_secs_f64();
    let affected: Vec<bool> = fleet
        .iter()
        .map(|p| match &p.namespace {
            None => shape.gateway_routed,
            Some(ns) => !shape.sidecar_scoped || *ns == last_namespace,
        })
        .collect();
    let want = affected.iter().filter(|a| **a).count();
    let (converged, peak) = await_marker(
        fleet,
        &affected,
        id,
        args.change_timeout,
        "storm over",
        Some(probe),
    )
    .await;
    rss_peak = rss_peak.max(peak);
    let after_last_write_ms = last_write.elapsed().as_secs_f64() * 1000.0;
    tokio::time::sleep(args.settle).await;
    let ms: Vec<f64> = holding(fleet, &affected, id)
        .map(|p| p.stats.converged_after_us.load(Ordering::Relaxed) as f64 / 1000.0)
        .collect();
    // Every ACK in (the proxies told to NACK never ACK their routes), or the timeout.
    let deadline = Instant::now() + args.change_timeout;
    let unsynced = loop {
        let monitoring = args.monitoring.clone();
        let n = tokio::task::spawn_blocking(move || out_of_sync(&monitoring))
            .await
            .map_err(|e| e.to_string())??;
        if n <= args.nack_proxies || Instant::now() > deadline {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    Ok(serde_json::json!({
        "writes": writes,
        "seconds": storm_seconds,
        "writes_per_second": writes as f64 / storm_seconds,
        "services": targets.len(),
        "pushes": recomputes(&args.monitoring) - pushes_before,
        "pushes_per_second": (recomputes(&args.monitoring) - pushes_before) / storm_seconds,
        "rss_peak_bytes": rss_peak,
        "affected": want,
        "holding_final_config": converged,
        "final_config_after_last_write_ms": Percentiles::of(ms),
        "all_converged_after_last_write_ms": after_last_write_ms,
        "connections_not_acked": unsynced,
    }))
}
