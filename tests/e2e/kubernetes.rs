//! Kubernetes mode against the test bed's real kube-apiserver and etcd (`cluster.rs`):
//! meshd runs under its own ServiceAccount bound to the role it ships
//! (`manifests/rbac.yaml`), watches with kube-runtime, and a real Envoy routes real
//! requests by what the API holds. Tests share one API server, each in namespaces of its
//! own; those that restart the server, compact etcd or remove a CRD start their own.

use std::time::Duration;

use crate::cluster::{Cluster, Tenant};
use crate::gateway::{front_vs, gateway_yaml};
use crate::harness::*;
use crate::test_host::{service_yaml, test_host, upstream};

pub struct KubeMesh {
    pub t: Tenant,
    pub meshd: Meshd,
    pub envoy: Envoy,
    addr: String,
    _upstreams: Vec<Upstream>,
}

/// productpage and reviews behind a gateway, meshd serving them from `t`'s namespaces.
pub fn kube_mesh_on(t: Tenant, name: &str) -> KubeMesh {
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
pub fn api_requests(cluster: &Cluster, resource: &str, subresource: &str, verb: &str) -> f64 {
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
