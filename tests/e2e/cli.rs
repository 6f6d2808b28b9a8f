//! The `meshd` command line: `validate` like `istioctl validate`, `crds` matching `crds/`.

use std::path::Path;
use std::process::Command;

use crate::harness::temp_dir;

fn meshd(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_meshd"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn validate_accepts_the_shipped_example() {
    let out = meshd(&[
        "validate",
        "-f",
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/bookinfo"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("valid"));
}

#[test]
fn validate_names_the_file_object_and_field_and_exits_non_zero() {
    let dir = temp_dir("validate");
    let file = dir.join("bad.yaml");
    std::fs::write(
        &file,
        "apiVersion: networking.istio.io/v1beta1\nkind: VirtualService\nmetadata: {name: reviews, namespace: shop}\nspec:\n  hosts: [reviews]\n  http:\n  - match: [{uri: {regex: \"(\"}}]\n    route: [{destination: {host: reviews}}]\n",
    )
    .unwrap();
    let out = meshd(&["validate", "-f", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.yaml (document 0): VirtualService shop/reviews: spec.http[0].match[0].uri.regex: invalid regex"), "{err}");
}

#[test]
fn crds_prints_what_is_committed() {
    for (args, file) in [
        (&["crds"][..], "istio.yaml"),
        (&["crds", "--operator"][..], "operator.yaml"),
    ] {
        let out = meshd(args);
        assert!(out.status.success());
        let committed = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("crds")
                .join(file),
        )
        .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), committed, "{file}");
    }
}

#[test]
fn pilot_cert_provider_istiod_is_honoured_and_the_others_refused_at_start() {
    let dir = temp_dir("cert-provider");
    let config = dir.join("config");
    std::fs::create_dir_all(&config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_meshd"))
        .env("PILOT_CERT_PROVIDER", "kubernetes")
        .args(["serve", "--config-dir", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("PILOT_CERT_PROVIDER=\"kubernetes\" is not supported"),
        "{err}"
    );
    // istiod's value starts as the default does.
    let meshd =
        crate::harness::Meshd::start_with_env(&config, &[], &[("PILOT_CERT_PROVIDER", "istiod")]);
    assert_eq!(meshd.get("/ready").unwrap().status, 200);
}
