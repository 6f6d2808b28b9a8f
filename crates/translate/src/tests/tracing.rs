//! Tracing from MeshConfig: the legacy `enableTracing` (sampling for the bootstrap's
//! tracer), a default Zipkin or OpenTelemetry provider, sampling and tags.

use envoy_api::pb::envoy::config::core::v3::{grpc_service, http_uri};
use envoy_api::pb::envoy::config::listener::v3::filter::ConfigType;
use envoy_api::pb::envoy::config::trace::v3::{
    OpenTelemetryConfig, ZipkinConfig, tracing::http::ConfigType as ProviderConfig, zipkin_config,
};
use envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_api::pb::envoy::extensions::request_id::uuid::v3::UuidRequestIdConfig;
use envoy_api::pb::envoy::r#type::metadata::v3::metadata_key::path_segment::Segment;
use envoy_api::pb::envoy::r#type::tracing::v3::custom_tag;
use prost::Message;
use serde_json::json;

use super::{context, ingress_gateway};
use crate::{ProxyConfig, proxy_config};
use model::Proxy;

const MESH: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |\n";

/// The Service the providers below report to, in istio-system.
const COLLECTORS: &str = "---\napiVersion: v1\nkind: Service\nmetadata: {name: collector, namespace: istio-system}\nspec: {clusterIP: 10.96.7.7, ports: [{name: http, port: 9411}, {name: grpc, port: 4317}]}\n";

/// A sidecar of `web` in shop: its canonical service and revision, a mesh id and a
/// service cluster.
fn web() -> Proxy {
    let meta = json!({
        "NAMESPACE": "shop",
        "MESH_ID": "mesh-a",
        "CLUSTER_ID": "east",
        "LABELS": {
            "app": "web",
            "service.istio.io/canonical-name": "web",
            "service.istio.io/canonical-revision": "v3",
        },
    });
    let mut p = Proxy::from_node(
        "sidecar~10.9.9.9~web-1.shop~shop.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap();
    p.service_cluster = "web.shop".into();
    p
}

const GATEWAY: &str = "---\napiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: istio-system}\nspec:\n  selector: {istio: ingressgateway}\n  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]\n";

fn config(mesh_lines: &str, proxy: &Proxy) -> ProxyConfig {
    let yaml = format!("{MESH}{mesh_lines}{COLLECTORS}{GATEWAY}");
    proxy_config(&context(&yaml), proxy)
}

/// Every connection manager of the configuration, decoded.
fn managers(cfg: &ProxyConfig) -> Vec<HttpConnectionManager> {
    let chains = cfg.listeners.iter().flat_map(|l| {
        l.filter_chains
            .iter()
            .chain(l.default_filter_chain.as_ref())
    });
    let managers: Vec<HttpConnectionManager> = chains
        .flat_map(|c| &c.filters)
        .filter(|f| f.name == "envoy.filters.network.http_connection_manager")
        .map(|f| {
            let Some(ConfigType::TypedConfig(any)) = &f.config_type else {
                panic!("{f:?}")
            };
            HttpConnectionManager::decode(any.value.as_slice()).unwrap()
        })
        .collect();
    assert!(!managers.is_empty());
    managers
}

fn literal(value: &str) -> Option<custom_tag::Type> {
    Some(custom_tag::Type::Literal(custom_tag::Literal {
        value: value.into(),
    }))
}

#[test]
fn by_default_every_manager_samples_one_percent_for_the_bootstraps_tracer_with_istios_tags() {
    let cfg = config("    trustDomain: cluster.local\n", &web());
    for hcm in managers(&cfg) {
        let uuid = hcm.request_id_extension.as_ref().unwrap();
        let uuid =
            UuidRequestIdConfig::decode(uuid.typed_config.as_ref().unwrap().value.as_slice())
                .unwrap();
        assert!(uuid.use_request_id_for_trace_sampling.unwrap().value);
        let t = hcm.tracing.as_ref().expect(&hcm.stat_prefix);
        assert_eq!(t.provider, None, "the bootstrap's tracer");
        assert_eq!(t.random_sampling.unwrap().value, 1.0);
        assert_eq!(t.client_sampling.unwrap().value, 100.0);
        assert_eq!(t.overall_sampling.unwrap().value, 100.0);
        let names: Vec<&str> = t.custom_tags.iter().map(|t| t.tag.as_str()).collect();
        assert_eq!(
            names,
            [
                "istio.authorization.dry_run.allow_policy.name",
                "istio.authorization.dry_run.allow_policy.result",
                "istio.authorization.dry_run.deny_policy.name",
                "istio.authorization.dry_run.deny_policy.result",
                "istio.canonical_revision",
                "istio.canonical_service",
                "istio.cluster_id",
                "istio.mesh_id",
                "istio.namespace",
            ]
        );
        let tag = |name: &str| {
            let t = t.custom_tags.iter().find(|t| t.tag == name).unwrap();
            t.r#type.clone()
        };
        assert_eq!(tag("istio.canonical_service"), literal("web"));
        assert_eq!(tag("istio.canonical_revision"), literal("v3"));
        assert_eq!(tag("istio.namespace"), literal("shop"));
        assert_eq!(tag("istio.mesh_id"), literal("mesh-a"));
        assert_eq!(tag("istio.cluster_id"), literal("east"));
        let Some(custom_tag::Type::Metadata(m)) =
            tag("istio.authorization.dry_run.deny_policy.name")
        else {
            panic!()
        };
        let key = m.metadata_key.unwrap();
        assert_eq!(key.key, "envoy.filters.http.rbac");
        let segment = key.path[0].segment.clone();
        assert_eq!(
            segment,
            Some(Segment::Key(
                "istio_dry_run_deny_shadow_effective_policy_id".into()
            ))
        );
    }
    // A proxy without those labels and metadata gets istiod's placeholders.
    let bare = Proxy::from_node(
        "sidecar~10.9.9.8~x-1.shop~shop.svc.cluster.local",
        json!({"NAMESPACE": "shop"}).as_object().unwrap(),
    )
    .unwrap();
    let t = managers(&config("", &bare))[0].tracing.clone().unwrap();
    let tag = |name: &str| {
        let t = t.custom_tags.iter().find(|t| t.tag == name).unwrap();
        t.r#type.clone()
    };
    assert_eq!(tag("istio.canonical_service"), literal("unknown"));
    assert_eq!(tag("istio.canonical_revision"), literal("latest"));
    assert_eq!(tag("istio.mesh_id"), literal("unknown"));

    // enableTracing: false leaves tracing out; the request id extension stays.
    let off = config("    enableTracing: false\n", &web());
    for hcm in managers(&off) {
        assert_eq!(hcm.tracing, None);
        assert!(hcm.request_id_extension.is_some());
    }
}

#[test]
fn proxy_config_sampling_tags_and_path_length_apply() {
    let lines = "    defaultConfig:\n      tracing:\n        sampling: 25.5\n        maxPathTagLength: 99\n        enableIstioTags: false\n        customTags:\n          team: {literal: {value: payments}}\n          user: {header: {name: x-user, defaultValue: anonymous}}\n          pod: {environment: {name: POD_NAME}}\n          broken: {}\n";
    let cfg = config(lines, &web());
    let t = managers(&cfg)[0].tracing.clone().unwrap();
    assert_eq!(t.random_sampling.unwrap().value, 25.5);
    assert_eq!(t.max_path_tag_length.unwrap().value, 99);
    let tags: Vec<(&str, String)> = (t.custom_tags.iter())
        .map(|t| (t.tag.as_str(), format!("{:?}", t.r#type)))
        .collect();
    assert_eq!(tags.len(), 3, "{tags:?}");
    assert_eq!(tags[0].0, "pod");
    assert!(tags[0].1.contains("Environment") && tags[0].1.contains("POD_NAME"));
    assert_eq!(tags[1], ("team", format!("{:?}", literal("payments"))));
    assert_eq!(tags[2].0, "user");
    assert!(tags[2].1.contains("RequestHeader") && tags[2].1.contains("anonymous"));

    // A percentage istiod would not send as it is becomes 1%.
    let over = config("    defaultConfig: {tracing: {sampling: 150}}\n", &web());
    let t = managers(&over)[0].tracing.clone().unwrap();
    assert_eq!(t.random_sampling.unwrap().value, 1.0);
}

fn zipkin_of(hcm: &HttpConnectionManager) -> ZipkinConfig {
    let provider = hcm.tracing.as_ref().unwrap().provider.as_ref().unwrap();
    assert_eq!(provider.name, "envoy.tracers.zipkin");
    let Some(ProviderConfig::TypedConfig(any)) = &provider.config_type else {
        panic!()
    };
    ZipkinConfig::decode(any.value.as_slice()).unwrap()
}

const ZIPKIN: &str = "    enableTracing: false\n    defaultProviders: {tracing: [zipkin]}\n    defaultConfig: {tracing: {sampling: 100}}\n    extensionProviders:\n    - name: zipkin\n      zipkin: {service: collector.istio-system.svc.cluster.local, port: 9411, maxTagLength: 64}\n";

#[test]
fn a_default_zipkin_provider_reports_through_its_services_outbound_cluster() {
    // The provider applies whatever enableTracing says, as istiod's Telemetry path does.
    let cfg = config(ZIPKIN, &web());
    for hcm in managers(&cfg) {
        let t = hcm.tracing.as_ref().unwrap();
        assert_eq!(t.random_sampling.unwrap().value, 100.0);
        assert_eq!(t.max_path_tag_length.unwrap().value, 64);
        assert_eq!(t.spawn_upstream_span, None, "a sidecar's own spans");
        assert!(
            t.custom_tags
                .iter()
                .any(|t| t.tag == "istio.canonical_service")
        );
        let z = zipkin_of(&hcm);
        let service = z.collector_service.unwrap();
        let uri = service.http_uri.unwrap();
        assert_eq!(
            uri.uri,
            "http://collector.istio-system.svc.cluster.local/api/v2/spans"
        );
        assert_eq!(
            uri.http_upstream_type,
            Some(http_uri::HttpUpstreamType::Cluster(
                "outbound|9411||collector.istio-system.svc.cluster.local".into()
            ))
        );
        assert_eq!(uri.timeout.unwrap().seconds, 5);
        assert!(z.trace_id_128bit);
        assert!(!z.shared_span_context.unwrap().value);
        assert_eq!(
            z.collector_endpoint_version,
            zipkin_config::CollectorEndpointVersion::HttpJson as i32
        );
        assert_eq!(
            z.trace_context_option,
            zipkin_config::TraceContextOption::UseB3 as i32
        );
    }
    // A gateway's spans have upstream children.
    let gw = config(ZIPKIN, &ingress_gateway());
    for hcm in managers(&gw) {
        let t = hcm.tracing.as_ref().unwrap();
        assert!(t.spawn_upstream_span.unwrap().value);
    }
    let custom = ZIPKIN.replace(
        "maxTagLength: 64}",
        "path: /collect, enable64bitTraceId: true, traceContextOption: USE_B3_WITH_W3C_PROPAGATION, timeout: 2s, headers: [{name: x-tenant, value: blue}]}",
    );
    let z = zipkin_of(&managers(&config(&custom, &web()))[0]);
    let service = z.collector_service.unwrap();
    let uri = service.http_uri.unwrap();
    assert_eq!(
        uri.uri,
        "http://collector.istio-system.svc.cluster.local/collect"
    );
    assert_eq!(uri.timeout.unwrap().seconds, 2);
    assert!(!z.trace_id_128bit);
    assert_eq!(
        z.trace_context_option,
        zipkin_config::TraceContextOption::UseB3WithW3cPropagation as i32
    );
    let header = service.request_headers_to_add[0].header.clone().unwrap();
    assert_eq!(
        (header.key.as_str(), header.value.as_str()),
        ("x-tenant", "blue")
    );
}

#[test]
fn the_default_provider_is_found_whatever_the_case_of_its_name() {
    // istiod's fetchProvider compares names with strings.EqualFold.
    let lines = ZIPKIN.replace("tracing: [zipkin]", "tracing: [Zipkin]");
    let yaml = format!("{MESH}{lines}{COLLECTORS}");
    let ctx = context(&yaml);
    let cfg = proxy_config(&ctx, &web());
    for hcm in managers(&cfg) {
        let service = zipkin_of(&hcm).collector_service.unwrap();
        assert_eq!(
            service.http_uri.unwrap().uri,
            "http://collector.istio-system.svc.cluster.local/api/v2/spans"
        );
    }
    assert!(
        !(ctx.issues.iter()).any(|i| i.field == "data.mesh.defaultProviders.tracing[0]"),
        "{:?}",
        ctx.issues
    );
}

#[test]
fn a_default_provider_that_cannot_be_used_configures_no_tracing_and_says_why() {
    for (lines, problem) in [
        (
            ZIPKIN.replace("collector.istio-system", "nowhere.istio-system"),
            "no service \"nowhere.istio-system.svc.cluster.local\"",
        ),
        (
            ZIPKIN.replace("tracing: [zipkin]", "tracing: [jaeger]"),
            "\"jaeger\" is not defined",
        ),
    ] {
        let yaml = format!("{MESH}{lines}{COLLECTORS}");
        let ctx = context(&yaml);
        for hcm in managers(&proxy_config(&ctx, &web())) {
            assert_eq!(hcm.tracing, None);
        }
        let issue = (ctx.issues.iter())
            .find(|i| i.field == "data.mesh.defaultProviders.tracing[0]")
            .unwrap_or_else(|| panic!("{:?}", ctx.issues));
        assert_eq!(issue.object, "ConfigMap istio-system/istio");
        assert!(issue.message.contains(problem), "{}", issue.message);
    }
}

fn otel_of(hcm: &HttpConnectionManager) -> OpenTelemetryConfig {
    let provider = hcm.tracing.as_ref().unwrap().provider.as_ref().unwrap();
    assert_eq!(provider.name, "envoy.tracers.opentelemetry");
    let Some(ProviderConfig::TypedConfig(any)) = &provider.config_type else {
        panic!()
    };
    OpenTelemetryConfig::decode(any.value.as_slice()).unwrap()
}

#[test]
fn an_opentelemetry_provider_exports_over_grpc_or_http_as_the_proxys_service_cluster() {
    let grpc = "    defaultProviders: {tracing: [otel]}\n    extensionProviders:\n    - name: otel\n      opentelemetry: {service: istio-system/collector.istio-system.svc.cluster.local, port: 4317, grpc: {timeout: 3s, initialMetadata: [{name: authorization, value: token}]}}\n";
    let o = otel_of(&managers(&config(grpc, &web()))[0]);
    assert_eq!(o.service_name, "web.shop");
    let service = o.grpc_service.unwrap();
    let Some(grpc_service::TargetSpecifier::EnvoyGrpc(envoy)) = service.target_specifier else {
        panic!()
    };
    assert_eq!(
        envoy.cluster_name,
        "outbound|4317||collector.istio-system.svc.cluster.local"
    );
    assert_eq!(envoy.authority, "collector.istio-system.svc.cluster.local");
    assert_eq!(service.timeout.unwrap().seconds, 3);
    assert_eq!(service.initial_metadata[0].key, "authorization");
    assert_eq!(o.http_service, None);

    let http = "    defaultProviders: {tracing: [otel]}\n    extensionProviders:\n    - name: otel\n      opentelemetry: {service: collector.istio-system.svc.cluster.local, port: 9411, http: {path: /v1/traces}}\n";
    let o = otel_of(&managers(&config(http, &web()))[0]);
    let uri = o.http_service.unwrap().http_uri.unwrap();
    assert_eq!(
        uri.uri,
        "collector.istio-system.svc.cluster.local/v1/traces"
    );
    assert_eq!(
        uri.http_upstream_type,
        Some(http_uri::HttpUpstreamType::Cluster(
            "outbound|9411||collector.istio-system.svc.cluster.local".into()
        ))
    );
    // Envoy requires a timeout, which istiod leaves out when the provider sets none.
    assert_eq!(uri.timeout.unwrap().seconds, 5);
    assert_eq!(o.grpc_service, None);
}

fn telemetry(name: &str, namespace: &str, spec: &str) -> String {
    format!(
        "---\napiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec: {spec}\n"
    )
}

/// A Service of web's, so that its sidecar has an inbound connection manager.
const WEB: &str = "---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {clusterIP: 10.96.8.8, selector: {app: web}, ports: [{name: http, port: 8080}]}\n";

/// web's sidecar's connection managers' tracing on each side: (outbound, inbound), each
/// the set of distinct tracings its managers have.
fn sides(
    mesh_lines: &str,
    extra: &str,
) -> (
    Vec<Option<envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing>>,
    Vec<Option<envoy_api::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing>>,
){
    use envoy_api::pb::envoy::config::core::v3::TrafficDirection;
    let yaml = format!("{MESH}{mesh_lines}{COLLECTORS}{WEB}{extra}");
    let cfg = proxy_config(&context(&yaml), &web());
    let of = |direction: TrafficDirection| {
        let listeners = (cfg.listeners.iter())
            .filter(|l| l.traffic_direction == direction as i32)
            .cloned()
            .collect();
        let mut out: Vec<_> = managers(&ProxyConfig {
            listeners,
            ..Default::default()
        })
        .into_iter()
        .map(|h| h.tracing)
        .collect();
        out.dedup();
        out
    };
    (
        of(TrafficDirection::Outbound),
        of(TrafficDirection::Inbound),
    )
}

const PROVIDER: &str = "    extensionProviders:\n    - name: zipkin\n      zipkin: {service: collector.istio-system.svc.cluster.local, port: 9411}\n";

#[test]
fn telemetry_tracing_overrides_the_mesh_per_side_namespace_and_workload() {
    let root = telemetry(
        "mesh",
        "istio-system",
        "{tracing: [{providers: [{name: zipkin}], randomSamplingPercentage: 25}]}",
    );
    let (outbound, inbound) = sides(PROVIDER, &root);
    assert_eq!(outbound, inbound);
    let t = outbound[0].as_ref().unwrap();
    assert_eq!(t.random_sampling.unwrap().value, 25.0);
    assert_eq!(t.provider.as_ref().unwrap().name, "envoy.tracers.zipkin");
    assert!(
        t.custom_tags
            .iter()
            .any(|t| t.tag == "istio.canonical_service")
    );
    // The namespace stops its server side reporting; the client side keeps the mesh's.
    let shop = telemetry(
        "shop",
        "shop",
        "{tracing: [{match: {mode: SERVER}, disableSpanReporting: true}]}",
    );
    let (outbound, inbound) = sides(PROVIDER, &format!("{root}{shop}"));
    assert_eq!(inbound, [None]);
    assert_eq!(
        outbound[0].as_ref().unwrap().random_sampling.unwrap().value,
        25.0
    );
    // The workload's own tags replace Istio's.
    let own = telemetry(
        "web",
        "shop",
        "{selector: {matchLabels: {app: web}}, tracing: [{enableIstioTags: false, customTags: {team: {literal: {value: shop}}}}]}",
    );
    let (outbound, _) = sides(PROVIDER, &format!("{root}{own}"));
    let tags: Vec<(&str, Option<custom_tag::Type>)> =
        (outbound[0].as_ref().unwrap().custom_tags.iter())
            .map(|t| (t.tag.as_str(), t.r#type.clone()))
            .collect();
    assert_eq!(tags, [("team", literal("shop"))]);
    // Telemetry tracing without a provider anywhere traces nothing, as istiod disables it,
    // whatever enableTracing says.
    let no_provider = telemetry(
        "mesh",
        "istio-system",
        "{tracing: [{randomSamplingPercentage: 50}]}",
    );
    let (outbound, inbound) = sides("    enableTracing: true\n", &no_provider);
    assert_eq!((outbound, inbound), (vec![None], vec![None]));
}

/// `PILOT_TRACE_SAMPLING` and a provider header's `envName` come from the control plane's
/// environment as the store was given it, not from the process translating: the same
/// configuration translates alike wherever it runs.
#[test]
fn the_sampling_default_and_env_headers_come_from_the_stores_environment() {
    let mesh = "    defaultProviders: {tracing: [otel]}\n    extensionProviders:\n    - name: otel\n      opentelemetry: {service: istio-system/collector.istio-system.svc.cluster.local, port: 4317, grpc: {initialMetadata: [{name: authorization, envName: OTEL_TOKEN}]}}\n";
    let yaml = format!("{MESH}{mesh}{COLLECTORS}{GATEWAY}");
    let with = |vars: &[(&str, &str)]| {
        let mut store = model::testmesh::store_of("mesh.yaml", &yaml);
        let env = vars.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        store.set_environment(env.collect());
        let ctx = model::PushContext::build(&store, "t/1".into());
        let hcm = managers(&proxy_config(&ctx, &web())).remove(0);
        let sampling = hcm.tracing.as_ref().unwrap().random_sampling.unwrap().value;
        let metadata = otel_of(&hcm).grpc_service.unwrap().initial_metadata;
        (sampling, metadata[0].value.clone())
    };
    assert_eq!(with(&[]), (1.0, String::new()));
    assert_eq!(
        with(&[("PILOT_TRACE_SAMPLING", "12.5"), ("OTEL_TOKEN", "secret")]),
        (12.5, "secret".to_string())
    );
    assert_eq!(with(&[("PILOT_TRACE_SAMPLING", "250")]).0, 1.0);
}
