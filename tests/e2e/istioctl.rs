//! What `istioctl proxy-status` reads over xDS: istiod's debug types
//! (`istio.io/debug/syncz`, `istio.io/debug/config_dump`, `istio.io/debug`) asked on the
//! secure port with a token, as istioctl's ADS client asks them, about real Envoys.

use std::time::Duration;

use envoy_api::pb::envoy::admin::v3::{ClustersConfigDump, ListenersConfigDump, RoutesConfigDump};
use envoy_api::pb::envoy::config::core::v3::Node;
use envoy_api::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_api::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_api::pb::envoy::service::status::v3::{ClientConfig, ConfigStatus};
use envoy_api::pb::google::protobuf::{Any, Struct, Value, value::Kind};
use meshd::dump::any_to_json;
use prost::{Message, Name};
use serde_json::json;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::harness::*;

const SYNCZ: &str = "istio.io/debug/syncz";
const CONFIG_DUMP: &str = "istio.io/debug/config_dump";
const DEBUG: &str = "istio.io/debug";
const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// The node istioctl's ADS client sends: a made-up sidecar id, the `event` generator, and
/// the namespace and service account its token is for.
fn istioctl_node(namespace: &str) -> Node {
    let s = |v: &str| Value {
        kind: Some(Kind::StringValue(v.into())),
    };
    Node {
        id: "sidecar~10.9.0.1~test-1.default~default.svc.cluster.local".into(),
        metadata: Some(Struct {
            fields: [
                ("GENERATOR".to_string(), s("event")),
                ("SERVICE_ACCOUNT".to_string(), s("default")),
                ("NAMESPACE".to_string(), s(namespace)),
            ]
            .into(),
        }),
        ..Default::default()
    }
}

fn with_token<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        let bearer = format!("Bearer {token}").parse().unwrap();
        request.metadata_mut().insert("authorization", bearer);
    }
    request
}

/// The first message of an answer stream (within 10 s), or the refusal.
async fn first_answer<T>(stream: &mut tonic::Streaming<T>) -> Result<T, tonic::Status> {
    let first = tokio::time::timeout(Duration::from_secs(10), stream.message()).await;
    let first = first.expect("no answer in 10s")?;
    Ok(first.expect("stream closed without an answer"))
}

/// One state-of-the-world debug request over `channel` and its answer.
async fn ask(
    channel: tonic::transport::Channel,
    token: Option<&str>,
    namespace: &str,
    type_url: &str,
    names: &[&str],
) -> Result<DiscoveryResponse, tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tx.send(DiscoveryRequest {
        node: Some(istioctl_node(namespace)),
        type_url: type_url.into(),
        resource_names: names.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut stream = AggregatedDiscoveryServiceClient::new(channel)
        .stream_aggregated_resources(with_token(ReceiverStream::new(rx), token))
        .await?
        .into_inner();
    let answer = first_answer(&mut stream).await?;
    // ACKed as istioctl's client does; a debug stream takes no more from an ACK.
    tx.send(DiscoveryRequest {
        type_url: type_url.into(),
        response_nonce: answer.nonce.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    Ok(answer)
}

/// As [`ask`], over delta ADS.
async fn ask_delta(
    channel: tonic::transport::Channel,
    token: Option<&str>,
    namespace: &str,
    type_url: &str,
) -> Result<DeltaDiscoveryResponse, tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tx.send(DeltaDiscoveryRequest {
        node: Some(istioctl_node(namespace)),
        type_url: type_url.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut stream = AggregatedDiscoveryServiceClient::new(channel)
        .delta_aggregated_resources(with_token(ReceiverStream::new(rx), token))
        .await?
        .into_inner();
    first_answer(&mut stream).await
}

/// Each `ClientConfig` of a syncz answer: node id → (type URL → status name).
fn statuses(resources: &[Any]) -> Vec<(String, Vec<(String, String)>)> {
    resources
        .iter()
        .map(|r| {
            assert_eq!(r.type_url, ClientConfig::type_url());
            let c = ClientConfig::decode(&r.value[..]).unwrap();
            let types = (c.generic_xds_configs.iter())
                .map(|g| {
                    let status = ConfigStatus::try_from(g.config_status).unwrap();
                    (g.type_url.clone(), status.as_str_name().to_string())
                })
                .collect();
            (c.node.unwrap().id, types)
        })
        .collect()
}

/// The resources of one section of a config dump answer, each as JSON, by name.
fn dumped<M: Message + Name + Default>(
    answer: &DiscoveryResponse,
    resources: impl Fn(M) -> Vec<Any>,
) -> std::collections::BTreeMap<String, serde_json::Value> {
    let section = (answer.resources.iter())
        .find(|a| a.type_url == M::type_url())
        .unwrap_or_else(|| panic!("no {} in the dump", M::type_url()));
    resources(M::decode(&section.value[..]).unwrap())
        .iter()
        .map(|a| {
            let json = any_to_json(a).unwrap();
            (json["name"].as_str().unwrap().to_string(), json)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istioctl_reads_proxy_status_and_config_dumps_over_xds() {
    let root = temp_dir("istioctl");
    let dir = root.join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let (_up, port) = write_reviews(&dir);
    let tokens = root.join("tokens");
    std::fs::write(
        &tokens,
        "root-token istio-system default\nshop-token shop default\n",
    )
    .unwrap();
    let meshd = Meshd::start_with(&dir, &["--ca-token-file", tokens.to_str().unwrap()]);
    let (sidecar, gateway) = tokio::task::block_in_place(|| {
        let sidecar = Envoy::sidecar(&meshd, Ads::Delta, "shop", "client");
        let gateway = Envoy::gateway(&meshd, Ads::Sotw, "ingress");
        for envoy in [&sidecar, &gateway] {
            wait_until("every type ACKed", Duration::from_secs(10), || {
                let s = meshd.syncz(&envoy.id);
                let types = s["types"].as_object().unwrap();
                !types.is_empty() && types.values().all(|t| t["nonce_sent"] == t["nonce_acked"])
            });
        }
        (sidecar, gateway)
    });
    let secure = || async { meshd.secure_channel(&meshd.root_pem(), None).await.unwrap() };

    // proxy-status: every proxy, each type it holds SYNCED, and who answered.
    let answer = ask(
        secure().await,
        Some("root-token"),
        "istio-system",
        SYNCZ,
        &[],
    )
    .await
    .unwrap();
    assert_eq!(answer.type_url, SYNCZ);
    let got = statuses(&answer.resources);
    // Named as istiod names them: `POD.NAMESPACE`, the node id's third part.
    let pod = |id: &str| id.split('~').nth(2).unwrap().to_string();
    let (gateway_pod, sidecar_pod) = (pod(&gateway.id), pod(&sidecar.id));
    let mut both = [gateway_pod.as_str(), sidecar_pod.as_str()];
    both.sort();
    let ids: Vec<&str> = got.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, both, "every proxy, by id");
    for (id, types) in &got {
        assert!(
            !types.is_empty() && types.iter().all(|(_, s)| s == "SYNCED"),
            "{id}: {types:?}"
        );
    }
    let sidecar_types: Vec<&str> = (got.iter().find(|(id, _)| *id == sidecar_pod))
        .unwrap()
        .1
        .iter()
        .map(|(t, _)| t.as_str())
        .collect();
    assert_eq!(
        sidecar_types,
        [
            CDS,
            "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
            "type.googleapis.com/envoy.config.listener.v3.Listener",
            "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
        ]
    );
    let c = (answer.resources.iter())
        .map(|r| ClientConfig::decode(&r.value[..]).unwrap())
        .find(|c| c.node.as_ref().unwrap().id == sidecar_pod)
        .unwrap();
    assert!(
        c.generic_xds_configs
            .iter()
            .all(|g| g.last_updated.as_ref().is_some_and(|t| t.seconds > 0)),
        "each type says when it was last sent: {c:?}"
    );
    let meta = &c.node.unwrap().metadata.unwrap().fields;
    assert_eq!(
        meta["NAMESPACE"].kind,
        Some(Kind::StringValue("shop".into()))
    );
    assert_eq!(
        meta["ISTIO_VERSION"].kind,
        Some(Kind::StringValue("1.28.0".into()))
    );
    let cp: serde_json::Value =
        serde_json::from_str(&answer.control_plane.unwrap().identifier).unwrap();
    assert_eq!(cp["Component"], "istiod", "{cp}");
    assert!(cp["ID"].as_str().is_some_and(|id| !id.is_empty()), "{cp}");
    assert!(cp["Info"]["version"].is_string(), "{cp}");
    // The debug client is no proxy: not listed, not counted.
    assert_eq!(meshd.json("/debug/syncz").as_array().unwrap().len(), 2);
    assert_eq!(meshd.metric("pilot_xds_clients"), 2.0);

    // A caller of another namespace sees its own namespace's proxies (over delta too).
    let answer = ask_delta(secure().await, Some("shop-token"), "shop", SYNCZ)
        .await
        .unwrap();
    let ids: Vec<&str> = answer.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(ids, [sidecar_pod.as_str()]);

    // config_dump, as `istioctl proxy-status POD` compares it with the proxy's own:
    // resource for resource what Envoy reports holding.
    let answer = ask(
        secure().await,
        Some("root-token"),
        "istio-system",
        CONFIG_DUMP,
        &["client-0.shop"],
    )
    .await
    .unwrap();
    let sections: Vec<&str> = answer
        .resources
        .iter()
        .map(|a| a.type_url.as_str())
        .collect();
    assert_eq!(
        sections,
        [
            "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump",
            "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
            "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
            "type.googleapis.com/envoy.admin.v3.ScopedRoutesConfigDump",
            "type.googleapis.com/envoy.admin.v3.RoutesConfigDump",
            "type.googleapis.com/envoy.admin.v3.SecretsConfigDump",
            "type.googleapis.com/envoy.admin.v3.EcdsConfigDump",
        ]
    );
    let clusters = dumped(&answer, |d: ClustersConfigDump| {
        (d.dynamic_active_clusters.into_iter())
            .filter_map(|c| c.cluster)
            .collect()
    });
    let listeners = dumped(&answer, |d: ListenersConfigDump| {
        (d.dynamic_listeners.into_iter())
            .filter_map(|l| l.active_state?.listener)
            .collect()
    });
    let routes = dumped(&answer, |d: RoutesConfigDump| {
        (d.dynamic_route_configs.into_iter())
            .filter_map(|r| r.route_config)
            .collect()
    });
    let sections = [
        ("dynamic_active_clusters", &["cluster"][..], clusters),
        (
            "dynamic_listeners",
            &["active_state", "listener"][..],
            listeners,
        ),
        ("dynamic_route_configs", &["route_config"][..], routes),
    ];
    for (resource, field, ours) in sections {
        let theirs = tokio::task::block_in_place(|| envoy_dump(&sidecar, resource, field, "name"));
        assert!(!theirs.is_empty(), "{resource}");
        assert_eq!(
            theirs, ours,
            "{resource}: the same resources as Envoy holds"
        );
    }
    assert!(
        (answer.resources.iter()).all(|a| a.type_url != "istio.io/debug"),
        "typed sections only"
    );
    // `meshd proxy-status POD --envoy-admin` finds what differs: the sidecar's
    // configuration against the gateway's Envoy.
    let admin = format!("127.0.0.1:{}", gateway.admin_port);
    let compared = tokio::task::block_in_place(|| {
        meshd.cli(&["proxy-status", "client-0.shop", "--envoy-admin", &admin])
    });
    assert!(compared.contains("Listeners Don't Match"), "{compared}");
    let inbound = (compared.lines()).find(|l| l.contains("served by meshd, not held by Envoy"));
    assert!(inbound.is_some(), "the sidecar's own listeners: {compared}");

    // Any debug view by name, its body as the resource.
    let answer = ask(
        secure().await,
        Some("root-token"),
        "istio-system",
        DEBUG,
        &["syncz"],
    )
    .await
    .unwrap();
    assert_eq!(answer.resources.len(), 1);
    assert_eq!(answer.resources[0].type_url, DEBUG);
    let view: serde_json::Value = serde_json::from_slice(&answer.resources[0].value).unwrap();
    let mut proxies: Vec<&str> = (view.as_array().unwrap().iter())
        .map(|c| c["proxy"].as_str().unwrap())
        .collect();
    proxies.sort();
    let mut both = [gateway.id.as_str(), sidecar.id.as_str()];
    both.sort();
    assert_eq!(proxies, both);
    let answer = ask(
        secure().await,
        Some("root-token"),
        "istio-system",
        DEBUG,
        &["config_dump?proxyID=nobody.shop"],
    )
    .await
    .unwrap();
    let body = String::from_utf8(answer.resources[0].value.clone()).unwrap();
    assert!(
        body.starts_with(&json!({"statusCode": "404"}).to_string()) && body.contains("nobody"),
        "{body}"
    );

    // The views' names, as `istioctl x internal-debug` lists them; the index an operator
    // browses; the name Pilot's docs give syncz.
    let answer = ask(
        secure().await,
        Some("root-token"),
        "istio-system",
        DEBUG,
        &["list"],
    )
    .await
    .unwrap();
    let names: Vec<String> = serde_json::from_slice(&answer.resources[0].value).unwrap();
    for name in [
        "syncz",
        "synz",
        "config_dump",
        "registryz",
        "endpointShardz",
    ] {
        assert!(names.contains(&name.to_string()), "{name} in {names:?}");
    }
    assert!(!names.contains(&"list".to_string()), "{names:?}");
    let index = meshd.get("/debug").unwrap();
    assert_eq!(index.status, 200);
    for name in &names {
        assert!(index.body.contains(&format!("/debug/{name}")), "{name}");
    }
    assert_eq!(meshd.json("/debug/synz"), meshd.json("/debug/syncz"));

    // Refused: without an identity (the plaintext port), another namespace's views and
    // proxies, a malformed request; each counted, and nothing else disturbed.
    let refused = [
        ask(
            meshd.plain_channel().await,
            None,
            "istio-system",
            SYNCZ,
            &[],
        )
        .await,
        ask(
            secure().await,
            Some("shop-token"),
            "shop",
            DEBUG,
            &["syncz"],
        )
        .await,
        ask(
            secure().await,
            Some("shop-token"),
            "shop",
            CONFIG_DUMP,
            &["ingress-0.istio-system"],
        )
        .await,
        ask(
            secure().await,
            Some("root-token"),
            "istio-system",
            CONFIG_DUMP,
            &[],
        )
        .await,
        ask(
            secure().await,
            Some("root-token"),
            "istio-system",
            "istio.io/debug/nope",
            &[],
        )
        .await,
        ask(
            secure().await,
            Some("shop-token"),
            "shop",
            DEBUG,
            &["edsz?proxyID=ingress-0.istio-system"],
        )
        .await,
    ];
    let codes: Vec<(Code, String)> = refused
        .into_iter()
        .map(|r| {
            let status = r.expect_err("refused");
            (status.code(), status.message().to_string())
        })
        .collect();
    let expected = [
        (Code::Unauthenticated, "secure port"),
        (Code::PermissionDenied, "root namespace"),
        (Code::NotFound, "ingress-0.istio-system"),
        (Code::InvalidArgument, "exactly one proxy"),
        (Code::InvalidArgument, "istio.io/debug/nope"),
        (Code::PermissionDenied, "of their own namespace"),
    ];
    for ((code, message), (want, says)) in codes.iter().zip(expected) {
        assert_eq!(*code, want, "{message}");
        assert!(message.contains(says), "{message:?} should say {says:?}");
    }
    assert_eq!(
        meshd.metric(r#"meshd_xds_connection_errors{reason="debug_request"}"#),
        6.0
    );
    // A caller of shop may read its own proxy's views, as istiod lets it.
    let answer = ask(
        secure().await,
        Some("shop-token"),
        "shop",
        DEBUG,
        &["config_dump?proxyID=client-0.shop"],
    )
    .await
    .unwrap();
    let dump: serde_json::Value = serde_json::from_slice(&answer.resources[0].value).unwrap();
    let clusters = meshd::cli::dump_by_name(&dump, "dynamic_active_clusters", &["cluster"]);
    assert!(
        clusters.contains_key(&format!("outbound|{port}||reviews.shop.svc.cluster.local")),
        "{clusters:?}"
    );
    // And its DNS name table, as `istioctl x internal-debug ndsz` reads it.
    let answer = ask(
        secure().await,
        Some("shop-token"),
        "shop",
        DEBUG,
        &["ndsz?proxyID=client-0.shop"],
    )
    .await
    .unwrap();
    let ndsz: serde_json::Value = serde_json::from_slice(&answer.resources[0].value).unwrap();
    let reviews = &ndsz["configs"][0]["table"]["reviews.shop.svc.cluster.local"];
    assert_eq!(reviews["shortname"], "reviews", "{ndsz}");
    // The proxy named by its node id, percent-encoded as a query value may be: the check
    // reads the id the view reads.
    let encoded = sidecar.id.replace('~', "%7E");
    let answer = ask(
        secure().await,
        Some("shop-token"),
        "shop",
        DEBUG,
        &[&format!("edsz?proxyID={encoded}")],
    )
    .await
    .unwrap();
    let edsz: serde_json::Value = serde_json::from_slice(&answer.resources[0].value).unwrap();
    assert_eq!(edsz[0]["proxy"], sidecar.id, "{edsz}");
    assert_eq!(meshd.metric("pilot_xds_clients"), 2.0);
    let still = meshd.syncz(&sidecar.id);
    assert_eq!(still["types"]["cds"]["rejects"], 0);
}

/// A proxy that rejects what it is sent shows as ERROR, with Envoy's message, until it
/// is sent something it accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_type_shows_as_error_in_proxy_status() {
    let root = temp_dir("istioctl-nack");
    let dir = root.join("config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("reviews.yaml"),
        service_yaml("shop", "reviews", free_port(), &[]),
    )
    .unwrap();
    let tokens = root.join("tokens");
    std::fs::write(&tokens, "root-token istio-system default\n").unwrap();
    let meshd = Meshd::start_with(&dir, &["--ca-token-file", tokens.to_str().unwrap()]);
    // A scripted proxy that NACKs its clusters.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let id = "sidecar~10.2.0.7~picky-0.shop~shop.svc.cluster.local";
    tx.send(DeltaDiscoveryRequest {
        node: Some(xds_node(id, "shop")),
        type_url: CDS.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut stream = xds_client(&meshd)
        .await
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    tx.send(DeltaDiscoveryRequest {
        type_url: CDS.into(),
        response_nonce: first.nonce.clone(),
        error_detail: Some(envoy_api::pb::google::rpc::Status {
            code: 3,
            message: "picky: no clusters today".into(),
            details: vec![],
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    tokio::task::block_in_place(|| {
        wait_until("the NACK recorded", Duration::from_secs(5), || {
            meshd.syncz(id)["types"]["cds"]["rejects"] == 1
        })
    });
    let secure = meshd.secure_channel(&meshd.root_pem(), None).await.unwrap();
    let answer = ask(secure, Some("root-token"), "istio-system", SYNCZ, &[])
        .await
        .unwrap();
    let c = ClientConfig::decode(&answer.resources[0].value[..]).unwrap();
    assert_eq!(
        c.node.as_ref().unwrap().id,
        "picky-0.shop",
        "istiod's POD.NAMESPACE"
    );
    let cds = &c.generic_xds_configs[0];
    assert_eq!(cds.type_url, CDS);
    assert_eq!(cds.config_status, ConfigStatus::Error as i32);
    let error = cds.error_state.as_ref().expect("the rejection's details");
    assert_eq!(error.details, "picky: no clusters today");
    // meshd's own proxy-status says the same.
    let table = tokio::task::block_in_place(|| meshd.cli(&["proxy-status"]));
    let row = table
        .lines()
        .find(|l| l.starts_with("picky-0.shop"))
        .unwrap();
    assert_eq!(row.split_whitespace().nth(2), Some("ERROR"), "{table}");
}
