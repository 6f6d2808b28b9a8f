//! HTTP/2 frames (RFC 9113 §4, §6): the nine-byte header, and the frames meshd's server
//! and the fleet simulator's client write.

use prost::bytes::BufMut;

/// A frame's header: payload length, type, flags, stream.
pub const HEAD: usize = 9;

/// What a client sends first (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PUSH_PROMISE: u8 = 0x5;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

pub const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
pub const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
pub const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// Error codes (RFC 9113 §7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    NoError = 0x0,
    ProtocolError = 0x1,
    FlowControlError = 0x3,
    StreamClosed = 0x5,
    FrameSizeError = 0x6,
    RefusedStream = 0x7,
    CompressionError = 0x9,
    EnhanceYourCalm = 0xb,
}

impl Reason {
    /// The `reason` label a connection closed with this code is counted under.
    pub fn label(self) -> &'static str {
        match self {
            Reason::NoError => "http2_no_error",
            Reason::ProtocolError => "http2_protocol_error",
            Reason::FlowControlError => "http2_flow_control_error",
            Reason::StreamClosed => "http2_stream_closed",
            Reason::FrameSizeError => "http2_frame_size_error",
            Reason::RefusedStream => "http2_refused_stream",
            Reason::CompressionError => "http2_compression_error",
            Reason::EnhanceYourCalm => "http2_enhance_your_calm",
        }
    }
}

/// The largest frame payload either side may send before SETTINGS say otherwise, and the
/// largest this server accepts.
pub const DEFAULT_MAX_FRAME: usize = 16_384;

/// The window every stream and the connection start with (RFC 9113 §6.9.2).
pub const DEFAULT_WINDOW: i64 = 65_535;

/// The HPACK dynamic table each side's decoder starts with (RFC 9113 §6.5.2).
pub const DEFAULT_HEADER_TABLE: usize = 4_096;

/// The largest window a WINDOW_UPDATE may open (RFC 9113 §6.9.1).
pub const MAX_WINDOW: i64 = (1 << 31) - 1;

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

/// The part of a DATA or HEADERS payload after its padding is taken off (RFC 9113
/// §6.1, §6.2): all of it unless the frame is PADDED; `None` when the padding is longer
/// than the frame.
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

pub fn put_rst_stream(buf: &mut impl BufMut, stream: u32, reason: Reason) {
    put_head(buf, 4, RST_STREAM, 0, stream);
    buf.put_u32(reason as u32);
}

/// GOAWAY, with `debug` (why, for the peer's logs) as its additional debug data.
pub fn put_goaway(buf: &mut impl BufMut, last_stream: u32, reason: Reason, debug: &[u8]) {
    put_head(buf, 8 + debug.len(), GOAWAY, 0, 0);
    buf.put_u32(last_stream);
    buf.put_u32(reason as u32);
    buf.put_slice(debug);
}

pub fn put_ping(buf: &mut impl BufMut, flags: u8, payload: [u8; 8]) {
    put_head(buf, 8, PING, flags, 0);
    buf.put_slice(&payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(flags: u8, len: usize) -> Head {
        Head {
            len,
            kind: DATA,
            flags,
            stream: 1,
        }
    }

    #[test]
    fn padding_is_taken_off_and_too_much_of_it_is_refused() {
        // Pad length 2, data "ab", two bytes of padding.
        let padded = [2, b'a', b'b', 0, 0];
        assert_eq!(unpadded(&head(PADDED, 5), &padded), Some(1..3));
        assert_eq!(unpadded(&head(0, 5), &padded), Some(0..5));
        // All padding, no data.
        assert_eq!(unpadded(&head(PADDED, 3), &[2, 0, 0]), Some(1..1));
        // Padding as long as the frame, and a PADDED frame without its length octet.
        assert_eq!(unpadded(&head(PADDED, 3), &[3, 0, 0]), None);
        assert_eq!(unpadded(&head(PADDED, 0), &[]), None);
    }

    #[test]
    fn window_increments_and_settings_are_read_as_written() {
        let mut b = Vec::new();
        put_window_update(&mut b, 3, 70_000);
        let h = Head::parse(&b);
        assert_eq!((h.kind, h.stream, h.len), (WINDOW_UPDATE, 3, 4));
        assert_eq!(window_increment(&b[HEAD..]), Some(70_000));
        // The reserved bit is not part of the increment; 3 or 5 bytes are no increment.
        assert_eq!(window_increment(&[0x80, 0, 0, 1]), Some(1));
        assert_eq!(window_increment(&[0, 0, 1]), None);
        assert_eq!(window_increment(&[0, 0, 0, 0, 1]), None);

        let mut b = Vec::new();
        put_settings(
            &mut b,
            &[
                (SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20),
                (SETTINGS_MAX_FRAME_SIZE, 16_384),
            ],
        );
        let h = Head::parse(&b);
        assert_eq!((h.kind, h.len), (SETTINGS, 12));
        let read: Vec<_> = settings(&b[HEAD..]).collect();
        assert_eq!(
            read,
            [
                (SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20),
                (SETTINGS_MAX_FRAME_SIZE, 16_384)
            ]
        );
    }
}
