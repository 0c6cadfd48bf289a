//! The metadata warm-up at mount (`fs.prefetch_metadata`): lists every directory under the
//! mounted prefix into the listing cache, several at once (a large directory is itself
//! listed over split key ranges), so that the first `os.walk`, `glob` or epoch of lookups is
//! answered from memory. It runs beside the mount, which serves requests all the while; it
//! stops short of `fs.metadata_cache_mb`, logs its progress, and a failed directory is
//! logged and skipped (it is listed on demand later).

use super::Fs;
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// How often the warm-up logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// What a warm-up did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct WarmUp {
    /// Directories listed into the cache.
    pub directories: u64,
    /// Entries (files and subdirectories) those listings hold.
    pub entries: u64,
    /// Directories that could not be listed.
    pub failed: u64,
    /// Stopped early: the listing cache reached its cap.
    pub capped: bool,
}

impl Fs {
    /// Lists the mounted tree into the listing cache, `fs.parallel_list_workers` directories
    /// at a time, and logs `metadata warm-up done` with what it did.
    pub async fn warm_metadata(&self) -> WarmUp {
        let sb = &self.inner.sb;
        let workers = sb.list_workers();
        let t0 = Instant::now();
        let mut last_log = t0;
        let mut done = WarmUp::default();
        let mut queue = VecDeque::from([sb.root_key.clone()]);
        let mut running = JoinSet::new();
        tracing::info!(prefix = %sb.root_key, "metadata warm-up started");
        while !queue.is_empty() || !running.is_empty() {
            while running.len() < workers && !done.capped {
                let Some(dkey) = queue.pop_front() else { break };
                let fs = self.clone();
                running.spawn(async move { fs.inner.sb.warm_listing(&dkey).await });
            }
            let Some(joined) = running.join_next().await else {
                break;
            };
            match joined {
                Ok(Ok(Some((subdirs, entries)))) => {
                    done.directories += 1;
                    done.entries += entries;
                    queue.extend(subdirs);
                }
                Ok(Ok(None)) => {
                    done.capped = true;
                    queue.clear();
                }
                Ok(Err(_)) | Err(_) => done.failed += 1,
            }
            if last_log.elapsed() >= PROGRESS_EVERY {
                last_log = Instant::now();
                tracing::info!(
                    directories = done.directories,
                    entries = done.entries,
                    queued = queue.len(),
                    "metadata warm-up in progress"
                );
            }
        }
        tracing::info!(
            directories = done.directories,
            entries = done.entries,
            failed = done.failed,
            capped = done.capped,
            secs = format!("{:.2}", t0.elapsed().as_secs_f64()),
            "metadata warm-up done"
        );
        done
    }
}
