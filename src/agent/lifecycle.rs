//! The injected proxy container's lifecycle hooks, as pilot-agent's: `meshd agent wait`
//! (`postStart` with `holdApplicationUntilProxyStarts`: the application's containers start
//! once Envoy is ready) and `meshd agent request` (`preStop`: `POST drain` to the agent's
//! status port, which asks Envoy to drain its inbound listeners gracefully).

use std::time::{Duration, Instant};

/// `meshd agent wait`'s flags (pilot-agent's `wait`).
#[derive(clap::Args, Clone, Debug)]
pub struct WaitArgs {
    /// The readiness URL polled.
    #[arg(long, default_value = "http://localhost:15021/healthz/ready")]
    pub url: String,
    /// How long to wait at most, in seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout_seconds: u64,
    /// How often to ask, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub period_millis: u64,
}

/// `meshd agent request`'s flags (pilot-agent's `request`).
#[derive(clap::Args, Clone, Debug)]
pub struct RequestArgs {
    /// The agent's status port on localhost.
    #[arg(long, default_value_t = 15020)]
    pub debug_port: u16,
    /// `GET` or `POST`.
    pub method: String,
    /// The path, without its leading `/` (e.g. `drain`).
    pub path: String,
}

/// A client for the pod's own HTTP endpoints (the agent's and Envoy's), every status an
/// answer rather than an error.
pub(super) fn local_client(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .build()
        .into()
}

/// Polls `url` until it answers 200, or fails after the timeout.
pub fn wait(args: &WaitArgs) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(args.timeout_seconds);
    let client = local_client(Duration::from_secs(1));
    let mut last = String::from("no answer yet");
    while Instant::now() < deadline {
        match client.get(&args.url).call() {
            Ok(r) if r.status() == 200 => return Ok(()),
            Ok(r) => last = format!("HTTP {}", r.status().as_u16()),
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(args.period_millis));
    }
    anyhow::bail!(
        "{} was not ready after {} s: {last}",
        args.url,
        args.timeout_seconds
    )
}

/// Sends one request to the agent's status port; fails unless it answers 200.
pub fn request(args: &RequestArgs) -> anyhow::Result<String> {
    let url = format!(
        "http://localhost:{}/{}",
        args.debug_port,
        args.path.trim_start_matches('/')
    );
    let client = local_client(Duration::from_secs(10));
    let mut response = match args.method.to_uppercase().as_str() {
        "GET" => client.get(&url).call(),
        "POST" => client.post(&url).send_empty(),
        other => anyhow::bail!("method {other:?} is not GET or POST"),
    }
    .map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
    let body = response.body_mut().read_to_string().unwrap_or_default();
    if response.status() != 200 {
        anyhow::bail!(
            "{url}: HTTP {}: {}",
            response.status().as_u16(),
            body.trim()
        );
    }
    Ok(body)
}
