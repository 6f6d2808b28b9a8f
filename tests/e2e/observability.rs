//! What an operator sees: the seed's metrics, the debug views (config_dump compared with
//! what Envoy itself reports), `meshd proxy-status` / `proxy-config`, and the freeing of
//! proxies that vanish, stall, or come and go by the thousand.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use envoy_api::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_api::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use serde_json::Value;
use tokio_stream::wrappers::ReceiverStream;

use crate::harness::*;

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

fn vs(header: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  hosts: [reviews]\n  http:\n  - match: [{{headers: {{x-user: {{exact: {header}}}}}}}]\n    route: [{{destination: {{host: reviews}}}}]\n  - route: [{{destination: {{host: reviews}}}}]\n"
    )
}

/// A Service whose EndpointSlice names a Pod that does not exist.
const GHOST: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: ghost, namespace: shop}\nspec: {clusterIP: 10.96.9.9, ports: [{name: http, port: 7000}]}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: ghost-1, namespace: shop, labels: {kubernetes.io/service-name: ghost}}\naddressType: IPv4\nports: [{name: http, port: 7000}]\nendpoints: [{addresses: [10.1.2.3], conditions: {ready: true}, targetRef: {kind: Pod, name: ghost-gone}}]\n";

#[test]
fn config_dump_matches_envoys_own_and_the_clis_and_debug_views_show_the_mesh() {
    let dir = temp_dir("observability").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let (up, port) = write_reviews(&dir);
    std::fs::write(dir.join("vs.yaml"), vs("jason")).unwrap();
    std::fs::write(dir.join("ghost.yaml"), GHOST).unwrap();
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "client");
    wait_until("the sidecar to route", Duration::from_secs(10), || {
        http_get(&format!("{}:{port}", envoy.ip), "reviews", "/", &[])
            .is_ok_and(|r| r.body == "reviews-1")
    });
    wait_until("every type ACKed", Duration::from_secs(5), || {
        let s = meshd.syncz(&envoy.id);
        ["cds", "eds", "lds", "rds"]
            .iter()
            .all(|t| s["types"][t]["nonce_sent"] == s["types"][t]["nonce_acked"])
    });

    // pilot_xds_config_size_bytes: one observation per response, of its resources' bytes.
    let sync = meshd.syncz(&envoy.id);
    for (short, kind) in [
        ("cds", "cluster.v3.Cluster"),
        ("eds", "endpoint.v3.ClusterLoadAssignment"),
        ("lds", "listener.v3.Listener"),
        ("rds", "route.v3.RouteConfiguration"),
    ] {
        let series = |what: &str| {
            let url = format!("type.googleapis.com/envoy.config.{kind}");
            meshd.metric(&format!(
                r#"pilot_xds_config_size_bytes_{what}{{type="{url}"}}"#
            ))
        };
        let responses = sync["types"][short]["responses"].as_f64().unwrap();
        assert!(responses >= 1.0, "{short}");
        assert_eq!(series("count"), responses, "{short}");
        assert!(series("sum") > 0.0, "{short}");
    }

    // The build, as istiod's dashboard reads it: the version `meshd --version` prints.
    let version = String::from_utf8(run_meshd(&["--version"], &[])).unwrap();
    let tag = version.split_whitespace().nth(1).unwrap();
    assert_eq!(
        meshd.metric(&format!(r#"istio_build{{component="pilot",tag="{tag}"}}"#)),
        1.0
    );

    // config_dump: resource for resource what Envoy reports holding.
    let ours = meshd.json("/debug/config_dump?proxyID=client-0.shop");
    let pairs = [
        (
            "dynamic_active_clusters",
            &["cluster"][..],
            "dynamic_active_clusters",
            &["cluster"][..],
        ),
        (
            "dynamic_listeners",
            &["active_state", "listener"][..],
            "dynamic_listeners",
            &["active_state", "listener"][..],
        ),
        (
            "dynamic_route_configs",
            &["route_config"][..],
            "dynamic_route_configs",
            &["route_config"][..],
        ),
    ];
    for (resource, envoy_field, section, our_field) in pairs {
        let theirs = envoy_dump(&envoy, resource, envoy_field, "name");
        let mine = meshd_dump(&ours, section, our_field, "name");
        assert!(!theirs.is_empty(), "{resource}");
        assert_eq!(
            theirs.keys().collect::<Vec<_>>(),
            mine.keys().collect::<Vec<_>>(),
            "{resource}: the same names"
        );
        for (name, r) in &theirs {
            assert_eq!(r, &mine[name], "{resource} {name}: the same JSON");
        }
    }

    // The per-type views and the registry views.
    let cdsz = meshd.json("/debug/cdsz?proxyID=client-0.shop");
    let names: Vec<&str> = cdsz[0]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&format!("outbound|{port}||reviews.shop.svc.cluster.local").as_str()),
        "{names:?}"
    );
    let edsz = meshd.json("/debug/edsz?proxyID=client-0.shop").to_string();
    assert!(
        edsz.contains(&format!("\"port_value\":{}", up.port)),
        "{edsz}"
    );
    let adsz = meshd.json("/debug/adsz");
    assert_eq!(adsz["clients"][0]["proxy"], envoy.id.as_str());
    assert!(
        adsz["clients"][0]["resources"]["rds"]
            .as_array()
            .unwrap()
            .contains(&Value::from(port.to_string()))
    );
    let workloadz = meshd.json("/debug/workloadz");
    assert_eq!(workloadz[0]["labels"]["app"], "client");
    assert_eq!(workloadz[0]["namespace"], "shop");
    let brief = meshd.get("/debug/endpointz?brief=1").unwrap().body;
    assert!(brief.starts_with("SERVICE"), "{brief}");
    assert!(
        brief.contains(&format!("127.0.0.1:{}", up.port)) && brief.contains("reviews-1"),
        "{brief}"
    );
    let shards = meshd.json("/debug/endpointShardz");
    let shard = &shards["reviews.shop.svc.cluster.local"]["shop"];
    assert_eq!(
        shard["Shards"]["Kubernetes/Kubernetes"][0]["pod"],
        "reviews-1"
    );
    assert!(shard["xds"].to_string().contains("lb_endpoints"), "{shard}");
    assert_eq!(
        meshd
            .json("/debug/endpointz")
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["service"] == "ghost.shop.svc.cluster.local")
            .count(),
        1
    );

    // istioctl's habits.
    let status = meshd.cli(&["proxy-status"]);
    let row = status
        .lines()
        .find(|l| l.starts_with("client-0.shop"))
        .unwrap_or_else(|| panic!("{status}"));
    let cells: Vec<&str> = row
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        cells[..8],
        [
            "client-0.shop",
            "Kubernetes",
            "SYNCED",
            "SYNCED",
            "SYNCED",
            "SYNCED",
            "NOT SENT",
            "default"
        ],
        "{status}"
    );
    // One proxy: its row alone; and with its Envoy's admin address, meshd's configuration
    // for it against what that Envoy holds, as `istioctl proxy-status POD` reports it.
    let one = meshd.cli(&["proxy-status", "client-0.shop"]);
    assert_eq!(one.lines().count(), 2, "{one}");
    let admin = format!("127.0.0.1:{}", envoy.admin_port);
    let compared = meshd.cli(&["proxy-status", "client-0.shop", "--envoy-admin", &admin]);
    let lines: Vec<&str> = compared.lines().collect();
    assert_eq!(
        lines[..2],
        ["Clusters Match", "Listeners Match"],
        "{compared}"
    );
    assert!(
        lines[2].starts_with("Routes Match (RDS last loaded at 20") && lines.len() == 3,
        "{compared}"
    );
    let clusters = meshd.cli(&["proxy-config", "cluster", "client-0.shop"]);
    assert!(
        clusters
            .lines()
            .any(|l| l.starts_with("reviews.shop.svc.cluster.local")
                && l.contains("outbound")
                && l.contains("EDS")),
        "{clusters}"
    );
    let routes = meshd.cli(&["proxy-config", "route", "client-0.shop"]);
    assert!(
        routes.contains("reviews.shop") && routes.contains("reviews.shop.svc.cluster.local"),
        "{routes}"
    );
    let endpoints = meshd.cli(&["proxy-config", "endpoint", "client-0.shop"]);
    assert!(
        endpoints
            .lines()
            .any(|l| l.starts_with(&format!("127.0.0.1:{}", up.port)) && l.contains("HEALTHY")),
        "{endpoints}"
    );
    let listeners = meshd.cli(&["proxy-config", "listener", envoy.id.as_str()]);
    assert!(listeners.contains(&format!("Route: {port}")), "{listeners}");
    let json: Value = serde_json::from_str(&meshd.cli(&[
        "proxy-config",
        "cluster",
        "client-0.shop",
        "-o",
        "json",
    ]))
    .unwrap();
    let theirs = envoy_dump(&envoy, "dynamic_active_clusters", &["cluster"], "name");
    let listed: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        theirs.keys().map(String::as_str).collect::<Vec<_>>()
    );

    // An edit, so the push-path metrics have observations.
    meshd.write("vs.yaml", &vs("mike"));
    wait_until("the edit pushed", Duration::from_secs(5), || {
        meshd.metric("pilot_xds_push_time_count{type=\"rds\"}") >= 1.0
    });

    // Every metric the seed names, under Istio's name and type.
    let text = meshd.get("/metrics").unwrap().body;
    for (name, kind) in [
        ("pilot_xds_push_time", "histogram"),
        ("pilot_proxy_convergence_time", "histogram"),
        ("pilot_debounce_time", "histogram"),
        ("pilot_proxy_queue_time", "histogram"),
        ("pilot_xds_pushes", "counter"),
        ("pilot_push_context_recompute_count", "counter"),
        ("pilot_total_xds_rejects", "counter"),
        ("pilot_xds_push_errors", "counter"),
        ("pilot_xds_clients", "gauge"),
        ("pilot_xds_expired_nonce", "counter"),
        ("endpoint_no_pod", "gauge"),
        ("pilot_services", "gauge"),
        ("pilot_virt_services", "gauge"),
        ("pilot_destroy_time_seconds", "histogram"),
        ("citadel_server_csr_count", "counter"),
        ("process_cpu_seconds_total", "counter"),
        ("process_resident_memory_bytes", "gauge"),
        ("meshd_tokio_tasks", "gauge"),
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} {kind}\n")),
            "{name} {kind}:\n{text}"
        );
    }
    assert_eq!(meshd.metric("endpoint_no_pod"), 1.0, "the ghost's endpoint");
    assert_eq!(meshd.metric("pilot_services"), 2.0);
    assert!(meshd.metric("process_resident_memory_bytes") > 1e6);
    assert!(meshd.metric("meshd_tokio_tasks") >= 1.0);
    assert_eq!(meshd.metric("pilot_destroy_time_seconds_count"), 0.0);

    // push_status: the push's times, the proxies that hold it, the identities serving
    // each port, and istiod's map of clusters with no endpoint (a service nothing
    // serves, a subset nothing is labelled for), counted in its gauge too.
    meshd.write(
        "status.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: lonely, namespace: shop}\nspec: {clusterIP: 10.96.9.10, ports: [{name: http, port: 8000}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: signed, namespace: shop}\nspec: {clusterIP: 10.96.9.11, selector: {app: signed}, ports: [{name: http, port: 8100}]}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: signed-0, namespace: shop, labels: {app: signed}}\nspec: {serviceAccountName: signer}\nstatus: {podIP: 10.1.2.4}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: signed-1, namespace: shop, labels: {kubernetes.io/service-name: signed}}\naddressType: IPv4\nports: [{name: http, port: 8100}]\nendpoints: [{addresses: [10.1.2.4], conditions: {ready: true}, targetRef: {kind: Pod, name: signed-0}}]\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews, namespace: shop}\nspec: {host: reviews, subsets: [{name: v9, labels: {version: v9}}]}\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews-again, namespace: shop}\nspec: {host: reviews, subsets: [{name: v9, labels: {version: v8}}]}\n",
    );
    let reviews = "reviews.shop.svc.cluster.local".to_string();
    let mut empty = [
        "outbound|8000||lonely.shop.svc.cluster.local".to_string(),
        format!("outbound|{port}|v9|{reviews}"),
    ];
    empty.sort();
    wait_until("the new push in sync", Duration::from_secs(10), || {
        let status = meshd.json("/debug/push_status");
        status["pilot_eds_no_instances"]
            .as_object()
            .is_some_and(|m| m.len() == 2)
            && status["proxiesInSync"] == 1
    });
    let status = meshd.json("/debug/push_status");
    let listed: Vec<&String> = status["pilot_eds_no_instances"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(listed, empty.iter().collect::<Vec<_>>(), "{status}");
    assert_eq!(meshd.metric("pilot_eds_no_instances"), 2.0);
    // The second rule for reviews names v9 again: left out, and noted as istiod notes it.
    let duplicate = &status["pilot_destrule_subsets"][&reviews]["message"];
    assert!(
        duplicate
            .as_str()
            .is_some_and(|m| m.contains("Duplicate subset v9")),
        "{status}"
    );
    assert_eq!(meshd.metric("pilot_destrule_subsets"), 1.0);
    assert_eq!(status["proxiesBehind"], serde_json::json!([]));
    assert_eq!(
        status["serviceAccounts"]["signed.shop.svc.cluster.local"]["8100"],
        serde_json::json!(["spiffe://cluster.local/ns/shop/sa/signer"]),
        "{status}"
    );
    assert!(
        status["serviceAccounts"].get(&reviews).is_none(),
        "{status}"
    );
    let (start, published) = (
        status["start"].as_str().unwrap(),
        status["published"].as_str().unwrap(),
    );
    assert!(
        start.ends_with('Z') && start <= published,
        "{start} {published}"
    );
    drop(envoy);
    wait_until("the proxy's state freed", Duration::from_secs(5), || {
        meshd.metric("pilot_xds_clients") == 0.0
    });
    assert_eq!(meshd.metric("pilot_destroy_time_seconds_count"), 1.0);
}

/// A TCP relay that can go silent: both directions stop flowing while the sockets stay
/// open, as when a proxy's node vanishes from the network.
struct Relay {
    port: u16,
    frozen: Arc<AtomicBool>,
}

impl Relay {
    fn start(target: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let frozen = Arc::new(AtomicBool::new(false));
        let f = frozen.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    return;
                };
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let frozen = f.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16384];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 {
                                return;
                            }
                            while frozen.load(Ordering::Relaxed) {
                                std::thread::sleep(Duration::from_millis(50));
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        Relay { port, frozen }
    }
}

/// Whether process `pid` may get transparent huge pages.
fn thp_enabled(pid: u32) -> bool {
    meshd::heap::huge_pages_allowed(&pid.to_string())
        .unwrap_or_else(|| panic!("no THP_enabled in /proc/{pid}/status"))
}

/// meshd turns transparent huge pages off for itself (its heap fragments into them and
/// they are zeroed on every re-use), unless mimalloc's own `MIMALLOC_ALLOW_THP` is set:
/// then mimalloc applies the operator's choice and meshd leaves it, inheriting ours.
#[test]
fn meshd_runs_without_transparent_huge_pages_unless_mimalloc_is_told_otherwise() {
    let dir = small_mesh("thp");
    let meshd = Meshd::start(&dir);
    assert!(!thp_enabled(meshd.pid()), "meshd keeps huge pages");
    drop(meshd);
    let meshd = Meshd::start_with_env(&dir, &[], &[("MIMALLOC_ALLOW_THP", "1")]);
    assert_eq!(
        thp_enabled(meshd.pid()),
        thp_enabled(std::process::id()),
        "with MIMALLOC_ALLOW_THP set, meshd changed the setting it inherited"
    );
}

/// A config change is read once. meshd's own read of a file must not count as a change
/// to it: when it did, meshd read the changed file again about every 20 ms for as long as
/// it ran.
#[test]
fn a_changed_file_is_read_once_and_then_left_alone() {
    let dir = small_mesh("read-once");
    let meshd = Meshd::start(&dir);
    let changed = GHOST.replace("10.1.2.3", "10.1.2.4");
    meshd.write("ghost.yaml", &changed);
    wait_until("meshd to load the change", Duration::from_secs(5), || {
        meshd.log().matches("config file loaded").count() >= 2
    });
    // Bytes meshd has read through any file descriptor. At rest, with nothing connected
    // and nothing scraping it, it reads nothing.
    let read = || {
        let pid = meshd.pid().to_string();
        meshd::metrics::proc_number(&pid, "io", "rchar:").expect("no rchar in /proc/PID/io")
    };
    std::thread::sleep(Duration::from_millis(300));
    let before = read();
    std::thread::sleep(Duration::from_secs(1));
    let after = read();
    assert!(
        after - before < 2 * changed.len() as u64,
        "meshd read {} bytes in a second at rest, after a {}-byte file changed",
        after - before,
        changed.len()
    );
}

fn small_mesh(name: &str) -> std::path::PathBuf {
    let dir = temp_dir(name).join("config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ghost.yaml"), GHOST).unwrap();
    dir
}

/// Opens a delta stream as a sidecar of `shop` and waits for the first CDS answer; the
/// returned sender keeps the stream open.
async fn open_stream(
    channel: tonic::transport::Channel,
    n: usize,
) -> (
    tokio::sync::mpsc::Sender<DeltaDiscoveryRequest>,
    tonic::Streaming<envoy_api::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let id = format!(
        "sidecar~10.3.{}.{}~app-{n}.shop~shop.svc.cluster.local",
        n / 250 % 250,
        n % 250 + 1
    );
    tx.send(DeltaDiscoveryRequest {
        node: Some(xds_node(&id, "shop")),
        type_url: CDS.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut stream = AggregatedDiscoveryServiceClient::new(channel)
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("no answer in 10s")
        .unwrap()
        .expect("stream closed");
    assert!(!first.resources.is_empty());
    (tx, stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_frees_the_state_of_a_proxy_that_vanished() {
    let dir = small_mesh("keepalive");
    let meshd = Meshd::start_with(
        &dir,
        &["--keepalive-interval", "1s", "--keepalive-timeout", "1s"],
    );
    let relay = Relay::start(meshd.xds_port);
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", relay.port))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let (_tx, _stream) = open_stream(channel, 1).await;
    assert_eq!(meshd.metric("pilot_xds_clients"), 1.0);
    relay.frozen.store(true, Ordering::Relaxed);
    // The stream is still open at both ends; only meshd's unanswered ping can tell.
    // The client count drops as the state is freed; the destroy time is observed just
    // after, so a loaded machine may show the one without the other for a moment.
    tokio::task::block_in_place(|| {
        wait_until("the vanished proxy freed", Duration::from_secs(10), || {
            meshd.metric("pilot_xds_clients") == 0.0
                && meshd.metric("pilot_destroy_time_seconds_count") >= 1.0
        });
        assert_eq!(meshd.metric("pilot_destroy_time_seconds_count"), 1.0);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_proxy_is_cut_off_after_the_send_timeout_and_others_keep_converging() {
    let dir = small_mesh("stalled");
    let (_up, _) = write_reviews(&dir);
    let dr = |n: u32| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  host: reviews\n  trafficPolicy: {{connectionPool: {{tcp: {{connectTimeout: {n}ms}}}}}}\n"
        )
    };
    std::fs::write(dir.join("dr.yaml"), dr(1500)).unwrap();
    many_services(&dir, 500);
    let meshd = Meshd::start_with_env(
        &dir,
        &[],
        &[
            ("PILOT_XDS_SEND_TIMEOUT", "1s"),
            ("PILOT_PUSH_THROTTLE", "1"),
            ("PILOT_DEBOUNCE_AFTER", "20ms"),
            // A 1 MiB send budget: the stalled proxy's unwritten frame holds part of it.
            ("MESHD_XDS_SEND_BUFFER_MB", "1"),
        ],
    );
    let envoy =
        tokio::task::block_in_place(|| Envoy::sidecar(&meshd, Ads::Delta, "shop", "client"));
    // A proxy that stops reading: a 1 KiB HTTP/2 window it never reopens. State of the
    // world, so every change resends all ~500 clusters and the HTTP/2 send buffer, then
    // the stream's queue, fill after a few edits.
    let stalled_channel =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", meshd.xds_port))
            .unwrap()
            .initial_stream_window_size(Some(1024))
            .connect()
            .await
            .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(DiscoveryRequest {
        node: Some(xds_node(
            "sidecar~10.3.0.9~stalled-0.shop~shop.svc.cluster.local",
            "shop",
        )),
        type_url: CDS.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let stalled = AggregatedDiscoveryServiceClient::new(stalled_channel)
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner(); // never read
    tokio::task::block_in_place(|| {
        wait_until("both proxies connected", Duration::from_secs(5), || {
            meshd.metric("pilot_xds_clients") == 2.0
        });
        // Every edit changes a cluster both proxies hold; the stalled one's queue fills.
        for n in 1..=40 {
            meshd.write("dr.yaml", &dr(n));
            std::thread::sleep(Duration::from_millis(100));
            if meshd.metric("pilot_xds_pushes{type=\"cds_senderr\"}") >= 1.0 {
                break;
            }
        }
        wait_until("the stalled stream cut off", Duration::from_secs(5), || {
            meshd.metric("pilot_xds_pushes{type=\"cds_senderr\"}") >= 1.0
                && meshd.metric("pilot_xds_clients") == 1.0
        });
        assert!(
            meshd.log().contains("did not take a response"),
            "{}",
            meshd.log()
        );
        // The seed's push-error count has it too (each send that timed out).
        assert_eq!(
            meshd.metric("pilot_xds_push_errors{type=\"cds\"}"),
            meshd.metric("pilot_xds_pushes{type=\"cds_senderr\"}")
        );
        // The healthy proxy ends on the final configuration, and keeps following.
        meshd.write("dr.yaml", &dr(777));
        wait_until(
            "Envoy holds the final DestinationRule",
            Duration::from_secs(5),
            || {
                envoy
                    .admin("/config_dump?resource=dynamic_active_clusters")
                    .is_ok_and(|r| r.body.contains("\"connect_timeout\": \"0.777s\""))
            },
        );
        // The stalled connection is alive (it answers HTTP/2 pings): the frame it never
        // read still holds its share of the send budget.
        assert!(meshd.metric("meshd_xds_send_buffer_bytes") > 0.0);
    });
    // Closing it gives the share back; everything Envoy was sent has been written.
    drop(stalled);
    drop(tx);
    tokio::task::block_in_place(|| {
        wait_until("the send budget returned", Duration::from_secs(5), || {
            meshd.metric("meshd_xds_send_buffer_bytes") == 0.0
        });
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_connect_disconnect_cycles_leave_memory_and_tasks_at_baseline() {
    let dir = small_mesh("churn");
    many_services(&dir, 20);
    let meshd = Meshd::start(&dir);
    let port = meshd.xds_port;
    let channels: Vec<tonic::transport::Channel> =
        futures::future::join_all((0..4).map(|_| async move {
            tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
                .unwrap()
                .connect()
                .await
                .unwrap()
        }))
        .await;
    let cycles = |from: usize, to: usize| {
        let channels = channels.clone();
        async move {
            let workers = 16;
            let tasks: Vec<_> = (0..workers)
                .map(|w| {
                    let channel = channels[w % channels.len()].clone();
                    tokio::spawn(async move {
                        for n in (from + w..to).step_by(workers) {
                            let (tx, stream) = open_stream(channel.clone(), n).await;
                            drop((tx, stream));
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        }
    };
    let settled = |what: &str| {
        tokio::task::block_in_place(|| {
            wait_until(what, Duration::from_secs(20), || {
                meshd.metric("pilot_xds_clients") == 0.0
            });
            std::thread::sleep(Duration::from_millis(300));
            (
                meshd.metric("process_resident_memory_bytes"),
                meshd.metric("meshd_tokio_tasks"),
                meshd.metric("pilot_destroy_time_seconds_count"),
            )
        })
    };
    cycles(0, 1_000).await; // warm-up: allocator pools, views, connection buffers
    let (rss_base, tasks_base, _) = settled("warm-up streams closed");
    cycles(1_000, 11_000).await;
    let (rss, tasks, destroyed) = settled("every stream closed");
    assert_eq!(destroyed, 11_000.0, "every stream's state was freed");
    assert!(tasks <= tasks_base, "tokio tasks {tasks_base} -> {tasks}");
    // A leak of even 500 bytes per proxy would show as 5 MB here.
    assert!(
        rss <= rss_base + 4e6,
        "RSS {rss_base} -> {rss} after 10,000 cycles"
    );
}

/// MeshConfig `accessLogFile`: a real Envoy sidecar writes a line per request to the file,
/// in Istio's text format (method, path, protocol, code, the upstream cluster); switched
/// to `accessLogEncoding: JSON` in place, its next line is a JSON object with Istio's keys.
#[test]
fn the_mesh_config_access_log_is_written_by_the_sidecar() {
    let root = temp_dir("access-log");
    let dir = root.join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let log = root.join("access.log");
    let mesh = |extra: &str| mesh_configmap(&format!("accessLogFile: {}\n{extra}", log.display()));
    std::fs::write(dir.join("mesh.yaml"), mesh("")).unwrap();
    let (_up, port) = write_reviews(&dir);
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let get = |path: &str| http_get(&format!("{}:{port}", envoy.ip), "reviews", path, &[]);
    let lines = || std::fs::read_to_string(&log).unwrap_or_default();
    let cluster = format!("outbound|{port}||reviews.shop.svc.cluster.local");
    // Envoy writes its access log out about once a second.
    wait_until(
        "a text line for the request",
        Duration::from_secs(15),
        || {
            let _ = get("/text?x=1");
            lines()
                .lines()
                .any(|l| l.contains("\"GET /text?x=1 HTTP/1.1\" 200") && l.contains(&cluster))
        },
    );

    meshd.write("mesh.yaml", &mesh("accessLogEncoding: JSON"));
    wait_until(
        "a JSON line for the request",
        Duration::from_secs(15),
        || {
            let _ = get("/json");
            lines().lines().any(|l| {
                serde_json::from_str::<serde_json::Value>(l).is_ok_and(|j| {
                    j["path"] == "/json"
                        && j["response_code"] == 200
                        && j["upstream_cluster"] == *cluster
                })
            })
        },
    );
    assert_eq!(envoy.rejected_updates(), Vec::<String>::new());
}

/// The Telemetry API: a mesh-wide Telemetry names a MeshConfig provider writing JSON lines
/// to a file and a CEL filter; the real Envoy sidecar logs the request that failed and not
/// the one that did not.
#[test]
fn a_telemetry_resource_chooses_the_provider_and_filters_what_is_logged() {
    let root = temp_dir("telemetry-log");
    let dir = root.join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let log = root.join("access.json");
    let mesh = mesh_configmap(&format!(
        "extensionProviders:\n- name: json-log\n  envoyFileAccessLog:\n    path: {}\n    logFormat: {{labels: {{path: '%REQ(:PATH)%', code: '%RESPONSE_CODE%'}}}}",
        log.display()
    ));
    std::fs::write(dir.join("mesh.yaml"), mesh).unwrap();
    std::fs::write(
        dir.join("telemetry.yaml"),
        "apiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: mesh-default, namespace: istio-system}\nspec:\n  accessLogging:\n  - providers: [{name: json-log}]\n    filter: {expression: 'response.code >= 400'}\n",
    )
    .unwrap();
    let up = Upstream::deciding("reviews", |path| {
        if path.starts_with("/missing") {
            "404 Not Found"
        } else {
            "200 OK"
        }
    });
    let port = free_port();
    std::fs::write(
        dir.join("reviews.yaml"),
        service_yaml("shop", "reviews", port, &[(&up, &[])]),
    )
    .unwrap();
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let get = |path: &str| http_get(&format!("{}:{port}", envoy.ip), "reviews", path, &[]);
    let lines = || -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    wait_until("the sidecar to route", Duration::from_secs(10), || {
        get("/ok").is_ok_and(|r| r.status == 200)
    });
    // Envoy writes its access log out about once a second.
    wait_until(
        "a line for the failed request",
        Duration::from_secs(15),
        || {
            let _ = get("/ok");
            let _ = get("/missing");
            lines()
                .iter()
                .any(|l| l["path"] == "/missing" && l["code"] == 404)
        },
    );
    assert!(
        lines().iter().all(|l| l["path"] != "/ok"),
        "the filter keeps successful requests out: {:?}",
        lines()
    );
    // An expression that does not parse is refused by meshd, so the sidecar keeps the
    // resource it had (Envoy would refuse the whole listener update).
    meshd.write(
        "telemetry.yaml",
        "apiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: mesh-default, namespace: istio-system}\nspec:\n  accessLogging:\n  - providers: [{name: json-log}]\n    filter: {expression: 'response.code >='}\n",
    );
    wait_until(
        "the refusal to be reported",
        Duration::from_secs(10),
        || meshd.log().contains("not a CEL expression"),
    );
    wait_until(
        "a line for a later failed request",
        Duration::from_secs(15),
        || {
            let _ = get("/missing-later");
            lines().iter().any(|l| l["path"] == "/missing-later")
        },
    );
    assert_eq!(envoy.rejected_updates(), Vec::<String>::new());
}

/// MeshConfig `connectTimeout`, `tcpKeepalive` and `h2UpgradePolicy`: a real Envoy holds
/// its clusters with them (its own config_dump), and takes the change when the ConfigMap
/// drops them.
#[test]
fn the_mesh_connect_timeout_keepalive_and_h2_upgrade_reach_envoys_clusters() {
    let dir = temp_dir("mesh-pool").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let mesh = |lines: &str| mesh_configmap(&format!("trustDomain: cluster.local\n{lines}"));
    std::fs::write(
        dir.join("mesh.yaml"),
        mesh("connectTimeout: 3s\ntcpKeepalive: {probes: 5, time: 600s}\nh2UpgradePolicy: UPGRADE"),
    )
    .unwrap();
    let (_up, port) = write_reviews(&dir);
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let name = format!("outbound|{port}||reviews.shop.svc.cluster.local");
    let reviews = || {
        let field = &["cluster"];
        envoy_dump(&envoy, "dynamic_active_clusters", field, "name").remove(&name)
    };
    wait_until("the reviews cluster", Duration::from_secs(10), || {
        reviews().is_some()
    });
    let cluster = reviews().unwrap();
    assert_eq!(cluster["connect_timeout"], "3s");
    let keepalive = &cluster["upstream_connection_options"]["tcp_keepalive"];
    assert_eq!(keepalive["keepalive_probes"], 5);
    assert_eq!(keepalive["keepalive_time"], 600);
    let upstream_http = |c: &serde_json::Value| {
        let key = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
        c["typed_extension_protocol_options"][key].clone()
    };
    let h2 = &upstream_http(&cluster)["explicit_http_config"]["http2_protocol_options"];
    assert!(h2.is_object(), "{cluster}");

    meshd.write("mesh.yaml", &mesh(""));
    wait_until(
        "Istio's default connect timeout",
        Duration::from_secs(10),
        || reviews().is_some_and(|c| c["connect_timeout"] == "10s"),
    );
    let cluster = reviews().unwrap();
    assert!(cluster.get("upstream_connection_options").is_none());
    assert!(upstream_http(&cluster).is_null(), "{cluster}");
    assert_eq!(envoy.rejected_updates(), Vec::<String>::new());
}

/// The path and body of each request a recording server got.
type Reports = Arc<std::sync::Mutex<Vec<(String, Vec<u8>)>>>;

/// A server that records the path and body of every HTTP/1.1 request it gets, and gives
/// each the same `answer`: a span collector, or a gRPC server answering OK.
fn recording_server(answer: &'static [u8]) -> (u16, Reports) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let record = record.clone();
            std::thread::spawn(move || {
                let mut reader = std::io::BufReader::new(conn);
                loop {
                    use std::io::BufRead;
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let Some(Request { path, body, .. }) = read_request(&mut reader, &line) else {
                        return;
                    };
                    record.lock().unwrap().push((path, body));
                    if reader.get_mut().write_all(answer).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, seen)
}

/// A span collector (a recording server answering 202) in `dir` (made here) as the
/// Service `collector` of istio-system: the Service's port, and what it received.
fn span_collector(dir: &std::path::Path) -> (u16, Reports) {
    std::fs::create_dir_all(dir).unwrap();
    let (collector_port, seen) =
        recording_server(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n");
    let port = free_port();
    let collector = Upstream {
        name: "collector-0".into(),
        port: collector_port,
    };
    let service = service_yaml("istio-system", "collector", port, &[(&collector, &[])]);
    std::fs::write(dir.join("collector.yaml"), service).unwrap();
    (port, seen)
}

/// The first Zipkin span `seen` of a request routed to `cluster`.
fn zipkin_span(seen: &Reports, cluster: &str) -> Option<Value> {
    let seen = seen.lock().unwrap();
    (seen.iter())
        .filter(|(path, _)| path == "/api/v2/spans")
        .flat_map(|(_, body)| serde_json::from_slice::<Vec<Value>>(body).unwrap_or_default())
        .find(|span| span["tags"]["upstream_cluster"] == cluster)
}

/// The Telemetry API's tracing: with no default provider and `enableTracing: false`, a
/// mesh-wide Telemetry names the Zipkin provider, samples every request and tags spans;
/// a real sidecar reports the spans of the requests it routes, with that tag.
#[test]
fn a_telemetry_resource_turns_tracing_on_with_its_provider_sampling_and_tags() {
    let dir = temp_dir("telemetry-tracing").join("config");
    let (port, seen) = span_collector(&dir);
    let mesh = mesh_configmap(&format!(
        "enableTracing: false\nextensionProviders:\n- name: zipkin\n  zipkin: {{service: collector.istio-system.svc.cluster.local, port: {port}}}\n"
    ));
    std::fs::write(dir.join("mesh.yaml"), mesh).unwrap();
    std::fs::write(
        dir.join("telemetry.yaml"),
        "apiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: mesh-default, namespace: istio-system}\nspec:\n  tracing:\n  - providers: [{name: zipkin}]\n    randomSamplingPercentage: 100\n    customTags: {team: {literal: {value: checkout}}}\n",
    )
    .unwrap();
    let (_up, reviews_port) = write_reviews(&dir);
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let get = || http_get(&format!("{}:{reviews_port}", envoy.ip), "reviews", "/", &[]);
    let reviews = format!("outbound|{reviews_port}||reviews.shop.svc.cluster.local");
    let span = || zipkin_span(&seen, &reviews);
    // Envoy reports spans in batches of five, or every five seconds.
    wait_until(
        "a Zipkin span of a request",
        Duration::from_secs(30),
        || {
            let _ = get();
            span().is_some()
        },
    );
    let span = span().unwrap();
    assert_eq!(span["tags"]["team"], "checkout", "{span}");
    assert_eq!(span["tags"]["istio.namespace"], "shop", "{span}");
    assert_eq!(envoy.rejected_updates(), Vec::<String>::new());
}

/// MeshConfig's default tracing provider: a real sidecar reports the spans of requests it
/// routes to the Zipkin collector's service, with Istio's and the configured tags, then,
/// after a live switch, to an OpenTelemetry collector over OTLP/HTTP; once the
/// collector's service is gone, it traces nothing and meshd counts the failed lookup.
#[test]
fn spans_reach_the_meshs_default_tracing_provider() {
    let dir = temp_dir("tracing").join("config");
    let (port, seen) = span_collector(&dir);
    let mesh = |provider: &str| {
        mesh_configmap(&format!(
            "defaultProviders: {{tracing: [{provider}]}}\ndefaultConfig:\n  tracing:\n    sampling: 100\n    customTags: {{team: {{literal: {{value: payments}}}}}}\nextensionProviders:\n- name: zipkin\n  zipkin: {{service: collector.istio-system.svc.cluster.local, port: {port}}}\n- name: otel\n  opentelemetry: {{service: collector.istio-system.svc.cluster.local, port: {port}, http: {{path: /v1/traces}}}}\n"
        ))
    };
    std::fs::write(dir.join("mesh.yaml"), mesh("zipkin")).unwrap();
    let (_up, reviews_port) = write_reviews(&dir);
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let get = || http_get(&format!("{}:{reviews_port}", envoy.ip), "reviews", "/", &[]);
    let reviews = format!("outbound|{reviews_port}||reviews.shop.svc.cluster.local");
    // Envoy reports spans in batches of five, or every five seconds.
    let zipkin_span = || zipkin_span(&seen, &reviews);
    wait_until(
        "a Zipkin span of a request",
        Duration::from_secs(30),
        || {
            let _ = get();
            zipkin_span().is_some()
        },
    );
    let span = zipkin_span().unwrap();
    let tags = &span["tags"];
    assert_eq!(tags["istio.namespace"], "shop", "{span}");
    assert_eq!(tags["team"], "payments", "{span}");
    assert_eq!(tags["istio.canonical_service"], "unknown", "{span}");
    assert_eq!(span["localEndpoint"]["serviceName"], "test", "{span}");
    assert_eq!(
        span["traceId"].as_str().unwrap().len(),
        32,
        "128-bit: {span}"
    );

    meshd.write("mesh.yaml", &mesh("otel"));
    let otlp = || {
        let seen = seen.lock().unwrap();
        (seen.iter())
            .filter(|(path, _)| path == "/v1/traces")
            .map(|(_, body)| body.clone())
            .find(|body| {
                let has = |s: &str| body.windows(s.len()).any(|w| w == s.as_bytes());
                has(&reviews) && has("payments") && has("istio.namespace")
            })
    };
    wait_until(
        "an OTLP export of a request's span",
        Duration::from_secs(30),
        || {
            let _ = get();
            otlp().is_some()
        },
    );

    // A provider whose service is gone: no tracing at all, as in istiod, counted; the
    // sidecar keeps routing.
    std::fs::remove_file(dir.join("collector.yaml")).unwrap();
    let failures = "provider_lookup_cluster_failures{type=\"opentelemetry\"}";
    wait_until("the failed lookup counted", Duration::from_secs(10), || {
        meshd.metric(failures) >= 1.0
    });
    // (The collector's own listener drains for a while, tracing still.)
    let active_tracing = || {
        let dump: Value = serde_json::from_str(&envoy.config_dump("dynamic_listeners")).unwrap();
        let configs = dump["configs"].as_array().unwrap().clone();
        (configs.iter())
            .filter(|c| c["active_state"].is_object())
            .any(|c| c["active_state"].to_string().contains("\"tracing\""))
    };
    wait_until(
        "tracing gone from the active listeners",
        Duration::from_secs(10),
        || !active_tracing(),
    );
    assert_eq!(get().unwrap().status, 200);
    assert_eq!(envoy.rejected_updates(), Vec::<String>::new());
}

/// istiod's gRPC statistics filter: a real sidecar counts the gRPC requests it routes, per
/// cluster (Envoy's `cluster.NAME.grpc.*`, which dashboards read as
/// `envoy_cluster_grpc_*`), and counts nothing for other requests.
#[test]
fn grpc_requests_are_counted_per_cluster() {
    let dir = temp_dir("grpc-stats").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    // A gRPC server's answer without a message: headers only, status OK.
    let (server, _) = recording_server(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\ngrpc-status: 0\r\ncontent-length: 0\r\n\r\n",
    );
    let upstream = Upstream {
        name: "reviews-grpc".into(),
        port: server,
    };
    let port = free_port();
    let service = service_yaml("shop", "reviews", port, &[(&upstream, &[])]);
    std::fs::write(dir.join("reviews.yaml"), service).unwrap();
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let get = |headers: &[(&str, &str)]| {
        let addr = format!("{}:{port}", envoy.ip);
        http_get(&addr, "reviews", "/shop.Reviews/List", headers)
    };
    let grpc = |stat: &str| {
        let name =
            format!("cluster.outbound|{port}||reviews.shop.svc.cluster.local;.grpc.{stat}: ");
        let stats = envoy.admin("/stats?filter=grpc").unwrap().body;
        (stats.lines())
            .find_map(|l| l.strip_prefix(&name))
            .map_or(0, |v| v.trim().parse::<u64>().unwrap())
    };
    wait_until("a plain request routed", Duration::from_secs(10), || {
        get(&[]).is_ok_and(|r| r.status == 200)
    });
    assert_eq!(grpc("total"), 0, "requests that are not gRPC");
    let grpc_request = [("content-type", "application/grpc")];
    assert_eq!(get(&grpc_request).unwrap().headers["grpc-status"], "0");
    wait_until("the gRPC request counted", Duration::from_secs(10), || {
        grpc("total") == 1
    });
    assert_eq!(grpc("success"), 1);
}

/// MeshConfig's `outboundClusterStatName`: a real sidecar counts a service's requests
/// under the name the pattern gives its cluster in Envoy's stats (what dashboards built on
/// it read), and under the Istio cluster name again once the pattern goes.
#[test]
fn a_real_sidecar_counts_requests_under_the_meshs_cluster_stat_name() {
    let dir = temp_dir("stat-names").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let mesh = |lines: &str| mesh_configmap(&format!("trustDomain: cluster.local\n{lines}"));
    let pattern = "outboundClusterStatName: '%SERVICE%_%SERVICE_PORT%'";
    std::fs::write(dir.join("mesh.yaml"), mesh(pattern)).unwrap();
    let (_up, port) = write_reviews(&dir);
    let meshd = Meshd::start(&dir);
    let envoy = Envoy::sidecar(&meshd, Ads::Delta, "shop", "productpage");
    let get = || http_get(&format!("{}:{port}", envoy.ip), "reviews", "/", &[]);
    // The requests Envoy counted for the cluster whose stats are named `name`.
    let total = |name: &str| envoy.stat(&format!("cluster.{name};.upstream_rq_total"));
    let named = format!("reviews.shop_{port}");
    let istio = format!("outbound|{port}||reviews.shop.svc.cluster.local");
    wait_until(
        "a request counted under the pattern's name",
        Duration::from_secs(10),
        || get().is_ok_and(|r| r.body == "reviews-1") && total(&named) > 0,
    );
    assert_eq!(total(&istio), 0);

    meshd.write("mesh.yaml", &mesh(""));
    wait_until(
        "a request counted under the Istio name",
        Duration::from_secs(10),
        || get().is_ok_and(|r| r.body == "reviews-1") && total(&istio) > 0,
    );
    assert_eq!(envoy.rejected_updates(), Vec::<String>::new());
}

/// The metric names a PromQL expression reads that are meshd's (or the process's).
fn meshd_metrics_in(expr: &str) -> Vec<String> {
    let prefixes = [
        "pilot_", "meshd_", "process_", "citadel_", "galley_", "sidecar_", "istio_",
    ];
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| prefixes.iter().any(|p| word.starts_with(p)))
        .map(str::to_string)
        .collect()
}

/// The chart's Grafana dashboard is what `scripts/dashboard.py` writes, and every meshd
/// metric it and the alert rules query is one meshd exports, with the type the query
/// needs: `_bucket` of a histogram, or the metric itself.
#[test]
fn the_dashboard_and_the_alerts_query_only_metrics_meshd_exports() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let committed =
        std::fs::read_to_string(root.join("charts/meshd/files/dashboard.json")).unwrap();
    let written = temp_dir("dashboard-script").join("dashboard.json");
    let script = std::process::Command::new("python3")
        .arg(root.join("scripts/dashboard.py"))
        .arg(&written)
        .status()
        .expect("python3 runs scripts/dashboard.py");
    assert!(script.success());
    assert_eq!(
        std::fs::read_to_string(&written).unwrap(),
        committed,
        "charts/meshd/files/dashboard.json differs from what scripts/dashboard.py writes"
    );
    let dashboard: Value = serde_json::from_str(&committed).unwrap();
    let rules: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(root.join("charts/meshd/files/prometheus-rules.yaml")).unwrap(),
    )
    .unwrap();
    let mut queries: Vec<String> = (dashboard["panels"].as_array().unwrap().iter())
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    let panels = queries.len();
    queries.extend(
        (rules["groups"][0]["rules"].as_array().unwrap().iter())
            .map(|r| r["expr"].as_str().unwrap().to_string()),
    );
    assert!(panels >= 14 && queries.len() > panels, "{queries:?}");

    let dir = temp_dir("dashboard").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let meshd = Meshd::start(&dir);
    let exposition = meshd.get("/metrics").unwrap().body;
    let types: std::collections::BTreeMap<&str, &str> = (exposition.lines())
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    let mut missing = Vec::new();
    for query in &queries {
        for name in meshd_metrics_in(query) {
            let found = match name.strip_suffix("_bucket") {
                Some(histogram) => types.get(histogram) == Some(&"histogram"),
                None => types.get(name.as_str()).is_some_and(|t| *t != "histogram"),
            };
            if !found {
                missing.push(format!("{name} (in {query})"));
            }
        }
    }
    assert!(missing.is_empty(), "not exported by meshd: {missing:#?}");
}
