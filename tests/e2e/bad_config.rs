//! Bad input never takes good config away: meshd rejects what it can see is wrong, and
//! Envoy's NACK of what only Envoy rejects leaves traffic on the last good config.

use std::time::Duration;

use crate::gateway::{front_vs, gateway_mesh};
use crate::harness::*;

fn vs_with_regex(name: &str, host: &str, regex: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  hosts: [\"{host}\"]\n  gateways: [web]\n  http:\n  - match: [{{uri: {{regex: \"{regex}\"}}}}]\n    route: [{{destination: {{host: reviews}}}}]\n"
    )
}

#[test]
fn an_invalid_regex_is_rejected_by_meshd_and_the_last_good_route_keeps_serving() {
    let m = gateway_mesh("bad-regex", Ads::Delta, &[("/productpage", "productpage")]);
    let get = |path| http_get(&m.addr, "shop.example.com", path, &[]).unwrap();
    let rds_before = m.meshd.metric("pilot_xds_pushes{type=\"rds\"}");

    // An edit of the live VirtualService that breaks it: the last good version stays.
    let broken = front_vs(&[("/productpage", "reviews")])
        .replace("prefix: /productpage", "regex: \"/(unclosed\"");
    m.meshd.write("front.yaml", &broken);
    wait_until("meshd to report the error", Duration::from_secs(5), || {
        m.meshd
            .metric("meshd_config_errors{kind=\"VirtualService\"}")
            >= 1.0
    });
    let configz = m.meshd.json("/debug/configz");
    let issue = &configz["errors"]["front.yaml"][0];
    assert_eq!(issue["level"], "error");
    assert_eq!(issue["kind"], "VirtualService");
    assert_eq!(issue["name"], "front");
    assert_eq!(issue["field"], "spec.http[0].match[0].uri.regex");
    assert!(
        issue["message"].as_str().unwrap().contains("invalid regex"),
        "{issue}"
    );
    assert!(
        m.meshd.log().contains("spec.http[0].match[0].uri.regex"),
        "the log names the field"
    );
    let front = configz["objects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "front")
        .cloned();
    let front = front.expect("the last good VirtualService stays in the model");
    assert_eq!(
        front["spec"]["http"][0]["match"][0]["uri"]["prefix"],
        "/productpage"
    );
    // Well past the debounce window, so a push (had there been one) would have landed.
    std::thread::sleep(Duration::from_millis(600));
    for _ in 0..10 {
        assert_eq!(
            get("/productpage").body,
            "productpage",
            "the last good route must keep serving"
        );
    }
    assert_eq!(
        m.meshd.metric("pilot_xds_pushes{type=\"rds\"}"),
        rds_before,
        "a rejected edit pushes nothing"
    );

    // Fixing the file applies the fix.
    m.meshd
        .write("front.yaml", &front_vs(&[("/productpage", "reviews")]));
    wait_until("the fix to apply", Duration::from_secs(5), || {
        get("/productpage").body == "reviews"
    });
}

#[test]
fn a_route_envoy_nacks_leaves_traffic_on_the_last_good_config() {
    let m = gateway_mesh("nack", Ads::Delta, &[("/productpage", "productpage")]);
    let get = |host, path| http_get(&m.addr, host, path, &[]).unwrap();
    // Valid RE2, so meshd accepts it, but its program exceeds Envoy's default size limit.
    let greek = "alpha|beta|gamma|delta|epsilon|zeta|eta|theta|iota|kappa|lambda|mu|nu|xi|omicron|pi|rho|sigma|tau";
    m.meshd.write(
        "big.yaml",
        &vs_with_regex("big", "big.example.com", &format!("^/({greek}){{1,20}}$")),
    );
    wait_until("Envoy to NACK the route", Duration::from_secs(5), || {
        m.meshd.metric("pilot_total_xds_rejects{type=\"rds\"}") >= 1.0
    });
    // The seed's NACK-rate metric counts the same rejections.
    assert_eq!(
        m.meshd.metric("pilot_xds_push_errors{type=\"rds\"}"),
        m.meshd.metric("pilot_total_xds_rejects{type=\"rds\"}")
    );
    let sync = m.meshd.syncz(&m.envoy.id);
    let err = sync["types"]["rds"]["last_error"].as_str().unwrap();
    assert!(
        err.contains("program size"),
        "Envoy's error_detail is recorded: {err}"
    );
    for _ in 0..10 {
        assert_eq!(get("shop.example.com", "/productpage").body, "productpage");
    }
    assert_eq!(
        get("big.example.com", "/alpha").status,
        404,
        "the rejected route is not in force"
    );

    // Removing the bad object and changing something else: Envoy accepts the next push.
    std::fs::remove_file(m.meshd.config_dir.join("big.yaml")).unwrap();
    m.meshd.write(
        "front.yaml",
        &front_vs(&[("/productpage", "productpage"), ("/reviews", "reviews")]),
    );
    wait_until(
        "the next good push to apply",
        Duration::from_secs(5),
        || get("shop.example.com", "/reviews").body == "reviews",
    );
    let sync = m.meshd.syncz(&m.envoy.id);
    assert_eq!(
        sync["types"]["rds"]["nonce_sent"],
        sync["types"]["rds"]["nonce_acked"]
    );
}

#[test]
fn malformed_yaml_and_unknown_kinds_never_stop_meshd() {
    let m = gateway_mesh("garbage", Ads::Sotw, &[("/productpage", "productpage")]);
    m.meshd.write(
        "junk.yaml",
        "this: [is not: yaml\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n",
    );
    m.meshd.write("notalist.yaml", "- 1\n- 2\n");
    wait_until("meshd to read the junk", Duration::from_secs(5), || {
        let c = m.meshd.json("/debug/configz");
        c["errors"].get("junk.yaml").is_some() && c["errors"].get("notalist.yaml").is_some()
    });
    let c = m.meshd.json("/debug/configz");
    assert!(
        c["errors"]["junk.yaml"][0]["message"]
            .as_str()
            .unwrap()
            .contains("invalid YAML")
    );
    assert!(
        c["errors"]["junk.yaml"][1]["message"]
            .as_str()
            .unwrap()
            .contains("Deployment")
    );
    assert_eq!(m.meshd.get("/ready").unwrap().status, 200);
    assert_eq!(
        http_get(&m.addr, "x", "/productpage", &[]).unwrap().body,
        "productpage"
    );
}

/// The validation webhook (15017, `/validate`) answers the API server's AdmissionReviews
/// over TLS with meshd's certificate for `istiod.istio-system.svc`: an invalid object is
/// denied naming its field, a valid one allowed, each counted in istiod's metrics; a body
/// that is not JSON, or not sent as JSON, is refused without harm to meshd.
#[test]
fn the_validation_webhook_denies_invalid_objects_as_istiods_does() {
    let dir = temp_dir("webhook").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let meshd = Meshd::start(&dir);
    let root = meshd.root_pem();
    let address = format!("127.0.0.1:{}", meshd.webhook_port);
    let post = |content_type: &str, body: &str| {
        let headers = [("Content-Type", content_type)];
        let sni = "istiod.istio-system.svc";
        https_request(&address, sni, &root, "POST /validate", &headers, body).unwrap()
    };
    let review = |api_version: &str, uid: &str, regex: &str| {
        serde_json::json!({
            "apiVersion": api_version,
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "operation": "CREATE",
                "kind": {"group": "networking.istio.io", "version": "v1", "kind": "VirtualService"},
                "resource": {"group": "networking.istio.io", "version": "v1", "resource": "virtualservices"},
                "namespace": "shop",
                "object": serde_saphyr::from_str::<serde_json::Value>(
                    &vs_with_regex("reviews", "reviews", regex)
                ).unwrap(),
            }
        })
        .to_string()
    };
    let answer = |r: HttpResponse| -> serde_json::Value {
        assert_eq!(r.status, 200, "{r:?}");
        serde_json::from_str(&r.body).unwrap()
    };

    let denied = answer(post(
        "application/json",
        &review("admission.k8s.io/v1", "a-1", "(unclosed"),
    ));
    assert_eq!(denied["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(denied["response"]["uid"], "a-1");
    assert_eq!(denied["response"]["allowed"], false);
    let message = denied["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("configuration is invalid: spec.http[0].match[0].uri.regex: "),
        "{message}"
    );
    let allowed = answer(post(
        "application/json",
        &review("admission.k8s.io/v1beta1", "a-2", "^/ok$"),
    ));
    assert_eq!(allowed["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(
        allowed["response"],
        serde_json::json!({"uid": "a-2", "allowed": true})
    );

    // Garbage is denied, not fatal; a body not sent as JSON is refused with 415.
    let garbage = answer(post("application/json", "\u{0}\u{1}not json"));
    assert_eq!(garbage["response"]["allowed"], false);
    assert_eq!(post("text/yaml", "kind: VirtualService").status, 415);

    let metrics = meshd.get("/metrics").unwrap().body;
    for line in [
        r#"galley_validation_failed{group="networking.istio.io",version="v1",resource="virtualservices",reason="invalid_resource"} 1"#,
        r#"galley_validation_passed{group="networking.istio.io",version="v1",resource="virtualservices"} 1"#,
        r#"galley_validation_http_error{status="415"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} missing from /metrics");
    }
    assert!(meshd.get("/ready").unwrap().status == 200);
}
