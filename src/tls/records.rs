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

use std::cell::RefCell;
use std::io::{self, IoSlice, Read};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::hkdf;
use rustls::{ConnectionTrafficSecrets, ProtocolVersion};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::http2::PeerCertificates;

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
    /// so a connection keeps sealed bytes only when the socket did not take them.
    static SEALED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// A direction's traffic secret, from which its keys derive and the next secret after a
/// KeyUpdate (RFC 8446 §7.2, §7.3).
#[derive(Clone)]
struct TrafficSecret {
    aead: &'static aead::Algorithm,
    hash: hkdf::Algorithm,
    bytes: [u8; 48],
    len: usize,
}

impl TrafficSecret {
    fn new(
        aead: &'static aead::Algorithm,
        hash: hkdf::Algorithm,
        secret: &[u8],
    ) -> Option<TrafficSecret> {
        let mut bytes = [0; 48];
        (secret.len() == hkdf::KeyType::len(&hash)).then_some(())?;
        bytes.get_mut(..secret.len())?.copy_from_slice(secret);
        Some(TrafficSecret {
            aead,
            hash,
            bytes,
            len: secret.len(),
        })
    }

    /// HKDF-Expand-Label(secret, label, "", out.len()) (RFC 8446 §7.1).
    fn expand(&self, label: &[u8], out: &mut [u8]) {
        struct Len(usize);
        impl hkdf::KeyType for Len {
            fn len(&self) -> usize {
                self.0
            }
        }
        let length = (out.len() as u16).to_be_bytes();
        let label_length = [(b"tls13 ".len() + label.len()) as u8];
        let info = [&length[..], &label_length, b"tls13 ", label, &[0]];
        let prk = hkdf::Prk::new_less_safe(self.hash, &self.bytes[..self.len]);
        // Infallible: the lengths asked for are the AEAD's key, its IV and the hash's.
        (prk.expand(&info, Len(out.len()))
            .and_then(|okm| okm.fill(out)))
        .expect("HKDF-Expand-Label of a valid length");
    }

    /// The key and IV this secret gives.
    fn key_and_iv(&self) -> (Vec<u8>, [u8; 12]) {
        let mut key = vec![0; self.aead.key_len()];
        self.expand(b"key", &mut key);
        let mut iv = [0; 12];
        self.expand(b"iv", &mut iv);
        (key, iv)
    }

    /// The secret after a KeyUpdate.
    fn next(&self) -> TrafficSecret {
        let mut next = self.clone();
        self.expand(b"traffic upd", &mut next.bytes[..self.len]);
        next
    }
}

/// One direction's key, IV and next sequence number.
struct Keys {
    key: LessSafeKey,
    iv: [u8; 12],
    seq: u64,
    /// The secret the key and IV derive from, for the next ones after a KeyUpdate; without
    /// it a KeyUpdate closes the connection.
    secret: Option<TrafficSecret>,
}

impl Keys {
    /// The keys rustls handed over, with the traffic secret they derive from if it was
    /// captured in the handshake and agrees with them.
    fn new(
        secrets: &ConnectionTrafficSecrets,
        seq: u64,
        captured: Option<&[u8]>,
    ) -> io::Result<Keys> {
        let (algorithm, hash, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => {
                (&aead::AES_128_GCM, hkdf::HKDF_SHA256, key, iv)
            }
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => {
                (&aead::AES_256_GCM, hkdf::HKDF_SHA384, key, iv)
            }
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, hkdf::HKDF_SHA256, key, iv)
            }
            #[allow(unreachable_patterns)]
            _ => {
                return Err(io::Error::other(
                    "a TLS cipher suite without a record layer",
                ));
            }
        };
        let iv: [u8; 12] = iv
            .as_ref()
            .try_into()
            .map_err(|_| io::Error::other("a TLS IV of the wrong length"))?;
        let secret = captured
            .and_then(|secret| TrafficSecret::new(algorithm, hash, secret))
            .filter(|secret| secret.key_and_iv() == (key.as_ref().to_vec(), iv));
        Keys::with(algorithm, key.as_ref(), iv, seq, secret)
    }

    fn with(
        algorithm: &'static aead::Algorithm,
        key: &[u8],
        iv: [u8; 12],
        seq: u64,
        secret: Option<TrafficSecret>,
    ) -> io::Result<Keys> {
        let key = UnboundKey::new(algorithm, key)
            .map_err(|_| io::Error::other("a TLS traffic key of the wrong length"))?;
        Ok(Keys {
            key: LessSafeKey::new(key),
            iv,
            seq,
            secret,
        })
    }

    /// The keys after a KeyUpdate.
    fn next(&self) -> io::Result<Keys> {
        let Some(secret) = &self.secret else {
            return Err(invalid(
                "a TLS KeyUpdate on a connection whose traffic secret was not kept; closing it \
                 for the peer to reconnect with new keys"
                    .into(),
            ));
        };
        let next = secret.next();
        let (key, iv) = next.key_and_iv();
        Keys::with(next.aead, &key, iv, 0, Some(next))
    }

    /// The next record's nonce: the IV XOR the sequence number (RFC 8446 §5.3).
    fn next_nonce(&mut self) -> Nonce {
        let mut nonce = self.iv;
        for (n, s) in nonce[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        self.seq += 1;
        Nonce::assume_unique_for_key(nonce)
    }

    /// Appends one record to `out`: the header, what `fill` appends, the content type,
    /// encrypted in place, and the tag. Once the key has sealed its limit of records, a
    /// KeyUpdate goes first and the record is sealed with the next key.
    fn seal(
        &mut self,
        content_type: u8,
        out: &mut Vec<u8>,
        fill: impl FnOnce(&mut Vec<u8>),
    ) -> io::Result<()> {
        if self.seq >= RECORD_LIMIT {
            self.update(out)?;
        }
        self.seal_one(content_type, out, fill)
    }

    /// Appends a KeyUpdate (not asking the peer for one) sealed with this key, and moves to
    /// the next key.
    fn update(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        let next = self.next()?;
        self.seal_one(HANDSHAKE, out, |out| {
            out.extend_from_slice(&[KEY_UPDATE, 0, 0, 1, UPDATE_NOT_REQUESTED]);
        })?;
        *self = next;
        Ok(())
    }

    fn seal_one(
        &mut self,
        content_type: u8,
        out: &mut Vec<u8>,
        fill: impl FnOnce(&mut Vec<u8>),
    ) -> io::Result<()> {
        let start = out.len();
        out.extend_from_slice(&[APPLICATION_DATA, 3, 3, 0, 0]);
        fill(out);
        out.push(content_type);
        let length = out.len() - start - HEADER + TAG;
        out[start + 3..start + HEADER].copy_from_slice(&(length as u16).to_be_bytes());
        let mut header = [0; HEADER];
        header.copy_from_slice(&out[start..start + HEADER]);
        let nonce = self.next_nonce();
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(header), &mut out[start + HEADER..])
            .map_err(|_| io::Error::other("sealing a TLS record failed"))?;
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }
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
    /// Whether the client may send session tickets (this side is the client).
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
            let length = usize::from(u16::from_be_bytes([header[3], header[4]]));
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
            let plain = self
                .rx
                .key
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

    /// Handshake messages after the handshake: a client ignores session tickets; anything
    /// else (a KeyUpdate above all) closes the connection.
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
        if !self.unsent.is_empty() {
            self.unsent = Vec::new();
            self.unsent_at = 0;
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
            let length = usize::from(u16::from_be_bytes([header[3], header[4]]));
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
                this.unsent = out[written..].to_vec();
                this.unsent_at = 0;
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
            let mut unsent = std::mem::take(&mut this.unsent);
            this.tx.seal(ALERT, &mut unsent, |out| {
                out.extend_from_slice(&[1, CLOSE_NOTIFY]);
            })?;
            this.unsent = unsent;
        }
        ready!(this.poll_send_unsent(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

/// The socket during a handshake: each read stops at the end of the record it is in, so
/// rustls never reads past the handshake's last record without decrypting what it read.
/// The bytes of the record being read are kept until it is whole.
pub struct Bounded<T> {
    io: T,
    /// The record being read, as far as it was read.
    record: Vec<u8>,
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
        match self.record.get(3..HEADER) {
            Some(length) => {
                HEADER + usize::from(u16::from_be_bytes([length[0], length[1]])) - self.record.len()
            }
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
/// version on rustls's own connection; with the client's leaf certificate.
pub struct Secure<T> {
    inner: Inner<T>,
    peer: Option<PeerCertificates>,
}

// Nearly every connection is on records (every TLS 1.3 client): boxing them instead would
// add an allocation to each and save nothing.
#[allow(clippy::large_enum_variant)]
enum Inner<T> {
    Records(Records<T>),
    Rustls(Box<tokio_rustls::server::TlsStream<Bounded<T>>>),
}

impl<T> Secure<T> {
    /// The client's leaf certificate, which names its identity. The rest of its chain was
    /// verified in the handshake and is not kept.
    pub fn peer(&self) -> Option<PeerCertificates> {
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
        .map(|leaf| PeerCertificates(Arc::from([leaf.to_vec()])));
    if conn.protocol_version() != Some(ProtocolVersion::TLSv1_3) {
        tls.get_mut().0.unbounded = true;
        let inner = Inner::Rustls(Box::new(tls));
        return Ok(Secure { inner, peer });
    }
    let (bounded, mut conn) = tls.into_inner();
    let handover = after_handshake(bounded, &mut conn, false, captured)?;
    let secrets = conn.dangerous_extract_secrets().map_err(io::Error::other)?;
    let records = handover.with_keys(&secrets)?;
    Ok(Secure {
        inner: Inner::Records(records),
        peer,
    })
}

/// What a connection whose handshake just ended holds besides its keys: plaintext rustls
/// already decrypted, the start of a record it only began to read, and the traffic
/// secrets it logged.
struct Handover<T> {
    io: T,
    client: bool,
    captured: Captured,
    received: Vec<u8>,
    plain: Vec<u8>,
    read_closed: bool,
}

fn after_handshake<T, D>(
    bounded: Bounded<T>,
    conn: &mut rustls::ConnectionCommon<D>,
    client: bool,
    captured: Captured,
) -> io::Result<Handover<T>> {
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
    Ok(Handover {
        io: bounded.io,
        client,
        captured,
        received,
        plain,
        read_closed,
    })
}

impl<T> Handover<T> {
    fn with_keys(self, secrets: &rustls::ExtractedSecrets) -> io::Result<Records<T>> {
        let Captured { client, server } = self.captured;
        let (tx, rx) = if self.client {
            (client, server)
        } else {
            (server, client)
        };
        Ok(Records {
            io: self.io,
            tx: Keys::new(&secrets.tx.1, secrets.tx.0, tx.as_deref())?,
            rx: Keys::new(&secrets.rx.1, secrets.rx.0, rx.as_deref())?,
            client: self.client,
            received: self.received,
            plain: self.plain,
            plain_at: 0,
            unsent: Vec::new(),
            unsent_at: 0,
            read_closed: self.read_closed,
            close_notify_sent: false,
        })
    }
}

/// A client's TLS handshake to `server` over `io`, on [`Records`] once it is done (the
/// simulator's proxies: its config must allow secret extraction and offer only TLS 1.3).
pub async fn connect<T: AsyncRead + AsyncWrite + Unpin>(
    io: T,
    connector: &tokio_rustls::TlsConnector,
    server: rustls::pki_types::ServerName<'static>,
) -> io::Result<Records<T>> {
    let (tls, captured) = capturing(connector.connect(server, Bounded::new(io))).await;
    let (bounded, mut conn) = tls?.into_inner();
    if conn.protocol_version() != Some(ProtocolVersion::TLSv1_3) {
        return Err(io::Error::other(
            "the server chose a TLS version before 1.3, which records do not speak",
        ));
    }
    let handover = after_handshake(bounded, &mut conn, true, captured)?;
    let secrets = conn.dangerous_extract_secrets().map_err(io::Error::other)?;
    handover.with_keys(&secrets)
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

#[cfg(test)]
mod tests;
