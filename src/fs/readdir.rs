//! Directory handles: `opendir`, `readdir` and `readdirplus` over the listing a handle
//! takes at its first read from offset 0 (so a directory read in several calls sees one
//! consistent listing; the handle table keeps it), and `releasedir`.

use super::error::{Errno, FsResult};
use super::handles::KeptListing;
use super::listing::Listing;
use super::{names, Entry, Fs, Kind};
use std::sync::Arc;

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
        let changes = self.inner.sb.dir_change_count(&self.dir_inode(ino)?.key());
        let kept = KeptListing {
            listing: self.inner.sb.listing(ino).await?,
            changes,
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
        let changes = self.inner.sb.dir_change_count(&dkey);
        let Some(listing) = self.inner.sb.cached_listing(&dkey) else {
            return Ok(None);
        };
        let kept = KeptListing { listing, changes };
        self.inner.handles.set_dir_listing(fh, kept.clone());
        Ok(Some((ino, kept)))
    }

    /// What a kept listing past offset 0 must be checked against: the directory's cached
    /// listing where it is newer, or, where none is cached but the directory changed through
    /// this mount since, a new listing (`Err(())`: that takes a call). Names the kept listing
    /// holds and the newer one lacks were unlinked or renamed away since, and must not get an
    /// inode again: the kernel would keep it for the entry TTL.
    fn newer_listing_at_hand(
        &self,
        dkey: &str,
        kept: &KeptListing,
        offset: u64,
    ) -> Result<Option<Arc<Listing>>, ()> {
        if offset == 0 {
            return Ok(None);
        }
        if let Some(current) = self.inner.sb.cached_listing(dkey) {
            return Ok((!Arc::ptr_eq(&current, &kept.listing)).then_some(current));
        }
        if self.inner.sb.dir_change_count(dkey) == kept.changes {
            return Ok(None);
        }
        Err(())
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
            Some(self.fill_readdir(ino, &k.listing, offset, add))
        })
    }

    /// `fill` over the listing at hand, if any (see `dir_listing_at_hand`).
    fn with_listing_at_hand(
        &self,
        fh: u64,
        offset: u64,
        fill: impl FnOnce(u64, &KeptListing) -> Option<FsResult<()>>,
    ) -> Option<FsResult<()>> {
        match self.dir_listing_at_hand(fh, offset) {
            Ok(Some((ino, kept))) => fill(ino, &kept),
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
        let dir = self.dir_inode(ino)?;
        let newer = match self.newer_listing_at_hand(&dir.key(), &kept, offset) {
            Ok(newer) => newer,
            Err(()) => Some(self.inner.sb.listing(ino).await?),
        };
        self.fill_readdirplus(ino, &kept.listing, newer.as_deref(), offset, add)
    }

    /// `readdirplus` when the listing is at hand, as `readdir_at_hand`.
    pub fn readdirplus_at_hand(
        &self,
        fh: u64,
        offset: u64,
        add: impl FnMut(&DirItem, &Entry) -> bool,
    ) -> Option<FsResult<()>> {
        self.with_listing_at_hand(fh, offset, |ino, kept| {
            let dkey = match self.dir_inode(ino) {
                Ok(dir) => dir.key(),
                Err(e) => return Some(Err(e)),
            };
            let newer = self.newer_listing_at_hand(&dkey, kept, offset).ok()?;
            Some(self.fill_readdirplus(ino, &kept.listing, newer.as_deref(), offset, add))
        })
    }

    /// The entries of `listing` from `offset` on, but for names `newer` (see
    /// `newer_listing_at_hand`) no longer holds.
    fn fill_readdirplus(
        &self,
        ino: u64,
        listing: &Listing,
        newer: Option<&Listing>,
        offset: u64,
        mut add: impl FnMut(&DirItem, &Entry) -> bool,
    ) -> FsResult<()> {
        let dir = self.dir_inode(ino)?;
        for item in dots(ino, offset) {
            // The kernel takes no lookup on `.` and `..`.
            if add(&item, &self.entry(&dir)) {
                return Ok(());
            }
        }
        let dir_key = dir.key();
        let skip = offset.saturating_sub(2) as usize;
        for (n, e) in (skip..).zip(listing.iter_from(skip)) {
            if newer.is_some_and(|l| l.find(e.name).is_none()) {
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
