//! `AppendWriter`: one `BidiWriteObject` session on an appendable object.
//!
//! Data goes out in CRC32C-checked chunks of at most 2 MiB and stays in memory until the
//! service reports it persisted (bounded by `write_buffer_kb`: `append` flushes and waits
//! beyond that). When the stream breaks (cut, transient status, redirect) the writer reopens
//! with `AppendObjectSpec` + write handle (+ routing token), learns the persisted size from
//! the reopen's first response and resends exactly from there: nothing lost, nothing
//! duplicated. FAILED_PRECONDITION on the stream means another writer took over: `Fenced`.
//! Touches only its own stream.

use super::buffer::Unpersisted;
use super::retry::{self, Backoff};
use super::{bucket_path, object_url, stream, Client, Error, ObjectMeta, Result};
use crate::proto::storage::{
    bidi_write_object_request::{Data, FirstMessage},
    bidi_write_object_response::WriteStatus,
    AppendObjectSpec, BidiWriteHandle, BidiWriteObjectRedirectedError, BidiWriteObjectRequest,
    BidiWriteObjectResponse, ChecksummedData, Object, ObjectChecksums, WriteObjectSpec,
};
use bytes::Bytes;
use futures::FutureExt;
use std::collections::HashMap;
use std::time::Duration;
use tonic::{Code, Status};

/// The wire limit of one data message.
pub(crate) const MAX_CHUNK: usize = 2 * 1024 * 1024;
/// Appended bytes wait in the writer until this many are unsent (or a flush, close or
/// finish takes them): a small file's bytes then leave with its create and its closing
/// flush in one write to the socket, and the service wakes once for the file, not three
/// times. Larger files stream as before, their close waiting for at most this much more.
const SEND_AT_LEAST: u64 = 256 * 1024;
const REDIRECT_TYPE: &str = "google.storage.v2.BidiWriteObjectRedirectedError";

/// How `try_pump` ends what it sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// As it comes: a flush + state_lookup only when half the buffer waits unpersisted.
    Open,
    /// With flush + state_lookup, unless one is unanswered when the last message goes.
    Lookup,
    /// With flush + state_lookup, and the half-close of the stream.
    Close,
}

/// Why an attempt failed: the stream (worth a reconnect, maybe) or for good.
enum Fail {
    /// The stream broke; another attempt may succeed.
    Stream(Status),
    /// Nothing will get better by trying again.
    Fatal(Error),
}

impl From<Status> for Fail {
    fn from(s: Status) -> Self {
        Fail::Stream(s)
    }
}

type Attempt<T> = std::result::Result<T, Fail>;

struct Conn {
    tx: stream::Requests<BidiWriteObjectRequest>,
    rx: stream::Responses<BidiWriteObjectResponse>,
}

/// The spec that creates the appendable object `object` with custom `metadata`.
fn create_spec(
    bucket: &str,
    object: &str,
    if_generation_match: Option<i64>,
    metadata: HashMap<String, String>,
) -> WriteObjectSpec {
    WriteObjectSpec {
        resource: Some(Object {
            name: object.to_string(),
            bucket: bucket_path(bucket),
            metadata,
            ..Default::default()
        }),
        if_generation_match,
        appendable: Some(true),
        ..Default::default()
    }
}

/// One BidiWriteObject session on an appendable object. Keeps every unpersisted byte;
/// resumes from persisted_size after a broken stream (takeover with the write handle).
/// Dropping it without `flush`, `close` or `finalize` abandons what is not yet persisted.
pub struct AppendWriter {
    client: Client,
    bucket: String,
    object: String,
    what: String,
    generation: i64,
    handle: Option<Bytes>,
    routing_token: Option<String>,
    /// The newest object resource the service returned.
    resource: Object,
    written: u64,
    persisted: u64,
    /// Unpersisted data covering [persisted, written).
    pending: Unpersisted,
    /// Everything below this offset went out on the current stream.
    sent: u64,
    /// CRC32C of [0, written), when the start of the object is known.
    crc: Option<u32>,
    /// Flush + state_lookup messages not yet answered on the current stream.
    lookups: usize,
    cap: u64,
    conn: Option<Conn>,
    backoff: Backoff,
    failing: bool,
    /// Set once the session failed for good; every later call returns it.
    dead: Option<Error>,
    /// The service has answered this session's create (or open): the object exists and
    /// `generation` is its. False only after `create_unanswered` until the first answer.
    answered: bool,
    /// The spec of a create sent without waiting for its answer: sent again when the stream
    /// breaks before the answer came, since whether the object exists is then unknown.
    unanswered_create: Option<WriteObjectSpec>,
    /// The create of `create_unanswered` has not gone out yet: the stream opens with the
    /// first message that does, so the create, the first bytes and (for a small file) the
    /// closing flush leave in one write to the socket.
    unopened: bool,
}

impl AppendWriter {
    pub(crate) async fn create(
        client: Client,
        bucket: &str,
        object: &str,
        if_generation_match: Option<i64>,
        metadata: HashMap<String, String>,
    ) -> Result<AppendWriter> {
        let mut w = AppendWriter::new(client, bucket, object, 0);
        let spec = create_spec(bucket, object, if_generation_match, metadata);
        w.first_open(Some(spec)).await?;
        w.crc = Some(0);
        Ok(w)
    }

    /// Creates (or replaces: no precondition) the appendable object without waiting for the
    /// service's answer: the spec goes out with the first message sent after it (bytes, a
    /// flush or the close), so a create costs no round trip and no write to the socket of
    /// its own. `generation` stays 0, and `flush` does not return, until the answer has
    /// come; a stream broken before it sends the spec again, and the data after it.
    pub(crate) fn create_unanswered(client: Client, bucket: &str, object: &str) -> AppendWriter {
        let mut w = AppendWriter::new(client, bucket, object, 0);
        w.crc = Some(0);
        w.answered = false;
        w.unopened = true;
        w.unanswered_create = Some(create_spec(bucket, object, None, HashMap::new()));
        w
    }

    /// Opens the stream of `create_unanswered` with its spec, without waiting for the answer.
    async fn open_unanswered(&mut self) -> Attempt<()> {
        self.unopened = false;
        let Some(spec) = self.unanswered_create.clone() else {
            return Ok(());
        };
        crate::metrics::stream("write", crate::metrics::StreamEvent::from_reopen(false));
        let msg = BidiWriteObjectRequest {
            first_message: Some(FirstMessage::WriteObjectSpec(spec)),
            write_offset: 0,
            ..Default::default()
        };
        let timeout = Duration::from_millis(self.client.config().call_timeout_ms);
        let (tx, rx) = tokio::time::timeout(
            timeout,
            stream::write(self.client.streams(), &self.bucket, None, &msg),
        )
        .await
        .unwrap_or_else(|_| Err(Status::deadline_exceeded("write stream open timed out")))?;
        self.conn = Some(Conn { tx, rx });
        Ok(())
    }

    pub(crate) async fn takeover(
        client: Client,
        bucket: &str,
        object: &str,
        generation: i64,
    ) -> Result<AppendWriter> {
        let mut w = AppendWriter::new(client, bucket, object, generation);
        w.first_open(None).await?;
        w.crc = match (
            w.persisted,
            w.resource.checksums.as_ref().and_then(|c| c.crc32c),
        ) {
            (0, _) => Some(0),
            (_, c) => c,
        };
        Ok(w)
    }

    fn new(client: Client, bucket: &str, object: &str, generation: i64) -> AppendWriter {
        let cap = client.config().write_buffer_kb.max(2 * 1024) * 1024;
        let backoff = Backoff::new(client.config());
        AppendWriter {
            what: object_url(bucket, object),
            bucket: bucket.to_string(),
            object: object.to_string(),
            generation,
            handle: None,
            routing_token: None,
            resource: Object::default(),
            written: 0,
            persisted: 0,
            pending: Unpersisted::default(),
            sent: 0,
            crc: None,
            lookups: 0,
            cap,
            conn: None,
            backoff,
            failing: false,
            dead: None,
            answered: true,
            unanswered_create: None,
            unopened: false,
            client,
        }
    }

    /// The object's generation (appends do not change it); 0 while a create sent by
    /// `create_unanswered` has no answer yet.
    pub fn generation(&self) -> i64 {
        self.generation
    }

    /// The name of the object this writer writes.
    pub fn object(&self) -> &str {
        &self.object
    }

    /// Bytes accepted by `append` so far (== object size once all is persisted).
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Bytes the service has reported persisted.
    pub fn persisted(&self) -> u64 {
        self.persisted
    }

    /// Queues data (split into <= 2 MiB CRC32C-checked chunks), handed to the stream once
    /// `SEND_AT_LEAST` bytes wait (or by the next flush, close or finish); applies
    /// back-pressure when too much is unpersisted (bounded buffer).
    pub async fn append(&mut self, data: Bytes) -> Result<()> {
        self.check_dead()?;
        let mut rest = data;
        while !rest.is_empty() {
            let piece = rest.split_to(rest.len().min(MAX_CHUNK));
            let len = piece.len() as u64;
            if self.pending.len() + len > self.cap {
                self.wait_persisted(self.written + len - self.cap).await?;
            }
            // Each byte's CRC is computed once: the piece's, kept for its data message and
            // folded into the object's.
            let piece_crc = super::crc32c(&piece);
            let before = self.written;
            self.crc = self
                .crc
                .map(|c| super::crc32c_concat(c, before, piece_crc, piece.len()));
            self.pending.push(piece, piece_crc);
            self.written += len;
            if self.written - self.sent >= SEND_AT_LEAST {
                self.pump().await?;
            }
        }
        Ok(())
    }

    /// flush + state_lookup; returns when persisted_size covers everything appended (and the
    /// object's create is answered).
    pub async fn flush(&mut self) -> Result<u64> {
        self.check_dead()?;
        self.wait_persisted(self.written).await?;
        Ok(self.persisted)
    }

    /// Makes every appended byte durable and half-closes without finalizing; the object stays
    /// appendable. The last flush and the half-close leave together, so that a close costs one
    /// round trip, not one for the flush and another for the close.
    pub async fn close(mut self) -> Result<ObjectMeta> {
        self.check_dead()?;
        while let Err(f) = self.try_close().await {
            self.recover(f).await?;
        }
        let mut meta = ObjectMeta::from(&self.resource);
        meta.generation = self.generation;
        meta.size = self.persisted;
        meta.finalized = false;
        Ok(meta)
    }

    /// Sends what is left with flush + state_lookup, half-closes, and takes in the answers
    /// until the stream ends. Once every byte is persisted (and the create answered), a
    /// broken stream no longer matters: the closing answers only refresh metadata.
    async fn try_close(&mut self) -> Attempt<()> {
        let closed = self.send_close().await;
        let settled = self.answered && self.persisted >= self.written;
        match closed {
            Err(Fail::Fatal(e)) => Err(Fail::Fatal(e)),
            _ if settled => Ok(()),
            Ok(()) => {
                Err(Status::unavailable("write stream ended before persisting every byte").into())
            }
            Err(f) => Err(f),
        }
    }

    /// The sends and receives of `try_close`, whatever they leave persisted.
    async fn send_close(&mut self) -> Attempt<()> {
        self.try_pump(Ending::Close).await?;
        let Some(Conn { tx, mut rx }) = self.conn.take() else {
            return Err(Status::unavailable("no write stream").into());
        };
        drop(tx);
        loop {
            let wait = self.answer_wait();
            match tokio::time::timeout(wait, rx.message()).await {
                Ok(Ok(Some(resp))) => self.on_response(resp)?,
                Ok(Ok(None)) => return Ok(()),
                Ok(Err(s)) => return Err(s.into()),
                Err(_) => {
                    return Err(Status::deadline_exceeded(format!("no answer for {wait:?}")).into())
                }
            }
        }
    }

    /// Flushes and finalizes (finish_write, whole-object CRC32C checked).
    pub async fn finalize(mut self) -> Result<ObjectMeta> {
        self.check_dead()?;
        let obj = loop {
            match self.try_finish().await {
                Ok(o) => break o,
                Err(f) => {
                    if let Err(e) = self.recover(f).await {
                        return self.finished_anyway(e).await;
                    }
                }
            }
        };
        self.check_final(&obj)
    }

    fn check_dead(&self) -> Result<()> {
        match &self.dead {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn append_spec(&self, with_handle: bool) -> AppendObjectSpec {
        AppendObjectSpec {
            bucket: bucket_path(&self.bucket),
            object: self.object.clone(),
            generation: self.generation,
            routing_token: self.routing_token.clone(),
            write_handle: self
                .handle
                .clone()
                .filter(|_| with_handle)
                .map(|handle| BidiWriteHandle { handle }),
            ..Default::default()
        }
    }

    /// Opens a stream with `first` and waits for its first response (resource + handle).
    async fn open(&mut self, first: FirstMessage, reopen: bool) -> Attempt<()> {
        crate::metrics::stream("write", crate::metrics::StreamEvent::from_reopen(reopen));
        let write_offset = self.persisted;
        let msg = BidiWriteObjectRequest {
            first_message: Some(first),
            write_offset: write_offset as i64,
            ..Default::default()
        };
        let timeout = Duration::from_millis(self.client.config().call_timeout_ms);
        let opened = async {
            let (tx, mut rx) = stream::write(
                self.client.streams(),
                &self.bucket,
                self.routing_token.as_deref(),
                &msg,
            )
            .await?;
            match rx.message().await? {
                Some(first) => Ok((tx, rx, first)),
                None => Err(Status::unavailable(
                    "write stream ended before its first answer",
                )),
            }
        };
        let (tx, rx, first) = match tokio::time::timeout(timeout, opened).await {
            Ok(r) => r?,
            Err(_) => return Err(Status::deadline_exceeded("write stream open timed out").into()),
        };
        let size = match &first.write_status {
            Some(WriteStatus::Resource(o)) => o.size,
            Some(WriteStatus::PersistedSize(n)) => *n,
            None => {
                return Err(Fail::Fatal(Error::Other(format!(
                    "{}: first write response carried no size",
                    self.what
                ))))
            }
        };
        let size = u64::try_from(size).unwrap_or(0);
        if reopen && (size < self.persisted || size > self.written) {
            return Err(Fail::Fatal(Error::Other(format!(
                "{}: service reports {size} bytes persisted, expected between {} and {}",
                self.what, self.persisted, self.written
            ))));
        }
        self.conn = Some(Conn { tx, rx });
        self.lookups = 0;
        if !reopen {
            // A new or taken-over object: its current size is where appends continue.
            self.persisted = size;
            self.written = size;
            self.pending = Unpersisted::at(size);
        }
        self.on_response(first)?;
        self.sent = self.persisted;
        Ok(())
    }

    /// Create (`create: Some`) or takeover (`None`): retried on transient errors; a redirect
    /// only lends its routing token (its handle would turn a takeover into a mere reconnect).
    async fn first_open(&mut self, create: Option<WriteObjectSpec>) -> Result<()> {
        loop {
            let first = match &create {
                Some(spec) => FirstMessage::WriteObjectSpec(spec.clone()),
                None => FirstMessage::AppendObjectSpec(self.append_spec(false)),
            };
            let s = match self.open(first, false).await {
                Ok(()) => return Ok(()),
                Err(Fail::Fatal(e)) => return Err(e),
                Err(Fail::Stream(s)) => s,
            };
            // Only the routing token: a handle would turn a takeover into a mere reconnect.
            let redirected =
                match retry::redirect_detail::<BidiWriteObjectRedirectedError>(&s, REDIRECT_TYPE) {
                    Some(r) => {
                        if r.routing_token.is_some() {
                            self.routing_token = r.routing_token;
                        }
                        true
                    }
                    None => false,
                };
            retry::retry_after(&mut self.backoff, &s, redirected, &self.what).await?;
        }
    }

    /// Learns what a response says: handle, persisted size, resource.
    fn on_response(&mut self, resp: BidiWriteObjectResponse) -> Attempt<()> {
        if let Some(h) = resp.write_handle {
            self.handle = Some(h.handle);
        }
        match resp.write_status {
            Some(WriteStatus::PersistedSize(n)) => {
                self.lookups = self.lookups.saturating_sub(1);
                self.set_persisted(n)?;
            }
            Some(WriteStatus::Resource(o)) => {
                // The answer to a create sent without waiting answers no lookup.
                if self.answered {
                    self.lookups = self.lookups.saturating_sub(1);
                }
                self.answered = true;
                self.generation = o.generation;
                self.set_persisted(o.size)?;
                self.resource = o;
            }
            None => {}
        }
        if let (Some(theirs), Some(ours)) = (
            resp.persisted_data_checksums.and_then(|c| c.crc32c),
            self.crc,
        ) {
            if self.persisted == self.written && theirs != ours {
                return Err(Fail::Fatal(Error::Checksum(format!(
                    "{}: service has crc32c {theirs:08x} for {} persisted bytes, we sent {ours:08x}",
                    self.what, self.persisted
                ))));
            }
        }
        Ok(())
    }

    /// Persisted data needs no keeping any more. More persisted than written is a service
    /// that holds bytes we never sent: appending after them would put ours at wrong offsets.
    fn set_persisted(&mut self, n: i64) -> Attempt<()> {
        let n = u64::try_from(n).unwrap_or(0);
        if n > self.written {
            return Err(Fail::Fatal(Error::Other(format!(
                "{}: service reports {n} bytes persisted, only {} were written",
                self.what, self.written
            ))));
        }
        if n > self.persisted {
            self.persisted = n;
            self.failing = false;
        }
        self.pending.trim_to(self.persisted);
        Ok(())
    }

    /// Sends one message, taking in responses that arrive while the queue is full; `last`
    /// half-closes the stream with it.
    async fn send(&mut self, msg: BidiWriteObjectRequest, last: bool) -> Attempt<()> {
        if self.unopened {
            self.open_unanswered().await?;
        }
        // A message that leaves little queued (a flush, a close, the first bytes of a small
        // file) goes out without waiting for the stream's capacity: waiting would hand the
        // connection's task each message in its own write to the socket.
        let bytes = msg
            .data
            .as_ref()
            .map_or(0, |Data::ChecksummedData(d)| d.content.len());
        let queued_after = self.sent.saturating_sub(self.persisted) + bytes as u64;
        if bytes == 0 || queued_after <= SEND_AT_LEAST {
            let Some(conn) = self.conn.as_mut() else {
                return Err(Status::unavailable("no write stream").into());
            };
            return Ok(conn.tx.send_write(msg, last)?);
        }
        // A service that neither grants room nor answers for a whole stall has stopped, as
        // surely as one that does not answer a lookup.
        let stall = self.stall();
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return Err(Status::unavailable("no write stream").into());
            };
            let resp = tokio::select! {
                ready = conn.tx.ready() => {
                    ready?;
                    return Ok(conn.tx.send_write(msg, last)?);
                }
                resp = conn.rx.message() => resp,
                _ = tokio::time::sleep(stall) => {
                    let stalled = format!("no room to send and no answer for {stall:?}");
                    return Err(Status::deadline_exceeded(stalled).into());
                }
            };
            match resp {
                Ok(Some(r)) => self.on_response(r)?,
                Ok(None) => return Err(Status::unavailable("write stream ended").into()),
                Err(s) => return Err(s.into()),
            }
        }
    }

    /// How long the stream may give neither an answer nor room to send before it counts as
    /// broken.
    fn stall(&self) -> Duration {
        Duration::from_millis(self.client.config().stall_timeout_ms.max(1))
    }

    /// How long an answer may take: a stall, plus the time the bytes sent and not yet
    /// persisted take to arrive at the slowest rate the sends accept (a message per stall).
    /// Those bytes may still be queued on this side (h2 holds up to a window), so a slow
    /// link that drains them is not taken for a stopped service.
    fn answer_wait(&self) -> Duration {
        let unpersisted = self.sent.saturating_sub(self.persisted);
        let messages = 1.0 + unpersisted as f64 / MAX_CHUNK as f64;
        Duration::try_from_secs_f64(self.stall().as_secs_f64() * messages).unwrap_or(Duration::MAX)
    }

    /// Takes in the responses that have already arrived, without waiting.
    fn poll_responses(&mut self) -> Attempt<()> {
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return Ok(());
            };
            match conn.rx.message().now_or_never() {
                None => return Ok(()),
                Some(Ok(Some(r))) => self.on_response(r)?,
                Some(Ok(None)) => return Err(Status::unavailable("write stream ended").into()),
                Some(Err(s)) => return Err(s.into()),
            }
        }
    }

    /// Waits for the next response (a stream silent past `answer_wait` counts as broken).
    async fn next_response(&mut self) -> Attempt<BidiWriteObjectResponse> {
        let wait = self.answer_wait();
        let Some(conn) = self.conn.as_mut() else {
            return Err(Status::unavailable("no write stream").into());
        };
        match tokio::time::timeout(wait, conn.rx.message()).await {
            Ok(Ok(Some(r))) => Ok(r),
            Ok(Ok(None)) => Err(Status::unavailable("write stream ended").into()),
            Ok(Err(s)) => Err(s.into()),
            Err(_) => Err(Status::deadline_exceeded(format!("no answer for {wait:?}")).into()),
        }
    }

    /// Sends every pending byte not yet on the current stream, ending as `ending` says; asks
    /// for the persisted size early (half the buffer) so `append` rarely has to wait for it.
    /// The flush + state_lookup rides on the last data message (the service flushes
    /// everything up to and including it): a small file's bytes, its flush and the
    /// half-close of its close leave in one write to the socket and reach the service as one
    /// message.
    async fn try_pump(&mut self, ending: Ending) -> Attempt<()> {
        self.poll_responses()?;
        let close = ending == Ending::Close;
        while self.sent < self.written {
            let Some((piece, piece_crc)) = self.pending.piece_from(self.sent) else {
                break;
            };
            let start = self.sent;
            let end = start + piece.len() as u64;
            // Decided at the last message: sending the ones before it may have taken in
            // the answer of a lookup that was outstanding when the pump began.
            let ask = end >= self.written && self.asks_lookup(ending);
            let msg = BidiWriteObjectRequest {
                write_offset: start as i64,
                data: Some(Data::ChecksummedData(ChecksummedData {
                    crc32c: Some(piece_crc),
                    content: piece.clone(),
                })),
                flush: ask,
                state_lookup: ask,
                ..Default::default()
            };
            self.send(msg, ask && close).await?;
            self.sent = end;
            if ask {
                self.lookups += 1;
                return Ok(());
            }
        }
        // Nothing was left to carry it, or the last message's own send took in the answer
        // it counted on.
        if self.asks_lookup(ending) {
            self.send_lookup(close).await?;
        }
        Ok(())
    }

    /// Whether a pump ending as `ending` asks for the persisted size, as things stand now.
    fn asks_lookup(&self, ending: Ending) -> bool {
        match ending {
            Ending::Open => self.lookups == 0 && self.pending.len() >= self.cap / 2,
            Ending::Lookup => self.lookups == 0,
            Ending::Close => true,
        }
    }

    /// Sends a bare flush + state_lookup; `last` half-closes the stream with it.
    async fn send_lookup(&mut self, last: bool) -> Attempt<()> {
        let msg = BidiWriteObjectRequest {
            write_offset: self.sent as i64,
            flush: true,
            state_lookup: true,
            ..Default::default()
        };
        self.send(msg, last).await?;
        self.lookups += 1;
        Ok(())
    }

    async fn pump(&mut self) -> Result<()> {
        loop {
            match self.try_pump(Ending::Open).await {
                Ok(()) => return Ok(()),
                Err(f) => self.recover(f).await?,
            }
        }
    }

    /// Returns once the service reports at least `target` bytes persisted (and has answered
    /// the create).
    async fn wait_persisted(&mut self, target: u64) -> Result<()> {
        while self.persisted < target || !self.answered {
            let attempt = async {
                // A lookup answered meanwhile may have been the last one needed.
                self.poll_responses()?;
                if self.persisted >= target && self.answered {
                    return Ok(());
                }
                self.try_pump(Ending::Lookup).await?;
                let r = self.next_response().await?;
                self.on_response(r)
            };
            if let Err(f) = attempt.await {
                self.recover(f).await?;
            }
        }
        Ok(())
    }

    /// Sends finish_write with the whole-object CRC32C and waits for the final resource.
    async fn try_finish(&mut self) -> Attempt<Object> {
        self.try_pump(Ending::Open).await?;
        let msg = BidiWriteObjectRequest {
            write_offset: self.written as i64,
            finish_write: true,
            object_checksums: self.crc.map(|c| ObjectChecksums {
                crc32c: Some(c),
                md5_hash: Bytes::new(),
            }),
            ..Default::default()
        };
        self.send(msg, false).await?;
        loop {
            let r = self.next_response().await?;
            if let Some(WriteStatus::Resource(o)) = &r.write_status {
                if o.finalize_time.is_some() {
                    let o = o.clone();
                    self.on_response(r)?;
                    return Ok(o);
                }
            }
            self.on_response(r)?;
        }
    }

    /// The final resource must hold exactly what we wrote.
    fn check_final(&self, o: &Object) -> Result<ObjectMeta> {
        let meta = ObjectMeta::from(o);
        if meta.size != self.written {
            return Err(Error::Other(format!(
                "{}: finalized with {} bytes, {} were written",
                self.what, meta.size, self.written
            )));
        }
        if let (Some(theirs), Some(ours)) = (meta.crc32c, self.crc) {
            if theirs != ours {
                return Err(Error::Checksum(format!(
                    "{}: object crc32c {theirs:08x}, we wrote {ours:08x}",
                    self.what
                )));
            }
        }
        Ok(meta)
    }

    /// A reconnect after a lost finish answer is refused because the object is finalized:
    /// that is success when the object holds exactly what we wrote.
    async fn finished_anyway(&self, e: Error) -> Result<ObjectMeta> {
        if !matches!(e, Error::Fenced(_)) {
            return Err(e);
        }
        match self.client.get_object(&self.bucket, &self.object).await {
            Ok(m) if m.finalized && m.generation == self.generation && m.size == self.written => {
                if m.crc32c.is_some() && self.crc.is_some() && m.crc32c != self.crc {
                    return Err(Error::Checksum(format!(
                        "{}: object crc32c differs",
                        self.what
                    )));
                }
                Ok(m)
            }
            _ => Err(e),
        }
    }

    /// After a failed attempt: give up for good, or reopen (backoff unless redirected)
    /// with the write handle and continue from the persisted size.
    async fn recover(&mut self, f: Fail) -> Result<()> {
        let mut s = match f {
            Fail::Fatal(e) => return Err(self.die(e)),
            Fail::Stream(s) => s,
        };
        self.conn = None;
        if !self.failing {
            self.failing = true;
            self.backoff.reset();
        }
        loop {
            let redirected = self.take_redirect(&s);
            if !redirected && s.code() == Code::FailedPrecondition {
                let e = Error::Fenced(format!("{}: {}", self.what, s.message()));
                return Err(self.die(e));
            }
            if let Err(e) = retry::retry_after(&mut self.backoff, &s, redirected, &self.what).await
            {
                return Err(self.die(e));
            }
            tracing::debug!(object = %self.what, code = ?s.code(), msg = s.message(), "reopening write stream");
            let first = match &self.unanswered_create {
                // Whether the create reached the service is unknown: create again (the
                // pending bytes still start at 0) rather than reopen an object that may not exist.
                Some(spec) if !self.answered => FirstMessage::WriteObjectSpec(spec.clone()),
                _ => FirstMessage::AppendObjectSpec(self.append_spec(true)),
            };
            match self.open(first, true).await {
                Ok(()) => {
                    if self.pending.len() == 0 {
                        // Nothing left to prove progress with: this recovery is complete.
                        self.failing = false;
                    }
                    return Ok(());
                }
                Err(Fail::Fatal(e)) => return Err(self.die(e)),
                Err(Fail::Stream(next)) => s = next,
            }
        }
    }

    fn take_redirect(&mut self, s: &Status) -> bool {
        let Some(r) = retry::redirect_detail::<BidiWriteObjectRedirectedError>(s, REDIRECT_TYPE)
        else {
            return false;
        };
        if let Some(t) = r.routing_token {
            self.routing_token = Some(t);
        }
        if let (Some(h), Some(g)) = (r.write_handle, r.generation) {
            self.handle = Some(h.handle);
            self.generation = g;
            self.answered = true;
        }
        true
    }

    fn die(&mut self, e: Error) -> Error {
        self.conn = None;
        self.dead = Some(e.clone());
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_persisted_size_beyond_the_bytes_written_is_refused() {
        let (_emu, cfg) = crate::fs::test_emulator(&[], 0).await;
        let client = Client::connect(&cfg.gcs).await.expect("client");
        let mut w = AppendWriter::new(client, "b", "o", 1);
        w.written = 10;
        let answer = |n| BidiWriteObjectResponse {
            write_status: Some(WriteStatus::PersistedSize(n)),
            ..Default::default()
        };
        assert!(w.on_response(answer(10)).is_ok());
        assert_eq!(w.persisted(), 10);
        assert!(matches!(w.on_response(answer(11)), Err(Fail::Fatal(_))));
        assert_eq!(w.persisted(), 10);
    }
}
