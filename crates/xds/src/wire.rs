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
mod tests {
    use super::*;
    use crate::resource::test_cluster as cluster;
    use envoy_api::pb::envoy::config::cluster::v3::Cluster;
    use envoy_api::pb::envoy::service::discovery::v3::{DeltaDiscoveryResponse, DiscoveryResponse};
    use prost::Message;

    /// The frame's chunks joined, checked against the gRPC header, without it.
    fn unframe(message: &impl WireMessage) -> Vec<u8> {
        let bytes: Vec<u8> = Chunks::frame(message, &Runs::default())
            .into_iter()
            .flatten()
            .collect();
        assert_eq!(bytes[0], 0, "uncompressed");
        let len = u32::from_be_bytes(bytes[1..5].try_into().unwrap()) as usize;
        assert_eq!(len, message.encoded_len());
        assert_eq!(bytes.len(), 5 + len);
        bytes[5..].to_vec()
    }

    #[test]
    fn responses_decode_as_envoys_messages() {
        // One small body (copied into the frame), one large (sent from the shared bytes).
        let a = cluster("outbound|80||a");
        let b = cluster(&format!("outbound|80||{}", "b".repeat(3 * SHARE_AT)));
        assert!(b.value_len() >= SHARE_AT);
        // One kept in pieces: the small ones copied, the large one shared.
        let large: Arc<[u8]> = vec![7u8; 2 * SHARE_AT].into();
        let c = crate::resource::from_pieces::<Cluster>(
            "outbound|80||c",
            vec![vec![1u8, 2].into(), large.clone(), vec![3u8].into()],
        );
        let bc = SotwResponse::new(
            String::new(),
            "t",
            String::new(),
            vec![b.clone(), c.clone()],
        );
        let chunks = Chunks::frame(&bc, &Runs::default());
        // What is sent by reference is what `shared_len` counts (the copy is sized by it).
        let by_reference: usize = chunks
            .iter()
            .filter(|chunk| {
                chunk.as_ptr() == b.value().as_ptr() || chunk.as_ptr() == large.as_ptr()
            })
            .map(|chunk| chunk.len())
            .sum();
        assert_eq!(by_reference, bc.shared_len());
        assert_eq!(by_reference, b.value_len() + large.len());
        let total: usize = chunks.iter().map(|chunk| chunk.len()).sum();
        assert_eq!(total, FRAME_HEADER + bc.encoded_len());
        assert!(
            chunks
                .iter()
                .any(|chunk| chunk.as_ptr() == b.value().as_ptr()),
            "the large body is not copied"
        );
        assert!(
            chunks.iter().any(|chunk| chunk.as_ptr() == large.as_ptr()),
            "the large piece is not copied"
        );
        let sotw = SotwResponse::new(
            "v/3".into(),
            "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            "3-1".into(),
            vec![a.clone(), b.clone(), c.clone()],
        );
        let buf = unframe(&sotw);
        let decoded = DiscoveryResponse::decode(buf.as_slice()).unwrap();
        assert_eq!(decoded.version_info, "v/3");
        assert_eq!(decoded.nonce, "3-1");
        assert_eq!(decoded.type_url, sotw.type_url);
        assert_eq!(decoded.resources, vec![a.any(), b.any(), c.any()]);
        assert_eq!(c.any().value, [&[1u8, 2][..], &large, &[3]].concat());

        // One batch for responses with and without versions: each counts its own length.
        let batch = Batch::from(vec![b.clone(), c.clone()]);
        let delta = DeltaResponse::new(
            "v/4".into(),
            sotw.type_url,
            "4-2".into(),
            batch.clone(),
            vec!["outbound|80||a".into()],
            true,
        );
        let buf = unframe(&delta);
        let decoded = DeltaDiscoveryResponse::decode(buf.as_slice()).unwrap();
        assert_eq!(decoded.system_version_info, "v/4");
        assert_eq!(decoded.removed_resources, vec!["outbound|80||a"]);
        assert_eq!(decoded.resources.len(), 2);
        let r = &decoded.resources[0];
        assert_eq!(
            (r.name.as_str(), r.version.as_str()),
            (&*b.name, b.version.as_str())
        );
        assert_eq!(r.resource.as_ref(), Some(&b.any()));
        assert!(!b.version.is_empty());

        // Without versions: the same resources, each with an empty version.
        let bare = DeltaResponse::new(
            "v/5".into(),
            sotw.type_url,
            "5-1".into(),
            batch.clone(),
            vec![],
            false,
        );
        assert_eq!(
            bare.resources.as_ptr(),
            delta.resources.as_ptr(),
            "one list"
        );
        let decoded = DeltaDiscoveryResponse::decode(unframe(&bare).as_slice()).unwrap();
        let got: Vec<_> = (decoded.resources.iter())
            .map(|r| (r.name.as_str(), r.version.as_str(), r.resource.clone()))
            .collect();
        assert_eq!(
            got,
            [(&*b.name, "", Some(b.any())), (&*c.name, "", Some(c.any()))]
        );
        let version_bytes = 2 * (2 + b.version.len());
        assert_eq!(bare.entries_len() + version_bytes, delta.entries_len());
    }

    #[test]
    fn the_control_plane_identifier_decodes_in_both_framings() {
        use envoy_api::pb::envoy::config::core::v3::ControlPlane;
        // Large enough that the entries go out as a shared run, which comes last.
        let resources: Vec<Arc<Resource>> = (0..300)
            .map(|i| cluster(&format!("outbound|80||cp-{i}.wire-test.svc.cluster.local")))
            .collect();
        assert!(as_run(
            Batch::from(resources.clone()).entries_len(Entry::Sotw)
        ));
        let id: Arc<str> = r#"{"Component":"istiod","ID":"meshd-0"}"#.into();
        let expected = Some(ControlPlane {
            identifier: id.to_string(),
        });
        let mut sotw = SotwResponse::new("v/1".into(), "t", "1-1".into(), resources.clone());
        sotw.control_plane = Some(id.clone());
        let decoded = DiscoveryResponse::decode(unframe(&sotw).as_slice()).unwrap();
        assert_eq!(decoded.control_plane, expected);
        assert_eq!(decoded.resources.len(), 300);
        let mut delta =
            DeltaResponse::new("v/1".into(), "t", "1-2".into(), resources, vec![], true);
        delta.control_plane = Some(id);
        let decoded = DeltaDiscoveryResponse::decode(unframe(&delta).as_slice()).unwrap();
        assert_eq!(decoded.control_plane, expected);
        assert_eq!(decoded.nonce, "1-2");
        // Without one, none is sent (as istiod sends none outside its debug types).
        let bare = SotwResponse::new("v/1".into(), "t", "1-3".into(), vec![]);
        let decoded = DiscoveryResponse::decode(unframe(&bare).as_slice()).unwrap();
        assert_eq!(decoded.control_plane, None);
    }

    #[test]
    fn large_responses_share_their_encoded_entries_between_frames() {
        let cds = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
        let resources: Vec<Arc<Resource>> = (0..400)
            .map(|i| cluster(&format!("outbound|80||run-{i}.wire-test.svc.cluster.local")))
            .collect();
        let delta = |nonce: &str, removed: Vec<String>| {
            let r = resources.clone();
            DeltaResponse::new("v/1".into(), cds, nonce.into(), r, removed, true)
        };
        let (a, b) = (delta("1-1", vec![]), delta("7-3", vec!["gone".into()]));
        assert!(a.entries_len() >= joined::JOIN_AT);
        let runs = Runs::default();
        let (fa, fb) = (Chunks::frame(&a, &runs), Chunks::frame(&b, &runs));
        let run = |frame: &VecDeque<Bytes>| {
            let run = frame.iter().find(|c| c.len() == a.entries_len());
            run.expect("the entries are one chunk").as_ptr()
        };
        assert_eq!(
            run(&fa),
            run(&fb),
            "one copy of the entries for both frames"
        );
        assert_eq!(
            a.shared_len(),
            a.entries_len(),
            "the copied part is sized without it"
        );
        let gone = vec!["gone".to_string()];
        for (response, nonce, removed) in [(&a, "1-1", vec![]), (&b, "7-3", gone)] {
            let decoded = DeltaDiscoveryResponse::decode(unframe(response).as_slice()).unwrap();
            assert_eq!(
                (decoded.nonce.as_str(), decoded.removed_resources),
                (nonce, removed)
            );
            let names: Vec<&str> = decoded.resources.iter().map(|r| r.name.as_str()).collect();
            let expected: Vec<&str> = resources.iter().map(|r| &*r.name).collect();
            assert_eq!(names, expected);
            let last = decoded.resources.last().unwrap();
            assert_eq!(last.version, resources[399].version);
            assert_eq!(last.resource.as_ref(), Some(&resources[399].any()));
        }
        // State of the world: the same resources as bare `Any`s, a run of their own.
        let sotw =
            |nonce: &str| SotwResponse::new("v/1".into(), cds, nonce.into(), resources.clone());
        let (c, d) = (sotw("2-1"), sotw("9-9"));
        let (fc, fd) = (Chunks::frame(&c, &runs), Chunks::frame(&d, &runs));
        let sotw_run = |frame: &VecDeque<Bytes>| {
            let run = frame.iter().find(|chunk| chunk.len() == c.entries_len());
            run.expect("the entries are one chunk").as_ptr()
        };
        assert_eq!(sotw_run(&fc), sotw_run(&fd));
        assert_ne!(sotw_run(&fc), run(&fa));
        // Delta without versions: another run, whose entries carry no version.
        let bare = DeltaResponse::new(
            "v/2".into(),
            cds,
            "3-1".into(),
            resources.clone(),
            vec![],
            false,
        );
        let bare_run = Chunks::frame(&bare, &runs);
        let bare_run = bare_run
            .iter()
            .find(|c| c.len() == bare.entries_len())
            .unwrap();
        assert_ne!(bare_run.as_ptr(), run(&fa));
        let decoded = DeltaDiscoveryResponse::decode(unframe(&bare).as_slice()).unwrap();
        assert!(decoded.resources.iter().all(|r| r.version.is_empty()));
        assert_eq!(decoded.resources.len(), 400);
        let decoded = DiscoveryResponse::decode(unframe(&d).as_slice()).unwrap();
        assert_eq!(decoded.nonce, "9-9");
        let expected: Vec<_> = resources.iter().map(|r| r.any()).collect();
        assert_eq!(decoded.resources, expected);
    }

    /// Polls a response body once, as HTTP/2 does when the stream has room.
    fn poll_once<B: http_body::Body<Data = Bytes, Error = Status> + Unpin>(
        body: &mut B,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        Pin::new(body).poll_frame(&mut Context::from_waker(std::task::Waker::noop()))
    }

    /// Every data chunk a body gives until its trailers.
    fn drain<B: http_body::Body<Data = Bytes, Error = Status> + Unpin>(body: &mut B) -> Vec<Bytes> {
        let mut chunks = Vec::new();
        loop {
            match poll_once(body) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(chunk) => chunks.push(chunk),
                    Err(_) => return chunks, // the trailers
                },
                other => panic!("the body should be ready: {:?}", other.is_ready()),
            }
        }
    }

    #[test]
    fn framed_bytes_wait_for_the_send_budget_until_they_are_written() {
        let response = |n: usize| {
            let resources: Vec<_> = (0..n)
                .map(|i| cluster(&format!("outbound|80||svc-{i}")))
                .collect();
            SotwResponse::new(String::new(), "t", String::new(), resources)
        };
        let len = FRAME_HEADER + response(60).encoded_len();
        let held = Gauge::default();
        // Room for one frame and a half.
        let budget = SendBudget::new(len + len / 2, held.clone());
        let body = |n: usize| {
            let stream = futures::stream::iter([Ok::<_, Status>(response(n))]);
            let framing = Framing {
                budget: Some(budget.clone()),
                runs: Arc::new(Runs::default()),
            };
            FrameBody::new(stream, framing)
        };
        let (mut a, mut b) = (body(60), body(60));
        let a_chunks = drain(&mut a);
        let joined: Vec<u8> = a_chunks.iter().flatten().copied().collect();
        let whole: Vec<u8> = Chunks::frame(&response(60), &Runs::default())
            .into_iter()
            .flatten()
            .collect();
        assert_eq!(joined, whole, "the budget does not change the bytes");
        assert_eq!(held.get(), len as i64);
        // The second frame does not fit while the first one's bytes are unwritten...
        assert!(poll_once(&mut b).is_pending());
        let one = a_chunks[0].clone();
        drop(a_chunks);
        assert!(poll_once(&mut b).is_pending(), "a chunk is still held");
        // ...and does once HTTP/2 has dropped the last of them.
        drop(one);
        assert_eq!(held.get(), 0);
        let b_chunks = drain(&mut b);
        assert_eq!(held.get(), len as i64);
        drop(b_chunks);
        // A frame larger than the whole budget waits for all of it, not forever.
        let mut c = body(200);
        assert!(FRAME_HEADER + response(200).encoded_len() > len + len / 2);
        assert!(!drain(&mut c).is_empty());
        assert_eq!(held.get(), 0);
    }
}
