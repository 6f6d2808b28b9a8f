//! The HTTP connection manager of a listener's filter chain, and what a view sets on
//! every connection manager and tcp_proxy: idle timeout, access logs, tracing, ProxyConfig
//! `proxyHeaders`.

use super::*;
use model::ProxyKind;
use model::proxy_headers::ProxyHeaders;
use model::topology::{ForwardClientCertDetails as MeshForward, GatewayTopology};
use prost::Message as _;

/// What a view sets on every connection manager and tcp_proxy of its listeners, beyond
/// what each listener's builder put there.
#[derive(Default)]
pub(crate) struct ViewSettings {
    /// istiod's `IDLE_TIMEOUT` node metadata: every connection manager's idle timeout,
    /// and that of every tcp_proxy no DestinationRule gave one (inbound, outbound,
    /// passthrough and blackhole alike).
    pub idle_timeout: Option<envoy_api::pb::google::protobuf::Duration>,
    /// The proxy's access logs ([`access_log`](crate::access_log)) on every listener, and
    /// on every connection manager and tcp_proxy in them, as istiod's `AccessLogBuilder`
    /// puts it there.
    pub access_logs: Option<crate::access_log::AccessLogs>,
    /// The proxy's tracing ([`tracing`](crate::tracing)) on every connection manager, by
    /// its listener's side.
    pub tracing: crate::tracing::Sides,
    /// The proxy's ProxyConfig `proxyHeaders` ([`proxy_headers`]), when it sets any.
    pub headers: Option<(ProxyHeaders, ProxyKind)>,
}

/// The `proxyHeaders` `proxy` runs with: those of the `PROXY_CONFIG` it sent, else
/// MeshConfig `defaultConfig`'s (istiod's `ProxyConfigOrDefault`; invalid there: reported
/// by validation and read as none); `None` when they change nothing.
pub(crate) fn proxy_headers(ctx: &PushContext, proxy: &Proxy) -> Option<ProxyHeaders> {
    let headers = proxy
        .proxy_headers
        .clone()
        .or_else(|| (ctx.mesh.default_config.proxy_headers()).ok().flatten());
    headers.filter(|h| *h != ProxyHeaders::default())
}

/// Sets `headers` on a connection manager of a listener of `direction` of a proxy of
/// `kind`, as istiod's `GetProxyHeadersFromProxyConfig` and its listener builders do.
/// `attemptCount` and `xForwardedHost` live in the virtual hosts ([`crate::route::RouteHeaders`]).
fn apply_headers(hcm: &mut HttpConnectionManager, headers: &ProxyHeaders, inbound: bool) {
    if headers.server_disabled {
        hcm.server_name = String::new();
        hcm.server_header_transformation = ServerHeaderTransformation::PassThrough as i32;
    } else if let Some(value) = &headers.server_value {
        hcm.server_name.clone_from(value);
    }
    if headers.request_id_disabled {
        hcm.generate_request_id = Some(BoolValue { value: false });
    }
    hcm.append_x_forwarded_port = headers.x_forwarded_port;
    if headers.envoy_debug_headers_disabled {
        for f in hcm.http_filters.iter_mut().filter(|f| f.name == ROUTER) {
            if let Some(http_filter::ConfigType::TypedConfig(any)) = &mut f.config_type
                && let Ok(mut router) = Router::decode(any.value.as_slice())
            {
                router.suppress_envoy_headers = true;
                *any = pack_any(router);
            }
        }
    }
    if inbound {
        if headers.forwarded_client_cert != MeshForward::Undefined {
            hcm.forward_client_cert_details =
                forward_client_cert_details(headers.forwarded_client_cert) as i32;
        }
        let [subject, cert, chain, dns, uri] = headers.client_cert_details;
        hcm.set_current_client_cert_details = Some(SetCurrentClientCertDetails {
            subject: Some(BoolValue {
                value: subject != Some(false),
            }),
            cert: cert == Some(true),
            chain: chain == Some(true),
            dns: dns != Some(false),
            uri: uri != Some(false),
            ..Default::default()
        });
    }
}

/// Applies `settings` to `listeners`. The idle timeout and access logs decode each filter
/// they change once; the tracing is encoded once and appended to every connection
/// manager's bytes (below).
pub(crate) fn apply_view_settings(listeners: &mut [Listener], settings: &ViewSettings) {
    use envoy_api::pb::envoy::config::core::v3::HttpProtocolOptions as CommonHttpOptions;
    let ViewSettings {
        idle_timeout,
        access_logs,
        tracing,
        headers,
    } = settings;
    if let Some(logs) = access_logs {
        for l in listeners.iter_mut() {
            let side = logs.side(l.traffic_direction);
            l.access_log.extend(side.listener.iter().cloned());
        }
    }
    if idle_timeout.is_some() || access_logs.is_some() || headers.is_some() {
        edit_filters(
            listeners,
            |hcm, direction| {
                if let Some((headers, kind)) = headers {
                    let inbound = crate::is_inbound(direction) && *kind == ProxyKind::Sidecar;
                    apply_headers(hcm, headers, inbound);
                }
                if let Some(timeout) = idle_timeout {
                    let common = hcm
                        .common_http_protocol_options
                        .get_or_insert_with(CommonHttpOptions::default);
                    common.idle_timeout = Some(*timeout);
                }
                if let Some(logs) = access_logs {
                    hcm.access_log
                        .extend(logs.side(direction).core.iter().cloned());
                }
                true
            },
            |tp, direction| {
                let mut changed = false;
                if let Some(timeout) = idle_timeout
                    && tp.idle_timeout.is_none()
                {
                    tp.idle_timeout = Some(*timeout);
                    changed = true;
                }
                if let Some(logs) = access_logs {
                    let core = &logs.side(direction).core;
                    tp.access_log.extend(core.iter().cloned());
                    changed |= !core.is_empty();
                }
                changed
            },
        );
    }
    append_tracing(listeners, tracing);
}

/// `HttpConnectionManager.tracing`'s field number.
pub(super) const HCM_TRACING_FIELD: u32 = 7;

/// Sets each side's tracing on every connection manager of `listeners` of that side
/// without decoding them: a message field appended to an encoded message is read as set
/// (protobuf merges repeated occurrences, and no builder sets the field). Each side is
/// encoded once.
pub(super) fn append_tracing(listeners: &mut [Listener], tracing: &crate::tracing::Sides) {
    use envoy_api::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfig;
    let encode = |t: Option<&HcmTracing>| {
        t.map(|t| {
            let mut field = Vec::new();
            prost::encoding::message::encode(HCM_TRACING_FIELD, t, &mut field);
            field
        })
    };
    let client = encode(tracing.client.as_ref());
    let server = if tracing.server == tracing.client {
        client.clone()
    } else {
        encode(tracing.server.as_ref())
    };
    for listener in listeners {
        let side = if crate::is_inbound(listener.traffic_direction) {
            &server
        } else {
            &client
        };
        let Some(field) = side else {
            continue;
        };
        let chains =
            (listener.filter_chains.iter_mut()).chain(listener.default_filter_chain.iter_mut());
        for filter in chains.flat_map(|c| c.filters.iter_mut()) {
            if let (HCM, Some(FilterConfig::TypedConfig(any))) =
                (filter.name.as_str(), &mut filter.config_type)
            {
                any.value.extend_from_slice(field);
            }
        }
    }
}

/// Runs `hcm` on every HTTP connection manager of `listeners` and `tcp` on every
/// tcp_proxy, with their listener's traffic direction, encoding again those they changed
/// (they say whether they did).
pub(super) fn edit_filters(
    listeners: &mut [Listener],
    mut hcm: impl FnMut(&mut HttpConnectionManager, i32) -> bool,
    mut tcp: impl FnMut(&mut TcpProxy, i32) -> bool,
) {
    use envoy_api::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfig;
    use prost::Message;
    for listener in listeners {
        let direction = listener.traffic_direction;
        let chains =
            (listener.filter_chains.iter_mut()).chain(listener.default_filter_chain.iter_mut());
        for filter in chains.flat_map(|c| c.filters.iter_mut()) {
            let Some(FilterConfig::TypedConfig(any)) = &mut filter.config_type else {
                continue;
            };
            match filter.name.as_str() {
                TCP_PROXY => {
                    let Ok(mut tp) = TcpProxy::decode(any.value.as_slice()) else {
                        continue;
                    };
                    if tcp(&mut tp, direction) {
                        *any = pack_any(tp);
                    }
                }
                HCM => {
                    let Ok(mut manager) = HttpConnectionManager::decode(any.value.as_slice())
                    else {
                        continue;
                    };
                    if hcm(&mut manager, direction) {
                        *any = pack_any(manager);
                    }
                }
                _ => {}
            }
        }
    }
}

/// Whose connection manager: a sidecar's outbound one, a sniffed listener's (which marks
/// its requests' upstream mTLS as HTTP, [`sniff::mtls_http_alpn_filter`]), or a
/// gateway's, with the AuthorizationPolicy filters that apply to the gateway first and
/// its `gatewayTopology` ([`gateway_topology`](super::gateway::gateway_topology)).
pub(super) enum Hcm {
    Outbound,
    Sniffed,
    Gateway(Vec<HttpFilter>, GatewayTopology),
}

/// How a connection manager normalizes request paths before routing and authorization,
/// as istiod sets it from MeshConfig `pathNormalization.normalization`: `BASE` (the
/// default: RFC 3986 normalization), `NONE`, `MERGE_SLASHES` (also `//` to `/`), or
/// `DECODE_AND_MERGE_SLASHES` (also `%2F` and `%5C` decoded first). An unknown value is
/// the default (validation reports it).
#[derive(Clone, Copy)]
pub(crate) struct PathNormalization {
    pub normalize_path: bool,
    pub merge_slashes: bool,
    pub escaped_slashes: PathWithEscapedSlashesAction,
}

impl PathNormalization {
    pub fn of(mesh: &MeshConfig) -> PathNormalization {
        let mode = (mesh.path_normalization.as_ref()).and_then(|p| p.normalization.as_deref());
        let (normalize_path, merge_slashes, escaped_slashes) = match mode {
            Some("NONE") => (false, false, PathWithEscapedSlashesAction::KeepUnchanged),
            Some("MERGE_SLASHES") => (true, true, PathWithEscapedSlashesAction::KeepUnchanged),
            Some("DECODE_AND_MERGE_SLASHES") => {
                (true, true, PathWithEscapedSlashesAction::UnescapeAndForward)
            }
            _ => (true, false, PathWithEscapedSlashesAction::KeepUnchanged),
        };
        PathNormalization {
            normalize_path,
            merge_slashes,
            escaped_slashes,
        }
    }

    /// Sets it on `hcm`.
    pub fn apply(self, hcm: &mut HttpConnectionManager) {
        hcm.normalize_path = Some(BoolValue {
            value: self.normalize_path,
        });
        hcm.merge_slashes = self.merge_slashes;
        hcm.path_with_escaped_slashes_action = self.escaped_slashes as i32;
    }
}

/// An HCM over RDS `route_name`.
pub(super) fn http_connection_manager(
    stat_prefix: String,
    route_name: String,
    kind: Hcm,
    mesh: &MeshConfig,
) -> Filter {
    let (authorization, alpn, topology) = match kind {
        Hcm::Outbound => (Vec::new(), None, None),
        Hcm::Sniffed => (Vec::new(), Some(sniff::mtls_http_alpn_filter()), None),
        Hcm::Gateway(filters, topology) => (filters, None, Some(topology)),
    };
    let gateway = topology.is_some();
    // A gateway replaces any `x-forwarded-client-cert` a client sent with what its own
    // mutual TLS handshake proved unless its `gatewayTopology` says otherwise, as istiod's
    // gateways; a sidecar's outbound keeps Envoy's SANITIZE.
    let forward = topology.map_or(ForwardClientCertDetails::Sanitize, |t| {
        forward_client_cert_details(t.forward_client_cert_details)
    });
    let mut hcm = HttpConnectionManager {
        stat_prefix: crate::stat_name::delimited(&stat_prefix),
        codec_type: CodecType::Auto as i32,
        route_specifier: Some(RouteSpecifier::Rds(Rds {
            config_source: Some(ads_config_source()),
            route_config_name: route_name,
        })),
        // Authorization first; routes with a VirtualService `fault` or `corsPolicy`
        // configure those filters (istiod's order: authorization, gRPC statistics,
        // fault, CORS, router).
        http_filters: authorization
            .into_iter()
            .chain([
                crate::filters::grpc_stats(),
                HttpFilter {
                    name: crate::filters::FAULT_FILTER.into(),
                    config_type: Some(http_filter::ConfigType::TypedConfig(
                        crate::filters::filter_config(),
                    )),
                    ..Default::default()
                },
                HttpFilter {
                    name: crate::filters::CORS_FILTER.into(),
                    config_type: Some(http_filter::ConfigType::TypedConfig(
                        crate::filters::cors_filter_config(),
                    )),
                    ..Default::default()
                },
            ])
            .chain(alpn)
            .chain(std::iter::once(HttpFilter {
                name: ROUTER.into(),
                config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
                    Router::default(),
                ))),
                ..Default::default()
            }))
            .collect(),
        use_remote_address: Some(BoolValue { value: gateway }),
        xff_num_trusted_hops: topology.map_or(0, |t| t.num_trusted_proxies),
        forward_client_cert_details: forward as i32,
        // What the handshake proved is added only where the header is set or appended to.
        set_current_client_cert_details: (gateway
            && matches!(
                forward,
                ForwardClientCertDetails::SanitizeSet | ForwardClientCertDetails::AppendForward
            ))
        .then(|| SetCurrentClientCertDetails {
            subject: Some(BoolValue { value: true }),
            cert: true,
            dns: true,
            uri: true,
            ..Default::default()
        }),
        upgrade_configs: vec![UpgradeConfig {
            upgrade_type: "websocket".into(),
            ..Default::default()
        }],
        server_name: if gateway {
            "istio-envoy".into()
        } else {
            String::new()
        },
        server_header_transformation: ServerHeaderTransformation::Overwrite as i32,
        request_id_extension: Some(crate::tracing::request_id_extension()),
        // Streams idle for long (server streaming, long polls) stay open, as istiod's.
        stream_idle_timeout: Some(crate::duration(std::time::Duration::ZERO)),
        // `Expect: 100-continue` goes to the server, which answers it (istiod's
        // ENABLE_100_CONTINUE_HEADERS default), instead of Envoy answering for it.
        proxy_100_continue: true,
        ..Default::default()
    };
    PathNormalization::of(mesh).apply(&mut hcm);
    Filter {
        name: HCM.into(),
        config_type: Some(ConfigType::TypedConfig(pack_any(hcm))),
    }
}

/// Envoy's value for MeshConfig's `ForwardClientCertDetails`; `UNDEFINED` is a gateway's
/// default, `SANITIZE_SET`.
fn forward_client_cert_details(mesh: MeshForward) -> ForwardClientCertDetails {
    match mesh {
        MeshForward::Undefined | MeshForward::SanitizeSet => ForwardClientCertDetails::SanitizeSet,
        MeshForward::Sanitize => ForwardClientCertDetails::Sanitize,
        MeshForward::ForwardOnly => ForwardClientCertDetails::ForwardOnly,
        MeshForward::AppendForward => ForwardClientCertDetails::AppendForward,
        MeshForward::AlwaysForwardOnly => ForwardClientCertDetails::AlwaysForwardOnly,
    }
}

const ROUTER: &str = "envoy.filters.http.router";
pub(crate) const HCM: &str = "envoy.filters.network.http_connection_manager";
pub(crate) const TCP_PROXY: &str = "envoy.filters.network.tcp_proxy";
