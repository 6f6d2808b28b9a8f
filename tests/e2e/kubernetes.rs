//! Kubernetes mode: the real kube client and kube-runtime watchers against the in-process
//! API server, a real Envoy routing real requests by what the API holds.

use std::time::Duration;

use crate::apiserver::FakeApiServer;
use crate::gateway::{front_vs, gateway_yaml};
use crate::harness::*;

struct KubeMesh {
    api: FakeApiServer,
    meshd: Meshd,
    envoy: Envoy,
    addr: String,
    _upstreams: Vec<Upstream>,
}

fn kube_mesh(name: &str) -> KubeMesh {
    let api = FakeApiServer::start().unwrap();
    let dir = temp_dir(name);
    let product = Upstream::start("productpage");
    let reviews = Upstream::start("reviews");
    let port = free_port();
    api.apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, labels: {istio-injection: enabled}}\n").unwrap();
    api.apply_yaml(&service_yaml(
        "shop",
        "productpage",
        9080,
        &[(&product, &[])],
    ))
    .unwrap();
    api.apply_yaml(&service_yaml("shop", "reviews", 9080, &[(&reviews, &[])]))
        .unwrap();
    api.apply_yaml(&gateway_yaml(port)).unwrap();
    // As kubectl leaves it: managed fields and the last-applied annotation.
    let vs = front_vs(&[("/productpage", "productpage")]).replace(
        "metadata: {name: front, namespace: shop}",
        "metadata:\n  name: front\n  namespace: shop\n  generation: 1\n  annotations: {kubectl.kubernetes.io/last-applied-configuration: '{\"huge\": true}', team: shop}\n  managedFields: [{manager: kubectl, operation: Apply, apiVersion: networking.istio.io/v1}]",
    );
    api.apply_yaml(&vs).unwrap();
    let meshd = Meshd::start_kubernetes(
        &dir.join("meshd"),
        &api.kubeconfig(&dir).unwrap(),
        "default",
    );
    let envoy = Envoy::gateway(&meshd, Ads::Delta, name);
    let addr = format!("127.0.0.1:{port}");
    wait_until(
        "the gateway to route from Kubernetes objects",
        Duration::from_secs(10),
        || {
            http_get(&addr, "shop.example.com", "/productpage", &[])
                .is_ok_and(|r| r.body == "productpage")
        },
    );
    KubeMesh {
        api,
        meshd,
        envoy,
        addr,
        _upstreams: vec![product, reviews],
    }
}

impl KubeMesh {
    fn get(&self, path: &str) -> HttpResponse {
        http_get(&self.addr, "shop.example.com", path, &[]).unwrap()
    }
    fn responses(&self) -> u64 {
        let s = self.meshd.syncz(&self.envoy.id);
        ["cds", "eds", "lds", "rds"]
            .iter()
            .map(|t| s["types"][t]["responses"].as_u64().unwrap_or(0))
            .sum()
    }
}

#[test]
fn kubernetes_objects_route_real_traffic_and_follow_live_changes() {
    let m = kube_mesh("k8s-route");
    // The first push carries the initial lists; a later push (the CA writing its secret)
    // does not claim them as changed again once the debounce window has passed.
    std::thread::sleep(Duration::from_secs(1));
    let status = m.meshd.json("/debug/push_status");
    assert!(
        !status["changed"].to_string().contains("VirtualService"),
        "{status}"
    );
    // Cut down at the edge: kubectl's copy of the object is not kept.
    let configz = m.meshd.json("/debug/configz");
    let front = configz["objects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "front")
        .unwrap()
        .clone();
    assert_eq!(front["kind"], "VirtualService");
    assert!(front.to_string().contains("team"), "{front}");
    assert!(
        !front.to_string().contains("last-applied") && !front.to_string().contains("managedFields"),
        "{front}"
    );

    m.api
        .apply_yaml(&front_vs(&[("/productpage", "reviews")]))
        .unwrap();
    wait_until("the change to route", Duration::from_secs(5), || {
        m.get("/productpage").body == "reviews"
    });
    // The status reports the new generation and that the gateway holds it.
    wait_until(
        "the status to count the proxy in sync",
        Duration::from_secs(10),
        || {
            let c =
                m.api.object("VirtualService", "shop", "front")["status"]["conditions"][0].clone();
            c["observedGeneration"] == 2
                && c["message"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("1/1 connected proxies in sync"))
        },
    );

    m.api.delete("VirtualService", "shop", "front");
    wait_until("the delete to apply", Duration::from_secs(5), || {
        m.get("/productpage").status == 404
    });

    // An invalid object from the API is reported and changes nothing.
    m.api
        .apply_yaml(&front_vs(&[("/productpage", "productpage")]))
        .unwrap();
    wait_until(
        "the VirtualService to return",
        Duration::from_secs(5),
        || m.get("/productpage").body == "productpage",
    );
    m.api
        .apply_yaml(
            &front_vs(&[("/productpage", "reviews")])
                .replace("prefix: /productpage", "regex: \"(\""),
        )
        .unwrap();
    wait_until(
        "meshd to report the bad object",
        Duration::from_secs(5),
        || {
            m.meshd
                .metric("meshd_config_errors{kind=\"VirtualService\"}")
                >= 1.0
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        m.get("/productpage").body,
        "productpage",
        "the last good version stays in force"
    );
    let issues =
        m.meshd.json("/debug/configz")["errors"]["kubernetes:VirtualService shop/front"].clone();
    assert_eq!(
        issues[0]["field"], "spec.http[0].match[0].uri.regex",
        "{issues}"
    );

    // The watch events, as istiod counts them for its dashboard: the VirtualService
    // listed, changed, deleted, created again and changed to something invalid (and its
    // status written back, an update too); the registry's Services and slices listed.
    let events = |family: &str, kind: &str, event: &str| {
        m.meshd
            .metric(&format!(r#"{family}{{type="{kind}",event="{event}"}}"#))
    };
    assert_eq!(events("pilot_k8s_cfg_events", "VirtualService", "add"), 2.0);
    assert_eq!(
        events("pilot_k8s_cfg_events", "VirtualService", "delete"),
        1.0
    );
    assert!(events("pilot_k8s_cfg_events", "VirtualService", "update") >= 2.0);
    assert_eq!(events("pilot_k8s_cfg_events", "Gateway", "add"), 1.0);
    // Each Service the registry holds was listed once (the two apps and the gateway's).
    let services = m.meshd.json("/debug/registryz").as_array().unwrap().len();
    assert_eq!(
        events("pilot_k8s_reg_events", "Services", "add"),
        services as f64
    );
    assert!(events("pilot_k8s_reg_events", "EndpointSlice", "add") >= 2.0);
    assert_eq!(events("pilot_k8s_reg_events", "Services", "delete"), 0.0);
}

#[test]
fn with_endpoint_slices_off_core_endpoints_feed_the_model() {
    let api = FakeApiServer::start().unwrap();
    let dir = temp_dir("k8s-endpoints");
    let kubeconfig = api.kubeconfig(&dir).unwrap();
    let by_slice = Upstream::start("from-slice");
    let by_endpoints = Upstream::start("from-endpoints");
    let port = free_port();
    api.apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n")
        .unwrap();
    api.apply_yaml(&service_yaml(
        "shop",
        "productpage",
        9080,
        &[(&by_slice, &[])],
    ))
    .unwrap();
    let endpoints = format!(
        "apiVersion: v1\nkind: Endpoints\nmetadata: {{name: productpage, namespace: shop}}\nsubsets:\n- addresses: [{{ip: 127.0.0.1}}]\n  notReadyAddresses: [{{ip: 127.0.0.2}}]\n  ports: [{{name: http, port: {}}}]\n",
        by_endpoints.port
    );
    api.apply_yaml(&endpoints).unwrap();
    api.apply_yaml(&gateway_yaml(port)).unwrap();
    api.apply_yaml(&front_vs(&[("/productpage", "productpage")]))
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    for (flag, expected) in [("true", "from-slice"), ("false", "from-endpoints")] {
        let meshd = Meshd::start_kubernetes_with(
            &dir.join(format!("meshd-{flag}")),
            &kubeconfig,
            &["--use-endpoint-slice", flag],
        );
        let envoy = Envoy::gateway(&meshd, Ads::Delta, &format!("k8s-endpoints-{flag}"));
        wait_until(
            &format!("PILOT_USE_ENDPOINT_SLICE={flag} to route to {expected}"),
            Duration::from_secs(10),
            || {
                http_get(&addr, "shop.example.com", "/productpage", &[])
                    .is_ok_and(|r| r.body == expected)
            },
        );
        if flag == "false" {
            // The not-ready address is sent as unhealthy, and a change to the Endpoints
            // object is followed live.
            let eds = envoy.admin("/clusters").unwrap().body;
            assert!(eds.contains("127.0.0.2:"), "{eds}");
            api.delete("Endpoints", "shop", "productpage");
            wait_until(
                "the Endpoints delete to apply",
                Duration::from_secs(5),
                || {
                    http_get(&addr, "shop.example.com", "/productpage", &[])
                        .is_ok_and(|r| r.status == 503)
                },
            );
        }
        drop(envoy);
    }
}

#[test]
fn a_relist_after_410_gone_pushes_only_real_differences() {
    let m = kube_mesh("k8s-relist");
    std::thread::sleep(Duration::from_millis(400));
    let (responses, recomputes, lists) = (
        m.responses(),
        m.meshd.metric("pilot_push_context_recompute_count"),
        m.api.list_requests("VirtualService"),
    );

    m.api.expire_watches();
    wait_until("every watcher to relist", Duration::from_secs(15), || {
        m.api.list_requests("VirtualService") > lists
    });
    wait_until("the watches to resume", Duration::from_secs(15), || {
        m.api.open_watches() >= meshd::config::Kind::ALL.len() - 1 // one endpoint kind
    });
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        m.responses(),
        responses,
        "an unchanged relist sends the proxy nothing"
    );
    assert_eq!(
        m.meshd.metric("pilot_push_context_recompute_count"),
        recomputes,
        "and builds no push"
    );
    assert_eq!(m.get("/productpage").body, "productpage");

    // A dropped stream resumes from its resourceVersion; a change made meanwhile arrives.
    m.api.drop_watches();
    m.api
        .apply_yaml(&front_vs(&[("/productpage", "reviews")]))
        .unwrap();
    wait_until(
        "the change made while the watch was down",
        Duration::from_secs(15),
        || m.get("/productpage").body == "reviews",
    );
}

#[test]
fn readiness_waits_for_every_initial_list_and_no_proxy_sees_a_partial_mesh() {
    let api = FakeApiServer::start().unwrap();
    let dir = temp_dir("k8s-ready");
    api.apply_yaml(&front_vs(&[("/x", "x")])).unwrap();
    api.hold("VirtualService");
    let meshd = Meshd::spawn_kubernetes(
        &dir.join("meshd"),
        &api.kubeconfig(&dir).unwrap(),
        "default",
    );
    wait_until(
        "meshd to answer on its monitoring port",
        Duration::from_secs(10),
        || meshd.get("/ready").is_ok(),
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        meshd.get("/ready").unwrap().status,
        503,
        "not ready while a list is failing"
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", meshd.xds_port)).is_err(),
        "xDS is not served before the initial lists"
    );
    api.release("VirtualService");
    wait_until(
        "readiness after the list succeeds",
        Duration::from_secs(30),
        || meshd.get("/ready").is_ok_and(|r| r.status == 200),
    );
    assert_eq!(meshd.json("/debug/push_status")["virtualServices"], 1);
}

/// Opens a delta stream as the proxy and returns the first answer (or the refusal).
async fn first_answer(meshd: &Meshd, namespace: &str) -> Result<usize, tonic::Status> {
    first_cds_answer(meshd.plain_channel().await, namespace, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_revisions_each_serve_exactly_their_shard() {
    let api = FakeApiServer::start().unwrap();
    let dir = temp_dir("k8s-revisions");
    api.apply_yaml(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: blue-ns, labels: {istio.io/rev: blue}}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: green-ns, labels: {istio.io/rev: green}}\n",
    ).unwrap();
    api.apply_yaml(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: canary, namespace: green-ns, labels: {istio.io/rev: green}}\nspec:\n  hosts: [canary]\n  http: [{route: [{destination: {host: canary}}]}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: shared, namespace: blue-ns}\nspec:\n  hosts: [shared]\n  http: [{route: [{destination: {host: shared}}]}]\n",
    ).unwrap();
    // Mesh-wide: unlabelled config in the root namespace applies to every revision.
    api.apply_yaml(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: mesh-wide, namespace: istio-system}\nspec:\n  hosts: [mesh-wide]\n  http: [{route: [{destination: {host: mesh-wide}}]}]\n",
    ).unwrap();
    let kubeconfig = api.kubeconfig(&dir).unwrap();
    let (d1, d2, k1, k2) = (
        dir.join("blue"),
        dir.join("green"),
        kubeconfig.clone(),
        kubeconfig.clone(),
    );
    let blue = tokio::task::spawn_blocking(move || Meshd::start_kubernetes(&d1, &k1, "blue"))
        .await
        .unwrap();
    let green = tokio::task::spawn_blocking(move || Meshd::start_kubernetes(&d2, &k2, "green"))
        .await
        .unwrap();

    let names = |m: &Meshd| -> Vec<String> {
        let mut names: Vec<String> = m.json("/debug/configz")["objects"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["kind"] == "VirtualService")
            .map(|o| o["name"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        names
    };
    // A revision-labelled object belongs to its revision; an unlabelled one to its
    // namespace's revision; root-namespace config to all.
    assert_eq!(names(&blue), ["mesh-wide", "shared"]);
    assert_eq!(names(&green), ["canary", "mesh-wide"]);

    assert!(first_answer(&blue, "blue-ns").await.is_ok());
    let refused = first_answer(&green, "blue-ns").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("revision \"blue\"")
            && refused.message().contains("serves revision \"green\""),
        "{}",
        refused.message()
    );
    assert!(first_answer(&green, "green-ns").await.is_ok());
    assert_eq!(
        green.metric("meshd_xds_connection_errors{reason=\"wrong_revision\"}"),
        1.0
    );

    // Relabelling the namespace moves its proxies to the other revision on reconnection.
    api.apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata: {name: blue-ns, labels: {istio.io/rev: green}}\n").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while first_answer(&green, "blue-ns").await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "green never took over blue-ns"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each instance watches the namespace on its own: blue may see the relabel later.
    let refused = loop {
        match first_answer(&blue, "blue-ns").await {
            Err(status) => break status,
            Ok(_) => {
                assert!(
                    std::time::Instant::now() < deadline + Duration::from_secs(5),
                    "blue kept serving blue-ns"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    // Its config moves with it: both views stay consistent.
    let (b, g) = (blue, green);
    let moved = tokio::task::spawn_blocking(move || {
        wait_until(
            "the namespace's config to move to green",
            Duration::from_secs(15),
            || names(&g) == ["canary", "mesh-wide", "shared"] && names(&b) == ["mesh-wide"],
        );
    });
    moved.await.unwrap();
}

fn vs(name: &str, host: &str, uri: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  hosts: [{host}]\n  http:\n  - match: [{{uri: {uri}}}]\n    route: [{{destination: {{host: {host}}}}}]\n"
    )
}

fn condition(api: &FakeApiServer, name: &str) -> serde_json::Value {
    api.object("VirtualService", "shop", name)["status"]["conditions"][0].clone()
}

#[test]
fn the_leader_writes_status_once_and_a_standby_takes_over() {
    let api = FakeApiServer::start().unwrap();
    let dir = temp_dir("k8s-status");
    let product = Upstream::start("productpage");
    api.apply_yaml(&service_yaml(
        "shop",
        "productpage",
        9080,
        &[(&product, &[])],
    ))
    .unwrap();
    api.apply_yaml(&vs("good", "productpage", "{prefix: /}"))
        .unwrap();
    api.apply_yaml(&vs("good", "productpage", "{prefix: /v2}"))
        .unwrap(); // generation 2
    api.apply_yaml(&vs("bad", "productpage", "{regex: \"(\"}"))
        .unwrap();
    api.apply_yaml(&vs("dangling", "nowhere", "{prefix: /}"))
        .unwrap();
    let kubeconfig = api.kubeconfig(&dir).unwrap();
    let mut replicas = [
        Some(Meshd::start_replica(&dir.join("a"), &kubeconfig, "meshd-a")),
        Some(Meshd::start_replica(&dir.join("b"), &kubeconfig, "meshd-b")),
    ];
    wait_until("status on every object", Duration::from_secs(20), || {
        ["good", "bad", "dangling"]
            .iter()
            .all(|n| !condition(&api, n).is_null())
    });
    let good = condition(&api, "good");
    assert_eq!(
        (good["type"].as_str(), good["status"].as_str()),
        (Some("Reconciled"), Some("True"))
    );
    assert_eq!(good["observedGeneration"], 2);
    let bad = condition(&api, "bad");
    assert_eq!(bad["status"], "False");
    assert!(
        bad["message"]
            .as_str()
            .unwrap()
            .contains("spec.http[0].match[0].uri.regex"),
        "{bad}"
    );
    assert_eq!(
        api.object("VirtualService", "shop", "bad")["status"]["validationMessages"][0]["level"],
        "ERROR"
    );
    let dangling = condition(&api, "dangling");
    assert_eq!(dangling["reason"], "AcceptedWithWarnings");
    assert!(
        dangling["message"].as_str().unwrap().contains("nowhere"),
        "{dangling}"
    );

    // One writer: each object was written once, and the status echoes pushed nothing.
    let holder = api
        .lease_holder("istio-system", "meshd-status-leader-default")
        .expect("a leader");
    let recomputes = || -> Vec<f64> {
        replicas
            .iter()
            .flatten()
            .map(|m| m.metric("pilot_push_context_recompute_count"))
            .collect()
    };
    // A replica that started late (a loaded machine) may still be pushing its initial
    // lists: start counting once both have been idle for a moment.
    wait_until("both replicas idle", Duration::from_secs(20), || {
        let before = recomputes();
        std::thread::sleep(Duration::from_millis(500));
        before == recomputes()
    });
    let before = recomputes();
    std::thread::sleep(Duration::from_millis(1500));
    for name in ["good", "bad", "dangling"] {
        assert_eq!(
            api.status_patches("VirtualService", "shop", name),
            1,
            "{name} written more than once"
        );
    }
    assert_eq!(before, recomputes(), "writing status must not cause pushes");

    // The leader goes; the standby takes the lease and writes the next status.
    let leader_index = if holder == "meshd-a" { 0 } else { 1 };
    replicas[leader_index].take();
    api.apply_yaml(&vs("later", "productpage", "{prefix: /later}"))
        .unwrap();
    wait_until(
        "the standby to take over and write",
        Duration::from_secs(20),
        || condition(&api, "later")["status"] == "True",
    );
    let new_holder = api
        .lease_holder("istio-system", "meshd-status-leader-default")
        .unwrap();
    assert_ne!(new_holder, holder);
}

fn kept_services(m: &Meshd) -> Vec<String> {
    let mut names: Vec<String> = m
        .json("/debug/registryz")
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["hostname"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

#[test]
fn discovery_selectors_limit_what_is_kept_and_follow_changes_live() {
    let api = FakeApiServer::start().unwrap();
    let dir = temp_dir("k8s-selectors");
    let up = Upstream::start("any");
    api.apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata: {name: in-mesh, labels: {mesh: \"on\"}}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: outside}\n").unwrap();
    api.apply_yaml(&service_yaml("in-mesh", "a", 9080, &[(&up, &[])]))
        .unwrap();
    api.apply_yaml(&service_yaml("outside", "b", 9080, &[(&up, &[])]))
        .unwrap();
    api.apply_yaml(&mesh_configmap(
        "discoverySelectors:\n- matchLabels: {mesh: \"on\"}",
    ))
    .unwrap();
    let meshd = Meshd::start_kubernetes(
        &dir.join("meshd"),
        &api.kubeconfig(&dir).unwrap(),
        "default",
    );
    assert_eq!(
        kept_services(&meshd),
        ["a.in-mesh.svc.cluster.local"],
        "only selected namespaces are kept"
    );
    let configz = meshd.json("/debug/configz");
    let outside: Vec<_> = configz["objects"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["namespace"] == "outside")
        .collect();
    assert!(
        outside.is_empty(),
        "nothing of an unselected namespace is cached: {outside:?}"
    );

    // A namespace joins by label: its objects are listed in.
    api.apply_yaml(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: outside, labels: {mesh: \"on\"}}\n",
    )
    .unwrap();
    wait_until(
        "the relabelled namespace to be kept",
        Duration::from_secs(15),
        || kept_services(&meshd).len() == 2,
    );

    // The mesh config changes live: a selector nobody matches leaves only the root namespace.
    api.apply_yaml(&mesh_configmap("discoverySelectors:\n- matchLabels: {mesh: nobody}\noutboundTrafficPolicy: {mode: REGISTRY_ONLY}")).unwrap();
    wait_until(
        "the new selectors to apply",
        Duration::from_secs(15),
        || kept_services(&meshd).is_empty(),
    );
    api.apply_yaml(&mesh_configmap("accessLogFile: /dev/stdout"))
        .unwrap();
    wait_until("no selectors: everything", Duration::from_secs(15), || {
        kept_services(&meshd).len() == 2
    });
}

#[test]
fn an_api_server_outage_leaves_proxies_on_their_last_config() {
    let m = kube_mesh("k8s-outage");
    std::thread::sleep(Duration::from_millis(400));
    let (responses, recomputes) = (
        m.responses(),
        m.meshd.metric("pilot_push_context_recompute_count"),
    );
    for kind in meshd::config::Kind::ALL {
        m.api.hold(kind.as_str());
    }
    m.api.expire_watches(); // every watcher must relist, and every list fails
    for _ in 0..10 {
        assert_eq!(
            m.get("/productpage").body,
            "productpage",
            "proxies keep their config"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        m.meshd.get("/ready").unwrap().status,
        200,
        "an outage after start-up is not unreadiness"
    );
    assert_eq!(
        (
            m.responses(),
            m.meshd.metric("pilot_push_context_recompute_count")
        ),
        (responses, recomputes),
        "nothing was pushed"
    );

    // The API server comes back with a change made meanwhile.
    m.api
        .apply_yaml(&front_vs(&[("/productpage", "reviews")]))
        .unwrap();
    for kind in meshd::config::Kind::ALL {
        m.api.release(kind.as_str());
    }
    wait_until("recovery with the change", Duration::from_secs(40), || {
        m.get("/productpage").body == "reviews"
    });
}

#[test]
fn a_nack_is_reported_on_the_object_that_produced_the_rejected_route() {
    let m = kube_mesh("k8s-nack");
    // The gateway has ACKed everything it was sent, so the only change it has not
    // accepted yet is the one below (a NACK blames what changed since the last ACK).
    wait_until(
        "the gateway to ACK every response",
        Duration::from_secs(10),
        || {
            let s = m.meshd.syncz(&m.envoy.id);
            s["types"].as_object().is_some_and(|types| {
                !types.is_empty() && types.values().all(|t| t["nonce_sent"] == t["nonce_acked"])
            })
        },
    );
    // Valid RE2 (meshd accepts it) whose program exceeds Envoy's default size limit.
    let greek = "alpha|beta|gamma|delta|epsilon|zeta|eta|theta|iota|kappa|lambda|mu|nu|xi|omicron|pi|rho|sigma|tau";
    m.api.apply_yaml(&format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: big, namespace: shop}}\nspec:\n  hosts: [\"big.example.com\"]\n  gateways: [web]\n  http:\n  - match: [{{uri: {{regex: \"^/({greek}){{1,20}}$\"}}}}]\n    route: [{{destination: {{host: reviews}}}}]\n"
    )).unwrap();
    wait_until(
        "the NACK on the object's status",
        Duration::from_secs(15),
        || {
            m.api.object("VirtualService", "shop", "big")["status"]["conditions"][0]["reason"]
                == "Rejected"
        },
    );
    let c = m.api.object("VirtualService", "shop", "big")["status"]["conditions"][0].clone();
    let text = c["message"].as_str().unwrap();
    assert!(
        text.contains(&m.envoy.id) && text.contains("program size"),
        "{text}"
    );
    assert_eq!(c["status"], "False");
    // Its neighbour on the same route configuration is not blamed, and traffic flows.
    let front = m.api.object("VirtualService", "shop", "front")["status"]["conditions"][0].clone();
    assert_eq!(front["status"], "True", "{front}");
    assert_eq!(m.get("/productpage").body, "productpage");
}

/// The revision's ValidatingWebhookConfigurations get meshd's root as their `caBundle`, as
/// istiod's webhook controller writes it: with it, the webhook port's certificate verifies
/// as the API server checks it. Another revision's configuration is left alone.
#[test]
fn the_revisions_webhook_configurations_get_meshds_root_as_their_ca_bundle() {
    use base64::Engine;
    let api = FakeApiServer::start().unwrap();
    let dir = temp_dir("k8s-webhook-ca");
    let whc = |name: &str, rev: &str| {
        format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata: {{name: {name}, labels: {{app: istiod, istio.io/rev: {rev}}}}}\nwebhooks:\n- name: rev.validation.istio.io\n  clientConfig: {{service: {{name: istiod, namespace: istio-system, path: /validate}}}}\n  failurePolicy: Ignore\n  sideEffects: None\n  admissionReviewVersions: [v1]\n  rules: [{{operations: [CREATE, UPDATE], apiGroups: [networking.istio.io], apiVersions: ['*'], resources: ['*']}}]\n"
        )
    };
    api.apply_yaml(&whc("istio-validator-istio-system", "default"))
        .unwrap();
    api.apply_yaml(&whc("istio-validator-canary-istio-system", "canary"))
        .unwrap();
    let meshd = Meshd::start_kubernetes(
        &dir.join("meshd"),
        &api.kubeconfig(&dir).unwrap(),
        "default",
    );
    let bundle = |name: &str| {
        let whc = api.object("ValidatingWebhookConfiguration", "", name);
        whc["webhooks"][0]["clientConfig"]["caBundle"]
            .as_str()
            .map(str::to_string)
    };
    wait_until(
        "the CA bundle to be written",
        Duration::from_secs(10),
        || bundle("istio-validator-istio-system").is_some(),
    );
    let encoded = bundle("istio-validator-istio-system").unwrap();
    let root = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap();
    let root = String::from_utf8(root).unwrap();
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "k-1", "operation": "DELETE", "resource": {}},
    });
    let answer = https_request(
        &format!("127.0.0.1:{}", meshd.webhook_port),
        "istiod.istio-system.svc",
        &root,
        "POST /validate",
        &[("Content-Type", "application/json")],
        &review.to_string(),
    )
    .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(bundle("istio-validator-canary-istio-system"), None);
    // The fake cannot reach a webhook by `service`: the probe's invalid config is let
    // through (failurePolicy Ignore), so the webhook is not known to work and keeps
    // failing open.
    std::thread::sleep(Duration::from_secs(1));
    let whc = api.object(
        "ValidatingWebhookConfiguration",
        "",
        "istio-validator-istio-system",
    );
    assert_eq!(whc["webhooks"][0]["failurePolicy"], "Ignore");
    let metrics = meshd.get("/metrics").unwrap().body;
    assert!(
        metrics.contains("galley_validation_config_updates 1\n"),
        "{metrics}"
    );
}

/// A JSON POST to the fake API server, as a client (kubectl) sends one.
fn post_json(api: &FakeApiServer, path: &str, body: &serde_json::Value) -> HttpResponse {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", api.port)).unwrap();
    let body = body.to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: kubernetes\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    parse_response(&raw).unwrap()
}

/// istiod's switch to failing closed: the revision's webhooks, installed with
/// `failurePolicy: Ignore`, become `Fail` once a dry run of invalid config sent through
/// the API server is refused by meshd's webhook (the fake API server calls webhooks over
/// HTTPS at their `clientConfig.url`, trusting their `caBundle`, as Kubernetes does).
/// After that, invalid config created through the API server is refused with meshd's
/// message naming the field. Another revision's webhook stays as installed.
#[test]
fn the_revisions_webhooks_fail_closed_once_meshd_refuses_invalid_config() {
    let api = FakeApiServer::start().unwrap();
    let dir = temp_dir("k8s-webhook-fail-closed");
    let meshd = Meshd::start_kubernetes(
        &dir.join("meshd"),
        &api.kubeconfig(&dir).unwrap(),
        "default",
    );
    let whc = |name: &str, rev: &str| {
        format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata: {{name: {name}, labels: {{app: istiod, istio.io/rev: {rev}}}}}\nwebhooks:\n- name: rev.validation.istio.io\n  clientConfig: {{url: 'https://127.0.0.1:{port}/validate'}}\n  failurePolicy: Ignore\n  sideEffects: None\n  admissionReviewVersions: [v1]\n  rules: [{{operations: [CREATE, UPDATE], apiGroups: [networking.istio.io, security.istio.io], apiVersions: ['*'], resources: ['*']}}]\n",
            port = meshd.webhook_port
        )
    };
    api.apply_yaml(&whc("istio-validator-istio-system", "default"))
        .unwrap();
    let policy = |name: &str| {
        api.object("ValidatingWebhookConfiguration", "", name)["webhooks"][0]["failurePolicy"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    wait_until(
        "the webhook to fail closed",
        Duration::from_secs(20),
        || policy("istio-validator-istio-system") == "Fail",
    );
    let installed = api.object(
        "ValidatingWebhookConfiguration",
        "",
        "istio-validator-istio-system",
    );
    assert!(installed["webhooks"][0]["clientConfig"]["caBundle"].is_string());
    // Invalid config through the API server is refused by meshd, naming the field.
    let invalid = serde_json::json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "bad", "namespace": "shop"},
        "spec": {"hosts": ["a"], "http": [{"match": [{"uri": {"regex": "("}}], "route": [{"destination": {"host": "a"}}]}]},
    });
    let refused = post_json(
        &api,
        "/apis/networking.istio.io/v1/namespaces/shop/virtualservices",
        &invalid,
    );
    assert_eq!(refused.status, 400, "{refused:?}");
    assert!(
        refused.body.contains("denied the request"),
        "{}",
        refused.body
    );
    assert!(
        refused.body.contains("spec.http[0].match[0].uri"),
        "{}",
        refused.body
    );
    // Valid config is created.
    let valid = serde_json::json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "good", "namespace": "shop"},
        "spec": {"hosts": ["a"], "http": [{"route": [{"destination": {"host": "a"}}]}]},
    });
    let created = post_json(
        &api,
        "/apis/networking.istio.io/v1/namespaces/shop/virtualservices",
        &valid,
    );
    assert_eq!(created.status, 200, "{created:?}");

    // Another revision's webhook, added later, is left failing open.
    api.apply_yaml(&whc("istio-validator-canary-istio-system", "canary"))
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(policy("istio-validator-canary-istio-system"), "Ignore");
}
