//! What the simulator's client writes and reads of HTTP/2 (RFC 9113 §4, §6) and HPACK
//! (RFC 7541): frame headers, SETTINGS, WINDOW_UPDATE, and a request's literal header
//! fields. meshd's own ports are served by hyper's server; this is a load generator's
//! client and nothing in meshd's serving path uses it.

use prost::bytes::BufMut;

/// A frame's header: payload length, type, flags, stream.
pub const HEAD: usize = 9;

/// What a client sends first (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;

pub const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;

/// The largest frame payload either side may send before SETTINGS say otherwise.
pub const DEFAULT_MAX_FRAME: usize = 16_384;

/// The window every stream and the connection start with (RFC 9113 §6.9.2).
pub const DEFAULT_WINDOW: i64 = 65_535;

/// A parsed frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

impl Head {
    pub fn parse(b: &[u8]) -> Head {
        Head {
            len: (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// The part of a DATA payload after its padding is taken off (RFC 9113 §6.1): all of it
/// unless the frame is PADDED; `None` when the padding is longer than the frame.
pub fn unpadded(head: &Head, payload: &[u8]) -> Option<std::ops::Range<usize>> {
    if !head.has(PADDED) {
        return Some(0..payload.len());
    }
    let pad = usize::from(*payload.first()?);
    (pad < payload.len()).then(|| 1..payload.len() - pad)
}

/// A WINDOW_UPDATE's increment; `None` unless the payload is its 4 bytes.
pub fn window_increment(payload: &[u8]) -> Option<u32> {
    let bytes: [u8; 4] = payload.try_into().ok()?;
    Some(u32::from_be_bytes(bytes) & 0x7fff_ffff)
}

/// A SETTINGS payload's (identifier, value) pairs.
pub fn settings(payload: &[u8]) -> impl Iterator<Item = (u16, u32)> + '_ {
    payload.chunks_exact(6).map(|s| {
        (
            u16::from_be_bytes([s[0], s[1]]),
            u32::from_be_bytes([s[2], s[3], s[4], s[5]]),
        )
    })
}

pub fn put_head(buf: &mut impl BufMut, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = len as u32;
    buf.put_slice(&len.to_be_bytes()[1..]);
    buf.put_u8(kind);
    buf.put_u8(flags);
    buf.put_u32(stream);
}

pub fn put_settings(buf: &mut impl BufMut, settings: &[(u16, u32)]) {
    put_head(buf, settings.len() * 6, SETTINGS, 0, 0);
    for &(id, value) in settings {
        buf.put_u16(id);
        buf.put_u32(value);
    }
}

pub fn put_window_update(buf: &mut impl BufMut, stream: u32, increment: u32) {
    put_head(buf, 4, WINDOW_UPDATE, 0, stream);
    buf.put_u32(increment);
}

/// A literal header field without indexing (RFC 7541 §6.2.2), not Huffman-coded: the
/// name by static table `index`, or given (`index` 0).
pub fn literal(buf: &mut impl BufMut, index: usize, name: &[u8], value: &[u8]) {
    integer(buf, 4, index);
    if index == 0 {
        integer(buf, 7, name.len());
        buf.put_slice(name);
    }
    integer(buf, 7, value.len());
    buf.put_slice(value);
}

/// An HPACK integer with an `n`-bit prefix, the prefix's high bits zero (RFC 7541 §5.1).
fn integer(buf: &mut impl BufMut, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        buf.put_u8(value as u8);
        return;
    }
    buf.put_u8(max as u8);
    value -= max;
    while value >= 128 {
        buf.put_u8((value % 128) as u8 | 0x80);
        value /= 128;
    }
    buf.put_u8(value as u8);
}
