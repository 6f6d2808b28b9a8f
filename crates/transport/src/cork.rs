//! Corked bursts on xDS connections.
//!
//! HTTP/2 sends a response as DATA frames of at most 16 KiB (what Envoy accepts), and h2
//! writes and flushes each frame on its own. With `TCP_NODELAY` every frame then leaves
//! as its own TCP segment: a 557 KB route configuration is 35 `writev`s and 35 segments,
//! each one taken through the kernel's transmit path and each one waking the proxy.
//!
//! [`Corked`] sets `TCP_CORK` on the socket from the second write of a burst, so the
//! kernel sends full-sized segments while the burst is written, and takes it off when the
//! burst has ended. A burst ends with the connection task's poll: h2 writes frames at the
//! end of a poll, after reading, and a flush while corked wakes the task, so the next
//! poll comes at once and its first read releases the cork (the kernel then sends the
//! rest). A single write (an endpoint update, an ACK-sized frame) is never corked and
//! leaves as before. Should a connection stop reading while corked (its peer gone), Linux
//! sends the corked rest after 200 ms at the latest; shutdown uncorks too.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// An accepted connection whose bursts of writes are corked (see the module docs).
pub struct Corked<T> {
    io: T,
    /// Writes since the connection task last read.
    writes: u32,
    corked: bool,
}

impl<T: AsRawFd> Corked<T> {
    pub fn new(io: T) -> Self {
        Corked {
            io,
            writes: 0,
            corked: false,
        }
    }

    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// A write: the second of a burst corks the socket.
    fn wrote(&mut self) {
        self.writes = self.writes.saturating_add(1);
        if self.writes == 2 && !self.corked {
            self.corked = set_cork(self.io.as_raw_fd(), true).is_ok();
        }
    }

    /// The burst has ended: uncorking sends what is left of it.
    fn burst_ended(&mut self) {
        self.writes = 0;
        if self.corked {
            self.corked = false;
            if let Err(e) = set_cork(self.io.as_raw_fd(), false) {
                tracing::debug!("TCP_CORK off failed: {e}");
            }
        }
    }
}

fn set_cork(fd: RawFd, on: bool) -> io::Result<()> {
    let value: libc::c_int = on.into();
    // SAFETY: `fd` is the open socket this connection owns, and `value` is a c_int that
    // lives across the call, as setsockopt(2) requires for TCP_CORK.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CORK,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl<T: AsRawFd + AsyncRead + Unpin> AsyncRead for Corked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // A read starts a new poll of the connection: the writes of the last one are done.
        self.burst_ended();
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsRawFd + AsyncWrite + Unpin> AsyncWrite for Corked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.wrote();
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.wrote();
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.corked {
            // The next poll's read uncorks: make sure there is one.
            cx.waker().wake_by_ref();
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.burst_ended();
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    fn is_corked(fd: RawFd) -> bool {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `fd` is an open socket; `value` and `len` outlive the call.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_CORK,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "getsockopt: {}", io::Error::last_os_error());
        value != 0
    }

    /// Counts the wakes of the task it stands for.
    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    async fn pair() -> (Corked<TcpStream>, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(client, listener.accept());
        let server = accepted.unwrap().0;
        server.set_nodelay(true).unwrap();
        (Corked::new(server), client.unwrap())
    }

    #[tokio::test]
    async fn a_burst_is_corked_from_its_second_write_until_the_next_read() {
        let (mut server, mut client) = pair().await;
        let fd = server.get_ref().as_raw_fd();
        let wakes = Arc::new(Wakes::default());
        let waker = std::task::Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let frame = [7u8; 16 << 10];

        // One write, as an endpoint update: not corked, and its flush wakes nobody.
        assert!(Pin::new(&mut server).poll_write(&mut cx, &frame).is_ready());
        assert!(Pin::new(&mut server).poll_flush(&mut cx).is_ready());
        assert!(!is_corked(fd), "a single write was corked");
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0);

        // A second write in the same burst corks; its flush asks for another poll.
        assert!(Pin::new(&mut server).poll_write(&mut cx, &frame).is_ready());
        assert!(is_corked(fd), "the second write of a burst was not corked");
        assert!(Pin::new(&mut server).poll_flush(&mut cx).is_ready());
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            1,
            "a corked flush must wake"
        );

        // The next poll reads first: that uncorks, and everything reaches the peer.
        let mut none = [0u8; 1];
        let mut read = ReadBuf::new(&mut none);
        assert!(
            Pin::new(&mut server)
                .poll_read(&mut cx, &mut read)
                .is_pending()
        );
        assert!(!is_corked(fd), "a read did not uncork");
        let mut got = vec![0u8; 2 * frame.len()];
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            client.read_exact(&mut got),
        )
        .await
        .expect("the corked tail was not sent")
        .unwrap();
        assert!(got.iter().all(|b| *b == 7));
    }

    #[tokio::test]
    async fn shutdown_uncorks_and_sends_everything() {
        let (mut server, mut client) = pair().await;
        let fd = server.get_ref().as_raw_fd();
        server.write_all(b"first ").await.unwrap();
        server.write_all(b"second").await.unwrap();
        assert!(is_corked(fd));
        server.shutdown().await.unwrap();
        assert!(!is_corked(fd));
        let mut got = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            client.read_to_end(&mut got),
        )
        .await
        .expect("the stream did not end")
        .unwrap();
        assert_eq!(got, b"first second");
    }
}
