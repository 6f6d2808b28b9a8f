//! NDS: the DNS name table istio-agent's DNS proxy answers from. The agent asks for it on
//! its Envoy's ADS stream, which it relays (pkg/istio-agent/xds_proxy_delta.go): after
//! Envoy's first listener request it adds a request for the table, keeps the table
//! responses for itself and ACKs them, and passes everything else on. Here a relay of
//! that kind sits between a real Envoy and meshd.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_api::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_api::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_api::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use prost::{Message, Name};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use translate::name_table::NameTable;

use crate::harness::*;

const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

type Responses<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

/// What the relay saw of the table: each one meshd sent, in order.
type Tables = Arc<Mutex<Vec<NameTable>>>;

/// istio-agent's xDS proxy, as far as NDS goes (delta ADS, which Istio's agents use).
struct AgentRelay {
    meshd: tonic::transport::Channel,
    tables: Tables,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for AgentRelay {
    type StreamAggregatedResourcesStream = Responses<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Responses<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        _: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("the relay speaks delta ADS"))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let mut from_envoy = request.into_inner();
        let (to_meshd, requests) = tokio::sync::mpsc::channel(16);
        let mut from_meshd = AggregatedDiscoveryServiceClient::new(self.meshd.clone())
            .delta_aggregated_resources(ReceiverStream::new(requests))
            .await?
            .into_inner();
        let relay = to_meshd.clone();
        tokio::spawn(async move {
            let mut asked = false;
            while let Ok(Some(r)) = from_envoy.message().await {
                let listeners = r.type_url == LISTENER_TYPE;
                if relay.send(r).await.is_err() {
                    return;
                }
                if listeners && !asked {
                    asked = true;
                    let nds = DeltaDiscoveryRequest {
                        type_url: NameTable::type_url(),
                        ..Default::default()
                    };
                    if relay.send(nds).await.is_err() {
                        return;
                    }
                }
            }
        });
        let (to_envoy, responses) = tokio::sync::mpsc::channel(16);
        let tables = self.tables.clone();
        tokio::spawn(async move {
            while let Ok(Some(r)) = from_meshd.message().await {
                if r.type_url != NameTable::type_url() {
                    if to_envoy.send(Ok(r)).await.is_err() {
                        return;
                    }
                    continue;
                }
                // The agent takes the first resource as the whole table.
                let table = (r.resources.first())
                    .map(|res| NameTable::decode(&*res.resource.as_ref().unwrap().value).unwrap());
                tables.lock().unwrap().extend(table);
                let ack = DeltaDiscoveryRequest {
                    type_url: r.type_url,
                    response_nonce: r.nonce,
                    ..Default::default()
                };
                if to_meshd.send(ack).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(responses))))
    }
}

/// Starts the relay in front of `meshd`'s plaintext port; returns its port.
async fn start_relay(meshd: &Meshd, tables: Tables) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let relay = AgentRelay {
        meshd: meshd.plain_channel().await,
        tables,
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AggregatedDiscoveryServiceServer::new(relay))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    port
}

fn entry(name: &str, host: &str, address: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  hosts: [{host}]\n  addresses: [{address}]\n  ports: [{{number: 80, name: http, protocol: HTTP}}]\n  location: MESH_EXTERNAL\n  resolution: STATIC\n  endpoints: [{{address: 127.0.0.1}}]\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_capturing_dns_gets_the_name_table_and_its_changes_while_envoy_routes() {
    let dir = temp_dir("nds").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let (_up, port) = write_reviews(&dir);
    std::fs::write(
        dir.join("legacy.yaml"),
        entry("legacy", "legacy.corp.example", "192.168.7.7"),
    )
    .unwrap();
    let meshd = Meshd::start(&dir);
    let tables = Tables::default();
    let relay = start_relay(&meshd, tables.clone()).await;
    let table_count = || tables.lock().unwrap().len();
    let last_table = || tables.lock().unwrap().last().cloned().unwrap();

    tokio::task::block_in_place(|| {
        let envoy = Envoy::sidecar_through(
            &meshd,
            relay,
            Ads::Delta,
            "shop",
            "productpage",
            r#"DNS_CAPTURE: "true""#,
        );
        // Envoy's own configuration goes through as before: it routes.
        wait_until("the sidecar to route", Duration::from_secs(10), || {
            http_get(&format!("{}:{port}", envoy.ip), "reviews", "/", &[])
                .is_ok_and(|r| r.status == 200 && r.body.contains("reviews-1"))
        });
        wait_until("the name table", Duration::from_secs(10), || {
            table_count() > 0
        });
        let table = last_table();
        let reviews = &table.table["reviews.shop.svc.cluster.local"];
        let vip = reviews.ips[0].clone();
        assert!(
            std::fs::read_to_string(dir.join("reviews.yaml"))
                .unwrap()
                .contains(&format!("clusterIP: {vip}")),
            "{reviews:?}"
        );
        assert_eq!(reviews.registry, "Kubernetes");
        assert_eq!(
            (&*reviews.shortname, &*reviews.namespace),
            ("reviews", "shop")
        );
        let legacy = &table.table["legacy.corp.example"];
        assert_eq!(
            (&legacy.ips[..], &*legacy.registry),
            (&["192.168.7.7".to_string()][..], "External")
        );
        assert_eq!(table.table.len(), 2, "{table:?}");

        // /debug/ndsz shows the table meshd sent, as istiod's does.
        let ndsz = meshd.json(&format!("/debug/ndsz?proxyID={}", envoy.id));
        assert_eq!(ndsz["configs"][0]["@type"], NameTable::type_url());
        assert_eq!(
            ndsz["configs"][0]["table"]["legacy.corp.example"],
            serde_json::json!({"ips": ["192.168.7.7"], "registry": "External"})
        );
        assert_eq!(
            ndsz["configs"][0]["table"]["reviews.shop.svc.cluster.local"]["shortname"],
            "reviews"
        );
        wait_until("NDS ACKed", Duration::from_secs(10), || {
            let nds = &meshd.syncz(&envoy.id)["types"]["nds"];
            nds["responses"].as_u64() > Some(0) && nds["nonce_sent"] == nds["nonce_acked"]
        });

        // A new ServiceEntry: a new table with its host, and its cluster for Envoy.
        let before = table_count();
        meshd.write(
            "billing.yaml",
            &entry("billing", "billing.corp.example", "192.168.7.8"),
        );
        wait_until("the table with billing", Duration::from_secs(10), || {
            table_count() > before && last_table().table.contains_key("billing.corp.example")
        });
        assert_eq!(
            last_table().table["billing.corp.example"].ips,
            ["192.168.7.8"]
        );
        wait_until(
            "Envoy's cluster for billing",
            Duration::from_secs(10),
            || {
                envoy
                    .config_dump("dynamic_active_clusters")
                    .contains("outbound|80||billing.corp.example")
            },
        );

        // A DestinationRule changes clusters, not names: Envoy gets it, the agent nothing.
        let before = table_count();
        meshd.write(
            "dr.yaml",
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: billing, namespace: shop}\nspec:\n  host: billing.corp.example\n  trafficPolicy: {connectionPool: {tcp: {maxConnections: 7}}}\n",
        );
        wait_until("Envoy's limit for billing", Duration::from_secs(10), || {
            envoy
                .config_dump("dynamic_active_clusters")
                .contains("\"max_connections\": 7")
        });
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            table_count(),
            before,
            "no table for a change that names none"
        );
        assert!(meshd.pushes("nds") >= 2.0);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sotw_agent_gets_the_table_and_a_proxy_without_a_dns_proxy_gets_none() {
    let dir = temp_dir("nds-sotw").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("legacy.yaml"),
        entry("legacy", "legacy.corp.example", "192.168.7.7"),
    )
    .unwrap();
    let meshd = Meshd::start(&dir);
    let ask = |dns: bool| {
        let meshd = &meshd;
        async move {
            let mut node = xds_node("sidecar~10.2.0.1~app-0.shop~shop.svc.cluster.local", "shop");
            if dns {
                let flag = envoy_api::pb::google::protobuf::Value {
                    kind: Some(envoy_api::pb::google::protobuf::value::Kind::StringValue(
                        "true".into(),
                    )),
                };
                node.metadata
                    .as_mut()
                    .unwrap()
                    .fields
                    .insert("DNS_CAPTURE".into(), flag);
            }
            let request = DiscoveryRequest {
                node: Some(node),
                type_url: NameTable::type_url(),
                ..Default::default()
            };
            let mut stream = xds_client(meshd)
                .await
                .stream_aggregated_resources(tokio_stream::iter([request]))
                .await
                .unwrap()
                .into_inner();
            let first = tokio::time::timeout(Duration::from_secs(5), stream.message())
                .await
                .expect("an answer in 5 s")
                .unwrap()
                .expect("an open stream");
            assert_eq!(first.type_url, NameTable::type_url());
            first.resources
        }
    };
    let with = ask(true).await;
    assert_eq!(with.len(), 1, "one table");
    let table = NameTable::decode(&*with[0].value).unwrap();
    assert_eq!(table.table["legacy.corp.example"].ips, ["192.168.7.7"]);
    assert!(
        ask(false).await.is_empty(),
        "an empty answer, which the agent ignores"
    );
}
