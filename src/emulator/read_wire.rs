//! BidiReadObject on the bare HTTP/2 stream. tonic's encoder copies every response, payload
//! and all, into a buffer of its own; here the session's responses (`read.rs`, unchanged) are
//! framed by hand and each payload goes out as a DATA frame of its own, a slice of the stored
//! object. Protobuf lets fields come in any order, so a payload is written last in each
//! message that holds it. Every other method goes to the generated server. Touches only the
//! calls it frames.

use super::Service;
use crate::proto::storage::storage_server::StorageServer;
use crate::proto::storage::{BidiReadObjectRequest, BidiReadObjectResponse, ObjectRangeData};
use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use prost::encoding::{self, WireType};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tonic::body::Body;
use tonic::codec::Codec;
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tonic::Status;

/// The path of the one method served here.
const PATH: &str = "/google.storage.v2.Storage/BidiReadObject";

/// The Storage service: BidiReadObject framed here, everything else by tonic.
#[derive(Clone)]
pub(crate) struct StorageRoutes {
    service: Service,
    generated: StorageServer<Service>,
    max_message: usize,
}

impl StorageRoutes {
    pub(crate) fn new(service: Service, max_message: usize) -> Self {
        StorageRoutes {
            generated: StorageServer::new(service.clone())
                .max_decoding_message_size(max_message)
                .max_encoding_message_size(max_message),
            service,
            max_message,
        }
    }
}

impl NamedService for StorageRoutes {
    const NAME: &'static str = <StorageServer<Service> as NamedService>::NAME;
}

type Answer = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

impl tower::Service<http::Request<Body>> for StorageRoutes {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Answer {
        if req.uri().path() == PATH {
            let (service, max) = (self.service.clone(), self.max_message);
            return Box::pin(async move { Ok(bidi_read(service, req, max).await) });
        }
        let mut generated = self.generated.clone();
        Box::pin(async move { generated.call(req).await })
    }
}

/// One BidiReadObject call: requests decoded by tonic, responses framed here.
async fn bidi_read(service: Service, req: http::Request<Body>, max: usize) -> http::Response<Body> {
    let (parts, body) = req.into_parts();
    let decoder =
        tonic_prost::ProstCodec::<BidiReadObjectResponse, BidiReadObjectRequest>::default()
            .decoder();
    let incoming = tonic::Streaming::new_request(decoder, body, None, Some(max));
    let request = tonic::Request::from_parts(
        MetadataMap::from_headers(parts.headers),
        parts.extensions,
        incoming,
    );
    let responses = match service.bidi_read(request).await {
        Ok(r) => r.into_inner(),
        Err(status) => return status.into_http(),
    };
    // Each response as its frames; the call's status as trailers once the session ends.
    let frames = futures::stream::unfold(Some(responses), |state| async move {
        let mut responses = state?;
        Some(match responses.next().await {
            Some(Ok(msg)) => (frames(&msg), Some(responses)),
            Some(Err(status)) => (vec![trailers(&status)], None),
            None => (vec![trailers(&Status::ok(""))], None),
        })
    })
    .flat_map(futures::stream::iter)
    .map(Ok::<_, Status>);
    // The headers wait for the first response's frames, so that they leave in one write to
    // the socket (a first request is answered at once): sent on their own, they cost a
    // write, and often the client a wake-up, of their own.
    let mut frames = Box::pin(frames);
    let first = frames.next().await;
    let frames = futures::stream::iter(first).chain(frames);
    let mut resp = http::Response::new(Body::new(http_body_util::StreamBody::new(frames)));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    resp
}

/// The trailers that end the call with `status`.
fn trailers(status: &Status) -> http_body::Frame<Bytes> {
    let mut headers = http::HeaderMap::new();
    if status.add_header(&mut headers).is_err() {
        headers.insert("grpc-status", http::HeaderValue::from_static("13"));
    }
    http_body::Frame::trailers(headers)
}

/// `msg` as one gRPC message in DATA frames: the metadata, the read handle and each range's
/// bookkeeping in one frame, each payload in a frame of its own.
fn frames(msg: &BidiReadObjectResponse) -> Vec<http_body::Frame<Bytes>> {
    let ranges: Vec<(usize, usize)> = msg
        .object_data_ranges
        .iter()
        .map(|d| {
            let data = d.checksummed_data.as_ref();
            let content = data.map_or(0, |c| c.content.len());
            let crc = data
                .and_then(|c| c.crc32c)
                .map_or(0, |_| encoding::key_len(2) + 4);
            let inner =
                crc + encoding::key_len(1) + encoding::encoded_len_varint(content as u64) + content;
            let outer = range_fields_len(d)
                + data.map_or(0, |_| {
                    encoding::key_len(1) + encoding::encoded_len_varint(inner as u64) + inner
                });
            (inner, outer)
        })
        .collect();
    let len = msg
        .metadata
        .as_ref()
        .map_or(0, |m| encoding::message::encoded_len(4, m))
        + msg
            .read_handle
            .as_ref()
            .map_or(0, |h| encoding::message::encoded_len(7, h))
        + ranges
            .iter()
            .map(|(_, outer)| {
                encoding::key_len(6) + encoding::encoded_len_varint(*outer as u64) + outer
            })
            .sum::<usize>();
    let mut out = Vec::new();
    let mut head = BytesMut::with_capacity(256);
    head.put_u8(0);
    head.put_u32(len as u32);
    if let Some(m) = &msg.metadata {
        encoding::message::encode(4, m, &mut head);
    }
    if let Some(h) = &msg.read_handle {
        encoding::message::encode(7, h, &mut head);
    }
    for (d, (inner, outer)) in msg.object_data_ranges.iter().zip(ranges) {
        encoding::encode_key(6, WireType::LengthDelimited, &mut head);
        encoding::encode_varint(outer as u64, &mut head);
        if let Some(r) = &d.read_range {
            encoding::message::encode(2, r, &mut head);
        }
        if d.range_end {
            encoding::bool::encode(3, &d.range_end, &mut head);
        }
        let Some(data) = &d.checksummed_data else {
            continue;
        };
        encoding::encode_key(1, WireType::LengthDelimited, &mut head);
        encoding::encode_varint(inner as u64, &mut head);
        if let Some(crc) = &data.crc32c {
            encoding::fixed32::encode(2, crc, &mut head);
        }
        encoding::encode_key(1, WireType::LengthDelimited, &mut head);
        encoding::encode_varint(data.content.len() as u64, &mut head);
        if !data.content.is_empty() {
            out.push(http_body::Frame::data(head.split().freeze()));
            out.push(http_body::Frame::data(data.content.clone()));
        }
    }
    if !head.is_empty() {
        out.push(http_body::Frame::data(head.freeze()));
    }
    out
}

/// Bytes of a range's fields other than its data: read_range and range_end.
fn range_fields_len(d: &ObjectRangeData) -> usize {
    d.read_range
        .as_ref()
        .map_or(0, |r| encoding::message::encoded_len(2, r))
        + if d.range_end {
            encoding::bool::encoded_len(3, &d.range_end)
        } else {
            0
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::storage::{BidiReadHandle, ChecksummedData, Object, ReadRange};
    use prost::Message;

    fn range(id: i64, content: &'static [u8], crc: bool, end: bool) -> ObjectRangeData {
        ObjectRangeData {
            checksummed_data: Some(ChecksummedData {
                content: Bytes::from_static(content),
                crc32c: crc.then(|| crc32c::crc32c(content)),
            }),
            read_range: Some(ReadRange {
                read_offset: 7,
                read_length: content.len() as i64,
                read_id: id,
            }),
            range_end: end,
        }
    }

    /// The frames decode to the message they framed, and every payload is a frame of its own
    /// that is the stored bytes themselves.
    #[test]
    fn framed_responses_decode_to_themselves_with_payloads_apart() {
        let mut big = range(3, b"", true, false);
        big.checksummed_data.as_mut().unwrap().content = Bytes::from(vec![5u8; 3000]);
        let cases = [
            BidiReadObjectResponse::default(),
            BidiReadObjectResponse {
                metadata: Some(Object {
                    name: "o".into(),
                    size: 3000,
                    ..Default::default()
                }),
                read_handle: Some(BidiReadHandle {
                    handle: Bytes::from_static(b"h"),
                }),
                object_data_ranges: vec![range(1, b"abc", true, true), big],
            },
            BidiReadObjectResponse {
                object_data_ranges: vec![
                    range(2, b"", false, true),
                    range(4, b"xyz", false, false),
                ],
                ..Default::default()
            },
        ];
        for msg in cases {
            let frames: Vec<Bytes> = frames(&msg)
                .into_iter()
                .map(|f| f.into_data().expect("data"))
                .collect();
            let wire: Vec<u8> = frames.iter().flat_map(|f| f.to_vec()).collect();
            assert_eq!(wire[0], 0);
            let len = u32::from_be_bytes([wire[1], wire[2], wire[3], wire[4]]) as usize;
            assert_eq!(len, wire.len() - 5);
            assert_eq!(
                BidiReadObjectResponse::decode(&wire[5..]).expect("decodes"),
                msg
            );
            for d in &msg.object_data_ranges {
                let content = &d.checksummed_data.as_ref().unwrap().content;
                if !content.is_empty() {
                    assert!(
                        frames
                            .iter()
                            .any(|f| f.as_ptr() == content.as_ptr() && f.len() == content.len()),
                        "payload not sent as is"
                    );
                }
            }
        }
    }
}
