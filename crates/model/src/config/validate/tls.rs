//! TLS versions, cipher suites and curves: MeshConfig `meshMTLS` and `tlsDefaults`, and a
//! Gateway server's `tls`. Names Envoy would not take are dropped on translation
//! (`crate::tls`), so they are warnings, as istiod's; a name Istio's enums lack, or a
//! minimum above the maximum, is an error.

use super::*;
use crate::tls::{KNOWN_ECDH_CURVES, MeshTlsConfig, TlsVersion, valid_cipher_suite};

/// Warns about cipher suites that are unknown or repeated (istiod's `validateTLSOptions`).
fn cipher_suites(r: &mut Report, field: &str, suites: &[String]) {
    let mut unknown = Vec::new();
    let mut repeated = Vec::new();
    for (i, s) in suites.iter().enumerate() {
        if !valid_cipher_suite(s) {
            unknown.push(s.as_str());
        } else if suites[..i].contains(s) {
            repeated.push(s.as_str());
        }
    }
    if !unknown.is_empty() {
        r.warn(
            field,
            format!("ignoring invalid cipher suites: {unknown:?}"),
        );
    }
    if !repeated.is_empty() {
        r.warn(
            field,
            format!("ignoring duplicate cipher suites: {repeated:?}"),
        );
    }
}

/// MeshConfig `meshMTLS` or `tlsDefaults` at `field`.
pub(super) fn mesh_tls(r: &mut Report, field: &str, config: &MeshTlsConfig, mesh_mtls: bool) {
    if let Some(v) = &config.min_protocol_version
        && !matches!(v.as_str(), "TLS_AUTO" | "TLSV1_2" | "TLSV1_3")
    {
        r.error(
            format!("{field}.minProtocolVersion"),
            format!("{v:?} is not TLS_AUTO, TLSV1_2 or TLSV1_3"),
        );
    }
    if let Some(s) = &config.cipher_suites {
        cipher_suites(r, &format!("{field}.cipherSuites"), s);
    }
    let curves = format!("{field}.ecdhCurves");
    if mesh_mtls {
        if !config.ecdh_curves.is_empty() {
            r.error(
                curves,
                "mesh TLS does not support ECDH curves configuration",
            );
        }
        return;
    }
    let unknown: Vec<&str> = (config.ecdh_curves.iter())
        .map(String::as_str)
        .filter(|c| !KNOWN_ECDH_CURVES.contains(c))
        .collect();
    if !unknown.is_empty() {
        r.warn(
            &curves,
            format!("detected unrecognized ECDH curves: {unknown:?}"),
        );
    }
    let repeated =
        (config.ecdh_curves.iter().enumerate()).any(|(i, c)| config.ecdh_curves[..i].contains(c));
    if repeated {
        r.warn(curves, "detected duplicate ECDH curves");
    }
}

/// A Gateway server's `tls` versions and cipher suites, at `field` (`spec.servers[i].tls`).
pub(super) fn server_tls_params(r: &mut Report, field: &str, tls: &api::AnyObject) {
    let version = |r: &mut Report, key: &str| {
        let value = tls.get(key)?;
        let parsed = value.as_str().and_then(TlsVersion::parse);
        if parsed.is_none() {
            r.error(
                format!("{field}.{key}"),
                format!("{value} is not TLS_AUTO, TLSV1_0, TLSV1_1, TLSV1_2 or TLSV1_3"),
            );
        }
        parsed.filter(|v| *v != TlsVersion::Auto)
    };
    let min = version(r, "minProtocolVersion");
    let max = version(r, "maxProtocolVersion");
    if let (Some(min), Some(max)) = (min, max)
        && min > max
    {
        r.error(
            format!("{field}.minProtocolVersion"),
            "is above maxProtocolVersion: Envoy would refuse the listener",
        );
    }
    let suites = crate::tls::server_cipher_suites(tls);
    if matches!(min, Some(TlsVersion::V1_0 | TlsVersion::V1_1)) && suites.is_empty() {
        r.warn(
            format!("{field}.minProtocolVersion"),
            "TLS version below TLSV1_2 require setting compatible ciphers as by default they no longer include compatible ciphers.",
        );
    }
    cipher_suites(r, &format!("{field}.cipherSuites"), &suites);
}
