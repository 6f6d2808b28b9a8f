//! TLS versions, cipher suites and ECDH curves as Istio's configuration names them, and
//! the parameters each kind of TLS context gets from them, as istiod sets them:
//! - inbound mutual TLS on sidecars: MeshConfig `meshMTLS`, else TLS 1.2 to 1.3 with six
//!   AES-GCM suites;
//! - a Gateway's SIMPLE, MUTUAL and OPTIONAL_MUTUAL servers: MeshConfig `tlsDefaults`,
//!   then the server's own `minProtocolVersion`, `maxProtocolVersion` and `cipherSuites`;
//! - TLS a DestinationRule originates (SIMPLE, MUTUAL): TLS 1.2 to 1.3 with the ciphers
//!   and curves of `tlsDefaults`.

use serde::{Deserialize, Serialize};

use crate::mesh::MeshConfig;

/// A TLS version as Istio's enums name it; `Auto` leaves Envoy's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    #[default]
    Auto,
    V1_0,
    V1_1,
    V1_2,
    V1_3,
}

impl TlsVersion {
    /// `TLS_AUTO`, `TLSV1_0`, `TLSV1_1`, `TLSV1_2` or `TLSV1_3`.
    pub fn parse(name: &str) -> Option<TlsVersion> {
        Some(match name {
            "TLS_AUTO" => TlsVersion::Auto,
            "TLSV1_0" => TlsVersion::V1_0,
            "TLSV1_1" => TlsVersion::V1_1,
            "TLSV1_2" => TlsVersion::V1_2,
            "TLSV1_3" => TlsVersion::V1_3,
            _ => return None,
        })
    }
}

/// MeshConfig `meshMTLS` and `tlsDefaults` (Istio's `MeshConfig.TLSConfig`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct MeshTlsConfig {
    /// `TLS_AUTO`, `TLSV1_2` or `TLSV1_3`.
    pub min_protocol_version: Option<String>,
    /// OpenSSL names. For `meshMTLS`, a list (even empty) replaces istiod's six suites.
    pub cipher_suites: Option<Vec<String>>,
    /// For `tlsDefaults` only: Istio refuses them in `meshMTLS`.
    pub ecdh_curves: Vec<String>,
}

impl MeshTlsConfig {
    /// The minimum version it sets: TLS 1.3 for `TLSV1_3`, TLS 1.2 for any other value
    /// but `TLS_AUTO`, as istiod's `GetMinTLSVersion`.
    fn min_version(&self) -> TlsVersion {
        match self.min_protocol_version.as_deref() {
            None | Some("TLS_AUTO") => TlsVersion::Auto,
            Some("TLSV1_3") => TlsVersion::V1_3,
            Some(_) => TlsVersion::V1_2,
        }
    }
}

/// The suites sidecars accept on inbound mutual TLS over TLS 1.2 unless `meshMTLS`
/// lists its own (istiod's `SupportedCiphers`).
pub const MESH_MTLS_CIPHER_SUITES: [&str; 6] = [
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-GCM-SHA256",
];

/// The cipher suites BoringSSL names, without PSK: what a Gateway's `cipherSuites` may
/// list (istiod's `ValidCipherSuites`).
pub const KNOWN_CIPHER_SUITES: [&str; 15] = [
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
    "ECDHE-ECDSA-AES128-SHA",
    "ECDHE-RSA-AES128-SHA",
    "ECDHE-ECDSA-AES256-SHA",
    "ECDHE-RSA-AES256-SHA",
    "AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-SHA",
    "AES256-SHA",
    "DES-CBC3-SHA",
];

/// The ECDH curves BoringSSL offers (istiod's `ValidECDHCurves`).
pub const KNOWN_ECDH_CURVES: [&str; 7] = [
    "P-224",
    "P-256",
    "P-521",
    "P-384",
    "X25519",
    "X25519Kyber768Draft00",
    "X25519MLKEM768",
];

/// istiod's rule: a known suite, `ALL`, or an expression that starts with an operator
/// (`-`, `+`, `!`, `[`), which is passed on as written.
pub fn valid_cipher_suite(name: &str) -> bool {
    match name.chars().next() {
        None => true,
        Some(c) if !c.is_alphanumeric() => true,
        Some(_) => name == "ALL" || KNOWN_CIPHER_SUITES.contains(&name),
    }
}

/// `names` that pass `valid`, without repeats, in order: Envoy refuses a whole listener
/// for one name it does not know.
fn usable(names: &[String], valid: impl Fn(&str) -> bool) -> Vec<String> {
    let mut usable: Vec<String> = Vec::with_capacity(names.len());
    for n in names {
        if valid(n) && !usable.contains(n) {
            usable.push(n.clone());
        }
    }
    usable
}

/// `suites` without the ones [`valid_cipher_suite`] refuses, empty names and repeats
/// (istiod's `FilterCipherSuites`).
pub fn usable_cipher_suites(suites: &[String]) -> Vec<String> {
    usable(suites, |s| !s.is_empty() && valid_cipher_suite(s))
}

/// `curves` without names BoringSSL does not offer and without repeats.
pub fn usable_ecdh_curves(curves: &[String]) -> Vec<String> {
    usable(curves, |c| KNOWN_ECDH_CURVES.contains(&c))
}

/// The parameters of one TLS context; `Auto` and empty lists leave Envoy's defaults.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TlsParams {
    pub min: TlsVersion,
    pub max: TlsVersion,
    pub cipher_suites: Vec<String>,
    pub ecdh_curves: Vec<String>,
}

impl TlsParams {
    /// Whether every field leaves Envoy's default.
    pub fn is_default(&self) -> bool {
        *self == TlsParams::default()
    }

    /// Inbound mutual TLS on a sidecar (istiod's `BuildInboundTLS`).
    pub fn mesh_inbound(mesh: &MeshConfig) -> TlsParams {
        let config = mesh.mesh_mtls.as_ref();
        let suites = config.and_then(|c| c.cipher_suites.as_deref());
        let min = config.map_or(TlsVersion::Auto, MeshTlsConfig::min_version);
        TlsParams {
            min: if min == TlsVersion::V1_3 {
                TlsVersion::V1_3
            } else {
                TlsVersion::V1_2
            },
            max: TlsVersion::V1_3,
            cipher_suites: match suites {
                Some(s) => usable_cipher_suites(s),
                None => MESH_MTLS_CIPHER_SUITES.map(str::to_string).to_vec(),
            },
            ecdh_curves: Vec::new(),
        }
    }

    /// A Gateway server terminating SIMPLE, MUTUAL or OPTIONAL_MUTUAL TLS: `tlsDefaults`,
    /// then the server's `tls` block (istiod's `applyDownstreamTLSDefaults` and
    /// `applyServerTLSSettings`). Unknown version names leave the default; validation
    /// reports them.
    pub fn gateway_server(mesh: &MeshConfig, tls: &api::AnyObject) -> TlsParams {
        let mut params = TlsParams::default();
        if let Some(d) = &mesh.tls_defaults {
            params.ecdh_curves = usable_ecdh_curves(&d.ecdh_curves);
            params.cipher_suites = usable_cipher_suites(d.cipher_suites.as_deref().unwrap_or(&[]));
            if d.min_version() != TlsVersion::Auto {
                params.min = d.min_version();
            }
        }
        let version = |key: &str| {
            let name = tls.get(key).and_then(|v| v.as_str())?;
            TlsVersion::parse(name).filter(|v| *v != TlsVersion::Auto)
        };
        if let Some(v) = version("minProtocolVersion") {
            params.min = v;
        }
        if let Some(v) = version("maxProtocolVersion") {
            params.max = v;
        }
        let suites = server_cipher_suites(tls);
        if !suites.is_empty() {
            params.cipher_suites = usable_cipher_suites(&suites);
        }
        params
    }

    /// TLS a DestinationRule originates: TLS 1.2 to 1.3, with `tlsDefaults`' ciphers and
    /// curves (istiod's `applyTLSDefaults`).
    pub fn originate(mesh: &MeshConfig) -> TlsParams {
        let defaults = mesh.tls_defaults.as_ref();
        TlsParams {
            min: TlsVersion::V1_2,
            max: TlsVersion::V1_3,
            cipher_suites: (defaults.and_then(|d| d.cipher_suites.as_deref()))
                .map(usable_cipher_suites)
                .unwrap_or_default(),
            ecdh_curves: defaults
                .map(|d| usable_ecdh_curves(&d.ecdh_curves))
                .unwrap_or_default(),
        }
    }
}

/// A Gateway server's `tls.cipherSuites`, as written.
pub fn server_cipher_suites(tls: &api::AnyObject) -> Vec<String> {
    (tls.get("cipherSuites").and_then(|v| v.as_array()))
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh(yaml: &str) -> MeshConfig {
        MeshConfig::parse(yaml).unwrap()
    }

    fn strings(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn inbound_mutual_tls_takes_mesh_mtls_else_the_six_aes_gcm_suites() {
        let default = TlsParams::mesh_inbound(&MeshConfig::default());
        assert_eq!(
            (default.min, default.max),
            (TlsVersion::V1_2, TlsVersion::V1_3)
        );
        assert_eq!(default.cipher_suites.len(), 6);
        assert!(default.cipher_suites.iter().all(|s| s.contains("GCM")));

        let set = TlsParams::mesh_inbound(&mesh(
            "meshMTLS: {minProtocolVersion: TLSV1_3, cipherSuites: [ECDHE-ECDSA-CHACHA20-POLY1305, NOT-A-SUITE]}",
        ));
        assert_eq!(set.min, TlsVersion::V1_3);
        assert_eq!(
            set.cipher_suites,
            strings(&["ECDHE-ECDSA-CHACHA20-POLY1305"])
        );
        // An empty list is a list: Envoy's defaults.
        let empty = TlsParams::mesh_inbound(&mesh("meshMTLS: {cipherSuites: []}"));
        assert!(empty.cipher_suites.is_empty());
    }

    #[test]
    fn a_gateway_server_overrides_tls_defaults_field_by_field() {
        let m = mesh(
            "tlsDefaults: {minProtocolVersion: TLSV1_3, cipherSuites: [AES128-SHA], ecdhCurves: [P-256, P-256, P-999]}",
        );
        let server =
            |json: serde_json::Value| TlsParams::gateway_server(&m, json.as_object().unwrap());
        let plain = server(serde_json::json!({"mode": "SIMPLE"}));
        assert_eq!(plain.min, TlsVersion::V1_3);
        assert_eq!(plain.max, TlsVersion::Auto);
        assert_eq!(plain.cipher_suites, strings(&["AES128-SHA"]));
        assert_eq!(plain.ecdh_curves, strings(&["P-256"]));
        let own = server(serde_json::json!({
            "mode": "SIMPLE", "minProtocolVersion": "TLSV1_2", "maxProtocolVersion": "TLSV1_2",
            "cipherSuites": ["ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256", "-AES128-SHA"],
        }));
        assert_eq!((own.min, own.max), (TlsVersion::V1_2, TlsVersion::V1_2));
        assert_eq!(
            own.cipher_suites,
            strings(&["ECDHE-RSA-AES128-GCM-SHA256", "-AES128-SHA"])
        );
        assert!(
            TlsParams::gateway_server(&MeshConfig::default(), &serde_json::Map::new()).is_default()
        );
    }

    #[test]
    fn originated_tls_takes_only_the_defaults_ciphers_and_curves() {
        let m = mesh(
            "tlsDefaults: {minProtocolVersion: TLSV1_3, cipherSuites: [AES256-SHA], ecdhCurves: [X25519]}",
        );
        let p = TlsParams::originate(&m);
        assert_eq!((p.min, p.max), (TlsVersion::V1_2, TlsVersion::V1_3));
        assert_eq!(p.cipher_suites, strings(&["AES256-SHA"]));
        assert_eq!(p.ecdh_curves, strings(&["X25519"]));
    }
}
