//! `meshd loadgen` against a meshd it starts: the simulated fleet initialises, every
//! affected proxy converges on each change, and with Sidecar scoping the proxies of other
//! namespaces are sent nothing. The mesh is served from files, or from the Kubernetes fake.

use serde_json::Value;

use crate::cluster::Cluster;
use crate::harness::{run_meshd, temp_dir};

fn loadgen(name: &str, args: &[&str]) -> Value {
    loadgen_in(&temp_dir(name).join("config"), args, &[])
}

/// Every run ends with a change storm (100 writes over 2 s) and a restart of meshd.
const STORM_THEN_RESTART: [&str; 5] = ["--storm-rate", "50", "--storm-duration", "2s", "--restart"];

/// `env` reaches the meshd the simulator starts.
fn loadgen_in(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Value {
    if !cfg!(feature = "loadgen") {
        panic!(
            "meshd was built without the fleet simulator: run the tests with `--features loadgen`"
        );
    }
    let dir = dir.to_str().expect("a UTF-8 temporary path");
    let all = [
        &["loadgen", "--config-dir", dir, "--spawn-meshd"],
        args,
        &STORM_THEN_RESTART,
    ]
    .concat();
    serde_json::from_slice(&run_meshd(&all, env)).unwrap()
}

fn assert_converged(summary: &Value, changes: usize) {
    assert_eq!(
        summary["connect"]["stream_errors_reconnected"], 0,
        "{summary:#}"
    );
    let reports = summary["changes"].as_array().unwrap();
    assert_eq!(reports.len(), changes, "{summary:#}");
    for r in reports {
        assert!(r["affected"].as_u64().unwrap() > 0, "{r:#}");
        assert_eq!(r["converged"], r["affected"], "{r:#}");
        assert_eq!(r["unaffected_pushed"], 0, "{r:#}");
        assert!(
            r["bytes_per_affected_proxy"].as_f64().unwrap() > 0.0,
            "{r:#}"
        );
    }
    assert!(summary["meshd"]["rss_connected_bytes"].as_f64().unwrap() > 1e6);
}

#[test]
fn a_scoped_delta_fleet_converges_and_other_namespaces_receive_nothing() {
    let s = loadgen(
        "loadgen-scoped",
        &[
            "--proxies",
            "40",
            "--services",
            "40",
            "--namespaces",
            "4",
            "--sidecar-scoped",
            "--change",
            "endpoint",
            "--changes",
            "2",
            "--nack-proxies",
            "2",
            "--warm-proxies",
            "4",
            "--dns-capture",
        ],
    );
    assert_converged(&s, 2);
    // Each proxy asked for its DNS name table and was sent it once; the endpoint changes
    // and the storm changed no name, so none was sent again.
    assert_eq!(s["settings"]["dns_capture"], true);
    let m = &s["meshd"];
    assert_eq!(m["name_tables_sent_connecting"], 40.0, "{m:#}");
    assert_eq!(m["name_tables_sent_after"], 0.0, "{m:#}");
    // One proxy per namespace connected first; memory and connect figures are then
    // those of the 36 others.
    assert_eq!(s["settings"]["warm_proxies"], 4);
    // The simulator, like meshd, runs without transparent huge pages: faulting in and
    // zeroing 2 MiB pages was 43% of the simulator's CPU in a connect storm.
    assert_eq!(s["settings"]["simulator_huge_pages"], false);
    assert_eq!(
        s["connect"]["initial_config_ms"]["count"], 36,
        "{:#}",
        s["connect"]
    );
    let m = &s["meshd"];
    assert!(m["rss_warm_bytes"].as_f64().unwrap() > 1e6, "{m:#}");
    let added = m["rss_per_added_proxy_bytes"].as_f64().unwrap();
    let expected =
        (m["rss_connected_bytes"].as_f64().unwrap() - m["rss_warm_bytes"].as_f64().unwrap()) / 36.0;
    assert!((added - expected).abs() < 1.0, "{m:#}");
    // Scoped to one namespace of four: a quarter of the fleet is affected.
    for r in s["changes"].as_array().unwrap() {
        assert_eq!(r["affected"], 10, "{r:#}");
    }
    // The storm: three services of three namespaces rewritten 100 times. Every proxy of
    // the last-written service's namespace holds its final endpoints, and every connection
    // but the two that NACK routes has ACKed everything.
    let storm = &s["storm"];
    assert_eq!(storm["writes"], 100, "{storm:#}");
    assert_eq!(storm["affected"], 10, "{storm:#}");
    assert_eq!(storm["holding_final_config"], 10, "{storm:#}");
    assert_eq!(storm["connections_not_acked"], 2, "{storm:#}");
    assert!(storm["pushes"].as_f64().unwrap() < 50.0, "{storm:#}");
    // After its first push a proxy holds exactly its view, and later pushes reach it as
    // the difference between two shared views.
    assert!(
        s["meshd"]["push_diffs_by_view"].as_f64().unwrap() > 0.0,
        "{:#}",
        s["meshd"]
    );
    // meshd restarted: every proxy reconnects and holds its configuration again. Delta
    // proxies name the versions they hold, and versions are content hashes that survive
    // a restart, so the new meshd sends them next to nothing.
    let restart = &s["restart"];
    assert_eq!(restart["reconnected"], 40, "{restart:#}");
    let initial = s["connect"]["initial_bytes_per_proxy"].as_f64().unwrap();
    assert!(
        restart["bytes_per_proxy"].as_f64().unwrap() < initial / 4.0,
        "{restart:#} vs {initial} initially"
    );
}

#[test]
fn a_sotw_fleet_with_gateways_converges_on_virtual_service_changes() {
    let s = loadgen(
        "loadgen-sotw",
        &[
            "--proxies",
            "20",
            "--gateways",
            "2",
            "--services",
            "30",
            "--sotw",
            "--change",
            "vs",
            "--changes",
            "2",
        ],
    );
    assert_converged(&s, 2);
    assert_eq!(
        s["meshd"]["proxies_with_identity"], 0,
        "plaintext: no identity"
    );
    assert_eq!(s["changes"][0]["affected"], 20, "every sidecar, no gateway");
    assert_eq!(s["restart"]["reconnected"], 22, "{:#}", s["restart"]);
    assert_eq!(s["connect"]["initial_config_ms"]["count"], 22);
    // A storm of 100 writes to three services: debounced into far fewer pushes, and every
    // proxy ends on the final config, every response ACKed.
    let storm = &s["storm"];
    assert_eq!(storm["writes"], 100, "{storm:#}");
    assert_eq!(storm["holding_final_config"], 20, "{storm:#}");
    assert_eq!(storm["connections_not_acked"], 0, "{storm:#}");
    let pushes = storm["pushes"].as_f64().unwrap();
    assert!((1.0..50.0).contains(&pushes), "{storm:#}");
}

/// With `MESHD_ENABLE_VHDS` a VirtualService change reaches the fleet, sidecars and
/// gateways (the routed services are bound to the ingress Gateway too), as the one
/// virtual host it changed, through the storm and a restart (each reconnecting proxy
/// asks for VHDS again). The fleet connects to the secure port over mutual TLS.
#[test]
fn a_vhds_fleet_converges_on_virtual_service_changes_with_one_virtual_host_each() {
    let s = loadgen_in(
        &temp_dir("loadgen-vhds").join("config"),
        &[
            "--proxies",
            "20",
            "--gateways",
            "2",
            "--gateway-routes",
            "--services",
            "30",
            "--change",
            "vs",
            "--changes",
            "2",
            "--secure",
        ],
        &[("MESHD_ENABLE_VHDS", "true")],
    );
    assert_converged(&s, 2);
    // Over TLS to the secure port: meshd knows every proxy, sidecars and gateways, by
    // the identity its certificate proved (after the restart too).
    assert_eq!(s["meshd"]["proxies_with_identity"], 22, "{:#}", s["meshd"]);
    // The route configuration holding the changed virtual host has 30 of them (16 KB
    // without VHDS), the gateways' `http.80` one per routed service; one virtual host is
    // ~1.3 KB.
    for r in s["changes"].as_array().unwrap() {
        assert_eq!(r["affected"], 22, "20 sidecars and 2 gateways: {r:#}");
        assert_eq!(r["responses_per_affected_proxy"], 1.0, "{r:#}");
        let bytes = r["bytes_per_affected_proxy"].as_f64().unwrap();
        assert!(bytes < 4000.0, "{r:#}");
    }
    let storm = &s["storm"];
    assert_eq!(storm["holding_final_config"], 22, "{storm:#}");
    assert_eq!(storm["connections_not_acked"], 0, "{storm:#}");
    assert_eq!(s["restart"]["reconnected"], 22, "{:#}", s["restart"]);
}

/// The fleet against the test bed's real kube-apiserver (one of this test's own, as the
/// generated mesh names its own namespaces): the mesh and its changes are written through
/// the API, and meshd watches them there.
#[test]
fn a_fleet_served_from_kubernetes_converges_on_changes_applied_through_the_api() {
    let cluster = Cluster::start("loadgen-kubernetes", &[]);
    let dir = temp_dir("loadgen-kubernetes").join("config");
    let s = loadgen_in(
        &dir,
        &[
            "--kubernetes",
            "--kubeconfig",
            cluster.kubeconfig.to_str().unwrap(),
            "--proxies",
            "20",
            "--services",
            "20",
            "--namespaces",
            "2",
            "--sidecar-scoped",
            "--change",
            "vs",
            "--changes",
            "2",
            // Two proxies per connection: the streams go through hyper's HTTP/2 client,
            // which the other fleets (each proxy on a connection of its own, through the
            // simulator's client) do not use.
            "--proxies-per-connection",
            "2",
        ],
        &[],
    );
    assert_eq!(s["settings"]["hyper_client"], true);
    // meshd watched the API: no mesh file was written for it to read.
    let files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(files.is_empty(), "{files:?}");
    // VirtualService changes (the CRD watch) reach the namespace's proxies only.
    assert_converged(&s, 2);
    for r in s["changes"].as_array().unwrap() {
        assert_eq!(r["affected"], 10, "{r:#}");
    }
    // The storm rewrites EndpointSlices through the API; every proxy that sees the last
    // one ends on it, and everything sent is ACKed.
    let storm = &s["storm"];
    assert_eq!(storm["holding_final_config"], 10, "{storm:#}");
    assert_eq!(storm["connections_not_acked"], 0, "{storm:#}");
    // A restarted meshd lists everything again from the API and the fleet converges.
    assert_eq!(s["restart"]["reconnected"], 20, "{:#}", s["restart"]);
}
