//! The read path: open handles pinned to one object generation, the block cache, read-ahead,
//! and the warm pools of streams, all under the one memory budget.
//!
//! Budget split (`cache.memory_mb`): half for the block cache (moka, weighted by bytes, LRU),
//! a quarter for read-ahead in flight (a semaphore: read-ahead that does not fit is skipped,
//! never waited for), a quarter for the reads being answered (a semaphore the kernel's
//! requests wait on: with many readers the kernel has more requests outstanding than memory
//! allows, and the blocks they fetch and the copies they reply with must fit too).
//!
//! - A small object (up to `read.small_object_kb`) is fetched whole, in one range, at its
//!   first read: straight to the reader when that read asks for all of it (the kernel's page
//!   cache keeps it then), else into the cache, which serves its other reads. Its stream
//!   closes with its last handle. Only large objects' streams stay warm.
//! - A large object's reads are served as the kernel sends them, each one range on a pooled
//!   stream, when the mount's kernel read-ahead is large (set at mount as root): the kernel
//!   keeps enough requests in flight and its page cache keeps the bytes. Where it stays small
//!   (an ordinary user's mount), and for a handle opened with `O_DIRECT` (the kernel reads
//!   nothing ahead for it), a sequential reader fetches whole blocks and prefetches a window
//!   ahead of itself into the block cache.
//! - A random read fetches only its own bytes (the kernel asks for whole pages), unless the
//!   cache already holds them.
//!
//! Every cache key carries the generation, so a handle never mixes bytes of two versions.

use super::counters::Counters;
use super::error::{Errno, FsResult};
use super::inode::ObjMeta;
use super::pool::StreamPool;
use super::seq::{Plan, Sequential};
use crate::config::{CacheConfig, ReadConfig};
use crate::gcs::Client;
use bytes::{Bytes, BytesMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;

/// Read-ahead budget is counted in units of this many bytes (semaphore permits).
const PERMIT_BYTES: u64 = 4096;
/// Kernel read-ahead from which a sequential reader is left to the kernel: enough 1 MiB
/// requests in flight to keep a stream busy.
const KERNEL_READ_AHEAD_ENOUGH: u64 = 4 * 1024 * 1024;
/// Block index of a small object's single whole-object entry.
const WHOLE: u64 = u64::MAX;

/// A cached block: the object, its generation and the block index (or `WHOLE`).
type BlockKey = (Arc<str>, i64, u64);

/// A version of an object read without an open (key, generation, size), whether the reader
/// asked for `O_DIRECT`, and the reading process.
type UnopenedKey = (Arc<str>, i64, u64, bool, u32);

/// Shared state of every read of the mount.
#[derive(Clone)]
pub struct ReadPath {
    client: Client,
    bucket: Arc<str>,
    pools: moka::sync::Cache<(Arc<str>, i64), Arc<StreamPool>>,
    /// Handles of large objects read without an open (`unopened`), by version, `O_DIRECT`
    /// and reader, for as long as reads keep coming.
    unopened: moka::sync::Cache<UnopenedKey, Arc<Handle>>,
    blocks: moka::future::Cache<BlockKey, Bytes>,
    prefetch_budget: Arc<Semaphore>,
    demand_budget: Arc<Semaphore>,
    demand_permits: u32,
    block: u64,
    small: u64,
    readahead_initial: u64,
    readahead_max: u64,
    max_streams: usize,
    bytes_per_stream: u64,
    /// Whole objects loaded by prefetch and not yet read: (key, generation).
    prefetched: moka::sync::Cache<(Arc<str>, i64), ()>,
    counters: Arc<Counters>,
    /// The mount's kernel read-ahead in bytes (0 until the mount reports it).
    kernel_read_ahead: Arc<AtomicU64>,
}

/// What loading a whole object into the cache did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loaded {
    /// Fetched now: this many bytes.
    Fetched(u64),
    /// Already cached, fetched meanwhile by someone else (a reader or another prefetch), or
    /// no longer wanted because a reader has it.
    Present,
}

/// One open file: the generation and size it reads, its stream pool and its scan state.
pub struct Handle {
    key: Arc<str>,
    generation: i64,
    size: u64,
    pool: Arc<StreamPool>,
    /// Opened with `O_DIRECT`: the kernel reads nothing ahead of it.
    direct: bool,
    seq: Mutex<Sequential>,
}

impl Handle {
    /// The size of the version this handle reads.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether it was opened with `O_DIRECT`.
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// The object it reads: its name and generation.
    pub fn object(&self) -> (&str, i64) {
        (&self.key, self.generation)
    }
}

impl ReadPath {
    /// Builds the caches from the configuration.
    pub fn new(client: Client, bucket: &str, read: &ReadConfig, cache: &CacheConfig) -> Self {
        let budget = cache.budget_mb().max(16) * 1024 * 1024;
        let block = read.block_kb.max(4) * 1024;
        let counters = Arc::new(Counters::default());
        let prefetched: moka::sync::Cache<(Arc<str>, i64), ()> =
            moka::sync::Cache::builder().max_capacity(1 << 20).build();
        let (evict_seen, evict_count) = (prefetched.clone(), counters.clone());
        let blocks = moka::future::Cache::builder()
            .max_capacity(budget / 2)
            .weigher(|_k: &BlockKey, v: &Bytes| u32::try_from(v.len()).unwrap_or(u32::MAX))
            .eviction_policy(moka::policy::EvictionPolicy::lru())
            .eviction_listener(move |k: Arc<BlockKey>, _v, cause| {
                // A prefetched object pushed out before anyone read it: the window is too big.
                if cause.was_evicted()
                    && k.2 == WHOLE
                    && evict_seen.remove(&(k.0.clone(), k.1)).is_some()
                {
                    evict_count.bump(&evict_count.evicted_unused, 1);
                }
            })
            .build();
        let pools = moka::sync::Cache::builder()
            .max_capacity(read.max_warm_objects.max(1))
            .time_to_idle(crate::config::ttl(read.stream_idle_ms))
            .build();
        let unopened = moka::sync::Cache::builder()
            .max_capacity(read.max_warm_objects.max(1))
            .time_to_idle(crate::config::ttl(read.stream_idle_ms))
            .build();
        let quarter = u32::try_from(budget / 4 / PERMIT_BYTES).unwrap_or(u32::MAX);
        ReadPath {
            client,
            bucket: Arc::from(bucket),
            pools,
            unopened,
            blocks,
            prefetch_budget: Arc::new(Semaphore::new(quarter as usize)),
            demand_budget: Arc::new(Semaphore::new(quarter as usize)),
            demand_permits: quarter,
            block,
            small: read.small_object_kb * 1024,
            readahead_initial: read.readahead_initial_kb * 1024,
            readahead_max: read.readahead_max_kb * 1024,
            max_streams: read.max_streams_per_object.max(1),
            bytes_per_stream: read.stream_per_mb.max(1) * 1024 * 1024,
            prefetched,
            counters,
            kernel_read_ahead: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Tells the read path how much the kernel reads ahead of a sequential reader of this
    /// mount (its `read_ahead_kb`). From `KERNEL_READ_AHEAD_ENOUGH` on, the kernel's requests
    /// are served as they come; below it (an ordinary user's mount, which cannot raise the
    /// kernel's 128 KiB) rapidfs reads ahead itself, into the block cache.
    pub fn set_kernel_read_ahead(&self, bytes: u64) {
        self.kernel_read_ahead.store(bytes, Ordering::Relaxed);
    }

    /// The budget permits `bytes` in flight take: at least one, at most a quarter of the
    /// budget (what either share holds), so that any load or read can start.
    fn permits(&self, bytes: u64) -> u32 {
        u32::try_from(bytes.div_ceil(PERMIT_BYTES).max(1))
            .unwrap_or(u32::MAX)
            .min(self.demand_permits)
    }

    fn kernel_reads_ahead(&self) -> bool {
        self.kernel_read_ahead.load(Ordering::Relaxed) >= KERNEL_READ_AHEAD_ENOUGH
    }

    /// The prefetch counters, shared with the prefetcher.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Largest object fetched whole.
    pub fn small_limit(&self) -> u64 {
        self.small
    }

    /// Bytes the block cache may hold, and holds now.
    pub fn cache_bytes(&self) -> (u64, u64) {
        (
            self.blocks.policy().max_capacity().unwrap_or(0),
            self.blocks.weighted_size(),
        )
    }

    /// Loads small object `key` whole, at the generation and size in `meta`, into the cache
    /// where a later read of that version finds it. A read or load of the same version already
    /// under way is joined, never repeated. Bytes in flight count against the read-ahead budget.
    ///
    /// `wanted` is asked once more when the budget lets the load start: a reader may have
    /// opened the file, read it whole and dropped its entry while this load waited, and
    /// loading it again would download it twice.
    pub async fn load_whole(
        &self,
        key: &str,
        meta: &ObjMeta,
        wanted: impl Fn() -> bool,
    ) -> FsResult<Loaded> {
        let key: Arc<str> = Arc::from(key);
        let cache_key = (key.clone(), meta.generation, WHOLE);
        if let Some(b) = self.blocks.get(&cache_key).await {
            if b.len() as u64 >= meta.size {
                return Ok(Loaded::Present);
            }
            self.blocks.invalidate(&cache_key).await;
        }
        let _permit = self
            .prefetch_budget
            .acquire_many(self.permits(meta.size))
            .await
            .map_err(|_| Errno::EIO)?;
        // Marked before the last look at `wanted`: a reader that opens the file after that
        // look sees the mark and joins this load instead of fetching the file on its own.
        let mark = (key.clone(), meta.generation);
        let marked = self.prefetched.entry(mark.clone()).or_insert(()).is_fresh();
        let unmark = || {
            if marked {
                self.prefetched.invalidate(&mark);
            }
        };
        if !wanted() {
            unmark();
            return Ok(Loaded::Present);
        }
        let (client, bucket, generation, size) = (
            self.client.clone(),
            self.bucket.clone(),
            meta.generation,
            meta.size,
        );
        let what = key.clone();
        // The cache runs one fetch for a key only among callers whose fetches fail with the
        // same error type: this one must stay `gcs::Error`, as in `cached`, for a reader to
        // join it.
        let entry = self
            .blocks
            .entry(cache_key)
            .or_try_insert_with(async move {
                if size == 0 {
                    return Ok(Bytes::new());
                }
                // A stream of its own, closed when done: prefetched objects keep no stream
                // open. Read in one go by this task; after a failure (a redirect, a cut) by
                // a reader, which reconnects and retries.
                let once = client.read_once_to_keep(&bucket, &what, generation, 0, size);
                if let Ok(whole) = once.await {
                    return Ok(whole);
                }
                let (_reader, pending) = client
                    .open_reader_reading(&bucket, &what, Some(generation), 0, size)
                    .await?;
                pending.bytes().await
            })
            .await;
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                unmark();
                return Err(super::error::log_err("prefetch", &key, &e));
            }
        };
        if !entry.is_fresh() {
            return Ok(Loaded::Present);
        }
        Ok(Loaded::Fetched(entry.value().len() as u64))
    }

    /// Loads every block of large object `key` into the cache, a few blocks at a time, the
    /// bytes in flight counted against the read-ahead budget.
    pub async fn load_blocks(&self, key: &str, meta: &ObjMeta) -> FsResult<u64> {
        let h = self.open(key, meta, false);
        let loaded = self.load_blocks_of(&h).await;
        self.release(&h);
        loaded.map(|()| h.size)
    }

    async fn load_blocks_of(&self, h: &Handle) -> FsResult<()> {
        const AT_ONCE: u64 = 8;
        let mut at = 0;
        while at < h.size {
            let end = (at + AT_ONCE * self.block).min(h.size);
            let _permit = self
                .prefetch_budget
                .acquire_many(self.permits(end - at))
                .await
                .map_err(|_| Errno::EIO)?;
            let fetches = (at / self.block..=(end - 1) / self.block).map(|i| {
                let start = i * self.block;
                self.cached(h, i, start, (start + self.block).min(h.size))
            });
            futures::future::try_join_all(fetches).await?;
            at = end;
        }
        Ok(())
    }

    /// True when small object `h` is in the cache, or a prefetch of it has begun: a read then
    /// takes it from there (joining the load in flight) instead of fetching it again.
    fn cached_or_loading(&self, h: &Handle) -> bool {
        self.prefetched.contains_key(&(h.key.clone(), h.generation))
            || self
                .blocks
                .contains_key(&(h.key.clone(), h.generation, WHOLE))
    }

    /// A read of a prefetched object: counted once as a prefetch used.
    fn note_use(&self, h: &Handle) {
        if self
            .prefetched
            .remove(&(h.key.clone(), h.generation))
            .is_some()
        {
            self.counters.bump(&self.counters.used, 1);
        }
    }

    /// A handle reading object `key` at the generation and size in `meta`; `direct`: opened
    /// with `O_DIRECT`, which the kernel reads nothing ahead for, so this path does.
    pub fn open(&self, key: &str, meta: &ObjMeta, direct: bool) -> Handle {
        self.open_version(key, meta.generation, meta.size, direct)
    }

    /// A handle like `h` for the same bytes moved to `key` as generation `generation` (a
    /// rename through this mount).
    pub fn moved(&self, h: &Handle, key: &str, generation: i64) -> Handle {
        self.open_version(key, generation, h.size, h.direct)
    }

    fn open_version(&self, key: &str, generation: i64, size: u64, direct: bool) -> Handle {
        let key: Arc<str> = Arc::from(key);
        let streams = usize::try_from(1 + size / self.bytes_per_stream)
            .unwrap_or(usize::MAX)
            .min(self.max_streams);
        let new_pool = || {
            Arc::new(StreamPool::new(
                self.client.clone(),
                self.bucket.clone(),
                key.to_string(),
                generation,
                streams,
            ))
        };
        // A small object is read whole in one range: a warm stream would save its next
        // reader nothing (a new stream carries the range in its first message), and
        // thousands of idle streams cost both ends CPU on every frame. Its stream closes
        // with its last handle.
        let pool = if size <= self.small {
            new_pool()
        } else {
            self.pools.get_with((key.clone(), generation), new_pool)
        };
        Handle {
            key,
            generation,
            size,
            pool,
            direct,
            seq: Mutex::new(Sequential::new(self.readahead_initial, self.readahead_max)),
        }
    }

    /// A handle for a read the kernel sent without opening the file (a read-only mount skips
    /// `open`) for process `reader`. A small object's is new for each read: read whole at
    /// once, it keeps nothing between reads, and its stream closes with it. A large object's
    /// is kept per reader until its reads stop for `read.stream_idle_ms`, so that its scan
    /// state follows that reader's pattern (two readers of one file at two places would each
    /// look random to a shared one), and all of them share the version's warm streams.
    pub fn unopened(&self, key: &str, meta: &ObjMeta, direct: bool, reader: u32) -> Arc<Handle> {
        if meta.size <= self.small {
            return Arc::new(self.open(key, meta, direct));
        }
        let key: Arc<str> = Arc::from(key);
        let h = self.unopened.get_with(
            (key.clone(), meta.generation, meta.size, direct, reader),
            || Arc::new(self.open(&key, meta, direct)),
        );
        // No release marks the end of these reads: each read keeps the version's streams in
        // `pools` (their idle time counts from now), where a later reader's handle finds them.
        self.pools
            .get_with((key, meta.generation), || h.pool.clone());
        h
    }

    /// The handle is closed: the streams of a large object stay warm for
    /// `read.stream_idle_ms` from now.
    pub fn release(&self, h: &Handle) {
        if h.size > self.small {
            self.pools
                .insert((h.key.clone(), h.generation), h.pool.clone());
        }
    }

    /// Reads up to `len` bytes at `offset`, clipped to the size the handle opened.
    pub async fn read(&self, h: &Handle, offset: u64, len: u64) -> FsResult<Bytes> {
        let end = offset.saturating_add(len).min(h.size);
        if offset >= end {
            return Ok(Bytes::new());
        }
        // Worst case held while answering: every covering block fetched, plus one copy.
        let kernel_reads_ahead = !h.direct && self.kernel_reads_ahead();
        let held = if h.size <= self.small {
            h.size
        } else if kernel_reads_ahead {
            end - offset
        } else {
            ((end - 1) / self.block - offset / self.block + 1) * self.block + (end - offset)
        };
        let _permit = self
            .demand_budget
            .acquire_many(self.permits(held))
            .await
            .map_err(|_| Errno::EIO)?;
        if h.size <= self.small {
            if offset == 0 && end == h.size && !self.cached_or_loading(h) {
                // Read whole in one request and loaded by nobody else: it goes straight to
                // the reader, whose page cache keeps it. Passing it through the block cache
                // would cost an insert and an eviction for nothing.
                let whole = self.fetch_once(h).await?;
                return Ok(crate::metrics::cache_lookup(false, whole));
            }
            let whole = self.cached(h, WHOLE, 0, h.size).await?;
            self.note_use(h);
            if offset == 0 && end == h.size {
                // Read whole in one request: the kernel's page cache holds it now. Keeping a
                // second copy would only push out what is still to be read (the cache is LRU,
                // and files prefetched for later were loaded before this one was read).
                self.blocks
                    .invalidate(&(h.key.clone(), h.generation, WHOLE))
                    .await;
            }
            return Ok(slice(&whole, offset, end));
        }
        if kernel_reads_ahead {
            // Each request is one range on a pooled stream, straight to the reader: the
            // kernel's read-ahead keeps enough of them in flight, and its page cache keeps the
            // bytes, so caching them here too would only cost an insert and a copy.
            if let Some(b) = self.cached_range(h, offset, end).await {
                return Ok(b);
            }
            return self.fetch_uncached(h, offset, end).await;
        }
        let plan = h
            .seq
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(offset, end - offset);
        match plan {
            Plan::Sequential { prefetch } => {
                if let Some((from, to)) = prefetch {
                    self.prefetch(h, from, to.min(h.size));
                }
                self.read_blocks(h, offset, end).await
            }
            Plan::Random => {
                if let Some(b) = self.cached_range(h, offset, end).await {
                    return Ok(b);
                }
                self.fetch_uncached(h, offset, end).await
            }
        }
    }

    /// Small object `h` whole, on a stream of its own that closes as soon as it is read;
    /// after any failure, on the object's pool of streams, which reconnects and retries.
    async fn fetch_once(&self, h: &Handle) -> FsResult<Bytes> {
        let once = self
            .client
            .read_once(&self.bucket, &h.key, h.generation, 0, h.size)
            .await;
        match once {
            Ok(got) => {
                self.counters
                    .bump(&self.counters.demand_bytes, got.len() as u64);
                Ok(got)
            }
            Err(e) => {
                tracing::debug!(key = %h.key, error = %e, "one-shot read failed; retrying on the pool");
                self.fetch_uncached(h, 0, h.size).await
            }
        }
    }

    /// Bytes `[offset, end)` straight from the object's streams, past the block cache.
    async fn fetch_uncached(&self, h: &Handle, offset: u64, end: u64) -> FsResult<Bytes> {
        let got = h
            .pool
            .read(offset, end - offset)
            .await
            .map_err(|e| super::error::log_err("read", &h.key, &e))?;
        self.counters
            .bump(&self.counters.demand_bytes, got.len() as u64);
        Ok(got)
    }

    /// Bytes `[offset, end)` from whole blocks, fetching (once) the blocks not yet cached.
    async fn read_blocks(&self, h: &Handle, offset: u64, end: u64) -> FsResult<Bytes> {
        let first = offset / self.block;
        let last = (end - 1) / self.block;
        let fetches = (first..=last).map(|i| {
            let start = i * self.block;
            self.cached(h, i, start, (start + self.block).min(h.size))
        });
        let blocks = futures::future::try_join_all(fetches).await?;
        Ok(assemble(&blocks, first * self.block, offset, end))
    }

    /// Bytes `[offset, end)` if every block covering them is cached.
    async fn cached_range(&self, h: &Handle, offset: u64, end: u64) -> Option<Bytes> {
        let first = offset / self.block;
        let last = (end - 1) / self.block;
        let mut blocks = Vec::new();
        for i in first..=last {
            let b = self.blocks.get(&(h.key.clone(), h.generation, i)).await?;
            // A short last block was cached before the object grew.
            if (b.len() as u64) < self.block.min(h.size - i * self.block) {
                return None;
            }
            blocks.push(b);
        }
        Some(assemble(&blocks, first * self.block, offset, end))
    }

    /// The cache entry `index` holding bytes `[start, end)`, fetched once however many
    /// readers ask for it at the same time.
    async fn cached(&self, h: &Handle, index: u64, start: u64, end: u64) -> FsResult<Bytes> {
        let pool = h.pool.clone();
        let key = (h.key.clone(), h.generation, index);
        // The last block of an appendable object cached before it grew is short: fetch anew.
        if let Some(b) = self.blocks.get(&key).await {
            if (b.len() as u64) < end - start {
                self.blocks.invalidate(&key).await;
            }
        }
        let counters = self.counters.clone();
        let entry = self
            .blocks
            .entry(key.clone())
            .or_try_insert_with(async move {
                let got = pool.read(start, end - start).await?;
                counters.bump(&counters.demand_bytes, got.len() as u64);
                Ok::<_, crate::gcs::Error>(got)
            })
            .await
            .map_err(|e| super::error::log_err("read", &h.key, &e))?;
        let hit = !entry.is_fresh();
        let got = entry.into_value();
        if (got.len() as u64) >= end - start {
            return Ok(crate::metrics::cache_lookup(hit, got));
        }
        // The fetch joined was made for a handle that saw the object before it grew: its
        // bytes end too soon for this one, and would shift every block after them.
        self.blocks.invalidate(&key).await;
        self.fetch_uncached(h, start, end).await
    }

    /// Starts fetching the blocks of `[from, to)` that are not cached, in the background, as
    /// far as the read-ahead budget allows.
    fn prefetch(&self, h: &Handle, from: u64, to: u64) {
        if from >= to {
            return;
        }
        let first = from / self.block;
        let last = (to - 1) / self.block;
        for i in first..=last {
            let key = (h.key.clone(), h.generation, i);
            if self.blocks.contains_key(&key) {
                continue;
            }
            let start = i * self.block;
            let end = (start + self.block).min(h.size);
            let permits = u32::try_from((end - start).div_ceil(PERMIT_BYTES)).unwrap_or(u32::MAX);
            let Ok(permit) = self.prefetch_budget.clone().try_acquire_many_owned(permits) else {
                return;
            };
            let blocks = self.blocks.clone();
            let pool = h.pool.clone();
            let counters = self.counters.clone();
            tokio::spawn(async move {
                let fetched = blocks
                    .try_get_with(key, async move {
                        let got = pool.read(start, end - start).await?;
                        counters.bump(&counters.readahead_bytes, got.len() as u64);
                        Ok::<_, crate::gcs::Error>(got)
                    })
                    .await;
                if let Err(e) = fetched {
                    tracing::debug!(error = %e, "read-ahead failed; the reader will fetch on demand");
                }
                drop(permit);
            });
        }
    }
}

/// `[offset, end)` of `whole`, which starts at byte 0.
fn slice(whole: &Bytes, offset: u64, end: u64) -> Bytes {
    let len = whole.len() as u64;
    whole.slice(offset.min(len) as usize..end.min(len) as usize)
}

/// `[offset, end)` out of consecutive blocks, the first starting at `base`: a slice when one
/// block holds it all, else one copy.
fn assemble(blocks: &[Bytes], base: u64, offset: u64, end: u64) -> Bytes {
    if let [one] = blocks {
        return slice(one, offset - base, end - base);
    }
    let mut out = BytesMut::with_capacity((end - offset) as usize);
    let mut pos = base;
    for b in blocks {
        let b_end = pos + b.len() as u64;
        let from = offset.max(pos);
        let to = end.min(b_end);
        if from < to {
            out.extend_from_slice(&b[(from - pos) as usize..(to - pos) as usize]);
        }
        pos = b_end;
    }
    out.freeze()
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("key", &self.key)
            .field("generation", &self.generation)
            .field("size", &self.size)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// An emulator holding object "f" of 50,000 bytes with `latency_us` per response, the
    /// read path of a mount on it, and the object's metadata.
    async fn read_path_on_emulator(
        latency_us: u64,
    ) -> (crate::emulator::Emulator, Arc<ReadPath>, ObjMeta) {
        read_path_over("f", Bytes::from(vec![7u8; 50_000]), latency_us).await
    }

    /// An emulator holding object `name` with `latency_us` per response, the read path of a
    /// mount on it, and the object's metadata.
    async fn read_path_over(
        name: &str,
        bytes: Bytes,
        latency_us: u64,
    ) -> (crate::emulator::Emulator, Arc<ReadPath>, ObjMeta) {
        let (emu, cfg) = crate::fs::test_emulator(&[(name, bytes)], latency_us).await;
        let client = Client::connect(&cfg.gcs).await.expect("client");
        let meta = ObjMeta::from(&client.get_object("b", name).await.expect("meta"));
        let reads = Arc::new(ReadPath::new(client, "b", &cfg.read, &cfg.cache));
        (emu, reads, meta)
    }

    /// A reader of a file whose load is in flight joins the load: one stream, not two.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reader_joins_a_load_in_flight() {
        // Each response waits 2 s: the load is still in flight when the reader comes.
        let (emu, reads, meta) = read_path_on_emulator(2_000_000).await;
        let load = tokio::spawn({
            let reads = reads.clone();
            async move { reads.load_whole("f", &meta, || true).await }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while emu.stats().read_streams == 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(emu.stats().read_streams, 1, "the load is in flight");
        assert!(!load.is_finished());
        let h = reads.open("f", &meta, false);
        let got = reads.read(&h, 0, meta.size).await.expect("read");
        assert_eq!(got.len() as u64, meta.size);
        assert_eq!(load.await.expect("joined"), Ok(Loaded::Fetched(meta.size)));
        assert_eq!(emu.stats().read_streams, 1);
    }

    /// A load whose one-shot stream fails (here redirected) is fetched by a reader, which
    /// follows the redirect: the bytes are cached all the same.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_load_whose_one_shot_stream_fails_is_fetched_by_a_reader() {
        let (emu, reads, meta) = read_path_on_emulator(0).await;
        emu.set_faults(crate::emulator::Faults {
            redirect_every: Some(1),
            ..Default::default()
        });
        let loaded = reads.load_whole("f", &meta, || true).await;
        assert_eq!(loaded, Ok(Loaded::Fetched(meta.size)));
        let cached = reads
            .blocks
            .get(&(Arc::from("f"), meta.generation, WHOLE))
            .await
            .expect("cached");
        assert!(cached == vec![7u8; 50_000]);
        assert!(
            emu.stats().read_streams >= 2,
            "the one-shot stream, then a reader's"
        );
    }

    /// A load that waited for the budget while a reader opened the file (and read it whole,
    /// leaving no cache entry) asks again before fetching, and fetches nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_load_no_longer_wanted_when_its_turn_comes_fetches_nothing() {
        let (emu, reads, meta) = read_path_on_emulator(0).await;
        let all = reads.prefetch_budget.available_permits() as u32;
        let held = reads
            .prefetch_budget
            .clone()
            .acquire_many_owned(all)
            .await
            .expect("budget");
        let wanted = Arc::new(AtomicBool::new(true));
        let load = tokio::spawn({
            let (reads, wanted) = (reads.clone(), wanted.clone());
            async move {
                reads
                    .load_whole("f", &meta, || wanted.load(Ordering::SeqCst))
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!load.is_finished(), "the load waits for the budget");
        wanted.store(false, Ordering::SeqCst);
        drop(held);
        assert_eq!(load.await.expect("joined"), Ok(Loaded::Present));
        assert_eq!(emu.stats().read_streams, 0);
        assert!(!reads
            .blocks
            .contains_key(&(Arc::from("f"), meta.generation, WHOLE)));
    }

    /// Under a large kernel read-ahead a sequential reader's requests go straight to the
    /// service, nothing read ahead into the block cache; a handle opened with `O_DIRECT`,
    /// which the kernel reads nothing ahead for, still gets rapidfs's own read-ahead.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_a_direct_handle_reads_ahead_when_the_kernel_does() {
        const MIB: u64 = 1024 * 1024;
        let big = Bytes::from((0..8 * MIB).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        let (_emu, reads, meta) = read_path_over("big", big.clone(), 0).await;
        reads.set_kernel_read_ahead(16 * MIB);
        let ahead = |reads: &ReadPath| reads.counters.readahead_bytes.load(Ordering::Relaxed);
        for (direct, reads_ahead) in [(false, false), (true, true)] {
            let h = reads.open("big", &meta, direct);
            for i in 0..4 {
                let got = reads.read(&h, i * MIB, MIB).await.expect("read");
                assert!(got == big.slice((i * MIB) as usize..((i + 1) * MIB) as usize));
            }
            reads.release(&h);
            assert_eq!(ahead(&reads) > 0, reads_ahead, "direct {direct}");
        }
    }

    /// An object that grew under the same generation: a handle that opened it shorter reads
    /// ahead its last block short. A reader that opened it longer and joins that fetch gets
    /// the whole block, not the short one (which shifted every block after it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reader_joining_a_fetch_for_a_shorter_size_gets_whole_blocks() {
        const MIB: u64 = 1024 * 1024;
        let big = Bytes::from((0..4 * MIB).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        // Each response waits 200 ms: the read-ahead is in flight when the second reader comes.
        let (_emu, reads, meta) = read_path_over("grown", big.clone(), 200_000).await;
        let before = ObjMeta {
            size: 2 * MIB + 500,
            ..meta
        };
        let short = reads.open("grown", &before, false);
        let long = reads.open("grown", &meta, false);
        reads.read(&short, 0, MIB).await.expect("read");
        // Sequential: reads block 2 ahead, as the 500 bytes this handle knows of.
        reads.read(&short, MIB, MIB).await.expect("read");
        let got = reads.read(&long, 0, 4 * MIB).await.expect("read");
        assert_eq!(got.len(), big.len());
        assert!(got == big, "the bytes read differ from the object's");
    }

    /// Warming a large object counts its bytes in flight against the read-ahead budget.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn loading_a_large_object_takes_the_read_ahead_budget() {
        const MIB: u64 = 1024 * 1024;
        let big = Bytes::from(vec![3u8; (16 * MIB) as usize]);
        let (_emu, reads, meta) = read_path_over("big", big, 100_000).await;
        let all = reads.prefetch_budget.available_permits();
        let load = tokio::spawn({
            let reads = reads.clone();
            async move { reads.load_blocks("big", &meta).await }
        });
        let mut least = all;
        while !load.is_finished() {
            least = least.min(reads.prefetch_budget.available_permits());
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(load.await.expect("joined"), Ok(16 * MIB));
        assert!(least < all, "the load took none of the budget");
        assert_eq!(reads.prefetch_budget.available_permits(), all);
    }

    #[test]
    fn assemble_spans_blocks() {
        let blocks = [
            Bytes::from_static(b"0123"),
            Bytes::from_static(b"4567"),
            Bytes::from_static(b"89"),
        ];
        assert_eq!(&assemble(&blocks, 8, 9, 16)[..], b"1234567");
        assert_eq!(&assemble(&blocks[..1], 8, 9, 11)[..], b"12");
        assert_eq!(&assemble(&blocks, 8, 8, 18)[..], b"0123456789");
    }
}
