//! Names removed from each directory through this mount (unlinked, removed, renamed away),
//! with when, for a while. A directory handle reads on past offset 0 from the listing it
//! took at offset 0; a name removed since must not get an inode from it again, which the
//! kernel would keep, and show, for the entry TTL. Checking against a record of removals
//! costs no listing call, whatever the directory's size and whether its listing is cached.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a removal is remembered: longer than any one directory read takes.
const KEEP: Duration = Duration::from_secs(600);

/// The most removals remembered per directory; past it the oldest is forgotten (a handle
/// that has read for that long through that many removals may list one of them again).
const MOST_PER_DIR: usize = 4096;

/// Every this many removals, directories whose removals are all older than `KEEP` are
/// forgotten, so that the record stays as small as the recent removals.
const PRUNE_EVERY: u64 = 1024;

/// The recent removals of every directory, by directory key.
#[derive(Debug, Default)]
pub struct RemovedNames {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    dirs: HashMap<String, HashMap<String, Instant>>,
    removals: u64,
}

impl RemovedNames {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        super::lock(&self.inner)
    }

    /// Name `name` of directory `dkey` is gone as of now. Called once the cached listing no
    /// longer holds it, so that a handle that found it there took its listing earlier.
    pub fn removed(&self, dkey: &str, name: &str) {
        let now = Instant::now();
        let mut inner = self.inner();
        inner.removals += 1;
        if inner.removals.is_multiple_of(PRUNE_EVERY) {
            inner.dirs.retain(|_, names| {
                names.retain(|_, at| now.duration_since(*at) < KEEP);
                !names.is_empty()
            });
        }
        let names = inner.dirs.entry(dkey.to_string()).or_default();
        if names.len() >= MOST_PER_DIR {
            names.retain(|_, at| now.duration_since(*at) < KEEP);
        }
        if names.len() >= MOST_PER_DIR {
            let oldest = names
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(n, _)| n.clone());
            if let Some(oldest) = oldest {
                names.remove(&oldest);
            }
        }
        names.insert(name.to_string(), now);
    }

    /// Name `name` of directory `dkey` exists again (created, or renamed onto).
    pub fn exists(&self, dkey: &str, name: &str) {
        let mut inner = self.inner();
        if let Some(names) = inner.dirs.get_mut(dkey) {
            names.remove(name);
            if names.is_empty() {
                inner.dirs.remove(dkey);
            }
        }
    }

    /// The names of directory `dkey` removed at `since` or later (and not back since).
    pub fn since(&self, dkey: &str, since: Instant) -> HashSet<String> {
        self.inner()
            .dirs
            .get(dkey)
            .map_or_else(HashSet::new, |names| {
                names
                    .iter()
                    .filter(|(_, at)| **at >= since)
                    .map(|(n, _)| n.clone())
                    .collect()
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removal_counts_for_handles_that_began_before_it_until_the_name_is_back() {
        let r = RemovedNames::default();
        let before = Instant::now();
        r.removed("d/", "a");
        let after = Instant::now() + Duration::from_millis(1);
        assert_eq!(r.since("d/", before), HashSet::from(["a".to_string()]));
        assert!(r.since("d/", after).is_empty());
        assert!(r.since("e/", before).is_empty());
        r.exists("d/", "a");
        assert!(r.since("d/", before).is_empty());
    }

    #[test]
    fn a_directory_keeps_at_most_its_newest_removals() {
        let r = RemovedNames::default();
        let start = Instant::now();
        for i in 0..MOST_PER_DIR + 10 {
            r.removed("d/", &format!("n{i}"));
        }
        let kept = r.since("d/", start);
        assert_eq!(kept.len(), MOST_PER_DIR);
        assert!(kept.contains(&format!("n{}", MOST_PER_DIR + 9)));
    }
}
