//! The transport of meshd's gRPC ports, below the services they host: hyper's HTTP/2
//! server with every limit a client can reach set explicitly ([`grpc`]), TLS accept loops
//! on rustls ([`tls`]), a bound on connections accepted and not yet answered
//! ([`admission`]), corked bursts of writes ([`cork`]), and the SPIFFE identities a
//! client certificate proves ([`identity`]). Nothing here knows xDS or the CA.

pub mod admission;
pub mod cork;
pub mod grpc;
pub mod identity;
pub mod plaintext;
pub mod tls;

/// A TCP listener on `address` with the listen backlog Go's `net.Listen` (so istiod's
/// ports) uses: the kernel's `net.core.somaxconn`, where tokio's `bind` asks for 1,024.
/// Connections the accept loops have no [`admission`] ticket for wait in that backlog; a
/// connection the backlog has no room for is refused or reset and retried by its client.
pub fn listen(address: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match address {
        std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    // As tokio's (and Go's) listeners: a restarted server rebinds at once.
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(somaxconn())
}

/// `net.core.somaxconn`, or 4,096 (the kernel's default since Linux 5.4) where it cannot
/// be read.
fn somaxconn() -> u32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn listeners_take_the_kernels_backlog_and_accept() {
        assert!(super::somaxconn() > 0);
        let listener = super::listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let address = listener.local_addr().unwrap();
        let (client, accepted) =
            tokio::join!(tokio::net::TcpStream::connect(address), listener.accept());
        assert_eq!(client.unwrap().local_addr().unwrap(), accepted.unwrap().1);
    }
}
