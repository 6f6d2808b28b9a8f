//! ADS responses as a simulated proxy reads them: in place, in the pieces of the frame they
//! arrived in.
//!
//! A response arrives as HTTP/2 DATA frames of at most 16 KiB, and its gRPC frame is
//! decoded from those chunks without joining them (`wire::Messages`). A resource that
//! lies within one chunk is kept as a slice of it and read in place when needed
//! ([`ResourceRef::parse`]). A larger one — an unscoped sidecar's 557 KB outbound route
//! configuration on a 1,000-service mesh spans ~35 chunks — is kept as its pieces
//! ([`Encoded::Spanning`]): prost would copy it into one new buffer, and filling that copy
//! and faulting in its pages was a quarter of the simulator's CPU while meshd pushed a
//! VirtualService change to 5,000 proxies.

use std::borrow::Cow;

use prost::bytes::{Buf, BufMut, Bytes};
use prost::encoding::{
    DecodeContext, WireType, check_wire_type, decode_key, decode_varint, encode_key, encode_varint,
    encoded_len_varint, key_len, skip_field, string,
};
use prost::{DecodeError, Message};

use grpc_messages::Received;

/// `google.protobuf.Any`, its fields slices of the received frame (state of the world).
#[derive(Clone, PartialEq, Message)]
pub struct AnyBody {
    #[prost(bytes = "bytes", tag = "1")]
    pub type_url: Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    pub value: Bytes,
}

/// `envoy.service.discovery.v3.DiscoveryResponse`, as meshd fills it.
#[derive(Clone, PartialEq, Message)]
pub struct SotwResponse {
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<AnyBody>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
}

/// `envoy.service.discovery.v3.DeltaDiscoveryResponse`, as meshd fills it; its resources
/// still encoded, where they arrived (read with [`DeltaResponse::each`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeltaResponse {
    pub system_version_info: String,
    pub resources: Vec<Encoded>,
    pub type_url: String,
    pub nonce: String,
    pub removed_resources: Vec<String>,
}

impl DeltaResponse {
    /// Its resources, read in place (those that do not parse are left out).
    pub fn each(&self) -> impl Iterator<Item = ResourceRef<'_>> {
        self.resources.iter().filter_map(Encoded::read)
    }
}

/// The fields of a `DeltaDiscoveryResponse` meshd fills; any other is skipped.
const SYSTEM_VERSION_INFO: u32 = 1;
const RESOURCES: u32 = 2;
const TYPE_URL: u32 = 4;
const NONCE: u32 = 5;
const REMOVED_RESOURCES: u32 = 6;

impl Message for DeltaResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if !self.system_version_info.is_empty() {
            string::encode(SYSTEM_VERSION_INFO, &self.system_version_info, buf);
        }
        for r in &self.resources {
            encode_key(RESOURCES, WireType::LengthDelimited, buf);
            encode_varint(r.len() as u64, buf);
            for piece in r.pieces() {
                buf.put_slice(piece);
            }
        }
        if !self.type_url.is_empty() {
            string::encode(TYPE_URL, &self.type_url, buf);
        }
        if !self.nonce.is_empty() {
            string::encode(NONCE, &self.nonce, buf);
        }
        string::encode_repeated(REMOVED_RESOURCES, &self.removed_resources, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            SYSTEM_VERSION_INFO => {
                string::merge(wire_type, &mut self.system_version_info, buf, ctx)
            }
            RESOURCES => {
                check_wire_type(WireType::LengthDelimited, wire_type)?;
                let len = decode_varint(buf)?;
                match usize::try_from(len) {
                    Ok(len) if len <= buf.remaining() => {
                        self.resources.push(Encoded::take(buf, len));
                        Ok(())
                    }
                    // prost makes its errors only in its own decoders, and this is what
                    // they are for (`Message` implementations).
                    #[allow(deprecated)]
                    _ => Err(DecodeError::new("a resource longer than its response")),
                }
            }
            TYPE_URL => string::merge(wire_type, &mut self.type_url, buf, ctx),
            NONCE => string::merge(wire_type, &mut self.nonce, buf, ctx),
            REMOVED_RESOURCES => {
                string::merge_repeated(wire_type, &mut self.removed_resources, buf, ctx)
            }
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let text = |tag, s: &String| {
            if s.is_empty() {
                0
            } else {
                string::encoded_len(tag, s)
            }
        };
        let resources: usize = (self.resources.iter())
            .map(|r| key_len(RESOURCES) + encoded_len_varint(r.len() as u64) + r.len())
            .sum();
        text(SYSTEM_VERSION_INFO, &self.system_version_info)
            + resources
            + text(TYPE_URL, &self.type_url)
            + text(NONCE, &self.nonce)
            + string::encoded_len_repeated(REMOVED_RESOURCES, &self.removed_resources)
    }

    fn clear(&mut self) {
        *self = DeltaResponse::default();
    }
}

/// One encoded `envoy.service.discovery.v3.Resource` of a delta response, where it arrived.
#[derive(Clone, Debug, PartialEq)]
pub enum Encoded {
    /// Within one chunk of the frame: a slice of it, read when needed.
    Whole(Bytes),
    /// Across chunks: its pieces, read as it was taken (boxed: rare, and larger).
    Spanning(Box<Spanning>),
}

/// A resource that arrived across chunks, read once: its name and version (copied only if
/// they too cross a chunk's end) and its body's pieces.
#[derive(Clone, Debug, PartialEq)]
pub struct Spanning {
    pieces: Vec<Bytes>,
    /// `None` if it does not parse.
    read: Option<(Bytes, Bytes, Option<Vec<Bytes>>)>,
}

impl Encoded {
    /// The next `len` bytes of `buf` (at most what it holds), sliced from its chunks.
    fn take(buf: &mut impl Buf, len: usize) -> Encoded {
        if buf.chunk().len() >= len {
            return Encoded::Whole(buf.copy_to_bytes(len));
        }
        let pieces = slices(buf, len);
        let read = read_spanning(&pieces);
        Encoded::Spanning(Box::new(Spanning { pieces, read }))
    }

    fn len(&self) -> usize {
        self.pieces().iter().map(|p| p.len()).sum()
    }

    fn pieces(&self) -> &[Bytes] {
        match self {
            Encoded::Whole(b) => std::slice::from_ref(b),
            Encoded::Spanning(s) => &s.pieces,
        }
    }

    fn read(&self) -> Option<ResourceRef<'_>> {
        match self {
            Encoded::Whole(raw) => ResourceRef::parse(raw),
            Encoded::Spanning(s) => {
                let (name, version, body) = s.read.as_ref()?;
                Some(ResourceRef {
                    name: &name[..],
                    version: &version[..],
                    body: body.as_deref().map(Body::Pieces),
                })
            }
        }
    }
}

impl From<Bytes> for Encoded {
    fn from(raw: Bytes) -> Encoded {
        Encoded::Whole(raw)
    }
}

/// One `envoy.service.discovery.v3.Resource` of a delta response, read in place: its name,
/// version and body are borrowed from the frame. An unscoped proxy's initial configuration
/// has ~2,100 resources; decoded as `String`s (three allocations, copies and UTF-8 checks
/// each) they were a fifth of the simulator's CPU in a connect storm, and as a list of
/// decoded resources (`Bytes`, a reference count each) the list's memory and the counts
/// were another.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ResourceRef<'a> {
    pub name: &'a [u8],
    pub version: &'a [u8],
    /// The `Any`'s value, if the resource has one.
    pub body: Option<Body<'a>>,
}

/// Fields of `Resource` meshd fills: 1 version, 2 the `Any` (2 is its value), 3 name.
const VERSION: u32 = 1;
const RESOURCE: u32 = 2;
const ANY_VALUE: u32 = 2;
const NAME: u32 = 3;

impl<'a> ResourceRef<'a> {
    /// Reads an encoded `Resource` that lies in one slice; anything but the fields above
    /// is skipped. `None` if it does not parse.
    pub fn parse(mut raw: &'a [u8]) -> Option<ResourceRef<'a>> {
        let mut r = ResourceRef::default();
        while !raw.is_empty() {
            let (tag, value) = next_field(&mut raw)?;
            match (tag, value) {
                (VERSION, Some(v)) => r.version = v,
                (NAME, Some(v)) => r.name = v,
                (RESOURCE, Some(mut any)) => {
                    let mut body: &[u8] = &[];
                    while !any.is_empty() {
                        if let (ANY_VALUE, Some(v)) = next_field(&mut any)? {
                            body = v;
                        }
                    }
                    r.body = Some(Body::Whole(body));
                }
                _ => {}
            }
        }
        Some(r)
    }
}

/// The next field of `buf`: its tag, and its bytes if length-delimited (`None` for a
/// varint or fixed-width field, which is skipped). `None` if it does not parse.
fn next_field<'a>(buf: &mut &'a [u8]) -> Option<(u32, Option<&'a [u8]>)> {
    let (tag, wire_type) = decode_key(buf).ok()?;
    match wire_type {
        WireType::LengthDelimited => {
            let len = usize::try_from(decode_varint(buf).ok()?).ok()?;
            let value = buf.get(..len)?;
            *buf = &buf[len..];
            Some((tag, Some(value)))
        }
        other => {
            skip_scalar(other, buf)?;
            Some((tag, None))
        }
    }
}

/// Skips a varint or fixed-width value; `None` for groups or a value cut short.
fn skip_scalar(wire_type: WireType, buf: &mut impl Buf) -> Option<()> {
    let width = match wire_type {
        WireType::Varint => return decode_varint(buf).ok().map(drop),
        WireType::SixtyFourBit => 8,
        WireType::ThirtyTwoBit => 4,
        WireType::LengthDelimited | WireType::StartGroup | WireType::EndGroup => return None,
    };
    (buf.remaining() >= width).then(|| buf.advance(width))
}

/// The next `len` bytes of `buf` (at most what it holds), a slice of each chunk they lie in
/// (for `Bytes` and [`Received`], no copies).
fn slices(buf: &mut impl Buf, len: usize) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut left = len.min(buf.remaining());
    while left > 0 {
        let n = buf.chunk().len().min(left);
        // A `Buf` whose chunk is empty before its end (none of ours) is copied from.
        let n = if n == 0 { left } else { n };
        out.push(buf.copy_to_bytes(n));
        left -= n;
    }
    out
}

/// A length prefix, if what follows in `buf` holds that many bytes.
fn length(buf: &mut impl Buf) -> Option<usize> {
    let len = usize::try_from(decode_varint(&mut *buf).ok()?).ok()?;
    (len <= buf.remaining()).then_some(len)
}

/// Reads a `Resource` that arrived in `pieces`, as [`ResourceRef::parse`] reads one slice.
fn read_spanning(pieces: &[Bytes]) -> Option<(Bytes, Bytes, Option<Vec<Bytes>>)> {
    let mut buf = Received::default();
    for piece in pieces {
        buf.push(piece.clone());
    }
    let (mut name, mut version, mut body) = (Bytes::new(), Bytes::new(), None);
    while buf.remaining() > 0 {
        let (tag, wire_type) = decode_key(&mut buf).ok()?;
        if wire_type != WireType::LengthDelimited {
            skip_scalar(wire_type, &mut buf)?;
            continue;
        }
        let len = length(&mut buf)?;
        match tag {
            VERSION => version = buf.copy_to_bytes(len),
            NAME => name = buf.copy_to_bytes(len),
            RESOURCE => {
                let end = buf.remaining() - len;
                let mut value = Vec::new();
                while buf.remaining() > end {
                    let (tag, wire_type) = decode_key(&mut buf).ok()?;
                    if wire_type != WireType::LengthDelimited {
                        skip_scalar(wire_type, &mut buf)?;
                        continue;
                    }
                    let len = length(&mut buf)?;
                    if tag == ANY_VALUE {
                        value = slices(&mut buf, len);
                    } else {
                        buf.advance(len);
                    }
                }
                if buf.remaining() != end {
                    return None; // the `Any`'s last field ran past its end
                }
                body = Some(value);
            }
            _ => buf.advance(len),
        }
    }
    Some((name, version, body))
}

/// A resource's body: one slice, or the pieces it arrived in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Body<'a> {
    Whole(&'a [u8]),
    Pieces(&'a [Bytes]),
}

impl<'a> Body<'a> {
    /// Whether `needle` occurs in it, within a piece or across pieces.
    pub fn contains(&self, needle: &memchr::memmem::Finder<'_>) -> bool {
        let pieces = match self {
            Body::Whole(b) => return needle.find(b).is_some(),
            Body::Pieces(p) => p,
        };
        let overlap = needle.needle().len().saturating_sub(1);
        // The last `overlap` bytes before the current piece, so that an occurrence across
        // a piece's start is found in `tail` + the piece's first `overlap` bytes.
        let mut tail: Vec<u8> = Vec::new();
        let mut across: Vec<u8> = Vec::new();
        for piece in pieces.iter() {
            if needle.find(piece).is_some() {
                return true;
            }
            if !tail.is_empty() {
                across.clear();
                across.extend_from_slice(&tail);
                across.extend_from_slice(&piece[..overlap.min(piece.len())]);
                if needle.find(&across).is_some() {
                    return true;
                }
            }
            tail.extend_from_slice(&piece[piece.len().saturating_sub(overlap)..]);
            let excess = tail.len().saturating_sub(overlap);
            tail.drain(..excess);
        }
        false
    }

    /// Its bytes in one slice: a copy only if it arrived in pieces.
    pub fn joined(&self) -> Cow<'a, [u8]> {
        match self {
            Body::Whole(b) => Cow::Borrowed(b),
            Body::Pieces(p) => Cow::Owned(p.concat()),
        }
    }
}

#[cfg(test)]
mod tests {
    use envoy_api::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse, Resource,
    };
    use envoy_api::pb::google::protobuf::Any;

    use super::*;
    use crate::types::ROUTE_TYPE;

    fn any(value: &[u8]) -> Any {
        Any {
            type_url: ROUTE_TYPE.into(),
            value: value.to_vec(),
        }
    }

    /// A `Buf` over `frame` cut into chunks of `size` bytes, as HTTP/2 delivers a frame.
    fn chunked(frame: &Bytes, size: usize) -> prost::bytes::buf::Chain<Bytes, Bytes> {
        // Two levels of `Chain` are enough for the few chunks the tests use.
        let cut = size.min(frame.len());
        frame.slice(..cut).chain(frame.slice(cut..))
    }

    #[test]
    fn a_resource_is_read_in_place_whatever_else_it_carries() {
        let full = Resource {
            name: "outbound|80||a.read-test".into(),
            version: "0a0b".into(),
            resource: Some(any(b"body")),
            aliases: vec!["an alias".into()],
            ttl: Some(envoy_api::pb::google::protobuf::Duration {
                seconds: 5,
                nanos: 0,
            }),
            ..Default::default()
        }
        .encode_to_vec();
        // Fixed-width fields are skipped too.
        let mut raw = full.clone();
        raw.extend([0x49, 1, 2, 3, 4, 5, 6, 7, 8]); // field 9, 64-bit
        raw.extend([0x55, 1, 2, 3, 4]); // field 10, 32-bit
        let r = ResourceRef::parse(&raw).unwrap();
        assert_eq!(
            (r.name, r.version, r.body),
            (
                &b"outbound|80||a.read-test"[..],
                &b"0a0b"[..],
                Some(Body::Whole(&b"body"[..]))
            )
        );
        // Read across pieces, cut at every byte, it is the same.
        let raw = Bytes::from(raw.clone());
        for cut in 1..raw.len() {
            let pieces = [raw.slice(..cut), raw.slice(cut..)];
            let (name, version, body) = read_spanning(&pieces).unwrap();
            assert_eq!(
                (&name[..], &version[..], body.map(|b| b.concat())),
                (r.name, r.version, Some(b"body".to_vec())),
                "cut at {cut}"
            );
        }
        // A resource without a body, and one cut short.
        let bare = Resource {
            name: "n".into(),
            version: "v".into(),
            ..Default::default()
        }
        .encode_to_vec();
        assert_eq!(ResourceRef::parse(&bare).unwrap().body, None);
        assert_eq!(ResourceRef::parse(&full[..full.len() - 2]), None);
        let short = Bytes::from(full[..full.len() - 2].to_vec());
        assert_eq!(read_spanning(&[short.slice(..10), short.slice(10..)]), None);
    }

    #[test]
    fn responses_decode_as_envoys_with_bodies_left_where_they_arrived() {
        let body: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let delta = DeltaDiscoveryResponse {
            system_version_info: "v/2".into(),
            resources: vec![Resource {
                name: "8080".into(),
                version: "00ff".into(),
                resource: Some(any(&body)),
                ..Default::default()
            }],
            type_url: ROUTE_TYPE.into(),
            nonce: "2-1".into(),
            removed_resources: vec!["9090".into()],
            ..Default::default()
        };
        let frame = Bytes::from(delta.encode_to_vec());
        // Whole, then in two chunks that cut the body.
        for chunks in [chunked(&frame, frame.len()), chunked(&frame, 1000)] {
            let whole = chunks.first_ref().len() == frame.len();
            let got = DeltaResponse::decode(chunks).unwrap();
            assert_eq!(
                (
                    got.type_url.as_str(),
                    got.nonce.as_str(),
                    &got.removed_resources[..]
                ),
                (ROUTE_TYPE, "2-1", &["9090".to_string()][..])
            );
            let r: Vec<ResourceRef> = got.each().collect();
            let value = r[0].body.unwrap();
            assert_eq!(
                (r.len(), r[0].name, r[0].version, &value.joined()[..]),
                (1, &b"8080"[..], &b"00ff"[..], &body[..])
            );
            assert_eq!(matches!(value, Body::Whole(_)), whole);
            let within = frame.as_ptr_range();
            let pieces = match value {
                Body::Whole(b) => vec![b],
                Body::Pieces(p) => p.iter().map(|p| &p[..]).collect(),
            };
            for (what, field) in [("name", r[0].name), ("version", r[0].version)]
                .into_iter()
                .chain(pieces.into_iter().map(|p| ("body", p)))
            {
                assert!(within.contains(&field.as_ptr()), "the {what} is not copied");
            }
            assert_eq!(
                got.encoded_len(),
                frame.len(),
                "every field meshd sends is read"
            );
            assert_eq!(got.encode_to_vec(), frame, "and written back as it was");
        }

        let sotw = DiscoveryResponse {
            version_info: "v/3".into(),
            resources: vec![any(&body), any(b"small")],
            type_url: ROUTE_TYPE.into(),
            nonce: "3-1".into(),
            ..Default::default()
        };
        let frame = Bytes::from(sotw.encode_to_vec());
        let got = SotwResponse::decode(frame.clone()).unwrap();
        assert_eq!(
            (got.version_info.as_str(), got.nonce.as_str()),
            ("v/3", "3-1")
        );
        let bodies: Vec<&[u8]> = got.resources.iter().map(|a| &a.value[..]).collect();
        assert_eq!(bodies, vec![&body[..], b"small"]);
        assert_eq!(got.encoded_len(), frame.len());
    }

    #[test]
    fn a_resource_longer_than_its_response_does_not_decode() {
        let mut frame = Vec::new();
        encode_key(RESOURCES, WireType::LengthDelimited, &mut frame);
        encode_varint(100, &mut frame);
        frame.extend([0; 10]);
        assert!(DeltaResponse::decode(&frame[..]).is_err());
    }

    #[test]
    fn a_marker_is_found_within_a_piece_and_across_any_number_of_them() {
        let marker = b"marker-17";
        let finder = memchr::memmem::Finder::new(marker);
        let text: Vec<u8> = [&b"0123456789abcdef"[..], marker, b"ghijklmnop"].concat();
        let text = Bytes::from(text);
        // Every way of cutting it into three pieces, tiny ones included.
        for a in 0..=text.len() {
            for b in a..=text.len() {
                let pieces = [text.slice(..a), text.slice(a..b), text.slice(b..)];
                assert!(Body::Pieces(&pieces).contains(&finder), "cut at {a}, {b}");
            }
        }
        // Nothing found that is not there, even where the pieces meet.
        let other = Bytes::from_static(b"marker-1marker-1");
        let pieces = [other.slice(..8), other.slice(8..)];
        assert!(!Body::Pieces(&pieces).contains(&finder));
        assert!(!Body::Whole(&other).contains(&finder));
        assert!(Body::Whole(&text).contains(&finder));
    }
}
