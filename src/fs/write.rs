//! The write path: one writer per inode being written, shared by every handle that opened it
//! for writing, streaming sequential appends into one `BidiWriteObject` stream, or, when the
//! file is not written as appends, editing a local staged copy uploaded as a new generation.
//!
//! A writer starts `Open` (a file just created: its stream opens with its first bytes or
//! flush) or `Idle` (an existing object opened for writing: nothing happens until the first
//! write; one at the end of an unfinalized object takes the object over and streams). A
//! write anywhere else, a size change, or an append to a finalized object turns the writer
//! `Staged` (see `staging.rs`): a stream in progress is flushed and closed first, so the
//! object holds every byte written so far, and the staged copy is filled from it. A
//! write-only open with O_TRUNC of an existing object starts `Replacing`: the new version
//! streams into an object beside the file's, moved onto it at fsync or close. A staged
//! file is uploaded on fsync and close; the upload replaces exactly the generation it
//! started from, so a failed upload leaves the old object as it was (`gcs/upload.rs` says
//! how, and where a server that refuses to replace it makes the one exception). Unpersisted bytes
//! count against the write share of the one memory budget (a semaphore in KiB): a write
//! that does not fit first makes its own bytes durable, then waits, and every so often
//! makes idle writers' bytes durable so they cannot hold the budget forever. A failed
//! writer stays failed: every later write, flush or fsync on it answers the same errno. The
//! close(2) of the only writing handle ends the stream (the writer turns `Idle`), else the
//! last handle's release does; either closes it, or finalizes it with
//! `write.finalize_on_close`.
//!
//! Touches `gcs::AppendWriter`, the staging area, uploads, and the inode's size and
//! generation; no kernel types.

use super::error::{log_err, Errno, FsResult};
use super::inode::{Inode, ObjMeta, PENDING_GENERATION};
use super::lock;
use super::staging::{StagedFile, Staging};
use super::write_budget::{permits_for, Held, PERMIT_BYTES};
use super::write_ops::Mtime;
use crate::config::WriteConfig;
use crate::gcs::{self, AppendWriter, Client, ObjectMeta};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::Semaphore;

/// The longest a change of a modification time may hold the call that made it (a `close`,
/// a `utimes`): it is best effort, and the service allows about one update a second of one
/// object.
const MTIME_WAIT: Duration = Duration::from_secs(3);

/// A write waiting this long for budget makes idle writers' bytes durable.
const IDLE_FLUSH_AFTER: Duration = Duration::from_millis(200);

enum State {
    /// An existing object of this generation, not being written: opened for writing and
    /// not written yet, or its stream ended by a close(2) while a handle stays open.
    Idle {
        generation: i64,
        /// The size this writer's own stream left the object at, when a close(2) ended it:
        /// an object that has grown since was taken over by another writer, which fences
        /// this one as it would have fenced its stream.
        ended: Option<u64>,
    },
    /// Streaming into the object.
    Open { w: Box<AppendWriter>, held: Held },
    /// A write-only open with O_TRUNC of an existing object: streaming the file's new
    /// version into an object of its own beside it (`gcs/upload.rs`), which replaces
    /// generation `base` of the file's object when it is placed (`Writes::place`): at fsync or
    /// close, or as soon as the file's object must hold what was written (a reader, a rename,
    /// another handle). A write that is not an append, a size change or an unlink stages it
    /// instead (`Writes::stage_aside`). Until then the file's object keeps its old version, as
    /// a staged rewrite leaves it, without a staged copy.
    Replacing {
        w: Box<AppendWriter>,
        held: Held,
        base: i64,
    },
    /// Editing a staged copy.
    Staged(Box<Staged>),
    /// Failed for good; every later call answers this.
    Failed(Errno),
    /// The stream was ended by the last release.
    Done,
}

/// A staged copy and the version of the object it will replace.
struct Staged {
    file: StagedFile,
    /// The generation the upload must replace (0: no object exists).
    base: i64,
    /// Changed since the last upload.
    dirty: bool,
    /// The file was unlinked while open: its handles go on with this copy, never uploaded.
    unlinked: bool,
}

/// The writer of one inode.
pub struct FileWriter {
    inode: Inode,
    /// Bytes the file holds as written through this writer (what `stat` shows).
    size: AtomicU64,
    /// The size above is exact (a staged file may have shrunk), not just a lower bound.
    exact: std::sync::atomic::AtomicBool,
    state: tokio::sync::Mutex<State>,
    /// What to record of the file's modification time once the stream or the edits under
    /// way have ended (`Writes::set_mtime`, `appending_to`): recorded before, it would be
    /// the time of a version still to come.
    mtime: Mutex<Option<MtimeToRecord>>,
}

impl FileWriter {
    /// The inode it writes, and its size as written through this mount so far.
    pub fn written(&self) -> (Inode, u64) {
        (self.inode.clone(), self.size.load(Ordering::Acquire))
    }
}

/// A file as written through this mount while a writer is active on it.
#[derive(Debug, Clone, Copy)]
pub struct AsWritten {
    /// Its size as written so far.
    pub size: u64,
    /// The size is exact (staged) rather than a lower bound (streaming).
    pub exact: bool,
    /// A modification time set while it is written, recorded once the writing ends: the
    /// time until then, or a `stat` after a later `fchown` (as `cp -p` does) would show the
    /// object's.
    pub mtime: Option<SystemTime>,
}

/// Every writer of the mount (one per inode, shared by its writing handles) and the budget.
pub struct Writes {
    client: Client,
    bucket: Arc<str>,
    finalize_on_close: bool,
    budget: Arc<Semaphore>,
    budget_permits: u32,
    staging: Staging,
    /// Writer of each inode and the number of handles writing it.
    by_ino: Mutex<HashMap<u64, (Arc<FileWriter>, usize)>>,
    /// Writers whose last handle is being released (no longer in `by_ino`): a `utimes(2)`
    /// meanwhile still goes through them (`writer_for_mtime`), so it waits for their end
    /// instead of racing the time they record.
    ending: Mutex<HashMap<u64, Arc<FileWriter>>>,
    /// Set when the daemon stops: every write passes this gate, so closing it waits for the
    /// writes in flight and refuses later ones, and flushing the writers then covers every
    /// write the kernel was told succeeded.
    stopped: tokio::sync::RwLock<bool>,
}

/// What the end of a file's writing records of its modification time.
#[derive(Debug, Clone, Copy, PartialEq)]
enum MtimeToRecord {
    /// A time `utimes(2)` set while the file was written (`cp -p`, `tar -x`).
    At(SystemTime),
    /// The present time, as the object's update time: the time it recorded is dropped
    /// (`gcs::Client::reset_mtime`); with `only_if`, only while that is still the time it
    /// records (another mount may have set one since).
    Reset { only_if: Option<SystemTime> },
}

/// A takeover of `taken` to append to it: a modification time it records (`utimes(2)`
/// through a mount, or a copy by gcloud storage) will be older than its bytes, so the end of
/// the writing drops it, unless a `utimes(2)` sets one to record. Only that time: one
/// another mount records meanwhile stands. Dropped, not replaced by the present time, so
/// that later appends cost no update.
fn appending_to(fw: &FileWriter, taken: &ObjectMeta) {
    if taken.mtime.is_some() {
        lock(&fw.mtime).get_or_insert(MtimeToRecord::Reset {
            only_if: taken.mtime,
        });
    }
}

/// Whether a writer in state `st` has no stream and no edits under way: the object holds
/// everything written, as its last version.
fn writing_ended(st: &State) -> bool {
    match st {
        State::Idle { .. } | State::Done => true,
        State::Staged(s) => !s.dirty,
        State::Open { .. } | State::Replacing { .. } | State::Failed(_) => false,
    }
}

/// EIO when another writer has taken the object over since a close(2) ended this writer's
/// stream at size `ended`: the object, of `size` bytes now (what its read stream says: a
/// stat can lag behind appends), was appended to or finalized since (this writer never
/// finalizes a stream its close ended). The stream would have been fenced, and so is the
/// writer.
fn not_taken_over(key: &str, ended: Option<u64>, finalized: bool, size: u64) -> FsResult<()> {
    match ended {
        Some(end) if size != end || finalized => {
            tracing::warn!(path = key, "taken over by another writer since its close");
            Err(Errno::EIO)
        }
        _ => Ok(()),
    }
}

/// The generation of the object a writer in state `st` writes (`None`: it writes nothing
/// more).
fn generation_of(st: &State) -> Option<i64> {
    match st {
        State::Open { w, .. } => Some(w.generation()),
        State::Idle { generation, .. } => Some(*generation),
        State::Staged(s) => Some(s.base),
        State::Replacing { base, .. } => Some(*base),
        State::Failed(_) | State::Done => None,
    }
}

/// The object a writer in state `st` wrote moved, as `generation`: a stream made durable
/// before goes on as a takeover of the moved object, a staged copy replaces it.
fn moved(st: &mut State, generation: i64) {
    match st {
        State::Open { .. } => {
            *st = State::Idle {
                generation,
                ended: None,
            }
        }
        State::Idle { generation: g, .. } => *g = generation,
        State::Staged(s) => s.base = generation,
        State::Replacing { base, .. } => *base = generation,
        State::Failed(_) | State::Done => {}
    }
}

/// The parts of a `Replacing` writer, taken out of `st` (left `Done`); `None`, with `st` as
/// it was, in any other state.
fn take_replacing(st: &mut State) -> Option<(Box<AppendWriter>, Held, i64)> {
    if !matches!(st, State::Replacing { .. }) {
        return None;
    }
    match std::mem::replace(st, State::Done) {
        State::Replacing { w, held, base } => Some((w, held, base)),
        _ => None,
    }
}

/// True when the `Replacing` writer `st` has not written a byte yet.
fn written_none(st: &State) -> bool {
    matches!(st, State::Replacing { w, .. } if w.written() == 0)
}

/// Makes what `fw`'s `Replacing` state `st` streamed durable beside the file, without
/// placing it; a failure fails the writer.
async fn persist_aside(fw: &FileWriter, st: &mut State) -> FsResult<()> {
    let State::Replacing { w, held, .. } = st else {
        return Ok(());
    };
    match w.flush().await {
        Ok(_) => {
            held.settle(0);
            Ok(())
        }
        Err(e) => {
            let errno = log_err("fsync", &fw.inode.key(), &e);
            *st = State::Failed(errno);
            Err(errno)
        }
    }
}

/// Flushes the stream of `fw`, whose state `st` is `Open`; a failure fails the writer.
async fn persist_stream(fw: &FileWriter, st: &mut State) -> FsResult<()> {
    let State::Open { w, held } = st else {
        return Ok(());
    };
    match w.flush().await {
        Ok(persisted) => {
            held.settle(0);
            fw.inode.note_written(w.generation(), persisted);
            Ok(())
        }
        Err(e) => {
            let errno = log_err("fsync", &fw.inode.key(), &e);
            *st = State::Failed(errno);
            Err(errno)
        }
    }
}

impl Writes {
    /// No writers yet; `budget_bytes` bounds the unpersisted bytes of all of them together.
    pub fn new(client: Client, bucket: &str, cfg: &WriteConfig, budget_bytes: u64) -> Self {
        let permits = permits_for(budget_bytes).max(1);
        Writes {
            client,
            bucket: Arc::from(bucket),
            finalize_on_close: cfg.finalize_on_close,
            budget: Arc::new(Semaphore::new(permits as usize)),
            budget_permits: permits,
            staging: Staging::new(cfg),
            by_ino: Mutex::new(HashMap::new()),
            ending: Mutex::new(HashMap::new()),
            stopped: tokio::sync::RwLock::new(false),
        }
    }

    /// The bytes all writers together may hold unpersisted.
    pub fn budget_bytes(&self) -> u64 {
        u64::from(self.budget_permits) * PERMIT_BYTES
    }

    /// One more handle writes `inode`: it joins the inode's writer if it has one, else
    /// starts one from `start` (a fresh stream, or the generation to take over later). True
    /// when it started one.
    fn attach(
        &self,
        inode: &Inode,
        start: impl FnOnce() -> (State, u64),
    ) -> (Arc<FileWriter>, bool) {
        let mut by_ino = lock(&self.by_ino);
        let mut started = false;
        let entry = by_ino.entry(inode.ino).or_insert_with(|| {
            started = true;
            let (state, size) = start();
            let fw = Arc::new(FileWriter {
                inode: inode.clone(),
                size: AtomicU64::new(size),
                exact: std::sync::atomic::AtomicBool::new(false),
                state: tokio::sync::Mutex::new(state),
                mtime: Mutex::new(None),
            });
            (fw, 0)
        });
        entry.1 += 1;
        (entry.0.clone(), started)
    }

    /// A handle writes the object just created as `inode` through `w`.
    pub fn attach_created(&self, inode: &Inode, w: AppendWriter) -> Arc<FileWriter> {
        let held = self.held(0);
        let (fw, _) = self.attach(inode, move || {
            (
                State::Open {
                    w: Box::new(w),
                    held,
                },
                0,
            )
        });
        fw
    }

    /// A handle may write the existing object `inode` (generation `generation`, `size`
    /// bytes); the takeover waits for its first write. True when no other handle was
    /// writing it, so the writer is this handle's alone.
    pub fn attach_existing(
        &self,
        inode: &Inode,
        generation: i64,
        size: u64,
    ) -> (Arc<FileWriter>, bool) {
        self.attach(inode, || {
            let idle = State::Idle {
                generation,
                ended: None,
            };
            (idle, size)
        })
    }

    fn held(&self, permits: u32) -> Held {
        Held {
            budget: self.budget.clone(),
            permits,
        }
    }

    /// What `stat` shows of `ino` while a writer is active on it (see `AsWritten`).
    pub fn as_written(&self, ino: u64) -> Option<AsWritten> {
        let of = |fw: &FileWriter| AsWritten {
            size: fw.size.load(Ordering::Acquire),
            exact: fw.exact.load(Ordering::Acquire),
            mtime: match *lock(&fw.mtime) {
                Some(MtimeToRecord::At(t)) => Some(t),
                _ => None,
            },
        };
        if let Some((fw, _)) = lock(&self.by_ino).get(&ino) {
            return Some(of(fw));
        }
        // Being ended by its last release: its stream's end is not in the inode yet.
        lock(&self.ending).get(&ino).map(|fw| of(fw))
    }

    /// Moves the writer of `ino`, if any, to a staged copy of everything written so far, so
    /// that its handles no longer need the object: `unlink` stages an open file before it
    /// deletes its object, then calls `unlinked`.
    pub async fn stage_for_unlink(&self, ino: u64) {
        let Some(fw) = self.writer_of(ino) else {
            return;
        };
        let mut st = fw.state.lock().await;
        if matches!(*st, State::Replacing { .. }) {
            let _ = self.stage_aside(&fw, &mut st, None).await;
            return;
        }
        let next = match &*st {
            State::Open { .. } => self.stage_stream(&fw, &mut st, None).await,
            State::Idle { generation, .. } => {
                self.stage_object(&fw.inode.key(), *generation, None).await
            }
            State::Staged(_) | State::Replacing { .. } | State::Failed(_) | State::Done => return,
        };
        *st = next;
    }

    /// The object of `ino`'s writer was deleted or replaced (unlink, or a rename onto it,
    /// while open): its staged copy, if it has one, holds the file from now on and is never
    /// uploaded, so writes, reads and the close of the open handles go on as POSIX has them.
    /// A writer that could not stage keeps failing (EIO), as it would have.
    pub async fn unlinked(&self, ino: u64) {
        let Some(fw) = self.writer_of(ino) else {
            return;
        };
        let mut st = fw.state.lock().await;
        if let State::Staged(s) = &mut *st {
            s.unlinked = true;
        }
    }

    /// Moves the object of `ino` (rename while open) with `mv`, which returns the moved
    /// object's generation and gives the inode its new key. The inode's writer, if it has
    /// one, has its streamed bytes made durable first and is held still until then: a write,
    /// flush or release that came in between would go to the old object or look for it under
    /// the old key (and fail the writer). Later writes continue on the moved object; a staged
    /// copy, never uploaded half-edited, will replace the moved object at its fsync or close.
    pub async fn moving<Fut>(&self, ino: u64, mv: impl FnOnce() -> Fut) -> FsResult<()>
    where
        Fut: std::future::Future<Output = FsResult<i64>>,
    {
        let Some(fw) = self.writer_of(ino) else {
            return mv().await.map(|_| ());
        };
        let mut st = fw.state.lock().await;
        self.held_for_move(&fw, &mut st).await?;
        let generation = mv().await?;
        moved(&mut st, generation);
        Ok(())
    }

    /// `moving` for every writer of a file under directory `from`, which `mv` moves (a
    /// directory rename) and whose inodes it gives their new keys. Each moved object is then
    /// looked up, for the generation its writer goes on with. A writer that failed before
    /// stays failed, and an unlinked file's, whose object is gone, is not moved.
    pub async fn moving_under<Fut>(&self, from: &str, mv: impl FnOnce() -> Fut) -> FsResult<()>
    where
        Fut: std::future::Future<Output = FsResult<()>>,
    {
        let mut writers: Vec<Arc<FileWriter>> = lock(&self.by_ino)
            .values()
            .filter(|(fw, _)| fw.inode.is_named() && fw.inode.key().starts_with(from))
            .map(|(fw, _)| fw.clone())
            .collect();
        // One order for every caller: two renames of overlapping trees never wait on each
        // other's writers.
        writers.sort_by_key(|fw| fw.inode.ino);
        let mut held = Vec::with_capacity(writers.len());
        for fw in &writers {
            let mut st = fw.state.lock().await;
            if !matches!(*st, State::Failed(_)) {
                self.held_for_move(fw, &mut st).await?;
            }
            held.push(st);
        }
        mv().await?;
        for (fw, st) in writers.iter().zip(held.iter_mut()) {
            let Some(known) = generation_of(st) else {
                continue;
            };
            let key = fw.inode.key();
            let generation = match self.client.get_object(&self.bucket, &key).await {
                Ok(meta) => meta.generation,
                // A folder's move keeps its objects' generations here; failing the writer
                // for a lookup would throw away a rewrite's edits.
                Err(e) => {
                    tracing::warn!(path = key, error = %e, "the moved object could not be looked up; its writer goes on with the generation it knew");
                    known
                }
            };
            moved(st, generation);
        }
        Ok(())
    }

    /// Makes what `fw` streamed durable before its object moves (a failed writer fails the
    /// move), a new version being streamed beside it placed first. A staged copy stays as it
    /// is: it replaces the moved object later.
    async fn held_for_move(&self, fw: &FileWriter, st: &mut State) -> FsResult<()> {
        match st {
            State::Failed(e) => Err(*e),
            State::Replacing { .. } => self.place(fw, st, false).await,
            _ => persist_stream(fw, st).await,
        }
    }

    /// Starts the new version of `fw`'s file that a write-only open with O_TRUNC makes
    /// (`State::Replacing`), when `fw` has nothing else going and one handle: false (and
    /// nothing changed) otherwise.
    pub async fn replace_truncated(&self, fw: &Arc<FileWriter>) -> bool {
        let mut st = fw.state.lock().await;
        // A handle that joined since could read, and would read the object.
        let one_handle = lock(&self.by_ino)
            .get(&fw.inode.ino)
            .is_some_and(|(w, handles)| Arc::ptr_eq(w, fw) && *handles == 1);
        if !one_handle {
            return false;
        }
        let State::Idle {
            generation,
            ended: None,
        } = *st
        else {
            return false;
        };
        let w = self
            .client
            .create_aside_unanswered(&self.bucket, &fw.inode.key());
        *st = State::Replacing {
            w: Box::new(w),
            held: self.held(0),
            base: generation,
        };
        fw.size.store(0, Ordering::Release);
        fw.exact.store(true, Ordering::Release);
        true
    }

    /// Puts the new version `fw` streams beside its file in place, if it does: a handle that
    /// joins the writer needs the file's object to hold it.
    pub async fn place_for_new_handle(&self, fw: &FileWriter) -> FsResult<()> {
        let mut st = fw.state.lock().await;
        self.place(fw, &mut st, false).await
    }

    /// Leaves `Replacing` for staging without touching the file's object: what was streamed
    /// beside it (up to `keep` bytes) is made durable, copied into a staged copy and deleted.
    /// The copy replaces generation `base` at fsync or close, as any rewrite's does, so the
    /// file keeps its old version until then (`zipfile` seeks back to patch its headers).
    async fn stage_aside(
        &self,
        fw: &FileWriter,
        st: &mut State,
        keep: Option<u64>,
    ) -> FsResult<()> {
        let Some((w, held, base)) = take_replacing(st) else {
            return Ok(());
        };
        let aside = w.object().to_string();
        let generation = w.generation();
        let closed = w.close().await;
        drop(held);
        let written = match closed {
            Ok(written) => written,
            Err(e) => {
                self.client.discard(&self.bucket, &aside, generation).await;
                let errno = log_err("stage", &fw.inode.key(), &e);
                *st = State::Failed(errno);
                return Err(errno);
            }
        };
        let upto = keep.map_or(written.size, |k| k.min(written.size));
        let mut staged = self
            .stage_object(&aside, written.generation, Some(upto))
            .await;
        self.client
            .discard(&self.bucket, &aside, written.generation)
            .await;
        if let State::Staged(s) = &mut staged {
            s.base = base;
            s.dirty = true;
        }
        *st = staged;
        match st {
            State::Failed(e) => Err(*e),
            _ => Ok(()),
        }
    }

    /// Puts the new version a `Replacing` writer streamed in place of generation `base` of
    /// its file's object: the stream is closed (finalized when `finalize`), then moved onto
    /// the file's name. The writer goes on as after a close(2) of its stream, idle at the
    /// moved object. A failure fails the writer (ESTALE when the object is no longer `base`)
    /// and deletes the new version. Nothing to do in any other state.
    async fn place(&self, fw: &FileWriter, st: &mut State, finalize: bool) -> FsResult<()> {
        let Some((w, held, base)) = take_replacing(st) else {
            return Ok(());
        };
        let key = fw.inode.key();
        let aside = w.object().to_string();
        let generation = w.generation();
        let ended = if finalize {
            w.finalize().await
        } else {
            w.close().await
        };
        drop(held);
        let placed = match ended {
            Ok(written) => self
                .client
                .move_into_place(&self.bucket, &aside, &key, &written, Some(base))
                .await
                .map(|meta| (meta, written.size)),
            Err(e) => {
                self.client.discard(&self.bucket, &aside, generation).await;
                Err(e)
            }
        };
        match placed {
            Ok((meta, size)) => {
                // The size is the stream's: the service's metadata of an unfinalized object
                // can lag behind its appends.
                fw.inode.replace(ObjMeta {
                    size,
                    ..ObjMeta::from(&meta)
                });
                fw.size.store(size, Ordering::Release);
                *st = State::Idle {
                    generation: meta.generation,
                    ended: (!meta.finalized).then_some(size),
                };
                Ok(())
            }
            Err(e) => {
                let errno = match e {
                    gcs::Error::PreconditionFailed(why) => {
                        tracing::warn!(
                            path = &*key,
                            reason = why,
                            "object replaced since its open with O_TRUNC: not overwritten"
                        );
                        Errno::ESTALE
                    }
                    e => log_err("close", &key, &e),
                };
                *st = State::Failed(errno);
                Err(errno)
            }
        }
    }

    /// The writer of `ino` on this mount, while it has one.
    pub fn writer_of(&self, ino: u64) -> Option<Arc<FileWriter>> {
        lock(&self.by_ino).get(&ino).map(|(fw, _)| fw.clone())
    }

    /// The writer a `utimes(2)` of `ino` goes through: its active one, else one whose last
    /// release is ending it.
    pub fn writer_for_mtime(&self, ino: u64) -> Option<Arc<FileWriter>> {
        self.writer_of(ino)
            .or_else(|| lock(&self.ending).get(&ino).cloned())
    }

    /// Whether the writer of `ino` on this mount may be writing a new version of the file
    /// (one streamed beside it, or a staged copy), which a reader asks `ready_for_reader`
    /// for. A writer busy at this moment may be, and the reader waits for it there: the
    /// kernel keeps what a read answers.
    pub fn rewrites(&self, ino: u64) -> bool {
        let Some(fw) = self.writer_of(ino) else {
            return false;
        };
        let rewriting = match fw.state.try_lock() {
            Ok(st) => matches!(*st, State::Replacing { .. } | State::Staged(_)),
            Err(_) => true,
        };
        rewriting
    }

    /// Whether `ino` has a writer on this mount.
    pub fn is_writing(&self, ino: u64) -> bool {
        lock(&self.by_ino).contains_key(&ino)
    }

    /// Writes `data` at `offset` through `fw` (at the file's end when `None`, as O_APPEND
    /// writes): an append at the end streams, anything else goes to a staged copy. The bytes
    /// written and the offset they went to. EIO once the writes are stopped.
    pub async fn write(
        &self,
        fw: &Arc<FileWriter>,
        offset: Option<u64>,
        data: Bytes,
    ) -> FsResult<(u32, u64)> {
        let stopped = self.stopped.read().await;
        if *stopped {
            return Err(Errno::EIO);
        }
        self.write_through(fw, offset, data).await
    }

    /// Refuses writes from now on (EIO), waits for those in flight, and makes every byte
    /// written so far durable: what a stopping daemon does before it unmounts.
    pub async fn stop(&self) {
        *self.stopped.write().await = true;
        for fw in self.writers() {
            let mut st = fw.state.lock().await;
            match self.flush_held(&fw, &mut st).await {
                Ok(()) => self.record_pending_mtime(&fw, &st, None).await,
                Err(e) => {
                    tracing::error!(key = %fw.inode.key(), errno = e.0, "making written bytes durable failed");
                }
            }
        }
    }

    /// Makes every appended byte durable, writes going on. A staged (rewritten) file is left
    /// to its fsync or close: uploading it half-edited would replace the version before it.
    pub async fn persist_all_appends(&self) {
        for fw in self.writers() {
            if let Err(e) = self.persist_appends(&fw).await {
                tracing::error!(key = %fw.inode.key(), errno = e.0, "making appended bytes durable failed");
            }
        }
    }

    fn writers(&self) -> Vec<Arc<FileWriter>> {
        lock(&self.by_ino)
            .values()
            .map(|(fw, _)| fw.clone())
            .collect()
    }

    async fn write_through(
        &self,
        fw: &Arc<FileWriter>,
        offset: Option<u64>,
        data: Bytes,
    ) -> FsResult<(u32, u64)> {
        let len = u32::try_from(data.len()).map_err(|_| Errno::EINVAL)?;
        let key = fw.inode.key();
        let mut st = fw.state.lock().await;
        Self::wrote(fw);
        if let State::Replacing { w, .. } = &*st {
            if offset.is_some_and(|o| o != w.written()) {
                self.stage_aside(fw, &mut st, None).await?;
            }
        }
        if let State::Idle { generation, ended } = *st {
            *st = match self.take_over(fw, generation, ended, offset).await {
                Ok(next) => next,
                Err(e) => State::Failed(e),
            };
        }
        // The end is the object's, as this writer knows it: the kernel's offset for an
        // O_APPEND write comes from the size it last saw, which another writer of the
        // object (another mount) may have left behind since.
        let offset = match (&*st, offset) {
            (_, Some(offset)) => offset,
            (State::Open { w, .. } | State::Replacing { w, .. }, None) => w.written(),
            (State::Staged(s), None) => s.file.size(),
            (_, None) => 0,
        };
        if let State::Open { w, .. } = &*st {
            if offset != w.written() {
                let next = self.stage_stream(fw, &mut st, None).await;
                *st = next;
            }
        }
        match &mut *st {
            State::Open { w, held } | State::Replacing { w, held, .. } => {
                let appended = async {
                    self.reserve(w, held, data.len() as u64).await?;
                    w.append(data).await
                };
                if let Err(e) = appended.await {
                    let errno = log_err("write", &key, &e);
                    *st = State::Failed(errno);
                    return Err(errno);
                }
                held.settle(w.written().saturating_sub(w.persisted()));
                fw.size.store(w.written(), Ordering::Release);
                Ok((len, offset))
            }
            State::Staged(s) => {
                if let Err(e) = s.file.write_at(offset, data, &key).await {
                    // The staged copy no longer holds what the caller wrote: it must never
                    // be uploaded. The object stays as it was.
                    *st = State::Failed(e);
                    return Err(e);
                }
                s.dirty = true;
                fw.size.store(s.file.size(), Ordering::Release);
                Ok((len, offset))
            }
            State::Failed(e) => Err(*e),
            State::Idle { .. } | State::Done => Err(Errno::EBADF),
        }
    }

    /// Sets the size of the file `fw` writes to `size` (truncate or extend), staging it
    /// unless the size stays the same.
    pub async fn set_size(&self, fw: &Arc<FileWriter>, size: u64) -> FsResult<()> {
        let key = fw.inode.key();
        let mut st = fw.state.lock().await;
        if let State::Replacing { w, .. } = &*st {
            if w.written() == size {
                return Ok(());
            }
            Self::wrote(fw);
            self.stage_aside(fw, &mut st, Some(size)).await?;
        }
        let next = match &mut *st {
            State::Idle { generation, ended } => {
                let meta = self.current(&key, *generation).await?;
                let now = self.true_size(&key, &meta).await?;
                not_taken_over(&key, *ended, meta.finalized, now)?;
                if now == size {
                    return Ok(());
                }
                Self::wrote(fw);
                self.stage_object(&key, meta.generation, Some(size)).await
            }
            State::Open { w, .. } => {
                if w.written() == size {
                    return Ok(());
                }
                Self::wrote(fw);
                self.stage_stream(fw, &mut st, Some(size)).await
            }
            State::Staged(_) => {
                Self::wrote(fw);
                return self.resize_staged(fw, &mut st, size, &key).await;
            }
            State::Failed(e) => return Err(*e),
            State::Replacing { .. } | State::Done => return Err(Errno::EBADF),
        };
        *st = next;
        self.resize_staged(fw, &mut st, size, &key).await
    }

    async fn resize_staged(
        &self,
        fw: &FileWriter,
        st: &mut State,
        size: u64,
        key: &str,
    ) -> FsResult<()> {
        match st {
            State::Staged(s) => {
                if let Err(e) = s.file.set_len(size, key).await {
                    *st = State::Failed(e);
                    return Err(e);
                }
                s.dirty = true;
                fw.size.store(size, Ordering::Release);
                fw.exact.store(true, Ordering::Release);
                Ok(())
            }
            State::Failed(e) => Err(*e),
            _ => Err(Errno::EIO),
        }
    }

    /// The live object, which must still be generation `generation`.
    async fn current(&self, key: &str, generation: i64) -> FsResult<ObjectMeta> {
        let meta = self
            .client
            .get_object(&self.bucket, key)
            .await
            .map_err(|e| log_err("write", key, &e))?;
        if meta.generation != generation {
            tracing::warn!(path = key, "object replaced since it was opened");
            return Err(Errno::ESTALE);
        }
        Ok(meta)
    }

    /// The size of `meta`'s object: its stat's when finalized; else the size its read
    /// stream reports, since the stat of an unfinalized object can lag behind its appends.
    async fn true_size(&self, key: &str, meta: &ObjectMeta) -> FsResult<u64> {
        if meta.finalized {
            return Ok(meta.size);
        }
        let reader = self
            .client
            .open_reader(&self.bucket, key, Some(meta.generation))
            .await
            .map_err(|e| match e {
                crate::gcs::Error::NotFound(_) => Errno::ESTALE,
                e => log_err("write", key, &e),
            })?;
        Ok(reader.metadata().size.max(meta.size))
    }

    /// A staged copy of generation `generation` of `key`, up to `upto` bytes (all of it when
    /// `None`).
    async fn stage_object(&self, key: &str, generation: i64, upto: Option<u64>) -> State {
        let mut file = match self.staging.create() {
            Ok(f) => f,
            Err(e) => return State::Failed(e),
        };
        match file
            .fill(&self.client, &self.bucket, key, generation, upto)
            .await
        {
            Ok(()) => State::Staged(Box::new(Staged {
                file,
                base: generation,
                dirty: false,
                unlinked: false,
            })),
            Err(e) => State::Failed(e),
        }
    }

    /// Leaves streaming for staging: every byte streamed so far is made durable and the stream
    /// is closed (the object now holds them all), then the staged copy is filled from the
    /// object (up to `keep` bytes when the file is about to be cut).
    async fn stage_stream(&self, fw: &FileWriter, st: &mut State, keep: Option<u64>) -> State {
        let key = fw.inode.key();
        let State::Open { w, held } = std::mem::replace(st, State::Done) else {
            return State::Failed(Errno::EIO);
        };
        let closed = w.close().await;
        drop(held);
        let (generation, size) = match closed {
            Ok(meta) => {
                fw.inode.note_written(meta.generation, meta.size);
                (meta.generation, meta.size)
            }
            Err(e) => return State::Failed(log_err("stage", &key, &e)),
        };
        tracing::debug!(path = %key, size, "streaming write turns staged");
        fw.exact.store(true, Ordering::Release);
        self.stage_object(&key, generation, Some(keep.map_or(size, |k| k.min(size))))
            .await
    }

    /// The first write to an existing object (or the first since a close(2) ended this
    /// writer's stream, `ended`): at the end of an unfinalized object (`offset` None: wherever
    /// that is) it takes the object over and streams; anywhere else (or on a finalized object)
    /// it stages.
    async fn take_over(
        &self,
        fw: &FileWriter,
        generation: i64,
        ended: Option<u64>,
        offset: Option<u64>,
    ) -> FsResult<State> {
        let key = &*fw.inode.key();
        let meta = self.current(key, generation).await?;
        // What this writer ended at (or knew at its open) is a size the object had: a stat
        // that lags behind the appends says less. Staging copies the whole object anyway.
        let known = match ended {
            Some(end) => {
                let now = self.true_size(key, &meta).await?;
                not_taken_over(key, ended, meta.finalized, now)?;
                end
            }
            None => meta.size.max(fw.size.load(Ordering::Acquire)),
        };
        if meta.finalized || offset.is_some_and(|o| o != known) {
            fw.exact.store(true, Ordering::Release);
            return Ok(self.stage_object(key, meta.generation, None).await);
        }
        let w = self
            .client
            .open_appendable(&self.bucket, key, generation)
            .await
            .map_err(|e| log_err("takeover", key, &e))?;
        appending_to(fw, &meta);
        fw.size.store(w.written(), Ordering::Release);
        Ok(State::Open {
            w: Box::new(w),
            held: self.held(0),
        })
    }

    /// Takes budget for `bytes` more unpersisted bytes: when the budget is spent, makes our
    /// own bytes durable first (they stop counting), then waits, nudging idle writers.
    async fn reserve(&self, w: &mut AppendWriter, held: &mut Held, bytes: u64) -> gcs::Result<()> {
        let want = permits_for(bytes).min(self.budget_permits);
        loop {
            if let Ok(p) = self.budget.try_acquire_many(want) {
                p.forget();
                held.permits += want;
                return Ok(());
            }
            if held.permits > 0 {
                w.flush().await?;
                held.settle(w.written().saturating_sub(w.persisted()));
                if held.permits == 0 {
                    continue;
                }
            }
            match tokio::time::timeout(IDLE_FLUSH_AFTER, self.budget.acquire_many(want)).await {
                Ok(Ok(p)) => {
                    p.forget();
                    held.permits += want;
                    return Ok(());
                }
                Ok(Err(_)) => return Err(gcs::Error::Other("write budget closed".to_string())),
                Err(_) => self.flush_idle().await,
            }
        }
    }

    /// Makes the bytes of writers nobody is using right now durable, freeing their budget.
    async fn flush_idle(&self) {
        let writers: Vec<Arc<FileWriter>> = lock(&self.by_ino)
            .values()
            .map(|(fw, _)| fw.clone())
            .collect();
        for fw in writers {
            let Ok(mut st) = fw.state.try_lock() else {
                continue;
            };
            // A new version streaming beside its file is made durable there, not placed.
            if let State::Open { w, held } | State::Replacing { w, held, .. } = &mut *st {
                if held.permits == 0 {
                    continue;
                }
                match w.flush().await {
                    Ok(_) => held.settle(w.written().saturating_sub(w.persisted())),
                    Err(e) => *st = State::Failed(log_err("flush", &fw.inode.key(), &e)),
                }
            }
        }
    }

    /// `close(2)` of a descriptor writing through `fw`: returns once every byte written
    /// through it is persisted. When `fw` has no other writing handle, its stream ends here
    /// (the last flush and the half-close, or the finalize with `write.finalize_on_close`,
    /// leave together), which spares the release that follows a round trip of its own. A
    /// descriptor still open on the same handle (a dup, a forked child) that writes again
    /// takes the object over, as a later open would, unless another writer has appended since
    /// (see `not_taken_over`). Only the handle's opener's process closes this way: another
    /// process's close of a descriptor it inherited comes to `flush_inherited` or `flush`.
    pub async fn closing(&self, fw: &FileWriter) -> FsResult<()> {
        let only_handle = lock(&self.by_ino)
            .get(&fw.inode.ino)
            .is_some_and(|(w, handles)| std::ptr::eq(Arc::as_ptr(w), fw) && *handles == 1);
        let mut st = fw.state.lock().await;
        match std::mem::replace(&mut *st, State::Done) {
            // Nothing written yet: a shell's redirection closes the descriptor it opened
            // before the command writes through its copy.
            State::Open { w, held } if only_handle && w.written() > 0 => {
                // Finalized here, not at the release: the kernel sends that without waiting,
                // after close(2) has returned to a writer that may tell others to read.
                let closed = if self.finalize_on_close {
                    (*w).finalize().await
                } else {
                    (*w).close().await
                };
                drop(held);
                match closed {
                    Ok(meta) => {
                        fw.inode.note_written(meta.generation, meta.size);
                        *st = State::Idle {
                            generation: meta.generation,
                            // A dup writing after a finalize stages the finalized object
                            // (see `take_over`), which nobody took over.
                            ended: (!self.finalize_on_close).then_some(meta.size),
                        };
                        self.record_pending_mtime(fw, &st, None).await;
                        Ok(())
                    }
                    Err(e) => {
                        let errno = log_err("close", &fw.inode.key(), &e);
                        *st = State::Failed(errno);
                        Err(errno)
                    }
                }
            }
            // Nothing written yet through the only handle: as above, a dup may write next, and
            // its close (or the release) places what it wrote. Else finalized here for the
            // same reason.
            replacing @ State::Replacing { .. } if only_handle && written_none(&replacing) => {
                *st = replacing;
                Ok(())
            }
            replacing @ State::Replacing { .. } => {
                *st = replacing;
                self.place(fw, &mut st, only_handle && self.finalize_on_close)
                    .await?;
                self.record_pending_mtime(fw, &st, None).await;
                Ok(())
            }
            other => {
                *st = other;
                self.flush_held(fw, &mut st).await?;
                self.record_pending_mtime(fw, &st, None).await;
                Ok(())
            }
        }
    }

    /// Returns once every byte written through `fw` is persisted; the stream stays open
    /// (fsync, and whatever needs the bytes in the service first).
    pub async fn flush(&self, fw: &FileWriter) -> FsResult<()> {
        let mut st = fw.state.lock().await;
        self.flush_held(fw, &mut st).await
    }

    /// `flush` of `fw`, whose state `st` the caller holds.
    async fn flush_held(&self, fw: &FileWriter, st: &mut State) -> FsResult<()> {
        match st {
            State::Staged(s) if s.dirty => {
                if let Err(e) = self.upload(fw, s).await {
                    *st = State::Failed(e);
                    return Err(e);
                }
                Ok(())
            }
            State::Staged(_) => Ok(()),
            State::Open { .. } => persist_stream(fw, st).await,
            State::Replacing { .. } => self.place(fw, st, false).await,
            State::Failed(e) => Err(*e),
            State::Idle { .. } | State::Done => Ok(()),
        }
    }

    /// Makes the appends streamed through `fw` durable, and nothing else: a staged copy is
    /// uploaded only at fsync and close, never half-edited. False when `fw` is staged (its
    /// bytes are read from the staged copy).
    pub async fn persist_appends(&self, fw: &FileWriter) -> FsResult<bool> {
        let mut st = fw.state.lock().await;
        match &mut *st {
            State::Staged(_) => Ok(false),
            State::Open { .. } => persist_stream(fw, &mut st).await.map(|()| true),
            // A regular sidecar's SIGTERM lands here: the new version is made durable beside
            // the file, not published half-written. Its only handle cannot read.
            State::Replacing { .. } => persist_aside(fw, &mut st).await.map(|()| true),
            State::Failed(e) => Err(*e),
            State::Idle { .. } | State::Done => Ok(true),
        }
    }

    /// The close of a descriptor of `fw`'s handle by a process other than the opener's (a
    /// forked child's exit or exec, which closes its copies of its parent's descriptors),
    /// while the opener still holds its own: streamed bytes are persisted, and the stream
    /// stays open for the opener. A new version streamed beside the file is made durable
    /// there and a staged copy stays local: neither is published half-written.
    pub async fn flush_inherited(&self, fw: &FileWriter) -> FsResult<()> {
        let mut st = fw.state.lock().await;
        match &*st {
            State::Replacing { .. } => persist_aside(fw, &mut st).await,
            State::Open { .. } => persist_stream(fw, &mut st).await,
            State::Staged(_) | State::Idle { .. } | State::Done => Ok(()),
            State::Failed(e) => Err(*e),
        }
    }

    /// Readies `ino` for a new reader: streamed bytes are made durable, so that the reader
    /// finds them in the object; a file being rewritten gives its writer (`Some`), whose
    /// staged copy the reader reads instead, since uploading it half-edited would replace the
    /// version before it.
    pub async fn ready_for_reader(&self, ino: u64) -> FsResult<Option<Arc<FileWriter>>> {
        let Some(fw) = self.writer_of(ino) else {
            return Ok(None);
        };
        let mut st = fw.state.lock().await;
        match &*st {
            State::Staged(_) => Ok(Some(fw.clone())),
            State::Failed(e) => Err(*e),
            State::Open { .. } => persist_stream(&fw, &mut st).await.map(|()| None),
            State::Replacing { .. } => self.place(&fw, &mut st, false).await.map(|()| None),
            State::Idle { .. } | State::Done => Ok(None),
        }
    }

    /// Makes the service hold everything written to `ino` so far, a rewrite in progress
    /// included (an fsync through any handle; a create others must find first).
    pub async fn settle(&self, ino: u64) -> FsResult<()> {
        let fw = self.writer_of(ino);
        match fw {
            Some(fw) => self.flush(&fw).await,
            None => Ok(()),
        }
    }

    /// A handle writing through `fw` is closed; the last writing handle of an inode ends its
    /// stream unless a close(2) did (and finalizes the object with `write.finalize_on_close`).
    /// The inode it wrote.
    pub async fn release(&self, fw: Arc<FileWriter>) -> Inode {
        let last = {
            let mut by_ino = lock(&self.by_ino);
            match by_ino.get_mut(&fw.inode.ino) {
                Some(entry) if Arc::ptr_eq(&entry.0, &fw) => {
                    entry.1 = entry.1.saturating_sub(1);
                    let last = entry.1 == 0;
                    if last {
                        by_ino.remove(&fw.inode.ino);
                        lock(&self.ending).insert(fw.inode.ino, fw.clone());
                    }
                    last
                }
                _ => false,
            }
        };
        if last {
            self.end_writing(&fw).await;
            let mut ending = lock(&self.ending);
            if ending
                .get(&fw.inode.ino)
                .is_some_and(|e| Arc::ptr_eq(e, &fw))
            {
                ending.remove(&fw.inode.ino);
            }
        }
        fw.inode.clone()
    }

    /// The end of `fw`'s writing at its last release: a new version is placed, a staged
    /// copy uploaded, a stream closed (or finalized), and the modification time left to
    /// record recorded. The state stays locked throughout, so that a `utimes(2)` coming in
    /// meanwhile (through `writer_for_mtime`) records its time after this one's.
    async fn end_writing(&self, fw: &FileWriter) {
        let mut st = fw.state.lock().await;
        if matches!(*st, State::Replacing { .. }) {
            if self
                .place(fw, &mut st, self.finalize_on_close)
                .await
                .is_ok()
            {
                self.record_pending_mtime(fw, &st, None).await;
            }
            *st = State::Done;
            return;
        }
        if let State::Staged(s) = &mut *st {
            // Normally uploaded by the flush of close(2) already; this covers the rest, before
            // a reader of the rewrite (`read_rewrite`) finds it over.
            if s.dirty {
                let _ = self.upload(fw, s).await;
            }
        }
        // Ended by a flush that was not the opener's close (`Closer::Unknown`), a rename, or
        // a reader: what it left to record is recorded now.
        if matches!(*st, State::Idle { .. } | State::Staged(_)) {
            self.record_pending_mtime(fw, &st, None).await;
        }
        let (w, held) = match std::mem::replace(&mut *st, State::Done) {
            State::Open { w, held } => (w, held),
            State::Staged(_) | State::Idle { .. } => return,
            _ => {
                // A failed writer may never have had its create answered.
                fw.inode.forget_pending();
                return;
            }
        };
        let key = &*fw.inode.key();
        let w = *w;
        let ended = if self.finalize_on_close {
            w.finalize().await
        } else {
            w.close().await
        };
        drop(held);
        match ended {
            Ok(meta) => {
                fw.inode.note_written(meta.generation, meta.size);
                self.record_pending_mtime(fw, &st, Some(meta.generation))
                    .await;
            }
            Err(e) => {
                log_err("close", key, &e);
                fw.inode.forget_pending();
            }
        }
    }
}

impl Writes {
    /// `utimes(2)` of the file `fw` writes. A given time is recorded in its object now when
    /// no stream or edit is under way, else once they end (a close, or the last release);
    /// the present time is that of the object's last update when the writing ends, so it
    /// needs recording only when nothing is under way.
    pub async fn set_mtime(&self, fw: &FileWriter, mtime: Mtime) {
        let st = fw.state.lock().await;
        match mtime {
            Mtime::At(t) => *lock(&fw.mtime) = Some(MtimeToRecord::At(t)),
            Mtime::Now if writing_ended(&st) => {
                *lock(&fw.mtime) = Some(MtimeToRecord::Reset { only_if: None });
            }
            Mtime::Now => {
                Self::wrote(fw);
                return;
            }
        }
        self.record_pending_mtime(fw, &st, None).await;
    }

    /// A write or size change through `fw` (or a `touch` during them): a time set before it
    /// no longer says when the bytes changed.
    fn wrote(fw: &FileWriter) {
        let mut pending = lock(&fw.mtime);
        if matches!(*pending, Some(MtimeToRecord::At(_))) {
            *pending = None;
        }
    }

    /// Records what `fw`'s writing left to record of the modification time, once `st` says
    /// it has ended with every byte in the object, on the version it ended with (`generation`
    /// when the state no longer says); a failed writer's is dropped with its bytes.
    async fn record_pending_mtime(&self, fw: &FileWriter, st: &State, generation: Option<i64>) {
        if !writing_ended(st) {
            return;
        }
        let Some(what) = *lock(&fw.mtime) else {
            return;
        };
        let generation = generation
            .or_else(|| generation_of(st))
            .or_else(|| fw.inode.meta().0.map(|m| m.generation));
        if let Some(generation) = generation {
            self.record(&fw.inode, generation, what).await;
        }
        // Taken only now: until the answer, `stat` shows the time set (`as_written`).
        let mut pending = lock(&fw.mtime);
        if *pending == Some(what) {
            *pending = None;
        }
    }

    /// Records `mtime` as the modification time of generation `generation` of `inode`'s
    /// object, whose file has no writer on this mount.
    pub async fn record_mtime(&self, inode: &Inode, generation: i64, mtime: Mtime) {
        let what = match mtime {
            Mtime::At(t) => MtimeToRecord::At(t),
            Mtime::Now => MtimeToRecord::Reset { only_if: None },
        };
        self.record(inode, generation, what).await;
    }

    /// Records `what` in generation `generation` of `inode`'s object (`gcs::Client::set_mtime`,
    /// `reset_mtime`), and gives the inode the time that results. Best effort, within
    /// `MTIME_WAIT`: a time not kept is logged, never an error of the call that set it, which
    /// `tar`, `rsync` and `cp -p` would take for a failed copy.
    async fn record(&self, inode: &Inode, generation: i64, what: MtimeToRecord) {
        if generation == PENDING_GENERATION || !inode.is_named() {
            return;
        }
        let key = inode.key();
        let (bucket, client) = (&self.bucket, &self.client);
        let recorded = async {
            let done = match what {
                MtimeToRecord::At(t) => client.set_mtime(bucket, &key, generation, t).await,
                MtimeToRecord::Reset { only_if } => {
                    client.reset_mtime(bucket, &key, generation, only_if).await
                }
            };
            match done {
                // Changed since by someone else, or by an attempt whose answer was lost: the
                // object's time is whatever it says now.
                Err(gcs::Error::PreconditionFailed(why)) => {
                    tracing::debug!(
                        path = &*key,
                        reason = why,
                        "modification time changed meanwhile"
                    );
                    client.get_object(bucket, &key).await
                }
                done => done,
            }
        };
        match tokio::time::timeout(MTIME_WAIT, recorded).await {
            Ok(Ok(meta)) => inode.note_mtime(&ObjMeta::from(&meta)),
            Ok(Err(e)) => tracing::warn!(path = &*key, error = %e, "modification time not kept"),
            Err(_) => tracing::warn!(
                path = &*key,
                "modification time not kept: no answer in time"
            ),
        }
    }

    /// Uploads a staged copy as the new generation of its object, replacing exactly the
    /// generation it was staged from (ESTALE when someone else replaced it meanwhile); the
    /// copy of an unlinked file stays where it is.
    async fn upload(&self, fw: &FileWriter, s: &mut Staged) -> FsResult<()> {
        if s.unlinked {
            s.dirty = false;
            return Ok(());
        }
        let key = fw.inode.key();
        let (file, len) = (s.file.file(), s.file.size());
        let uploaded = self
            .client
            .upload_file(&self.bucket, &key, file, len, Some(s.base))
            .await;
        let meta = match uploaded {
            Ok(m) => m,
            Err(gcs::Error::PreconditionFailed(why)) => {
                tracing::warn!(
                    path = &*key,
                    reason = why,
                    "object replaced since it was staged: not overwritten"
                );
                return Err(Errno::ESTALE);
            }
            Err(e) => return Err(log_err("upload", &key, &e)),
        };
        s.base = meta.generation;
        s.dirty = false;
        fw.inode.replace(ObjMeta::from(&meta));
        fw.size.store(meta.size, Ordering::Release);
        Ok(())
    }

    /// The bytes at `offset` of rewrite `fw` for a reader that opened during it (see
    /// `ready_for_reader`): from its staged copy while there is one; the rewrite's errno
    /// once it failed, since the edit that reader saw is gone; `None` once it is over (read
    /// the file's version in the bucket).
    pub async fn read_rewrite(
        &self,
        fw: &FileWriter,
        offset: u64,
        size: u32,
    ) -> Option<FsResult<Bytes>> {
        let st = fw.state.lock().await;
        match &*st {
            State::Staged(s) => Some(s.file.read_at(offset, u64::from(size)).await),
            State::Failed(e) => Some(Err(*e)),
            State::Open { .. } | State::Replacing { .. } | State::Idle { .. } | State::Done => None,
        }
    }

    /// The bytes at `offset` of the staged copy `fw` writes, when its file is staged
    /// (`None`: read the object).
    pub async fn read_staged(
        &self,
        fw: &FileWriter,
        offset: u64,
        size: u32,
    ) -> Option<FsResult<Bytes>> {
        let st = fw.state.lock().await;
        match &*st {
            State::Staged(s) => Some(s.file.read_at(offset, u64::from(size)).await),
            _ => None,
        }
    }
}
