//! Gives the memory of forgotten metadata back to the system. glibc keeps freed small
//! allocations in its heap for reuse, so after the kernel forgets a million inodes (memory
//! pressure, `drop_caches`) the daemon's resident size would not move; `malloc_trim` returns
//! the free pages. It walks the whole heap, so it runs on its own thread, once enough was
//! freed, and at most once per interval.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Metadata entries freed before a trim is worth its walk of the heap.
const FREED_BEFORE_TRIM: u64 = 16 * 1024;
/// The least time between two trims.
const TRIM_INTERVAL: Duration = Duration::from_secs(1);

/// Entries freed since the last trim, process-wide: the heap is the process's.
static FREED: AtomicU64 = AtomicU64::new(0);
/// A trim thread is running.
static TRIMMING: AtomicBool = AtomicBool::new(false);

/// `n` metadata entries (inodes, listing entries) were freed.
pub(super) fn freed(n: u64) {
    if FREED.fetch_add(n, Ordering::Relaxed) + n < FREED_BEFORE_TRIM
        || TRIMMING.swap(true, Ordering::AcqRel)
    {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("rapidfs-trim".into())
        .spawn(trim_while_freeing);
    if spawned.is_err() {
        TRIMMING.store(false, Ordering::Release);
    }
}

/// Trims, then again each interval while more was freed meanwhile: forgets come in
/// batches over seconds, and the last batch must be given back too.
fn trim_while_freeing() {
    while FREED.swap(0, Ordering::Relaxed) > 0 {
        trim_heap();
        std::thread::sleep(TRIM_INTERVAL);
    }
    TRIMMING.store(false, Ordering::Release);
}

fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap pages; it takes the allocator's own locks.
    unsafe {
        libc::malloc_trim(0);
    }
}
