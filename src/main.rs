//! The `meshd` binary: `serve`, `crds`, `validate`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use meshd::config::Level;
use meshd::config::parse::parse_file;
use meshd::filesource::yaml_files;
use meshd::k8s::Scope;
use meshd::serve::{LeaderOptions, ServeOptions, Source, run};
use meshd::xds::push::PushSettings;

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
        /// How long a status leader's Lease lasts without renewal.
        #[arg(long, default_value = "15s", value_parser = parse_duration)]
        leader_lease_duration: std::time::Duration,
        /// xDS (ADS over gRPC, plaintext), Istio's port 15010.
        #[arg(long, default_value = "0.0.0.0:15010")]
        xds_address: SocketAddr,
        /// Metrics, readiness and debug endpoints, Istio's port 15014.
        #[arg(long, default_value = "0.0.0.0:15014")]
        monitoring_address: SocketAddr,
    },
    /// Print the CustomResourceDefinitions of every Istio kind meshd serves.
    Crds,
    /// Check Istio YAML offline, like `istioctl validate`; exits 1 if anything is invalid.
    Validate {
        /// Files or directories to check.
        #[arg(short = 'f', long = "filename", required = true)]
        paths: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crds => {
            print!("{}", meshd::api::crd::to_yaml());
            ExitCode::SUCCESS
        }
        Command::Validate { paths } => validate(&paths),
        Command::Serve {
            config_dir,
            revision,
            watched_namespaces,
            use_endpoint_slice,
            pod_name,
            pod_namespace,
            leader_lease_duration,
            xds_address,
            monitoring_address,
        } => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "info".into()),
                )
                .with_writer(std::io::stderr)
                .init();
            let push = match PushSettings::from_env() {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("meshd: {e:#}");
                    return ExitCode::from(2);
                }
            };
            let source = match config_dir {
                Some(dir) => Source::ConfigDir(dir),
                None => Source::Kubernetes(Scope {
                    revision: revision.clone(),
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
            let opts = ServeOptions {
                source,
                leader,
                revision,
                xds_address,
                monitoring_address,
                push,
            };
            let runtime =
                tokio::runtime::Runtime::new().expect("BUG: cannot start the tokio runtime");
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

fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    meshd::duration::parse(text)
}
