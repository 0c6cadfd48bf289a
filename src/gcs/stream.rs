//! A bidi gRPC call (`BidiReadObject`, `BidiWriteObject`) on a directly driven HTTP/2
//! stream (`direct`): requests are framed as gRPC messages and handed to the connection as
//! they are sent, and responses are decoded straight out of the received HTTP/2 DATA frames.
//! tonic's `Streaming` first copies every frame into a buffer of its own; here a payload
//! that lies within one frame (a server may send it in a frame of its own, or its whole
//! message in one frame of up to our `max_frame_size`) is decoded in place, so a read
//! reaches the FUSE reply as a slice of the bytes read off the socket. Only a field that
//! straddles frames is copied, as tonic would. Touches only the call it opens.

use super::direct::Pool;
use super::{routing, MAX_MESSAGE_BYTES};
use crate::proto::storage::bidi_write_object_request::Data;
use crate::proto::storage::{
    BidiReadObjectRequest, BidiReadObjectResponse, BidiWriteObjectRequest, BidiWriteObjectResponse,
};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::task::Poll;
use std::time::Instant;
use tonic::Status;

/// The method paths of the calls made here.
const READ: &str = "/google.storage.v2.Storage/BidiReadObject";
const WRITE: &str = "/google.storage.v2.Storage/BidiWriteObject";
/// Bytes before every gRPC message: a compression flag and a big-endian length.
const PREFIX: usize = 5;

/// Opens a `BidiReadObject` call (see `open`).
pub(crate) async fn read(
    pool: &Pool,
    bucket: &str,
    routing_token: Option<&str>,
    first: &BidiReadObjectRequest,
) -> Result<
    (
        Requests<BidiReadObjectRequest>,
        Responses<BidiReadObjectResponse>,
    ),
    Status,
> {
    open(pool, READ, bucket, routing_token, first).await
}

/// Opens a `BidiWriteObject` call (see `open`).
pub(crate) async fn write(
    pool: &Pool,
    bucket: &str,
    routing_token: Option<&str>,
    first: &BidiWriteObjectRequest,
) -> Result<
    (
        Requests<BidiWriteObjectRequest>,
        Responses<BidiWriteObjectResponse>,
    ),
    Status,
> {
    open(pool, WRITE, bucket, routing_token, first).await
}

/// Opens the call `path` on `pool` with `first` as its first message; the routing header
/// names `bucket` (and `routing_token` after a redirect). Resolves once the stream is open
/// for sending: the response headers are awaited by the first `message`, since a server may
/// hold them back until it has something to answer (after a whole upload, say).
async fn open<Req: Message, Resp: Message + Default>(
    pool: &Pool,
    path: &'static str,
    bucket: &str,
    routing_token: Option<&str>,
    first: &Req,
) -> Result<(Requests<Req>, Responses<Resp>), Status> {
    let start = Instant::now();
    let method = crate::metrics::grpc_method(path);
    let opened = async {
        let mut headers = http::HeaderMap::new();
        let params =
            http::HeaderValue::try_from(routing::params(bucket, routing_token)).map_err(|e| {
                Status::invalid_argument(format!("bucket name not usable in a header: {e}"))
            })?;
        headers.insert(routing::HEADER, params);
        let (response, send) = pool.open(path, headers).await?;
        let mut requests = Requests {
            send,
            ended: false,
            method,
            _messages: PhantomData,
        };
        requests.send(first)?;
        Ok::<_, Status>((requests, response))
    };
    match opened.await {
        Ok((requests, response)) => Ok((
            requests,
            Responses {
                body: Body::Waiting(response, start),
                method,
                frames: VecDeque::new(),
                buffered: 0,
                _messages: PhantomData,
            },
        )),
        Err(s) => {
            record_open(method, start, &Err(s.clone()));
            Err(s)
        }
    }
}

/// Counts the call in the metrics once its opening is known (answered or refused).
fn record_open(method: &'static str, start: Instant, outcome: &Result<(), Status>) {
    let code = match outcome {
        Ok(()) => tonic::Code::Ok,
        Err(s) => s.code(),
    };
    crate::metrics::grpc_call(
        method,
        start.elapsed(),
        crate::metrics::grpc_code(code as i32),
    );
}

/// The call's answer to its opening: the HTTP/2 stream, or the status it was refused with.
fn accepted(
    method: &str,
    resp: Result<http::Response<h2::RecvStream>, h2::Error>,
) -> Result<h2::RecvStream, Status> {
    let resp = resp.map_err(|e| h2_status(method, e))?;
    // A call refused at once carries its status in the headers ("trailers only").
    if let Some(s) = Status::from_header_map(resp.headers()) {
        if s.code() != tonic::Code::Ok {
            return Err(s);
        }
    }
    if resp.status() != http::StatusCode::OK {
        return Err(http_status(method, resp.status()));
    }
    Ok(resp.into_body())
}

/// The status of a call answered with HTTP `code` and no gRPC status, mapped much as gRPC's
/// own clients map it. A proxy or front end that refuses the credentials answers 401 or 403:
/// taken as UNAVAILABLE, that was retried until the deadline and surfaced as EIO instead of
/// EACCES. Any 5xx stays transient, as a front end's 500 usually is; a 400 is not retried
/// (gRPC's INTERNAL would be, by `retry`).
fn http_status(method: &str, code: http::StatusCode) -> Status {
    let msg = format!("{method} answered HTTP {code}");
    match code.as_u16() {
        401 => Status::unauthenticated(msg),
        403 => Status::permission_denied(msg),
        404 => Status::unimplemented(msg),
        429 | 500..=599 => Status::unavailable(msg),
        _ => Status::unknown(msg),
    }
}

/// The request side of an open call. It stays open while the call runs (a half-close could
/// end the ranges still being served); dropping it half-closes the call (unless its last
/// message did), and dropping the `Responses` too releases the stream at both ends.
pub(crate) struct Requests<Req> {
    send: h2::SendStream<Bytes>,
    /// The last message half-closed the call already.
    ended: bool,
    method: &'static str,
    _messages: PhantomData<fn(&Req)>,
}

impl<Req> Drop for Requests<Req> {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.send.send_data(Bytes::new(), true);
        }
    }
}

impl<Req: Message> Requests<Req> {
    /// Sends `m` on the stream at once; the connection's task writes it out. Fails once the
    /// stream is gone, which the response side reports too.
    pub(crate) fn send(&mut self, m: &Req) -> Result<(), Status> {
        self.send
            .send_data(frame(m), false)
            .map_err(|e| h2_status(self.method, e))
    }

    /// Waits until the stream can take another message without piling up more than h2's
    /// send buffer: what a writer awaits before each `send`, for back-pressure.
    pub(crate) async fn ready(&mut self) -> Result<(), Status> {
        self.send.reserve_capacity(1);
        std::future::poll_fn(|cx| loop {
            if self.send.capacity() > 0 {
                return Poll::Ready(Ok(()));
            }
            match self.send.poll_capacity(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(h2_status(self.method, e))),
                Poll::Ready(None) => {
                    return Poll::Ready(Err(Status::unavailable(format!(
                        "{}: the stream is closed",
                        self.method
                    ))))
                }
            }
        })
        .await
    }
}

impl Requests<BidiWriteObjectRequest> {
    /// Sends a write message whose data goes out as the writer's own buffer, shared rather
    /// than copied into the message's encoding (see `write_frame`). `last`: the call is
    /// half-closed with the message's last frame, not with an empty frame of its own, which
    /// would go out in a write to the socket of its own after a message carrying data.
    pub(crate) fn send_write(
        &mut self,
        m: BidiWriteObjectRequest,
        last: bool,
    ) -> Result<(), Status> {
        let pieces = write_frame(m);
        let n = pieces.len();
        for (i, piece) in pieces.into_iter().enumerate() {
            let end = last && i + 1 == n;
            self.send
                .send_data(piece, end)
                .map_err(|e| h2_status(self.method, e))?;
            self.ended |= end;
        }
        Ok(())
    }
}

/// `m` as one gRPC message in pieces: the message without its data, then its
/// `checksummed_data` field (4) around the content, which is not copied. Protobuf takes
/// fields in any order, so the data may come last, and within it the crc32c (field 2) before
/// the content (field 1): h2 writes the head and the content in one system call, and a tail
/// after the content would take a second one. Pieces of a message without data: one.
fn write_frame(mut m: BidiWriteObjectRequest) -> Vec<Bytes> {
    use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};
    let Some(Data::ChecksummedData(data)) = m.data.take() else {
        return vec![frame(&m)];
    };
    let content = data.content.len();
    let crc_len = if data.crc32c.is_some() { 5 } else { 0 };
    let data_len = crc_len + 1 + encoded_len_varint(content as u64) + content;
    let rest = m.encoded_len();
    let len = rest + 1 + encoded_len_varint(data_len as u64) + data_len;
    let mut head = BytesMut::with_capacity(PREFIX + rest + 24);
    head.put_u8(0);
    head.put_u32(len as u32);
    // Cannot fail: BytesMut grows.
    let _ = m.encode(&mut head);
    encode_key(4, WireType::LengthDelimited, &mut head);
    encode_varint(data_len as u64, &mut head);
    if let Some(crc) = data.crc32c {
        encode_key(2, WireType::ThirtyTwoBit, &mut head);
        head.put_u32_le(crc);
    }
    encode_key(1, WireType::LengthDelimited, &mut head);
    encode_varint(content as u64, &mut head);
    vec![head.freeze(), data.content]
}

/// `m` as one gRPC message: uncompressed flag, length, bytes.
fn frame(m: &impl Message) -> Bytes {
    let len = m.encoded_len();
    let mut buf = BytesMut::with_capacity(PREFIX + len);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    // Cannot fail: the buffer was sized for the message.
    let _ = m.encode(&mut buf);
    buf.freeze()
}

/// Where the response side of a call is.
enum Body {
    /// Waiting for the response headers, since the call was opened at the instant given.
    Waiting(h2::client::ResponseFuture, Instant),
    /// Receiving.
    Open(h2::RecvStream),
    /// Ended with status OK.
    Ended,
}

/// The response side of an open call.
pub(crate) struct Responses<Resp> {
    body: Body,
    method: &'static str,
    /// Received DATA frames not yet decoded, oldest first.
    frames: VecDeque<Bytes>,
    buffered: usize,
    _messages: PhantomData<fn() -> Resp>,
}

impl<Resp: Message + Default> Responses<Resp> {
    /// The next response; `None` once the call ended with status OK.
    pub(crate) async fn message(&mut self) -> Result<Option<Resp>, Status> {
        loop {
            if let Some(m) = self.decode()? {
                return Ok(Some(m));
            }
            let body = match &mut self.body {
                Body::Open(body) => body,
                Body::Waiting(response, start) => {
                    let answer = accepted(self.method, response.await);
                    record_open(
                        self.method,
                        *start,
                        &answer.as_ref().map(|_| ()).map_err(Status::clone),
                    );
                    self.body = Body::Open(answer?);
                    continue;
                }
                Body::Ended => {
                    return match self.buffered {
                        0 => Ok(None),
                        n => Err(Status::internal(format!(
                            "the stream ended inside a message ({n} bytes left over)"
                        ))),
                    }
                }
            };
            match body.data().await {
                Some(Ok(data)) => {
                    // The window reopens as frames arrive, as hyper does: what bounds the
                    // bytes in flight is the reader's own read-ahead.
                    let _ = body.flow_control().release_capacity(data.len());
                    if !data.is_empty() {
                        self.buffered += data.len();
                        self.frames.push_back(data);
                    }
                }
                Some(Err(e)) => return Err(h2_status(self.method, e)),
                None => {
                    let trailers = body
                        .trailers()
                        .await
                        .map_err(|e| h2_status(self.method, e))?;
                    if let Some(s) = trailers.as_ref().and_then(Status::from_header_map) {
                        if s.code() != tonic::Code::Ok {
                            return Err(s);
                        }
                    }
                    self.body = Body::Ended;
                }
            }
        }
    }

    /// One whole message off the received frames, if they hold one.
    fn decode(&mut self) -> Result<Option<Resp>, Status> {
        if self.buffered < PREFIX {
            return Ok(None);
        }
        let mut prefix = [0u8; PREFIX];
        self.peek(&mut prefix);
        if prefix[0] != 0 {
            return Err(Status::internal("compressed message, none was asked for"));
        }
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if len > MAX_MESSAGE_BYTES {
            return Err(Status::out_of_range(format!(
                "a message of {len} bytes, over the {MAX_MESSAGE_BYTES} allowed"
            )));
        }
        if self.buffered < PREFIX + len {
            return Ok(None);
        }
        self.advance(PREFIX);
        self.buffered -= len;
        let body = InFrames {
            frames: &mut self.frames,
            left: len,
        };
        let decoded = Resp::decode(body);
        decoded
            .map(Some)
            .map_err(|e| Status::internal(format!("undecodable response: {e}")))
    }

    /// Copies the first `out.len()` buffered bytes (all frames together hold them).
    fn peek(&self, out: &mut [u8]) {
        let mut filled = 0;
        for f in &self.frames {
            let n = f.len().min(out.len() - filled);
            out[filled..filled + n].copy_from_slice(&f[..n]);
            filled += n;
            if filled == out.len() {
                return;
            }
        }
    }

    /// Drops the first `n` buffered bytes.
    fn advance(&mut self, n: usize) {
        self.buffered -= n;
        drop_front(&mut self.frames, n);
    }
}

/// A broken stream or connection as the status a call ends with. The h2 error is kept as
/// its source: that is what marks a CANCEL as the transport's (a server going away resets
/// its streams with it), worth another attempt, not a server's final answer.
fn h2_status(method: &str, e: h2::Error) -> Status {
    let mut s = match e.reason() {
        Some(h2::Reason::CANCEL) => Status::cancelled(format!("{method}: {e}")),
        _ => Status::unavailable(format!("{method}: {e}")),
    };
    s.set_source(std::sync::Arc::new(e));
    s
}

/// Drops the first `n` bytes of `frames`, and the empty frames that then lie in front: a
/// `chunk` of nothing while bytes remain would have the decoder wait on it for ever.
fn drop_front(frames: &mut VecDeque<Bytes>, mut n: usize) {
    while let Some(front) = frames.front_mut() {
        if front.len() > n {
            front.advance(n);
            return;
        }
        n -= front.len();
        frames.pop_front();
    }
}

/// One message's bytes as they lie in the received frames, read in place: a `bytes` field
/// that lies within one frame (a payload the server sent in a frame of its own, or with its
/// message in one frame) comes out as a slice of it; one that straddles frames is copied.
struct InFrames<'a> {
    frames: &'a mut VecDeque<Bytes>,
    left: usize,
}

impl Buf for InFrames<'_> {
    fn remaining(&self) -> usize {
        self.left
    }

    fn chunk(&self) -> &[u8] {
        match self.frames.front() {
            Some(f) => &f[..f.len().min(self.left)],
            None => &[],
        }
    }

    fn advance(&mut self, n: usize) {
        self.left -= n;
        drop_front(self.frames, n);
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        match self.frames.front_mut() {
            Some(front) if front.len() >= len && self.left >= len => {
                self.left -= len;
                let out = front.split_to(len);
                drop_front(self.frames, 0);
                out
            }
            _ => {
                let mut out = BytesMut::with_capacity(len);
                out.put((&mut *self).take(len));
                out.freeze()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::storage::{ChecksummedData, ObjectRangeData, ReadRange};

    #[test]
    fn refused_credentials_in_plain_http_are_final_and_denied() {
        use crate::gcs::retry::{is_transient, map_status};
        use crate::gcs::Error;
        for code in [401, 403] {
            let s = http_status("BidiReadObject", http::StatusCode::from_u16(code).unwrap());
            assert!(!is_transient(&s), "{code}: {s:?}");
            let e = map_status(&s, "o");
            assert!(matches!(e, Error::PermissionDenied(_)), "{code}: {e}");
            assert!(e.to_string().contains(&code.to_string()), "{e}");
        }
        for code in [400, 404] {
            let s = http_status("BidiReadObject", http::StatusCode::from_u16(code).unwrap());
            assert!(!is_transient(&s), "{code}: {s:?}");
        }
        for code in [429, 500, 502, 503, 504] {
            let s = http_status("BidiReadObject", http::StatusCode::from_u16(code).unwrap());
            assert!(is_transient(&s), "{code}: {s:?}");
        }
    }

    fn response(read_id: i64, content: &'static [u8]) -> BidiReadObjectResponse {
        BidiReadObjectResponse {
            object_data_ranges: vec![ObjectRangeData {
                checksummed_data: Some(ChecksummedData {
                    content: Bytes::from_static(content),
                    crc32c: Some(crc32c::crc32c(content)),
                }),
                read_range: Some(ReadRange {
                    read_offset: 0,
                    read_length: content.len() as i64,
                    read_id,
                }),
                range_end: true,
            }],
            ..Default::default()
        }
    }

    /// `wire` as received in frames of `size` bytes, the body already ended.
    fn received(wire: &[u8], size: usize) -> Responses<BidiReadObjectResponse> {
        let frames: VecDeque<Bytes> = wire.chunks(size).map(Bytes::copy_from_slice).collect();
        Responses {
            body: Body::Ended,
            method: "test",
            buffered: wire.len(),
            frames,
            _messages: PhantomData,
        }
    }

    fn framed(m: &BidiReadObjectResponse) -> Vec<u8> {
        let mut out = vec![0u8];
        out.extend_from_slice(&(m.encoded_len() as u32).to_be_bytes());
        out.extend_from_slice(&m.encode_to_vec());
        out
    }

    /// `r` decodes to `sent`, then ends; `size` names the frames' size in failures.
    async fn gives_back(
        r: &mut Responses<BidiReadObjectResponse>,
        sent: &[BidiReadObjectResponse],
        size: usize,
    ) {
        for want in sent {
            let got = r.message().await.unwrap();
            assert_eq!(got.as_ref(), Some(want), "frames of {size}");
        }
        assert_eq!(r.message().await.unwrap(), None);
    }

    #[tokio::test]
    async fn empty_frames_between_the_others_change_nothing() {
        let sent = [response(1, b"first payload"), response(2, &[7u8; 3000])];
        let wire: Vec<u8> = sent.iter().flat_map(framed).collect();
        for size in [1, 3, 100, 2999] {
            let mut r = received(&wire, size);
            r.frames = std::iter::once(Bytes::new())
                .chain(r.frames.drain(..).flat_map(|f| [f, Bytes::new()]))
                .collect();
            gives_back(&mut r, &sent, size).await;
        }
    }

    #[test]
    fn a_stream_reset_with_cancel_is_worth_another_attempt() {
        let s = h2_status("test", h2::Error::from(h2::Reason::CANCEL));
        assert_eq!(s.code(), tonic::Code::Cancelled);
        assert!(super::super::retry::is_transient(&s));
    }

    #[tokio::test]
    async fn messages_come_back_however_the_frames_split_them() {
        let sent = [response(1, b"first payload"), response(2, &[7u8; 3000])];
        let wire: Vec<u8> = sent.iter().flat_map(framed).collect();
        for size in [1, 2, 5, 7, 100, 2999, wire.len()] {
            let mut r = received(&wire, size);
            gives_back(&mut r, &sent, size).await;
        }
    }

    /// A payload that lies within one frame comes out as a slice of it: with its whole
    /// message in one frame, or in a frame of its own between the message's other bytes.
    #[tokio::test]
    async fn a_payload_within_one_frame_is_decoded_in_place() {
        let wire = Bytes::from(framed(&response(1, &[9u8; 4096])));
        let at = wire.windows(4096).position(|w| w == [9u8; 4096]).unwrap();
        let layouts = [
            vec![wire.clone()],
            vec![
                wire.slice(..at),
                wire.slice(at..at + 4096),
                wire.slice(at + 4096..),
            ],
        ];
        for frames in layouts {
            let mut r = Responses::<BidiReadObjectResponse> {
                body: Body::Ended,
                method: "test",
                buffered: wire.len(),
                frames: frames.into(),
                _messages: PhantomData,
            };
            let m = r.message().await.unwrap().unwrap();
            let content = &m.object_data_ranges[0]
                .checksummed_data
                .as_ref()
                .unwrap()
                .content;
            assert_eq!(
                content.as_ptr(),
                wire[at..].as_ptr(),
                "the payload was copied"
            );
            assert_eq!(r.message().await.unwrap(), None);
        }
    }

    #[test]
    fn a_write_message_goes_out_whole_with_its_data_shared() {
        use crate::proto::storage::ObjectChecksums;
        let content = Bytes::from(vec![5u8; 300_000]);
        for crc in [Some(0xdead_beef), None] {
            let m = BidiWriteObjectRequest {
                write_offset: 1 << 40,
                data: Some(Data::ChecksummedData(ChecksummedData {
                    content: content.clone(),
                    crc32c: crc,
                })),
                finish_write: true,
                object_checksums: Some(ObjectChecksums {
                    crc32c: Some(7),
                    md5_hash: Bytes::new(),
                }),
                ..Default::default()
            };
            let pieces = write_frame(m.clone());
            // The content last: h2 sends a head and its content in one system call.
            assert_eq!(pieces.len(), 2, "pieces after the content");
            assert_eq!(pieces[1].as_ptr(), content.as_ptr(), "the data was copied");
            let wire: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
            assert_eq!(wire, frame_bytes_of(&wire), "length prefix");
            let got = BidiWriteObjectRequest::decode(&wire[PREFIX..]).unwrap();
            assert_eq!(got, m);
        }
        let plain = BidiWriteObjectRequest {
            flush: true,
            ..Default::default()
        };
        assert_eq!(write_frame(plain.clone()), vec![frame(&plain)]);
    }

    /// `wire` checked against its own gRPC prefix: flag 0 and the length of what follows.
    fn frame_bytes_of(wire: &[u8]) -> Vec<u8> {
        assert_eq!(wire[0], 0);
        let len = u32::from_be_bytes([wire[1], wire[2], wire[3], wire[4]]) as usize;
        assert_eq!(len, wire.len() - PREFIX);
        wire.to_vec()
    }

    #[tokio::test]
    async fn a_stream_that_ends_inside_a_message_is_an_error() {
        let wire = framed(&response(1, b"cut short"));
        let mut r = received(&wire[..wire.len() - 3], 4);
        assert_eq!(r.message().await.unwrap_err().code(), tonic::Code::Internal);
        let mut compressed = wire.clone();
        compressed[0] = 1;
        let mut r = received(&compressed, 64);
        assert_eq!(r.message().await.unwrap_err().code(), tonic::Code::Internal);
    }
}
