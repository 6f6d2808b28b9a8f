//! Who is calling: a workload proves its identity with a client certificate this CA issued
//! (renewal, and every xDS connection after the first), or with a bearer token: a
//! Kubernetes service-account JWT checked by TokenReview (audience `istio-ca`), or in local
//! mode a bootstrap token from a file.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use tonic::metadata::MetadataMap;

use super::{CaError, Identity};

/// The audience a service-account token must carry (`TOKEN_AUDIENCES`).
pub const DEFAULT_AUDIENCE: &str = "istio-ca";

/// How bearer tokens are checked.
pub enum TokenVerifier {
    /// No tokens accepted: only client certificates.
    None,
    /// Local mode: `TOKEN NAMESPACE SERVICE_ACCOUNT` lines from a file.
    Static(HashMap<String, (String, String)>),
    /// Kubernetes: a TokenReview for these audiences.
    TokenReview {
        client: kube::Client,
        audiences: Vec<String>,
    },
}

impl TokenVerifier {
    /// Reads a bootstrap token file: one `TOKEN NAMESPACE SERVICE_ACCOUNT` per line, `#`
    /// comments and blank lines ignored.
    pub fn from_file(path: &Path) -> anyhow::Result<TokenVerifier> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading the token file {}: {e}", path.display()))?;
        let mut tokens = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let parts: Vec<&str> = line.split_whitespace().collect();
            let [token, namespace, sa] = parts[..] else {
                anyhow::bail!(
                    "{}:{}: expected `TOKEN NAMESPACE SERVICE_ACCOUNT`",
                    path.display(),
                    n + 1
                );
            };
            tokens.insert(token.to_string(), (namespace.to_string(), sa.to_string()));
        }
        Ok(TokenVerifier::Static(tokens))
    }
}

/// Authenticates callers of the CA and of the secure xDS port.
pub struct Authenticator {
    pub trust_domain: String,
    pub tokens: TokenVerifier,
}

impl Authenticator {
    pub fn new(trust_domain: &str, tokens: TokenVerifier) -> Arc<Authenticator> {
        Arc::new(Authenticator {
            trust_domain: trust_domain.to_string(),
            tokens,
        })
    }

    /// The caller's identity: from its (already chain-verified) client certificate if it
    /// presented one (`peer`: the certificate's SPIFFE identities), else from its bearer
    /// token.
    pub async fn authenticate(
        &self,
        peer: Option<&[Identity]>,
        metadata: &MetadataMap,
    ) -> Result<Identity, CaError> {
        if let Some(ids) = peer {
            return match ids {
                [id] if id.trust_domain == self.trust_domain => Ok(id.clone()),
                [id] => Err(CaError::Unauthenticated(format!(
                    "the client certificate's identity {id} is not in trust domain {}",
                    self.trust_domain
                ))),
                _ => Err(CaError::Unauthenticated(
                    "the client certificate carries no single SPIFFE identity".into(),
                )),
            };
        }
        let token = bearer(metadata)?;
        match &self.tokens {
            TokenVerifier::None => Err(CaError::Unauthenticated(
                "no client certificate, and this CA accepts no tokens".into(),
            )),
            TokenVerifier::Static(tokens) => {
                let (ns, sa) = tokens.get(token).ok_or_else(|| {
                    CaError::Unauthenticated("the bearer token is not known".into())
                })?;
                Ok(Identity::new(&self.trust_domain, ns, sa))
            }
            TokenVerifier::TokenReview { client, audiences } => {
                self.token_review(client, audiences, token).await
            }
        }
    }

    async fn token_review(
        &self,
        client: &kube::Client,
        audiences: &[String],
        token: &str,
    ) -> Result<Identity, CaError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: Some(audiences.to_vec()),
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(client.clone());
        let result = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| CaError::Unauthenticated(format!("TokenReview failed: {e}")))?;
        let status = result.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err(CaError::Unauthenticated(format!(
                "the token was not accepted by the API server: {}",
                status.error.unwrap_or_else(|| "not authenticated".into())
            )));
        }
        let granted = status.audiences.unwrap_or_default();
        if !audiences.iter().any(|a| granted.contains(a)) {
            return Err(CaError::Unauthenticated(format!(
                "the token is not for audience {audiences:?} (it is for {granted:?})"
            )));
        }
        let user = status.user.and_then(|u| u.username).unwrap_or_default();
        Identity::from_service_account_user(&self.trust_domain, &user)
            .ok_or_else(|| CaError::Unauthenticated(format!("{user:?} is not a service account")))
    }
}

/// The secure xDS port authenticates its streams as the CA authenticates its callers.
impl xds::Authenticate for Authenticator {
    fn authenticate<'a>(
        &'a self,
        peer: Option<&'a [Identity]>,
        metadata: &'a MetadataMap,
    ) -> futures::future::BoxFuture<'a, Result<Identity, Box<dyn std::error::Error + Send + Sync>>>
    {
        Box::pin(async move {
            Authenticator::authenticate(self, peer, metadata)
                .await
                .map_err(Into::into)
        })
    }
}

/// The token of an `authorization: Bearer TOKEN` header.
fn bearer(metadata: &MetadataMap) -> Result<&str, CaError> {
    let value = metadata.get("authorization").ok_or_else(|| {
        CaError::Unauthenticated("no client certificate and no bearer token".into())
    })?;
    value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| CaError::Unauthenticated("malformed authorization header".into()))
}
