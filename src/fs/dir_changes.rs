//! Counts of the changes made through the mount, per directory (in stripes of directory
//! keys). A listing taken while its directory changed may lack the change, whose edit found
//! no cached listing to edit: it is cached only if its directory's count did not move.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

/// Directories whose keys fall in the same stripe share a count, which only costs a listing
/// not cached now and then.
const STRIPES: usize = 64;

/// The change counts of every directory.
#[derive(Debug)]
pub struct DirChanges {
    counts: [AtomicU64; STRIPES],
    hasher: foldhash::fast::FixedState,
}

impl Default for DirChanges {
    fn default() -> Self {
        DirChanges {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            hasher: foldhash::fast::FixedState::default(),
        }
    }
}

impl DirChanges {
    fn stripe(&self, dkey: &str) -> &AtomicU64 {
        &self.counts[self.hasher.hash_one(dkey) as usize % STRIPES]
    }

    /// The count of directory `dkey` now: read before listing it, compared after.
    pub fn count(&self, dkey: &str) -> u64 {
        self.stripe(dkey).load(Ordering::Acquire)
    }

    /// Directory `dkey` changed; called before its cached listing is edited.
    pub fn changed(&self, dkey: &str) {
        self.stripe(dkey).fetch_add(1, Ordering::Release);
    }

    /// Every directory changed (a directory renamed: every key below it moved).
    pub fn all_changed(&self) {
        for count in &self.counts {
            count.fetch_add(1, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DirChanges;

    #[test]
    fn a_change_moves_its_directory_count_and_a_rename_moves_all() {
        let c = DirChanges::default();
        let (a, b) = (c.count("a/"), c.count("b/"));
        c.changed("a/");
        assert_eq!(c.count("a/"), a + 1);
        c.all_changed();
        assert_eq!(c.count("a/"), a + 2);
        assert!(c.count("b/") > b);
    }
}
