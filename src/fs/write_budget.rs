//! The write share of the one memory budget: how the budget splits between reads and
//! writes, and the permits (of 1 KiB) a writer holds for its unpersisted bytes.

use crate::config::{CacheConfig, WriteConfig};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The write budget is counted in units of this many bytes (semaphore permits).
pub(super) const PERMIT_BYTES: u64 = 1024;

/// Permits of the write budget held by one writer; given back when dropped.
pub(super) struct Held {
    pub(super) budget: Arc<Semaphore>,
    pub(super) permits: u32,
}

impl Held {
    /// Keeps just enough permits for `unpersisted` bytes.
    pub(super) fn settle(&mut self, unpersisted: u64) {
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

/// The permits that stand for `bytes`.
pub(super) fn permits_for(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(PERMIT_BYTES)).unwrap_or(u32::MAX)
}

/// The write share of the memory budget in bytes, and the read path's configuration with
/// what remains.
pub fn split_budget(cache: &CacheConfig, write: &WriteConfig) -> (u64, CacheConfig) {
    let total = cache.budget_mb().max(16);
    let write_mb = (total * write.memory_percent.min(90) / 100).max(4);
    let read = CacheConfig {
        memory_mb: total.saturating_sub(write_mb).max(8),
    };
    (write_mb * 1024 * 1024, read)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_split_between_reads_and_writes() {
        let (w, r) = split_budget(
            &CacheConfig { memory_mb: 128 },
            &WriteConfig {
                memory_percent: 25,
                ..WriteConfig::default()
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
