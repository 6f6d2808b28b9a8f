//! Gateway: a server's `tls`.

use super::*;

/// A Gateway server's `tls`: meshd serves SIMPLE, MUTUAL and OPTIONAL_MUTUAL from a
/// `credentialName` or from files (which must then all be named, as istiod requires),
/// ISTIO_MUTUAL with the gateway's workload certificate (which takes no other
/// certificate), and forwards PASSTHROUGH and, on TLS ports, AUTO_PASSTHROUGH (elsewhere
/// it is accepted with a warning and gets no listener).
///
/// As istiod's `validateServer`, a plaintext HTTP server may have a `tls` block only for
/// `httpsRedirect` (no mode but PASSTHROUGH, no certificate files), and other servers
/// that are neither HTTPS nor TLS none; `httpsRedirect` elsewhere than on an HTTP server
/// is warned about.
pub(super) fn server_tls(r: &mut Report, field: &str, server: &api::networking::Server) {
    use api::values::{https_redirect, server_tls_field, server_tls_mode};
    let Some(tls) = &server.tls else {
        return;
    };
    let set = |key: &str| server_tls_field(tls, key).is_some();
    let credential = set("credentialName");
    let f = format!("{field}.tls");
    let protocol = server.port.protocol.to_ascii_uppercase();
    let http = matches!(
        protocol.as_str(),
        "HTTP" | "HTTP2" | "GRPC" | "GRPC-WEB" | "HTTP_PROXY"
    );
    if !http && https_redirect(Some(tls)) {
        r.warn(
            format!("{f}.httpsRedirect"),
            "tls.httpsRedirect should only be used with http servers",
        );
    }
    if !matches!(protocol.as_str(), "HTTPS" | "TLS") {
        let passthrough = matches!(
            server_tls_mode(tls).as_str(),
            "PASSTHROUGH" | "AUTO_PASSTHROUGH"
        );
        let files = ["serverCertificate", "privateKey", "caCertificates"];
        if !http {
            r.error(f, "server cannot have TLS settings for non HTTPS/TLS ports");
        } else if !passthrough || files.iter().any(|k| set(k)) {
            r.error(
                f,
                "server cannot have TLS settings for plain text HTTP ports",
            );
        }
        return;
    }
    server_tls_params(r, &f, tls);
    match server_tls_mode(tls).as_str() {
        "PASSTHROUGH" => {}
        "AUTO_PASSTHROUGH" if !server.port.protocol.eq_ignore_ascii_case("TLS") => r.warn(
            format!("{f}.mode"),
            format!("{NOT_APPLIED}: AUTO_PASSTHROUGH on a port of protocol other than TLS"),
        ),
        "AUTO_PASSTHROUGH" => {}
        "ISTIO_MUTUAL" => {
            for key in [
                "serverCertificate",
                "privateKey",
                "caCertificates",
                "credentialName",
            ] {
                if set(key) {
                    r.error(
                        format!("{f}.{key}"),
                        "ISTIO_MUTUAL uses the gateway's workload certificate: set no other",
                    );
                }
            }
        }
        "SIMPLE" | "MUTUAL" | "OPTIONAL_MUTUAL" if credential => {}
        // Files in the gateway's container, served by its agent.
        mode @ ("SIMPLE" | "MUTUAL" | "OPTIONAL_MUTUAL") => {
            for key in ["serverCertificate", "privateKey"] {
                if !set(key) {
                    r.error(format!("{f}.{key}"), "is required without a credentialName");
                }
            }
            if mode != "SIMPLE" && !set("caCertificates") {
                r.error(
                    format!("{f}.caCertificates"),
                    format!("{mode} needs the clients' CA without a credentialName"),
                );
            }
        }
        other => r.warn(format!("{f}.mode"), format!("{NOT_APPLIED}: mode {other}")),
    }
}
