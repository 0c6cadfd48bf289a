//! The write path: one writer per inode being written, shared by every handle that opened it
//! for writing, streaming sequential appends into one `BidiWriteObject` stream.
//!
//! A writer starts `Open` (a file just created: its stream exists) or `Idle` (an existing
//! object opened for writing: nothing happens until the first write, which must land exactly
//! at the object's end and then takes the object over). Unpersisted bytes count against the
//! write share of the one memory budget (a semaphore in KiB): a write that does not fit first
//! makes its own bytes durable, then waits, and every so often makes idle writers' bytes
//! durable so they cannot hold the budget forever. A failed writer stays failed: every later
//! write, flush or fsync on it answers the same errno. The last handle's release ends the
//! stream (close, or finalize with `write.finalize_on_close`).
//!
//! Touches `gcs::AppendWriter` and the inode's size; no kernel types.

use super::error::{log_err, Errno, FsResult};
use super::inode::Inode;
use crate::config::{CacheConfig, WriteConfig};
use crate::gcs::{self, AppendWriter, Client};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use tokio::sync::Semaphore;

/// What every non-sequential write answers in this version.
pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
/// The write budget is counted in units of this many bytes (semaphore permits).
const PERMIT_BYTES: u64 = 1024;
/// A write waiting this long for budget makes idle writers' bytes durable.
const IDLE_FLUSH_AFTER: Duration = Duration::from_millis(200);

/// Permits of the write budget held by one writer; given back when dropped.
struct Held {
    budget: Arc<Semaphore>,
    permits: u32,
}

impl Held {
    /// Keeps just enough permits for `unpersisted` bytes.
    fn settle(&mut self, unpersisted: u64) {
        let need = permits_for(unpersisted).min(self.permits);
        let extra = self.permits - need;
        if extra > 0 {
            self.budget.add_permits(extra as usize);
            self.permits = need;
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.permits > 0 {
            self.budget.add_permits(self.permits as usize);
        }
    }
}

fn permits_for(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(PERMIT_BYTES)).unwrap_or(u32::MAX)
}

enum State {
    /// An existing object of this generation, opened for writing but not written yet.
    Idle { generation: i64 },
    /// Streaming into the object.
    Open { w: Box<AppendWriter>, held: Held },
    /// Failed for good; every later call answers this.
    Failed(Errno),
    /// The stream was ended by the last release.
    Done,
}

/// The writer of one inode.
pub struct FileWriter {
    inode: Arc<Inode>,
    /// Bytes the file holds as written through this writer (what `stat` shows).
    size: AtomicU64,
    state: tokio::sync::Mutex<State>,
}

/// Every writer of the mount, the write budget and the handles that write.
pub struct Writes {
    client: Client,
    bucket: Arc<str>,
    finalize_on_close: bool,
    budget: Arc<Semaphore>,
    budget_permits: u32,
    /// Writer of each inode and the number of handles writing it.
    by_ino: Mutex<HashMap<u64, (Arc<FileWriter>, usize)>>,
    by_fh: Mutex<HashMap<u64, Arc<FileWriter>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means another request panicked mid-update of plain data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The write share of the memory budget in bytes, and the read path's configuration with
/// what remains.
pub fn split_budget(cache: &CacheConfig, write: &WriteConfig) -> (u64, CacheConfig) {
    let total = cache.memory_mb.max(16);
    let write_mb = (total * write.memory_percent.min(90) / 100).max(4);
    let read = CacheConfig {
        memory_mb: total.saturating_sub(write_mb).max(8),
    };
    (write_mb * 1024 * 1024, read)
}

/// Records `size` (and now as mtime) as the inode's current size, keeping its generation.
fn note_size(inode: &Inode, size: u64) {
    if let Some(mut m) = inode.meta().0 {
        m.size = size;
        m.mtime = SystemTime::now();
        inode.refresh(m);
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
            by_ino: Mutex::new(HashMap::new()),
            by_fh: Mutex::new(HashMap::new()),
        }
    }

    /// Registers handle `fh` as a writer of `inode`: joins the inode's writer if it has one,
    /// else starts one from `start` (a fresh stream, or the generation to take over later).
    fn attach(&self, fh: u64, inode: &Arc<Inode>, start: impl FnOnce() -> (State, u64)) {
        let fw = {
            let mut by_ino = lock(&self.by_ino);
            let entry = by_ino.entry(inode.ino).or_insert_with(|| {
                let (state, size) = start();
                let fw = Arc::new(FileWriter {
                    inode: inode.clone(),
                    size: AtomicU64::new(size),
                    state: tokio::sync::Mutex::new(state),
                });
                (fw, 0)
            });
            entry.1 += 1;
            entry.0.clone()
        };
        lock(&self.by_fh).insert(fh, fw);
    }

    /// Handle `fh` writes the object just created as `inode` through `w`.
    pub fn attach_created(&self, fh: u64, inode: &Arc<Inode>, w: AppendWriter) {
        let held = self.held(0);
        self.attach(fh, inode, move || {
            (
                State::Open {
                    w: Box::new(w),
                    held,
                },
                0,
            )
        });
    }

    /// Handle `fh` may write the existing object `inode` (generation `generation`, `size`
    /// bytes); the takeover waits for its first write.
    pub fn attach_existing(&self, fh: u64, inode: &Arc<Inode>, generation: i64, size: u64) {
        self.attach(fh, inode, || (State::Idle { generation }, size));
    }

    fn held(&self, permits: u32) -> Held {
        Held {
            budget: self.budget.clone(),
            permits,
        }
    }

    /// The size of `ino` as written through this mount, while a writer is active on it.
    pub fn size_of(&self, ino: u64) -> Option<u64> {
        lock(&self.by_ino)
            .get(&ino)
            .map(|(fw, _)| fw.size.load(Ordering::Acquire))
    }

    fn writer(&self, fh: u64) -> Option<Arc<FileWriter>> {
        lock(&self.by_fh).get(&fh).cloned()
    }

    /// Appends `data` at `offset` through handle `fh`: only at the end of the file.
    pub async fn write(&self, fh: u64, offset: u64, data: Bytes) -> FsResult<u32> {
        let fw = self.writer(fh).ok_or(Errno::EBADF)?;
        let len = u32::try_from(data.len()).map_err(|_| Errno::EINVAL)?;
        let key = fw.inode.key.as_str();
        let mut st = fw.state.lock().await;
        if let State::Idle { generation } = *st {
            *st = self.take_over(&fw, generation, offset).await?;
        }
        let (w, held) = match &mut *st {
            State::Open { w, held } => (w, held),
            State::Failed(e) => return Err(*e),
            State::Idle { .. } | State::Done => return Err(Errno::EBADF),
        };
        if offset != w.written() {
            tracing::warn!(
                path = key,
                offset,
                size = w.written(),
                "write not at the end of the file: only sequential appends are supported"
            );
            return Err(EOPNOTSUPP);
        }
        let appended = async {
            self.reserve(w, held, data.len() as u64).await?;
            w.append(data).await
        };
        if let Err(e) = appended.await {
            let errno = log_err("write", key, &e);
            *st = State::Failed(errno);
            return Err(errno);
        }
        held.settle(w.written().saturating_sub(w.persisted()));
        fw.size.store(w.written(), Ordering::Release);
        Ok(len)
    }

    /// Takes over the existing object for the first write, which must land at its end.
    async fn take_over(&self, fw: &FileWriter, generation: i64, offset: u64) -> FsResult<State> {
        let key = fw.inode.key.as_str();
        let meta = self
            .client
            .get_object(&self.bucket, key)
            .await
            .map_err(|e| log_err("write", key, &e))?;
        if meta.generation != generation {
            tracing::warn!(path = key, "object replaced since it was opened");
            return Err(Errno::ESTALE);
        }
        if meta.finalized {
            tracing::warn!(
                path = key,
                "object is finalized: appending to finalized objects is not supported"
            );
            return Err(EOPNOTSUPP);
        }
        if offset != meta.size {
            tracing::warn!(
                path = key,
                offset,
                size = meta.size,
                "write not at the end of the file: only sequential appends are supported"
            );
            return Err(EOPNOTSUPP);
        }
        let w = self
            .client
            .open_appendable(&self.bucket, key, generation)
            .await
            .map_err(|e| log_err("takeover", key, &e))?;
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
            if let State::Open { w, held } = &mut *st {
                if held.permits == 0 {
                    continue;
                }
                match w.flush().await {
                    Ok(_) => held.settle(w.written().saturating_sub(w.persisted())),
                    Err(e) => *st = State::Failed(log_err("flush", &fw.inode.key, &e)),
                }
            }
        }
    }

    /// Returns once every byte written through handle `fh`'s writer is persisted (fsync and
    /// close); handles that do not write have nothing to do.
    pub async fn flush(&self, fh: u64) -> FsResult<()> {
        match self.writer(fh) {
            Some(fw) => Self::flush_writer(&fw).await,
            None => Ok(()),
        }
    }

    async fn flush_writer(fw: &FileWriter) -> FsResult<()> {
        let mut st = fw.state.lock().await;
        match &mut *st {
            State::Open { w, held } => match w.flush().await {
                Ok(persisted) => {
                    held.settle(0);
                    note_size(&fw.inode, persisted);
                    Ok(())
                }
                Err(e) => {
                    let errno = log_err("fsync", &fw.inode.key, &e);
                    *st = State::Failed(errno);
                    Err(errno)
                }
            },
            State::Failed(e) => Err(*e),
            State::Idle { .. } | State::Done => Ok(()),
        }
    }

    /// Makes the service hold everything written to `ino` so far, so a new reader sees it.
    pub async fn settle(&self, ino: u64) -> FsResult<()> {
        let fw = lock(&self.by_ino).get(&ino).map(|(fw, _)| fw.clone());
        match fw {
            Some(fw) => Self::flush_writer(&fw).await,
            None => Ok(()),
        }
    }

    /// Handle `fh` is closed; the last writing handle of an inode ends its stream (and
    /// finalizes the object with `write.finalize_on_close`). Says whether `fh` was a writer.
    pub async fn release(&self, fh: u64) -> bool {
        let Some(fw) = lock(&self.by_fh).remove(&fh) else {
            return false;
        };
        let last = {
            let mut by_ino = lock(&self.by_ino);
            match by_ino.get_mut(&fw.inode.ino) {
                Some(entry) if Arc::ptr_eq(&entry.0, &fw) => {
                    entry.1 = entry.1.saturating_sub(1);
                    let last = entry.1 == 0;
                    if last {
                        by_ino.remove(&fw.inode.ino);
                    }
                    last
                }
                _ => false,
            }
        };
        if !last {
            return true;
        }
        let state = std::mem::replace(&mut *fw.state.lock().await, State::Done);
        let State::Open { w, held } = state else {
            return true;
        };
        let key = fw.inode.key.as_str();
        let w = *w;
        let ended = if self.finalize_on_close {
            w.finalize().await
        } else {
            w.close().await
        };
        drop(held);
        match ended {
            Ok(meta) => note_size(&fw.inode, meta.size),
            Err(e) => {
                log_err("close", key, &e);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_split_between_reads_and_writes() {
        let (w, r) = split_budget(
            &CacheConfig { memory_mb: 128 },
            &WriteConfig {
                finalize_on_close: false,
                memory_percent: 25,
            },
        );
        assert_eq!(w, 32 * 1024 * 1024);
        assert_eq!(r.memory_mb, 96);
    }

    #[test]
    fn held_permits_shrink_to_what_is_unpersisted() {
        let budget = Arc::new(Semaphore::new(100));
        let p = budget.try_acquire_many(10).expect("permits");
        p.forget();
        let mut h = Held {
            budget: budget.clone(),
            permits: 10,
        };
        h.settle(3 * PERMIT_BYTES + 1);
        assert_eq!(h.permits, 4);
        assert_eq!(budget.available_permits(), 96);
        drop(h);
        assert_eq!(budget.available_permits(), 100);
    }
}
