//! The transport of meshd's gRPC ports, below the services they host: hyper's HTTP/2
//! server with every limit a client can reach set explicitly ([`grpc`]), TLS accept loops
//! on rustls ([`tls`]), corked bursts of writes ([`cork`]), and the SPIFFE identities a
//! client certificate proves ([`identity`]). Nothing here knows xDS or the CA.

pub mod cork;
pub mod grpc;
pub mod identity;
pub mod plaintext;
pub mod tls;
