//! ADS responses on the wire without per-proxy copies. A response holds `Arc`s to the
//! push's shared encoded resources; their bytes are written straight into the gRPC frame
//! buffer when the stream is polled, so a thousand proxies receiving the same 500 KB of
//! clusters share one copy of it instead of each queueing its own. The encoding is
//! `envoy.service.discovery.v3.DiscoveryResponse` / `DeltaDiscoveryResponse` field for
//! field (a unit test decodes it with the generated types).
//!
//! The gRPC service is routed here by hand (what tonic's generated server does), because
//! the generated one fixes the response type to the owned prost message.

use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use prost::bytes::BufMut;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{BoxFuture, Service, StdError, http};
use tonic::{Status, Streaming};

use super::resource::Resource;

/// A state-of-the-world response: the full subscribed set.
#[derive(Debug)]
pub struct SotwResponse {
    pub version_info: String,
    pub type_url: &'static str,
    pub nonce: String,
    pub resources: Vec<Arc<Resource>>,
}

/// A delta response: what changed, and the names removed.
#[derive(Debug)]
pub struct DeltaResponse {
    pub system_version_info: String,
    pub type_url: &'static str,
    pub nonce: String,
    pub resources: Vec<Arc<Resource>>,
    pub removed: Vec<String>,
}

/// A message this module knows how to put on the wire.
pub trait WireMessage {
    fn encoded_len(&self) -> usize;
    fn encode_raw(&self, buf: &mut impl BufMut);
}

fn string_len(tag: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        key_len(tag) + encoded_len_varint(s.len() as u64) + s.len()
    }
}

fn put_string(tag: u32, s: &str, buf: &mut impl BufMut) {
    if !s.is_empty() {
        put_bytes(tag, s.as_bytes(), buf);
    }
}

fn put_bytes(tag: u32, b: &[u8], buf: &mut impl BufMut) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(b.len() as u64, buf);
    buf.put_slice(b);
}

fn message_len(tag: u32, inner: usize) -> usize {
    key_len(tag) + encoded_len_varint(inner as u64) + inner
}

/// `google.protobuf.Any` of a resource: type_url = 1, value = 2.
fn any_len(r: &Resource) -> usize {
    string_len(1, &r.body.type_url) + message_len(2, r.body.value.len())
}

fn put_any(tag: u32, r: &Resource, buf: &mut impl BufMut) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(any_len(r) as u64, buf);
    put_string(1, &r.body.type_url, buf);
    put_bytes(2, &r.body.value, buf);
}

impl WireMessage for SotwResponse {
    fn encoded_len(&self) -> usize {
        string_len(1, &self.version_info)
            + self
                .resources
                .iter()
                .map(|r| message_len(2, any_len(r)))
                .sum::<usize>()
            + string_len(4, self.type_url)
            + string_len(5, &self.nonce)
    }

    fn encode_raw(&self, buf: &mut impl BufMut) {
        put_string(1, &self.version_info, buf);
        for r in &self.resources {
            put_any(2, r, buf);
        }
        put_string(4, self.type_url, buf);
        put_string(5, &self.nonce, buf);
    }
}

/// `envoy.service.discovery.v3.Resource`: version = 1, resource = 2, name = 3.
fn delta_resource_len(r: &Resource) -> usize {
    string_len(1, &r.version) + message_len(2, any_len(r)) + string_len(3, &r.name)
}

impl WireMessage for DeltaResponse {
    fn encoded_len(&self) -> usize {
        string_len(1, &self.system_version_info)
            + self
                .resources
                .iter()
                .map(|r| message_len(2, delta_resource_len(r)))
                .sum::<usize>()
            + string_len(4, self.type_url)
            + string_len(5, &self.nonce)
            + self
                .removed
                .iter()
                .map(|n| key_len(6) + encoded_len_varint(n.len() as u64) + n.len())
                .sum::<usize>()
    }

    fn encode_raw(&self, buf: &mut impl BufMut) {
        put_string(1, &self.system_version_info, buf);
        for r in &self.resources {
            encode_key(2, WireType::LengthDelimited, buf);
            encode_varint(delta_resource_len(r) as u64, buf);
            put_string(1, &r.version, buf);
            put_any(2, r, buf);
            put_string(3, &r.name, buf);
        }
        put_string(4, self.type_url, buf);
        put_string(5, &self.nonce, buf);
        for n in &self.removed {
            put_bytes(6, n.as_bytes(), buf);
        }
    }
}

/// Responses as [`WireMessage`]s, requests decoded by prost.
pub struct AdsCodec<Req, Resp>(PhantomData<fn() -> (Req, Resp)>);

impl<Req, Resp> Default for AdsCodec<Req, Resp> {
    fn default() -> Self {
        AdsCodec(PhantomData)
    }
}

pub struct WireEncoder<Resp>(PhantomData<fn() -> Resp>);

impl<Resp: WireMessage> Encoder for WireEncoder<Resp> {
    type Item = Resp;
    type Error = Status;

    fn encode(&mut self, item: Resp, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode_raw(buf);
        Ok(())
    }
}

impl<Req, Resp> Codec for AdsCodec<Req, Resp>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: WireMessage + Send + 'static,
{
    type Encode = Resp;
    type Decode = Req;
    type Encoder = WireEncoder<Resp>;
    type Decoder = RequestDecoder<Req>;

    fn encoder(&mut self) -> Self::Encoder {
        WireEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder(PhantomData)
    }
}

pub struct RequestDecoder<Req>(PhantomData<fn() -> Req>);

impl<Req: prost::Message + Default> Decoder for RequestDecoder<Req> {
    type Item = Req;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Req>, Status> {
        Req::decode(buf)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

/// The two ADS methods, as the server side implements them.
pub trait Ads: Send + Sync + 'static {
    type SotwStream: futures::Stream<Item = Result<SotwResponse, Status>> + Send + 'static;
    type DeltaStream: futures::Stream<Item = Result<DeltaResponse, Status>> + Send + 'static;

    fn sotw(
        &self,
        request: tonic::Request<Streaming<DiscoveryRequest>>,
    ) -> impl Future<Output = Result<tonic::Response<Self::SotwStream>, Status>> + Send;

    fn delta(
        &self,
        request: tonic::Request<Streaming<DeltaDiscoveryRequest>>,
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
}

impl<T> Clone for AdsServer<T> {
    fn clone(&self) -> Self {
        AdsServer {
            inner: self.inner.clone(),
            max_decoding_message_size: self.max_decoding_message_size,
        }
    }
}

impl<T: Ads> AdsServer<T> {
    pub fn new(inner: T, max_decoding_message_size: usize) -> Self {
        AdsServer {
            inner: Arc::new(inner),
            max_decoding_message_size,
        }
    }
}

impl<T> tonic::server::NamedService for AdsServer<T> {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

struct SotwMethod<T>(Arc<T>);

impl<T: Ads> tonic::server::StreamingService<DiscoveryRequest> for SotwMethod<T> {
    type Response = SotwResponse;
    type ResponseStream = T::SotwStream;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: tonic::Request<Streaming<DiscoveryRequest>>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move { inner.sotw(request).await })
    }
}

struct DeltaMethod<T>(Arc<T>);

impl<T: Ads> tonic::server::StreamingService<DeltaDiscoveryRequest> for DeltaMethod<T> {
    type Response = DeltaResponse;
    type ResponseStream = T::DeltaStream;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: tonic::Request<Streaming<DeltaDiscoveryRequest>>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move { inner.delta(request).await })
    }
}

impl<T, B> Service<http::Request<B>> for AdsServer<T>
where
    T: Ads,
    B: tonic::codegen::Body + Send + 'static,
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
        match req.uri().path() {
            SOTW_PATH => Box::pin(async move {
                let mut grpc =
                    tonic::server::Grpc::new(AdsCodec::<DiscoveryRequest, SotwResponse>::default())
                        .apply_max_message_size_config(Some(limit), None);
                Ok(grpc.streaming(SotwMethod(inner), req).await)
            }),
            DELTA_PATH => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(AdsCodec::<
                    DeltaDiscoveryRequest,
                    DeltaResponse,
                >::default())
                .apply_max_message_size_config(Some(limit), None);
                Ok(grpc.streaming(DeltaMethod(inner), req).await)
            }),
            _ => Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::resource::encode;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse,
    };
    use prost::Message;

    fn cluster(name: &str) -> Arc<Resource> {
        encode(
            name,
            &Cluster {
                name: name.into(),
                ..Default::default()
            },
        )
    }

    #[test]
    fn responses_decode_as_envoys_messages() {
        let (a, b) = (cluster("outbound|80||a"), cluster("outbound|80||b"));
        let sotw = SotwResponse {
            version_info: "v/3".into(),
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            nonce: "3-1".into(),
            resources: vec![a.clone(), b.clone()],
        };
        let mut buf = Vec::new();
        sotw.encode_raw(&mut buf);
        assert_eq!(buf.len(), sotw.encoded_len());
        let decoded = DiscoveryResponse::decode(buf.as_slice()).unwrap();
        assert_eq!(decoded.version_info, "v/3");
        assert_eq!(decoded.nonce, "3-1");
        assert_eq!(decoded.type_url, sotw.type_url);
        assert_eq!(decoded.resources, vec![a.body.clone(), b.body.clone()]);

        let delta = DeltaResponse {
            system_version_info: "v/4".into(),
            type_url: sotw.type_url,
            nonce: "4-2".into(),
            resources: vec![b.clone()],
            removed: vec!["outbound|80||a".into()],
        };
        let mut buf = Vec::new();
        delta.encode_raw(&mut buf);
        assert_eq!(buf.len(), delta.encoded_len());
        let decoded = DeltaDiscoveryResponse::decode(buf.as_slice()).unwrap();
        assert_eq!(decoded.system_version_info, "v/4");
        assert_eq!(decoded.removed_resources, vec!["outbound|80||a"]);
        assert_eq!(decoded.resources.len(), 1);
        let r = &decoded.resources[0];
        assert_eq!(
            (r.name.as_str(), r.version.as_str()),
            (&*b.name, b.version.as_str())
        );
        assert_eq!(r.resource.as_ref(), Some(&b.body));
    }
}
