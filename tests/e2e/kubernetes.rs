//! Kubernetes mode against the test bed's real kube-apiserver and etcd (`cluster.rs`):
//! meshd runs under its own ServiceAccount bound to the role it ships
//! (`manifests/rbac.yaml`), watches with kube-runtime, and a real Envoy routes real
//! requests by what the API holds. Tests share one API server, each in namespaces of its
//! own; those that restart the server, compact etcd or remove a CRD start their own.

use std::time::Duration;

use crate::cluster::{Cluster, Tenant, service_yaml, test_host, upstream};
use crate::gateway::{front_vs, gateway_yaml};
use crate::harness::*;

struct KubeMesh {
    t: Tenant,
    meshd: Meshd,
    envoy: Envoy,
    addr: String,
    _upstreams: Vec<Upstream>,
}

/// productpage and reviews behind a gateway, meshd serving them from `t`'s namespaces.
fn kube_mesh_on(t: Tenant, name: &str) -> KubeMesh {
    let product = upstream("productpage");
    let reviews = upstream("reviews");
    let port = free_port();
    t.apply(&service_yaml("productpage", 9080, &[(&product, &[])]))
        .unwrap();
    t.apply(&service_yaml("reviews", 9080, &[(&reviews, &[])]))
        .unwrap();
    t.apply(&gateway_yaml(port)).unwrap();
    // As `kubectl apply` leaves it: the last-applied annotation and managed fields.
    let vs = front_vs(&[("/productpage", "productpage")]).replace(
        "metadata: {name: front, namespace: shop}",
        "metadata:\n  name: front\n  namespace: shop\n  annotations: {team: shop}",
    );
    t.cluster
        .kubectl(&["apply", "-f", "-"], Some(&t.yaml(&vs)))
        .unwrap();
    let meshd = Meshd::start_tenant(&t, "meshd", &[], &[]);
    let envoy = Envoy::gateway_in(&meshd, Ads::Delta, name, &t.system);
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
        t,
        meshd,
        envoy,
        addr,
        _upstreams: vec![product, reviews],
    }
}

fn kube_mesh(name: &str) -> KubeMesh {
    kube_mesh_on(Tenant::new(name, ""), name)
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
    fn condition(&self, name: &str) -> serde_json::Value {
        self.t.object("VirtualService", name)["status"]["conditions"][0].clone()
    }
}

#[test]
fn kubernetes_objects_route_real_traffic_and_follow_live_changes() {
    let m = kube_mesh("k8s-route");
    // A Service created in a namespace this meshd does not watch: not an event for it.
    let elsewhere = format!("{}-elsewhere", m.t.app);
    m.t.cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {elsewhere}}}\n---\n{}",
            service_yaml("outside", 9080, &[])
                .replace("namespace: shop", &format!("namespace: {elsewhere}"))
        ))
        .unwrap();
    // The first push carries the initial lists; a later push (the CA writing its secret)
    // does not claim them as changed again once the debounce window has passed.
    std::thread::sleep(Duration::from_secs(1));
    let status = m.meshd.json("/debug/push_status");
    assert!(
        !status["changed"].to_string().contains("VirtualService"),
        "{status}"
    );
    // Cut down at the edge: kubectl's copy of the object is not kept.
    let stored = m.t.object("VirtualService", "front");
    assert!(
        stored.to_string().contains("last-applied-configuration")
            && stored.to_string().contains("managedFields"),
        "kubectl left its annotation and managed fields: {stored}"
    );
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

    // Another field manager's part of the status, written through the status subresource.
    let other = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: front, namespace: shop}\nstatus: {other: kept}\n";
    m.t.cluster
        .kubectl(
            &[
                "apply",
                "--server-side",
                "--subresource=status",
                "--field-manager=other",
                "-f",
                "-",
            ],
            Some(&m.t.yaml(other)),
        )
        .unwrap();
    m.t.apply(&front_vs(&[("/productpage", "reviews")]))
        .unwrap();
    wait_until("the change to route", Duration::from_secs(5), || {
        m.get("/productpage").body == "reviews"
    });
    // The status reports the new generation and that the gateway holds it.
    wait_until(
        "the status to count the proxy in sync",
        Duration::from_secs(10),
        || {
            let c = m.condition("front");
            c["observedGeneration"] == 2
                && c["message"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("1/1 connected proxies in sync"))
        },
    );

    // meshd's server-side apply left the other manager's field alone.
    let front = m.t.object("VirtualService", "front");
    assert_eq!(front["status"]["other"], "kept", "{front}");
    let managers: Vec<&str> = front["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["subresource"] == "status")
        .map(|f| f["manager"].as_str().unwrap())
        .collect();
    assert!(
        managers.contains(&"meshd") && managers.contains(&"other"),
        "{managers:?}"
    );

    m.t.delete("VirtualService", "front");
    wait_until("the delete to apply", Duration::from_secs(5), || {
        m.get("/productpage").status == 404
    });

    // An invalid object from the API is reported and changes nothing.
    m.t.apply(&front_vs(&[("/productpage", "productpage")]))
        .unwrap();
    wait_until(
        "the VirtualService to return",
        Duration::from_secs(5),
        || m.get("/productpage").body == "productpage",
    );
    m.t.apply(
        &front_vs(&[("/productpage", "reviews")]).replace("prefix: /productpage", "regex: \"(\""),
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
    let issues = m.meshd.json("/debug/configz")["errors"]
        [&format!("kubernetes:VirtualService {}/front", m.t.app)]
        .clone();
    assert_eq!(
        issues[0]["field"], "spec.http[0].match[0].uri.regex",
        "{issues}"
    );

    // The watch events, as istiod counts them for its dashboard: the VirtualService
    // listed, changed, deleted, created again and changed to something invalid (and its
    // status written back, an update too); the registry's Services and slices listed.
    // Other tests' objects in the shared API server are outside this meshd's namespaces
    // and are not counted.
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
    assert_eq!(services, 3);
    assert_eq!(
        events("pilot_k8s_reg_events", "Services", "add"),
        services as f64
    );
    assert!(events("pilot_k8s_reg_events", "EndpointSlice", "add") >= 2.0);
    assert_eq!(events("pilot_k8s_reg_events", "Services", "delete"), 0.0);
}

/// What meshd's model holds of `t`'s objects: (kind, namespace, name) → annotations.
fn held(meshd: &Meshd) -> std::collections::BTreeMap<(String, String, String), serde_json::Value> {
    meshd.json("/debug/configz")["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let s = |f: &str| o[f].as_str().unwrap_or_default().to_string();
            (
                (s("kind"), s("namespace"), s("name")),
                o["annotations"].clone(),
            )
        })
        .collect()
}

/// Every kind meshd reads, added, changed (`kubectl annotate`) and deleted through the
/// API server, followed in meshd's model.
#[test]
fn every_kind_is_followed_through_add_change_and_delete() {
    let t = Tenant::new("k8s-kinds", "");
    let meshd = Meshd::start_tenant(&t, "meshd", &[], &[]);
    let node = format!("{}-node", t.app);
    let mut docs = crate::kubernetes_crds::one_of_each_istio_kind("every");
    docs.push(service_yaml("every", 9080, &[(&upstream("every"), &[])]));
    docs.push("apiVersion: v1\nkind: Secret\nmetadata: {name: every, namespace: shop}\ntype: Opaque\nstringData: {cacert: not-a-cert}\n".into());
    docs.push(format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {node}, labels: {{topology.kubernetes.io/region: r1}}}}\n"
    ));
    for doc in &docs {
        t.apply(doc).unwrap();
    }
    let mut objects: Vec<(String, String, String)> = [
        "VirtualService",
        "DestinationRule",
        "Gateway",
        "ServiceEntry",
        "Sidecar",
        "WorkloadEntry",
        "PeerAuthentication",
        "RequestAuthentication",
        "AuthorizationPolicy",
        "Telemetry",
        "Service",
        "Pod",
        "EndpointSlice",
        "Secret",
    ]
    .iter()
    .map(|k| (k.to_string(), t.app.clone(), "every".to_string()))
    .collect();
    objects.push(("Node".into(), String::new(), node.clone()));
    let kubectl_args = |(kind, ns, name): &(String, String, String)| -> Vec<String> {
        let mut args = vec![kind.clone(), name.clone()];
        if !ns.is_empty() {
            args.extend(["-n".to_string(), ns.clone()]);
        }
        args
    };
    wait_until("every object in the model", Duration::from_secs(15), || {
        let held = held(&meshd);
        objects.iter().all(|o| held.contains_key(o))
    });
    for o in &objects {
        let mut args = vec!["annotate".to_string()];
        args.extend(kubectl_args(o));
        args.push("round=2".into());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        t.cluster.kubectl(&args, None).unwrap();
    }
    wait_until("every change in the model", Duration::from_secs(15), || {
        let held = held(&meshd);
        objects
            .iter()
            .all(|o| held.get(o).is_some_and(|a| a["round"] == "2"))
    });
    for o in &objects {
        t.cluster.delete(&o.0, &o.1, &o.2);
    }
    wait_until("every delete in the model", Duration::from_secs(15), || {
        let held = held(&meshd);
        objects.iter().all(|o| !held.contains_key(o))
    });
}

/// meshd remembers the status it wrote per object instance: an object deleted and created
/// again unchanged (a new uid) gets its status written again, valid or not.
#[test]
fn a_deleted_and_recreated_object_gets_its_status_again() {
    let m = kube_mesh("k8s-recreate");
    let invalid = front_vs(&[("/x", "reviews")])
        .replace("name: front", "name: broken")
        .replace("prefix: /x", "regex: \"(\"");
    m.t.apply(&invalid).unwrap();
    for round in 0..2 {
        wait_until(
            &format!("round {round}: both objects' status"),
            Duration::from_secs(15),
            || {
                m.condition("front")["status"] == "True"
                    && m.condition("broken")["status"] == "False"
            },
        );
        let uid = m.t.object("VirtualService", "broken")["metadata"]["uid"].clone();
        m.t.delete("VirtualService", "front");
        m.t.delete("VirtualService", "broken");
        wait_until("both to go", Duration::from_secs(10), || {
            m.t.object("VirtualService", "broken").is_null()
                && m.t.object("VirtualService", "front").is_null()
        });
        m.t.apply(&front_vs(&[("/productpage", "productpage")]))
            .unwrap();
        m.t.apply(&invalid).unwrap();
        assert_ne!(
            m.t.object("VirtualService", "broken")["metadata"]["uid"],
            uid
        );
    }
    wait_until(
        "the recreated objects' status",
        Duration::from_secs(15),
        || m.condition("front")["status"] == "True" && m.condition("broken")["status"] == "False",
    );
}

#[test]
fn with_endpoint_slices_off_core_endpoints_feed_the_model() {
    let t = Tenant::new("k8s-endpoints", "");
    let by_slice = upstream("from-slice");
    let by_endpoints = upstream("from-endpoints");
    let port = free_port();
    t.apply(&service_yaml("productpage", 9080, &[(&by_slice, &[])]))
        .unwrap();
    let host = test_host();
    let endpoints = format!(
        "apiVersion: v1\nkind: Endpoints\nmetadata: {{name: productpage, namespace: shop}}\nsubsets:\n- addresses: [{{ip: {}}}]\n  notReadyAddresses: [{{ip: {}}}]\n  ports: [{{name: http, port: {}}}]\n",
        host.ip, host.peer_ip, by_endpoints.port
    );
    t.apply(&endpoints).unwrap();
    t.apply(&gateway_yaml(port)).unwrap();
    t.apply(&front_vs(&[("/productpage", "productpage")]))
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    for (flag, expected) in [("true", "from-slice"), ("false", "from-endpoints")] {
        let meshd = Meshd::start_tenant(
            &t,
            &format!("meshd-{flag}"),
            &["--use-endpoint-slice", flag],
            &[],
        );
        let envoy = Envoy::gateway_in(
            &meshd,
            Ads::Delta,
            &format!("k8s-endpoints-{flag}"),
            &t.system,
        );
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
            assert!(eds.contains(&format!("{}:", host.peer_ip)), "{eds}");
            t.delete("Endpoints", "productpage");
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

/// The sum of kube-apiserver's `apiserver_request_total` samples for `resource`, its
/// `subresource` (empty for the object itself) and `verb`.
fn api_requests(cluster: &Cluster, resource: &str, subresource: &str, verb: &str) -> f64 {
    let text = cluster
        .kubectl(&["get", "--raw", "/metrics"], None)
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| {
            l.contains(&format!("resource=\"{resource}\""))
                && l.contains(&format!("subresource=\"{subresource}\""))
                && l.contains(&format!("verb=\"{verb}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Real causes, on an API server of this test's own: kube-apiserver killed (proxies keep
/// their configuration, meshd stays ready and pushes nothing), etcd's history compacted
/// meanwhile, so that the watches resumed on the restarted server get `410 Gone` and meshd
/// relists, and a relist of unchanged objects pushes nothing. A change made after the
/// restart arrives.
#[test]
fn an_api_server_restart_and_a_compacted_history_push_only_real_differences() {
    let cluster: &'static Cluster = Box::leak(Box::new(Cluster::start("k8s-restart", &[])));
    let m = kube_mesh_on(Tenant::of(cluster, "k8s-restart", ""), "k8s-restart");
    std::thread::sleep(Duration::from_millis(400));
    let (responses, recomputes) = (
        m.responses(),
        m.meshd.metric("pilot_push_context_recompute_count"),
    );
    // History moves on past every resourceVersion meshd holds, and is compacted.
    m.t.apply("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bump, namespace: shop}\n")
        .unwrap();
    cluster.stop_apiserver();
    cluster.compact_etcd();
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
    cluster.restart_apiserver();
    wait_until(
        "meshd to relist VirtualServices on the restarted server",
        Duration::from_secs(40),
        || api_requests(cluster, "virtualservices", "", "LIST") >= 1.0,
    );
    assert!(
        m.meshd.log().contains("relisted"),
        "the watches resumed with a relist: {}",
        m.meshd.log()
    );
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(
        (
            m.responses(),
            m.meshd.metric("pilot_push_context_recompute_count")
        ),
        (responses, recomputes),
        "an unchanged relist sends the proxy nothing and builds no push"
    );
    m.t.apply(&front_vs(&[("/productpage", "reviews")]))
        .unwrap();
    wait_until(
        "a change after the restart",
        Duration::from_secs(15),
        || m.get("/productpage").body == "reviews",
    );
}

/// A kind whose list fails (here for a real reason: meshd's role does not cover
/// networking.istio.io yet) holds readiness, and xDS is not served before every kind has
/// been listed once. Granting the role lets the retried lists through.
#[test]
fn readiness_waits_for_every_initial_list_and_no_proxy_sees_a_partial_mesh() {
    let t = Tenant::new("k8s-ready", "");
    t.apply(&front_vs(&[("/x", "x")])).unwrap();
    let full = format!("meshd-{}", t.system);
    let role = t.cluster.object("ClusterRole", "", "meshd");
    let mut partial = role.clone();
    partial["metadata"] = serde_json::json!({"name": format!("{full}-partial")});
    partial["rules"] = serde_json::Value::Array(
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| !r["apiGroups"].to_string().contains("networking.istio.io"))
            .cloned()
            .collect(),
    );
    t.cluster.apply(&partial.to_string()).unwrap();
    let mut binding = t.cluster.object("ClusterRoleBinding", "", &full);
    binding["metadata"] = serde_json::json!({"name": full});
    let mut partial_binding = binding.clone();
    partial_binding["metadata"] = serde_json::json!({"name": format!("{full}-partial")});
    partial_binding["roleRef"]["name"] = serde_json::json!(format!("{full}-partial"));
    t.cluster.apply(&partial_binding.to_string()).unwrap();
    t.cluster.delete("ClusterRoleBinding", "", &full);

    let meshd = Meshd::spawn_tenant(&t, "meshd", &[], &[]);
    wait_until(
        "meshd to answer on its monitoring port",
        Duration::from_secs(10),
        || meshd.get("/ready").is_ok(),
    );
    wait_until(
        "meshd to be refused a list",
        Duration::from_secs(10),
        || meshd.log().contains("forbidden"),
    );
    assert_eq!(
        meshd.get("/ready").unwrap().status,
        503,
        "not ready while a list is failing"
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", meshd.xds_port)).is_err(),
        "xDS is not served before the initial lists"
    );
    t.cluster.apply(&binding.to_string()).unwrap();
    wait_until(
        "readiness after the list succeeds",
        Duration::from_secs(40),
        || meshd.get("/ready").is_ok_and(|r| r.status == 200),
    );
    assert_eq!(meshd.json("/debug/push_status")["virtualServices"], 1);
}

/// A cluster whose Istio CRDs come from an older release (no Telemetry CRD): meshd serves
/// every other kind, reports the missing one, and starts watching it within seconds of
/// `kubectl apply` installing the CRD, as istiod does.
#[test]
fn a_missing_crd_is_reported_and_watched_once_installed() {
    let cluster: &'static Cluster = Box::leak(Box::new(Cluster::start("k8s-crd", &[])));
    let crd = cluster
        .kubectl(
            &["get", "crd", "telemetries.telemetry.istio.io", "-o", "yaml"],
            None,
        )
        .unwrap();
    cluster.delete("crd", "", "telemetries.telemetry.istio.io");
    wait_until("the CRD to go", Duration::from_secs(20), || {
        cluster
            .kubectl(&["get", "crd", "telemetries.telemetry.istio.io"], None)
            .is_err()
    });
    let m = kube_mesh_on(Tenant::of(cluster, "k8s-crd", ""), "k8s-crd");
    assert_eq!(
        m.meshd.metric("meshd_k8s_crd_missing{type=\"Telemetry\"}"),
        1.0
    );
    assert_eq!(
        m.meshd.json("/debug/configz")["missingCrds"],
        serde_json::json!(["telemetries.telemetry.istio.io"])
    );
    assert!(
        m.meshd.log().contains("CRD not installed"),
        "{}",
        m.meshd.log()
    );

    let crd: String = crd
        .lines()
        .filter(|l| {
            !l.trim_start().starts_with("resourceVersion:") && !l.trim_start().starts_with("uid:")
        })
        .map(|l| format!("{l}\n"))
        .collect();
    cluster
        .kubectl(&["apply", "--server-side", "-f", "-"], Some(&crd))
        .unwrap();
    cluster
        .kubectl(
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=30s",
                "crd/telemetries.telemetry.istio.io",
            ],
            None,
        )
        .unwrap();
    // A Telemetry that turns on access logging for the gateway's namespace.
    m.t.apply(&m.t.mesh_configmap(
        "",
        "extensionProviders:\n- name: log\n  envoyFileAccessLog: {path: /dev/stdout}\n",
    ))
    .unwrap();
    m.t.apply(
        "apiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: logs, namespace: istio-system}\nspec:\n  accessLogging: [{providers: [{name: log}]}]\n",
    )
    .unwrap();
    wait_until(
        "the Telemetry to be watched and kept",
        Duration::from_secs(15),
        || {
            m.meshd.json("/debug/configz")["objects"]
                .as_array()
                .unwrap()
                .iter()
                .any(|o| o["kind"] == "Telemetry" && o["name"] == "logs")
        },
    );
    assert_eq!(
        m.meshd.metric("meshd_k8s_crd_missing{type=\"Telemetry\"}"),
        0.0
    );
}

/// Opens a delta stream as the proxy and returns the first answer (or the refusal).
async fn first_answer(meshd: &Meshd, namespace: &str) -> Result<usize, tonic::Status> {
    first_cds_answer(meshd.plain_channel().await, namespace, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_revisions_each_serve_exactly_their_shard() {
    let t = tokio::task::spawn_blocking(|| Tenant::new("k8s-revisions", "istio.io/rev: blue"))
        .await
        .unwrap();
    let (blue_ns, green_ns) = (t.app.clone(), format!("{}-green", t.app));
    let setup = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {green_ns}, labels: {{istio.io/rev: green}}}}\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: canary, namespace: {green_ns}, labels: {{istio.io/rev: green}}}}\nspec:\n  hosts: [canary]\n  http: [{{route: [{{destination: {{host: canary}}}}]}}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: shared, namespace: shop}}\nspec:\n  hosts: [shared]\n  http: [{{route: [{{destination: {{host: shared}}}}]}}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: mesh-wide, namespace: istio-system}}\nspec:\n  hosts: [mesh-wide]\n  http: [{{route: [{{destination: {{host: mesh-wide}}}}]}}]\n"
    );
    // Mesh-wide: unlabelled config in the root namespace applies to every revision.
    t.apply(&setup).unwrap();
    t.apply(&t.mesh_configmap("blue", "")).unwrap();
    t.apply(&t.mesh_configmap("green", "")).unwrap();
    let watched = format!("{blue_ns},{green_ns},{}", t.system);
    let t = std::sync::Arc::new(t);
    let start = |rev: &'static str| {
        let (t, watched) = (t.clone(), watched.clone());
        tokio::task::spawn_blocking(move || {
            Meshd::start_tenant(
                &t,
                rev,
                &["--revision", rev],
                &[("WATCHED_NAMESPACES", &watched)],
            )
        })
    };
    let blue = start("blue").await.unwrap();
    let green = start("green").await.unwrap();

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

    assert!(first_answer(&blue, &blue_ns).await.is_ok());
    let refused = first_answer(&green, &blue_ns).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("revision \"blue\"")
            && refused.message().contains("serves revision \"green\""),
        "{}",
        refused.message()
    );
    assert!(first_answer(&green, &green_ns).await.is_ok());
    assert_eq!(
        green.metric("meshd_xds_connection_errors{reason=\"wrong_revision\"}"),
        1.0
    );

    // Relabelling the namespace moves its proxies to the other revision on reconnection.
    let relabel = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {blue_ns}, labels: {{istio.io/rev: green}}}}\n"
    );
    let t2 = t.clone();
    tokio::task::spawn_blocking(move || t2.cluster.apply(&relabel).unwrap())
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while first_answer(&green, &blue_ns).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "green never took over {blue_ns}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each instance watches the namespace on its own: blue may see the relabel later.
    let refused = loop {
        match first_answer(&blue, &blue_ns).await {
            Err(status) => break status,
            Ok(_) => {
                assert!(
                    std::time::Instant::now() < deadline + Duration::from_secs(5),
                    "blue kept serving {blue_ns}"
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

/// Two replicas on a real Lease: one writes status (each object once, seen in the API
/// server's own request count on an API server of this test's own), the other takes over
/// within the lease duration when the leader goes.
#[test]
fn the_leader_writes_status_once_and_a_standby_takes_over() {
    let cluster: &'static Cluster = Box::leak(Box::new(Cluster::start("k8s-status", &[])));
    let t = Tenant::of(cluster, "k8s-status", "");
    let product = upstream("productpage");
    t.apply(&service_yaml("productpage", 9080, &[(&product, &[])]))
        .unwrap();
    t.apply(&vs("good", "productpage", "{prefix: /}")).unwrap();
    t.apply(&vs("good", "productpage", "{prefix: /v2}"))
        .unwrap(); // generation 2
    t.apply(&vs("bad", "productpage", "{regex: \"(\"}"))
        .unwrap();
    t.apply(&vs("dangling", "nowhere", "{prefix: /}")).unwrap();
    let replica = |pod: &str| {
        Meshd::start_tenant(
            &t,
            pod,
            &["--pod-name", pod, "--leader-lease-duration", "2s"],
            &[],
        )
    };
    let mut replicas = [Some(replica("meshd-a")), Some(replica("meshd-b"))];
    let condition =
        |name: &str| t.object("VirtualService", name)["status"]["conditions"][0].clone();
    wait_until("status on every object", Duration::from_secs(20), || {
        ["good", "bad", "dangling"]
            .iter()
            .all(|n| !condition(n).is_null())
    });
    let good = condition("good");
    assert_eq!(
        (good["type"].as_str(), good["status"].as_str()),
        (Some("Reconciled"), Some("True"))
    );
    assert_eq!(good["observedGeneration"], 2);
    let bad = condition("bad");
    assert_eq!(bad["status"], "False");
    assert!(
        bad["message"]
            .as_str()
            .unwrap()
            .contains("spec.http[0].match[0].uri.regex"),
        "{bad}"
    );
    assert_eq!(
        t.object("VirtualService", "bad")["status"]["validationMessages"][0]["level"],
        "ERROR"
    );
    let dangling = condition("dangling");
    assert_eq!(dangling["reason"], "AcceptedWithWarnings");
    assert!(
        dangling["message"].as_str().unwrap().contains("nowhere"),
        "{dangling}"
    );

    // One writer: each object was written once, and the status echoes pushed nothing.
    let lease = || {
        cluster.object("Lease", &t.system, "meshd-status-leader-default")["spec"]["holderIdentity"]
            .as_str()
            .map(str::to_string)
    };
    let holder = lease().expect("a leader");
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
    assert_eq!(
        api_requests(cluster, "virtualservices", "status", "APPLY"),
        3.0,
        "each of the three objects' status applied once, by one replica"
    );
    assert_eq!(before, recomputes(), "writing status must not cause pushes");

    // The leader goes; the standby takes the lease and writes the next status.
    let leader_index = if holder == "meshd-a" { 0 } else { 1 };
    replicas[leader_index].take();
    t.apply(&vs("later", "productpage", "{prefix: /later}"))
        .unwrap();
    wait_until(
        "the standby to take over and write",
        Duration::from_secs(20),
        || condition("later")["status"] == "True",
    );
    assert_ne!(lease().unwrap(), holder);
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
    let t = Tenant::new("k8s-selectors", "mesh: \"on\"");
    let (inside, outside) = (t.app.clone(), format!("{}-out", t.app));
    let up = upstream("any");
    t.cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {outside}}}\n"
        ))
        .unwrap();
    t.apply(&service_yaml("a", 9080, &[(&up, &[])])).unwrap();
    t.cluster
        .apply(
            &service_yaml("b", 9080, &[(&up, &[])])
                .replace("namespace: shop", &format!("namespace: {outside}")),
        )
        .unwrap();
    t.apply(&t.mesh_configmap("", "discoverySelectors:\n- matchLabels: {mesh: \"on\"}"))
        .unwrap();
    let watched = format!("{inside},{outside},{}", t.system);
    let meshd = Meshd::start_tenant(&t, "meshd", &[], &[("WATCHED_NAMESPACES", &watched)]);
    assert_eq!(
        kept_services(&meshd),
        [format!("a.{inside}.svc.cluster.local")],
        "only selected namespaces are kept"
    );
    let configz = meshd.json("/debug/configz");
    let kept_outside: Vec<_> = configz["objects"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["namespace"] == outside.as_str())
        .collect();
    assert!(
        kept_outside.is_empty(),
        "nothing of an unselected namespace is cached: {kept_outside:?}"
    );

    // A namespace joins by label: its objects are listed in.
    t.cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {outside}, labels: {{mesh: \"on\"}}}}\n"
        ))
        .unwrap();
    wait_until(
        "the relabelled namespace to be kept",
        Duration::from_secs(15),
        || kept_services(&meshd).len() == 2,
    );

    // The mesh config changes live: a selector nobody matches leaves only the root namespace.
    t.apply(&t.mesh_configmap(
        "",
        "discoverySelectors:\n- matchLabels: {mesh: nobody}\noutboundTrafficPolicy: {mode: REGISTRY_ONLY}",
    ))
    .unwrap();
    wait_until(
        "the new selectors to apply",
        Duration::from_secs(15),
        || kept_services(&meshd).is_empty(),
    );
    t.apply(&t.mesh_configmap("", "accessLogFile: /dev/stdout"))
        .unwrap();
    wait_until("no selectors: everything", Duration::from_secs(15), || {
        kept_services(&meshd).len() == 2
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
    m.t.apply(&format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: big, namespace: shop}}\nspec:\n  hosts: [\"big.example.com\"]\n  gateways: [web]\n  http:\n  - match: [{{uri: {{regex: \"^/({greek}){{1,20}}$\"}}}}]\n    route: [{{destination: {{host: reviews}}}}]\n"
    ))
    .unwrap();
    wait_until(
        "the NACK on the object's status",
        Duration::from_secs(15),
        || m.condition("big")["reason"] == "Rejected",
    );
    let c = m.condition("big");
    let text = c["message"].as_str().unwrap();
    assert!(
        text.contains(&m.envoy.id) && text.contains("program size"),
        "{text}"
    );
    assert_eq!(c["status"], "False");
    // Its neighbour on the same route configuration is not blamed, and traffic flows.
    let front = m.condition("front");
    assert_eq!(front["status"], "True", "{front}");
    assert_eq!(m.get("/productpage").body, "productpage");
}
