//! Istio's mutual TLS contexts: the workload certificate (SDS `default`) and the root bundle
//! (SDS `ROOTCA`), both from the local agent's `sds-grpc` cluster, never inline. Outbound
//! verifies the server's SPIFFE identities; inbound requires a client certificate.

use envoy_api::pb::envoy::config::core::v3::{
    ApiConfigSource, ApiVersion, ConfigSource, DataSource, GrpcService, TransportSocket,
    api_config_source::ApiType, config_source::ConfigSourceSpecifier, data_source::Specifier,
    grpc_service, transport_socket,
};
use envoy_api::pb::envoy::extensions::transport_sockets::raw_buffer::v3::RawBuffer;
use envoy_api::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SdsSecretConfig, Secret,
    SubjectAltNameMatcher, TlsCertificate, TlsParameters, UpstreamTlsContext,
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
    secret,
    subject_alt_name_matcher::SanType,
    tls_parameters::TlsProtocol,
};
use envoy_api::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};
use envoy_api::pb::google::protobuf::BoolValue;
use envoy_api::util::pack_any;

use super::duration;
use api::networking::ClientTlsSettings;
use model::tls::{TlsParams, TlsVersion};

/// The SDS secret names the agent serves.
pub const WORKLOAD_SECRET: &str = "default";
pub const ROOT_SECRET: &str = "ROOTCA";
/// The SDS names istiod gives files in the workload's container (DestinationRule TLS
/// origination), which the agent serves: `file-cert:CERT~KEY` and `file-root:CA`, with
/// `file-root:system` for the system's CA bundle.
pub const FILE_CERT_PREFIX: &str = "file-cert:";
pub const FILE_ROOT_PREFIX: &str = "file-root:";
pub const FILE_PAIR_SEPARATOR: char = '~';
pub const SYSTEM_ROOTS: &str = "system";
/// The agent's SDS name for a certificate and key in files.
pub fn file_cert(cert: &str, key: &str) -> String {
    format!("{FILE_CERT_PREFIX}{cert}{FILE_PAIR_SEPARATOR}{key}")
}

/// The agent's SDS name for a CA bundle in a file (or `system`).
pub fn file_root(ca: &str) -> String {
    format!("{FILE_ROOT_PREFIX}{ca}")
}

/// The bootstrap cluster of the agent's SDS socket.
pub const SDS_CLUSTER: &str = "sds-grpc";

/// ALPN a mesh client offers (`istio-peer-exchange`, `istio`; plus `h2` for HTTP/2).
pub fn mesh_alpn(h2: bool) -> Vec<String> {
    let mut alpn = vec!["istio-peer-exchange".to_string(), "istio".to_string()];
    if h2 {
        alpn.push("h2".into());
    }
    alpn
}

/// An SDS secret the local agent serves (over its `sds-grpc` cluster).
pub fn sds(name: &str) -> SdsSecretConfig {
    SdsSecretConfig {
        name: name.to_string(),
        sds_config: Some(ConfigSource {
            config_source_specifier: Some(ConfigSourceSpecifier::ApiConfigSource(
                ApiConfigSource {
                    api_type: ApiType::Grpc as i32,
                    transport_api_version: ApiVersion::V3 as i32,
                    set_node_on_first_message_only: true,
                    grpc_services: vec![GrpcService {
                        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                            grpc_service::EnvoyGrpc {
                                cluster_name: SDS_CLUSTER.into(),
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            )),
            initial_fetch_timeout: Some(duration(std::time::Duration::ZERO)),
            resource_api_version: ApiVersion::V3 as i32,
            ..Default::default()
        }),
    }
}

fn san_matcher(san_type: SanType, value: &str) -> SubjectAltNameMatcher {
    SubjectAltNameMatcher {
        san_type: san_type as i32,
        matcher: Some(StringMatcher {
            match_pattern: Some(MatchPattern::Exact(value.to_string())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// TLS 1.2 to 1.3, as istiod's mesh contexts.
fn tls_params() -> Option<TlsParameters> {
    Some(TlsParameters {
        tls_minimum_protocol_version: TlsProtocol::TlSv12 as i32,
        tls_maximum_protocol_version: TlsProtocol::TlSv13 as i32,
        ..Default::default()
    })
}

fn protocol(version: TlsVersion) -> i32 {
    (match version {
        TlsVersion::Auto => TlsProtocol::TlsAuto,
        TlsVersion::V1_0 => TlsProtocol::TlSv10,
        TlsVersion::V1_1 => TlsProtocol::TlSv11,
        TlsVersion::V1_2 => TlsProtocol::TlSv12,
        TlsVersion::V1_3 => TlsProtocol::TlSv13,
    }) as i32
}

/// Envoy's `tls_params` for `params`; none when all are Envoy's defaults.
pub fn envoy_tls_params(params: &TlsParams) -> Option<TlsParameters> {
    (!params.is_default()).then(|| TlsParameters {
        tls_minimum_protocol_version: protocol(params.min),
        tls_maximum_protocol_version: protocol(params.max),
        cipher_suites: params.cipher_suites.clone(),
        ecdh_curves: params.ecdh_curves.clone(),
        ..Default::default()
    })
}

/// A subject alt name as written: a URI (SPIFFE) or an IP matches as such, anything else
/// as a DNS name.
fn san_by_form(san: &str) -> SubjectAltNameMatcher {
    let kind = if san.contains("://") {
        SanType::Uri
    } else if san.parse::<std::net::IpAddr>().is_ok() {
        SanType::IpAddress
    } else {
        SanType::Dns
    };
    san_matcher(kind, san)
}

fn common(
    alpn: Vec<String>,
    sans: &[String],
    tls_params: Option<TlsParameters>,
) -> CommonTlsContext {
    let san_matchers = sans.iter().map(|s| san_by_form(s)).collect();
    CommonTlsContext {
        tls_params,
        alpn_protocols: alpn,
        tls_certificate_sds_secret_configs: vec![sds(WORKLOAD_SECRET)],
        validation_context_type: Some(ValidationContextType::CombinedValidationContext(
            CombinedCertificateValidationContext {
                default_validation_context: Some(CertificateValidationContext {
                    match_typed_subject_alt_names: san_matchers,
                    ..Default::default()
                }),
                validation_context_sds_secret_config: Some(sds(ROOT_SECRET)),
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}

/// Inline PEM for a secret.
pub fn inline_bytes(text: &str) -> Option<DataSource> {
    Some(DataSource {
        specifier: Some(Specifier::InlineBytes(text.as_bytes().to_vec())),
        ..Default::default()
    })
}

/// A `TlsCertificate` secret: a certificate chain and its key.
pub fn certificate_secret(name: &str, chain_pem: &str, key_pem: &str) -> Secret {
    Secret {
        name: name.to_string(),
        r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: inline_bytes(chain_pem),
            private_key: inline_bytes(key_pem),
            ..Default::default()
        })),
    }
}

/// A validation-context secret: the CAs a peer's certificate must chain to.
pub fn validation_secret(name: &str, ca_pem: &str) -> Secret {
    Secret {
        name: name.to_string(),
        r#type: Some(secret::Type::ValidationContext(
            CertificateValidationContext {
                trusted_ca: inline_bytes(ca_pem),
                ..Default::default()
            },
        )),
    }
}

/// `envoy.transport_sockets.tls` around an Upstream- or DownstreamTlsContext.
pub fn tls_transport_socket(context: envoy_api::pb::google::protobuf::Any) -> TransportSocket {
    TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(context)),
    }
}

/// ISTIO_MUTUAL towards a server that must be one of `sans` (any mesh identity if empty).
pub fn upstream(sni: &str, sans: &[String], h2: bool) -> TransportSocket {
    tls_transport_socket(pack_any(UpstreamTlsContext {
        common_tls_context: Some(common(mesh_alpn(h2), sans, tls_params())),
        sni: sni.to_string(),
        ..Default::default()
    }))
}

/// Where Envoy finds the system's CA bundle when it reads the files itself (Debian's path,
/// as in the istio-proxy image).
pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// A file Envoy reads itself.
fn file(path: &str) -> Option<DataSource> {
    Some(DataSource {
        specifier: Some(Specifier::Filename(path.to_string())),
        ..Default::default()
    })
}

/// TLS originated to a destination outside the mesh (`SIMPLE`, or `MUTUAL` with
/// `client`'s certificate and key files), as istiod's `constructUpstreamTLS` builds it.
/// The server's certificate must chain to `ca_certificates` (the system's bundle when
/// unset) and carry one of `subject_alt_names`, unless `insecure_skip_verify`.
///
/// A proxy with the agent (`agent`) gets the files over SDS as istiod names them
/// (`file-cert:CERT~KEY`, `file-root:CA` or `file-root:system`), so rotated files reach
/// it; one without reads them itself.
pub fn originate(
    tls: &ClientTlsSettings,
    client: Option<(&str, &str)>,
    h2: bool,
    agent: bool,
    params: &TlsParams,
) -> TransportSocket {
    let mut common = CommonTlsContext {
        tls_params: envoy_tls_params(params),
        alpn_protocols: if h2 { vec!["h2".into()] } else { Vec::new() },
        ..Default::default()
    };
    if let Some((cert, key)) = client {
        if agent {
            let name = file_cert(cert, key);
            common.tls_certificate_sds_secret_configs = vec![sds(&name)];
        } else {
            common.tls_certificates = vec![TlsCertificate {
                certificate_chain: file(cert),
                private_key: file(key),
                ..Default::default()
            }];
        }
    }
    if tls.insecure_skip_verify == Some(true) {
        common.validation_context_type = Some(ValidationContextType::ValidationContext(
            CertificateValidationContext::default(),
        ));
    } else {
        let ca = tls.ca_certificates.as_deref().filter(|c| !c.is_empty());
        let sans = tls
            .subject_alt_names
            .iter()
            .map(|s| san_by_form(s))
            .collect();
        let mut validation = CertificateValidationContext {
            match_typed_subject_alt_names: sans,
            crl: tls
                .ca_crl
                .as_deref()
                .filter(|c| !c.is_empty())
                .and_then(file),
            ..Default::default()
        };
        common.validation_context_type = Some(if agent {
            let root = file_root(ca.unwrap_or(SYSTEM_ROOTS));
            ValidationContextType::CombinedValidationContext(CombinedCertificateValidationContext {
                default_validation_context: Some(validation),
                validation_context_sds_secret_config: Some(sds(&root)),
                ..Default::default()
            })
        } else {
            validation.trusted_ca = file(ca.unwrap_or(SYSTEM_CA_BUNDLE));
            ValidationContextType::ValidationContext(validation)
        });
    }
    tls_transport_socket(pack_any(UpstreamTlsContext {
        common_tls_context: Some(common),
        sni: tls.sni.clone().unwrap_or_default(),
        ..Default::default()
    }))
}

/// TLS originated by a gateway with a `credentialName` (istiod's
/// `ApplyCustomSDSToClientCommonTLSContext`): for `MUTUAL` the client certificate is the
/// SDS secret `kubernetes://NAME`; unless `insecure_skip_verify`, the server's certificate
/// must chain to `kubernetes://NAME-cacert` and carry one of `subject_alt_names`. meshd
/// serves both over ADS from the Secret NAME in the gateway's namespace.
pub fn originate_credential(
    tls: &ClientTlsSettings,
    credential: &super::credentials::CredentialUse,
    h2: bool,
    params: &TlsParams,
) -> TransportSocket {
    let mut common = CommonTlsContext {
        tls_params: envoy_tls_params(params),
        alpn_protocols: if h2 { vec!["h2".into()] } else { Vec::new() },
        ..Default::default()
    };
    if credential.cert {
        common.tls_certificate_sds_secret_configs =
            vec![super::credentials::ads_secret(credential.cert_resource())];
    }
    if credential.ca {
        common.validation_context_type = Some(ValidationContextType::CombinedValidationContext(
            CombinedCertificateValidationContext {
                default_validation_context: Some(CertificateValidationContext {
                    match_typed_subject_alt_names: (tls.subject_alt_names.iter())
                        .map(|s| san_by_form(s))
                        .collect(),
                    ..Default::default()
                }),
                validation_context_sds_secret_config: Some(super::credentials::ads_secret(
                    credential.ca_resource(),
                )),
                ..Default::default()
            },
        ));
    }
    tls_transport_socket(pack_any(UpstreamTlsContext {
        common_tls_context: Some(common),
        sni: tls.sni.clone().unwrap_or_default(),
        ..Default::default()
    }))
}

/// Plaintext, for endpoints outside the mesh.
pub fn raw_buffer() -> TransportSocket {
    TransportSocket {
        name: "envoy.transport_sockets.raw_buffer".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(
            RawBuffer::default(),
        ))),
    }
}

/// The inbound side of mutual TLS: the workload certificate, a client certificate required
/// and verified against the root bundle, the versions and suites of `params`
/// ([`TlsParams::mesh_inbound`]).
pub fn downstream(http: bool, params: &TlsParams) -> TransportSocket {
    let alpn = if http {
        vec!["h2".to_string(), "http/1.1".to_string()]
    } else {
        vec![
            "istio-peer-exchange".to_string(),
            "h2".to_string(),
            "http/1.1".to_string(),
        ]
    };
    mesh_server(alpn, &[], envoy_tls_params(params))
}

/// Mutual TLS served with the workload certificate to clients whose certificates chain
/// to the mesh's roots and, unless `sans` is empty, carry one of `sans` (a gateway's
/// ISTIO_MUTUAL server).
pub fn downstream_with(alpn: Vec<String>, sans: &[String]) -> TransportSocket {
    mesh_server(alpn, sans, tls_params())
}

fn mesh_server(
    alpn: Vec<String>,
    sans: &[String],
    params: Option<TlsParameters>,
) -> TransportSocket {
    tls_transport_socket(pack_any(DownstreamTlsContext {
        common_tls_context: Some(common(alpn, sans, params)),
        require_client_certificate: Some(BoolValue { value: true }),
        ..Default::default()
    }))
}
