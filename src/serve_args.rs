//! `meshd serve`'s groups of flags: sidecar injection and the secure port with its CA.

use std::net::SocketAddr;
use std::path::PathBuf;

use meshd::ca::CertTtl;
use meshd::secure::SecurityOptions;

/// Sidecar injection (`/inject` on the webhook port).
#[derive(clap::Args)]
pub struct InjectArgs {
    /// The image of the injected `istio-proxy` and `istio-init` containers: meshd's agent
    /// with Envoy.
    #[arg(long, env = "MESHD_PROXY_IMAGE", default_value = concat!("ghcr.io/meshd/proxy:", env!("CARGO_PKG_VERSION")))]
    proxy_image: String,
    /// The proxy as a native sidecar (an init container that keeps running): `true`,
    /// `false`, or `auto` (when every kubelet, or the pod's node's, is 1.33 or later).
    #[arg(long, env = "ENABLE_NATIVE_SIDECARS", default_value = "auto")]
    native_sidecars: meshd::inject::NativeSidecars,
    /// Whether pods that do not say (`sidecar.istio.io/inject`) are injected, Istio's
    /// `global.proxy.autoInject`: `enabled` or `disabled`.
    #[arg(long, default_value = "enabled")]
    injection_policy: meshd::inject::Policy,
    /// The cluster's name in the mesh (`ISTIO_META_CLUSTER_ID` of injected proxies).
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    cluster_id: String,
    /// The mesh's id (`ISTIO_META_MESH_ID`); the trust domain when unset.
    #[arg(long, env = "MESH_ID")]
    mesh_id: Option<String>,
    /// Kubernetes mode: the revision's MutatingWebhookConfigurations (`istio.io/rev=REV`)
    /// get meshd's root as the `caBundle` of their `*sidecar-injector.istio.io` webhooks;
    /// empty turns that off (istiod's `INJECTION_WEBHOOK_CONFIG_NAME`).
    #[arg(
        long,
        env = "INJECTION_WEBHOOK_CONFIG_NAME",
        default_value = "istio-sidecar-injector"
    )]
    injection_webhook_config_name: String,
}

impl InjectArgs {
    pub fn options(
        self,
        revision: &str,
        namespace: &str,
        trust_domain: &str,
    ) -> meshd::inject::InjectOptions {
        meshd::inject::InjectOptions {
            revision: revision.to_string(),
            istio_namespace: namespace.to_string(),
            proxy_image: self.proxy_image,
            trust_domain: trust_domain.to_string(),
            cluster_id: self.cluster_id,
            mesh_id: self.mesh_id,
            native_sidecars: self.native_sidecars,
            policy: self.injection_policy,
            patch_ca_bundle: !self.injection_webhook_config_name.is_empty(),
            network: None,
            path_env: Vec::new(),
        }
    }
}

/// The secure port (15012) and the CA.
#[derive(clap::Args)]
pub struct SecurityArgs {
    /// xDS over TLS and the CA's IstioCertificateService, Istio's port 15012.
    #[arg(long, default_value = "0.0.0.0:15012")]
    secure_xds_address: SocketAddr,
    /// The validation webhook (`/validate` over HTTPS, with the secure port's certificate),
    /// istiod's `--httpsAddr` port 15017; `none` turns it off.
    #[arg(long, default_value = "0.0.0.0:15017")]
    webhook_address: String,
    /// The SPIFFE trust domain of issued identities.
    #[arg(long, env = "TRUST_DOMAIN", default_value = "cluster.local")]
    trust_domain: String,
    /// Local mode: where the self-signed root is kept (made on first start).
    #[arg(long, env = "MESHD_CA_DIR", default_value = ".meshd/ca")]
    ca_dir: PathBuf,
    /// Plugged-in CA files (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem), used
    /// when the directory holds ca-key.pem; in Kubernetes mode the Secret `cacerts`.
    #[arg(long, default_value = "/etc/cacerts")]
    cacerts_dir: PathBuf,
    /// Local mode: bootstrap tokens, one `TOKEN NAMESPACE SERVICE_ACCOUNT` per line.
    #[arg(long, env = "MESHD_CA_TOKEN_FILE")]
    ca_token_file: Option<PathBuf>,
    /// Audiences a service-account token must carry (Kubernetes mode).
    #[arg(
        long,
        env = "TOKEN_AUDIENCES",
        default_value = "istio-ca",
        value_delimiter = ','
    )]
    token_audiences: Vec<String>,
    /// Lifetime of a workload certificate when the request asks for none
    /// (`DEFAULT_WORKLOAD_CERT_TTL`; `PILOT_WORKLOAD_CERT_TTL` is read too).
    #[arg(long, env = "DEFAULT_WORKLOAD_CERT_TTL", value_parser = parse_duration)]
    workload_cert_ttl: Option<std::time::Duration>,
    /// No workload certificate lives longer.
    #[arg(long, env = "MAX_WORKLOAD_CERT_TTL", default_value = "2160h", value_parser = parse_duration)]
    max_workload_cert_ttl: std::time::Duration,
    /// Lifetime of a self-signed root.
    #[arg(long, env = "CITADEL_SELF_SIGNED_CA_CERT_TTL", default_value = "87600h", value_parser = parse_duration)]
    self_signed_ca_cert_ttl: std::time::Duration,
    /// Extra names (DNS or IP) in meshd's serving certificate.
    #[arg(long, value_delimiter = ',')]
    serving_names: Vec<String>,
    /// Kubernetes mode: the ConfigMap that carries the CA's roots (key `root-cert.pem`)
    /// into every discovered namespace, for sidecars to mount.
    #[arg(
        long,
        env = "PILOT_CA_CERT_CONFIGMAP",
        default_value = "istio-ca-root-cert"
    )]
    ca_cert_configmap: String,
    /// Forward certificate requests to this Istio-compatible CA (`https://HOST:PORT`)
    /// instead of signing them: this instance still authenticates the caller and checks
    /// its CSR, and the external CA authenticates the caller's token again.
    #[arg(long, env = "EXTERNAL_CA")]
    external_ca: Option<String>,
    /// The root the external CA's serving certificate chains to (PEM file).
    #[arg(long, env = "EXTERNAL_CA_ROOT_CERT")]
    external_ca_root_cert: Option<PathBuf>,
    /// The name the external CA's serving certificate carries.
    #[arg(long, default_value = "istiod.istio-system.svc")]
    external_ca_server_name: String,
    /// Who signs this instance's own serving certificate, istiod's `PILOT_CERT_PROVIDER`:
    /// only `istiod` (its own CA, the default) is supported; istiod's `kubernetes`,
    /// `custom` and `none` are refused at start-up rather than silently ignored.
    #[arg(long, env = "PILOT_CERT_PROVIDER", default_value = "istiod")]
    cert_provider: String,
}

impl SecurityArgs {
    pub fn options(self) -> Result<SecurityOptions, String> {
        if self.cert_provider != "istiod" {
            return Err(format!(
                "PILOT_CERT_PROVIDER={:?} is not supported: meshd's serving certificate comes \
                 from its own CA (PILOT_CERT_PROVIDER=istiod, the default); plug a CA of your \
                 own in through cacerts (--cacerts-dir) or EXTERNAL_CA instead",
                self.cert_provider
            ));
        }
        let mut opts = SecurityOptions::defaults(Some(self.secure_xds_address));
        opts.webhook_address = match self.webhook_address.as_str() {
            "none" => None,
            address => {
                Some((address.parse()).map_err(|e| format!("--webhook-address {address:?}: {e}"))?)
            }
        };
        let default_ttl = match self.workload_cert_ttl {
            Some(ttl) => ttl,
            None => match std::env::var("PILOT_WORKLOAD_CERT_TTL") {
                Ok(v) => parse_duration(&v).map_err(|e| format!("PILOT_WORKLOAD_CERT_TTL: {e}"))?,
                Err(_) => opts.ttl.default,
            },
        };
        opts.trust_domain = self.trust_domain;
        opts.ttl = CertTtl {
            default: default_ttl,
            max: self.max_workload_cert_ttl,
        };
        opts.root.ttl = self.self_signed_ca_cert_ttl;
        opts.root.cacerts_dir = Some(self.cacerts_dir);
        opts.ca_dir = self.ca_dir;
        opts.token_file = self.ca_token_file;
        opts.audiences = self.token_audiences;
        opts.dns_names.extend(self.serving_names);
        opts.root_cert_configmap = self.ca_cert_configmap;
        if let Some(address) = self.external_ca {
            let root = self
                .external_ca_root_cert
                .ok_or("--external-ca needs --external-ca-root-cert")?;
            let root_pem = std::fs::read_to_string(&root)
                .map_err(|e| format!("reading {}: {e}", root.display()))?;
            opts.external_ca = Some(meshd::ca::service::UpstreamCa {
                address,
                root_pem,
                server_name: self.external_ca_server_name,
            });
        }
        Ok(opts)
    }
}

/// A Go-style duration (`100ms`, `1h30m`), as Istio's environment variables take them.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, api::duration::DurationError> {
    api::duration::parse(text)
}
