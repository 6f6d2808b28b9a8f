//! The simulator's command line.

use super::*;

/// What each change touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// A VirtualService's header match (RDS).
    Vs,
    /// One endpoint added to a service (EDS only).
    Endpoint,
    /// No changes: connect, measure memory, disconnect.
    None,
}

#[derive(Clone, Debug, clap::Args)]
pub struct LoadgenArgs {
    /// The config directory meshd serves; the generated mesh and every change are written
    /// there (its *.yaml files are replaced). With --kubernetes it holds only the
    /// kubeconfig; meshd's log and CA directory go next to it.
    #[arg(long)]
    pub config_dir: PathBuf,
    /// Start meshd (this binary) on the config directory, on free local ports, instead
    /// of using a running one at --xds / --monitoring.
    #[arg(long)]
    pub spawn_meshd: bool,
    /// Serve the mesh from the Kubernetes API server of `--kubeconfig` instead of the
    /// config directory: the mesh and each change are written to it by server-side apply,
    /// and the server watches it as it watches a cluster (the spawned meshd, or a running
    /// server such as istiod at --xds).
    #[arg(long, requires = "kubeconfig")]
    pub kubernetes: bool,
    /// The cluster `--kubernetes` writes to and the server watches.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// A running server's xDS address (meshd's, or istiod's plaintext 15010).
    #[arg(long, default_value = "127.0.0.1:15010")]
    pub xds: String,
    /// A running server's monitoring address (`/metrics`: RSS, CPU; istiod's 15014).
    #[arg(long, default_value = "127.0.0.1:15014")]
    pub monitoring: String,
    /// Simulated sidecars, spread over the namespaces.
    #[arg(long, default_value_t = 100)]
    pub proxies: usize,
    /// Simulated ingress gateways (istio-system, `istio: ingressgateway`).
    #[arg(long, default_value_t = 0)]
    pub gateways: usize,
    /// State of the world instead of delta.
    #[arg(long)]
    pub sotw: bool,
    /// New proxies per second.
    #[arg(long, default_value_t = 1000.0)]
    pub connect_rate: f64,
    /// Proxies sharing one gRPC connection (1: one each, as real Envoys). Shared
    /// connections go through hyper's HTTP/2 client.
    #[arg(long, default_value_t = 1)]
    pub proxies_per_connection: usize,
    /// Each proxy's connection through hyper's HTTP/2 client instead of the simulator's
    /// own (`h2c.rs`), to compare what the simulator costs.
    #[arg(long)]
    pub hyper_client: bool,
    /// The first N sidecars NACK every route configuration.
    #[arg(long, default_value_t = 0)]
    pub nack_proxies: usize,
    /// Sidecars whose agents capture DNS, as `ISTIO_META_DNS_CAPTURE=true` makes them:
    /// their nodes say `DNS_CAPTURE`, and each asks for its DNS name table (NDS) after its
    /// listeners, as istio-agent does, and ACKs it.
    #[arg(long)]
    pub dns_capture: bool,
    #[arg(long, default_value_t = 100)]
    pub services: usize,
    #[arg(long, default_value_t = 10)]
    pub namespaces: usize,
    #[arg(long, default_value_t = 3)]
    pub endpoints: usize,
    /// Every Nth service gets a VirtualService and DestinationRule.
    #[arg(long, default_value_t = 10)]
    pub routed_every: usize,
    /// A Sidecar per namespace scoping its proxies to that namespace.
    #[arg(long)]
    pub sidecar_scoped: bool,
    /// Bind the routed services' VirtualServices to the ingress Gateway too (host
    /// `svc-N.example.com`). The gateways are then measured like sidecars: a
    /// VirtualService change reaches them, and they hold every service's endpoints.
    /// Without it the gateways are connected but not measured.
    #[arg(long)]
    pub gateway_routes: bool,
    #[arg(long, value_enum, default_value = "vs")]
    pub change: Change,
    /// Changes to make, one at a time.
    #[arg(long, default_value_t = 5)]
    pub changes: usize,
    /// Services each change touches (written together, inside one debounce window).
    #[arg(long, default_value_t = 1)]
    pub services_per_change: usize,
    /// After the changes, a change storm: this many config writes per second (0: none),
    /// each adding a new endpoint address to one of --storm-services services.
    #[arg(long, default_value_t = 0.0)]
    pub storm_rate: f64,
    /// Services the storm's writes cycle over.
    #[arg(long, default_value_t = 3)]
    pub storm_services: usize,
    /// How long the change storm lasts.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub storm_duration: Duration,
    /// Connect to meshd's secure port (15012's counterpart) over TLS, each proxy
    /// presenting a workload certificate of its namespace signed by meshd's CA, as
    /// sidecars connect in Istio. The certificates are signed with the CA key of the
    /// meshd it spawns, or of the running one whose --ca-dir is given (--xds is then its
    /// secure port). Uses the simulator's own HTTP/2 client.
    #[arg(long, conflicts_with_all = ["hyper_client", "proxies_per_connection"])]
    pub secure: bool,
    /// With --secure and a running meshd: that meshd's CA directory.
    #[arg(long)]
    pub ca_dir: Option<PathBuf>,
    /// Connect this many proxies first, wait until they hold their configuration and
    /// meshd's RSS has settled, then connect the rest and report what each of those cost
    /// (`meshd.rss_per_added_proxy_bytes`): memory per proxy without what the first proxy
    /// of a namespace makes meshd build once for all of them (the view of its Sidecar
    /// scope). With --namespaces N, N warm proxies are one per namespace. The connect rate
    /// and initial-config times are then the other proxies'. 0: no warm-up.
    #[arg(long, default_value_t = 0)]
    pub warm_proxies: usize,
    /// How long the whole fleet may take to hold its initial configuration.
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration)]
    pub init_timeout: Duration,
    /// How long a change may take to reach every affected proxy.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub change_timeout: Duration,
    /// After a change converged, how long to keep watching for pushes to proxies it does
    /// not affect.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    pub settle: Duration,
    /// At the end, restart the meshd this run started (--spawn-meshd) on the same ports
    /// and measure how long the fleet takes to reconnect and hold its configuration
    /// again, and meshd's memory meanwhile.
    #[arg(long, requires = "spawn_meshd")]
    pub restart: bool,
    /// Write the JSON summary here (it is always printed on stdout).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Progress as plain lines on stderr even when it is not a terminal (for scripts that
    /// wait for a phase, such as scripts/fleet-flamegraph.sh).
    #[arg(long)]
    pub progress_lines: bool,
}

impl LoadgenArgs {
    /// Whether the proxies' streams go through hyper's HTTP/2 client: asked for, or
    /// needed for connections shared by several proxies.
    pub(crate) fn through_hyper(&self) -> bool {
        self.hyper_client || self.proxies_per_connection > 1
    }
}
