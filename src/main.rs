//! The `meshd` binary: `serve`, `crds`, `validate`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[cfg(test)]
mod options_doc;
mod serve_args;

use serve_args::{InjectArgs, SecurityArgs, parse_duration};

use meshd::filesource::yaml_files;
use meshd::k8s::Scope;
use meshd::serve::{LeaderOptions, ServeOptions, Source, run};
use model::config::Level;
use model::config::parse::parse_file;
use xds::push::PushSettings;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "meshd",
    version,
    about = "An Istio-compatible service-mesh control plane"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up; the size of the `serve` variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Serve xDS to Envoy proxies from a directory of Istio and Kubernetes YAML.
    Serve {
        /// Directory of *.yaml / *.yml files (watched; edits apply live). Without it, meshd
        /// watches the Kubernetes API (kubeconfig or in-cluster configuration).
        #[arg(long, env = "MESHD_CONFIG_DIR")]
        config_dir: Option<PathBuf>,
        /// The control-plane revision served: proxies and namespaces labelled
        /// `istio.io/rev=REVISION` (Istio's `REVISION`).
        #[arg(long, env = "REVISION", default_value = "default")]
        revision: String,
        /// Comma-separated namespaces to watch and keep (Kubernetes mode); all if empty.
        #[arg(long, env = "WATCHED_NAMESPACES", value_delimiter = ',')]
        watched_namespaces: Vec<String>,
        /// Read discovery.k8s.io/v1 EndpointSlices (true) or core v1 Endpoints (false).
        #[arg(long, env = "PILOT_USE_ENDPOINT_SLICE", default_value_t = true, action = clap::ArgAction::Set)]
        use_endpoint_slice: bool,
        /// This replica's identity for status leader election (Kubernetes mode).
        #[arg(long, env = "POD_NAME")]
        pod_name: Option<String>,
        /// Namespace of the status leader Lease (Kubernetes mode).
        #[arg(long, env = "POD_NAMESPACE", default_value = "istio-system")]
        pod_namespace: String,
        /// How long a leader's Lease (the status writer's, the CA root ConfigMaps') lasts
        /// without renewal.
        #[arg(long, default_value = "15s", value_parser = parse_duration)]
        leader_lease_duration: std::time::Duration,
        /// xDS (ADS over gRPC, plaintext, no identity: never serves secrets), Istio's port
        /// 15010.
        #[arg(long, default_value = "0.0.0.0:15010")]
        xds_address: SocketAddr,
        /// Turn the plaintext xDS port off; proxies must use the secure port.
        #[arg(long, env = "MESHD_DISABLE_PLAINTEXT_XDS")]
        no_plaintext_xds: bool,
        #[command(flatten)]
        security: SecurityArgs,
        #[command(flatten)]
        inject: InjectArgs,
        /// Metrics, readiness and debug endpoints, Istio's port 15014.
        #[arg(long, default_value = "0.0.0.0:15014")]
        monitoring_address: SocketAddr,
        /// Answer the /debug views (which expose configuration) to non-local callers too;
        /// by default only localhost may read them. /metrics and /ready are always open.
        #[arg(long, env = "MESHD_REMOTE_DEBUG")]
        remote_debug: bool,
        /// Ping idle xDS connections this often (istiod's --keepaliveInterval) ...
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        keepalive_interval: std::time::Duration,
        /// ... and drop a connection whose ping goes unanswered this long, freeing every
        /// stream's state on it (istiod's --keepaliveTimeout).
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        keepalive_timeout: std::time::Duration,
    },
    /// The sidecar's companion (like pilot-agent): workload key and certificate from meshd's
    /// CA, served to Envoy over SDS on a Unix socket, renewed before expiry, and Envoy's
    /// bootstrap.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Agent(AgentArgs),
    /// Reconcile meshd's `operator.meshd.io` resources (Mesh, MeshRevision,
    /// MeshRevisionTag) into control-plane revisions, through the Kubernetes API
    /// (kubeconfig or in-cluster configuration).
    Operator {
        /// Where `/metrics`, `/healthz` and `/readyz` are served.
        #[arg(long, default_value = "0.0.0.0:8080")]
        monitoring_address: SocketAddr,
        /// The name events are reported under.
        #[arg(long, env = "POD_NAME", default_value = "meshd-operator")]
        pod_name: String,
    },
    /// Print the CustomResourceDefinitions of every Istio kind meshd serves.
    Crds {
        /// Print those of meshd's own `operator.meshd.io` kinds instead.
        #[arg(long)]
        operator: bool,
    },
    /// Every proxy connected to a running meshd and, per xDS type, whether it holds what
    /// was last sent (SYNCED), has not ACKed it yet (STALE), rejected it (ERROR), or was
    /// sent nothing (NOT SENT).
    ProxyStatus {
        /// Only this proxy (`POD.NAMESPACE` or its node id). With `--envoy-admin`, its
        /// configuration as meshd serves it is compared with what its Envoy holds, as
        /// `istioctl proxy-status POD` compares them.
        proxy: Option<String>,
        /// The proxy's Envoy admin address (port 15000), to read its `/config_dump`.
        #[arg(long, requires = "proxy")]
        envoy_admin: Option<String>,
        /// The instance's monitoring address (port 15014).
        #[arg(
            long,
            env = "MESHD_MONITORING_ADDRESS",
            default_value = "127.0.0.1:15014"
        )]
        meshd: String,
        /// `json` prints /debug/syncz as is.
        #[arg(short = 'o', long, value_enum, default_value = "table")]
        output: Output,
    },
    /// One part of a connected proxy's configuration as meshd serves it (like `istioctl
    /// proxy-config`): PROXY is `POD.NAMESPACE` or the full node id.
    ProxyConfig {
        #[arg(value_enum)]
        kind: meshd::cli::ConfigKind,
        proxy: String,
        #[arg(
            long,
            env = "MESHD_MONITORING_ADDRESS",
            default_value = "127.0.0.1:15014"
        )]
        meshd: String,
        /// `json` prints the resources in Envoy's JSON.
        #[arg(short = 'o', long, value_enum, default_value = "table")]
        output: Output,
    },
    /// A fleet simulator: N proxies over real gRPC against a meshd, config changes made
    /// through its config directory, per-proxy convergence measured; prints a JSON summary.
    #[cfg(feature = "loadgen")]
    Loadgen(loadgen::LoadgenArgs),
    /// Check Istio YAML offline, like `istioctl validate`; exits 1 if anything is invalid.
    Validate {
        /// Files or directories to check.
        #[arg(short = 'f', long = "filename", required = true)]
        paths: Vec<PathBuf>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Table,
    Json,
}

fn print_or_fail(command: &str, result: anyhow::Result<String>) -> ExitCode {
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("meshd {command}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before any other thread starts (mimalloc's options are not synchronised).
    #[cfg(feature = "loadgen")]
    if matches!(cli.command, Command::Loadgen(_)) {
        loadgen::process::keep_freed_memory();
    }
    meshd::heap::disable_huge_pages_unless_configured();
    match cli.command {
        #[cfg(feature = "loadgen")]
        Command::Loadgen(args) => match loadgen::run(args) {
            Ok(summary) => {
                println!("{summary:#}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("meshd loadgen: {e}");
                ExitCode::FAILURE
            }
        },
        Command::ProxyStatus {
            proxy,
            envoy_admin,
            meshd,
            output,
        } => print_or_fail(
            "proxy-status",
            match (proxy, envoy_admin) {
                (Some(proxy), Some(admin)) => {
                    meshd::cli::compare_with_envoy(&meshd, &proxy, &admin)
                }
                (proxy, _) => {
                    meshd::cli::proxy_status(&meshd, proxy.as_deref(), output == Output::Json)
                }
            },
        ),
        Command::ProxyConfig {
            kind,
            proxy,
            meshd,
            output,
        } => print_or_fail(
            "proxy-config",
            meshd::cli::proxy_config(&meshd, kind, &proxy, output == Output::Json),
        ),
        Command::Crds { operator } => {
            match operator {
                true => print!("{}", api::crd::operator_yaml()),
                false => print!("{}", api::crd::to_yaml()),
            }
            ExitCode::SUCCESS
        }
        Command::Validate { paths } => validate(&paths),
        Command::Operator {
            monitoring_address,
            pod_name,
        } => {
            init_tracing();
            let opts = meshd::operator::OperatorOptions {
                monitoring_address,
                instance: pod_name,
            };
            let runtime =
                tokio::runtime::Runtime::new().expect("BUG: cannot start the tokio runtime");
            finish(
                "operator",
                runtime.block_on(meshd::operator::run(opts)),
                drop,
            )
        }
        Command::Agent(AgentArgs {
            command: Some(command),
            ..
        }) => match command {
            AgentCommand::Iptables(args) => {
                finish("agent iptables", meshd::agent::iptables::run(&args), drop)
            }
            AgentCommand::Wait(args) => {
                finish("agent wait", meshd::agent::lifecycle::wait(&args), drop)
            }
            AgentCommand::Request(args) => finish(
                "agent request",
                meshd::agent::lifecycle::request(&args),
                |body| print!("{body}"),
            ),
        },
        Command::Agent(args) => {
            init_tracing();
            let opts = match args.options() {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("meshd agent: {e:#}");
                    return ExitCode::from(2);
                }
            };
            let runtime =
                tokio::runtime::Runtime::new().expect("BUG: cannot start the tokio runtime");
            match runtime.block_on(meshd::agent::run(opts)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("meshd agent: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Serve {
            config_dir,
            revision,
            watched_namespaces,
            use_endpoint_slice,
            pod_name,
            pod_namespace,
            leader_lease_duration,
            xds_address,
            no_plaintext_xds,
            security,
            inject,
            monitoring_address,
            remote_debug,
            keepalive_interval,
            keepalive_timeout,
        } => {
            init_tracing();
            let push = match PushSettings::from_env() {
                Ok(p) => PushSettings {
                    keepalive_interval,
                    keepalive_timeout,
                    ..p
                },
                Err(e) => {
                    eprintln!("meshd: {e:#}");
                    return ExitCode::from(2);
                }
            };
            let source = match config_dir {
                Some(dir) => Source::ConfigDir(dir),
                None => Source::Kubernetes(Scope {
                    revisions: model::Revisions::new(&revision),
                    config_namespace: pod_namespace.clone(),
                    namespaces: watched_namespaces
                        .into_iter()
                        .filter(|n| !n.is_empty())
                        .collect(),
                    use_endpoint_slice,
                }),
            };
            let identity = pod_name.unwrap_or_else(|| {
                let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
                format!("{}-{}", host.trim(), std::process::id())
            });
            let leader = LeaderOptions {
                identity,
                namespace: pod_namespace,
                lease_duration: leader_lease_duration,
            };
            let mut security = match security.options() {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("meshd: {e}");
                    return ExitCode::from(2);
                }
            };
            // The revision's Service in meshd's namespace, `istiod[-REV].NS.svc`: its
            // webhooks and `CA_ADDR` name it.
            let service = match revision.as_str() {
                "default" => "istiod".to_string(),
                r => format!("istiod-{r}"),
            };
            let name = format!("{service}.{}.svc", leader.namespace);
            if !security.dns_names.contains(&name) {
                security.dns_names.push(name);
            }
            let inject = inject.options(&revision, &leader.namespace, &security.trust_domain);
            let opts = ServeOptions {
                source,
                leader,
                inject,
                revision,
                xds_address: (!no_plaintext_xds).then_some(xds_address),
                security,
                monitoring_address,
                remote_debug,
                push,
            };
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .on_thread_park(meshd::heap::on_idle)
                .build()
                .expect("BUG: cannot start the tokio runtime");
            match runtime.block_on(run(opts)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("meshd: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}

#[derive(clap::Args)]
struct AgentArgs {
    #[command(subcommand)]
    command: Option<AgentCommand>,
    /// meshd's CA (and secure xDS), `https://HOST:PORT`.
    #[arg(
        long,
        env = "CA_ADDR",
        default_value = "https://istiod.istio-system.svc:15012"
    )]
    ca_address: String,
    /// The root certificate meshd's serving certificate chains to (the
    /// `istio-ca-root-cert` ConfigMap, mounted).
    #[arg(long, default_value = "/var/run/secrets/istio/root-cert.pem")]
    ca_root_cert: PathBuf,
    /// The name meshd's serving certificate must carry.
    #[arg(long, default_value = "istiod.istio-system.svc")]
    ca_server_name: String,
    /// Bearer token for the first certificate (service-account JWT, or a bootstrap token
    /// in local mode); renewals authenticate with the current certificate.
    #[arg(long, env = "MESHD_AGENT_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    #[arg(long, env = "TRUST_DOMAIN", default_value = "cluster.local")]
    trust_domain: String,
    /// The workload's namespace (required).
    #[arg(long, env = "POD_NAMESPACE", required = true)]
    namespace: Option<String>,
    #[arg(long, env = "SERVICE_ACCOUNT", default_value = "default")]
    service_account: String,
    /// The workload's pod (required).
    #[arg(long, env = "POD_NAME", required = true)]
    pod_name: Option<String>,
    #[arg(long, env = "INSTANCE_IP", default_value = "127.0.0.1")]
    instance_ip: String,
    /// `sidecar` or `router` (a gateway).
    #[arg(long, default_value = "sidecar")]
    proxy_type: String,
    /// Pod labels, `KEY=VALUE` (repeatable).
    #[arg(long = "label", value_parser = key_value)]
    labels: Vec<(String, String)>,
    /// `REDIRECT`, `TPROXY` or `NONE` (no traffic capture).
    #[arg(long, env = "ISTIO_META_INTERCEPTION_MODE", default_value = "REDIRECT")]
    interception_mode: String,
    /// The network the workload is on (metadata `NETWORK`), for multi-network meshes.
    #[arg(long, env = "ISTIO_META_NETWORK")]
    network: Option<String>,
    #[arg(long, default_value = "./var/run/secrets/workload-spiffe-uds/socket")]
    sds_socket: String,
    /// Where to write Envoy's bootstrap.
    #[arg(long, default_value = "./etc/istio/proxy/envoy-rev.json")]
    bootstrap: PathBuf,
    /// Start this Envoy with the bootstrap and run until it exits, as pilot-agent does
    /// (the sidecar image's `/usr/local/bin/envoy`); without it, Envoy is started by
    /// someone else.
    #[arg(long)]
    envoy: Option<PathBuf>,
    /// The pod's downward-API folder (`labels`): the pod's labels become the proxy's
    /// (`--label` wins).
    #[arg(long)]
    pod_info: Option<PathBuf>,
    /// Serve the status port (Istio's 15020): `/healthz/ready`, the application's probes
    /// (`/app-health/...`, from `ISTIO_KUBE_APP_PROBERS`) and `/stats/prometheus`.
    #[arg(long)]
    status_port: Option<u16>,
    #[arg(long, default_value_t = 15000)]
    admin_port: u16,
    /// Delta xDS (Istio's default since 1.22) or state of the world.
    #[arg(long, env = "ISTIO_DELTA_XDS", default_value_t = true, action = clap::ArgAction::Set)]
    delta: bool,
    /// Requested certificate lifetime.
    #[arg(long, env = "SECRET_TTL", default_value = "24h", value_parser = parse_duration)]
    secret_ttl: std::time::Duration,
    /// Renew when this fraction of the lifetime is left (0.2: at 80% of it).
    #[arg(long, env = "SECRET_GRACE_PERIOD_RATIO", default_value_t = 0.2)]
    secret_grace_period_ratio: f64,
}

#[derive(Subcommand)]
enum AgentCommand {
    /// The injected `istio-init` container: traffic capture as Istio's istio-iptables
    /// writes it (outbound to the proxy's 15001, inbound to 15006, the proxy's own uid and
    /// gid left alone), applied with iptables-restore.
    Iptables(Box<meshd::agent::iptables::IptablesArgs>),
    /// The proxy container's `postStart` with `holdApplicationUntilProxyStarts`: waits until
    /// Envoy is ready (`localhost:15021/healthz/ready`), at most a minute.
    Wait(meshd::agent::lifecycle::WaitArgs),
    /// One request to the agent's status port (`POST drain`: the `preStop` hook).
    Request(meshd::agent::lifecycle::RequestArgs),
}

/// A command's exit status: success after `ok` has its value, or failure with the error
/// on standard error, naming the command.
fn finish<T, E: std::fmt::Display>(
    command: &str,
    result: Result<T, E>,
    ok: impl FnOnce(T),
) -> ExitCode {
    match result {
        Ok(value) => {
            ok(value);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("meshd {command}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn key_value(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{text:?} is not KEY=VALUE"))
}

impl AgentArgs {
    fn options(self) -> anyhow::Result<meshd::agent::AgentOptions> {
        use meshd::agent::bootstrap::BootstrapOptions;
        use meshd::agent::certs::CaClientOptions;
        let root_pem = std::fs::read_to_string(&self.ca_root_cert).map_err(|e| {
            anyhow::anyhow!("reading the CA root {}: {e}", self.ca_root_cert.display())
        })?;
        let authority = self
            .ca_address
            .split_once("://")
            .map_or(self.ca_address.as_str(), |(_, rest)| rest)
            .trim_end_matches('/');
        let (xds_host, xds_port) = authority
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
            .ok_or_else(|| anyhow::anyhow!("--ca-address {:?} needs HOST:PORT", self.ca_address))?;
        if !(0.0..1.0).contains(&self.secret_grace_period_ratio) {
            anyhow::bail!("SECRET_GRACE_PERIOD_RATIO must be in [0, 1)");
        }
        let (Some(ns), Some(pod_name)) = (&self.namespace, &self.pod_name) else {
            anyhow::bail!("--namespace (POD_NAMESPACE) and --pod-name (POD_NAME) are required");
        };
        let mut labels = serde_json::Map::new();
        if let Some(dir) = &self.pod_info {
            let path = dir.join("labels");
            let text = std::fs::read_to_string(&path)
                .map_err(|e| anyhow::anyhow!("reading the pod's labels {}: {e}", path.display()))?;
            for (k, v) in meshd::agent::downward_api(&text) {
                labels.insert(k, v.into());
            }
        }
        for (k, v) in self.labels {
            labels.insert(k, v.into());
        }
        let mut metadata = serde_json::json!({
            "NAMESPACE": ns,
            "SERVICE_ACCOUNT": self.service_account,
            "LABELS": labels,
            "INTERCEPTION_MODE": self.interception_mode,
            "CLUSTER_ID": std::env::var("ISTIO_META_CLUSTER_ID").unwrap_or_else(|_| "Kubernetes".into()),
            "ISTIO_VERSION": "1.28.0",
            "POD_NAME": pod_name,
        });
        if let Some(network) = self.network.filter(|n| !n.is_empty()) {
            metadata["NETWORK"] = network.into();
        }
        // As istio-agent: every `ISTIO_META_KEY` variable is metadata `KEY` (flags win).
        for (key, value) in std::env::vars() {
            if let Some(key) = key.strip_prefix("ISTIO_META_")
                && !key.is_empty()
                && metadata.get(key).is_none()
            {
                metadata[key] = value.into();
            }
        }
        Ok(meshd::agent::AgentOptions {
            ca: CaClientOptions {
                // `CA_ADDR` as Istio writes it is `HOST:PORT`.
                address: if self.ca_address.contains("://") {
                    self.ca_address.clone()
                } else {
                    format!("https://{}", self.ca_address)
                },
                server_name: self.ca_server_name.clone(),
                root_pem,
                token_file: self.token_file,
                spiffe_id: format!(
                    "spiffe://{}/ns/{ns}/sa/{}",
                    self.trust_domain, self.service_account
                ),
                ttl: self.secret_ttl,
                grace_ratio: self.secret_grace_period_ratio,
            },
            bootstrap: BootstrapOptions {
                node_id: format!(
                    "{}~{}~{}.{ns}~{ns}.svc.cluster.local",
                    self.proxy_type, self.instance_ip, pod_name
                ),
                metadata: metadata.as_object().cloned().unwrap_or_default(),
                xds_host,
                xds_port,
                xds_server_name: self.ca_server_name,
                sds_socket: self.sds_socket,
                admin_port: self.admin_port,
                delta: self.delta,
                status_port: self.status_port,
            },
            bootstrap_path: self.bootstrap,
            envoy: self.envoy,
            status_port: self.status_port,
        })
    }
}

fn validate(paths: &[PathBuf]) -> ExitCode {
    let mut errors = 0;
    let mut objects = 0;
    for root in paths {
        let files = match yaml_files(root) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("error: {}: {e}", root.display());
                errors += 1;
                continue;
            }
        };
        for file in files {
            let name = file.display().to_string();
            let text = match std::fs::read_to_string(&file) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("error: {name}: {e}");
                    errors += 1;
                    continue;
                }
            };
            let parsed = parse_file(&name, &text);
            objects += parsed.objects.len();
            for issue in &parsed.issues {
                eprintln!("{issue}");
                if issue.level == Level::Error {
                    errors += 1;
                }
            }
        }
    }
    if errors > 0 {
        eprintln!("{errors} error(s); {objects} valid object(s)");
        ExitCode::FAILURE
    } else {
        println!("{objects} object(s) valid");
        ExitCode::SUCCESS
    }
}
