//! The one table of open handles, shared by the read and write paths: a file handle's read
//! side (pinned to the version it opened), the rewrite it reads when it opened during one,
//! and, when it writes, the writer it shares with the other writing handles of its inode; a
//! directory handle's cursor (the listing it reads).

use super::inode::Inode;
use super::listing::Listing;
use super::lock;
use super::read::Handle as ReadSide;
use super::write::FileWriter;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// What a handle number stands for.
enum Open {
    File {
        inode: Inode,
        read: Arc<ReadSide>,
        writer: Option<Arc<FileWriter>>,
        /// A reading handle opened while its file was being rewritten: the writer whose
        /// staged copy it reads, for as long as there is one.
        rewrite: Option<Arc<FileWriter>>,
        /// The process (thread id) that opened it, when the kernel said.
        opener: Option<u32>,
        /// The opener closed its descriptor and has not written since: what is written
        /// through the handle now comes from a process it passed the descriptor to.
        opener_closed: bool,
    },
    Dir {
        ino: u64,
        listing: Option<KeptListing>,
    },
}

/// The listing a directory handle reads past offset 0, and when the handle set out to take
/// it: names removed through this mount since (`RemovedNames`) may still be in it.
#[derive(Clone)]
pub(super) struct KeptListing {
    pub listing: Arc<Listing>,
    pub taken_at: Instant,
}

/// What a file handle reads through.
pub(super) struct FileSides {
    /// The file's inode.
    pub inode: Inode,
    /// Its read side, pinned to a version.
    pub read: Arc<ReadSide>,
    /// Its writer, when it writes.
    pub writer: Option<Arc<FileWriter>>,
    /// The rewrite it reads, when it opened during one.
    pub rewrite: Option<Arc<FileWriter>>,
}

/// Every open handle of the mount.
pub(super) struct Handles {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Open>>,
}

impl Handles {
    /// No handle open yet; numbers start at 1.
    pub(super) fn new() -> Handles {
        Handles {
            next: AtomicU64::new(1),
            open: Mutex::new(HashMap::new()),
        }
    }

    fn table(&self) -> MutexGuard<'_, HashMap<u64, Open>> {
        lock(&self.open)
    }

    fn add(&self, open: Open) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        self.table().insert(fh, open);
        fh
    }

    /// Opens a file handle of `inode` reading through `read`; returns its number.
    pub(super) fn add_file(&self, inode: Inode, read: Arc<ReadSide>) -> u64 {
        self.add(Open::File {
            inode,
            read,
            writer: None,
            rewrite: None,
            opener: None,
            opener_closed: false,
        })
    }

    /// Opens a directory handle of `ino`; returns its number.
    pub(super) fn add_dir(&self, ino: u64) -> u64 {
        self.add(Open::Dir { ino, listing: None })
    }

    /// Gives file handle `fh` a new read side; returns the one it replaces.
    pub(super) fn replace_read_side(&self, fh: u64, new: Arc<ReadSide>) -> Option<Arc<ReadSide>> {
        match self.table().get_mut(&fh) {
            Some(Open::File { read, .. }) => Some(std::mem::replace(read, new)),
            _ => None,
        }
    }

    /// Gives file handle `fh` the read side `new` if it still reads through `seen`: `Ok` with
    /// the one replaced. `Err` with the one it reads through now when another change (a
    /// rename's) replaced `seen` meanwhile, which wins.
    pub(super) fn swap_read_side(
        &self,
        fh: u64,
        seen: &Arc<ReadSide>,
        new: Arc<ReadSide>,
    ) -> Result<Arc<ReadSide>, Option<Arc<ReadSide>>> {
        match self.table().get_mut(&fh) {
            Some(Open::File { read, .. }) if Arc::ptr_eq(read, seen) => {
                Ok(std::mem::replace(read, new))
            }
            Some(Open::File { read, .. }) => Err(Some(read.clone())),
            _ => Err(None),
        }
    }

    /// Gives every file handle whose read side `moved` maps to a new one that new read
    /// side; returns the read sides replaced.
    pub(super) fn repoint_reads(
        &self,
        moved: impl Fn(&ReadSide) -> Option<Arc<ReadSide>>,
    ) -> Vec<Arc<ReadSide>> {
        let mut replaced = Vec::new();
        for open in self.table().values_mut() {
            if let Open::File { read, .. } = open {
                if let Some(new) = moved(read) {
                    replaced.push(std::mem::replace(read, new));
                }
            }
        }
        replaced
    }

    /// The writer of file handle `fh`, when it writes.
    pub(super) fn writer(&self, fh: u64) -> Option<Arc<FileWriter>> {
        match self.table().get(&fh) {
            Some(Open::File { writer, .. }) => writer.clone(),
            _ => None,
        }
    }

    /// File handle `fh` writes through `w`.
    pub(super) fn set_writer(&self, fh: u64, w: Arc<FileWriter>) {
        if let Some(Open::File { writer, .. }) = self.table().get_mut(&fh) {
            *writer = Some(w);
        }
    }

    /// Everything file handle `fh` reads through, in one look at the table (a read needs
    /// it all).
    pub(super) fn file(&self, fh: u64) -> Option<FileSides> {
        match self.table().get(&fh) {
            Some(Open::File {
                inode,
                read,
                writer,
                rewrite,
                ..
            }) => Some(FileSides {
                inode: inode.clone(),
                read: read.clone(),
                writer: writer.clone(),
                rewrite: rewrite.clone(),
            }),
            _ => None,
        }
    }

    /// Reading handle `fh` reads the staged copy of `w` (`Some`), or its own version (`None`).
    pub(super) fn set_rewrite(&self, fh: u64, w: Option<Arc<FileWriter>>) {
        if let Some(Open::File { rewrite, .. }) = self.table().get_mut(&fh) {
            *rewrite = w;
        }
    }

    /// File handle `fh` was opened by process (thread) `pid`.
    pub(super) fn set_opener(&self, fh: u64, pid: u32) {
        if let Some(Open::File { opener, .. }) = self.table().get_mut(&fh) {
            *opener = Some(pid);
        }
    }

    /// Notes whether the opener of file handle `fh` has closed its descriptor (see
    /// `Open::File::opener_closed`).
    pub(super) fn set_opener_closed(&self, fh: u64, closed: bool) {
        if let Some(Open::File { opener_closed, .. }) = self.table().get_mut(&fh) {
            *opener_closed = closed;
        }
    }

    /// Whether the opener of file handle `fh` has closed its descriptor and not written since.
    pub(super) fn opener_closed(&self, fh: u64) -> bool {
        matches!(
            self.table().get(&fh),
            Some(Open::File {
                opener_closed: true,
                ..
            })
        )
    }

    /// The process (thread) that opened file handle `fh`, when known.
    pub(super) fn opener(&self, fh: u64) -> Option<u32> {
        match self.table().get(&fh) {
            Some(Open::File { opener, .. }) => *opener,
            _ => None,
        }
    }

    /// Closes file handle `fh`: its read side, and its writer when it wrote.
    pub(super) fn remove_file(&self, fh: u64) -> Option<(Arc<ReadSide>, Option<Arc<FileWriter>>)> {
        let mut table = self.table();
        match table.get(&fh) {
            Some(Open::File { .. }) => match table.remove(&fh) {
                Some(Open::File { read, writer, .. }) => Some((read, writer)),
                _ => None,
            },
            _ => None,
        }
    }

    /// The directory handle `fh`'s inode and the listing it took, if any yet.
    pub(super) fn dir(&self, fh: u64) -> Option<(u64, Option<KeptListing>)> {
        match self.table().get(&fh) {
            Some(Open::Dir { ino, listing }) => Some((*ino, listing.clone())),
            _ => None,
        }
    }

    /// Directory handle `fh` reads `l` from now on.
    pub(super) fn set_dir_listing(&self, fh: u64, l: KeptListing) {
        if let Some(Open::Dir { listing, .. }) = self.table().get_mut(&fh) {
            *listing = Some(l);
        }
    }

    /// Closes directory handle `fh`.
    pub(super) fn remove_dir(&self, fh: u64) {
        let mut table = self.table();
        if let Some(Open::Dir { .. }) = table.get(&fh) {
            table.remove(&fh);
        }
    }
}
