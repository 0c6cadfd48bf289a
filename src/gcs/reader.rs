//! `BidiReader`: one `BidiReadObject` session with many ranges in flight.
//!
//! A background task owns the stream. Callers hand it ranges through a channel; the task
//! batches whatever is queued into request messages of at most 100 ranges, routes each
//! response chunk to its range by `read_id`, checks the chunk's CRC32C and offset, and
//! delivers the bytes in order. When the stream breaks (redirect, cut, stall, transient
//! status, corrupt chunk) it reopens with the newest read handle and routing token and asks
//! only for the unfinished remainder of every range; after the retry deadline passes without
//! progress, every caller gets `Error::Unavailable`. Touches only its own stream.

use super::ranges::{joined_to_keep, BadChunk, RangeTable, Sink};
use super::retry::{self, Backoff};
use super::{bucket_path, object_url, stream, Client, Error, ObjectMeta, Result};
use crate::proto::storage::{
    BidiReadHandle, BidiReadObjectRedirectedError, BidiReadObjectRequest, BidiReadObjectResponse,
    BidiReadObjectSpec, ReadRange,
};
use bytes::Bytes;
use futures::Stream;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::Status;

/// The wire limit of ranges in one request message.
const MAX_RANGES_PER_MESSAGE: usize = 100;
const REDIRECT_TYPE: &str = "google.storage.v2.BidiReadObjectRedirectedError";

/// One BidiReadObject session: many ranges in flight, reconnects invisibly. Cheap to clone
/// (Arc inside); clones share the stream. Dropping the last clone closes the stream.
#[derive(Clone)]
pub struct BidiReader {
    shared: Arc<Shared>,
}

/// What the callers hold; the task holds only `counters`, so dropping the last
/// `BidiReader` closes `cmd` and thereby ends the task and its stream.
struct Shared {
    meta: ObjectMeta,
    what: String,
    cmd: mpsc::UnboundedSender<Cmd>,
    counters: Arc<Counters>,
    stream_window: u64,
}

#[derive(Default)]
struct Counters {
    in_flight: Arc<AtomicUsize>,
    broken: AtomicBool,
    reconnects: AtomicU64,
}

/// A new range for the task: deliver [offset, offset+len) to `tx`.
struct Cmd {
    offset: u64,
    len: u64,
    tx: Sink,
}

impl BidiReader {
    pub(crate) async fn open(
        client: Client,
        bucket: &str,
        object: &str,
        generation: Option<i64>,
    ) -> Result<BidiReader> {
        Ok(Self::open_inner(client, bucket, object, generation, None)
            .await?
            .0)
    }

    /// Opens the stream with `first` = (offset, len) already in its first message, so the
    /// bytes follow the metadata without another round trip. The range must lie inside the
    /// object (the caller knows its size).
    async fn open_inner(
        client: Client,
        bucket: &str,
        object: &str,
        generation: Option<i64>,
        first: Option<(u64, u64)>,
    ) -> Result<(BidiReader, Option<PendingRead>)> {
        let counters = Arc::new(Counters::default());
        let stream_window = client.config().read_stream_window_kb.max(1) * 1024;
        let mut session = Session {
            what: object_url(bucket, object),
            bucket: bucket.to_string(),
            object: object.to_string(),
            generation,
            handle: None,
            routing_token: None,
            ranges: RangeTable::new(counters.in_flight.clone()),
            unsent: Vec::new(),
            conn: None,
            stall: Duration::from_millis(client.config().stall_timeout_ms.max(1)),
            last_activity: Instant::now(),
            failing: false,
            last_error: None,
            redirected: false,
            counters: counters.clone(),
            client,
        };
        let first_rx = first.map(|(offset, len)| {
            let (tx, rx) = mpsc::unbounded_channel();
            counters.in_flight.fetch_add(1, Ordering::Relaxed);
            session.ranges.insert(offset, len, tx);
            (offset, len, rx)
        });
        let meta = session.first_open().await?;
        let (cmd, cmd_rx) = mpsc::unbounded_channel();
        let what = session.what.clone();
        tokio::spawn(session.run(cmd_rx));
        let shared = Arc::new(Shared {
            meta,
            what,
            cmd,
            counters,
            stream_window,
        });
        let pending = first_rx.map(|(offset, len, rx)| PendingRead {
            shared: shared.clone(),
            offset,
            len,
            rx,
        });
        Ok((BidiReader { shared }, pending))
    }

    /// The object as seen at open; its generation is pinned for the life of the reader.
    pub fn metadata(&self) -> &ObjectMeta {
        &self.shared.meta
    }

    /// The bytes [offset, offset+len) clipped to the object end; concurrent calls share the
    /// stream and are batched into one request message when they queue up together.
    pub async fn read(&self, offset: u64, len: u64) -> Result<Bytes> {
        let (offset, len) = self.clip(offset, len);
        if len == 0 {
            return Ok(Bytes::new());
        }
        let rx = self.shared.start(offset, len)?;
        crate::metrics::stream("read", crate::metrics::StreamEvent::Reused);
        PendingRead {
            shared: self.shared.clone(),
            offset,
            len,
            rx,
        }
        .bytes()
        .await
    }

    /// Same range, delivered as in-order chunks (for streaming large ranges without
    /// buffering). At most `read_stream_window_kb` are requested ahead of the consumer, as
    /// several smaller ranges, so a slow consumer holds back only itself.
    pub fn read_stream(
        &self,
        offset: u64,
        len: u64,
    ) -> impl Stream<Item = Result<Bytes>> + Send + 'static {
        let (offset, len) = self.clip(offset, len);
        let piece = (self.shared.stream_window / 4).clamp(64 * 1024, 16 * 1024 * 1024);
        let depth = (self.shared.stream_window / piece).max(1) as usize;
        let state = StreamState {
            shared: self.shared.clone(),
            next: offset,
            end: offset + len,
            piece,
            depth,
            pieces: VecDeque::new(),
        };
        futures::stream::unfold(Some(state), |state| async move {
            let mut st = state?;
            loop {
                if let Err(e) = st.top_up() {
                    return Some((Err(e), None));
                }
                let (p_off, p_len, p_got, rx) = st.pieces.front_mut()?;
                match rx.recv().await {
                    Some(Ok(chunk)) => {
                        *p_got += chunk.len() as u64;
                        return Some((Ok(chunk), Some(st)));
                    }
                    Some(Err(e)) => return Some((Err(e), None)),
                    None if *p_got != *p_len => {
                        let e = st.shared.short(*p_off, *p_len, *p_got);
                        return Some((Err(e), None));
                    }
                    None => {
                        st.pieces.pop_front();
                    }
                }
            }
        })
    }

    /// Ranges currently outstanding on this stream (for pool balancing).
    pub fn in_flight(&self) -> usize {
        self.shared.counters.in_flight.load(Ordering::Relaxed)
    }

    /// True once the session has failed for good (callers open a new reader).
    pub fn is_broken(&self) -> bool {
        self.shared.counters.broken.load(Ordering::Relaxed)
    }

    /// Streams opened after the first one (redirects, cuts, stalls, transient errors).
    pub fn reconnects(&self) -> u64 {
        self.shared.counters.reconnects.load(Ordering::Relaxed)
    }

    /// [offset, offset+len) clipped to the object size seen at open.
    fn clip(&self, offset: u64, len: u64) -> (u64, u64) {
        let size = self.shared.meta.size;
        let offset = offset.min(size);
        (offset, len.min(size - offset))
    }
}

impl Shared {
    /// Hands a range to the task; the receiver yields its chunks in order, then closes.
    fn start(&self, offset: u64, len: u64) -> Result<mpsc::UnboundedReceiver<Result<Bytes>>> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.counters.in_flight.fetch_add(1, Ordering::Relaxed);
        if self.cmd.send(Cmd { offset, len, tx }).is_err() {
            self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
            return Err(Error::Unavailable(format!(
                "{}: read session has failed; open a new reader",
                self.what
            )));
        }
        Ok(rx)
    }

    fn short(&self, offset: u64, len: u64, got: u64) -> Error {
        Error::Unavailable(format!(
            "{}: range [{offset}, {}) ended after {got} bytes",
            self.what,
            offset + len
        ))
    }
}

/// A range asked for in a stream's first message (see [`Client::open_reader_reading`]).
pub struct PendingRead {
    shared: Arc<Shared>,
    offset: u64,
    len: u64,
    rx: mpsc::UnboundedReceiver<Result<Bytes>>,
}

impl PendingRead {
    /// All bytes of the range; fewer than asked is an error.
    pub async fn bytes(mut self) -> Result<Bytes> {
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut got = 0u64;
        while let Some(item) = self.rx.recv().await {
            let chunk = item?;
            got += chunk.len() as u64;
            chunks.push(chunk);
        }
        if got != self.len {
            return Err(self.shared.short(self.offset, self.len, got));
        }
        Ok(joined_to_keep(chunks, self.len as usize))
    }
}

impl Client {
    /// Opens a BidiReadObject stream whose first message already asks for
    /// `[offset, offset + len)`: one round trip brings metadata and bytes (the small-file fast
    /// path). The range must lie inside the object as it is at `generation`.
    pub async fn open_reader_reading(
        &self,
        bucket: &str,
        object: &str,
        generation: Option<i64>,
        offset: u64,
        len: u64,
    ) -> Result<(BidiReader, PendingRead)> {
        let (reader, pending) = BidiReader::open_inner(
            self.clone(),
            bucket,
            object,
            generation,
            Some((offset, len)),
        )
        .await?;
        let pending = pending.ok_or_else(|| Error::Other("first range not registered".into()))?;
        Ok((reader, pending))
    }
}

/// A `read_stream` in progress: pieces (offset, len, bytes got, receiver) in order.
struct StreamState {
    shared: Arc<Shared>,
    next: u64,
    end: u64,
    piece: u64,
    depth: usize,
    pieces: VecDeque<(u64, u64, u64, mpsc::UnboundedReceiver<Result<Bytes>>)>,
}

impl StreamState {
    /// Keeps `depth` pieces requested ahead of the consumer.
    fn top_up(&mut self) -> Result<()> {
        while self.pieces.len() < self.depth && self.next < self.end {
            let len = self.piece.min(self.end - self.next);
            let rx = self.shared.start(self.next, len)?;
            self.pieces.push_back((self.next, len, 0, rx));
            self.next += len;
        }
        Ok(())
    }
}

/// The live stream: its request sender and response receiver.
struct Conn {
    tx: stream::Requests<BidiReadObjectRequest>,
    rx: stream::Responses<BidiReadObjectResponse>,
}

/// The task's state: the stream, the ranges, and what a reconnect needs.
struct Session {
    client: Client,
    what: String,
    bucket: String,
    object: String,
    generation: Option<i64>,
    handle: Option<Bytes>,
    routing_token: Option<String>,
    ranges: RangeTable,
    /// Registered ranges not yet asked for on the current stream.
    unsent: Vec<i64>,
    conn: Option<Conn>,
    stall: Duration,
    last_activity: Instant,
    /// A failure series is under way (no payload since the last break).
    failing: bool,
    last_error: Option<Status>,
    /// The last break was a redirect (or an idle close): reconnect at once.
    redirected: bool,
    counters: Arc<Counters>,
}

impl Session {
    fn spec(&self, with_handle: bool) -> BidiReadObjectSpec {
        BidiReadObjectSpec {
            bucket: bucket_path(&self.bucket),
            object: self.object.clone(),
            generation: self.generation.unwrap_or(0),
            read_handle: self
                .handle
                .clone()
                .filter(|_| with_handle)
                .map(|handle| BidiReadHandle { handle }),
            routing_token: self.routing_token.clone(),
            ..Default::default()
        }
    }

    /// Opens a stream whose first message is `spec` plus `ranges`.
    async fn open_stream(
        &self,
        spec: BidiReadObjectSpec,
        ranges: Vec<ReadRange>,
    ) -> std::result::Result<Conn, Status> {
        let first = BidiReadObjectRequest {
            read_object_spec: Some(spec),
            read_ranges: ranges,
        };
        let opening = stream::read(
            self.client.streams(),
            &self.bucket,
            self.routing_token.as_deref(),
            &first,
        );
        let timeout = Duration::from_millis(self.client.config().call_timeout_ms);
        match tokio::time::timeout(timeout, opening).await {
            Ok(Ok((tx, rx))) => Ok(Conn { tx, rx }),
            Ok(Err(s)) => Err(s),
            Err(_) => Err(Status::deadline_exceeded("stream open timed out")),
        }
    }

    /// Learns a redirect's routing token and handle; true when `s` was a redirect.
    fn take_redirect(&mut self, s: &Status) -> bool {
        let Some(r) = retry::redirect_detail::<BidiReadObjectRedirectedError>(s, REDIRECT_TYPE)
        else {
            return false;
        };
        if let Some(t) = r.routing_token {
            self.routing_token = Some(t);
        }
        if let Some(h) = r.read_handle {
            self.handle = Some(h.handle);
        }
        true
    }

    /// The first stream: the spec plus any ranges already registered, then wait for metadata
    /// and handle. Pins the generation.
    async fn first_open(&mut self) -> Result<ObjectMeta> {
        let mut backoff = Backoff::new(self.client.config());
        let timeout = Duration::from_millis(self.client.config().call_timeout_ms);
        loop {
            let ranges: Vec<_> = self
                .ranges
                .ids()
                .iter()
                .take(MAX_RANGES_PER_MESSAGE)
                .filter_map(|id| self.ranges.remainder(*id))
                .collect();
            // No handle: a handle-based open would not carry the metadata we need.
            let attempt = async {
                let mut conn = self.open_stream(self.spec(false), ranges).await?;
                match tokio::time::timeout(timeout, conn.rx.message()).await {
                    Ok(Ok(Some(first))) => Ok((conn, first)),
                    Ok(Ok(None)) => Err(Status::unavailable("stream ended before metadata")),
                    Ok(Err(s)) => Err(s),
                    Err(_) => Err(Status::deadline_exceeded("no metadata in time")),
                }
            };
            let status = match attempt.await {
                Ok((conn, first)) => {
                    let Some(obj) = first.metadata.as_ref() else {
                        return Err(Error::Other(format!(
                            "{}: first response carried no metadata",
                            self.what
                        )));
                    };
                    let meta = ObjectMeta::from(obj);
                    crate::metrics::stream("read", crate::metrics::StreamEvent::Opened);
                    self.generation = Some(meta.generation);
                    self.conn = Some(conn);
                    // The stall clock starts at the answer: an open that took longer than
                    // a stall (a retry, a slow first answer) has not stalled.
                    self.last_activity = Instant::now();
                    // The first response may already carry data of the first ranges; a bad
                    // chunk there is handled like any later break: the task reconnects.
                    if let Err(s) = self.on_response(first) {
                        self.conn = None;
                        self.failing = true;
                        self.last_error = Some(s);
                    }
                    return Ok(meta);
                }
                Err(s) => s,
            };
            let redirected = self.take_redirect(&status);
            retry::retry_after(&mut backoff, &status, redirected, &self.what).await?;
        }
    }

    /// The task: serve commands and responses until every `BidiReader` is gone or the
    /// session fails for good.
    async fn run(mut self, mut cmd_rx: mpsc::UnboundedReceiver<Cmd>) {
        let mut backoff = Backoff::new(self.client.config());
        loop {
            self.prune_cancelled();
            if self.conn.is_none() && !self.ranges.is_empty() {
                if let Err(e) = self.reconnect(&mut backoff).await {
                    self.fail(e, &mut cmd_rx);
                    return;
                }
            }
            self.send_unsent();
            let stall_armed = self.conn.is_some() && !self.ranges.is_empty();
            let stall_at = self.last_activity + self.stall;
            tokio::select! {
                cmd = cmd_rx.recv() => {
                    let Some(cmd) = cmd else { return };
                    self.register(cmd);
                    while let Ok(cmd) = cmd_rx.try_recv() {
                        self.register(cmd);
                    }
                }
                msg = next_message(&mut self.conn) => {
                    self.last_activity = Instant::now();
                    let outcome = match msg {
                        Ok(Some(resp)) => self.on_response(resp),
                        Ok(None) => Err(Status::unavailable("server ended the stream")),
                        Err(s) => Err(s),
                    };
                    if let Err(s) = outcome {
                        if let Err(e) = self.on_break(s, &mut backoff) {
                            self.fail(e, &mut cmd_rx);
                            return;
                        }
                    }
                }
                _ = tokio::time::sleep_until(stall_at), if stall_armed => {
                    let s = Status::deadline_exceeded(format!("stream stalled for {:?}", self.stall));
                    if let Err(e) = self.on_break(s, &mut backoff) {
                        self.fail(e, &mut cmd_rx);
                        return;
                    }
                }
            }
        }
    }

    fn register(&mut self, cmd: Cmd) {
        if self.ranges.is_empty() {
            // The stall clock measures waiting for data, not idle time before this range.
            self.last_activity = Instant::now();
        }
        let id = self.ranges.insert(cmd.offset, cmd.len, cmd.tx);
        self.unsent.push(id);
    }

    /// Forgets ranges whose caller went away (their late data is ignored as unknown).
    fn prune_cancelled(&mut self) {
        self.ranges.prune_cancelled();
        let ranges = &self.ranges;
        self.unsent.retain(|id| ranges.contains(*id));
    }

    /// Asks for every unsent range, at most 100 per message.
    fn send_unsent(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        if self.unsent.is_empty() {
            return;
        }
        let ids = std::mem::take(&mut self.unsent);
        for batch in ids.chunks(MAX_RANGES_PER_MESSAGE) {
            let read_ranges: Vec<_> = batch
                .iter()
                .filter_map(|id| self.ranges.remainder(*id))
                .collect();
            if read_ranges.is_empty() {
                continue;
            }
            let msg = BidiReadObjectRequest {
                read_object_spec: None,
                read_ranges,
            };
            // A closed sender means the stream is gone; its error arrives on the response side.
            let _ = conn.tx.send(&msg);
        }
    }

    /// Routes one response; an error is a reason to reconnect.
    fn on_response(&mut self, resp: BidiReadObjectResponse) -> std::result::Result<(), Status> {
        if let Some(h) = resp.read_handle {
            self.handle = Some(h.handle);
        }
        if let (Some(m), Some(g)) = (&resp.metadata, self.generation) {
            if m.generation != g {
                return Err(Status::failed_precondition(format!(
                    "generation changed from {g} to {}",
                    m.generation
                )));
            }
        }
        for d in resp.object_data_ranges {
            let n = self
                .ranges
                .on_chunk(d)
                .map_err(|BadChunk(m)| Status::internal(m))?;
            if n > 0 {
                self.failing = false;
            }
        }
        Ok(())
    }

    /// The stream broke with `s`: drop it, and decide whether a reconnect may follow.
    fn on_break(&mut self, s: Status, backoff: &mut Backoff) -> Result<()> {
        self.conn = None;
        self.redirected = self.take_redirect(&s);
        self.prune_cancelled();
        if self.ranges.is_empty() {
            // Nobody waits (servers end idle streams): reopen without delay when the next
            // range comes, and let a lasting problem show itself then.
            self.redirected = true;
            self.failing = false;
            return Ok(());
        }
        if !self.redirected && !retry::is_transient(&s) {
            return Err(retry::map_status(&s, &self.what));
        }
        if !self.failing {
            self.failing = true;
            backoff.reset();
        }
        tracing::debug!(object = %self.what, code = ?s.code(), msg = s.message(), "read stream broke");
        self.last_error = Some(s);
        Ok(())
    }

    /// Reopens with handle and routing token, asking for the remainder of every range.
    async fn reconnect(&mut self, backoff: &mut Backoff) -> Result<()> {
        if !self.failing {
            // The deadline counts from when a reconnect is first needed.
            self.failing = true;
            backoff.reset();
        }
        loop {
            let last = self
                .last_error
                .clone()
                .unwrap_or_else(|| Status::unavailable("stream broke"));
            retry::retry_after(backoff, &last, self.redirected, &self.what).await?;
            self.redirected = false;
            self.prune_cancelled();
            if self.ranges.is_empty() {
                // Nothing to read: the failure is over. Its status must not decide the next
                // reconnect (a redirect's ABORTED would count as final there).
                self.failing = false;
                self.last_error = None;
                return Ok(());
            }
            self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
            crate::metrics::stream("read", crate::metrics::StreamEvent::Reconnected);
            let mut ids = self.ranges.ids();
            let first: Vec<_> = ids
                .iter()
                .take(MAX_RANGES_PER_MESSAGE)
                .filter_map(|id| self.ranges.remainder(*id))
                .collect();
            match self.open_stream(self.spec(true), first).await {
                Ok(conn) => {
                    self.conn = Some(conn);
                    self.last_error = None;
                    self.unsent = ids.split_off(ids.len().min(MAX_RANGES_PER_MESSAGE));
                    self.last_activity = Instant::now();
                    return Ok(());
                }
                Err(s) => {
                    self.redirected = self.take_redirect(&s);
                    if !self.redirected && !retry::is_transient(&s) {
                        return Err(retry::map_status(&s, &self.what));
                    }
                    self.last_error = Some(s);
                }
            }
        }
    }

    /// The session is over: every caller, present and queued, gets `e`.
    fn fail(&mut self, e: Error, cmd_rx: &mut mpsc::UnboundedReceiver<Cmd>) {
        tracing::warn!(error = %e, "read session failed");
        self.counters.broken.store(true, Ordering::Relaxed);
        self.conn = None;
        cmd_rx.close();
        self.ranges.fail_all(&e);
        while let Ok(cmd) = cmd_rx.try_recv() {
            let _ = cmd.tx.send(Err(e.clone()));
            self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The next response of the live stream; never resolves while there is none.
async fn next_message(
    conn: &mut Option<Conn>,
) -> std::result::Result<Option<BidiReadObjectResponse>, Status> {
    match conn {
        Some(c) => c.rx.message().await,
        None => std::future::pending().await,
    }
}
