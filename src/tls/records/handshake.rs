//! The hand-over from rustls's handshake to [`Records`]: the socket read one record at a
//! time while rustls handshakes, the traffic secrets rustls logs, and what rustls already
//! read when it is done.

use std::cell::RefCell;
use std::io::{self, IoSlice, Read};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use rustls::ProtocolVersion;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::keys::Keys;
use super::{HEADER, Records, record_length};
use crate::ca::Identity;
use crate::http2::PeerIdentities;

/// The socket during a handshake: each read stops at the end of the record it is in, so
/// rustls never reads past the handshake's last record without decrypting what it read.
/// The bytes of the record being read are kept until it is whole.
pub struct Bounded<T> {
    io: T,
    /// The record being read, as far as it was read.
    pub(super) record: Vec<u8>,
    /// Reads no longer stop at records (a TLS 1.2 connection kept by rustls).
    unbounded: bool,
}

impl<T> Bounded<T> {
    pub fn new(io: T) -> Bounded<T> {
        Bounded {
            io,
            record: Vec::new(),
            unbounded: false,
        }
    }

    /// How much more of the current record there is to read.
    fn left(&self) -> usize {
        match self.record.get(..HEADER) {
            Some(header) => HEADER + record_length(header) - self.record.len(),
            None => HEADER - self.record.len(),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Bounded<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.unbounded {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        let mut part = buf.take(this.left());
        ready!(Pin::new(&mut this.io).poll_read(cx, &mut part))?;
        let n = part.filled().len();
        this.record.extend_from_slice(part.filled());
        if this.left() == 0 {
            this.record.clear();
        }
        // SAFETY: the read initialised and filled the first `n` bytes of `part`, which are
        // the first `n` unfilled bytes of `buf`.
        unsafe { buf.assume_init(n) };
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Bounded<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A connection's TLS 1.3 traffic secrets, as rustls logs them during its handshake.
#[derive(Default)]
struct Captured {
    client: Option<Vec<u8>>,
    server: Option<Vec<u8>>,
}

thread_local! {
    /// The secrets of the handshake being polled on this thread ([`Capturing`]).
    static CAPTURING: RefCell<Option<Captured>> = const { RefCell::new(None) };
}

/// A rustls `KeyLog` (a config's `key_log`) that hands each TLS 1.3 connection's traffic
/// secrets to its own record layer, so that it can derive the keys after a KeyUpdate. It
/// writes nothing anywhere: outside a handshake polled by [`accept`] or [`connect`] it
/// drops what it is given.
#[derive(Debug)]
pub struct TrafficSecrets;

const CLIENT_TRAFFIC_SECRET: &str = "CLIENT_TRAFFIC_SECRET_0";
const SERVER_TRAFFIC_SECRET: &str = "SERVER_TRAFFIC_SECRET_0";

impl rustls::KeyLog for TrafficSecrets {
    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        CAPTURING.with_borrow_mut(|captured| {
            let Some(captured) = captured else { return };
            match label {
                CLIENT_TRAFFIC_SECRET => captured.client = Some(secret.to_vec()),
                SERVER_TRAFFIC_SECRET => captured.server = Some(secret.to_vec()),
                _ => {}
            }
        });
    }

    fn will_log(&self, label: &str) -> bool {
        matches!(label, CLIENT_TRAFFIC_SECRET | SERVER_TRAFFIC_SECRET)
    }
}

/// A handshake polled with this thread's [`CAPTURING`] holding its own secrets; rustls
/// logs them synchronously within the poll.
struct Capturing<F> {
    handshake: F,
    captured: Captured,
}

impl<F: Future + Unpin> Future for Capturing<F> {
    type Output = (F::Output, Captured);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let mine = std::mem::take(&mut this.captured);
        let outer = CAPTURING.with_borrow_mut(|slot| slot.replace(mine));
        let polled = Pin::new(&mut this.handshake).poll(cx);
        let mine = CAPTURING.with_borrow_mut(|slot| std::mem::replace(slot, outer));
        this.captured = mine.unwrap_or_default();
        polled.map(|output| (output, std::mem::take(&mut this.captured)))
    }
}

fn capturing<F: Future + Unpin>(handshake: F) -> Capturing<F> {
    Capturing {
        handshake,
        captured: Captured::default(),
    }
}

/// A connection of the secure port after its handshake: TLS 1.3 on [`Records`], an older
/// version on rustls's own connection; with the identities the client's certificate names.
pub struct Secure<T> {
    inner: Inner<T>,
    peer: Option<PeerIdentities>,
}

// Nearly every connection is on records (every TLS 1.3 client): boxing them instead would
// add an allocation to each and save nothing.
#[allow(clippy::large_enum_variant)]
enum Inner<T> {
    Records(Records<T>),
    Rustls(Box<tokio_rustls::server::TlsStream<Bounded<T>>>),
}

impl<T> Secure<T> {
    /// The SPIFFE identities the client's certificate names (its chain was verified in the
    /// handshake; the certificate is not kept).
    pub fn peer(&self) -> Option<PeerIdentities> {
        self.peer.clone()
    }

    /// Whether the connection runs on meshd's record layer (TLS 1.3).
    pub fn is_records(&self) -> bool {
        matches!(self.inner, Inner::Records(_))
    }
}

/// The TLS handshake of an accepted connection with `config` (which must allow secret
/// extraction), and the connection it leaves.
pub async fn accept<T: AsyncRead + AsyncWrite + Unpin>(
    io: T,
    config: Arc<rustls::ServerConfig>,
) -> io::Result<Secure<T>> {
    let accept = tokio_rustls::TlsAcceptor::from(config).accept(Bounded::new(io));
    let (tls, captured) = capturing(accept).await;
    let mut tls = tls?;
    let (_, conn) = tls.get_ref();
    let peer = (conn.peer_certificates())
        .and_then(|chain| chain.first())
        .map(|leaf| PeerIdentities(Identity::from_certificate_der(leaf).into()));
    if conn.protocol_version() != Some(ProtocolVersion::TLSv1_3) {
        tls.get_mut().0.unbounded = true;
        let inner = Inner::Rustls(Box::new(tls));
        return Ok(Secure { inner, peer });
    }
    let (bounded, conn) = tls.into_inner();
    let records = after_handshake(bounded, conn, false, captured, |conn| {
        conn.dangerous_extract_secrets()
    })?;
    Ok(Secure {
        inner: Inner::Records(records),
        peer,
    })
}

/// The records of a connection whose handshake just ended: with the plaintext rustls
/// already decrypted, the start of a record it only began to read, the traffic secrets it
/// logged, and the keys `extract` takes from it.
fn after_handshake<T, C, D>(
    bounded: Bounded<T>,
    mut conn: C,
    client: bool,
    captured: Captured,
    extract: impl FnOnce(C) -> Result<rustls::ExtractedSecrets, rustls::Error>,
) -> io::Result<Records<T>>
where
    C: std::ops::DerefMut<Target = rustls::ConnectionCommon<D>>,
{
    let mut plain = Vec::new();
    let mut read_closed = false;
    let mut chunk = [0; 4096];
    loop {
        match conn.reader().read(&mut chunk) {
            Ok(0) => {
                read_closed = true;
                break;
            }
            Ok(n) => plain.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    // The record buffer keeps the capacity of the largest handshake record; only a
    // begun record is worth keeping.
    let received = if bounded.record.is_empty() {
        Vec::new()
    } else {
        bounded.record
    };
    let secrets = extract(conn).map_err(io::Error::other)?;
    let (client_secret, server_secret) = (captured.client, captured.server);
    let (tx, rx) = if client {
        (client_secret, server_secret)
    } else {
        (server_secret, client_secret)
    };
    Ok(Records {
        io: bounded.io,
        tx: Keys::new(&secrets.tx.1, secrets.tx.0, tx.as_deref())?,
        rx: Keys::new(&secrets.rx.1, secrets.rx.0, rx.as_deref())?,
        client,
        received,
        plain,
        plain_at: 0,
        unsent: Vec::new(),
        unsent_at: 0,
        read_closed,
        close_notify_sent: false,
    })
}

/// A client's TLS handshake to `server` over `io`, on [`Records`] once it is done (the
/// simulator's proxies: its config must allow secret extraction and offer only TLS 1.3).
pub async fn connect<T: AsyncRead + AsyncWrite + Unpin>(
    io: T,
    connector: &tokio_rustls::TlsConnector,
    server: rustls::pki_types::ServerName<'static>,
) -> io::Result<Records<T>> {
    let (tls, captured) = capturing(connector.connect(server, Bounded::new(io))).await;
    let (bounded, conn) = tls?.into_inner();
    if conn.protocol_version() != Some(ProtocolVersion::TLSv1_3) {
        return Err(io::Error::other(
            "the server chose a TLS version before 1.3, which records do not speak",
        ));
    }
    after_handshake(bounded, conn, true, captured, |conn| {
        conn.dangerous_extract_secrets()
    })
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for Secure<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Records(io) => Pin::new(io).poll_read(cx, buf),
            Inner::Rustls(io) => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Secure<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().inner {
            Inner::Records(io) => Pin::new(io).poll_write(cx, buf),
            Inner::Rustls(io) => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().inner {
            Inner::Records(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Inner::Rustls(io) => Pin::new(io.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Records(io) => Pin::new(io).poll_flush(cx),
            Inner::Rustls(io) => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Records(io) => Pin::new(io).poll_shutdown(cx),
            Inner::Rustls(io) => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }
}
