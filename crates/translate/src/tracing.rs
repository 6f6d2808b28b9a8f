//! Tracing on every HTTP connection manager, as istiod's `configureTracingFromTelemetry`
//! sets it: from the proxy's Telemetry resources' `tracing` when it has any ([`of`], per
//! side of its traffic), else from MeshConfig:
//! - with `defaultProviders.tracing`, each manager reports spans to that provider (Zipkin
//!   or OpenTelemetry), through the outbound cluster of the provider's service;
//! - else, with `enableTracing` (on by default), each manager samples requests for the
//!   tracer the proxy's own bootstrap names, as istio-agent writes it from
//!   `defaultConfig.tracing`;
//! - else, no tracing.
//!
//! Both sample `defaultConfig.tracing.sampling` percent of requests (`PILOT_TRACE_SAMPLING`,
//! 1%, when unset) and tag spans with Istio's tags and `defaultConfig.tracing.customTags`.
//! Istio's tags name the proxy's canonical service, namespace, mesh and cluster, so the
//! configuration is the proxy's own: views tell proxies apart by [`TraceIds`] while
//! tracing is on.

use envoy_api::pb::envoy::config::core::v3::{
    GrpcService, HeaderValue, HeaderValueOption, HttpService, HttpUri, grpc_service,
    header_value_option::HeaderAppendAction, http_uri,
};
use envoy_api::pb::envoy::config::trace::v3::{
    OpenTelemetryConfig, ZipkinConfig, tracing::Http as Provider, tracing::http::ConfigType,
    zipkin_config,
};
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    RequestIdExtension, http_connection_manager::Tracing,
};
use envoy_api::pb::envoy::extensions::request_id::uuid::v3::UuidRequestIdConfig;
use envoy_api::pb::envoy::r#type::metadata::v3::{
    MetadataKey, MetadataKind, metadata_key::PathSegment, metadata_key::path_segment::Segment,
    metadata_kind,
};
use envoy_api::pb::envoy::r#type::tracing::v3::{CustomTag, custom_tag};
use envoy_api::pb::envoy::r#type::v3::Percent;
use envoy_api::pb::google::protobuf::{BoolValue, UInt32Value};
use envoy_api::util::pack_any;

use super::ext_authz::ProviderError;
use model::mesh::{self, OpenTelemetryProvider, ProviderHeader, ProxyTracing, ZipkinProvider};
use model::{Proxy, ProxyKind, PushContext};

/// The mesh-wide sampling percentage when `defaultConfig.tracing.sampling` is unset:
/// `PILOT_TRACE_SAMPLING` from the control plane's environment, 1 when unset or not a
/// percentage (meshd warns of that at start-up).
fn trace_sampling(ctx: &PushContext) -> f64 {
    mesh::trace_sampling(ctx.environment_var(mesh::TRACE_SAMPLING_ENV)).unwrap_or(1.0)
}

/// What tells two proxies' tracing apart besides their labels and namespace: their
/// cluster, mesh and Envoy service cluster (`node.cluster`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceIds<'a> {
    pub cluster_id: std::borrow::Cow<'a, str>,
    pub mesh_id: std::borrow::Cow<'a, str>,
    pub service_cluster: std::borrow::Cow<'a, str>,
}

impl TraceIds<'_> {
    pub fn of(proxy: &Proxy) -> TraceIds<'_> {
        TraceIds {
            cluster_id: proxy.cluster_id.as_str().into(),
            mesh_id: proxy.mesh_id.as_str().into(),
            service_cluster: proxy.service_cluster.as_str().into(),
        }
    }

    pub fn into_owned(self) -> TraceIds<'static> {
        TraceIds {
            cluster_id: self.cluster_id.into_owned().into(),
            mesh_id: self.mesh_id.into_owned().into(),
            service_cluster: self.service_cluster.into_owned().into(),
        }
    }
}

/// Whether the mesh may trace at all: with a default provider, `enableTracing`, or a
/// Telemetry resource's `tracing`.
pub fn enabled(ctx: &PushContext) -> bool {
    let mesh = &ctx.mesh;
    !mesh.default_providers.tracing.is_empty() || mesh.tracing_enabled() || ctx.telemetry_traces()
}

/// The tracing of a proxy's outbound and gateway connection managers (`client`) and of
/// its inbound ones (`server`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sides {
    pub client: Option<Tracing>,
    pub server: Option<Tracing>,
}

/// One side's tracing as istiod's `Telemetries.Tracing` merges it (`TracingSpec`):
/// the default provider, then each Telemetry entry for the side overriding what it sets.
struct Spec<'a> {
    provider: Option<&'a str>,
    disabled: bool,
    sampling: Option<f64>,
    custom_tags: Option<&'a std::collections::BTreeMap<String, mesh::CustomTag>>,
    istio_tags: bool,
}

/// The tracing of `proxy`'s connection managers on each side: from its Telemetry
/// resources' `tracing` when it has any (istiod's `configureTracingFromTelemetry`), else
/// from MeshConfig alone, the same on both sides.
pub fn of(ctx: &PushContext, proxy: &Proxy) -> Sides {
    let entries = ctx.tracing_for(proxy);
    if entries.is_empty() {
        let tracing = of_mesh(ctx, proxy);
        return Sides {
            client: tracing.clone(),
            server: tracing,
        };
    }
    let mesh = &ctx.mesh;
    let side = |mode: &str| {
        let mut spec = Spec {
            provider: mesh.default_providers.tracing.first().map(String::as_str),
            disabled: false,
            sampling: None,
            custom_tags: None,
            istio_tags: true,
        };
        for e in (entries.iter()).filter(|e| api::telemetry::applies(&e.r#match, mode)) {
            if let Some(p) = e.providers.first() {
                spec.provider = Some(&p.name);
            }
            if let Some(d) = e.disable_span_reporting {
                spec.disabled = d;
            }
            if let Some(tags) = &e.custom_tags {
                spec.custom_tags = Some(tags);
            }
            if let Some(p) = e.random_sampling_percentage {
                spec.sampling = Some(p);
            }
            if let Some(t) = e.enable_istio_tags {
                spec.istio_tags = t;
            }
        }
        of_spec(ctx, proxy, &spec)
    };
    let (client, server) = super::per_side(proxy, side);
    Sides { client, server }
}

/// A side's tracing from its merged spec: none when disabled or without a provider that
/// works (as istiod disables a spec whose provider lookup fails); sampling from the spec,
/// else MeshConfig's; the spec's custom tags, else MeshConfig's.
fn of_spec(ctx: &PushContext, proxy: &Proxy, spec: &Spec) -> Option<Tracing> {
    let mesh = &ctx.mesh;
    if spec.disabled {
        return None;
    }
    let provider = mesh.extension_provider(spec.provider?)?;
    let mut tracing = provider_tracing(ctx, proxy, &provider).ok()?;
    let unset = ProxyTracing::default();
    let settings = mesh.default_config.tracing.as_ref().unwrap_or(&unset);
    let sampling = match spec.sampling {
        Some(p) if (0.0..=100.0).contains(&p) => p,
        _ => sampling(ctx, settings),
    };
    finish(&mut tracing, sampling, settings);
    let own = spec.custom_tags.filter(|tags| !tags.is_empty());
    let configured = own.unwrap_or(&settings.custom_tags);
    tracing.custom_tags = custom_tags(ctx, proxy, spec.istio_tags, configured);
    Some(tracing)
}

/// Sampling as istiod's `configureSampling`, and MeshConfig's path tag length when the
/// provider set none.
fn finish(tracing: &mut Tracing, sampling: f64, settings: &ProxyTracing) {
    let percent = |value| Some(Percent { value });
    tracing.client_sampling = percent(100.0);
    tracing.overall_sampling = percent(100.0);
    tracing.random_sampling = percent(sampling);
    if tracing.max_path_tag_length.is_none() && settings.max_path_tag_length != 0 {
        tracing.max_path_tag_length = Some(UInt32Value {
            value: settings.max_path_tag_length,
        });
    }
}

/// The request id extension every connection manager has (istiod's
/// `UUIDRequestIDExtension`): the `x-request-id` decides sampling, so that every proxy on
/// a request's path samples it alike.
pub fn request_id_extension() -> RequestIdExtension {
    RequestIdExtension {
        typed_config: Some(pack_any(UuidRequestIdConfig {
            use_request_id_for_trace_sampling: Some(BoolValue { value: true }),
            ..Default::default()
        })),
    }
}

/// The tracing of `proxy`'s connection managers from MeshConfig alone; `None` when the
/// mesh traces nothing, or when its default provider cannot be used
/// ([`PushContext::tracing_problem`]).
fn of_mesh(ctx: &PushContext, proxy: &Proxy) -> Option<Tracing> {
    let mesh = &ctx.mesh;
    let unset = ProxyTracing::default();
    let settings = mesh.default_config.tracing.as_ref().unwrap_or(&unset);
    let mut tracing = match mesh.default_providers.tracing.first() {
        Some(name) => {
            let provider = mesh.extension_provider(name)?;
            provider_tracing(ctx, proxy, &provider).ok()?
        }
        None if mesh.tracing_enabled() => Tracing::default(),
        None => return None,
    };
    finish(&mut tracing, sampling(ctx, settings), settings);
    let istio_tags = settings.enable_istio_tags != Some(false);
    tracing.custom_tags = custom_tags(ctx, proxy, istio_tags, &settings.custom_tags);
    Some(tracing)
}

/// istiod's `proxyConfigSamplingValue`: the setting when set (1% outside 0–100, where
/// istiod would send what Envoy refuses below 0), else `PILOT_TRACE_SAMPLING`.
fn sampling(ctx: &PushContext, settings: &ProxyTracing) -> f64 {
    let s = settings.sampling;
    if s == 0.0 {
        trace_sampling(ctx)
    } else if (0.0..=100.0).contains(&s) {
        s
    } else {
        1.0
    }
}

/// Istio's tags (with `istio_tags`) and the `configured` ones, by tag name.
fn custom_tags(
    ctx: &PushContext,
    proxy: &Proxy,
    istio_tags: bool,
    configured: &std::collections::BTreeMap<String, mesh::CustomTag>,
) -> Vec<CustomTag> {
    let mut tags = Vec::new();
    if istio_tags {
        let labels = ctx.proxy_labels(proxy);
        let or = |v: Option<&str>, default: &'static str| {
            v.filter(|v| !v.is_empty()).unwrap_or(default).to_string()
        };
        let label = |k: &str| labels.get(k).map(String::as_str);
        let literals = [
            (
                "istio.canonical_revision",
                or(label("service.istio.io/canonical-revision"), "latest"),
            ),
            (
                "istio.canonical_service",
                or(label("service.istio.io/canonical-name"), "unknown"),
            ),
            ("istio.mesh_id", or(Some(&proxy.mesh_id), "unknown")),
            ("istio.namespace", or(Some(&proxy.namespace), "default")),
            ("istio.cluster_id", or(Some(&proxy.cluster_id), "unknown")),
        ];
        tags.extend(literals.into_iter().map(|(tag, value)| literal(tag, value)));
        tags.extend(dry_run_policy_tags());
    }
    for (tag, t) in configured {
        let named = |n: &mesh::NamedTag| (n.name.clone(), n.default_value.clone());
        // Exactly one kind, as the field is a oneof (validation warns otherwise).
        let kind = match (&t.literal, &t.environment, &t.header) {
            (Some(l), None, None) => custom_tag::Type::Literal(custom_tag::Literal {
                value: l.value.clone(),
            }),
            (None, Some(e), None) => {
                let (name, default_value) = named(e);
                custom_tag::Type::Environment(custom_tag::Environment {
                    name,
                    default_value,
                })
            }
            (None, None, Some(h)) => {
                let (name, default_value) = named(h);
                custom_tag::Type::RequestHeader(custom_tag::Header {
                    name,
                    default_value,
                })
            }
            _ => continue,
        };
        tags.push(CustomTag {
            tag: tag.clone(),
            r#type: Some(kind),
        });
    }
    tags.sort_by(|a, b| a.tag.cmp(&b.tag));
    tags
}

fn literal(tag: &str, value: String) -> CustomTag {
    CustomTag {
        tag: tag.into(),
        r#type: Some(custom_tag::Type::Literal(custom_tag::Literal { value })),
    }
}

/// istiod's `optionalPolicyTags`: what a dry-run AuthorizationPolicy decided, from the
/// RBAC filter's request metadata.
fn dry_run_policy_tags() -> impl Iterator<Item = CustomTag> {
    use super::authz::{
        DRY_RUN_ALLOW_PREFIX, DRY_RUN_DENY_PREFIX, SHADOW_EFFECTIVE_POLICY_ID, SHADOW_ENGINE_RESULT,
    };
    [
        (
            "allow_policy.name",
            DRY_RUN_ALLOW_PREFIX,
            SHADOW_EFFECTIVE_POLICY_ID,
        ),
        (
            "allow_policy.result",
            DRY_RUN_ALLOW_PREFIX,
            SHADOW_ENGINE_RESULT,
        ),
        (
            "deny_policy.name",
            DRY_RUN_DENY_PREFIX,
            SHADOW_EFFECTIVE_POLICY_ID,
        ),
        (
            "deny_policy.result",
            DRY_RUN_DENY_PREFIX,
            SHADOW_ENGINE_RESULT,
        ),
    ]
    .into_iter()
    .map(|(tag, prefix, key)| CustomTag {
        tag: format!("istio.authorization.dry_run.{tag}"),
        r#type: Some(custom_tag::Type::Metadata(custom_tag::Metadata {
            kind: Some(MetadataKind {
                kind: Some(metadata_kind::Kind::Request(
                    metadata_kind::Request::default(),
                )),
            }),
            metadata_key: Some(MetadataKey {
                key: super::authz::HTTP_RBAC_FILTER.into(),
                path: vec![PathSegment {
                    segment: Some(Segment::Key(format!("{prefix}{key}"))),
                }],
            }),
            default_value: String::new(),
        })),
    })
}

/// A provider's part of the tracing (istiod's `configureFromProviderConfig`): the tracer,
/// a gateway's upstream spans, the provider's tag length.
fn provider_tracing(
    ctx: &PushContext,
    proxy: &Proxy,
    p: &mesh::ExtensionProvider,
) -> Result<Tracing, ProviderError> {
    let (name, config, max_tag_length) = match (&p.zipkin, &p.opentelemetry) {
        (Some(z), _) => ("envoy.tracers.zipkin", zipkin(ctx, z)?, z.max_tag_length),
        (None, Some(o)) => (
            "envoy.tracers.opentelemetry",
            opentelemetry(ctx, proxy, o)?,
            o.max_tag_length,
        ),
        (None, None) => return Err(ProviderError::NotATracer(p.name.clone())),
    };
    Ok(Tracing {
        provider: Some(Provider {
            name: name.into(),
            config_type: Some(ConfigType::TypedConfig(config)),
        }),
        spawn_upstream_span: (proxy.kind == ProxyKind::Router).then_some(BoolValue { value: true }),
        max_path_tag_length: (max_tag_length != 0).then_some(UInt32Value {
            value: max_tag_length,
        }),
        ..Default::default()
    })
}

/// How long a span report may take when the provider does not say (istiod's Zipkin
/// default).
const REPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A provider's `timeout`, [`REPORT_TIMEOUT`] when unset or unparsable.
fn report_timeout(t: &Option<String>) -> Option<super::pbp::Duration> {
    let t = super::optional_duration(t.as_deref());
    Some(t.unwrap_or_else(|| super::duration(REPORT_TIMEOUT)))
}

/// istiod's `zipkinConfig` for proxies of Istio 1.29 on (Envoy's `collector_service`).
fn zipkin(
    ctx: &PushContext,
    z: &ZipkinProvider,
) -> Result<envoy_api::pb::google::protobuf::Any, ProviderError> {
    let (host, cluster) = super::ext_authz::lookup_cluster(ctx, &z.service, z.port)?;
    let path = if z.path.is_empty() {
        "/api/v2/spans"
    } else {
        &z.path
    };
    let context = match z.trace_context_option.as_deref() {
        Some("USE_B3_WITH_W3C_PROPAGATION") => {
            zipkin_config::TraceContextOption::UseB3WithW3cPropagation
        }
        _ => zipkin_config::TraceContextOption::UseB3,
    };
    Ok(pack_any(ZipkinConfig {
        collector_endpoint_version: zipkin_config::CollectorEndpointVersion::HttpJson as i32,
        trace_id_128bit: !z.enable_64bit_trace_id,
        shared_span_context: Some(BoolValue { value: false }),
        trace_context_option: context as i32,
        collector_service: Some(HttpService {
            http_uri: Some(HttpUri {
                uri: format!("http://{host}{path}"),
                timeout: report_timeout(&z.timeout),
                http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(cluster)),
            }),
            request_headers_to_add: header_options(ctx, &z.headers),
            ..Default::default()
        }),
        ..Default::default()
    }))
}

/// istiod's `otelConfig`: OTLP over gRPC, or over HTTP with `http`; spans name the
/// proxy's service cluster (`node.cluster`). An HTTP export without a `timeout` gets
/// 5s, where istiod sends none and Envoy refuses the listener.
fn opentelemetry(
    ctx: &PushContext,
    proxy: &Proxy,
    o: &OpenTelemetryProvider,
) -> Result<envoy_api::pb::google::protobuf::Any, ProviderError> {
    let (host, cluster) = super::ext_authz::lookup_cluster(ctx, &o.service, o.port)?;
    let mut config = OpenTelemetryConfig {
        service_name: proxy.service_cluster.clone(),
        ..Default::default()
    };
    if let Some(http) = &o.http {
        let path = http.path.trim_start_matches('/');
        let uri = if path.is_empty() {
            host
        } else {
            format!("{host}/{path}")
        };
        config.http_service = Some(HttpService {
            http_uri: Some(HttpUri {
                uri,
                // Envoy refuses a URI without a timeout; istiod would send none.
                timeout: report_timeout(&http.timeout),
                http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(cluster)),
            }),
            request_headers_to_add: header_options(ctx, &http.headers),
            ..Default::default()
        });
    } else {
        let grpc = o.grpc.clone().unwrap_or_default();
        config.grpc_service = Some(GrpcService {
            target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                grpc_service::EnvoyGrpc {
                    cluster_name: cluster,
                    authority: host,
                    ..Default::default()
                },
            )),
            timeout: super::optional_duration(grpc.timeout.as_deref()),
            initial_metadata: (grpc.initial_metadata.iter())
                .map(|h| header_value(ctx, h))
                .collect(),
            ..Default::default()
        });
    }
    Ok(pack_any(config))
}

/// A provider's header; one that names `envName` carries that variable of the control
/// plane's environment, as istiod reads its own.
fn header_value(ctx: &PushContext, h: &ProviderHeader) -> HeaderValue {
    let value = if h.env_name.is_empty() {
        h.value.clone()
    } else {
        ctx.environment_var(&h.env_name)
            .unwrap_or_default()
            .to_string()
    };
    HeaderValue {
        key: h.name.clone(),
        value,
        ..Default::default()
    }
}

fn header_options(ctx: &PushContext, headers: &[ProviderHeader]) -> Vec<HeaderValueOption> {
    (headers.iter())
        .map(|h| HeaderValueOption {
            header: Some(header_value(ctx, h)),
            append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
            ..Default::default()
        })
        .collect()
}
