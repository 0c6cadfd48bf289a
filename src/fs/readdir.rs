//! Directory handles: `opendir`, `readdir` and `readdirplus` over the listing a handle
//! takes at its first read from offset 0 (so a directory read in several calls sees one
//! consistent listing; the handle table keeps it), and `releasedir`.

use super::dir::Listing;
use super::error::{Errno, FsResult};
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
    async fn dir_listing(&self, fh: u64, offset: u64) -> FsResult<(u64, Arc<Listing>)> {
        let (ino, kept) = self.inner.handles.dir(fh).ok_or(Errno::EBADF)?;
        if let (Some(l), true) = (kept, offset > 0) {
            return Ok((ino, l));
        }
        let listing = self.inner.sb.listing(ino).await?;
        self.inner.handles.set_dir_listing(fh, listing.clone());
        Ok((ino, listing))
    }

    /// Entries of directory handle `fh` after `offset`: `.`, `..`, then the listing.
    pub async fn readdir(
        &self,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(&DirItem) -> bool,
    ) -> FsResult<()> {
        let (ino, listing) = self.dir_listing(fh, offset).await?;
        let dir = self.dir_inode(ino)?;
        for item in dots(ino, offset) {
            if add(&item) {
                return Ok(());
            }
        }
        let dir_key = dir.key();
        let skip = offset.saturating_sub(2) as usize;
        for (n, e) in listing.entries.iter().enumerate().skip(skip) {
            let key = match e.kind {
                Kind::Dir => names::dir_key(&dir_key, &e.name),
                Kind::File | Kind::Symlink => names::file_key(&dir_key, &e.name),
            };
            let item = DirItem {
                ino: self.inner.sb.ino_of(&key, e.kind),
                offset: n as u64 + 3,
                kind: e.kind,
                name: &e.name,
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
        mut add: impl FnMut(&DirItem, &Entry) -> bool,
    ) -> FsResult<()> {
        let (ino, listing) = self.dir_listing(fh, offset).await?;
        let dir = self.dir_inode(ino)?;
        for item in dots(ino, offset) {
            // The kernel takes no lookup on `.` and `..`.
            if add(&item, &self.entry(&dir)) {
                return Ok(());
            }
        }
        let dir_key = dir.key();
        let skip = offset.saturating_sub(2) as usize;
        for (n, e) in listing.entries.iter().enumerate().skip(skip) {
            let inode = self.inner.sb.found_listed(&dir_key, e);
            let item = DirItem {
                ino: inode.ino,
                offset: n as u64 + 3,
                kind: e.kind,
                name: &e.name,
            };
            if add(&item, &self.entry(&inode)) {
                self.inner.sb.forget(inode.ino, 1);
                return Ok(());
            }
        }
        Ok(())
    }
}
