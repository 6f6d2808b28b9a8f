//! TLS 1.3 records on the secure xDS port once rustls has done the handshake.
//!
//! rustls's connection keeps, for each client, a 4 KB receive buffer that it grows back
//! before every read, ~2.4 KB of state inline and what the handshake left allocated: ~11
//! KB a connected proxy beyond the plaintext port's (BENCHMARKS.md, session 30). After the
//! handshake a TLS 1.3 connection needs only each direction's key, IV and sequence number.
//! So [`accept`] lets rustls do the handshake, takes those from it
//! (`dangerous_extract_secrets`) and drops the rest; [`Records`] then seals what meshd
//! writes and opens what the client sends with ring's AEADs (the ones rustls uses), and
//! keeps bytes between polls only while a record is partial or unsent.
//!
//! During the handshake the socket is read no further than the end of the record rustls
//! is reading ([`Bounded`]). Whatever rustls has already decrypted when it is done is
//! taken from it, and the bytes of a record it has only begun are kept from the socket,
//! so nothing the client sent right behind its Finished is lost.
//!
//! A TLS 1.2 client keeps rustls's connection. KeyUpdates (RFC 8446 §4.6.3) are followed
//! and answered: the next keys derive from each direction's traffic secret, which rustls
//! logs during the handshake to [`TrafficSecrets`] (its `KeyLog`, writing nowhere) and
//! which is kept only if it gives the keys rustls handed over. After 2^24 records under
//! one key this side moves to the next with a KeyUpdate of its own.

mod handshake;
mod keys;

use std::cell::RefCell;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use ring::aead::Aad;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub use handshake::{Bounded, Secure, TrafficSecrets, accept, connect};
use keys::Keys;

const HEADER: usize = 5;
const TAG: usize = 16;
/// The most plaintext in one record (RFC 8446 §5.1).
const MAX_PLAINTEXT: usize = 1 << 14;
/// The longest record a peer may send: 2^14 + 256 bytes after the header (§5.2).
const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
const APPLICATION_DATA: u8 = 23;
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;
/// An alert's description: close_notify.
const CLOSE_NOTIFY: u8 = 0;

/// Plaintext sealed per write to the socket; what the socket does not take is kept.
const SEAL_PER_WRITE: usize = 64 * 1024;
/// What a record adds to its content: the header, the content type and the tag.
const RECORD_OVERHEAD: usize = HEADER + 1 + TAG;
/// Room for one write's records: its plaintext in records of at most 16 KiB, and a
/// KeyUpdate record (a 5-byte message) that may go before them.
const SEALED_CAPACITY: usize = SEAL_PER_WRITE
    + SEAL_PER_WRITE.div_ceil(MAX_PLAINTEXT) * RECORD_OVERHEAD
    + (RECORD_OVERHEAD + 5);
/// Records sealed under one key before the next comes with a KeyUpdate (AES-GCM's
/// confidentiality limit is 2^24.5 records, RFC 8446 §5.5).
const RECORD_LIMIT: u64 = 1 << 24;
/// A KeyUpdate's request_update field.
const UPDATE_NOT_REQUESTED: u8 = 0;
const UPDATE_REQUESTED: u8 = 1;
/// Bytes read from the socket per read.
const READ_CHUNK: usize = 16 * 1024;

thread_local! {
    /// Where records are sealed before they are written: one buffer per worker thread,
    /// so a connection keeps sealed bytes only when the socket did not take them (then it
    /// takes the buffer, and hands it back once it is written).
    static SEALED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The length a record's header (its first five bytes) gives for what follows it.
fn record_length(header: &[u8]) -> usize {
    usize::from(u16::from_be_bytes([header[3], header[4]]))
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// Seals up to `limit` bytes of `bufs` into records of at most 16 KiB, appended to `out`.
/// Returns how many bytes were sealed.
fn seal_slices(
    keys: &mut Keys,
    bufs: &[IoSlice<'_>],
    limit: usize,
    out: &mut Vec<u8>,
) -> io::Result<usize> {
    let total = bufs.iter().map(|b| b.len()).sum::<usize>().min(limit);
    let (mut taken, mut slice, mut offset) = (0, 0, 0);
    while taken < total {
        let mut room = MAX_PLAINTEXT.min(total - taken);
        keys.seal(APPLICATION_DATA, out, |out| {
            while room > 0 {
                let rest = &bufs[slice][offset..];
                let n = rest.len().min(room);
                out.extend_from_slice(&rest[..n]);
                (room, taken, offset) = (room - n, taken + n, offset + n);
                if offset == bufs[slice].len() {
                    (slice, offset) = (slice + 1, 0);
                }
            }
        })?;
    }
    Ok(taken)
}

/// A TLS 1.3 connection after its handshake: see the module docs.
pub struct Records<T> {
    io: T,
    tx: Keys,
    rx: Keys,
    /// This side is the client, which passes over the server's session tickets.
    client: bool,
    /// Received bytes of a record not yet whole.
    received: Vec<u8>,
    /// Opened plaintext the reader has not taken yet, from `plain_at`.
    plain: Vec<u8>,
    plain_at: usize,
    /// Sealed records the socket has not taken yet, from `unsent_at`.
    unsent: Vec<u8>,
    unsent_at: usize,
    /// The peer's close_notify was read.
    read_closed: bool,
    close_notify_sent: bool,
}

impl<T> Records<T> {
    /// Opens the whole records at the start of `data` in place, puts their plaintext into
    /// `buf` (what does not fit into `plain`) and returns the bytes they took. Stops at a
    /// partial record, once `buf` is full, and after the peer's close_notify.
    fn open(&mut self, data: &mut [u8], buf: &mut ReadBuf<'_>) -> io::Result<usize> {
        let mut at = 0;
        while data.len() - at >= HEADER && buf.remaining() > 0 && !self.read_closed {
            let mut header = [0; HEADER];
            header.copy_from_slice(&data[at..at + HEADER]);
            let length = record_length(&header);
            if header[0] != APPLICATION_DATA {
                return Err(invalid(format!(
                    "a TLS record of type {} after the handshake",
                    header[0]
                )));
            }
            if !(TAG + 1..=MAX_CIPHERTEXT).contains(&length) {
                return Err(invalid(format!("a TLS record of {length} bytes")));
            }
            if data.len() - at < HEADER + length {
                break;
            }
            let record = &mut data[at + HEADER..at + HEADER + length];
            at += HEADER + length;
            let nonce = self.rx.next_nonce();
            let plain = (self.rx.aead())
                .open_in_place(nonce, Aad::from(header), record)
                .map_err(|_| {
                    invalid("a TLS record that does not decrypt (bad_record_mac)".into())
                })?;
            // The content type is the last byte that is not padding (RFC 8446 §5.4).
            let end = (plain.iter())
                .rposition(|&b| b != 0)
                .ok_or_else(|| invalid("a TLS record without a content type".into()))?;
            let (content, content_type) = (&plain[..end], plain[end]);
            match content_type {
                APPLICATION_DATA => {
                    let n = content.len().min(buf.remaining());
                    buf.put_slice(&content[..n]);
                    self.plain.extend_from_slice(&content[n..]);
                }
                ALERT if content.get(1) == Some(&CLOSE_NOTIFY) => self.read_closed = true,
                ALERT => {
                    return Err(invalid(format!(
                        "the peer sent TLS alert {:?}",
                        content.get(1)
                    )));
                }
                HANDSHAKE => self.post_handshake(content)?,
                other => {
                    return Err(invalid(format!("a TLS record of content type {other}")));
                }
            }
        }
        Ok(at)
    }

    /// [`Self::open`] on the bytes kept from earlier reads.
    fn open_received(&mut self, buf: &mut ReadBuf<'_>) -> io::Result<()> {
        let mut received = std::mem::take(&mut self.received);
        let used = self.open(&mut received, buf)?;
        if used < received.len() {
            received.drain(..used);
            self.received = received;
        }
        Ok(())
    }

    /// Handshake messages after the handshake: a KeyUpdate moves the receiving side to its
    /// next keys (and, if asked, the sending side too); a client passes over session
    /// tickets; anything else closes the connection.
    fn post_handshake(&mut self, mut messages: &[u8]) -> io::Result<()> {
        while let [kind, a, b, c, rest @ ..] = messages {
            let length = usize::from(*a) << 16 | usize::from(*b) << 8 | usize::from(*c);
            if rest.len() < length {
                break;
            }
            match *kind {
                NEW_SESSION_TICKET if self.client => {}
                KEY_UPDATE if length == 1 => {
                    self.rx = self.rx.next()?;
                    match rest[0] {
                        UPDATE_NOT_REQUESTED => {}
                        // Answered before any more data: the answer joins what is unsent,
                        // which every write sends first.
                        UPDATE_REQUESTED => self.tx.update(&mut self.unsent)?,
                        other => {
                            return Err(invalid(format!("a TLS KeyUpdate requesting {other}")));
                        }
                    }
                }
                kind => {
                    return Err(invalid(format!(
                        "an unexpected TLS handshake message ({kind}) after the handshake"
                    )));
                }
            }
            messages = &rest[length..];
        }
        if messages.is_empty() {
            Ok(())
        } else {
            Err(invalid("a TLS handshake message split over records".into()))
        }
    }
}

impl<T: AsyncWrite + Unpin> Records<T> {
    /// Writes the sealed records the socket did not take before.
    fn poll_send_unsent(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.unsent_at < self.unsent.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.unsent[self.unsent_at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.unsent_at += n;
        }
        if self.unsent.capacity() > 0 {
            let mut unsent = std::mem::take(&mut self.unsent);
            self.unsent_at = 0;
            // Back to the thread's buffer, unless that has room of its own again.
            SEALED.with_borrow_mut(|sealed| {
                if sealed.capacity() < unsent.capacity() {
                    unsent.clear();
                    *sealed = unsent;
                }
            });
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Records<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        loop {
            if this.plain_at < this.plain.len() {
                let n = (this.plain.len() - this.plain_at).min(buf.remaining());
                buf.put_slice(&this.plain[this.plain_at..this.plain_at + n]);
                this.plain_at += n;
                if this.plain_at == this.plain.len() {
                    this.plain = Vec::new();
                    this.plain_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.read_closed || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if whole_record(&this.received) {
                this.open_received(buf)?;
            } else {
                let mut chunk = [MaybeUninit::<u8>::uninit(); READ_CHUNK];
                let mut read = ReadBuf::uninit(&mut chunk);
                ready!(Pin::new(&mut this.io).poll_read(cx, &mut read))?;
                if read.filled().is_empty() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed the TLS connection without close_notify",
                    )));
                }
                if this.received.is_empty() {
                    let data = read.filled_mut();
                    let used = this.open(data, buf)?;
                    this.received.extend_from_slice(&data[used..]);
                } else {
                    this.received.extend_from_slice(read.filled());
                    this.open_received(buf)?;
                }
            }
            if buf.filled().len() > before {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// Whether `data` starts with a whole record (or a header no record can follow, which
/// opening it reports).
fn whole_record(data: &[u8]) -> bool {
    match data.get(..HEADER) {
        Some(header) => {
            let length = record_length(header);
            header[0] != APPLICATION_DATA
                || length > MAX_CIPHERTEXT
                || data.len() >= HEADER + length
        }
        None => false,
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Records<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    /// Seals up to 64 KiB of `bufs` and writes the records once; what the socket does not
    /// take is kept, and the next write waits for it.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_send_unsent(cx))?;
        SEALED.with_borrow_mut(|out| {
            out.clear();
            out.reserve(SEALED_CAPACITY);
            let sealed = seal_slices(&mut this.tx, bufs, SEAL_PER_WRITE, out)?;
            if sealed == 0 {
                return Poll::Ready(Ok(0));
            }
            let written = match Pin::new(&mut this.io).poll_write(cx, out) {
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => 0,
            };
            if written < out.len() {
                // Kept as sealed, without a copy: the thread seals into a new buffer.
                this.unsent = std::mem::take(out);
                this.unsent_at = written;
            }
            Poll::Ready(Ok(sealed))
        })
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send_unsent(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    /// Sends close_notify, then shuts the socket's write side.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.close_notify_sent {
            this.close_notify_sent = true;
            this.tx.seal(ALERT, &mut this.unsent, |out| {
                out.extend_from_slice(&[1, CLOSE_NOTIFY]);
            })?;
        }
        ready!(this.poll_send_unsent(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
