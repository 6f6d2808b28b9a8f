//! Gateway TLS from `credentialName`: the HTTPS server's TLS context asks for the secret
//! `kubernetes://NAME` over ADS (and `kubernetes://NAME-cacert` for MUTUAL), and meshd
//! serves it from the Kubernetes Secret NAME in the gateway's own namespace, as istiod
//! does. Only a gateway that proved its identity (the secure port) gets either: a private
//! key never goes to a connection without one.

use envoy_api::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch};
use envoy_api::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, DownstreamTlsContext, SdsSecretConfig, Secret,
    common_tls_context::ValidationContextType,
};
use envoy_api::pb::google::protobuf::BoolValue;
use envoy_api::util::pack_any;

use super::ads_config_source;
use super::tls::{certificate_secret, tls_transport_socket, validation_secret};
use std::sync::Arc;

use api::AnyObject;
use api::networking::{ClientTlsMode, ClientTlsSettings};
use api::values::{server_tls_field, server_tls_mode};
use model::config::Spec;
use model::mesh::MeshConfig;
use model::tls::TlsParams;
use model::{Proxy, PushContext, Service};

/// A Gateway server's `tls` block, as far as meshd serves it.
#[derive(Clone, Debug, PartialEq)]
pub enum ServerTls {
    /// SIMPLE, MUTUAL or OPTIONAL_MUTUAL with a `credentialName`: the Secret's name in the
    /// gateway's namespace; `mutual`: a client's certificate is verified against the
    /// credential's CA, and `required` (MUTUAL, not OPTIONAL_MUTUAL) unless absent.
    Credential {
        credential: String,
        mutual: bool,
        required: bool,
        params: TlsParams,
    },
    /// SIMPLE, MUTUAL or OPTIONAL_MUTUAL with `serverCertificate` and `privateKey` (and,
    /// when mutual, `caCertificates`) files in the gateway's container, served by its
    /// agent as istiod names them (`file-cert:CERT~KEY`, `file-root:CA`).
    Files {
        cert: String,
        key: String,
        ca: Option<String>,
        required: bool,
        params: TlsParams,
    },
    /// ISTIO_MUTUAL: the gateway's own workload certificate (SDS `default` from its
    /// agent), clients' certificates verified against the mesh's roots (`ROOTCA`) and,
    /// if the server lists them, its `subjectAltNames`.
    Mesh { subject_alt_names: Vec<String> },
}

impl ServerTls {
    /// Reads `{mode: SIMPLE|MUTUAL|OPTIONAL_MUTUAL}` with a `credentialName` or certificate
    /// files, and `{mode: ISTIO_MUTUAL}`; `None` for anything else (PASSTHROUGH,
    /// AUTO_PASSTHROUGH, incomplete files), which meshd does not serve. The first three
    /// take their versions and suites from `mesh`'s `tlsDefaults` and the server.
    pub fn from_server(
        tls: Option<&AnyObject>,
        gateway_namespace: &str,
        mesh: &MeshConfig,
    ) -> Option<ServerTls> {
        let tls = tls?;
        let mode = server_tls_mode(tls);
        if mode == "ISTIO_MUTUAL" {
            let sans = (tls.get("subjectAltNames").and_then(|v| v.as_array()))
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            return Some(ServerTls::Mesh {
                subject_alt_names: sans,
            });
        }
        let (mutual, required) = match mode.as_str() {
            "SIMPLE" => (false, false),
            "MUTUAL" => (true, true),
            "OPTIONAL_MUTUAL" => (true, false),
            _ => return None,
        };
        let text = |key: &str| server_tls_field(tls, key).map(str::to_string);
        let params = TlsParams::gateway_server(mesh, tls);
        let Some(name) = text("credentialName") else {
            let ca = text("caCertificates");
            if mutual && ca.is_none() {
                return None;
            }
            return Some(ServerTls::Files {
                cert: text("serverCertificate")?,
                key: text("privateKey")?,
                ca: ca.filter(|_| mutual),
                required,
                params,
            });
        };
        let name =
            (name.strip_prefix("kubernetes://")).map_or_else(|| name.clone(), str::to_string);
        // `ns/name` names another namespace: only the gateway's own is served.
        let name = match name.split_once('/') {
            Some((ns, n)) if ns == gateway_namespace => n.to_string(),
            Some(_) => return None,
            None => name,
        };
        Some(ServerTls::Credential {
            credential: name,
            mutual,
            required,
            params,
        })
    }

    /// The credential it reads over ADS, if any.
    pub fn credential_use(&self) -> Option<CredentialUse> {
        match self {
            ServerTls::Credential {
                credential, mutual, ..
            } => Some(CredentialUse::server(credential, *mutual)),
            ServerTls::Files { .. } | ServerTls::Mesh { .. } => None,
        }
    }
}

/// One credential a proxy's configuration refers to, and which of its parts: the
/// certificate and key (`kubernetes://NAME`), the CA (`kubernetes://NAME-cacert`).
#[derive(Clone, Debug, PartialEq)]
pub struct CredentialUse {
    pub credential: String,
    pub cert: bool,
    pub ca: bool,
}

impl CredentialUse {
    /// What a DestinationRule's `SIMPLE` or `MUTUAL` TLS with a `credentialName` needs at
    /// a gateway: the certificate for `MUTUAL`, the CA unless `insecureSkipVerify`.
    pub fn of_client(tls: &ClientTlsSettings) -> Option<CredentialUse> {
        let name = tls.credential_name.as_deref().filter(|n| !n.is_empty())?;
        let mutual = match tls.mode {
            Some(ClientTlsMode::Simple) => false,
            Some(ClientTlsMode::Mutual) => true,
            _ => return None,
        };
        Some(CredentialUse {
            credential: name
                .strip_prefix("kubernetes://")
                .unwrap_or(name)
                .to_string(),
            cert: mutual,
            ca: tls.insecure_skip_verify != Some(true),
        })
    }

    /// What a server terminating with the credential needs: its certificate, and its CA
    /// when clients' certificates are verified (`mutual`).
    pub fn server(credential: &str, mutual: bool) -> CredentialUse {
        CredentialUse {
            credential: credential.to_string(),
            cert: true,
            ca: mutual,
        }
    }

    pub fn cert_resource(&self) -> String {
        format!("kubernetes://{}", self.credential)
    }

    pub fn ca_resource(&self) -> String {
        format!("kubernetes://{}-cacert", self.credential)
    }
}

/// The credentials the DestinationRules of `services` originate TLS with (their own
/// policies, their subsets' and port-level ones), as a gateway needs them.
pub fn destination_rule_uses(
    ctx: &PushContext,
    proxy: &Proxy,
    services: &[&Arc<Service>],
) -> Vec<CredentialUse> {
    services
        .iter()
        .flat_map(|svc| {
            let rule = ctx.service_rule(proxy, svc);
            super::cluster::policies(svc, rule.map(|r| &**r))
        })
        .flatten()
        .filter_map(|p| CredentialUse::of_client(p.tls.as_ref()?))
        .collect()
}

pub(super) fn ads_secret(name: String) -> SdsSecretConfig {
    SdsSecretConfig {
        name,
        sds_config: Some(ads_config_source()),
    }
}

/// The filter chain of one HTTPS (or terminated TLS) server: SNI match on its hosts (none
/// if `*` is one), its TLS (the credential over ADS, or the mesh's certificates), then
/// `filters`.
pub fn https_chain(
    hosts: &[String],
    tls: &ServerTls,
    filters: Vec<envoy_api::pb::envoy::config::listener::v3::Filter>,
) -> FilterChain {
    let mut server_names: Vec<String> = hosts
        .iter()
        .map(|h| h.split_once('/').map_or(h.as_str(), |(_, h)| h).to_string())
        .collect();
    server_names.sort();
    server_names.dedup();
    if server_names.iter().any(|h| h == "*") {
        server_names.clear();
    }
    let alpn = vec!["h2".to_string(), "http/1.1".to_string()];
    // The certificate, the CA that verifies clients (if any), whether one is required,
    // and the versions and suites.
    let terminate =
        |cert: SdsSecretConfig, ca: Option<SdsSecretConfig>, required: bool, params: &TlsParams| {
            let ctx = DownstreamTlsContext {
                common_tls_context: Some(CommonTlsContext {
                    tls_params: super::tls::envoy_tls_params(params),
                    alpn_protocols: alpn.clone(),
                    tls_certificate_sds_secret_configs: vec![cert],
                    validation_context_type: ca
                        .map(ValidationContextType::ValidationContextSdsSecretConfig),
                    ..Default::default()
                }),
                require_client_certificate: Some(BoolValue { value: required }),
                ..Default::default()
            };
            tls_transport_socket(pack_any(ctx))
        };
    let transport_socket = match tls {
        ServerTls::Credential {
            credential,
            mutual,
            required,
            params,
        } => {
            let uses = CredentialUse::server(credential, *mutual);
            terminate(
                ads_secret(uses.cert_resource()),
                mutual.then(|| ads_secret(uses.ca_resource())),
                *required,
                params,
            )
        }
        ServerTls::Files {
            cert,
            key,
            ca,
            required,
            params,
        } => terminate(
            super::tls::sds(&super::tls::file_cert(cert, key)),
            ca.as_deref()
                .map(|ca| super::tls::sds(&super::tls::file_root(ca))),
            *required,
            params,
        ),
        ServerTls::Mesh { subject_alt_names } => {
            super::tls::downstream_with(alpn.clone(), subject_alt_names)
        }
    };
    FilterChain {
        // As istiod's: a chain that matches every connection has no match at all.
        filter_chain_match: (!server_names.is_empty()).then(|| FilterChainMatch {
            server_names,
            ..Default::default()
        }),
        transport_socket: Some(transport_socket),
        filters,
        ..Default::default()
    }
}

/// The SDS resources for `credentials`, from Secrets in the proxy's namespace. A missing
/// Secret (or one without a key) yields nothing: Envoy keeps that listener or cluster
/// warming rather than serving without a certificate.
pub fn secrets(ctx: &PushContext, proxy: &Proxy, credentials: &[CredentialUse]) -> Vec<Secret> {
    let lookup = |name: &str| {
        ctx.secrets
            .get(&(proxy.namespace.clone(), name.to_string()))
            .and_then(|o| match &o.spec {
                Spec::Secret(s) => Some(s),
                _ => None,
            })
    };
    let mut out = Vec::new();
    for tls in credentials {
        let Some(s) = lookup(&tls.credential) else {
            continue;
        };
        if tls.cert
            && let (Some(cert), Some(key)) = (&s.cert, &s.key)
        {
            out.push(certificate_secret(&tls.cert_resource(), cert, key));
        }
        if tls.ca {
            // The CA is in the credential itself (ca.crt) or in NAME-cacert, as in Istio.
            let ca = s.ca.clone().or_else(|| {
                lookup(&format!("{}-cacert", tls.credential))
                    .and_then(|c| c.ca.clone().or_else(|| c.cert.clone()))
            });
            if let Some(ca) = ca {
                out.push(validation_secret(&tls.ca_resource(), &ca));
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.dedup_by(|a, b| a.name == b.name);
    out
}
