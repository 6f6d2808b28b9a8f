//! Header blocks (RFC 7541). Requests are decoded with the peer's HPACK state; responses
//! and trailers are written as literals that never enter the dynamic table, so the
//! encoder keeps no state at all.

use prost::bytes::{BufMut, BytesMut};
use tonic::codegen::http::{self, HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};

/// The largest header list a request may carry (SETTINGS_MAX_HEADER_LIST_SIZE): the
/// decoded size, each field counted as its name, its value and 32 bytes (RFC 9113
/// §6.5.2). A small header block can decode to far more, repeating an entry of the HPACK
/// table ("HPACK bomb"), so it is counted as it decodes.
pub const MAX_HEADER_LIST: usize = 64 * 1024;

/// A request's head decoded from its header block.
pub struct RequestHead {
    pub method: Option<Method>,
    pub scheme: Option<String>,
    pub authority: Option<String>,
    pub path: Option<String>,
    pub headers: HeaderMap,
}

/// Decodes a request's (or trailers') header block. Errors name what was wrong; an
/// HPACK error breaks the whole connection (its table state is lost), a malformed field
/// only the stream.
pub fn decode(
    decoder: &mut loona_hpack::Decoder<'static>,
    block: &[u8],
) -> Result<Result<RequestHead, String>, String> {
    let mut head = RequestHead {
        method: None,
        scheme: None,
        authority: None,
        path: None,
        headers: HeaderMap::new(),
    };
    let mut malformed = None;
    let mut size = 0;
    decoder
        .decode_with_cb(block, |name, value| {
            // Decoded to the end all the same: the HPACK table must follow every block.
            if malformed.is_some() {
                return;
            }
            size += name.len() + value.len() + 32;
            if size > MAX_HEADER_LIST {
                malformed = Some(format!("a header list over {MAX_HEADER_LIST} bytes"));
                return;
            }
            if let Err(e) = head.add(&name, &value) {
                malformed = Some(e);
            }
        })
        .map_err(|e| format!("header block does not decode: {e}"))?;
    Ok(match malformed {
        Some(e) => Err(e),
        None => Ok(head),
    })
}

impl RequestHead {
    fn add(&mut self, name: &[u8], value: &[u8]) -> Result<(), String> {
        let text = || {
            std::str::from_utf8(value)
                .map(str::to_string)
                .map_err(|_| format!("{} is not UTF-8", String::from_utf8_lossy(name)))
        };
        match name {
            b":method" => {
                self.method = Some(Method::from_bytes(value).map_err(|e| format!(":method: {e}"))?)
            }
            b":scheme" => self.scheme = Some(text()?),
            b":authority" => self.authority = Some(text()?),
            b":path" => self.path = Some(text()?),
            _ if name.first() == Some(&b':') => {
                return Err(format!(
                    "unknown pseudo-header {}",
                    String::from_utf8_lossy(name)
                ));
            }
            _ => {
                let n = HeaderName::from_bytes(name)
                    .map_err(|e| format!("{}: {e}", String::from_utf8_lossy(name)))?;
                let v = HeaderValue::from_bytes(value).map_err(|e| format!("{n}: {e}"))?;
                self.headers.append(n, v);
            }
        }
        Ok(())
    }

    /// The request, with `body`.
    pub fn into_request<B>(self, body: B) -> Result<Request<B>, String> {
        let (Some(method), Some(path)) = (self.method, self.path) else {
            return Err("a request without :method or :path".to_string());
        };
        let mut uri = Uri::builder().path_and_query(path);
        if let Some(authority) = self.authority {
            uri = uri
                .scheme(self.scheme.as_deref().unwrap_or("http"))
                .authority(authority);
        }
        let uri = uri.build().map_err(|e| format!(":path: {e}"))?;
        let mut request = Request::new(body);
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        *request.version_mut() = http::Version::HTTP_2;
        *request.headers_mut() = self.headers;
        Ok(request)
    }
}

/// Fields HTTP/2 forbids (RFC 9113 §8.2.2).
fn connection_specific(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade"
    )
}

/// A request's `grpc-timeout` (gRPC over HTTP/2: at most eight digits and a unit, `H`
/// hours, `M` minutes, `S` seconds, `m`, `u`, `n` milli-, micro-, nanoseconds); `None`
/// when absent or malformed (a malformed one is ignored, as gRPC's servers do).
pub fn grpc_timeout(headers: &HeaderMap) -> Option<std::time::Duration> {
    use std::time::Duration;
    let value = headers.get("grpc-timeout")?.as_bytes();
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// A response's header block: `:status`, then each field as a literal never indexed
/// into the dynamic table.
pub fn encode_response(buf: &mut BytesMut, status: http::StatusCode, headers: &HeaderMap) {
    if status == http::StatusCode::OK {
        buf.put_u8(0x88); // static table entry 8, `:status: 200`
    } else {
        literal(buf, 8, b"", status.as_str().as_bytes());
    }
    encode_fields(buf, headers);
}

/// A trailers block: each field as a literal.
pub fn encode_fields(buf: &mut BytesMut, headers: &HeaderMap) {
    for (name, value) in headers {
        if !connection_specific(name) {
            literal(buf, 0, name.as_str().as_bytes(), value.as_bytes());
        }
    }
}

/// A literal header field without indexing (RFC 7541 §6.2.2), not Huffman-coded: the
/// name by static table `index`, or given (`index` 0).
pub(crate) fn literal(buf: &mut impl BufMut, index: usize, name: &[u8], value: &[u8]) {
    integer(buf, 4, index);
    if index == 0 {
        integer(buf, 7, name.len());
        buf.put_slice(name);
    }
    integer(buf, 7, value.len());
    buf.put_slice(value);
}

/// An HPACK integer with an `n`-bit prefix, the prefix's high bits zero (as in every
/// field [`literal`] writes; RFC 7541 §5.1).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_are_read_in_every_unit_and_malformed_ones_ignored() {
        use std::time::Duration;
        let timeout = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert("grpc-timeout", v.parse().unwrap());
            grpc_timeout(&h)
        };
        assert_eq!(timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(timeout("10S"), Some(Duration::from_secs(10)));
        assert_eq!(timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(
            timeout("99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(timeout("5n"), Some(Duration::from_nanos(5)));
        for bad in ["", "S", "100", "123456789S", "1.5S", "-1S", "10s", "10 S"] {
            assert_eq!(timeout(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&HeaderMap::new()), None);
    }

    #[test]
    fn a_response_block_decodes_to_what_was_encoded() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        headers.insert(
            "grpc-message",
            HeaderValue::from_str(&"x".repeat(300)).unwrap(),
        );
        headers.insert("connection", HeaderValue::from_static("close"));
        for status in [http::StatusCode::OK, http::StatusCode::NOT_FOUND] {
            let mut buf = BytesMut::new();
            encode_response(&mut buf, status, &headers);
            let fields = loona_hpack::Decoder::new().decode(&buf).unwrap();
            let fields: Vec<(String, String)> = fields
                .into_iter()
                .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
                .collect();
            assert_eq!(
                fields,
                [
                    (":status".to_string(), status.as_str().to_string()),
                    ("content-type".into(), "application/grpc".into()),
                    ("grpc-message".into(), "x".repeat(300)),
                ]
            );
        }
    }

    #[test]
    fn a_request_block_becomes_a_request_and_bad_fields_are_named() {
        let mut encoder = loona_hpack::Encoder::new();
        let block = encoder.encode([
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":authority", b"meshd:15010"),
            (
                b":path",
                b"/envoy.service.discovery.v3.AggregatedDiscoveryService/X",
            ),
            (b"te", b"trailers"),
        ]);
        let mut decoder = loona_hpack::Decoder::new();
        let request = decode(&mut decoder, &block)
            .unwrap()
            .unwrap()
            .into_request(())
            .unwrap();
        assert_eq!(request.method(), Method::POST);
        assert_eq!(
            request.uri().path(),
            "/envoy.service.discovery.v3.AggregatedDiscoveryService/X"
        );
        assert_eq!(request.uri().authority().unwrap().as_str(), "meshd:15010");
        assert_eq!(request.headers()["te"], "trailers");

        let block = encoder.encode([(&b":protocol"[..], &b"x"[..])]);
        let bad = decode(&mut decoder, &block).unwrap().err().unwrap();
        assert!(bad.contains(":protocol"), "{bad}");
        let missing = decode(&mut decoder, &encoder.encode([(&b"te"[..], &b"x"[..])]))
            .unwrap()
            .unwrap()
            .into_request(())
            .err()
            .unwrap();
        assert!(missing.contains(":path"), "{missing}");
        assert!(decode(&mut decoder, &[0xff, 0xff, 0xff]).is_err());
    }
}
