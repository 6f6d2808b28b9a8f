//! SPIFFE workload identities: `spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT`.

use std::fmt;

use x509_cert::Certificate;
use x509_cert::der::Decode;
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::ext::pkix::name::GeneralName;

/// One workload identity, as Istio writes it in a certificate's URI SAN.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    pub trust_domain: String,
    pub namespace: String,
    pub service_account: String,
}

impl Identity {
    pub fn new(trust_domain: &str, namespace: &str, service_account: &str) -> Identity {
        Identity {
            trust_domain: trust_domain.to_string(),
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
        }
    }

    /// Parses `spiffe://TD/ns/NS/sa/SA`.
    pub fn parse(uri: &str) -> Option<Identity> {
        let rest = uri.strip_prefix("spiffe://")?;
        let mut parts = rest.split('/');
        match (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) {
            (Some(td), Some("ns"), Some(ns), Some("sa"), Some(sa), None)
                if !td.is_empty() && !ns.is_empty() && !sa.is_empty() =>
            {
                Some(Identity::new(td, ns, sa))
            }
            _ => None,
        }
    }

    /// The identity a Kubernetes service-account username names
    /// (`system:serviceaccount:NS:SA`).
    pub fn from_service_account_user(trust_domain: &str, user: &str) -> Option<Identity> {
        let rest = user.strip_prefix("system:serviceaccount:")?;
        let (ns, sa) = rest.split_once(':')?;
        (!ns.is_empty() && !sa.is_empty() && !sa.contains(':'))
            .then(|| Identity::new(trust_domain, ns, sa))
    }

    /// The URI SANs of a DER certificate that parse as SPIFFE identities.
    pub fn from_certificate_der(der: &[u8]) -> Vec<Identity> {
        let Ok(cert) = Certificate::from_der(der) else {
            return Vec::new();
        };
        uri_sans(&cert)
            .iter()
            .filter_map(|u| Identity::parse(u))
            .collect()
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

/// Every URI in a certificate's subjectAltName.
pub fn uri_sans(cert: &Certificate) -> Vec<String> {
    cert.tbs_certificate()
        .filter_extensions::<SubjectAltName>()
        .filter_map(Result::ok)
        .flat_map(|(_, san)| san.0)
        .filter_map(|name| match name {
            GeneralName::UniformResourceIdentifier(uri) => Some(uri.to_string()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spiffe_ids_round_trip_and_malformed_ones_are_refused() {
        let id = Identity::parse("spiffe://cluster.local/ns/shop/sa/reviews").unwrap();
        assert_eq!(id, Identity::new("cluster.local", "shop", "reviews"));
        assert_eq!(id.to_string(), "spiffe://cluster.local/ns/shop/sa/reviews");
        for bad in [
            "spiffe://cluster.local/ns/shop",
            "spiffe://cluster.local/ns//sa/x",
            "spiffe:///ns/a/sa/b",
            "https://cluster.local/ns/a/sa/b",
            "spiffe://td/ns/a/sa/b/extra",
        ] {
            assert_eq!(Identity::parse(bad), None, "{bad}");
        }
        assert_eq!(
            Identity::from_service_account_user("td", "system:serviceaccount:shop:reviews"),
            Some(Identity::new("td", "shop", "reviews"))
        );
        assert_eq!(Identity::from_service_account_user("td", "admin"), None);
    }
}
