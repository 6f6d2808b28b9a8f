//! The plaintext xDS port's accept loop.

use crate::admission::{Admission, Admitted};
use crate::cork::Corked;

/// The connections accepted on the plaintext xDS port, with `TCP_NODELAY` set as Go (and
/// so istiod), Envoy and meshd's TLS port set it: without it, a small response written
/// while an earlier one is still unacknowledged waits for the proxy's ACK (Nagle). Bursts
/// of writes are [`crate::cork::Corked`], so that a large response still leaves in full segments.
/// Each is accepted once `admission` has a place for it.
pub fn incoming(
    listener: tokio::net::TcpListener,
    admission: Admission,
) -> impl tokio_stream::Stream<Item = std::io::Result<Admitted<Corked<tokio::net::TcpStream>>>> + Unpin
{
    use futures::StreamExt;
    futures::stream::unfold((listener, admission), |(listener, admission)| async move {
        let reserved = admission.reserve().await;
        let accepted = listener.accept().await.map(|(tcp, _)| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!("TCP_NODELAY: {e}");
            }
            Admitted {
                io: Corked::new(tcp),
                ticket: reserved.admit(),
            }
        });
        Some((accepted, (listener, admission)))
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    use super::*;

    #[tokio::test]
    async fn plaintext_connections_are_accepted_with_nodelay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut incoming = super::incoming(listener, Admission::new(1, Default::default()));
        let _client = tokio::net::TcpStream::connect(address).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        assert!(
            accepted.io.get_ref().nodelay().unwrap(),
            "TCP_NODELAY is not set"
        );
    }
}
