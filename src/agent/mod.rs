//! `meshd agent`: the sidecar's companion, like pilot-agent. It makes the workload's key
//! (which never leaves it), gets the certificate from meshd's CA, serves both to Envoy over
//! SDS on a Unix socket, renews before expiry, and writes Envoy's bootstrap.

pub mod bootstrap;
pub mod certs;
pub mod iptables;
pub mod sds;

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

    let server = tonic::transport::Server::builder()
        .add_service(sds::Sds::new(cert_rx).into_server())
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            crate::serve::shutdown_signal(),
        );
    server.await?;
    let _ = std::fs::remove_file(&socket);
    Ok(())
}
