//! ADS responses on the wire without per-proxy copies. A response holds `Arc`s to the
//! push's shared encoded resources, and the response body hands HTTP/2 shared bytes: large
//! bodies themselves (`Bytes::from_owner`), and the entries of a large response as a run
//! encoded once for every response that carries the same resources ([`joined`]). A
//! thousand proxies receiving the same 500 KB of clusters share one copy of it, and no
//! stream keeps an encode buffer as large as the largest response it ever sent (tonic's
//! encoder does, which cost ~1 MB per connected proxy on a 1,000-service mesh). The
//! encoding is
//! `envoy.service.discovery.v3.DiscoveryResponse` / `DeltaDiscoveryResponse` field for
//! field (a unit test decodes it with the generated types).
//!
//! The gRPC service is routed here by hand, as tonic's generated server would, with
//! requests decoded by [`Messages`] and the response body framed here.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use envoy_api::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use futures::Stream;
use http_body::Frame;
use prometheus_client::metrics::gauge::Gauge;
use prost::bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;
use tonic::codegen::{BoxFuture, Service, StdError, http};

use super::joined::{self, Entry, Runs};
use super::resource::Resource;

pub use grpc_messages::{FRAME_HEADER, Messages, prost_frame, put_frame_header};

/// The resources one response carries, as one shared list. A view's whole set is one
/// batch for every proxy sent all of it (each proxy that connects: ~2,400 resources on an
/// unscoped 1,000-service mesh), and the changes between two views one batch for every
/// proxy stepping between them, so a response and what its connection keeps of it until
/// the ACK take one reference, not one per resource, and each encoding's length is
/// counted once per batch rather than once per response.
#[derive(Clone, Debug, Default)]
pub struct Batch(Arc<BatchInner>);

#[derive(Debug, Default)]
struct BatchInner {
    list: Vec<Arc<Resource>>,
    /// The encoded length of the entries, per [`Entry`]: delta with versions, delta
    /// without, state of the world.
    lens: [OnceLock<usize>; 3],
    /// The resources' own bytes (`pilot_xds_config_size_bytes`).
    values: OnceLock<usize>,
}

impl Batch {
    /// The resources' encoded messages, in bytes (counted once per batch).
    pub fn values_len(&self) -> usize {
        *(self.0.values).get_or_init(|| self.0.list.iter().map(|r| r.value_len()).sum())
    }

    fn entries_len(&self, entry: Entry) -> usize {
        let i = match entry {
            Entry::Delta { versions: true } => 0,
            Entry::Delta { versions: false } => 1,
            Entry::Sotw => 2,
        };
        *self.0.lens[i].get_or_init(|| {
            let list = self.0.list.iter();
            match entry {
                Entry::Delta { versions } => list
                    .map(|r| message_len(2, delta_resource_len(r, versions)))
                    .sum(),
                Entry::Sotw => list.map(|r| message_len(2, any_len(r))).sum(),
            }
        })
    }
}

impl From<Vec<Arc<Resource>>> for Batch {
    fn from(list: Vec<Arc<Resource>>) -> Self {
        Batch(Arc::new(BatchInner {
            list,
            lens: Default::default(),
            values: OnceLock::new(),
        }))
    }
}

impl std::ops::Deref for Batch {
    type Target = [Arc<Resource>];

    fn deref(&self) -> &[Arc<Resource>] {
        &self.0.list
    }
}

/// A state-of-the-world response: the full subscribed set.
#[derive(Debug)]
pub struct SotwResponse {
    pub version_info: String,
    pub type_url: &'static str,
    pub nonce: String,
    pub resources: Batch,
    /// Who answered (`control_plane.identifier`): only on istioctl's debug responses,
    /// as istiod sends it.
    pub control_plane: Option<Arc<str>>,
}

impl SotwResponse {
    pub fn new(
        version_info: String,
        type_url: &'static str,
        nonce: String,
        resources: impl Into<Batch>,
    ) -> Self {
        SotwResponse {
            version_info,
            type_url,
            nonce,
            resources: resources.into(),
            control_plane: None,
        }
    }

    /// The encoded length of the resources' entries (counted once per batch).
    fn entries_len(&self) -> usize {
        self.resources.entries_len(Entry::Sotw)
    }
}

/// A delta response: what changed, and the names removed.
#[derive(Debug)]
pub struct DeltaResponse {
    pub system_version_info: String,
    pub type_url: &'static str,
    pub nonce: String,
    pub resources: Batch,
    pub removed: Vec<String>,
    /// Whether each resource carries its version.
    pub versions: bool,
    /// As [`SotwResponse::control_plane`].
    pub control_plane: Option<Arc<str>>,
}

impl DeltaResponse {
    /// With `versions`, each resource carries its version (its content hash), which Envoy
    /// names back in `initial_resource_versions` when it reconnects; without, the version
    /// is empty, as istiod sends every delta resource.
    pub fn new(
        system_version_info: String,
        type_url: &'static str,
        nonce: String,
        resources: impl Into<Batch>,
        removed: Vec<String>,
        versions: bool,
    ) -> Self {
        DeltaResponse {
            system_version_info,
            type_url,
            nonce,
            resources: resources.into(),
            removed,
            versions,
            control_plane: None,
        }
    }

    fn entry(&self) -> Entry {
        Entry::Delta {
            versions: self.versions,
        }
    }

    /// The encoded length of the resources' entries (counted once per batch).
    fn entries_len(&self) -> usize {
        self.resources.entries_len(self.entry())
    }
}

/// Where an encoded message goes: small fields into a buffer, resource bodies by
/// reference.
pub trait Sink {
    fn buf(&mut self) -> &mut BytesMut;
    fn shared(&mut self, resource: &Arc<Resource>);
    /// Encoded entries shared with other frames ([`joined`]).
    fn run(&mut self, bytes: Bytes);
    /// Where shared runs are kept, for a sink that sends them.
    fn runs(&self) -> Option<&Runs> {
        None
    }
}

/// A sink that copies everything into one buffer (how a shared run is built).
struct Copy<'a>(&'a mut BytesMut);

impl Sink for Copy<'_> {
    fn buf(&mut self) -> &mut BytesMut {
        self.0
    }

    fn shared(&mut self, r: &Arc<Resource>) {
        for p in r.pieces() {
            self.0.put_slice(p);
        }
    }

    fn run(&mut self, bytes: Bytes) {
        self.0.put_slice(&bytes);
    }
}

/// Resource bodies below this size are copied into the frame; larger ones are sent from
/// the shared allocation.
const SHARE_AT: usize = 2048;

/// The chunks of one gRPC frame: small pieces coalesced, large bodies shared, large runs
/// of entries taken from `runs`.
pub struct Chunks<'a> {
    out: VecDeque<Bytes>,
    small: BytesMut,
    runs: &'a Runs,
}

impl Chunks<'_> {
    fn flush_small(&mut self) {
        if !self.small.is_empty() {
            self.out.push_back(self.small.split().freeze());
        }
    }
}

impl Sink for Chunks<'_> {
    fn buf(&mut self) -> &mut BytesMut {
        &mut self.small
    }

    fn shared(&mut self, r: &Arc<Resource>) {
        for p in r.pieces() {
            if shares(p) {
                self.flush_small();
                self.out.push_back(Bytes::from_owner(p.clone()));
            } else {
                self.small.put_slice(p);
            }
        }
    }

    fn run(&mut self, bytes: Bytes) {
        self.flush_small();
        self.out.push_back(bytes);
    }

    fn runs(&self) -> Option<&Runs> {
        Some(self.runs)
    }
}

/// Whether [`Chunks`] sends a piece of a resource's value by reference (else copies it).
fn shares(piece: &[u8]) -> bool {
    piece.len() >= SHARE_AT
}

impl Chunks<'_> {
    /// `message` as one gRPC frame (uncompressed flag, big-endian length, bytes), its
    /// large runs of entries shared through `runs`.
    pub fn frame(message: &impl WireMessage, runs: &Runs) -> VecDeque<Bytes> {
        let mut c = Chunks {
            out: VecDeque::new(),
            small: BytesMut::new(),
            runs,
        };
        let len = message.encoded_len();
        // Exactly what is copied: growing the buffer as it fills copied a 1.4 MB initial
        // configuration about twice more (a quarter of meshd's CPU in a connect storm).
        c.small.reserve(FRAME_HEADER + len - message.shared_len());
        put_frame_header(&mut c.small, len);
        message.encode(&mut c);
        if !c.small.is_empty() {
            let rest = c.small.split().freeze();
            c.out.push_back(rest);
        }
        c.out
    }
}

/// A message this module knows how to put on the wire.
pub trait WireMessage {
    fn encoded_len(&self) -> usize;
    /// The part of `encoded_len` sent from shared allocations rather than copied.
    fn shared_len(&self) -> usize;
    fn encode(&self, sink: &mut impl Sink);
}

impl<M: WireMessage> WireMessage for Box<M> {
    fn encoded_len(&self) -> usize {
        (**self).encoded_len()
    }
    fn shared_len(&self) -> usize {
        (**self).shared_len()
    }
    fn encode(&self, sink: &mut impl Sink) {
        (**self).encode(sink)
    }
}

fn string_len(tag: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        key_len(tag) + encoded_len_varint(s.len() as u64) + s.len()
    }
}

fn put_string(tag: u32, s: &str, buf: &mut BytesMut) {
    if !s.is_empty() {
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(s.len() as u64, buf);
        buf.put_slice(s.as_bytes());
    }
}

fn message_len(tag: u32, inner: usize) -> usize {
    key_len(tag) + encoded_len_varint(inner as u64) + inner
}

/// `google.protobuf.Any` of a resource: type_url = 1, value = 2.
fn any_len(r: &Resource) -> usize {
    string_len(1, r.type_url()) + message_len(2, r.value_len())
}

/// The bytes of a resource's value that [`Chunks`] sends by reference.
fn shared_len(r: &Resource) -> usize {
    r.pieces()
        .iter()
        .filter(|p| shares(p))
        .map(|p| p.len())
        .sum()
}

fn put_any(tag: u32, r: &Arc<Resource>, sink: &mut impl Sink) {
    let buf = sink.buf();
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(any_len(r) as u64, buf);
    put_string(1, r.type_url(), buf);
    encode_key(2, WireType::LengthDelimited, buf);
    encode_varint(r.value_len() as u64, buf);
    sink.shared(r);
}

/// Whether a response's entries (`entries_len` bytes) go out as a shared run.
fn as_run(entries_len: usize) -> bool {
    entries_len >= joined::JOIN_AT
}

/// The bytes of a response's entries sent by reference: all of them as a shared run, or
/// the large pieces of their values.
fn entries_shared_len(resources: &[Arc<Resource>], entries_len: usize) -> usize {
    if as_run(entries_len) {
        entries_len
    } else {
        resources.iter().map(|r| shared_len(r)).sum()
    }
}

/// A response's entries as a shared run, if they are large enough ([`joined`]), each
/// written by `put`; else `None`, and the caller writes them one by one. The run goes last
/// in the frame (protobuf fields may come in any order), so that the response is whole
/// once its last chunk is written: a small chunk after it waited for the stream's task to
/// be polled again, behind every other stream.
fn shared_run(
    runs: Option<&Runs>,
    entry: Entry,
    resources: &[Arc<Resource>],
    entries_len: usize,
    put: impl Fn(&Arc<Resource>, &mut Copy<'_>),
) -> Option<Bytes> {
    runs.filter(|_| as_run(entries_len)).map(|runs| {
        runs.get(entry, resources, entries_len, |buf| {
            let mut copy = Copy(buf);
            for r in resources {
                put(r, &mut copy);
            }
        })
    })
}

impl WireMessage for SotwResponse {
    fn encoded_len(&self) -> usize {
        string_len(1, &self.version_info)
            + self.entries_len()
            + string_len(4, self.type_url)
            + string_len(5, &self.nonce)
            + control_plane_len(6, self.control_plane.as_deref())
    }

    fn shared_len(&self) -> usize {
        entries_shared_len(&self.resources, self.entries_len())
    }

    fn encode(&self, sink: &mut impl Sink) {
        put_string(1, &self.version_info, sink.buf());
        let run = shared_run(
            sink.runs(),
            Entry::Sotw,
            &self.resources,
            self.entries_len(),
            |r, c| put_any(2, r, c),
        );
        if run.is_none() {
            for r in self.resources.iter() {
                put_any(2, r, sink);
            }
        }
        put_string(4, self.type_url, sink.buf());
        put_string(5, &self.nonce, sink.buf());
        put_control_plane(6, self.control_plane.as_deref(), sink.buf());
        if let Some(run) = run {
            sink.run(run);
        }
    }
}

/// `envoy.config.core.v3.ControlPlane` (identifier = 1) as field `tag`, when there is one.
fn control_plane_len(tag: u32, identifier: Option<&str>) -> usize {
    identifier.map_or(0, |id| message_len(tag, string_len(1, id)))
}

fn put_control_plane(tag: u32, identifier: Option<&str>, buf: &mut BytesMut) {
    if let Some(id) = identifier {
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(string_len(1, id) as u64, buf);
        put_string(1, id, buf);
    }
}

/// The version a delta entry carries: `r`'s, or none.
fn entry_version(r: &Resource, versions: bool) -> &str {
    if versions { &r.version } else { "" }
}

/// `envoy.service.discovery.v3.Resource`: version = 1, resource = 2, name = 3.
fn delta_resource_len(r: &Resource, versions: bool) -> usize {
    string_len(1, entry_version(r, versions)) + message_len(2, any_len(r)) + string_len(3, &r.name)
}

/// A delta response's entry for `r`.
fn put_delta_entry(r: &Arc<Resource>, versions: bool, sink: &mut impl Sink) {
    let buf = sink.buf();
    encode_key(2, WireType::LengthDelimited, buf);
    encode_varint(delta_resource_len(r, versions) as u64, buf);
    put_string(1, entry_version(r, versions), buf);
    put_any(2, r, sink);
    put_string(3, &r.name, sink.buf());
}

impl WireMessage for DeltaResponse {
    fn encoded_len(&self) -> usize {
        string_len(1, &self.system_version_info)
            + self.entries_len()
            + string_len(4, self.type_url)
            + string_len(5, &self.nonce)
            + self.removed.iter().map(|n| string_len(6, n)).sum::<usize>()
            + control_plane_len(7, self.control_plane.as_deref())
    }

    fn shared_len(&self) -> usize {
        entries_shared_len(&self.resources, self.entries_len())
    }

    fn encode(&self, sink: &mut impl Sink) {
        put_string(1, &self.system_version_info, sink.buf());
        let versions = self.versions;
        let run = shared_run(
            sink.runs(),
            self.entry(),
            &self.resources,
            self.entries_len(),
            |r, c| put_delta_entry(r, versions, c),
        );
        if run.is_none() {
            for r in self.resources.iter() {
                put_delta_entry(r, versions, sink);
            }
        }
        put_string(4, self.type_url, sink.buf());
        put_string(5, &self.nonce, sink.buf());
        for n in &self.removed {
            put_string(6, n, sink.buf());
        }
        put_control_plane(7, self.control_plane.as_deref(), sink.buf());
        if let Some(run) = run {
            sink.run(run);
        }
    }
}

/// A bound on the response bytes framed for the wire and not yet written to a socket,
/// across every stream. A response's frame is only built once its size fits; its bytes
/// count until HTTP/2 has written the last of them. Without it, a connect storm of proxies
/// that read slowly holds one full initial configuration per proxy in memory at once.
#[derive(Clone)]
pub struct SendBudget {
    permits: Arc<Semaphore>,
    total: u32,
    /// Bytes held now (`meshd_xds_send_buffer_bytes`).
    held: Gauge,
}

impl SendBudget {
    pub fn new(bytes: usize, held: Gauge) -> SendBudget {
        let total = u32::try_from(bytes).unwrap_or(u32::MAX).max(1);
        SendBudget {
            permits: Arc::new(Semaphore::new(total as usize)),
            total,
            held,
        }
    }

    /// Waits until a frame of `len` bytes fits (a frame larger than the whole budget
    /// waits for all of it).
    fn reserve(&self, len: usize) -> BoxFuture<Reserved, Status> {
        let n = u32::try_from(len).unwrap_or(u32::MAX).clamp(1, self.total);
        let (permits, held) = (self.permits.clone(), self.held.clone());
        Box::pin(async move {
            let permit = permits
                .acquire_many_owned(n)
                .await
                .map_err(|_| Status::unavailable("shutting down"))?;
            held.inc_by(i64::from(n));
            Ok(Reserved { permit, held })
        })
    }
}

/// One frame's share of the budget, given back when the last of its chunks is dropped.
struct Reserved {
    permit: OwnedSemaphorePermit,
    held: Gauge,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.held.dec_by(self.permit.num_permits() as i64);
    }
}

/// A chunk of a frame that holds its frame's share of the budget.
struct Budgeted {
    chunk: Bytes,
    _share: Arc<Reserved>,
}

impl AsRef<[u8]> for Budgeted {
    fn as_ref(&self) -> &[u8] {
        &self.chunk
    }
}

/// A response stream as an HTTP/2 body of gRPC frames, then the status trailers.
pub struct FrameBody<S, M> {
    stream: Pin<Box<S>>,
    pending: VecDeque<Bytes>,
    done: bool,
    framing: Framing,
    /// A message waiting for its frame to fit in the budget (with none, it does not wait).
    waiting: Option<(M, Option<BoxFuture<Reserved, Status>>)>,
}

impl<S, M> FrameBody<S, M> {
    pub fn new(stream: S, framing: Framing) -> Self {
        FrameBody {
            stream: Box::pin(stream),
            pending: VecDeque::new(),
            done: false,
            framing,
            waiting: None,
        }
    }
}

impl<S, M> http_body::Body for FrameBody<S, M>
where
    S: Stream<Item = Result<M, Status>> + Send + 'static,
    M: WireMessage + Unpin,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Some(chunk) = this.pending.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if this.done {
            return Poll::Ready(None);
        }
        let status = loop {
            if let Some((message, reserving)) = &mut this.waiting {
                // The frame is built (copied) only once it fits.
                let reserved = match reserving.as_mut().map(|r| r.as_mut().poll(cx)) {
                    Some(Poll::Pending) => return Poll::Pending,
                    Some(Poll::Ready(Err(status))) => break status,
                    Some(Poll::Ready(Ok(reserved))) => Some(Arc::new(reserved)),
                    None => None,
                };
                let chunks = Chunks::frame(message, &this.framing.runs);
                this.pending = match reserved {
                    Some(reserved) => chunks
                        .into_iter()
                        .map(|chunk| {
                            Bytes::from_owner(Budgeted {
                                chunk,
                                _share: reserved.clone(),
                            })
                        })
                        .collect(),
                    None => chunks,
                };
                this.waiting = None;
                let first = this.pending.pop_front().unwrap_or_default();
                return Poll::Ready(Some(Ok(Frame::data(first))));
            }
            match this.stream.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(message))) => {
                    let reserving = (this.framing.budget.as_ref())
                        .map(|budget| budget.reserve(FRAME_HEADER + message.encoded_len()));
                    this.waiting = Some((message, reserving));
                }
                Poll::Ready(Some(Err(status))) => break status,
                Poll::Ready(None) => break Status::ok(""),
            }
        };
        this.done = true;
        let mut trailers = http::HeaderMap::new();
        if status.add_header(&mut trailers).is_err() {
            trailers.insert("grpc-status", http::HeaderValue::from_static("13"));
        }
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }
}

/// The two ADS methods, as the server side implements them.
pub trait Ads: Send + Sync + 'static {
    type SotwStream: Stream<Item = Result<Box<SotwResponse>, Status>> + Send + 'static;
    type DeltaStream: Stream<Item = Result<Box<DeltaResponse>, Status>> + Send + 'static;

    fn sotw(
        &self,
        request: tonic::Request<Messages<DiscoveryRequest>>,
    ) -> impl Future<Output = Result<tonic::Response<Self::SotwStream>, Status>> + Send;

    fn delta(
        &self,
        request: tonic::Request<Messages<DeltaDiscoveryRequest>>,
    ) -> impl Future<Output = Result<tonic::Response<Self::DeltaStream>, Status>> + Send;
}

const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// `envoy.service.discovery.v3.AggregatedDiscoveryService` over an [`Ads`].
pub struct AdsServer<T> {
    inner: Arc<T>,
    max_decoding_message_size: usize,
    framing: Framing,
}

/// What every response body of a server shares: the send budget (none: unbounded) and the
/// kept runs of encoded entries.
#[derive(Clone)]
pub struct Framing {
    pub budget: Option<SendBudget>,
    pub runs: Arc<Runs>,
}

impl<T> Clone for AdsServer<T> {
    fn clone(&self) -> Self {
        AdsServer {
            inner: self.inner.clone(),
            max_decoding_message_size: self.max_decoding_message_size,
            framing: self.framing.clone(),
        }
    }
}

impl<T: Ads> AdsServer<T> {
    /// Requests are limited to `max_decoding_message_size`; responses share `framing`.
    pub fn new(inner: T, max_decoding_message_size: usize, framing: Framing) -> Self {
        AdsServer {
            inner: Arc::new(inner),
            max_decoding_message_size,
            framing,
        }
    }
}

impl<T> tonic::server::NamedService for AdsServer<T> {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

/// The HTTP response for a handler's answer: gRPC frames, or the refusal as a
/// trailers-only response.
fn respond<S, M>(
    answer: Result<tonic::Response<S>, Status>,
    framing: Framing,
) -> http::Response<tonic::body::Body>
where
    S: Stream<Item = Result<M, Status>> + Send + 'static,
    M: WireMessage + Unpin + Send + 'static,
{
    match answer {
        Err(status) => status.into_http(),
        Ok(response) => {
            let (metadata, stream, _) = response.into_parts();
            let mut http =
                http::Response::new(tonic::body::Body::new(FrameBody::new(stream, framing)));
            *http.headers_mut() = metadata.into_headers();
            http.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            http
        }
    }
}

impl<T, B> Service<http::Request<B>> for AdsServer<T>
where
    T: Ads,
    B: tonic::codegen::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let limit = self.max_decoding_message_size;
        let framing = self.framing.clone();
        let path = req.uri().path().to_string();
        let (parts, body) = req.into_parts();
        Box::pin(async move {
            Ok(match path.as_str() {
                SOTW_PATH => {
                    let requests = Messages::<DiscoveryRequest>::new(body, limit);
                    let request =
                        tonic::Request::from_http(http::Request::from_parts(parts, requests));
                    respond(inner.sotw(request).await, framing)
                }
                DELTA_PATH => {
                    let requests = Messages::<DeltaDiscoveryRequest>::new(body, limit);
                    let request =
                        tonic::Request::from_http(http::Request::from_parts(parts, requests));
                    respond(inner.delta(request).await, framing)
                }
                _ => Status::unimplemented(format!("no method {path}")).into_http(),
            })
        })
    }
}

#[cfg(test)]
mod tests;
