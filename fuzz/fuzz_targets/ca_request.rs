//! Any bytes as a CreateCertificate request body, handled as the CA handles an
//! authenticated caller's request: decode, verify the CSR, sign or refuse. Never a panic.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use meshd::ca::material::Material;
use meshd::ca::service::pb::IstioCertificateRequest;
use meshd::ca::{CertTtl, CertificateAuthority, Identity};
use prost::Message;

fn ca() -> &'static CertificateAuthority {
    static CA: OnceLock<CertificateAuthority> = OnceLock::new();
    CA.get_or_init(|| {
        let m = Material::self_signed("cluster.local", Duration::from_secs(3600)).unwrap();
        CertificateAuthority::new("cluster.local", CertTtl::default(), m)
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = IstioCertificateRequest::decode(data) {
        let caller = Identity::new("cluster.local", "fuzz", "fuzz");
        let _ = ca().sign_workload(&req.csr, &caller, req.validity_duration);
    }
});
