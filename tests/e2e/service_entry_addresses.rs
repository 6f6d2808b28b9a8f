//! ServiceEntry addresses in a real Envoy with traffic capture: a listener per address and
//! a CIDR's chain matched on the range.
//!
//! IP auto-allocation: ServiceEntries without addresses get some in their status from
//! meshd's leader, and a sidecar whose agent captures DNS knows each host by its address.
//! Its TCP listeners are bound to them, so two TCP ServiceEntries on one port each get a
//! listener of their own. A real Envoy with traffic capture accepts them. A proxy whose
//! agent serves DNS without capturing it, in the same namespace with the same labels, gets
//! its own view, as before.

use std::time::Duration;

use envoy_api::pb::google::protobuf::{Value, value::Kind};

use crate::cluster::Tenant;
use crate::harness::*;

fn entry(name: &str, host: &str, port: u32, protocol: &str, labels: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: shop, labels: {{{labels}}}}}\nspec:\n  hosts: [{host}]\n  ports: [{{number: {port}, name: {protocol}, protocol: {protocol}}}]\n  resolution: DNS\n"
    )
}

/// `host=ip` for each of an entry's `status.addresses`.
fn addresses(t: &Tenant, name: &str) -> Vec<String> {
    let se = t.object("ServiceEntry", name);
    (se["status"]["addresses"].as_array().into_iter().flatten())
        .map(|a| {
            format!(
                "{}={}",
                a["host"].as_str().unwrap(),
                a["value"].as_str().unwrap()
            )
        })
        .collect()
}

/// The listener names of the first delta answer to a sidecar of `namespace` labelled
/// `app: test` (traffic captured) whose agent runs a DNS proxy, capturing DNS or only
/// serving it (`ENABLE_DNS_SERVER`: a name table, but no auto-allocated addresses).
async fn listeners(meshd: &Meshd, namespace: &str, dns_capture: bool) -> Vec<String> {
    let last = u8::from(dns_capture) + 7;
    let mut node = xds_node(
        &format!("sidecar~10.2.0.{last}~client-x.{namespace}~{namespace}.svc.cluster.local"),
        namespace,
    );
    let flag = if dns_capture {
        "DNS_CAPTURE"
    } else {
        "ENABLE_DNS_SERVER"
    };
    let yes = Value {
        kind: Some(Kind::StringValue("true".into())),
    };
    (node.metadata.as_mut().unwrap().fields).insert(flag.to_string(), yes);
    let listener = "type.googleapis.com/envoy.config.listener.v3.Listener";
    let first = first_delta_answer(meshd.plain_channel().await, node, listener, None)
        .await
        .unwrap();
    let mut names: Vec<String> = first.resources.into_iter().map(|r| r.name).collect();
    names.sort();
    names
}

#[test]
fn service_entries_get_addresses_and_dns_capturing_sidecars_are_sent_listeners_for_them() {
    let t = Tenant::new("autoallocate", "");
    t.apply(&entry("api", "api.example.com", 80, "HTTP", ""))
        .unwrap();
    t.apply(&entry("db-a", "db-a.example.com", 3306, "TCP", ""))
        .unwrap();
    t.apply(&entry("db-b", "db-b.example.com", 3306, "TCP", ""))
        .unwrap();
    let opted_out = entry(
        "legacy",
        "legacy.example.com",
        3306,
        "TCP",
        "networking.istio.io/enable-autoallocate-ip: \"false\"",
    );
    t.apply(&opted_out).unwrap();
    let meshd = Meshd::start_tenant(&t, "meshd", &[], &[]);

    // The leader allocates in order of creation, then of name; IPv4 and IPv6 per host.
    wait_until("status.addresses on db-b", Duration::from_secs(20), || {
        !addresses(&t, "db-b").is_empty()
    });
    assert_eq!(
        addresses(&t, "api"),
        ["api.example.com=240.240.0.1", "api.example.com=2001:2::1"]
    );
    assert_eq!(
        addresses(&t, "db-a"),
        ["db-a.example.com=240.240.0.2", "db-a.example.com=2001:2::2"]
    );
    assert_eq!(
        addresses(&t, "db-b"),
        ["db-b.example.com=240.240.0.3", "db-b.example.com=2001:2::3"]
    );
    assert!(addresses(&t, "legacy").is_empty());
    // The Reconciled condition is written beside them, by another field manager.
    wait_until(
        "db-a's Reconciled condition",
        Duration::from_secs(20),
        || t.object("ServiceEntry", "db-a")["status"]["conditions"][0]["type"] == "Reconciled",
    );
    assert_eq!(
        addresses(&t, "db-a").len(),
        2,
        "the condition kept the addresses"
    );

    // Labelled as the scripted clients below are (`xds_node`'s `app: test`).
    let envoy =
        Envoy::captured_sidecar(&meshd, Ads::Delta, &t.app, "test", "DNS_CAPTURE: \"true\"");
    let dump = || envoy.config_dump("dynamic_listeners");
    wait_until("db-b's listener in Envoy", Duration::from_secs(15), || {
        dump().contains("\"240.240.0.3_3306\"")
    });
    let listeners_dump = dump();
    for expected in [
        "\"240.240.0.2_3306\"",
        "outbound|3306||db-a.example.com",
        "outbound|3306||db-b.example.com",
        // The opted-out entry keeps the shared listener.
        "\"0.0.0.0_3306\"",
        "outbound|3306||legacy.example.com",
    ] {
        assert!(
            listeners_dump.contains(expected),
            "{expected}: {listeners_dump}"
        );
    }
    let routes = envoy.config_dump("dynamic_route_configs");
    assert!(
        routes.contains("\"240.240.0.1\""),
        "api's address as a domain: {routes}"
    );
    let rejected = envoy.rejected_updates();
    assert!(rejected.is_empty(), "{rejected:?}");
    // The agent's DNS proxy would answer with the same address.
    let nds = meshd.json(&format!("/debug/ndsz?proxyID={}", envoy.id));
    let table = &nds["configs"][0]["table"];
    assert_eq!(table["db-a.example.com"]["ips"][0], "240.240.0.2", "{nds}");

    // Same namespace and labels, a DNS proxy without DNS capture: the addresses are not
    // used.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let plain = rt.block_on(listeners(&meshd, &t.app, false));
    assert!(plain.contains(&"0.0.0.0_3306".to_string()), "{plain:?}");
    assert!(
        !plain.iter().any(|l| l.starts_with("240.240.")),
        "{plain:?}"
    );
    let capturing = rt.block_on(listeners(&meshd, &t.app, true));
    assert!(
        capturing.contains(&"240.240.0.2_3306".to_string()),
        "{capturing:?}"
    );

    // Opting out clears the entry's addresses, and its listener goes.
    let db_b = entry(
        "db-b",
        "db-b.example.com",
        3306,
        "TCP",
        "networking.istio.io/enable-autoallocate-ip: \"false\"",
    );
    t.apply(&db_b).unwrap();
    wait_until("db-b's addresses cleared", Duration::from_secs(20), || {
        addresses(&t, "db-b").is_empty()
    });
    // Envoy drains a removed listener: it stays in the dump, without an active state.
    let active = || -> Vec<String> {
        let dump: serde_json::Value = serde_json::from_str(&dump()).unwrap();
        (dump["configs"].as_array().into_iter().flatten())
            .filter(|l| !l["active_state"].is_null())
            .map(|l| l["name"].as_str().unwrap().to_string())
            .collect()
    };
    wait_until(
        "db-b's listener gone from Envoy",
        Duration::from_secs(15),
        || !active().contains(&"240.240.0.3_3306".to_string()),
    );
    assert!(active().contains(&"240.240.0.2_3306".to_string()));
}

/// From files, nothing allocates, but addresses a status already holds (as istiod wrote
/// them) are used; with `PILOT_ENABLE_IP_AUTOALLOCATE=false` they are not.
#[test]
fn addresses_istiod_wrote_are_used_unless_auto_allocation_is_off() {
    let dir = temp_dir("autoallocate-files");
    let config = dir.join("config");
    std::fs::create_dir_all(&config).unwrap();
    let with_status = entry("db-a", "db-a.example.com", 3306, "TCP", "")
        + "status:\n  addresses: [{value: 240.240.7.7, host: db-a.example.com}]\n";
    std::fs::write(config.join("db.yaml"), with_status).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let on = Meshd::start(&config);
    let names = rt.block_on(listeners(&on, "shop", true));
    assert!(names.contains(&"240.240.7.7_3306".to_string()), "{names:?}");
    drop(on);
    let off = Meshd::start_with_env(&config, &[], &[("PILOT_ENABLE_IP_AUTOALLOCATE", "false")]);
    let names = rt.block_on(listeners(&off, "shop", true));
    assert!(names.contains(&"0.0.0.0_3306".to_string()), "{names:?}");
    assert!(
        !names.iter().any(|n| n.starts_with("240.240.")),
        "{names:?}"
    );
}

/// Before, a CIDR became a listener address Envoy refused (NACKing every listener), and an
/// entry's addresses after the first had no listener.
#[test]
fn a_captured_envoy_takes_a_listener_per_address_and_a_chain_per_cidr() {
    let dir = temp_dir("se-addresses");
    let config = dir.join("config");
    std::fs::create_dir_all(&config).unwrap();
    let corp = entry("corp", "db.corp.example", 5432, "TCP", "").replace(
        "resolution: DNS",
        "addresses: [10.50.0.8, 192.168.8.0/24, 10.50.0.7/32]\n  resolution: NONE",
    );
    std::fs::write(config.join("corp.yaml"), corp).unwrap();
    let meshd = Meshd::start(&config);
    let envoy = Envoy::captured_sidecar(&meshd, Ads::Delta, "shop", "client", "A: b");
    let dump = || envoy.config_dump("dynamic_listeners");
    wait_until(
        "the entry's listeners in Envoy",
        Duration::from_secs(15),
        || dump().contains("\"10.50.0.7_5432\""),
    );
    let listeners = dump();
    for expected in [
        "\"10.50.0.8_5432\"",
        "\"0.0.0.0_5432\"",
        "\"address_prefix\": \"192.168.8.0\"",
        "outbound|5432||db.corp.example",
    ] {
        assert!(listeners.contains(expected), "{expected}: {listeners}");
    }
    let rejected = envoy.rejected_updates();
    assert!(rejected.is_empty(), "{rejected:?}");
}
