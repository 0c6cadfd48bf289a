//! Sequential-read detection for one open handle, and the read-ahead window it earns.
//!
//! The kernel sends a sequential reader's requests (its own read-ahead, 1 MiB each) several at
//! a time, so they may arrive slightly out of order: a read counts as sequential when it is
//! large and starts near the furthest end read so far. Each sequential read doubles the
//! window, from the initial size up to the cap; a random read resets it. Small random reads
//! (what `pread` of 4 KiB through the page cache becomes) never trigger read-ahead.

/// Reads smaller than this are never taken as part of a sequential scan.
const MIN_SEQUENTIAL_READ: u64 = 64 * 1024;
/// How far behind the furthest end a read may start and still count as sequential: the
/// kernel may have this much of its own read-ahead in flight, reordered.
const REORDER_SLACK: u64 = 16 * 1024 * 1024;

/// What to do for one read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Fetch only the bytes asked for.
    Random,
    /// Part of a scan: fetch whole blocks, and also the range `prefetch` ahead, if any.
    Sequential {
        /// Bytes `[start, end)` to fetch ahead of the reader.
        prefetch: Option<(u64, u64)>,
    },
}

/// Per-handle scan state.
#[derive(Debug)]
pub struct Sequential {
    max_end: u64,
    window: u64,
    prefetched_to: u64,
    initial: u64,
    max: u64,
}

impl Sequential {
    /// A fresh handle; windows in bytes.
    pub fn new(initial: u64, max: u64) -> Self {
        let initial = initial.max(1);
        Sequential {
            max_end: 0,
            window: initial,
            prefetched_to: 0,
            initial,
            max: max.max(initial),
        }
    }

    /// Classifies the read `[offset, offset + len)` and updates the window.
    pub fn observe(&mut self, offset: u64, len: u64) -> Plan {
        let end = offset.saturating_add(len);
        let near = offset.saturating_add(REORDER_SLACK) >= self.max_end
            && offset <= self.max_end.saturating_add(len);
        if len < MIN_SEQUENTIAL_READ || !near {
            self.window = self.initial;
            self.max_end = end;
            self.prefetched_to = end;
            return Plan::Random;
        }
        self.max_end = self.max_end.max(end);
        let from = self.prefetched_to.max(self.max_end);
        let target = self.max_end.saturating_add(self.window);
        self.window = self.window.saturating_mul(2).min(self.max);
        if target > from {
            self.prefetched_to = target;
            Plan::Sequential {
                prefetch: Some((from, target)),
            }
        } else {
            Plan::Sequential { prefetch: None }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn a_scan_ramps_up_to_the_cap() {
        let mut s = Sequential::new(MIB, 8 * MIB);
        assert_eq!(
            s.observe(0, MIB),
            Plan::Sequential {
                prefetch: Some((MIB, 2 * MIB))
            }
        );
        assert_eq!(
            s.observe(MIB, MIB),
            Plan::Sequential {
                prefetch: Some((2 * MIB, 4 * MIB))
            }
        );
        assert_eq!(
            s.observe(2 * MIB, MIB),
            Plan::Sequential {
                prefetch: Some((4 * MIB, 7 * MIB))
            }
        );
        let mut last = 0;
        for i in 3..20 {
            if let Plan::Sequential {
                prefetch: Some((_, to)),
            } = s.observe(i * MIB, MIB)
            {
                assert!(to - (i + 1) * MIB <= 8 * MIB, "window capped");
                last = to;
            }
        }
        assert!(last >= 20 * MIB);
    }

    #[test]
    fn reordered_requests_stay_sequential() {
        let mut s = Sequential::new(MIB, 8 * MIB);
        s.observe(0, MIB);
        s.observe(2 * MIB, MIB);
        assert!(matches!(s.observe(MIB, MIB), Plan::Sequential { .. }));
    }

    #[test]
    fn small_or_far_reads_are_random() {
        let mut s = Sequential::new(MIB, 8 * MIB);
        assert_eq!(s.observe(0, 4096), Plan::Random);
        assert_eq!(s.observe(100 * MIB, MIB), Plan::Random);
        assert_eq!(s.observe(5 * MIB, 4096), Plan::Random);
        assert!(matches!(
            s.observe(5 * MIB + 4096, MIB),
            Plan::Sequential { .. }
        ));
    }
}
