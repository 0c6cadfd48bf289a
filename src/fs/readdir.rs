//! Directory handles: `opendir`, `readdir` and `readdirplus` over the listing a handle
//! takes at its first read from offset 0 (so a directory read in several calls sees one
//! consistent listing; the handle table keeps it), and `releasedir`.

use super::error::{Errno, FsResult};
use super::handles::KeptListing;
use super::listing::Listing;
use super::{names, Entry, Fs, Kind};
use std::collections::HashSet;
use std::time::Instant;

/// One entry of a directory read, borrowing its name from the listing.
#[derive(Debug, Clone, PartialEq)]
pub struct DirItem<'a> {
    /// Inode number.
    pub ino: u64,
    /// Offset of the next entry (what the kernel passes back to continue).
    pub offset: u64,
    /// File, directory or symbolic link.
    pub kind: Kind,
    /// The name.
    pub name: &'a str,
}

/// The entries `.` and `..` of directory `ino` (both its own inode: the kernel fills in the
/// parent) from `offset` on; the listing's entries follow at offset 3.
fn dots(ino: u64, offset: u64) -> impl Iterator<Item = DirItem<'static>> {
    [".", ".."]
        .into_iter()
        .enumerate()
        .filter(move |(n, _)| offset <= *n as u64)
        .map(move |(n, name)| DirItem {
            ino,
            offset: n as u64 + 1,
            kind: Kind::Dir,
            name,
        })
}

impl Fs {
    /// Opens directory `ino` for reading.
    pub fn opendir(&self, ino: u64) -> FsResult<u64> {
        self.dir_inode(ino)?;
        Ok(self.inner.handles.add_dir(ino))
    }

    /// Closes directory handle `fh`.
    pub fn releasedir(&self, fh: u64) {
        self.inner.handles.remove_dir(fh);
    }

    /// The listing directory handle `fh` reads: taken at offset 0, kept for later offsets.
    async fn dir_listing(&self, fh: u64, offset: u64) -> FsResult<(u64, KeptListing)> {
        if let Some(found) = self.dir_listing_at_hand(fh, offset)? {
            return Ok(found);
        }
        let (ino, _) = self.inner.handles.dir(fh).ok_or(Errno::EBADF)?;
        let taken_at = Instant::now();
        let kept = KeptListing {
            listing: self.inner.sb.listing(ino).await?,
            taken_at,
        };
        self.inner.handles.set_dir_listing(fh, kept.clone());
        Ok((ino, kept))
    }

    /// `dir_listing` as far as it needs no call: the handle's kept listing past offset 0, or
    /// at offset 0 the directory's cached one. `None`: it must be listed.
    fn dir_listing_at_hand(&self, fh: u64, offset: u64) -> FsResult<Option<(u64, KeptListing)>> {
        let (ino, kept) = self.inner.handles.dir(fh).ok_or(Errno::EBADF)?;
        if let (Some(k), true) = (kept, offset > 0) {
            return Ok(Some((ino, k)));
        }
        let dkey = self.dir_inode(ino)?.key();
        // Read before the listing is: a name the listing still holds was removed later.
        let taken_at = Instant::now();
        let Some(listing) = self.inner.sb.cached_listing(&dkey) else {
            return Ok(None);
        };
        let kept = KeptListing { listing, taken_at };
        self.inner.handles.set_dir_listing(fh, kept.clone());
        Ok(Some((ino, kept)))
    }

    /// Entries of directory handle `fh` after `offset`: `.`, `..`, then the listing.
    pub async fn readdir(
        &self,
        fh: u64,
        offset: u64,
        add: impl FnMut(&DirItem) -> bool,
    ) -> FsResult<()> {
        let (ino, kept) = self.dir_listing(fh, offset).await?;
        self.fill_readdir(ino, &kept.listing, offset, add)
    }

    /// `readdir` when the listing is at hand (see `dir_listing_at_hand`): what the FUSE thread
    /// answers at once, without waking a runtime worker for every page of a large directory.
    /// `None`: ask `readdir`; nothing was added then.
    pub fn readdir_at_hand(
        &self,
        fh: u64,
        offset: u64,
        add: impl FnMut(&DirItem) -> bool,
    ) -> Option<FsResult<()>> {
        self.with_listing_at_hand(fh, offset, |ino, k| {
            self.fill_readdir(ino, &k.listing, offset, add)
        })
    }

    /// `fill` over the listing at hand, if any (see `dir_listing_at_hand`).
    fn with_listing_at_hand(
        &self,
        fh: u64,
        offset: u64,
        fill: impl FnOnce(u64, &KeptListing) -> FsResult<()>,
    ) -> Option<FsResult<()>> {
        match self.dir_listing_at_hand(fh, offset) {
            Ok(Some((ino, kept))) => Some(fill(ino, &kept)),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }

    fn fill_readdir(
        &self,
        ino: u64,
        listing: &Listing,
        offset: u64,
        mut add: impl FnMut(&DirItem) -> bool,
    ) -> FsResult<()> {
        let dir = self.dir_inode(ino)?;
        for item in dots(ino, offset) {
            if add(&item) {
                return Ok(());
            }
        }
        let dir_key = dir.key();
        let skip = offset.saturating_sub(2) as usize;
        for (n, e) in (skip..).zip(listing.iter_from(skip)) {
            let key = match e.kind {
                Kind::Dir => names::dir_key(&dir_key, e.name),
                Kind::File | Kind::Symlink => names::file_key(&dir_key, e.name),
            };
            let item = DirItem {
                ino: self.inner.sb.ino_of(&key, e.kind),
                offset: n as u64 + 3,
                kind: e.kind,
                name: e.name,
            };
            if add(&item) {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Entries with attributes of directory handle `fh` after `offset`, handed to `add` until
    /// it reports its buffer full (returns true); each entry it accepts counts one lookup.
    pub async fn readdirplus(
        &self,
        fh: u64,
        offset: u64,
        add: impl FnMut(&DirItem, &Entry) -> bool,
    ) -> FsResult<()> {
        let (ino, kept) = self.dir_listing(fh, offset).await?;
        self.fill_readdirplus(ino, &kept, offset, add)
    }

    /// `readdirplus` when the listing is at hand, as `readdir_at_hand`.
    pub fn readdirplus_at_hand(
        &self,
        fh: u64,
        offset: u64,
        add: impl FnMut(&DirItem, &Entry) -> bool,
    ) -> Option<FsResult<()>> {
        self.with_listing_at_hand(fh, offset, |ino, kept| {
            self.fill_readdirplus(ino, kept, offset, add)
        })
    }

    /// The entries of the kept listing from `offset` on, but for names removed through this
    /// mount since the handle took it: the kernel would keep the inode of such a name, and
    /// show the name, for the entry TTL. (At offset 0 the listing was just taken.)
    fn fill_readdirplus(
        &self,
        ino: u64,
        kept: &KeptListing,
        offset: u64,
        mut add: impl FnMut(&DirItem, &Entry) -> bool,
    ) -> FsResult<()> {
        let listing = &kept.listing;
        let dir = self.dir_inode(ino)?;
        for item in dots(ino, offset) {
            // The kernel takes no lookup on `.` and `..`.
            if add(&item, &self.entry(&dir)) {
                return Ok(());
            }
        }
        let dir_key = dir.key();
        let removed = if offset > 0 {
            self.inner.sb.names_removed_since(&dir_key, kept.taken_at)
        } else {
            HashSet::new()
        };
        let skip = offset.saturating_sub(2) as usize;
        for (n, e) in (skip..).zip(listing.iter_from(skip)) {
            if removed.contains(e.name) {
                continue;
            }
            let inode = self.inner.sb.found_listed(&dir_key, e, listing.listed_at);
            let item = DirItem {
                ino: inode.ino,
                offset: n as u64 + 3,
                kind: e.kind,
                name: e.name,
            };
            if add(&item, &self.entry(&inode)) {
                self.inner.sb.forget(inode.ino, 1);
                return Ok(());
            }
        }
        Ok(())
    }
}
