//! `meshd agent`: the sidecar's companion, like pilot-agent. It makes the workload's key
//! (which never leaves it), gets the certificate from meshd's CA, serves both to Envoy over
//! SDS on a Unix socket, renews before expiry, and writes Envoy's bootstrap.

pub mod bootstrap;
pub mod certs;
pub mod iptables;
pub mod lifecycle;
pub mod sds;
pub mod status;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tokio::sync::watch;

use self::bootstrap::BootstrapOptions;
use self::certs::CaClientOptions;

#[derive(Clone, Debug)]
pub struct AgentOptions {
    pub ca: CaClientOptions,
    pub bootstrap: BootstrapOptions,
    /// Where to write Envoy's bootstrap (JSON).
    pub bootstrap_path: PathBuf,
    /// The Envoy binary the agent starts and watches, as pilot-agent does; `None` when
    /// Envoy is started by someone else.
    pub envoy: Option<PathBuf>,
    /// The status port (Istio's 15020): readiness, application probes, metrics.
    pub status_port: Option<u16>,
}

/// A downward-API file (`key="value"` lines, values quoted as Go quotes them) as pairs.
pub fn downward_api(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let (key, value) = line.split_once('=')?;
            let value = value.strip_prefix('"')?.strip_suffix('"')?;
            let mut out = String::new();
            let mut chars = value.chars();
            while let Some(c) = chars.next() {
                match (c, c == '\\') {
                    (_, true) => match chars.next()? {
                        'n' => out.push('\n'),
                        't' => out.push('\t'),
                        other => out.push(other),
                    },
                    (c, false) => out.push(c),
                }
            }
            Some((key.to_string(), out))
        })
        .collect()
}

/// Asks Envoy to stop (SIGTERM), and kills it if it has not after its drain time.
async fn stop_envoy(envoy: &mut tokio::process::Child) {
    if let Some(pid) = envoy.id().and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill(2) on our own child's pid, which `envoy` has not reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let drained = tokio::time::timeout(std::time::Duration::from_secs(45), envoy.wait()).await;
    if drained.is_err() {
        let _ = envoy.kill().await;
    }
}

/// Envoy with the agent's bootstrap, as pilot-agent starts it.
fn start_envoy(
    binary: &std::path::Path,
    bootstrap: &std::path::Path,
) -> anyhow::Result<tokio::process::Child> {
    let mut command = tokio::process::Command::new(binary);
    command
        .arg("-c")
        .arg(bootstrap)
        .args(["--drain-time-s", "45", "--drain-strategy", "immediate"])
        .args([
            "--local-address-ip-version",
            "v4",
            "--file-flush-interval-msec",
            "1000",
        ])
        .args(["--disable-hot-restart", "--allow-unknown-static-fields"])
        .args(["-l", "warning", "--component-log-level", "misc:error"])
        .kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe and touches only the child's own state.
    unsafe {
        // Envoy does not outlive its agent, however the agent ends.
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    command
        .spawn()
        .with_context(|| format!("starting Envoy {}", binary.display()))
}

/// Runs until SIGINT/SIGTERM.
pub async fn run(opts: AgentOptions) -> anyhow::Result<()> {
    let socket = PathBuf::from(&opts.bootstrap.sds_socket);
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the SDS socket directory {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket)
        .with_context(|| format!("binding the SDS socket {}", socket.display()))?;

    if let Some(port) = opts.status_port {
        let status = status::StatusPort {
            admin_port: opts.bootstrap.admin_port,
            probers: status::probers_from_env()?,
            app_metrics: status::app_metrics_from_env()?,
        };
        let address = std::net::SocketAddr::from(([0, 0, 0, 0], port));
        tokio::spawn(async move {
            if let Err(e) = status::serve(address, status).await {
                tracing::error!("status port: {e:#}");
            }
        });
    }
    let (cert_tx, cert_rx) = watch::channel(None);
    tokio::spawn(certs::keep_fresh(Arc::new(opts.ca.clone()), cert_tx));

    // Written whole, then renamed: whoever starts Envoy never reads half a file.
    let text = serde_json::to_string_pretty(&bootstrap::render(&opts.bootstrap))?;
    let tmp = opts.bootstrap_path.with_extension("tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &opts.bootstrap_path))
        .with_context(|| format!("writing {}", opts.bootstrap_path.display()))?;
    tracing::info!(
        node = %opts.bootstrap.node_id,
        bootstrap = %opts.bootstrap_path.display(),
        sds = %socket.display(),
        "agent ready"
    );

    // Envoy's SDS streams never end on their own: on a signal the agent stops without
    // waiting for them (after Envoy, when it started Envoy).
    let server = tonic::transport::Server::builder()
        .add_service(sds::Sds::new(cert_rx).into_server())
        .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener));
    let result = match &opts.envoy {
        None => tokio::select! {
            served = server => served.map_err(anyhow::Error::from),
            () = crate::serve::shutdown_signal() => Ok(()),
        },
        Some(binary) => {
            let mut envoy = start_envoy(binary, &opts.bootstrap_path)?;
            tracing::info!(envoy = %binary.display(), "Envoy started");
            tokio::select! {
                served = server => {
                    let _ = envoy.start_kill();
                    served.map_err(anyhow::Error::from)
                }
                () = crate::serve::shutdown_signal() => {
                    stop_envoy(&mut envoy).await;
                    Ok(())
                }
                exited = envoy.wait() => Err(anyhow::anyhow!("Envoy exited: {}", exited?)),
            }
        }
    };
    let _ = std::fs::remove_file(&socket);
    result
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_downward_api_labels_file_is_read_as_go_quotes_it() {
        let text =
            "app=\"reviews\"\nversion=\"v1\"\nnote=\"a \\\"quoted\\\" \\\\ value\"\nbroken\n";
        assert_eq!(
            super::downward_api(text),
            [
                ("app".to_string(), "reviews".to_string()),
                ("version".to_string(), "v1".to_string()),
                ("note".to_string(), "a \"quoted\" \\ value".to_string()),
            ]
        );
    }
}
