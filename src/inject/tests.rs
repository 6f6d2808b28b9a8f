use serde_json::json;

use super::*;

fn options() -> InjectOptions {
    InjectOptions {
        revision: "canary".into(),
        istio_namespace: "istio-system".into(),
        proxy_image: "meshd/proxy:test".into(),
        trust_domain: "cluster.local".into(),
        cluster_id: "Kubernetes".into(),
        mesh_id: None,
        native_sidecars: NativeSidecars::Auto,
        policy: Policy::Enabled,
        patch_ca_bundle: true,
        network: None,
        path_env: Vec::new(),
    }
}

fn pod(value: serde_json::Value) -> Pod {
    serde_json::from_value(value).unwrap()
}

fn hello() -> Pod {
    pod(json!({
        "metadata": {"name": "hello", "namespace": "shop", "labels": {"app": "hello", "version": "v2"}},
        "spec": {"containers": [{"name": "hello", "image": "hello", "ports": [{"name": "http", "containerPort": 8080}]}]}
    }))
}

fn names(list: &Option<Vec<k8s_openapi::api::core::v1::Container>>) -> Vec<&str> {
    list.iter().flatten().map(|c| c.name.as_str()).collect()
}

fn env<'a>(c: &'a k8s_openapi::api::core::v1::Container, name: &str) -> Option<&'a str> {
    (c.env.iter().flatten())
        .find(|e| e.name == name)
        .and_then(|e| e.value.as_deref())
}

#[test]
fn the_label_wins_over_the_annotation_then_the_policy_decides() {
    let with = |labels: serde_json::Value, annotations: serde_json::Value| {
        pod(json!({"metadata": {"name": "p", "labels": labels, "annotations": annotations}}))
    };
    let opted_in_by_label = with(json!({INJECT: "true"}), json!({INJECT: "false"}));
    assert_eq!(
        required(&opted_in_by_label, "shop", Policy::Disabled),
        Ok(())
    );
    let opted_out_by_label = with(json!({INJECT: "false"}), json!({INJECT: "true"}));
    assert_eq!(
        required(&opted_out_by_label, "shop", Policy::Enabled),
        Err(Skip::OptedOut)
    );
    let annotated = with(json!({}), json!({INJECT: "false"}));
    assert_eq!(
        required(&annotated, "shop", Policy::Enabled),
        Err(Skip::OptedOut)
    );
    // Another value counts as unset.
    let unclear = with(json!({INJECT: "yes"}), json!({}));
    assert_eq!(required(&unclear, "shop", Policy::Enabled), Ok(()));
    assert_eq!(
        required(&unclear, "shop", Policy::Disabled),
        Err(Skip::PolicyDisabled)
    );
    assert_eq!(
        required(&opted_in_by_label, "kube-system", Policy::Enabled),
        Err(Skip::IgnoredNamespace)
    );
    let host =
        pod(json!({"metadata": {"name": "h"}, "spec": {"hostNetwork": true, "containers": []}}));
    assert_eq!(
        required(&host, "shop", Policy::Enabled),
        Err(Skip::HostNetwork)
    );
}

#[test]
fn native_sidecars_follow_the_kubelets_unless_the_pod_says() {
    let nodes = NodeVersions::default();
    let mesh = MeshDefaults::default();
    let injected =
        |p: Pod, nodes: &NodeVersions| inject(p, "shop", &options(), &mesh, nodes).unwrap();
    // No cluster: off, the proxy is the last container.
    let p = injected(hello(), &nodes);
    assert_eq!(
        names(&p.spec.as_ref().unwrap().init_containers),
        ["istio-init"]
    );
    assert_eq!(p.spec.as_ref().unwrap().containers[1].name, "istio-proxy");
    nodes.set(
        [
            ("a".into(), "v1.37.2".into()),
            ("b".into(), "v1.33.0".into()),
        ]
        .into(),
    );
    let p = injected(hello(), &nodes);
    let spec = p.spec.as_ref().unwrap();
    assert_eq!(names(&spec.init_containers), ["istio-init", "istio-proxy"]);
    assert_eq!(spec.containers.len(), 1);
    assert_eq!(
        spec.init_containers.as_ref().unwrap()[1]
            .restart_policy
            .as_deref(),
        Some("Always")
    );
    let status = &p.metadata.annotations.as_ref().unwrap()[STATUS];
    assert!(
        status.starts_with(r#"{"initContainers":["istio-init","istio-proxy"],"containers":null,"volumes":["workload-socket","#),
        "{status}"
    );
    assert!(
        status.ends_with(r#""imagePullSecrets":null,"revision":"canary"}"#),
        "{status}"
    );
    // One old kubelet turns it off for unscheduled pods; a pod on a new node keeps it.
    nodes.set(
        [
            ("a".into(), "v1.37.2".into()),
            ("old".into(), "v1.32.9".into()),
        ]
        .into(),
    );
    assert_eq!(
        names(&injected(hello(), &nodes).spec.unwrap().init_containers),
        ["istio-init"]
    );
    let mut on_a = hello();
    on_a.spec.as_mut().unwrap().node_name = Some("a".into());
    assert_eq!(
        names(&injected(on_a, &nodes).spec.unwrap().init_containers),
        ["istio-init", "istio-proxy"]
    );
    let mut annotated = hello();
    annotated.metadata.annotations =
        Some([(NATIVE_SIDECAR.to_string(), "true".to_string())].into());
    assert_eq!(
        names(&injected(annotated, &nodes).spec.unwrap().init_containers),
        ["istio-init", "istio-proxy"]
    );
}

#[test]
fn the_proxy_reaches_the_revisions_service_and_carries_the_pods_identity() {
    let mut p = hello();
    p.metadata.name = Some("hello-5d8f-x2x".into());
    p.metadata.generate_name = Some("hello-5d8f-".into());
    p.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("pod-template-hash".into(), "5d8f".into());
    p.metadata.owner_references = Some(vec![serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "hello-5d8f", "uid": "u", "controller": true
    })).unwrap()]);
    let mut opts = options();
    opts.native_sidecars = NativeSidecars::On;
    let p = inject(
        p,
        "shop",
        &opts,
        &MeshDefaults::default(),
        &NodeVersions::default(),
    )
    .unwrap();
    let proxy = &p.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[1];
    assert_eq!(
        env(proxy, "CA_ADDR"),
        Some("istiod-canary.istio-system.svc:15012")
    );
    assert_eq!(env(proxy, "ISTIO_META_WORKLOAD_NAME"), Some("hello"));
    assert_eq!(
        env(proxy, "ISTIO_META_OWNER"),
        Some("kubernetes://apis/apps/v1/namespaces/shop/deployments/hello")
    );
    assert_eq!(env(proxy, "ISTIO_META_APP_CONTAINERS"), Some("hello"));
    let ports: serde_json::Value =
        serde_json::from_str(env(proxy, "ISTIO_META_POD_PORTS").unwrap()).unwrap();
    assert_eq!(ports, json!([{"name": "http", "containerPort": 8080}]));
    let args = proxy.args.as_ref().unwrap();
    let server = args.iter().position(|a| a == "--ca-server-name").unwrap();
    assert_eq!(args[server + 1], "istiod-canary.istio-system.svc");
    let labels = p.metadata.labels.as_ref().unwrap();
    assert_eq!(labels["service.istio.io/canonical-name"], "hello");
    assert_eq!(labels["service.istio.io/canonical-revision"], "v2");
    assert_eq!(labels["security.istio.io/tlsMode"], "istio");
    assert_eq!(
        p.metadata.annotations.as_ref().unwrap()["istio.io/rev"],
        "canary"
    );
}

#[test]
fn traffic_annotations_reach_the_capture_command() {
    let mut p = hello();
    p.metadata.annotations = Some(
        [
            (
                "traffic.sidecar.istio.io/excludeOutboundIPRanges",
                "10.0.0.0/8",
            ),
            ("traffic.sidecar.istio.io/includeInboundPorts", "8080"),
            ("traffic.sidecar.istio.io/excludeInboundPorts", "9000"),
            ("traffic.sidecar.istio.io/excludeOutboundPorts", "5432"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into(),
    );
    let p = inject(
        p,
        "shop",
        &options(),
        &MeshDefaults::default(),
        &NodeVersions::default(),
    )
    .unwrap();
    let init = &p.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0];
    let args = init.args.as_ref().unwrap().join(" ");
    assert_eq!(
        args,
        "agent iptables -p 15001 -z 15006 -u 1337 -m REDIRECT -i * -x 10.0.0.0/8 -b 8080 \
         -d 15090,15021,15020,9000 -o 5432 --log_output_level=default:info"
    );
}

#[test]
fn probes_go_through_the_agent_and_the_originals_to_it() {
    let p = pod(json!({
        "metadata": {"name": "hello", "annotations": {"prometheus.io/port": "9090"}},
        "spec": {"containers": [{
            "name": "hello", "image": "hello",
            "ports": [{"name": "http", "containerPort": 8080}],
            "livenessProbe": {"httpGet": {"port": "http", "path": "/live", "scheme": "HTTPS"}, "timeoutSeconds": 2},
            "readinessProbe": {"tcpSocket": {"port": 3333}},
            "startupProbe": {"exec": {"command": ["true"]}}
        }]}
    }));
    let mesh = MeshDefaults {
        prometheus_merge: true,
        ..Default::default()
    };
    let p = inject(p, "shop", &options(), &mesh, &NodeVersions::default()).unwrap();
    let spec = p.spec.as_ref().unwrap();
    let app = &spec.containers[0];
    let live = app
        .liveness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(live.path.as_deref(), Some("/app-health/hello/livez"));
    assert_eq!(live.scheme.as_deref(), Some("HTTP"));
    let ready = app.readiness_probe.as_ref().unwrap();
    assert!(ready.tcp_socket.is_none());
    assert_eq!(
        ready.http_get.as_ref().unwrap().path.as_deref(),
        Some("/app-health/hello/readyz")
    );
    assert!(app.startup_probe.as_ref().unwrap().exec.is_some());
    let proxy = spec
        .containers
        .iter()
        .find(|c| c.name == "istio-proxy")
        .unwrap();
    let probers: serde_json::Value =
        serde_json::from_str(env(proxy, "ISTIO_KUBE_APP_PROBERS").unwrap()).unwrap();
    assert_eq!(
        probers,
        json!({
            "/app-health/hello/livez": {"httpGet": {"port": 8080, "path": "/live", "scheme": "HTTPS"}, "timeoutSeconds": 2},
            "/app-health/hello/readyz": {"tcpSocket": {"port": 3333}}
        })
    );
    let annotations = p.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations["prometheus.io/port"], "15020");
    let scrape: serde_json::Value =
        serde_json::from_str(env(proxy, "ISTIO_PROMETHEUS_ANNOTATIONS").unwrap()).unwrap();
    assert_eq!(scrape, json!({"port": "9090"}));
}

#[test]
fn proxy_config_comes_from_the_mesh_and_the_annotation_and_hold_puts_the_proxy_first() {
    let mut p = hello();
    p.metadata.annotations = Some(
        [(
            PROXY_CONFIG.to_string(),
            "{holdApplicationUntilProxyStarts: true, concurrency: 2}".to_string(),
        )]
        .into(),
    );
    let mesh = MeshDefaults {
        default_config:
            json!({"concurrency": 4, "drainDuration": "45s", "discoveryAddress": "x:1"})
                .as_object()
                .cloned()
                .unwrap(),
        prometheus_merge: false,
    };
    let mut opts = options();
    opts.native_sidecars = NativeSidecars::Off;
    let p = inject(p, "shop", &opts, &mesh, &NodeVersions::default()).unwrap();
    let spec = p.spec.as_ref().unwrap();
    assert_eq!(spec.containers[0].name, "istio-proxy");
    let post_start = spec.containers[0]
        .lifecycle
        .as_ref()
        .and_then(|l| l.post_start.as_ref());
    let command = post_start
        .and_then(|h| h.exec.as_ref())
        .and_then(|e| e.command.clone());
    assert_eq!(
        command,
        Some(vec!["meshd".into(), "agent".into(), "wait".into()])
    );
    let config: serde_json::Value =
        serde_json::from_str(env(&spec.containers[0], "PROXY_CONFIG").unwrap()).unwrap();
    assert_eq!(
        config,
        json!({"concurrency": 2, "discoveryAddress": "x:1", "holdApplicationUntilProxyStarts": true})
    );
    assert!(
        !p.metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key("prometheus.io/port")
    );

    let mut bad = hello();
    bad.metadata.annotations = Some([(PROXY_CONFIG.to_string(), "[1, 2]".to_string())].into());
    let e = inject(bad, "shop", &opts, &mesh, &NodeVersions::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "annotation proxy.istio.io/config: not an object"
    );
}

#[test]
fn a_pod_injected_before_is_injected_afresh() {
    let mesh = MeshDefaults {
        prometheus_merge: true,
        ..Default::default()
    };
    let mut p = hello();
    p.spec.as_mut().unwrap().containers[0].liveness_probe =
        Some(serde_json::from_value(json!({"httpGet": {"port": 8080}})).unwrap());
    let once = inject(p, "shop", &options(), &mesh, &NodeVersions::default()).unwrap();
    let twice = inject(
        once.clone(),
        "shop",
        &options(),
        &mesh,
        &NodeVersions::default(),
    )
    .unwrap();
    assert_eq!(once, twice);
}

#[test]
fn the_webhooks_path_names_the_cluster_the_network_and_more_environment() {
    let opts = options().for_path("/inject/cluster/east/net/network-1/custom_key/a--slash--b");
    let p = inject(
        hello(),
        "shop",
        &opts,
        &MeshDefaults::default(),
        &NodeVersions::default(),
    )
    .unwrap();
    let proxy = p
        .spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .find(|c| c.name == "istio-proxy")
        .unwrap();
    assert_eq!(env(proxy, "ISTIO_META_CLUSTER_ID"), Some("east"));
    assert_eq!(env(proxy, "ISTIO_META_NETWORK"), Some("network-1"));
    assert_eq!(env(proxy, "CUSTOM_KEY"), Some("a/b"));
    assert_eq!(
        p.metadata.labels.as_ref().unwrap()["topology.istio.io/network"],
        "network-1"
    );
    // A plain path changes nothing.
    let plain = options().for_path("/inject");
    assert_eq!(
        (
            plain.cluster_id.as_str(),
            plain.network,
            plain.path_env.len()
        ),
        ("Kubernetes", None, 0)
    );
}
