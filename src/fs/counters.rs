//! What the read path and the prefetcher counted since the mount: plain atomic counters,
//! read by the control socket's `stats` (see `prefetch::PrefetchStats`).

use std::sync::atomic::{AtomicU64, Ordering};

/// What prefetch and the read path did since the mount, for the control socket's `stats`.
#[derive(Debug, Default)]
pub struct Counters {
    /// Files handed to the prefetcher (hinted or directory order).
    pub issued: AtomicU64,
    /// Files loaded by the prefetcher.
    pub fetched: AtomicU64,
    /// Bytes loaded by the prefetcher.
    pub bytes: AtomicU64,
    /// Loaded files a reader then read.
    pub used: AtomicU64,
    /// Loaded files evicted before anyone read them.
    pub evicted_unused: AtomicU64,
    /// Files already cached, in flight or opened by a reader when their turn came.
    pub present: AtomicU64,
    /// Files too large to prefetch whole.
    pub skipped_large: AtomicU64,
    /// Loads that failed (the reader fetches on demand).
    pub failed: AtomicU64,
    /// Prefetches started by the directory-order detector.
    pub dir_order: AtomicU64,
    /// Bytes readers waited for (fetched on demand).
    pub demand_bytes: AtomicU64,
    /// Bytes fetched by sequential read-ahead.
    pub readahead_bytes: AtomicU64,
}

impl Counters {
    /// Adds `n` to `c`.
    pub fn bump(&self, c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}
