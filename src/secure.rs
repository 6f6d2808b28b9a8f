//! The secure port (15012): the CA's `IstioCertificateService` and ADS over TLS, on one
//! gRPC server; and the validation webhook's HTTPS port (15017, [`crate::webhook`]).
//! meshd's serving certificate comes from its own CA and is renewed at half its life; a
//! self-signed root is rotated when a fifth of its life is left. Both apply to new
//! connections without a restart.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use tokio::sync::watch;
use tokio_stream::StreamExt;

use crate::ca::authn::{Authenticator, DEFAULT_AUDIENCE, TokenVerifier};
use crate::ca::persist::{CaStore, RootOptions, needs_rotation};
use crate::ca::service::{CaService, UpstreamCa};
use crate::ca::{CertTtl, CertificateAuthority};
use crate::metrics::Metrics;
use xds::{AdsService, XdsShared};

/// How the secure port and the CA are set up.
#[derive(Clone, Debug)]
pub struct SecurityOptions {
    /// `None` turns the secure port (and the CA) off.
    pub address: Option<SocketAddr>,
    /// The validation webhook's HTTPS port (istiod's 15017, `--httpsAddr`); served with
    /// the same certificate, only when the secure port is on.
    pub webhook_address: Option<SocketAddr>,
    pub trust_domain: String,
    pub ttl: CertTtl,
    pub root: RootOptions,
    /// Local mode: where the self-signed root is kept.
    pub ca_dir: PathBuf,
    /// Local mode: bootstrap tokens (`TOKEN NAMESPACE SERVICE_ACCOUNT` lines).
    pub token_file: Option<PathBuf>,
    /// Kubernetes mode: accepted token audiences (`TOKEN_AUDIENCES`).
    pub audiences: Vec<String>,
    /// Names in meshd's serving certificate.
    pub dns_names: Vec<String>,
    /// Forward certificate requests to this CA instead of signing (`EXTERNAL_CA`).
    pub external_ca: Option<UpstreamCa>,
    /// Kubernetes mode: the ConfigMap written with the roots into every discovered
    /// namespace (`PILOT_CA_CERT_CONFIGMAP`).
    pub root_cert_configmap: String,
}

impl SecurityOptions {
    /// Istio's defaults: trust domain `cluster.local`, names `istiod.istio-system.svc` and
    /// `localhost`, audience `istio-ca`.
    pub fn defaults(address: Option<SocketAddr>) -> SecurityOptions {
        SecurityOptions {
            address,
            webhook_address: None,
            trust_domain: "cluster.local".into(),
            ttl: CertTtl::default(),
            root: RootOptions {
                ttl: Duration::from_secs(3650 * 24 * 3600),
                cacerts_dir: None,
            },
            ca_dir: PathBuf::from(".meshd/ca"),
            token_file: None,
            audiences: vec![DEFAULT_AUDIENCE.into()],
            dns_names: vec![
                "istiod.istio-system.svc".into(),
                "localhost".into(),
                "127.0.0.1".into(),
            ],
            external_ca: None,
            root_cert_configmap: crate::k8s::root_cert::DEFAULT_NAME.into(),
        }
    }
}

/// How long meshd's own serving certificate lives; it is renewed at half that.
const SERVING_TTL: Duration = Duration::from_secs(24 * 3600);
/// How often the root and serving certificate are checked.
const CHECK_EVERY: Duration = Duration::from_secs(60);

/// The running CA and what the secure port needs.
pub struct Security {
    pub ca: Arc<CertificateAuthority>,
    pub authn: Arc<Authenticator>,
    upstream: Option<UpstreamCa>,
    configs: watch::Receiver<Arc<rustls::ServerConfig>>,
}

impl Security {
    /// Loads (or makes and persists) the CA material and starts keeping it fresh.
    pub async fn start(
        opts: &SecurityOptions,
        client: Option<kube::Client>,
        namespace: &str,
    ) -> anyhow::Result<Security> {
        let store = match &client {
            Some(client) => CaStore::Secret {
                client: client.clone(),
                namespace: namespace.to_string(),
            },
            None => CaStore::Dir(opts.ca_dir.clone()),
        };
        let material = store
            .load_or_create(&opts.trust_domain, &opts.root)
            .await
            .context("setting up the CA")?;
        let ca = Arc::new(CertificateAuthority::new(
            &opts.trust_domain,
            opts.ttl,
            material,
        ));
        let tokens = match (&opts.token_file, client) {
            (Some(file), _) => TokenVerifier::from_file(file)?,
            (None, Some(client)) => TokenVerifier::TokenReview {
                client,
                audiences: opts.audiences.clone(),
            },
            (None, None) => TokenVerifier::None,
        };
        let authn = Authenticator::new(&opts.trust_domain, tokens);
        let (config, renew_at) = serving_config(&ca, &opts.dns_names)?;
        let (tx, configs) = watch::channel(config);
        tokio::spawn(maintain(ca.clone(), store, opts.clone(), tx, renew_at));
        Ok(Security {
            ca,
            authn,
            upstream: opts.external_ca.clone(),
            configs,
        })
    }

    /// Serves the validation webhook (HTTP/1.1 over TLS, with the secure port's
    /// certificate) on `listener` until `shutdown` changes.
    pub fn serve_webhook(
        &self,
        listener: tokio::net::TcpListener,
        metrics: Arc<Metrics>,
        state: crate::webhook::WebhookState,
        mut shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
        let local = listener.local_addr()?;
        let incoming = transport::tls::incoming_with_alpn(
            listener,
            self.configs.clone(),
            Some(&[b"http/1.1"]),
            transport::tls::HandshakeErrors {
                family: metrics.tls_handshake_errors.clone(),
                port: "webhook",
            },
            // Webhook requests are few and come from the API server.
            transport::admission::Admission::new(0, Default::default()),
        )
        .map(|accepted| accepted.map(|a| a.io));
        let listener = crate::webhook::TlsListener { incoming, local };
        let router = crate::webhook::router(state);
        Ok(tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = shutdown.changed().await;
                })
                .await
        }))
    }

    /// Serves the CA and secure ADS on `listener` until `shutdown` changes.
    pub fn serve(
        &self,
        listener: tokio::net::TcpListener,
        xds: Arc<XdsShared>,
        metrics: Arc<Metrics>,
        shutdown: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        (self.ca).report_expiry(
            metrics.ca.root_cert_expiry.clone(),
            metrics.ca.cert_chain_expiry.clone(),
        );
        let ca = CaService::new(self.ca.clone(), self.authn.clone(), metrics.ca.clone())
            .forwarding_to(self.upstream.clone());
        let settings = xds.grpc_settings();
        let errors = transport::tls::HandshakeErrors {
            family: metrics.tls_handshake_errors.clone(),
            port: "secure",
        };
        let admission = xds.admission();
        let ads = AdsService::secure(xds, self.authn.clone());
        let routes = tonic::service::Routes::new(ca.into_server()).add_service(ads.into_server());
        let incoming = transport::tls::incoming(listener, self.configs.clone(), errors, admission);
        tokio::spawn(transport::grpc::serve(
            incoming,
            routes,
            settings,
            transport::tls::peer_identities,
            shutdown,
        ))
    }
}

/// A fresh serving certificate from the CA, and when to renew it.
fn serving_config(
    ca: &CertificateAuthority,
    dns_names: &[String],
) -> anyhow::Result<(Arc<rustls::ServerConfig>, SystemTime)> {
    let (chain, key) = ca.issue_server_certificate(dns_names, SERVING_TTL)?;
    let config = transport::tls::server_config(&chain, &key, &ca.roots_pem())?;
    Ok((config, SystemTime::now() + SERVING_TTL / 2))
}

/// Rotates a self-signed root that is near its end, and renews the serving certificate.
async fn maintain(
    ca: Arc<CertificateAuthority>,
    store: CaStore,
    opts: SecurityOptions,
    configs: watch::Sender<Arc<rustls::ServerConfig>>,
    mut renew_at: SystemTime,
) {
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        let mut renew = SystemTime::now() >= renew_at;
        if needs_rotation(&ca.material(), SystemTime::now()) {
            match ca.material().rotated(&opts.trust_domain, opts.root.ttl) {
                Ok(new) => {
                    if let Err(e) = store.save(&new).await {
                        tracing::error!("CA: cannot persist the rotated root: {e:#}");
                        continue;
                    }
                    ca.replace_material(new);
                    tracing::info!("CA: rotated the self-signed root; the old one stays trusted");
                    renew = true;
                }
                Err(e) => tracing::error!("CA: root rotation failed: {e}"),
            }
        }
        if renew {
            match serving_config(&ca, &opts.dns_names) {
                Ok((config, at)) => {
                    configs.send_replace(config);
                    renew_at = at;
                }
                Err(e) => tracing::error!("renewing meshd's serving certificate failed: {e:#}"),
            }
        }
    }
}
