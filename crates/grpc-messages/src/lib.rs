//! gRPC messages decoded from the frames of an HTTP/2 body as each completes, without
//! joining the chunks they arrived in, and a message framed for sending. meshd decodes
//! the requests of its ADS streams with it, and the fleet simulator the responses.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::pin::Pin;

use futures::{Stream, StreamExt};
use prost::bytes::{Buf, BufMut, Bytes, BytesMut};
use tonic::codegen::StdError;
use tonic::{Code, Status};

/// A gRPC message's frame header: the compressed flag and the length (big-endian).
pub const FRAME_HEADER: usize = 5;

/// The frame header of an uncompressed message of `len` bytes.
pub fn put_frame_header(buf: &mut BytesMut, len: usize) {
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
}

/// The messages of one side of a gRPC stream, decoded from their frames as each completes:
/// the requests of an ADS stream in meshd, the responses in the fleet simulator. Unlike
/// tonic's `Streaming`, whose buffer keeps the capacity of the largest message it ever held
/// (an initial request naming every cluster: ~70 KB per connected proxy on a 1,000-service
/// mesh; an initial configuration: ~1.5 MB per simulated proxy), the buffer here is
/// released whenever it empties. A message is decoded from the chunks its frame arrived in,
/// without copying them into one buffer first (a simulated proxy's 1.4 MB initial
/// configuration was copied once more that way, into memory faulted in for it), and
/// `bytes` fields are decoded as slices of those chunks.
pub struct Messages<M> {
    chunks: Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send>>,
    received: Received,
    limit: usize,
    failed: bool,
    _message: PhantomData<fn() -> M>,
}

/// `message` as one uncompressed gRPC frame.
pub fn prost_frame(message: &impl prost::Message) -> Bytes {
    let len = message.encoded_len();
    let mut frame = BytesMut::with_capacity(FRAME_HEADER + len);
    put_frame_header(&mut frame, len);
    message.encode_raw(&mut frame);
    frame.freeze()
}

impl<M: prost::Message + Default> Messages<M> {
    /// Messages carried by `body`, each at most `limit` bytes. A `grpc-status` other than
    /// OK in the body's trailers ends them with that status.
    pub fn new<B>(body: B, limit: usize) -> Self
    where
        B: http_body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<StdError>,
    {
        let chunks = futures::stream::unfold(Box::pin(body), |mut body| async move {
            loop {
                match std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await? {
                    Ok(frame) => match frame.into_data() {
                        Ok(mut data) => {
                            let bytes = data.copy_to_bytes(data.remaining());
                            return Some((Ok(bytes), body));
                        }
                        Err(frame) => {
                            let status = frame.trailers_ref().and_then(Status::from_header_map);
                            if let Some(status) = status.filter(|s| s.code() != Code::Ok) {
                                return Some((Err(status), body));
                            }
                        }
                    },
                    Err(e) => return Some((Err(Status::from_error(e.into())), body)),
                }
            }
        });
        Messages {
            chunks: Box::pin(chunks),
            received: Received::default(),
            limit,
            failed: false,
            _message: PhantomData,
        }
    }

    /// The next message; `None` when the peer ended the stream. After an error (a broken
    /// stream, a frame that does not decode, an error status) there are no more.
    pub async fn message(&mut self) -> Result<Option<M>, Status> {
        if self.failed {
            return Ok(None);
        }
        let next = self.next().await;
        self.failed = next.is_err();
        next
    }

    async fn next(&mut self) -> Result<Option<M>, Status> {
        loop {
            if let Some(message) = self.decode_buffered()? {
                return Ok(Some(message));
            }
            match self.chunks.next().await {
                Some(Ok(chunk)) => self.received.push(chunk),
                Some(Err(status)) => return Err(status),
                None if self.received.len == 0 => return Ok(None),
                None => {
                    return Err(Status::invalid_argument(format!(
                        "the stream ended inside a {} ({} bytes of its frame received)",
                        message_name::<M>(),
                        self.received.len
                    )));
                }
            }
        }
    }

    /// A message, if what was received holds a whole one.
    fn decode_buffered(&mut self) -> Result<Option<M>, Status> {
        let Some(header) = self.received.header() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if header[0] != 0 {
            return Err(Status::unimplemented(format!(
                "a compressed {}: meshd accepts no grpc-encoding",
                message_name::<M>()
            )));
        }
        if len > self.limit {
            return Err(Status::resource_exhausted(format!(
                "a {} of {len} bytes, over the limit of {} bytes",
                message_name::<M>(),
                self.limit
            )));
        }
        if self.received.len < FRAME_HEADER + len {
            return Ok(None);
        }
        let mut frame = self.received.split_frame(FRAME_HEADER + len);
        frame.advance(FRAME_HEADER);
        M::decode(frame).map(Some).map_err(|e| {
            Status::invalid_argument(format!(
                "a {} that does not decode: {e}",
                message_name::<M>()
            ))
        })
    }
}

/// Bytes received and not yet decoded, in the chunks they arrived in; as a [`Buf`], the
/// bytes of one frame (or of a field of one: the fleet simulator reads a resource that
/// spans chunks with it). `copy_to_bytes` slices a chunk, and copies only across chunks.
#[derive(Default)]
pub struct Received {
    parts: VecDeque<Bytes>,
    len: usize,
}

impl Received {
    /// Chunks a stream keeps room for once it has emptied (a large message's list of
    /// chunks is released with it).
    const KEPT_PARTS: usize = 4;

    pub fn push(&mut self, chunk: Bytes) {
        if !chunk.is_empty() {
            self.len += chunk.len();
            self.parts.push_back(chunk);
        }
    }

    /// The first frame header, once received whole.
    fn header(&self) -> Option<[u8; FRAME_HEADER]> {
        if self.len < FRAME_HEADER {
            return None;
        }
        let mut header = [0; FRAME_HEADER];
        let mut at = 0;
        for part in &self.parts {
            let n = part.len().min(FRAME_HEADER - at);
            header[at..at + n].copy_from_slice(&part[..n]);
            at += n;
            if at == FRAME_HEADER {
                break;
            }
        }
        Some(header)
    }

    /// The first `n` bytes (at most `self.len`), taken out without copying.
    fn split_frame(&mut self, n: usize) -> Received {
        let mut out = Received::default();
        while out.len < n {
            let Some(front) = self.parts.front_mut() else {
                break;
            };
            let want = n - out.len;
            if front.len() <= want {
                let part = self.parts.pop_front().expect("a front part");
                out.push(part);
            } else {
                out.push(front.split_to(want));
            }
        }
        self.len -= out.len;
        if self.parts.is_empty() && self.parts.capacity() > Self::KEPT_PARTS {
            self.parts = VecDeque::new();
        }
        out
    }
}

impl Buf for Received {
    fn remaining(&self) -> usize {
        self.len
    }

    fn chunk(&self) -> &[u8] {
        self.parts.front().map_or(&[], |b| &b[..])
    }

    fn advance(&mut self, mut cnt: usize) {
        assert!(cnt <= self.len, "advanced past the end of a frame");
        self.len -= cnt;
        while cnt > 0 {
            let front = self.parts.front_mut().expect("a front part");
            if cnt < front.len() {
                front.advance(cnt);
                return;
            }
            cnt -= front.len();
            self.parts.pop_front();
        }
    }

    /// A slice of the chunk it lies in; copied only when it spans chunks.
    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        assert!(len <= self.len, "read past the end of a frame");
        if let Some(front) = self.parts.front_mut()
            && front.len() >= len
        {
            let out = front.split_to(len);
            if front.is_empty() {
                self.parts.pop_front();
            }
            self.len -= len;
            return out;
        }
        let mut out = BytesMut::with_capacity(len);
        out.put((&mut *self).take(len));
        out.freeze()
    }
}

/// `DeltaDiscoveryRequest` for `envoy_api::...::DeltaDiscoveryRequest`.
fn message_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

#[cfg(test)]
mod tests {
    use std::task::{Context, Poll};

    use envoy_api::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
    use http_body::Frame;
    use prost::Message;
    use tonic::codegen::http;

    use super::*;

    /// An HTTP/2 body as the receiving side sees it: these frames, then its end.
    struct Chunked(VecDeque<Result<Frame<Bytes>, Status>>);

    impl http_body::Body for Chunked {
        type Data = Bytes;
        type Error = Status;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            Poll::Ready(self.get_mut().0.pop_front())
        }
    }

    fn requests(chunks: Vec<Vec<u8>>, limit: usize) -> Messages<DeltaDiscoveryRequest> {
        let chunks = chunks
            .into_iter()
            .map(|c| Ok(Frame::data(Bytes::from(c))))
            .collect();
        Messages::new(Chunked(chunks), limit)
    }

    fn grpc_frame(flag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![flag];
        out.extend((body.len() as u32).to_be_bytes());
        out.extend(body);
        out
    }

    fn request(names: usize) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment".into(),
            resource_names_subscribe: (0..names)
                .map(|i| format!("outbound|9080||svc-{i}.ns.svc.cluster.local"))
                .collect(),
            ..Default::default()
        }
    }

    fn block_on<T>(f: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn requests_decode_across_chunk_boundaries_and_free_their_buffer() {
        let (small, large) = (request(1), request(2_000));
        let mut bytes = grpc_frame(0, &small.encode_to_vec());
        bytes.extend(grpc_frame(0, &large.encode_to_vec()));
        bytes.extend(grpc_frame(0, &small.encode_to_vec()));
        // A header split in two, a message over many chunks, two messages in one chunk.
        let cuts = [3, 40, 20_000, 60_000, bytes.len()];
        let mut chunks = Vec::new();
        let mut at = 0;
        for cut in cuts {
            chunks.push(bytes[at..cut].to_vec());
            at = cut;
        }
        block_on(async {
            let mut r = requests(chunks, 4 << 20);
            assert_eq!(r.message().await.unwrap(), Some(small.clone()));
            assert_eq!(r.message().await.unwrap(), Some(large));
            assert_eq!(r.message().await.unwrap(), Some(small));
            // Nothing of the ~100 KB the large request took is kept for the stream's life.
            assert_eq!(r.received.len, 0);
            assert!(r.received.parts.capacity() <= Received::KEPT_PARTS);
            assert_eq!(r.message().await.unwrap(), None);
        });
    }

    /// A message with `bytes` fields, as the fleet simulator decodes responses.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Blobs {
        #[prost(bytes = "bytes", repeated, tag = "1")]
        blobs: Vec<Bytes>,
    }

    #[test]
    fn a_frame_is_decoded_from_its_chunks_without_copying_them() {
        let message = Blobs {
            blobs: (0..40u8).map(|i| Bytes::from(vec![i; 1000])).collect(),
        };
        let frame = grpc_frame(0, &message.encode_to_vec());
        let chunks: Vec<Bytes> = (frame.chunks(4096)).map(Bytes::copy_from_slice).collect();
        let mut messages = Messages::<Blobs>::new(
            Chunked(chunks.iter().map(|c| Ok(Frame::data(c.clone()))).collect()),
            1 << 20,
        );
        let got = block_on(messages.message()).unwrap().unwrap();
        assert_eq!(got, message);
        // A field inside one chunk is a slice of it; only those that span two are copied.
        let within_a_chunk =
            |b: &Bytes| (chunks.iter()).any(|c| c.as_ptr_range().contains(&b.as_ptr()));
        let sliced = got.blobs.iter().filter(|b| within_a_chunk(b)).count();
        let spanning = (frame.len() / 4096).min(message.blobs.len());
        assert!(sliced >= message.blobs.len() - spanning, "{sliced} sliced");
        assert!(
            sliced < message.blobs.len(),
            "a blob that spans chunks is copied"
        );
    }

    #[test]
    fn frames_that_are_no_request_end_the_stream_with_a_clear_status() {
        let cases = [
            (
                grpc_frame(0, b"\xff\xff\xff garbage"),
                tonic::Code::InvalidArgument,
                "a DeltaDiscoveryRequest that does not decode",
            ),
            (
                grpc_frame(1, &request(1).encode_to_vec()),
                tonic::Code::Unimplemented,
                "a compressed DeltaDiscoveryRequest",
            ),
            (
                grpc_frame(0, &request(100).encode_to_vec()),
                tonic::Code::ResourceExhausted,
                "over the limit of 1000 bytes",
            ),
            (
                grpc_frame(0, &request(1).encode_to_vec())[..20].to_vec(),
                tonic::Code::InvalidArgument,
                "the stream ended inside a DeltaDiscoveryRequest",
            ),
        ];
        for (bytes, code, text) in cases {
            block_on(async {
                let mut r = requests(vec![bytes], 1000);
                let status = r.message().await.unwrap_err();
                assert_eq!(status.code(), code, "{status:?}");
                assert!(status.message().contains(text), "{status:?}");
                assert_eq!(r.message().await.unwrap(), None, "nothing after an error");
            });
        }
        // A broken stream's error is passed on.
        block_on(async {
            let body = Chunked([Err(Status::cancelled("reset"))].into());
            let mut r = Messages::<DeltaDiscoveryRequest>::new(body, 1000);
            assert_eq!(
                r.message().await.unwrap_err().code(),
                tonic::Code::Cancelled
            );
        });
    }

    #[test]
    fn a_status_in_the_trailers_ends_the_messages_with_it() {
        let trailers = |code: &str| {
            let mut t = http::HeaderMap::new();
            t.insert("grpc-status", code.parse().unwrap());
            t.insert("grpc-message", "cut off".parse().unwrap());
            Ok(Frame::trailers(t))
        };
        let data = Frame::data(Bytes::from(grpc_frame(0, &request(1).encode_to_vec())));
        block_on(async {
            let body = Chunked([Ok(data), trailers("14")].into());
            let mut r = Messages::<DeltaDiscoveryRequest>::new(body, 1000);
            assert_eq!(r.message().await.unwrap(), Some(request(1)));
            let status = r.message().await.unwrap_err();
            assert_eq!(
                (status.code(), status.message()),
                (tonic::Code::Unavailable, "cut off")
            );
            let body = Chunked([trailers("0")].into());
            let mut ok = Messages::<DeltaDiscoveryRequest>::new(body, 1000);
            assert_eq!(ok.message().await.unwrap(), None, "an OK status is the end");
        });
    }
}
