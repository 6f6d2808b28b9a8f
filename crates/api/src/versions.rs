//! The apiVersions each API group is served at, as Istio serves them.

/// apiVersions served for `networking.istio.io` kinds (the first is stored).
pub const NETWORKING_VERSIONS: &[&str] = &["v1", "v1beta1", "v1alpha3"];
/// apiVersions served for `security.istio.io` kinds (the first is stored).
pub const SECURITY_VERSIONS: &[&str] = &["v1", "v1beta1"];
/// apiVersions served for `telemetry.istio.io` kinds (the first is stored).
pub const TELEMETRY_VERSIONS: &[&str] = &["v1", "v1alpha1"];
