//! Prefetch of whole small files ahead of the reader, and warm-up of the cache on request.
//!
//! "Upcoming" files come from an order: one given by a client of the control socket (a hint:
//! the paths an epoch will read, in order), or a directory's listing order once a process
//! opens three of its files one after the other in that order. Each open of a file found in an
//! order moves that order's cursor; the next files are loaded, one BidiReadObject stream each
//! (the range in the stream's first message), while the bytes loaded and not yet opened stay
//! under the window, itself at most half the block cache so that prefetched files are read
//! before they are evicted. Loaded files land in the block cache under (object, generation): a reader
//! of another version never sees them, and a reader arriving while the load is in flight joins
//! it. An upcoming file whose metadata no cache holds is found by listing its directory (one
//! call per folder, shared with the lookups that want the same listing), which then answers
//! the reader's lookups too.

use super::inode::{Kind, ObjMeta};
use super::read::Loaded;
use super::{lock, Fs};
use crate::config::ReadConfig;
use futures::StreamExt;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// Size assumed for an upcoming file whose metadata is not known yet.
const GUESSED_SIZE: u64 = 128 * 1024;
/// Opens in a row of listing neighbours that start directory-order prefetch. Two are not
/// enough: a shuffled epoch over a dataset's class folders puts two neighbours together about
/// once every folder-size picks, and each such pair used to prefetch the rest of the folder
/// (1.3x the bytes read and fewer samples/s in the workload benchmark); three in a row happen
/// by chance about once every folder-size squared.
const DIR_ORDER_RUN: usize = 3;

/// Directories whose scan state is remembered at once.
const MAX_DIR_SCANS: usize = 1024;
/// Progress of a warm-up is reported at most this often.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// The figures the control socket's `stats` op reports.
#[derive(Debug, Clone, Serialize)]
pub struct PrefetchStats {
    /// Files handed to the prefetcher.
    pub prefetch_issued: u64,
    /// Files loaded by the prefetcher.
    pub prefetch_fetched: u64,
    /// Bytes loaded by the prefetcher.
    pub prefetch_bytes: u64,
    /// Loaded files later read.
    pub prefetch_used: u64,
    /// Loaded files evicted unread.
    pub prefetch_evicted_unused: u64,
    /// Files found already cached, in flight or opened by a reader.
    pub prefetch_present: u64,
    /// Files too large to prefetch whole.
    pub prefetch_skipped_large: u64,
    /// Failed loads.
    pub prefetch_failed: u64,
    /// Prefetches started by directory-order detection.
    pub prefetch_dir_order: u64,
    /// Bytes readers waited for (fetched on demand).
    pub demand_bytes: u64,
    /// Bytes fetched by sequential read-ahead.
    pub readahead_bytes: u64,
    /// Paths in the hints now held.
    pub hinted_paths: u64,
    /// Bytes fetched ahead of the reader at most.
    pub window_bytes: u64,
    /// Bytes the block cache may hold.
    pub cache_capacity: u64,
    /// Bytes the block cache holds now.
    pub cache_bytes: u64,
}

/// Progress of a warm-up (`prefetch` op).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Progress {
    /// Files loaded (or failed) so far.
    pub done: u64,
    /// Files to load.
    pub total: u64,
    /// Bytes loaded so far.
    pub bytes: u64,
    /// Files that could not be loaded.
    pub failed: u64,
}

/// An order of upcoming files and how far the reader and the prefetcher are in it.
struct Order {
    keys: Vec<Arc<str>>,
    pos: HashMap<Arc<str>, usize>,
    cursor: Mutex<Cursor>,
}

#[derive(Default)]
struct Cursor {
    /// Furthest position opened so far, if any.
    read: Option<usize>,
    /// Positions below this have had their turn (issued, or passed by a reader).
    issued_to: usize,
    /// Issued positions not opened yet, with the bytes counted for each.
    waiting: HashMap<usize, u64>,
    /// Bytes of `waiting`.
    pending: u64,
}

/// Listing-order scan of one directory: the last position opened, how many opens in a row
/// came in listing order, and once enough did, the listing's keys and the cursor moving over
/// them.
#[derive(Default)]
struct DirScan {
    last: usize,
    run: usize,
    cursor: Cursor,
    keys: Option<Arc<[Arc<str>]>>,
    /// The listing the positions refer to; a new listing starts a new scan.
    listing: Option<Arc<super::listing::Listing>>,
}

/// What to do about an upcoming file.
#[derive(Debug, Clone, Copy)]
enum Upcoming {
    /// Load it; its metadata is known.
    Load(ObjMeta),
    /// Load it if it turns out small; its metadata must be fetched first.
    Unknown,
    /// Leave it: not a file, or too large.
    Skip,
    /// Leave it: a reader opened this version, so the kernel's page cache holds it or the
    /// reader is fetching it.
    Held,
}

/// Prefetch state of a mount.
pub struct Prefetch {
    window: u64,
    max_files: usize,
    dir_order: bool,
    parallel: Arc<Semaphore>,
    parallel_n: usize,
    hints: Mutex<HashMap<u64, Arc<Order>>>,
    dirs: Mutex<HashMap<String, DirScan>>,
    /// The open clock: bytes of all files opened so far. A file opened more than
    /// `page_cache_span` bytes of opens ago is assumed gone from the kernel's page cache.
    opened: AtomicU64,
    page_cache_span: u64,
}

impl Prefetch {
    /// Sized from `[read]`, the window capped at half of a block cache of `cache_capacity`.
    pub fn new(read: &ReadConfig, cache_capacity: u64) -> Self {
        Prefetch {
            window: (read.prefetch_window_mb * 1024 * 1024).min(cache_capacity / 2),
            max_files: read.prefetch_max_files.max(1),
            dir_order: read.prefetch_dir_order,
            parallel: Arc::new(Semaphore::new(read.prefetch_parallel.max(1))),
            parallel_n: read.prefetch_parallel.max(1),
            hints: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            opened: AtomicU64::new(0),
            page_cache_span: match read.prefetch_page_cache_mb {
                0 => physical_memory() / 2,
                mb => mb.saturating_mul(1024 * 1024),
            },
        }
    }

    /// Moves the open clock past a file of `size` bytes being opened; returns the new time.
    pub(super) fn open_clock(&self, size: u64) -> u64 {
        self.opened.fetch_add(size, Ordering::Relaxed) + size
    }

    /// Opens at or after this time on the open clock are assumed still in the page cache.
    fn page_cache_since(&self) -> u64 {
        self.opened
            .load(Ordering::Relaxed)
            .saturating_sub(self.page_cache_span)
    }
}

/// Bytes of physical memory (0 when unknown: then only the latest open counts as held).
fn physical_memory() -> u64 {
    // SAFETY: sysconf only reads system configuration.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    u64::try_from(pages)
        .unwrap_or(0)
        .saturating_mul(u64::try_from(page).unwrap_or(0))
}

/// Notes that position `at` was opened (none: the order just arrived) and returns the next
/// positions to load: as many as keep the bytes issued and not yet opened under `window` and
/// their count under `max_files`. Readers may open positions out of order (DataLoader workers
/// each take a batch); a position left unopened `max_files` behind the furthest one opened
/// is given up on, so a skipped file cannot stall the window.
fn advance(
    c: &mut Cursor,
    at: Option<usize>,
    len: usize,
    window: u64,
    max_files: usize,
    mut size_of: impl FnMut(usize) -> u64,
) -> Vec<usize> {
    if let Some(at) = at {
        c.read = Some(c.read.map_or(at, |r| r.max(at)));
        match c.waiting.remove(&at) {
            Some(size) => c.pending -= size,
            // Ahead of everything issued: what lies between is being read or was skipped.
            None if at >= c.issued_to => c.issued_to = at + 1,
            None => {}
        }
    }
    let low = c.read.map_or(0, |r| (r + 1).saturating_sub(max_files));
    let mut given_up = 0;
    c.waiting.retain(|&p, size| {
        let keep = p >= low;
        if !keep {
            given_up += *size;
        }
        keep
    });
    c.pending -= given_up;
    let mut due = Vec::new();
    while c.issued_to < len && c.pending < window && c.waiting.len() < max_files {
        let size = size_of(c.issued_to);
        c.waiting.insert(c.issued_to, size);
        c.pending += size;
        due.push(c.issued_to);
        c.issued_to += 1;
    }
    due
}

impl Fs {
    fn key_of(&self, rel: &str) -> String {
        format!("{}{}", self.inner.sb.root_key, rel.trim_matches('/'))
    }

    /// What to do about upcoming file `key`, from what is known without a call: its inode's
    /// metadata, else its directory listing's.
    fn upcoming(&self, key: &str) -> Upcoming {
        if key.is_empty() || key.ends_with('/') {
            return Upcoming::Skip;
        }
        let i = &self.inner;
        let small = i.reads.small_limit();
        let judge = |m: ObjMeta| {
            if m.size > small {
                Upcoming::Skip
            } else {
                Upcoming::Load(m)
            }
        };
        if let Some(inode) = i.sb.held(key, Kind::File) {
            if let Some(m) = inode.meta().0 {
                // The kernel serves this version from its page cache: loading it again
                // would only fill our cache with bytes nobody asks for.
                if inode.page_cache_holds(m.identity(), i.prefetch.page_cache_since()) {
                    return Upcoming::Held;
                }
                return judge(m);
            }
        }
        let (dir, name) = split_key(key);
        let found =
            i.sb.cached_listing(dir)
                .and_then(|l| l.find(name).and_then(|e| e.meta));
        found.map_or(Upcoming::Unknown, judge)
    }

    /// Advances `c` over `keys` (see [`advance`]) and loads what comes due.
    fn advance_keys(&self, c: &mut Cursor, at: Option<usize>, keys: &[Arc<str>]) -> u64 {
        let p = &self.inner.prefetch;
        let mut plans = Vec::new();
        let range = advance(c, at, keys.len(), p.window, p.max_files, |n| {
            let plan = self.upcoming(&keys[n]);
            plans.push(plan);
            match plan {
                Upcoming::Skip | Upcoming::Held => 0,
                Upcoming::Load(m) => m.size,
                Upcoming::Unknown => GUESSED_SIZE,
            }
        });
        let mut started = 0;
        for (n, plan) in range.into_iter().zip(plans) {
            match plan {
                Upcoming::Skip | Upcoming::Held => continue,
                Upcoming::Load(m) => self.spawn_load(keys[n].clone(), Some(m)),
                Upcoming::Unknown => self.spawn_load(keys[n].clone(), None),
            }
            started += 1;
        }
        started
    }

    /// Replaces the hint of control connection `conn`: `rels` (paths relative to the mount
    /// root) will be opened in this order. Returns how many paths it holds.
    pub fn hint(&self, conn: u64, rels: &[String]) -> usize {
        let keys: Vec<Arc<str>> = rels.iter().map(|r| Arc::from(self.key_of(r))).collect();
        let mut pos = HashMap::with_capacity(keys.len());
        for (n, k) in keys.iter().enumerate() {
            pos.entry(k.clone()).or_insert(n);
        }
        let n = keys.len();
        let order = Arc::new(Order {
            keys,
            pos,
            cursor: Mutex::new(Cursor::default()),
        });
        lock(&self.inner.prefetch.hints).insert(conn, order.clone());
        // The first files are wanted before anyone opens them.
        self.advance_order(&order, None);
        n
    }

    /// Control connection `conn` closed: its hint goes.
    pub fn end_hint(&self, conn: u64) {
        lock(&self.inner.prefetch.hints).remove(&conn);
    }

    /// Loads the files of `order` that are due once position `at` is opened.
    fn advance_order(&self, order: &Order, at: Option<usize>) {
        let mut c = lock(&order.cursor);
        self.advance_keys(&mut c, at, &order.keys);
    }

    /// Called at every open of file `key`: moves the orders it is part of.
    pub(super) fn prefetch_on_open(&self, key: &str) {
        let orders: Vec<(Arc<Order>, usize)> = lock(&self.inner.prefetch.hints)
            .values()
            .filter_map(|o| o.pos.get(key).map(|&n| (o.clone(), n)))
            .collect();
        if orders.is_empty() {
            if self.inner.prefetch.dir_order {
                self.dir_order_open(key);
            }
            return;
        }
        for (order, n) in orders {
            self.advance_order(&order, Some(n));
        }
    }

    /// Directory-order detection: `DIR_ORDER_RUN` opens in a row of neighbours in a cached
    /// listing start prefetching the files after them, as if the listing were a hint.
    fn dir_order_open(&self, key: &str) {
        let i = &self.inner;
        let (dir, name) = split_key(key);
        let Some(listing) = i.sb.cached_listing(dir) else {
            return;
        };
        let Ok(at) = listing.position(name) else {
            return;
        };
        let mut dirs = lock(&i.prefetch.dirs);
        if dirs.len() >= MAX_DIR_SCANS && !dirs.contains_key(dir) {
            dirs.clear();
        }
        let s = dirs.entry(dir.to_string()).or_default();
        let same_listing = s.listing.as_ref().is_some_and(|l| Arc::ptr_eq(l, &listing));
        let in_order = same_listing && s.cursor.read.is_some() && at == s.last + 1;
        s.last = at;
        if !in_order {
            *s = DirScan {
                last: at,
                run: 1,
                cursor: Cursor {
                    read: Some(at),
                    ..Cursor::default()
                },
                keys: None,
                listing: Some(listing),
            };
            return;
        }
        s.run += 1;
        if s.run < DIR_ORDER_RUN {
            return;
        }
        // Directories and links are not files to load: their keys stay out of the order.
        let keys = s.keys.get_or_insert_with(|| {
            listing
                .iter()
                .map(|e| match e.kind {
                    Kind::File => Arc::from(format!("{dir}{}", e.name)),
                    Kind::Dir | Kind::Symlink => Arc::from(""),
                })
                .collect()
        });
        let keys = keys.clone();
        let started = self.advance_keys(&mut s.cursor, Some(at), &keys);
        let c = i.reads.counters();
        c.bump(&c.dir_order, started);
    }

    /// Loads one small file in the background, at most `prefetch_parallel` at once.
    fn spawn_load(&self, key: Arc<str>, meta: Option<ObjMeta>) {
        let fs = self.clone();
        let slots = self.inner.prefetch.parallel.clone();
        let c = self.inner.reads.counters().clone();
        c.bump(&c.issued, 1);
        // Boxed: the load's state was 15 KB, just under the size from which tokio boxes a
        // future itself, so it was copied by value several times into each new task, on the
        // FUSE thread. A reader of small files in directory order spent about 30% more of
        // the daemon's CPU per file that way.
        tokio::spawn(Box::pin(async move {
            let Ok(_slot) = slots.acquire_owned().await else {
                return;
            };
            match fs.load_small(&key, meta).await {
                Ok(Some(Loaded::Fetched(n))) => {
                    c.bump(&c.fetched, 1);
                    c.bump(&c.bytes, n);
                }
                Ok(Some(Loaded::Present)) => c.bump(&c.present, 1),
                Ok(None) => c.bump(&c.skipped_large, 1),
                Err(()) => c.bump(&c.failed, 1),
            }
        }));
    }

    /// Loads `key` whole if it is small (`None` when it is not); metadata looked up when
    /// unknown.
    async fn load_small(&self, key: &str, meta: Option<ObjMeta>) -> Result<Option<Loaded>, ()> {
        let i = &self.inner;
        // Judged again now that its turn has come: a reader may have opened (and read, and
        // dropped from the cache) the file while the load waited for a slot.
        let meta = match (self.upcoming(key), meta) {
            (Upcoming::Held, _) => return Ok(Some(Loaded::Present)),
            (Upcoming::Skip, _) => return Ok(None),
            (Upcoming::Load(m), _) | (Upcoming::Unknown, Some(m)) => m,
            (Upcoming::Unknown, None) => self.unknown_meta(key).await?,
        };
        if meta.size > i.reads.small_limit() {
            return Ok(None);
        }
        i.reads
            .load_whole(key, &meta, || !matches!(self.upcoming(key), Upcoming::Held))
            .await
            .map(Some)
            .map_err(|_| ())
    }

    /// Metadata of upcoming file `key` that no cache holds: from a listing of its directory
    /// (one call per folder, which then answers the reader's lookups too), else the object's.
    async fn unknown_meta(&self, key: &str) -> Result<ObjMeta, ()> {
        let (dir, name) = split_key(key);
        if let Some(listing) = self.inner.sb.whole_listing(dir).await {
            return listing.find(name).and_then(|e| e.meta).ok_or(());
        }
        let i = &self.inner;
        match i.client.get_object(&i.bucket, key).await {
            Ok(m) => Ok(ObjMeta::from(&m)),
            Err(e) => {
                tracing::debug!(key, error = %e, "prefetch: no metadata");
                Err(())
            }
        }
    }

    /// Warm-up: loads the files and directory trees `rels` (relative to the mount root) into
    /// the cache, small files whole and large ones block by block, calling `progress` now and
    /// then and once at the end. Err names the first path that does not exist.
    pub async fn warm(
        &self,
        rels: &[String],
        mut progress: impl FnMut(Progress),
    ) -> Result<Progress, String> {
        let i = &self.inner;
        let mut items: Vec<(String, ObjMeta)> = Vec::new();
        for rel in rels {
            let key = self.key_of(rel);
            let prefix = if key.is_empty() || key.ends_with('/') {
                key.clone()
            } else {
                format!("{key}/")
            };
            let req = crate::gcs::ListRequest {
                prefix,
                page_size: 1000,
                ..Default::default()
            };
            let mut pages = Box::pin(i.client.list(&i.bucket, req));
            let mut found = false;
            while let Some(page) = pages.next().await {
                let page = page.map_err(|e| format!("{rel}: {e}"))?;
                for o in page.objects.iter().filter(|o| !o.name.ends_with('/')) {
                    found = true;
                    // A link's object holds its target, not data worth loading; an upload's
                    // aside object is not a file (see `names::is_visible`).
                    let aside = crate::gcs::is_aside_name(super::names::base_name(&o.name));
                    if o.symlink.is_none() && !aside {
                        items.push((o.name.clone(), ObjMeta::from(o)));
                    }
                }
            }
            if found {
                continue;
            }
            match i.client.get_object(&i.bucket, &key).await {
                Ok(m) if !key.is_empty() => items.push((key, ObjMeta::from(&m))),
                Ok(_) | Err(crate::gcs::Error::NotFound(_)) => {
                    return Err(format!("{rel}: no such file or directory in the mount"))
                }
                Err(e) => return Err(format!("{rel}: {e}")),
            }
        }
        let mut p = Progress {
            total: items.len() as u64,
            ..Progress::default()
        };
        progress(p);
        let small = i.reads.small_limit();
        let mut loads = futures::stream::iter(items)
            .map(|(key, meta)| async move {
                let r = if meta.size <= small {
                    i.reads
                        .load_whole(&key, &meta, || true)
                        .await
                        .map(|_| meta.size)
                } else {
                    i.reads.load_blocks(&key, &meta).await
                };
                r.map_err(|_| key)
            })
            .buffer_unordered(i.prefetch.parallel_n);
        let mut last = Instant::now();
        while let Some(r) = loads.next().await {
            p.done += 1;
            match r {
                Ok(n) => p.bytes += n,
                Err(key) => {
                    p.failed += 1;
                    tracing::debug!(key, "warm-up: load failed");
                }
            }
            if last.elapsed() >= PROGRESS_EVERY {
                last = Instant::now();
                progress(p);
            }
        }
        Ok(p)
    }

    /// What prefetch did since the mount.
    pub fn prefetch_stats(&self) -> PrefetchStats {
        let c = self.inner.reads.counters();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (cache_capacity, cache_bytes) = self.inner.reads.cache_bytes();
        let hinted_paths = lock(&self.inner.prefetch.hints)
            .values()
            .map(|o| o.keys.len() as u64)
            .sum();
        PrefetchStats {
            prefetch_issued: get(&c.issued),
            prefetch_fetched: get(&c.fetched),
            prefetch_bytes: get(&c.bytes),
            prefetch_used: get(&c.used),
            prefetch_evicted_unused: get(&c.evicted_unused),
            prefetch_present: get(&c.present),
            prefetch_skipped_large: get(&c.skipped_large),
            prefetch_failed: get(&c.failed),
            prefetch_dir_order: get(&c.dir_order),
            demand_bytes: get(&c.demand_bytes),
            readahead_bytes: get(&c.readahead_bytes),
            hinted_paths,
            window_bytes: self.inner.prefetch.window,
            cache_capacity,
            cache_bytes,
        }
    }
}

/// (directory key ending in `/` or empty, name) of a file key.
fn split_key(key: &str) -> (&str, &str) {
    match key.rfind('/') {
        Some(n) => (&key[..=n], &key[n + 1..]),
        None => ("", key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_bytes_issued_and_not_yet_opened() {
        let mut c = Cursor::default();
        // 10-byte files, window 35: four files ahead, from the start before any open.
        assert_eq!(advance(&mut c, None, 100, 35, 50, |_| 10), vec![0, 1, 2, 3]);
        // Opening one frees room for one more.
        assert_eq!(advance(&mut c, Some(0), 100, 35, 50, |_| 10), vec![4]);
        // Out of order (another worker's batch) frees room just the same.
        assert_eq!(advance(&mut c, Some(3), 100, 35, 50, |_| 10), vec![5]);
        // Opening a position again issues nothing.
        assert_eq!(
            advance(&mut c, Some(3), 100, 35, 50, |_| 10),
            Vec::<usize>::new()
        );
        assert_eq!(advance(&mut c, Some(1), 100, 35, 50, |_| 10), vec![6]);
    }

    #[test]
    fn a_reader_ahead_moves_the_turn_and_skipped_positions_are_given_up() {
        let mut c = Cursor::default();
        assert_eq!(advance(&mut c, None, 100, 25, 5, |_| 10), vec![0, 1, 2]);
        // A reader ahead of the prefetcher: positions 3 and 4 lose their turn.
        assert!(advance(&mut c, Some(4), 100, 25, 5, |_| 10).is_empty());
        assert_eq!(advance(&mut c, Some(0), 100, 25, 5, |_| 10), vec![5]);
        assert_eq!(advance(&mut c, Some(1), 100, 25, 5, |_| 10), vec![6]);
        // Positions 2, 5 and 6 are never opened; moving far past them frees the window.
        assert_eq!(
            advance(&mut c, Some(20), 100, 25, 5, |_| 10),
            vec![21, 22, 23]
        );
    }

    #[test]
    fn file_count_and_order_end_bound_the_window() {
        let mut c = Cursor::default();
        assert_eq!(
            advance(&mut c, None, 100, u64::MAX, 3, |_| 1),
            vec![0, 1, 2]
        );
        let mut c = Cursor::default();
        assert_eq!(
            advance(&mut c, Some(97), 100, u64::MAX, 50, |_| 1),
            vec![98, 99]
        );
        assert!(advance(&mut c, Some(99), 100, u64::MAX, 50, |_| 1).is_empty());
    }

    #[test]
    fn keys_split_into_directory_and_name() {
        assert_eq!(split_key("a/b/c.jpg"), ("a/b/", "c.jpg"));
        assert_eq!(split_key("top"), ("", "top"));
    }
}
