//! The simulated proxies' TCP connections, read in large pieces.
//!
//! HTTP/2 (h2) reads its connection one frame at a time: it asks for what the next frame
//! still lacks, 8–16 KB. A simulated proxy receives 1.4 MB of initial configuration on a
//! 1,000-service mesh, so in a connect storm the simulator made ~170 `recvfrom` calls per
//! proxy, and each woke meshd's writer for the few kilobytes it freed. [`ReadAhead`]
//! reads whatever the socket holds, up to [`AHEAD`], and hands h2 its small reads from
//! that; the buffer is released as soon as h2 has taken it all, so an idle connection
//! holds none.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most read from the socket at once.
pub const AHEAD: usize = 256 << 10;

/// `inner`, read ahead into a buffer of at most [`AHEAD`] bytes.
pub struct ReadAhead<T> {
    inner: T,
    /// Read from the socket, not yet taken: `buf[taken..]`.
    buf: Vec<u8>,
    taken: usize,
}

impl<T> ReadAhead<T> {
    pub fn new(inner: T) -> Self {
        ReadAhead {
            inner,
            buf: Vec::new(),
            taken: 0,
        }
    }

    /// Copies what is buffered into `dst`; the buffer is released once all taken.
    fn hand_out(&mut self, dst: &mut ReadBuf<'_>) {
        let n = (self.buf.len() - self.taken).min(dst.remaining());
        dst.put_slice(&self.buf[self.taken..self.taken + n]);
        self.taken += n;
        if self.taken == self.buf.len() {
            self.buf = Vec::new();
            self.taken = 0;
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ReadAhead<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        dst: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.taken < this.buf.len() {
            this.hand_out(dst);
            return Poll::Ready(Ok(()));
        }
        if dst.remaining() >= AHEAD {
            return Pin::new(&mut this.inner).poll_read(cx, dst);
        }
        let mut buf = Vec::with_capacity(AHEAD);
        let mut ahead = ReadBuf::uninit(buf.spare_capacity_mut());
        ready!(Pin::new(&mut this.inner).poll_read(cx, &mut ahead))?;
        let n = ahead.filled().len();
        // SAFETY: the first `n` bytes of `buf`'s spare capacity were filled by the read.
        unsafe { buf.set_len(n) };
        if n > 0 {
            // Nothing is kept at the end of the stream (n = 0).
            this.buf = buf;
            this.taken = 0;
            this.hand_out(dst);
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ReadAhead<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn small_reads_are_served_from_one_large_read_and_the_buffer_is_released() {
        let (near, mut far) = tokio::io::duplex(1 << 20);
        let sent: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        far.write_all(&sent).await.unwrap();
        drop(far);
        let mut r = ReadAhead::new(near);
        let mut got = Vec::new();
        let mut small = [0u8; 9_000];
        // The first small read takes AHEAD bytes from the socket and hands out 9,000.
        let n = r.read(&mut small).await.unwrap();
        assert_eq!(n, small.len());
        got.extend_from_slice(&small[..n]);
        assert_eq!(r.buf.len() - r.taken, AHEAD - n, "read ahead");
        while r.taken < r.buf.len() {
            let n = r.read(&mut small).await.unwrap();
            got.extend_from_slice(&small[..n]);
        }
        assert_eq!(r.buf.capacity(), 0, "released once all taken");
        // A read as large as AHEAD goes straight to the socket.
        let mut large = vec![0u8; AHEAD];
        loop {
            let n = r.read(&mut large).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&large[..n]);
            assert_eq!(r.buf.capacity(), 0);
        }
        assert_eq!(got, sent);
        // At the end of the stream a small read keeps no buffer either.
        assert_eq!(r.read(&mut small).await.unwrap(), 0);
        assert_eq!(r.buf.capacity(), 0);
    }
}
