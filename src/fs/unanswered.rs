//! Files created through this mount whose create the service may not have seen yet: a
//! create without O_EXCL goes out with the file's first bytes or flush, without waiting for
//! its answer (see `Fs::create`), so a listing asked for before then, or while it is on its
//! way, comes back without the file. Every listing fetched is completed with the files that
//! were pending when it was asked for and that it lacks, as long as their name still leads
//! to them. Their lookups and attributes are answered here, not asked of the service, which
//! would not find them. What must find them at the service (a rename onto one, an unlink,
//! the fsync, removal or rename of their directory) waits for their answers first. A file
//! counts as pending from its create to the first release of a handle writing it, by which
//! time its create has been answered (or has failed, and the file is gone with its writer).
//!
//! Touches only the inodes it is given and the listings it is handed.

use super::dir::ListedEntry;
use super::inode::{Inode, Kind};
use super::listing::Listing;
use super::{lock, names};
use std::collections::HashMap;
use std::sync::Mutex;

/// The pending files by inode number, each with the directory it was created in.
#[derive(Default)]
pub struct Unanswered {
    files: Mutex<HashMap<u64, (String, Inode)>>,
}

impl Unanswered {
    /// File `inode` was just created, its create not yet answered.
    pub fn add(&self, inode: &Inode) {
        let dkey = names::parent_dir(&inode.key()).to_string();
        lock(&self.files).insert(inode.ino, (dkey, inode.clone()));
    }

    /// A handle writing `inode` was released: its create is answered by now, if it ever is.
    pub fn remove(&self, inode: &Inode) {
        let mut files = lock(&self.files);
        if !files.is_empty() {
            files.remove(&inode.ino);
        }
    }

    /// Whether file `ino` is pending: the service may not know it, so only this mount does.
    pub fn holds(&self, ino: u64) -> bool {
        lock(&self.files).contains_key(&ino)
    }

    /// The files pending in directory `dkey` now: taken before its listing is asked for.
    pub fn in_dir(&self, dkey: &str) -> Vec<Inode> {
        self.matching(|d| d == dkey)
    }

    /// The files pending in directory `dkey` or below it (every one for the root, "").
    pub fn under(&self, dkey: &str) -> Vec<Inode> {
        self.matching(|d| d.starts_with(dkey))
    }

    fn matching(&self, dir: impl Fn(&str) -> bool) -> Vec<Inode> {
        let files = lock(&self.files);
        if files.is_empty() {
            return Vec::new();
        }
        files
            .values()
            .filter(|(d, _)| dir(d))
            .map(|(_, inode)| inode.clone())
            .collect()
    }
}

/// `listing` of directory `dkey` with each of `pending` (see `Unanswered::in_dir`) that it
/// lacks, still in that directory and still the file its name leads to (`named`): not
/// unlinked, renamed away or replaced since.
pub fn complete(
    listing: Listing,
    dkey: &str,
    pending: &[Inode],
    named: impl Fn(&str, &Inode) -> bool,
) -> Listing {
    let mut listing = listing;
    for inode in pending {
        let key = inode.key();
        if names::parent_dir(&key) != dkey || !named(&key, inode) {
            continue;
        }
        let name = names::base_name(&key);
        if listing.find(name).is_some() {
            continue;
        }
        let Some(meta) = inode.meta().0 else {
            continue;
        };
        listing = listing.with(&ListedEntry {
            name: name.to_string(),
            kind: Kind::File,
            meta: Some(meta),
            target: None,
        });
    }
    listing
}
