//! Where the CA's material comes from and is kept, as istiod does it:
//!
//! 1. plugged-in certificates (`cacerts`: a directory, or the Secret `cacerts` in the
//!    control plane's namespace) are used as they are;
//! 2. otherwise the self-signed root kept in the Secret `istio-ca-secret` (Kubernetes) or
//!    a directory (local mode) is loaded;
//! 3. otherwise a new self-signed root is made and written there, so a restart keeps it.
//!
//! A self-signed root is re-issued (same key) when less than a fifth of its life is left;
//! the old root stays in the trust bundle until it expires.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};

use super::material::{Files, Material};

/// Istio's names.
pub const SELF_SIGNED_SECRET: &str = "istio-ca-secret";
pub const PLUGGED_SECRET: &str = "cacerts";

/// Where the CA keeps its material.
#[derive(Clone)]
pub enum CaStore {
    /// Local mode: a directory for the self-signed root.
    Dir(PathBuf),
    /// Kubernetes: Secrets in the control plane's namespace.
    Secret {
        client: kube::Client,
        namespace: String,
    },
}

/// How the root is made.
#[derive(Clone, Debug)]
pub struct RootOptions {
    /// `CITADEL_SELF_SIGNED_CA_CERT_TTL` (default 10 years).
    pub ttl: Duration,
    /// A directory of plugged-in `cacerts` files, used if it holds `ca-key.pem`.
    pub cacerts_dir: Option<PathBuf>,
}

impl CaStore {
    /// The material to sign with, made and persisted on first start.
    pub async fn load_or_create(
        &self,
        trust_domain: &str,
        opts: &RootOptions,
    ) -> anyhow::Result<Material> {
        if let Some(dir) = &opts.cacerts_dir
            && let Some(m) = Material::load_dir(dir)?
        {
            tracing::info!(dir = %dir.display(), "CA: using plugged-in certificates");
            return Ok(m);
        }
        match self {
            CaStore::Dir(dir) => {
                if let Some(m) = Material::load_dir(dir)? {
                    tracing::info!(dir = %dir.display(), "CA: loaded the self-signed root");
                    return Ok(m);
                }
                let m = Material::self_signed(trust_domain, opts.ttl)?;
                m.save_dir(dir)?;
                tracing::info!(dir = %dir.display(), "CA: created a self-signed root");
                Ok(m)
            }
            CaStore::Secret { client, namespace } => {
                let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
                if let Some(s) = api.get_opt(PLUGGED_SECRET).await? {
                    tracing::info!(
                        "CA: using plugged-in certificates from Secret {PLUGGED_SECRET}"
                    );
                    return Ok(Material::from_files(&files_of(&s))?);
                }
                if let Some(s) = api.get_opt(SELF_SIGNED_SECRET).await? {
                    tracing::info!("CA: loaded the self-signed root from {SELF_SIGNED_SECRET}");
                    return Ok(Material::from_files(&files_of(&s))?);
                }
                let m = Material::self_signed(trust_domain, opts.ttl)?;
                match api
                    .create(&PostParams::default(), &secret_of(&m, namespace)?)
                    .await
                {
                    Ok(_) => {
                        tracing::info!("CA: created a self-signed root in {SELF_SIGNED_SECRET}");
                        Ok(m)
                    }
                    // Another replica made one first: use that, so every replica agrees.
                    Err(kube::Error::Api(e)) if e.code == 409 => {
                        let s = api.get(SELF_SIGNED_SECRET).await?;
                        Ok(Material::from_files(&files_of(&s))?)
                    }
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// Writes rotated material back where it came from.
    pub async fn save(&self, m: &Material) -> anyhow::Result<()> {
        match self {
            CaStore::Dir(dir) => Ok(m.save_dir(dir)?),
            CaStore::Secret { client, namespace } => {
                let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
                api.replace(
                    SELF_SIGNED_SECRET,
                    &PostParams::default(),
                    &secret_of(m, namespace)?,
                )
                .await?;
                Ok(())
            }
        }
    }
}

/// Whether a self-signed root should be re-issued: less than a fifth of its life left.
pub fn needs_rotation(m: &Material, now: SystemTime) -> bool {
    if !m.self_signed {
        return false;
    }
    let life = m
        .not_after()
        .duration_since(m.not_before())
        .unwrap_or_default();
    let left = m.not_after().duration_since(now).unwrap_or_default();
    left < life / 5
}

fn files_of(s: &Secret) -> Files {
    let data = s.data.clone().unwrap_or_default();
    let get = |k: &str| {
        data.get(k)
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .unwrap_or_default()
    };
    Files {
        ca_cert: get("ca-cert.pem"),
        ca_key: get("ca-key.pem"),
        cert_chain: get("cert-chain.pem"),
        root_cert: get("root-cert.pem"),
    }
}

fn secret_of(m: &Material, namespace: &str) -> anyhow::Result<Secret> {
    let f = m.to_files()?;
    let data: BTreeMap<String, ByteString> = [
        ("ca-cert.pem", f.ca_cert),
        ("ca-key.pem", f.ca_key),
        ("cert-chain.pem", f.cert_chain),
        ("root-cert.pem", f.root_cert),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
    .collect();
    Ok(Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(SELF_SIGNED_SECRET.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        type_: Some("istio.io/ca-root".into()),
        data: Some(data),
        ..Default::default()
    })
}
