//! The messages of a BidiWriteObject stream that came in together with its first, and the
//! upload they hold whole: a mount sends a small file's create, bytes, flush and half-close
//! (or finish) in one socket write, and such an upload is stored in one durable step (one
//! disk sync on the directory backend) instead of a create made durable on its own and
//! bytes synced after it. Answers as a session taking the messages one by one would.
//! Touches the store and the stream's own messages.

use super::content::{Content, Data as StoredData, Segments, WriteState, MAX_CHUNK};
use super::object_proto::to_proto;
use super::preconditions::Preconditions;
use super::stats::add;
use super::store::{CustomMetadata, Entry};
use super::wire::Outbox;
use super::write::{persisted_response, write_handle, WriteStream};
use super::Service;
use crate::proto::storage::bidi_write_object_request::Data;
use crate::proto::storage::bidi_write_object_response::WriteStatus;
use crate::proto::storage::{
    BidiWriteHandle, BidiWriteObjectRequest, BidiWriteObjectResponse, ChecksummedData,
};
use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use std::collections::VecDeque;
use tonic::{Response, Status, Streaming};

/// The most payload taken in before the stream is read message by message: a whole upload
/// is a small file's, and a bigger one is better written as it comes than held in memory.
const WHOLE_AT_MOST: usize = MAX_CHUNK;

/// A write stream's messages: those taken in already, then the rest as they come.
pub(super) struct Incoming {
    queued: VecDeque<BidiWriteObjectRequest>,
    /// How the stream ended while its messages were taken in: after the queued ones.
    end: Option<Result<(), Status>>,
    stream: Streaming<BidiWriteObjectRequest>,
}

impl Incoming {
    /// The stream whose `first` message was read.
    pub fn new(first: BidiWriteObjectRequest, stream: Streaming<BidiWriteObjectRequest>) -> Self {
        Incoming {
            queued: VecDeque::from([first]),
            end: None,
            stream,
        }
    }

    /// The first message, until the session takes it.
    pub fn first(&self) -> &BidiWriteObjectRequest {
        &self.queued[0]
    }

    /// Queues the messages that came in already (never waits), up to a finish, or until
    /// their payload passes `WHOLE_AT_MOST` (the message that passes it is queued too).
    pub fn take_in_what_came(&mut self) {
        let mut payload: usize = self
            .queued
            .iter()
            .filter_map(chunk)
            .map(|d| d.content.len())
            .sum();
        while self.end.is_none()
            && payload <= WHOLE_AT_MOST
            && self.queued.back().is_some_and(|m| !m.finish_write)
        {
            match self.stream.message().now_or_never() {
                None => break,
                Some(Ok(Some(m))) => {
                    payload += chunk(&m).map_or(0, |d| d.content.len());
                    self.queued.push_back(m);
                }
                Some(Ok(None)) => self.end = Some(Ok(())),
                Some(Err(e)) => self.end = Some(Err(e)),
            }
        }
    }

    /// The next message; `None` once the client half-closed the stream.
    pub async fn next(&mut self) -> Result<Option<BidiWriteObjectRequest>, Status> {
        if let Some(m) = self.queued.pop_front() {
            return Ok(Some(m));
        }
        match &self.end {
            Some(end) => end.clone().map(|()| None),
            None => self.stream.message().await,
        }
    }
}

/// A whole upload taken in at once: its bytes, and how it ended.
pub(super) struct WholeUpload {
    bytes: Bytes,
    /// With finish_write; else half-closed, the object left appendable.
    finished: bool,
    /// The half-close's message asked for the persisted size too.
    looked_up: bool,
}

/// The upload `incoming` holds whole, from its first message at offset 0 to a finish or the
/// half-close, every chunk and the whole matching the CRC32C they came with; `None` for
/// anything else, which the session serves message by message (and refuses where it should).
pub(super) fn whole_upload(incoming: &Incoming) -> Option<WholeUpload> {
    let queued = &incoming.queued;
    let last = queued.back()?;
    let finished = last.finish_write;
    if !finished && !matches!(incoming.end, Some(Ok(()))) {
        return None;
    }
    let mut len = 0u64;
    for (i, m) in queued.iter().enumerate() {
        // Only the half-close's own message may ask for the size: it is answered after.
        let lookup_answered = !finished && i + 1 == queued.len();
        if m.write_offset != len as i64 || m.state_lookup && !lookup_answered {
            return None;
        }
        if let Some(d) = chunk(m) {
            if d.content.len() > MAX_CHUNK {
                return None;
            }
            len += d.content.len() as u64;
        }
    }
    let mut crc = 0;
    let mut bytes = BytesMut::with_capacity(len as usize);
    for d in queued.iter().filter_map(chunk) {
        let actual = crate::gcs::crc32c(&d.content);
        if d.crc32c.is_some_and(|c| c != actual) {
            return None;
        }
        crc = crate::gcs::crc32c_concat(crc, bytes.len() as u64, actual, d.content.len());
        // One copy: the chunks are slices of receive buffers that a memory object would
        // otherwise keep alive.
        bytes.extend_from_slice(&d.content);
    }
    let expected = last.object_checksums.as_ref().and_then(|c| c.crc32c);
    if finished && expected.is_some_and(|c| c != crc) {
        return None;
    }
    Some(WholeUpload {
        bytes: bytes.freeze(),
        finished,
        looked_up: last.state_lookup && !finished,
    })
}

/// The bytes a message carries, if any.
fn chunk(m: &BidiWriteObjectRequest) -> Option<&ChecksummedData> {
    m.data.as_ref().map(|Data::ChecksummedData(d)| d)
}

impl Service {
    /// Stores `up` as object `name` in one step, finalized or left appendable as it ended,
    /// and answers the stream as a session would have.
    pub(super) async fn store_whole(
        &self,
        bucket: &str,
        name: &str,
        up: WholeUpload,
        pre: Preconditions,
        metadata: CustomMetadata,
    ) -> Result<Response<WriteStream>, Status> {
        let len = up.bytes.len() as u64;
        let segs = Segments::from_bytes(up.bytes);
        let answers = if up.finished {
            let entry = self.store.put(bucket, name, segs, pre, metadata)?;
            vec![
                created_answer(bucket, name, &entry, 0),
                resource_answer(bucket, name, &entry, None),
            ]
        } else {
            let (entry, writer) = self
                .store
                .create_appendable(bucket, name, pre, metadata, segs)?;
            let mut answers = vec![created_answer(bucket, name, &entry, writer.token)];
            let lookups = if up.looked_up { 2 } else { 1 };
            answers.extend((0..lookups).map(|_| persisted_response(&entry.content)));
            answers
        };
        add(&self.calls.stats.whole_uploads, 1);
        add(&self.calls.stats.bytes_received, len);
        let (out, stream) = Outbox::new(self.calls.faults.latency());
        for resp in answers {
            // At most three: the queue holds them all, none waits for the client.
            out.send(Ok(resp)).await;
        }
        Ok(Response::new(stream))
    }
}

/// The answer to the first message: the object as it was created, empty, with the write
/// handle of writer `token`. Rendered from an empty generation of its own, since the stored
/// one holds the bytes already.
fn created_answer(bucket: &str, name: &str, entry: &Entry, token: u64) -> BidiWriteObjectResponse {
    let created = Entry {
        content: Content::new(
            entry.content.generation,
            StoredData::Mem(Default::default()),
            WriteState::appendable(token, entry.create_time),
        ),
        ..entry.clone()
    };
    let handle = write_handle(&entry.content, token);
    resource_answer(bucket, name, &created, Some(handle))
}

/// An answer carrying `entry` as the resource, and a write handle if given.
fn resource_answer(
    bucket: &str,
    name: &str,
    entry: &Entry,
    handle: Option<Bytes>,
) -> BidiWriteObjectResponse {
    BidiWriteObjectResponse {
        write_status: Some(WriteStatus::Resource(to_proto(bucket, name, entry))),
        write_handle: handle.map(|handle| BidiWriteHandle { handle }),
        persisted_data_checksums: None,
    }
}
