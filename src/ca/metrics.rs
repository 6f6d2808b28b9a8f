//! The CA's metrics, with Citadel's names (`citadel_server_*`) and meshd's refusals.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::metrics::{Labels, unix_seconds};

#[derive(Clone, Default)]
pub struct CaMetrics {
    pub csr_count: Counter,
    pub cert_issued: Counter,
    pub auth_failures: Counter,
    /// Certificate requests refused, by meshd's reason.
    pub errors: Family<Labels, Counter>,
    /// Refusals for a CSR that does not parse or verify (istiod's parsing errors).
    pub csr_parsing_errors: Counter,
    /// Signing failures, by `error` (meshd's reason).
    pub csr_sign_errors: Family<Labels, Counter>,
    /// When the current root and the signing certificate expire, Unix seconds (0: no CA).
    pub root_cert_expiry: Gauge,
    pub cert_chain_expiry: Gauge,
    /// Seconds until the root expires, as of the last scrape ([`CaMetrics::refresh`]).
    pub root_cert_expiry_seconds: Gauge,
}

impl CaMetrics {
    pub fn register(registry: &mut Registry) -> CaMetrics {
        let m = CaMetrics::default();
        let r = registry;
        r.register(
            "citadel_server_csr_count",
            "The number of CSRs received by Citadel server",
            m.csr_count.clone(),
        );
        r.register(
            "citadel_server_success_cert_issuance_count",
            "The number of certificates issuances that have succeeded",
            m.cert_issued.clone(),
        );
        r.register(
            "citadel_server_authentication_failure_count",
            "The number of authentication failures",
            m.auth_failures.clone(),
        );
        r.register(
            "meshd_ca_errors",
            "Certificate requests refused, by reason",
            m.errors.clone(),
        );
        r.register(
            "citadel_server_csr_parsing_err_count",
            "The number of errors occurred when parsing the CSR",
            m.csr_parsing_errors.clone(),
        );
        r.register(
            "citadel_server_csr_sign_err_count",
            "The number of errors occurred when signing the CSR",
            m.csr_sign_errors.clone(),
        );
        r.register(
            "citadel_server_root_cert_expiry_timestamp",
            "The unix timestamp, in seconds, when the root cert will expire",
            m.root_cert_expiry.clone(),
        );
        r.register(
            "citadel_server_root_cert_expiry_seconds",
            "The time remaining, in seconds, before the root cert will expire",
            m.root_cert_expiry_seconds.clone(),
        );
        r.register(
            "citadel_server_cert_chain_expiry_timestamp",
            "The unix timestamp, in seconds, when the CA's signing cert chain will expire",
            m.cert_chain_expiry.clone(),
        );
        m
    }

    /// Derives the seconds left on the root from its expiry, as istiod does at each scrape.
    pub fn refresh(&self) {
        let expiry = self.root_cert_expiry.get();
        if expiry != 0 {
            let now = unix_seconds(std::time::SystemTime::now());
            self.root_cert_expiry_seconds.set(expiry - now);
        }
    }
}
