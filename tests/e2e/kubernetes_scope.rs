//! Sharding and leadership on the real kube-apiserver: two revisions serving their own
//! namespaces, status written by the leader of a real Lease, and `discoverySelectors`
//! deciding what is kept (see `kubernetes.rs` for the set-up).

use std::time::Duration;

use crate::cluster::{Cluster, Tenant};
use crate::harness::*;
use crate::kubernetes::api_requests;
use crate::test_host::{service_yaml, upstream};

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

/// A revision tag as istioctl makes it (the MutatingWebhookConfiguration
/// `istio-revision-tag-T`, labelled `istio.io/tag=T` and `istio.io/rev=R`): a namespace
/// labelled `istio.io/rev=T`, and config labelled so, are served by the revision the tag
/// points to; moving the tag moves them without relabelling anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revision_tag_serves_its_namespaces_from_the_revision_it_points_to() {
    let t = tokio::task::spawn_blocking(|| Tenant::new("k8s-tags", ""))
        .await
        .unwrap();
    // Tag configurations are cluster-scoped: revisions and the tag are this test's own.
    let (blue, green, tag) = (
        format!("{}-blue", t.app),
        format!("{}-green", t.app),
        format!("{}-prod", t.app),
    );
    let tag_config = {
        let tag = tag.clone();
        move |revision: &str| {
            format!(
                "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nmetadata: {{name: istio-revision-tag-{tag}, labels: {{istio.io/tag: {tag}, istio.io/rev: {revision}}}}}\nwebhooks: []\n"
            )
        }
    };
    let setup = format!(
        "{}---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: shop, labels: {{istio.io/rev: {tag}}}}}\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: tagged, namespace: shop, labels: {{istio.io/rev: {tag}}}}}\nspec:\n  hosts: [tagged]\n  http: [{{route: [{{destination: {{host: tagged}}}}]}}]\n",
        tag_config(&blue)
    );
    let t = std::sync::Arc::new(t);
    let (t2, b, g) = (t.clone(), blue.clone(), green.clone());
    tokio::task::spawn_blocking(move || {
        t2.apply(&setup).unwrap();
        t2.apply(&t2.mesh_configmap(&b, "")).unwrap();
        t2.apply(&t2.mesh_configmap(&g, "")).unwrap();
    })
    .await
    .unwrap();
    let start = |rev: String| {
        let t = t.clone();
        tokio::task::spawn_blocking(move || {
            Meshd::start_tenant(&t, &rev, &["--revision", &rev], &[])
        })
    };
    let blue_meshd = start(blue.clone()).await.unwrap();
    let green_meshd = start(green.clone()).await.unwrap();
    let tagged = |m: &Meshd| {
        m.json("/debug/configz")["objects"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["kind"] == "VirtualService" && o["name"] == "tagged")
    };

    assert!(
        first_answer(&blue_meshd, &t.app).await.is_ok(),
        "the tag's revision serves"
    );
    let refused = first_answer(&green_meshd, &t.app).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(tagged(&blue_meshd) && !tagged(&green_meshd));
    assert_eq!(
        blue_meshd.json("/debug/push_status")["tags"],
        serde_json::json!([tag])
    );

    // The tag moves to green: green takes the namespace and the tagged config, blue lets go.
    let (t2, g) = (t.clone(), green.clone());
    tokio::task::spawn_blocking(move || t2.cluster.apply(&tag_config(&g)).unwrap())
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while first_answer(&green_meshd, &t.app).await.is_err()
        || first_answer(&blue_meshd, &t.app).await.is_ok()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the tag's move was not followed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (b, g) = (blue_meshd, green_meshd);
    let moved = tokio::task::spawn_blocking(move || {
        wait_until(
            "the tagged config to follow the tag",
            Duration::from_secs(10),
            || tagged(&g) && !tagged(&b),
        );
        (b, g)
    });
    let (_b, _g) = moved.await.unwrap();
    let (t2, name) = (t.clone(), format!("istio-revision-tag-{tag}"));
    tokio::task::spawn_blocking(move || {
        t2.cluster.delete("MutatingWebhookConfiguration", "", &name)
    })
    .await
    .unwrap();
}
