//! A service port's protocol, as Istio infers it from the port's name or appProtocol.

use super::*;

/// Protocol of a service port, from its name prefix or appProtocol, as Istio infers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Protocol {
    Http,
    Http2,
    Grpc,
    Https,
    Tls,
    Tcp,
    /// A port whose name and appProtocol name no protocol: its traffic is sniffed, as
    /// Istio sniffs it (HTTP on one filter chain, anything else on another).
    Unknown,
}

impl Protocol {
    pub fn parse(name: &str) -> Protocol {
        let prefix = name.split('-').next().unwrap_or("").to_ascii_lowercase();
        match prefix.as_str() {
            "http" => Protocol::Http,
            "http2" => Protocol::Http2,
            "grpc" | "grpc-web" => Protocol::Grpc,
            "https" => Protocol::Https,
            "tls" => Protocol::Tls,
            "tcp" | "mongo" | "mysql" | "redis" => Protocol::Tcp,
            _ => Protocol::Unknown,
        }
    }

    pub fn is_http(self) -> bool {
        matches!(
            self,
            Protocol::Http | Protocol::Http2 | Protocol::Grpc | Protocol::Unknown
        )
    }

    pub fn is_http2(self) -> bool {
        matches!(self, Protocol::Http2 | Protocol::Grpc)
    }
}
