//! BidiReadObject: one stream, many ranges. Opens the object (pinning its generation),
//! answers with metadata and a read handle (on the first chunk when the first message asked
//! for a range), then serves every ReadRange in chunks of at most 2 MiB with a CRC32C each,
//! ending each read_id with `range_end`. Chaos mode varies
//! chunk sizes, interleaves read_ids and adds trailing empty chunks. Touches the store
//! (lookup only) and the stream's own state.

use super::bucket_names::{bucket_path, parse_bucket};
use super::content::{ContentReader, MAX_CHUNK};
use super::object_proto::to_proto;
use super::preconditions::preconditions_of;
use super::stats::add;
use super::wire::{decode_handle, encode_handle, header_routing_token, status_with_detail, Outbox};
use super::Service;
use crate::proto::rpc;
use crate::proto::storage::{
    BidiReadHandle, BidiReadObjectError, BidiReadObjectRedirectedError, BidiReadObjectRequest,
    BidiReadObjectResponse, ChecksummedData, ObjectRangeData, ReadRange, ReadRangeError,
};
use futures::{Stream, StreamExt};
use rand::Rng;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use tonic::{Code, Request, Response, Status, Streaming};

/// At most this many ranges in one request message.
const MAX_RANGES_PER_MESSAGE: usize = 100;
/// Tag of read handles.
const READ_HANDLE_TAG: &str = "rh1";

/// The response stream type.
pub(crate) type ReadStream =
    Pin<Box<dyn Stream<Item = Result<BidiReadObjectResponse, Status>> + Send>>;

/// One outstanding range.
struct Range {
    read_id: i64,
    next: u64,
    end: u64,
}

impl Service {
    /// Handles one BidiReadObject call.
    pub(crate) async fn bidi_read(
        &self,
        req: Request<Streaming<BidiReadObjectRequest>>,
    ) -> Result<Response<ReadStream>, Status> {
        let opened = self.open_read_stream(req).await;
        if opened.is_err() {
            // A failed open is a response too: it comes after the injected latency.
            self.calls.delay().await;
        }
        opened
    }

    async fn open_read_stream(
        &self,
        req: Request<Streaming<BidiReadObjectRequest>>,
    ) -> Result<Response<ReadStream>, Status> {
        let stats = self.calls.stats.clone();
        add(&stats.read_streams, 1);
        let header_token = header_routing_token(req.metadata());
        let meta = req.metadata().clone();
        let mut incoming = req.into_inner();
        let first = incoming
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the stream ended before its first message"))?;
        let spec = first.read_object_spec.clone().ok_or_else(|| {
            Status::invalid_argument("the first BidiReadObjectRequest must carry read_object_spec")
        })?;
        let bucket = parse_bucket(&spec.bucket)?;
        self.calls.begin(&meta, "bucket", &bucket_path(&bucket))?;

        let mut generation = spec.generation;
        let with_handle = spec
            .read_handle
            .as_ref()
            .is_some_and(|h| !h.handle.is_empty());
        if let Some(h) = spec.read_handle.as_ref().filter(|_| with_handle) {
            let parts = decode_handle(READ_HANDLE_TAG, &h.handle)?;
            let pinned = parts.first().copied().unwrap_or(0) as i64;
            if generation != 0 && generation != pinned {
                return Err(Status::invalid_argument(format!(
                    "read_handle is for generation {pinned}, the spec asks for {generation}"
                )));
            }
            generation = pinned;
        }
        let (entry, reader) = self
            .store
            .open_for_read(&bucket, &spec.object, generation)?;
        preconditions_of!(spec).check(Some((entry.content.generation, entry.metageneration)))?;
        let handle = encode_handle(READ_HANDLE_TAG, &[entry.content.generation as u64]);

        let presented = spec.routing_token.clone().or(header_token);
        if let Some(token) = self.calls.faults.redirect(presented.as_deref()) {
            add(&stats.faults_injected, 1);
            return Err(status_with_detail(
                Code::Aborted,
                "injected fault: redirected; reopen with the read handle and routing token".into(),
                "google.storage.v2.BidiReadObjectRedirectedError",
                &BidiReadObjectRedirectedError {
                    read_handle: Some(BidiReadHandle { handle }),
                    routing_token: Some(token),
                },
            ));
        }

        let faults = self.calls.faults.get();
        let (out, stream) = Outbox::new(self.calls.faults.latency());
        let first_response = BidiReadObjectResponse {
            object_data_ranges: vec![],
            metadata: (!with_handle).then(|| to_proto(&bucket, &spec.object, &entry)),
            read_handle: Some(BidiReadHandle {
                handle: handle.clone(),
            }),
        };
        let session = Session {
            reader,
            content: entry.content.clone(),
            stats,
            out,
            head: Some(first_response),
            active: VecDeque::new(),
            sent: 0,
            cut: faults.cut_read_after_bytes,
            chaos: faults.chaos,
        };
        // The session runs inside the response stream, polled by whoever sends the responses:
        // no task of its own, and a response queued wakes nobody but that poller.
        let session = futures::stream::once(session.run(first, incoming))
            .filter_map(|()| std::future::ready(None));
        Ok(Response::new(Box::pin(futures::stream::select(
            stream, session,
        ))))
    }
}

/// The state of one read stream after it opened.
struct Session {
    reader: ContentReader,
    content: Arc<super::content::Content>,
    stats: Arc<super::stats::Stats>,
    out: Outbox<BidiReadObjectResponse>,
    /// The metadata and read handle not yet sent: they ride on the first chunk, so a small
    /// object asked for in the first message comes back in one response.
    head: Option<BidiReadObjectResponse>,
    active: VecDeque<Range>,
    sent: u64,
    cut: Option<u64>,
    chaos: bool,
}

impl Drop for Session {
    /// Counted here: a session also ends when its response stream is dropped (the client
    /// reset the call) while it waits.
    fn drop(&mut self) {
        add(&self.stats.read_streams_ended, 1);
    }
}

/// Why a session stops.
enum Stop {
    /// The client went away.
    Gone,
    /// End the stream with this status.
    Fail(Status),
}

impl Session {
    async fn run(
        mut self,
        first: BidiReadObjectRequest,
        mut incoming: Streaming<BidiReadObjectRequest>,
    ) {
        let served = self.serve(first, &mut incoming).await;
        if self.send_head().await {
            if let Err(Stop::Fail(status)) = served {
                self.out.send(Err(status)).await;
            }
        }
    }

    /// Sends the metadata on its own if no chunk carried it yet; false once the client is gone.
    async fn send_head(&mut self) -> bool {
        match self.head.take() {
            Some(head) => self.out.send(Ok(head)).await,
            None => true,
        }
    }

    async fn serve(
        &mut self,
        first: BidiReadObjectRequest,
        incoming: &mut Streaming<BidiReadObjectRequest>,
    ) -> Result<(), Stop> {
        self.add_ranges(first.read_ranges)?;
        let mut open = true;
        loop {
            if self.active.is_empty() {
                if !open {
                    return Ok(());
                }
                // Nothing to carry the metadata: the client waits for it before asking more.
                if !self.send_head().await {
                    return Err(Stop::Gone);
                }
            }
            tokio::select! {
                biased;
                msg = incoming.message(), if open => match msg {
                    Ok(Some(m)) => {
                        if m.read_object_spec.is_some() {
                            return Err(Stop::Fail(Status::invalid_argument(
                                "read_object_spec may only be set on the first message of a stream",
                            )));
                        }
                        self.add_ranges(m.read_ranges)?;
                    }
                    Ok(None) => open = false,
                    Err(_) => return Err(Stop::Gone),
                },
                _ = std::future::ready(()), if !self.active.is_empty() => self.send_chunk().await?,
            }
        }
    }

    /// Resolves and queues the ranges of one message.
    fn add_ranges(&mut self, ranges: Vec<ReadRange>) -> Result<(), Stop> {
        if ranges.len() > MAX_RANGES_PER_MESSAGE {
            return Err(Stop::Fail(Status::invalid_argument(format!(
                "{} read ranges in one message; at most {MAX_RANGES_PER_MESSAGE} are allowed",
                ranges.len()
            ))));
        }
        add(&self.stats.ranges_requested, ranges.len() as u64);
        let size = self.content.persisted();
        for r in ranges {
            if self.active.iter().any(|a| a.read_id == r.read_id) {
                return Err(range_error(
                    r.read_id,
                    Code::InvalidArgument,
                    format!(
                        "read_id {} is already outstanding on this stream",
                        r.read_id
                    ),
                ));
            }
            let start = if r.read_offset < 0 {
                size.saturating_sub(r.read_offset.unsigned_abs())
            } else {
                r.read_offset as u64
            };
            if start > size {
                return Err(range_error(
                    r.read_id,
                    Code::OutOfRange,
                    format!(
                        "read_offset {} is past the end of the object ({size} bytes)",
                        r.read_offset
                    ),
                ));
            }
            if r.read_length < 0 {
                return Err(range_error(
                    r.read_id,
                    Code::OutOfRange,
                    format!("read_length {} is negative", r.read_length),
                ));
            }
            let end = if r.read_length == 0 {
                size
            } else {
                size.min(start.saturating_add(r.read_length as u64))
            };
            add(&self.stats.bytes_requested, end - start);
            self.active.push_back(Range {
                read_id: r.read_id,
                next: start,
                end,
            });
        }
        Ok(())
    }

    /// Sends one chunk of one outstanding range.
    async fn send_chunk(&mut self) -> Result<(), Stop> {
        if let Some(cut) = self.cut {
            if self.sent >= cut {
                add(&self.stats.faults_injected, 1);
                return Err(Stop::Fail(Status::unavailable(format!(
                    "injected fault: read stream cut after {cut} payload bytes"
                ))));
            }
        }
        let (idx, max) = if self.chaos {
            add(&self.stats.chaos_chunks, 1);
            let mut rng = rand::rng();
            (
                rng.random_range(0..self.active.len()),
                rng.random_range(1..=MAX_CHUNK),
            )
        } else {
            (0, MAX_CHUNK)
        };
        let Some(range) = self.active.get_mut(idx) else {
            return Ok(());
        };
        let mut want = ((range.end - range.next) as usize).min(max);
        if let Some(cut) = self.cut {
            want = want.min((cut - self.sent) as usize);
        }
        let (data, crc) = self
            .reader
            .read(range.next, want)
            .map_err(|e| Stop::Fail(Status::internal(format!("read failed: {e}"))))?;
        // Memory segments may give less than asked (a segment edge), never nothing.
        if data.is_empty() && want > 0 {
            return Err(Stop::Fail(Status::data_loss(format!(
                "the stored object is shorter than its recorded size (nothing at offset {})",
                range.next
            ))));
        }
        let offset = range.next;
        range.next += data.len() as u64;
        let done = range.next >= range.end;
        let read_id = range.read_id;
        let len = data.len() as u64;
        if done {
            self.active.remove(idx);
        }
        self.sent += len;
        add(&self.stats.bytes_sent, len);
        add(&self.stats.read_messages, 1);
        let mut msg = chunk(read_id, offset, data, Some(crc), done);
        if let Some(mut head) = self.head.take() {
            head.object_data_ranges = msg.object_data_ranges;
            msg = head;
        }
        if !self.out.send(Ok(msg)).await {
            return Err(Stop::Gone);
        }
        if done && self.chaos && rand::rng().random_bool(0.5) {
            let trailer = chunk(read_id, offset + len, bytes::Bytes::new(), Some(0), false);
            if !self.out.send(Ok(trailer)).await {
                return Err(Stop::Gone);
            }
        }
        Ok(())
    }
}

fn chunk(
    read_id: i64,
    offset: u64,
    data: bytes::Bytes,
    crc: Option<u32>,
    end: bool,
) -> BidiReadObjectResponse {
    let len = data.len() as i64;
    BidiReadObjectResponse {
        object_data_ranges: vec![ObjectRangeData {
            checksummed_data: Some(ChecksummedData {
                content: data,
                crc32c: crc,
            }),
            read_range: Some(ReadRange {
                read_offset: offset as i64,
                read_length: len,
                read_id,
            }),
            range_end: end,
        }],
        metadata: None,
        read_handle: None,
    }
}

/// Ends the stream with `code`, naming the failed read_id in a BidiReadObjectError.
fn range_error(read_id: i64, code: Code, message: String) -> Stop {
    let detail = BidiReadObjectError {
        read_range_errors: vec![ReadRangeError {
            read_id,
            status: Some(rpc::Status {
                code: code as i32,
                message: message.clone(),
                details: vec![],
            }),
        }],
    };
    Stop::Fail(status_with_detail(
        code,
        message,
        "google.storage.v2.BidiReadObjectError",
        &detail,
    ))
}
